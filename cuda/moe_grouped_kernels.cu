// The routed experts' grouped kernels (LaunchMoeExpertsGrouped, cuda/moe_ops.h): many tokens,
// each selected expert's weights read once per tile of its (token, slot) pairs, on tensor cores.
// No abseil here: nvcc must never see it.
#include <algorithm>
#include <climits>
#include <cstdint>

#include <cuda_bf16.h>

#include "core_kernels.cuh"
#include "moe_ops.h"
#include "programmatic_launch.cuh"
#include "ptx.cuh"

namespace eagle3::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;
constexpr int64_t kMaxGridY = 65535;

// ---- Grouped routed experts ----------------------------------------------------------------
//
// One round per chunk of tokens: MoeGroupKernel sorts the chunk's (token, slot) pairs by expert and
// lists the expert tiles of up to kTileM pairs; MoeGroupedGemmKernel<W, false> computes act for
// every tile x 64 intermediate rows (gate and up), MoeGroupedGemmKernel<W, true> y = act W_down^T
// for every tile x 128 hidden columns, and MoeGroupedReduceKernel sums y into out per token in slot
// order. See moe_ops.h for the numerics (three-way bf16 split of f32 operands on tensor cores).

constexpr int kTileM = static_cast<int>(kMoeGroupedTileRows);  // pairs per tile
constexpr int kTileN = 128;  // weight rows per block (stage 1: 64 gate + the 64 matching up rows)
constexpr int kTileK = 32;   // k per shared-memory tile (two m16n8k16 steps)
constexpr int kTileThreads = 256;  // 8 warps: 2 along M x 4 along N, 32 x 32 outputs each
// Shared row stride (elements) of every tile: fragment reads of 8 rows x 4 lanes hit distinct
// banks.
constexpr int kTileStride = kTileK + 8;
constexpr int kGroupThreads = 1024;
constexpr int kReduceThreads = 256;

static_assert(kTileM == 64, "the warp layout covers 64 rows");

// Inclusive prefix sums of two ints over the lanes of a warp.
__device__ int2 WarpInclusiveScan(int2 v, int lane) {
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int x = __shfl_up_sync(kFullMask, v.x, offset);
    const int y = __shfl_up_sync(kFullMask, v.y, offset);
    if (lane >= offset) {
      v.x += x;
      v.y += y;
    }
  }
  return v;
}

// Exclusive block-wide prefix sums of two ints (blockDim.x == kGroupThreads); *total gets the sums.
__device__ int2 BlockExclusiveScan(int2 v, int2* total) {
  __shared__ int2 warp_totals[kGroupThreads / kWarpSize];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int2 inclusive = WarpInclusiveScan(v, lane);
  if (lane == kWarpSize - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {  // kGroupThreads / kWarpSize == kWarpSize warps
    warp_totals[lane] = WarpInclusiveScan(warp_totals[lane], lane);  // inclusive over warps
  }
  __syncthreads();
  const int2 base = warp > 0 ? warp_totals[warp - 1] : make_int2(0, 0);
  *total = warp_totals[kWarpSize - 1];
  return make_int2(base.x + inclusive.x - v.x, base.y + inclusive.y - v.y);
}
static_assert(kGroupThreads == kWarpSize * kWarpSize, "BlockExclusiveScan's layout");

// Counting sort of the chunk's tokens * top_k pairs by expert (one block): pairs[] gets the pair
// indices t * top_k + j in expert-major order, tiles[3 * i] = (expert, first sorted pair, pairs)
// for each tile of up to kTileM pairs of one expert, *num_tiles their count. A pair with an id
// outside [0, experts) is left out and its token (chunk offset t0 added) recorded.
__global__ void __launch_bounds__(kGroupThreads)
    MoeGroupKernel(const int32_t* __restrict__ ids, int64_t ids_stride, int tokens, int top_k,
                   int experts, int64_t t0, int32_t* __restrict__ pairs,
                   int32_t* __restrict__ tiles, int32_t* __restrict__ num_tiles, int* error_flag,
                   int error_code) {
  PdlEnter();
  __shared__ int count[kMoeGroupedMaxExperts];  // per expert: pairs, then the scatter cursor
  const int n = tokens * top_k;
  for (int e = threadIdx.x; e < experts; e += kGroupThreads) count[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += kGroupThreads) {
    const int t = p / top_k;
    const int32_t e = ids[t * ids_stride + (p - t * top_k)];
    if (e < 0 || e >= experts) {
      RecordDeviceError(error_flag, error_code, t0 + t);
    } else {
      atomicAdd(&count[e], 1);
    }
  }
  __syncthreads();
  // Thread i owns the experts [begin, end): their pairs and tiles are consecutive.
  const int per = (experts + kGroupThreads - 1) / kGroupThreads;
  const int begin = min(static_cast<int>(threadIdx.x) * per, experts);
  const int end = min(begin + per, experts);
  int2 mine = make_int2(0, 0);
  for (int e = begin; e < end; ++e) {
    mine.x += count[e];
    mine.y += (count[e] + kTileM - 1) / kTileM;
  }
  int2 total;
  int2 at = BlockExclusiveScan(mine, &total);  // (first pair, first tile) of `begin`
  for (int e = begin; e < end; ++e) {
    const int c = count[e];
    for (int first = 0; first < c; first += kTileM) {
      tiles[3 * at.y] = e;
      tiles[3 * at.y + 1] = at.x + first;
      tiles[3 * at.y + 2] = min(kTileM, c - first);
      ++at.y;
    }
    count[e] = at.x;  // cursor: this expert's first sorted position
    at.x += c;
  }
  if (threadIdx.x == 0) *num_tiles = total.y;
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += kGroupThreads) {
    const int t = p / top_k;
    const int32_t e = ids[t * ids_stride + (p - t * top_k)];
    if (e >= 0 && e < experts) pairs[atomicAdd(&count[e], 1)] = p;
  }
}

// v = hi + mid + lo exactly (to 2^-26 relative), each a bf16, for both halves of a pair of f32
// values; the packed words hold the element of the lower index in their low half (mma operands).
__device__ __forceinline__ void Split3(float2 v, uint32_t (&parts)[3]) {
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(v.x, v.y);
    const float2 f = __bfloat1622float2(b);
    v.x -= f.x;  // exact: f is v rounded to 8 significant bits
    v.y -= f.y;
    parts[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
}

struct GroupedGemmArgs {
  const float* x = nullptr;  // stage 1: the chunk's token rows [tokens, hidden]
  int64_t x_stride = 0;
  float* act = nullptr;  // [pairs, inter], sorted order: stage 1 writes it, stage 2 reads it
  float* partial = nullptr;  // stage 2: [pairs, hidden], chunk-local pair order
  const int32_t* pairs = nullptr;
  const int32_t* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  const MoeExpertPointers* experts = nullptr;
  int64_t top_k = 0, hidden = 0, inter = 0;
};

// Pipeline depth (shared-memory stages) of MoeGroupedGemmKernel<W>: (kStages - 1) k tiles of
// weights in flight per block while one is multiplied.
template <typename W>
constexpr int GroupedStages() {
  return sizeof(W) == 2 ? 4 : 3;
}
template <typename W>
constexpr size_t GroupedStageBytes() {
  return static_cast<size_t>(kTileM) * kTileStride * sizeof(float) +
         static_cast<size_t>(kTileN) * kTileStride * sizeof(W);
}
template <typename W>
constexpr size_t GroupedSharedBytes() {  // 80 KiB (bf16) or 90 KiB (f32): 2 blocks per SM fit
  return GroupedStages<W>() * GroupedStageBytes<W>();
}

// Stage 1 (kDown false): act[s, i] = silu(gate_e[i] . x[t]) * (up_e[i] . x[t]) for the sorted
// pairs s of tile blockIdx.y (token t = pairs[s] / top_k) and the 64 rows i of blockIdx.x.
// Stage 2 (kDown true): partial[pairs[s], h] = down_e[h] . act[s] for the 128 rows h of
// blockIdx.x. Blocks past *num_tiles return at once. Dynamic shared memory:
// GroupedSharedBytes<W>(), kStages slots of [kTileM][kTileStride] f32 (A) then
// [kTileN][kTileStride] W (B). Operand rows are copied with cp.async 16 bytes at a time when every
// row is 16-byte aligned and k a multiple of 16 bytes, else element by element (odd shapes).
template <typename W, bool kDown>
__global__ void __launch_bounds__(kTileThreads, 2) MoeGroupedGemmKernel(GroupedGemmArgs args) {
  constexpr int kStages = GroupedStages<W>();
  constexpr int kBVec = 16 / sizeof(W);              // weights per 16-byte chunk
  constexpr int kBChunksPerRow = kTileK / kBVec;     // 4 (bf16) or 8 (f32)
  constexpr int kBLoads = kTileN * kBChunksPerRow / kTileThreads;  // 2 or 4
  constexpr int kALoads = kTileM * (kTileK / 4) / kTileThreads;   // 2
  constexpr int kParts = sizeof(W) == 2 ? 1 : 3;  // bf16 parts per weight
  extern __shared__ __align__(16) unsigned char grouped_shared[];
  const auto a_tile = [&](int stage) {
    return reinterpret_cast<float(*)[kTileStride]>(grouped_shared + stage * GroupedStageBytes<W>());
  };
  const auto b_tile = [&](int stage) {
    return reinterpret_cast<W(*)[kTileStride]>(grouped_shared + stage * GroupedStageBytes<W>() +
                                               kTileM * kTileStride * sizeof(float));
  };

  PdlEnter();
  const int tile = blockIdx.y;
  if (tile >= *args.num_tiles) return;
  const int expert = args.tiles[3 * tile];
  const int start = args.tiles[3 * tile + 1];
  const int rows = args.tiles[3 * tile + 2];
  const MoeExpertPointers w = args.experts[expert];
  const int64_t k_len = kDown ? args.inter : args.hidden;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * (kDown ? kTileN : kTileN / 2);
  const int tid = threadIdx.x;

  // The rows this thread copies (fixed over k); nullptr: zeros (padding).
  const float* a_row[kALoads];
  const float* a_base = kDown ? args.act : args.x;  // a valid address for zero-filling copies
  const bool a_vec = kDown ? Aligned16(args.act) && args.inter % 4 == 0
                           : Aligned16(args.x) && args.x_stride % 4 == 0 && args.hidden % 4 == 0;
#pragma unroll
  for (int i = 0; i < kALoads; ++i) {
    const int r = (tid + i * kTileThreads) / (kTileK / 4);
    a_row[i] = nullptr;
    if (r < rows) {
      a_row[i] = kDown ? args.act + static_cast<int64_t>(start + r) * args.inter
                       : args.x + (args.pairs[start + r] / args.top_k) * args.x_stride;
    }
  }
  const W* b_row[kBLoads];
  const W* b_base = static_cast<const W*>(kDown ? w.down : w.gate_up);
  const int64_t b_stride = kDown ? w.down_stride : w.gate_up_stride;
  const bool b_vec = Aligned16(b_base) && b_stride % kBVec == 0 && k_len % kBVec == 0;
#pragma unroll
  for (int i = 0; i < kBLoads; ++i) {
    const int r = (tid + i * kTileThreads) / kBChunksPerRow;
    int64_t row;
    bool valid;
    if (kDown) {
      row = n0 + r;
      valid = row < args.hidden;
    } else {  // r < 64: gate row n0 + r; else the up row of n0 + r - 64
      const int64_t i_row = n0 + (r % (kTileN / 2));
      valid = i_row < args.inter;
      row = r < kTileN / 2 ? i_row : args.inter + i_row;
    }
    b_row[i] = valid ? b_base + row * b_stride : nullptr;
  }

  // Copies k tile [k0, k0 + kTileK) into `stage` (asynchronously on the vector path).
  const auto issue = [&](int64_t k0, int stage) {
    float(*a_s)[kTileStride] = a_tile(stage);
    W(*b_s)[kTileStride] = b_tile(stage);
#pragma unroll
    for (int i = 0; i < kALoads; ++i) {
      const int c = tid + i * kTileThreads;
      const int col = (c % (kTileK / 4)) * 4;
      float* dst = &a_s[c / (kTileK / 4)][col];
      if (a_vec) {
        const bool valid = a_row[i] != nullptr && k0 + col < k_len;
        CpAsync16OrZero(dst, valid ? a_row[i] + k0 + col : a_base, valid);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const bool valid = a_row[i] != nullptr && k0 + col + q < k_len;
          dst[q] = valid ? __ldg(a_row[i] + k0 + col + q) : 0.0f;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBLoads; ++i) {
      const int c = tid + i * kTileThreads;
      const int col = (c % kBChunksPerRow) * kBVec;
      W* dst = &b_s[c / kBChunksPerRow][col];
      if (b_vec) {
        const bool valid = b_row[i] != nullptr && k0 + col < k_len;
        CpAsync16OrZero(dst, valid ? b_row[i] + k0 + col : b_base, valid);
      } else {
#pragma unroll
        for (int e = 0; e < kBVec; ++e) {
          const bool valid = b_row[i] != nullptr && k0 + col + e < k_len;
          dst[e] = valid ? __ldg(b_row[i] + k0 + col + e) : W{0};
        }
      }
    }
  };

  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int wm = warp % 2, wn = warp / 2;
  const int g = lane / 4, c2 = (lane % 4) * 2;  // fragment row (group) and first column
  bool active[2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) active[mt] = wm * 32 + mt * 16 < rows;  // warp-uniform
  int b_local[4];  // the shared row of each n8 tile's column g
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    b_local[nt] = kDown ? wn * 32 + nt * 8 + g
                        : (nt < 2 ? 0 : kTileN / 2) + wn * 16 + (nt % 2) * 8 + g;
  }
  float acc[2][4][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[mt][nt][q] = 0.0f;
    }
  }

  // kStages - 1 tiles ahead; one commit group per tile (empty past the end) keeps the count.
  const int64_t k_tiles = (k_len + kTileK - 1) / kTileK;
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) {
    if (stage < k_tiles) issue(stage * kTileK, stage);
    CpAsyncCommit();
  }
  for (int64_t kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();  // this thread's copies of tile kt have landed
    __syncthreads();  // everyone's have; and tile kt - 1's slot is free (all done with it)
    if (kt + kStages - 1 < k_tiles) {
      issue((kt + kStages - 1) * kTileK, static_cast<int>((kt + kStages - 1) % kStages));
    }
    CpAsyncCommit();
    if (!active[0]) continue;  // a warp whose rows are all padding only helps copy
    const int stage = static_cast<int>(kt % kStages);
    float(*a_s)[kTileStride] = a_tile(stage);
    W(*b_s)[kTileStride] = b_tile(stage);
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      uint32_t af[2][3][4];  // [m tile][hi, mid, lo][register]
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        if (!active[mt]) continue;
        const int r = wm * 32 + mt * 16 + g;
        const float2 v[4] = {*reinterpret_cast<const float2*>(&a_s[r][kk + c2]),
                             *reinterpret_cast<const float2*>(&a_s[r + 8][kk + c2]),
                             *reinterpret_cast<const float2*>(&a_s[r][kk + c2 + 8]),
                             *reinterpret_cast<const float2*>(&a_s[r + 8][kk + c2 + 8])};
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          uint32_t parts[3];
          Split3(v[reg], parts);
#pragma unroll
          for (int p = 0; p < 3; ++p) af[mt][p][reg] = parts[p];
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        uint32_t bf[kParts][2];
        if constexpr (kParts == 1) {
          bf[0][0] = *reinterpret_cast<const uint32_t*>(&b_s[b_local[nt]][kk + c2]);
          bf[0][1] = *reinterpret_cast<const uint32_t*>(&b_s[b_local[nt]][kk + c2 + 8]);
        } else {
#pragma unroll
          for (int reg = 0; reg < 2; ++reg) {
            uint32_t parts[3];
            Split3(*reinterpret_cast<const float2*>(&b_s[b_local[nt]][kk + c2 + 8 * reg]), parts);
#pragma unroll
            for (int p = 0; p < 3; ++p) bf[p][reg] = parts[p];
          }
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          if (!active[mt]) continue;
          // This k16 step's sum on the tensor cores (3 or 6 products of 16 terms each, smallest
          // first; with split weights, the six of order >= 2^-16 of the nine), then into acc in
          // f32: the tensor core's own accumulation never runs long.
          float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int order = 2; order >= 0; --order) {
#pragma unroll
            for (int p = 0; p < kParts; ++p) {
              if (order - p >= 0) MmaBf16(part, af[mt][order - p], bf[p][0], bf[p][1]);
            }
          }
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[mt][nt][q] += part[q];
        }
      }
    }
  }
  CpAsyncWait<0>();  // (only empty groups can be pending here)

#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    if (!active[mt]) continue;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int r = wm * 32 + mt * 16 + g + (q / 2) * 8;
      if (r >= rows) continue;
      if constexpr (kDown) {
        float* y = args.partial + static_cast<int64_t>(args.pairs[start + r]) * args.hidden;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const int64_t h = n0 + wn * 32 + nt * 8 + c2 + q % 2;
          if (h < args.hidden) y[h] = acc[mt][nt][q];
        }
      } else {
        float* a = args.act + static_cast<int64_t>(start + r) * args.inter;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int64_t i = n0 + wn * 16 + nt * 8 + c2 + q % 2;
          const float gate = acc[mt][nt][q];
          if (i < args.inter) a[i] = gate / (1.0f + expf(-gate)) * acc[mt][nt + 2][q];
        }
      }
    }
  }
}

// Sets the dynamic shared memory MoeGroupedGemmKernel<W, kDown> needs (above the 48 KiB default)
// and launches it.
template <typename W, bool kDown>
cudaError_t LaunchGroupedGemm(const GroupedGemmArgs& a, dim3 grid, bool programmatic,
                              cudaStream_t stream) {
  constexpr size_t kBytes = GroupedSharedBytes<W>();
  const cudaError_t error = cudaFuncSetAttribute(
      MoeGroupedGemmKernel<W, kDown>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      static_cast<int>(kBytes));
  if (error != cudaSuccess) return error;
  return LaunchKernel(programmatic, MoeGroupedGemmKernel<W, kDown>, grid, dim3(kTileThreads),
                      kBytes, stream, a);
}

// out[t, h] = (accumulate ? out[t, h] : 0) + sum over j in order of weights[t, j] * partial[t *
// top_k + j, h] for token t = blockIdx.x and h of blockIdx.y's block; a token with a bad id is left
// alone (MoeGroupKernel recorded it).
__global__ void __launch_bounds__(kReduceThreads)
    MoeGroupedReduceKernel(const int32_t* __restrict__ ids, int64_t ids_stride,
                           const float* __restrict__ weights, int64_t weights_stride,
                           int64_t num_experts, int64_t top_k, int64_t hidden,
                           const float* __restrict__ partial, float* __restrict__ out,
                           int64_t out_stride, bool accumulate) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  const int32_t* id = ids + t * ids_stride;
  for (int64_t j = 0; j < top_k; ++j) {
    if (id[j] < 0 || id[j] >= num_experts) return;
  }
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kReduceThreads + threadIdx.x;
  if (h >= hidden) return;
  float* o = out + t * out_stride + h;
  float acc = accumulate ? *o : 0.0f;  // without accumulate out is write-only (may hold NaN)
  const float* y = partial + t * top_k * hidden + h;
  for (int64_t j = 0; j < top_k; ++j) acc += weights[t * weights_stride + j] * y[j * hidden];
  *o = acc;
}

}  // namespace

cudaError_t LaunchMoeExpertsGrouped(const float* x, int64_t x_stride, const int32_t* ids,
                                    int64_t ids_stride, const float* weights,
                                    int64_t weights_stride, const MoeExpertPointers* experts,
                                    MoeWeightType weight_type, int64_t num_experts, int64_t tokens,
                                    int64_t top_k, int64_t hidden, int64_t inter, float* act,
                                    const MoeGroupedWorkspace& workspace, float* out,
                                    int64_t out_stride, bool accumulate, int* error_flag,
                                    int error_code, bool programmatic, cudaStream_t stream) {
  const MoeGroupedWorkspace& ws = workspace;
  if (weight_type != MoeWeightType::kF32 && weight_type != MoeWeightType::kBF16) {
    return cudaErrorInvalidValue;
  }
  if (tokens < 0 || top_k < 1 || hidden < 1 || inter < 1 || num_experts < 1 ||
      num_experts > kMoeGroupedMaxExperts || x_stride < 0 || ids_stride < 0 ||
      weights_stride < 0 || out_stride < 0 || ws.max_pairs < top_k ||
      ws.max_experts < num_experts || ws.hidden < hidden) {
    return cudaErrorInvalidValue;
  }
  if (tokens == 0) return cudaSuccess;
  if (x == nullptr || ids == nullptr || weights == nullptr || experts == nullptr ||
      act == nullptr || out == nullptr || error_flag == nullptr || ws.pairs == nullptr ||
      ws.tiles == nullptr || ws.num_tiles == nullptr || ws.partial == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t chunk = std::min<int64_t>({tokens, ws.max_pairs / top_k, INT_MAX / top_k});
  const int64_t max_tiles = MoeGroupedMaxTiles(chunk * top_k, num_experts);
  const int64_t act_blocks = (inter + kTileN / 2 - 1) / (kTileN / 2);
  const int64_t down_blocks = (hidden + kTileN - 1) / kTileN;
  const int64_t reduce_blocks = (hidden + kReduceThreads - 1) / kReduceThreads;
  if (max_tiles > kMaxGridY || reduce_blocks > kMaxGridY || act_blocks > INT_MAX ||
      down_blocks > INT_MAX) {
    return cudaErrorInvalidValue;
  }
  const auto launch = [&](auto weight) {  // weight: a W value, selecting the instantiation
    using W = decltype(weight);
    for (int64_t t0 = 0; t0 < tokens; t0 += chunk) {
      const int64_t n = std::min(chunk, tokens - t0);
      cudaError_t error = LaunchKernel(
          programmatic, MoeGroupKernel, dim3(1), dim3(kGroupThreads), 0, stream,
          ids + t0 * ids_stride, ids_stride, static_cast<int>(n), static_cast<int>(top_k),
          static_cast<int>(num_experts), t0, ws.pairs, ws.tiles, ws.num_tiles, error_flag,
          error_code);
      if (error != cudaSuccess) return error;
      GroupedGemmArgs a;
      a.x = x + t0 * x_stride;
      a.x_stride = x_stride;
      a.act = act;
      a.partial = ws.partial;
      a.pairs = ws.pairs;
      a.tiles = ws.tiles;
      a.num_tiles = ws.num_tiles;
      a.experts = experts;
      a.top_k = top_k;
      a.hidden = hidden;
      a.inter = inter;
      const unsigned tiles = static_cast<unsigned>(MoeGroupedMaxTiles(n * top_k, num_experts));
      error = LaunchGroupedGemm<W, false>(a, dim3(static_cast<unsigned>(act_blocks), tiles),
                                          programmatic, stream);
      if (error == cudaSuccess) {
        error = LaunchGroupedGemm<W, true>(a, dim3(static_cast<unsigned>(down_blocks), tiles),
                                           programmatic, stream);
      }
      if (error == cudaSuccess) {
        error = LaunchKernel(
            programmatic, MoeGroupedReduceKernel,
            dim3(static_cast<unsigned>(n), static_cast<unsigned>(reduce_blocks)),
            dim3(kReduceThreads), 0, stream, ids + t0 * ids_stride, ids_stride,
            weights + t0 * weights_stride, weights_stride, num_experts, top_k, hidden, ws.partial,
            out + t0 * out_stride, out_stride, accumulate);
      }
      if (error != cudaSuccess) return error;
    }
    return cudaSuccess;
  };
  return weight_type == MoeWeightType::kBF16 ? launch(uint16_t{0}) : launch(0.0f);
}

}  // namespace eagle3::cuda
