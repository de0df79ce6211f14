// How a paged latent attention call is launched (cuda/attention_ops.h, "Paged latent attention,
// fast path"): which kernel, how many query rows a block holds and how they split into tokens x
// heads, how many blocks split each sequence's keys, and whether the splits merge inside the
// attention kernel. Host code only, plain C++ (no kernel code): the launchers in
// latent_decode_kernels.cu follow it, and tests/latent_plan_test.cc checks its rules without a GPU.
// Each kernel's own facts (chunk, shared memory, where it applies) are declared here and defined
// beside the kernel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention_ops.h"
#include "eagle3/detail/host_device.h"

namespace eagle3::cuda {

inline constexpr int kLatentChunk = 32;         // keys per staged chunk (the f32 and general bf16 kernels)
inline constexpr int kLatentTileColumns = 512;  // value columns per block: 64 column groups x 2 float4
// Splits of one call at most (the bound LaunchAttention uses too; the combine's shared weights).
inline constexpr int kLatentMaxSplits = 4096;

// The latent shape LatentCompactKernel is built for: key rows of 576 (the 512-wide compressed KV and
// 64 RoPE dims), values the first 512.
inline constexpr int64_t kLatentCompactKeyDim = 576;
inline constexpr int64_t kLatentCompactValueDim = 512;

// Whether a call has the shape the compact, tree and wgmma kernels are compiled for: a bf16 cache,
// 16-byte aligned, at DeepSeek's 576 / 512 latent shape, with key positions that fit 32 bits.
inline bool LatentAtCompactShape(const LatentLaunchParams& p) {
  return p.cache_bf16 != nullptr && p.key_dim == kLatentCompactKeyDim && p.value_dim == kLatentCompactValueDim &&
         reinterpret_cast<uintptr_t>(p.cache_bf16) % 16 == 0 && p.max_kv_len <= 0x3fffffff;
}

// Dynamic shared memory the folded combine of a block of `rows` query rows takes: a flag, 1 / the
// denominator of each row, the weights of each row's splits.
EAGLE3_HOST_DEVICE constexpr size_t LatentFoldSharedBytes(int64_t rows, int64_t splits) {
  return sizeof(float) * static_cast<size_t>(1 + rows + rows * splits);
}

// ---- Each kernel's facts, defined beside it ----------------------------------------------------

// The general bf16 kernel (latent_mma_kernels.cu): elements per staged key row (key_dim rounded up
// to 64, + 8), its dynamic shared memory for blocks of 16 x groups rows (groups 1 or 4), and
// whether it merges its splits itself.
int MmaRowStride(int64_t key_dim);
size_t MmaSharedBytes(int64_t key_dim, int groups);
bool LatentMmaFolds(int groups);

// The compact kernel (latent_compact_kernels.cu): whether it takes `rows`-row blocks of a call (the
// compact shape, 16 rows), its chunk and its shared memory.
bool LatentCompactApplies(const LatentLaunchParams& p, int rows);
int LatentCompactChunk();
size_t LatentCompactSharedBytes();

// The tree kernel (latent_tree_kernels.cu): whether it takes `rows`-row blocks (the compact shape,
// 64 rows), its rows, chunk and shared memory.
bool LatentTreeApplies(const LatentLaunchParams& p, int rows);
int LatentTreeRows();
int LatentTreeChunk();
size_t LatentTreeSharedBytes();

// ---- The plan ----------------------------------------------------------------------------------

enum class LatentKernelKind {
  kF32,      // f32 cache (latent_decode_kernels.cu)
  kMma,      // bf16, any shape (latent_mma_kernels.cu)
  kCompact,  // bf16 at the compact shape, 16 rows (latent_compact_kernels.cu)
  kTree,     // bf16 at the compact shape, 64 rows on mma.sync (latent_tree_kernels.cu)
  kWgmma,    // bf16 at the compact shape, 64 rows on wgmma (latent_wgmma_kernels.cu)
  kWgmmaPair,  // the same, the warpgroups owning alternate chunks (latent_wgmma_pair_kernels.cu)
};

// What the plan needs to know of the device and of the kernel choice.
struct LatentPlanDevice {
  int sms = 0;
  size_t max_shared = 0;                                    // opt-in dynamic shared memory per block
  LatentTreeKernelChoice choice = LatentTreeKernelChoice::kAuto;
  bool wgmma_available = false;                             // LatentWgmmaAvailable() on this device
  LatentWgmmaVariant wgmma_variant = LatentWgmmaVariant::kSingle;  // which kernel a wgmma plan runs
  int64_t max_splits = 0;                                   // GetLatentMaxSplits(): 0 = no cap
};

// The split cap an EAGLE3_LATENT_MAX_SPLITS value asks for: a whole number in [1, kLatentMaxSplits];
// unset, empty, not a whole number or out of that range: 0 (no cap).
int64_t LatentMaxSplitsFromEnv(const char* value);

// A call's query rows per sequence, on average (heads x its tokens, rounded up).
int64_t LatentRowsPerSequence(const LatentLaunchParams& p);

// Whether the wgmma kernel takes the call: chosen for it (kWgmmaAll; kWgmma for sequences of 64+
// query rows; kAuto for those in batches of 8+ and for sequences of 1024+ rows), at the compact
// shape, where the device runs it.
bool LatentWgmmaTakes(const LatentLaunchParams& p, const LatentPlanDevice& device);

// Query rows per block. The bf16 (tensor-core) kernels at DeepSeek's 576 / 512 shape: 64 (the wgmma
// kernel) when it takes the call; else 64 (the tree kernel) when a sequence holds at least 1024
// query rows on average (heads x its tokens), or 256 with 8+ sequences, else 16 (the compact
// kernel). At other shapes: 64 when a sequence averages >= 64 query rows, the call holds at least
// 2048 and 64-row blocks fit in shared memory; else 16. The f32 kernel: 8 when there are few heads
// and at most one query token per sequence (decode at 8 heads per rank), else 16. The tile table
// and the kernels agree with it.
int LatentBlockRows(const LatentLaunchParams& p, const LatentPlanDevice& device);

struct LatentPlan {
  LatentKernelKind kernel = LatentKernelKind::kF32;
  int rows = 0;             // query rows per block: tokens_per_tile x heads_per_tile (or fewer)
  int heads_per_tile = 0;   // H: a block's rows are G tokens x H heads
  int tokens_per_tile = 0;  // G
  int64_t head_tiles = 0;
  int64_t value_tiles = 0;  // value_dim / kLatentTileColumns, rounded up
  int64_t token_tiles = 0;  // grid.x: exact without a tile table, else a bound (see LaunchLatentKernels)
  int64_t splits = 1;       // grid.y
  int split_chunk = 0;      // split lengths are multiples of it (kWgmmaPair: a pair of chunks)
  size_t shared_bytes = 0;
  bool fold_combine = false;  // the attention kernel merges the splits (else the combine kernel)
};

// The plan of a call (tokens x heads > 0, value_dim > 0). tile_table: whether token tiles come from
// a tile table (the batched form) rather than `tokens` alone. partials: whether there is split
// scratch, partial_capacity its floats. False where nothing can run it: the kernel's shared memory
// past the device's, more than 65535 head x value tiles or splits, token tiles past 2^31.
bool PlanLatentLaunch(const LatentLaunchParams& p, bool tile_table, bool partials, int64_t partial_capacity,
                      const LatentFold& fold, const LatentPlanDevice& device, LatentPlan* plan);

}  // namespace eagle3::cuda
