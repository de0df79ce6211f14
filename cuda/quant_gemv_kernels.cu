// The quantized small-M product (cuda/quant_gemv_ops.h) and its planned launchers
// (cuda/quant_gemv_plan.h). No abseil here: nvcc must never see it.
//
// A weight stream is bound by the bytes in flight: by Little's law the HBM needs some megabytes of
// loads outstanding to run at its rate, so every lane keeps QuantGemvDepth steps of 16-byte weight
// loads in flight in a register ring (the first ones, and fp8's first staged scales, issued before
// the programmatic-launch wait), and the planner (quant_gemv_plan.cc) sizes the grid and the K
// split so that the whole machine holds enough of them. Registers, not shared memory, hold the
// ring: a lane's chunk goes straight from its load to the widening and the tensor cores.
//
// Products: each m16n8k16 product takes 16 weight rows as its A operand (a warp's rows g and g + 8
// of lane (g, c), widened to bf16 in registers straight into the A fragment) and 8 activation rows as
// its B operand (staged bf16 in shared memory so that one 16-byte read gives a lane its B pairs); up
// to 8 activation rows cost one product per 16 x 16 weights, 9 to 16 two, 17 to 32 four: a fragment
// is widened once for all of them (QuantGemvRowOperands), since the widening, not the products,
// bounds the kernel where the bytes do not. Within a chunk, the columns enter the products in a
// fixed permutation that the staged activations share (PieceColumn): fp8 word j (4 codes) feeds
// product j with codes (0, 2) and (1, 3); int4 word j (8 nibbles) feeds products 2j and 2j + 1
// with nibble pairs (0, 4), (1, 5) and (2, 6), (3, 7), word j of every lane lying in the step's
// 32-column group j (eagle3/detail/quant_tiles.h), so that both products stay in one scale group.
//
// Sums: each warp accumulates its rows over its K run in step order (fp8: each 128-column block's
// products in fp32, times the block's scale, added to the row's sum; int4: each 32-column group's
// products in fp32, times the group's scale, added to the row's sum); the wk warps of a row group
// add their sums in warp order, and the blocks of a cluster in rank order: the same bits every run.
// From 9 rows on, each 8-row operand has its own accumulators, so an activation row's sum is the
// same chain whichever operand holds it: for a given plan, row r of a 9- to 32-row call has the bits
// of the same activations in any row of any 9- to 32-row call (up to 8 rows, two chains per row).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "eagle3/detail/quant_tiles.h"
#include "core_kernels.cuh"
#include "programmatic_launch.cuh"
#include "ptx.cuh"
#include "quant_gemv_ops.h"
#include "quant_gemv_plan.h"

namespace eagle3::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = kQuantGemvThreads;
constexpr int kWarps = kQuantGemvWarps;
constexpr int kWarpRows = kQuantGemvWarpRows;
constexpr int kBlockRows = kQuantGemvBlockRows;
constexpr int kUnitColumns = kQuantGemvUnitColumns;
constexpr int kBlockRowsShift = 7;  // log2(kBlockRows)
static_assert(kBlockRows == 1 << kBlockRowsShift);
// Partial sums of the final reduction per warp, B operand, lane and fragment element (then, cluster
// ranks only, per block row and activation row: quant_gemv_plan.cc sizes both).
constexpr int WarpPartFloats(int operands) { return kWarps * operands * 32 * 4; }
// Largest k and col0 taken: column and step arithmetic stays in 32 bits.
constexpr int64_t kMaxColumn = int64_t{1} << 29;

struct Params {
  const void* a;
  int64_t lda, stride_a;
  bool a_bf16;
  bool a_vec;  // every activation row of every item 16-byte aligned: 16-byte loads
  const char* b;           // codes (fp8) or packed words (int4)
  int64_t ldb, stride_b;   // bytes
  const void* scale;       // f32 scale_inv (fp8) or bf16 weight_scale (int4)
  int64_t scale_ld, scale_stride;
  int64_t row0;            // fp8: the slice's first global row
  int col0;                // the slice's first global column
  int group_shift;         // int4: log2(group_size)
  int last_group;          // int4: the group of column k - 1
  float* c;
  int64_t ldc, stride_c;
  const float* bias;
  int m;
  int64_t n;
  int k;
  float alpha, beta;
  int shift;               // virtual columns of the first unit before column 0: col0 % 128 (fp8), % 32 (int4)
  int units;               // units covering shift + k columns
  int rank_units;          // units per cluster rank
  int part_units;          // units per warp part per tile
  int tiles;               // activation tiles per block
  int wk, split;
  int row_loops;           // row-looped plans: 16-row groups per warp (quant_gemv_plan.h)
  int act_stride;          // bytes between staged activation rows
  // Grouped launches (QuantGemvItems): per-item device pointers replacing `item * stride`
  // arithmetic where given, and the device item count past which blocks exit.
  const void* const* a_items;
  const void* const* b_items;
  const void* const* scale_items;
  float* const* c_items;
  const int32_t* item_count;
  const int32_t* rows_items;  // per item: its activation rows (<= m), or nullptr: m each
  int64_t silu_up;            // > 0: gated f32 activations (QuantGemvItems::silu_up_offset)
  QuantGemvCombine combine;   // counters non-null: the combine epilogue (QuantGemvCombine)
  bool tiled;                 // codes in warp-step tiles (eagle3/detail/quant_tiles.h)
  // Indexed items (QuantGemvIndexedItems), where ids is non-null.
  const int32_t* ids;
  const char* table;
  int64_t entry_bytes;
  int num_entries, per_id;
  int64_t codes_at[2], scales_at[2], scales_skip;
  int* error_flag;
  int error_code;
  int64_t error_index;
  bool early_items;  // QuantGemvIndexedItems::ids_final: the items are read before the wait
  int tile_items;    // the in-block combine's items a token (QuantGemvCombine::in_block), else 0
  int token_items;   // QuantGemvIndexedItems::token_items
  bool a_by_token;   // QuantGemvIndexedItems::a_by_token
  int fold_ranks;    // QuantGemvBlock<..., kFoldRanks>: the plan's cluster ranks, folded into wk
};

// An indexed item's table entry (Params::ids), or nullptr where its id names none.
// per_id is 1 or 2 (QuantGemvIndexedItems): shifts and masks, not divisions.
__device__ __forceinline__ const char* ItemEntry(const Params& p, int64_t item) {
  const int32_t e = p.ids[static_cast<int>(item) >> (p.per_id - 1)];
  return e >= 0 && e < p.num_entries ? p.table + static_cast<int64_t>(e) * p.entry_bytes : nullptr;
}
// Role r's pointer stored `at` bytes into an indexed item's entry (the item has rows: ItemRows).
__device__ __forceinline__ const char* EntryPointer(const Params& p, int64_t item, const int64_t (&at)[2]) {
  return *reinterpret_cast<const char* const*>(ItemEntry(p, item) + at[static_cast<int>(item) & (p.per_id - 1)]);
}

// Item `item`'s operands: its pointer from the grouped launch's array, or its entry's (indexed
// items), or the batched stride's. A branch per block (or per staged tile), never per load.
__device__ __forceinline__ const char* ItemA(const Params& p, int64_t item) {
  if (p.a_items != nullptr) return static_cast<const char*>(p.a_items[item]);
  const int64_t row = p.a_by_token ? static_cast<int>(item) / p.token_items : item;
  return static_cast<const char*>(p.a) + row * p.stride_a * (p.a_bf16 ? 2 : 4);
}
__device__ __forceinline__ const char* ItemB(const Params& p, int64_t item) {
  if (p.ids != nullptr) return EntryPointer(p, item, p.codes_at);
  return p.b_items != nullptr ? static_cast<const char*>(p.b_items[item]) : p.b + item * p.stride_b;
}
// The item's scales, in elements of `T` (f32 scale_inv or bf16 weight_scale).
template <typename T>
__device__ __forceinline__ const T* ItemScale(const Params& p, int64_t item) {
  if (p.ids != nullptr) return reinterpret_cast<const T*>(EntryPointer(p, item, p.scales_at) + p.scales_skip);
  return p.scale_items != nullptr ? static_cast<const T*>(p.scale_items[item])
                                  : static_cast<const T*>(p.scale) + item * p.scale_stride;
}
__device__ __forceinline__ float* ItemC(const Params& p, int64_t item) {
  return p.c_items != nullptr ? p.c_items[item] : p.c + item * p.stride_c;
}
// The item's activation rows: its entry of the grouped launch's row counts (at most m), or m (an
// indexed item: m where its id names an entry, else none).
__device__ __forceinline__ int ItemRows(const Params& p, int64_t item) {
  if (p.ids != nullptr) return ItemEntry(p, item) != nullptr ? p.m : 0;
  return p.rows_items != nullptr ? min(p.m, p.rows_items[item]) : p.m;
}

// The index an indexed item's bad id records: its token's (QuantGemvIndexedItems::token_items).
__device__ __forceinline__ int64_t ItemErrorIndex(const Params& p, int64_t item) {
  return p.error_index + (p.token_items > 0 ? static_cast<int>(item) / p.token_items : 0);
}
// A block of an item without rows: an indexed item's bad id is recorded (every block of the item
// records the same index, which RecordDeviceError keeps once).
__device__ __forceinline__ void RecordBadId(const Params& p, int64_t item) {
  if (p.ids != nullptr && p.error_flag != nullptr && threadIdx.x == 0) {
    RecordDeviceError(p.error_flag, p.error_code, ItemErrorIndex(p, item));
  }
}

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

// A lane's weight rows: g and g + 8 of its warp's 16 (rows past n read row n - 1, whose results are
// not written). Tiled codes: row[0] is the lane's 32 bytes in the warp's first tile (rows g, then
// g + 8), a step's tile kQuantTileBytes further per step (the padding rows read zeros).
struct LaneRows {
  const char* row[2];
  const uint16_t* scale_row[2];  // int4: the rows' group scales
};

// Lane rows on tiled codes: the lane's place in the tiles of the 16-row group holding `row` (a
// multiple of 16; past n: the last group, whose loads are never consumed).
__device__ __forceinline__ LaneRows TiledLaneRows(const Params& p, const char* item_b, const uint16_t* item_scale,
                                                 int64_t row, int steps, int lane, int g) {
  LaneRows rows;
  const int64_t group = min(row, p.n - 1) / kQuantTileRows;
  rows.row[0] = item_b + (group * steps) * kQuantTileBytes + 32 * lane;
  rows.row[1] = rows.row[0] + 16;
#pragma unroll
  for (int h = 0; h < 2; ++h) rows.scale_row[h] = item_scale + min(row + g + 8 * h, p.n - 1) * p.scale_ld;
  return rows;
}

// A step's two chunks of tiled codes, `at` the lane's 32 bytes in the step's tile (every byte of a
// tile is in range: no edge path).
__device__ __forceinline__ void LoadTiled(const char* at, uint4 (&w)[2]) {
  w[0] = __ldcs(reinterpret_cast<const uint4*>(at));
  w[1] = __ldcs(reinterpret_cast<const uint4*>(at + 16));
}

// Bytes [col, col + 16) of a row as a chunk, zeros outside [0, k): the slow path of a chunk that a
// slice's edge cuts (fp8's virtual columns before column 0, which take whole chunks, and the row's
// partial last chunk), which never reads outside the row. col is a multiple of 16 and row + col
// 16-byte aligned.
__device__ __noinline__ uint4 LoadEdgeBytes(const uint8_t* row, int col, int k) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if (col < 0) return make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int start = col + 4 * e;
    if (start + 4 <= k) {
      w[e] = *reinterpret_cast<const uint32_t*>(row + start);
    } else if (start < k) {
      uint32_t v = 0u;
#pragma unroll 1
      for (int b = 0; b < k - start; ++b) v |= static_cast<uint32_t>(row[start + b]) << (8 * b);
      w[e] = v;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Words word0, word0 + 4, word0 + 8 and word0 + 12 of a packed row (an int4 lane's chunk), zeros
// outside [0, words): a slice's edge. Out of line, as LoadEdgeBytes.
__device__ __noinline__ uint4 LoadEdgeWords(const uint32_t* row, int word0, int words) {
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (word0 + 4 * j >= 0 && word0 + 4 * j < words) w[j] = row[word0 + 4 * j];
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// A step's staged activation pieces as lane (g, c) reads them: activation row g + 8 o of B operand
// o. A lane whose row is past m reads row m - 1 instead: a B column feeds only its own output
// column, whose sums are never written, so any finite or non-finite value there is harmless.
template <int kOperands>
struct StepActivations {
  const unsigned char* smem;
  int row[kOperands];  // byte offsets of the step's piece 0 in rows min(g + 8 o, m - 1)
  __device__ __forceinline__ uint4 Piece(int o, int piece) const {
    return *reinterpret_cast<const uint4*>(smem + row[o] + 64 * piece);
  }
};

// ---- FP8 block-scaled ----------------------------------------------------------------------------
//
// A step is 64 columns, aligned to the global 64-column grid (the first unit starts `shift` columns
// before column 0, which read as zeros); lane c's chunk is columns 16c .. 16c + 15 of it, word j
// feeding product j. A code widens to bf16 exactly by moving its exponent and mantissa into bf16's
// fields (and its sign to bf16's sign) and multiplying by 2^120, the difference of the exponent
// biases: e4m3 subnormals included, NaN codes reading as +-480.
struct Fp8Format {
  static constexpr bool kBlockScaled = true;
  static constexpr bool kWordPerGroup = false;  // a lane's chunk: consecutive columns
  static constexpr float kSumScale = 1.0f;  // the sums are the products' (Int4Format halves them)
  static constexpr int kStepColumns = 64;
  static constexpr int kUnitSteps = kUnitColumns / kStepColumns;
  static constexpr int kPieces = 2;  // 8-column activation pieces of a lane's chunk
  // Position i of a staged piece holds column PieceColumn(i): pairs (0, 2), (1, 3), (4, 6), (5, 7).
  __device__ static constexpr int PieceColumn(int i) { return (i & 4) | ((i & 1) << 1) | ((i >> 1) & 1); }

  struct Item {
    uint4 w[2];  // rows g and g + 8
  };

  // The step's chunks: kTiled, from `tile` (the lane's bytes in the step's tile); otherwise from the
  // rows at the step's columns, or (p.tiled: the generic kernel on tiled codes, kept as the
  // specialized kernel's baseline) from the step's tile.
  template <bool kTiled>
  __device__ static void Load(const Params& p, const LaneRows& rows, const char* tile, int step, int c, Item& item) {
    if (kTiled || p.tiled) {
      LoadTiled(kTiled ? tile : rows.row[0] + static_cast<int64_t>(step) * kQuantTileBytes, item.w);
      return;
    }
    const int col = step * kStepColumns + 16 * c - p.shift;
    if (col >= 0 && col + 16 <= p.k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) item.w[h] = __ldcs(reinterpret_cast<const uint4*>(rows.row[h] + col));
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) item.w[h] = LoadEdgeBytes(reinterpret_cast<const uint8_t*>(rows.row[h]), col, p.k);
    }
  }

  // Codes 0 and 2 (even) or 1 and 3 of a word as a bf16 pair, exactly.
  __device__ static uint32_t Widen(uint32_t w, bool even) {
    const __nv_bfloat162 bias2 = BitCast<__nv_bfloat162>(0x7B807B80u);  // 2^120 in both halves
    const uint32_t moved = even ? ((w << 4) & 0x07f007f0u) | ((w << 8) & 0x80008000u)
                                : ((w >> 4) & 0x07f007f0u) | (w & 0x80008000u);
    return Bits(__hmul2(BitCast<__nv_bfloat162>(moved), bias2));
  }

  // The step's products, rows g and g + 8 of the weights times the activation rows. With one B
  // operand (up to 8 rows), products alternate between the accumulators acc[0] and acc[1], two
  // independent chains; with more, acc[o] takes operand o's rows 8 o .. 8 o + 7.
  template <int kOperands, int kChains>
  __device__ static void Products(const Item& item, const StepActivations<kOperands>& act,
                                  float (&acc)[kChains][4]) {
    const uint32_t w[2][4] = {{item.w[0].x, item.w[0].y, item.w[0].z, item.w[0].w},
                              {item.w[1].x, item.w[1].y, item.w[1].z, item.w[1].w}};
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) {
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * pc + jj;
        const unsigned a[4] = {Widen(w[0][j], true), Widen(w[1][j], true), Widen(w[0][j], false),
                               Widen(w[1][j], false)};
        if constexpr (kOperands == 1) {
          const uint4 b = act.Piece(0, pc);
          MmaBf16(acc[jj], a, jj == 0 ? b.x : b.z, jj == 0 ? b.y : b.w);
        } else {
#pragma unroll
          for (int o = 0; o < kOperands; ++o) {
            const uint4 b = act.Piece(o, pc);
            MmaBf16(acc[o], a, jj == 0 ? b.x : b.z, jj == 0 ? b.y : b.w);
          }
        }
      }
    }
  }
};

// ---- INT4 group-quantized ------------------------------------------------------------------------
//
// A step is 128 columns, aligned to the global 32-column grid (the first unit starts `shift` =
// col0 % 32 columns before column 0, which read as zeros), so that the step's four 32-column groups
// j each lie in one scale group (32 divides the group size); lane c's chunk is the step's words c,
// c + 4, c + 8 and c + 12, word j of it in group j. A nibble u widens exactly to the bf16 8 + u / 2
// (u in mantissa bits 3..6 under 8's exponent: one shift and one lop3 a pair), that is 12 + q / 2
// for q = u - 8; one bf16x2 subtraction of 12 (exact) leaves q / 2. A group's two products
// t = sum q x / 2 (exact products, fp32 sums) times the group's scale are added to the row's sum,
// which is doubled at the end (kSumScale). The group scale thus never rounds into the weights
// (against bf16(q * scale)), and the widening takes 12 instructions a word instead of 15. (Keeping
// 12 + q / 2 and subtracting 12 X per group instead, X the group's sum of the activations, needs
// those sums staged per activation row: a pass over the staged tile after a barrier.)
struct Int4Format {
  static constexpr bool kBlockScaled = false;
  static constexpr bool kWordPerGroup = true;  // a lane's word j: the step's group j
  static constexpr float kSumScale = 2.0f;
  static constexpr int kStepColumns = 128;
  static constexpr int kUnitSteps = kUnitColumns / kStepColumns;
  static constexpr int kPieces = 4;
  // Position i of a staged piece holds column PieceColumn(i): pairs (0, 4), (1, 5), (2, 6), (3, 7).
  __device__ static constexpr int PieceColumn(int i) { return (i >> 1) | ((i & 1) << 2); }

  struct Item {
    uint4 w[2];
    uint32_t scales[2][2];  // per row: the bf16 scales of groups (0, 1) and (2, 3) of the step
  };

  // A row's scales of the step's groups, from the global column of the step's first word.
  __device__ static void LoadScales(const Params& p, const uint16_t* row, int first_col, uint32_t (&out)[2]) {
    const int g0 = first_col >> p.group_shift;
    // row + g0 8-byte aligned: g0 is (col0 - shift) / 32 plus a multiple of 4, so the test does not
    // depend on the step (the loops can keep it).
    const bool aligned = ((reinterpret_cast<uintptr_t>(row) + ((p.col0 - p.shift) >> 4)) & 7) == 0;
    if (p.group_shift == 5 && g0 + 3 <= p.last_group && aligned) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + g0));  // four consecutive groups
      out[0] = v.x;
      out[1] = v.y;
      return;
    }
    // A group wholly past k (the last unit's tail) takes the last group's scale: its words are zeros.
    uint32_t g[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) g[j] = __ldg(row + min((first_col + 32 * j) >> p.group_shift, p.last_group));
    out[0] = g[0] | (g[1] << 16);
    out[1] = g[2] | (g[3] << 16);
  }

  // As Fp8Format::Load, and the groups' scales.
  template <bool kTiled>
  __device__ static void Load(const Params& p, const LaneRows& rows, const char* tile, int step, int c, Item& item) {
    const int word0 = step * (kStepColumns / 8) + c - (p.shift >> 3);  // the lane's word of group 0
    const int words = (p.k + 7) >> 3;
    if (kTiled || p.tiled) {
      LoadTiled(kTiled ? tile : rows.row[0] + static_cast<int64_t>(step) * kQuantTileBytes, item.w);
    } else if (word0 >= 0 && word0 + 12 < words) {  // four whole words, 16 bytes apart
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned* row = reinterpret_cast<const unsigned*>(rows.row[h]) + word0;
        item.w[h] = make_uint4(__ldcs(row), __ldcs(row + 4), __ldcs(row + 8), __ldcs(row + 12));
      }
    } else {  // a slice's edge
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        item.w[h] = LoadEdgeWords(reinterpret_cast<const uint32_t*>(rows.row[h]), word0, words);
      }
    }
    // The scales after the weights, so that the weight loads issue first.
    const int first_col = p.col0 - p.shift + step * kStepColumns;
#pragma unroll
    for (int h = 0; h < 2; ++h) LoadScales(p, rows.scale_row[h], first_col, item.scales[h]);
  }

  // Pairs i = 0..3 of word w (nibbles i and i + 4) as the bf16 pairs q / 2, exactly. Pairs 1..3:
  // 8 + u / 2 by placing u (shifted) under 8's exponent, less 12. Pair 0's nibbles already sit in
  // the low bits of each half, where under 64's exponent (a mantissa step of 1 / 2) they make
  // 64 + u / 2 without a shift, less 68.
  __device__ static void Widen(uint32_t w, uint32_t (&pair)[4]) {
    constexpr uint32_t kMask = 0x00780078u, kEight = 0x41004100u;  // bits 3..6 of each half; 8.0, 8.0
    constexpr uint32_t kLowMask = 0x000F000Fu, kSixtyFour = 0x42804280u;  // bits 0..3; 64.0, 64.0
    const __nv_bfloat162 twelve = BitCast<__nv_bfloat162>(0x41404140u);
    const __nv_bfloat162 sixty_eight = BitCast<__nv_bfloat162>(0x42884288u);
    const uint32_t biased[4] = {Lop3<0xEA>(w, kLowMask, kSixtyFour), Lop3<0xEA>(w >> 1, kMask, kEight),
                                Lop3<0xEA>(w >> 5, kMask, kEight), Lop3<0xEA>(w >> 9, kMask, kEight)};
    pair[0] = Bits(__hsub2(BitCast<__nv_bfloat162>(biased[0]), sixty_eight));
#pragma unroll
    for (int i = 1; i < 4; ++i) pair[i] = Bits(__hsub2(BitCast<__nv_bfloat162>(biased[i]), twelve));
  }

  // Group j's scale of a row, as f32.
  __device__ static float Scale(const uint32_t (&scales)[2], int j) {
    const uint32_t bits = scales[j >> 1];
    return __uint_as_float((j & 1) != 0 ? bits & 0xffff0000u : bits << 16);
  }

  // The step's products, rows g and g + 8 times the activation rows, group by group (the class
  // comment). With one B operand (up to 8 rows), the groups alternate between the sums acc[0] and
  // acc[1], two independent chains; with more, acc[o] takes operand o's rows 8 o .. 8 o + 7.
  template <int kOperands, int kChains>
  __device__ static void Products(const Item& item, const StepActivations<kOperands>& act,
                                  float (&acc)[kChains][4]) {
    const uint32_t w[2][4] = {{item.w[0].x, item.w[0].y, item.w[0].z, item.w[0].w},
                              {item.w[1].x, item.w[1].y, item.w[1].z, item.w[1].w}};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t pairs[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) Widen(w[h][j], pairs[h]);
      const unsigned a0[4] = {pairs[0][0], pairs[1][0], pairs[0][1], pairs[1][1]};
      const unsigned a1[4] = {pairs[0][2], pairs[1][2], pairs[0][3], pairs[1][3]};
      const float s_lo = Scale(item.scales[0], j), s_hi = Scale(item.scales[1], j);
#pragma unroll
      for (int o = 0; o < kOperands; ++o) {
        const uint4 b = act.Piece(o, j);
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        MmaBf16(t, a0, b.x, b.y);
        MmaBf16(t, a1, b.z, b.w);
        float(&sum)[4] = acc[kOperands == 1 ? (j & 1) : o];
        sum[0] = fmaf(t[0], s_lo, sum[0]);
        sum[1] = fmaf(t[1], s_lo, sum[1]);
        sum[2] = fmaf(t[2], s_hi, sum[2]);
        sum[3] = fmaf(t[3], s_hi, sum[3]);
      }
    }
  }
};

// ---- Activation staging --------------------------------------------------------------------------
//
// A tile of units is staged per activation row as bf16, step by step; within a step, lane c's
// piece pc (8 columns, permuted by PieceColumn) sits at byte 64 pc + 16 c. So the 8 lanes of a
// 16-byte shared-memory read phase (rows g, g + 1; c = 0..3) read 64 contiguous bytes of each of two
// rows whose stride is 64 bytes past a multiple of 128: 8 distinct 16-byte bank groups.

// Byte offset, within a staged row, of piece q (8 columns from column 8q of the tile): lane c's
// piece j of a step at 64 j + 16 c. fp8: the lane's chunk is pieces 2c, 2c + 1 of the step; int4:
// its word j is piece c + 4 j (eagle3/detail/quant_tiles.h), so the step's pieces stay in order.
template <typename F>
__device__ __forceinline__ int PieceOffset(int q) {
  constexpr int kStepPieces = F::kStepColumns / 8;
  const int step = q / kStepPieces, in_step = q % kStepPieces;
  if constexpr (F::kWordPerGroup) return step * (F::kStepColumns * 2) + in_step * 16;
  return step * (F::kStepColumns * 2) + (in_step % F::kPieces) * 64 + (in_step / F::kPieces) * 16;
}

// Pieces a thread stages at once (their loads in flight together).
constexpr int kStageBatch = 2;

// f32 columns [lk, lk + 8) of `row` into out (left as they are outside 0 .. k - 1).
__device__ __forceinline__ void LoadF32Columns(const Params& p, const float* row, int lk, bool whole, float (&out)[8]) {
  if (whole && p.a_vec) {
    const float4 q0 = *reinterpret_cast<const float4*>(row + lk);
    const float4 q1 = *reinterpret_cast<const float4*>(row + lk + 4);
    out[0] = q0.x, out[1] = q0.y, out[2] = q0.z, out[3] = q0.w, out[4] = q1.x, out[5] = q1.y, out[6] = q1.z, out[7] = q1.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (lk + e >= 0 && lk + e < p.k) out[e] = row[lk + e];
    }
  }
}

// Activation columns [lk, lk + 8) of row r, as floats (zeros outside 0 .. k - 1).
__device__ __forceinline__ void LoadColumns(const Params& p, const char* a, int r, int lk, float (&v)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = 0.0f;
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
    LoadF32Columns(p, row, lk, whole, v);
    if (p.silu_up > 0) {
      // The expression QuantMoeSiluMulKernel rounds, in the same fp32 operations: the same bits.
      float u[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) u[e] = 0.0f;
      LoadF32Columns(p, row + p.silu_up, lk, whole, u);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = v[e] / (1.0f + expf(-v[e])) * u[e];
    }
  }
}

// Stages the item's m (<= p.m) activation rows of the tile of units [unit0, unit0 + units) as bf16
// (f32 rounded to nearest even, bf16 exact), zeros outside the slice's columns: threads tid, tid +
// threads, ... of the block's (all of it, or one warp's lanes).
template <typename F>
__device__ void StageActivations(const Params& p, int64_t item, int m, int unit0, int units, unsigned char* smem,
                                 int tid, int threads) {
  const char* a = ItemA(p, item);
  const int row_pieces = units * (kUnitColumns / 8);
  const int total = m * row_pieces;
  const int col0 = unit0 * kUnitColumns - p.shift;  // slice column of the tile's first column
  for (int base = tid; base < total; base += threads * kStageBatch) {
    float v[kStageBatch][8];
    int dest[kStageBatch];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int i = base + u * threads;
      dest[u] = -1;
      if (i < total) {
        const int r = m == 1 ? 0 : i / row_pieces;  // one row (decode rounds): no division a piece
        const int q = i - r * row_pieces;
        LoadColumns(p, a, r, col0 + 8 * q, v[u]);
        dest[u] = r * p.act_stride + PieceOffset<F>(q);
      }
    }
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      if (dest[u] < 0) continue;
      uint32_t words[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(v[u][F::PieceColumn(2 * w)]));
        const uint32_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(v[u][F::PieceColumn(2 * w + 1)]));
        words[w] = lo | (hi << 16);
      }
      *reinterpret_cast<uint4*>(smem + dest[u]) = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

// fp8: stages the f32 scale_inv of the tile's units for the scale rows of the block's rows
// [block_row, block_row + block_rows): [scale_rows][units] (scale_rows: at least the rows those rows
// touch), after the activation rows. Threads t0, t0 + stride, ... take its entries (the block's, or
// one warp's lanes).
__device__ void StageScales(const Params& p, int64_t item, int64_t block_row, int block_rows, int scale_rows,
                            int unit0, int units, float* staged, int t0, int stride) {
  const int64_t first_row = (p.row0 + block_row) >> 7;
  const int64_t last_row = (p.row0 + min(block_row + block_rows, p.n) - 1) >> 7;
  const float* scale = ItemScale<float>(p, item);
  for (int i = t0; i < scale_rows * units; i += stride) {
    const int r = i / units, u = unit0 + i % units;
    staged[i] = first_row + r <= last_row && u < p.units ? scale[(first_row + r) * p.scale_ld + (p.col0 >> 7) + u]
                                                         : 0.0f;
  }
}

// ---- Pieces both kernels share ------------------------------------------------------------------

// The combine epilogue (QuantGemvCombine) of the block tile `tile`, output rows [row_begin, row_end):
// called by every thread of a block once every row of the tile it writes is written (by this block,
// or by the other ranks of its cluster, which fenced their writes before the cluster barrier that
// precedes this call). The block counts itself in; the last of the launch's items to arrive writes
// the tile's rows of out. Each writer's fence before the count and the last block's fence after it
// order the items' rows before their reads (the classic last-block reduction), which bypass L1. Out
// of line, its operands by value: the kernels' register allocation stays as without it.
__device__ __noinline__ void CombineTile(const QuantGemvCombine cb, const float* c, const int32_t* item_count,
                                        int64_t n, int64_t tile, int64_t row_begin, int64_t row_end) {
  __threadfence();
  __syncthreads();
  int last = 0;  // no shared memory: a plan may take all the default limit allows
  if (threadIdx.x == 0) {
    const int expected = item_count != nullptr ? *item_count : static_cast<int>(gridDim.y);
    last = atomicAdd(cb.counters + tile, 1) == expected - 1;
    if (last) cb.counters[tile] = 0;  // for the next launch, which starts after this one ends
  }
  if (!__syncthreads_or(last)) return;  // block-uniform
  __threadfence();
  row_end = min(row_end, n);
  const int64_t rows = row_end - row_begin;
  for (int64_t i = threadIdx.x; i < cb.tokens * rows; i += blockDim.x) {
    const int64_t tl = i / rows, h = row_begin + (i - tl * rows), t = cb.token0 + tl;
    const int32_t* id = cb.ids + t * cb.ids_stride;
    bool good = true;
    for (int j = 0; j < cb.top_k; ++j) good = good && id[j] >= 0 && id[j] < cb.num_experts;
    if (!good) continue;  // the token keeps its row
    float* o = cb.out + t * cb.out_stride + h;
    float acc = cb.accumulate ? *o : 0.0f;
    for (int j = 0; j < cb.top_k; ++j) {
      const int64_t pair = tl * cb.top_k + j;
      const int64_t row = cb.slot_of != nullptr ? cb.slot_of[pair] : pair * cb.pair_rows;
      acc += cb.weights[t * cb.weights_stride + j] * __ldcg(c + row * cb.row_ld + h);
    }
    *o = acc;
  }
}

// Whether the launch is grouped (QuantGemvItems): its count, rows and pointers are written by the
// kernels just before it, so they are read only after those have completed.
__device__ __forceinline__ bool Grouped(const Params& p) {
  return p.item_count != nullptr || p.a_items != nullptr || p.b_items != nullptr || p.scale_items != nullptr ||
         p.c_items != nullptr || p.rows_items != nullptr || p.ids != nullptr;
}

template <int kSets>
__device__ __forceinline__ void Zero(float (&x)[kSets][4]) {
#pragma unroll
  for (int h = 0; h < kSets; ++h) {
#pragma unroll
    for (int e = 0; e < 4; ++e) x[h][e] = 0.0f;
  }
}

// Lane (g, c)'s byte offsets of its B rows in a staged step: activation row g + 8 o of operand o,
// or the item's last row m - 1 past it (StepActivations).
template <int kOperands>
__device__ __forceinline__ void ActRows(const Params& p, int m, int g, int c, int (&act_row)[kOperands]) {
#pragma unroll
  for (int o = 0; o < kOperands; ++o) act_row[o] = min(g + 8 * o, m - 1) * p.act_stride + 16 * c;
}

// fp8, at a unit's last step: its block sums (the two chains' sum with one operand) times the scales
// of rows g (s_lo) and g + 8 (s_hi) into the running sums; the block accumulators restart.
template <int kOperands, int kChains>
__device__ __forceinline__ void FoldBlockSums(float (&acc)[kChains][4], float (&sum)[kOperands][4], float s_lo,
                                              float s_hi) {
  if constexpr (kOperands == 1) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][e] += acc[1][e];
  }
#pragma unroll
  for (int h = 0; h < kOperands; ++h) {
    sum[h][0] = fmaf(acc[h][0], s_lo, sum[h][0]);
    sum[h][1] = fmaf(acc[h][1], s_lo, sum[h][1]);
    sum[h][2] = fmaf(acc[h][2], s_hi, sum[h][2]);
    sum[h][3] = fmaf(acc[h][3], s_hi, sum[h][3]);
  }
  Zero(acc);
}

// The ring's first steps (at most kDepth of total_steps; load(d) fills slot d and advances the load
// cursor), issued before the programmatic-launch wait: the weights are not written by the step, so
// they are read while the kernels that write the activations (and c) finish
// (programmatic_launch.cuh).
// `wait` stands in for the programmatic wait where the inputs come from elsewhere (a chained
// launch's second product: the first product's counts, QuantGemvChainKernel).
struct WaitForPredecessors {
  __device__ __forceinline__ void operator()(bool) const { PdlWait(); }
};
template <int kDepth, typename Load, typename Wait = WaitForPredecessors>
__device__ __forceinline__ void FillRingThenWait(int total_steps, const Load& load, const Wait& wait = Wait{}) {
  PdlLaunchDependents();
#pragma unroll
  for (int d = 0; d < kDepth; ++d) {
    if (d < total_steps) load(d);
  }
  wait(true);
}

// kOperands: the 8-row B operands of each product, QuantGemvRowOperands(m). kTiled: the codes are in
// warp-step tiles (p.tiled), compiled apart so that the tiled loop holds neither the row-major edge
// paths nor their branch, and steps its loads with one pointer. The generic kernel (kTiled false)
// reads tiles too, a branch per load, where EAGLE3_QUANT_GEMV_TILED_KERNEL=generic asks for it (the
// baseline the specialized kernel is measured against).
//
// QuantGemvBlock is one block's work, block (bx, by) of the grid: the kernel's whole body, and the
// first product of a chained launch (QuantGemvChainKernel), whose blocks take (bx, by) in turn.
// kFoldRanks: the plan's cluster ranks are warps of the block instead (p.wk counts the warps of a
// row group over all ranks, p.fold_ranks the ranks, split 1): rank r's parts are warps r * wk / ranks
// on, which take the same units as the cluster's rank r, and their sums are added as the cluster adds
// them (each rank's warps in warp order, then the ranks in rank order): the same bits.
template <typename F, int kOperands, bool kTiled, bool kFoldRanks, int kDepth = QuantGemvDepth(kOperands)>
__device__ __forceinline__ void QuantGemvBlock(const Params& p, unsigned bx, unsigned by, unsigned char* smem) {
  constexpr int kUnitSteps = F::kUnitSteps;
  // Accumulator sets: with one operand, two chains that take alternate products.
  constexpr int kChains = kOperands == 1 ? 2 : kOperands;
  static_assert(kDepth % kUnitSteps == 0, "a ring cycle holds whole units");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  // wk is 1, 2, 4 or 8 (QuantGemvPlanValid): shifts, not divisions. A folded plan has split 1.
  const int wk_shift = __ffs(p.wk) - 1;
  const int group = warp >> wk_shift, part = warp & (p.wk - 1);
  const int rank = kFoldRanks ? 0 : static_cast<int>(bx) % p.split;
  const int block_rows = kBlockRows >> wk_shift;
  const unsigned row_block = kFoldRanks ? bx : bx / p.split;
  const int64_t block_row = static_cast<int64_t>(row_block) * block_rows;
  const int64_t warp_row = block_row + group * kWarpRows;
  const int64_t item = by;
  // A grouped launch's count and item pointers (and so the weights they point at) are written by the
  // kernels just before it: read only after they have completed (programmatic_launch.cuh), unless
  // they were final before the kernel just before it (early_items: FillRingThenWait waits).
  if (Grouped(p) && !p.early_items) PdlWait();
  // A grouped launch's items past the device count: the whole block leaves before any barrier, and
  // so does its whole cluster (a cluster's blocks differ in blockIdx.x only).
  if (p.item_count != nullptr && item >= *p.item_count) return;
  // The item's rows (a grouped launch's per-item count): rows past them are neither staged nor
  // written, and the lanes of their B columns read the last row instead (StepActivations).
  const int m = ItemRows(p, item);
  if (m <= 0) {  // the whole cluster: its blocks share the item
    if (p.early_items) PdlWait();  // before the combine reads out, and before the block exits
    RecordBadId(p, item);
    if (p.combine.counters != nullptr && rank == 0) {
      CombineTile(p.combine, p.c, p.item_count, p.n, row_block, block_row, block_row + block_rows);
    }
    return;
  }

  // The warp's units: in tile t, [part_first + t * tile_units, + part_units) within the rank's
  // [unit0, unit_end). Only a warp's last non-empty tile can be partial, so with several tiles
  // (part_units * kUnitSteps a multiple of kDepth) every tile starts at ring slot 0.
  const int tile_units = p.wk * p.part_units, part_steps = p.part_units * kUnitSteps;
  const int unit0 = rank * p.rank_units;
  const int unit_end = min(p.units, unit0 + p.rank_units);
  const int part_first = unit0 + part * p.part_units;
  const auto tile_steps = [&](int t) {
    return warp_row < p.n ? max(0, min(p.part_units, unit_end - (part_first + t * tile_units))) * kUnitSteps : 0;
  };
  int total_steps = 0;
  for (int t = 0; t < p.tiles; ++t) total_steps += tile_steps(t);

  // The rows' addresses are computed once: opaque to the compiler, which would otherwise derive them
  // again (64-bit products) at every load of the loop to save the registers that hold them.
  LaneRows rows;
  const char* item_b = ItemB(p, item);
  const uint16_t* item_scale = ItemScale<uint16_t>(p, item);
  const bool tiled = kTiled || p.tiled;
  if (tiled) rows = TiledLaneRows(p, item_b, item_scale, warp_row, p.units * kUnitSteps, lane, g);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!tiled) {
      const int64_t r = min(warp_row + g + 8 * h, p.n - 1);
      rows.row[h] = item_b + r * p.ldb;
      rows.scale_row[h] = item_scale + r * p.scale_ld;
    }
    asm volatile("" : "+l"(rows.row[h]), "+l"(rows.scale_row[h]));
  }
  // fp8: which staged scale row (the block's first or second) rows g and g + 8 take, as the byte
  // offset of that row in the staged scales.
  int scale_row_at[2] = {0, 0};
  if constexpr (F::kBlockScaled) {
    const int first = static_cast<int>((p.row0 + block_row) % kFp8ScaleBlock);  // block_row's place in its scale row
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = static_cast<int>(min(warp_row + g + 8 * h, p.n - 1) - block_row);  // < kBlockRows
      scale_row_at[h] = first + r >= kFp8ScaleBlock ? 4 * tile_units : 0;
    }
  }

  // The load cursor: the next step to load, in the global step grid, and its place in the part's
  // run of the current tile (a whole run done, the cursor jumps over the other parts' runs).
  // Row-major codes advance it a step at a time. Tiled codes advance it a ring cycle at a time,
  // slot d of a cycle loading the cursor's step + d from the lane's bytes of that step's tile
  // (load_tile + d tiles): a run is whole cycles where a warp has several (QuantGemvPlanValid), and
  // with one it is the warp's last, so no cycle straddles a jump.
  int load_step = part_first * kUnitSteps, load_in_run = 0;
  const char* load_tile = nullptr;
  if constexpr (kTiled) load_tile = rows.row[0] + static_cast<int64_t>(load_step) * kQuantTileBytes;
  const int run_skip = (tile_units - p.part_units) * kUnitSteps;  // steps of the other parts' runs
  const auto advance = [&](int steps) {
    load_step += steps;
    if constexpr (kTiled) load_tile += static_cast<int64_t>(steps) * kQuantTileBytes;
    load_in_run += steps;
    if (load_in_run == part_steps) {
      load_in_run = 0;
      load_step += run_skip;
      if constexpr (kTiled) load_tile += static_cast<int64_t>(run_skip) * kQuantTileBytes;
    }
  };
  // Loads ring slot d (tiled: of the current cycle; row-major: the next step, then advances).
  const auto load = [&](int d, typename F::Item& slot) {
    if constexpr (kTiled) {
      F::template Load<true>(p, rows, load_tile + d * kQuantTileBytes, load_step + d, c, slot);
    } else {
      F::template Load<false>(p, rows, nullptr, load_step, c, slot);
      advance(1);
    }
  };

  typename F::Item ring[kDepth];
  const int scales_at = p.m * p.act_stride;  // fp8: the staged scales, after the activation rows
  // fp8's scales are weights, final before the launch: the first tile's are staged while the
  // kernels before finish (the barrier after the first activation staging publishes them).
  FillRingThenWait<kDepth>(total_steps, [&](int d) { load(d, ring[d]); }, [&](bool) {
    if constexpr (F::kBlockScaled) {
      StageScales(p, item, block_row, block_rows, 2, unit0, tile_units, reinterpret_cast<float*>(smem + scales_at),
                  threadIdx.x, kThreads);
    }
    PdlWait();
  });
  if constexpr (kTiled) advance(kDepth);

  float acc[kChains][4], sum[kOperands][4];  // sum: fp8's block-scaled sums
  Zero(acc);
  Zero(sum);
  int act_row[kOperands];
  ActRows(p, m, g, c, act_row);
  int done = 0;  // steps of the warp consumed before the current tile
  for (int t = 0; t < p.tiles; ++t) {
    if (t > 0) __syncthreads();  // every warp is done with the previous tile
    const int tile_unit0 = unit0 + t * tile_units;
    StageActivations<F>(p, item, m, tile_unit0, tile_units, smem, threadIdx.x, kThreads);
    if constexpr (F::kBlockScaled) {
      if (t > 0) {
        StageScales(p, item, block_row, block_rows, 2, tile_unit0, tile_units,
                    reinterpret_cast<float*>(smem + scales_at), threadIdx.x, kThreads);
      }
    }
    __syncthreads();
    const int n_t = tile_steps(t);
    const int run0 = part * part_steps;  // the run's first step in the tile
    for (int j = 0; j < n_t; j += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        if (j + d >= n_t) break;
        const int offset = (run0 + j + d) * (F::kStepColumns * 2);
        StepActivations<kOperands> act{smem, {}};
#pragma unroll
        for (int o = 0; o < kOperands; ++o) act.row[o] = act_row[o] + offset;
        F::Products(ring[d], act, acc);
        if constexpr (F::kBlockScaled) {
          // The unit's last step (runs and ring cycles start at unit boundaries): fold its block sum.
          if (d % kUnitSteps == kUnitSteps - 1) {
            const int u = (run0 + j + d) / kUnitSteps;
            const float s_lo = *reinterpret_cast<const float*>(smem + scales_at + scale_row_at[0] + 4 * u);
            const float s_hi = *reinterpret_cast<const float*>(smem + scales_at + scale_row_at[1] + 4 * u);
            FoldBlockSums(acc, sum, s_lo, s_hi);
          }
        }
        if (done + j + d + kDepth < total_steps) load(d, ring[d]);
      }
      if constexpr (kTiled) advance(kDepth);
    }
    done += n_t;
  }

  // Partial sums: warp fragments -> block rows (the wk warps of a group in warp order) -> cluster
  // ranks in rank order. The shared area is reused: every warp is past its last tile read.
  float* warp_part = reinterpret_cast<float*>(smem);
  float* block_part = warp_part + WarpPartFloats(kOperands);
  if constexpr (!F::kBlockScaled && kOperands == 1) {  // the two chains hold parts of one sum
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][e] += acc[1][e];
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < kOperands; ++h) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      warp_part[((warp * kOperands + h) * 32 + lane) * 4 + e] = F::kBlockScaled ? sum[h][e] : acc[h][e];
    }
  }
  __syncthreads();
  // The item's rows read again rather than kept live through the loop (a register the 4-operand
  // kernel does not have to spare).
  const int outputs = block_rows * ItemRows(p, item);
  float* const item_c = ItemC(p, item);
  const auto write = [&](int e, float total) {
    const int mr = e >> (kBlockRowsShift - wk_shift);
    const int64_t row = block_row + (e - mr * block_rows);
    if (row >= p.n) return;
    float* out = item_c + mr * p.ldc + row;
    float v = p.alpha * (F::kSumScale * total);
    if (p.beta != 0.0f) v += p.beta * *out;
    if (p.bias != nullptr) v += p.bias[row];
    *out = v;
  };
  for (int e = threadIdx.x; e < outputs; e += kThreads) {
    // Output (block row rr, activation row mr) sits in the fragments of group rr / 16's warps at
    // lane (rr % 8) * 4 + (mr % 8) / 2, B operand mr / 8, element (rr % 16 >= 8 ? 2 : 0) + mr % 2
    // (c0..c3 = (g, 2c), (g, 2c + 1), (g + 8, 2c), (g + 8, 2c + 1) of the 16 x 8 product).
    const int mr = e >> (kBlockRowsShift - wk_shift), rr = e - mr * block_rows;
    const int grp = rr / kWarpRows, r16 = rr % kWarpRows;
    const int src_lane = (r16 % 8) * 4 + (mr % 8) / 2, src_e = (r16 >= 8 ? 2 : 0) + mr % 2, h = mr / 8;
    float total = 0.0f;
    if constexpr (kFoldRanks) {
      const int rank_warps = p.wk >> (__ffs(p.fold_ranks) - 1);  // both powers of two
      for (int r = 0; r < p.fold_ranks; ++r) {
        float rank_total = 0.0f;
        for (int w = r * rank_warps; w < (r + 1) * rank_warps; ++w) {
          rank_total += warp_part[(((grp * p.wk + w) * kOperands + h) * 32 + src_lane) * 4 + src_e];
        }
        total += rank_total;
      }
    } else {
      for (int w = 0; w < p.wk; ++w) {
        total += warp_part[(((grp * p.wk + w) * kOperands + h) * 32 + src_lane) * 4 + src_e];
      }
    }
    if (p.split == 1) {
      write(e, total);
    } else {
      block_part[e] = total;
    }
  }
  if (p.split > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every rank's block_part is written
    for (int e = rank * kThreads + threadIdx.x; e < outputs; e += p.split * kThreads) {
      float total = 0.0f;
      for (int r = 0; r < p.split; ++r) total += cluster.map_shared_rank(block_part, r)[e];
      write(e, total);
    }
    if (p.combine.counters != nullptr) __threadfence();  // this rank's rows, before rank 0 counts the tile
    cluster.sync();  // no rank leaves while another still reads its shared memory
  }
  if (p.combine.counters != nullptr && rank == 0) {
    CombineTile(p.combine, p.c, p.item_count, p.n, row_block, block_row, block_row + block_rows);
  }
}

template <typename F, int kOperands, bool kTiled>
__global__ void __launch_bounds__(kThreads, kQuantGemvBlocksPerSm) QuantGemvKernel(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  QuantGemvBlock<F, kOperands, kTiled, false>(p, blockIdx.x, blockIdx.y, smem);
}

// ---- Row-looped plans (short K) -------------------------------------------------------------------
//
// Where a row's whole K is a few steps (the routed experts' down product: K is the rank's slice of
// the expert intermediate), a warp of the kernel above streams those few chunks and its block then
// pays its fixed costs (the staging, the reduction, a ring filled from empty) again, block after
// block. Here a warp takes row_loops 16-row groups of its block in turn, each with its whole K, and
// its ring runs on from one group into the next: the loads of a group's first steps are in flight
// while the previous group's last products run. The whole K of a row being one warp's (wk 1, no
// cluster), a group's sums are final in the warp's fragments and are written from there; each sum
// is the same chain as in a wk = 1, split = 1 plan of the kernel above.
// The one-operand row loops on tiled codes fit the register budget of 3 blocks a multiprocessor
// without spills (ptxas; int4 with a 2-step ring, which its 16 rows' two steps of a 256-column K
// fill), so they ask for them: more warps to hide their dependent latency, with as many bytes in
// flight a multiprocessor as 2 blocks' 4-step rings give. The others keep 2 blocks and their rings.
// The in-block combine's fp8 form needs more registers (ptxas spills at 3 blocks' 80) and loses
// nothing at 2: its decode grids (one tile of 16 * row_loops rows a block: 224 blocks at hidden 7168
// and 2 row loops) are within 2 blocks a multiprocessor.
template <typename F, int kOperands, bool kTiled, bool kTileCombine = false>
inline constexpr int kRowLoopBlocksPerSm =
    kOperands == 1 && kTiled && !(kTileCombine && F::kBlockScaled) ? 3 : kQuantGemvBlocksPerSm;
template <typename F, int kOperands, bool kTiled>
inline constexpr int kRowLoopDepth = !F::kBlockScaled && kOperands == 1 && kTiled ? 2 : QuantGemvDepth(kOperands);

// The in-block combine (QuantGemvCombine::in_block) of a block's tile of rows [row_begin, row_begin
// + rows) for the launch's token `token` (from 0), from `tile` (the token's item j's row r at
// tile[j * rows + r], written by warp j before the barrier that precedes this call): CombineTile's
// sum, term for term.
__device__ __forceinline__ void CombineInBlock(const QuantGemvCombine& cb, const float* tile, int64_t n,
                                               int64_t row_begin, int rows, int threads, int64_t token) {
  const int64_t t = cb.token0 + token;
  const int32_t* id = cb.ids + t * cb.ids_stride;
  bool good = true;
  for (int j = 0; j < cb.top_k; ++j) good = good && id[j] >= 0 && id[j] < cb.num_experts;
  if (!good) return;  // the token keeps its row
  for (int r = threadIdx.x; r < rows && row_begin + r < n; r += threads) {
    float* o = cb.out + t * cb.out_stride + row_begin + r;
    float acc = cb.accumulate ? *o : 0.0f;
    for (int j = 0; j < cb.top_k; ++j) acc += cb.weights[t * cb.weights_stride + j] * tile[j * rows + r];
    *o = acc;
  }
}

// CombineInBlock's inputs other than the tile, read by one warp (`lane` its lane) into shared
// memory `pre` at a tile's start rather than after its barrier: the token's weights
// [kQuantGemvMaxTileItems], then 1 where every id names an expert (else 0), then its out rows
// [rows] where the combine accumulates. Their global reads (dependent L2 trips) then overlap the
// tile's weight stream instead of following the slowest warp. Valid once the block has passed its
// programmatic wait (the chain's blocks wait at their start; the ids, weights and out are final by
// then) and where nothing else writes them while the tile runs: the tile's out rows are written
// only by its own combine.
constexpr int kPreloadOut = kQuantGemvMaxTileItems + 1;
__host__ __device__ constexpr size_t PreloadBytes(int rows) { return (kPreloadOut + static_cast<size_t>(rows)) * 4; }
__device__ __forceinline__ void PreloadCombineInputs(const QuantGemvCombine& cb, float* pre, int64_t n,
                                                     int64_t row_begin, int rows, int64_t token, int lane) {
  static_assert(kQuantGemvMaxTileItems <= 32, "a lane for each item");
  const int64_t t = cb.token0 + token;
  bool bad = false;
  if (lane < cb.top_k) {
    const int32_t id = cb.ids[t * cb.ids_stride + lane];
    bad = id < 0 || id >= cb.num_experts;
    pre[lane] = cb.weights[t * cb.weights_stride + lane];
  }
  const unsigned any_bad = __ballot_sync(0xffffffffu, bad);
  if (lane == 0) pre[kQuantGemvMaxTileItems] = any_bad != 0 ? 0.0f : 1.0f;
  for (int r = lane; r < rows; r += 32) {
    pre[kPreloadOut + r] = cb.accumulate && row_begin + r < n ? cb.out[t * cb.out_stride + row_begin + r] : 0.0f;
  }
}

// CombineInBlock from PreloadCombineInputs' values (after a barrier that follows it): the same sum,
// term for term.
__device__ __forceinline__ void CombineInBlockPreloaded(const QuantGemvCombine& cb, const float* tile,
                                                        const float* pre, int64_t n, int64_t row_begin, int rows,
                                                        int threads, int64_t token) {
  if (pre[kQuantGemvMaxTileItems] == 0.0f) return;  // the token keeps its row
  const int64_t t = cb.token0 + token;
  for (int r = threadIdx.x; r < rows && row_begin + r < n; r += threads) {
    float acc = cb.accumulate ? pre[kPreloadOut + r] : 0.0f;
    for (int j = 0; j < cb.top_k; ++j) acc += pre[j] * tile[j * rows + r];
    cb.out[t * cb.out_stride + row_begin + r] = acc;
  }
}

// The in-block combine's shared memory a warp stages into: its item's activation row, then (fp8)
// the scale rows of its block's tile, [row_loops + 1][units] f32 (StageScales), 16-byte aligned.
__host__ __device__ inline int TileWarpBytes(const Params& p, bool block_scaled) {
  return p.act_stride + (block_scaled ? ((p.row_loops + 1) * p.units * 4 + 15) / 16 * 16 : 0);
}

// kTileCombine (QuantGemvCombine::in_block, one activation row): the block's rows are one tile of
// kWarpRows * row_loops rows of every item, warp j taking item j's groups of it in turn (group i
// at rows block_row + 16 i), staging item j's row (and fp8 scale rows) itself in its own area (no
// block barrier before the products),
// and the block combining the tile after one barrier. Otherwise the block is one item's rows and
// its warps' groups interleave, kBlockRows apart.
//
// kBlockWarps: the block's warps, kWarps but for the in-block combine of more items than that
// (kQuantGemvMaxTileItems), whose block has a warp an item.
//
// QuantGemvRowLoopBlock is block bx (by: its item, or for kTileCombine its token) of the grid, as
// QuantGemvBlock is for the kernel above; `wait(has_item)` is the programmatic wait (a warp's, for
// kTileCombine) before the activations are read.
template <typename F, int kOperands, bool kTiled, bool kTileCombine, int kBlockWarps = kWarps, bool kPreload = false,
          typename Wait>
__device__ __forceinline__ void QuantGemvRowLoopBlock(const Params& p, unsigned bx, unsigned by, unsigned char* smem,
                                                      const Wait& wait) {
  constexpr int kUnitSteps = F::kUnitSteps;
  constexpr int kDepth = kRowLoopDepth<F, kOperands, kTiled>;
  constexpr int kChains = kOperands == 1 ? 2 : kOperands;
  static_assert(kDepth % kUnitSteps == 0, "a ring cycle holds whole units");
  static_assert(!kTileCombine || kOperands == 1, "the in-block combine: one activation row");
  static_assert(kBlockWarps == kWarps || kTileCombine, "only the in-block combine widens the block");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  constexpr int kGroupStride = kTileCombine ? kWarpRows : kBlockRows;  // rows between a warp's groups
  const int64_t block_row = static_cast<int64_t>(bx) * kGroupStride * p.row_loops;
  // The in-block combine: block row by is token by's, warp j its item j.
  const int64_t item = kTileCombine ? static_cast<int64_t>(by) * p.tile_items + warp : by;
  // The in-block combine's tile: every item's rows of the block (f32, after the warps' areas).
  const int warp_bytes = TileWarpBytes(p, F::kBlockScaled);
  float* const tile = reinterpret_cast<float*>(smem + kBlockWarps * warp_bytes);
  const int tile_rows = kWarpRows * p.row_loops;
  // kPreload (kTileCombine only; the caller's shared memory holds PreloadBytes(tile_rows) after the
  // tile): the combine's inputs read at the start (PreloadCombineInputs).
  static_assert(!kPreload || kTileCombine, "the preload is the in-block combine's");
  float* const pre = tile + kBlockWarps * tile_rows;
  if constexpr (kPreload) {
    if (warp == 0) PreloadCombineInputs(p.combine, pre, p.n, block_row, tile_rows, by, lane);
  }
  const auto combine = [&] {
    if constexpr (kPreload) {
      CombineInBlockPreloaded(p.combine, tile, pre, p.n, block_row, tile_rows, kBlockWarps * 32, by);
    } else {
      CombineInBlock(p.combine, tile, p.n, block_row, tile_rows, kBlockWarps * 32, by);
    }
  };
  if (Grouped(p) && !p.early_items) PdlWait();  // as in the kernel above
  if (!kTileCombine && p.item_count != nullptr && item >= *p.item_count) return;
  const int m = !kTileCombine || warp < p.tile_items ? ItemRows(p, item) : 0;  // as in the kernel above
  if (m <= 0) {
    if constexpr (kTileCombine) {
      // A warp without an item, or whose item's id names no entry: no products, but the barrier
      // and the combine (which then leaves the token's row as it is) with the others.
      PdlLaunchDependents();
      if (p.early_items) wait(false);
      if (warp < p.tile_items && lane == 0 && p.error_flag != nullptr) {
        RecordDeviceError(p.error_flag, p.error_code, ItemErrorIndex(p, item));
      }
      __syncthreads();
      combine();
    } else {
      if (p.early_items) wait(false);
      RecordBadId(p, item);
      if (p.combine.counters != nullptr) CombineTile(p.combine, p.c, p.item_count, p.n, bx, block_row, block_row + kBlockRows * p.row_loops);
    }
    return;
  }

  // The warp's groups: group i holds rows first_row + i * kGroupStride .. + 15; groups wholly past
  // n are not taken.
  const int64_t first_row = block_row + (kTileCombine ? 0 : warp * kWarpRows);
  const int groups =
      first_row < p.n ? static_cast<int>(min(static_cast<int64_t>(p.row_loops), (p.n - first_row + kGroupStride - 1) / kGroupStride))
                      : 0;
  const int steps = p.units * kUnitSteps;  // per group: the whole K
  const int total_steps = groups * steps;

  const char* item_b = ItemB(p, item);
  const uint16_t* item_scale = ItemScale<uint16_t>(p, item);
  // Lane rows of group i (rows past n read row n - 1, whose results are not written); opaque to the
  // compiler for the reason the kernel above gives.
  const auto rows_of = [&](int i) {
    LaneRows rows;
    const int64_t row0 = first_row + static_cast<int64_t>(i) * kGroupStride;
    const bool tiled = kTiled || p.tiled;
    if (tiled) rows = TiledLaneRows(p, item_b, item_scale, row0, steps, lane, g);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (!tiled) {
        const int64_t r = min(row0 + g + 8 * h, p.n - 1);
        rows.row[h] = item_b + r * p.ldb;
        rows.scale_row[h] = item_scale + r * p.scale_ld;
      }
      asm volatile("" : "+l"(rows.row[h]), "+l"(rows.scale_row[h]));
    }
    return rows;
  };
  LaneRows load_rows = rows_of(0);
  int load_group = 0, load_step = 0;
  const char* load_tile = kTiled ? load_rows.row[0] : nullptr;  // tiled: the lane's bytes in the step's tile
  const auto advance = [&] {
    if constexpr (kTiled) load_tile += kQuantTileBytes;
    if (++load_step == steps) {
      load_step = 0;
      if (++load_group < groups) {
        load_rows = rows_of(load_group);
        if constexpr (kTiled) load_tile = load_rows.row[0];
      }
    }
  };

  // The whole K staged once (units: one tile), and fp8's scale rows of the block's rows after it;
  // in-block combine: each warp its own item's row and scale rows, in its own area. The scales are
  // weights, final before the launch: they are staged before the wait, while the kernels before
  // finish.
  const int block_rows = kBlockRows * p.row_loops;
  unsigned char* const act_smem = kTileCombine ? smem + warp * warp_bytes : smem;
  unsigned char* const scales = kTileCombine ? act_smem + p.act_stride : smem + p.m * p.act_stride;
  const auto stage_scales = [&] {
    if constexpr (F::kBlockScaled) {
      if constexpr (kTileCombine) {
        StageScales(p, item, block_row, tile_rows, p.row_loops + 1, 0, p.units, reinterpret_cast<float*>(scales),
                    lane, 32);
      } else {
        StageScales(p, item, block_row, block_rows, p.row_loops + 1, 0, p.units, reinterpret_cast<float*>(scales),
                    threadIdx.x, kThreads);
      }
    }
  };

  typename F::Item ring[kDepth];
  FillRingThenWait<kDepth>(
      total_steps,
      [&](int d) {
        F::template Load<kTiled>(p, load_rows, load_tile, load_step, c, ring[d]);
        advance();
      },
      [&](bool has_item) {
        stage_scales();
        wait(has_item);
      });

  if constexpr (kTileCombine) {
    StageActivations<F>(p, item, m, 0, p.units, act_smem, lane, 32);
    __syncwarp();
  } else {
    StageActivations<F>(p, item, m, 0, p.units, smem, threadIdx.x, kThreads);
    __syncthreads();
  }

  float acc[kChains][4], sum[kOperands][4];  // sum: fp8's block-scaled sums
  Zero(acc);
  Zero(sum);
  int act_row[kOperands];
  ActRows(p, m, g, c, act_row);
  // fp8: the byte offsets, in the staged scales, of the scale rows of rows g and g + 8 of group i.
  const int64_t first_scale_row = (p.row0 + block_row) >> 7;
  const auto scale_rows_of = [&](int i, int (&at)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = min(first_row + static_cast<int64_t>(i) * kGroupStride + g + 8 * h, p.n - 1);
      at[h] = static_cast<int>(((p.row0 + r) >> 7) - first_scale_row) * p.units * 4;
    }
  };
  int scale_row_at[2] = {0, 0};
  if constexpr (F::kBlockScaled) scale_rows_of(0, scale_row_at);
  float* const item_c = ItemC(p, item);
  // Group i's sums, final: out = alpha * sum (+ beta * out) (+ bias). Fragment element e of operand
  // h is weight row g (e < 2) or g + 8, activation row 8 h + 2 c + e % 2 (the m16n8 C layout).
  const auto write_group = [&](int i) {
    const int64_t row_base = first_row + static_cast<int64_t>(i) * kGroupStride + g;
#pragma unroll
    for (int h = 0; h < kOperands; ++h) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float total;
        if constexpr (F::kBlockScaled) {
          total = sum[h][e];
        } else if constexpr (kOperands == 1) {
          total = acc[0][e] + acc[1][e];  // the two chains hold parts of one sum
        } else {
          total = acc[h][e];
        }
        const int64_t row = row_base + (e >= 2 ? 8 : 0);
        const int mr = 8 * h + 2 * c + e % 2;
        if (row >= p.n || mr >= m) continue;
        float* out = item_c + mr * p.ldc + row;
        float v = p.alpha * (F::kSumScale * total);
        if (p.beta != 0.0f) v += p.beta * *out;
        if (p.bias != nullptr) v += p.bias[row];
        *out = v;
        if constexpr (kTileCombine) tile[warp * tile_rows + (row - block_row)] = v;
      }
    }
  };

  int cons_group = 0, cons_step = 0;
  for (int j = 0; j < total_steps; j += kDepth) {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      if (j + d >= total_steps) break;
      StepActivations<kOperands> act{act_smem, {}};
#pragma unroll
      for (int o = 0; o < kOperands; ++o) act.row[o] = act_row[o] + cons_step * (F::kStepColumns * 2);
      F::Products(ring[d], act, acc);
      if constexpr (F::kBlockScaled) {
        // A unit's last step: groups and ring cycles start at unit boundaries (steps and kDepth are
        // multiples of kUnitSteps), so cons_step % kUnitSteps == d % kUnitSteps.
        if (d % kUnitSteps == kUnitSteps - 1) {
          const int u = cons_step / kUnitSteps;
          const float s_lo = *reinterpret_cast<const float*>(scales + scale_row_at[0] + 4 * u);
          const float s_hi = *reinterpret_cast<const float*>(scales + scale_row_at[1] + 4 * u);
          FoldBlockSums(acc, sum, s_lo, s_hi);
        }
      }
      if (++cons_step == steps) {  // the group's last step: its sums are final
        write_group(cons_group);
        Zero(acc);
        Zero(sum);
        cons_step = 0;
        if (++cons_group < groups) {
          if constexpr (F::kBlockScaled) scale_rows_of(cons_group, scale_row_at);
        }
      }
      if (j + d + kDepth < total_steps) {
        F::template Load<kTiled>(p, load_rows, load_tile, load_step, c, ring[d]);
        advance();
      }
    }
  }
  if constexpr (kTileCombine) {
    __syncthreads();
    combine();
  } else if (p.combine.counters != nullptr) {
    CombineTile(p.combine, p.c, p.item_count, p.n, bx, block_row, block_row + block_rows);
  }
}

// The wider in-block block (kBlockWarps > kWarps) keeps 2 blocks a multiprocessor, its registers
// capped as the fp8 8-warp form's are at 2 (kQuantGemvMaxTileItems says why 9 warps fit).
template <typename F, int kOperands, bool kTiled, bool kTileCombine, int kBlockWarps = kWarps>
__global__ void __launch_bounds__(kBlockWarps * 32, (kBlockWarps == kWarps
                                                         ? kRowLoopBlocksPerSm<F, kOperands, kTiled, kTileCombine>
                                                         : kQuantGemvBlocksPerSm))
    QuantGemvRowLoopKernel(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  QuantGemvRowLoopBlock<F, kOperands, kTiled, kTileCombine, kBlockWarps>(p, blockIdx.x, blockIdx.y, smem,
                                                                         WaitForPredecessors{});
}

// ---- Chained products (LaunchInt4GroupGemvChain) ------------------------------------------------
//
// One kernel for a decode round's gate-up product and the down product gated from it: the launches
// of two kernels pay twice what a kernel costs beside its weight steps (the setup, the first loads
// after the wait, the block barriers, the drain of the last blocks), which at one token is most of
// each. Its blocks take units of work from a ticket counter: first the gate-up product's (block
// bx, item by of its plan), then the down product's tiles. A gate-up block counts itself done for
// its pair (items 2j, 2j + 1) with a release; a down warp for pair j loads its first weight steps,
// then waits for all of pair j's gate-up blocks with an acquire before it stages the gated row. Every
// gate-up unit is taken before any down unit, by a block that finishes it without waiting: the
// waits always end, however few blocks run at once.

// Counter lines (ints) of the sync area (kQuantGemvChainSyncInts).
constexpr int kChainLine = 32;
// The gate-up units' ring depth: the loop around both products and the folded reduction take the
// registers that a deeper ring would need (ptxas spills from 3 steps on at 2 blocks a multiprocessor).
constexpr int kChainDepth = 2;

struct ChainGeometry {
  int first_row_blocks;  // the gate-up plan's blocks of rows an item
  int first_units;       // first_row_blocks * the gate-up items
  int units;             // first_units + the down product's tiles
};

__global__ void __launch_bounds__(kThreads, kQuantGemvBlocksPerSm)
    QuantGemvChainKernel(const Params first, const Params second, int* sync, const ChainGeometry geo) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int unit_at;
  int* const ticket = sync;
  int* const done = sync + kChainLine;
  int* const pair_done = sync + 2 * kChainLine;
  // The expert table is final before the launch (the ids are not): its lines are asked into L2
  // while the kernels before finish, so that each unit's entry read after its id hits there.
  {
    const int64_t lines = (static_cast<int64_t>(first.num_entries) * first.entry_bytes + 127) / 128;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    if (i < lines) PrefetchL2(first.table + i * 128);
  }
  // The ids, x, out and the counters (which the previous launch resets as it ends) are read only once
  // the kernels before have completed.
  PdlWait();
  if (threadIdx.x == 0) unit_at = atomicAdd(ticket, 1);
  __syncthreads();
  int unit = unit_at;
  const int pair_units = 2 * geo.first_row_blocks;
  while (unit < geo.units) {
    int next = 0;
    if (threadIdx.x == 0) next = atomicAdd(ticket, 1);  // in flight while this unit runs
    if (unit < geo.first_units) {
      const int item = unit / geo.first_row_blocks;
      QuantGemvBlock<Int4Format, 1, true, true, kChainDepth>(first, static_cast<unsigned>(unit % geo.first_row_blocks),
                                                static_cast<unsigned>(item), smem);
      __syncthreads();  // every thread's rows are written
      if (threadIdx.x == 0) RedReleaseAddGpu(pair_done + (item / 2) * kChainLine, 1);
    } else {
      const auto wait = [&](bool has_item) {
        if (!has_item) return;
        const int* const count = pair_done + (threadIdx.x / 32) * kChainLine;
        if (threadIdx.x % 32 == 0) {
          while (LdRelaxedGpu(count) < pair_units) __nanosleep(32);
          LdAcquireGpu(count);  // the count only grows until every wait is past: all its releases
        }
        __syncwarp();
      };
      QuantGemvRowLoopBlock<Int4Format, 1, true, true, kWarps, /*kPreload=*/true>(
          second, static_cast<unsigned>(unit - geo.first_units), 0, smem, wait);
    }
    __syncthreads();  // shared memory and unit_at are free again
    if (threadIdx.x == 0) unit_at = next;
    __syncthreads();
    unit = unit_at;
  }
  // The last block out resets the counters for the next launch: every block has taken its last
  // ticket and passed its last wait.
  if (threadIdx.x == 0 && atomicAdd(done, 1) == static_cast<int>(gridDim.x) - 1) {
    *ticket = 0;
    for (int j = 0; j < kQuantGemvMaxChainItems; ++j) pair_done[j * kChainLine] = 0;
    *done = 0;
  }
}

// ---- Launch ---------------------------------------------------------------------------------------

// The checks and fields both formats share (a, c, bias, sizes).
cudaError_t CommonParams(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a, float* c,
                         int64_t ldc, int64_t batch_stride_c, const float* bias, int64_t batch, int64_t m,
                         int64_t n, int64_t k, float alpha, float beta, const QuantGemvItems& items, Params& p) {
  if ((a == nullptr && items.a == nullptr) || (c == nullptr && items.c == nullptr)) return cudaErrorInvalidValue;
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
  p.a_vec = (items.a != nullptr ? items.a_aligned16 : reinterpret_cast<uintptr_t>(a) % 16 == 0) && p.lda % vec == 0 &&
            p.stride_a % vec == 0;
  p.a_items = items.a;
  p.b_items = items.codes;
  p.scale_items = items.scales;
  p.c_items = items.c;
  p.item_count = items.count;
  p.rows_items = items.rows;
  if (items.silu_up_offset < 0 || (items.silu_up_offset > 0 && p.a_bf16)) return cudaErrorInvalidValue;
  p.silu_up = items.silu_up_offset;
  p.a_vec = p.a_vec && p.silu_up % 4 == 0;
  const QuantGemvCombine& cb = items.combine;
  if (cb.counters != nullptr &&
      (items.c != nullptr || c == nullptr || cb.ids == nullptr || cb.weights == nullptr ||
       (cb.slot_of == nullptr && cb.pair_rows < 1) || cb.out == nullptr || cb.row_ld < n || cb.tokens < 0 ||
       cb.top_k < 0 || cb.token0 < 0 || cb.ids_stride < 0 || cb.weights_stride < 0 || cb.out_stride < 0)) {
    return cudaErrorInvalidValue;
  }
  p.combine = cb;
  const QuantGemvIndexedItems& ix = items.indexed;
  if (ix.ids != nullptr) {
    const auto in_entry = [&](int64_t at) { return at >= 0 && at % 8 == 0 && at + 8 <= ix.entry_bytes; };
    if (items.codes != nullptr || items.scales != nullptr || items.rows != nullptr || ix.table == nullptr ||
        (ix.per_id != 1 && ix.per_id != 2) || batch % ix.per_id != 0 || ix.entry_bytes < 8 ||
        ix.entry_bytes % 8 != 0 || ix.num_entries < 0 || ix.error_index < 0 ||
        reinterpret_cast<uintptr_t>(ix.table) % 8 != 0 || (ix.ids_final && items.count != nullptr) ||
        ix.token_items < 0 || ix.token_items > INT_MAX || ix.token_items % ix.per_id != 0 ||
        (ix.a_by_token && (ix.token_items == 0 || items.a != nullptr))) {
      return cudaErrorInvalidValue;
    }
    for (int r = 0; r < ix.per_id; ++r) {
      if (!in_entry(ix.codes_at[r]) || !in_entry(ix.scales_at[r])) return cudaErrorInvalidValue;
    }
    p.ids = ix.ids;
    p.table = static_cast<const char*>(ix.table);
    p.entry_bytes = ix.entry_bytes;
    p.num_entries = ix.num_entries;
    p.per_id = ix.per_id;
    for (int r = 0; r < 2; ++r) {
      p.codes_at[r] = ix.codes_at[r];
      p.scales_at[r] = ix.scales_at[r];
    }
    p.scales_skip = ix.scales_skip;
    p.error_flag = ix.error_flag;
    p.error_code = ix.error_code;
    p.error_index = ix.error_index;
    p.early_items = ix.ids_final;
    p.token_items = static_cast<int>(ix.token_items);
    p.a_by_token = ix.a_by_token;
  }
  p.c = c;
  p.ldc = m > 1 ? ldc : 0;
  p.stride_c = batch > 1 ? batch_stride_c : 0;
  p.bias = bias;
  p.m = static_cast<int>(m);
  p.n = n;
  p.k = static_cast<int>(k);
  p.alpha = alpha;
  p.beta = beta;
  return cudaSuccess;
}

// QuantGemvTiledKernel's process-wide choice: -1 until first read.
std::atomic<int> tiled_kernel_choice{-1};

// Lets `kernel` take up to kQuantGemvSharedMax of dynamic shared memory where a launch needs more
// than the default limit: once per device and kernel (the attribute is per device; setting it can
// wait for the device's copies in flight, so not at every launch).
template <typename Kernel>
cudaError_t AllowShared(Kernel* kernel, size_t bytes) {
  if (bytes <= kQuantGemvSharedLimit) return cudaSuccess;
  int device = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  static std::mutex mutex;
  static std::vector<std::pair<int, const void*>> allowed;
  const std::pair<int, const void*> key{device, reinterpret_cast<const void*>(kernel)};
  const std::lock_guard<std::mutex> lock(mutex);
  if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) return cudaSuccess;
  if (const cudaError_t error =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kQuantGemvSharedMax));
      error != cudaSuccess) {
    return error;
  }
  allowed.push_back(key);
  return cudaSuccess;
}

// Whether a planned launch (either format) takes the in-block combine (QuantGemvCombine::in_block):
// one activation row on tiled codes in the specialized kernels, a row-looped plan, indexed items
// tokens x top_k token-major (token_items = top_k past one token), at most kQuantGemvMaxTileItems a
// token (a warp an item).
bool TileCombined(const Params& p, const QuantGemvProblem& problem, bool specialized) {
  const QuantGemvCombine& cb = p.combine;
  return p.row_loops > 0 && cb.in_block && cb.counters != nullptr && specialized && QuantGemvRowOperands(p.m) == 1 &&
         p.ids != nullptr && p.per_id == 1 && p.item_count == nullptr && cb.tokens >= 1 && cb.slot_of == nullptr &&
         cb.top_k >= 1 && cb.top_k <= kQuantGemvMaxTileItems &&
         static_cast<int64_t>(cb.tokens) * cb.top_k == problem.batch && (cb.tokens == 1 || p.token_items == cb.top_k);
}
// Its blocks' warps (kWarps, or one an item past that), its blocks (one per tile of 16 * row_loops
// rows and token) and their shared memory: each warp's staging area, then the tile's rows of every
// warp's item.
int TileCombineWarps(const Params& p) { return p.combine.top_k <= kWarps ? kWarps : kQuantGemvMaxTileItems; }
int64_t TileCombineBlocks(const Params& p) {
  const int64_t tile_rows = static_cast<int64_t>(kWarpRows) * p.row_loops;
  return (p.n + tile_rows - 1) / tile_rows;
}
size_t TileCombineShared(const Params& p, bool block_scaled, int warps) {
  return static_cast<size_t>(warps) *
         (TileWarpBytes(p, block_scaled) + static_cast<size_t>(kWarpRows) * p.row_loops * sizeof(float));
}

// Plans (or checks `plan`) into `chosen` and fills the split fields of `p` (weights, sizes and shift
// set).
cudaError_t PlanParams(Params& p, QuantGemvProblem& problem, const QuantGemvPlan* plan, QuantGemvPlan& chosen) {
  // The chooser keeps to its rule's limit; an explicit plan may take all the kernel can.
  problem.shared_limit = plan != nullptr ? kQuantGemvSharedMax : QuantGemvSharedLimitFor(problem.m);
  if (plan != nullptr) {
    if (!QuantGemvPlanValid(problem, *plan)) return cudaErrorInvalidValue;
    chosen = *plan;
  } else {
    int device = 0, sm_count = 0;
    if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
    if (const cudaError_t error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
        error != cudaSuccess) {
      return error;
    }
    chosen = ChooseQuantGemvPlan(problem, sm_count);
  }
  p.units = static_cast<int>(QuantGemvUnits(problem));
  p.wk = chosen.wk;
  p.split = chosen.split;
  p.row_loops = chosen.row_loops;
  p.rank_units = (p.units + p.split - 1) / p.split;
  p.part_units = chosen.part_units;
  p.tiles = chosen.tiles;
  p.act_stride = p.wk * p.part_units * kUnitColumns * 2 + 64;
  return cudaSuccess;
}

// Plans (or checks `plan`), fills the split fields of `p` (weights, sizes and shift set) and launches.
template <typename F>
cudaError_t Launch(Params p, QuantGemvProblem problem, const QuantGemvPlan* plan, bool programmatic,
                   cudaStream_t stream) {
  QuantGemvPlan chosen;
  if (const cudaError_t error = PlanParams(p, problem, plan, chosen); error != cudaSuccess) return error;
  const int operands = QuantGemvRowOperands(p.m);
  const size_t shared = QuantGemvSharedBytes(problem, chosen);
  const bool specialized = p.tiled && GetQuantGemvTiledKernel() != QuantGemvTiledKernel::kGeneric;
  if (p.row_loops > 0) {  // one plain block per 128 * row_loops rows (QuantGemvPlanValid: <= 16 rows)
    // The in-block combine where the launch is what QuantGemvCombine::in_block asks for: one block
    // per tile of 16 * row_loops rows and token, of each of the token's items.
    if (TileCombined(p, problem, specialized)) {
      p.tile_items = p.combine.top_k;
      // Several tokens: fp8's longer blocks (QuantGemvTileRowLoops), where their shared memory
      // fits; a caller's explicit plan is run as given.
      if (plan == nullptr && p.combine.tokens > 1) {
        Params longer = p;
        longer.row_loops = QuantGemvTileRowLoops(problem, p.row_loops, p.combine.tokens);
        if (TileCombineShared(longer, F::kBlockScaled, TileCombineWarps(longer)) <= kQuantGemvSharedMax) {
          p.row_loops = longer.row_loops;
        }
      }
      const int warps = TileCombineWarps(p);
      const size_t tile_shared = TileCombineShared(p, F::kBlockScaled, warps);
      const auto kernel = warps == kWarps ? QuantGemvRowLoopKernel<F, 1, true, true>
                                          : QuantGemvRowLoopKernel<F, 1, true, true, kQuantGemvMaxTileItems>;
      if (const cudaError_t error = AllowShared(kernel, tile_shared); error != cudaSuccess) return error;
      const dim3 grid(static_cast<unsigned>(TileCombineBlocks(p)), static_cast<unsigned>(p.combine.tokens));
      return LaunchKernel(programmatic, kernel, grid, dim3(32 * warps), tile_shared, stream, p);
    }
    const int64_t block_rows = static_cast<int64_t>(kBlockRows) * p.row_loops;
    const dim3 grid(static_cast<unsigned>((p.n + block_rows - 1) / block_rows), static_cast<unsigned>(problem.batch));
    const auto kernel = specialized ? (operands == 1 ? QuantGemvRowLoopKernel<F, 1, true, false>
                                                     : QuantGemvRowLoopKernel<F, 2, true, false>)
                                    : (operands == 1 ? QuantGemvRowLoopKernel<F, 1, false, false>
                                                     : QuantGemvRowLoopKernel<F, 2, false, false>);
    if (const cudaError_t error = AllowShared(kernel, shared); error != cudaSuccess) return error;
    return LaunchKernel(programmatic, kernel, grid, dim3(kThreads), shared, stream, p);
  }
  const int64_t row_blocks = (p.n + kBlockRows / p.wk - 1) / (kBlockRows / p.wk);
  const dim3 grid(static_cast<unsigned>(row_blocks * p.split), static_cast<unsigned>(problem.batch));
  const auto kernel = specialized ? (operands == 1   ? QuantGemvKernel<F, 1, true>
                                 : operands == 2 ? QuantGemvKernel<F, 2, true>
                                                 : QuantGemvKernel<F, 4, true>)
                              : (operands == 1   ? QuantGemvKernel<F, 1, false>
                                 : operands == 2 ? QuantGemvKernel<F, 2, false>
                                                 : QuantGemvKernel<F, 4, false>);
  if (const cudaError_t error = AllowShared(kernel, shared); error != cudaSuccess) return error;
  return LaunchKernelInClusters(programmatic, static_cast<unsigned>(p.split), kernel, grid, dim3(kThreads), shared,
                                stream, p);
}

// The launchers' shared body, with a grouped launch's items (none: all nullptr).
cudaError_t Fp8Gemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a, const Fp8BlockWeights& b,
                    float* c, int64_t ldc, int64_t batch_stride_c, const float* bias, int64_t batch, int64_t m, int64_t n,
                    int64_t k, float alpha, float beta, const QuantGemvPlan* plan, bool programmatic,
                    const QuantGemvItems& items, cudaStream_t stream) {
  Params p{};
  if (const cudaError_t error = CommonParams(a, a_type, lda, batch_stride_a, c, ldc, batch_stride_c, bias, batch, m, n,
                                             k, alpha, beta, items, p);
      error != cudaSuccess) {
    return error;
  }
  const bool indexed = items.indexed.ids != nullptr;
  if ((b.codes == nullptr && items.codes == nullptr && !indexed) ||
      (b.scale_inv == nullptr && items.scales == nullptr && !indexed)) {
    return cudaErrorInvalidValue;
  }
  if (b.row0 < 0 || b.col0 < 0 || b.col0 > kMaxColumn || b.col0 % 16 != 0) return cudaErrorInvalidValue;
  if (!b.tiled && n > 1 && (b.ld < k || b.ld % 16 != 0)) return cudaErrorInvalidValue;
  if (batch > 1 && (b.batch_stride < 0 || b.batch_stride % 16 != 0 || b.scale_batch_stride < 0)) {
    return cudaErrorInvalidValue;
  }
  if (b.tiled && batch > 1 && items.codes == nullptr && b.batch_stride != 0 &&
      b.batch_stride < QuantTiledBytes(false, n, k, b.col0)) {
    return cudaErrorInvalidValue;
  }
  const int64_t scale_rows = (b.row0 + n - 1) / kFp8ScaleBlock + 1;
  const int64_t scale_cols = (b.col0 + k - 1) / kFp8ScaleBlock + 1;
  if (scale_rows > 1 && b.scale_ld < scale_cols) return cudaErrorInvalidValue;
  if (items.codes == nullptr && !indexed && reinterpret_cast<uintptr_t>(b.codes) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  p.b = reinterpret_cast<const char*>(b.codes);
  p.tiled = b.tiled;
  p.ldb = n > 1 && !b.tiled ? b.ld : 0;
  p.stride_b = batch > 1 ? b.batch_stride : 0;
  p.scale = b.scale_inv;
  p.scale_ld = scale_rows > 1 ? b.scale_ld : 0;
  p.scale_stride = batch > 1 ? b.scale_batch_stride : 0;
  p.row0 = b.row0;
  p.col0 = static_cast<int>(b.col0);
  p.shift = p.col0 % kUnitColumns;
  QuantGemvProblem problem;
  problem.int4 = false;
  problem.batch = batch;
  problem.m = m;
  problem.n = n;
  problem.k = k;
  problem.shift = p.shift;
  // A gated product is planned as the product of its bf16 activations computed beforehand would be:
  // the same plan, so the same bits (its staging reads two f32 rows instead, small beside the weights).
  // So is an indexed one, which stands in for a grouped round's bf16 copies of its f32 rows.
  problem.a_bytes = p.a_bf16 || p.silu_up > 0 || p.ids != nullptr ? 2 : 4;
  problem.weight_bytes = static_cast<double>(batch) * n * k;
  return Launch<Fp8Format>(p, problem, plan, programmatic, stream);
}

// Int4Gemv's checks and fields, before planning.
cudaError_t Int4Setup(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a, const Int4GroupWeights& b,
                      float* c, int64_t ldc, int64_t batch_stride_c, const float* bias, int64_t batch, int64_t m,
                      int64_t n, int64_t k, float alpha, float beta, const QuantGemvItems& items, Params& p,
                      QuantGemvProblem& problem) {
  p = Params{};
  if (const cudaError_t error = CommonParams(a, a_type, lda, batch_stride_a, c, ldc, batch_stride_c, bias, batch, m, n,
                                             k, alpha, beta, items, p);
      error != cudaSuccess) {
    return error;
  }
  const bool indexed = items.indexed.ids != nullptr;
  if ((b.packed == nullptr && items.codes == nullptr && !indexed) ||
      (b.scale == nullptr && items.scales == nullptr && !indexed)) {
    return cudaErrorInvalidValue;
  }
  if (b.group_size < 32 || (b.group_size & (b.group_size - 1)) != 0 || b.group_size > (int64_t{1} << 30)) {
    return cudaErrorInvalidValue;
  }
  if (b.col0 < 0 || b.col0 > kMaxColumn || b.col0 % 8 != 0) return cudaErrorInvalidValue;
  const int64_t words = (k + 7) / 8;
  if (!b.tiled && n > 1 && (b.ld < words || b.ld % 4 != 0)) return cudaErrorInvalidValue;
  if (batch > 1 && (b.batch_stride < 0 || b.batch_stride % 4 != 0 || b.scale_batch_stride < 0)) {
    return cudaErrorInvalidValue;
  }
  if (b.tiled && batch > 1 && items.codes == nullptr && b.batch_stride != 0 &&
      4 * b.batch_stride < QuantTiledBytes(true, n, k, b.col0)) {
    return cudaErrorInvalidValue;
  }
  const int64_t groups = (b.col0 + k - 1) / b.group_size + 1;
  if (n > 1 && b.scale_ld < groups) return cudaErrorInvalidValue;
  if (items.codes == nullptr && !indexed && reinterpret_cast<uintptr_t>(b.packed) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  p.b = reinterpret_cast<const char*>(b.packed);
  p.tiled = b.tiled;
  p.ldb = n > 1 && !b.tiled ? b.ld * 4 : 0;
  p.stride_b = batch > 1 ? b.batch_stride * 4 : 0;
  p.scale = b.scale;
  p.scale_ld = n > 1 ? b.scale_ld : 0;
  p.scale_stride = batch > 1 ? b.scale_batch_stride : 0;
  p.col0 = static_cast<int>(b.col0);
  int shift = 0;
  while ((int64_t{1} << shift) < b.group_size) ++shift;
  p.group_shift = shift;
  p.last_group = static_cast<int>((b.col0 + k - 1) >> shift);
  p.shift = p.col0 % 32;
  problem = QuantGemvProblem{};
  problem.int4 = true;
  problem.batch = batch;
  problem.m = m;
  problem.n = n;
  problem.k = k;
  problem.shift = p.shift;
  // A gated product is planned as the product of its bf16 activations computed beforehand would be:
  // the same plan, so the same bits (its staging reads two f32 rows instead, small beside the weights).
  // So is an indexed one, which stands in for a grouped round's bf16 copies of its f32 rows.
  problem.a_bytes = p.a_bf16 || p.silu_up > 0 || p.ids != nullptr ? 2 : 4;
  problem.weight_bytes = static_cast<double>(batch) * n * (words * 4 + 2.0 * k / b.group_size);
  return cudaSuccess;
}

cudaError_t Int4Gemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a, const Int4GroupWeights& b,
                     float* c, int64_t ldc, int64_t batch_stride_c, const float* bias, int64_t batch, int64_t m,
                     int64_t n, int64_t k, float alpha, float beta, const QuantGemvPlan* plan, bool programmatic,
                     const QuantGemvItems& items, cudaStream_t stream) {
  Params p;
  QuantGemvProblem problem;
  if (const cudaError_t error = Int4Setup(a, a_type, lda, batch_stride_a, b, c, ldc, batch_stride_c, bias, batch, m, n,
                                          k, alpha, beta, items, p, problem);
      error != cudaSuccess) {
    return error;
  }
  return Launch<Int4Format>(p, problem, plan, programmatic, stream);
}

// Int4Setup and the plan of one product of a chain.
cudaError_t ChainSetup(const Int4GroupedProduct& d, Params& p, QuantGemvProblem& problem, QuantGemvPlan& plan) {
  if (const cudaError_t error = Int4Setup(d.a, d.a_type, d.lda, d.batch_stride_a, d.b, d.c, d.ldc, d.batch_stride_c,
                                          nullptr, d.max_items, d.m, d.n, d.k, 1.0f, 0.0f, d.items, p, problem);
      error != cudaSuccess) {
    return error;
  }
  return PlanParams(p, problem, nullptr, plan);
}

}  // namespace

cudaError_t LaunchInt4GroupGemvChain(const Int4GroupedProduct& first, const Int4GroupedProduct& second, int32_t* sync,
                                     bool programmatic, cudaStream_t stream) {
  Params p1, p2;
  QuantGemvProblem problem1, problem2;
  QuantGemvPlan plan1, plan2;
  if (const cudaError_t error = ChainSetup(first, p1, problem1, plan1); error != cudaSuccess) return error;
  if (const cudaError_t error = ChainSetup(second, p2, problem2, plan2); error != cudaSuccess) return error;
  if (sync == nullptr) return cudaErrorInvalidValue;
  const bool specialized = GetQuantGemvTiledKernel() != QuantGemvTiledKernel::kGeneric;
  // The round's shape: first's items are pair j's gate and up (two per id), second's item j is pair
  // j's down product gated from them, over the same ids.
  const QuantGemvIndexedItems& ix1 = first.items.indexed;
  const QuantGemvIndexedItems& ix2 = second.items.indexed;
  const bool round = p1.m == 1 && p2.m == 1 && p1.tiled && p2.tiled && ix1.ids != nullptr && ix1.per_id == 2 &&
                     ix2.ids == ix1.ids && ix2.per_id == 1 && first.items.count == nullptr &&
                     first.items.combine.counters == nullptr && first.items.silu_up_offset == 0 &&
                     second.a == first.c && second.a_type == GemvType::kF32 &&
                     second.batch_stride_a == 2 * first.batch_stride_c &&
                     second.items.silu_up_offset == first.batch_stride_c && first.max_items == 2 * second.max_items &&
                     second.k == first.n && second.max_items <= kQuantGemvMaxChainItems &&
                     second.items.combine.tokens == 1;
  // first's plan with its cluster ranks as warps (QuantGemvBlock<..., kFoldRanks>): each rank's units
  // a whole number of its warps' parts, its K range in one tile; second's with the in-block combine.
  const int ways = plan1.wk * plan1.split;
  const int64_t rank_units = (p1.units + plan1.split - 1) / plan1.split;
  const bool plans = plan1.row_loops == 0 && plan1.tiles == 1 && ways <= kWarps && kWarps % ways == 0 &&
                     (plan1.split == 1 || rank_units == static_cast<int64_t>(plan1.wk) * plan1.part_units) &&
                     TileCombined(p2, problem2, specialized);
  if (!round || !plans || !specialized) return cudaErrorNotSupported;
  const QuantGemvPlan folded{ways, 1, plan1.part_units, 1, 0};
  p1.fold_ranks = plan1.split;
  p1.wk = ways;
  p1.split = 1;
  p1.rank_units = p1.units;
  p1.act_stride = p1.wk * p1.part_units * kUnitColumns * 2 + 64;
  p2.tile_items = static_cast<int>(second.max_items);
  ChainGeometry geo;
  geo.first_row_blocks = static_cast<int>((p1.n + kBlockRows / ways - 1) / (kBlockRows / ways));
  geo.first_units = geo.first_row_blocks * static_cast<int>(first.max_items);
  geo.units = geo.first_units + static_cast<int>(TileCombineBlocks(p2));
  const size_t shared = std::max(QuantGemvSharedBytes(problem1, folded),
                                 TileCombineShared(p2, false, kWarps) + PreloadBytes(kWarpRows * p2.row_loops));
  if (const cudaError_t error = AllowShared(QuantGemvChainKernel, shared); error != cudaSuccess) return error;
  int device = 0, sm_count = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  if (const cudaError_t error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
      error != cudaSuccess) {
    return error;
  }
  // As many blocks as run at once: the kernel's register budget is kQuantGemvBlocksPerSm blocks a
  // multiprocessor, whose shared memory (at most kQuantGemvSharedMax each) fits beside them; more
  // blocks would only take their tickets after the work is gone.
  const int blocks = std::max(1, std::min(geo.units, kQuantGemvBlocksPerSm * sm_count));
  return LaunchKernel(programmatic, QuantGemvChainKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), shared,
                      stream, p1, p2, static_cast<int*>(sync), geo);
}

QuantGemvTiledKernel GetQuantGemvTiledKernel() {
  int choice = tiled_kernel_choice.load(std::memory_order_relaxed);
  if (choice < 0) {
    const char* value = std::getenv("EAGLE3_QUANT_GEMV_TILED_KERNEL");
    QuantGemvTiledKernel from_env = QuantGemvTiledKernel::kSpecialized;
    if (value != nullptr && std::strcmp(value, "generic") == 0) from_env = QuantGemvTiledKernel::kGeneric;
    int expected = -1;
    tiled_kernel_choice.compare_exchange_strong(expected, static_cast<int>(from_env));
    choice = tiled_kernel_choice.load(std::memory_order_relaxed);
  }
  return static_cast<QuantGemvTiledKernel>(choice);
}

void SetQuantGemvTiledKernel(QuantGemvTiledKernel kernel) {
  tiled_kernel_choice.store(static_cast<int>(kernel), std::memory_order_relaxed);
}

cudaError_t LaunchFp8BlockGemvPlanned(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                      const Fp8BlockWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                      const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                                      float beta, const QuantGemvPlan* plan, bool programmatic, cudaStream_t stream) {
  return Fp8Gemv(a, a_type, lda, batch_stride_a, b, c, ldc, batch_stride_c, bias, batch, m, n, k, alpha, beta, plan,
                 programmatic, QuantGemvItems{}, stream);
}

cudaError_t LaunchInt4GroupGemvPlanned(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                       const Int4GroupWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                       const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                                       float beta, const QuantGemvPlan* plan, bool programmatic, cudaStream_t stream) {
  return Int4Gemv(a, a_type, lda, batch_stride_a, b, c, ldc, batch_stride_c, bias, batch, m, n, k, alpha, beta, plan,
                  programmatic, QuantGemvItems{}, stream);
}

// A grouped launch may be programmatic: its blocks wait for the kernels before them before they read
// the item count and pointers (QuantGemvKernel), so only the launch overlaps those kernels' drain.
cudaError_t LaunchFp8BlockGemvGrouped(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                      const Fp8BlockWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                      const float* bias, const QuantGemvItems& items, int64_t max_items, int64_t m,
                                      int64_t n, int64_t k, float alpha, float beta, bool programmatic,
                                      cudaStream_t stream) {
  return Fp8Gemv(a, a_type, lda, batch_stride_a, b, c, ldc, batch_stride_c, bias, max_items, m, n, k, alpha, beta,
                 nullptr, programmatic, items, stream);
}

cudaError_t LaunchInt4GroupGemvGrouped(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                       const Int4GroupWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                       const float* bias, const QuantGemvItems& items, int64_t max_items, int64_t m,
                                       int64_t n, int64_t k, float alpha, float beta, bool programmatic,
                                       cudaStream_t stream) {
  return Int4Gemv(a, a_type, lda, batch_stride_a, b, c, ldc, batch_stride_c, bias, max_items, m, n, k, alpha, beta,
                  nullptr, programmatic, items, stream);
}

cudaError_t LaunchFp8BlockGemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                               const Fp8BlockWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                               const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                               float beta, bool programmatic, cudaStream_t stream) {
  return LaunchFp8BlockGemvPlanned(a, a_type, lda, batch_stride_a, b, c, ldc, batch_stride_c, bias, batch, m, n, k,
                                   alpha, beta, nullptr, programmatic, stream);
}

cudaError_t LaunchInt4GroupGemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                const Int4GroupWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                const float* bias, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha,
                                float beta, bool programmatic, cudaStream_t stream) {
  return LaunchInt4GroupGemvPlanned(a, a_type, lda, batch_stride_a, b, c, ldc, batch_stride_c, bias, batch, m, n, k,
                                    alpha, beta, nullptr, programmatic, stream);
}

}  // namespace eagle3::cuda
