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
//     kQuantMoeJobPairs pairs of one expert; x rounded to bf16 into the workspace;
//  2. per job and block of intermediate rows: act[pair][i] = bf16(silu(gate_i . x) * (up_i . x));
//  3. per job and block of hidden rows: y[pair][h] = down_h . act[pair];
//  4. per token: out[t] = (accumulate ? out[t] : 0) + sum_j weights[t, j] * y[t, j], j = 0, 1, ...
//     in order (a token with a bad id keeps its row).
// Numerics: x and act are rounded to bf16 (round to nearest, ties to even), as QuantizedGemm rounds
// its activations (quant_gemv_ops.h); the weights enter as the exact f32 values DequantizeWeight
// gives (fp8: e4m3 * scale_inv rounded once in fp32; int4: q * bf16 scale, exact); products and
// sums are fp32 (CUDA-core FMAs) in a fixed order: each lane sums its 16-column chunks in column
// order, the lanes of a row are added in a fixed butterfly, and step 4 adds the slots in order. No
// float atomics: every run gives the same bits. Which pairs share a job may vary between runs; a
// pair's result does not depend on it.
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

// What every expert of a call shares.
struct QuantMoeShape {
  QuantMoeFormat format = QuantMoeFormat::kFp8Block;
  int64_t block_rows = 1, block_cols = 1;  // >= 1 (int4: block_rows 1)
  int64_t hidden = 0, inter = 0;           // H, I >= 0
  int64_t num_experts = 0;                 // table entries, <= kQuantMoeMaxExperts
  int64_t top_k = 0;
  // QuantMoeChunked holds for every expert's gate and up (gate_up_chunked), and down.
  bool gate_up_chunked = false, down_chunked = false;
};

// Largest expert count (the grouping kernel's counters live in shared memory).
inline constexpr int64_t kQuantMoeMaxExperts = 4096;
// Pairs of one expert a job holds (the kernels keep a job's sums in registers).
inline constexpr int64_t kQuantMoeJobPairs = 8;

inline constexpr int64_t QuantMoeMaxJobs(int64_t max_pairs, int64_t num_experts) {
  return max_pairs / kQuantMoeJobPairs + (num_experts < max_pairs ? num_experts : max_pairs) + 1;
}

inline constexpr int64_t QuantMoeRoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

// Device scratch of one round of up to max_tokens tokens (contents overwritten by every call).
struct QuantMoeWorkspace {
  int32_t* sorted = nullptr;    // [max_tokens * top_k]: round-local pair t * top_k + j, expert-major
  int32_t* jobs = nullptr;      // [QuantMoeMaxJobs(max_tokens * top_k, max_experts), 3]: expert,
                                // first sorted pair, pair count
  int32_t* num_jobs = nullptr;  // [1]
  uint16_t* x = nullptr;        // [max_tokens, RoundUp16(hidden)] bf16
  uint16_t* act = nullptr;      // [max_tokens * top_k, RoundUp16(inter)] bf16
  float* y = nullptr;           // [max_tokens * top_k, hidden] f32
  int64_t max_tokens = 0, top_k = 0, max_experts = 0, hidden = 0, inter = 0;
};

// Bytes of one 256-byte aligned buffer holding a workspace (QuantMoeWorkspaceAt carves it).
size_t QuantMoeWorkspaceBytes(int64_t max_tokens, int64_t top_k, int64_t max_experts, int64_t hidden,
                              int64_t inter);
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
// workspace: as above with max_tokens >= 1, top_k, max_experts >= num_experts, hidden and inter
//            >= the call's
// Returns cudaErrorInvalidValue for sizes or a workspace outside this, or a missing pointer.
cudaError_t LaunchQuantMoeExperts(const float* x, int64_t x_stride, const int32_t* ids, int64_t ids_stride,
                                  const float* weights, int64_t weights_stride, const QuantMoeExpert* experts,
                                  const QuantMoeShape& shape, int64_t tokens, const QuantMoeWorkspace& workspace,
                                  float* out, int64_t out_stride, bool accumulate, int* error_flag, int error_code,
                                  cudaStream_t stream);

}  // namespace eagle3::cuda
