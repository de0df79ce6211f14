// Pieces the two warpgroup (wgmma) latent kernels share: LatentWgmmaKernel
// (latent_wgmma_kernels.cu, both warpgroups on each chunk) and LatentWgmmaPairKernel
// (latent_wgmma_pair_kernels.cu, the warpgroups owning alternate chunks). Both are blocks of two
// warpgroups over one 64-row tile (latent_wgmma_layout.h) and built for sm_90a alone
// (eagle3_cuda_sm90a); device code only, no abseil.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "attention_common.cuh"
#include "latent_common.cuh"
#include "latent_wgmma_layout.h"

namespace eagle3::cuda {

inline constexpr int kWgmmaBlockThreads = 256;  // two warpgroups

// The bf16 bits of (lo, hi), rounded to nearest even, lo in the low half.
__device__ __forceinline__ uint32_t Bf16x2Bits(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Stages dims 0 .. 8 kRowPieces - 1 of the block's 64 query rows, rounded to bf16, into the
// swizzled panels at `qs` (WgmmaPieceOffset), one 16-byte piece (8 dims) a store: thread i takes
// pieces i, i + 256, ... of the 64 rows x kRowPieces (0 for rows the tile does not hold), kBatch of
// them loaded before any is stored, as float4 pairs where q's rows are 16-byte aligned.
template <int kRowPieces, int kBatch>
__device__ __forceinline__ void StageWgmmaQueries(const LatentArgs& a, const LatentTile& tile, int n0,
                                                  int tile_tokens, uint8_t* qs) {
  constexpr int kPiecesPerThread = kWgmmaRows * kRowPieces / kWgmmaBlockThreads;
  static_assert(kWgmmaRows * kRowPieces % kWgmmaBlockThreads == 0 && kPiecesPerThread % kBatch == 0,
                "every thread stages as many query pieces, in whole batches");
  const LatentLaunchParams& p = a.p;
  const int tid = static_cast<int>(threadIdx.x);
  const int heads = a.heads_per_tile;
  const bool q_vec =
      (reinterpret_cast<uintptr_t>(p.q) | static_cast<uintptr_t>(p.q_token_stride | p.q_head_stride) * 4) % 16 == 0;
#pragma unroll
  for (int u0 = 0; u0 < kPiecesPerThread; u0 += kBatch) {
    float v[kBatch][8];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int piece = tid + kWgmmaBlockThreads * (u0 + b);
      const int r = piece / kRowPieces, j = piece % kRowPieces;
      const float* src = nullptr;
      if (LatentRowHeld(a, n0, tile_tokens, r)) {
        const int64_t t = tile.q0 + tile.i0 + r / heads;
        src = p.q + t * p.q_token_stride + (n0 + r % heads) * p.q_head_stride + 8 * j;
      }
      if (src != nullptr && q_vec) {
        const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
        v[b][0] = lo.x, v[b][1] = lo.y, v[b][2] = lo.z, v[b][3] = lo.w;
        v[b][4] = hi.x, v[b][5] = hi.y, v[b][6] = hi.z, v[b][7] = hi.w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[b][e] = src != nullptr ? src[e] : 0.0f;
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int piece = tid + kWgmmaBlockThreads * (u0 + b);
      uint4 packed;
      packed.x = Bf16x2Bits(v[b][0], v[b][1]);
      packed.y = Bf16x2Bits(v[b][2], v[b][3]);
      packed.z = Bf16x2Bits(v[b][4], v[b][5]);
      packed.w = Bf16x2Bits(v[b][6], v[b][7]);
      *reinterpret_cast<uint4*>(qs + WgmmaPieceOffset(piece / kRowPieces, piece % kRowPieces)) = packed;
    }
  }
}

// Chunk c's mask words, written by the kWarps warps `warp` of one writer (a block or a warpgroup):
// bit k of allow_words[(c % 2) * 64 + lt] says whether token lt of the tile sees key k of the chunk
// (key s_begin + 64 c + k); used_by_warp[(c % 2) * kWarps + warp] is the OR of the words of warp
// `warp`, which takes tokens warp, warp + kWarps, ... Called by every lane of the warp.
template <int kWarps>
__device__ __forceinline__ void WriteWgmmaAllowWords(const LatentArgs& a, const LatentTile& tile, int tile_tokens,
                                                     int s_begin, int s_end, int c, int warp, uint64_t* allow_words,
                                                     uint64_t* used_by_warp) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int prefix = static_cast<int>(tile.kv - tile.n);  // checked: 0 <= n <= kv
  auto allow_byte = [&](int lt, int s) -> uint8_t {
    const int64_t allow_tokens = tile_tokens, allow_end = s_end, allow_prefix = prefix;
    return *LatentAllowByte{allow_tokens, allow_end, tile, a.p, allow_prefix}(lt, s);
  };
  uint64_t warp_or = 0;
  const int s = s_begin + kWgmmaChunk * c + lane;
#pragma unroll 1
  for (int lt = warp; lt < tile_tokens; lt += kWarps) {
    const uint32_t lo = __ballot_sync(kFullMask, allow_byte(lt, s) != 0);
    const uint32_t hi = __ballot_sync(kFullMask, allow_byte(lt, s + 32) != 0);
    const uint64_t word = lo | (static_cast<uint64_t>(hi) << 32);
    if (lane == 0) allow_words[(c % 2) * kWgmmaRows + lt] = word;
    warp_or |= word;
  }
  if (lane == 0) used_by_warp[(c % 2) * kWarps + warp] = warp_or;
}

// x *= f0 on the accumulator elements of the thread's row r0 and x *= f1 on those of row r0 + 8
// (the m64nNk16 f32 layout: elements 4 j, 4 j + 1 of row r0, 4 j + 2, 4 j + 3 of row r0 + 8).
template <int kN>
__device__ __forceinline__ void ScaleWgmmaRows(float (&x)[kN], float f0, float f1) {
  static_assert(kN % 4 == 0, "whole 8-column groups");
#pragma unroll
  for (int j = 0; j < kN / 4; ++j) {
    x[4 * j] *= f0;
    x[4 * j + 1] *= f0;
    x[4 * j + 2] *= f1;
    x[4 * j + 3] *= f1;
  }
}

// The end of both kernels, called by every thread once its last value product completed: each
// row's sum (the thread's share l0 / l1, its quad's, then both warpgroups', which must share the
// maxima m0 / m1 by then; `sums` is [2][64] floats of shared memory nothing reads any more) and
// the results of its rows written where LatentRowDestination says (the output, or the split's
// partials): the thread's columns 256 half + 8 j + 2 t4 + {0, 1} of rows r0 and r0 + 8 from `o` (the
// m64n256 accumulator of the warpgroup's half of the value dims). Maxima in the log2 domain.
__device__ __forceinline__ void StoreWgmmaRows(const LatentArgs& a, const LatentTile& tile, int n0, int half, int r0,
                                               bool held0, bool held1, float m0, float m1, float l0, float l1,
                                               const float (&o)[128], float* sums) {
  constexpr float kLn2 = 0.6931471805599453f;
  const int t4 = static_cast<int>(threadIdx.x) % 4;
  const int r1 = r0 + 8;
  const int heads = a.heads_per_tile;
#pragma unroll
  for (int offset = 1; offset <= 2; offset *= 2) {
    l0 += __shfl_xor_sync(kFullMask, l0, offset);
    l1 += __shfl_xor_sync(kFullMask, l1, offset);
  }
  __syncthreads();  // every read of `sums`' bytes done
  if (t4 == 0) {
    sums[half * kWgmmaRows + r0] = l0;
    sums[half * kWgmmaRows + r1] = l1;
  }
  __syncthreads();
  const float row_sums[2] = {sums[r0] + sums[kWgmmaRows + r0], sums[r1] + sums[kWgmmaRows + r1]};
  const float maxima[2] = {m0 * kLn2, m1 * kLn2};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = h == 0 ? r0 : r1;
    if (!(h == 0 ? held0 : held1)) continue;
    const int64_t t = tile.q0 + tile.i0 + row / heads;
    const int n = n0 + row % heads;
    const LatentRowOut dst = LatentRowDestination(a, t, n, maxima[h], row_sums[h], half == 0 && t4 == 0);
    // A thread holds column pairs: one 8-byte store a pair where the row allows it (always for the
    // split partials), so a quad's stores fill whole 32-byte sectors.
    if (reinterpret_cast<uintptr_t>(dst.values) % sizeof(float2) == 0) {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = kWgmmaHalfColumns * half + 8 * j + 2 * t4;
        *reinterpret_cast<float2*>(dst.values + col) =
            make_float2(o[4 * j + 2 * h] * dst.factor, o[4 * j + 2 * h + 1] * dst.factor);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int col = kWgmmaHalfColumns * half + 8 * j + 2 * t4;
        dst.values[col] = o[4 * j + 2 * h] * dst.factor;
        dst.values[col + 1] = o[4 * j + 2 * h + 1] * dst.factor;
      }
    }
  }
}

}  // namespace eagle3::cuda
