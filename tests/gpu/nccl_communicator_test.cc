// GPU tests of NcclCommunicator: one rank on one GPU (collectives are copies, bad arguments are
// statuses), every collective and dtype across all visible GPUs against a host reference, and
// hangs turned into deadlines. Skipped without a CUDA device; the multi-rank tests need two.
#include "eagle3/cuda/nccl_communicator.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/half.h"
#include "eagle3/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if EAGLE3_HAVE_NCCL
#include <nccl.h>
#endif

namespace eagle3::cuda {
namespace {

using ::testing::HasSubstr;
using Comms = std::vector<std::unique_ptr<NcclCommunicator>>;

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64};
constexpr auto kWait =
    std::chrono::seconds(60);  // generous: only a broken run ever waits this long

// gmock prints Debian abseil's string_view char by char; match on std::string instead.
std::string Msg(const absl::Status& s) { return std::string(s.message()); }

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// `numel` elements of `dtype` that rank `rank` contributes to the collective `seed`: floats
// uniform in [-4, 4) rounded to the dtype, integers over their whole range (so that sums wrap).
std::vector<uint8_t> RankData(DType dtype, int64_t numel, int rank, uint64_t seed) {
  std::vector<uint8_t> bytes(static_cast<size_t>(numel) * DTypeSize(dtype));
  for (int64_t i = 0; i < numel; ++i) {
    const uint64_t h =
        Mix((seed << 56) ^ (static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(i));
    const float f = static_cast<float>(h >> 40) / static_cast<float>(1 << 24) * 8.0f - 4.0f;
    uint8_t* p = bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kF32:
        std::memcpy(p, &f, 4);
        break;
      case DType::kF16: {
        const uint16_t bits = FloatToF16(f);
        std::memcpy(p, &bits, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t bits = FloatToBf16(f);
        std::memcpy(p, &bits, 2);
        break;
      }
      case DType::kI32: {
        const uint32_t v = static_cast<uint32_t>(h);
        std::memcpy(p, &v, 4);
        break;
      }
      default:
        std::memcpy(p, &h, 8);
        break;
    }
  }
  return bytes;
}

double FloatAt(DType dtype, const uint8_t* p) {
  uint16_t bits = 0;
  switch (dtype) {
    case DType::kF32: {
      float f = 0;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kF16:
      std::memcpy(&bits, p, 2);
      return F16ToFloat(bits);
    default:
      std::memcpy(&bits, p, 2);
      return Bf16ToFloat(bits);
  }
}

// Unit roundoff of a float dtype (half an ulp of 1).
double UnitRoundoff(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return std::ldexp(1.0, -24);
    case DType::kF16:
      return std::ldexp(1.0, -11);
    default:
      return std::ldexp(1.0, -8);
  }
}

// Expects got[0, count) == sum over r of inputs[r][offset + i]. Integers: exact, wrapping. Floats:
// NCCL rounds each partial sum to the dtype, so |got - exact| <= (ranks - 1) * u * sum |x| (first
// order; checked with a factor 2 of slack) — exact for one rank.
void ExpectSum(DType dtype, const std::vector<std::vector<uint8_t>>& inputs, int64_t offset,
               const std::vector<uint8_t>& got, int64_t count, const std::string& what) {
  const size_t es = DTypeSize(dtype);
  ASSERT_EQ(got.size(), static_cast<size_t>(count) * es) << what;
  const int n = static_cast<int>(inputs.size());
  int failures = 0;
  for (int64_t i = 0; i < count && failures < 5; ++i) {
    const size_t at = static_cast<size_t>(offset + i) * es;
    if (dtype == DType::kI32 || dtype == DType::kI64) {
      uint64_t sum = 0, value = 0;
      for (const auto& in : inputs) {
        uint64_t x = 0;
        std::memcpy(&x, in.data() + at, es);
        sum += x;
      }
      std::memcpy(&value, got.data() + i * es, es);
      if (dtype == DType::kI32) sum &= 0xffffffffull;
      if (value != sum) {
        ++failures;
        ADD_FAILURE() << what << ": element " << i << " is " << value << ", expected " << sum;
      }
    } else {
      double exact = 0, magnitude = 0;
      for (const auto& in : inputs) {
        const double x = FloatAt(dtype, in.data() + at);
        exact += x;
        magnitude += std::fabs(x);
      }
      const double value = FloatAt(dtype, got.data() + i * es);
      const double tolerance = 2.0 * (n - 1) * UnitRoundoff(dtype) * magnitude;
      if (!(std::fabs(value - exact) <= tolerance)) {
        ++failures;
        ADD_FAILURE() << what << ": element " << i << " is " << value << ", expected " << exact
                      << " within " << tolerance;
      }
    }
  }
}

Tensor DeviceTensor(DType dtype, const Shape& shape, Allocator& allocator) {
  auto t = Tensor::Empty(dtype, shape, allocator);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(t).value() : Tensor();
}

void Upload(const std::vector<uint8_t>& host, const TensorView& device) {
  ASSERT_EQ(host.size(), device.nbytes());
  ASSERT_EQ(cudaMemcpy(device.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
}

std::vector<uint8_t> Download(const TensorView& device) {
  std::vector<uint8_t> host(device.nbytes());
  EXPECT_EQ(cudaMemcpy(host.data(), device.data(), host.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

TensorView Rows(const Tensor& t, int64_t first, int64_t count) {
  return t.view().Narrow(0, first, count);
}

// Runs every collective in every dtype on `comm` (in place and out of place) and checks the
// results against the host reference; every rank must call it. Returns the out-of-place
// all-reduce results, one per dtype, for the cross-rank bit-identity check.
std::vector<std::vector<uint8_t>> CheckAllCollectives(NcclCommunicator& comm) {
  const int n = comm.size(), rank = comm.rank();
  DeviceAllocator allocator(comm.device().index);
  constexpr int64_t kRows = 37, kCols = 29;  // odd sizes: no alignment luck
  const int64_t small = kRows * kCols;
  std::vector<std::vector<uint8_t>> all_reduce_results;
  for (DType dtype : kDTypes) {
    const std::string tag =
        absl::StrCat("rank ", rank, " of ", n, ", ", std::string(DTypeName(dtype)), ": ");
    std::vector<std::vector<uint8_t>> reduce_in(n), scatter_in(n), broadcast_in(n);
    for (int r = 0; r < n; ++r) {
      reduce_in[r] = RankData(dtype, small, r, 1);
      scatter_in[r] = RankData(dtype, n * small, r, 2);
      broadcast_in[r] = RankData(dtype, small, r, 3);
    }
    Tensor ar_send = DeviceTensor(dtype, Shape{kRows, kCols}, allocator);
    Tensor ar_recv = DeviceTensor(dtype, Shape{kRows, kCols}, allocator);
    Tensor ar_inplace = DeviceTensor(dtype, Shape{kRows, kCols}, allocator);
    Tensor ag_recv = DeviceTensor(dtype, Shape{n * kRows, kCols}, allocator);
    Tensor ag_inplace = DeviceTensor(dtype, Shape{n * kRows, kCols}, allocator);
    Tensor rs_send = DeviceTensor(dtype, Shape{n * kRows, kCols}, allocator);
    Tensor rs_recv = DeviceTensor(dtype, Shape{kRows, kCols}, allocator);
    Tensor rs_inplace = DeviceTensor(dtype, Shape{n * kRows, kCols}, allocator);
    Tensor bc = DeviceTensor(dtype, Shape{kRows, kCols}, allocator);
    Upload(reduce_in[rank], ar_send);
    Upload(reduce_in[rank], ar_inplace);
    Upload(reduce_in[rank], Rows(ag_inplace, rank * kRows, kRows));
    Upload(scatter_in[rank], rs_send);
    Upload(scatter_in[rank], rs_inplace);
    Upload(broadcast_in[rank], bc);

    EXPECT_TRUE(comm.AllReduceSum(ar_send, ar_recv).ok()) << tag;
    EXPECT_TRUE(comm.AllReduceSum(ar_inplace, ar_inplace).ok()) << tag;
    EXPECT_TRUE(comm.AllGather(ar_send, ag_recv).ok()) << tag;
    EXPECT_TRUE(comm.AllGather(Rows(ag_inplace, rank * kRows, kRows), ag_inplace).ok()) << tag;
    EXPECT_TRUE(comm.ReduceScatterSum(rs_send, rs_recv).ok()) << tag;
    EXPECT_TRUE(comm.ReduceScatterSum(rs_inplace, Rows(rs_inplace, rank * kRows, kRows)).ok())
        << tag;
    EXPECT_TRUE(comm.Broadcast(bc, n - 1).ok()) << tag;
    EXPECT_TRUE(comm.AllReduceSum(Rows(ar_send, 0, 0), Rows(ar_recv, 0, 0)).ok()) << tag << "empty";
    const absl::Status waited = comm.WaitFor(kWait);
    EXPECT_TRUE(waited.ok()) << tag << waited;
    if (!waited.ok()) return all_reduce_results;

    const std::vector<uint8_t> all_reduced = Download(ar_recv);
    ExpectSum(dtype, reduce_in, 0, all_reduced, small, tag + "AllReduceSum");
    ExpectSum(dtype, reduce_in, 0, Download(ar_inplace), small, tag + "in-place AllReduceSum");
    const std::vector<uint8_t> gathered = Download(ag_recv);
    const std::vector<uint8_t> gathered_inplace = Download(ag_inplace);
    const size_t block = reduce_in[0].size();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(
          std::vector<uint8_t>(gathered.begin() + r * block, gathered.begin() + (r + 1) * block),
          reduce_in[r])
          << tag << "AllGather block " << r;
      EXPECT_EQ(std::vector<uint8_t>(gathered_inplace.begin() + r * block,
                                     gathered_inplace.begin() + (r + 1) * block),
                reduce_in[r])
          << tag << "in-place AllGather block " << r;
    }
    ExpectSum(dtype, scatter_in, rank * small, Download(rs_recv), small, tag + "ReduceScatterSum");
    ExpectSum(dtype, scatter_in, rank * small, Download(Rows(rs_inplace, rank * kRows, kRows)),
              small, tag + "in-place ReduceScatterSum");
    EXPECT_EQ(Download(bc), broadcast_in[n - 1]) << tag << "Broadcast from rank " << n - 1;
    all_reduce_results.push_back(all_reduced);
  }
  return all_reduce_results;
}

// Calls fn(comm) for every communicator on its own thread (with its device current) and joins.
void RunOnRanks(const Comms& comms, const std::function<void(NcclCommunicator&)>& fn) {
  std::vector<std::thread> threads;
  for (const auto& comm : comms) {
    threads.emplace_back([&fn, c = comm.get()] {
      ASSERT_EQ(cudaSetDevice(c->device().index), cudaSuccess);
      fn(*c);
    });
  }
  for (auto& t : threads) t.join();
}

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !EAGLE3_HAVE_NCCL
    GTEST_SKIP() << "built without NCCL";
#endif
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }

  // The single-rank communicator of these tests: ncclCommInitAll semantics on cuda:0.
  static std::unique_ptr<NcclCommunicator> SingleRank(bool nonblocking = false) {
    const int devices[] = {0};
    auto comms = NcclCommunicator::CreateAllLocal(
        devices, {}, NcclOptions{.timeout = kWait, .nonblocking = nonblocking});
    EXPECT_TRUE(comms.ok()) << comms.status();
    if (!comms.ok() || comms->size() != 1) return nullptr;
    return std::move((*comms)[0]);
  }
};

class NcclMultiGpuTest : public NcclCommunicatorTest {
 protected:
  void SetUp() override {
    NcclCommunicatorTest::SetUp();
    if (IsSkipped()) return;
    if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
    for (int d = 0; d < CudaDeviceCount(); ++d) devices_.push_back(d);
  }

  std::vector<int> devices_;
};

#if !EAGLE3_HAVE_NCCL
TEST(NcclCommunicatorWithoutNccl, FactoriesAreUnimplemented) {
  EXPECT_EQ(NcclCommunicator::NewUniqueId().status().code(), absl::StatusCode::kUnimplemented);
  const int devices[] = {0};
  EXPECT_EQ(NcclCommunicator::CreateAllLocal(devices).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(NcclCommunicator::Wrap(nullptr, nullptr).status().code(),
            absl::StatusCode::kUnimplemented);
}
#endif

TEST_F(NcclCommunicatorTest, SingleRankCollectivesAreCopies) {
  for (bool nonblocking : {false, true}) {
    SCOPED_TRACE(nonblocking ? "nonblocking" : "blocking");
    std::unique_ptr<NcclCommunicator> comm = SingleRank(nonblocking);
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->rank(), 0);
    EXPECT_EQ(comm->size(), 1);
    EXPECT_EQ(comm->device(), Device::Cuda(0));
    EXPECT_TRUE(comm->owns_comm());
    EXPECT_NE(comm->stream(), nullptr);
    // With one rank every sum has one term: ExpectSum demands exact equality.
    CheckAllCollectives(*comm);
    EXPECT_TRUE(comm->Poll().ok());
    EXPECT_TRUE(comm->Synchronize().ok());
  }
}

TEST_F(NcclCommunicatorTest, BadArgumentsAreStatusesAndPoison) {
  std::unique_ptr<NcclCommunicator> comm = SingleRank();
  ASSERT_NE(comm, nullptr);
  DeviceAllocator allocator(0);
  Tensor buf = DeviceTensor(DType::kF32, Shape{8, 4}, allocator);
  const Device dev = Device::Cuda(0);
  float* p = buf.data_as<float>();
  const TensorView rows4(p, DType::kF32, Shape{4, 4}, dev);
  const TensorView other4(p + 16, DType::kF32, Shape{4, 4}, dev);
  std::vector<float> host(16);

  struct Case {
    std::string name;
    std::function<absl::Status()> call;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"u8 dtype",
       [&] {
         return comm->AllReduceSum(TensorView(p, DType::kU8, Shape{16}, dev),
                                   TensorView(p + 8, DType::kU8, Shape{16}, dev));
       },
       "has dtype u8; expected f32, f16, bf16, i32 or i64"},
      {"host memory",
       [&] {
         return comm->AllReduceSum(TensorView(host.data(), DType::kF32, Shape{4, 4}), other4);
       },
       "must be memory of cuda:0 (the communicator's device)"},
      {"another device",
       [&] { return comm->Broadcast(TensorView(p, DType::kF32, Shape{4}, Device::Cuda(1)), 0); },
       "must be memory of cuda:0"},
      {"strided",
       [&] {
         return comm->Broadcast(TensorView(p, DType::kF32, Shape{4, 2}, Shape{4, 1}, dev), 0);
       },
       "must be contiguous"},
      {"no data",
       [&] { return comm->Broadcast(TensorView(nullptr, DType::kF32, Shape{4}, dev), 0); },
       "has no data"},
      {"dtypes differ",
       [&] {
         return comm->AllReduceSum(rows4, TensorView(p + 16, DType::kI32, Shape{4, 4}, dev));
       },
       "send and recv dtypes differ"},
      {"shapes differ",
       [&] { return comm->AllReduceSum(rows4, TensorView(p + 16, DType::kF32, Shape{16}, dev)); },
       "send and recv shapes differ"},
      {"partial overlap",
       [&] {
         return comm->AllReduceSum(rows4, TensorView(p + 4, DType::kF32, Shape{4, 4}, dev));
       },
       "partially overlap (must be the same buffer or disjoint)"},
      {"gather rows",
       [&] {
         return comm->AllGather(rows4, TensorView(p, DType::kF32, Shape{8, 4}, dev));
       },
       "send and recv shapes differ"},  // with one rank recv has send's shape
      {"scatter rows",
       [&] {
         return comm->ReduceScatterSum(TensorView(p, DType::kF32, Shape{8, 4}, dev), other4);
       },
       "send and recv shapes differ: recv f32[4, 4] cuda:0, send f32[8, 4] cuda:0"},
      {"gather aliasing",
       [&] {
         return comm->AllGather(rows4, TensorView(p + 4, DType::kF32, Shape{4, 4}, dev));
       },
       "but is not its block 0 (in place means exactly that block)"},
      {"root too big", [&] { return comm->Broadcast(rows4, 1); }, "root 1 is outside [0, 1)"},
      {"root negative", [&] { return comm->Broadcast(rows4, -1); }, "root -1 is outside [0, 1)"},
  };
  for (const Case& c : cases) {
    const absl::Status s = c.call();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(Msg(s), HasSubstr(c.message)) << c.name;
  }
  // The first bad call poisoned the communicator (this rank skipped a collective its peers would
  // have run) and aborted it; valid calls are refused, quoting the first error.
  EXPECT_EQ(comm->status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(comm->status()), HasSubstr("has dtype u8"));
  EXPECT_THAT(Msg(comm->status()), HasSubstr("[the NCCL communicator was aborted]"));
  EXPECT_EQ(comm->nccl_comm(), nullptr);
  const absl::Status refused = comm->AllReduceSum(rows4, rows4);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted) << refused;
  EXPECT_THAT(Msg(refused),
              HasSubstr("NcclCommunicator AllReduceSum on rank 0 refused: the communicator is "
                        "poisoned: AllReduceSum: send u8[16] cuda:0 has dtype u8"));
  EXPECT_EQ(comm->Poll().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->WaitFor(std::chrono::seconds(1)).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclCommunicatorTest, FactoriesRejectBadArguments) {
  const int count = CudaDeviceCount();
  const std::vector<int> none;
  EXPECT_THAT(Msg(NcclCommunicator::CreateAllLocal(none).status()), HasSubstr("no devices"));
  const std::vector<int> twice = {0, 0};
  EXPECT_THAT(Msg(NcclCommunicator::CreateAllLocal(twice).status()),
              HasSubstr("cuda:0 is listed twice"));
  const std::vector<int> missing = {count};
  EXPECT_THAT(Msg(NcclCommunicator::CreateAllLocal(missing).status()), HasSubstr("does not exist"));
  const std::vector<int> zero = {0};
  const std::vector<cudaStream_t> two_streams = {nullptr, nullptr};
  EXPECT_THAT(Msg(NcclCommunicator::CreateAllLocal(zero, two_streams).status()),
              HasSubstr("2 streams for 1"));
  EXPECT_THAT(Msg(NcclCommunicator::CreateAllLocal(zero, {}, NcclOptions{.timeout = {}}).status()),
              HasSubstr("timeout must be positive"));
  const NcclUniqueId id{};  // never used: the arguments are rejected first
  EXPECT_EQ(NcclCommunicator::CreateFromUniqueId(id, 2, 2, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::CreateFromUniqueId(id, 1, 0, count).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclCommunicator::Wrap(nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclCommunicatorTest, UniqueIdSingleRank) {
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  auto comm = NcclCommunicator::CreateFromUniqueId(*id, 1, 0, 0, nullptr, {.timeout = kWait});
  ASSERT_TRUE(comm.ok()) << comm.status();
  DeviceAllocator allocator(0);
  Tensor t = DeviceTensor(DType::kI32, Shape{5}, allocator);
  const std::vector<uint8_t> in = RankData(DType::kI32, 5, 0, 7);
  Upload(in, t);
  EXPECT_TRUE((*comm)->AllReduceSum(t, t).ok());
  ASSERT_TRUE((*comm)->WaitFor(kWait).ok());
  EXPECT_EQ(Download(t), in);
}

// In nonblocking mode a peer that never joins makes creation fail with DeadlineExceeded after the
// timeout instead of hanging.
TEST_F(NcclCommunicatorTest, MissingPeerAtCreationIsADeadline) {
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const auto start = std::chrono::steady_clock::now();
  auto comm = NcclCommunicator::CreateFromUniqueId(
      *id, 2, 0, 0, nullptr, {.timeout = std::chrono::seconds(1), .nonblocking = true});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_THAT(Msg(comm.status()), HasSubstr("not every rank joined within 1000 ms"));
  EXPECT_LT(elapsed, std::chrono::seconds(30));
}

#if EAGLE3_HAVE_NCCL
// Wrap borrows: collectives work, errors poison without aborting, and the engine's communicator
// outlives the wrapper.
TEST_F(NcclCommunicatorTest, WrapBorrowsTheEnginesCommunicator) {
  ncclComm_t raw = nullptr;
  const int device = 0;
  ASSERT_EQ(ncclCommInitAll(&raw, 1, &device), ncclSuccess);
  {
    auto wrapped = NcclCommunicator::Wrap(raw, nullptr);
    ASSERT_TRUE(wrapped.ok()) << wrapped.status();
    NcclCommunicator& comm = **wrapped;
    EXPECT_FALSE(comm.owns_comm());
    EXPECT_EQ(comm.nccl_comm(), raw);
    EXPECT_EQ(comm.size(), 1);
    EXPECT_EQ(comm.device(), Device::Cuda(0));
    DeviceAllocator allocator(0);
    Tensor send = DeviceTensor(DType::kBF16, Shape{3, 7}, allocator);
    Tensor recv = DeviceTensor(DType::kBF16, Shape{3, 7}, allocator);
    const std::vector<uint8_t> in = RankData(DType::kBF16, 21, 0, 9);
    Upload(in, send);
    EXPECT_TRUE(comm.AllReduceSum(send, recv).ok());
    ASSERT_TRUE(comm.WaitFor(kWait).ok());
    EXPECT_EQ(Download(recv), in);
    const absl::Status bad = comm.Broadcast(send, 3);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Msg(comm.status()), HasSubstr("must be aborted by its owner"));
    EXPECT_EQ(comm.nccl_comm(), raw);  // poisoned, not aborted
  }
  int count = 0;
  EXPECT_EQ(ncclCommCount(raw, &count), ncclSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(ncclCommDestroy(raw), ncclSuccess);
}
#endif

// Every collective in every dtype on all GPUs, one thread per rank, against the host reference.
void CheckAllGpus(const std::vector<int>& devices, bool nonblocking) {
  auto comms = NcclCommunicator::CreateAllLocal(
      devices, {}, NcclOptions{.timeout = kWait, .nonblocking = nonblocking});
  ASSERT_TRUE(comms.ok()) << comms.status();
  const int n = static_cast<int>(comms->size());
  ASSERT_EQ(n, static_cast<int>(devices.size()));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ((*comms)[r]->rank(), r);
    EXPECT_EQ((*comms)[r]->size(), n);
    EXPECT_EQ((*comms)[r]->device(), Device::Cuda(devices[r]));
  }
  std::vector<std::vector<std::vector<uint8_t>>> results(n);
  RunOnRanks(*comms,
             [&](NcclCommunicator& comm) { results[comm.rank()] = CheckAllCollectives(comm); });
  // Every rank holds the same all-reduce bits (the TP=1 == TP=N invariants rely on it).
  for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]) << "rank " << r << " vs rank 0";
  for (const auto& comm : *comms) EXPECT_TRUE(comm->Poll().ok());
}

TEST_F(NcclMultiGpuTest, EveryCollectiveAndDTypeOnAllGpus) { CheckAllGpus(devices_, false); }

TEST_F(NcclMultiGpuTest, EveryCollectiveAndDTypeOnAllGpusNonblocking) {
  CheckAllGpus(devices_, true);
}

TEST_F(NcclMultiGpuTest, UniqueIdRanksOnTheirOwnThreads) {
  auto id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const int n = static_cast<int>(devices_.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      // Nonblocking: should a rank fail to start, the others time out instead of hanging.
      auto comm = NcclCommunicator::CreateFromUniqueId(*id, n, r, r, nullptr,
                                                       {.timeout = kWait, .nonblocking = true});
      ASSERT_TRUE(comm.ok()) << comm.status();
      DeviceAllocator allocator(r);
      Tensor t = DeviceTensor(DType::kI64, Shape{3}, allocator);
      const std::vector<int64_t> mine = {1, r, int64_t{1} << 40};
      Upload(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(mine.data()),
                                  reinterpret_cast<const uint8_t*>(mine.data() + 3)),
             t);
      EXPECT_TRUE((*comm)->AllReduceSum(t, t).ok());
      ASSERT_TRUE((*comm)->WaitFor(kWait).ok());
      std::vector<uint8_t> got = Download(t);
      std::vector<int64_t> sums(3);
      std::memcpy(sums.data(), got.data(), 24);
      EXPECT_EQ(sums, (std::vector<int64_t>{n, int64_t{n} * (n - 1) / 2, int64_t{n} << 40}));
    });
  }
  for (auto& t : threads) t.join();
}

// One rank enqueues an all-reduce the others never call: its kernel waits forever on the GPU, but
// the host gets DeadlineExceeded from WaitFor, the communicator is aborted (the kernel quits), and
// the other ranks are unaffected and tear down cleanly.
void LoneCollectiveIsADeadline(const std::vector<int>& devices, bool nonblocking) {
  // 20 s bounds creation and NCCL's connecting on the first all-reduce (ample); the lone call
  // below gets its own 2 s deadline.
  auto created = NcclCommunicator::CreateAllLocal(
      devices, {}, NcclOptions{.timeout = std::chrono::seconds(20), .nonblocking = nonblocking});
  ASSERT_TRUE(created.ok()) << created.status();
  Comms& comms = *created;
  std::vector<std::unique_ptr<DeviceAllocator>> allocators;
  std::vector<Tensor> buffers;
  for (int d : devices) {
    allocators.push_back(std::make_unique<DeviceAllocator>(d));
    buffers.push_back(DeviceTensor(DType::kF32, Shape{1024}, *allocators.back()));
  }
  // Every rank runs this all-reduce once, so NCCL has connected what the lone call below uses (in
  // blocking mode a call that had to connect would wait on the host for the peers).
  RunOnRanks(comms, [&](NcclCommunicator& comm) {
    const Tensor& t = buffers[comm.rank()];
    EXPECT_TRUE(comm.AllReduceSum(t, t).ok());
    const absl::Status waited = comm.WaitFor(kWait);
    EXPECT_TRUE(waited.ok()) << waited;
  });

  NcclCommunicator& lone = *comms[0];
  ASSERT_EQ(cudaSetDevice(devices[0]), cudaSuccess);
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = lone.AllReduceSum(buffers[0], buffers[0]);
  // Enqueued (the connections exist), so WaitFor times out after 2 s. In nonblocking mode, had
  // NCCL needed to connect first, the call itself would have timed out (20 s).
  if (status.ok()) status = lone.WaitFor(std::chrono::seconds(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(Msg(status), HasSubstr("AllReduceSum of 1024 f32 elements"));
  EXPECT_THAT(Msg(status), HasSubstr("[the NCCL communicator was aborted]"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  EXPECT_EQ(lone.nccl_comm(), nullptr);
  EXPECT_EQ(lone.Poll().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(lone.AllReduceSum(buffers[0], buffers[0]).code(), absl::StatusCode::kAborted);
  // The abort makes the waiting kernel quit: the stream drains.
  cudaError_t drained = cudaErrorNotReady;
  for (int i = 0; i < 2000 && drained == cudaErrorNotReady; ++i) {
    drained = cudaStreamQuery(lone.stream());
    if (drained == cudaErrorNotReady) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(drained, cudaSuccess) << cudaGetErrorName(drained);
  cudaGetLastError();
  for (size_t r = 1; r < comms.size(); ++r) EXPECT_TRUE(comms[r]->Poll().ok()) << "rank " << r;
  const auto teardown = std::chrono::steady_clock::now();
  comms.clear();
  EXPECT_LT(std::chrono::steady_clock::now() - teardown, std::chrono::seconds(30));
}

TEST_F(NcclMultiGpuTest, LoneCollectiveIsADeadlineNotAHang) {
  LoneCollectiveIsADeadline(devices_, false);
}

TEST_F(NcclMultiGpuTest, LoneCollectiveIsADeadlineNotAHangNonblocking) {
  LoneCollectiveIsADeadline(devices_, true);
}

}  // namespace
}  // namespace eagle3::cuda
