// Launchers for RoPE, masked attention (dense or over a paged latent cache) and paged cache rows on
// the device: the kernels behind CudaBackend::ApplyRope, Attention, LatentAttention, PagedWrite and
// PagedRead (semantics in eagle3/backend.h). Raw pointers, stream last, cudaError_t out; no
// allocation; callable from any C++ compiler (no nvcc needed to include this header). fp32
// throughout; strides are in elements. A launcher returns cudaErrorInvalidValue for negative sizes,
// a missing pointer, or a parameter outside what it documents.
//
// "Checked before anything is written" on the device. The data-dependent checks (positions, page
// entries, mask rows) run as check kernels ahead of the writing kernels of the same op, on the same
// stream. One device int, `bad`, links them: the caller zeroes it (cudaMemsetAsync) before the
// op's checks; a check kernel that finds a bad entry sets *bad = 1 and records
// error_code | index in the backend's error flag (RecordDeviceError in cuda/core_kernels.cuh: the
// first failing op is kept, within it the lowest index); every writing kernel reads *bad as it
// starts and writes nothing when it is set. So a bad entry anywhere leaves every output untouched.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

// ---- Checks ----------------------------------------------------------------------------------

// Records index i (the lowest such) when idx[i] is outside [0, limit), for i < n.
// idx:        [n], i32 or i64, device
// bad:        [1], i32, device (set to 1 on a bad entry)
// error_flag: [1], i32, device (the backend's flag; see the top of this file)
cudaError_t LaunchCheckIndexRange(const int32_t* idx, int64_t n, int64_t limit, int* bad,
                                  int* error_flag, int error_code, cudaStream_t stream);
cudaError_t LaunchCheckIndexRange(const int64_t* idx, int64_t n, int64_t limit, int* bad,
                                  int* error_flag, int error_code, cudaStream_t stream);

// Records token t when positions[t] is outside [0, pages * page_size) or its page entry
// page_table[positions[t] / page_size] is outside [0, num_pages).
// positions:  [tokens], i32 or i64, device
// page_table: [pages], i32, device
// page_size >= 1, num_pages >= 0
cudaError_t LaunchCheckPagedPositions(const int32_t* positions, int64_t tokens,
                                      const int32_t* page_table, int64_t pages, int64_t page_size,
                                      int64_t num_pages, int* bad, int* error_flag, int error_code,
                                      cudaStream_t stream);
cudaError_t LaunchCheckPagedPositions(const int64_t* positions, int64_t tokens,
                                      const int32_t* page_table, int64_t pages, int64_t page_size,
                                      int64_t num_pages, int* bad, int* error_flag, int error_code,
                                      cudaStream_t stream);

// Records row r when mask row r allows no key (every byte zero; cols == 0 counts as none).
// mask: [rows, cols], u8 or bool bytes (nonzero = allowed), row stride mask_stride, device
cudaError_t LaunchCheckMaskRows(const uint8_t* mask, int64_t rows, int64_t cols,
                                int64_t mask_stride, int* bad, int* error_flag, int error_code,
                                cudaStream_t stream);

// ---- Writers ---------------------------------------------------------------------------------

// Rotary embedding in place, as Backend::ApplyRope: pair i of dims [offset, offset + rope_dim) of
// head (t, n) — (2i, 2i + 1) with adjacent_pairs, else (i, i + rope_dim / 2) — becomes
// (a c - b s, b c + a s), c = cos_sin[p][i], s = cos_sin[p][rope_dim / 2 + i], p = positions[t].
// x:         element [t, n, d] at x[t * token_stride + n * head_stride + d], f32, device; the
//            rotated elements are distinct; d < offset + rope_dim
// positions: [tokens], i32 or i64, device, each a row of cos_sin (checked by LaunchCheckIndexRange)
// cos_sin:   [P, rope_dim], f32, row stride table_stride, device
// rope_dim even and >= 2; nothing is written when *bad != 0
cudaError_t LaunchApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride,
                            int64_t head_stride, int64_t offset, int64_t rope_dim,
                            const int32_t* positions, const float* cos_sin, int64_t table_stride,
                            bool adjacent_pairs, const int* bad, cudaStream_t stream);
cudaError_t LaunchApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride,
                            int64_t head_stride, int64_t offset, int64_t rope_dim,
                            const int64_t* positions, const float* cos_sin, int64_t table_stride,
                            bool adjacent_pairs, const int* bad, cudaStream_t stream);

// Paged cache rows: the slot of token t is row page_table[p / page_size] * page_size + p % page_size
// of cache, p = positions[t] (checked by LaunchCheckPagedPositions). PagedWrite copies rows[t] to
// its slot (which row lands when two tokens share a slot is unspecified); PagedRead copies the
// slot to out[t]. Nothing is written when *bad != 0.
// rows / out: [tokens, width], f32, row stride rows_stride / out_stride, device
// positions:  [tokens], i32 or i64, device
// page_table: [>= pages used], i32, device; read only for tokens that pass the check (so it may
//             be null when it is empty)
// cache:      [num_pages * page_size, width], f32, contiguous, device; no overlap with the others
cudaError_t LaunchPagedWrite(const float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                             const int32_t* positions, const int32_t* page_table, int64_t page_size,
                             float* cache, const int* bad, cudaStream_t stream);
cudaError_t LaunchPagedWrite(const float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                             const int64_t* positions, const int32_t* page_table, int64_t page_size,
                             float* cache, const int* bad, cudaStream_t stream);
cudaError_t LaunchPagedRead(const float* cache, const int32_t* page_table, int64_t page_size,
                            const int32_t* positions, int64_t tokens, int64_t width, float* out,
                            int64_t out_stride, const int* bad, cudaStream_t stream);
cudaError_t LaunchPagedRead(const float* cache, const int32_t* page_table, int64_t page_size,
                            const int64_t* positions, int64_t tokens, int64_t width, float* out,
                            int64_t out_stride, const int* bad, cudaStream_t stream);

// One masked attention call (Backend::Attention, or Backend::LatentAttention when `paged`):
//   out[t, n] = sum_s softmax_s(scale * q[t, n] . key(s, n) over s with mask[t][s] != 0) * value(s, n)
// in fp32 with the maximum subtracted (online, flash-decoding style: the keys may be split into
// ranges whose partial maxima, sums and weighted values go to `partials` and are combined by a
// second kernel). Every mask row must allow a key (checked by LaunchCheckMaskRows).
struct AttentionLaunchParams {
  // Queries: element [t, n, d] at q[t * q_token_stride + n * q_head_stride + d], d < key_dim.
  const float* q = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  // Dense keys and values (paged == false): key(s, n)[d] at k[s * k_key_stride + n *
  // k_head_stride + d], value(s, n)[e] at v[s * v_key_stride + n * v_head_stride + e]. Zero head
  // strides (keys shared by every head, as in GQA) are allowed.
  const float* k = nullptr;
  int64_t k_key_stride = 0;
  int64_t k_head_stride = 0;
  const float* v = nullptr;
  int64_t v_key_stride = 0;
  int64_t v_head_stride = 0;
  // Paged latent keys (paged == true; k and v unused): key(s, n) = row page_table[s / page_size]
  // * page_size + s % page_size of cache [num_pages * page_size, key_dim] (contiguous) for every n,
  // value(s, n) = its first value_dim columns (value_dim <= key_dim). The page entries of the first
  // `keys` positions must be valid (checked by LaunchCheckIndexRange).
  bool paged = false;
  const float* cache = nullptr;
  const int32_t* page_table = nullptr;
  int64_t page_size = 1;
  // mask: [tokens, keys], u8 / bool bytes, row stride mask_stride.
  const uint8_t* mask = nullptr;
  int64_t mask_stride = 0;
  // out: element [t, n, e] at out[t * out_token_stride + n * out_head_stride + e], e < value_dim;
  // elements distinct, no overlap with the inputs or partials.
  float* out = nullptr;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t keys = 0;
  int64_t key_dim = 0;
  int64_t value_dim = 0;
  float scale = 1.0f;
};

// Dynamic shared memory one attention block needs for these widths; the launcher returns
// cudaErrorInvalidValue when it exceeds the device's opt-in per-block limit
// (cudaDevAttrMaxSharedMemoryPerBlockOptin; 227 KiB on the H100/H200: key_dim up to about 1200
// for paged keys, 860 for dense keys with value_dim >= 512).
size_t AttentionSharedBytes(int64_t key_dim, int64_t value_dim, bool paged);

// Runs the attention of `params` on the current device. partials: device scratch of
// partial_capacity floats (may be nullptr with capacity 0); the launcher splits the keys only as far
// as the scratch holds the partial results (tokens * heads * splits * (value_dim + 2) floats), so
// any capacity is correct and more of it only adds parallelism for long contexts. Nothing is
// written when *bad != 0. tokens * heads == 0 or value_dim == 0 launches nothing.
cudaError_t LaunchAttention(const AttentionLaunchParams& params, float* partials,
                            int64_t partial_capacity, const int* bad, cudaStream_t stream);

}  // namespace eagle3::cuda
