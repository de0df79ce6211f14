// BatchedPagedAttention kernels (cuda/paged_attention_ops.h). No abseil here: nvcc must
// never see it.
#include <math_constants.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core_kernels.cuh"
#include "paged_attention_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kCheckThreads = 128;

// One block per sequence (block 0 also checks q_start[0] and q_start[B]); conditions as in
// paged_attention_ops.h. Threads only read what the earlier conditions of b made safe.
__global__ void CheckBatchedPagedKernel(const PagedAttentionParams p, int* error_flag, int error_code) {
  PdlEnter();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.q_start[0] != 0) RecordDeviceError(error_flag, error_code, 0);
    if (p.q_start[p.batch] != p.tokens) RecordDeviceError(error_flag, error_code, 8 * p.batch + 5);
  }
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const int64_t begin = p.q_start[b], end = p.q_start[b + 1], len = p.kv_len[b];
    if (end < begin || end > p.tokens) {
      if (threadIdx.x == 0) RecordDeviceError(error_flag, error_code, 8 * b + 1);
      continue;
    }
    if (end == begin) continue;
    if (len < 0 || len > p.max_kv_len || len > p.pages_per_seq * p.page_size) {
      if (threadIdx.x == 0) RecordDeviceError(error_flag, error_code, 8 * b + 2);
      continue;
    }
    if (p.mask == nullptr && end - begin > len) {
      if (threadIdx.x == 0) RecordDeviceError(error_flag, error_code, 8 * b + 6);
      continue;
    }
    const int32_t* pages = p.page_tables + b * p.page_table_stride;
    for (int64_t j = threadIdx.x; j < (len + p.page_size - 1) / p.page_size; j += blockDim.x) {
      if (pages[j] < 0 || pages[j] >= p.num_pages) RecordDeviceError(error_flag, error_code, 8 * b + 3);
    }
  }
}

// The sequence owning query row t: the last b with q_start[b] <= t, if t < q_start[b + 1]; else -1.
__device__ int64_t SequenceOf(const int32_t* __restrict__ q_start, int64_t batch, int64_t t) {
  int64_t lo = 0, hi = batch - 1, found = -1;
  while (lo <= hi) {
    const int64_t mid = (lo + hi) / 2;
    if (q_start[mid] <= t) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found >= 0 && t < q_start[found + 1] ? found : -1;
}

// The shared memory of both attention kernels (PagedAttentionSharedBytes): the scaled queries
// [group][D], then per warp the accumulators [group][D], the running maxima [group] and sums [group].
struct PagedShared {
  float* q;
  float* acc;
  float* max;
  float* sum;
};

__device__ inline PagedShared PagedSharedLayout(float* smem, int group, int dim) {
  PagedShared sh;
  sh.q = smem;
  sh.acc = sh.q + group * dim;
  sh.max = sh.acc + kPagedAttentionWarps * group * dim;
  sh.sum = sh.max + kPagedAttentionWarps * group;
  return sh;
}

// What a block knows of its query row: its sequence, the keys [0, keys) it may attend to, and its
// mask row (null: causal, every key below `keys`).
struct PagedRow {
  int64_t b = 0;
  int64_t keys = 0;
  const uint8_t* mask = nullptr;
};

// Query row t's PagedRow: keys is kv_len[b] with a mask, and kv_len[b] - n_b + i + 1 for row i of
// the sequence when causal (the bound replaces the mask, so causal keys cost no extra loads). False
// when the metadata is bad (the check kernel reports it): the row is not written.
__device__ inline bool FindPagedRow(const PagedAttentionParams& p, int64_t t, PagedRow* row) {
  row->b = SequenceOf(p.q_start, p.batch, t);
  if (row->b < 0) return false;
  const int64_t len = p.kv_len[row->b];
  if (len < 0 || len > p.max_kv_len || len > p.pages_per_seq * p.page_size) return false;
  if (p.mask != nullptr) {
    row->keys = len;
    row->mask = p.mask + t * p.mask_stride;
    return true;
  }
  const int64_t begin = p.q_start[row->b], n = p.q_start[row->b + 1] - begin;
  if (n > len) return false;
  row->keys = len - n + (t - begin) + 1;
  row->mask = nullptr;
  return true;
}

// Query row t's PagedRow, and the row's `group` query heads from first_head, scaled, into sh.q (no
// barrier). False when the metadata is bad: the block returns without writing.
__device__ inline bool PagedRowSetup(const PagedAttentionParams& p, int64_t t, int64_t first_head, int group,
                                     int dim, const PagedShared& sh, PagedRow* row) {
  if (!FindPagedRow(p, t, row)) return false;
  for (int i = threadIdx.x; i < group * dim; i += blockDim.x) {
    sh.q[i] = p.q[t * p.q_token_stride + (first_head + i / dim) * p.q_head_stride + i % dim] * p.scale;
  }
  return true;
}

// Key s, below the bound `keys`: whether the row's mask (null: causal, all below the bound) allows
// it and its page entry is good; if so *row is its first element in the cache (a key with a bad
// page entry is skipped).
__device__ inline bool PagedKey(const PagedAttentionParams& p, const int32_t* pages, const uint8_t* mask_row,
                                int64_t s, int64_t keys, int64_t row_width, long long* row) {
  if (s >= keys || (mask_row != nullptr && mask_row[s] == 0)) return false;
  const int32_t page = pages[s / p.page_size];
  if (page < 0 || page >= p.num_pages) return false;
  *row = (static_cast<long long>(page) * p.page_size + s % p.page_size) * row_width;
  return true;
}

// After the key loop (and the block's check that the row met an allowed key): merges the warps'
// partial results into out: out = sum_w e^(m_w - M) acc_w / sum_w e^(m_w - M) l_w
// (some warp has m_w = M finite, so the total is >= 1; a warp that met no key has m = -inf, l = 0).
__device__ inline void MergePagedWarps(const PagedAttentionParams& p, int64_t t, int64_t first_head, int group,
                                       int dim, const PagedShared& sh) {
  for (int i = threadIdx.x; i < group * dim; i += blockDim.x) {
    const int g = i / dim, d = i % dim;
    float top = -CUDART_INF_F;
    for (int w = 0; w < kPagedAttentionWarps; ++w) top = fmaxf(top, sh.max[w * group + g]);
    float total = 0.0f, value = 0.0f;
    for (int w = 0; w < kPagedAttentionWarps; ++w) {
      const float f = expf(sh.max[w * group + g] - top);
      total += sh.sum[w * group + g] * f;
      value += sh.acc[(w * group + g) * dim + d] * f;
    }
    p.out[t * p.out_token_stride + (first_head + g) * p.out_head_stride + d] = value / total;
  }
}

// Block (t, g): query row t, kv head g and its `group` query heads. Shared memory: the scaled
// queries [group][D], then per warp the accumulators [group][D], the running maxima [group] and
// the running sums [group]. Warp w takes keys [32 (w + k W), 32 (w + k W) + 32), a lane per key.
__global__ void __launch_bounds__(kPagedAttentionThreads)
    BatchedPagedAttentionKernel(const PagedAttentionParams p, bool vec4, int* error_flag, int error_code) {
  PdlEnter();
  extern __shared__ __align__(16) float smem[];
  const int64_t t = blockIdx.x;
  const int64_t kv_head = blockIdx.y;
  const int group = static_cast<int>(p.q_heads / p.kv_heads);
  const int dim = static_cast<int>(p.head_dim);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const PagedShared sh = PagedSharedLayout(smem, group, dim);
  float* q_s = sh.q;
  float* acc = sh.acc;
  float* max_s = sh.max;
  float* sum_s = sh.sum;

  const int64_t first_head = kv_head * group;
  PagedRow r;
  if (!PagedRowSetup(p, t, first_head, group, dim, sh, &r)) return;
  for (int i = threadIdx.x; i < kPagedAttentionWarps * group * dim; i += blockDim.x) acc[i] = 0.0f;
  for (int i = threadIdx.x; i < kPagedAttentionWarps * group; i += blockDim.x) {
    max_s[i] = -CUDART_INF_F;
    sum_s[i] = 0.0f;
  }
  __syncthreads();

  const int64_t row_width = 2 * p.kv_heads * p.head_dim;
  const int64_t key_col = kv_head * p.head_dim, value_col = (p.kv_heads + kv_head) * p.head_dim;
  const int32_t* pages = p.page_tables + r.b * p.page_table_stride;
  bool seen_key = false;  // whether this thread's warp met an allowed key (also with no query heads)
  for (int64_t base = static_cast<int64_t>(warp) * 32; base < r.keys; base += kPagedAttentionWarps * 32) {
    long long row = 0;  // the key's first element in the cache
    const bool valid = PagedKey(p, pages, r.mask, base + lane, r.keys, row_width, &row);
    if (__ballot_sync(kFullMask, valid) == 0) continue;
    seen_key = true;
    const float* key = p.cache + row + key_col;
    for (int g = 0; g < group; ++g) {
      const float* qg = q_s + g * dim;
      float score = -CUDART_INF_F;
      if (valid) {
        float dot = 0.0f;
        if (vec4) {
          for (int d = 0; d < dim; d += 4) {
            const float4 k4 = *reinterpret_cast<const float4*>(key + d);
            const float4 q4 = *reinterpret_cast<const float4*>(qg + d);
            dot += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
          }
        } else {
          for (int d = 0; d < dim; ++d) dot += qg[d] * key[d];
        }
        score = dot;
      }
      float* running_max = max_s + warp * group + g;
      float* running_sum = sum_s + warp * group + g;
      const float old_max = *running_max;
      const float new_max = fmaxf(old_max, WarpMax(score));
      const float correction = expf(old_max - new_max);  // 0 while nothing was seen
      const float prob = valid ? expf(score - new_max) : 0.0f;
      const float new_sum = *running_sum * correction + WarpSum(prob);
      float* a = acc + (warp * group + g) * dim;
      for (int d = lane; d < dim; d += 32) a[d] *= correction;
      for (int k = 0; k < 32; ++k) {
        const float pk = __shfl_sync(kFullMask, prob, k);
        const long long rk = __shfl_sync(kFullMask, row, k);
        if (pk == 0.0f) continue;  // the same for the whole warp
        const float* value = p.cache + rk + value_col;
        for (int d = lane; d < dim; d += 32) a[d] += pk * value[d];
      }
      __syncwarp();
      if (lane == 0) {
        *running_max = new_max;
        *running_sum = new_sum;
      }
      __syncwarp();
    }
  }
  if (!__syncthreads_or(seen_key)) {  // uniform: the row allows no key
    if (kv_head == 0 && threadIdx.x == 0) RecordDeviceError(error_flag, error_code, 8 * t + 4);
    return;
  }

  MergePagedWarps(p, t, first_head, group, dim, sh);
}

// The split register kernel (PagedAttentionParams::register_kernel). Block (t, g, split): query
// row t, kv head g and its `group` query heads, over the split's share of the row's keys (its
// PagedRow::keys spread evenly over gridDim.z splits, in whole chunks). Per 32-key chunk each
// warp takes 4 consecutive keys: its lanes read the keys' K and V rows across head_dim (dims
// lane + 32 i, coalesced; 8 rows in flight per lane), the 4 x kSplitHeads dot products are reduced
// over the warp in one butterfly, the block's online softmax per head runs in shared memory (warp h
// updates head h), and each lane adds its dims of the 4 value rows into registers. The shared-
// memory kernel above (and this kernel's first, unsplit version) walked all of a (row, kv head)'s
// keys in one block, a lane per key over the whole head_dim: a chain of dependent loads on one SM,
// which for the draft's one-token rows left the GPU idle; the splits spread a row over many SMs and
// each lane keeps loads in flight. After the key loop the warps' sums are added per head; one split
// writes out (as the other kernel would), several write their partial (sum, max, total) for
// PagedCombineKernel. Keys, masks, skipped pages and the reports are those of the kernel above; a
// row with no allowed key is reported here with one split and by the combine with several.
constexpr int kSplitHeads = 8;                              // query heads per pass of the key loop
constexpr int kSplitKeysPerWarp = 4;                        // keys a warp reads per chunk
constexpr int kSplitChunk = kSplitKeysPerWarp * kPagedAttentionWarps;  // keys per chunk (32)
// Most splits of a row: past this the combine's sum over the splits costs more than the blocks
// save.
constexpr int kPagedMaxSplits = 32;
static_assert(kSplitKeysPerWarp * kSplitHeads == 32, "one butterfly reduces a warp's dot products");

// Shared memory of the split kernel: the scaled queries [group][D], the chunk's scores and its
// softmax weights [kSplitHeads][kSplitChunk] each, the running max / total / correction per head of
// the pass, and the warps' value sums of one head [kPagedAttentionWarps][D] for the final reduction.
inline int64_t PagedSplitSharedFloats(int64_t group, int64_t dim) {
  return group * dim + 2 * kSplitHeads * kSplitChunk + 3 * kSplitHeads + kPagedAttentionWarps * dim;
}

// One step of WarpSumEach32: lanes with bit kHalf set keep the upper kHalf of their values, the
// others the lower, each adding its partner's (lane ^ kHalf) copy of the kept half. Selects by bit
// masks: written as `upper ? v[k + kHalf] : v[k]` the compiler turns the select into an indexed
// address and moves v to local memory.
template <int kHalf>
__device__ __forceinline__ void ButterflyStep(float (&v)[32], int lane) {
  const unsigned upper = (lane & kHalf) != 0 ? 0xffffffffu : 0u;
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    const unsigned lo = __float_as_uint(v[k]), hi = __float_as_uint(v[k + kHalf]);
    const float keep = __uint_as_float((hi & upper) | (lo & ~upper));
    const float give = __uint_as_float((lo & upper) | (hi & ~upper));
    v[k] = keep + __shfl_xor_sync(kFullMask, give, kHalf);
  }
}

// v[i], i < 32: lane L of the warp gets the warp's sum of v[L] (a butterfly that halves the values
// a lane holds at every step: 31 shuffles for 32 sums instead of 5 per sum).
__device__ __forceinline__ float WarpSumEach32(float (&v)[32]) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  ButterflyStep<16>(v, lane);
  ButterflyStep<8>(v, lane);
  ButterflyStep<4>(v, lane);
  ButterflyStep<2>(v, lane);
  ButterflyStep<1>(v, lane);
  return v[0];
}

template <int kDims>  // head_dim <= 32 * kDims
__global__ void __launch_bounds__(kPagedAttentionThreads)
    PagedSplitKernel(const PagedAttentionParams p, int* error_flag, int error_code) {
  PdlEnter();
  extern __shared__ __align__(16) float smem[];
  const int64_t t = blockIdx.x;
  const int64_t kv_head = blockIdx.y;
  const int64_t split = blockIdx.z, splits = gridDim.z;
  const int group = static_cast<int>(p.q_heads / p.kv_heads);
  const int dim = static_cast<int>(p.head_dim);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float* q_s = smem;
  float* score_s = q_s + group * dim;              // [kSplitHeads][kSplitChunk]
  float* weight_s = score_s + kSplitHeads * kSplitChunk;
  float* max_s = weight_s + kSplitHeads * kSplitChunk;
  float* total_s = max_s + kSplitHeads;
  float* scale_s = total_s + kSplitHeads;          // the chunk's correction of the old sums
  float* reduce_s = scale_s + kSplitHeads;         // [kPagedAttentionWarps][D]

  const int64_t first_head = kv_head * group;
  PagedRow r;
  PagedShared setup;
  setup.q = q_s;
  if (!PagedRowSetup(p, t, first_head, group, dim, setup, &r)) return;

  const int64_t per_split = (r.keys + splits * kSplitChunk - 1) / (splits * kSplitChunk) * kSplitChunk;
  const int64_t begin = split * per_split, end = min(r.keys, begin + per_split);
  const int64_t row_width = 2 * p.kv_heads * p.head_dim;
  const int64_t key_col = kv_head * p.head_dim, value_col = (p.kv_heads + kv_head) * p.head_dim;
  const int32_t* pages = p.page_tables + r.b * p.page_table_stride;
  bool seen_key = false;  // whether this thread's warp met an allowed key
  for (int g0 = 0; g0 < group; g0 += kSplitHeads) {
    const int gn = min(kSplitHeads, group - g0);  // block-uniform, >= 1
    if (threadIdx.x < kSplitHeads) {
      max_s[threadIdx.x] = -CUDART_INF_F;
      total_s[threadIdx.x] = 0.0f;
    }
    float acc[kSplitHeads][kDims];
#pragma unroll
    for (int g = 0; g < kSplitHeads; ++g) {
#pragma unroll
      for (int i = 0; i < kDims; ++i) acc[g][i] = 0.0f;
    }
    __syncthreads();  // q_s staged (first pass), max_s / total_s reset, the last pass's reads done
    for (int64_t chunk = begin; chunk < end; chunk += kSplitChunk) {
      // Lane j < 4 finds key chunk + 4 warp + j; the warp then reads the 4 K and V rows together.
      long long my_row = 0;
      const bool my_valid =
          lane < kSplitKeysPerWarp && PagedKey(p, pages, r.mask, chunk + warp * kSplitKeysPerWarp + lane, end,
                                               row_width, &my_row);
      const unsigned valid_bits = __ballot_sync(kFullMask, my_valid);
      seen_key = seen_key || valid_bits != 0;
      float k[kSplitKeysPerWarp][kDims], v[kSplitKeysPerWarp][kDims];
#pragma unroll
      for (int j = 0; j < kSplitKeysPerWarp; ++j) {
        const long long row = __shfl_sync(kFullMask, my_row, j);
        const bool valid = ((valid_bits >> j) & 1u) != 0;
#pragma unroll
        for (int i = 0; i < kDims; ++i) {
          const int d = lane + 32 * i;
          k[j][i] = valid && d < dim ? p.cache[row + key_col + d] : 0.0f;
          v[j][i] = valid && d < dim ? p.cache[row + value_col + d] : 0.0f;
        }
      }
      float dots[32];  // [key j][head g] at j * kSplitHeads + g
#pragma unroll
      for (int g = 0; g < kSplitHeads; ++g) {
        float q[kDims];
#pragma unroll
        for (int i = 0; i < kDims; ++i) {
          const int d = lane + 32 * i;
          q[i] = g < gn && d < dim ? q_s[(g0 + g) * dim + d] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kSplitKeysPerWarp; ++j) {
          float dot = 0.0f;
#pragma unroll
          for (int i = 0; i < kDims; ++i) dot = fmaf(q[i], k[j][i], dot);
          dots[j * kSplitHeads + g] = dot;
        }
      }
      const float dot = WarpSumEach32(dots);  // lane L: key L / kSplitHeads, head L % kSplitHeads
      {
        const int j = lane / kSplitHeads, g = lane % kSplitHeads;
        const bool valid = ((valid_bits >> j) & 1u) != 0;
        score_s[g * kSplitChunk + warp * kSplitKeysPerWarp + j] = valid ? dot : -CUDART_INF_F;
      }
      __syncthreads();
      if (warp < gn) {  // warp h: the online softmax of head h over the chunk (a lane a key)
        const float score = score_s[warp * kSplitChunk + lane];
        const float old_max = max_s[warp];
        const float new_max = fmaxf(old_max, WarpMax(score));
        // Nothing allowed so far (new_max = -inf): weights 0 and the (zero) sums kept as they are.
        const bool none = new_max == -CUDART_INF_F;
        const float w = none ? 0.0f : expf(score - new_max);
        const float correction = none ? 1.0f : expf(old_max - new_max);
        const float total = total_s[warp] * correction + WarpSum(w);
        weight_s[warp * kSplitChunk + lane] = w;
        __syncwarp();  // every lane has read max_s / total_s before lane 0 replaces them
        if (lane == 0) {
          max_s[warp] = new_max;
          total_s[warp] = total;
          scale_s[warp] = correction;
        }
      }
      __syncthreads();
#pragma unroll
      for (int g = 0; g < kSplitHeads; ++g) {
        if (g < gn) {
          const float correction = scale_s[g];
#pragma unroll
          for (int i = 0; i < kDims; ++i) acc[g][i] *= correction;
#pragma unroll
          for (int j = 0; j < kSplitKeysPerWarp; ++j) {
            const float w = weight_s[g * kSplitChunk + warp * kSplitKeysPerWarp + j];
#pragma unroll
            for (int i = 0; i < kDims; ++i) acc[g][i] = fmaf(w, v[j][i], acc[g][i]);
          }
        }
      }
      // No barrier here: the next chunk writes score_s (read before the barrier above) and writes
      // weight_s / the statistics only after its first barrier, which every warp reaches after
      // adding this chunk.
    }
    // The warps' sums of each head of the pass, added; then out (one split) or the partials.
#pragma unroll
    for (int g = 0; g < kSplitHeads; ++g) {
      if (g >= gn) break;  // block-uniform
#pragma unroll
      for (int i = 0; i < kDims; ++i) {
        const int d = lane + 32 * i;
        if (d < dim) reduce_s[warp * dim + d] = acc[g][i];
      }
      __syncthreads();
      const int64_t head = first_head + g0 + g;
      const float row_max = max_s[g], row_total = total_s[g];
      for (int d = threadIdx.x; d < dim; d += blockDim.x) {
        float sum = 0.0f;
        for (int w = 0; w < kPagedAttentionWarps; ++w) sum += reduce_s[w * dim + d];
        if (splits == 1) {
          if (row_total > 0.0f) p.out[t * p.out_token_stride + head * p.out_head_stride + d] = sum / row_total;
        } else {
          p.partials[((t * p.q_heads + head) * splits + split) * dim + d] = sum;
        }
      }
      if (splits > 1 && threadIdx.x == 0) {
        float* stats = p.partials + p.tokens * p.q_heads * splits * dim;
        stats[2 * ((t * p.q_heads + head) * splits + split)] = row_max;
        stats[2 * ((t * p.q_heads + head) * splits + split) + 1] = row_total;
      }
      __syncthreads();  // reduce_s is rewritten by the next head
    }
  }
  if (splits == 1 && !__syncthreads_or(seen_key)) {  // uniform: the row allows no key
    if (kv_head == 0 && threadIdx.x == 0) RecordDeviceError(error_flag, error_code, 8 * t + 4);
  }
}

// Block (t, h): query row t, query head h: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s
// over the splits (a split with no allowed key has m = -inf, l = 0). A row whose metadata is bad
// was not written by the split kernel and is not written here; a row with no allowed key in any
// split is reported (by head 0) and not written.
__global__ void __launch_bounds__(128) PagedCombineKernel(const PagedAttentionParams p, int splits,
                                                          int* error_flag, int error_code) {
  PdlEnter();
  __shared__ float weight[kPagedMaxSplits];  // e^(m_s - M), then divided by the total
  __shared__ float top_s;
  const int64_t t = blockIdx.x, head = blockIdx.y;
  PagedRow r;
  if (!FindPagedRow(p, t, &r)) return;
  const int dim = static_cast<int>(p.head_dim);
  const int64_t entry = (t * p.q_heads + head) * splits;
  const float* stats = p.partials + p.tokens * p.q_heads * splits * dim + 2 * entry;
  if (threadIdx.x < 32) {  // warp 0: the splits' maximum and total, in parallel over the splits
    float top = -CUDART_INF_F;
    for (int i = threadIdx.x; i < splits; i += 32) top = fmaxf(top, stats[2 * i]);
    top = WarpMax(top);
    float total = 0.0f;
    if (top != -CUDART_INF_F) {
      for (int i = threadIdx.x; i < splits; i += 32) {
        weight[i] = expf(stats[2 * i] - top);
        total += stats[2 * i + 1] * weight[i];
      }
    }
    total = WarpSum(total);
    for (int i = threadIdx.x; i < splits && top != -CUDART_INF_F; i += 32) weight[i] /= total;
    if (threadIdx.x == 0) top_s = top;
  }
  __syncthreads();
  if (top_s == -CUDART_INF_F) {  // uniform: no split met an allowed key
    if (head == 0 && threadIdx.x == 0) RecordDeviceError(error_flag, error_code, 8 * t + 4);
    return;
  }
  const float* part = p.partials + entry * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float value = 0.0f;
#pragma unroll 8
    for (int i = 0; i < splits; ++i) value = fmaf(part[i * dim + d], weight[i], value);
    p.out[t * p.out_token_stride + head * p.out_head_stride + d] = value;
  }
}

}  // namespace

cudaError_t LaunchBatchedPagedAttention(const PagedAttentionParams& params, int* error_flag, int error_code,
                                        bool programmatic, cudaStream_t stream) {
  const PagedAttentionParams& p = params;
  if (p.batch < 0 || p.tokens < 0 || p.tokens > INT32_MAX || p.num_pages < 0 || p.page_size < 1 || p.pages_per_seq < 0 ||
      p.max_kv_len < 1 || p.max_kv_len > INT32_MAX || p.head_dim < 1 || p.kv_heads < 1 || p.kv_heads > 65535 ||
      p.q_heads < 0 || p.q_heads % p.kv_heads != 0 || error_flag == nullptr || p.q_start == nullptr ||
      (p.batch > 0 && (p.kv_len == nullptr || (p.pages_per_seq > 0 && p.page_tables == nullptr))) ||
      (p.tokens > 0 && p.q_heads > 0 && (p.q == nullptr || p.out == nullptr)) ||
      (p.num_pages > 0 && p.cache == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t shared = PagedAttentionSharedBytes(group, p.head_dim);
  if (shared > kPagedAttentionMaxSharedBytes) return cudaErrorInvalidValue;
  cudaError_t error =
      LaunchKernel(programmatic, CheckBatchedPagedKernel,
                   dim3(static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(p.batch, 1), 65535))),
                   dim3(kCheckThreads), 0, stream, p, error_flag, error_code);
  if (error != cudaSuccess || p.tokens == 0) return error;
  if (p.register_kernel && p.head_dim <= kPagedAttentionRegisterMaxDim && p.q_heads > 0) {
    // Splits: enough blocks to fill the device, at most one per chunk of the longest sequence, and
    // what the partials hold (dim + 2 floats per row, query head and split).
    const int64_t rows = p.tokens * p.kv_heads;
    const int64_t per_split_floats = p.tokens * p.q_heads * (p.head_dim + 2);
    int64_t splits = std::max<int64_t>(1, (p.target_blocks + rows - 1) / std::max<int64_t>(rows, 1));
    splits = std::min(splits, (p.max_kv_len + kSplitChunk - 1) / kSplitChunk);
    splits = std::min<int64_t>(splits, p.partials == nullptr ? 1 : p.partial_floats / per_split_floats);
    splits = std::clamp<int64_t>(splits, 1, kPagedMaxSplits);
    const size_t bytes = sizeof(float) * static_cast<size_t>(PagedSplitSharedFloats(group, p.head_dim));
    const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.kv_heads),
                    static_cast<unsigned>(splits));
    error = LaunchKernel(programmatic,
                         p.head_dim <= 128 ? PagedSplitKernel<4> : PagedSplitKernel<kPagedAttentionRegisterMaxDim / 32>,
                         grid, dim3(kPagedAttentionThreads), bytes, stream, p, error_flag, error_code);
    if (error != cudaSuccess || splits == 1) return error;
    return LaunchKernel(programmatic, PagedCombineKernel,
                        dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.q_heads)), dim3(128), 0,
                        stream, p, static_cast<int>(splits), error_flag, error_code);
  }
  // float4 loads of keys and queries: every key row and the queries' shared rows 16-byte aligned.
  const bool vec4 = p.head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(p.cache) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.kv_heads));
  return LaunchKernel(programmatic, BatchedPagedAttentionKernel, grid, dim3(kPagedAttentionThreads),
                      static_cast<size_t>(shared), stream, p, vec4, error_flag, error_code);
}

}  // namespace eagle3::cuda
