// The quantized GEMV's split model (quant_gemv_plan.h).
#include "quant_gemv_plan.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <optional>

namespace eagle3::cuda {
namespace {

// Partial sums of the kernel's final reduction: per warp, B operand, lane and fragment element, then
// per block row and activation row.
size_t ReduceBytes(int64_t m) {
  return static_cast<size_t>(kQuantGemvWarps * QuantGemvRowOperands(m) * 32 * 4 + kQuantGemvBlockRows * m) * 4;
}

// Shared memory of one multiprocessor, and what the runtime reserves per block.
constexpr size_t kSmemPerSm = 228 * 1024;
constexpr size_t kSmemReservedPerBlock = 1024;

// Blocks of `smem` dynamic shared memory a multiprocessor holds at once.
int64_t BlocksPerSm(size_t smem) {
  return std::min<int64_t>(kQuantGemvBlocksPerSm, static_cast<int64_t>(kSmemPerSm / (smem + kSmemReservedPerBlock)));
}

// The time model (seconds, bytes per second). A plan is charged the largest of, softened where they
// meet (a 4-norm: two equal limits cost 1.19 times either):
// - streaming: the weight bytes at the HBM's streaming rate;
// - L2: the weights and every block's staged activations (which hit in L2) at the L2's rate;
// - latency: each warp refills its ring of QuantGemvDepth steps once per load round trip, so a
//   warp's run of steps takes ceil(steps / depth) round trips, once per wave of blocks, plus an
//   activation restaging (an L2 round trip the ring only partly hides) per extra tile;
// - issue: the busiest multiprocessor's weight bytes at the rate at which its warps widen and
//   multiply them (the dequantization instructions, not the loads, bound a multiprocessor; a
//   fragment is widened once for all the rows of a pass), full with kQuantGemvBlocksPerSm blocks
//   resident and proportionally less with fewer;
// and a cluster's barriers and distributed reduction once per launch.
constexpr double kStreamRate = 4.5e12;
constexpr double kL2Rate = 7.0e12;
constexpr double kRoundTrip = 1.0e-6;
constexpr double kRestage = 0.5e-6;
constexpr double kSmRateFp8 = 40e9;
constexpr double kSmRateInt4 = 28e9;
constexpr double kClusterCost = 0.3e-6;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The problem's shared-memory limit, within what the kernels can take.
size_t SharedLimit(const QuantGemvProblem& problem) {
  return std::min(std::max(problem.shared_limit, kQuantGemvSharedLimit), kQuantGemvSharedMax);
}

int64_t RowBlocks(const QuantGemvProblem& problem, int wk, int row_loops = 0) {
  return CeilDiv(problem.n, kQuantGemvBlockRows / wk * std::max(row_loops, 1));
}

// Blocks of a K-split plan's grid.
int64_t SplitBlocks(const QuantGemvProblem& problem, const QuantGemvPlan& plan) {
  return RowBlocks(problem, plan.wk) * plan.split * problem.batch;
}

double ModelledSeconds(const QuantGemvProblem& problem, const QuantGemvPlan& plan, int sm_count) {
  const int64_t units = QuantGemvUnits(problem);
  const int64_t row_blocks = RowBlocks(problem, plan.wk);
  const int64_t blocks = SplitBlocks(problem, plan);
  const size_t smem = QuantGemvSharedBytes(problem, plan);
  const int operands = QuantGemvRowOperands(problem.m);
  const int64_t per_sm = BlocksPerSm(smem);
  const int64_t slots = std::max<int64_t>(1, per_sm * sm_count);
  const int64_t waves = CeilDiv(blocks, slots);
  const int64_t steps = static_cast<int64_t>(plan.part_units) * plan.tiles * QuantGemvUnitSteps(problem.int4);

  const double stream = problem.weight_bytes / kStreamRate;
  const double act_bytes = static_cast<double>(row_blocks) * problem.batch * problem.m * units *
                           kQuantGemvUnitColumns * problem.a_bytes;
  const double l2 = (problem.weight_bytes + act_bytes) / kL2Rate;
  const double latency = static_cast<double>(waves) *
                         (CeilDiv(steps, QuantGemvDepth(operands)) * kRoundTrip + (plan.tiles - 1) * kRestage);
  const int64_t busiest = CeilDiv(blocks, sm_count);  // blocks the busiest multiprocessor runs
  const double resident = static_cast<double>(std::min(busiest, per_sm));
  const double sm_rate = (problem.int4 ? kSmRateInt4 : kSmRateFp8) * std::min(1.0, resident / kQuantGemvBlocksPerSm);
  const double issue = busiest * (problem.weight_bytes / blocks) / sm_rate;
  const auto fourth = [](double x) { return (x * x) * (x * x); };
  const double norm = std::sqrt(std::sqrt(fourth(stream) + fourth(l2) + fourth(latency) + fourth(issue)));
  return norm + (plan.split > 1 ? kClusterCost : 0.0);
}

}  // namespace

std::optional<QuantGemvPlan> QuantGemvPlanFor(const QuantGemvProblem& problem, int wk, int split) {
  const int64_t units = QuantGemvUnits(problem);
  const int64_t rank_units = CeilDiv(units, split);
  if (split > 1 && (split - 1) * rank_units >= units) return std::nullopt;  // a rank without units
  if (wk > 1 && wk > rank_units) return std::nullopt;                       // a warp part without units
  QuantGemvPlan plan{wk, split, static_cast<int>(CeilDiv(rank_units, wk)), 1};
  if (QuantGemvPlanValid(problem, plan)) return plan;
  // Units per warp part of a tile when the rank's range does not fit one: whole ring cycles.
  const int part_step = QuantGemvDepth(QuantGemvRowOperands(problem.m)) / QuantGemvUnitSteps(problem.int4);
  std::optional<QuantGemvPlan> tiled;
  for (int part_units = part_step;; part_units += part_step) {
    const QuantGemvPlan candidate{wk, split, part_units,
                                  static_cast<int>(CeilDiv(rank_units, static_cast<int64_t>(wk) * part_units))};
    if (candidate.tiles < 2 || !QuantGemvPlanValid(problem, candidate)) break;
    tiled = candidate;
  }
  return tiled;
}

std::optional<QuantGemvPlan> QuantGemvRowLoopPlanFor(const QuantGemvProblem& problem, int row_loops) {
  const QuantGemvPlan plan{1, 1, static_cast<int>(QuantGemvUnits(problem)), 1, row_loops};
  if (!QuantGemvPlanValid(problem, plan)) return std::nullopt;
  return plan;
}

namespace {

// Short K (the routed experts' down product): a K-split block would stream a few chunks per warp
// and then pay its fixed costs (launch, staging, the reduction, an empty ring) again, block after
// block. Where the products need more blocks than one wave holds, a row-looped plan takes the
// fewest groups per warp (a power of two) whose blocks fit one wave, but no more than
// kRowLoopSteps steps per warp. The bound is timed with explicit plans (quant_gemv_benchmark's
// BM_QuantGemvRowLoop; benchmarks/NOTES.md) on the experts' down products at 3 blocks a
// multiprocessor: past 8 steps per warp, fewer and longer warps cost more than the extra waves of
// blocks they save (each block's tail waits on its slowest warp, and a multiprocessor's last
// blocks run alone). Where one wave holds the K-split blocks, their plans spread the work wider.
constexpr int kRowLoopSteps = 8;

std::optional<QuantGemvPlan> RowLoopPlan(const QuantGemvProblem& problem, int sm_count) {
  const int64_t steps = QuantGemvUnits(problem) * QuantGemvUnitSteps(problem.int4);  // per group
  if (steps > kQuantGemvRowLoopMaxSteps) return std::nullopt;
  const std::optional<QuantGemvPlan> one = QuantGemvRowLoopPlanFor(problem, 1);
  if (!one.has_value()) return std::nullopt;
  const int64_t slots = BlocksPerSm(QuantGemvSharedBytes(problem, *one)) * sm_count;
  const auto blocks = [&](int row_loops) { return RowBlocks(problem, 1, row_loops) * problem.batch; };
  if (blocks(1) <= slots) return std::nullopt;
  int row_loops = 1;
  while (blocks(row_loops) > slots && 2 * row_loops * steps <= kRowLoopSteps) row_loops *= 2;
  return QuantGemvRowLoopPlanFor(problem, row_loops);
}

// Products of up to 8 rows whose blocks can all be resident at once take the plan that splits each
// 16-row group's K range the most ways (wk warps x split cluster ranks: wk a power of two up to 4,
// or up to every warp of the block for a single product; split 1, 2, 3, 4 or 8) while still
// fitting one wave: the kernel is then bound by the weight loads in flight and by its fixed costs
// (launch, staging, reduction), and a second wave pays the fixed costs again. Timed with explicit
// plans (quant_gemv_benchmark's BM_QuantGemvPlan; benchmarks/NOTES.md) on the decode shapes, this
// rule's plans were the fastest or near them where the time model below picked slower ones (wide
// splits of 128-row blocks); clusters of 5 to 7 ranks were never the fastest, while a split of 3
// was where it let twice the multiprocessors hold two blocks (6 ways where 8 took a second wave:
// a decode step's 18 gate / up items). Of two plans with as many ways, a single product takes the
// one with more warps and fewer cluster ranks: a grid of larger clusters fits a wave less often (a
// cluster's blocks must share a GPC). Only plans that `keep` accepts are taken; nullopt: no such
// plan fits one wave (large batches: the model decides).
template <typename Keep>
std::optional<QuantGemvPlan> OneWavePlan(const QuantGemvProblem& problem, int sm_count, const Keep& keep) {
  // Up to 8 activation rows (one B operand) only: with more, each of the rule's narrower blocks
  // stages more activation rows for fewer weight rows, and the model's plans measured faster.
  if (QuantGemvRowOperands(problem.m) > 1) return std::nullopt;
  const int max_wk = problem.batch == 1 ? kQuantGemvWarps : 4;
  constexpr int kSplits[] = {8, 4, 3, 2, 1};
  constexpr int kMaxWays = 4 * kQuantGemvMaxSplit;
  for (int ways = kMaxWays; ways >= 1; --ways) {
    for (int wk = max_wk; wk >= 1; wk /= 2) {
      if (ways % wk != 0 || std::find(std::begin(kSplits), std::end(kSplits), ways / wk) == std::end(kSplits)) {
        continue;
      }
      const int split = ways / wk;
      const std::optional<QuantGemvPlan> plan = QuantGemvPlanFor(problem, wk, split);
      if (!plan.has_value() || !keep(*plan)) continue;
      if (SplitBlocks(problem, *plan) <= BlocksPerSm(QuantGemvSharedBytes(problem, *plan)) * sm_count) return plan;
    }
  }
  return std::nullopt;
}

// The valid plan of least modelled time among those `keep` accepts; nullopt where it accepts none.
// Fewer warps per row group (more rows per block: fewer activation re-reads) and fewer cluster
// ranks first: a later plan must be clearly faster to replace an earlier one.
template <typename Keep>
std::optional<QuantGemvPlan> ModelledBest(const QuantGemvProblem& problem, int sm_count, const Keep& keep) {
  std::optional<QuantGemvPlan> best;
  double best_cost = 0.0;
  for (int wk = 1; wk <= kQuantGemvWarps; wk *= 2) {
    for (int split = 1; split <= kQuantGemvMaxSplit; ++split) {
      const std::optional<QuantGemvPlan> candidate = QuantGemvPlanFor(problem, wk, split);
      if (!candidate.has_value() || !keep(*candidate)) continue;
      const double cost = ModelledSeconds(problem, *candidate, sm_count);
      if (!best.has_value() || cost < 0.97 * best_cost) {
        best = candidate;
        best_cost = cost;
      }
    }
  }
  return best;
}

// Products of up to 8 rows whose blocks take more than one wave: one warp per 16-row group and the
// fewest cluster ranks (1 to 4) whose waves leave at most a quarter of their block slots idle (the
// slots of the last, partial wave that no block takes). Timed with explicit plans on the gate-up
// products of grouped MoE rounds at 8 rows (quant_gemv_benchmark's BM_QuantGemvPlan,
// benchmarks/NOTES.md), split 1 was the fastest where its waves idled under a quarter of their
// slots, ahead of the model's wider splits, and lost to splits of 2 to 4 where its second wave held
// a few dozen blocks: a partial wave over most multiprocessors costs little more than a full one,
// while wider splits pay their clusters' barriers and reductions. The grouped MoE plans for every
// job a round may have, and blocks of jobs it does not have exit at once, so a plan that just
// passes the bound on the planned blocks idles more in the run: the quarter, rather than a looser
// half of the last wave, keeps a margin for it (whole MoE rounds timed both ways). nullopt where
// no such plan is valid or `keep` accepts none (the model decides).
template <typename Keep>
std::optional<QuantGemvPlan> TailPlan(const QuantGemvProblem& problem, int sm_count, const Keep& keep) {
  if (QuantGemvRowOperands(problem.m) > 1) return std::nullopt;
  for (int split = 1; split <= 4; ++split) {
    const std::optional<QuantGemvPlan> plan = QuantGemvPlanFor(problem, 1, split);
    if (!plan.has_value() || !keep(*plan)) continue;
    const int64_t slots = BlocksPerSm(QuantGemvSharedBytes(problem, *plan)) * sm_count;
    const int64_t blocks = SplitBlocks(problem, *plan);
    const int64_t wave_slots = CeilDiv(blocks, slots) * slots;
    if (4 * (wave_slots - blocks) <= wave_slots) return plan;
  }
  return std::nullopt;
}

// The plan of the one-wave rule, else of the tail rule, else of least modelled time, among the
// valid plans within the problem's shared-memory limit that `keep` accepts; nullopt where it accepts
// none.
template <typename Keep>
std::optional<QuantGemvPlan> SweepPlans(const QuantGemvProblem& problem, int sm_count, const Keep& keep) {
  if (std::optional<QuantGemvPlan> one_wave = OneWavePlan(problem, sm_count, keep); one_wave.has_value()) {
    return one_wave;
  }
  if (std::optional<QuantGemvPlan> tail = TailPlan(problem, sm_count, keep); tail.has_value()) return tail;
  return ModelledBest(problem, sm_count, keep);
}

// Where `narrow`, the plan within the default shared-memory limit, splits the activations into
// several tiles: the plan the sweep takes within the problem's wider limit among those with fewer
// tiles and no more blocks than `narrow`, where it is modelled faster than `narrow`; else nullopt.
// The wider limit buys fewer restagings (or a narrower grid), never a larger grid. The model prices
// a larger grid too low (it counts a wave in blocks, while a grid of clusters fills a wave only as
// far as whole clusters fit each GPC's multiprocessors, and it charges a second wave only its
// latency), and the wider limit's larger grids (the dense gate-up at 32 rows in 7 cluster ranks
// where the default limit's plan takes 6; two 32-row items in 504 blocks where it takes 216) ran
// slower than the default limit's plans of several tiles (benchmarks/NOTES.md).
std::optional<QuantGemvPlan> WiderPlan(const QuantGemvProblem& problem, const QuantGemvPlan& narrow, int sm_count) {
  const int64_t blocks = SplitBlocks(problem, narrow);
  const std::optional<QuantGemvPlan> wide = SweepPlans(problem, sm_count, [&](const QuantGemvPlan& plan) {
    return plan.tiles < narrow.tiles && SplitBlocks(problem, plan) <= blocks;
  });
  if (!wide.has_value() || ModelledSeconds(problem, *wide, sm_count) >= ModelledSeconds(problem, narrow, sm_count)) {
    return std::nullopt;
  }
  return wide;
}

// The K-split kernel's plan: the sweep's within the default shared-memory limit, or past it only
// where that plan splits the activations into several tiles (a plan that stages them once within
// it is kept as it was measured), and then as WiderPlan says.
QuantGemvPlan SplitPlan(const QuantGemvProblem& problem, int sm_count) {
  QuantGemvProblem narrow = problem;
  narrow.shared_limit = kQuantGemvSharedLimit;
  const std::optional<QuantGemvPlan> plan = SweepPlans(narrow, sm_count, [](const QuantGemvPlan&) { return true; });
  if (!plan.has_value()) {  // unreachable for valid sizes: the smallest tile of one row fits
    const int part_step = QuantGemvDepth(QuantGemvRowOperands(problem.m)) / QuantGemvUnitSteps(problem.int4);
    return {1, 1, part_step, static_cast<int>(CeilDiv(QuantGemvUnits(problem), part_step))};
  }
  if (plan->tiles > 1 && SharedLimit(problem) > kQuantGemvSharedLimit) {
    if (const std::optional<QuantGemvPlan> wide = WiderPlan(problem, *plan, sm_count); wide.has_value()) return *wide;
  }
  return *plan;
}

bool SameProblem(const QuantGemvProblem& a, const QuantGemvProblem& b) {
  return a.int4 == b.int4 && a.batch == b.batch && a.m == b.m && a.n == b.n && a.k == b.k && a.shift == b.shift &&
         a.a_bytes == b.a_bytes && a.weight_bytes == b.weight_bytes && a.shared_limit == b.shared_limit;
}

}  // namespace

int QuantGemvUnitSteps(bool int4) { return int4 ? 1 : 2; }

size_t QuantGemvSharedLimitFromEnv(const char* value) {
  if (value == nullptr || value[0] == '\0') return kQuantGemvSharedMax;
  char* end = nullptr;
  const long kib = std::strtol(value, &end, 10);
  if (end == value || *end != '\0') return kQuantGemvSharedMax;
  return std::min(std::max(static_cast<size_t>(std::max(kib, 0L)) * 1024, kQuantGemvSharedLimit), kQuantGemvSharedMax);
}

size_t QuantGemvSharedLimitFor(int64_t m) {
  static const size_t wide = QuantGemvSharedLimitFromEnv(std::getenv("EAGLE3_QUANT_GEMV_SHARED_KIB"));
  return QuantGemvRowOperands(m) > 1 ? wide : kQuantGemvSharedLimit;
}

int64_t QuantGemvUnits(const QuantGemvProblem& problem) {
  return CeilDiv(problem.shift + problem.k, kQuantGemvUnitColumns);
}

size_t QuantGemvStagedBytes(const QuantGemvProblem& problem, const QuantGemvPlan& plan) {
  const int64_t tile_units = static_cast<int64_t>(plan.wk) * plan.part_units;
  // Each activation row: the tile's columns as bf16 and 64 bytes that skew the rows' banks.
  const int64_t act = problem.m * (tile_units * kQuantGemvUnitColumns * 2 + 64);
  // fp8: the scale rows the block's rows touch (two for 128 rows; one more per further 128).
  const int64_t scale_rows = plan.row_loops > 0 ? plan.row_loops + 1 : 2;
  const int64_t scales = problem.int4 ? 0 : scale_rows * tile_units * 4;
  return static_cast<size_t>(act + scales);
}

size_t QuantGemvSharedBytes(const QuantGemvProblem& problem, const QuantGemvPlan& plan) {
  const size_t staged = QuantGemvStagedBytes(problem, plan);
  // A row-looped block writes its sums from the fragments: no reduction area.
  if (plan.row_loops > 0) return staged;
  return std::max(staged, ReduceBytes(problem.m));
}

bool QuantGemvPlanValid(const QuantGemvProblem& problem, const QuantGemvPlan& plan) {
  if (plan.wk != 1 && plan.wk != 2 && plan.wk != 4 && plan.wk != 8) return false;
  if (plan.split < 1 || plan.split > kQuantGemvMaxSplit) return false;
  if (plan.part_units < 1 || plan.tiles < 1 || plan.part_units > (1 << 20) || plan.tiles > (1 << 20)) return false;
  const int64_t units = QuantGemvUnits(problem);
  if (plan.row_loops != 0) {
    if (plan.row_loops < 1 || plan.row_loops > kQuantGemvMaxRowLoops) return false;
    if (plan.wk != 1 || plan.split != 1 || plan.tiles != 1 || plan.part_units != units) return false;
    if (QuantGemvRowOperands(problem.m) > 2) return false;
    if (QuantGemvSharedBytes(problem, plan) > SharedLimit(problem)) return false;
    return RowBlocks(problem, 1, plan.row_loops) <= 0x7fffffff;
  }
  const int64_t rank_units = CeilDiv(units, plan.split);
  if (static_cast<int64_t>(plan.wk) * plan.part_units * plan.tiles < rank_units) return false;
  const int depth = QuantGemvDepth(QuantGemvRowOperands(problem.m));
  if (plan.tiles > 1 && plan.part_units * QuantGemvUnitSteps(problem.int4) % depth != 0) return false;
  if (QuantGemvSharedBytes(problem, plan) > SharedLimit(problem)) return false;
  return RowBlocks(problem, plan.wk) * plan.split <= 0x7fffffff;
}

int QuantGemvTileRowLoops(const QuantGemvProblem& problem, int row_loops, int64_t tokens) {
  if (problem.int4 || row_loops < 1) return row_loops;
  const int64_t target =
      tokens >= kQuantGemvTileRowLoopWideTokens ? kQuantGemvTileRowLoopWideSteps : kQuantGemvTileRowLoopSteps;
  const int64_t steps = QuantGemvUnits(problem) * QuantGemvUnitSteps(problem.int4);  // per group
  while (row_loops * steps < target && 2 * row_loops <= kQuantGemvMaxRowLoops) row_loops *= 2;
  return row_loops;
}

QuantGemvPlan ChooseQuantGemvSplitPlan(const QuantGemvProblem& problem, int sm_count) {
  return SplitPlan(problem, std::max(sm_count, 1));
}

QuantGemvPlan ChooseQuantGemvPlan(const QuantGemvProblem& problem, int sm_count) {
  sm_count = std::max(sm_count, 1);
  // The sweep takes microseconds, as long as a small product itself: a decode step launches the
  // same few shapes again and again (eagerly too), so each thread keeps its last choices.
  struct Choice {
    QuantGemvProblem problem;
    int sm_count = 0;
    QuantGemvPlan plan;
  };
  constexpr int kKept = 32;
  thread_local std::array<Choice, kKept> kept;
  thread_local int next = 0;
  for (const Choice& choice : kept) {
    if (choice.sm_count == sm_count && SameProblem(choice.problem, problem)) return choice.plan;
  }
  const std::optional<QuantGemvPlan> row_looped = RowLoopPlan(problem, sm_count);
  const QuantGemvPlan plan = row_looped.has_value() ? *row_looped : SplitPlan(problem, sm_count);
  kept[next] = {problem, sm_count, plan};
  next = (next + 1) % kKept;
  return plan;
}

}  // namespace eagle3::cuda
