// Small-M products with bf16 (shape 10: f32) weights and f32 activations, as decode steps run them (timed with CUDA
// events, bench_util.h), each against its weight-streaming floor.
//
//   BM_GemmSmallM/shape/m/path : CudaBackend::Gemm, or BatchedGemm for the per-head shapes, of m
//       activation rows. shape (N x K, per DeepSeek-V2 TP8 rank unless named):
//         0 q_a_proj 1536 x 5120        1 kv_a_proj_with_mqa 576 x 5120   2 q_b_proj 3072 x 1536
//         3 o_proj 5120 x 2048          4 shared-expert gate_up 768 x 5120
//         5 shared-expert down 5120 x 384                                6 router 160 x 5120
//         7 V3 draft fc 7168 x 21504    8 W_UK: 16 heads of 512 x 128    9 W_UV: 16 heads of 128 x 512
//         10 V3 router 256 x 7168 with f32 weights (as the library kept routers before 2026-12-04)
//         11 V3 router 256 x 7168 with bf16 weights and the activations kept f32
//            (GemmOptions::keep_f32_activations: as FeedForwardBlock runs a bf16 checkpoint's
//            router on CUDA; the same products as shape 10, half the weight bytes)
//       counter ksplit: the K split of the GEMV kernel (cuda/gemv_ops.h GemvKSplit; absent past
//       kGemvMaxRows rows)
//       path 0 is what the backend picks (by default CudaBackendOptions::small_m_gemv: the GEMV
//       kernel up to kGemvMaxRows rows, cuBLASLt above (shape 11: on the f32 copy of the weights);
//       with EAGLE3_BENCH_SMALL_M_GEMV=0, cuBLASLt throughout); m 32 and 64 only for shapes 10 and
//       11 (the routers of batched verify steps);
//       path 1 hands the same weights to the backend 16 bytes into a padded buffer with rows of K + 4,
//       so that the GEMV path declines them (rows 8-byte aligned) and cuBLASLt runs with its bf16
//       conversion of `a`: the contrast, at a slight alignment handicap for cuBLASLt.
//
// Model: bytes = the weights + a (f32) + c (f32); the floor is bytes / the measured copy rate
// (flops are far below the GEMM rate). Weight sets rotate past the L2, as in a decode step, where a
// layer's weights are long evicted by the time the next step reads them.
#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include "bench_util.h"
#include "eagle3/cuda/cuda_backend.h"
#include "gemv_ops.h"
#include "eagle3/tensor.h"

namespace eagle3::bench {
namespace {

struct GemmShape {
  const char* name;
  int64_t items, n, k;  // items > 1: BatchedGemm over head-major views
  DType weights = DType::kBF16;
  bool keep_f32_activations = false;  // GemmOptions::keep_f32_activations
};

GemmShape ShapeOf(int64_t id) {
  switch (id) {
    case 0: return {"q_a", 1, 1536, 5120};
    case 1: return {"kv_a", 1, 576, 5120};
    case 2: return {"q_b", 1, 3072, 1536};
    case 3: return {"o_proj", 1, 5120, 2048};
    case 4: return {"shared_gate_up", 1, 768, 5120};
    case 5: return {"shared_down", 1, 5120, 384};
    case 6: return {"router", 1, 160, 5120};
    case 7: return {"v3_draft_fc", 1, 7168, 21504};
    case 8: return {"w_uk", 16, 512, 128};
    case 9: return {"w_uv", 16, 128, 512};
    case 10: return {"v3_router_f32", 1, 256, 7168, DType::kF32};  // a TP rank's full router
    default: return {"v3_router_bf16", 1, 256, 7168, DType::kBF16, true};
  }
}

void BM_GemmSmallM(benchmark::State& state) {
  cuda::CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const GemmShape s = ShapeOf(state.range(0));
  const int64_t m = state.range(1);
  const bool misaligned = state.range(2) == 1;
  state.SetLabel(s.name);
  // Weights [items, n, ld]; path 1 views them 8 elements (16 bytes) in with ld = k + 4.
  const int64_t ld = misaligned ? s.k + 4 : s.k, offset = misaligned ? 8 : 0;
  const int64_t size = static_cast<int64_t>(DTypeSize(s.weights));
  const double weight_bytes = static_cast<double>(size) * s.items * s.n * s.k;
  Rotation<Tensor> sets(CopiesToDefeatL2(weight_bytes), [&](int i) {
    return RandomDevice(s.weights, Shape{offset + s.items * s.n * ld}, 20 + i, 0.02f);
  });
  const auto weights = [&](const Tensor& t) {
    auto* data = static_cast<char*>(t.data()) + offset * size;
    if (s.items == 1) return TensorView(data, s.weights, Shape{s.n, s.k}, Shape{ld, 1}, t.device());
    return TensorView(data, s.weights, Shape{s.items, s.n, s.k}, Shape{s.n * ld, ld, 1}, t.device());
  };
  // Activations and outputs [m, items * k] / [m, items * n]: per-head items are head-major views.
  Tensor a = RandomDevice(DType::kF32, Shape{m, s.items * s.k}, 3);
  Tensor c = *Tensor::Empty(DType::kF32, Shape{m, s.items * s.n}, b->allocator());
  const TensorView a_items(a.data(), DType::kF32, Shape{s.items, m, s.k},
                           Shape{s.k, s.items * s.k, 1}, a.device());
  const TensorView c_items(c.data(), DType::kF32, Shape{s.items, m, s.n},
                           Shape{s.n, s.items * s.n, 1}, c.device());
  absl::Status status;
  const GemmOptions options = s.keep_f32_activations ? kF32ActivationsWeightsGemm : kWeightsGemm;
  auto run = [&] {
    const TensorView w = weights(sets.Next());
    status = s.items == 1 ? b->Gemm(a, w, c, options) : b->BatchedGemm(a_items, w, c_items, options);
  };
  run();
  if (!Check(state, status, "Gemm") || !Check(state, b->Synchronize(), "Synchronize")) return;
  // Timed inside a graph of 16 calls (each on the next weight set), as a decode step runs it.
  const double seconds = RunTimedInGraph(state, b->stream(), 16, run);
  if (!Check(state, status, "Gemm")) return;
  const double bytes = weight_bytes + 4.0 * static_cast<double>(m) * s.items * (s.k + s.n);
  const double flops = 2.0 * static_cast<double>(m) * s.items * s.n * s.k;
  state.counters["rotated_sets"] = static_cast<double>(sets.size());
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && m <= cuda::kGemvMaxRows) {
    const cuda::GemvType type = s.weights == DType::kF32 ? cuda::GemvType::kF32 : cuda::GemvType::kBF16;
    const cuda::GemvActivations activations =
        s.keep_f32_activations ? cuda::GemvActivations::kKeepF32 : cuda::GemvActivations::kRoundToBf16;
    state.counters["ksplit"] = cuda::GemvKSplit(type, activations, m, s.n, s.k, s.items, sms);
  }
  ReportRoofline(state, seconds, bytes, flops);
}

void GemmArgs(benchmark::internal::Benchmark* bm) {
  if (Quick()) {
    bm->ArgsProduct({{1, 2, 3, 7, 8}, {1, 16}, {0}});
    bm->ArgsProduct({{1, 7}, {1}, {1}});
    bm->ArgsProduct({{10, 11}, {1, 8}, {0}});
  } else {
    bm->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {1, 4, 8, 9, 16}, {0}});
    bm->ArgsProduct({{10, 11}, {32, 64}, {0}});  // routers of batched verify steps
    bm->ArgsProduct({{0, 1, 2, 3, 7, 8}, {1, 4, 8}, {1}});
  }
}
BENCHMARK(BM_GemmSmallM)->ArgNames({"shape", "m", "path"})->Apply(GemmArgs)->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
