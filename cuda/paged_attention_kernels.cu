// BatchedPagedAttention kernels (eagle3/cuda/paged_attention_ops.h). No abseil here: nvcc must
// never see it.
#include <math_constants.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "core_kernels.cuh"
#include "eagle3/cuda/paged_attention_ops.h"

namespace eagle3::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kCheckThreads = 128;

// One block per sequence (block 0 also checks q_start[0] and q_start[B]); conditions as in
// paged_attention_ops.h. Threads only read what the earlier conditions of b made safe.
__global__ void CheckBatchedPagedKernel(const PagedAttentionParams p, int* error_flag, int error_code) {
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

// Query row t's sequence *b and its key count *len, and the row's `group` query heads from
// first_head, scaled, into sh.q (no barrier). False when the metadata is bad (the check kernel
// reports it): the block returns without writing.
__device__ inline bool PagedRowSetup(const PagedAttentionParams& p, int64_t t, int64_t first_head, int group,
                                     int dim, const PagedShared& sh, int64_t* b, int64_t* len) {
  *b = SequenceOf(p.q_start, p.batch, t);
  if (*b < 0) return false;
  *len = p.kv_len[*b];
  if (*len < 0 || *len > p.max_kv_len || *len > p.pages_per_seq * p.page_size) return false;
  for (int i = threadIdx.x; i < group * dim; i += blockDim.x) {
    sh.q[i] = p.q[t * p.q_token_stride + (first_head + i / dim) * p.q_head_stride + i % dim] * p.scale;
  }
  return true;
}

// Key s of a sequence of len keys: whether the row's mask allows it and its page entry is good; if
// so *row is its first element in the cache (a key with a bad page entry is skipped).
__device__ inline bool PagedKey(const PagedAttentionParams& p, const int32_t* pages, const uint8_t* mask_row,
                                int64_t s, int64_t len, int64_t row_width, long long* row) {
  if (s >= len || mask_row[s] == 0) return false;
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
  int64_t b = 0, len = 0;
  if (!PagedRowSetup(p, t, first_head, group, dim, sh, &b, &len)) return;
  for (int i = threadIdx.x; i < kPagedAttentionWarps * group * dim; i += blockDim.x) acc[i] = 0.0f;
  for (int i = threadIdx.x; i < kPagedAttentionWarps * group; i += blockDim.x) {
    max_s[i] = -CUDART_INF_F;
    sum_s[i] = 0.0f;
  }
  __syncthreads();

  const int64_t row_width = 2 * p.kv_heads * p.head_dim;
  const int64_t key_col = kv_head * p.head_dim, value_col = (p.kv_heads + kv_head) * p.head_dim;
  const int32_t* pages = p.page_tables + b * p.page_table_stride;
  const uint8_t* mask_row = p.mask + t * p.mask_stride;
  bool seen_key = false;  // whether this thread's warp met an allowed key (also with no query heads)
  for (int64_t base = static_cast<int64_t>(warp) * 32; base < len; base += kPagedAttentionWarps * 32) {
    long long row = 0;  // the key's first element in the cache
    const bool valid = PagedKey(p, pages, mask_row, base + lane, len, row_width, &row);
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

// The register kernel (PagedAttentionParams::register_kernel): the same blocks, keys, masks,
// skipped pages and error reports as the kernel above, restructured for latency. Above, for each
// 32-key chunk and each head of the group, every lane re-reads its whole key and the warp then adds
// the chunk's 32 value rows one after another into shared-memory accumulators; the compiler cannot
// prove those shared stores do not alias the next value's global load, so each of the 32 x group
// value rows waits a full memory latency (the DeepSeek-V3 draft step: ~0.8 ms of a 1K-key context
// at one token, TP 1 or TP 8 alike). Here a lane reads its key once per pass of up to
// kRegisterHeads heads, the value sums live in registers (a lane holds dims lane, lane + 32, ...),
// and the value rows of a chunk are independent loads the compiler can keep in flight.
constexpr int kRegisterHeads = 8;
constexpr int kRegisterDimsPerLane = kPagedAttentionRegisterMaxDim / 32;
constexpr int kValueBatch = 4;  // value rows a lane has in flight

__global__ void __launch_bounds__(kPagedAttentionThreads)
    BatchedPagedAttentionRegistersKernel(const PagedAttentionParams p, bool vec4, int* error_flag, int error_code) {
  extern __shared__ __align__(16) float smem[];
  const int64_t t = blockIdx.x;
  const int64_t kv_head = blockIdx.y;
  const int group = static_cast<int>(p.q_heads / p.kv_heads);
  const int dim = static_cast<int>(p.head_dim);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const PagedShared sh = PagedSharedLayout(smem, group, dim);  // the kernel above's: the merge is shared
  const float* q_s = sh.q;

  const int64_t first_head = kv_head * group;
  int64_t b = 0, len = 0;
  if (!PagedRowSetup(p, t, first_head, group, dim, sh, &b, &len)) return;
  __syncthreads();

  const int64_t row_width = 2 * p.kv_heads * p.head_dim;
  const int64_t key_col = kv_head * p.head_dim, value_col = (p.kv_heads + kv_head) * p.head_dim;
  const int32_t* pages = p.page_tables + b * p.page_table_stride;
  const uint8_t* mask_row = p.mask + t * p.mask_stride;
  bool seen_key = false;  // whether this thread's warp met an allowed key (also with no query heads)
  // Passes of up to kRegisterHeads heads; one pass with none when the group is empty, so that a
  // row with no allowed key is still found.
  for (int g0 = 0; g0 < max(group, 1); g0 += kRegisterHeads) {
    const int gn = min(kRegisterHeads, group - g0);  // warp-uniform; <= 0 with no query heads
    float m[kRegisterHeads], l[kRegisterHeads], acc[kRegisterHeads][kRegisterDimsPerLane];
#pragma unroll
    for (int g = 0; g < kRegisterHeads; ++g) {
      m[g] = -CUDART_INF_F;
      l[g] = 0.0f;
#pragma unroll
      for (int i = 0; i < kRegisterDimsPerLane; ++i) acc[g][i] = 0.0f;
    }
    for (int64_t base = static_cast<int64_t>(warp) * 32; base < len; base += kPagedAttentionWarps * 32) {
      long long row = 0;  // the key's first element in the cache
      const bool valid = PagedKey(p, pages, mask_row, base + lane, len, row_width, &row);
      const unsigned allowed = __ballot_sync(kFullMask, valid);
      if (allowed == 0) continue;
      seen_key = true;
      if (gn <= 0) continue;
      // This lane's key against every head of the pass (q pre-scaled), one read of the key.
      float score[kRegisterHeads];
#pragma unroll
      for (int g = 0; g < kRegisterHeads; ++g) score[g] = 0.0f;
      if (valid) {
        const float* key = p.cache + row + key_col;
        if (vec4) {
          for (int d = 0; d < dim; d += 4) {
            const float4 k4 = *reinterpret_cast<const float4*>(key + d);
#pragma unroll
            for (int g = 0; g < kRegisterHeads; ++g) {
              if (g < gn) {
                const float4 q4 = *reinterpret_cast<const float4*>(q_s + (g0 + g) * dim + d);
                score[g] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
              }
            }
          }
        } else {
          for (int d = 0; d < dim; ++d) {
            const float k = key[d];
#pragma unroll
            for (int g = 0; g < kRegisterHeads; ++g) {
              if (g < gn) score[g] += q_s[(g0 + g) * dim + d] * k;
            }
          }
        }
      }
      // Online softmax per head over the chunk: the warp's running max / sum (every lane holds them).
      float prob[kRegisterHeads];
#pragma unroll
      for (int g = 0; g < kRegisterHeads; ++g) {
        prob[g] = 0.0f;
        if (g < gn) {
          const float sc = valid ? score[g] : -CUDART_INF_F;
          const float new_max = fmaxf(m[g], WarpMax(sc));  // finite: some lane is valid
          const float correction = expf(m[g] - new_max);     // 0 while nothing was seen
          prob[g] = valid ? expf(sc - new_max) : 0.0f;
          l[g] = l[g] * correction + WarpSum(prob[g]);
          m[g] = new_max;
#pragma unroll
          for (int i = 0; i < kRegisterDimsPerLane; ++i) acc[g][i] *= correction;
        }
      }
      // The chunk's allowed value rows, in key order, kValueBatch rows loaded before any is used
      // (the loads do not depend on the sums). A disallowed key's row is not read: its weight is 0.
      for (int k0 = 0; k0 < 32; k0 += kValueBatch) {
        if (((allowed >> k0) & ((1u << kValueBatch) - 1u)) == 0) continue;  // warp-uniform
        float v[kValueBatch][kRegisterDimsPerLane];
#pragma unroll
        for (int j = 0; j < kValueBatch; ++j) {
          const long long rk = __shfl_sync(kFullMask, row, k0 + j);
          const bool use = ((allowed >> (k0 + j)) & 1u) != 0;
          const float* value = p.cache + rk + value_col;
#pragma unroll
          for (int i = 0; i < kRegisterDimsPerLane; ++i) {
            const int d = lane + 32 * i;
            v[j][i] = use && d < dim ? value[d] : 0.0f;
          }
        }
#pragma unroll
        for (int j = 0; j < kValueBatch; ++j) {
#pragma unroll
          for (int g = 0; g < kRegisterHeads; ++g) {
            if (g < gn) {
              const float pk = __shfl_sync(kFullMask, prob[g], k0 + j);
#pragma unroll
              for (int i = 0; i < kRegisterDimsPerLane; ++i) acc[g][i] = fmaf(pk, v[j][i], acc[g][i]);
            }
          }
        }
      }
    }
    // This warp's part of the pass, for the merge.
    for (int g = 0; g < gn; ++g) {
#pragma unroll
      for (int i = 0; i < kRegisterDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < dim) sh.acc[(warp * group + g0 + g) * dim + d] = acc[g][i];
      }
      if (lane == 0) {
        sh.max[warp * group + g0 + g] = m[g];
        sh.sum[warp * group + g0 + g] = l[g];
      }
    }
  }
  if (!__syncthreads_or(seen_key)) {  // uniform: the row allows no key
    if (kv_head == 0 && threadIdx.x == 0) RecordDeviceError(error_flag, error_code, 8 * t + 4);
    return;
  }

  MergePagedWarps(p, t, first_head, group, dim, sh);
}

}  // namespace

cudaError_t LaunchBatchedPagedAttention(const PagedAttentionParams& params, int* error_flag, int error_code,
                                        cudaStream_t stream) {
  const PagedAttentionParams& p = params;
  if (p.batch < 0 || p.tokens < 0 || p.tokens > INT32_MAX || p.num_pages < 0 || p.page_size < 1 || p.pages_per_seq < 0 ||
      p.max_kv_len < 1 || p.max_kv_len > INT32_MAX || p.head_dim < 1 || p.kv_heads < 1 || p.kv_heads > 65535 ||
      p.q_heads < 0 || p.q_heads % p.kv_heads != 0 || error_flag == nullptr || p.q_start == nullptr ||
      (p.batch > 0 && (p.kv_len == nullptr || (p.pages_per_seq > 0 && p.page_tables == nullptr))) ||
      (p.tokens > 0 && p.mask == nullptr) ||
      (p.tokens > 0 && p.q_heads > 0 && (p.q == nullptr || p.out == nullptr)) ||
      (p.num_pages > 0 && p.cache == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const int64_t group = p.q_heads / p.kv_heads;
  const int64_t shared = PagedAttentionSharedBytes(group, p.head_dim);
  if (shared > kPagedAttentionMaxSharedBytes) return cudaErrorInvalidValue;
  CheckBatchedPagedKernel<<<static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(p.batch, 1), 65535)),
                            kCheckThreads, 0, stream>>>(p, error_flag, error_code);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess || p.tokens == 0) return error;
  // float4 loads of keys and queries: every key row and the queries' shared rows 16-byte aligned.
  const bool vec4 = p.head_dim % 4 == 0 && reinterpret_cast<uintptr_t>(p.cache) % 16 == 0;
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.kv_heads));
  if (p.register_kernel && p.head_dim <= kPagedAttentionRegisterMaxDim) {
    BatchedPagedAttentionRegistersKernel<<<grid, kPagedAttentionThreads, static_cast<size_t>(shared), stream>>>(
        p, vec4, error_flag, error_code);
  } else {
    BatchedPagedAttentionKernel<<<grid, kPagedAttentionThreads, static_cast<size_t>(shared), stream>>>(
        p, vec4, error_flag, error_code);
  }
  return cudaGetLastError();
}

}  // namespace eagle3::cuda
