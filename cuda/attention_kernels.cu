// RoPE, attention and paged-cache kernels (cuda/attention_ops.h). No abseil here: nvcc must
// never see it.
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <math_constants.h>

#include "core_kernels.cuh"
#include "attention_ops.h"

namespace eagle3::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;

// ---- Launch helpers ----------------------------------------------------------------------------

// Blocks for a grid-stride loop over n items (n > 0); the loop covers what the cap leaves out.
unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<int64_t>(blocks, int64_t{1} << 16));
}

// Blocks for a loop with one block per row (rows > 0).
unsigned RowGrid(int64_t rows) { return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 16)); }

// Marks the op's call bad (its writers then write nothing) and records the entry for Synchronize.
__device__ void Flag(int* bad, int* error_flag, int error_code, int64_t index) {
  *bad = 1;
  RecordDeviceError(error_flag, error_code, index);
}

// ---- Checks ------------------------------------------------------------------------------------

template <typename Index>
__global__ void CheckIndexRangeKernel(const Index* __restrict__ idx, int64_t n, int64_t limit,
                                      int* bad, int* error_flag, int error_code) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t value = idx[i];
    if (value < 0 || value >= limit) Flag(bad, error_flag, error_code, i);
  }
}

template <typename Index>
__global__ void CheckPagedPositionsKernel(const Index* __restrict__ positions, int64_t tokens,
                                          const int32_t* __restrict__ page_table, int64_t pages,
                                          int64_t page_size, int64_t num_pages, int* bad,
                                          int* error_flag, int error_code) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pos = positions[t];
    if (pos < 0 || pos >= pages * page_size) {
      Flag(bad, error_flag, error_code, t);
      continue;
    }
    const int64_t page = page_table[pos / page_size];
    if (page < 0 || page >= num_pages) Flag(bad, error_flag, error_code, t);
  }
}

// One block per mask row.
__global__ void CheckMaskRowsKernel(const uint8_t* __restrict__ mask, int64_t rows, int64_t cols,
                                    int64_t mask_stride, int* bad, int* error_flag,
                                    int error_code) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint8_t* row = mask + r * mask_stride;
    int any = 0;
    for (int64_t c = threadIdx.x; c < cols && !any; c += blockDim.x) any = row[c] != 0;
    const int allowed = __syncthreads_or(any);
    if (!allowed && threadIdx.x == 0) Flag(bad, error_flag, error_code, r);
  }
}

template <typename Index>
cudaError_t CheckIndexRange(const Index* idx, int64_t n, int64_t limit, int* bad, int* error_flag,
                            int error_code, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (idx == nullptr || bad == nullptr || error_flag == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  CheckIndexRangeKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(idx, n, limit, bad,
                                                                       error_flag, error_code);
  return cudaGetLastError();
}

template <typename Index>
cudaError_t CheckPagedPositions(const Index* positions, int64_t tokens, const int32_t* page_table,
                                int64_t pages, int64_t page_size, int64_t num_pages, int* bad,
                                int* error_flag, int error_code, cudaStream_t stream) {
  if (tokens < 0 || pages < 0 || page_size < 1 || num_pages < 0) return cudaErrorInvalidValue;
  if (tokens == 0) return cudaSuccess;
  if (positions == nullptr || (pages > 0 && page_table == nullptr) || bad == nullptr ||
      error_flag == nullptr) {
    return cudaErrorInvalidValue;
  }
  CheckPagedPositionsKernel<<<GridFor(tokens, kThreads), kThreads, 0, stream>>>(
      positions, tokens, page_table, pages, page_size, num_pages, bad, error_flag, error_code);
  return cudaGetLastError();
}

// ---- RoPE --------------------------------------------------------------------------------------

// One thread per (token, head, pair); pair i is (h[i * a_step], h[i * a_step + b_offset]).
template <typename Index>
__global__ void RopeKernel(float* __restrict__ x, int64_t tokens, int64_t heads,
                           int64_t token_stride, int64_t head_stride, int64_t offset, int64_t half,
                           const Index* __restrict__ positions, const float* __restrict__ cos_sin,
                           int64_t table_stride, int64_t a_step, int64_t b_offset,
                           const int* __restrict__ bad) {
  if (*bad != 0) return;
  const int64_t total = tokens * heads * half;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t pair = i % half;
    const int64_t head = i / half;
    const int64_t n = head % heads;
    const int64_t t = head / heads;
    const float* cos = cos_sin + static_cast<int64_t>(positions[t]) * table_stride;
    const float c = cos[pair];
    const float s = cos[half + pair];
    float* h = x + t * token_stride + n * head_stride + offset + pair * a_step;
    const float a = h[0];
    const float b = h[b_offset];
    h[0] = a * c - b * s;
    h[b_offset] = b * c + a * s;
  }
}

template <typename Index>
cudaError_t ApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride,
                      int64_t head_stride, int64_t offset, int64_t rope_dim, const Index* positions,
                      const float* cos_sin, int64_t table_stride, bool adjacent_pairs,
                      const int* bad, cudaStream_t stream) {
  if (tokens < 0 || heads < 0 || offset < 0 || rope_dim < 2 || rope_dim % 2 != 0 ||
      token_stride < 0 || head_stride < 0 || table_stride < 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t half = rope_dim / 2;
  const int64_t total = tokens * heads * half;
  if (total == 0) return cudaSuccess;
  if (x == nullptr || positions == nullptr || cos_sin == nullptr || bad == nullptr) {
    return cudaErrorInvalidValue;
  }
  RopeKernel<<<GridFor(total, kThreads), kThreads, 0, stream>>>(
      x, tokens, heads, token_stride, head_stride, offset, half, positions, cos_sin, table_stride,
      adjacent_pairs ? 2 : 1, adjacent_pairs ? 1 : half, bad);
  return cudaGetLastError();
}

// ---- Paged rows --------------------------------------------------------------------------------

// Cache row of sequence position `pos` (validated by the check kernels).
__device__ inline int64_t SlotOf(int64_t pos, const int32_t* __restrict__ page_table,
                                 int64_t page_size) {
  const int64_t page = NonNegativeDiv(pos, page_size);
  return static_cast<int64_t>(page_table[page]) * page_size + (pos - page * page_size);
}

// Cache elements: f32, or bf16 bit patterns (stored rounded to nearest even, read exactly).
__device__ inline float LoadCached(const float* p) { return *p; }
__device__ inline float LoadCached(const uint16_t* p) {
  return __uint_as_float(static_cast<unsigned>(*p) << 16);
}
__device__ inline void StoreCached(float* p, float v) { *p = v; }
__device__ inline void StoreCached(uint16_t* p, float v) {
  *p = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// One block per token: rows[t] -> its slot (to_cache) or its slot -> rows[t].
template <typename Index, typename Cached>
__global__ void PagedCopyKernel(float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                                const Index* __restrict__ positions,
                                const int32_t* __restrict__ page_table, int64_t page_size,
                                Cached* cache, bool to_cache, const int* __restrict__ bad) {
  if (*bad != 0) return;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    float* row = rows + t * rows_stride;
    Cached* slot = cache + SlotOf(positions[t], page_table, page_size) * width;
    if (to_cache) {
      for (int64_t c = threadIdx.x; c < width; c += blockDim.x) StoreCached(slot + c, row[c]);
    } else {
      for (int64_t c = threadIdx.x; c < width; c += blockDim.x) row[c] = LoadCached(slot + c);
    }
  }
}

template <typename Index, typename Cached>
cudaError_t PagedCopy(float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                      const Index* positions, const int32_t* page_table, int64_t page_size,
                      Cached* cache, bool to_cache, const int* bad, cudaStream_t stream) {
  if (tokens < 0 || width < 0 || rows_stride < 0 || page_size < 1) return cudaErrorInvalidValue;
  if (tokens == 0 || width == 0) return cudaSuccess;
  // page_table may be null when it is empty: the check then fails every token.
  if (rows == nullptr || positions == nullptr || cache == nullptr || bad == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int threads = width >= 256 ? 256 : (width >= 128 ? 128 : 64);
  PagedCopyKernel<<<RowGrid(tokens), threads, 0, stream>>>(rows, rows_stride, tokens, width,
                                                           positions, page_table, page_size, cache,
                                                           to_cache, bad);
  return cudaGetLastError();
}

// ---- Attention ---------------------------------------------------------------------------------
//
// Split kernel. A block owns kBlockRows query rows that read the same keys, and one range of keys
// (its split): either kBlockRows heads of one token (keys shared by every head: the paged latent
// cache, or zero head strides) or kBlockRows tokens of one head. It walks its keys in chunks of 32:
// the chunk's key rows (and, for dense values, value rows) are staged in shared memory; each warp
// owns kRowsPerWarp query rows; for the scores lane c takes key c of the chunk (key rows padded to
// an odd stride, so the 32 lanes hit 32 banks), for the values lane j takes columns j, j + 32, ...
// The running maximum / sum / weighted values are kept per row (online softmax). With one split
// the block writes out; otherwise it writes its partial (max, sum, unnormalized values) and the
// combine kernel merges the splits.

constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = 2;
constexpr int kBlockRows = kWarps * kRowsPerWarp;
constexpr int kChunk = 32;              // keys per staged chunk: one per lane
constexpr int64_t kMinKeysPerSplit = 256;
constexpr int64_t kMaxSplits = 4096;    // the combine kernel keeps one weight per split in smem
constexpr int kCombineThreads = 128;

struct AttendArgs {
  AttentionLaunchParams p;
  bool heads_tiling;       // block rows are heads of one token, else tokens of one head
  int64_t value_tiles;     // grid.z = column blocks * value_tiles; tiles of kChunks * 32 columns
  int64_t splits;          // grid.y
  int64_t keys_per_split;  // a multiple of kChunk
  int qstride;             // floats per staged query row: key_dim rounded up to 4 (float4 reads)
  int kstride;             // floats per staged key row: odd, so the 32 lanes read 32 banks
  int vstride;             // floats per staged value row (dense values only)
  float* partials;
  const int* bad;
};

int QStride(int64_t key_dim) { return static_cast<int>((key_dim + 3) / 4 * 4); }
int KStride(int64_t key_dim) { return static_cast<int>(key_dim % 2 == 0 ? key_dim + 1 : key_dim); }
int64_t TileColumns(int64_t value_dim) { return value_dim <= 128 ? 128 : 512; }

size_t SharedFloats(int64_t key_dim, int64_t value_dim, bool paged) {
  const int64_t vstride = paged ? 0 : std::min(value_dim, TileColumns(value_dim));
  return static_cast<size_t>(kBlockRows * QStride(key_dim) + kChunk * KStride(key_dim) +
                             kChunk * vstride);
}

template <int kChunks>
__global__ void __launch_bounds__(kThreads) AttendSplitKernel(const AttendArgs a) {
  if (*a.bad != 0) return;
  extern __shared__ float4 shared_f4[];
  float* qs = reinterpret_cast<float*>(shared_f4);     // [kBlockRows][qstride]
  float* ks = qs + kBlockRows * a.qstride;             // [kChunk][kstride]
  float* vs = ks + kChunk * a.kstride;                 // [kChunk][vstride] (dense values)
  const AttentionLaunchParams& p = a.p;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;

  const int64_t tile = blockIdx.z % a.value_tiles;
  const int64_t column_block = blockIdx.z / a.value_tiles;
  const int64_t col0 = tile * kChunks * 32;
  const int64_t cols = std::min<int64_t>(p.value_dim - col0, kChunks * 32);
  // Block row r is query (t0 + r * dt, n0 + r * dn).
  const int64_t t0 = a.heads_tiling ? blockIdx.x : blockIdx.x * static_cast<int64_t>(kBlockRows);
  const int64_t n0 = a.heads_tiling ? column_block * kBlockRows : column_block;
  const int64_t dt = a.heads_tiling ? 0 : 1;
  const int64_t dn = a.heads_tiling ? 1 : 0;

  for (int i = threadIdx.x; i < kBlockRows * a.qstride; i += kThreads) {
    const int r = i / a.qstride;
    const int d = i % a.qstride;
    const int64_t t = t0 + r * dt;
    const int64_t n = n0 + r * dn;
    qs[i] = t < p.tokens && n < p.heads && d < p.key_dim
                ? p.q[t * p.q_token_stride + n * p.q_head_stride + d]
                : 0.0f;
  }

  int64_t row_t[kRowsPerWarp], row_n[kRowsPerWarp];
  bool valid[kRowsPerWarp];
  const uint8_t* mask_row[kRowsPerWarp];
#pragma unroll
  for (int h = 0; h < kRowsPerWarp; ++h) {
    const int r = warp * kRowsPerWarp + h;
    row_t[h] = t0 + r * dt;
    row_n[h] = n0 + r * dn;
    valid[h] = row_t[h] < p.tokens && row_n[h] < p.heads;
    mask_row[h] = valid[h] ? p.mask + row_t[h] * p.mask_stride : nullptr;
  }

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kChunks];
#pragma unroll
  for (int h = 0; h < kRowsPerWarp; ++h) {
    m[h] = -CUDART_INF_F;
    l[h] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) acc[h][j] = 0.0f;
  }

  // Key and value rows of this block (the head is n0 for every row that reads dense keys:
  // heads tiling is only chosen when the head strides are zero).
  const float* k_base = p.paged ? nullptr : p.k + n0 * p.k_head_stride;
  const float* v_base = p.paged ? nullptr : p.v + n0 * p.v_head_stride + col0;
  const int64_t s_begin = blockIdx.y * a.keys_per_split;
  const int64_t s_end = std::min(p.keys, s_begin + a.keys_per_split);

  for (int64_t base = s_begin; base < s_end; base += kChunk) {
    const int64_t s = base + lane;
    unsigned bits[kRowsPerWarp];  // bit c: key base + c is allowed for the row
#pragma unroll
    for (int h = 0; h < kRowsPerWarp; ++h) {
      bits[h] = __ballot_sync(kFullMask, valid[h] && s < s_end && mask_row[h][s] != 0);
    }
    unsigned any = 0;
#pragma unroll
    for (int h = 0; h < kRowsPerWarp; ++h) any |= bits[h];
    // Also the barrier after the previous chunk's reads of ks / vs (and the first qs writes).
    if (!__syncthreads_or(any != 0)) continue;

    for (int c = warp; c < kChunk; c += kWarps) {
      const int64_t key = base + c;
      float* k_dst = ks + c * a.kstride;
      float* v_dst = vs + c * a.vstride;
      if (key < s_end) {
        const float* k_src = p.paged ? p.cache + SlotOf(key, p.page_table, p.page_size) * p.key_dim
                                     : k_base + key * p.k_key_stride;
        for (int64_t d = lane; d < p.key_dim; d += 32) k_dst[d] = k_src[d];
        if (!p.paged) {
          const float* v_src = v_base + key * p.v_key_stride;
          for (int64_t e = lane; e < cols; e += 32) v_dst[e] = v_src[e];
        }
      } else {
        for (int64_t d = lane; d < p.key_dim; d += 32) k_dst[d] = 0.0f;
        if (!p.paged) {
          for (int64_t e = lane; e < cols; e += 32) v_dst[e] = 0.0f;
        }
      }
    }
    __syncthreads();
    if (any == 0) continue;  // warp-uniform; the next barrier is the loop's __syncthreads_or

    // Scores: lane c against key c, four partial sums per row for latency.
    float score[kRowsPerWarp];
    {
      const float* k_row = ks + lane * a.kstride;
      float4 sum[kRowsPerWarp];
#pragma unroll
      for (int h = 0; h < kRowsPerWarp; ++h) sum[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      const int key_dim = static_cast<int>(p.key_dim);
      int d = 0;
      for (; d + 4 <= key_dim; d += 4) {
        const float k0 = k_row[d], k1 = k_row[d + 1], k2 = k_row[d + 2], k3 = k_row[d + 3];
#pragma unroll
        for (int h = 0; h < kRowsPerWarp; ++h) {
          const float4 qv =
              *reinterpret_cast<const float4*>(qs + (warp * kRowsPerWarp + h) * a.qstride + d);
          sum[h].x += qv.x * k0;
          sum[h].y += qv.y * k1;
          sum[h].z += qv.z * k2;
          sum[h].w += qv.w * k3;
        }
      }
      for (; d < key_dim; ++d) {
#pragma unroll
        for (int h = 0; h < kRowsPerWarp; ++h) {
          sum[h].x += qs[(warp * kRowsPerWarp + h) * a.qstride + d] * k_row[d];
        }
      }
#pragma unroll
      for (int h = 0; h < kRowsPerWarp; ++h) {
        const float dot = (sum[h].x + sum[h].y) + (sum[h].z + sum[h].w);
        score[h] = (bits[h] >> lane) & 1u ? p.scale * dot : -CUDART_INF_F;
      }
    }

    // Online softmax: rescale what the row has so far to the new maximum.
    float prob[kRowsPerWarp];
#pragma unroll
    for (int h = 0; h < kRowsPerWarp; ++h) {
      prob[h] = 0.0f;
      if (bits[h] == 0) continue;  // warp-uniform
      const float new_max = fmaxf(m[h], WarpMax(score[h]));
      const float alpha = expf(m[h] - new_max);  // 0 on the row's first allowed chunk
      prob[h] = (bits[h] >> lane) & 1u ? expf(score[h] - new_max) : 0.0f;
      l[h] = l[h] * alpha + WarpSum(prob[h]);
#pragma unroll
      for (int j = 0; j < kChunks; ++j) acc[h][j] *= alpha;
      m[h] = new_max;
    }
    // Weighted values; a key a row does not allow is never read for it (as on the CPU).
    for (unsigned rest = any; rest != 0; rest &= rest - 1) {
      const int c = __ffs(static_cast<int>(rest)) - 1;
      float pc[kRowsPerWarp];
#pragma unroll
      for (int h = 0; h < kRowsPerWarp; ++h) pc[h] = __shfl_sync(kFullMask, prob[h], c);
      const float* v_row = p.paged ? ks + c * a.kstride + col0 : vs + c * a.vstride;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int e = lane + 32 * j;
        if (e < cols) {
          const float value = v_row[e];
#pragma unroll
          for (int h = 0; h < kRowsPerWarp; ++h) {
            if (pc[h] != 0.0f) acc[h][j] += pc[h] * value;
          }
        }
      }
    }
  }

#pragma unroll
  for (int h = 0; h < kRowsPerWarp; ++h) {
    if (!valid[h]) continue;
    if (a.splits == 1) {
      // Every key is in this block and the row allows one (checked), so l > 0.
      const float inv = 1.0f / l[h];
      float* o = p.out + row_t[h] * p.out_token_stride + row_n[h] * p.out_head_stride + col0;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int e = lane + 32 * j;
        if (e < cols) o[e] = acc[h][j] * inv;
      }
    } else {
      const int64_t rows = p.tokens * p.heads;
      const int64_t entry = (row_t[h] * p.heads + row_n[h]) * a.splits + blockIdx.y;
      float* partial = a.partials + entry * p.value_dim + col0;
#pragma unroll
      for (int j = 0; j < kChunks; ++j) {
        const int e = lane + 32 * j;
        if (e < cols) partial[e] = acc[h][j];
      }
      if (tile == 0 && lane == 0) {
        float* max_sum = a.partials + rows * a.splits * p.value_dim + 2 * entry;
        max_sum[0] = m[h];
        max_sum[1] = l[h];
      }
    }
  }
}

// One block per query row (t, n): out = sum_i w_i acc_i / sum_i w_i l_i, w_i = exp(m_i - max m).
// A split whose keys the row masks entirely has m = -inf, l = 0 and weight 0.
__global__ void __launch_bounds__(kCombineThreads) AttendCombineKernel(const AttendArgs a) {
  if (*a.bad != 0) return;
  extern __shared__ float weight[];  // [splits]
  const AttentionLaunchParams& p = a.p;
  const int64_t rows = p.tokens * p.heads;
  const int64_t splits = a.splits;
  const float* max_sum_base = a.partials + rows * splits * p.value_dim;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* max_sum = max_sum_base + 2 * row * splits;
    float row_max = -CUDART_INF_F;
    for (int64_t i = 0; i < splits; ++i) row_max = fmaxf(row_max, max_sum[2 * i]);
    __syncthreads();  // the previous row's readers of weight are done
    for (int64_t i = threadIdx.x; i < splits; i += blockDim.x) {
      const float m = max_sum[2 * i];
      weight[i] = m == -CUDART_INF_F ? 0.0f : expf(m - row_max);
    }
    __syncthreads();
    float sum = 0.0f;
    for (int64_t i = 0; i < splits; ++i) sum += max_sum[2 * i + 1] * weight[i];
    const float inv = 1.0f / sum;
    const int64_t t = row / p.heads;
    const int64_t n = row % p.heads;
    float* o = p.out + t * p.out_token_stride + n * p.out_head_stride;
    const float* partial = a.partials + row * splits * p.value_dim;
    for (int64_t e = threadIdx.x; e < p.value_dim; e += blockDim.x) {
      float value = 0.0f;
      for (int64_t i = 0; i < splits; ++i) value += partial[i * p.value_dim + e] * weight[i];
      o[e] = value * inv;
    }
  }
}

// Sizes and strides; the pointers that the call reads (tokens * heads > 0, value_dim > 0).
bool ValidParams(const AttentionLaunchParams& p) {
  if (p.tokens < 0 || p.heads < 0 || p.keys < 0 || p.key_dim < 0 || p.value_dim < 0 ||
      p.key_dim > (int64_t{1} << 20)) {
    return false;
  }
  if (p.q_token_stride < 0 || p.q_head_stride < 0 || p.mask_stride < 0 ||
      p.out_token_stride < 0 || p.out_head_stride < 0 || p.k_key_stride < 0 ||
      p.k_head_stride < 0 || p.v_key_stride < 0 || p.v_head_stride < 0) {
    return false;
  }
  if (p.paged && (p.page_size < 1 || p.value_dim > p.key_dim)) return false;
  if (p.tokens * p.heads == 0 || p.value_dim == 0) return true;  // nothing to launch
  if (p.out == nullptr || (p.key_dim > 0 && p.q == nullptr)) return false;
  if (p.keys == 0) return true;
  if (p.mask == nullptr) return false;
  return p.paged ? p.cache != nullptr && p.page_table != nullptr
                 : p.k != nullptr && p.v != nullptr;
}

template <int kChunks>
cudaError_t LaunchSplit(const AttendArgs& a, dim3 grid, size_t shared_bytes, cudaStream_t stream) {
  if (shared_bytes > 48 * 1024) {
    const cudaError_t error = cudaFuncSetAttribute(
        AttendSplitKernel<kChunks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(shared_bytes));
    if (error != cudaSuccess) return error;
  }
  AttendSplitKernel<kChunks><<<grid, kThreads, shared_bytes, stream>>>(a);
  return cudaGetLastError();
}


// ---- Paged latent attention, fast path ---------------------------------------------------------
//
// Why a kernel of its own: the split kernel above copies each key row with a scalar loop of
// dependent global loads after a page-table load, with nothing in flight during the compute, so a
// block's 256 keys cost dozens of memory latencies (the ~260 us per call measured in
// benchmarks/RESULTS.md). Here a block (256 threads, one per SM: the staging takes ~190 KiB)
// double-buffers 32-key chunks with cp.async: chunk i + 1 is in flight while chunk i is computed,
// and its page entries and mask bytes were loaded into registers one chunk earlier still. Compute
// is register-blocked: scores as a [rows x 32] tile, each thread 4 keys x kRT rows over an
// eighth of the dims (float4 shared reads, conflict-free), summed with shuffles; values with each
// thread owning kRT rows x 8 columns of the output for the whole key range.
//
// Arithmetic note (fp32 CUDA cores): at 16 heads a latent row costs 16 * (576 + 512) FMAs per
// 2304 bytes, about what the H200's 67 TFLOP/s fp32 can do at its 4.2 TB/s copy rate, so this
// kernel is bounded by FMA issue at 16 heads (expect ~0.6 of the byte floor) and by bandwidth at
// 8 heads; going further needs tensor cores (3xTF32 for fp32 accuracy, or a bf16 cache).

constexpr int kLatentThreads = 256;
constexpr int kLatentWarps = kLatentThreads / 32;
constexpr int kLatentChunk = 32;
constexpr int kLatentTileColumns = 512;  // value columns per block: 64 column groups x 2 float4
constexpr int kLatentMaxRows = 16;
constexpr int kScoreStride = kLatentChunk + 1;

__device__ const uint8_t kMaskConstants[2] = {0, 1};

struct LatentArgs {
  LatentLaunchParams p;
  const int32_t* tile_table;  // [batch + 1]: first token tile of each sequence; nullptr: one sequence
  // 32-bit: the kernels divide block rows by H per staged element, and a 64-bit division is a
  // long subroutine.
  int heads_per_tile;         // H: query rows of a block are G tokens x H heads
  int tokens_per_tile;        // G
  int64_t value_tiles;
  int64_t splits;
  int wp;                     // f32: floats per staged row, key_dim rounded up to 32 (zero
                              // padded); bf16: elements per staged row, key_dim rounded up to 64,
                              // + 8 (MmaRowStride)
  bool vec;                   // 16-byte cp.async
  float* partials;
  const int* bad;
};

int LatentRowStride(int64_t key_dim) { return static_cast<int>((key_dim + 31) / 32 * 32); }

size_t LatentSharedFloats(int64_t key_dim) {
  const int64_t wp = LatentRowStride(key_dim);
  return static_cast<size_t>(kLatentMaxRows * wp + 2 * kLatentChunk * wp +
                             kLatentMaxRows * kScoreStride + kLatentChunk * kLatentMaxRows +
                             2 * kLatentMaxRows + kLatentMaxRows);
}

__device__ inline void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ inline void CpAsync4(float* smem, const float* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ inline void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ inline void CpAsyncWaitAllButOne() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

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
// whole chunks. The host sizes a.splits for max_kv_len (the cache capacity a captured graph must
// cover), so the split length follows each sequence's real length on the device: a 1K-key sequence
// in a 4K-capacity cache uses every split, not the first quarter of them (with the host's
// split length it ran all its keys in one block per row tile: the V2 TP8 decode step at batch 32
// took 56 ms at capacity 4224 vs 37 ms at 1152, same 1K context). Never above the host's split
// length for max_kv_len, so a.splits splits cover every sequence.
__device__ inline int64_t LatentSplitKeys(const LatentArgs& a, int64_t kv) {
  const int64_t per = (kv + a.splits - 1) / a.splits;
  return std::max<int64_t>(kLatentChunk, (per + kLatentChunk - 1) / kLatentChunk * kLatentChunk);
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

// Fills count elements of shared memory, element i = value(i) stored by store(i, v), i = tid,
// tid + threads, ...: the loads of kStageBatch elements are issued before their stores. A plain
// loop of load-then-store through a generic pointer waits one memory latency per element (the
// compiler cannot prove the load does not alias the shared store): ~36 latencies, tens of
// microseconds, for a block's 16 query rows of 576 before its first key (ncu, H200).
constexpr int kStageBatch = 16;
template <typename Value, typename Store>
__device__ inline void StageBatched(int count, int tid, int threads, Value&& value, Store&& store) {
  for (int base = tid; base < count; base += threads * kStageBatch) {
    float v[kStageBatch];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int i = base + u * threads;
      v[u] = i < count ? value(i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int i = base + u * threads;
      if (i < count) store(i, v[u]);
    }
  }
}

// Whether block row r (token i0 + r / H of the tile, head n0 + r % H, H = heads_per_tile) is a query
// row the tile holds.
__device__ inline bool LatentRowHeld(const LatentArgs& a, int64_t n0, int64_t tile_tokens, int r) {
  const int heads = a.heads_per_tile;
  return r < heads * a.tokens_per_tile && r / heads < tile_tokens && n0 + r % heads < a.p.heads;
}

// Stages a block's query rows, rows x stride elements (0 for rows the tile does not hold, see
// LatentRowHeld, and for dims >= key_dim), through store(i, value).
template <typename Store>
__device__ inline void StageLatentQueries(const LatentArgs& a, const LatentTile& tile, int64_t n0,
                                          int64_t tile_tokens, int rows, int stride, int threads,
                                          Store&& store) {
  const LatentLaunchParams& p = a.p;
  const int heads = a.heads_per_tile;
  StageBatched(
      rows * stride, static_cast<int>(threadIdx.x), threads,
      [&](int i) {
        const int r = i / stride;
        const int d = i % stride;
        if (d >= p.key_dim || !LatentRowHeld(a, n0, tile_tokens, r)) return 0.0f;
        const int64_t t = tile.q0 + tile.i0 + r / heads;
        const int64_t n = n0 + r % heads;
        return p.q[t * p.q_token_stride + n * p.q_head_stride + d];
      },
      store);
}

template <int kRT>
__global__ void __launch_bounds__(kLatentThreads, 1) LatentKernel(const LatentArgs a) {
  if (*a.bad != 0) return;
  constexpr int kRows = 4 * kRT;
  const LatentLaunchParams& p = a.p;
  LatentTile tile;
  if (!FindLatentTile(a, blockIdx.x, &tile)) return;
  const int64_t split_keys = LatentSplitKeys(a, tile.kv);
  const int64_t s_begin = static_cast<int64_t>(blockIdx.y) * split_keys;
  const int64_t s_end = std::min(tile.kv, s_begin + split_keys);
  if (s_begin >= s_end) return;  // the combine reads only the splits that hold keys
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
  StageLatentQueries(a, tile, n0, tile_tokens, kRows, wp, kLatentThreads,
                     [&](int i, float v) { qs[i] = v; });
  // Pad columns are never copied: zero them once in both stages (pad x 0 must not be NaN).
  const int pad = wp - key_dim;
  for (int i = tid; i < 2 * kLatentChunk * pad; i += kLatentThreads) {
    ks[(i / pad) * wp + key_dim + i % pad] = 0.0f;
  }

  // The byte that says whether tile token lt allows key s (a pointer, so the load can be issued a
  // chunk ahead and read a chunk later).
  auto allow_byte = [&](int64_t lt, int64_t s) -> const uint8_t* {
    if (lt >= tile_tokens || s >= s_end) return &kMaskConstants[0];
    const int64_t i = tile.i0 + lt;
    if (p.mask != nullptr) return p.mask + (tile.q0 + i) * p.mask_stride + s;
    if (s < prefix) return &kMaskConstants[1];
    const int64_t j = s - prefix;
    if (p.tree_mask != nullptr) return p.tree_mask + (tile.q0 + i) * p.tree_mask_stride + j;
    return &kMaskConstants[j <= i ? 1 : 0];
  };
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
      const float* src =
          p.cache + (static_cast<int64_t>(page[k]) * p.page_size +
                     (s - NonNegativeDiv(s, p.page_size) * p.page_size)) *
                        p.key_dim;
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
    CpAsyncWaitAllButOne();
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
    float* dst;
    float factor = 1.0f;
    if (a.splits == 1) {
      // Every key of the sequence is in this block and the row allows one (checked): l > 0.
      dst = p.out + t * p.out_token_stride + n * p.out_head_stride + col0;
      factor = 1.0f / row_l[row];
    } else {
      const int64_t entry = (t * p.heads + n) * a.splits + blockIdx.y;
      dst = a.partials + entry * p.value_dim + col0;
      if (blockIdx.z % a.value_tiles == 0 && warp % 2 == 0 && lane == 0) {
        float* max_sum = a.partials + p.tokens * p.heads * a.splits * p.value_dim + 2 * entry;
        max_sum[0] = row_a[row];
        max_sum[1] = row_l[row];
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t col = pv_col + (e / 4) * 256 + e % 4;
      if (col0 + col < p.value_dim) dst[col] = values[e] * factor;
    }
  }
}

// ---- Paged latent attention over a bf16 cache: tensor cores -------------------------------------
//
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32. Fragment layouts (PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type"); lane = 4 g + t (g = groupID = lane / 4,
// t = threadID_in_group = lane % 4); a register holds two bf16, the lower index in the low half:
//   A (16 x 16, row):  a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]
//                      a2 = A[g][2t+8, 2t+9] a3 = A[g+8][2t+8, 2t+9]
//   B (16 x 8, col):   b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
//   C, D (16 x 8, f32): c0, c1 = C[g][2t, 2t+1]   c2, c3 = C[g+8][2t, 2t+1]
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8j .. 8j+7 give the row addresses (16
// bytes each) of 8x8 matrix j; register j of lane l gets matrix j's row l / 4, elements 2 (l % 4),
// 2 (l % 4) + 1 (.trans: elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4)). Hence:
//   A from row-major X[m][k] at k0: matrix j = rows 8 (j % 2) + 0..7, columns k0 + 8 (j / 2) + 0..7
//     gives a0, a1, a2, a3 (matrix 0 = rows 0-7 x cols 0-7 = a0, 1 = rows 8-15 = a1, ...);
//   B = K^T from key rows K[n][k] (no .trans) at (n0, k0): matrix j = keys n0 + 8 (j / 2) + 0..7,
//     dims k0 + 8 (j % 2) + 0..7 gives b0, b1 of n-tile n0, then b0, b1 of n-tile n0 + 8;
//   B = V from key rows V[k][n] (.trans) at (k0, n0): matrix j = keys k0 + 8 (j % 2) + 0..7,
//     columns n0 + 8 (j / 2) + 0..7 gives b0, b1 of n-tile n0, then b0, b1 of n-tile n0 + 8.
//
// A block is 8 warps, 16 kGroups query rows (G tokens x H heads, as LatentKernel; kGroups = 1 or
// 4 row groups of 16) and one split of the keys, walked in 32-key chunks that cp.async stages
// MmaStages(kGroups) - 1 chunks ahead (page entries one chunk earlier still, mask bytes one chunk
// ahead). Scores: warp w takes keys 16 (w / 4) .. + 15 (two n-tiles); with one row group it takes
// dim quarter w % 4, whose q fragments stay in registers, and the four partial tiles meet in shared
// memory; with four it takes row group w % 4 over every dim, loading q and key fragments from
// shared memory a k-step at a time. Softmax: 256 / rows threads per row, fp32, online. Values: warp w owns row
// group w % kGroups and output columns col0 + 64 kGroups (w / kGroups) .. + 64 kGroups - 1,
// A = the probabilities in bf16; B registers of keys no row allows are zeroed (such rows may be
// stale or garbage). Staged rows are padded by 16 bytes (row stride = 4 banks mod 32): ldmatrix is
// conflict-free.
//
// Why 64 rows: a block reads every key of its split once per chunk, whatever its row count, so a
// sequence of R query rows reads its keys R / rows times (from L2 at best). Tree verify at 16 heads
// x 64 tokens is 1024 rows: with 16-row blocks the key stream was re-read 64 times and the chunk's
// barrier chain ran 64 times per key (32 x 4K x 64 tokens: 7.3 ms, 40 TFLOP/s, 2026-12-01g; 4.0 ms
// with 64-row blocks, which lose below 2048 rows: kMmaWideMinRows).

constexpr int kMmaThreads = 256;
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kMmaMaxKSteps = static_cast<int>(kLatentMaxKeyDim / 64);  // per dim quarter
constexpr int kRedStride = 36;  // floats per partial score row (float2 / float4 aligned)
constexpr int kPStride = 40;    // bf16 per probability row (80 bytes: conflict-free ldmatrix)
static_assert(kLatentMaxKeyDim % 64 == 0, "the dim quarters hold whole k-steps");

// Chunks in flight: four for 16-row blocks; three for 64-row blocks (their queries take 48 KiB more
// shared memory at key_dim 576).
__host__ __device__ constexpr int MmaStages(int groups) { return groups == 1 ? 4 : 3; }

int MmaRowStride(int64_t key_dim) { return static_cast<int>((key_dim + 63) / 64 * 64 + 8); }

// Shared memory of a block of 16 x groups rows: queries, staged chunks, partial scores (64 rows x
// kRedStride in either layout: 4 quarters x 16 rows or 1 x 64), probabilities, per-row state.
size_t MmaSharedBytes(int64_t key_dim, int groups) {
  const size_t rs = static_cast<size_t>(MmaRowStride(key_dim));
  const size_t rows = static_cast<size_t>(16 * groups);
  return 2 * rs * (rows + MmaStages(groups) * kLatentChunk) + 4 * (64 * kRedStride) +
         2 * (rows * kPStride) + 4 * (3 * rows + kMmaWarps);
}

// The largest dynamic shared memory a block may opt into on sm_90 (227 KiB): 64-row blocks run only
// where they fit it (key_dim <= 640; DeepSeek's 576 takes 197 KiB).
constexpr size_t kMmaWideSharedLimit = 227 * 1024;

template <int kPending>
__device__ inline void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ inline void LdMatrixX4(unsigned (&r)[4], const uint16_t* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

__device__ inline void LdMatrixX4Trans(unsigned (&r)[4], const uint16_t* smem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

__device__ inline uint16_t Bf16Bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// Keeps the bf16 halves of a B register whose keys (key, key + 1) are set in `used`.
__device__ inline unsigned PairMask(unsigned used, int key) {
  return (((used >> key) & 1u) != 0 ? 0x0000ffffu : 0u) |
         (((used >> (key + 1)) & 1u) != 0 ? 0xffff0000u : 0u);
}

template <int kGroups>
__global__ void __launch_bounds__(kMmaThreads, 1) LatentMmaKernel(const LatentArgs a) {
  static_assert(kGroups == 1 || kGroups == 4, "16 or 64 rows");
  constexpr int kRows = 16 * kGroups;
  constexpr int kStages = MmaStages(kGroups);
  constexpr int kQuarters = 4 / kGroups;   // dim quarters of the score role
  constexpr int kRowThreads = 256 / kRows;  // softmax threads per row: 16 or 4
  constexpr int kRowKeys = kLatentChunk / kRowThreads;  // keys per softmax thread: 2 or 8
  constexpr int kValueTiles = 8 * kGroups;  // n-tiles of 8 columns per warp: 64 or 256 columns
  if (*a.bad != 0) return;
  const LatentLaunchParams& p = a.p;
  LatentTile tile;
  if (!FindLatentTile(a, blockIdx.x, &tile)) return;
  const int64_t split_keys = LatentSplitKeys(a, tile.kv);
  const int64_t s_begin = static_cast<int64_t>(blockIdx.y) * split_keys;
  const int64_t s_end = std::min(tile.kv, s_begin + split_keys);
  if (s_begin >= s_end) return;  // the combine reads only the splits that hold keys
  const int64_t col0 = (blockIdx.z % a.value_tiles) * kLatentTileColumns;
  const int heads_per_tile = a.heads_per_tile;
  const int64_t n0 = (blockIdx.z / a.value_tiles) * heads_per_tile;
  const int64_t tile_tokens = std::min<int64_t>(a.tokens_per_tile, tile.n - tile.i0);
  const int64_t prefix = tile.kv - tile.n;
  const int key_dim = static_cast<int>(p.key_dim);
  const int rs = a.wp;            // staged row stride: key_dim rounded up to 64, + 8
  const int nks = (rs - 8) / 64;  // k-steps per dim quarter

  extern __shared__ float4 mma_shared[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(mma_shared);          // [kRows][rs]
  uint16_t* ks = qs + kRows * rs;                                   // [kStages][32][rs]
  float* red = reinterpret_cast<float*>(ks + kStages * kLatentChunk * rs);  // [kQuarters][kRows][36]
  uint16_t* ps = reinterpret_cast<uint16_t*>(red + 64 * kRedStride);        // [kRows][40]
  float* row_alpha = reinterpret_cast<float*>(ps + kRows * kPStride);       // [kRows]
  float* row_m = row_alpha + kRows;                                         // [kRows]
  float* row_l = row_m + kRows;                                             // [kRows]
  unsigned* used_by_warp = reinterpret_cast<unsigned*>(row_l + kRows);      // [8]

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int mat = lane / 8;  // the ldmatrix matrix this lane addresses
  const int mrow = lane % 8;

  // Block row r is token i0 + r / H of the sequence, head n0 + r % H.
  auto row_valid = [&](int r) { return LatentRowHeld(a, n0, tile_tokens, r); };
  StageLatentQueries(a, tile, n0, tile_tokens, kRows, rs, kMmaThreads,
                     [&](int i, float v) { qs[i] = Bf16Bits(v); });
  // Pad dims are never copied: zero them once in every stage (pad x 0 must not be NaN).
  const int pad = rs - 8 - key_dim;
  for (int i = tid; i < kStages * kLatentChunk * pad; i += kMmaThreads) {
    ks[(i / pad) * rs + key_dim + i % pad] = 0;
  }

  auto allow_byte = [&](int64_t lt, int64_t s) -> const uint8_t* {
    if (lt >= tile_tokens || s >= s_end) return &kMaskConstants[0];
    const int64_t i = tile.i0 + lt;
    if (p.mask != nullptr) return p.mask + (tile.q0 + i) * p.mask_stride + s;
    if (s < prefix) return &kMaskConstants[1];
    const int64_t j = s - prefix;
    if (p.tree_mask != nullptr) return p.tree_mask + (tile.q0 + i) * p.tree_mask_stride + j;
    return &kMaskConstants[j <= i ? 1 : 0];
  };
  // Warp w copies keys w, w + 8, w + 16, w + 24 of a chunk.
  auto load_pages = [&](int64_t base, int32_t (&page)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t s = base + warp + kMmaWarps * k;
      page[k] = s < s_end ? tile.pages[NonNegativeDiv(s, p.page_size)] : 0;
    }
  };
  auto issue = [&](int64_t base, int stage, const int32_t (&page)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int key = warp + kMmaWarps * k;
      const int64_t s = base + key;
      if (s >= s_end) continue;
      const uint16_t* src =
          p.cache_bf16 + (static_cast<int64_t>(page[k]) * p.page_size +
                          (s - NonNegativeDiv(s, p.page_size) * p.page_size)) *
                             key_dim;
      uint16_t* dst = ks + (stage * kLatentChunk + key) * rs;
      if (a.vec) {
        for (int e = lane * 8; e < key_dim; e += 256) CpAsync16(dst + e, src + e);
      } else {
        for (int e = lane; e < key_dim; e += 32) dst[e] = src[e];
      }
    }
  };

  const int64_t chunks = (s_end - s_begin + kLatentChunk - 1) / kLatentChunk;
  int32_t page[4];
  {
    int32_t first[kStages - 1][4];
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) load_pages(s_begin + st * kLatentChunk, first[st]);
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < chunks) issue(s_begin + st * kLatentChunk, st, first[st]);
      CpAsyncCommit();
    }
  }
  load_pages(s_begin + (kStages - 1) * kLatentChunk, page);

  // Softmax role: row sr, keys sk .. sk + kRowKeys - 1 of each chunk; the row's running max, sum.
  const int sr = tid / kRowThreads;
  const int sk = kRowKeys * (tid % kRowThreads);
  const bool sr_valid = row_valid(sr);
  const int64_t sr_token = sr / heads_per_tile;
  float m_run = -CUDART_INF_F, l_run = 0.0f;
  uint8_t mask_next[kRowKeys];
#pragma unroll
  for (int k = 0; k < kRowKeys; ++k) mask_next[k] = *allow_byte(sr_token, s_begin + sk + k);

  __syncthreads();  // qs staged
  // Score role: keys 16 key_half .. + 15 of row group sg, over dim quarter `quarter` (one row
  // group) or every dim (four).
  const int quarter = (warp % 4) % kQuarters;
  const int sg = (warp % 4) / kQuarters;
  const int key_half = warp / 4;
  const uint16_t* q_rows = qs + (sg * 16 + (mat % 2) * 8 + mrow) * rs + (mat / 2) * 8;
  unsigned qa[kGroups == 1 ? kMmaMaxKSteps : 1][4];  // one group: its quarter's q fragments
  if constexpr (kGroups == 1) {
#pragma unroll
    for (int i = 0; i < kMmaMaxKSteps; ++i) {
      if (i < nks) {
        LdMatrixX4(qa[i], q_rows + (quarter * nks + i) * 16);
      } else {
        qa[i][0] = qa[i][1] = qa[i][2] = qa[i][3] = 0u;
      }
    }
  }

  // Value role: row group vg, columns vcol .. + 8 kValueTiles - 1.
  const int vg = warp % kGroups;
  const int64_t vcol = col0 + 8 * kValueTiles * (warp / kGroups);
  float o[kValueTiles][4];
#pragma unroll
  for (int j = 0; j < kValueTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t base = s_begin + c * kLatentChunk;
    const uint16_t* kst = ks + static_cast<int>(c % kStages) * kLatentChunk * rs;
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // chunk c staged by every thread; iteration c - 1 is done with its stage
    if (c + kStages - 1 < chunks) {
      issue(base + (kStages - 1) * kLatentChunk, static_cast<int>((c + kStages - 1) % kStages), page);
    }
    CpAsyncCommit();
    if (c + kStages < chunks) load_pages(base + kStages * kLatentChunk, page);
    uint8_t mask_now[kRowKeys];
#pragma unroll
    for (int k = 0; k < kRowKeys; ++k) mask_now[k] = mask_next[k];
    if (c + 1 < chunks) {
#pragma unroll
      for (int k = 0; k < kRowKeys; ++k) mask_next[k] = *allow_byte(sr_token, base + kLatentChunk + sk + k);
    }

    // Scores of this warp's 16 rows x 16 keys (partial over its quarter with one row group).
    {
      float sacc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      const uint16_t* k_rows = kst + (key_half * 16 + (mat / 2) * 8 + mrow) * rs + (mat % 2) * 8;
      if constexpr (kGroups == 1) {
        unsigned kb[kMmaMaxKSteps][4];
#pragma unroll
        for (int i = 0; i < kMmaMaxKSteps; ++i) {
          if (i < nks) LdMatrixX4(kb[i], k_rows + (quarter * nks + i) * 16);
        }
#pragma unroll
        for (int i = 0; i < kMmaMaxKSteps; ++i) {
          if (i < nks) {
            MmaBf16(sacc[0], qa[i], kb[i][0], kb[i][1]);
            MmaBf16(sacc[1], qa[i], kb[i][2], kb[i][3]);
          }
        }
      } else {
        // Every dim: q and key fragments a k-step at a time (the 64-row block's 128 accumulator
        // registers leave no room for a quarter's fragments).
#pragma unroll 4
        for (int i = 0; i < 4 * nks; ++i) {
          unsigned qf[4], kf[4];
          LdMatrixX4(qf, q_rows + i * 16);
          LdMatrixX4(kf, k_rows + i * 16);
          MmaBf16(sacc[0], qf, kf[0], kf[1]);
          MmaBf16(sacc[1], qf, kf[2], kf[3]);
        }
      }
      float* part = red + (quarter * kRows + sg * 16) * kRedStride;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = key_half * 16 + nt * 8 + 2 * t4;
        *reinterpret_cast<float2*>(part + g * kRedStride + key) = make_float2(sacc[nt][0], sacc[nt][1]);
        *reinterpret_cast<float2*>(part + (g + 8) * kRedStride + key) =
            make_float2(sacc[nt][2], sacc[nt][3]);
      }
    }
    __syncthreads();  // partial scores written

    // Online softmax over the kRowThreads lanes of row sr.
    {
      float sc[kRowKeys];
#pragma unroll
      for (int k = 0; k < kRowKeys; k += 2) {
        float2 dot = make_float2(0.0f, 0.0f);
#pragma unroll
        for (int q4 = 0; q4 < kQuarters; ++q4) {
          const float2 v = *reinterpret_cast<const float2*>(red + (q4 * kRows + sr) * kRedStride + sk + k);
          dot.x += v.x;
          dot.y += v.y;
        }
        sc[k] = dot.x;
        sc[k + 1] = dot.y;
      }
      unsigned bits = 0;
      float chunk_max = -CUDART_INF_F;
#pragma unroll
      for (int k = 0; k < kRowKeys; ++k) {
        const bool allow = sr_valid && mask_now[k] != 0;
        sc[k] = allow ? p.scale * sc[k] : -CUDART_INF_F;
        bits |= allow ? 1u << (sk + k) : 0u;
        chunk_max = fmaxf(chunk_max, sc[k]);
      }
#pragma unroll
      for (int offset = kRowThreads / 2; offset >= 1; offset >>= 1) {
        chunk_max = fmaxf(chunk_max, __shfl_xor_sync(kFullMask, chunk_max, offset));
      }
      const float new_max = fmaxf(m_run, chunk_max);
      float alpha = 1.0f, psum = 0.0f;  // no allowed key yet: m = -inf, l = 0 stay
#pragma unroll
      for (int k = 0; k < kRowKeys; ++k) {
        sc[k] = new_max != -CUDART_INF_F ? expf(sc[k] - new_max) : 0.0f;
        psum += sc[k];
      }
      if (new_max != -CUDART_INF_F) alpha = expf(m_run - new_max);
#pragma unroll
      for (int offset = kRowThreads / 2; offset >= 1; offset >>= 1) {
        psum += __shfl_xor_sync(kFullMask, psum, offset);
      }
      l_run = l_run * alpha + psum;
      m_run = new_max;
#pragma unroll
      for (int k = 0; k < kRowKeys; k += 2) {
        *reinterpret_cast<__nv_bfloat162*>(ps + sr * kPStride + sk + k) = __floats2bfloat162_rn(sc[k], sc[k + 1]);
      }
      if (sk == 0) row_alpha[sr] = alpha;
      const unsigned warp_bits = __reduce_or_sync(kFullMask, bits);
      if (lane == 0) used_by_warp[warp] = warp_bits;
    }
    __syncthreads();  // probabilities, alpha and used bits written

    unsigned used = 0;  // keys of the chunk that some row allows (block-uniform)
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) used |= used_by_warp[w];
    if (used == 0) continue;  // every alpha is 1
    const float alpha_lo = row_alpha[vg * 16 + g], alpha_hi = row_alpha[vg * 16 + g + 8];
#pragma unroll
    for (int j = 0; j < kValueTiles; ++j) {
      o[j][0] *= alpha_lo;
      o[j][1] *= alpha_lo;
      o[j][2] *= alpha_hi;
      o[j][3] *= alpha_hi;
    }
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      unsigned pa[4];
      LdMatrixX4(pa, ps + (vg * 16 + (mat % 2) * 8 + mrow) * kPStride + 16 * kk + (mat / 2) * 8);
      const unsigned keep0 = PairMask(used, 16 * kk + 2 * t4);
      const unsigned keep1 = PairMask(used, 16 * kk + 8 + 2 * t4);
      const uint16_t* v_rows = kst + (16 * kk + (mat % 2) * 8 + mrow) * rs + (mat / 2) * 8;
#pragma unroll
      for (int jj = 0; jj < kValueTiles / 2; ++jj) {
        const int64_t cb = vcol + 16 * jj;
        if (cb >= p.value_dim) continue;  // warp-uniform; cb + 16 <= the staged width
        unsigned vb[4];
        LdMatrixX4Trans(vb, v_rows + cb);
        MmaBf16(o[2 * jj], pa, vb[0] & keep0, vb[1] & keep1);
        MmaBf16(o[2 * jj + 1], pa, vb[2] & keep0, vb[3] & keep1);
      }
    }
  }
  CpAsyncWait<0>();

  if (sk == 0) {
    row_m[sr] = m_run;
    row_l[sr] = l_run;
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = vg * 16 + g + 8 * half;
    if (!row_valid(row)) continue;
    const int64_t t = tile.q0 + tile.i0 + row / heads_per_tile;
    const int64_t n = n0 + row % heads_per_tile;
    float* dst;
    float factor = 1.0f;
    if (a.splits == 1) {
      // Every key of the sequence is in this block and the row allows one (checked): l > 0.
      dst = p.out + t * p.out_token_stride + n * p.out_head_stride;
      factor = 1.0f / row_l[row];
    } else {
      const int64_t entry = (t * p.heads + n) * a.splits + blockIdx.y;
      dst = a.partials + entry * p.value_dim;
      if (blockIdx.z % a.value_tiles == 0 && warp / kGroups == 0 && t4 == 0) {
        float* max_sum = a.partials + p.tokens * p.heads * a.splits * p.value_dim + 2 * entry;
        max_sum[0] = row_m[row];
        max_sum[1] = row_l[row];
      }
    }
#pragma unroll
    for (int j = 0; j < kValueTiles; ++j) {
      const int64_t col = vcol + 8 * j + 2 * t4;
      if (col < p.value_dim) dst[col] = o[j][2 * half] * factor;
      if (col + 1 < p.value_dim) dst[col + 1] = o[j][2 * half + 1] * factor;
    }
  }
}

// One block per (query row, 128 value columns): out = sum_i w_i acc_i / sum_i w_i l_i over the
// splits that hold keys of the row's sequence, w_i = exp(m_i - max m) (0 for m_i = -inf).
__global__ void __launch_bounds__(kLatentThreads) LatentCombineKernel(const LatentArgs a) {
  if (*a.bad != 0) return;
  __shared__ float4 part_sums[kLatentWarps][32];
  const LatentLaunchParams& p = a.p;
  const int64_t row = blockIdx.x;
  const int64_t t = row / p.heads;
  const int64_t n = row % p.heads;
  int64_t kv = p.max_kv_len;
  if (p.q_start != nullptr) kv = p.kv_len[LastNotAbove(p.q_start, p.batch, t)];
  const int64_t split_keys = LatentSplitKeys(a, kv);
  const int64_t splits = std::min(a.splits, (kv + split_keys - 1) / split_keys);
  const float* max_sum = a.partials + p.tokens * p.heads * a.splits * p.value_dim + 2 * row * a.splits;
  const int tid = static_cast<int>(threadIdx.x);
  float row_max = -CUDART_INF_F;
  for (int64_t i = tid; i < splits; i += kLatentThreads) row_max = fmaxf(row_max, max_sum[2 * i]);
  row_max = BlockMax(row_max);
  float denominator = 0.0f;
  for (int64_t i = tid; i < splits; i += kLatentThreads) {
    const float mi = max_sum[2 * i];
    if (mi != -CUDART_INF_F) denominator += max_sum[2 * i + 1] * expf(mi - row_max);
  }
  denominator = BlockSum(denominator);
  const int group = tid / 32;
  const int64_t col = blockIdx.y * 128 + 4 * (tid % 32);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t i = group; i < splits; i += kLatentWarps) {
    const float mi = max_sum[2 * i];
    if (mi == -CUDART_INF_F) continue;
    const float w = expf(mi - row_max);
    const float* part = a.partials + (row * a.splits + i) * p.value_dim;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (col + e < p.value_dim) acc[e] = fmaf(w, part[col + e], acc[e]);
    }
  }
  part_sums[group][tid % 32] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (group == 0) {
    float4 sum = part_sums[0][tid];
    for (int g = 1; g < kLatentWarps; ++g) {
      const float4 v = part_sums[g][tid];
      sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
    }
    const float inv = 1.0f / denominator;
    const float values[4] = {sum.x, sum.y, sum.z, sum.w};
    float* o = p.out + t * p.out_token_stride + n * p.out_head_stride;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (col + e < p.value_dim) o[col + e] = values[e] * inv;
    }
  }
}

// Batched metadata, one block per sequence (block 0 also checks q_start[0] and q_start[B]):
// records 8 * b + condition for the lowest failing sequence (conditions in attention_ops.h, in
// the CPU reference's order). Threads only read what the earlier conditions of b made safe.
__global__ void CheckBatchedLatentKernel(const LatentLaunchParams p, int* bad, int* error_flag,
                                         int error_code) {
  const int64_t batch = p.batch;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.q_start[0] != 0) Flag(bad, error_flag, error_code, 0);
    if (p.q_start[batch] != p.tokens) Flag(bad, error_flag, error_code, 8 * batch + 6);
  }
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const int64_t begin = p.q_start[b], end = p.q_start[b + 1], len = p.kv_len[b];
    const int64_t n = end - begin;
    if (end < begin || end > p.tokens) {
      if (threadIdx.x == 0) Flag(bad, error_flag, error_code, 8 * b + 1);
      continue;
    }
    if (n == 0) continue;
    if (len < n || len > p.max_kv_len || len > p.pages_per_seq * p.page_size) {
      if (threadIdx.x == 0) Flag(bad, error_flag, error_code, 8 * b + 2);
      continue;
    }
    const bool has_mask = p.tree_mask != nullptr;
    if (has_mask && n > p.tree_width) {
      if (threadIdx.x == 0) Flag(bad, error_flag, error_code, 8 * b + 3);
      continue;
    }
    const int32_t* pages = p.page_tables + b * p.page_table_stride;
    for (int64_t j = threadIdx.x; j < (len + p.page_size - 1) / p.page_size; j += blockDim.x) {
      if (pages[j] < 0 || pages[j] >= p.num_pages) Flag(bad, error_flag, error_code, 8 * b + 4);
    }
    if (has_mask && len == n && begin >= 0) {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const uint8_t* row = p.tree_mask + (begin + i) * p.tree_mask_stride;
        bool any = false;
        for (int64_t j = 0; j < n && !any; ++j) any = row[j] != 0;
        if (!any) Flag(bad, error_flag, error_code, 8 * b + 5);
      }
    }
  }
}

// tile_table[b] = sum over b' < b of ceil(n_b' / tokens_per_tile); tile_table[B] = the total.
__global__ void LatentTileTableKernel(const int32_t* __restrict__ q_start, int64_t batch,
                                      int64_t tokens_per_tile, int32_t* tile_table,
                                      const int* bad) {
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

// Query rows (tokens x heads) from which the bf16 kernel runs 64-row blocks, measured on one H200
// (runs/2026-12-01h-h200, 16 and 8 heads, 4K keys, 8-64 tree tokens): 64-row blocks took 0.89-0.96x
// the time of 16-row blocks at 2048-4096 rows and 0.54-0.55x from 8192, but 1.02-1.80x at 64-1024
// rows (one exception, 0.89x at 1024), where 16-row blocks fill more SMs with shorter chunk chains.
constexpr int64_t kMmaWideMinRows = 2048;

// Query rows per block. The bf16 (tensor-core) kernel: 64 when a sequence holds at least 64 query
// rows on average (heads x its tokens: tree verify, or 64+ heads), the call at least
// kMmaWideMinRows, and 64-row blocks fit in shared memory; else 16. The f32 kernel: 8 when there
// are few heads and at most one query token per sequence (decode at 8 heads per rank), else 16.
// Host values only; the tile table and the kernels agree.
int LatentBlockRows(const LatentLaunchParams& p) {
  const int64_t sequences = std::max<int64_t>(p.batch, 1);
  if (p.cache_bf16 != nullptr) {
    const int64_t rows_per_sequence = p.heads * ((p.tokens + sequences - 1) / sequences);
    const bool wide = rows_per_sequence >= 64 && p.tokens * p.heads >= kMmaWideMinRows &&
                      MmaSharedBytes(p.key_dim, 4) <= kMmaWideSharedLimit;
    return wide ? 64 : 16;
  }
  const bool one_token_per_sequence = p.tokens <= sequences;
  return p.heads <= 8 && one_token_per_sequence ? 8 : 16;
}

// Launch geometry (host values only, so a captured graph replays any lengths within the bounds).
cudaError_t LaunchLatentKernels(const LatentLaunchParams& p, const int32_t* tile_table,
                                float* partials, int64_t partial_capacity, const int* bad,
                                cudaStream_t stream) {
  if (p.tokens * p.heads == 0 || p.value_dim == 0) return cudaSuccess;
  int device = 0, sms = 0, max_shared = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (error != cudaSuccess) return error;
  const bool bf16 = p.cache_bf16 != nullptr;
  const int rows = LatentBlockRows(p);
  const size_t shared_bytes =
      bf16 ? MmaSharedBytes(p.key_dim, rows / 16) : LatentSharedFloats(p.key_dim) * sizeof(float);
  if (shared_bytes > static_cast<size_t>(max_shared)) return cudaErrorInvalidValue;

  LatentArgs a{};
  a.p = p;
  a.tile_table = tile_table;
  a.partials = partials;
  a.bad = bad;
  a.wp = bf16 ? MmaRowStride(p.key_dim) : LatentRowStride(p.key_dim);
  a.vec = bf16 ? p.key_dim % 8 == 0 && reinterpret_cast<uintptr_t>(p.cache_bf16) % 16 == 0
               : p.key_dim % 4 == 0 && reinterpret_cast<uintptr_t>(p.cache) % 16 == 0;
  a.heads_per_tile = static_cast<int>(std::min<int64_t>(p.heads, rows));
  a.tokens_per_tile = rows / a.heads_per_tile;
  const int64_t head_tiles = (p.heads + a.heads_per_tile - 1) / a.heads_per_tile;
  a.value_tiles = (p.value_dim + kLatentTileColumns - 1) / kLatentTileColumns;
  if (head_tiles * a.value_tiles > 65535) return cudaErrorInvalidValue;
  // Token tiles: sum over sequences of ceil(n_b / G) <= min(T, (T + B (G - 1)) / G).
  const int64_t g = a.tokens_per_tile;
  const int64_t token_tiles =
      tile_table == nullptr ? (p.tokens + g - 1) / g
                            : std::min(p.tokens, (p.tokens + p.batch * (g - 1)) / g);
  if (token_tiles > 0x7fffffff) return cudaErrorInvalidValue;

  // Splits: one resident block per SM; pick the split count with the fewest modeled chunk-times
  // (waves x (chunks per split + 2 for the prologue)), within the scratch and kMaxSplits.
  const int64_t blocks = token_tiles * head_tiles * a.value_tiles;
  const int64_t per_split_floats = p.tokens * p.heads * (p.value_dim + 2);
  int64_t max_splits = partials == nullptr ? 1 : partial_capacity / per_split_floats;
  max_splits = std::clamp<int64_t>(max_splits, 1, kMaxSplits);
  max_splits = std::min(max_splits, (p.max_kv_len + kLatentChunk - 1) / kLatentChunk);
  int64_t best_cost = -1;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t kps = ((p.max_kv_len + s - 1) / s + kLatentChunk - 1) / kLatentChunk * kLatentChunk;
    const int64_t eff = (p.max_kv_len + kps - 1) / kps;
    const int64_t waves = (blocks * eff + sms - 1) / sms;
    const int64_t cost = waves * (kps / kLatentChunk + 2) + (eff > 1 ? 1 : 0);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      a.splits = eff;
    }
  }
  if (a.splits > 65535) return cudaErrorInvalidValue;

  const int row_tile = rows / 4;
  const dim3 grid(static_cast<unsigned>(token_tiles), static_cast<unsigned>(a.splits),
                  static_cast<unsigned>(head_tiles * a.value_tiles));
  if (bf16 && rows == 64) {
    error = cudaFuncSetAttribute(LatentMmaKernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(shared_bytes));
    if (error == cudaSuccess) LatentMmaKernel<4><<<grid, kMmaThreads, shared_bytes, stream>>>(a);
  } else if (bf16) {
    error = cudaFuncSetAttribute(LatentMmaKernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(shared_bytes));
    if (error == cudaSuccess) LatentMmaKernel<1><<<grid, kMmaThreads, shared_bytes, stream>>>(a);
  } else if (row_tile == 2) {
    error = cudaFuncSetAttribute(LatentKernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(shared_bytes));
    if (error == cudaSuccess) LatentKernel<2><<<grid, kLatentThreads, shared_bytes, stream>>>(a);
  } else {
    error = cudaFuncSetAttribute(LatentKernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(shared_bytes));
    if (error == cudaSuccess) LatentKernel<4><<<grid, kLatentThreads, shared_bytes, stream>>>(a);
  }
  if (error != cudaSuccess) return error;
  error = cudaGetLastError();
  if (error != cudaSuccess || a.splits == 1) return error;
  const dim3 combine_grid(static_cast<unsigned>(p.tokens * p.heads),
                          static_cast<unsigned>((p.value_dim + 127) / 128));
  LatentCombineKernel<<<combine_grid, kLatentThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCheckIndexRange(const int32_t* idx, int64_t n, int64_t limit, int* bad,
                                  int* error_flag, int error_code, cudaStream_t stream) {
  return CheckIndexRange(idx, n, limit, bad, error_flag, error_code, stream);
}

cudaError_t LaunchCheckIndexRange(const int64_t* idx, int64_t n, int64_t limit, int* bad,
                                  int* error_flag, int error_code, cudaStream_t stream) {
  return CheckIndexRange(idx, n, limit, bad, error_flag, error_code, stream);
}

cudaError_t LaunchCheckPagedPositions(const int32_t* positions, int64_t tokens,
                                      const int32_t* page_table, int64_t pages, int64_t page_size,
                                      int64_t num_pages, int* bad, int* error_flag, int error_code,
                                      cudaStream_t stream) {
  return CheckPagedPositions(positions, tokens, page_table, pages, page_size, num_pages, bad,
                             error_flag, error_code, stream);
}

cudaError_t LaunchCheckPagedPositions(const int64_t* positions, int64_t tokens,
                                      const int32_t* page_table, int64_t pages, int64_t page_size,
                                      int64_t num_pages, int* bad, int* error_flag, int error_code,
                                      cudaStream_t stream) {
  return CheckPagedPositions(positions, tokens, page_table, pages, page_size, num_pages, bad,
                             error_flag, error_code, stream);
}

cudaError_t LaunchCheckMaskRows(const uint8_t* mask, int64_t rows, int64_t cols,
                                int64_t mask_stride, int* bad, int* error_flag, int error_code,
                                cudaStream_t stream) {
  if (rows < 0 || cols < 0 || mask_stride < 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if ((cols > 0 && mask == nullptr) || bad == nullptr || error_flag == nullptr) {
    return cudaErrorInvalidValue;
  }
  CheckMaskRowsKernel<<<RowGrid(rows), kThreads, 0, stream>>>(mask, rows, cols, mask_stride, bad,
                                                              error_flag, error_code);
  return cudaGetLastError();
}

cudaError_t LaunchApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride,
                            int64_t head_stride, int64_t offset, int64_t rope_dim,
                            const int32_t* positions, const float* cos_sin, int64_t table_stride,
                            bool adjacent_pairs, const int* bad, cudaStream_t stream) {
  return ApplyRope(x, tokens, heads, token_stride, head_stride, offset, rope_dim, positions,
                   cos_sin, table_stride, adjacent_pairs, bad, stream);
}

cudaError_t LaunchApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride,
                            int64_t head_stride, int64_t offset, int64_t rope_dim,
                            const int64_t* positions, const float* cos_sin, int64_t table_stride,
                            bool adjacent_pairs, const int* bad, cudaStream_t stream) {
  return ApplyRope(x, tokens, heads, token_stride, head_stride, offset, rope_dim, positions,
                   cos_sin, table_stride, adjacent_pairs, bad, stream);
}

cudaError_t LaunchPagedWrite(const float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                             const int32_t* positions, const int32_t* page_table, int64_t page_size,
                             float* cache, const int* bad, cudaStream_t stream) {
  return PagedCopy(const_cast<float*>(rows), rows_stride, tokens, width, positions, page_table,
                   page_size, cache, true, bad, stream);
}

cudaError_t LaunchPagedWrite(const float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                             const int64_t* positions, const int32_t* page_table, int64_t page_size,
                             float* cache, const int* bad, cudaStream_t stream) {
  return PagedCopy(const_cast<float*>(rows), rows_stride, tokens, width, positions, page_table,
                   page_size, cache, true, bad, stream);
}

cudaError_t LaunchPagedRead(const float* cache, const int32_t* page_table, int64_t page_size,
                            const int32_t* positions, int64_t tokens, int64_t width, float* out,
                            int64_t out_stride, const int* bad, cudaStream_t stream) {
  return PagedCopy(out, out_stride, tokens, width, positions, page_table, page_size,
                   const_cast<float*>(cache), false, bad, stream);
}

cudaError_t LaunchPagedRead(const float* cache, const int32_t* page_table, int64_t page_size,
                            const int64_t* positions, int64_t tokens, int64_t width, float* out,
                            int64_t out_stride, const int* bad, cudaStream_t stream) {
  return PagedCopy(out, out_stride, tokens, width, positions, page_table, page_size,
                   const_cast<float*>(cache), false, bad, stream);
}

cudaError_t LaunchPagedWrite(const float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                             const int32_t* positions, const int32_t* page_table, int64_t page_size,
                             uint16_t* cache, const int* bad, cudaStream_t stream) {
  return PagedCopy(const_cast<float*>(rows), rows_stride, tokens, width, positions, page_table,
                   page_size, cache, true, bad, stream);
}

cudaError_t LaunchPagedWrite(const float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                             const int64_t* positions, const int32_t* page_table, int64_t page_size,
                             uint16_t* cache, const int* bad, cudaStream_t stream) {
  return PagedCopy(const_cast<float*>(rows), rows_stride, tokens, width, positions, page_table,
                   page_size, cache, true, bad, stream);
}

cudaError_t LaunchPagedRead(const uint16_t* cache, const int32_t* page_table, int64_t page_size,
                            const int32_t* positions, int64_t tokens, int64_t width, float* out,
                            int64_t out_stride, const int* bad, cudaStream_t stream) {
  return PagedCopy(out, out_stride, tokens, width, positions, page_table, page_size,
                   const_cast<uint16_t*>(cache), false, bad, stream);
}

cudaError_t LaunchPagedRead(const uint16_t* cache, const int32_t* page_table, int64_t page_size,
                            const int64_t* positions, int64_t tokens, int64_t width, float* out,
                            int64_t out_stride, const int* bad, cudaStream_t stream) {
  return PagedCopy(out, out_stride, tokens, width, positions, page_table, page_size,
                   const_cast<uint16_t*>(cache), false, bad, stream);
}

size_t AttentionSharedBytes(int64_t key_dim, int64_t value_dim, bool paged) {
  return SharedFloats(key_dim, value_dim, paged) * sizeof(float);
}

cudaError_t LaunchAttention(const AttentionLaunchParams& params, float* partials,
                            int64_t partial_capacity, const int* bad, cudaStream_t stream) {
  if (!ValidParams(params) || partial_capacity < 0) return cudaErrorInvalidValue;
  const AttentionLaunchParams& p = params;
  if (p.tokens * p.heads == 0 || p.value_dim == 0) return cudaSuccess;
  if (bad == nullptr) return cudaErrorInvalidValue;

  int device = 0;
  int sms = 0;
  int max_shared = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (error != cudaSuccess) return error;
  const bool paged = p.paged;
  const size_t shared_bytes = AttentionSharedBytes(p.key_dim, p.value_dim, paged);
  if (shared_bytes > static_cast<size_t>(max_shared)) return cudaErrorInvalidValue;

  AttendArgs a{};
  a.p = p;
  a.qstride = QStride(p.key_dim);
  a.kstride = KStride(p.key_dim);
  a.vstride = paged ? 0 : static_cast<int>(std::min(p.value_dim, TileColumns(p.value_dim)));
  a.partials = partials;
  a.bad = bad;
  const int64_t tile_columns = TileColumns(p.value_dim);
  a.value_tiles = (p.value_dim + tile_columns - 1) / tile_columns;
  // Tile the rows that share keys the way that launches fewer blocks (fewer reads of the keys).
  const int64_t head_blocks = (p.heads + kBlockRows - 1) / kBlockRows;
  const int64_t token_blocks = (p.tokens + kBlockRows - 1) / kBlockRows;
  const bool shared_keys = paged || (p.k_head_stride == 0 && p.v_head_stride == 0);
  a.heads_tiling = shared_keys && p.tokens * head_blocks <= token_blocks * p.heads;
  const int64_t row_blocks = a.heads_tiling ? p.tokens : token_blocks;
  const int64_t column_blocks = a.heads_tiling ? head_blocks : p.heads;
  if (column_blocks * a.value_tiles > 65535) return cudaErrorInvalidValue;

  // Split the keys while the grid is smaller than two blocks per SM, each split at least
  // kMinKeysPerSplit keys, as far as the scratch holds the partials.
  const int64_t blocks = row_blocks * column_blocks * a.value_tiles;
  const int64_t target = 2 * static_cast<int64_t>(sms);
  int64_t splits = 1;
  if (blocks < target) {
    splits = std::min((target + blocks - 1) / blocks, (p.keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit);
    const int64_t per_split_floats = p.tokens * p.heads * (p.value_dim + 2);
    splits = std::min({splits, partial_capacity / per_split_floats, kMaxSplits});
    if (partials == nullptr) splits = 1;
  }
  splits = std::max<int64_t>(splits, 1);
  a.keys_per_split = std::max<int64_t>(
      (p.keys + splits - 1) / splits + kChunk - 1, kChunk) / kChunk * kChunk;
  a.splits = std::max<int64_t>((p.keys + a.keys_per_split - 1) / a.keys_per_split, 1);

  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(a.splits),
                  static_cast<unsigned>(column_blocks * a.value_tiles));
  error = tile_columns == 128 ? LaunchSplit<4>(a, grid, shared_bytes, stream)
                              : LaunchSplit<16>(a, grid, shared_bytes, stream);
  if (error != cudaSuccess || a.splits == 1) return error;
  // Four floats of slack: compute-sanitizer saw 12-byte shared reads just past `splits` floats in
  // this kernel (the compiler's vectorized reads of the weight loops); they stay inside the slack.
  AttendCombineKernel<<<RowGrid(p.tokens * p.heads), kCombineThreads,
                        static_cast<size_t>(a.splits + 4) * sizeof(float), stream>>>(a);
  return cudaGetLastError();
}

size_t LatentSharedBytes(int64_t key_dim) { return LatentSharedFloats(key_dim) * sizeof(float); }

size_t LatentBf16SharedBytes(int64_t key_dim) { return MmaSharedBytes(key_dim, 1); }

cudaError_t LaunchLatentAttention(const LatentLaunchParams& params, float* partials,
                                  int64_t partial_capacity, const int* bad, cudaStream_t stream) {
  if (!ValidLatentParams(params) || partial_capacity < 0 || bad == nullptr) return cudaErrorInvalidValue;
  LatentLaunchParams p = params;
  p.batch = 1;
  p.q_start = nullptr;
  p.kv_len = nullptr;
  p.tree_mask = nullptr;
  if (p.tokens * p.heads > 0 && p.value_dim > 0 && p.mask == nullptr) return cudaErrorInvalidValue;
  return LaunchLatentKernels(p, nullptr, partials, partial_capacity, bad, stream);
}

cudaError_t LaunchBatchedLatentAttention(const LatentLaunchParams& params, int32_t* tile_table,
                                         float* partials, int64_t partial_capacity, int* bad,
                                         int* error_flag, int error_code, cudaStream_t stream) {
  const LatentLaunchParams& p = params;
  if (!ValidLatentParams(p) || partial_capacity < 0 || bad == nullptr || error_flag == nullptr ||
      tile_table == nullptr || p.q_start == nullptr || (p.batch > 0 && p.kv_len == nullptr) ||
      p.mask != nullptr || (p.tree_mask != nullptr && p.tree_width < 1)) {
    return cudaErrorInvalidValue;
  }
  if (p.batch > 0 && p.page_tables == nullptr) return cudaErrorInvalidValue;
  CheckBatchedLatentKernel<<<static_cast<unsigned>(std::max<int64_t>(p.batch, 1)), kThreads, 0,
                             stream>>>(p, bad, error_flag, error_code);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess || p.tokens * p.heads == 0 || p.value_dim == 0) return error;
  const int rows = LatentBlockRows(p);
  const int64_t tokens_per_tile = rows / std::min<int64_t>(p.heads, rows);
  LatentTileTableKernel<<<1, kThreads, 0, stream>>>(p.q_start, p.batch, tokens_per_tile,
                                                    tile_table, bad);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  return LaunchLatentKernels(p, tile_table, partials, partial_capacity, bad, stream);
}

}  // namespace eagle3::cuda
