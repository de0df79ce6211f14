// The quantized GEMV's planner (cuda/quant_gemv_plan.h), host code that needs no GPU: the chosen
// plans valid for decode shapes and extremes on any device size and either shared-memory limit, the
// wider limit taken only where the default one splits the activations into tiles and then never for
// a larger grid, the one-wave rule and the row-looped plans. The kernels that run the plans:
// tests/gpu/quant_gemv_test.cc.
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "gtest/gtest.h"
#include "quant_gemv_plan.h"
#include "quant_gemv_problem.h"

namespace eagle3::cuda {
namespace {

// The planner's choice is a plan the kernel runs, for decode shapes and extremes, on any device size.
TEST(QuantGemvPlanTest, ChosenPlansAreValid) {
  struct Shape {
    int64_t batch, n, k, col0;
  };
  const Shape shapes[] = {{1, 1, 1, 0},        {1, 9, 40, 16},       {1, 1536, 7168, 0},     {1, 576, 7168, 0},
                          {16, 512, 128, 0},   {16, 128, 512, 0},    {1, 7168, 2048, 2048},  {1, 4608, 7168, 0},
                          {8, 7168, 256, 256}, {8, 512, 7168, 0},    {1, 100, 1 << 20, 48},  {1, 3, 1 << 29, 0},
                          {65535, 16, 64, 0},  {1, 1 << 24, 128, 0}, {1, 300, 1000, 104},  {1, 2112, 7168, 0}};
  for (const bool int4 : {false, true}) {
    for (const Shape& shape : shapes) {
      for (const int64_t m : {1, 5, 8, 9, 16, 17, 24, 32}) {
        for (const int sm_count : {1, 16, 132, 1000}) {
          for (const size_t limit : {kQuantGemvSharedLimit, kQuantGemvSharedMax}) {
            const int64_t col0 = int4 ? shape.col0 / 8 * 8 : shape.col0 / 16 * 16;
            QuantGemvProblem problem = ProblemOf(int4, shape.batch, m, shape.n, shape.k, col0);
            problem.shared_limit = limit;
            const QuantGemvPlan plan = ChooseQuantGemvPlan(problem, sm_count);
            EXPECT_TRUE(QuantGemvPlanValid(problem, plan))
                << (int4 ? "int4" : "fp8") << " batch " << shape.batch << " n " << shape.n << " k " << shape.k
                << " m " << m << " sms " << sm_count << " limit " << limit << ": wk " << plan.wk << " split "
                << plan.split << " part_units " << plan.part_units << " tiles " << plan.tiles;
            EXPECT_LE(QuantGemvSharedBytes(problem, plan), limit);
          }
        }
      }
    }
  }
}

// Past the default shared-memory limit only where it splits the activations into tiles: at 24 and 32
// rows the V3 rank's q_a and the experts' gate-up products stage their whole rank range once with the
// wider limit (several tiles without it), and every plan that fits one tile within the default limit
// (up to 20 rows there) is chosen unchanged.
TEST(QuantGemvPlanTest, WiderSharedLimitOnlyWhereTilesSplit) {
  struct Shape {
    bool int4;
    int64_t batch, n, k;
  };
  const Shape shapes[] = {{false, 1, 1536, 7168}, {false, 1, 2112, 7168}, {false, 9, 512, 7168}, {true, 9, 512, 7168}};
  for (const Shape& shape : shapes) {
    for (const int64_t m : {9, 16, 17, 20, 24, 28, 32}) {
      SCOPED_TRACE(testing::Message() << (shape.int4 ? "int4" : "fp8") << " batch " << shape.batch << " n "
                                      << shape.n << " k " << shape.k << " m " << m);
      const QuantGemvProblem narrow = ProblemOf(shape.int4, shape.batch, m, shape.n, shape.k, 0);
      QuantGemvProblem wide = narrow;
      wide.shared_limit = kQuantGemvSharedMax;
      const QuantGemvPlan before = ChooseQuantGemvPlan(narrow, 132);
      const QuantGemvPlan after = ChooseQuantGemvPlan(wide, 132);
      EXPECT_EQ(after.tiles, 1);
      if (before.tiles == 1) {
        EXPECT_EQ(after.wk, before.wk);
        EXPECT_EQ(after.split, before.split);
        EXPECT_EQ(after.part_units, before.part_units);
      } else {
        EXPECT_GE(m, 24);
        EXPECT_GT(QuantGemvSharedBytes(wide, after), kQuantGemvSharedLimit);
      }
    }
  }
  // Up to 8 rows the launchers keep the default limit; from 9, the wider one.
  EXPECT_EQ(QuantGemvSharedLimitFor(8), kQuantGemvSharedLimit);
  if (std::getenv("EAGLE3_QUANT_GEMV_SHARED_KIB") == nullptr) EXPECT_EQ(QuantGemvSharedLimitFor(9), kQuantGemvSharedMax);
}

// Blocks of a K-split plan's grid.
int64_t GridBlocks(const QuantGemvProblem& problem, const QuantGemvPlan& plan) {
  const int64_t block_rows = kQuantGemvBlockRows / plan.wk;
  return (problem.n + block_rows - 1) / block_rows * plan.split * problem.batch;
}

// The wider limit buys fewer activation tiles, never a larger grid. The V3 rank's dense gate-up
// (4608 x 7168) at 32 rows: within 48 KiB 6 cluster ranks of 10 units in two tiles (216 blocks);
// past it one tile of the same 6 ranks, not 7 ranks of 8 units (252 blocks: the larger grid that ran
// slower than the two tiles). Two 32-row items (64 rows): 3 ranks in four tiles within 48 KiB and no plan of fewer
// tiles and no more blocks that the model finds faster, so the same plan, not 504 blocks of 7
// ranks. q_a keeps its plans past 48 KiB (fewer blocks: 240 -> 168 at 24 rows, 240 -> 192 for two
// 32-row items). Over decode and verify shapes, a plan past 48 KiB has fewer tiles and no more
// blocks than the plan within it.
TEST(QuantGemvPlanTest, WiderSharedLimitNeverGrowsTheGrid) {
  const auto choose = [](int64_t batch, int64_t m, int64_t n, int64_t k, size_t limit) {
    QuantGemvProblem problem = ProblemOf(false, batch, m, n, k, 0);
    problem.shared_limit = limit;
    return ChooseQuantGemvPlan(problem, 132);
  };
  const auto expect_plan = [](const QuantGemvPlan& plan, int wk, int split, int part_units, int tiles) {
    EXPECT_EQ(plan.wk, wk);
    EXPECT_EQ(plan.split, split);
    EXPECT_EQ(plan.part_units, part_units);
    EXPECT_EQ(plan.tiles, tiles);
    EXPECT_EQ(plan.row_loops, 0);
  };
  {
    SCOPED_TRACE("dense gate-up, 32 rows");
    expect_plan(choose(1, 32, 4608, 7168, kQuantGemvSharedLimit), 1, 6, 5, 2);
    expect_plan(choose(1, 32, 4608, 7168, kQuantGemvSharedMax), 1, 6, 10, 1);
  }
  {
    SCOPED_TRACE("dense gate-up, two items of 32 rows");
    expect_plan(choose(2, 32, 4608, 7168, kQuantGemvSharedLimit), 1, 3, 5, 4);
    expect_plan(choose(2, 32, 4608, 7168, kQuantGemvSharedMax), 1, 3, 5, 4);
  }
  {
    SCOPED_TRACE("q_a, 24 rows");
    expect_plan(choose(1, 24, 1536, 7168, kQuantGemvSharedLimit), 4, 5, 1, 3);
    expect_plan(choose(1, 24, 1536, 7168, kQuantGemvSharedMax), 2, 7, 4, 1);
  }
  {
    SCOPED_TRACE("q_a, two items of 32 rows");
    expect_plan(choose(2, 32, 1536, 7168, kQuantGemvSharedLimit), 2, 5, 2, 3);
    expect_plan(choose(2, 32, 1536, 7168, kQuantGemvSharedMax), 1, 8, 7, 1);
  }

  struct Shape {
    bool int4;
    int64_t n, k;
  };
  const Shape shapes[] = {{false, 1536, 7168}, {false, 3072, 1536}, {false, 576, 7168}, {false, 2112, 7168},
                          {false, 7168, 2048}, {false, 4608, 7168}, {false, 7168, 2304}, {false, 512, 7168},
                          {true, 512, 7168},   {true, 7168, 256},   {false, 256, 7168},  {true, 256, 7168}};
  for (const Shape& shape : shapes) {
    for (const int64_t batch : {1, 2, 3, 4, 8, 9}) {
      for (const int64_t m : {9, 16, 17, 20, 24, 28, 32}) {
        SCOPED_TRACE(testing::Message() << (shape.int4 ? "int4" : "fp8") << " batch " << batch << " n " << shape.n
                                        << " k " << shape.k << " m " << m);
        const QuantGemvProblem narrow = ProblemOf(shape.int4, batch, m, shape.n, shape.k, 0);
        QuantGemvProblem wide = narrow;
        wide.shared_limit = kQuantGemvSharedMax;
        const QuantGemvPlan before = ChooseQuantGemvPlan(narrow, 132);
        const QuantGemvPlan after = ChooseQuantGemvPlan(wide, 132);
        if (before.row_loops > 0 || before.tiles == 1) {
          EXPECT_EQ(after.row_loops, before.row_loops);
          EXPECT_EQ(after.wk, before.wk);
          EXPECT_EQ(after.split, before.split);
          EXPECT_EQ(after.part_units, before.part_units);
          EXPECT_EQ(after.tiles, before.tiles);
          continue;
        }
        if (after.tiles == before.tiles) {  // kept: the plan within 48 KiB
          EXPECT_EQ(after.wk, before.wk);
          EXPECT_EQ(after.split, before.split);
          EXPECT_EQ(after.part_units, before.part_units);
        } else {
          EXPECT_LT(after.tiles, before.tiles);
          EXPECT_LE(GridBlocks(wide, after), GridBlocks(narrow, before));
        }
      }
    }
  }
}

// The one-wave rule for a single product: of the plans with the most K ways that fit one wave, the
// one with every warp of the block on K and fewer cluster ranks (the stacked q_a | kv_a product of
// a V3 rank: 16 ways as 8 warps x 2 ranks, not 4 x 4); a grouped product keeps 4 warps at most.
TEST(QuantGemvPlanTest, OneWavePlansPreferWarpsOverClusterRanks) {
  const QuantGemvPlan stacked = ChooseQuantGemvPlan(ProblemOf(false, 1, 1, 2112, 7168, 0), 132);
  EXPECT_EQ(stacked.wk, 8);
  EXPECT_EQ(stacked.split, 2);
  const QuantGemvPlan q_a = ChooseQuantGemvPlan(ProblemOf(false, 1, 1, 1536, 7168, 0), 132);
  EXPECT_EQ(q_a.wk * q_a.split, 16);
  EXPECT_EQ(q_a.wk, 8);
  const QuantGemvPlan experts = ChooseQuantGemvPlan(ProblemOf(false, 8, 8, 512, 7168, 0), 132);
  EXPECT_LE(experts.wk, 4);
}

// Ways that are not powers of two: a V3 decode step's 18 gate / up items of 256 x 7168 at one row
// would need 288 blocks for 8 ways (a second wave of 2 x 132), so the rule takes 6 (2 warps x 3
// ranks, 216 blocks) rather than 4; a K2.5 step's 16 items fit 8 ways (4 x 2, 256 blocks) and keep
// them.
TEST(QuantGemvPlanTest, OneWavePlansTakeSplitsOfThree) {
  const QuantGemvPlan v3 = ChooseQuantGemvPlan(ProblemOf(false, 18, 1, 256, 7168, 0), 132);
  EXPECT_EQ(v3.wk, 2);
  EXPECT_EQ(v3.split, 3);
  const QuantGemvPlan k25 = ChooseQuantGemvPlan(ProblemOf(true, 16, 1, 256, 7168, 0), 132);
  EXPECT_EQ(k25.wk, 4);
  EXPECT_EQ(k25.split, 2);
}

// Past one wave at up to 8 rows, the tail rule: one warp per group and the fewest cluster ranks
// whose waves leave at most a quarter of their slots idle (264 slots a wave on 132 multiprocessors).
// The gate-up products of 204 to 570 items of 256 x 7168 at 8 rows take split 1 (204: 408 blocks,
// 120 of 528 slots idle); 160, 176 and 192 items take split 2 (split 1 idles 208, 176 and 144 of
// 528; split 2 152, 88 and 24 of 792); 144 items split 3 (split 2 idles 216 of 792; split 3 192 of
// 1056).
TEST(QuantGemvPlanTest, TailRuleLeavesFewSlotsIdle) {
  const int sms = 132;
  for (const bool int4 : {false, true}) {
    SCOPED_TRACE(int4 ? "int4" : "fp8");
    for (const int64_t items : {204, 218, 224, 448, 570}) {
      const QuantGemvPlan plan = ChooseQuantGemvPlan(ProblemOf(int4, items, 8, 256, 7168, 0), sms);
      EXPECT_EQ(plan.wk, 1) << items << " items";
      EXPECT_EQ(plan.split, 1) << items << " items";
    }
    const QuantGemvPlan few = ChooseQuantGemvPlan(ProblemOf(int4, 144, 8, 256, 7168, 0), sms);
    EXPECT_EQ(few.wk, 1);
    EXPECT_EQ(few.split, 3);
    for (const int64_t items : {160, 176, 192}) {
      const QuantGemvPlan plan = ChooseQuantGemvPlan(ProblemOf(int4, items, 8, 256, 7168, 0), sms);
      EXPECT_EQ(plan.wk, 1) << items << " items";
      EXPECT_EQ(plan.split, 2) << items << " items";
    }
  }
  // More rows than one operand: the model decides, as before.
  const QuantGemvPlan wide = ChooseQuantGemvPlan(ProblemOf(true, 160, 16, 256, 7168, 0), sms);
  EXPECT_TRUE(QuantGemvPlanValid(ProblemOf(true, 160, 16, 256, 7168, 0), wide));
}

// Row-looped plans: what QuantGemvPlanValid takes, and where the chooser takes them and with how
// many groups (short K over more blocks than one wave of an H200-sized device holds: the experts'
// down products of a decode and a verify step) and where not (long K, one wave, more than 16 rows).
TEST(QuantGemvPlanTest, RowLoopedPlanRules) {
  for (const bool int4 : {false, true}) {
    SCOPED_TRACE(int4 ? "int4" : "fp8");
    const QuantGemvProblem down = ProblemOf(int4, 8, 8, 7168, 256, 256);  // 2 units
    EXPECT_TRUE(QuantGemvPlanValid(down, QuantGemvPlan{1, 1, 2, 1, 4}));
    ASSERT_TRUE(QuantGemvRowLoopPlanFor(down, 64).has_value());
    const QuantGemvPlan bad[] = {
        {2, 1, 1, 1, 4},  // wk
        {1, 2, 1, 1, 4},  // split
        {1, 1, 1, 2, 4},  // tiles
        {1, 1, 1, 1, 4},  // part_units short of the units
        {1, 1, 3, 1, 4},  // part_units past them
        {1, 1, 2, 1, 65}, {1, 1, 2, 1, -1},  // row_loops
    };
    for (const QuantGemvPlan& plan : bad) {
      EXPECT_FALSE(QuantGemvPlanValid(down, plan)) << "wk " << plan.wk << " split " << plan.split << " part_units "
                                                   << plan.part_units << " tiles " << plan.tiles << " row_loops "
                                                   << plan.row_loops;
    }
    EXPECT_FALSE(QuantGemvRowLoopPlanFor(ProblemOf(int4, 8, 17, 7168, 256, 256), 2).has_value()) << "17 rows";
    EXPECT_FALSE(QuantGemvRowLoopPlanFor(ProblemOf(int4, 1, 16, 7168, 7168, 0), 1).has_value()) << "tile past 48 KB";

    // 8 experts (a token's top-8): 2 groups per warp fit one wave of 264 blocks; 128 (a 16-token
    // step's jobs): 8 steps per warp, 4 groups of 2 int4 steps or 2 of 4 fp8 steps.
    EXPECT_EQ(ChooseQuantGemvPlan(down, 132).row_loops, 2);
    const QuantGemvPlan verify = ChooseQuantGemvPlan(ProblemOf(int4, 128, 8, 7168, 256, 256), 132);
    EXPECT_EQ(verify.row_loops, int4 ? 4 : 2);
    EXPECT_TRUE(QuantGemvPlanValid(ProblemOf(int4, 128, 8, 7168, 256, 256), verify));
    EXPECT_EQ(ChooseQuantGemvPlan(ProblemOf(int4, 8, 8, 512, 7168, 0), 132).row_loops, 0) << "long K";
    EXPECT_EQ(ChooseQuantGemvPlan(ProblemOf(int4, 1, 8, 7168, 256, 256), 132).row_loops, 0) << "one wave";
    EXPECT_EQ(ChooseQuantGemvPlan(ProblemOf(int4, 128, 17, 7168, 256, 256), 132).row_loops, 0) << "17 rows";
    EXPECT_EQ(ChooseQuantGemvSplitPlan(down, 132).row_loops, 0);

    // The in-block combine of several tokens (a direct MoE round's down product, one row an
    // item): fp8 from the planned 2 groups of 4 steps to 4 (16 steps a warp) under 4 tokens, to 8
    // (32 steps) from 4 tokens; int4 as planned; long K as planned, short K up to the steps, 0
    // stays 0.
    const QuantGemvProblem direct_down = ProblemOf(int4, 16, 1, 7168, 256, 256);
    const int planned = ChooseQuantGemvPlan(direct_down, 132).row_loops;
    EXPECT_EQ(planned, int4 ? 4 : 2);
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, planned, 2), 4);
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, planned, 3), 4);
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, planned, 4), int4 ? 4 : 8);
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, planned, 16), int4 ? 4 : 8);
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, 1, 2), int4 ? 1 : 4);
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, 1, 4), int4 ? 1 : 8);
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, 8, 2), 8);
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, 16, 4), 16);
    EXPECT_EQ(QuantGemvTileRowLoops(ProblemOf(int4, 16, 1, 7168, 2048, 0), 1, 4), 1) << "long K";
    EXPECT_EQ(QuantGemvTileRowLoops(ProblemOf(int4, 16, 1, 7168, 128, 0), 1, 2), int4 ? 1 : 8) << "one unit";
    EXPECT_EQ(QuantGemvTileRowLoops(ProblemOf(int4, 16, 1, 7168, 128, 0), 1, 4), int4 ? 1 : 16) << "one unit";
    EXPECT_EQ(QuantGemvTileRowLoops(direct_down, 0, 4), 0);
    const QuantGemvPlan longer{1, 1, 2, 1, QuantGemvTileRowLoops(direct_down, planned, 2)};
    const QuantGemvPlan wide{1, 1, 2, 1, QuantGemvTileRowLoops(direct_down, planned, 4)};
    if (!int4) EXPECT_TRUE(QuantGemvPlanValid(direct_down, longer));
    if (!int4) EXPECT_TRUE(QuantGemvPlanValid(direct_down, wide));
  }
}

// EAGLE3_QUANT_GEMV_SHARED_KIB: whole KiB clamped to [48, 112]; unset, empty (`VAR= cmd`, which an
// A/B script's "default" arm writes) or not a number means the default, 112 KiB, not 48.
TEST(QuantGemvPlanTest, SharedLimitFromEnvTreatsEmptyAsUnset) {
  EXPECT_EQ(QuantGemvSharedLimitFromEnv(nullptr), kQuantGemvSharedMax);
  EXPECT_EQ(QuantGemvSharedLimitFromEnv(""), kQuantGemvSharedMax);
  EXPECT_EQ(QuantGemvSharedLimitFromEnv("abc"), kQuantGemvSharedMax);
  EXPECT_EQ(QuantGemvSharedLimitFromEnv("64k"), kQuantGemvSharedMax);
  EXPECT_EQ(QuantGemvSharedLimitFromEnv("48"), kQuantGemvSharedLimit);
  EXPECT_EQ(QuantGemvSharedLimitFromEnv("64"), size_t{64} * 1024);
  EXPECT_EQ(QuantGemvSharedLimitFromEnv("0"), kQuantGemvSharedLimit);
  EXPECT_EQ(QuantGemvSharedLimitFromEnv("4096"), kQuantGemvSharedMax);
}

}  // namespace
}  // namespace eagle3::cuda
