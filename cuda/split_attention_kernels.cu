// The split attention kernels (cuda/attention_ops.h, LaunchAttention): dense keys, or keys in a
// paged latent cache wider than the latent kernels take. No abseil here: nvcc must never see it.
#include <algorithm>
#include <cstdint>

#include <math_constants.h>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "programmatic_launch.cuh"

namespace eagle3::cuda {
namespace {

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
  PdlEnter();
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
  PdlEnter();
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
cudaError_t LaunchSplit(const AttendArgs& a, dim3 grid, size_t shared_bytes, bool programmatic,
                        cudaStream_t stream) {
  if (shared_bytes > 48 * 1024) {
    const cudaError_t error = cudaFuncSetAttribute(
        AttendSplitKernel<kChunks>, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(shared_bytes));
    if (error != cudaSuccess) return error;
  }
  return LaunchKernel(programmatic, AttendSplitKernel<kChunks>, grid, dim3(kThreads), shared_bytes,
                      stream, a);
}

}  // namespace

size_t AttentionSharedBytes(int64_t key_dim, int64_t value_dim, bool paged) {
  return SharedFloats(key_dim, value_dim, paged) * sizeof(float);
}

cudaError_t LaunchAttention(const AttentionLaunchParams& params, float* partials,
                            int64_t partial_capacity, const int* bad, bool programmatic,
                            cudaStream_t stream) {
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
  error = tile_columns == 128 ? LaunchSplit<4>(a, grid, shared_bytes, programmatic, stream)
                              : LaunchSplit<16>(a, grid, shared_bytes, programmatic, stream);
  if (error != cudaSuccess || a.splits == 1) return error;
  // Four floats of slack: compute-sanitizer saw 12-byte shared reads just past `splits` floats in
  // this kernel (the compiler's vectorized reads of the weight loops); they stay inside the slack.
  return LaunchKernel(programmatic, AttendCombineKernel, RowGrid(p.tokens * p.heads),
                      dim3(kCombineThreads), static_cast<size_t>(a.splits + 4) * sizeof(float),
                      stream, a);
}

}  // namespace eagle3::cuda
