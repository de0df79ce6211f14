// The launch plan of a paged latent attention call (latent_plan.h).
#include "latent_plan.h"

#include <algorithm>
#include <cstdlib>
#include <cstdint>

#include "latent_wgmma_layout.h"

namespace eagle3::cuda {
namespace {

// The largest dynamic shared memory a block may opt into on sm_90 (227 KiB): the general bf16
// kernel's 64-row blocks run only where they fit it (key_dim <= 640; DeepSeek's 576 takes 197 KiB).
constexpr size_t kMmaWideSharedLimit = 227 * 1024;

// Query rows (tokens x heads) from which the general bf16 kernel runs 64-row blocks. Below it
// 16-row blocks win (they fill more SMs, with shorter chunk chains), from it 64-row blocks do (each
// key is read and waited for by four times fewer blocks).
constexpr int64_t kMmaWideMinRows = 2048;

// kAuto's rule for the wgmma kernel: sequences of 64+ query rows in batches of at least
// kLatentWgmmaMinBatch, or of at least kLatentWgmmaAnyBatchRows rows in any batch.
constexpr int64_t kLatentWgmmaMinBatch = 8;
constexpr int64_t kLatentWgmmaAnyBatchRows = 1024;

}  // namespace

int64_t LatentRowsPerSequence(const LatentLaunchParams& p) {
  const int64_t sequences = std::max<int64_t>(p.batch, 1);
  return p.heads * ((p.tokens + sequences - 1) / sequences);
}

bool LatentWgmmaTakes(const LatentLaunchParams& p, const LatentPlanDevice& device) {
  const int64_t rows = LatentRowsPerSequence(p);
  bool chosen = false;
  switch (device.choice) {
    case LatentTreeKernelChoice::kMma:
      break;
    case LatentTreeKernelChoice::kWgmma:
      chosen = rows >= kWgmmaRows;
      break;
    case LatentTreeKernelChoice::kAuto:
      // Where it runs faster than the mma.sync kernels (benchmarks/NOTES.md, seventeenth session):
      // 8+ sequences from 4 tokens at 16 heads, and long sequences at any batch; a single short tree,
      // or one token of 128 heads, runs slower on it.
      chosen = rows >= kWgmmaRows && (p.batch >= kLatentWgmmaMinBatch || rows >= kLatentWgmmaAnyBatchRows);
      break;
    case LatentTreeKernelChoice::kWgmmaAll:
      chosen = true;
      break;
  }
  return chosen && device.wgmma_available && LatentAtCompactShape(p);
}

int LatentBlockRows(const LatentLaunchParams& p, const LatentPlanDevice& device) {
  const int64_t sequences = std::max<int64_t>(p.batch, 1);
  if (p.cache_bf16 != nullptr) {
    if (LatentWgmmaTakes(p, device)) return kWgmmaRows;
    const int64_t rows_per_sequence = LatentRowsPerSequence(p);
    // The tree kernel's 64-row blocks read each key once per 64 rows of a sequence, the compact
    // kernel's once per 16, but each of its chunks costs several of the compact kernel's (four row
    // tiles of products and softmax per staged key): it pays where a sequence's keys would be read
    // 16+ times by 16-row blocks (>= 256 rows) and the batch gives each of its blocks a share of
    // the GPU, or where the re-reads alone dominate (>= 1024 rows).
    const int tree_rows = LatentTreeRows();
    const bool tree_pays = rows_per_sequence >= 1024 || (rows_per_sequence >= 256 && sequences >= 8);
    if (tree_pays && LatentTreeApplies(p, tree_rows)) {
      return tree_rows;
    }
    if (LatentCompactApplies(p, 16)) return 16;
    const bool wide = rows_per_sequence >= 64 && p.tokens * p.heads >= kMmaWideMinRows &&
                      MmaSharedBytes(p.key_dim, 4) <= kMmaWideSharedLimit;
    return wide ? 64 : 16;
  }
  const bool one_token_per_sequence = p.tokens <= sequences;
  return p.heads <= 8 && one_token_per_sequence ? 8 : 16;
}

int64_t LatentMaxSplitsFromEnv(const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long long n = std::strtoll(value, &end, 10);
  return *end == '\0' && n > 0 && n <= kLatentMaxSplits ? n : 0;
}

bool PlanLatentLaunch(const LatentLaunchParams& p, bool tile_table, bool partials, int64_t partial_capacity,
                      const LatentFold& fold, const LatentPlanDevice& device, LatentPlan* plan) {
  LatentPlan& a = *plan;
  a = LatentPlan{};
  const bool bf16 = p.cache_bf16 != nullptr;
  a.rows = LatentBlockRows(p, device);
  const bool wgmma = a.rows == kWgmmaRows && LatentWgmmaTakes(p, device);
  const bool pair = wgmma && device.wgmma_variant == LatentWgmmaVariant::kPair;
  const bool tree = !wgmma && LatentTreeApplies(p, a.rows);
  const bool compact = LatentCompactApplies(p, a.rows);
  a.kernel = pair      ? LatentKernelKind::kWgmmaPair
             : wgmma   ? LatentKernelKind::kWgmma
             : tree    ? LatentKernelKind::kTree
             : compact ? LatentKernelKind::kCompact
             : bf16    ? LatentKernelKind::kMma
                       : LatentKernelKind::kF32;
  a.shared_bytes = wgmma     ? kWgmmaLaunchSharedBytes
                   : tree    ? LatentTreeSharedBytes()
                   : compact ? LatentCompactSharedBytes()
                   : bf16    ? MmaSharedBytes(p.key_dim, a.rows / 16)
                             : LatentSharedBytes(p.key_dim);
  if (a.shared_bytes > device.max_shared) return false;
  // The paired kernel's warpgroups take a split's chunks two at a time (one each, scores and
  // softmax overlapping the other's products): its splits hold whole pairs, so none ends on a
  // chunk whose partner warpgroup has no chunk of its own, and the split cost below counts pairs.
  a.split_chunk = pair    ? 2 * kWgmmaChunk
                  : wgmma ? kWgmmaChunk
                  : tree  ? LatentTreeChunk()
                  : compact ? LatentCompactChunk()
                            : kLatentChunk;
  a.heads_per_tile = static_cast<int>(std::min<int64_t>(p.heads, a.rows));
  a.tokens_per_tile = a.rows / a.heads_per_tile;
  a.head_tiles = (p.heads + a.heads_per_tile - 1) / a.heads_per_tile;
  a.value_tiles = (p.value_dim + kLatentTileColumns - 1) / kLatentTileColumns;
  if (a.head_tiles * a.value_tiles > 65535) return false;
  // Token tiles: sum over sequences of ceil(n_b / G) <= min(T, (T + B (G - 1)) / G).
  const int64_t g = a.tokens_per_tile;
  a.token_tiles = !tile_table ? (p.tokens + g - 1) / g : std::min(p.tokens, (p.tokens + p.batch * (g - 1)) / g);
  // With a tree mask a sequence holds at most tree_width tokens (the check refuses more), so at most
  // ceil(tree_width / G) tiles: at uniform trees the exact count, which the splits below are chosen
  // for (a bound above it can buy a second wave of blocks that never runs).
  if (tile_table && p.tree_mask != nullptr && p.tree_width > 0) {
    a.token_tiles = std::min(a.token_tiles, p.batch * ((p.tree_width + g - 1) / g));
  }
  if (a.token_tiles > 0x7fffffff) return false;

  // Splits: one resident block per SM; pick the split count with the fewest modeled chunk-times
  // (waves x (chunks per split + 2 for the prologue)), within the scratch and kLatentMaxSplits.
  const int64_t blocks = a.token_tiles * a.head_tiles * a.value_tiles;
  const int64_t per_split_floats = p.tokens * p.heads * (p.value_dim + 2);
  const int64_t chunk = a.split_chunk;
  int64_t max_splits = !partials ? 1 : partial_capacity / per_split_floats;
  max_splits = std::clamp<int64_t>(max_splits, 1, kLatentMaxSplits);
  max_splits = std::min(max_splits, (p.max_kv_len + chunk - 1) / chunk);
  if (device.max_splits > 0) max_splits = std::min(max_splits, device.max_splits);
  int64_t best_cost = -1;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t kps = ((p.max_kv_len + s - 1) / s + chunk - 1) / chunk * chunk;
    const int64_t eff = (p.max_kv_len + kps - 1) / kps;
    const int64_t waves = (blocks * eff + device.sms - 1) / device.sms;
    const int64_t cost = waves * (kps / chunk + 2) + (eff > 1 ? 1 : 0);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      a.splits = eff;
    }
  }
  if (a.splits > 65535) return false;
  // The fold's counters are per token tile x head tile; its last block reads the tile's partials
  // alone, and keeps each row's split weights in the block's shared memory.
  const int64_t tile_partial_bytes = a.splits * a.rows * p.value_dim * static_cast<int64_t>(sizeof(float));
  const bool kernel_folds = wgmma || tree || compact || !bf16 || LatentMmaFolds(a.rows / 16);
  a.fold_combine = kernel_folds && a.splits > 1 && fold.counters != nullptr && a.value_tiles == 1 &&
                   a.token_tiles * a.head_tiles <= fold.capacity && tile_partial_bytes <= fold.max_fold_bytes &&
                   LatentFoldSharedBytes(a.rows, a.splits) <= a.shared_bytes;
  return true;
}

}  // namespace eagle3::cuda
