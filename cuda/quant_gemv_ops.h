// Launchers for the small-M product with weight-only quantized weights (decode steps of FP8 and
// INT4 checkpoints: a few activation rows against a quantized weight matrix that stays quantized in
// device memory). Raw pointers, stream last, cudaError_t out; no allocation, no host
// synchronization (capturable); callable from any C++ compiler (no nvcc needed to include this
// header). Semantics are LaunchGemv's (gemv_ops.h), with w the dequantized weights:
//   c = alpha * a w^T + beta * c + bias      (beta == 0: c is never read; bias added last)
// Activations are rounded to bf16 (f32 `a`: round to nearest, ties to even; bf16 `a`: exact), as
// the bf16-weight GEMV path rounds them, and every product is taken on the tensor cores with fp32
// accumulation in a fixed order: the same result every run. How each format's weights enter the
// products is stated at its launcher. Row strides and batch strides are in elements of the
// operand they stride (bytes for e4m3 codes, int32 words for packed int4).
//
// Tensor-parallel slices: a launcher takes the slice as it is stored (its own rows and columns) and
// where it starts in the global matrix (row0, col0). Scales are indexed by the GLOBAL position, as
// the checkpoint loader does (eagle3/detail/quantized_weights.h), so a slice that starts inside a
// scale block or group uses that block's or group's scale.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "gemv_ops.h"

namespace eagle3::cuda {

// Most activation rows the quantized GEMV takes in one pass over the weights: the rows are the
// 8-row B operands of m16n8k16 tensor-core products (one, two or four of them), and each weight is
// widened once for all of them: where the widening, not the bytes, bounds a product, a second pass
// would pay it again.
inline constexpr int64_t kQuantGemvMaxRows = 32;

// ---- FP8 block-scaled (DeepSeek-V3 / R1, Kimi-K2-Instruct) ------------------------------------

// Rows and columns of one scale block: DeepSeek's weight_block_size [128, 128], the only size the
// published checkpoints use.
inline constexpr int64_t kFp8ScaleBlock = 128;

// A [n, k] slice of an e4m3 weight matrix [N_global, K_global] and its block scales. The
// dequantized weight of slice element (r, c) is e4m3(codes[r][c]) * scale_inv[(row0 + r) / 128]
// [(col0 + c) / 128]. e4m3's NaN codes (0x7f, 0xff), which no checkpoint holds, read as +-480.
struct Fp8BlockWeights {
  // [batch, n, k] e4m3 bytes, row stride ld >= k (any when n == 1), item stride batch_stride;
  // device; the pointer, ld (when n > 1) and batch_stride (when batch > 1) multiples of 16 bytes.
  const uint8_t* codes = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  // [batch, >= (row0 + n - 1) / 128 + 1, >= (col0 + k - 1) / 128 + 1], f32, row stride scale_ld,
  // item stride scale_batch_stride, device, any alignment: the global matrix's scale_inv (each
  // item's, for batched weights).
  const float* scale_inv = nullptr;
  int64_t scale_ld = 0;
  int64_t scale_batch_stride = 0;
  // The slice's first global row and column: row0 >= 0, 0 <= col0 <= 2^29 and a multiple of 16
  // (whole 16-byte chunks of a row share a scale block).
  int64_t row0 = 0;
  int64_t col0 = 0;
  // The codes in warp-step tiles (eagle3/detail/quant_tiles.h: QuantTiledBytes(false, n, k, col0)
  // bytes an item, TileQuantizedCodes), which the kernels stream as whole 1 KiB blocks; ld is then
  // unused and batch_stride 0 or >= those bytes. The same results as the row-major codes, bit for
  // bit.
  bool tiled = false;
};

// For each item i < batch: c_i = alpha * a_i w_i^T + beta * c_i + bias, x_i starting
// i * batch_stride_x elements after x. The e4m3 codes are widened exactly to bf16, each 128-column
// block's products are summed on the tensor cores in fp32 and that sum is multiplied by its
// scale_inv in fp32 (the scale applied per block sum rather than per weight: the products differ
// from those of the f32-dequantized weights only by fp32 rounding).
// a:    [batch, m, k], a_type, row stride lda >= k (any when m == 1), item stride batch_stride_a
//       >= 0, device, any alignment
// b:    the weights as above
// c:    [batch, m, n], f32, row stride ldc >= n (any when m == 1), item stride batch_stride_c,
//       device, any alignment; items and rows must not overlap one another, a, b or bias
// bias: [n], f32, device, added to every row of every item; nullptr for none
// 1 <= m <= kQuantGemvMaxRows, n >= 1, 1 <= k <= 2^29, 1 <= batch <= 65535; alpha and beta
// finite.
// programmatic: b (codes and scales) and bias are not written by any work enqueued on `stream`
// before this call: the kernel is launched as a programmatic dependent (programmatic_launch.cuh)
// and starts streaming b while that work drains; a and c are touched only after it has completed.
// Returns cudaErrorInvalidValue for sizes, strides, offsets or alpha / beta outside this, a missing
// pointer, or misaligned codes.
cudaError_t LaunchFp8BlockGemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                               const Fp8BlockWeights& b, float* c, int64_t ldc,
                               int64_t batch_stride_c, const float* bias, int64_t batch, int64_t m,
                               int64_t n, int64_t k, float alpha, float beta, bool programmatic,
                               cudaStream_t stream);

// ---- INT4 group-quantized W4A16 (compressed-tensors pack-quantized: Kimi-K2-Thinking / K2.5) ----

// A [n, k] slice of a pack-quantized int4 weight matrix [N_global, K_global] and its group scales.
// The packing is eagle3/detail/int4_packing.h's (value j of a row in word j / 8, bits
// 4 (j % 8) .. 4 (j % 8) + 3, stored as q + 8, q in [-8, 7]); the slice's value (r, c) is value
// col0 + c of global row r's packed row, so `packed` points at word col0 / 8 of the slice's first
// row. The dequantized weight is q * scale[r][(col0 + c) / group_size].
struct Int4GroupWeights {
  // [batch, n, ceil(k / 8)] int32 (packed), row stride ld (words) >= ceil(k / 8) (any when n == 1),
  // item stride batch_stride (words), device; the pointer, ld (when n > 1) and batch_stride (when
  // batch > 1) multiples of 16 bytes.
  const int32_t* packed = nullptr;
  int64_t ld = 0;
  int64_t batch_stride = 0;
  // [batch, n, >= (col0 + k - 1) / group_size + 1], bf16 bit patterns, row stride scale_ld, item
  // stride scale_batch_stride, device, any alignment: the slice's rows of the global matrix's
  // weight_scale (every group of K_global).
  const uint16_t* scale = nullptr;
  int64_t scale_ld = 0;
  int64_t scale_batch_stride = 0;
  // The slice's first global column: 0 <= col0 <= 2^29, a multiple of 8 (a whole int32 word).
  int64_t col0 = 0;
  // Columns sharing one scale: a power of two >= 32 (Kimi's checkpoints: 32).
  int64_t group_size = 32;
  // The packed words in warp-step tiles, as Fp8BlockWeights::tiled (QuantTiledBytes(true, n, k,
  // col0) bytes an item; batch_stride in words 0 or >= a quarter of that).
  bool tiled = false;
};

// As LaunchFp8BlockGemv (same a, c, bias, sizes, batch, programmatic and error contract), with the
// int4 weights above. The weights enter exactly: each 32-column group's products of the codes with
// the bf16 activations are exact in fp32 and summed there, and the group's sum is multiplied by its
// scale in fp32 (never rounded into a bf16 weight, as compressed-tensors' decompression to bf16
// would round q * scale).
// Returns cudaErrorInvalidValue also for a group size that is not a power of two >= 32, or a col0
// that is not a multiple of 8.
cudaError_t LaunchInt4GroupGemv(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                const Int4GroupWeights& b, float* c, int64_t ldc,
                                int64_t batch_stride_c, const float* bias, int64_t batch, int64_t m,
                                int64_t n, int64_t k, float alpha, float beta, bool programmatic,
                                cudaStream_t stream);

// ---- Grouped launches (the routed experts of an MoE layer) --------------------------------------

// The routed experts' combine as a grouped launch's epilogue (an MoE layer's down product): the
// launch's outputs, seen as rows of f32 starting at its c (row s at c + s * row_ld: c_items must
// be nullptr; an MoE launch's items are slots of row_ld-spaced rows), are gathered per token:
//   out[t] = (accumulate ? out[t] : 0) + sum_j weights[t, j] * row(slot_of[t * top_k + j]),
// j = 0, 1, ... in order in fp32, for the tokens t = token0 .. token0 + tokens - 1 whose ids are all
// in [0, num_experts) (a token with a bad id keeps its row). The rows of out a block tile of the
// product covers are written by the last block to finish that tile among all of the launch's items
// (a device counter per tile), after every item's rows of the tile are written: no launch of its
// own, and the same bits as a separate kernel adding the same terms in the same order.
struct QuantGemvCombine {
  // [ceil(n / 16)] i32, device: zero before the launch, zero again after it (the last block of a
  // tile resets its counter). nullptr: no combine.
  int32_t* counters = nullptr;
  int64_t row_ld = 0;                // >= n
  const int32_t* ids = nullptr;      // [token0 + tokens, top_k] i32, row stride ids_stride, device
  int64_t ids_stride = 0;
  const float* weights = nullptr;    // [token0 + tokens, top_k] f32, row stride weights_stride, device
  int64_t weights_stride = 0;
  // [tokens * top_k] i32, device: pair t * top_k + j's output row; nullptr: row (t * top_k + j) *
  // pair_rows (a launch of indexed items, QuantGemvIndexedItems: pair q's product is item q's).
  const int32_t* slot_of = nullptr;
  int64_t pair_rows = 0;
  float* out = nullptr;              // [token0 + tokens, n] f32, row stride out_stride, device; no
                                     // overlap with the launch's other operands
  int64_t out_stride = 0;
  int64_t token0 = 0;
  int tokens = 0, top_k = 0, num_experts = 0;
  bool accumulate = false;
  // Each token's pairs, combined inside a block (a decode or small verify round's down product):
  // with indexed items (QuantGemvIndexedItems, one id an item, no count) whose ids are the tokens'
  // ids token-major (token_items = top_k where tokens > 1), pair_rows set, top_k <=
  // kQuantGemvMaxTileItems and the launch's items tokens * top_k, a launch (INT4 or FP8) of one
  // activation row on tiled codes whose plan is row-looped gives each block one tile of rows of one
  // token's items (warp j its item j) and combines the tile in shared memory: the same terms in the
  // same order, so the same bits, without the counters' fences, atomics and last-block pass. Any
  // other launch ignores it and combines through the counters, which must be set either way.
  bool in_block = false;
};

// Most items of the in-block combine (QuantGemvCombine::in_block), a block's warp each: a top-8
// round with the shared expert joined as a ninth pair (DeepSeek-V3 / R1, Kimi-K2-Instruct). Past 8
// items the block has 9 warps, which at the fp8 form's registers still fit 2 blocks a
// multiprocessor (2 * 288 threads at up to 112 registers); a tenth would not.
inline constexpr int kQuantGemvMaxTileItems = 9;

// A grouped launch's items named by ids rather than by pointer arrays (a decode round's routed
// experts, without a kernel that writes their pointers first): item i is role i % per_id of table
// entry e = ids[i / per_id], its codes the pointer stored codes_at[role] bytes into the entry, its
// scales the pointer stored scales_at[role] bytes into it plus scales_skip bytes (int4: the slice's
// first row of scales), and its rows all m of the launch while e is in [0, num_entries); an item
// whose e is not has no rows (skipped, its c untouched) and, with error_flag, records error_index
// there (RecordDeviceError: the lowest index an op records wins). The ids may be written by the
// kernels just before the launch; the table may not.
struct QuantGemvIndexedItems {
  const int32_t* ids = nullptr;  // [max_items / per_id] i32, device; nullptr: not indexed
  const void* table = nullptr;   // device: num_entries entries of entry_bytes, 8-byte aligned
  int64_t entry_bytes = 0;
  int num_entries = 0;
  int per_id = 1;                    // 1 or 2 (max_items a multiple of it)
  int64_t codes_at[2] = {0, 0};      // byte offsets of role r's codes pointer in an entry (8-aligned)
  int64_t scales_at[2] = {0, 0};     // and of its scales pointer
  int64_t scales_skip = 0;           // bytes added to each scales pointer read
  int* error_flag = nullptr;         // device; nullptr: bad ids are not recorded
  int error_code = 0;
  int64_t error_index = 0;
  // Items of one token (a decode or verify round of several tokens, its pairs token-major): item i
  // is token t = i / token_items's, and a bad id of it records error_index + t; with a_by_token its
  // activation row is also its token's, row t of `a` (batch_stride_a apart) rather than row i. 0:
  // every item one token's (error_index), activation rows by item.
  int64_t token_items = 0;
  bool a_by_token = false;
  // The ids were written before the kernel just before a programmatic launch, and that kernel waits
  // for its own predecessors before it lets this launch start (the grouped launches here do): the
  // launch then reads the ids, the table and the weights before its programmatic wait, which it
  // keeps for its activations (a launch without a count only).
  bool ids_final = false;
};

// Per-item DEVICE pointers of a grouped launch: up to max_items products of one shape (n, k, m, the
// weights' ld, scale_ld, row0, col0 and group size shared: the experts of one MoE layer are the
// same slice of same-shaped tensors) whose operands need not be evenly spaced, and whose number is
// known only on the device. Each array is nullable: null, item i's operand is the batched launch's,
// its base pointer plus i times its item stride. The arrays (and count) may be written by the
// kernels enqueued just before on the stream.
struct QuantGemvItems {
  // [max_items] device arrays of device pointers:
  const void* const* a = nullptr;       // item i's activation rows [m, k], a_type, row stride lda
  bool a_aligned16 = false;             // with `a`: every a[i] 16-byte aligned (16-byte loads)
  const void* const* codes = nullptr;   // fp8: e4m3 codes [n, k] (Fp8BlockWeights::codes); int4: packed
                                        // words (Int4GroupWeights::packed); each 16-byte aligned
  const void* const* scales = nullptr;  // fp8: f32, as Fp8BlockWeights::scale_inv (the scale tensor's
                                        // block (0, 0), indexed by row0 + r, col0 + c); int4: bf16, as
                                        // Int4GroupWeights::scale (the slice's first row of scales)
  float* const* c = nullptr;            // item i's output rows [m, n], f32, row stride ldc
  // [1] i32, device: items i >= *count are skipped (their c untouched); nullptr: all max_items.
  const int32_t* count = nullptr;
  // [max_items] i32, device: item i's activation rows are its first min(m, rows[i]) (an MoE job's
  // tokens): only those are read and only their rows of c written (an item with none is skipped);
  // nullptr: m rows each.
  const int32_t* rows = nullptr;
  // A gated activation (the routed experts' down product after their gate and up products): > 0,
  // `a` is f32 and the product's activation (r, col) is silu(g) * u in fp32 with g = a's element
  // (r, col) and u the element silu_up_offset elements after it, rounded to bf16 as f32
  // activations are (so the same bits as the product of bf16(silu(g) * u) computed beforehand);
  // a multiple of 4 for 16-byte loads. 0: a as it is.
  int64_t silu_up_offset = 0;
  // An epilogue gathering the items' output rows into tokens' rows (QuantGemvCombine); none while
  // its counters are nullptr.
  QuantGemvCombine combine;
  // Items named by ids (QuantGemvIndexedItems): with indexed.ids set, codes, scales and rows above
  // must be nullptr (count may be set).
  QuantGemvIndexedItems indexed;
};

// LaunchFp8BlockGemv / LaunchInt4GroupGemv over batch = max_items items (same sizes, alignment and
// error contract, per-item strides as there for the operands without a pointer array), with the
// operands of `items`. A base pointer that an array replaces (a, c, b.codes / b.packed,
// b.scale_inv / b.scale) may be nullptr; the alignment rules of b.codes apply to every items.codes
// entry (unchecked: device memory). programmatic: launched as a programmatic dependent
// (programmatic_launch.cuh) whose blocks wait for the kernels before it before they read anything
// (the count, item pointers and the weights they point at may be written by those kernels): the
// launch and block scheduling overlap their drain, the loads do not. Also cudaErrorInvalidValue for
// indexed items beside codes, scales or rows arrays, or with per_id not 1 or 2, max_items not a
// multiple of it, no table, entry_bytes < 8, a pointer offset outside an entry or not 8-aligned, a
// negative num_entries or error_index, or ids_final with a count; and for a combine without slot_of
// whose pair_rows is < 1.
cudaError_t LaunchFp8BlockGemvGrouped(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                      const Fp8BlockWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                      const float* bias, const QuantGemvItems& items, int64_t max_items, int64_t m,
                                      int64_t n, int64_t k, float alpha, float beta, bool programmatic,
                                      cudaStream_t stream);
cudaError_t LaunchInt4GroupGemvGrouped(const void* a, GemvType a_type, int64_t lda, int64_t batch_stride_a,
                                       const Int4GroupWeights& b, float* c, int64_t ldc, int64_t batch_stride_c,
                                       const float* bias, const QuantGemvItems& items, int64_t max_items, int64_t m,
                                       int64_t n, int64_t k, float alpha, float beta, bool programmatic,
                                       cudaStream_t stream);

// ---- Chained launches (a decode round's gate-up and down products in one kernel) ----------------

// One grouped INT4 product's arguments, as LaunchInt4GroupGemvGrouped takes them.
struct Int4GroupedProduct {
  const void* a = nullptr;
  GemvType a_type = GemvType::kF32;
  int64_t lda = 0, batch_stride_a = 0;
  Int4GroupWeights b;
  float* c = nullptr;
  int64_t ldc = 0, batch_stride_c = 0;
  QuantGemvItems items;
  int64_t max_items = 0, m = 0, n = 0, k = 0;
};

// Ints of a chained launch's device counters: one 128-byte line each for the next block's unit of
// work, the blocks done, and each of the second product's items (kQuantGemvMaxChainItems).
inline constexpr int64_t kQuantGemvMaxChainItems = 8;
inline constexpr int64_t kQuantGemvChainSyncInts = (2 + kQuantGemvMaxChainItems) * 32;

// The two products of one token's routed-expert round as one kernel: `first` (the gate-up product:
// indexed items, two per id, one activation row, no count, no combine) and then `second` (the down
// product, gated from first's outputs: second.a == first.c, its item j's gate rows first's item 2j
// and its up rows item 2j + 1, i.e. batch_stride_a == 2 * first.batch_stride_c and silu_up_offset
// == first.batch_stride_c; indexed items, one per id, over the same ids; its combine in the block,
// QuantGemvCombine::in_block), with the results of the two launches
// LaunchInt4GroupGemvGrouped(first) then LaunchInt4GroupGemvGrouped(second), bit for bit: the same
// plans, the same sums in the same order. The kernel's blocks take units of work in turn from a
// device counter, all of first's before any of second's, and second's item j waits until first's
// blocks of items 2j and 2j + 1 have counted themselves done: no block waits on work that no running
// block holds, so the launch completes however few of its blocks the device runs at once. Where the
// first product's plan keeps each block's K range whole in one activation tile, its cluster ranks
// (if any) become warps of one block.
// sync: [kQuantGemvChainSyncInts] i32, device, zero before the launch and zero again after it (the
// last block resets it); a launch's counters must not be shared with a launch that may run at the
// same time. programmatic: as the grouped launchers (the blocks wait for the kernels before them
// before they read anything but their code).
// Returns cudaErrorNotSupported where the pair is not such a round or its plans do not allow one
// kernel (the caller launches the two products instead), and the grouped launchers' errors.
cudaError_t LaunchInt4GroupGemvChain(const Int4GroupedProduct& first, const Int4GroupedProduct& second, int32_t* sync,
                                     bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
