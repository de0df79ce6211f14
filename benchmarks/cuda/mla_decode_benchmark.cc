// Absorbed MLA decode / tree verify through CudaBackend::BatchedLatentAttention at the DeepSeek
// shapes of issue 6: 16 and 8 heads per rank, latent rows of 576 (512 + 64 rope) in a bf16 or f32
// cache (cache_bits 16 / 32), values the first 512 columns, page size 64, batch 1/8/32/64, context
// 1K-64K, 1 query token per sequence (decode) or 4/8/16/32/64 (tree verify with a random tree mask);
// and 128 heads at one token (bf16), FlashMLA's headline shape.
// CUDA events (bench_util.h's TimeOnce per iteration, in its NVTX range), Google Benchmark manual
// time, medians of repetitions; the backend, inputs, ceilings and counters of bench_util.h.
//
// Counters (bench_util.h's ReportRoofline): bytes = batch x context x 576 x (2 or 4) (each cached
// row read once) + q + out (f32); flops = query rows x heads x context x 2 x (576 + 512) (scores and
// values; runs before 2026-12-01g's follow-up counted no flops, so their tree-verify floors were the
// bytes alone); floor_us = max(bytes / copy rate, flops / bf16 GEMM rate), both measured in the run.
//
// PREDICTION for the bf16 cache (tensor-core kernel; written before any run of it; H200, copy
// ~4.16 TB/s). Per 32-key chunk a block spends ~1300 cycles (~0.7 us) of dependent MMA / softmax /
// barrier latency while the chunk's 36.9 KB take ~1.15 us at 1/132 of the copy rate, so decode is
// bandwidth bound with one block per SM and 3 chunks (110 KB) in flight:
//   16 heads, 1 token, batch 32 x 4K:  floor ~37 us; predicted ~45 us (0.8 of the floor).
//   16 heads, 1 token, batch 1 x 64K:  floor ~18 us; predicted ~26 us (0.7: prologue, combine).
//   16 heads, 8 tokens, batch 32 x 4K: floor ~41 us; predicted ~190 us (0.2): a block serves one
//     token's 16 heads, so each key row is read (from L2) by 8 blocks and the chunk latency
//     (256 blocks x 128 chunks x ~0.7 us over 132 SMs) bounds it; blocks of 64 rows would fix it.
//
// PREDICTION (written before any measurement of this kernel; fp32 cache, H200, copy ~4.16 TB/s):
// the kernel is FMA-issue bound at 16 heads (16 x 1088 FMAs per 2304-byte row is the fp32 CUDA-core
// rate at the copy rate), bandwidth bound at 8 heads.
//   16 heads, 1 token, batch 32 x 4K:  floor ~73 us; predicted ~120 us (0.6 of the floor).
//   16 heads, 1 token, batch 1 x 64K:  floor ~36 us; predicted ~60 us (0.6).
//   8 heads: ~0.75-0.85 of the floor at >= 4K keys. 1K contexts: ~10-15 us (launch-bound).
//   Tree verify (T = 64 per sequence) is compute bound at fp32: ~40x the decode time per sequence.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench_util.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/tensor.h"

namespace eagle3::cuda {
namespace {

constexpr int64_t kWidth = 576, kValues = 512, kPage = 64;

using bench::Backend;
using bench::Median;
using bench::RandomDevice;
using bench::ToDevice;

// args: heads, context, batch, query tokens per sequence, cache bits (16: bf16, 32: f32).
void BM_BatchedLatentAttention(benchmark::State& state) {
  CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t heads = state.range(0), context = state.range(1), batch = state.range(2),
                tokens = state.range(3), t = batch * tokens;
  const DType cache_dtype = state.range(4) == 16 ? DType::kBF16 : DType::kF32;
  const double elem = cache_dtype == DType::kBF16 ? 2.0 : 4.0;
  const int64_t pages_per_seq = (context + kPage - 1) / kPage;
  const double cache_bytes = static_cast<double>(batch * pages_per_seq * kPage * kWidth) * elem;
  // Rotated copies of the cache exceed twice the L2 (up to 128 of them: 1.2 MB at batch 1 x 1K bf16).
  const int copies = bench::CopiesToDefeatL2(cache_bytes, 128);
  std::vector<Tensor> caches;
  for (int i = 0; i < copies; ++i) {
    caches.push_back(RandomDevice(cache_dtype, Shape{batch * pages_per_seq, kPage, kWidth}, 1 + i));
  }
  Tensor q = RandomDevice(DType::kF32, Shape{t, heads, kWidth}, 100);
  Tensor out = *Tensor::Empty(DType::kF32, Shape{t, heads, kValues}, b->allocator());
  Tensor tables = *Tensor::Empty(DType::kI32, Shape{batch, pages_per_seq});
  std::vector<int32_t> perm(static_cast<size_t>(batch * pages_per_seq));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  std::copy(perm.begin(), perm.end(), tables.data_as<int32_t>());
  Tensor starts = *Tensor::Empty(DType::kI32, Shape{batch + 1});
  Tensor lens = *Tensor::Empty(DType::kI32, Shape{batch});
  for (int64_t i = 0; i <= batch; ++i) starts.data_as<int32_t>()[i] = static_cast<int32_t>(i * tokens);
  for (int64_t i = 0; i < batch; ++i) lens.data_as<int32_t>()[i] = static_cast<int32_t>(context);
  // A random tree per sequence (ancestors + itself) when verifying more than one token.
  Tensor mask = *Tensor::Zeros(DType::kU8, Shape{t, tokens});
  std::mt19937 rng(9);
  for (int64_t s = 0; s < batch && tokens > 1; ++s) {
    std::vector<int64_t> parent(static_cast<size_t>(tokens));
    for (int64_t k = 0; k < tokens; ++k) {
      parent[k] = k == 0 ? -1 : static_cast<int64_t>(rng() % k);
      for (int64_t a = k; a >= 0; a = parent[a]) mask.data_as<uint8_t>()[(s * tokens + k) * tokens + a] = 1;
    }
  }
  const Tensor d_tables = ToDevice(tables), d_starts = ToDevice(starts), d_lens = ToDevice(lens);
  const Tensor d_mask = ToDevice(mask);
  const TensorView mask_view =
      tokens > 1 ? d_mask.view() : TensorView(d_mask.data(), DType::kU8, Shape{t, 0}, Shape{1, 1}, d_mask.device());
  auto step = [&](int i) {
    (void)b->BatchedLatentAttention(q, caches[static_cast<size_t>(i) % caches.size()], d_tables, d_starts, d_lens,
                                    context, mask_view, 0.04f, kValues, out);
  };
  step(0);
  if (absl::Status st = b->Synchronize(); !st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
  int iteration = 0;
  std::vector<double> all;
  for (auto _ : state) {
    const double seconds = bench::TimeOnce(b->stream(), [&] { step(iteration++); });
    all.push_back(seconds);
    state.SetIterationTime(seconds);
  }
  const double seconds = Median(all);
  const double bytes = static_cast<double>(batch) * context * kWidth * elem +
                       static_cast<double>(t) * heads * (kWidth + kValues) * 4.0;
  // Every query row scores `context` keys (576-wide dot products) and sums as many 512-wide values.
  const double flops = static_cast<double>(t) * heads * context * 2.0 * (kWidth + kValues);
  bench::ReportRoofline(state, seconds, bytes, flops);
}
// The shapes; EAGLE3_BENCH_QUICK=1 (run_all.sh --quick) keeps the headline rows only, because
// filling the larger caches (up to 64 x 64K x 576 f32 = 9.7 GB) dominates the full run's time.
// The quick rows include the headline tree-verify row (32 x 4K x 8 tokens) and batch 1.
void Shapes(benchmark::internal::Benchmark* b) {
  const char* quick_env = std::getenv("EAGLE3_BENCH_QUICK");
  const bool quick = quick_env != nullptr && std::string(quick_env) != "0" && std::string(quick_env) != "";
  if (quick) {
    b->ArgsProduct({{16, 8}, {4096, 65536}, {1, 32}, {1}, {16, 32}});
    b->ArgsProduct({{16}, {4096}, {1, 8, 32}, {8, 64}, {16, 32}});
    b->ArgsProduct({{128}, {4096}, {1, 32}, {1}, {16}});
    return;
  }
  b->ArgsProduct({{16, 8}, {1024, 4096, 16384, 65536}, {1, 8, 32, 64}, {1}, {16, 32}});
  b->ArgsProduct({{16, 8}, {4096}, {1, 8, 32}, {4, 8, 16, 32, 64}, {16, 32}});
  // All 128 heads of one token in a block set (DeepSeek-V3 at TP 1, or an engine running
  // attention data-parallel): FlashMLA's own headline shape; bf16 cache only.
  b->ArgsProduct({{128}, {1024, 4096, 16384, 65536}, {1, 8, 32, 64}, {1}, {16}});
}
BENCHMARK(BM_BatchedLatentAttention)
    ->Apply(Shapes)
    ->ArgNames({"heads", "context", "batch", "qtokens", "cache_bits"})
    ->UseManualTime()
    ->Repetitions(3)
    ->Iterations(50)  // a fixed count: see TimedIterations in bench_util.h
    ->ReportAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace eagle3::cuda

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
