// Launchers for RoPE, masked attention (dense or over a paged latent cache) and paged cache rows on
// the device: the kernels behind CudaBackend::ApplyRope, Attention, LatentAttention, PagedWrite and
// PagedRead (semantics in eagle3/backend.h). Raw pointers, stream last, cudaError_t out; no
// allocation; callable from any C++ compiler (no nvcc needed to include this header). fp32
// throughout, except the paged latent cache, which may also be bf16 (bit patterns, uint16_t): its
// writer rounds to nearest even, its readers widen exactly; strides are in elements. A launcher
// returns cudaErrorInvalidValue for negative sizes, a missing pointer, or a parameter outside what
// it documents.
//
// A launcher over several index or element types is one function template (IdType: the index type,
// T: the cache element), declared here and explicitly instantiated in its .cu file for the types
// its comment lists; other types do not link.
//
// Kernels: the checks in attention_check_kernels.cu, RoPE in rope_kernels.cu, paged rows in
// paged_kv_kernels.cu, LaunchAttention in split_attention_kernels.cu, the paged latent fast path in
// latent_decode_kernels.cu (f32 kernel, launchers), latent_plan.cc (which kernel, tiles, splits)
// and the bf16 tensor-core kernels (latent_mma, _compact, _tree and _wgmma_kernels.cu).
//
// "Checked before anything is written" on the device. The data-dependent checks (positions, page
// entries, mask rows) run as check kernels ahead of the writing kernels of the same op, on the same
// stream. One device int, `bad`, links them: it is zeroed before the op's checks, by the caller
// (cudaMemsetAsync) or by the op's first check itself (clear_flag: one graph node fewer, and no
// memset node between programmatic kernels); a check kernel that finds a bad entry sets *bad = 1
// and records
// error_code | index in the backend's error flag (RecordDeviceError in cuda/core_kernels.cuh: the
// first failing op is kept, within it the lowest index); every writing kernel reads *bad as it
// starts and writes nothing when it is set. So a bad entry anywhere leaves every output untouched.
//
// programmatic: the launcher's kernels are launched as programmatic dependents of the kernel before
// them on `stream` (programmatic_launch.cuh; CudaBackendOptions::programmatic_launch): each waits
// for the earlier kernels before it touches memory, so results are the same either way.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace eagle3::cuda {

// ---- Checks ----------------------------------------------------------------------------------

// Records index i (the lowest such) when idx[i] is outside [0, limit), for i < n.
// idx:        [n], IdType = int32_t or int64_t, device
// bad:        [1], i32, device (set to 1 on a bad entry)
// error_flag: [1], i32, device (the backend's flag; see the top of this file)
// clear_flag: this is the op's first check: *bad is set to 0 first (also when n == 0), within the
//             check's one block, so that the caller need not zero it; else *bad is only set
template <typename IdType>
cudaError_t LaunchCheckIndexRange(const IdType* idx, int64_t n, int64_t limit, int* bad,
                                  int* error_flag, int error_code, bool clear_flag, bool programmatic,
                                  cudaStream_t stream);

// Records token t when positions[t] is outside [0, pages * page_size) or its page entry
// page_table[positions[t] / page_size] is outside [0, num_pages).
// positions:  [tokens], IdType = int32_t or int64_t, device
// page_table: [pages], i32, device
// page_size >= 1, num_pages >= 0; bad, error_flag and clear_flag as in LaunchCheckIndexRange
template <typename IdType>
cudaError_t LaunchCheckPagedPositions(const IdType* positions, int64_t tokens,
                                      const int32_t* page_table, int64_t pages, int64_t page_size,
                                      int64_t num_pages, int* bad, int* error_flag, int error_code,
                                      bool clear_flag, bool programmatic, cudaStream_t stream);

// Records row r when mask row r allows no key (every byte zero; cols == 0 counts as none).
// mask: [rows, cols], u8 or bool bytes (nonzero = allowed), row stride mask_stride, device
cudaError_t LaunchCheckMaskRows(const uint8_t* mask, int64_t rows, int64_t cols,
                                int64_t mask_stride, int* bad, int* error_flag, int error_code,
                                bool programmatic, cudaStream_t stream);

// ---- Writers ---------------------------------------------------------------------------------

// Rotary embedding in place, as Backend::ApplyRope: pair i of dims [offset, offset + rope_dim) of
// head (t, n) — (2i, 2i + 1) with adjacent_pairs, else (i, i + rope_dim / 2) — becomes
// (a c - b s, b c + a s), c = cos_sin[p][i], s = cos_sin[p][rope_dim / 2 + i], p = positions[t].
// x:         element [t, n, d] at x[t * token_stride + n * head_stride + d], f32, device; the
//            rotated elements are distinct; d < offset + rope_dim
// positions: [tokens], IdType = int32_t or int64_t, device, each a row of cos_sin (checked by
//            LaunchCheckIndexRange)
// cos_sin:   [P, rope_dim], f32, row stride table_stride, device
// rope_dim even and >= 2; nothing is written when *bad != 0
template <typename IdType>
cudaError_t LaunchApplyRope(float* x, int64_t tokens, int64_t heads, int64_t token_stride,
                            int64_t head_stride, int64_t offset, int64_t rope_dim,
                            const IdType* positions, const float* cos_sin, int64_t table_stride,
                            bool adjacent_pairs, const int* bad, bool programmatic,
                            cudaStream_t stream);

// Paged cache rows: the slot of token t is row page_table[p / page_size] * page_size + p % page_size
// of cache, p = positions[t] (checked by LaunchCheckPagedPositions). PagedWrite copies rows[t] to
// its slot (which row lands when two tokens share a slot is unspecified); PagedRead copies the
// slot to out[t]. Nothing is written when *bad != 0.
// rows / out: [tokens, width], f32, row stride rows_stride / out_stride, device
// positions:  [tokens], IdType = int32_t or int64_t, device
// page_table: [>= pages used], i32, device; read only for tokens that pass the check (so it may
//             be null when it is empty)
// cache:      [num_pages * page_size, width], T, contiguous, device; no overlap with the others.
//             T = float, or uint16_t for a bf16 cache (bit patterns): PagedWrite then stores
//             bf16(rows[t]) (round to nearest even, NaN stays NaN), PagedRead widens the stored
//             bf16 to f32 (exact).
template <typename T, typename IdType>
cudaError_t LaunchPagedWrite(const float* rows, int64_t rows_stride, int64_t tokens, int64_t width,
                             const IdType* positions, const int32_t* page_table, int64_t page_size,
                             T* cache, const int* bad, bool programmatic, cudaStream_t stream);
// CudaBackend::LatentRowsAndQueries (Backend's contract) in one kernel: for each token t, c =
// rows[t, 0:latent] normed in place by norm_weight (RmsNorm's bits) when `norm`; k_pe = rows[t,
// latent:width] rotated in place and each head's q_pe rotated into q_rot (ApplyRope's bits, pairs
// adjacent or rotate-half); then rows[t] stored at the slot of slots[t] (PagedWrite's bits, as
// LaunchPagedWrite's positions and page table). Nothing is written when *rope_bad or *paged_bad
// (the flags of the position checks, LaunchCheckIndexRange and LaunchCheckPagedPositions).
struct LatentRowsParams {
  float* rows = nullptr;  // [tokens, width], row stride rows_stride
  int64_t rows_stride = 0;
  int64_t tokens = 0;
  int64_t latent = 0;  // width = latent + rope
  int64_t rope = 0;
  int64_t width = 0;
  bool norm = false;
  const float* norm_weight = nullptr;  // [latent] when norm
  float eps = 0.0f;
  const float* q_pe = nullptr;  // [tokens, heads, rope], strides q_pe_stride[0], [1], 1
  float* q_rot = nullptr;       // the same shape, strides q_rot_stride
  int64_t q_pe_stride[2] = {0, 0};
  int64_t q_rot_stride[2] = {0, 0};
  int64_t heads = 0;
  const float* cos_sin = nullptr;  // [P, rope], row stride table_stride
  int64_t table_stride = 0;
  bool adjacent_pairs = true;
  const int32_t* slot_table = nullptr;  // the paged write's page table
  int64_t page_size = 0;
  const int* rope_bad = nullptr;
  const int* paged_bad = nullptr;
};
// T = float or uint16_t (a bf16 cache), IdType = int32_t or int64_t (positions and slots alike).
template <typename T, typename IdType>
cudaError_t LaunchLatentRows(const LatentRowsParams& params, const IdType* positions, const IdType* slots, T* cache,
                             bool programmatic, cudaStream_t stream);

template <typename T, typename IdType>
cudaError_t LaunchPagedRead(const T* cache, const int32_t* page_table, int64_t page_size,
                            const IdType* positions, int64_t tokens, int64_t width, float* out,
                            int64_t out_stride, const int* bad, bool programmatic,
                            cudaStream_t stream);

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
                            int64_t partial_capacity, const int* bad, bool programmatic,
                            cudaStream_t stream);

// ---- Paged latent attention, fast path ---------------------------------------------------------
//
// Absorbed MLA attention over a paged latent cache for one sequence with an explicit mask
// (LatentAttention) or a batch of sequences whose lengths live on the device and whose mask is
// generated from them (BatchedLatentAttention, semantics in eagle3/backend.h). Key rows are copied
// to shared memory with cp.async (16-byte copies when key_dim % 4 == 0 and the cache is 16-byte
// aligned) one 32-key chunk ahead of the compute, and page entries and mask bytes one chunk ahead
// in registers; a block serves up to 16 query rows (heads of one token, or several tokens of one
// sequence when there are few heads) and one range of keys; partial results are merged by a
// combine kernel or in the attention kernel itself (LatentFold). key_dim <= kLatentMaxKeyDim (shared
// memory).
//
// bf16 cache (cache_bf16 set instead of cache): a tensor-core kernel (mma.sync m16n8k16, bf16
// operands, fp32 accumulation). q is rounded to bf16 (nearest even) as it is staged, scores are
// scaled, masked and soft-maxed in fp32 (online, as above), and the probabilities are rounded to
// bf16 for the value product (as FlashMLA does); the row sums stay fp32. So the result is that of
// the fp32 path on bf16(q) and the stored rows, up to fp32 accumulation of bf16 products and the
// bf16 rounding of each probability (relative 2^-9). At DeepSeek's shape (key_dim 576, value_dim
// 512): blocks of 64 query rows of one sequence (latent_tree_kernels.cu) for long trees (a sequence
// averaging >= 1024 query rows, heads x tokens, or >= 256 with 8+ sequences), else 16
// (latent_compact_kernels.cu). At other
// shapes: blocks of 16 query rows (64 when a sequence averages >= 64 query rows, the call holds
// >= 2048 and key_dim <= 640), 32-key chunks staged four (64 rows: three) deep with cp.async
// (16-byte copies when key_dim % 8 == 0 and the cache is 16-byte aligned, else plain loads). A key
// that no row of a block allows is never read for the value product; a key some row of the block
// allows is multiplied (by probability 0) into the block's other rows too, so a non-finite value
// there reaches them (the fp32 path and the CPU skip it per row).
inline constexpr int64_t kLatentMaxKeyDim = 704;
// Sequences one batched call may hold (the size of the tile table in the caller's scratch).
inline constexpr int64_t kLatentMaxBatch = 4096;

struct LatentLaunchParams {
  // q: element [t, n, d] at q[t * q_token_stride + n * q_head_stride + d], d < key_dim.
  const float* q = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  // cache: [num_pages, page_size, key_dim], contiguous; values are the first value_dim columns.
  // Exactly one of cache (f32) and cache_bf16 (bf16 bit patterns, same layout) is set.
  const float* cache = nullptr;
  const uint16_t* cache_bf16 = nullptr;
  int64_t page_size = 1;
  int64_t num_pages = 0;
  // page_tables: [batch, pages_per_seq], i32, row stride page_table_stride (batch 1 for the
  // explicit-mask form).
  const int32_t* page_tables = nullptr;
  int64_t page_table_stride = 0;
  int64_t pages_per_seq = 0;
  int64_t batch = 1;
  // Batched form: q_start [batch + 1] and kv_len [batch], i32, device; max_kv_len bounds every
  // kv_len. Explicit-mask form: both nullptr, one sequence of `tokens` rows and max_kv_len keys.
  const int32_t* q_start = nullptr;
  const int32_t* kv_len = nullptr;
  int64_t max_kv_len = 0;
  // Explicit-mask form: mask [tokens, max_kv_len], u8 / bool bytes, row stride mask_stride. The
  // batched form may take one too instead of tree_mask (BatchedLatentAttentionKeyMask): row t over
  // its sequence's keys s < kv_len[b], read at mask[t * mask_stride + s].
  const uint8_t* mask = nullptr;
  int64_t mask_stride = 0;
  // Batched form: tree_mask [tokens, tree_width], row stride tree_mask_stride, or nullptr (causal).
  const uint8_t* tree_mask = nullptr;
  int64_t tree_mask_stride = 0;
  int64_t tree_width = 0;
  // out: element [t, n, e] at out[t * out_token_stride + n * out_head_stride + e], e < value_dim;
  // elements distinct, no overlap with the inputs or the scratch.
  float* out = nullptr;
  int64_t out_token_stride = 0;
  int64_t out_head_stride = 0;
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t key_dim = 0;
  int64_t value_dim = 0;
  float scale = 1.0f;
};

// Where a split latent attention call merges its splits. A call whose keys are split writes each
// split's partial results to the scratch, and they are merged either by a combine kernel launched
// after the attention kernel, or, folded into the attention kernel, by the last block to finish of
// each output tile (token tile x head tile): that block counts the tile's arrivals on an atomic
// counter, merges the tile's rows and sets its counter back to zero. Same bits either way; the
// fold saves a launch, but one block reads the tile's whole partials (splits x block rows x
// value_dim floats), which the combine kernel spreads over many. The launcher folds a call when
// its kernel can (all but the general bf16 kernel's 64-row blocks), value_dim <= 512, its output
// tiles fit the counters and a tile's partials take at most max_fold_bytes; other calls launch the
// combine kernel.
struct LatentFold {
  int* counters = nullptr;  // [capacity] i32, device, zero (the kernels leave them so); nullptr: no fold
  int64_t capacity = 0;
  int64_t max_fold_bytes = 0;
};

// Dynamic shared memory of one latent attention block (188 KiB at key_dim 576, 227 KiB at 704);
// the launchers return cudaErrorInvalidValue when the device allows less.
size_t LatentSharedBytes(int64_t key_dim);
// The same for the bf16-cache kernel's 16-row blocks (175 KiB at key_dim 576, 211 KiB at 704); its
// 64-row blocks (197 KiB at 576) run only where they fit sm_90's 227 KiB.
size_t LatentBf16SharedBytes(int64_t key_dim);

// Which kernel takes a bf16 call at DeepSeek's 576 / 512 shape. kMma: the rule above (64-row
// blocks on mma.sync, latent_tree_kernels.cu, for long trees; else 16-row blocks). kWgmma: 64-row
// blocks on the warpgroup products (wgmma, latent_wgmma_kernels.cu) wherever a sequence averages
// >= 64 query rows (4+ tokens at 16 heads, or 64+ heads), on devices that run its sm_90a code
// (LatentWgmmaAvailable); elsewhere the kMma rule. kAuto (the default): the wgmma kernel where it
// was measured faster, sequences of >= 64 query rows in batches of 8 or more and sequences of >=
// 1024 rows at any batch (benchmarks/NOTES.md, seventeenth session), else the kMma rule.
// kWgmmaAll: the wgmma kernel for every call at that shape on such devices, decode at 8 or 16 heads
// included (a block's 64 rows then hold one token's heads: the products are padded, the keys still
// read once per sequence). The choices give results within the bf16 tolerance above, not the same
// bits (other summation orders). The process-wide choice starts from EAGLE3_LATENT_TREE_KERNEL
// ("mma", "wgmma", "wgmma-all"; unset or anything else: kAuto); SetLatentTreeKernelChoice (tests,
// benchmarks) changes it from the next launch on.
enum class LatentTreeKernelChoice {
  kAuto,
  kMma,
  kWgmma,
  kWgmmaAll,
};
LatentTreeKernelChoice GetLatentTreeKernelChoice();
void SetLatentTreeKernelChoice(LatentTreeKernelChoice kernel);

// Which kernel implements the wgmma choice: kSingle, LatentWgmmaKernel (both warpgroups on each
// chunk, latent_wgmma_kernels.cu); kPair, LatentWgmmaPairKernel (the warpgroups own alternate
// chunks, latent_wgmma_pair_kernels.cu; not the default: no faster where measured,
// benchmarks/NOTES.md). Results within the bf16 tolerance of each other. The process-wide variant
// starts from EAGLE3_LATENT_WGMMA ("pair"; unset or anything else: kSingle).
enum class LatentWgmmaVariant {
  kSingle,
  kPair,
};
LatentWgmmaVariant GetLatentWgmmaVariant();
void SetLatentWgmmaVariant(LatentWgmmaVariant variant);

// The most splits a latent attention call's keys may take (0: the plan's own count, the default).
// For measuring the split rule at a shape (its scratch and kLatentMaxSplits still bound it): the
// process-wide cap EAGLE3_LATENT_MAX_SPLITS gives (LatentMaxSplitsFromEnv), read once.
int64_t GetLatentMaxSplits();

// Whether the current device runs the wgmma kernel (compute capability 9.0: its code is built for
// sm_90a only).
bool LatentWgmmaAvailable();

// Explicit-mask form (q_start, kv_len, tree_mask unused): the caller has checked the page entries
// and mask rows (LaunchCheckIndexRange, LaunchCheckMaskRows) with the same `bad`. partials as in
// LaunchAttention; fold: see LatentFold. Nothing is written when *bad != 0.
cudaError_t LaunchLatentAttention(const LatentLaunchParams& params, float* partials,
                                  int64_t partial_capacity, const LatentFold& fold, const int* bad,
                                  bool programmatic, cudaStream_t stream);

// Batched form: checks the metadata on the device first (q_start, kv_len, page entries, tree-mask
// width and rows, as CpuBackend::BatchedLatentAttention does), recording
// error_code | (8 * b + condition) for the lowest failing sequence b (condition: 0 q_start[0] != 0,
// 1 q_start[b + 1] outside [q_start[b], T], 2 kv_len[b] outside [n_b, min(max_kv_len,
// pages_per_seq * page_size)], 3 n_b > tree_width, 4 a page entry used outside [0, num_pages),
// 5 a tree-mask row with no key and no cached prefix, 6 q_start[B] != T with b = B, 7 a row of the
// key mask allowing none of its sequence's keys), then runs one
// attention launch over every sequence. tile_table: [kLatentMaxBatch + 1] i32 device scratch.
// Launch shapes depend only on tokens, heads, key_dim, value_dim, batch, max_kv_len and the
// capacity, so the sequence can be captured in a CUDA graph and replayed with other lengths.
// batch in [0, kLatentMaxBatch]; nothing is written when a check fails. The check is the op's
// first: it clears *bad itself (one block), so the caller need not zero it.
// check false: an earlier call with the same metadata (and the same tokens, heads, key_dim,
// value_dim, max_kv_len and cache dtype) checked it and built tile_table, and *bad holds its
// verdict (shared checks, Backend::BeginSharedChecks): only the attention launches run.
// programmatic: as above; where the compact or tree kernel runs with one token per row tile right
// after the check, its prologue (query staging) also overlaps the check. fold: see LatentFold.
cudaError_t LaunchBatchedLatentAttention(const LatentLaunchParams& params, int32_t* tile_table,
                                         float* partials, int64_t partial_capacity, const LatentFold& fold,
                                         int* bad, int* error_flag, int error_code, bool check, bool programmatic,
                                         cudaStream_t stream);

}  // namespace eagle3::cuda
