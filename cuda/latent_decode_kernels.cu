// Paged latent attention, fast path (cuda/attention_ops.h): the f32 kernel, the combine of split
// results, the batched form's metadata check and tile table, and the launchers, which pick the f32
// kernel or one of the bf16 tensor-core kernels (latent_mma_kernels.cu, latent_compact_kernels.cu,
// latent_tree_kernels.cu, latent_wgmma_kernels.cu). No abseil here: nvcc must never see it.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <math_constants.h>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "core_kernels.cuh"
#include "latent_common.cuh"
#include "latent_plan.h"
#include "ptx.cuh"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

// Why a kernel of its own: the split kernel (split_attention_kernels.cu) copies each key row with a
// scalar loop of dependent global loads after a page-table load, with nothing in flight during the
// compute, so a block's 256 keys cost dozens of memory latencies. Here a block (256 threads, one
// per SM: the staging takes ~190 KiB) double-buffers 32-key chunks with cp.async: chunk i + 1 is in
// flight while chunk i is computed, and its page entries and mask bytes were loaded into registers
// one chunk earlier still. Compute is register-blocked: scores as a [rows x 32] tile, each thread 4
// keys x kRT rows over an eighth of the dims (float4 shared reads, conflict-free), summed with
// shuffles; values with each thread owning kRT rows x 8 columns of the output for the whole key
// range.
//
// Arithmetic note (fp32 CUDA cores): at 16 heads a latent row costs 16 * (576 + 512) FMAs per
// 2304 bytes, about as many as the fp32 units can issue while HBM delivers those bytes, so this
// kernel is bounded by FMA issue at 16 heads and by bandwidth at 8 heads; going further needs
// tensor cores (3xTF32 for fp32 accuracy, or a bf16 cache: latent_mma_kernels.cu).

constexpr int kLatentThreads = 256;
constexpr int kLatentWarps = kLatentThreads / 32;
constexpr int kLatentMaxRows = 16;
constexpr int kScoreStride = kLatentChunk + 1;

int LatentRowStride(int64_t key_dim) { return static_cast<int>((key_dim + 31) / 32 * 32); }

size_t LatentSharedFloats(int64_t key_dim) {
  const int64_t wp = LatentRowStride(key_dim);
  return static_cast<size_t>(kLatentMaxRows * wp + 2 * kLatentChunk * wp +
                             kLatentMaxRows * kScoreStride + kLatentChunk * kLatentMaxRows +
                             2 * kLatentMaxRows + kLatentMaxRows);
}

template <int kRT>
__global__ void __launch_bounds__(kLatentThreads, 1) LatentKernel(const LatentArgs a) {
  PdlEnter();
  if (*a.bad != 0) return;
  constexpr int kRows = 4 * kRT;
  const LatentLaunchParams& p = a.p;
  LatentTile tile;
  if (!FindLatentTile(a, blockIdx.x, &tile)) return;
  const LatentKeyRange keys = LatentBlockKeys(a, tile);
  const int64_t s_begin = keys.begin, s_end = keys.end;
  if (s_begin >= s_end) return;  // the combine reads only the splits that hold keys (and counts no other)
  const int64_t head_tile = blockIdx.z / a.value_tiles;
  const int64_t col0 = (blockIdx.z % a.value_tiles) * kLatentTileColumns;
  const int heads_per_tile = a.heads_per_tile;
  const int64_t n0 = head_tile * heads_per_tile;
  const int64_t tile_tokens = std::min<int64_t>(a.tokens_per_tile, tile.n - tile.i0);
  const int64_t prefix = tile.kv - tile.n;
  const int wp = a.wp;
  const int key_dim = static_cast<int>(p.key_dim);

  extern __shared__ float4 latent_shared[];
  float* qs = reinterpret_cast<float*>(latent_shared);  // [kLatentMaxRows][wp]
  float* ks = qs + kLatentMaxRows * wp;                 // [2][kLatentChunk][wp]
  float* sc = ks + 2 * kLatentChunk * wp;               // [kLatentMaxRows][kScoreStride]
  float* pt = sc + kLatentMaxRows * kScoreStride;       // [kLatentChunk][kRows], key-major
  float* row_a = pt + kLatentChunk * kLatentMaxRows;    // [kLatentMaxRows]: alpha, then max
  float* row_l = row_a + kLatentMaxRows;                // [kLatentMaxRows]
  unsigned* allow = reinterpret_cast<unsigned*>(row_l + kLatentMaxRows);  // [kLatentMaxRows]

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;

  // Block row r is token i0 + r / H of the sequence, head n0 + r % H.
  auto row_valid = [&](int r) { return LatentRowHeld(a, n0, tile_tokens, r); };
  StageLatentQueries<kRows, kLatentThreads>(a, tile, n0, tile_tokens, wp,
                                             [&](int i, float v) { qs[i] = v; });
  // Pad columns are never copied: zero them once in both stages (pad x 0 must not be NaN).
  const int pad = wp - key_dim;
  for (int row = warp; row < 2 * kLatentChunk; row += kLatentWarps) {
    for (int e = lane; e < pad; e += 32) ks[row * wp + key_dim + e] = 0.0f;
  }

  const LatentAllowByte allow_byte{tile_tokens, s_end, tile, p, prefix};
  // Warp w copies keys w, w + 8, w + 16, w + 24 of a chunk; page entries are loaded a chunk ahead.
  int32_t page[4];
  auto load_pages = [&](int64_t base) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t s = base + warp + kLatentWarps * k;
      page[k] = s < s_end ? tile.pages[NonNegativeDiv(s, p.page_size)] : 0;
    }
  };
  auto issue = [&](int64_t base, int stage) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int key = warp + kLatentWarps * k;
      const int64_t s = base + key;
      if (s >= s_end) continue;
      const float* src = p.cache + LatentCacheRow(page[k], s, p.page_size) * p.key_dim;
      float* dst = ks + (stage * kLatentChunk + key) * wp;
      if (a.vec) {
        for (int e = lane * 4; e < key_dim; e += 128) CpAsync16(dst + e, src + e);
      } else {
        for (int e = lane; e < key_dim; e += 32) CpAsync4(dst + e, src + e);
      }
    }
  };

  float m[kRows / 8], l[kRows / 8];
#pragma unroll
  for (int i = 0; i < kRows / 8; ++i) {
    m[i] = -CUDART_INF_F;
    l[i] = 0.0f;
  }
  const int pv_rows = (warp / 2) * kRT;       // value phase: rows pv_rows .. + kRT
  const int pv_col = 4 * ((warp % 2) * 32 + lane);  // and columns pv_col .. + 3, pv_col + 256 ..
  const bool use0 = col0 + pv_col < p.value_dim;
  const bool use1 = col0 + pv_col + 256 < p.value_dim;
  float4 o[kRT][2];
#pragma unroll
  for (int r = 0; r < kRT; ++r) {
    o[r][0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    o[r][1] = o[r][0];
  }
  const int qk_rows = (lane / 8) * kRT;  // score phase: rows qk_rows .. + kRT
  const int qk_keys = warp * 4;          // keys qk_keys .. + 3
  const int qk_part = lane % 8;          // dims 4 * (qk_part + 8 i) .. + 3

  const int64_t chunks = (s_end - s_begin + kLatentChunk - 1) / kLatentChunk;
  load_pages(s_begin);
  issue(s_begin, 0);
  CpAsyncCommit();
  load_pages(s_begin + kLatentChunk);
  uint8_t mask_next[2] = {*allow_byte(warp, s_begin + lane), *allow_byte(warp + 8, s_begin + lane)};

  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t base = s_begin + c * kLatentChunk;
    const int stage = static_cast<int>(c % 2);
    const unsigned bits0 = __ballot_sync(kFullMask, mask_next[0] != 0);
    const unsigned bits1 = __ballot_sync(kFullMask, mask_next[1] != 0);
    if (lane == 0) {
      allow[warp] = bits0;
      allow[warp + 8] = bits1;
    }
    if (c + 1 < chunks) issue(base + kLatentChunk, 1 - stage);
    CpAsyncCommit();
    if (c + 2 < chunks) load_pages(base + 2 * kLatentChunk);
    mask_next[0] = *allow_byte(warp, base + kLatentChunk + lane);
    mask_next[1] = *allow_byte(warp + 8, base + kLatentChunk + lane);
    CpAsyncWait<1>();
    __syncthreads();  // chunk c staged by every thread; allow written

    unsigned used = 0;  // keys of the chunk that some row allows (block-uniform)
    for (int64_t i = 0; i < tile_tokens; ++i) used |= allow[i];
    if (used != 0) {
      const float* kst = ks + stage * kLatentChunk * wp;
      float acc[kRT][4];
#pragma unroll
      for (int r = 0; r < kRT; ++r) {
#pragma unroll
        for (int k = 0; k < 4; ++k) acc[r][k] = 0.0f;
      }
      for (int d = 4 * qk_part; d < wp; d += 32) {
        float4 qv[kRT], kv[4];
#pragma unroll
        for (int r = 0; r < kRT; ++r) qv[r] = *reinterpret_cast<const float4*>(qs + (qk_rows + r) * wp + d);
#pragma unroll
        for (int k = 0; k < 4; ++k) kv[k] = *reinterpret_cast<const float4*>(kst + (qk_keys + k) * wp + d);
#pragma unroll
        for (int r = 0; r < kRT; ++r) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            acc[r][k] = fmaf(qv[r].x, kv[k].x, acc[r][k]);
            acc[r][k] = fmaf(qv[r].y, kv[k].y, acc[r][k]);
            acc[r][k] = fmaf(qv[r].z, kv[k].z, acc[r][k]);
            acc[r][k] = fmaf(qv[r].w, kv[k].w, acc[r][k]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kRT; ++r) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
#pragma unroll
          for (int offset = 1; offset < 8; offset <<= 1) {
            acc[r][k] += __shfl_xor_sync(kFullMask, acc[r][k], offset);
          }
        }
      }
      if (qk_part == 0) {
#pragma unroll
        for (int r = 0; r < kRT; ++r) {
          const int row = qk_rows + r;
          const bool valid = row_valid(row);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int key = qk_keys + k;
            const bool ok = valid && ((allow[row / heads_per_tile] >> key) & 1u) != 0;
            sc[row * kScoreStride + key] = ok ? p.scale * acc[r][k] : -CUDART_INF_F;
          }
        }
      }
      __syncthreads();

      // Online softmax, one warp per row: lane = key.
#pragma unroll
      for (int i = 0; i < kRows / 8; ++i) {
        const int row = warp + 8 * i;
        const float score = sc[row * kScoreStride + lane];
        const float new_max = fmaxf(m[i], WarpMax(score));
        float prob = 0.0f, alpha = 1.0f;  // a row with no allowed key yet keeps m = -inf, l = 0
        if (new_max != -CUDART_INF_F) {
          prob = expf(score - new_max);
          alpha = expf(m[i] - new_max);
        }
        l[i] = l[i] * alpha + WarpSum(prob);
        m[i] = new_max;
        pt[lane * kRows + row] = prob;
        if (lane == 0) row_a[row] = alpha;
      }
      __syncthreads();

      // Weighted values; keys no row allows are skipped (never read).
#pragma unroll
      for (int r = 0; r < kRT; ++r) {
        const float alpha = row_a[pv_rows + r];
        o[r][0].x *= alpha; o[r][0].y *= alpha; o[r][0].z *= alpha; o[r][0].w *= alpha;
        o[r][1].x *= alpha; o[r][1].y *= alpha; o[r][1].z *= alpha; o[r][1].w *= alpha;
      }
#pragma unroll 4
      for (int key = 0; key < kLatentChunk; ++key) {
        if (((used >> key) & 1u) == 0) continue;
        float prob[kRT];
#pragma unroll
        for (int r = 0; r < kRT; ++r) prob[r] = pt[key * kRows + pv_rows + r];
        const float* v_row = kst + key * wp + col0 + pv_col;
        if (use0) {
          const float4 v = *reinterpret_cast<const float4*>(v_row);
#pragma unroll
          for (int r = 0; r < kRT; ++r) {
            o[r][0].x = fmaf(prob[r], v.x, o[r][0].x);
            o[r][0].y = fmaf(prob[r], v.y, o[r][0].y);
            o[r][0].z = fmaf(prob[r], v.z, o[r][0].z);
            o[r][0].w = fmaf(prob[r], v.w, o[r][0].w);
          }
        }
        if (use1) {
          const float4 v = *reinterpret_cast<const float4*>(v_row + 256);
#pragma unroll
          for (int r = 0; r < kRT; ++r) {
            o[r][1].x = fmaf(prob[r], v.x, o[r][1].x);
            o[r][1].y = fmaf(prob[r], v.y, o[r][1].y);
            o[r][1].z = fmaf(prob[r], v.z, o[r][1].z);
            o[r][1].w = fmaf(prob[r], v.w, o[r][1].w);
          }
        }
      }
    }
    __syncthreads();  // stage c % 2, sc, pt and allow are free for the next chunk
  }

#pragma unroll
  for (int i = 0; i < kRows / 8; ++i) {
    if (lane == 0) {
      row_a[warp + 8 * i] = m[i];
      row_l[warp + 8 * i] = l[i];
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRT; ++r) {
    const int row = pv_rows + r;
    if (!row_valid(row)) continue;
    const int64_t t = tile.q0 + tile.i0 + row / heads_per_tile;
    const int64_t n = n0 + row % heads_per_tile;
    const float values[8] = {o[r][0].x, o[r][0].y, o[r][0].z, o[r][0].w,
                             o[r][1].x, o[r][1].y, o[r][1].z, o[r][1].w};
    const LatentRowOut dst = LatentRowDestination(a, t, n, row_a[row], row_l[row],
                                                  blockIdx.z % a.value_tiles == 0 && warp % 2 == 0 && lane == 0);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t col = pv_col + (e / 4) * 256 + e % 4;
      if (col0 + col < p.value_dim) dst.values[col0 + col] = values[e] * dst.factor;
    }
  }
  if (a.fold_combine) {
    LatentFoldCombine<kLatentThreads, kRows>(a, tile, n0, tile_tokens, reinterpret_cast<float*>(latent_shared));
  }
}

// One block per (query row, 128 value columns), the merge of latent_common.cuh ("Merging a row's
// splits"): warp 0 computes the weights into shared memory first, so the value loop has no branch
// and no dependent load (its loads of several splits are in flight at once; a loop that skips empty
// splits waits one memory latency per split), and warp g sums group g.
__global__ void __launch_bounds__(kLatentThreads) LatentCombineKernel(const LatentArgs a) {
  static_assert(kLatentWarps == kLatentCombineGroups, "a warp per group");
  PdlLaunchDependents();  // lets the weight-streaming GEMV after this one start early
  PdlWait();              // the attention kernel's partials
  if (*a.bad != 0) return;
  __shared__ float4 part_sums[kLatentCombineGroups][32];
  __shared__ float split_weight[kLatentMaxSplits];
  __shared__ float row_inv;
  const LatentLaunchParams& p = a.p;
  const int64_t row = blockIdx.x;
  const int64_t t = row / p.heads;
  const int64_t n = row % p.heads;
  // Splits past the sequence's keys hold nothing: marked empty (MarkEmptySplit, -inf maxima), or
  // not counted.
  int splits = static_cast<int>(a.splits);
  if (!a.splits_marked) {
    int64_t kv = p.max_kv_len;
    if (p.q_start != nullptr) kv = p.kv_len[LastNotAbove(p.q_start, p.batch, t)];
    splits = LatentUsedSplits(a, kv);
  }
  const LatentPartialRow first = LatentPartials(a, t, n, 0);  // the row's splits follow it
  const int tid = static_cast<int>(threadIdx.x);
  const int group = tid / 32, lane = tid % 32;
  if (group == 0) {
    const float inv = LatentCombineWeights(first.max_sum, splits, split_weight);
    if (lane == 0) row_inv = inv;
  }
  __syncthreads();  // split_weight, row_inv written
  const int64_t col = blockIdx.y * 128 + 4 * lane;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (col < p.value_dim) {
#pragma unroll 4
    for (int i = group; i < splits; i += kLatentCombineGroups) {
      const float4 v = LatentPartialQuad(first.values + static_cast<int64_t>(i) * p.value_dim, col, p.value_dim);
      acc = LatentCombineStep(acc, split_weight[i], v);
    }
  }
  part_sums[group][lane] = acc;
  __syncthreads();
  if (group == 0 && col < p.value_dim) {
    LatentStoreCombined([&](int g) { return part_sums[g][lane]; }, row_inv,
                        p.out + t * p.out_token_stride + n * p.out_head_stride, col, p.value_dim);
  }
}

// Threads of the batched metadata check: one block covers every sequence.
constexpr int kCheckThreads = 1024;

// Batched metadata, one block for all sequences (and q_start[0] and q_start[B]):
// records 8 * b + condition for the lowest failing sequence (conditions in attention_ops.h, in
// the CPU reference's order). Threads only read what the earlier conditions of b made safe.
// The block splits into teams (a power of two, at most one per warp), team k taking sequences k,
// k + teams, ...: a sequence's checks are a chain of dependent loads (its starts and length, then
// its page entries and mask rows), so sequences one after another would make the check's time grow
// with the batch, while one team per sequence of a small batch keeps a long page table's scan wide.
__global__ void CheckBatchedLatentKernel(const LatentLaunchParams p, int* bad, int* error_flag,
                                         int error_code) {
  // Waits before it lets the next kernel launch: the compact or tree kernel after it reads the
  // queries and page tables before its own PdlWait (LaunchLatentCompact).
  PdlEnter();
  // One block: it clears the op's flag (the kernels of the op before have completed: PdlEnter),
  // then any thread may set it.
  if (threadIdx.x == 0) *bad = 0;
  __syncthreads();
  const int64_t batch = p.batch;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.q_start[0] != 0) Flag(bad, error_flag, error_code, 0);
    if (p.q_start[batch] != p.tokens) Flag(bad, error_flag, error_code, 8 * batch + 6);
  }
  int teams = 1;
  while (2 * teams <= kCheckThreads / 32 && 2 * teams <= batch) teams *= 2;
  const int team_size = static_cast<int>(blockDim.x) / teams;
  const int team = static_cast<int>(threadIdx.x) / team_size, member = static_cast<int>(threadIdx.x) % team_size;
  for (int64_t b = team; b < batch; b += teams) {
    const int64_t begin = p.q_start[b], end = p.q_start[b + 1], len = p.kv_len[b];
    const int64_t n = end - begin;
    if (end < begin || end > p.tokens) {
      if (member == 0) Flag(bad, error_flag, error_code, 8 * b + 1);
      continue;
    }
    if (n == 0) continue;
    if (len < n || len > p.max_kv_len || len > p.pages_per_seq * p.page_size) {
      if (member == 0) Flag(bad, error_flag, error_code, 8 * b + 2);
      continue;
    }
    const bool has_mask = p.tree_mask != nullptr;
    if (has_mask && n > p.tree_width) {
      if (member == 0) Flag(bad, error_flag, error_code, 8 * b + 3);
      continue;
    }
    const int32_t* pages = p.page_tables + b * p.page_table_stride;
    for (int64_t j = member; j < (len + p.page_size - 1) / p.page_size; j += team_size) {
      if (pages[j] < 0 || pages[j] >= p.num_pages) Flag(bad, error_flag, error_code, 8 * b + 4);
    }
    if (has_mask && len == n && begin >= 0) {
      for (int64_t i = member; i < n; i += team_size) {
        const uint8_t* row = p.tree_mask + (begin + i) * p.tree_mask_stride;
        bool any = false;
        for (int64_t j = 0; j < n && !any; ++j) any = row[j] != 0;
        if (!any) Flag(bad, error_flag, error_code, 8 * b + 5);
      }
    }
    if (p.mask != nullptr && begin >= 0) {
      // The key-mask form: every row must allow one of its sequence's keys (a draft row allows its
      // committed prefix, so the scan stops at once).
      for (int64_t i = member; i < n; i += team_size) {
        const uint8_t* row = p.mask + (begin + i) * p.mask_stride;
        bool any = false;
        for (int64_t s = 0; s < len && !any; ++s) any = row[s] != 0;
        if (!any) Flag(bad, error_flag, error_code, 8 * b + 7);
      }
    }
  }
}

// tile_table[b] = sum over b' < b of ceil(n_b' / tokens_per_tile); tile_table[B] = the total.
__global__ void LatentTileTableKernel(const int32_t* __restrict__ q_start, int64_t batch,
                                      int64_t tokens_per_tile, int32_t* tile_table,
                                      const int* bad) {
  PdlEnter();
  if (*bad != 0) return;
  int running = 0;
  for (int64_t base = 0; base < batch; base += blockDim.x) {
    const int64_t b = base + threadIdx.x;
    const int tiles = b < batch ? static_cast<int>((q_start[b + 1] - q_start[b] + tokens_per_tile - 1) /
                                                   tokens_per_tile)
                                : 0;
    int total = 0;
    const int offset = BlockExclusiveScan(tiles, &total);
    if (b < batch) tile_table[b] = running + offset;
    running += total;
  }
  if (threadIdx.x == 0) tile_table[batch] = running;
}

bool ValidLatentParams(const LatentLaunchParams& p) {
  if (p.tokens < 0 || p.heads < 0 || p.key_dim < 1 || p.key_dim > kLatentMaxKeyDim ||
      p.value_dim < 0 || p.value_dim > p.key_dim || p.page_size < 1 || p.num_pages < 0 ||
      p.max_kv_len < 1 || p.batch < 0 || p.batch > kLatentMaxBatch || p.pages_per_seq < 0) {
    return false;
  }
  if (p.q_token_stride < 0 || p.q_head_stride < 0 || p.out_token_stride < 0 ||
      p.out_head_stride < 0 || p.mask_stride < 0 || p.tree_mask_stride < 0 ||
      p.page_table_stride < 0 || p.tree_width < 0) {
    return false;
  }
  if (p.cache != nullptr && p.cache_bf16 != nullptr) return false;
  if (p.tokens * p.heads == 0 || p.value_dim == 0) return true;
  return p.q != nullptr && p.out != nullptr && (p.cache != nullptr || p.cache_bf16 != nullptr) &&
         p.page_tables != nullptr;
}

std::atomic<int> tree_kernel_choice{-1};
std::atomic<int> wgmma_variant{-1};
std::atomic<int> max_splits{-1};

// Per device: 0 not yet asked, 1 the wgmma kernel runs there, 2 it does not.
constexpr int kMaxDevices = 64;
std::array<std::atomic<int>, kMaxDevices> wgmma_on_device{};

// The current device's facts for the launch plan: its multiprocessors and opt-in shared memory, the
// kernel choice, and (when the choice asks for it) whether it runs the wgmma kernel.
cudaError_t CurrentPlanDevice(LatentPlanDevice* device) {
  int id = 0, sms = 0, max_shared = 0;
  cudaError_t error = cudaGetDevice(&id);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, id);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, id);
  if (error != cudaSuccess) return error;
  device->sms = sms;
  device->max_shared = static_cast<size_t>(max_shared);
  device->choice = GetLatentTreeKernelChoice();
  device->wgmma_available = device->choice != LatentTreeKernelChoice::kMma && LatentWgmmaAvailable();
  device->wgmma_variant = GetLatentWgmmaVariant();
  device->max_splits = GetLatentMaxSplits();
  return cudaSuccess;
}

// Launch geometry (host values only, so a captured graph replays any lengths within the bounds).
// programmatic: the kernels launch as programmatic dependents; the compact or tree kernel stages
// its prologue before its PdlWait only where `after_check` (the batched form's check kernel was
// launched just before: see LaunchLatentCompact), and otherwise waits first (LatentArgs::wait_first).
// Split calls merge their splits in the attention kernel where `fold` allows it (LatentFold), else
// in LatentCombineKernel.
// `device`: CurrentPlanDevice's answer, asked once per call by the caller.
cudaError_t LaunchLatentKernels(const LatentLaunchParams& p, const int32_t* tile_table,
                                float* partials, int64_t partial_capacity, const LatentFold& fold,
                                const int* bad, bool programmatic, bool after_check,
                                const LatentPlanDevice& device, cudaStream_t stream) {
  if (p.tokens * p.heads == 0 || p.value_dim == 0) return cudaSuccess;
  LatentPlan plan;
  if (!PlanLatentLaunch(p, tile_table != nullptr, partials != nullptr, partial_capacity, fold, device, &plan)) {
    return cudaErrorInvalidValue;
  }
  const bool bf16 = p.cache_bf16 != nullptr;
  const int rows = plan.rows;
  const size_t shared_bytes = plan.shared_bytes;

  LatentArgs a{};
  a.p = p;
  a.tile_table = tile_table;
  a.partials = partials;
  a.bad = bad;
  a.wait_first = !after_check;
  a.split_chunk = plan.split_chunk;
  a.splits_marked = plan.kernel == LatentKernelKind::kWgmma || plan.kernel == LatentKernelKind::kWgmmaPair ||
                    plan.kernel == LatentKernelKind::kTree || plan.kernel == LatentKernelKind::kCompact;
  a.wp = bf16 ? MmaRowStride(p.key_dim) : LatentRowStride(p.key_dim);
  a.vec = bf16 ? p.key_dim % 8 == 0 && reinterpret_cast<uintptr_t>(p.cache_bf16) % 16 == 0
               : p.key_dim % 4 == 0 && reinterpret_cast<uintptr_t>(p.cache) % 16 == 0;
  a.heads_per_tile = plan.heads_per_tile;
  a.tokens_per_tile = plan.tokens_per_tile;
  a.value_tiles = plan.value_tiles;
  a.splits = plan.splits;
  a.fold_combine = plan.fold_combine;
  a.counters = fold.counters;
  const int64_t token_tiles = plan.token_tiles, head_tiles = plan.head_tiles;

  const int row_tile = rows / 4;
  const dim3 grid(static_cast<unsigned>(token_tiles), static_cast<unsigned>(a.splits),
                  static_cast<unsigned>(head_tiles * a.value_tiles));
  cudaError_t error = cudaSuccess;
  switch (plan.kernel) {
    case LatentKernelKind::kWgmma:
      error = LaunchLatentWgmma(a, grid, programmatic, stream);
      break;
    case LatentKernelKind::kWgmmaPair:
      error = LaunchLatentWgmmaPair(a, grid, programmatic, stream);
      break;
    case LatentKernelKind::kTree:
      error = LaunchLatentTree(a, grid, programmatic, stream);
      break;
    case LatentKernelKind::kCompact:
      error = LaunchLatentCompact(a, grid, programmatic, stream);
      break;
    case LatentKernelKind::kMma:
      error = LaunchLatentMma(a, rows / 16, grid, shared_bytes, programmatic, stream);
      break;
    case LatentKernelKind::kF32:
      error = LaunchWithSharedMemory(row_tile == 2 ? LatentKernel<2> : LatentKernel<4>, grid, kLatentThreads,
                                     shared_bytes, programmatic, stream, a);
      break;
  }
  if (error != cudaSuccess) return error;
  error = cudaGetLastError();
  if (error != cudaSuccess || a.splits == 1 || a.fold_combine) return error;
  const dim3 combine_grid(static_cast<unsigned>(p.tokens * p.heads),
                          static_cast<unsigned>((p.value_dim + 127) / 128));
  return LaunchKernel(programmatic, LatentCombineKernel, combine_grid, dim3(kLatentThreads), 0,
                      stream, a);
}

// A process-wide switch: `slot` once set (by its setter or an earlier call), else the value
// from_env(getenv(variable)) gives, stored by the first caller to get there.
template <typename Choice, typename FromEnv>
Choice ProcessChoice(std::atomic<int>& slot, const char* variable, const FromEnv& from_env) {
  int choice = slot.load(std::memory_order_relaxed);
  if (choice < 0) {
    int expected = -1;
    slot.compare_exchange_strong(expected, static_cast<int>(from_env(std::getenv(variable))));
    choice = slot.load(std::memory_order_relaxed);
  }
  return static_cast<Choice>(choice);
}

bool Is(const char* value, const char* name) { return value != nullptr && std::strcmp(value, name) == 0; }

}  // namespace

LatentTreeKernelChoice GetLatentTreeKernelChoice() {
  return ProcessChoice<LatentTreeKernelChoice>(tree_kernel_choice, "EAGLE3_LATENT_TREE_KERNEL", [](const char* v) {
    return Is(v, "mma")         ? LatentTreeKernelChoice::kMma
           : Is(v, "wgmma")     ? LatentTreeKernelChoice::kWgmma
           : Is(v, "wgmma-all") ? LatentTreeKernelChoice::kWgmmaAll
                                : LatentTreeKernelChoice::kAuto;
  });
}

void SetLatentTreeKernelChoice(LatentTreeKernelChoice kernel) {
  tree_kernel_choice.store(static_cast<int>(kernel), std::memory_order_relaxed);
}

LatentWgmmaVariant GetLatentWgmmaVariant() {
  return ProcessChoice<LatentWgmmaVariant>(wgmma_variant, "EAGLE3_LATENT_WGMMA", [](const char* v) {
    return Is(v, "pair") ? LatentWgmmaVariant::kPair : LatentWgmmaVariant::kSingle;
  });
}

void SetLatentWgmmaVariant(LatentWgmmaVariant variant) {
  wgmma_variant.store(static_cast<int>(variant), std::memory_order_relaxed);
}

int64_t GetLatentMaxSplits() {
  return ProcessChoice<int64_t>(max_splits, "EAGLE3_LATENT_MAX_SPLITS", LatentMaxSplitsFromEnv);
}

bool LatentWgmmaAvailable() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return false;
  int known = wgmma_on_device[device].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0, minor = 0;
    bool runs = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
                major == 9 && minor == 0;
    // sm_90a code runs on compute capability 9.0 alone; the image lookup confirms the build has it.
    if (runs && LatentWgmmaImage() != cudaSuccess) {
      runs = false;
      (void)cudaGetLastError();  // the failed lookup's error must not reach the next launch's check
    }
    known = runs ? 1 : 2;
    wgmma_on_device[device].store(known, std::memory_order_relaxed);
  }
  return known == 1;
}

size_t LatentSharedBytes(int64_t key_dim) { return LatentSharedFloats(key_dim) * sizeof(float); }

cudaError_t LaunchLatentAttention(const LatentLaunchParams& params, float* partials,
                                  int64_t partial_capacity, const LatentFold& fold, const int* bad,
                                  bool programmatic, cudaStream_t stream) {
  if (!ValidLatentParams(params) || partial_capacity < 0 || bad == nullptr || fold.capacity < 0) {
    return cudaErrorInvalidValue;
  }
  LatentLaunchParams p = params;
  p.batch = 1;
  p.q_start = nullptr;
  p.kv_len = nullptr;
  p.tree_mask = nullptr;
  if (p.tokens * p.heads == 0 || p.value_dim == 0) return cudaSuccess;
  if (p.mask == nullptr) return cudaErrorInvalidValue;
  LatentPlanDevice device;
  const cudaError_t error = CurrentPlanDevice(&device);
  if (error != cudaSuccess) return error;
  return LaunchLatentKernels(p, nullptr, partials, partial_capacity, fold, bad, programmatic,
                             /*after_check=*/false, device, stream);
}

cudaError_t LaunchBatchedLatentAttention(const LatentLaunchParams& params, int32_t* tile_table,
                                         float* partials, int64_t partial_capacity, const LatentFold& fold,
                                         int* bad, int* error_flag, int error_code, bool check,
                                         bool programmatic, cudaStream_t stream) {
  const LatentLaunchParams& p = params;
  if (!ValidLatentParams(p) || partial_capacity < 0 || fold.capacity < 0 || bad == nullptr || error_flag == nullptr ||
      tile_table == nullptr || p.q_start == nullptr || (p.batch > 0 && p.kv_len == nullptr) ||
      (p.mask != nullptr && p.tree_mask != nullptr) || (p.tree_mask != nullptr && p.tree_width < 1)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch > 0 && p.page_tables == nullptr) return cudaErrorInvalidValue;
  cudaError_t error = cudaSuccess;
  if (check) {
    error = LaunchKernel(programmatic, CheckBatchedLatentKernel, dim3(1), dim3(kCheckThreads), 0, stream, p, bad,
                         error_flag, error_code);
  }
  if (error != cudaSuccess || p.tokens * p.heads == 0 || p.value_dim == 0) return error;
  LatentPlanDevice device;
  error = CurrentPlanDevice(&device);
  if (error != cudaSuccess) return error;
  const int rows = LatentBlockRows(p, device);
  const int64_t tokens_per_tile = rows / std::min<int64_t>(p.heads, rows);
  // One token per tile (as many heads as block rows, or more): the tile table is q_start itself.
  if (tokens_per_tile == 1) {
    return LaunchLatentKernels(p, p.q_start, partials, partial_capacity, fold, bad, programmatic,
                               /*after_check=*/check, device, stream);
  }
  // Without the check, the earlier call's tile table (for the same metadata) stands.
  if (!check) {
    return LaunchLatentKernels(p, tile_table, partials, partial_capacity, fold, bad, programmatic,
                               /*after_check=*/false, device, stream);
  }
  error = LaunchKernel(programmatic, LatentTileTableKernel, dim3(1), dim3(kThreads), 0, stream,
                       p.q_start, p.batch, tokens_per_tile, tile_table, bad);
  if (error != cudaSuccess) return error;
  // The attention kernel reads the tile table, which the kernel just before writes.
  return LaunchLatentKernels(p, tile_table, partials, partial_capacity, fold, bad, programmatic,
                             /*after_check=*/false, device, stream);
}

}  // namespace eagle3::cuda
