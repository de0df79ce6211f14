// The launch plan of paged latent attention (cuda/latent_plan.h), host code that needs no GPU: which
// kernel each call shape runs under each kernel choice, how a block's rows split into tokens x
// heads, how many splits the keys take within the scratch, when the splits merge in the attention
// kernel, and what cannot run. The kernels that run the plans: tests/gpu/cuda_latent_bf16_test.cc.
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"
#include "latent_plan.h"
#include "latent_wgmma_layout.h"

namespace eagle3::cuda {
namespace {

// A bf16 cache address that is 16-byte aligned (never dereferenced: the plan reads no memory).
const uint16_t* const kAlignedCache = reinterpret_cast<const uint16_t*>(uintptr_t{1} << 20);

// A batched call at DeepSeek's latent shape (576 / 512): `batch` sequences of `tokens_each` new
// tokens, `heads` heads, keys up to max_kv.
LatentLaunchParams Call(int64_t batch, int64_t tokens_each, int64_t heads, int64_t max_kv) {
  LatentLaunchParams p;
  p.cache_bf16 = kAlignedCache;
  p.key_dim = 576;
  p.value_dim = 512;
  p.batch = batch;
  p.tokens = batch * tokens_each;
  p.heads = heads;
  p.max_kv_len = max_kv;
  p.page_size = 64;
  return p;
}

LatentPlanDevice H200(LatentTreeKernelChoice choice = LatentTreeKernelChoice::kMma, bool wgmma = true) {
  // kMma by default here: the rules of the mma.sync kernels; kAuto has a test of its own.
  LatentPlanDevice d;
  d.sms = 132;
  d.max_shared = 227 * 1024;
  d.choice = choice;
  d.wgmma_available = wgmma;
  return d;
}

constexpr int64_t kPlentyOfScratch = int64_t{1} << 40;

LatentPlan Plan(const LatentLaunchParams& p, const LatentPlanDevice& device, const LatentFold& fold = {}) {
  LatentPlan plan;
  EXPECT_TRUE(PlanLatentLaunch(p, /*tile_table=*/true, /*partials=*/true, kPlentyOfScratch, fold, device, &plan));
  return plan;
}

TEST(LatentPlanTest, DecodeAt16HeadsRunsTheCompactKernel) {
  const LatentPlan plan = Plan(Call(32, 1, 16, 4096), H200());
  EXPECT_EQ(plan.kernel, LatentKernelKind::kCompact);
  EXPECT_EQ(plan.rows, 16);
  EXPECT_EQ(plan.heads_per_tile, 16);
  EXPECT_EQ(plan.tokens_per_tile, 1);
  EXPECT_EQ(plan.head_tiles, 1);
  EXPECT_EQ(plan.value_tiles, 1);
  EXPECT_EQ(plan.token_tiles, 32);
  EXPECT_EQ(plan.split_chunk, LatentCompactChunk());
  // 32 blocks a split: 4 splits fill one wave of 132 multiprocessors (128 blocks), 5 take two.
  EXPECT_EQ(plan.splits, 4);
  // One sequence: the keys spread over every multiprocessor it can use (one chunk a split).
  EXPECT_EQ(Plan(Call(1, 1, 16, 4096), H200()).splits, 4096 / LatentCompactChunk());
}

// Trees of 8 tokens x 16 heads (128 rows a sequence): the compact kernel's 16-row blocks under the
// default choice; the wgmma kernel's 64-row blocks (4 tokens x 16 heads) where chosen and the device
// runs it, else the default rule.
TEST(LatentPlanTest, ShortTreesTakeTheWgmmaKernelWhereChosen) {
  const LatentLaunchParams p = Call(32, 8, 16, 4096);
  EXPECT_EQ(Plan(p, H200()).kernel, LatentKernelKind::kCompact);
  const LatentPlan wgmma = Plan(p, H200(LatentTreeKernelChoice::kWgmma));
  EXPECT_EQ(wgmma.kernel, LatentKernelKind::kWgmma);
  EXPECT_EQ(wgmma.rows, 64);
  EXPECT_EQ(wgmma.heads_per_tile, 16);
  EXPECT_EQ(wgmma.tokens_per_tile, 4);
  EXPECT_EQ(wgmma.token_tiles, (256 + 32 * 3) / 4);  // the tile table's bound: sum of ceil(n_b / 4) <= 88
  EXPECT_EQ(wgmma.split_chunk, kWgmmaChunk);
  EXPECT_EQ(wgmma.shared_bytes, kWgmmaLaunchSharedBytes);
  EXPECT_EQ(Plan(p, H200(LatentTreeKernelChoice::kWgmma, /*wgmma=*/false)).kernel, LatentKernelKind::kCompact);
  EXPECT_EQ(Plan(p, H200(LatentTreeKernelChoice::kWgmmaAll, /*wgmma=*/false)).kernel, LatentKernelKind::kCompact);
  // Below 64 rows a sequence (3 tokens x 16 heads) kWgmma keeps the default rule; kWgmmaAll does not.
  EXPECT_EQ(Plan(Call(8, 3, 16, 4096), H200(LatentTreeKernelChoice::kWgmma)).kernel, LatentKernelKind::kCompact);
  EXPECT_EQ(Plan(Call(8, 3, 16, 4096), H200(LatentTreeKernelChoice::kWgmmaAll)).kernel, LatentKernelKind::kWgmma);
}

// A tree mask bounds each sequence's tokens (tree_width, checked by the kernels' check), so the
// tile count the splits are chosen for is exact at uniform trees: 32 trees of 8 tokens take 64
// tiles of 4 tokens x 16 heads, 2 splits fill one wave (128 blocks); the causal bound (88 tiles)
// would choose 3 splits, two waves of which the second holds 60 blocks.
TEST(LatentPlanTest, TreeWidthBoundsTheTiles) {
  LatentLaunchParams p = Call(32, 8, 16, 4096);
  const LatentPlanDevice device = H200(LatentTreeKernelChoice::kWgmma);
  const LatentPlan causal = Plan(p, device);
  EXPECT_EQ(causal.token_tiles, 88);
  EXPECT_EQ(causal.splits, 3);
  const uint8_t mask_byte = 1;
  p.tree_mask = &mask_byte;  // never read by the plan
  p.tree_width = 8;
  const LatentPlan tree = Plan(p, device);
  EXPECT_EQ(tree.kernel, LatentKernelKind::kWgmma);
  EXPECT_EQ(tree.token_tiles, 64);
  EXPECT_EQ(tree.splits, 2);
  // Wider trees than the tokens allow: the causal bound stands.
  p.tree_width = 64;
  EXPECT_EQ(Plan(p, device).token_tiles, 88);
  // Without a tile table (one sequence, explicit rows) the count is exact already.
  LatentPlan single;
  LatentLaunchParams one = Call(1, 8, 16, 4096);
  one.tree_mask = &mask_byte;
  one.tree_width = 8;
  ASSERT_TRUE(PlanLatentLaunch(one, /*tile_table=*/false, /*partials=*/true, kPlentyOfScratch, {}, device, &single));
  EXPECT_EQ(single.token_tiles, 2);
}

// The paired wgmma variant: the same calls as the wgmma kernel, whose splits hold whole pairs of
// chunks (128 keys), the split count chosen in pairs. One tree of 8 tokens at 4K: 2 tiles, 32 splits
// of one pair each where the single-chunk kernel takes 64 of one chunk (one wave either way, half
// the partials to merge). 32 trees of 8: 2 splits of 16 pairs, as with 32 chunks. Elsewhere the
// variant changes nothing.
TEST(LatentPlanTest, PairedWgmmaSplitsOnWholePairs) {
  const uint8_t mask_byte = 1;
  LatentPlanDevice device = H200(LatentTreeKernelChoice::kWgmma);
  LatentLaunchParams one = Call(1, 8, 16, 4096);
  one.tree_mask = &mask_byte;  // never read by the plan
  one.tree_width = 8;
  const LatentPlan single = Plan(one, device);
  EXPECT_EQ(single.kernel, LatentKernelKind::kWgmma);
  EXPECT_EQ(single.split_chunk, kWgmmaChunk);
  EXPECT_EQ(single.splits, 64);
  device.wgmma_variant = LatentWgmmaVariant::kPair;
  const LatentPlan pair = Plan(one, device);
  EXPECT_EQ(pair.kernel, LatentKernelKind::kWgmmaPair);
  EXPECT_EQ(pair.split_chunk, 2 * kWgmmaChunk);
  EXPECT_EQ(pair.splits, 32);
  EXPECT_EQ(pair.rows, single.rows);
  EXPECT_EQ(pair.shared_bytes, single.shared_bytes);

  LatentLaunchParams batch = Call(32, 8, 16, 4096);
  batch.tree_mask = &mask_byte;
  batch.tree_width = 8;
  const LatentPlan batched = Plan(batch, device);
  EXPECT_EQ(batched.kernel, LatentKernelKind::kWgmmaPair);
  EXPECT_EQ(batched.token_tiles, 64);
  EXPECT_EQ(batched.splits, 2);

  // Where the wgmma kernel does not take the call, the variant is not asked.
  LatentPlanDevice mma = H200(LatentTreeKernelChoice::kMma);
  mma.wgmma_variant = LatentWgmmaVariant::kPair;
  EXPECT_EQ(Plan(batch, mma).kernel, LatentKernelKind::kCompact);
}

// Long trees (>= 1024 rows a sequence, or >= 256 with 8+ sequences) run the 64-row mma.sync tree
// kernel by default, the wgmma kernel where chosen.
TEST(LatentPlanTest, LongTreesRunTheTreeKernel) {
  for (const LatentLaunchParams& p : {Call(1, 64, 16, 4096), Call(8, 16, 16, 4096), Call(32, 64, 16, 4096)}) {
    const LatentPlan plan = Plan(p, H200());
    EXPECT_EQ(plan.kernel, LatentKernelKind::kTree);
    EXPECT_EQ(plan.rows, LatentTreeRows());
    EXPECT_EQ(plan.tokens_per_tile, 4);
    EXPECT_EQ(plan.split_chunk, LatentTreeChunk());
    EXPECT_EQ(Plan(p, H200(LatentTreeKernelChoice::kWgmma)).kernel, LatentKernelKind::kWgmma);
  }
  EXPECT_EQ(Plan(Call(4, 16, 16, 4096), H200()).kernel, LatentKernelKind::kCompact);  // 256 rows, 4 sequences
}

// kAuto (the default): the wgmma kernel for sequences of 64+ rows in batches of 8+ and for sequences
// of 1024+ rows; the mma.sync rule for a short tree alone, decode, and one token of 128 heads alone.
TEST(LatentPlanTest, AutoTakesTheWgmmaKernelWhereItWasFaster) {
  const LatentPlanDevice device = H200(LatentTreeKernelChoice::kAuto);
  EXPECT_EQ(LatentPlanDevice{}.choice, LatentTreeKernelChoice::kAuto);
  for (const LatentLaunchParams& p : {Call(8, 4, 16, 4096), Call(32, 8, 16, 4096), Call(8, 64, 16, 4096),
                                      Call(32, 1, 128, 4096), Call(1, 64, 16, 4096)}) {
    EXPECT_EQ(Plan(p, device).kernel, LatentKernelKind::kWgmma) << p.batch << " x " << p.tokens / p.batch;
  }
  EXPECT_EQ(Plan(Call(1, 8, 16, 4096), device).kernel, LatentKernelKind::kCompact);
  EXPECT_EQ(Plan(Call(4, 16, 16, 4096), device).kernel, LatentKernelKind::kCompact);
  EXPECT_EQ(Plan(Call(32, 1, 16, 4096), device).kernel, LatentKernelKind::kCompact);
  EXPECT_EQ(Plan(Call(1, 1, 128, 4096), device).kernel, LatentKernelKind::kCompact);
  EXPECT_EQ(Plan(Call(8, 3, 16, 4096), device).kernel, LatentKernelKind::kCompact);  // 48 rows a sequence
  EXPECT_EQ(Plan(Call(32, 8, 16, 4096), H200(LatentTreeKernelChoice::kAuto, false)).kernel,
            LatentKernelKind::kCompact);
}

// Decode at 16 heads under kWgmmaAll: one token's heads in a block's 64 rows (the tile table gives
// each sequence its own tiles), 64-key splits.
TEST(LatentPlanTest, WgmmaAllTakesDecode) {
  const LatentPlan plan = Plan(Call(32, 1, 16, 4096), H200(LatentTreeKernelChoice::kWgmmaAll));
  EXPECT_EQ(plan.kernel, LatentKernelKind::kWgmma);
  EXPECT_EQ(plan.heads_per_tile, 16);
  EXPECT_EQ(plan.tokens_per_tile, 4);
  EXPECT_EQ(plan.token_tiles, 32);
  EXPECT_EQ(plan.split_chunk, kWgmmaChunk);
}

// 128 heads of one token: 8 head tiles of 16 on the compact kernel, 2 of 64 on the wgmma kernel.
TEST(LatentPlanTest, ManyHeadsTileByHeads) {
  const LatentLaunchParams p = Call(32, 1, 128, 4096);
  const LatentPlan compact = Plan(p, H200());
  EXPECT_EQ(compact.kernel, LatentKernelKind::kCompact);
  EXPECT_EQ(compact.head_tiles, 8);
  const LatentPlan wgmma = Plan(p, H200(LatentTreeKernelChoice::kWgmma));
  EXPECT_EQ(wgmma.kernel, LatentKernelKind::kWgmma);
  EXPECT_EQ(wgmma.heads_per_tile, 64);
  EXPECT_EQ(wgmma.tokens_per_tile, 1);
  EXPECT_EQ(wgmma.head_tiles, 2);
}

// Other shapes: the general bf16 kernel (16 rows; 64 from 2048 rows in the call and 64 a sequence),
// also for an unaligned cache or keys past 2^30; the f32 kernel (8 rows at decode with <= 8 heads).
TEST(LatentPlanTest, OtherShapesRunTheGeneralKernels) {
  LatentLaunchParams p = Call(8, 1, 16, 1000);
  p.key_dim = 72;
  p.value_dim = 64;
  EXPECT_EQ(Plan(p, H200(LatentTreeKernelChoice::kWgmmaAll)).kernel, LatentKernelKind::kMma);
  EXPECT_EQ(Plan(p, H200()).rows, 16);
  p.tokens = 8 * 256;  // 4096 rows, 512 a sequence
  EXPECT_EQ(Plan(p, H200()).rows, 64);
  LatentLaunchParams unaligned = Call(8, 16, 16, 4096);
  unaligned.cache_bf16 = kAlignedCache + 1;
  EXPECT_EQ(Plan(unaligned, H200(LatentTreeKernelChoice::kWgmma)).kernel, LatentKernelKind::kMma);
  LatentLaunchParams f32 = Call(8, 1, 8, 1000);
  f32.cache_bf16 = nullptr;
  f32.cache = reinterpret_cast<const float*>(kAlignedCache);
  const LatentPlan decode = Plan(f32, H200(LatentTreeKernelChoice::kWgmmaAll));
  EXPECT_EQ(decode.kernel, LatentKernelKind::kF32);
  EXPECT_EQ(decode.rows, 8);
  f32.heads = 16;
  EXPECT_EQ(Plan(f32, H200()).rows, 16);
}

// Splits: none without scratch, at most what the scratch holds, at most one per chunk of keys, and
// every split holds keys (the keys spread over whole chunks).
TEST(LatentPlanTest, SplitsRespectTheScratchAndTheKeys) {
  const LatentLaunchParams p = Call(1, 1, 16, 4096);
  LatentPlan plan;
  ASSERT_TRUE(PlanLatentLaunch(p, true, /*partials=*/false, 0, {}, H200(), &plan));
  EXPECT_EQ(plan.splits, 1);
  const int64_t per_split = p.tokens * p.heads * (p.value_dim + 2);
  ASSERT_TRUE(PlanLatentLaunch(p, true, true, 3 * per_split + 1, {}, H200(), &plan));
  EXPECT_EQ(plan.splits, 3);
  EXPECT_EQ(Plan(Call(1, 1, 16, 1), H200()).splits, 1);
  for (const int64_t kv : {int64_t{1}, int64_t{63}, int64_t{65}, int64_t{4097}, int64_t{65536}}) {
    for (const LatentTreeKernelChoice choice : {LatentTreeKernelChoice::kMma, LatentTreeKernelChoice::kWgmmaAll}) {
      const LatentPlan q = Plan(Call(2, 1, 16, kv), H200(choice));
      const int64_t chunks = (kv + q.split_chunk - 1) / q.split_chunk;
      EXPECT_GE(q.splits, 1);
      EXPECT_LE(q.splits, chunks) << "kv " << kv;
      const int64_t split_keys = (chunks + q.splits - 1) / q.splits * q.split_chunk;
      EXPECT_GT(kv, (q.splits - 1) * split_keys) << "kv " << kv << ": the last split holds keys";
    }
  }
}

// EAGLE3_LATENT_MAX_SPLITS: a whole number in range is the cap; anything else is no cap (0).
TEST(LatentPlanTest, SplitCapFromEnvTakesWholeNumbersInRangeOnly) {
  EXPECT_EQ(LatentMaxSplitsFromEnv("8"), 8);
  EXPECT_EQ(LatentMaxSplitsFromEnv("1"), 1);
  EXPECT_EQ(LatentMaxSplitsFromEnv(nullptr), 0);
  EXPECT_EQ(LatentMaxSplitsFromEnv(""), 0);
  EXPECT_EQ(LatentMaxSplitsFromEnv("0"), 0);
  EXPECT_EQ(LatentMaxSplitsFromEnv("-4"), 0);
  EXPECT_EQ(LatentMaxSplitsFromEnv("8x"), 0);
  EXPECT_EQ(LatentMaxSplitsFromEnv("eight"), 0);
  EXPECT_EQ(LatentMaxSplitsFromEnv("4097"), 0);
}

// GetLatentMaxSplits' cap (LatentPlanDevice::max_splits) bounds the count and never raises it.
TEST(LatentPlanTest, SplitCapBoundsTheSplits) {
  const LatentLaunchParams p = Call(1, 1, 16, 4096);
  const int64_t uncapped = Plan(p, H200()).splits;
  ASSERT_GT(uncapped, 8);
  for (const int64_t cap : {int64_t{1}, int64_t{2}, int64_t{8}}) {
    LatentPlanDevice device = H200();
    device.max_splits = cap;
    const LatentPlan plan = Plan(p, device);
    EXPECT_LE(plan.splits, cap);
    EXPECT_GE(plan.splits, 1);
    // Every key still lies in a split.
    const int64_t chunks = (p.max_kv_len + plan.split_chunk - 1) / plan.split_chunk;
    EXPECT_GE(plan.splits * ((chunks + plan.splits - 1) / plan.splits), chunks) << "cap " << cap;
  }
  LatentPlanDevice loose = H200();
  loose.max_splits = uncapped + 100;
  EXPECT_EQ(Plan(p, loose).splits, uncapped);
}

// The splits merge in the attention kernel when the fold's counters cover the tiles and a tile's
// partials stay within its bytes; not with one split, and not past either bound.
TEST(LatentPlanTest, FoldWithinItsBounds) {
  int counter_storage = 0;
  LatentFold fold;
  fold.counters = &counter_storage;
  fold.capacity = 1 << 20;
  fold.max_fold_bytes = std::numeric_limits<int64_t>::max();
  for (const LatentTreeKernelChoice choice : {LatentTreeKernelChoice::kMma, LatentTreeKernelChoice::kWgmma}) {
    const LatentPlan split = Plan(Call(1, 8, 16, 4096), H200(choice), fold);
    ASSERT_GT(split.splits, 1);
    EXPECT_TRUE(split.fold_combine);
    LatentFold few = fold;
    few.capacity = split.token_tiles * split.head_tiles - 1;
    EXPECT_FALSE(Plan(Call(1, 8, 16, 4096), H200(choice), few).fold_combine);
    LatentFold small = fold;
    small.max_fold_bytes = split.splits * split.rows * 512 * 4 - 1;
    EXPECT_FALSE(Plan(Call(1, 8, 16, 4096), H200(choice), small).fold_combine);
    EXPECT_FALSE(Plan(Call(1, 8, 16, 64), H200(choice), fold).fold_combine);  // one chunk: one split
  }
}

// What cannot run: a kernel's shared memory past the device's, more than 65535 head tiles.
TEST(LatentPlanTest, RefusesWhatCannotRun) {
  LatentPlanDevice small = H200(LatentTreeKernelChoice::kWgmma);
  small.max_shared = 100 * 1024;
  LatentPlan plan;
  EXPECT_FALSE(PlanLatentLaunch(Call(32, 8, 16, 4096), true, true, kPlentyOfScratch, {}, small, &plan));
  // One token of 64 x n heads: the tree kernel's 64-head tiles (>= 1024 rows a sequence).
  EXPECT_FALSE(PlanLatentLaunch(Call(1, 1, int64_t{64} * 65536, 64), true, true, kPlentyOfScratch, {}, H200(),
                                &plan));
  ASSERT_TRUE(PlanLatentLaunch(Call(1, 1, int64_t{64} * 65535, 64), true, true, kPlentyOfScratch, {}, H200(), &plan));
  EXPECT_EQ(plan.head_tiles, 65535);
}

}  // namespace
}  // namespace eagle3::cuda
