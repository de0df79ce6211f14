// CudaBackend with a bf16 latent cache: PagedWrite rounds rows to bf16 (nearest even, bitwise as
// the host's FloatToBf16), PagedRead widens them exactly, and LatentAttention /
// BatchedLatentAttention (the tensor-core kernel) match the CPU reference run on an f32 cache that
// holds the same rounded rows, with q rounded to bf16 too.
//
// Tolerance (kBf16Tol, relative to the largest output): the kernel multiplies bf16 operands exactly
// and accumulates in fp32 (differences ~1e-6), but it rounds each softmax probability to bf16 for
// the value product (relative 2^-9 = 0.002 per weight, unbiased), so an output moves by at most
// ~0.002 of the values it averages; 1e-2 leaves room for the largest of many rows. The same run
// against unrounded q shows the q-rounding error (scores off by ~2^-9 |q| |k| scale), bounded by
// kUnroundedTol and printed.
//
// Split calls merge their splits either in a combine kernel or in the attention kernel's last block
// of each tile (CudaBackendOptions::latent_fold_combine_bytes): the parity suites run on both, and
// the folded merge gives the combine kernel's bits on every latent kernel (compact, tree, the
// general bf16 one, the f32 one), call after call, in CUDA graph replays and after a failed check,
// with one kernel launch fewer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention_ops.h"
#include "eagle3/backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parity_util.h"

namespace eagle3::parity {
namespace {

using ::testing::HasSubstr;

constexpr double kBf16Tol = 1e-2;
constexpr double kUnroundedTol = 3e-2;
// The f32 kernel on an f32 cache against the CPU (both fp32, summed in other orders).
constexpr double kF32Tol = 1e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Options whose latent calls merge their splits in the attention kernel wherever it can (fold) or
// always in the combine kernel.
cuda::CudaBackendOptions CombineOptions(bool fold) {
  cuda::CudaBackendOptions o;
  o.latent_fold_combine_bytes = fold ? std::numeric_limits<int64_t>::max() : 0;
  return o;
}

// A CudaBackend beside the fixture's, on the same device, with CombineOptions(fold).
std::unique_ptr<cuda::CudaBackend> CombineBackend(bool fold) {
  auto backend = cuda::CudaBackend::Create(CombineOptions(fold));
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

// The latent tree-kernel choice (cuda/attention_ops.h) for a scope; the previous one after it.
class ScopedTreeKernel {
 public:
  explicit ScopedTreeKernel(cuda::LatentTreeKernelChoice kernel) : saved_(cuda::GetLatentTreeKernelChoice()) {
    cuda::SetLatentTreeKernelChoice(kernel);
  }
  ~ScopedTreeKernel() { cuda::SetLatentTreeKernelChoice(saved_); }
  ScopedTreeKernel(const ScopedTreeKernel&) = delete;
  ScopedTreeKernel& operator=(const ScopedTreeKernel&) = delete;

 private:
  cuda::LatentTreeKernelChoice saved_;
};

// The wgmma kernel variant (cuda/attention_ops.h) for a scope; the previous one after it.
class ScopedWgmmaVariant {
 public:
  explicit ScopedWgmmaVariant(cuda::LatentWgmmaVariant variant) : saved_(cuda::GetLatentWgmmaVariant()) {
    cuda::SetLatentWgmmaVariant(variant);
  }
  ~ScopedWgmmaVariant() { cuda::SetLatentWgmmaVariant(saved_); }
  ScopedWgmmaVariant(const ScopedWgmmaVariant&) = delete;
  ScopedWgmmaVariant& operator=(const ScopedWgmmaVariant&) = delete;

 private:
  cuda::LatentWgmmaVariant saved_;
};

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// max |a - b| / max |b| over the elements that are numbers in both; +inf when NaN-ness differs.
double NanAwareError(const TensorView& a, const TensorView& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) {
    const float x = a.data_as<const float>()[i], y = b.data_as<const float>()[i];
    if (std::isnan(x) != std::isnan(y)) return std::numeric_limits<double>::infinity();
    if (std::isnan(y)) continue;
    diff = std::max(diff, std::fabs(static_cast<double>(x) - y));
    scale = std::max(scale, std::fabs(static_cast<double>(y)));
  }
  return diff / scale;
}

// The bf16 bits of a host f32 tensor (round to nearest even).
Tensor ToBf16(const Tensor& f32) {
  Tensor out = *Tensor::Empty(DType::kBF16, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) {
    out.data_as<uint16_t>()[i] = FloatToBf16(f32.data_as<const float>()[i]);
  }
  return out;
}

// f32 values rounded to bf16 (the values a bf16 cache holds).
Tensor Rounded(const Tensor& f32) {
  Tensor out = *Tensor::Empty(DType::kF32, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) {
    out.data_as<float>()[i] = Bf16ToFloat(FloatToBf16(f32.data_as<const float>()[i]));
  }
  return out;
}

Tensor Filled(const Shape& shape, float value) {
  Tensor t = *Tensor::Empty(DType::kF32, shape);
  std::fill(t.data_as<float>(), t.data_as<float>() + t.numel(), value);
  return t;
}

Tensor I32(const std::vector<int32_t>& values) {
  Tensor t = *Tensor::Empty(DType::kI32, Shape{static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data_as<int32_t>());
  return t;
}

class CudaLatentBf16Test : public ParityTest {
 protected:
  // The folded merge on the wgmma kernel under the current variant (WgmmaFoldedMergeIsTheCombineKernels).
  void ExpectWgmmaFoldedMergeIsTheCombineKernels();

  // One latent problem: the rows (already bf16-rounded, NaN where no position lives) as an f32
  // host cache and as a bf16 device cache, shuffled pages.
  struct Cache {
    Tensor host_f32;  // [num_pages, page_size, W], bf16-rounded values
    Tensor dev_bf16;
    std::vector<int32_t> pages;  // position p lives on page pages[p / page_size]
    int64_t num_pages = 0;
  };
  Cache MakeCache(int64_t positions, int64_t page_size, int64_t w, uint32_t seed) {
    Cache c;
    const int64_t used = (positions + page_size - 1) / page_size;
    c.num_pages = used + 2;
    std::vector<int32_t> order(static_cast<size_t>(c.num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    c.pages.assign(order.begin(), order.begin() + used);
    Tensor cache = Filled(Shape{c.num_pages, page_size, w}, kNaN);
    const Tensor values = Rounded(Random(Shape{std::max<int64_t>(positions, 1), w}, seed + 1));
    for (int64_t p = 0; p < positions; ++p) {
      std::memcpy(cache.data_as<float>() + (c.pages[p / page_size] * page_size + p % page_size) * w,
                  values.data_as<float>() + p * w, w * sizeof(float));
    }
    c.dev_bf16 = Upload(ToBf16(cache));
    c.host_f32 = std::move(cache);
    return c;
  }

  // What both forms' problems hold: the cache, q [t, heads, W] (and rounded to bf16), the mask and
  // page table, and their device copies.
  struct Problem {
    Cache c;
    Tensor q, q_rounded, mask, table;
    Tensor d_q, d_mask, d_table;
    int64_t t = 0, heads = 0, r = 0;
    float scale = 1.0f;
  };
  // Draws q for x (its cache, mask, table, t, heads and r set) and uploads q, the mask and the table;
  // then gpu_ synchronizes, so that other backends may read every upload.
  void FinishProblem(Problem& x, int64_t w, uint32_t seed) {
    x.q = Random(Shape{x.t, x.heads, w}, seed + 2);
    x.q_rounded = Rounded(x.q);
    x.scale = 1.0f / std::sqrt(static_cast<float>(w));
    x.d_q = Upload(x.q);
    x.d_mask = Upload(x.mask);
    x.d_table = Upload(x.table);
    EXPECT_TRUE(gpu_->Synchronize().ok());
  }

  // A LatentAttention problem: q [T, N, W] random, mask random / causal.
  struct Explicit : Problem {
    int64_t s = 0;
    absl::Status Run(Backend& backend, const TensorView& out) const {
      return backend.LatentAttention(d_q, c.dev_bf16, d_table, s, d_mask, scale, r, out);
    }
    Tensor Cpu(Backend& cpu, const Tensor& queries) const {
      Tensor ref = Filled(Shape{t, heads, r}, kNaN);
      EXPECT_TRUE(cpu.LatentAttention(queries, c.host_f32, table, s, mask, scale, r, ref).ok());
      return ref;
    }
  };
  Explicit MakeExplicit(int64_t t, int64_t n, int64_t s, int64_t page_size, int64_t w, int64_t r, bool causal,
                        uint32_t seed) {
    Explicit x;
    x.c = MakeCache(s, page_size, w, seed);
    x.mask = *Tensor::Zeros(DType::kU8, Shape{t, s});
    std::mt19937 rng(seed + 3);
    for (int64_t i = 0; i < t; ++i) {
      uint8_t* row = x.mask.data_as<uint8_t>() + i * s;
      for (int64_t j = 0; j < s; ++j) {
        row[j] = causal ? (j <= s - t + i ? 1 : 0) : (rng() % 3 == 0 ? 1 : 0);
      }
      row[causal ? 0 : rng() % s] = 1;
    }
    x.table = I32(x.c.pages);
    x.t = t;
    x.heads = n;
    x.s = s;
    x.r = r;
    FinishProblem(x, w, seed);
    return x;
  }

  // LatentAttention on the bf16 cache. Returns {error vs the CPU on rounded q, error vs the CPU on
  // unrounded q}.
  std::pair<double, double> RunLatent(int64_t t, int64_t n, int64_t s, int64_t page_size, int64_t w,
                                      int64_t r, bool causal, uint32_t seed) {
    const Explicit x = MakeExplicit(t, n, s, page_size, w, r, causal, seed);
    const Tensor got = OutputOf(*gpu_, Shape{t, n, r},
                                [&](cuda::CudaBackend& b, const TensorView& out) { return x.Run(b, out); });
    return {NanAwareError(got, x.Cpu(cpu_, x.q_rounded)), NanAwareError(got, x.Cpu(cpu_, x.q))};
  }

  // A BatchedLatentAttention problem: sequence b has n[b] new tokens and kv[b] keys on its own
  // shuffled pages of one shared cache; tree masks are random trees (ancestors + itself), else
  // causal. The device holds the bf16 cache and an f32 one with the same rounded rows.
  struct Batched : Problem {
    Tensor starts, kv;
    Tensor d_starts, d_kv, d_cache_f32;
    int64_t max_kv = 1;
    bool tree = false;
    TensorView Mask(const Tensor& m) const {
      return tree ? m.view() : TensorView(m.data(), DType::kU8, Shape{t, 0}, Shape{1, 1}, m.device());
    }
    // The op on the device over the bf16 cache (or the f32 one) into out.
    absl::Status Run(Backend& backend, bool f32_cache, const TensorView& out) const {
      return backend.BatchedLatentAttention(d_q, f32_cache ? d_cache_f32 : c.dev_bf16, d_table, d_starts, d_kv,
                                            max_kv, Mask(d_mask), scale, r, out);
    }
    // The CPU reference on the f32 cache with queries q.
    Tensor Cpu(Backend& cpu, const Tensor& queries) const {
      Tensor ref = Filled(Shape{t, heads, r}, kNaN);
      EXPECT_TRUE(cpu.BatchedLatentAttention(queries, c.host_f32, table, starts, kv, max_kv, Mask(mask), scale, r, ref)
                      .ok());
      return ref;
    }
  };
  Batched MakeBatched(const std::vector<int64_t>& n, const std::vector<int64_t>& kv, int64_t heads,
                      int64_t page_size, int64_t w, int64_t r, bool tree, uint32_t seed) {
    Batched x;
    const int64_t b = static_cast<int64_t>(n.size());
    int64_t max_n = 1;
    std::vector<int32_t> starts{0};
    for (int64_t i = 0; i < b; ++i) {
      x.t += n[i];
      starts.push_back(static_cast<int32_t>(x.t));
      x.max_kv = std::max(x.max_kv, kv[i]);
      max_n = std::max(max_n, n[i]);
    }
    const int64_t pages_per_seq = (x.max_kv + page_size - 1) / page_size + 1;
    // One cache for all sequences: sequence i owns pages [i * pages_per_seq, ...) of the shuffle.
    x.c = MakeCache(b * pages_per_seq * page_size, page_size, w, seed);
    x.table = *Tensor::Empty(DType::kI32, Shape{b, pages_per_seq});
    std::copy(x.c.pages.begin(), x.c.pages.begin() + b * pages_per_seq, x.table.data_as<int32_t>());
    const int64_t m = tree ? max_n + 1 : 0;
    x.mask = *Tensor::Zeros(DType::kU8, Shape{x.t, std::max<int64_t>(m, 1)});
    std::mt19937 rng(seed + 5);
    for (int64_t i = 0; i < b && tree; ++i) {
      std::vector<int64_t> parent(static_cast<size_t>(n[i]));
      for (int64_t k = 0; k < n[i]; ++k) {
        parent[k] = k == 0 ? -1 : static_cast<int64_t>(rng() % k);
        uint8_t* row = x.mask.data_as<uint8_t>() + (starts[i] + k) * m;
        for (int64_t a = k; a >= 0; a = parent[a]) row[a] = 1;
      }
    }
    x.starts = I32(starts);
    x.kv = I32(std::vector<int32_t>(kv.begin(), kv.end()));
    x.heads = heads;
    x.r = r;
    x.tree = tree;
    x.d_starts = Upload(x.starts);
    x.d_kv = Upload(x.kv);
    x.d_cache_f32 = Upload(x.c.host_f32);
    FinishProblem(x, w, seed);
    return x;
  }

  // The output of call(backend, out) on a fresh NaN-filled device tensor of `shape`, once `backend`
  // has finished.
  using DeviceCall = std::function<absl::Status(cuda::CudaBackend&, const TensorView&)>;
  Tensor OutputOf(cuda::CudaBackend& backend, const Shape& shape, const DeviceCall& call) {
    const Tensor out = Upload(Filled(shape, kNaN));
    EXPECT_TRUE(gpu_->Synchronize().ok());
    EXPECT_TRUE(call(backend, out).ok());
    EXPECT_TRUE(backend.Synchronize().ok());
    return Download(out);
  }

  // call(backend, out) captured in a CUDA graph, replayed twice with out reset to NaN before each
  // replay: each must give `eager`'s bits. Returns the graph's node count.
  size_t ExpectReplaysGive(cuda::CudaBackend& backend, const Shape& shape, const DeviceCall& call,
                           const Tensor& eager) {
    const Tensor out = Upload(Filled(shape, kNaN));
    EXPECT_TRUE(gpu_->Synchronize().ok());
    auto graph = cuda::CudaGraph::Capture(backend.stream(), [&] { return call(backend, out); });
    EXPECT_TRUE(graph.ok()) << graph.status();
    if (!graph.ok()) return 0;
    const Tensor nan = Filled(shape, kNaN);
    for (int replay = 0; replay < 2; ++replay) {
      EXPECT_TRUE(backend.Copy(nan, out).ok());
      EXPECT_TRUE((*graph)->Launch(backend.stream()).ok());
      EXPECT_TRUE(backend.Synchronize().ok());
      EXPECT_TRUE(SameBits(Download(out), eager)) << "replay " << replay;
    }
    return (*graph)->num_nodes();
  }

  // call on `folded` (CombineBackend(true)) twice and on `separate` (CombineBackend(false)), eagerly
  // and in CUDA graphs: the same bits every time (a count left on a fold counter would leave the
  // next call's output NaN), and where the call splits its keys, one kernel node fewer in the
  // folded graph (the merge ran in the attention kernel). Returns the output.
  Tensor ExpectFoldedMergeIsTheCombineKernels(cuda::CudaBackend& folded, cuda::CudaBackend& separate,
                                               const Shape& shape, const DeviceCall& call, bool split) {
    Tensor first = OutputOf(folded, shape, call);
    EXPECT_TRUE(SameBits(OutputOf(folded, shape, call), first)) << "the same call again";
    EXPECT_TRUE(SameBits(OutputOf(separate, shape, call), first)) << "the combine kernel";
    const size_t folded_nodes = ExpectReplaysGive(folded, shape, call, first);
    const size_t separate_nodes = ExpectReplaysGive(separate, shape, call, first);
    EXPECT_EQ(separate_nodes, folded_nodes + (split ? 1 : 0));
    return first;
  }

  // LatentAttention over cache rows that hold NaN where no query row allows the key (576 / 512, 16
  // heads, one sequence of 128 tokens: 64-row blocks): such a key must not reach the value product
  // (0 x NaN), whether it sits in a chunk with allowed keys (70, 201) or fills one (128..159). Pages
  // of 16 and 3.
  void ExpectKeysNoRowAllowsAreSkipped() {
    constexpr int64_t kT = 128, kHeads = 16, kS = 300, kW = 576, kR = 512;
    auto blocked = [](int64_t key) { return (key >= 128 && key < 160) || key == 70 || key == 201; };
    uint32_t seed = 900;
    for (int64_t page_size : {16, 3}) {
      SCOPED_TRACE(::testing::Message() << "page_size=" << page_size);
      Cache c = MakeCache(kS, page_size, kW, seed);
      for (int64_t key = 0; key < kS; ++key) {
        if (!blocked(key)) continue;
        float* row = c.host_f32.data_as<float>() + (c.pages[key / page_size] * page_size + key % page_size) * kW;
        std::fill(row, row + kW, kNaN);
      }
      c.dev_bf16 = Upload(ToBf16(c.host_f32));
      const Tensor q = Rounded(Random(Shape{kT, kHeads, kW}, seed + 2));
      Tensor mask = *Tensor::Zeros(DType::kU8, Shape{kT, kS});
      std::mt19937 rng(seed + 3);
      for (int64_t i = 0; i < kT; ++i) {
        uint8_t* row = mask.data_as<uint8_t>() + i * kS;
        for (int64_t j = 0; j < kS; ++j) row[j] = !blocked(j) && rng() % 3 == 0 ? 1 : 0;
        row[rng() % 64] = 1;  // every row allows a key
      }
      const Tensor table = I32(c.pages);
      const float scale = 1.0f / std::sqrt(static_cast<float>(kW));
      const Tensor d_q = Upload(q), d_table = Upload(table), d_mask = Upload(mask);
      Tensor d_out = Upload(Filled(Shape{kT, kHeads, kR}, kNaN));
      ASSERT_TRUE(gpu_->LatentAttention(d_q, c.dev_bf16, d_table, kS, d_mask, scale, kR, d_out).ok());
      Tensor ref = Filled(Shape{kT, kHeads, kR}, kNaN);
      ASSERT_TRUE(cpu_.LatentAttention(q, c.host_f32, table, kS, mask, scale, kR, ref).ok());
      const Tensor got = Download(d_out);
      int64_t nans = 0;
      for (int64_t i = 0; i < got.numel(); ++i) nans += std::isnan(got.data_as<const float>()[i]) ? 1 : 0;
      EXPECT_EQ(nans, 0);
      EXPECT_LE(NanAwareError(got, ref), kBf16Tol);
      seed += 10;
    }
  }

  // A batched call at DeepSeek's shape (576 / 512): the sequences' new tokens and keys, heads, page
  // size, random trees or causal.
  struct BatchedCase {
    std::vector<int64_t> n, kv;
    int64_t heads, page_size;
    bool tree;
  };
  // Calls that LatentBlockRows gives the tree kernel (>= 1024 rows per sequence, or >= 256 with 8+
  // sequences): see TreeKernelMatchesCpuOnRoundedInputs.
  static std::vector<BatchedCase> TreeKernelCases() {
    // Each case meets LatentBlockRows' rule for the tree kernel: >= 1024 rows per sequence, or >= 256
    // with 8+ sequences.
    const std::vector<int64_t> eight_16(8, 16);
    return {
        {eight_16, {100, 16, 1000, 4097, 33, 700, 2049, 17}, 16, 64, true},
        {eight_16, {33, 4095, 700, 16, 64, 65, 1023, 300}, 16, 1, true},
        {{64, 64}, {64, 1500}, 16, 3, true},
        {{64, 100}, {1500, 100}, 16, 16, true},
        {{16, 32, 16, 20, 24, 16, 17, 19}, {300, 32, 4000, 100, 24, 16, 17, 2000}, 16, 64, true},
        {{64, 64}, {64, 2000}, 16, 64, false},
        {{128, 128}, {128, 333}, 8, 64, true},
        {std::vector<int64_t>(8, 13), std::vector<int64_t>(8, 1025), 20, 16, true},
        {{512, 520}, {600, 520}, 2, 64, true},
        {std::vector<int64_t>(8, 2), {2, 1000, 4096, 3, 77, 2, 500, 64}, 128, 64, false},
        {std::vector<int64_t>(16, 64), std::vector<int64_t>(16, 300), 16, 64, true},
        // One sequence: 17 tiles, the last holding 2 of its 4 tokens, each tile's keys split.
        {{66}, {1100}, 16, 64, true},
        {{64}, {4096}, 16, 1, true},
    };
  }
  // Each case against the CPU on rounded and unrounded queries (seeds from `seed` on).
  void ExpectBatchedCasesMatchCpu(const std::vector<BatchedCase>& cases, uint32_t seed) {
    for (const BatchedCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << "B=" << c.n.size() << " heads=" << c.heads << " page_size="
                                        << c.page_size << " n0=" << c.n[0] << " kv0=" << c.kv[0]
                                        << (c.tree ? " tree" : " causal"));
      const auto [rounded, unrounded] = RunBatched(c.n, c.kv, c.heads, c.page_size, 576, 512, c.tree, seed);
      seed += 10;
      EXPECT_LE(rounded, kBf16Tol);
      EXPECT_LE(unrounded, kUnroundedTol);
      std::printf("B=%zu heads=%ld n0=%ld kv0=%ld: error %.2e vs rounded q, %.2e vs unrounded q\n", c.n.size(),
                  static_cast<long>(c.heads), static_cast<long>(c.n[0]), static_cast<long>(c.kv[0]), rounded,
                  unrounded);
    }
  }

  // BatchedLatentAttention on the bf16 cache. Returns {error vs the CPU on rounded q, error vs the
  // CPU on unrounded q}.
  std::pair<double, double> RunBatched(const std::vector<int64_t>& n, const std::vector<int64_t>& kv,
                                       int64_t heads, int64_t page_size, int64_t w, int64_t r,
                                       bool tree, uint32_t seed) {
    const Batched x = MakeBatched(n, kv, heads, page_size, w, r, tree, seed);
    const Tensor got = OutputOf(*gpu_, Shape{x.t, heads, r},
                                [&](cuda::CudaBackend& b, const TensorView& out) { return x.Run(b, false, out); });
    return {NanAwareError(got, x.Cpu(cpu_, x.q_rounded)), NanAwareError(got, x.Cpu(cpu_, x.q))};
  }
};

// The parity suites below run on both merges of a split call's results: the combine kernel, and the
// attention kernels' folded merge wherever it applies.
class CudaLatentBf16CombineTest : public CudaLatentBf16Test, public ::testing::WithParamInterface<bool> {
 protected:
  cuda::CudaBackendOptions Options() const override { return CombineOptions(GetParam()); }
  // The wgmma kernel's cases under the current variant (WgmmaKernelMatchesCpuOnRoundedInputs).
  void ExpectWgmmaCasesMatchCpu();
};

INSTANTIATE_TEST_SUITE_P(Merge, CudaLatentBf16CombineTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Folded" : "CombineKernel");
                         });

// Rows of awkward values (ties, subnormals, infinities, large finite values that round to inf)
// written at scattered positions through shuffled pages: every cache element is bitwise the host's
// FloatToBf16 of its row element (untouched slots keep their bits), and PagedRead returns exactly
// their widening. NaN rows stay NaN.
TEST_F(CudaLatentBf16Test, PagedWriteRoundsAndReadWidens) {
  uint32_t seed = 1;
  for (int64_t page_size : {1, 3, 64}) {
    for (int64_t w : {5, 576}) {
      for (DType pos_dtype : {DType::kI32, DType::kI64}) {
        SCOPED_TRACE(::testing::Message() << "page_size=" << page_size << " W=" << w
                                          << " i64=" << (pos_dtype == DType::kI64));
        const int64_t t = 37, pages = (2 * t + page_size - 1) / page_size, num_pages = pages + 2;
        std::mt19937 rng(seed++);
        std::vector<int32_t> table(static_cast<size_t>(num_pages));
        std::iota(table.begin(), table.end(), 0);
        std::shuffle(table.begin(), table.end(), rng);
        table.resize(static_cast<size_t>(pages));
        std::vector<int64_t> positions(static_cast<size_t>(pages * page_size));
        std::iota(positions.begin(), positions.end(), 0);
        std::shuffle(positions.begin(), positions.end(), rng);
        positions.resize(static_cast<size_t>(t));
        Tensor pos = *Tensor::Empty(pos_dtype, Shape{t});
        for (int64_t i = 0; i < t; ++i) {
          if (pos_dtype == DType::kI64) pos.data_as<int64_t>()[i] = positions[i];
          if (pos_dtype == DType::kI32) pos.data_as<int32_t>()[i] = static_cast<int32_t>(positions[i]);
        }
        // Rows in a [t, w + 3] buffer (row-strided view).
        Tensor rows = Random(Shape{t, w + 3}, seed++, 3.0f);
        const float specials[] = {1.0f + 0x1p-8f,  1.0f + 3 * 0x1p-8f, -1.0f - 0x1p-8f, 0x1p-130f,
                                  -0x1p-133f,       3.4e38f,            -3.39e38f,       INFINITY,
                                  -INFINITY,        0.0f,               -0.0f,           1.00390625f};
        for (int64_t i = 0; i < std::min<int64_t>(t * w, 12); ++i) {
          rows.data_as<float>()[(i % t) * (w + 3) + (i * 7) % w] = specials[i];
        }
        rows.data_as<float>()[(t - 1) * (w + 3)] = kNaN;
        Tensor cache_bits = *Tensor::Empty(DType::kBF16, Shape{num_pages, page_size, w});
        for (int64_t i = 0; i < cache_bits.numel(); ++i) cache_bits.data_as<uint16_t>()[i] = 0x1234;
        const Tensor d_rows = Upload(rows), d_pos = Upload(pos), d_table = Upload(I32(table));
        Tensor d_cache = Upload(cache_bits);
        ASSERT_TRUE(gpu_->PagedWrite(d_rows.view().Narrow(1, 0, w), d_pos, d_table, d_cache).ok());
        for (int64_t i = 0; i < t; ++i) {
          const int64_t p = positions[i];
          uint16_t* slot = cache_bits.data_as<uint16_t>() + (table[p / page_size] * page_size + p % page_size) * w;
          for (int64_t e = 0; e < w; ++e) slot[e] = FloatToBf16(rows.data_as<float>()[i * (w + 3) + e]);
        }
        const Tensor got = Download(d_cache);
        int64_t mismatches = 0;
        for (int64_t i = 0; i < got.numel(); ++i) {
          const uint16_t g = got.data_as<uint16_t>()[i], e = cache_bits.data_as<uint16_t>()[i];
          const bool both_nan = (g & 0x7fff) > 0x7f80 && (e & 0x7fff) > 0x7f80;
          if (g != e && !both_nan) ++mismatches;
        }
        EXPECT_EQ(mismatches, 0);

        Tensor d_out = Upload(Filled(Shape{t, w + 2}, kNaN));
        ASSERT_TRUE(gpu_->PagedRead(d_cache, d_table, d_pos, d_out.view().Narrow(1, 0, w)).ok());
        const Tensor out = Download(d_out);
        Tensor expect = Filled(Shape{t, w + 2}, kNaN);
        for (int64_t i = 0; i < t; ++i) {
          for (int64_t e = 0; e < w; ++e) {
            expect.data_as<float>()[i * (w + 2) + e] =
                Bf16ToFloat(FloatToBf16(rows.data_as<float>()[i * (w + 3) + e]));
          }
        }
        EXPECT_EQ(NanAwareError(out, expect), 0.0);
      }
    }
  }
}

// The explicit-mask form over contexts that are and are not multiples of the 32-key chunk and of
// the page size, page sizes 1 / 3 / 64, 16 / 8 / 5 / 1 heads, widths 576 / 512 (values 512), 72
// (values 64: pad dims) and 36 (not a multiple of 8: the kernel's plain-load path). At W = 576 one
// token of 16 heads runs the compact kernel, 4+ tokens (or 64 of one head) the tree kernel.
TEST_P(CudaLatentBf16CombineTest, LatentAttentionMatchesCpuOnRoundedInputs) {
  struct Case {
    int64_t t, n, s, page_size, w, r;
    bool causal;
  };
  const std::vector<Case> cases = {
      {1, 16, 1, 64, 576, 512, true},     {1, 16, 33, 1, 576, 512, true},
      {1, 16, 4097, 64, 576, 512, true},  {1, 8, 1000, 3, 576, 512, true},
      {8, 16, 100, 64, 576, 512, false},  {32, 8, 4096, 64, 512, 512, true},
      {7, 5, 65, 1, 72, 64, false},       {3, 2, 250, 3, 36, 20, true},
      {64, 1, 300, 64, 576, 512, false},  {1, 20, 129, 64, 72, 64, true},
      // >= 2048 query rows (tokens x heads): 64-row blocks, also with rows a tile leaves empty (5
      // heads x 12 tokens = 60 of 64), 64 values (warps 4-7 own no column) and the plain-load path.
      {410, 5, 450, 1, 72, 64, false},    {683, 3, 700, 3, 36, 20, true},
      {128, 16, 200, 64, 576, 512, false},
      // >= 64 rows at W = 576: the tree kernel, a context ending mid-chunk, page sizes 3 and 1.
      {16, 16, 4097, 3, 576, 512, false}, {4, 16, 1000, 1, 576, 512, true},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.t << " N=" << c.n << " S=" << c.s
                                      << " page_size=" << c.page_size << " W=" << c.w
                                      << " R=" << c.r << (c.causal ? " causal" : " random"));
    const auto [rounded, unrounded] = RunLatent(c.t, c.n, c.s, c.page_size, c.w, c.r, c.causal, seed);
    seed += 10;
    EXPECT_LE(rounded, kBf16Tol);
    EXPECT_LE(unrounded, kUnroundedTol);
    std::printf("T=%ld N=%ld S=%ld: error %.2e vs rounded q, %.2e vs unrounded q\n",
                static_cast<long>(c.t), static_cast<long>(c.n), static_cast<long>(c.s), rounded,
                unrounded);
  }
}

// Decode (1 token) and tree verify (8 / 32 tokens, random trees) over batches of different
// lengths, page sizes 1 and 64, 16 and 8 heads: 16-row blocks (decode) and 64-row blocks (a
// sequence averaging >= 64 query rows; at W = 576 the tree kernel, latent_tree_kernels.cu). Decode
// of one sequence at 1K / 4K keys and at lengths off the 64-key chunk splits its keys the most.
TEST_P(CudaLatentBf16CombineTest, BatchedLatentAttentionMatchesCpuOnRoundedInputs) {
  struct Case {
    std::vector<int64_t> n, kv;
    int64_t heads, page_size, w, r;
    bool tree;
  };
  const std::vector<Case> cases = {
      {{1}, {1}, 16, 64, 576, 512, false},
      {{1}, {4096}, 16, 64, 576, 512, false},
      {{1}, {1024}, 16, 1, 576, 512, false},
      {{1}, {1000}, 16, 64, 576, 512, false},
      {{1}, {4097}, 16, 1, 576, 512, false},
      {std::vector<int64_t>(8, 1), {4096, 65, 1, 2049, 300, 31, 32, 4000}, 16, 1, 576, 512, false},
      {{1, 1, 1, 1}, {1, 33, 64, 1000}, 16, 1, 576, 512, false},
      {{1, 1, 1, 1, 1, 1, 1, 1}, {4096, 65, 1, 2049, 300, 31, 32, 4000}, 8, 64, 576, 512, false},
      {{8, 8}, {8, 700}, 16, 64, 576, 512, true},
      {{32, 1, 8}, {4096, 2, 100}, 16, 1, 576, 512, true},
      {{8, 8, 8}, {50, 3000, 8}, 8, 64, 576, 512, true},
      {{5, 3}, {5, 40}, 16, 64, 576, 512, false},  // causal, several tokens
      {{1, 2, 0, 3}, {7, 9, 4, 100}, 4, 3, 72, 64, true},
      // 64-row blocks (>= 2048 rows): 64 values, sequences of 3 tokens (a partly empty tile); 16
      // heads x 64 tokens of 576.
      {{256, 3, 256, 256, 3, 256, 256, 256}, {300, 3, 256, 1000, 30, 400, 256, 257}, 4, 64, 72, 64, true},
      {{64, 64, 8}, {1500, 100, 700}, 16, 64, 576, 512, true},
  };
  uint32_t seed = 500;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.n.size() << " heads=" << c.heads << " page_size="
                                      << c.page_size << " W=" << c.w << " n0=" << c.n[0]
                                      << " kv0=" << c.kv[0] << (c.tree ? " tree" : " causal"));
    const auto [rounded, unrounded] =
        RunBatched(c.n, c.kv, c.heads, c.page_size, c.w, c.r, c.tree, seed);
    seed += 10;
    EXPECT_LE(rounded, kBf16Tol);
    EXPECT_LE(unrounded, kUnroundedTol);
    std::printf("B=%zu heads=%ld kv0=%ld: error %.2e vs rounded q, %.2e vs unrounded q\n",
                c.n.size(), static_cast<long>(c.heads), static_cast<long>(c.kv[0]), rounded, unrounded);
  }
}

// Keys no row allows, their cache rows NaN (ExpectKeysNoRowAllowsAreSkipped), on the tree kernel.
TEST_P(CudaLatentBf16CombineTest, KeysNoRowAllowsMayHoldNaN) {
  const ScopedTreeKernel mma(cuda::LatentTreeKernelChoice::kMma);
  ExpectKeysNoRowAllowsAreSkipped();
}

// The tree kernel (64-row blocks at W = 576, R = 512, where LatentBlockRows routes to it):
// 16 / 64 tokens x 16 heads with random trees, contexts that end mid-chunk (and the splits
// the launcher cuts them into), page sizes 1 / 3 / 16 / 64, sequences whose keys are all new (kv ==
// n), mixed token counts in one batch (short sequences leave tile rows empty), one sequence of 66
// tokens (its last tile half full) or 64 tokens after 4K keys, causal without a
// mask, 8 / 20 heads (tiles of 8 x 8 and 3 x 20 = 60 rows), 2 heads x 32+ tokens (more tokens per
// tile than warps), 128 heads x 1 token (two 64-head tiles, launched as a programmatic dependent of
// the check), and a batch large enough for one split (results written directly, no combine).
TEST_P(CudaLatentBf16CombineTest, TreeKernelMatchesCpuOnRoundedInputs) {
  const ScopedTreeKernel mma(cuda::LatentTreeKernelChoice::kMma);
  ExpectBatchedCasesMatchCpu(TreeKernelCases(), 900);
}

// The wgmma kernel (latent_wgmma_kernels.cu, where SetLatentTreeKernelChoice chooses it): the tree
// kernel's cases, the calls it alone takes with 64-row blocks (sequences averaging 64 to 1023 query
// rows: trees of 4-16 tokens at 16 heads in small batches, causal runs of several tokens, 64 and 128
// heads at one token: one and two head tiles, the latter after the check as a programmatic
// dependent), sequences whose keys are all new, the explicit-mask form (random and causal), keys no
// row allows whose cache rows hold NaN, and under kWgmmaAll decode at 16 and 8 heads. Skipped where
// the device does not run sm_90a code.
// Both variants (LatentWgmmaVariant): both warpgroups on each chunk, and warpgroups owning
// alternate chunks (odd chunk counts, one chunk, splits of one pair among the cases).
TEST_P(CudaLatentBf16CombineTest, WgmmaKernelMatchesCpuOnRoundedInputs) {
  if (!cuda::LatentWgmmaAvailable()) GTEST_SKIP() << "the device does not run sm_90a code";
  for (const cuda::LatentWgmmaVariant variant : {cuda::LatentWgmmaVariant::kSingle, cuda::LatentWgmmaVariant::kPair}) {
    SCOPED_TRACE(variant == cuda::LatentWgmmaVariant::kPair ? "paired chunks" : "single");
    const ScopedWgmmaVariant scoped(variant);
    ExpectWgmmaCasesMatchCpu();
  }
}

void CudaLatentBf16CombineTest::ExpectWgmmaCasesMatchCpu() {
  const ScopedTreeKernel wgmma(cuda::LatentTreeKernelChoice::kWgmma);
  ExpectBatchedCasesMatchCpu(TreeKernelCases(), 1900);
  ExpectBatchedCasesMatchCpu({{{4}, {4096}, 16, 64, true},
                              {{8}, {1000}, 16, 1, true},
                              {{8, 8, 8, 8}, {4096, 33, 700, 65}, 16, 3, true},
                              {{16, 4}, {4097, 4}, 16, 64, true},
                              {{5, 3, 8}, {70, 3, 64}, 16, 64, false},
                              {{1, 1, 1}, {4096, 5, 1000}, 128, 64, false},
                              {{1}, {100}, 64, 16, false},
                              {{4}, {4}, 16, 1, true}},
                             2900);
  uint32_t seed = 3900;
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "explicit mask, 16 x 4097 causal" : "explicit mask, 4 x 1000 random");
    const auto [rounded, unrounded] = causal ? RunLatent(16, 16, 4097, 64, 576, 512, true, seed)
                                             : RunLatent(4, 16, 1000, 3, 576, 512, false, seed);
    seed += 10;
    EXPECT_LE(rounded, kBf16Tol);
    EXPECT_LE(unrounded, kUnroundedTol);
  }
  ExpectKeysNoRowAllowsAreSkipped();
  // kWgmmaAll: decode too (a block's 64 rows hold one token's 16 or 8 heads), one sequence of 1 / 4K
  // keys, 8 of mixed lengths on pages of 1 and 64, and a causal batch of several tokens.
  const ScopedTreeKernel all(cuda::LatentTreeKernelChoice::kWgmmaAll);
  const std::vector<int64_t> mixed = {4096, 65, 1, 2049, 300, 31, 32, 4000};
  ExpectBatchedCasesMatchCpu({{{1}, {1}, 16, 64, false},
                              {{1}, {4096}, 16, 64, false},
                              {std::vector<int64_t>(8, 1), mixed, 16, 1, false},
                              {std::vector<int64_t>(8, 1), mixed, 8, 64, false},
                              {{5, 3}, {5, 40}, 16, 64, false}},
                             4900);
}

// The folded merge against the combine kernel, bitwise, on every latent kernel at DeepSeek's shape
// (16 heads, 576 / 512) and beside it: one decode sequence of 1 (no split) / 1K / 4K + 1 keys (page
// sizes 64 and 1), 8 of mixed lengths (some in one split; at 8 heads a tile has rows for 2 tokens
// and holds 1), several tokens per sequence on the compact kernel, the tree kernel (a last tile half full;
// 8 sequences of 16 tokens), the general bf16 kernel (W = 72), the f32 kernel, and the explicit-mask
// form (random masks: splits where a row allows no key weigh 0). Each result also matches the CPU.
TEST_F(CudaLatentBf16Test, FoldedMergeIsTheCombineKernels) {
  const std::unique_ptr<cuda::CudaBackend> folded = CombineBackend(true), separate = CombineBackend(false);
  ASSERT_TRUE(folded != nullptr && separate != nullptr);
  struct Case {
    const char* what;
    std::vector<int64_t> n, kv;
    int64_t heads, page_size, w, r;
    bool tree, f32_cache, split;
  };
  const std::vector<int64_t> decode8(8, 1), mixed = {4096, 65, 1, 2049, 300, 31, 32, 4000};
  const std::vector<Case> cases = {
      {"compact, 1 x 1K", {1}, {1024}, 16, 64, 576, 512, false, false, true},
      {"compact, 1 x 4097, page 1", {1}, {4097}, 16, 1, 576, 512, false, false, true},
      {"compact, 1 x 1 (one split)", {1}, {1}, 16, 64, 576, 512, false, false, false},
      {"compact, 8 mixed, page 1", decode8, mixed, 16, 1, 576, 512, false, false, true},
      {"compact, 8 mixed at 8 heads", decode8, mixed, 8, 64, 576, 512, false, false, true},
      {"compact, tree of 8 tokens", {8, 8}, {77, 4000}, 16, 64, 576, 512, true, false, true},
      {"tree kernel, 66 tokens", {66}, {1100}, 16, 64, 576, 512, true, false, true},
      {"tree kernel, 8 x 16 tokens", std::vector<int64_t>(8, 16), {100, 16, 1000, 4097, 33, 700, 2049, 17}, 16, 1,
       576, 512, true, false, true},
      {"general bf16 kernel", {1, 1}, {1000, 70}, 16, 64, 72, 64, false, false, true},
      {"f32 kernel, 1 x 1K", {1}, {1024}, 16, 64, 576, 512, false, true, true},
      {"f32 kernel, 8 mixed at 8 heads", decode8, mixed, 8, 16, 576, 512, false, true, true},
  };
  uint32_t seed = 2000;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Batched x = MakeBatched(c.n, c.kv, c.heads, c.page_size, c.w, c.r, c.tree, seed);
    seed += 10;
    const Tensor got = ExpectFoldedMergeIsTheCombineKernels(
        *folded, *separate, Shape{x.t, c.heads, c.r},
        [&](cuda::CudaBackend& b, const TensorView& out) { return x.Run(b, c.f32_cache, out); }, c.split);
    if (c.f32_cache) {
      EXPECT_LE(NanAwareError(got, x.Cpu(cpu_, x.q)), kF32Tol);
    } else {
      EXPECT_LE(NanAwareError(got, x.Cpu(cpu_, x.q_rounded)), kBf16Tol);
    }
  }
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "explicit mask, 4 x 300 causal" : "explicit mask, 1 x 4097 random");
    const Explicit x = causal ? MakeExplicit(4, 16, 300, 1, 576, 512, true, seed)
                              : MakeExplicit(1, 16, 4097, 64, 576, 512, false, seed);
    seed += 10;
    const Tensor got = ExpectFoldedMergeIsTheCombineKernels(
        *folded, *separate, Shape{x.t, x.heads, x.r},
        [&](cuda::CudaBackend& b, const TensorView& out) { return x.Run(b, out); }, true);
    EXPECT_LE(NanAwareError(got, x.Cpu(cpu_, x.q_rounded)), kBf16Tol);
  }
}

// The folded merge on the wgmma kernel: the combine kernel's bits, eagerly and in graph replays
// (8-token trees, 128 heads at one token, the explicit-mask form), each within the CPU tolerance.
TEST_F(CudaLatentBf16Test, WgmmaFoldedMergeIsTheCombineKernels) {
  if (!cuda::LatentWgmmaAvailable()) GTEST_SKIP() << "the device does not run sm_90a code";
  for (const cuda::LatentWgmmaVariant variant : {cuda::LatentWgmmaVariant::kSingle, cuda::LatentWgmmaVariant::kPair}) {
    SCOPED_TRACE(variant == cuda::LatentWgmmaVariant::kPair ? "paired chunks" : "single");
    const ScopedWgmmaVariant scoped(variant);
    ExpectWgmmaFoldedMergeIsTheCombineKernels();
  }
}

void CudaLatentBf16Test::ExpectWgmmaFoldedMergeIsTheCombineKernels() {
  const ScopedTreeKernel wgmma(cuda::LatentTreeKernelChoice::kWgmma);
  const std::unique_ptr<cuda::CudaBackend> folded = CombineBackend(true), separate = CombineBackend(false);
  ASSERT_TRUE(folded != nullptr && separate != nullptr);
  struct Case {
    const char* what;
    std::vector<int64_t> n, kv;
    int64_t heads, page_size;
    bool tree;
  };
  const std::vector<Case> cases = {
      {"trees of 8 tokens", {8, 8}, {77, 4000}, 16, 64, true},
      {"128 heads, one token", {1, 1}, {1000, 4097}, 128, 1, false},
  };
  uint32_t seed = 4000;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Batched x = MakeBatched(c.n, c.kv, c.heads, c.page_size, 576, 512, c.tree, seed);
    seed += 10;
    const Tensor got = ExpectFoldedMergeIsTheCombineKernels(
        *folded, *separate, Shape{x.t, c.heads, 512},
        [&](cuda::CudaBackend& b, const TensorView& out) { return x.Run(b, false, out); }, true);
    EXPECT_LE(NanAwareError(got, x.Cpu(cpu_, x.q_rounded)), kBf16Tol);
  }
  const Explicit x = MakeExplicit(4, 16, 300, 1, 576, 512, true, seed);
  const Tensor got = ExpectFoldedMergeIsTheCombineKernels(
      *folded, *separate, Shape{x.t, x.heads, x.r},
      [&](cuda::CudaBackend& b, const TensorView& out) { return x.Run(b, out); }, true);
  EXPECT_LE(NanAwareError(got, x.Cpu(cpu_, x.q_rounded)), kBf16Tol);
}

// A call whose check fails (a page entry out of range) writes nothing and leaves the fold counters
// at zero (its blocks exit before they count), so the next call merges as the combine kernel does.
TEST_F(CudaLatentBf16Test, FoldedMergeAfterAFailedCheck) {
  const std::unique_ptr<cuda::CudaBackend> folded = CombineBackend(true), separate = CombineBackend(false);
  ASSERT_TRUE(folded != nullptr && separate != nullptr);
  Batched x = MakeBatched({1, 1}, {1000, 3000}, 16, 64, 576, 512, false, 3000);
  Tensor bad_table = *Tensor::Empty(DType::kI32, x.table.shape());
  std::memcpy(bad_table.data(), x.table.data(), x.table.nbytes());
  bad_table.data_as<int32_t>()[x.table.dim(1) + 2] = -3;
  Tensor good_table = std::move(x.d_table);
  x.d_table = Upload(bad_table);
  const Shape shape{x.t, x.heads, x.r};
  const Tensor out = Upload(Filled(shape, kNaN));
  ASSERT_TRUE(gpu_->Synchronize().ok());
  EXPECT_TRUE(x.Run(*folded, false, out).ok());
  const absl::Status deferred = folded->Synchronize();
  EXPECT_EQ(deferred.code(), absl::StatusCode::kInvalidArgument) << deferred;
  EXPECT_TRUE(SameBits(Download(out), Filled(shape, kNaN))) << "out was written";
  x.d_table = std::move(good_table);
  const Tensor got = ExpectFoldedMergeIsTheCombineKernels(
      *folded, *separate, shape, [&](cuda::CudaBackend& b, const TensorView& out) { return x.Run(b, false, out); },
      true);
  EXPECT_LE(NanAwareError(got, x.Cpu(cpu_, x.q_rounded)), kBf16Tol);
}

// Host-side refusals: q and out stay f32; the cache is f32 or bf16 (an f16 cache is named).
TEST_F(CudaLatentBf16Test, RefusesOtherDtypesNamingTheTensor) {
  const Cache c = MakeCache(10, 4, 16, 1);
  const Tensor d_table = Upload(I32(c.pages));
  const Tensor d_mask = Upload(*Tensor::Zeros(DType::kU8, Shape{1, 10}));
  const Tensor q = Upload(Random(Shape{1, 2, 16}, 2));
  const Tensor q16 = Upload(ToBf16(Random(Shape{1, 2, 16}, 2)));
  Tensor out = Upload(Filled(Shape{1, 2, 8}, 0.0f));
  const Tensor f16_cache = *Tensor::Empty(DType::kF16, c.dev_bf16.shape(), gpu_->allocator());
  absl::Status st = gpu_->LatentAttention(q16, c.dev_bf16, d_table, 10, d_mask, 1.0f, 8, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("q is bf16"));
  st = gpu_->LatentAttention(q, f16_cache, d_table, 10, d_mask, 1.0f, 8, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("cache is f16"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("f32 or bf16 cache"));
  const Tensor pos = Upload(I32({0}));
  st = gpu_->PagedWrite(Upload(Random(Shape{1, 16}, 3)), pos, d_table, f16_cache);
  EXPECT_THAT(std::string(st.message()), HasSubstr("cache is f16"));
  st = gpu_->PagedRead(c.dev_bf16, d_table, pos, Upload(ToBf16(Random(Shape{1, 16}, 3))));
  EXPECT_THAT(std::string(st.message()), HasSubstr("out is bf16"));
}

}  // namespace
}  // namespace eagle3::parity
