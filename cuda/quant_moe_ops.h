// Launchers for the routed experts of a quantized checkpoint (the kernels behind
// CudaBackend::QuantizedMoeExperts; semantics in eagle3/backend.h): every expert's gate, up and down
// weights stay FP8 block-scaled or INT4 group-quantized in device memory and are dequantized in
// registers as they stream. Raw pointers, stream last, cudaError_t out; no allocation and no host
// synchronization (capturable); callable from any C++ compiler (no nvcc needed to include this
// header). Row strides are in elements of the operand they stride (bytes for e4m3 codes, int32
// words for packed int4, elements for scales).
//
// The decode-time design: each touched expert's quantized bytes are read once per call (per round
// of tokens, below), however many of the call's tokens chose it. One round of kernels:
//  1. group the round's (token, slot) pairs by expert on the device (counting sort; a pair with a
//     bad id is left out and its token recorded in the error flag) into jobs of up to
//     kQuantMoeJobPairs pairs of one expert (on the grouped path up to the round's job_pairs,
//     QuantMoeJobPairsFor: one at decode; and a round of at most kQuantMoeFoldPairs pairs is
//     grouped by step 2's kernel rather than a kernel of its own);
//  then, on the grouped quantized GEMV (QuantMoeShape::grouped: every expert's views on the GEMV's
//  layout with one shared layout, QuantMoeGemvLayout; quant_gemv_ops.h's grouped launchers):
//  2. per job: its pairs' x rows rounded to bf16 into the job's kQuantMoeJobPairs-row slot, and the
//     job's weight pointers and pair count into the item arrays;
//  3. one grouped GEMV, items 2j and 2j + 1 = job j's gate and up (m = the round's job_pairs
//     rows, of which each item takes its job's pair count: QuantGemvItems::rows), then act =
//     bf16(silu(gate) * up) per pair row, then one grouped GEMV of down over the jobs' act slots: y
//     per pair row (slot rows past a job's pairs are never written or read); the grids are sized
//     for the most jobs a round can have and the blocks of jobs past the device job count exit at
//     once; at decode by default (QuantMoeShape::fold_silu, fold_combine) act is computed where the
//     down GEMV stages its activations, and step 4 below is the down GEMV's epilogue
//     (QuantGemvCombine), and steps 1 and 2 are left out (QuantMoeShape::direct_one_token: the
//     GEMVs find each pair's expert from its id and stage the token's row themselves);
//  or, off that layout (QuantMoeShape::grouped false; row-major codes only), CUDA-core kernels:
//  2'. x rounded to bf16 per token; per job and block of intermediate rows:
//      act[pair][i] = bf16(silu(gate_i . x) * (up_i . x));
//  3'. per job and block of hidden rows: y[pair][h] = down_h . act[pair];
//  4. per token: out[t] = (accumulate ? out[t] : 0) + sum_j weights[t, j] * y[t, j], j = 0, 1, ...
//     in order (a token with a bad id keeps its row).
// Numerics: x and act are rounded to bf16 (round to nearest, ties to even), as QuantizedGemm rounds
// its activations (quant_gemv_ops.h); step 4 adds the slots in order in fp32. The grouped path's
// products are the quantized GEMV's (tensor cores, fp32 sums in the GEMV's fixed order; fp8: exact
// e4m3 x bf16 products, each 128-column block's sum times its scale; int4: exact q x bf16
// products, each 32-column group's sum times its scale, as QuantizedGemm's GEMV path takes them).
// The CUDA-core path takes the weights as the exact f32 values DequantizeWeight gives (fp8: e4m3 *
// scale_inv rounded once in fp32; int4: q * bf16 scale, exact) in fp32 FMAs: each lane sums its
// 16-column chunks in column order, the lanes of a row are added in a fixed butterfly. No float
// atomics: every run gives the same bits. Which pairs share a job, and a pair's row within its job,
// may vary between runs of a round of more than kQuantMoeFoldPairs pairs (smaller ones keep an
// expert's pairs in index order); a pair's result does not depend on them (an activation row's
// products do not depend on the other rows of the tile).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

enum class QuantMoeFormat : int {
  kFp8Block = 0,   // e4m3 codes, f32 scale_inv per block_rows x block_cols block
  kInt4Group = 1,  // pack-quantized int4 (eagle3/detail/int4_packing.h), bf16 scale per row and group
};

// One quantized [rows, k] slice of one expert (QuantizedWeightView's fields, with the scale grid's
// offsets folded in): slice element (r, c) dequantizes to
//   q(r, c) * scales[(row_off + r) / block_rows * scales_ld + (col_off + c) / block_cols]
// with q(r, c) = e4m3(codes[r * codes_ld + c]) (fp8) or the int4 value nib0 + c of packed row r
// (int4: codes[r * codes_ld + (nib0 + c) / 8], nibble (nib0 + c) % 8).
struct QuantMoeMatrix {
  const void* codes = nullptr;   // fp8: uint8 codes; int4: int32 words; device
  const void* scales = nullptr;  // fp8: f32; int4: bf16 bit patterns; device
  int64_t codes_ld = 0;
  int64_t scales_ld = 0;
  int64_t row_off = 0;  // row0 - scale_row0 * block_rows, >= 0
  int64_t col_off = 0;  // col0 - scale_col0 * block_cols, >= 0
  int64_t nib0 = 0;     // int4: col0 % 8; fp8: 0
  // 1: the codes are in warp-step tiles (eagle3/detail/quant_tiles.h; codes_ld 0), which only the
  // grouped path reads; 0: row-major. An int64 so that the entry has no padding bytes (the backend
  // compares tables byte by byte).
  int64_t tiled = 0;
};

// The device table's entry per expert: gate and up [inter, hidden], down [hidden, inter].
struct QuantMoeExpert {
  QuantMoeMatrix gate, up, down;
};

// Columns a lane takes at once: one 16-byte load of fp8 codes, one 8-byte load of int4 words.
inline constexpr int64_t kQuantMoeChunk = 16;

// Whether a [rows, k] matrix can be read in whole kQuantMoeChunk-column chunks (aligned vector
// loads, one scale per chunk); otherwise the kernels read it a value at a time (same results).
inline bool QuantMoeChunked(const QuantMoeMatrix& m, int64_t rows, QuantMoeFormat format, int64_t block_cols) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(m.codes);
  if (block_cols % kQuantMoeChunk != 0 || m.col_off % kQuantMoeChunk != 0) return false;
  if (format == QuantMoeFormat::kFp8Block) return at % 16 == 0 && (rows <= 1 || m.codes_ld % 16 == 0);
  return m.nib0 == 0 && at % 8 == 0 && (rows <= 1 || m.codes_ld % 2 == 0);
}

// The layout of one matrix role (gate and up together, or down) that every expert shares on the
// grouped path: the quantized GEMV's Fp8BlockWeights / Int4GroupWeights fields other than the
// pointers (ld, scale_ld, row0 = QuantMoeMatrix::row_off, col0 = col_off).
struct QuantMoeGemvLayout {
  int64_t codes_ld = 0, scales_ld = 0, row_off = 0, col_off = 0;
  bool tiled = false;  // QuantMoeMatrix::tiled (Fp8BlockWeights::tiled / Int4GroupWeights::tiled)
};

// Whether a [rows, k] expert matrix is on the quantized GEMV launchers' layout (quant_gemv_ops.h):
// fp8 128 x 128 blocks, col_off a multiple of 16; int4 groups of a power of two >= 32, whole words
// (nib0 0); codes 16-byte aligned with rows on 16-byte boundaries; the scale grid as wide as the
// columns need; k and col_off <= 2^29.
inline bool QuantMoeOnGemvLayout(const QuantMoeMatrix& m, int64_t rows, int64_t k, QuantMoeFormat format,
                                 int64_t block_rows, int64_t block_cols) {
  constexpr int64_t kMaxColumn = int64_t{1} << 29;
  if (reinterpret_cast<uintptr_t>(m.codes) % 16 != 0 || k > kMaxColumn || m.col_off > kMaxColumn || m.row_off < 0 ||
      m.col_off < 0) {
    return false;
  }
  const int64_t scale_cols = (m.col_off + k - 1) / block_cols + 1;
  if (format == QuantMoeFormat::kFp8Block) {
    const int64_t scale_rows = (m.row_off + rows - 1) / block_rows + 1;
    return block_rows == 128 && block_cols == 128 && m.col_off % 16 == 0 && (rows <= 1 || m.codes_ld % 16 == 0) &&
           (scale_rows <= 1 || m.scales_ld >= scale_cols);
  }
  return block_cols >= 32 && block_cols <= (int64_t{1} << 30) && (block_cols & (block_cols - 1)) == 0 &&
         m.nib0 == 0 && (rows <= 1 || (m.codes_ld % 4 == 0 && m.scales_ld >= scale_cols));
}

// What every expert of a call shares.
struct QuantMoeShape {
  QuantMoeFormat format = QuantMoeFormat::kFp8Block;
  int64_t block_rows = 1, block_cols = 1;  // >= 1 (int4: block_rows 1)
  int64_t hidden = 0, inter = 0;           // H, I >= 0
  int64_t num_experts = 0;                 // table entries, <= kQuantMoeMaxExperts
  int64_t top_k = 0;
  // QuantMoeChunked holds for every expert's gate and up (gate_up_chunked), and down.
  bool gate_up_chunked = false, down_chunked = false;
  // The grouped-GEMV path: every expert's gate, up and down on the GEMV's layout
  // (QuantMoeOnGemvLayout), gate and up of every expert with the layout gate_up, down with `down`.
  bool grouped = false;
  QuantMoeGemvLayout gate_up, down;
  // On the grouped path, rounds of at most kQuantMoeFoldPairs pairs are grouped by step 2's kernel
  // itself, one launch fewer; false: by the grouping kernel, as larger rounds are (the same
  // grouping and the same bits: the reference the tests hold the fold to).
  bool fold_grouping = true;
  // On the grouped path, in rounds of one token (decode: jobs of one pair, QuantMoeJobPairsFor):
  // SiLU-mul computed where the down GEMV stages its activations (QuantGemvItems::silu_up_offset)
  // rather than by a kernel of its own, and step 4 done by the down GEMV's last block of each tile
  // of hidden rows (QuantGemvCombine) rather than by the combine kernel: two launches fewer, the
  // same bits (false: the kernels, the reference the tests hold the folds to). Larger rounds keep
  // the kernels: the down GEMV's blocks would each repeat the SiLU of their job's rows, and one
  // block per tile would combine every token's rows of it, both slower than the kernels they
  // replace from two tokens on (benchmarks/NOTES.md).
  bool fold_silu = true;
  bool fold_combine = true;
  // On the grouped path, rounds of one token with fold_silu and fold_combine: no slots kernel either.
  // Pair j is job j; the gate-up GEMV finds expert ids[j]'s weights in the device table itself
  // (QuantGemvIndexedItems) and stages the token's f32 row as bf16, the down GEMV likewise; a bad
  // id leaves its pair without rows and is recorded by the GEMVs. Two kernels a decode round instead
  // of three, the same bits (the same plans, products and combine order; false: the slots kernel).
  bool direct_one_token = true;
  // With direct_one_token, rounds of 2 to direct_max_tokens tokens run direct too, each pair its own
  // job (t * top_k + j: token t's slot j; ids token-major, at most kQuantGemvMaxTileItems a token),
  // where the down GEMV combines each token's pairs in its blocks (combine_in_block): no grouping,
  // slots, SiLU-mul or combine kernel, at the cost of reading an expert once for each of the round's
  // tokens that chose it. Its products are planned for one activation row an item, so their fp32
  // sums may be ordered otherwise than the grouped path's (not the same bits as the kernels; within
  // the same tolerances of the reference). 1: rounds of one token only (CudaBackend sets it by
  // format from CudaBackendOptions::quant_moe_direct_max_tokens_int4 / _fp8).
  int64_t direct_max_tokens = 1;
  // With direct_one_token, a round's down GEMV (INT4 or FP8) combines in its blocks
  // (QuantGemvCombine::in_block: each block one tile of hidden rows of one token's pairs, its
  // experts one warp each, no counters) where its launch allows (tiled codes, a row-looped plan,
  // top_k <= kQuantGemvMaxTileItems: a top-8 round with a joined shared expert's ninth pair takes a
  // block of 9 warps); the same bits.
  bool combine_in_block = true;
  // With combine_in_block, an INT4 round's gate-up and down GEMVs as one kernel
  // (LaunchInt4GroupGemvChain) where their plans allow: one kernel's fixed costs instead of two's,
  // the down GEMV's first weight loads in flight while the gate-up's last blocks run; the same bits.
  // (An FP8 form was measured slower than FP8's in-block combine alone: benchmarks/NOTES.md.)
  bool chain_round = true;
};

// Largest expert count (the grouping kernel's counters live in shared memory).
inline constexpr int64_t kQuantMoeMaxExperts = 4096;
// Pairs of one expert a job holds (the kernels keep a job's sums in registers).
inline constexpr int64_t kQuantMoeJobPairs = 8;
// Most pairs (tokens * top_k) of a round whose grouping step 2's kernel folds in
// (QuantMoeShape::fold_grouping). Every block of that kernel then groups the whole round itself (a
// few shared-memory passes over the pairs and the experts), and the kernel has kQuantMoeJobPairs
// blocks per job the round may have (jobs <= pairs): at most 1024 blocks of 256 threads, one wave
// of a Hopper GPU or little more, so the repeated grouping adds about one block's grouping time to
// the kernel, less than the grouping kernel's launch it saves. A larger round would repeat it over
// more waves, and its other kernels take longer, so that one launch matters less. Decode (a
// token's top-8 and the shared expert: 9 pairs) and verify steps of up to 14 tokens (16 without
// the shared expert) are folded.
inline constexpr int64_t kQuantMoeFoldPairs = 128;

// Most jobs max_pairs pairs over num_experts experts make when a job holds up to job_pairs
// (1 .. kQuantMoeJobPairs) pairs: an expert's c pairs make ceil(c / job_pairs) jobs, and a job
// holds at least one pair.
inline constexpr int64_t QuantMoeMaxJobs(int64_t max_pairs, int64_t num_experts,
                                         int64_t job_pairs = kQuantMoeJobPairs) {
  const int64_t bound = max_pairs / job_pairs + (num_experts < max_pairs ? num_experts : max_pairs) + 1;
  return bound < max_pairs ? bound : max_pairs;
}

// The pairs a job of the grouped path holds in a round of `tokens` tokens: one in a round of one
// token (a decode step), else kQuantMoeJobPairs. A token's top-k experts are distinct (a router's
// are), so each expert then has one job, and the products are planned for one activation row
// rather than for a job's 8: the gate-up product stages one row, its whole K range in one tile. A
// token naming an expert twice only makes more jobs. The launcher takes kQuantMoeJobPairs instead
// where the jobs this makes would not fit the workspace or the grid. Rounds of 2 to 7 tokens keep
// 8-pair jobs: planned for their own rows, 4 tokens measured slower (a larger first tile).
inline constexpr int64_t QuantMoeJobPairsFor(int64_t tokens) { return tokens <= 1 ? 1 : kQuantMoeJobPairs; }

// Rows of the per-job slots (kQuantMoeJobPairs per job, whatever a round's job_pairs).
inline constexpr int64_t QuantMoeSlotRows(int64_t max_pairs, int64_t num_experts,
                                          int64_t job_pairs = kQuantMoeJobPairs) {
  return QuantMoeMaxJobs(max_pairs, num_experts, job_pairs) * kQuantMoeJobPairs;
}

inline constexpr int64_t QuantMoeRoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

// Device scratch of one round of up to max_tokens tokens (contents overwritten by every call). With
// J = QuantMoeMaxJobs(max_tokens * top_k, max_experts, QuantMoeJobPairsFor(max_tokens)) jobs (a
// round whose own job_pairs would make more takes kQuantMoeJobPairs, which J bounds) and S = 8 J
// slot rows (>= the round's pairs and tokens), the
// grouped path holds the rows of job j's slot at rows [8 j, 8 j + 8) of x, act and y; the CUDA-core
// path indexes them by token (x) or round-local pair (act, y).
struct QuantMoeWorkspace {
  int32_t* sorted = nullptr;    // [max_tokens * top_k]: round-local pair t * top_k + j, expert-major
  int32_t* jobs = nullptr;      // [J, 3]: expert,
                                // first sorted pair, pair count
  int32_t* num_jobs = nullptr;  // [1]
  int32_t* gate_up_items = nullptr;  // [1]: 2 * *num_jobs (the gate-up GEMV's item count)
  int32_t* slot_of = nullptr;   // [max_tokens * top_k]: grouped path, a pair's slot row
  // [2 * max jobs] each: the gate-up GEMV's per-item activation rows, codes and scales (item 2j:
  // job j's gate, 2j + 1: its up); [max jobs] each: the down GEMV's codes and scales.
  const void** gate_up_a = nullptr;
  const void** gate_up_codes = nullptr;
  const void** gate_up_scales = nullptr;
  const void** down_codes = nullptr;
  const void** down_scales = nullptr;
  int32_t* gate_up_rows = nullptr;  // [2 * max jobs]: the gate-up GEMV's item rows (job j's pair count
                                    // at items 2j, 2j + 1)
  int32_t* down_rows = nullptr;     // [max jobs]: the down GEMV's item rows
  uint16_t* x = nullptr;        // [S, RoundUp16(hidden)] bf16
  float* gate_up = nullptr;     // [2 S, inter] f32: grouped path, item i's rows at [8 i, 8 i + 8)
  uint16_t* act = nullptr;      // [S, RoundUp16(inter)] bf16
  float* y = nullptr;           // [S, hidden] f32
  // [ceil(hidden / 16)] i32: the folded combine's tile counters (QuantGemvCombine::counters), then,
  // from the next 128-byte boundary, [kQuantGemvChainSyncInts] i32: a chained round's counters
  // (LaunchInt4GroupGemvChain); zero between calls: they are the buffer's first
  // QuantMoeWorkspaceCountersBytes(hidden) bytes, which the owner zeroes once before the first call.
  int32_t* counters = nullptr;
  int32_t* chain_sync = nullptr;
  int64_t max_tokens = 0, top_k = 0, max_experts = 0, hidden = 0, inter = 0;
  int64_t max_jobs = 0;  // J
};

// Bytes of one 256-byte aligned buffer holding a workspace (QuantMoeWorkspaceAt carves it).
size_t QuantMoeWorkspaceBytes(int64_t max_tokens, int64_t top_k, int64_t max_experts, int64_t hidden,
                              int64_t inter);
// The bytes at the start of such a buffer to zero once (QuantMoeWorkspace::counters).
size_t QuantMoeWorkspaceCountersBytes(int64_t hidden);
QuantMoeWorkspace QuantMoeWorkspaceAt(void* buffer, int64_t max_tokens, int64_t top_k, int64_t max_experts,
                                      int64_t hidden, int64_t inter);

// out[t] = (accumulate ? out[t] : 0) + sum_j weights[t, j] * down_e(silu(gate_e x[t]) * up_e x[t]),
// e = ids[t, j], with the numerics of the file comment; tokens in rounds of workspace.max_tokens.
// A token t with an id outside [0, num_experts) records error_code | t and keeps its out row.
// x:        [tokens, hidden], f32, row stride x_stride, device
// ids:      [tokens, top_k], i32, row stride ids_stride, device
// weights:  [tokens, top_k], f32, row stride weights_stride, device
// experts:  [shape.num_experts], device table (views on the device)
// out:      [tokens, hidden], f32, row stride out_stride, device; no overlap with the inputs
// error_flag: [1], i32, device
// workspace: as above with max_tokens >= 1, max_tokens * top_k >= the call's top_k (its pairs, not
//            its top_k, bound a round: a call of more pairs a token takes fewer tokens a round),
//            max_experts >= num_experts, hidden and inter >= the call's
// programmatic: the kernels are launched as programmatic dependents (programmatic_launch.cuh), each
// waiting for the kernels before it before it touches memory: launches overlap, work does not.
// Returns cudaErrorInvalidValue for sizes or a workspace outside this, a missing pointer, or tiled
// layouts off the grouped path.
cudaError_t LaunchQuantMoeExperts(const float* x, int64_t x_stride, const int32_t* ids, int64_t ids_stride,
                                  const float* weights, int64_t weights_stride, const QuantMoeExpert* experts,
                                  const QuantMoeShape& shape, int64_t tokens, const QuantMoeWorkspace& workspace,
                                  float* out, int64_t out_stride, bool accumulate, int* error_flag, int error_code,
                                  bool programmatic, cudaStream_t stream);

}  // namespace eagle3::cuda
