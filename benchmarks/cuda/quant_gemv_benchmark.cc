// The quantized GEMV launchers (cuda/quant_gemv_ops.h) at the real per-rank shapes of a TP8
// deployment, timed with CUDA events (bench_util.h), each against its weight-streaming floor.
//
//   BM_QuantGemv/shape/m : m activation rows (f32, rounded to bf16 by the kernel) against one rank's
//       quantized weights, launched as a programmatic dependent (as the backend launches weight
//       products), per call of a CUDA graph of 16 back-to-back calls over rotated weight sets.
//   DeepSeek-V3 FP8 (e4m3, 128 x 128 block scales; hidden 7168, q_lora_rank 1536, kv_lora_rank 512 +
//   rope 64, 128 heads -> 16 per rank, qk_nope 128, qk_rope 64, v_head 128, dense intermediate
//   18432 -> 2304 per rank, moe_intermediate 2048 -> 256 per rank, 1 shared expert), split as
//   DeepseekV2Weights does (q_a, kv_a replicated; q_b, kv_b, gate, up row-split; o_proj, down
//   column-split; routed experts split like the dense MLP, not placed by expert), N x K:
//     0 q_a 1536 x 7168             1 q_b 3072 x 1536 (16 heads x 192)
//     2 kv_a 576 x 7168             3 W_UK: 16 heads of 512 x 128 (the per-head transposed copy)
//     4 W_UV: 16 heads of 128 x 512, a view of the rank's kv_b [4096, 512] (rows 128.. of each
//       head's 256, global row 128 + 256 h, so the scale row advances by 2 per head)
//     5 o_proj 7168 x 2048          6 dense gate_up 4608 x 7168 (gate and up, 2304 rows each)
//     7 dense down 7168 x 2304      8 expert gate_up 512 x 7168 (the shared expert's, or one routed
//       expert's: same shape)       9 expert down 7168 x 256
//    10 8 routed experts' gate_up in one launch (batch 8)     11 8 routed experts' down (batch 8)
//   Kimi-K2.5 INT4 routed experts (pack-quantized int4, group 32, bf16 scales; hidden 7168,
//   moe_intermediate 2048 -> 256 per rank):
//    12 expert gate_up 512 x 7168   13 expert down 7168 x 256 (column slice at 256 * rank)
//    14 8 routed experts' gate_up (batch 8)                   15 8 routed experts' down (batch 8)
//   The down product of a 16-token verify step, as the grouped MoE launches it (one item per job of
//   up to 8 tokens of one expert; 16 tokens x top-8 make up to 128 jobs):
//    16 V3 FP8 128 experts' down (batch 128)                  17 K2.5 INT4 128 experts' down
//   and its gate-up product (items 2j, 2j + 1: job j's gate and up, 256 rows each):
//    18 V3 FP8 256 items' gate / up (batch 256)               19 K2.5 INT4 256 items' gate / up
//   q_a and kv_a stacked by rows (MlaBlock's one product for both): 20 V3 q_a + kv_a 2112 x 7168.
//   The gate-up product of a one-token decode step (items 2j, 2j + 1: job j's gate and up):
//    21 V3 FP8 18 items (8 routed experts and the shared one)  22 K2.5 INT4 16 items (8 routed)
//   The products of an 8-token verify step as planned (the most jobs its 72 / 64 pairs can make):
//    23 V3 FP8 144 gate / up items    24 K2.5 INT4 128 items
//    25 V3 FP8 72 experts' down       26 K2.5 INT4 64 experts' down
//   The gate-up products of 16- and 64-token steps with only the items of the experts that random
//   routing touches on average (the grouped launch's other items leave at once): how a grid's last
//   partial wave weighs on each plan.
//    27 K2.5 INT4 218 items (16 tokens, 109 of 384 experts)    28 V3 FP8 204 items (16, 102 of 256)
//    29 K2.5 INT4 570 items (64 tokens, 285 experts)           30 V3 FP8 448 items (64, 224)
//   and of 10- to 14-token steps, between one wave of blocks and two (the chooser's clusters of 5
//   to 7 ranks): 31 / 32 / 33 K2.5 INT4 160 / 192 / 224 items, 34 / 35 V3 FP8 160 / 192 items.
//   Column slices are taken at rank 1 (o_proj col0 2048, down col0 2304 / 256), row slices at rank 1.
//
//   BM_QuantGemvPlan/shape/m/wk/split : the same products with the plan QuantGemvPlanFor gives for
//       wk warps per 16-row group and split blocks per cluster along K (quant_gemv_plan.h), chosen
//       = 1 on the row of the plan ChooseQuantGemvPlan picks: the data behind the planner's rules.
//       Skipped where QuantGemvPlanFor has no plan (a rank or warp part without units).
//   BM_QuantGemvRowLoop/shape/m/loops : the short-K products with the row-looped plan of `loops`
//       16-row groups per warp (QuantGemvRowLoopPlanFor), or with loops = 0 the plan the chooser
//       takes among the K-split kernel's plans (ChooseQuantGemvSplitPlan); chosen = 1 as above.
//
// Model: bytes = the quantized weight bytes read (codes or packed words, and the scales they use);
// the floor is bytes / the measured copy rate (flops are far below the GEMM rate). Weight sets rotate
// past the L2, as in a decode step, where a layer's weights are long evicted by the time the next
// step reads them. Activations (f32 [m, k]) and outputs are not counted: at m = 8 they are under 7 %
// of the weight bytes of every shape but the batched ones.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/detail/quant_tiles.h"
#include "eagle3/tensor.h"
#include "quant_gemv_ops.h"
#include "quant_gemv_plan.h"

namespace eagle3::bench {
namespace {

struct QuantShape {
  const char* name;
  bool int4;
  int64_t batch, n, k;
  int64_t row0 = 0, col0 = 0;  // the slice's first global row and column
  // Rows of the allocation between items and before the first item's first row (a view of a
  // larger tensor: W_UV in kv_b); 0: items are n rows apart from row 0.
  int64_t item_rows = 0, row_offset = 0;
};

QuantShape ShapeOf(int64_t id) {
  switch (id) {
    case 0: return {"v3_q_a", false, 1, 1536, 7168};
    case 1: return {"v3_q_b", false, 1, 3072, 1536, 3072, 0};
    case 2: return {"v3_kv_a", false, 1, 576, 7168};
    case 3: return {"v3_w_uk", false, 16, 512, 128};
    case 4: return {"v3_w_uv", false, 16, 128, 512, 4096 + 128, 0, 256, 128};
    case 5: return {"v3_o_proj", false, 1, 7168, 2048, 0, 2048};
    case 6: return {"v3_dense_gate_up", false, 1, 4608, 7168};
    case 7: return {"v3_dense_down", false, 1, 7168, 2304, 0, 2304};
    case 8: return {"v3_expert_gate_up", false, 1, 512, 7168};
    case 9: return {"v3_expert_down", false, 1, 7168, 256, 0, 256};
    case 10: return {"v3_experts8_gate_up", false, 8, 512, 7168};
    case 11: return {"v3_experts8_down", false, 8, 7168, 256, 0, 256};
    case 12: return {"k25_expert_gate_up", true, 1, 512, 7168};
    case 13: return {"k25_expert_down", true, 1, 7168, 256, 0, 256};
    case 14: return {"k25_experts8_gate_up", true, 8, 512, 7168};
    case 15: return {"k25_experts8_down", true, 8, 7168, 256, 0, 256};
    case 16: return {"v3_experts128_down", false, 128, 7168, 256, 0, 256};
    case 17: return {"k25_experts128_down", true, 128, 7168, 256, 0, 256};
    case 18: return {"v3_items256_gate_up", false, 256, 256, 7168};
    case 19: return {"k25_items256_gate_up", true, 256, 256, 7168};
    case 21: return {"v3_items18_gate_up", false, 18, 256, 7168};
    case 22: return {"k25_items16_gate_up", true, 16, 256, 7168};
    case 23: return {"v3_items144_gate_up", false, 144, 256, 7168};
    case 24: return {"k25_items128_gate_up", true, 128, 256, 7168};
    case 25: return {"v3_experts72_down", false, 72, 7168, 256, 0, 256};
    case 26: return {"k25_experts64_down", true, 64, 7168, 256, 0, 256};
    case 27: return {"k25_items218_gate_up", true, 218, 256, 7168};
    case 28: return {"v3_items204_gate_up", false, 204, 256, 7168};
    case 29: return {"k25_items570_gate_up", true, 570, 256, 7168};
    case 30: return {"v3_items448_gate_up", false, 448, 256, 7168};
    case 31: return {"k25_items160_gate_up", true, 160, 256, 7168};
    case 32: return {"k25_items192_gate_up", true, 192, 256, 7168};
    case 33: return {"k25_items224_gate_up", true, 224, 256, 7168};
    case 34: return {"v3_items160_gate_up", false, 160, 256, 7168};
    case 35: return {"v3_items192_gate_up", false, 192, 256, 7168};
    // q_a and kv_a stacked by rows (MlaBlock's one product for both).
    default: return {"v3_q_a_kv_a", false, 1, 2112, 7168};
  }
}

constexpr int64_t kInt4Group = 32;

// One rotated weight set: the codes or packed words and the scales of every item.
struct WeightSet {
  Tensor data, scales;
};

// EAGLE3_BENCH_QUANT_TILED=1: the weights read as warp-step tiles (Fp8BlockWeights::tiled,
// eagle3/detail/quant_tiles.h) where a shape's tiles take the bytes of its rows (items of whole
// 16-row groups and 128-column units starting on the unit grid, no rows between items); other shapes
// are skipped. The benchmark's codes are random, so the same buffer serves either layout.
bool TiledRequested() {
  const char* value = std::getenv("EAGLE3_BENCH_QUANT_TILED");
  return value != nullptr && value[0] == '1';
}

// The product of shape s with m rows, the chosen plan or `plan`.
void RunQuantGemv(benchmark::State& state, const QuantShape& s, int64_t m, const cuda::QuantGemvPlan* plan) {
  cuda::CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  state.SetLabel(s.name);
  const int64_t item_rows = s.item_rows > 0 ? s.item_rows : s.n;
  const bool tiled = TiledRequested();
  if (tiled && (item_rows != s.n || s.row_offset != 0 || QuantTileShift(s.int4, s.col0) != 0 ||
                QuantTiledBytes(s.int4, s.n, s.k, s.col0) != s.n * (s.int4 ? s.k / 2 : s.k))) {
    return state.SkipWithError("not tileable in place (EAGLE3_BENCH_QUANT_TILED)");
  }
  // Row strides: fp8 rows of k bytes, int4 rows of k / 8 words (both multiples of 16 bytes here).
  const int64_t ld = s.int4 ? s.k / 8 : s.k;
  const int64_t row_bytes = s.int4 ? s.k / 2 : s.k;
  // Scales: fp8 the global blocks the slice's rows touch ([rows / 128, global columns / 128] per
  // item), int4 the slice's rows of every global group.
  const int64_t global_k = s.col0 + s.k;
  const int64_t scale_ld = s.int4 ? global_k / kInt4Group : (global_k + 127) / 128;
  const int64_t scale_rows = s.int4 ? item_rows : (s.row0 + item_rows * s.batch + 127) / 128;
  const int64_t scale_item = s.int4 ? item_rows * scale_ld : 0;  // fp8 items index by global row
  const double weight_bytes = static_cast<double>(s.batch) * s.n * row_bytes;
  const double scale_bytes = s.int4 ? static_cast<double>(s.batch) * s.n * (s.k / kInt4Group) * 2
                                    : static_cast<double>(s.batch) * ((s.n + 127) / 128) * ((s.k + 127) / 128) * 4;
  const double bytes = weight_bytes + scale_bytes;
  Rotation<WeightSet> sets(CopiesToDefeatL2(bytes), [&](int i) {
    WeightSet w;
    // Random bits through FillRandom's bf16 / f32 fills: e4m3 codes as bf16 pairs, int4 words as
    // f32 bit patterns (only the timing depends on them).
    const int64_t data_bytes = s.batch * item_rows * row_bytes + s.row_offset * row_bytes;
    w.data = RandomDevice(DType::kBF16, Shape{(data_bytes + 1) / 2}, 40 + i);
    w.scales = s.int4 ? RandomDevice(DType::kBF16, Shape{s.batch * scale_rows * scale_ld}, 80 + i, 0.01f)
                      : RandomDevice(DType::kF32, Shape{scale_rows * scale_ld}, 80 + i, 0.01f);
    return w;
  });
  Tensor a = RandomDevice(DType::kF32, Shape{m, s.k}, 3);
  Tensor c = *Tensor::Empty(DType::kF32, Shape{s.batch, m, s.n}, b->allocator());
  cudaError_t error = cudaSuccess;
  auto run = [&] {
    const WeightSet& w = sets.Next();
    const char* data = static_cast<const char*>(w.data.data()) + s.row_offset * row_bytes;
    if (s.int4) {
      cuda::Int4GroupWeights q;
      q.packed = reinterpret_cast<const int32_t*>(data);
      q.ld = ld;
      q.batch_stride = item_rows * ld;
      q.scale = static_cast<const uint16_t*>(w.scales.data());
      q.scale_ld = scale_ld;
      q.scale_batch_stride = scale_item;
      q.col0 = s.col0;
      q.group_size = kInt4Group;
      q.tiled = tiled;
      error = cuda::LaunchInt4GroupGemvPlanned(a.data(), cuda::GemvType::kF32, s.k, 0, q, static_cast<float*>(c.data()),
                                               s.n, m * s.n, nullptr, s.batch, m, s.n, s.k, 1.0f, 0.0f, plan, true,
                                               b->stream());
    } else {
      cuda::Fp8BlockWeights q;
      q.codes = reinterpret_cast<const uint8_t*>(data);
      q.ld = ld;
      q.batch_stride = item_rows * ld;
      q.scale_inv = static_cast<const float*>(w.scales.data());
      q.scale_ld = scale_ld;
      // Items item_rows global rows apart: a scale row every item_rows / 128 (whole blocks here).
      q.scale_batch_stride = item_rows / 128 * scale_ld;
      q.row0 = s.row0;
      q.col0 = s.col0;
      q.tiled = tiled;
      error = cuda::LaunchFp8BlockGemvPlanned(a.data(), cuda::GemvType::kF32, s.k, 0, q, static_cast<float*>(c.data()),
                                              s.n, m * s.n, nullptr, s.batch, m, s.n, s.k, 1.0f, 0.0f, plan, true,
                                              b->stream());
    }
  };
  run();
  if (error != cudaSuccess) return state.SkipWithError(cudaGetErrorString(error));
  if (!Check(state, b->Synchronize(), "Synchronize")) return;
  const double seconds = RunTimedInGraph(state, b->stream(), 16, run);
  if (error != cudaSuccess) return state.SkipWithError(cudaGetErrorString(error));
  state.counters["rotated_sets"] = static_cast<double>(sets.size());
  ReportRoofline(state, seconds, bytes, 2.0 * static_cast<double>(m) * s.batch * s.n * s.k);
}

void BM_QuantGemv(benchmark::State& state) {
  RunQuantGemv(state, ShapeOf(state.range(0)), state.range(1), nullptr);
}

void QuantArgs(benchmark::internal::Benchmark* bm) {
  if (Quick()) {
    bm->ArgsProduct({{0, 2, 5, 6, 8, 10, 12, 14}, {1, 8}});
    bm->ArgsProduct({{0, 5, 12}, {16, 32}});
    bm->ArgsProduct({{11, 15, 16, 17}, {8}});
  } else {
    bm->ArgsProduct({{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {1, 4, 8, 16, 17, 24, 32}});
    bm->ArgsProduct({{16, 17, 18, 19, 20, 21, 22}, {1, 8}});
    bm->ArgsProduct({{23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35}, {8}});
  }
}
BENCHMARK(BM_QuantGemv)->ArgNames({"shape", "m"})->Apply(QuantArgs)->Apply(Timed);

// The planner's view of shape s with m rows (as the launchers count the bytes).
cuda::QuantGemvProblem ProblemOf(const QuantShape& s, int64_t m) {
  cuda::QuantGemvProblem problem;
  problem.int4 = s.int4;
  problem.batch = s.batch;
  problem.m = m;
  problem.n = s.n;
  problem.k = s.k;
  problem.shift = s.int4 ? s.col0 % kInt4Group : s.col0 % 128;
  problem.a_bytes = 4;
  // As the launchers count them (the planner's input).
  problem.weight_bytes =
      static_cast<double>(s.batch) * s.n * (s.int4 ? (s.k + 7) / 8 * 4 + 2.0 * s.k / kInt4Group : s.k);
  problem.shared_limit = cuda::QuantGemvSharedLimitFor(m);  // as the launchers' chooser
  return problem;
}

int SmCount() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  return sms;
}

// Runs shape s with m rows and `plan`, with the plan's fields and whether the chooser takes it.
void RunPlan(benchmark::State& state, const QuantShape& s, int64_t m, const cuda::QuantGemvPlan& plan) {
  const cuda::QuantGemvPlan chosen = cuda::ChooseQuantGemvPlan(ProblemOf(s, m), SmCount());
  RunQuantGemv(state, s, m, &plan);
  state.counters["wk"] = plan.wk;
  state.counters["split"] = plan.split;
  state.counters["part_units"] = plan.part_units;
  state.counters["tiles"] = plan.tiles;
  state.counters["row_loops"] = plan.row_loops;
  const bool is_chosen = chosen.wk == plan.wk && chosen.split == plan.split &&
                         chosen.part_units == plan.part_units && chosen.tiles == plan.tiles &&
                         chosen.row_loops == plan.row_loops;
  state.counters["chosen"] = is_chosen ? 1.0 : 0.0;
}

void BM_QuantGemvPlan(benchmark::State& state) {
  const QuantShape s = ShapeOf(state.range(0));
  const int64_t m = state.range(1);
  const std::optional<cuda::QuantGemvPlan> planned =
      cuda::QuantGemvPlanFor(ProblemOf(s, m), static_cast<int>(state.range(2)), static_cast<int>(state.range(3)));
  if (!planned.has_value()) return state.SkipWithError("plan not valid for the shape");
  RunPlan(state, s, m, *planned);
}

void PlanArgs(benchmark::internal::Benchmark* bm) {
  // The long-K, few-row shapes (q_a, kv_a), o_proj, and the experts as the grouped MoE runs them
  // (8 items of 8 rows: gate_up long-K, down short-K).
  bm->ArgsProduct({{0, 2, 5}, {1}, {1, 2, 4, 8}, {1, 2, 4, 8}});
  bm->ArgsProduct({{20}, {1, 8}, {1, 2, 4, 8}, {1, 2, 4, 8}});
  bm->ArgsProduct({{10, 11, 14, 15}, {8}, {1, 2, 4, 8}, {1, 2, 4, 8}});
  // A 16-token step's gate-up product: 8 rows (a job's slot), 1 (the staging of one pair).
  bm->ArgsProduct({{18, 19}, {1, 8}, {1, 2, 4, 8}, {1, 2, 4}});
  // A one-token decode step's gate-up product, planned for 1 row (one pair per job) or for a job's
  // 8-row slot; cluster splits of 3 too (wk x split ways between the powers of two).
  bm->ArgsProduct({{21, 22}, {1, 8}, {1, 2, 4, 8}, {1, 2, 3, 4}});
  // An 8-token verify step's gate-up product.
  bm->ArgsProduct({{23, 24}, {8}, {1, 2, 4}, {1, 2, 3, 4, 5, 6, 8}});
  // q_a, the dense gate-up and a K2.5 expert's gate-up at 24 and 32 rows, past the default
  // shared-memory limit: the grids of 3 to 8 cluster ranks between which the chooser's wider limit
  // picks (never more blocks than the default limit's plan).
  bm->ArgsProduct({{0, 6, 12}, {24, 32}, {1, 2, 4}, {3, 4, 5, 6, 7, 8}});
  // The 16- and 64-token gate-up products with their touched experts' items only.
  bm->ArgsProduct({{27, 28, 29, 30}, {8}, {1, 2, 4}, {1, 2, 3, 4, 5}});
  // The 10- to 14-token gate-up products, every cluster split the chooser may take.
  bm->ArgsProduct({{31, 32, 33, 34, 35}, {8}, {1, 2}, {1, 2, 3, 4, 5, 6, 7, 8}});
}
BENCHMARK(BM_QuantGemvPlan)->ArgNames({"shape", "m", "wk", "split"})->Apply(PlanArgs)->Apply(Timed);

void BM_QuantGemvRowLoop(benchmark::State& state) {
  const QuantShape s = ShapeOf(state.range(0));
  const int64_t m = state.range(1);
  const int loops = static_cast<int>(state.range(2));
  const cuda::QuantGemvProblem problem = ProblemOf(s, m);
  const std::optional<cuda::QuantGemvPlan> planned =
      loops == 0 ? std::optional<cuda::QuantGemvPlan>(cuda::ChooseQuantGemvSplitPlan(problem, SmCount()))
                 : cuda::QuantGemvRowLoopPlanFor(problem, loops);
  if (!planned.has_value()) return state.SkipWithError("plan not valid for the shape");
  RunPlan(state, s, m, *planned);
}

void RowLoopArgs(benchmark::internal::Benchmark* bm) {
  // The experts' down product: one expert, 8 (a token's top-8), 128 (a 16-token verify step's jobs).
  bm->ArgsProduct({{9, 11, 13, 15, 16, 17}, {8}, {0, 1, 2, 4, 8, 16, 32}});
  bm->ArgsProduct({{11, 15, 16, 17}, {1, 16}, {0, 1, 2, 4, 8, 16}});
  // An 8-token verify step's down product.
  bm->ArgsProduct({{25, 26}, {8}, {0, 1, 2, 4, 8, 16}});
}
BENCHMARK(BM_QuantGemvRowLoop)->ArgNames({"shape", "m", "loops"})->Apply(RowLoopArgs)->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
