// Paged latent attention over a bf16 cache on the tensor cores (cuda/attention_ops.h, "Paged latent
// attention, fast path"): LatentMmaKernel, launched by LaunchLatentKernels in
// latent_decode_kernels.cu through LaunchLatentMma (latent_common.cuh). No abseil here: nvcc must
// never see it.
#include <algorithm>
#include <cstdint>

#include <cuda_bf16.h>
#include <math_constants.h>

#include "attention_common.cuh"
#include "attention_ops.h"
#include "core_kernels.cuh"
#include "latent_common.cuh"
#include "ptx.cuh"

namespace eagle3::cuda {
namespace {

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
// x 64 tokens is 1024 rows: with 16-row blocks the key stream is re-read 64 times and the chunk's
// barrier chain runs 64 times per key. 64-row blocks divide both by four; on calls of fewer rows
// (below kMmaWideMinRows, latent_plan.cc) 16-row blocks win, filling more SMs.

constexpr int kMmaThreads = 256;
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kMmaMaxKSteps = static_cast<int>(kLatentMaxKeyDim / 64);  // per dim quarter
constexpr int kRedStride = 36;  // floats per partial score row (float2 / float4 aligned)
constexpr int kPStride = 40;    // bf16 per probability row (80 bytes: conflict-free ldmatrix)
static_assert(kLatentMaxKeyDim % 64 == 0, "the dim quarters hold whole k-steps");

// Chunks in flight: four for 16-row blocks; three for 64-row blocks (their queries take 48 KiB more
// shared memory at key_dim 576).
__host__ __device__ constexpr int MmaStages(int groups) { return groups == 1 ? 4 : 3; }

__device__ inline uint16_t Bf16Bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

template <int kGroups>
__global__ void __launch_bounds__(kMmaThreads, 1) LatentMmaKernel(const LatentArgs a) {
  static_assert(kGroups == 1 || kGroups == 4, "16 or 64 rows");
  constexpr int kRows = 16 * kGroups;
  constexpr int kStages = MmaStages(kGroups);
  constexpr int kQuarters = 4 / kGroups;   // dim quarters of the score role
  constexpr int kRowThreads = 256 / kRows;  // softmax threads per row: 16 or 4
  constexpr int kRowKeys = kLatentChunk / kRowThreads;  // keys per softmax thread: 2 or 8
  constexpr int kValueTiles = 8 * kGroups;  // n-tiles of 8 columns per warp: 64 or 256 columns
  PdlEnter();
  if (*a.bad != 0) return;
  const LatentLaunchParams& p = a.p;
  LatentTile tile;
  if (!FindLatentTile(a, blockIdx.x, &tile)) return;
  const LatentKeyRange keys = LatentBlockKeys(a, tile);
  const int64_t s_begin = keys.begin, s_end = keys.end;
  if (s_begin >= s_end) return;  // the combine reads only the splits that hold keys (and counts no other)
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
  StageLatentQueries<kRows, kMmaThreads>(a, tile, n0, tile_tokens, rs,
                                          [&](int i, float v) { qs[i] = Bf16Bits(v); });
  // Pad dims are never copied: zero them once in every stage (pad x 0 must not be NaN). Warp w
  // takes staged rows w, w + 8, ...: no division per element (this runs once per block, and at
  // one chunk per block its instructions count).
  const int pad = rs - 8 - key_dim;
  for (int row = warp; row < kStages * kLatentChunk; row += kMmaWarps) {
    for (int e = lane; e < pad; e += 32) ks[row * rs + key_dim + e] = 0;
  }

  const LatentAllowByte allow_byte{tile_tokens, s_end, tile, p, prefix};
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
      const uint16_t* src = p.cache_bf16 + LatentCacheRow(page[k], s, p.page_size) * key_dim;
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
      const unsigned keep0 = LatentKeepKeyPair(used, 16 * kk + 2 * t4);
      const unsigned keep1 = LatentKeepKeyPair(used, 16 * kk + 8 + 2 * t4);
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
    const LatentRowOut dst = LatentRowDestination(a, t, n, row_m[row], row_l[row],
                                                  blockIdx.z % a.value_tiles == 0 && warp / kGroups == 0 && t4 == 0);
#pragma unroll
    for (int j = 0; j < kValueTiles; ++j) {
      const int64_t col = vcol + 8 * j + 2 * t4;
      if (col < p.value_dim) dst.values[col] = o[j][2 * half] * dst.factor;
      if (col + 1 < p.value_dim) dst.values[col + 1] = o[j][2 * half + 1] * dst.factor;
    }
  }
  // Not with four row groups: the 64-row kernel is at its register limit, and the sequence length the
  // fold needs, kept live through the key loop, spills (LatentMmaFolds).
  if constexpr (kGroups == 1) {
    if (a.fold_combine) {
      LatentFoldCombine<kMmaThreads, kRows>(a, tile, n0, tile_tokens, reinterpret_cast<float*>(mma_shared));
    }
  }
}

}  // namespace

bool LatentMmaFolds(int groups) { return groups == 1; }

int MmaRowStride(int64_t key_dim) { return static_cast<int>((key_dim + 63) / 64 * 64 + 8); }

// Queries, staged chunks, partial scores (64 rows x kRedStride in either layout: 4 quarters x 16
// rows or 1 x 64), probabilities, per-row state.
size_t MmaSharedBytes(int64_t key_dim, int groups) {
  const size_t rs = static_cast<size_t>(MmaRowStride(key_dim));
  const size_t rows = static_cast<size_t>(16 * groups);
  return 2 * rs * (rows + MmaStages(groups) * kLatentChunk) + 4 * (64 * kRedStride) +
         2 * (rows * kPStride) + 4 * (3 * rows + kMmaWarps);
}

cudaError_t LaunchLatentMma(const LatentArgs& a, int groups, dim3 grid, size_t shared_bytes,
                            bool programmatic, cudaStream_t stream) {
  return LaunchWithSharedMemory(groups == 4 ? LatentMmaKernel<4> : LatentMmaKernel<1>, grid,
                                kMmaThreads, shared_bytes, programmatic, stream, a);
}

size_t LatentBf16SharedBytes(int64_t key_dim) { return MmaSharedBytes(key_dim, 1); }

}  // namespace eagle3::cuda
