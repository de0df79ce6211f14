// The quantized small-M product (cuda/quant_gemv_ops.h). No abseil here: nvcc must never see it.
//
// One kernel skeleton serves both formats (Fp8Format, Int4Format below). Each m16n8k16 tensor-core
// product takes the activation rows as its 16-row A operand and 8 weight rows as its B operand, so
// every M up to 16 costs the same products, and an 8-row weight tile is the unit of work.
//
// Work split: a block of 8 warps covers 128 / wk weight rows; each warp two 8-row tiles (16 rows),
// and the wk warps of a row group split the block's columns between them step by step (a step is
// the 64 (fp8) or 128 (int4) columns that the 4 lanes of a tile row load as one 16-byte chunk
// each). Where the rows alone give too few blocks for the machine (skinny n), a cluster of up to 8
// blocks splits the columns further and adds its partial sums through distributed shared memory in
// rank order. Every sum is taken in a fixed order (lane chunks in step order, warps of a group in
// warp order, cluster ranks in rank order): the same result every run.
//
// Streaming: each lane keeps kDepth steps of weight chunks (both tiles) in flight in a register
// ring, the first kDepth issued before the programmatic-launch wait, and refills a slot as soon as
// it is consumed. Weight chunks are read with evict-first 16-byte loads; int4 group scales ride in
// the same ring (two bf16 per chunk, for a chunk that straddles a group boundary); fp8 block scales
// (one per 128 x 128 block) are staged in shared memory with the activations.
//
// Activations are staged a tile of steps at a time in shared memory as bf16, in "slots" of 8
// columns permuted to the order in which the format unpacks its weights, and laid out so that the 8
// lanes of each 16-byte shared-memory read phase hit 8 distinct slots of one 128-byte line. The
// weight ring keeps streaming across a restaging.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "programmatic_launch.cuh"
#include "ptx.cuh"
#include "quant_gemv_ops.h"

namespace eagle3::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTiles = 2;                        // 8-row weight tiles per warp
constexpr int kWarpRows = 8 * kTiles;            // weight rows per warp
constexpr int kBlockRows = kWarpRows * kWarps;   // weight rows per block with wk = 1
constexpr int kDepth = 6;                        // steps a lane has in flight
constexpr int kMaxSplit = 8;                     // blocks per cluster (portable cluster size)
constexpr int kActBytes = 32 * 1024;             // activation tile
// Partial sums at the end: per warp, tile, lane and fragment element, then per block row and M.
constexpr int kWarpPartFloats = kWarps * kTiles * 32 * 4;
constexpr int kReduceBytes = (kWarpPartFloats + kBlockRows * kQuantGemvMaxRows) * 4;
constexpr int kAreaBytes = kActBytes > kReduceBytes ? kActBytes : kReduceBytes;
// Largest k and col0 taken: column and step arithmetic stays in 32 bits.
constexpr int64_t kMaxColumn = int64_t{1} << 29;

struct Params {
  const void* a;
  int64_t lda, stride_a;
  bool a_bf16;
  bool a_vec;  // every activation row of every item 16-byte aligned: 16-byte loads
  const char* b;               // codes (fp8) or packed words (int4)
  int64_t ldb, stride_b;       // bytes
  const void* scale;           // f32 scale_inv (fp8) or bf16 weight_scale (int4)
  int64_t scale_ld, scale_stride;
  int64_t row0;
  int col0;                    // <= 2^29, as is k: column sums and step indices stay in 32 bits
  int group_shift;             // int4: log2(group_size)
  float* c;
  int64_t ldc, stride_c;
  const float* bias;
  int m;
  int halves;                  // 16-byte activation slots per lane read: rows 0-7, and 8-15 when m > 8
  int64_t n;
  int k;
  float alpha, beta;
  int shift;                   // virtual columns before column 0 (fp8: col0 % 64)
  int steps;                   // steps covering shift + k columns
  int rank_steps;              // steps per cluster rank
  int wk;                      // warps per row group: 1, 2, 4 or 8
  int split;                   // blocks per cluster: 1 .. kMaxSplit
  int tile_steps;              // steps per activation tile, a multiple of wk
};

template <typename T>
__device__ __forceinline__ T BitCast(uint32_t bits) {
  T out;
  memcpy(&out, &bits, sizeof(out));
  return out;
}
template <typename T>
__device__ __forceinline__ uint32_t Bits(T value) {
  uint32_t out;
  memcpy(&out, &value, sizeof(out));
  return out;
}

// The weight rows a lane loads (row g of each tile; rows past n read row n - 1, whose results are
// not written) and whether each tile has any row below n (a tile wholly past n is not read).
struct LaneRows {
  const char* row[kTiles];
  bool active[kTiles];
};

// ---- FP8 block-scaled ----------------------------------------------------------------------------
//
// Lane (g, c)'s chunk of a step is 16 codes of row g at columns 16c .. 16c + 15 of the step, word
// j (4 codes) feeding product j of the step. A word's codes 0 and 2 become one bf16 pair and 1 and
// 3 the other, by moving each code's exponent and mantissa into bf16's fields (and its sign to
// bf16's sign) and multiplying by 2^120, the difference of the two exponent biases: exact, e4m3
// subnormals included. Steps are aligned to global 64-column boundaries (the first starts `shift`
// columns before column 0), so every product lies in one 128-column scale block; the products of a
// block accumulate in `part`, which is multiplied by the block's scale into `sum` when the warp
// moves to another block.
struct Fp8Format {
  static constexpr int kStepK = 64;
  static constexpr int kPieces = 2;  // 8-column activation slots per lane and step
  // Slot position i holds column SlotColumn(i) of the slot's 8: pairs (0, 2), (1, 3), (4, 6), (5, 7).
  __device__ static constexpr int SlotColumn(int i) { return (i & 4) | ((i & 1) << 1) | ((i >> 1) & 1); }
  // Scale blocks a tile's steps can touch: tile_steps / 2 + 1, with tile_steps <= 32.
  static constexpr int kScaleCols = 18;
  static constexpr int kScaleBytes = 2 * kScaleCols * 4;

  struct Item {
    uint4 w[kTiles];
  };

  struct State {
    float sum[kTiles][4];
    float part[kTiles][4];
    int block;                 // the scale column `part` belongs to, -1 for none
    unsigned second_row;       // bit 2t + h: output row 2c + h of tile t takes the second staged scale row
  };

  __device__ static void Init(const Params& p, int64_t warp_row, int64_t block_row, int c,
                              const float* staged, State& s) {
    const int64_t first = (p.row0 + block_row) >> 7;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s.sum[t][e] = s.part[t][e] = 0.0f;
    }
    s.second_row = 0u;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = min(warp_row + 8 * t + 2 * c + h, p.n - 1);
        if (((p.row0 + r) >> 7) != first) s.second_row |= 1u << (2 * t + h);
      }
    }
    s.block = -1;
  }

  __device__ static void Load(const Params& p, const LaneRows& rows, const State&, int step, int c, Item& item) {
    const int col = step * kStepK + 16 * c - p.shift;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      item.w[t] = make_uint4(0u, 0u, 0u, 0u);
      if (!rows.active[t] || col < 0 || col >= p.k) continue;
      const uint8_t* row = reinterpret_cast<const uint8_t*>(rows.row[t]);
      if (col + 16 <= p.k) {
        item.w[t] = __ldcs(reinterpret_cast<const uint4*>(row + col));  // read once: evict first
      } else {  // the row's partial last chunk, never read past k (zero codes are +0)
        uint32_t words[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          if (col + e < p.k) words[e / 4] |= static_cast<uint32_t>(row[col + e]) << (8 * (e % 4));
        }
        item.w[t] = make_uint4(words[0], words[1], words[2], words[3]);
      }
    }
  }

  // The global scale column (128-column block) of a step.
  __device__ static int BlockOf(const Params& p, int step) {
    return ((p.col0 - p.shift) / kStepK + step) >> 1;
  }

  // sum += part * scale of part's block (staged for the tile that starts at tile_step0); part = 0.
  __device__ static void Flush(const Params& p, const float* staged, int tile_step0, State& s) {
    if (s.block < 0) return;
    const int col = s.block - BlockOf(p, tile_step0);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      const float lo = staged[(s.second_row >> (2 * t) & 1u ? kScaleCols : 0) + col];
      const float hi = staged[(s.second_row >> (2 * t + 1) & 1u ? kScaleCols : 0) + col];
      s.sum[t][0] = fmaf(s.part[t][0], lo, s.sum[t][0]);
      s.sum[t][1] = fmaf(s.part[t][1], hi, s.sum[t][1]);
      s.sum[t][2] = fmaf(s.part[t][2], lo, s.sum[t][2]);
      s.sum[t][3] = fmaf(s.part[t][3], hi, s.sum[t][3]);
#pragma unroll
      for (int e = 0; e < 4; ++e) s.part[t][e] = 0.0f;
    }
    s.block = -1;
  }

  // Before a tile's activations replace the previous tile's (and its scales): fold the open block.
  __device__ static void EndTile(const Params& p, const float* staged, int tile_step0, State& s) {
    Flush(p, staged, tile_step0, s);
  }

  // Stages the f32 scale_inv entries of the tile's blocks for the block's (at most two) scale rows.
  __device__ static void StageScales(const Params& p, int64_t item, int64_t block_row, int step0, float* staged) {
    const int64_t first_row = (p.row0 + block_row) >> 7;
    const int64_t last_row = (p.row0 + min(block_row + kBlockRows / p.wk, p.n) - 1) >> 7;
    const int block0 = BlockOf(p, step0);
    const int last_block = (p.col0 + p.k - 1) >> 7;
    const float* scale = static_cast<const float*>(p.scale) + item * p.scale_stride;
    for (int i = threadIdx.x; i < 2 * kScaleCols; i += kThreads) {
      const int64_t r = first_row + i / kScaleCols;
      const int col = block0 + i % kScaleCols;
      staged[i] = r <= last_row && col <= last_block ? scale[r * p.scale_ld + col] : 0.0f;
    }
  }

  // The products of one step: 4 per tile, from piece pc's activation slots a0 (rows 0-7) and a1
  // (rows 8-15).
  template <typename Slots>
  __device__ static void Step(const Params& p, const Item& item, int step, const Slots& slots, const float* staged,
                              int tile_step0, State& s) {
    const int block = BlockOf(p, step);
    if (block != s.block) {
      Flush(p, staged, tile_step0, s);
      s.block = block;
    }
    const __nv_bfloat162 bias2 = BitCast<__nv_bfloat162>(0x7B807B80u);  // 2^120 in both halves
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) {
      const uint4 lo = slots.Lo(pc), hi = slots.Hi(pc);
      const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
      const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const uint32_t w0 = pc == 0 ? item.w[t].x : item.w[t].z;
        const uint32_t w1 = pc == 0 ? item.w[t].y : item.w[t].w;
        MmaBf16(s.part[t], a0, Widen(w0, true, bias2), Widen(w0, false, bias2));
        MmaBf16(s.part[t], a1, Widen(w1, true, bias2), Widen(w1, false, bias2));
      }
    }
  }

  // Codes 0 and 2 (even) or 1 and 3 of a word as a bf16 pair, exactly.
  __device__ static uint32_t Widen(uint32_t w, bool even, __nv_bfloat162 bias2) {
    const uint32_t moved = even ? ((w << 4) & 0x07f007f0u) | ((w << 8) & 0x80008000u)
                                : ((w >> 4) & 0x07f007f0u) | (w & 0x80008000u);
    return Bits(__hmul2(BitCast<__nv_bfloat162>(moved), bias2));
  }

  __device__ static float Result(const State& s, int t, int e) { return s.sum[t][e]; }
};

// ---- INT4 group-quantized ------------------------------------------------------------------------
//
// Lane (g, c)'s chunk of a step is 4 packed words of row g (32 columns at 32c .. 32c + 31 of the
// step); word j feeds products 2j and 2j + 1 of the step with the nibble pairs (0, 4), (1, 5) and
// (2, 6), (3, 7). A nibble u becomes the bf16 128 + u by setting bf16 128's low mantissa bits, then
// q = u - 8 exactly and w = bf16(q * scale), rounded once. The chunk's scales: the group of its
// first word and, when the chunk straddles a group boundary (col0 not a multiple of 32, or a larger
// group), the next group's.
struct Int4Format {
  static constexpr int kStepK = 128;
  static constexpr int kPieces = 4;
  // Slot position i holds column SlotColumn(i): pairs (0, 4), (1, 5), (2, 6), (3, 7).
  __device__ static constexpr int SlotColumn(int i) { return (i >> 1) | ((i & 1) << 2); }
  static constexpr int kScaleBytes = 0;

  struct Item {
    uint4 w[kTiles];
    uint32_t scales[kTiles];  // bf16 scale of the chunk's first word (low), the next group's (high)
  };

  struct State {
    float acc[kTiles][4];
    const uint16_t* scale_row[kTiles];
  };

  __device__ static void Init(const Params& p, int64_t warp_row, int64_t block_row, int c,
                              const float* staged, State& s) {
    (void)block_row, (void)c, (void)staged;
    const int g = (threadIdx.x % 32) / 4;
    const int64_t item = blockIdx.y;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s.acc[t][e] = 0.0f;
      const int64_t r = min(warp_row + 8 * t + g, p.n - 1);
      s.scale_row[t] = static_cast<const uint16_t*>(p.scale) + item * p.scale_stride + r * p.scale_ld;
    }
  }

  // Words of the chunk's first group: 1 .. 4.
  __device__ static int FirstGroupWords(const Params& p, int col) {
    const int size = 1 << p.group_shift;
    const int words = (size - ((p.col0 + col) & (size - 1))) >> 3;
    return words < 4 ? words : 4;
  }

  __device__ static void Load(const Params& p, const LaneRows& rows, const State& s, int step, int c, Item& item) {
    const int col = step * kStepK + 32 * c;
    const int word0 = col / 8, words = (p.k + 7) / 8;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      item.w[t] = make_uint4(0u, 0u, 0u, 0u);
      if (!rows.active[t] || col >= p.k) continue;
      const uint32_t* row = reinterpret_cast<const uint32_t*>(rows.row[t]);
      if (word0 + 4 <= words) {
        item.w[t] = __ldcs(reinterpret_cast<const uint4*>(row + word0));  // read once: evict first
      } else {  // the row's partial last chunk, never read past its last word
        uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (word0 + e < words) w[e] = row[word0 + e];
        }
        item.w[t] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
    // The scales after the weights, so that the weight loads issue first.
    const int group = (p.col0 + col) >> p.group_shift;
    const int first_words = FirstGroupWords(p, col);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      item.scales[t] = 0u;
      if (!rows.active[t] || col >= p.k) continue;
      const uint32_t first = __ldg(s.scale_row[t] + group);
      const uint32_t next =
          first_words < 4 && word0 + first_words < words ? __ldg(s.scale_row[t] + group + 1) : first;
      item.scales[t] = first | (next << 16);
    }
  }

  __device__ static void EndTile(const Params&, const float*, int, State&) {}
  __device__ static void StageScales(const Params&, int64_t, int64_t, int, float*) {}

  template <typename Slots>
  __device__ static void Step(const Params& p, const Item& item, int step, const Slots& slots, const float*, int,
                              State& s) {
    const int c = threadIdx.x % 4;
    const int first_words = FirstGroupWords(p, step * kStepK + 32 * c);
    const __nv_bfloat162 minus_136 = BitCast<__nv_bfloat162>(0xC308C308u);  // -136, -136
    const __nv_bfloat162 one = BitCast<__nv_bfloat162>(0x3F803F80u);
    const __nv_bfloat162 neg_zero = BitCast<__nv_bfloat162>(0x80008000u);
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) {
      const uint4 lo = slots.Lo(pc), hi = slots.Hi(pc);
      const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
      const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
      for (int t = 0; t < kTiles; ++t) {
        const uint32_t w = pc == 0 ? item.w[t].x : pc == 1 ? item.w[t].y : pc == 2 ? item.w[t].z : item.w[t].w;
        const uint32_t scale = __byte_perm(item.scales[t], 0u, pc < first_words ? 0x1010u : 0x3232u);
        const __nv_bfloat162 s2 = BitCast<__nv_bfloat162>(scale);
        uint32_t pair[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t biased = ((w >> (4 * j)) & 0x000f000fu) | 0x43004300u;  // 128 + u, both halves
          const __nv_bfloat162 q = __hfma2(BitCast<__nv_bfloat162>(biased), one, minus_136);
          pair[j] = Bits(__hfma2(q, s2, neg_zero));
        }
        MmaBf16(s.acc[t], a0, pair[0], pair[1]);
        MmaBf16(s.acc[t], a1, pair[2], pair[3]);
      }
    }
  }

  __device__ static float Result(const State& s, int t, int e) { return s.acc[t][e]; }
};

// ---- The kernel skeleton -------------------------------------------------------------------------

// Index (in 16-byte slots) of the activation slot that lane (row8 = g, c) reads for piece `piece`
// of tile step `ts` and row half `half`: the 8 lanes of a read phase (g = 2i, 2i + 1; c = 0..3) get
// 8 consecutive slots.
template <typename F>
__device__ __forceinline__ int SlotIndex(int ts, int half, int halves, int row8, int piece, int c) {
  return ((((ts * halves + half) * 4 + row8 / 2) * F::kPieces + piece) * 8 + (row8 % 2) * 4) + c;
}

// The activation slots of one step as lane (g, c) reads them: rows g (lo) and g + 8 (hi), zeros for
// rows >= m.
template <typename F>
struct StepSlots {
  const uint4* act;
  int ts, halves, m, g, c;
  __device__ __forceinline__ uint4 Lo(int piece) const {
    return g < m ? act[SlotIndex<F>(ts, 0, halves, g, piece, c)] : make_uint4(0u, 0u, 0u, 0u);
  }
  __device__ __forceinline__ uint4 Hi(int piece) const {
    return g + 8 < m ? act[SlotIndex<F>(ts, 1, halves, g, piece, c)] : make_uint4(0u, 0u, 0u, 0u);
  }
};

// Slots a thread stages at once (their loads in flight together).
constexpr int kStageBatch = 2;

// Activation columns [lk, lk + 8) of row r, as floats (zeros outside 0 .. k - 1).
__device__ __forceinline__ void LoadColumns(const Params& p, const char* a, int r, int lk, float (&v)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = 0.0f;
  if (r >= p.m) return;
  const bool whole = lk >= 0 && lk + 8 <= p.k;
  if (p.a_bf16) {
    const uint16_t* row = reinterpret_cast<const uint16_t*>(a) + r * p.lda;
    if (whole && p.a_vec) {
      const uint4 q = *reinterpret_cast<const uint4*>(row + lk);
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = __uint_as_float(e % 2 == 0 ? words[e / 2] << 16 : words[e / 2] & 0xffff0000u);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (lk + e >= 0 && lk + e < p.k) v[e] = __uint_as_float(static_cast<uint32_t>(row[lk + e]) << 16);
      }
    }
  } else {
    const float* row = reinterpret_cast<const float*>(a) + r * p.lda;
    if (whole && p.a_vec) {
      const float4 q0 = *reinterpret_cast<const float4*>(row + lk);
      const float4 q1 = *reinterpret_cast<const float4*>(row + lk + 4);
      v[0] = q0.x, v[1] = q0.y, v[2] = q0.z, v[3] = q0.w, v[4] = q1.x, v[5] = q1.y, v[6] = q1.z, v[7] = q1.w;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (lk + e >= 0 && lk + e < p.k) v[e] = row[lk + e];
      }
    }
  }
}

// Stages the activations of steps [step0, step1) (tile step 0 = step0) as bf16 slots, in slot
// order (consecutive threads write consecutive slots); slots of rows >= m are never read and not
// written.
template <typename F>
__device__ void StageActivations(const Params& p, int64_t item, int step0, int step1, uint4* act) {
  const char* a = static_cast<const char*>(p.a) + item * p.stride_a * (p.a_bf16 ? 2 : 4);
  const int total = (step1 - step0) * p.halves * 32 * F::kPieces;
  for (int base = threadIdx.x; base < total; base += kThreads * kStageBatch) {
    float v[kStageBatch][8];
    int r[kStageBatch];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      int i = base + u * kThreads;
      const int c = i % 4;
      i /= 4;
      const int row_parity = i % 2;
      i /= 2;
      const int piece = i % F::kPieces;
      i /= F::kPieces;
      const int row_pair = i % 4;
      i /= 4;
      const int half = i % p.halves;
      const int ts = i / p.halves;
      r[u] = base + u * kThreads < total ? half * 8 + row_pair * 2 + row_parity : p.m;
      const int lk = (step0 + ts) * F::kStepK + 8 * (c * F::kPieces + piece) - p.shift;
      LoadColumns(p, a, r[u], lk, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      if (r[u] >= p.m) continue;
      uint32_t words[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(v[u][F::SlotColumn(2 * w)]));
        const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(v[u][F::SlotColumn(2 * w + 1)]));
        words[w] = lo | (hi << 16);
      }
      act[base + u * kThreads] = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

template <typename F>
__global__ void __launch_bounds__(kThreads, 2) QuantGemvKernel(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* act = reinterpret_cast<uint4*>(smem);
  float* staged_scales = reinterpret_cast<float*>(smem + kAreaBytes);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int group = warp / p.wk, part = warp % p.wk;
  const int rank = static_cast<int>(blockIdx.x) % p.split;
  const int64_t block_row = static_cast<int64_t>(blockIdx.x / p.split) * (kBlockRows / p.wk);
  const int64_t warp_row = block_row + group * kWarpRows;
  const int64_t item = blockIdx.y;
  const int step0 = rank * p.rank_steps;
  const int step_end = min(p.steps, step0 + p.rank_steps);
  const int block_steps = step_end > step0 ? step_end - step0 : 0;
  // Items (steps) of warp part 0, the most of any part: the loop bound every warp runs to, so that
  // all of them meet at the block barriers of the restagings.
  const int items = (block_steps + p.wk - 1) / p.wk;
  const int items_per_tile = p.tile_steps / p.wk;  // a multiple of kDepth unless one tile holds all

  LaneRows rows;
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
    const int64_t r = min(warp_row + 8 * t + g, p.n - 1);
    rows.row[t] = p.b + item * p.stride_b + r * p.ldb;
    rows.active[t] = warp_row + 8 * t < p.n;
  }
  typename F::State state;
  F::Init(p, warp_row, block_row, c, staged_scales, state);

  // The weights are not written by the step, so the first kDepth steps are read before the
  // kernels that write the activations (and c) have finished (programmatic_launch.cuh).
  typename F::Item ring[kDepth];
  PdlLaunchDependents();
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    const int step = step0 + part + p.wk * d;
    if (step < step_end) F::Load(p, rows, state, step, c, ring[d]);
  }
  PdlWait();

  // Tiles hold a whole number of kDepth items per warp (or the block's steps are one tile), so every
  // tile starts at ring slot 0.
  int tile_step0 = step0;
  for (int tile_item0 = 0; tile_item0 < items; tile_item0 += items_per_tile) {
    if (tile_item0 > 0) {
      F::EndTile(p, staged_scales, tile_step0, state);
      __syncthreads();  // every warp is done with the previous tile
      tile_step0 += p.tile_steps;
    }
    F::StageScales(p, item, block_row, tile_step0, staged_scales);
    StageActivations<F>(p, item, tile_step0, min(step_end, tile_step0 + p.tile_steps), act);
    __syncthreads();
    const int tile_items = min(items_per_tile, items - tile_item0);
    for (int i0 = tile_item0; i0 < tile_item0 + tile_items; i0 += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int step = step0 + part + p.wk * (i0 + d);
        if (i0 + d >= tile_item0 + tile_items || step >= step_end) break;
        const StepSlots<F> slots{act, step - tile_step0, p.halves, p.m, g, c};
        F::Step(p, ring[d], step, slots, staged_scales, tile_step0, state);
        const int next = step + p.wk * kDepth;
        if (next < step_end) F::Load(p, rows, state, next, c, ring[d]);
      }
    }
  }
  F::EndTile(p, staged_scales, tile_step0, state);

  // Partial sums: warp fragments -> block rows (wk warps of a group in warp order) -> cluster
  // ranks in rank order. The shared area is reused: every warp is past its last tile read.
  float* warp_part = reinterpret_cast<float*>(smem);
  float* block_part = warp_part + kWarpPartFloats;
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int e = 0; e < 4; ++e) warp_part[((warp * kTiles + t) * 32 + lane) * 4 + e] = F::Result(state, t, e);
  }
  __syncthreads();
  const int block_rows = kBlockRows / p.wk, outputs = block_rows * p.m;
  const auto write = [&](int e, float sum) {
    const int64_t row = block_row + e / p.m;
    const int mr = e % p.m;
    if (row >= p.n) return;
    float* out = p.c + item * p.stride_c + mr * p.ldc + row;
    float v = p.alpha * sum;
    if (p.beta != 0.0f) v += p.beta * *out;
    if (p.bias != nullptr) v += p.bias[row];
    *out = v;
  };
  for (int e = threadIdx.x; e < outputs; e += kThreads) {
    // Fragment element of (block row rr, activation row mr): lane (mr % 8) * 4 + rt / 2 of tile
    // rt / 8's warps, element (mr >= 8 ? 2 : 0) + rt % 2 (c0..c3 = (g, 2c), (g, 2c + 1), (g + 8, 2c),
    // (g + 8, 2c + 1)).
    const int rr = e / p.m, mr = e % p.m;
    const int grp = rr / kWarpRows, t = rr % kWarpRows / 8, rt = rr % 8;
    const int src_lane = (mr % 8) * 4 + rt / 2, src_e = (mr >= 8 ? 2 : 0) + rt % 2;
    float sum = 0.0f;
    for (int w = 0; w < p.wk; ++w) sum += warp_part[(((grp * p.wk + w) * kTiles + t) * 32 + src_lane) * 4 + src_e];
    if (p.split == 1) {
      write(e, sum);
    } else {
      block_part[e] = sum;
    }
  }
  if (p.split > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every rank's block_part is written
    for (int e = rank * kThreads + threadIdx.x; e < outputs; e += p.split * kThreads) {
      float sum = 0.0f;
      for (int r = 0; r < p.split; ++r) sum += cluster.map_shared_rank(block_part, r)[e];
      write(e, sum);
    }
    cluster.sync();  // no rank leaves while another still reads its shared memory
  }
}

// ---- Launch ---------------------------------------------------------------------------------------

// Cluster (K split) and warps per row group for a product: the pair with the least modelled time,
// fewer warps per group (larger row blocks, so fewer activation re-reads) and fewer splits first.
// Time is modelled as the bytes the L2 must deliver (the weights, and each row block's staged
// activations, which hit in L2 at some 1.5x the HBM rate) spread over the busiest multiprocessor: a
// multiprocessor holding one block was taken to pull up to 1.25x its even share of the bandwidth.
struct Split {
  int wk = 1;
  int split = 1;
};

Split ChooseSplit(int64_t n, int steps, int64_t batch, int max_tile_steps, double weight_bytes,
                  double act_bytes_per_row_block, int sm_count) {
  constexpr double kL2Rate = 1.5, kBurst = 1.25;
  Split best;
  double best_cost = 0.0;
  for (int wk = 1; wk <= kWarps; wk *= 2) {
    const int64_t row_blocks = (n + kBlockRows / wk - 1) / (kBlockRows / wk);
    const double bytes = std::max(weight_bytes, (weight_bytes + act_bytes_per_row_block * row_blocks * batch) / kL2Rate);
    for (int split = 1; split <= kMaxSplit; ++split) {
      if (split * wk > steps && split * wk > 1) break;  // a step for every warp part
      // A rank's steps in one tile, or tiles of whole kDepth items per warp.
      const int rank_steps = (steps + split - 1) / split;
      if (rank_steps > max_tile_steps && wk * kDepth > max_tile_steps) continue;
      const double blocks = static_cast<double>(row_blocks * split * batch);
      const double busiest = std::ceil(blocks / sm_count) * sm_count / (blocks * kBurst);
      const double cost = bytes * std::max(1.0, busiest);
      if (best_cost == 0.0 || cost < 0.98 * best_cost) {
        best = {wk, split};
        best_cost = cost;
      }
    }
  }
  return best;
}

// The checks and fields LaunchFp8BlockGemv and LaunchInt4GroupGemv share (a, c, bias, sizes).
cudaError_t CommonParams(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a, float* c,
                         int64_t ldc, int64_t batch_stride_c, const float* bias, int64_t batch, int64_t m,
                         int64_t n, int64_t k, float alpha, float beta, Params& p) {
  if (a == nullptr || c == nullptr) return cudaErrorInvalidValue;
  if (m < 1 || m > kQuantGemvMaxRows || n < 1 || k < 1 || k > kMaxColumn || batch < 1 || batch > 65535) {
    return cudaErrorInvalidValue;
  }
  if (m > 1 && (lda < k || ldc < n)) return cudaErrorInvalidValue;
  if (batch > 1 && (batch_stride_a < 0 || batch_stride_c < 0)) return cudaErrorInvalidValue;
  if (a_type != GemvType::kF32 && a_type != GemvType::kBF16) return cudaErrorInvalidValue;
  if (!std::isfinite(alpha) || !std::isfinite(beta)) return cudaErrorInvalidValue;
  p.a = a;
  p.a_bf16 = a_type == GemvType::kBF16;
  p.lda = m > 1 ? lda : 0;
  p.stride_a = batch > 1 ? batch_stride_a : 0;
  const int64_t vec = p.a_bf16 ? 8 : 4;  // elements per 16 bytes
  p.a_vec = reinterpret_cast<uintptr_t>(a) % 16 == 0 && p.lda % vec == 0 && p.stride_a % vec == 0;
  p.c = c;
  p.ldc = m > 1 ? ldc : 0;
  p.stride_c = batch > 1 ? batch_stride_c : 0;
  p.bias = bias;
  p.m = static_cast<int>(m);
  p.halves = m > 8 ? 2 : 1;
  p.n = n;
  p.k = static_cast<int>(k);
  p.alpha = alpha;
  p.beta = beta;
  return cudaSuccess;
}

// Chooses the split for `p` (weights, sizes and shift set), sizes the tile and launches.
template <typename F>
cudaError_t Launch(Params p, int64_t batch, double weight_bytes, bool programmatic, cudaStream_t stream) {
  int device = 0, sm_count = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  if (const cudaError_t error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
      error != cudaSuccess) {
    return error;
  }
  p.steps = (p.shift + p.k + F::kStepK - 1) / F::kStepK;
  // Steps whose activation slots fit the tile: 16 bytes per column per row half.
  const int max_tile_steps = kActBytes / (16 * F::kStepK * p.halves);
  const double act_bytes = static_cast<double>(p.m) * p.k * (p.a_bf16 ? 2 : 4);
  const Split s = ChooseSplit(p.n, p.steps, batch, max_tile_steps, weight_bytes, act_bytes, sm_count);
  p.wk = s.wk;
  p.split = s.split;
  p.rank_steps = (p.steps + p.split - 1) / p.split;
  p.tile_steps = p.rank_steps <= max_tile_steps ? (p.rank_steps + p.wk - 1) / p.wk * p.wk
                                                : max_tile_steps / (p.wk * kDepth) * (p.wk * kDepth);
  const int64_t row_blocks = (p.n + kBlockRows / p.wk - 1) / (kBlockRows / p.wk);
  if (row_blocks * p.split > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(row_blocks * p.split), static_cast<unsigned>(batch));
  return LaunchKernelInClusters(programmatic, static_cast<unsigned>(p.split), QuantGemvKernel<F>, grid, dim3(kThreads),
                                kAreaBytes + F::kScaleBytes, stream, p);
}

}  // namespace

cudaError_t LaunchFp8BlockGemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                               const Fp8BlockWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                               const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                               float beta, bool programmatic, cudaStream_t stream) {
  Params p{};
  if (const cudaError_t error =
          CommonParams(a, a_type, lda, batch_stride_a, c, ldc, batch_stride_c, bias, batch, m, n, k, alpha, beta, p);
      error != cudaSuccess) {
    return error;
  }
  if (b.codes == nullptr || b.scale_inv == nullptr) return cudaErrorInvalidValue;
  if (b.row0 < 0 || b.col0 < 0 || b.col0 > kMaxColumn || b.col0 % 16 != 0) return cudaErrorInvalidValue;
  if (n > 1 && (b.ld < k || b.ld % 16 != 0)) return cudaErrorInvalidValue;
  if (batch > 1 && (b.batch_stride < 0 || b.batch_stride % 16 != 0 || b.scale_batch_stride < 0)) {
    return cudaErrorInvalidValue;
  }
  const int64_t scale_rows = (b.row0 + n - 1) / kFp8ScaleBlock + 1;
  const int64_t scale_cols = (b.col0 + k - 1) / kFp8ScaleBlock + 1;
  if (scale_rows > 1 && b.scale_ld < scale_cols) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(b.codes) % 16 != 0) return cudaErrorInvalidValue;
  p.b = reinterpret_cast<const char*>(b.codes);
  p.ldb = n > 1 ? b.ld : 0;
  p.stride_b = batch > 1 ? b.batch_stride : 0;
  p.scale = b.scale_inv;
  p.scale_ld = scale_rows > 1 ? b.scale_ld : 0;
  p.scale_stride = batch > 1 ? b.scale_batch_stride : 0;
  p.row0 = b.row0;
  p.col0 = static_cast<int>(b.col0);
  p.shift = p.col0 % Fp8Format::kStepK;
  const double weight_bytes = static_cast<double>(batch) * n * k;
  return Launch<Fp8Format>(p, batch, weight_bytes, programmatic, stream);
}

cudaError_t LaunchInt4GroupGemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                const Int4GroupWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                                float beta, bool programmatic, cudaStream_t stream) {
  Params p{};
  if (const cudaError_t error =
          CommonParams(a, a_type, lda, batch_stride_a, c, ldc, batch_stride_c, bias, batch, m, n, k, alpha, beta, p);
      error != cudaSuccess) {
    return error;
  }
  if (b.packed == nullptr || b.scale == nullptr) return cudaErrorInvalidValue;
  if (b.group_size < 32 || (b.group_size & (b.group_size - 1)) != 0 || b.group_size > (int64_t{1} << 30)) {
    return cudaErrorInvalidValue;
  }
  if (b.col0 < 0 || b.col0 > kMaxColumn || b.col0 % 8 != 0) return cudaErrorInvalidValue;
  const int64_t words = (k + 7) / 8;
  if (n > 1 && (b.ld < words || b.ld % 4 != 0)) return cudaErrorInvalidValue;
  if (batch > 1 && (b.batch_stride < 0 || b.batch_stride % 4 != 0 || b.scale_batch_stride < 0)) {
    return cudaErrorInvalidValue;
  }
  const int64_t groups = (b.col0 + k - 1) / b.group_size + 1;
  if (n > 1 && b.scale_ld < groups) return cudaErrorInvalidValue;
  if (reinterpret_cast<uintptr_t>(b.packed) % 16 != 0) return cudaErrorInvalidValue;
  p.b = reinterpret_cast<const char*>(b.packed);
  p.ldb = n > 1 ? b.ld * 4 : 0;
  p.stride_b = batch > 1 ? b.batch_stride * 4 : 0;
  p.scale = b.scale;
  p.scale_ld = n > 1 ? b.scale_ld : 0;
  p.scale_stride = batch > 1 ? b.scale_batch_stride : 0;
  p.col0 = static_cast<int>(b.col0);
  int shift = 0;
  while ((int64_t{1} << shift) < b.group_size) ++shift;
  p.group_shift = shift;
  p.shift = 0;
  const double weight_bytes = static_cast<double>(batch) * n * (words * 4 + 2.0 * k / b.group_size);
  return Launch<Int4Format>(p, batch, weight_bytes, programmatic, stream);
}

}  // namespace eagle3::cuda
