// CudaBackend::QuantizedGemm at the per-rank shapes of a TP8 deployment, by path, against the
// weight-streaming floor (timed with CUDA events per call of a 16-call graph, bench_util.h): where
// the quantized GEMV's 32-row chunks stop paying and the dequantize-then-cuBLASLt path should take
// over (CudaBackendOptions::quantized_gemv_max_rows), and where the W8A8 path (issue 20:
// activations quantized to e4m3 per 1 x 128 group, cuBLASLt's block-scaled FP8 product) beats both
// (CudaBackendOptions::fp8_w8a8_min_rows).
//
//   BM_QuantizedGemm/shape/m/path : m f32 activation rows against one rank's weights.
//       path 0: QuantizedGemm as the backend routes it (by default the quantized GEMV up to 64 rows,
//               in 32-row chunks past 32; dequantized into bf16 scratch then cuBLASLt above);
//       path 1: QuantizedGemm on a backend with quantized_gemv_max_rows 0 (always dequantized);
//       path 2: Gemm on bf16 weights of the same shape (the dense baseline the quantized form
//               replaces);
//       path 3: QuantizedGemm on a backend with fp8_w8a8_min_rows 1 (W8A8 at every M; FP8 shapes
//               only), the activation quantization kernel inside the timed call.
//   Shapes, N x K (DeepSeek-V3 FP8, 128 x 128 blocks, split as DeepseekV2Weights does, rank 1;
//   column slices start at K * rank):
//     0 q_a 1536 x 7168        1 q_b 3072 x 1536         2 kv_a 576 x 7168
//     3 o_proj 7168 x 2048     4 dense gate_up 4608 x 7168   5 dense down 7168 x 2304
//     6 shared expert gate_up 512 x 7168                 7 shared expert down 7168 x 256
//   INT4 (pack-quantized, group 32, bf16 scales), Kimi-K2.5's routed-expert shapes:
//     8 gate_up 512 x 7168     9 down 7168 x 256
//
// The codes are read as warp tiles (QuantCodesLayout::kWarpTiles) where the backend's weight loads
// would keep them so (CudaBackendOptions::quant_gemm_tiled_weights: paths 0 and 1;
// EAGLE3_BENCH_QUANT_GEMM_TILED_WEIGHTS=0: row-major).
//
// Model: bytes = the weights as stored for the path (codes or packed words with the scales they
// use; bf16 for path 2) + a (f32) + c (f32); flops = 2 m N K; floor = max(bytes / copy rate,
// flops / GEMM rate), the GEMM rate the bf16 one measured at 8192^3, and for path 3 the W8A8 path's
// own at 8192^3 (FP8 tensor cores; its activation quantization included, a few percent there). The
// e4m3 copy of `a` that path 3 writes and reads back is not in its bytes: the floor is the op's,
// not the implementation's. Weight sets rotate past the L2, as in a decode step.
//
// Issue 20's comparison (W8A8 against the weight-only GEMV and the dequantized path):
//   --benchmark_filter='BM_QuantizedGemm/shape:[0234]/m:[0-9]+/path:[013]'
// at M 1, 4, 16, 64, 128, 512, 2048 (EAGLE3_BENCH_QUICK=1: q_a and o_proj at fewer M).
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"

namespace eagle3::bench {
namespace {

struct QuantizedShape {
  const char* name;
  bool int4;
  int64_t n, k;
  int64_t row0 = 0, col0 = 0;  // the slice's first global row and column
};

QuantizedShape ShapeOf(int64_t id) {
  switch (id) {
    case 0: return {"v3_q_a", false, 1536, 7168};
    case 1: return {"v3_q_b", false, 3072, 1536, 3072, 0};
    case 2: return {"v3_kv_a", false, 576, 7168};
    case 3: return {"v3_o_proj", false, 7168, 2048, 0, 2048};
    case 4: return {"v3_dense_gate_up", false, 4608, 7168, 4608, 0};
    case 5: return {"v3_dense_down", false, 7168, 2304, 0, 2304};
    case 6: return {"v3_shared_gate_up", false, 512, 7168, 512, 0};
    case 7: return {"v3_shared_down", false, 7168, 256, 0, 256};
    case 8: return {"k25_expert_gate_up", true, 512, 7168, 512, 0};
    default: return {"k25_expert_down", true, 7168, 256, 0, 256};
  }
}

constexpr int64_t kBlock = 128;
constexpr int64_t kGroup = 32;

// A backend of its own for a path that needs other options than Backend()'s (created once).
std::unique_ptr<cuda::CudaBackend> PathBackend(int64_t quantized_gemv_max_rows, int64_t fp8_w8a8_min_rows) {
  cuda::CudaBackendOptions options;
  options.max_rows = 4096;
  options.quantized_gemv_max_rows = quantized_gemv_max_rows;
  options.fp8_w8a8_min_rows = fp8_w8a8_min_rows;
  // The tiled-weights switch as the default backend reads it (bench_util.h).
  if (const cuda::CudaBackend* base = Backend(); base != nullptr) {
    options.quant_gemm_tiled_weights = base->options().quant_gemm_tiled_weights;
  }
  auto b = cuda::CudaBackend::Create(options);
  return b.ok() ? std::move(*b) : nullptr;
}

// The backend of path 1: every QuantizedGemm dequantizes.
cuda::CudaBackend* DequantizingBackend() {
  static const std::unique_ptr<cuda::CudaBackend> backend = PathBackend(0, 0);
  return backend.get();
}

// The backend of path 3: FP8 calls W8A8 wherever the path takes the slice.
cuda::CudaBackend* W8A8Backend() {
  static const std::unique_ptr<cuda::CudaBackend> backend =
      PathBackend(cuda::CudaBackendOptions{}.quantized_gemv_max_rows, 1);
  return backend.get();
}

// The W8A8 path's rate at 8192^3 (f32 activations quantized in the call), flops per second; 0 when
// it fails (ReportRoofline then uses the bf16 rate).
double W8A8FlopsPerSecond() {
  static const double rate = [] {
    cuda::CudaBackend* b = W8A8Backend();
    if (b == nullptr) return 0.0;
    const int64_t n = 8192;
    Tensor codes = RandomDevice(DType::kBF16, Shape{n * n / 2}, 90);
    Tensor scales = RandomDevice(DType::kF32, Shape{n / kBlock, n / kBlock}, 91, 0.01f);
    QuantizedWeightView w;
    w.format = WeightFormat::kFp8Block;
    w.codes = TensorView(codes.data(), DType::kF8E4M3, Shape{n, n}, codes.device());
    w.scales = scales.view();
    w.k = n;
    w.block_rows = w.block_cols = kBlock;
    Tensor a = RandomDevice(DType::kF32, Shape{n, n}, 92);
    Tensor c = *Tensor::Empty(DType::kF32, Shape{n, n}, b->allocator());
    absl::Status status = b->QuantizedGemm(a, w, c, {});
    if (!status.ok() || !b->Synchronize().ok()) return 0.0;
    const double t = TimeMedian(b->stream(), 7, 2, [&] { status = b->QuantizedGemm(a, w, c, {}); });
    return status.ok() ? 2.0 * static_cast<double>(n) * n * n / t : 0.0;
  }();
  return rate;
}

// One rotated weight set: stored codes and scales (paths 0, 1) or bf16 weights (path 2).
struct WeightSet {
  Tensor codes, scales;
  QuantizedWeightView view;
};

void BM_QuantizedGemm(benchmark::State& state) {
  const int64_t path = state.range(2);
  cuda::CudaBackend* b = path == 1 ? DequantizingBackend() : path == 3 ? W8A8Backend() : Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const QuantizedShape s = ShapeOf(state.range(0));
  if (path == 3 && s.int4) return state.SkipWithError("W8A8: FP8 weights only");
  const int64_t m = state.range(1);
  state.SetLabel(s.name);
  // Codes: fp8 bytes [n, k]; int4 words [n, k / 8]. Scales: fp8 the blocks the slice touches; int4
  // the slice's rows of its own groups.
  const int64_t code_cols = s.int4 ? s.k / 8 : s.k;
  const int64_t scale_rows = s.int4 ? s.n : (s.n + kBlock - 1) / kBlock;
  const int64_t scale_cols = s.int4 ? s.k / kGroup : (s.k + kBlock - 1) / kBlock;
  const double weight_bytes =
      path == 2 ? 2.0 * s.n * s.k
                : static_cast<double>(s.n) * code_cols * (s.int4 ? 4 : 1) +
                      static_cast<double>(scale_rows) * scale_cols * (s.int4 ? 2 : 4);
  Rotation<WeightSet> sets(CopiesToDefeatL2(weight_bytes), [&](int i) {
    WeightSet w;
    if (path == 2) {
      w.codes = RandomDevice(DType::kBF16, Shape{s.n, s.k}, 40 + i, 0.02f);
      return w;
    }
    // Random bits (only the timing depends on them): e4m3 codes as bf16 pairs, int4 words as f32
    // bit patterns.
    w.codes = RandomDevice(DType::kBF16, Shape{s.n * code_cols * (s.int4 ? 4 : 1) / 2}, 40 + i);
    w.scales = RandomDevice(s.int4 ? DType::kBF16 : DType::kF32, Shape{scale_rows, scale_cols}, 80 + i, 0.01f);
    w.view.format = s.int4 ? WeightFormat::kInt4Group : WeightFormat::kFp8Block;
    w.view.codes = TensorView(w.codes.data(), s.int4 ? DType::kI32 : DType::kF8E4M3, Shape{s.n, code_cols},
                              w.codes.device());
    w.view.scales = w.scales.view();
    w.view.k = s.k;
    w.view.row0 = s.row0;
    w.view.col0 = s.col0;
    w.view.block_rows = s.int4 ? 1 : kBlock;
    w.view.block_cols = s.int4 ? kGroup : kBlock;
    w.view.scale_row0 = s.row0 / w.view.block_rows;
    w.view.scale_col0 = s.col0 / w.view.block_cols;
    // The codes read as warp tiles where the backend's loads would keep them so (the bits are
    // random either way; these whole shapes tile into exactly their row-major bytes).
    const Shape tiled = WarpTiledCodesShape(w.view);
    if (b->tiles_gemm_codes(w.view) && tiled.numel() == w.view.codes.numel()) {
      w.view = WithWarpTiledCodes(w.view, TensorView(w.codes.data(), w.view.codes.dtype(), tiled, w.codes.device()));
    }
    return w;
  });
  Tensor a = RandomDevice(DType::kF32, Shape{m, s.k}, 3);
  Tensor c = *Tensor::Empty(DType::kF32, Shape{m, s.n}, b->allocator());
  absl::Status status;
  auto run = [&] {
    const WeightSet& w = sets.Next();
    status = path == 2 ? b->Gemm(a, w.codes, c, kWeightsGemm) : b->QuantizedGemm(a, w.view, c, kWeightsGemm);
  };
  run();  // outside the capture: sizes the dequantization scratch
  if (!Check(state, status, "QuantizedGemm") || !Check(state, b->Synchronize(), "Synchronize")) return;
  const double seconds = RunTimedInGraph(state, b->stream(), 16, run);
  if (!Check(state, status, "QuantizedGemm")) return;
  const double bytes = weight_bytes + 4.0 * static_cast<double>(m) * (s.k + s.n);
  state.counters["rotated_sets"] = static_cast<double>(sets.size());
  ReportRoofline(state, seconds, bytes, 2.0 * static_cast<double>(m) * s.n * s.k,
                 path == 3 ? W8A8FlopsPerSecond() : 0.0);
}

void QuantizedGemmArgs(benchmark::internal::Benchmark* bm) {
  std::set<std::vector<int64_t>> rows;
  auto product = [&](const std::vector<int64_t>& shapes, const std::vector<int64_t>& ms,
                     const std::vector<int64_t>& paths) {
    for (int64_t shape : shapes) {
      for (int64_t m : ms) {
        for (int64_t path : paths) {
          if (rows.insert({shape, m, path}).second) bm->Args({shape, m, path});
        }
      }
    }
  };
  if (Quick()) {
    product({0, 3, 4, 8}, {1, 16, 64, 300}, {0, 1});
    product({0, 3, 8}, {17, 32}, {0});
    product({0, 3}, {1, 16, 128, 2048}, {3});
    product({0, 3}, {128, 2048}, {1});
  } else {
    product({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 8, 16, 17, 24, 32, 33, 48, 64, 65, 128, 300}, {0, 1, 2});
    product({0, 2, 3, 4}, {1, 4, 16, 64, 128, 512, 2048}, {0, 1, 3});
  }
}
BENCHMARK(BM_QuantizedGemm)->ArgNames({"shape", "m", "path"})->Apply(QuantizedGemmArgs)->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
