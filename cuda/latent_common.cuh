// What the paged latent attention kernels share (cuda/attention_ops.h, "Paged latent attention,
// fast path"; the launch plan in latent_plan.h): the f32 kernel and the launchers in
// latent_decode_kernels.cu, the bf16 tensor-core kernels in latent_mma_kernels.cu,
// latent_compact_kernels.cu, latent_tree_kernels.cu and latent_wgmma_kernels.cu. Their arguments,
// how a block finds its sequence and keys, the staging of its queries and mask bytes, the merge of
// split results (the combine kernel's and the one folded into the attention kernels), and the
// kernels' entry points for the launcher. Internal to those files. No abseil here: nvcc must never
// see it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "attention_ops.h"
#include "core_kernels.cuh"
#include "latent_plan.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {

// Mask bytes for keys that have no byte of their own: past the tile or the split (0), in the cached
// prefix (1), causal (0 or 1). Static: the build has no relocatable device code, so each .cu file
// that includes this header is a device program of its own and needs its own copy (an external
// __device__ variable would also define its host shadow twice).
static __device__ const uint8_t kMaskConstants[2] = {0, 1};

struct LatentArgs {
  LatentLaunchParams p;
  const int32_t* tile_table;  // [batch + 1]: first token tile of each sequence; nullptr: one sequence
  // 32-bit: the kernels divide block rows by H per staged element, and a 64-bit division is a
  // long subroutine.
  int heads_per_tile;         // H: query rows of a block are G tokens x H heads
  int tokens_per_tile;        // G
  int64_t value_tiles;
  int64_t splits;
  int split_chunk;            // split lengths are multiples of this (the kernel's chunk of keys)
  bool splits_marked;         // empty splits are marked (MarkEmptySplit): the compact kernel
  int wp;                     // f32: floats per staged row, key_dim rounded up to 32 (zero
                              // padded); bf16: elements per staged row, key_dim rounded up to 64,
                              // + 8 (MmaRowStride)
  bool vec;                   // 16-byte cp.async
  float* partials;
  const int* bad;
  // The compact and tree kernels stage the tile, the query rows and the first page entries before
  // their PdlWait when the kernel just before them is the batched op's check (PdlEnter: everything
  // before it has completed); after any other kernel they wait first.
  bool wait_first;
  // The attention kernel merges the splits itself (LatentFoldCombine; set only with splits > 1 and
  // one value tile), with one arrival counter per output tile: counters[blockIdx.x * gridDim.z +
  // blockIdx.z]. Else LatentCombineKernel does.
  bool fold_combine;
  int* counters;
};

// The sequence of a block's token tile.
struct LatentTile {
  int64_t q0 = 0;       // the sequence's first query row
  int64_t n = 0;        // its query rows
  int64_t kv = 0;       // its keys
  int64_t i0 = 0;       // the tile's first row within the sequence
  const int32_t* pages = nullptr;
};

// Largest b in [0, count) with values[b] <= x, given values[0] <= x.
__device__ inline int64_t LastNotAbove(const int32_t* values, int64_t count, int64_t x) {
  int64_t lo = 0, hi = count;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (values[mid] <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Keys per split for a sequence of kv keys: its keys spread evenly over the a.splits splits, in
// whole chunks of a.split_chunk keys. The host sizes a.splits for max_kv_len (the cache capacity a captured graph must
// cover), so the split length follows each sequence's real length on the device: a 1K-key sequence
// in a 4K-capacity cache uses every split, not the first quarter of them (with the host's split
// length it would run all its keys in one block per row tile, and a decode step would slow down
// with the cache capacity rather than with the context). Never above the host's split length for
// max_kv_len, so a.splits splits cover every sequence.
__device__ inline int64_t LatentSplitKeys(const LatentArgs& a, int64_t kv) {
  const int64_t per = (kv + a.splits - 1) / a.splits;
  return std::max<int64_t>(a.split_chunk, (per + a.split_chunk - 1) / a.split_chunk * a.split_chunk);
}

__device__ inline bool FindLatentTile(const LatentArgs& a, int64_t x, LatentTile* tile) {
  const LatentLaunchParams& p = a.p;
  if (a.tile_table == nullptr) {
    tile->n = p.tokens;
    tile->kv = p.max_kv_len;
    tile->i0 = x * a.tokens_per_tile;
    tile->pages = p.page_tables;
    return tile->i0 < tile->n;
  }
  if (x >= a.tile_table[p.batch]) return false;
  const int64_t b = LastNotAbove(a.tile_table, p.batch, x);
  tile->q0 = p.q_start[b];
  tile->n = p.q_start[b + 1] - tile->q0;
  tile->kv = p.kv_len[b];
  tile->i0 = (x - a.tile_table[b]) * a.tokens_per_tile;
  tile->pages = p.page_tables + b * p.page_table_stride;
  return true;
}

// The keys of a block: its split (blockIdx.y) of its tile's sequence, [begin, end); empty for a
// split past the sequence's keys.
struct LatentKeyRange {
  int64_t begin;
  int64_t end;
};

__device__ inline LatentKeyRange LatentBlockKeys(const LatentArgs& a, const LatentTile& tile) {
  const int64_t split_keys = LatentSplitKeys(a, tile.kv);
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * split_keys;
  return {begin, std::min(tile.kv, begin + split_keys)};
}

// The cache row of key s of a sequence, `page` its page entry.
__device__ inline int64_t LatentCacheRow(int32_t page, int64_t s, int64_t page_size) {
  return static_cast<int64_t>(page) * page_size + (s - NonNegativeDiv(s, page_size) * page_size);
}

// The byte that says whether token lt of the tile allows key s (a pointer, so the load can be
// issued a chunk ahead and read a chunk later): the explicit mask's byte; else the sequence's
// cached prefix (its first `prefix` keys) is allowed and its own keys follow the tree mask, or the
// causal rule without one; nothing past the tile's tile_tokens tokens or the block's keys (s_end).
// A functor of references to the kernel's locals, as the [&] lambda each kernel had before: nvcc
// generates the same code for it (a function taking the values instead does not).
struct LatentAllowByte {
  const int64_t& tile_tokens;
  const int64_t& s_end;
  const LatentTile& tile;
  const LatentLaunchParams& p;
  const int64_t& prefix;

  __device__ const uint8_t* operator()(int64_t lt, int64_t s) const {
    if (lt >= tile_tokens || s >= s_end) return &kMaskConstants[0];
    const int64_t i = tile.i0 + lt;
    if (p.mask != nullptr) return p.mask + (tile.q0 + i) * p.mask_stride + s;
    if (s < prefix) return &kMaskConstants[1];
    const int64_t j = s - prefix;
    if (p.tree_mask != nullptr) return p.tree_mask + (tile.q0 + i) * p.tree_mask_stride + j;
    return &kMaskConstants[j <= i ? 1 : 0];
  }
};

// Whether block row r (token i0 + r / H of the tile, head n0 + r % H, H = heads_per_tile) is a query
// row the tile holds.
__device__ inline bool LatentRowHeld(const LatentArgs& a, int64_t n0, int64_t tile_tokens, int r) {
  const int heads = a.heads_per_tile;
  return r < heads * a.tokens_per_tile && r / heads < tile_tokens && n0 + r % heads < a.p.heads;
}

// Where split `split` of query row (token t, head n) keeps its results when a call runs several
// splits: value_dim unnormalized values, and (max, sum) of its softmax; a row's splits are
// consecutive in both arrays. The one statement of the partials' layout: the attention kernels
// write it, LatentCombineKernel reads it.
struct LatentPartialRow {
  float* values;   // [value_dim]
  float* max_sum;  // [2]
};

__device__ inline LatentPartialRow LatentPartials(const LatentArgs& a, int64_t t, int64_t n, int64_t split) {
  const LatentLaunchParams& p = a.p;
  const int64_t entry = (t * p.heads + n) * a.splits + split;
  return {a.partials + entry * p.value_dim, a.partials + p.tokens * p.heads * a.splits * p.value_dim + 2 * entry};
}

// Where a block writes query row (token t, head n) of its results, and the factor its values take:
// with one split, the output, times 1 / sum (every key of the sequence is in the block and the row
// allows one, checked: sum > 0); else the block's split of the row's partials, unscaled, and the
// row's (max, sum) there, which the one thread of the row with `writes_stats` stores.
struct LatentRowOut {
  float* values;  // [value_dim]
  float factor;
};

__device__ inline LatentRowOut LatentRowDestination(const LatentArgs& a, int64_t t, int64_t n, float max, float sum,
                                                    bool writes_stats) {
  const LatentLaunchParams& p = a.p;
  if (a.splits == 1) return {p.out + t * p.out_token_stride + n * p.out_head_stride, 1.0f / sum};
  const LatentPartialRow part = LatentPartials(a, t, n, blockIdx.y);
  if (writes_stats) {
    part.max_sum[0] = max;
    part.max_sum[1] = sum;
  }
  return {part.values, 1.0f};
}

// Splits that hold keys of a sequence of kv keys (LatentBlockKeys): the first
// ceil(kv / split_keys), at most a.splits.
__device__ inline int LatentUsedSplits(const LatentArgs& a, int64_t kv) {
  const int64_t split_keys = LatentSplitKeys(a, kv);
  return static_cast<int>(std::min(a.splits, (kv + split_keys - 1) / split_keys));
}

// A block whose split holds no key of its tile's sequence marks its rows' entries of the split
// partials as empty (max -inf, sum 0), so the combine reads every split of a row without looking
// up the sequence's length (a.splits_marked). `n0`: the block's first head; `tile_tokens`: the
// tile's tokens.
__device__ inline void MarkEmptySplit(const LatentArgs& a, const LatentTile& tile, int64_t n0,
                                      int64_t tile_tokens) {
  if (a.splits == 1 || blockIdx.z % a.value_tiles != 0) return;
  const int rows = a.heads_per_tile * a.tokens_per_tile;
  for (int r = static_cast<int>(threadIdx.x); r < rows; r += static_cast<int>(blockDim.x)) {
    if (!LatentRowHeld(a, n0, tile_tokens, r)) continue;
    const int64_t t = tile.q0 + tile.i0 + r / a.heads_per_tile;
    float* max_sum = LatentPartials(a, t, n0 + r % a.heads_per_tile, blockIdx.y).max_sum;
    max_sum[0] = -__int_as_float(0x7f800000);
    max_sum[1] = 0.0f;
  }
}

// Where a block of the compact or the tree kernel starts: its tile (kv within what the page table
// holds: a no-op once the check has passed), its split's keys, its first head, the tile's tokens.
struct LatentBlockStart {
  LatentTile tile;
  LatentKeyRange keys;
  int n0 = 0;
  int tile_tokens = 0;
};

// The prologue the compact and tree kernels share, run before their PdlWait (every index bounded
// even if the metadata is bad). False when the block has nothing to compute — no tile, or a split
// with no key (marked empty once the check has passed) — after the block has waited for the check:
// the caller just returns.
__device__ inline bool StartLatentBlock(const LatentArgs& a, LatentBlockStart* s) {
  const LatentLaunchParams& p = a.p;
  if (!FindLatentTile(a, blockIdx.x, &s->tile)) {
    PdlWait();
    return false;
  }
  s->tile.kv = min(s->tile.kv, min(p.max_kv_len, p.pages_per_seq * p.page_size));
  s->keys = LatentBlockKeys(a, s->tile);
  s->n0 = static_cast<int>(blockIdx.z) * a.heads_per_tile;
  s->tile_tokens = static_cast<int>(
      max(static_cast<int64_t>(0), min(static_cast<int64_t>(a.tokens_per_tile), s->tile.n - s->tile.i0)));
  if (s->keys.begin >= s->keys.end) {
    PdlWait();
    if (*a.bad == 0) MarkEmptySplit(a, s->tile, s->n0, s->tile_tokens);
    return false;
  }
  return true;
}

// Stages a block's kRows query rows, kRows x stride elements (0 for rows the tile does not hold,
// see LatentRowHeld, and for dims >= key_dim), through store(r * stride + d, value). Warp w takes
// rows w, w + warps, ...: each row's source is computed once, its dims are read by consecutive
// lanes (coalesced), and a lane has up to 32 loads of its rows in flight before it stores any (a
// load-then-store loop through a generic pointer waits one memory latency per element: the
// compiler cannot prove the load does not alias the shared store). The staging runs once per
// block, before its first key: with one 32-key chunk per block (decode of a short context) its
// instructions are a large part of the block's work, so no division or 64-bit multiply runs per
// element.
template <int kRows, int kThreads, typename Store>
__device__ inline void StageLatentQueries(const LatentArgs& a, const LatentTile& tile, int64_t n0,
                                          int64_t tile_tokens, int stride, Store&& store) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kPerWarp = (kRows + kWarps - 1) / kWarps;
  constexpr int kPerRow = 32 / kPerWarp > 1 ? 32 / kPerWarp : 1;  // loads per row per lane batch
  const LatentLaunchParams& p = a.p;
  const int heads = a.heads_per_tile;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int key_dim = static_cast<int>(p.key_dim);
  const float* src[kPerWarp];
  int rows[kPerWarp];
#pragma unroll
  for (int j = 0; j < kPerWarp; ++j) {
    const int r = warp + kWarps * j;
    rows[j] = r;
    src[j] = nullptr;
    if (r < kRows && LatentRowHeld(a, n0, tile_tokens, r)) {
      const int64_t t = tile.q0 + tile.i0 + r / heads;
      const int64_t n = n0 + r % heads;
      src[j] = p.q + t * p.q_token_stride + n * p.q_head_stride;
    }
  }
  for (int d0 = lane; d0 < stride; d0 += 32 * kPerRow) {
    float v[kPerWarp][kPerRow];
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
      for (int u = 0; u < kPerRow; ++u) {
        const int d = d0 + 32 * u;
        v[j][u] = src[j] != nullptr && d < key_dim ? src[j][d] : 0.0f;
      }
    }
#pragma unroll
    for (int j = 0; j < kPerWarp; ++j) {
#pragma unroll
      for (int u = 0; u < kPerRow; ++u) {
        const int d = d0 + 32 * u;
        if (rows[j] < kRows && d < stride) store(rows[j] * stride + d, v[j][u]);
      }
    }
  }
}

// The bf16 halves of an mma.sync B register that holds keys (key, key + 1) of a chunk, kept where
// `bits` has the key's bit and zeroed where not: a key no row of the block allows must not reach the
// value product, whatever its cache row holds (0 x NaN is NaN; its probabilities are 0).
__device__ inline unsigned LatentKeepKeyPair(unsigned bits, int key) {
  return (((bits >> key) & 1u) != 0 ? 0x0000ffffu : 0u) | (((bits >> (key + 1)) & 1u) != 0 ? 0xffff0000u : 0u);
}

// ---- Merging a row's splits (LatentCombineKernel, and LatentFoldCombine in the kernels) --------
//
// out = sum_i w_i acc_i / sum_i w_i l_i over a row's splits, w_i = exp(m_i - max m) (0 for
// m_i = -inf). Both paths compute it with the functions below in one order, so that a call gives the
// same bits whether a combine kernel or the attention kernel merges it, and whichever block of a
// tile arrives last: the denominator as 32 lane sums (split i in lane i % 32, ascending) added by
// WarpSum; each output element as kLatentCombineGroups group sums (split i in group i % 8,
// ascending) added in group order. A split of weight 0 is skipped, not multiplied (an empty split's
// values were never written: 0 x NaN), so a loop may also run past the splits that hold keys, or
// stop at the last of them, without changing a bit.
constexpr int kLatentCombineGroups = 8;

__device__ inline float LatentCombineStep(float acc, float w, float v) { return w != 0.0f ? fmaf(w, v, acc) : acc; }

__device__ inline float4 LatentCombineStep(float4 acc, float w, float4 v) {
  return make_float4(LatentCombineStep(acc.x, w, v.x), LatentCombineStep(acc.y, w, v.y),
                     LatentCombineStep(acc.z, w, v.z), LatentCombineStep(acc.w, w, v.w));
}

// One warp, every lane: the weights of a row's first `splits` splits into weights[0, splits), and
// 1 / the denominator (the same on every lane). max_sum: the row's split 0 (LatentPartials), read
// through L2: blocks on other SMs wrote it.
__device__ inline float LatentCombineWeights(const float* max_sum, int splits, float* weights) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float no_key = -__int_as_float(0x7f800000);
  float row_max = no_key;
  for (int i = lane; i < splits; i += 32) row_max = fmaxf(row_max, __ldcg(max_sum + 2 * i));
  row_max = WarpMax(row_max);
  float denominator = 0.0f;
  for (int i = lane; i < splits; i += 32) {
    const float m = __ldcg(max_sum + 2 * i);
    const float w = m != no_key ? expf(m - row_max) : 0.0f;
    weights[i] = w;
    denominator = LatentCombineStep(denominator, w, __ldcg(max_sum + 2 * i + 1));
  }
  return 1.0f / WarpSum(denominator);
}

// Columns col .. col + 3 (col < value_dim, a multiple of 4) of one split's partial values, through
// L2; 0 past value_dim. 16-byte loads when value_dim % 4 == 0 (the quads are then aligned).
__device__ inline float4 LatentPartialQuad(const float* values, int64_t col, int64_t value_dim) {
  if (value_dim % 4 == 0) return __ldcg(reinterpret_cast<const float4*>(values + col));
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  v.x = __ldcg(values + col);
  if (col + 1 < value_dim) v.y = __ldcg(values + col + 1);
  if (col + 2 < value_dim) v.z = __ldcg(values + col + 2);
  if (col + 3 < value_dim) v.w = __ldcg(values + col + 3);
  return v;
}

// Adds the group sums group(0), ..., group(kLatentCombineGroups - 1) in order and stores their
// columns below value_dim, times `inv`, at out[col ..].
template <typename Group>
__device__ inline void LatentStoreCombined(Group&& group, float inv, float* out, int64_t col, int64_t value_dim) {
  float4 sum = group(0);
#pragma unroll
  for (int g = 1; g < kLatentCombineGroups; ++g) {
    const float4 v = group(g);
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  const float values[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if (col + e < value_dim) out[col + e] = values[e] * inv;
  }
}

// The combine folded into an attention kernel (a.fold_combine), called by every thread of each
// block that wrote split partials, after it wrote them (and by no block whose split holds no key:
// those do not count). The block arrives on its output tile's counter; the last of the tile's
// blocks to arrive (the counter reaches the tile's sequence's LatentUsedSplits) sets it back to zero
// for the next launch (graph replays included) and merges the tile's rows over every split that holds
// keys. shared: the block's dynamic shared memory (LatentFoldSharedBytes(kRows, a.splits) bytes or
// more), free from the call on: it is written only after the first barrier here.
template <int kThreads, int kRows>
__device__ inline void LatentFoldCombine(const LatentArgs& a, const LatentTile& tile, int64_t n0, int64_t tile_tokens,
                                         float* shared) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kQuads = kLatentTileColumns / 4;
  static_assert(kThreads % 32 == 0 && kQuads % 32 == 0, "a warp's tasks lie in one row");
  __threadfence();  // this thread's partials, before the block counts itself
  __syncthreads();
  const int used = LatentUsedSplits(a, tile.kv);
  int* last = reinterpret_cast<int*>(shared);
  if (threadIdx.x == 0) {
    int* counter = a.counters + (static_cast<int64_t>(blockIdx.x) * gridDim.z + blockIdx.z);
    const bool is_last = atomicAdd(counter, 1) == used - 1;
    if (is_last) atomicExch(counter, 0);
    *last = is_last ? 1 : 0;
  }
  __syncthreads();
  if (*last == 0) return;
  __threadfence();  // the other blocks' partials, after their counts

  const LatentLaunchParams& p = a.p;
  const int heads = a.heads_per_tile;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* row_inv = shared + 1;        // [kRows]
  float* weights = row_inv + kRows;  // [kRows][used]
  for (int r = warp; r < kRows; r += kWarps) {
    if (!LatentRowHeld(a, n0, tile_tokens, r)) continue;
    const int64_t t = tile.q0 + tile.i0 + r / heads;
    const float inv = LatentCombineWeights(LatentPartials(a, t, n0 + r % heads, 0).max_sum, used, weights + r * used);
    if (lane == 0) row_inv[r] = inv;
  }
  __syncthreads();  // weights written
  // Thread task: row task / kQuads, columns 4 (task % kQuads) .. + 3, every group at once: a round
  // loads one split of each group (kLatentCombineGroups loads in flight per thread).
  for (int task = static_cast<int>(threadIdx.x); task < kRows * kQuads; task += kThreads) {
    const int r = task / kQuads;
    const int64_t col = 4 * (task % kQuads);
    if (col >= p.value_dim || !LatentRowHeld(a, n0, tile_tokens, r)) continue;
    const int64_t t = tile.q0 + tile.i0 + r / heads;
    const int64_t n = n0 + r % heads;
    const float* values = LatentPartials(a, t, n, 0).values;  // split i at values + i * value_dim
    const float* w = weights + r * used;
    float4 groups[kLatentCombineGroups];
#pragma unroll
    for (int g = 0; g < kLatentCombineGroups; ++g) groups[g] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int base = 0; base < used; base += kLatentCombineGroups) {
      float4 v[kLatentCombineGroups];
#pragma unroll
      for (int g = 0; g < kLatentCombineGroups; ++g) {
        const int i = min(base + g, used - 1);  // past `used`: a real address, weight 0
        v[g] = LatentPartialQuad(values + static_cast<int64_t>(i) * p.value_dim, col, p.value_dim);
      }
#pragma unroll
      for (int g = 0; g < kLatentCombineGroups; ++g) {
        groups[g] = LatentCombineStep(groups[g], base + g < used ? w[base + g] : 0.0f, v[g]);
      }
    }
    LatentStoreCombined([&](int g) { return groups[g]; }, row_inv[r],
                        p.out + t * p.out_token_stride + n * p.out_head_stride, col, p.value_dim);
  }
}

// Raises the dynamic shared memory limit of `kernel` (the latent kernels take more than the
// default 48 KiB) to shared_bytes and launches it, as a programmatic dependent when
// `programmatic` (the kernel opens with PdlEnter). Returns the attribute call's error, else the
// launch's.
inline cudaError_t LaunchWithSharedMemory(void (*kernel)(LatentArgs), dim3 grid, int threads,
                                          size_t shared_bytes, bool programmatic, cudaStream_t stream,
                                          const LatentArgs& a) {
  const cudaError_t error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes));
  if (error != cudaSuccess) return error;
  return LaunchKernel(programmatic, kernel, grid, dim3(threads), shared_bytes, stream, a);
}

// ---- The kernels' launchers (their facts for the plan: latent_plan.h) --------------------------

// Sets LatentMmaKernel<groups>'s dynamic shared memory limit to shared_bytes and launches it on
// `grid` (a.wp = MmaRowStride(key_dim)), as LaunchWithSharedMemory does.
cudaError_t LaunchLatentMma(const LatentArgs& a, int groups, dim3 grid, size_t shared_bytes,
                            bool programmatic, cudaStream_t stream);

// The compact kernel on `grid` (one value tile: value_dim 512). programmatic: as a programmatic
// dependent of the kernel before it on the stream (programmatic_launch.cuh), which must be the
// batched form's metadata check, with nothing between them: the check waits for the kernels before
// it before it lets this one launch (PdlEnter), and before PdlWait this kernel reads only what those
// kernels wrote (queries, page tables, q_start, kv_len), with every index bounded as if the check
// had failed, and reads no cache row and no `bad`. Returns the attribute call's error, else the
// launch's.
cudaError_t LaunchLatentCompact(const LatentArgs& a, dim3 grid, bool programmatic, cudaStream_t stream);

// The tree kernel on `grid` (one value tile: value_dim 512), with the compact kernel's programmatic
// protocol (LaunchLatentCompact): before PdlWait it reads only the tile, the queries and the first
// page entries, every index bounded as if the check had failed, and no cache row, mask byte or
// `bad`. Returns the attribute call's error, else the launch's.
cudaError_t LaunchLatentTree(const LatentArgs& a, dim3 grid, bool programmatic, cudaStream_t stream);

// cudaSuccess when the current device has an image of the wgmma kernel (latent_wgmma_kernels.cu,
// its code sm_90a only), else the error cudaFuncGetAttributes returned (left as the thread's last
// error: the caller clears it).
cudaError_t LatentWgmmaImage();

// The wgmma kernel on `grid` with the compact kernel's programmatic protocol (LaunchLatentCompact),
// 64-row blocks at the compact kernel's shape (its shared memory and chunk: latent_wgmma_layout.h).
// Returns the attribute call's error, else the launch's.
cudaError_t LaunchLatentWgmma(const LatentArgs& a, dim3 grid, bool programmatic, cudaStream_t stream);

// The paired-chunk wgmma kernel (latent_wgmma_pair_kernels.cu), the same contract, launched with
// the same shared memory (kWgmmaLaunchSharedBytes, which holds its layout).
cudaError_t LaunchLatentWgmmaPair(const LatentArgs& a, dim3 grid, bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
