// Decode-time CUDA ops at real DeepSeek shapes, timed with CUDA events (Google Benchmark manual time,
// medians of repetitions), each with its roofline floor from ceilings measured in the same run:
// the device-to-device copy rate (read + write bytes / time) and the cuBLASLt bf16 GEMM rate.
//
//   BM_LatentAttentionDecode/heads/context/batch : absorbed MLA decode over the paged latent cache
//   BM_MoeDecode/tokens                          : V3 TP8 rank MoE (256 experts, I 256, H 7168, top-8)
//
// The models store f32 today, so the byte floors are counted at 4 bytes per element.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/tensor.h"

namespace eagle3::cuda {
namespace {

struct Ceilings {
  double copy_bytes_per_s = 0;  // read + write
  double gemm_flops_per_s = 0;
};

CudaBackend* Backend() {
  static std::unique_ptr<CudaBackend> backend = [] {
    CudaBackendOptions options;
    options.max_rows = 256;
    options.max_context_len = 65536;
    auto b = CudaBackend::Create(options);
    return b.ok() ? std::move(*b) : nullptr;
  }();
  return backend.get();
}

// Median of `reps` CUDA-event timings of fn() on the backend's stream, in seconds.
template <typename Fn>
double TimeMedian(int reps, Fn&& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start, Backend()->stream());
    fn();
    cudaEventRecord(stop, Backend()->stream());
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

const Ceilings& MeasuredCeilings() {
  static Ceilings c = [] {
    Ceilings out;
    CudaBackend* b = Backend();
    const int64_t bytes = int64_t{1} << 30;
    auto src = Tensor::Empty(DType::kU8, Shape{bytes}, b->allocator());
    auto dst = Tensor::Empty(DType::kU8, Shape{bytes}, b->allocator());
    if (src.ok() && dst.ok()) {
      const double t = TimeMedian(9, [&] {
        cudaMemcpyAsync(dst->data(), src->data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, b->stream());
      });
      out.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / t;
    }
    const int64_t n = 8192;
    auto a = Tensor::Empty(DType::kBF16, Shape{n, n}, b->allocator());
    auto w = Tensor::Empty(DType::kBF16, Shape{n, n}, b->allocator());
    auto o = Tensor::Empty(DType::kF32, Shape{n, n}, b->allocator());
    if (a.ok() && w.ok() && o.ok()) {
      cudaMemsetAsync(a->data(), 0, a->nbytes(), b->stream());
      cudaMemsetAsync(w->data(), 0, w->nbytes(), b->stream());
      const double t = TimeMedian(5, [&] { (void)b->Gemm(*a, *w, *o, GemmOptions{}); });
      out.gemm_flops_per_s = 2.0 * static_cast<double>(n) * n * n / t;
    }
    return out;
  }();
  return c;
}

void Report(benchmark::State& state, double seconds, double bytes, double flops) {
  const Ceilings& c = MeasuredCeilings();
  const double floor = std::max(bytes / c.copy_bytes_per_s, flops / c.gemm_flops_per_s);
  state.counters["us"] = seconds * 1e6;
  state.counters["floor_us"] = floor * 1e6;
  state.counters["of_floor"] = floor / seconds;  // fraction of the floor achieved (1 = at the floor)
  state.counters["GB/s"] = bytes / seconds * 1e-9;
  state.counters["copy_GB/s"] = c.copy_bytes_per_s * 1e-9;
  state.counters["gemm_TFLOP/s"] = c.gemm_flops_per_s * 1e-12;
}

Tensor RandomDevice(DType dtype, const Shape& shape, uint32_t seed) {
  Tensor host = *Tensor::Empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < host.numel(); ++i) host.data_as<float>()[i] = dist(rng);
  Tensor d = *Tensor::Empty(dtype, shape, Backend()->allocator());
  (void)Backend()->Copy(host, d);
  return d;
}

// Absorbed MLA decode: one query token per sequence, `heads` heads of width 576 (512 latent + 64
// rope) over `context` cached rows; `batch` sequences with disjoint pages (no L2 reuse between them).
void BM_LatentAttentionDecode(benchmark::State& state) {
  CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t heads = state.range(0), context = state.range(1), batch = state.range(2);
  const int64_t w = 576, r = 512, page = 64;
  const int64_t pages_per_seq = (context + page - 1) / page;
  const int64_t pages = pages_per_seq * batch;
  Tensor cache = RandomDevice(DType::kF32, Shape{pages, page, w}, 1);
  Tensor q = RandomDevice(DType::kF32, Shape{1, heads, w}, 2);
  Tensor out = *Tensor::Empty(DType::kF32, Shape{1, heads, r}, b->allocator());
  Tensor host_table = *Tensor::Empty(DType::kI32, Shape{pages});
  for (int64_t p = 0; p < pages; ++p) host_table.data_as<int32_t>()[p] = static_cast<int32_t>(p);
  Tensor table = *Tensor::Empty(DType::kI32, Shape{pages}, b->allocator());
  (void)b->Copy(host_table, table);
  Tensor host_mask = *Tensor::Empty(DType::kU8, Shape{1, context});
  std::fill_n(host_mask.data_as<uint8_t>(), context, uint8_t{1});
  Tensor mask = *Tensor::Empty(DType::kU8, Shape{1, context}, b->allocator());
  (void)b->Copy(host_mask, mask);
  auto step = [&] {
    for (int64_t s = 0; s < batch; ++s) {
      (void)b->LatentAttention(q, cache, table.view().Narrow(0, s * pages_per_seq, pages_per_seq), context, mask,
                               0.1f, r, out);
    }
  };
  step();
  if (absl::Status st = b->Synchronize(); !st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
  double seconds = 0;
  for (auto _ : state) {
    seconds = TimeMedian(1, step);
    state.SetIterationTime(seconds);
  }
  const double bytes = static_cast<double>(batch) * context * w * 4.0;
  const double flops = static_cast<double>(batch) * heads * context * (2.0 * w + 2.0 * r);
  Report(state, seconds, bytes, flops);
}
BENCHMARK(BM_LatentAttentionDecode)
    ->ArgsProduct({{16, 8}, {1024, 4096, 16384, 65536}, {1, 8, 32}})
    ->UseManualTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);

// MoE decode at one TP=8 rank of DeepSeek-V3: router logits given, MoeRoute (sigmoid, noaux_tc,
// 8 groups keep 4, top-8) + MoeExperts over f32 expert slices.
void BM_MoeDecode(benchmark::State& state) {
  CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t tokens = state.range(0), experts = 256, hidden = 7168, inter = 256, top_k = 8;
  static std::vector<Tensor>* weights = [&] {
    auto* w = new std::vector<Tensor>();
    for (int64_t e = 0; e < experts; ++e) {
      w->push_back(RandomDevice(DType::kF32, Shape{2 * inter, hidden}, static_cast<uint32_t>(100 + e)));
      w->push_back(RandomDevice(DType::kF32, Shape{hidden, inter}, static_cast<uint32_t>(1000 + e)));
    }
    return w;
  }();
  std::vector<ExpertWeights> table;
  for (int64_t e = 0; e < experts; ++e) table.push_back({(*weights)[2 * e].view(), (*weights)[2 * e + 1].view()});
  Tensor x = RandomDevice(DType::kF32, Shape{tokens, hidden}, 3);
  Tensor logits = RandomDevice(DType::kF32, Shape{tokens, experts}, 4);
  Tensor bias = RandomDevice(DType::kF32, Shape{experts}, 5);
  Tensor ids = *Tensor::Empty(DType::kI32, Shape{tokens, top_k}, b->allocator());
  Tensor w = *Tensor::Empty(DType::kF32, Shape{tokens, top_k}, b->allocator());
  Tensor out = *Tensor::Empty(DType::kF32, Shape{tokens, hidden}, b->allocator());
  MoeRoutingParams params;
  params.scoring_func = ScoringFunc::kSigmoid;
  params.topk_method = TopkMethod::kNoauxTc;
  params.top_k = static_cast<int>(top_k);
  params.n_group = 8;
  params.topk_group = 4;
  params.norm_topk_prob = true;
  params.routed_scaling_factor = 2.5f;
  const TensorView bias_view = bias.view();
  auto step = [&] {
    (void)b->MoeRoute(logits, &bias_view, params, ids, w);
    (void)b->MoeExperts(x, ids, w, table, out, false);
  };
  step();
  if (absl::Status st = b->Synchronize(); !st.ok()) return state.SkipWithError(std::string(st.message()).c_str());
  // The floor reads each selected expert once.
  Tensor host_ids = *Tensor::Empty(DType::kI32, Shape{tokens, top_k});
  (void)b->Copy(ids, host_ids);
  (void)b->Synchronize();
  std::set<int32_t> unique(host_ids.data_as<int32_t>(), host_ids.data_as<int32_t>() + host_ids.numel());
  double seconds = 0;
  for (auto _ : state) {
    seconds = TimeMedian(1, step);
    state.SetIterationTime(seconds);
  }
  const double bytes = static_cast<double>(unique.size()) * 3.0 * inter * hidden * 4.0;
  const double flops = static_cast<double>(tokens) * top_k * 3.0 * 2.0 * inter * hidden;
  state.counters["experts_touched"] = static_cast<double>(unique.size());
  Report(state, seconds, bytes, flops);
}
BENCHMARK(BM_MoeDecode)
    ->Arg(1)->Arg(4)->Arg(16)->Arg(64)->Arg(256)
    ->UseManualTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace eagle3::cuda

BENCHMARK_MAIN();
