// Paged latent attention over a bf16 cache at DeepSeek's latent shape (key rows of 576 = the
// 512-wide compressed KV + 64 RoPE dims, values the first 512), 16 query rows per block, on the
// tensor cores: LatentCompactKernel, launched by LaunchLatentKernels (latent_decode_kernels.cu)
// through LaunchLatentCompact (latent_common.cuh) wherever it applies. No abseil here: nvcc must
// never see it.
//
// Why a kernel of its own next to LatentMmaKernel (latent_mma_kernels.cu): a decode step of one
// sequence spreads its keys over many splits, so each block runs its code once or a few times.
// Straight-line code executed once is fetched from L2 instruction by instruction: the general
// kernel (any key_dim up to kLatentMaxKeyDim, unrolled for the largest, 64-bit index math
// throughout) is ten thousand instructions, and at one chunk per block its blocks spend most of
// their time waiting for instructions, not data. Here every size is a compile-time constant, the
// per-block setup is a short loop, and index math is 32-bit: the kernel is a small fraction of that,
// and a block's pass is bounded by its keys' memory latency.
//
// Layout (mma.sync m16n8k16 and ldmatrix fragment layouts: ptx.cuh). A block is 16 warps and one
// split of one 16-row tile's keys, computed in 64-key chunks and staged by cp.async in 32-key slots,
// a ring of five: while a chunk's two slots are computed, the next three are in flight (each thread
// fetches its key's page entry an iteration before it copies the row). Why slots: a block is alone
// on its SM (the staging takes nearly all of its shared memory), so the bytes it keeps in flight set
// its bandwidth; two whole 64-key stages would keep one chunk in flight, three do not fit. Scores: warp
// w takes dim quarter w % 4 (9 k-steps; its query fragments stay in registers for the whole block)
// and keys 16 (w / 4) .. + 15; the four quarters' partial tiles meet in shared memory. Softmax: warp
// w is row w (two keys per lane), fp32, online. Values: warp w owns output columns 32 w .. 32 w + 31
// for all 16 rows, A = the probabilities in bf16; B registers of keys no row allows are zeroed
// (such cache rows may hold anything). Why 16 warps: each chunk is three dependent phases (scores,
// softmax, values) separated by barriers, each a short chain of tensor-core and shared-memory
// latencies; twice the warps halve every warp's chain, which is what bounds a chunk. Staged rows
// are padded by 16 bytes (row stride = 73 x 16 bytes): ldmatrix is conflict-free. Results go where
// LatentMmaKernel's go (the output, or the split partials that LatentCombineKernel or the last of
// the tile's blocks merges: LatentFoldCombine).
#include <cstdint>

#include <cuda_bf16.h>
#include <math_constants.h>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "core_kernels.cuh"
#include "latent_common.cuh"
#include "programmatic_launch.cuh"
#include "ptx.cuh"

namespace eagle3::cuda {
namespace {

constexpr int kCompactThreads = 512;
constexpr int kCompactWarps = kCompactThreads / 32;
constexpr int kRows = 16;
constexpr int kDim = static_cast<int>(kLatentCompactKeyDim);
constexpr int kValueDim = static_cast<int>(kLatentCompactValueDim);
constexpr int kChunk = 64;                            // keys per computed chunk
constexpr int kSlot = 32;                             // keys per staged slot (a half chunk)
constexpr int kSlots = 5;                             // slots in the ring
constexpr int kStride = kDim + 8;                     // bf16 per staged row
constexpr int kQuarterSteps = kDim / 64;              // k-steps of 16 dims per dim quarter
constexpr int kPieces = kDim / 8;                     // 16-byte pieces per key row
constexpr int kSlices = kCompactWarps / 4;            // key slices of the score role
constexpr int kSliceKeys = kChunk / kSlices;          // keys per score warp: two n-tiles
constexpr int kWarpColumns = kValueDim / kCompactWarps;  // value columns per warp
constexpr int kLanesPerKey = kCompactThreads / kSlot;    // threads copying one key row
constexpr int kPiecesPerLane = (kPieces + kLanesPerKey - 1) / kLanesPerKey;
constexpr int kRedStride = kChunk + 8;                // floats per partial score row
constexpr int kPStride = kChunk + 8;                  // bf16 per probability row
constexpr int kWords = kChunk / 32;                   // 32-bit words of a chunk's key bits
static_assert(kDim % 64 == 0 && kValueDim % (16 * kCompactWarps) == 0, "whole tiles");
static_assert(kValueDim <= kDim, "values are the first columns of a key row");
static_assert(kSliceKeys == 16 && kCompactWarps == kRows, "two n-tiles per score warp, a warp per row");
static_assert(kChunk == 2 * kSlot && kSlot % kSliceKeys == 0, "a chunk is two slots; a slice sits in one");

constexpr size_t kCompactSharedBytes =
    2 * static_cast<size_t>(kStride) * (kRows + kSlots * kSlot) + 4 * static_cast<size_t>(4 * kRows * kRedStride) +
    2 * static_cast<size_t>(kRows * kPStride) + 4 * static_cast<size_t>(3 * kRows + kCompactWarps * kWords);

__device__ inline uint32_t Bf16Pair(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Keeps the bf16 halves of a B register whose keys (key, key + 1) are set in `bits`.
__device__ inline unsigned KeepPair(unsigned bits, int key) {
  return (((bits >> key) & 1u) != 0 ? 0x0000ffffu : 0u) |
         (((bits >> (key + 1)) & 1u) != 0 ? 0xffff0000u : 0u);
}

__global__ void __launch_bounds__(kCompactThreads, 1) LatentCompactKernel(const LatentArgs a) {
  // Before PdlWait (see LaunchLatentCompact): the tile, the query rows and the first page entries,
  // every index bounded even if the metadata is bad; no cache row, no `bad`.
  if (a.wait_first) PdlWait();
  // Lets the next kernel's blocks start where this kernel leaves room: the combine's, or, where this
  // kernel merges the splits itself (a.fold_combine), the weight-streaming GEMV's.
  PdlLaunchDependents();
  const LatentLaunchParams& p = a.p;
  LatentBlockStart start;
  if (!StartLatentBlock(a, &start)) return;
  const LatentTile& tile = start.tile;
  const LatentKeyRange keys = start.keys;
  const int heads_per_tile = a.heads_per_tile;
  const int n0 = start.n0;
  const int tile_tokens = start.tile_tokens;
  // Key positions fit 32 bits (the launcher's bound on max_kv_len).
  const int s_begin = static_cast<int>(keys.begin), s_end = static_cast<int>(keys.end);
  const int prefix = static_cast<int>(tile.kv - tile.n);
  const int page_size = static_cast<int>(p.page_size);

  extern __shared__ float4 compact_shared[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(compact_shared);                 // [16][kStride]
  uint16_t* ks = qs + kRows * kStride;                                        // [slots][32][kStride]
  float* red = reinterpret_cast<float*>(ks + kSlots * kSlot * kStride);       // [4][16][kRedStride]
  uint16_t* ps = reinterpret_cast<uint16_t*>(red + 4 * kRows * kRedStride);   // [16][kPStride]
  float* row_alpha = reinterpret_cast<float*>(ps + kRows * kPStride);         // [16]
  float* row_m = row_alpha + kRows;                                           // [16]
  float* row_l = row_m + kRows;                                               // [16]
  unsigned* used_by_warp = reinterpret_cast<unsigned*>(row_l + kRows);        // [16][words]

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int mat = lane / 8;  // the ldmatrix matrix this lane addresses
  const int mrow = lane % 8;

  // Copy role: thread tid copies pieces (tid % kLanesPerKey) + kLanesPerKey j of key
  // tid / kLanesPerKey of each slot; keys past the split are zero-filled, not read. Slot u (keys
  // s_begin + 32 u ..) lives in ring entry u % kSlots; chunk c is slots 2c and 2c + 1.
  const int copy_key = tid / kLanesPerKey;
  const int copy_piece = tid % kLanesPerKey;
  auto page_of = [&](int u) {
    const int s = s_begin + kSlot * u + copy_key;
    return s < s_end ? tile.pages[static_cast<uint32_t>(s) / page_size] : 0;
  };
  auto issue = [&](int u, int32_t page) {
    const int s = s_begin + kSlot * u + copy_key;
    const bool valid = s < s_end;
    const int64_t row = static_cast<int64_t>(page) * page_size + (s - (static_cast<uint32_t>(s) / page_size) * page_size);
    const uint16_t* src = p.cache_bf16 + (valid ? row * kDim : 0);
    uint16_t* dst = ks + ((u % kSlots) * kSlot + copy_key) * kStride;
#pragma unroll
    for (int j = 0; j < kPiecesPerLane; ++j) {
      const int piece = copy_piece + kLanesPerKey * j;
      if (kPieces % kLanesPerKey == 0 || piece < kPieces) CpAsync16OrZero(dst + 8 * piece, src + 8 * piece, valid);
    }
  };

  const int chunks = (s_end - s_begin + kChunk - 1) / kChunk;
  const int slots = 2 * chunks;  // the last may be past the split: zero-filled, masked
  // Page entries of the next two slots to issue (fetched an iteration before they are used).
  int32_t page_a = page_of(0), page_b = page_of(1), page_c = page_of(2);

  // Queries: warp w stages row w, lanes along the dims, rounded to bf16. Block row r is token
  // i0 + r / H of the tile, head n0 + r % H (H = heads_per_tile).
  auto row_held = [&](int r) {
    return r < heads_per_tile * a.tokens_per_tile && r / heads_per_tile < tile_tokens && n0 + r % heads_per_tile < p.heads;
  };
  {
    const int r = warp;
    const int64_t t = tile.q0 + tile.i0 + r / heads_per_tile;
    const bool held = row_held(r) && t >= 0 && t < p.tokens;
    const float* src = held ? p.q + t * p.q_token_stride + (n0 + r % heads_per_tile) * p.q_head_stride : nullptr;
    float v[kDim / 64], w[kDim / 64];
#pragma unroll
    for (int j = 0; j < kDim / 64; ++j) {
      v[j] = held ? src[2 * lane + 64 * j] : 0.0f;
      w[j] = held ? src[2 * lane + 64 * j + 1] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kDim / 64; ++j) {
      *reinterpret_cast<uint32_t*>(qs + r * kStride + 2 * lane + 64 * j) = Bf16Pair(v[j], w[j]);
    }
  }

  PdlWait();  // the check has completed
  if (*a.bad != 0) return;
  // Slots 0-2 in flight, one commit group each; iteration c issues slots 2c + 3 and 2c + 4.
  issue(0, page_a);
  CpAsyncCommit();
  if (1 < slots) issue(1, page_b);
  CpAsyncCommit();
  if (2 < slots) issue(2, page_c);
  CpAsyncCommit();
  page_a = page_of(3);
  page_b = page_of(4);

  // Softmax role: warp w is row w; lane l takes keys 2 l, 2 l + 1 of each chunk.
  const int sr = warp;
  const int sk = 2 * lane;
  const int sr_token = sr / heads_per_tile;
  const bool sr_valid = row_held(sr);
  // Which keys row sr sees: the one statement of the rule the latent kernels share.
  const int64_t allow_tokens = tile_tokens, allow_end = s_end, allow_prefix = prefix;
  const LatentAllowByte allow_byte{allow_tokens, allow_end, tile, p, allow_prefix};
  auto allowed = [&](int s) -> bool { return sr_valid && *allow_byte(sr_token, s) != 0; };
  float m_run = -CUDART_INF_F, l_run = 0.0f;

  __syncthreads();  // qs staged
  const int quarter = warp % 4;
  const int slice = warp / 4;
  unsigned qa[kQuarterSteps][4];
  {
    const uint16_t* q_rows = qs + ((mat % 2) * 8 + mrow) * kStride + (mat / 2) * 8 + quarter * (kDim / 4);
#pragma unroll
    for (int i = 0; i < kQuarterSteps; ++i) LdMatrixX4(qa[i], q_rows + 16 * i);
  }
  const int vcol = kWarpColumns * warp;
  float o[kWarpColumns / 8][4];
#pragma unroll
  for (int j = 0; j < kWarpColumns / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

#pragma unroll 1
  for (int c = 0; c < chunks; ++c) {
    const int base = s_begin + c * kChunk;
    // Keys 0-31 of the chunk in ring entry (2c) % kSlots, keys 32-63 in (2c + 1) % kSlots.
    const uint16_t* const low_half = ks + ((2 * c) % kSlots) * kSlot * kStride;
    const uint16_t* const high_half = ks + ((2 * c + 1) % kSlots) * kSlot * kStride;
    CpAsyncWait<1>();  // slots 2c and 2c + 1 (2c + 2 may still be in flight)
    __syncthreads();   // ... staged by every thread; chunk c - 1's entries and buffers are free
    {
      // Ring entries (2c + 3) % 5 and (2c + 4) % 5 held chunk c - 1.
      if (2 * c + 3 < slots) issue(2 * c + 3, page_a);
      CpAsyncCommit();
      if (2 * c + 4 < slots) issue(2 * c + 4, page_b);
      CpAsyncCommit();
      page_a = page_of(2 * c + 5);
      page_b = page_of(2 * c + 6);
    }

    // Partial scores of 16 rows x this warp's 16 keys over its dim quarter, in two chains per
    // n-tile (even and odd k-steps) for the tensor pipe's latency.
    {
      float sacc[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.0f;
      const uint16_t* k_rows = (slice < 2 ? low_half : high_half) + ((slice % 2) * kSliceKeys + (mat / 2) * 8 + mrow) * kStride +
                               (mat % 2) * 8 + quarter * (kDim / 4);
#pragma unroll
      for (int i = 0; i < kQuarterSteps; ++i) {
        unsigned kb[4];
        LdMatrixX4(kb, k_rows + 16 * i);
        MmaBf16(sacc[2 * (i % 2)], qa[i], kb[0], kb[1]);
        MmaBf16(sacc[2 * (i % 2) + 1], qa[i], kb[2], kb[3]);
      }
      float* part = red + quarter * kRows * kRedStride;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int key = slice * kSliceKeys + 8 * nt + 2 * t4;
        *reinterpret_cast<float2*>(part + g * kRedStride + key) =
            make_float2(sacc[nt][0] + sacc[2 + nt][0], sacc[nt][1] + sacc[2 + nt][1]);
        *reinterpret_cast<float2*>(part + (g + 8) * kRedStride + key) =
            make_float2(sacc[nt][2] + sacc[2 + nt][2], sacc[nt][3] + sacc[2 + nt][3]);
      }
    }
    __syncthreads();  // partial scores written

    // Online softmax of row sr over its warp.
    {
      float sc[2] = {0.0f, 0.0f};
#pragma unroll
      for (int q4 = 0; q4 < 4; ++q4) {
        const float2 v = *reinterpret_cast<const float2*>(red + (q4 * kRows + sr) * kRedStride + sk);
        sc[0] += v.x;
        sc[1] += v.y;
      }
      unsigned bits = 0;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const bool allow = allowed(base + sk + k);
        sc[k] = allow ? p.scale * sc[k] : -CUDART_INF_F;
        bits |= allow ? 1u << k : 0u;
      }
      const float chunk_max = WarpMax(fmaxf(sc[0], sc[1]));
      const float new_max = fmaxf(m_run, chunk_max);
      float alpha = 1.0f;  // no allowed key yet: m = -inf, l = 0 stay
      if (new_max != -CUDART_INF_F) {
        sc[0] = __expf(sc[0] - new_max);
        sc[1] = __expf(sc[1] - new_max);
        alpha = __expf(m_run - new_max);
      } else {
        sc[0] = sc[1] = 0.0f;
      }
      l_run = l_run * alpha + WarpSum(sc[0] + sc[1]);
      m_run = new_max;
      *reinterpret_cast<uint32_t*>(ps + sr * kPStride + sk) = Bf16Pair(sc[0], sc[1]);
      if (lane == 0) row_alpha[sr] = alpha;
      // Lane l's keys sit at bits 2 (l % 16) of word l / 16.
#pragma unroll
      for (int w = 0; w < kWords; ++w) {
        const unsigned row_bits = __reduce_or_sync(kFullMask, lane / 16 == w ? bits << (2 * (lane % 16)) : 0u);
        if (lane == 0) used_by_warp[warp * kWords + w] = row_bits;
      }
    }
    __syncthreads();  // probabilities, alpha and key bits written

    unsigned used[kWords];  // keys of the chunk some row allows (block-uniform)
    unsigned any = 0;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      used[w] = 0;
#pragma unroll
      for (int u = 0; u < kCompactWarps; ++u) used[w] |= used_by_warp[u * kWords + w];
      any |= used[w];
    }
    if (any == 0) continue;  // every alpha is 1
    const float alpha_lo = row_alpha[g], alpha_hi = row_alpha[g + 8];
#pragma unroll
    for (int j = 0; j < kWarpColumns / 8; ++j) {
      o[j][0] *= alpha_lo;
      o[j][1] *= alpha_lo;
      o[j][2] *= alpha_hi;
      o[j][3] *= alpha_hi;
    }
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      unsigned pa[4];
      LdMatrixX4(pa, ps + ((mat % 2) * 8 + mrow) * kPStride + 16 * kk + (mat / 2) * 8);
      const unsigned word = used[kk / 2];
      const unsigned keep0 = KeepPair(word, 16 * (kk % 2) + 2 * t4);
      const unsigned keep1 = KeepPair(word, 16 * (kk % 2) + 8 + 2 * t4);
      const uint16_t* v_rows = (kk < 2 ? low_half : high_half) + (16 * (kk % 2) + (mat % 2) * 8 + mrow) * kStride + (mat / 2) * 8 + vcol;
#pragma unroll
      for (int jj = 0; jj < kWarpColumns / 16; ++jj) {
        unsigned vb[4];
        LdMatrixX4Trans(vb, v_rows + 16 * jj);
        MmaBf16(o[2 * jj], pa, vb[0] & keep0, vb[1] & keep1);
        MmaBf16(o[2 * jj + 1], pa, vb[2] & keep0, vb[3] & keep1);
      }
    }
  }
  CpAsyncWait<0>();

  if (lane == 0) {
    row_m[sr] = m_run;
    row_l[sr] = l_run;
  }
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = g + 8 * half;
    if (!row_held(row)) continue;
    const int64_t t = tile.q0 + tile.i0 + row / heads_per_tile;
    const int n = n0 + row % heads_per_tile;
    const LatentRowOut dst = LatentRowDestination(a, t, n, row_m[row], row_l[row], warp == 0 && t4 == 0);
#pragma unroll
    for (int j = 0; j < kWarpColumns / 8; ++j) {
      const int col = vcol + 8 * j + 2 * t4;
      dst.values[col] = o[j][2 * half] * dst.factor;
      dst.values[col + 1] = o[j][2 * half + 1] * dst.factor;
    }
  }
  if (a.fold_combine) {
    LatentFoldCombine<kCompactThreads, kRows>(a, tile, n0, tile_tokens, reinterpret_cast<float*>(compact_shared));
  }
}

}  // namespace

bool LatentCompactApplies(const LatentLaunchParams& p, int rows) {
  return rows == kRows && LatentAtCompactShape(p);
}

int LatentCompactChunk() { return kChunk; }

size_t LatentCompactSharedBytes() { return kCompactSharedBytes; }

cudaError_t LaunchLatentCompact(const LatentArgs& a, dim3 grid, bool programmatic, cudaStream_t stream) {
  const cudaError_t error = cudaFuncSetAttribute(LatentCompactKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(kCompactSharedBytes));
  if (error != cudaSuccess) return error;
  return LaunchKernel(programmatic, LatentCompactKernel, grid, dim3(kCompactThreads), kCompactSharedBytes, stream, a);
}

}  // namespace eagle3::cuda
