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
  float* q_s = smem;
  float* acc = q_s + group * dim;
  float* max_s = acc + kPagedAttentionWarps * group * dim;
  float* sum_s = max_s + kPagedAttentionWarps * group;

  const int64_t b = SequenceOf(p.q_start, p.batch, t);
  if (b < 0) return;  // bad q_start: the check kernel reports it
  const int64_t len = p.kv_len[b];
  if (len < 0 || len > p.max_kv_len || len > p.pages_per_seq * p.page_size) return;  // reported too

  const int64_t first_head = kv_head * group;
  for (int i = threadIdx.x; i < group * dim; i += blockDim.x) {
    q_s[i] = p.q[t * p.q_token_stride + (first_head + i / dim) * p.q_head_stride + i % dim] * p.scale;
  }
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
    const int64_t s = base + lane;
    bool valid = false;
    long long row = 0;  // the key's first element in the cache
    if (s < len && mask_row[s] != 0) {
      const int32_t page = pages[s / p.page_size];
      if (page >= 0 && page < p.num_pages) {
        valid = true;
        row = (static_cast<long long>(page) * p.page_size + s % p.page_size) * row_width;
      }
    }
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

  // Merge the warps: out = sum_w e^(m_w - M) acc_w / sum_w e^(m_w - M) l_w (some warp has m_w = M
  // finite, so the total is >= 1).
  for (int i = threadIdx.x; i < group * dim; i += blockDim.x) {
    const int g = i / dim, d = i % dim;
    float top = -CUDART_INF_F;
    for (int w = 0; w < kPagedAttentionWarps; ++w) top = fmaxf(top, max_s[w * group + g]);
    float total = 0.0f, value = 0.0f;
    for (int w = 0; w < kPagedAttentionWarps; ++w) {
      const float f = expf(max_s[w * group + g] - top);
      total += sum_s[w * group + g] * f;
      value += acc[(w * group + g) * dim + d] * f;
    }
    p.out[t * p.out_token_stride + (first_head + g) * p.out_head_stride + d] = value / total;
  }
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
  BatchedPagedAttentionKernel<<<grid, kPagedAttentionThreads, static_cast<size_t>(shared), stream>>>(
      p, vec4, error_flag, error_code);
  return cudaGetLastError();
}

}  // namespace eagle3::cuda
