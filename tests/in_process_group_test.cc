#include "eagle3/in_process_group.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "eagle3/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

// Counts heap allocations per thread so that a test can assert the collective fast path makes
// none. Sanitizers own operator new, so the count (and its test) exist only in plain builds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EAGLE3_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EAGLE3_TEST_SANITIZED 1
#endif
#endif

#ifndef EAGLE3_TEST_SANITIZED
thread_local int64_t thread_allocations = 0;

void* operator new(size_t bytes) {
  ++thread_allocations;
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#endif

namespace eagle3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// gmock prints Debian abseil's string_view char by char; match on std::string instead.
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::vector<std::unique_ptr<Communicator>> MakeRanks(InProcessGroup& group) {
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < group.size(); ++r) {
    auto comm = group.Rank(r);
    EXPECT_TRUE(comm.ok()) << comm.status();
    comms.push_back(std::move(comm).value());
  }
  return comms;
}

// Runs body(rank) on one thread per rank and returns each rank's status.
std::vector<absl::Status> RunRanks(int size, const std::function<absl::Status(int)>& body) {
  std::vector<absl::Status> statuses(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] { statuses[r] = body(r); });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

// Host buffer of raw bytes with its dtype; viewed as a contiguous tensor.
struct Buffer {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;

  Buffer(DType d, const Shape& s)
      : dtype(d), shape(s), bytes(static_cast<size_t>(s.numel()) * DTypeSize(d)) {}
  TensorView view() { return TensorView(bytes.data(), dtype, shape); }
  int64_t numel() const { return shape.numel(); }
};

void FillRandom(Buffer& b, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  // Full-range integers so that sums wrap.
  std::uniform_int_distribution<int32_t> any_i32(INT32_MIN, INT32_MAX);
  std::uniform_int_distribution<int64_t> any_i64(INT64_MIN, INT64_MAX);
  for (int64_t i = 0; i < b.numel(); ++i) {
    switch (b.dtype) {
      case DType::kF32:
        reinterpret_cast<float*>(b.bytes.data())[i] = normal(rng);
        break;
      case DType::kF16:
        reinterpret_cast<uint16_t*>(b.bytes.data())[i] = FloatToF16(normal(rng));
        break;
      case DType::kBF16:
        reinterpret_cast<uint16_t*>(b.bytes.data())[i] = FloatToBf16(normal(rng));
        break;
      case DType::kI32:
        reinterpret_cast<int32_t*>(b.bytes.data())[i] = any_i32(rng);
        break;
      case DType::kI64:
        reinterpret_cast<int64_t*>(b.bytes.data())[i] = any_i64(rng);
        break;
      default:
        FAIL() << "unexpected dtype";
    }
  }
}

// The documented semantics, serially: element i of every source summed in rank order, f32
// accumulation rounded once for floats, two's complement wrap for integers.
void ReferenceSum(const std::vector<const uint8_t*>& srcs, DType dtype, int64_t src_offset,
                  int64_t count, uint8_t* dst) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = src_offset + i;
    if (dtype == DType::kI32 || dtype == DType::kI64) {
      uint64_t acc = 0;
      for (const uint8_t* s : srcs) {
        acc += dtype == DType::kI32 ? static_cast<uint64_t>(static_cast<int64_t>(
                                          reinterpret_cast<const int32_t*>(s)[j]))
                                    : static_cast<uint64_t>(reinterpret_cast<const int64_t*>(s)[j]);
      }
      if (dtype == DType::kI32) {
        reinterpret_cast<int32_t*>(dst)[i] = static_cast<int32_t>(static_cast<uint32_t>(acc));
      } else {
        reinterpret_cast<int64_t*>(dst)[i] = static_cast<int64_t>(acc);
      }
      continue;
    }
    auto load = [&](const uint8_t* s) -> float {
      if (dtype == DType::kF32) return reinterpret_cast<const float*>(s)[j];
      const uint16_t bits = reinterpret_cast<const uint16_t*>(s)[j];
      return dtype == DType::kF16 ? F16ToFloat(bits) : Bf16ToFloat(bits);
    };
    float acc = load(srcs[0]);
    for (size_t r = 1; r < srcs.size(); ++r) acc += load(srcs[r]);
    if (dtype == DType::kF32) {
      reinterpret_cast<float*>(dst)[i] = acc;
    } else {
      reinterpret_cast<uint16_t*>(dst)[i] =
          dtype == DType::kF16 ? FloatToF16(acc) : FloatToBf16(acc);
    }
  }
}

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64};

class InProcessGroupCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(InProcessGroupCollectiveTest, AllReduceSumMatchesSerialReferenceBitForBit) {
  const int size = GetParam();
  for (DType dtype : kDTypes) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + (in_place ? " in place" : " out of place"));
      auto group = InProcessGroup::Create(size);
      ASSERT_TRUE(group.ok()) << group.status();
      auto comms = MakeRanks(**group);
      std::mt19937 rng(7);
      const Shape shape{3, 347};  // not a multiple of the rank count or of the internal block
      std::vector<Buffer> send, recv;
      for (int r = 0; r < size; ++r) {
        send.emplace_back(dtype, shape);
        recv.emplace_back(dtype, shape);
        FillRandom(send.back(), rng);
      }
      Buffer expected(dtype, shape);
      std::vector<const uint8_t*> srcs;
      for (Buffer& b : send) srcs.push_back(b.bytes.data());
      ReferenceSum(srcs, dtype, 0, shape.numel(), expected.bytes.data());

      auto statuses = RunRanks(size, [&](int r) {
        return comms[r]->AllReduceSum(send[r].view(), in_place ? send[r].view() : recv[r].view());
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(statuses[r].ok()) << statuses[r];
        const Buffer& got = in_place ? send[r] : recv[r];
        EXPECT_EQ(got.bytes, expected.bytes) << "rank " << r;
      }
    }
  }
}

TEST_P(InProcessGroupCollectiveTest, AllGatherConcatenatesInRankOrder) {
  const int size = GetParam();
  for (DType dtype : kDTypes) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + (in_place ? " in place" : " out of place"));
      auto group = InProcessGroup::Create(size);
      ASSERT_TRUE(group.ok());
      auto comms = MakeRanks(**group);
      std::mt19937 rng(11);
      const Shape shape{2, 5, 3};
      const Shape gathered{2 * size, 5, 3};
      std::vector<Buffer> send, recv;
      Buffer expected(dtype, gathered);
      for (int r = 0; r < size; ++r) {
        send.emplace_back(dtype, shape);
        recv.emplace_back(dtype, gathered);
        FillRandom(send.back(), rng);
        std::memcpy(expected.bytes.data() + r * send[r].bytes.size(), send[r].bytes.data(),
                    send[r].bytes.size());
      }
      if (in_place) {  // each rank's input already sits in its own block of recv
        for (int r = 0; r < size; ++r) {
          std::memcpy(recv[r].bytes.data() + r * send[r].bytes.size(), send[r].bytes.data(),
                      send[r].bytes.size());
        }
      }
      auto statuses = RunRanks(size, [&](int r) {
        TensorView in = in_place ? recv[r].view().Narrow(0, 2 * r, 2) : send[r].view();
        return comms[r]->AllGather(in, recv[r].view());
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(statuses[r].ok()) << statuses[r];
        EXPECT_EQ(recv[r].bytes, expected.bytes) << "rank " << r;
      }
    }
  }
}

TEST_P(InProcessGroupCollectiveTest, ReduceScatterSumGivesEachRankItsBlock) {
  const int size = GetParam();
  for (DType dtype : kDTypes) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + (in_place ? " in place" : " out of place"));
      auto group = InProcessGroup::Create(size);
      ASSERT_TRUE(group.ok());
      auto comms = MakeRanks(**group);
      std::mt19937 rng(13);
      const Shape block{3, 101};
      const Shape full{3 * size, 101};
      std::vector<Buffer> send, recv;
      for (int r = 0; r < size; ++r) {
        send.emplace_back(dtype, full);
        recv.emplace_back(dtype, block);
        FillRandom(send.back(), rng);
      }
      std::vector<const uint8_t*> srcs;
      for (Buffer& b : send) srcs.push_back(b.bytes.data());
      std::vector<Buffer> expected;
      for (int r = 0; r < size; ++r) {
        expected.emplace_back(dtype, block);
        ReferenceSum(srcs, dtype, r * block.numel(), block.numel(), expected.back().bytes.data());
      }
      auto statuses = RunRanks(size, [&](int r) {
        TensorView out = in_place ? send[r].view().Narrow(0, 3 * r, 3) : recv[r].view();
        return comms[r]->ReduceScatterSum(send[r].view(), out);
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(statuses[r].ok()) << statuses[r];
        const size_t n = expected[r].bytes.size();
        const uint8_t* got = in_place ? send[r].bytes.data() + r * n : recv[r].bytes.data();
        EXPECT_EQ(std::memcmp(got, expected[r].bytes.data(), n), 0) << "rank " << r;
      }
    }
  }
}

TEST_P(InProcessGroupCollectiveTest, BroadcastCopiesRootToEveryRank) {
  const int size = GetParam();
  for (DType dtype : kDTypes) {
    for (int root : {0, size - 1}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " root " + std::to_string(root));
      auto group = InProcessGroup::Create(size);
      ASSERT_TRUE(group.ok());
      auto comms = MakeRanks(**group);
      std::mt19937 rng(17);
      std::vector<Buffer> buffers;
      for (int r = 0; r < size; ++r) {
        buffers.emplace_back(dtype, Shape{4, 9});
        FillRandom(buffers.back(), rng);
      }
      const std::vector<uint8_t> expected = buffers[root].bytes;
      auto statuses =
          RunRanks(size, [&](int r) { return comms[r]->Broadcast(buffers[r].view(), root); });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(statuses[r].ok()) << statuses[r];
        EXPECT_EQ(buffers[r].bytes, expected) << "rank " << r;
      }
    }
  }
}

TEST_P(InProcessGroupCollectiveTest, ZeroSizedBuffersSucceed) {
  const int size = GetParam();
  auto group = InProcessGroup::Create(size);
  ASSERT_TRUE(group.ok());
  auto comms = MakeRanks(**group);
  auto statuses = RunRanks(size, [&](int r) -> absl::Status {
    float dummy = 0.0f;
    TensorView empty(&dummy, DType::kF32, Shape{0, 4});
    if (auto s = comms[r]->AllReduceSum(empty, empty); !s.ok()) return s;
    if (auto s = comms[r]->AllGather(empty, empty); !s.ok()) return s;
    return comms[r]->Broadcast(empty, 0);
  });
  for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
}

TEST_P(InProcessGroupCollectiveTest, ThousandMixedRoundsStayInStep) {
  const int size = GetParam();
  auto group = InProcessGroup::Create(size);
  ASSERT_TRUE(group.ok());
  auto comms = MakeRanks(**group);
  std::vector<int> failures(size, 0);
  auto statuses = RunRanks(size, [&](int r) -> absl::Status {
    // Each rank owns its buffers; shapes change every round so a stale Call would be caught.
    std::vector<int64_t> send(4 * size + 8), recv(4 * size * size + 8);
    for (int it = 0; it < 1000; ++it) {
      const int64_t n = 1 + it % 4;
      for (int64_t i = 0; i < n * size; ++i) send[i] = 1000 * r + it + i;
      TensorView small(send.data(), DType::kI64, Shape{n});
      TensorView wide(send.data(), DType::kI64, Shape{n * size});
      TensorView out_small(recv.data(), DType::kI64, Shape{n});
      TensorView out_wide(recv.data(), DType::kI64, Shape{n * size});
      absl::Status s;
      switch (it % 4) {
        case 0:  // sum over ranks of (1000 r + it + i)
          s = comms[r]->AllReduceSum(small, small);
          for (int64_t i = 0; s.ok() && i < n; ++i) {
            failures[r] += send[i] != 1000LL * size * (size - 1) / 2 + size * (it + i);
          }
          break;
        case 1:
          s = comms[r]->AllGather(small, out_wide);
          for (int64_t q = 0; s.ok() && q < size; ++q) {
            for (int64_t i = 0; i < n; ++i) failures[r] += recv[q * n + i] != 1000 * q + it + i;
          }
          break;
        case 2:
          s = comms[r]->ReduceScatterSum(wide, out_small);
          for (int64_t i = 0; s.ok() && i < n; ++i) {
            failures[r] += recv[i] != 1000LL * size * (size - 1) / 2 + size * (it + r * n + i);
          }
          break;
        case 3:
          s = comms[r]->Broadcast(small, it % size);
          for (int64_t i = 0; s.ok() && i < n; ++i) {
            failures[r] += send[i] != 1000 * (it % size) + it + i;
          }
          break;
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(failures[r], 0) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(TpSizes, InProcessGroupCollectiveTest, ::testing::Values(1, 2, 3, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "tp" + std::to_string(info.param);
                         });

TEST(InProcessGroupTest, FastPathDoesNotAllocate) {
#ifdef EAGLE3_TEST_SANITIZED
  GTEST_SKIP() << "allocation counting needs the plain operator new";
#else
  const int size = 4;
  auto group = InProcessGroup::Create(size);
  ASSERT_TRUE(group.ok());
  auto comms = MakeRanks(**group);
  std::vector<int64_t> allocations(size, -1);
  auto statuses = RunRanks(size, [&](int r) -> absl::Status {
    std::vector<uint16_t> small(64), wide(64 * size);
    TensorView s(small.data(), DType::kBF16, Shape{4, 16});
    TensorView w(wide.data(), DType::kBF16, Shape{4 * size, 16});
    const int64_t before = thread_allocations;
    for (int it = 0; it < 100; ++it) {
      for (absl::Status st :
           {comms[r]->AllReduceSum(s, s), comms[r]->AllGather(s, w),
            comms[r]->ReduceScatterSum(w, s), comms[r]->Broadcast(s, it % size)}) {
        if (!st.ok()) return st;
      }
    }
    allocations[r] = thread_allocations - before;
    return absl::OkStatus();
  });
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(allocations[r], 0) << "rank " << r;
  }
#endif
}

TEST(InProcessGroupTest, RanksSeeTheSameBitsForFloatSums) {
  // Values of wildly different magnitude make the sum depend on the order of addition.
  const int size = 8;
  auto group = InProcessGroup::Create(size);
  ASSERT_TRUE(group.ok());
  auto comms = MakeRanks(**group);
  std::vector<std::vector<float>> bufs(size, std::vector<float>(4096));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> exponent(-20.0f, 20.0f);
  for (auto& b : bufs) {
    for (float& v : b) v = std::exp2(exponent(rng)) * (rng() % 2 ? 1.0f : -1.0f);
  }
  auto statuses = RunRanks(size, [&](int r) {
    TensorView v(bufs[r].data(), DType::kF32, Shape{4096});
    return comms[r]->AllReduceSum(v, v);
  });
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(std::memcmp(bufs[r].data(), bufs[0].data(), 4096 * sizeof(float)), 0) << "rank " << r;
  }
}

TEST(InProcessGroupTest, MissingRankTimesOutNamingItAndPoisonsTheGroup) {
  const int size = 3;
  auto group = InProcessGroup::Create(size, std::chrono::milliseconds(200));
  ASSERT_TRUE(group.ok());
  auto comms = MakeRanks(**group);
  std::vector<float> bufs(size * 4);
  const auto start = std::chrono::steady_clock::now();
  auto statuses = RunRanks(2, [&](int r) {  // rank 2 never calls
    TensorView v(bufs.data() + 4 * r, DType::kF32, Shape{4});
    return comms[r]->AllReduceSum(v, v);
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kDeadlineExceeded) << statuses[r];
    EXPECT_THAT(Msg(statuses[r]), AllOf(HasSubstr("AllReduceSum"),
                                        HasSubstr("ranks [2] never arrived"), HasSubstr("200 ms")));
  }
  EXPECT_EQ((*group)->status().code(), absl::StatusCode::kDeadlineExceeded);
  // The late rank, and everyone after, fails fast with the original reason.
  TensorView late(bufs.data() + 8, DType::kF32, Shape{4});
  absl::Status s = comms[2]->AllReduceSum(late, late);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(Msg(s), AllOf(HasSubstr("poisoned"), HasSubstr("ranks [2] never arrived")));
  s = comms[0]->Broadcast(late, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
}

TEST(InProcessGroupTest, AbortFromAnotherThreadWakesWaiters) {
  auto group = InProcessGroup::Create(4, std::chrono::seconds(60));
  ASSERT_TRUE(group.ok());
  auto comms = MakeRanks(**group);
  std::vector<float> bufs(16);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*group)->Abort("engine shutting down");
  });
  const auto start = std::chrono::steady_clock::now();
  auto statuses = RunRanks(3, [&](int r) {  // rank 3 never comes; Abort must release the others
    TensorView v(bufs.data() + 4 * r, DType::kF32, Shape{4});
    return comms[r]->AllReduceSum(v, v);
  });
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (const absl::Status& s : statuses) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_THAT(Msg(s), HasSubstr("engine shutting down"));
  }
  TensorView v(bufs.data() + 12, DType::kF32, Shape{4});
  absl::Status later = comms[3]->AllGather(v, TensorView(bufs.data(), DType::kF32, Shape{16}));
  EXPECT_EQ(later.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(Msg(later), HasSubstr("engine shutting down"));
}

// Runs one collective per rank where `call(rank)` may differ across ranks; expects InvalidArgument
// everywhere, each message containing every substring in `needles`.
void ExpectInvalidEverywhere(int size, const std::function<absl::Status(Communicator&, int)>& call,
                             const std::vector<std::string>& needles) {
  auto group = InProcessGroup::Create(size, std::chrono::seconds(10));
  ASSERT_TRUE(group.ok());
  auto comms = MakeRanks(**group);
  auto statuses = RunRanks(size, [&](int r) { return call(*comms[r], r); });
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(statuses[r].code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << statuses[r];
    for (const std::string& n : needles) EXPECT_THAT(Msg(statuses[r]), HasSubstr(n));
  }
  EXPECT_EQ((*group)->status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessGroupTest, MismatchedOpIsInvalidOnEveryRank) {
  std::vector<std::vector<float>> bufs(2, std::vector<float>(16));
  ExpectInvalidEverywhere(
      2,
      [&](Communicator& c, int r) {
        TensorView v(bufs[r].data(), DType::kF32, Shape{2, 4});
        if (r == 0) return c.AllReduceSum(v, v);
        return c.AllGather(TensorView(bufs[r].data() + 8, DType::kF32, Shape{1, 4}), v);
      },
      {"mismatched", "rank 0: AllReduceSum(send f32[2, 4] cpu",
       "rank 1: AllGather(send f32[1, 4] cpu"});
}

TEST(InProcessGroupTest, MismatchedShapeIsInvalidOnEveryRank) {
  std::vector<std::vector<float>> bufs(3, std::vector<float>(16));
  ExpectInvalidEverywhere(
      3,
      [&](Communicator& c, int r) {
        TensorView v(bufs[r].data(), DType::kF32, r == 1 ? Shape{3, 4} : Shape{2, 4});
        return c.AllReduceSum(v, v);
      },
      {"mismatched", "rank 0: AllReduceSum(send f32[2, 4]", "rank 1: AllReduceSum(send f32[3, 4]",
       "rank 2: AllReduceSum(send f32[2, 4]"});
}

TEST(InProcessGroupTest, MismatchedDTypeIsInvalidOnEveryRank) {
  std::vector<std::vector<int32_t>> bufs(2, std::vector<int32_t>(8));
  ExpectInvalidEverywhere(2,
                          [&](Communicator& c, int r) {
                            TensorView v(bufs[r].data(), r == 0 ? DType::kF32 : DType::kI32,
                                         Shape{8});
                            return c.AllReduceSum(v, v);
                          },
                          {"mismatched", "f32[8]", "i32[8]"});
}

TEST(InProcessGroupTest, MismatchedRootIsInvalidOnEveryRank) {
  std::vector<std::vector<float>> bufs(2, std::vector<float>(8));
  ExpectInvalidEverywhere(2,
                          [&](Communicator& c, int r) {
                            return c.Broadcast(TensorView(bufs[r].data(), DType::kF32, Shape{8}),
                                               r);
                          },
                          {"mismatched", "root 0", "root 1"});
}

TEST(InProcessGroupTest, BadArgumentsOnOneRankAreReportedToAll) {
  std::vector<std::vector<float>> bufs(3, std::vector<float>(32));
  // Rank 1 passes a gather output of the wrong height.
  ExpectInvalidEverywhere(
      3,
      [&](Communicator& c, int r) {
        TensorView send(bufs[r].data(), DType::kF32, Shape{2, 4});
        TensorView recv(bufs[r].data() + 8, DType::kF32, Shape{r == 1 ? 5 : 6, 4});
        return c.AllGather(send, recv);
      },
      {"rank 1", "AllGather", "f32[5, 4]"});
  // Rank 0 passes an unsupported dtype.
  ExpectInvalidEverywhere(2,
                          [&](Communicator& c, int r) {
                            TensorView v(bufs[r].data(), r == 0 ? DType::kU8 : DType::kF32,
                                         Shape{4});
                            return c.AllReduceSum(v, v);
                          },
                          {"rank 0", "u8"});
  // Non-contiguous buffer.
  ExpectInvalidEverywhere(
      2,
      [&](Communicator& c, int r) {
        TensorView v = TensorView(bufs[r].data(), DType::kF32, Shape{4, 4}).Narrow(1, 0, 2);
        return c.AllReduceSum(v, v);
      },
      {"contiguous"});
  // Root out of range (same on both ranks, so not a mismatch).
  ExpectInvalidEverywhere(2,
                          [&](Communicator& c, int r) {
                            return c.Broadcast(TensorView(bufs[r].data(), DType::kF32, Shape{4}),
                                               2);
                          },
                          {"root 2 is outside [0, 2)"});
  // Partially overlapping send/recv.
  ExpectInvalidEverywhere(2,
                          [&](Communicator& c, int r) {
                            return c.AllReduceSum(
                                TensorView(bufs[r].data(), DType::kF32, Shape{4}),
                                TensorView(bufs[r].data() + 2, DType::kF32, Shape{4}));
                          },
                          {"partially overlap"});
  // Ranks sharing one buffer.
  ExpectInvalidEverywhere(2,
                          [&](Communicator& c, int) {
                            TensorView v(bufs[0].data(), DType::kF32, Shape{4});
                            return c.AllReduceSum(v, v);
                          },
                          {"buffers of ranks 0 and 1 overlap"});
  // Non-host memory.
  ExpectInvalidEverywhere(2,
                          [&](Communicator& c, int r) {
                            TensorView v(bufs[r].data(), DType::kF32, Shape{4}, Shape{1},
                                         Device::Cuda(0));
                            return c.AllReduceSum(v, v);
                          },
                          {"cuda:0", "host memory"});
}

TEST(InProcessGroupTest, CreateAndRankValidate) {
  EXPECT_EQ(InProcessGroup::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InProcessGroup::Create(2, std::chrono::milliseconds(0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto forever = InProcessGroup::Create(2, std::chrono::milliseconds::max());
  ASSERT_TRUE(forever.ok());
  EXPECT_EQ((*forever)->timeout(), std::chrono::hours(24 * 365));
  {  // the deadline arithmetic must not overflow into an instant timeout
    auto comms = MakeRanks(**forever);
    std::vector<float> bufs = {1, 2};
    auto statuses = RunRanks(2, [&](int r) {
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      TensorView v(bufs.data() + r, DType::kF32, Shape{1});
      return comms[r]->AllReduceSum(v, v);
    });
    EXPECT_TRUE(statuses[0].ok() && statuses[1].ok()) << statuses[0] << statuses[1];
    EXPECT_EQ(bufs, (std::vector<float>{3, 3}));
  }
  auto group = InProcessGroup::Create(2);
  ASSERT_TRUE(group.ok());
  EXPECT_EQ((*group)->size(), 2);
  EXPECT_EQ((*group)->timeout(), std::chrono::seconds(60));
  EXPECT_THAT(Msg((*group)->Rank(2).status()), HasSubstr("rank 2 is outside [0, 2)"));
  EXPECT_EQ((*group)->Rank(-1).status().code(), absl::StatusCode::kInvalidArgument);
  auto first = (*group)->Rank(1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)->rank(), 1);
  EXPECT_EQ((*first)->size(), 2);
  EXPECT_TRUE((*first)->device().is_cpu());
  EXPECT_EQ((*group)->Rank(1).status().code(), absl::StatusCode::kFailedPrecondition);
  first->reset();
  EXPECT_TRUE((*group)->Rank(1).ok());
}

TEST(InProcessGroupTest, CommunicatorsOutliveTheGroupObject) {
  std::vector<std::unique_ptr<Communicator>> comms;
  {
    auto group = InProcessGroup::Create(2);
    ASSERT_TRUE(group.ok());
    comms = MakeRanks(**group);
  }
  std::vector<float> a = {1, 2}, b = {10, 20};
  auto statuses = RunRanks(2, [&](int r) {
    TensorView v((r == 0 ? a : b).data(), DType::kF32, Shape{2});
    return comms[r]->AllReduceSum(v, v);
  });
  EXPECT_TRUE(statuses[0].ok() && statuses[1].ok());
  EXPECT_EQ(a, (std::vector<float>{11, 22}));
  EXPECT_EQ(b, a);
}

}  // namespace
}  // namespace eagle3
