// The op interface that model composition is written against (docs/architecture.md): one implementation per
// device kind (eagle3::cpu::CpuBackend, the fp32 reference; the CUDA backend), checked against each
// other op by op.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "eagle3/allocator.h"
#include "eagle3/device.h"
#include "eagle3/dtype.h"
#include "eagle3/export.h"
#include "eagle3/moe_routing.h"
#include "eagle3/quantization_config.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor_view.h"
#include "eagle3/tree_verifier.h"
#include "eagle3/upload_ring.h"

namespace eagle3 {

// c = alpha * a * b^T + beta * c + bias (bias broadcast over rows, not scaled: the cuBLASLt bias
// epilogue order). beta == 0 means c is write-only: its old contents (even NaN) are never read.
struct GemmOptions {
  float alpha = 1.0f;
  float beta = 0.0f;
  const TensorView* bias = nullptr;  // [N], contiguous, backend device; nullptr for none
  // b (and bias) are weights: nothing enqueued on the backend before this call writes them. A
  // device backend may then start reading them before that earlier work has finished (CUDA:
  // programmatic dependent launch). Results are the same either way.
  bool b_is_weights = false;
  // With `a` f32 and `b` bf16: `a` enters the products as stored, never rounded to bf16; each
  // product is `a` times b widened to f32 (exact), accumulated in fp32. The result is the f32 x f32
  // Gemm of the same values up to fp32 summation order, at half the weight bytes: for weights whose
  // values are bf16 numbers but whose products must keep f32 activations (a MoE router stored in
  // bf16: router logits in fp32, as DeepSeek's and transformers' gates compute them). Every backend
  // takes this pair under it, the CPU reference included. Other dtype pairs are unaffected.
  // QuantizedGemm does not take it (InvalidArgument).
  bool keep_f32_activations = false;
};

// A plain product whose b is weights (alpha 1, beta 0, no bias).
inline constexpr GemmOptions kWeightsGemm{.b_is_weights = true};
// kWeightsGemm with keep_f32_activations: f32 activations against weights that may be bf16.
inline constexpr GemmOptions kF32ActivationsWeightsGemm{.b_is_weights = true, .keep_f32_activations = true};

// Which dims of a head RoPE pairs up.
enum class RopeStyle {
  kAdjacentPairs,  // pair i = (x[2i], x[2i+1]): GPT-J style, DeepSeek MLA's rope dims
  kRotateHalf,     // pair i = (x[i], x[i + rope_dim/2]): NeoX style, Llama / the EAGLE-3 draft
};

// One routed expert's weights on this rank (its 1/tp slice of the intermediate dim).
struct ExpertWeights {
  TensorView gate_up;  // [2 * I, H]: gate_proj rows, then up_proj rows
  TensorView down;     // [H, I]
  // x and this expert's activation silu(gate x) * up x are rounded to bf16 (nearest, ties to even)
  // before their products, as Gemm rounds f32 activations against bf16 weights. Set for a dense
  // layer's shared experts joined to its routed ones (FeedForwardBlock), so that the joined form
  // computes what their own MLP computes, up to summation order. Routed experts keep x unrounded.
  bool bf16_activations = false;
};

// One routed expert's weights on this rank kept in a checkpoint's quantized form (FP8 block-scaled
// or INT4 group: eagle3/quantized_weight_view.h), its 1/tp slice of the intermediate dim I. gate
// and up are separate views (the checkpoint's gate_proj and up_proj tensors, each sliced to the
// rank's rows), down is sliced along its columns. All experts of one call share the format, the
// block sizes, I and H; row0 / col0 / scale offsets and strides may differ per view.
struct QuantizedExpertWeights {
  QuantizedWeightView gate;  // rows() = I, k = H
  QuantizedWeightView up;    // rows() = I, k = H
  QuantizedWeightView down;  // rows() = H, k = I
};

// Conventions for every op:
//  - Inputs and outputs are caller-allocated views on device(); ops never allocate, so a decode
//    step can run from fixed buffers (and be captured in a CUDA graph).
//  - 2-D operands [rows, cols] may be row-strided: stride(1) == 1 and stride(0) >= cols (for
//    example a Narrow along dim 1 of a wider buffer). 1-D operands are contiguous.
//  - Floating-point math is fp32 internally; which storage dtypes a backend accepts is its own
//    policy (the CPU reference takes f32 only) and violations name the dtype. Index tensors are i32
//    or i64 on every backend.
//  - Outputs must not overlap inputs, except where an op says that exact in-place use is allowed.
//  - Every op validates shapes, dtypes and devices first and returns InvalidArgument naming the op,
//    the tensor, the expected and the actual value (via TensorView::ToString()). Data-dependent
//    errors (NaN, negative ids) may leave outputs partially written.
//  - A backend object is driven by one thread at a time (like a CUDA stream); calls may run
//    asynchronously until Synchronize().
//
// Tree and verify ops are added with the draft and verifier (issue 4).
// Whether a BatchedLatentAttention tree_mask or BatchedPagedAttention mask argument is a mask (else:
// causal).
inline bool HasTreeMask(const TensorView& tree_mask) {
  return !tree_mask.empty() && tree_mask.numel() > 0;
}

// The shape of a batched EAGLE-2 tree build (eagle3/draft_tree.h), the same for every call of one
// build: B sequences, each expanding k = topk children per frontier node over S = num_steps draft
// passes and keeping N = num_draft_tokens nodes (the root included) over a draft vocabulary Vd.
struct TreeBuildShape {
  int64_t batch = 0;
  int topk = 4;
  int num_steps = 3;
  int num_draft_tokens = 8;
  int64_t vocab = 0;
};

// Tree-build error records ([B, 4] i64 per build: kind, step, row, draft_id), the layout of
// eagle3::cuda::TreeBuildError: kind 0 none, 1 NaN at draft_id (the lowest), 2 +inf at draft_id, 3 a
// row with no finite logit (draft_id -1); step = the draft pass, row = the frontier row within the
// sequence.
inline constexpr int64_t kTreeBuildErrorWidth = 4;
// Verify error records ([B, 3] i64: kind, row, token), the layout of eagle3::cuda::VerifyError:
// kind 0 none, 1 bad tree (node `row`), 2 token out of range (node `row`, `token`), 3 NaN, 4 +inf
// (logits row `row`, the lowest bad token id), 5 a row with no finite logit.
inline constexpr int64_t kVerifyErrorWidth = 3;

// What TreeVerify writes, for B trees of N nodes (all on the backend's device, contiguous).
struct TreeVerifyOutputs {
  TensorView num_accepted;    // [B] i32: accepted drafted nodes, -1 for a sequence in error
  TensorView accepted;        // [B, N] i32: accepted node ids root to leaf (root excluded)
  TensorView out_tokens;      // [B, N] i64: their tokens, then the bonus / correction token
  TensorView commit_offsets;  // [B, N] i32: {0, accepted...}: the KV offsets to keep (CompactAccepted)
  TensorView commit_counts;   // [B] i32: num_accepted + 1, or -1 for a sequence in error
  TensorView errors;          // [B, kVerifyErrorWidth] i64
};

class EAGLE3_API Backend {
 public:
  virtual ~Backend() = default;

  // Where the tensors of every op must live.
  virtual Device device() const = 0;
  // The storage dtype for model weights (Gemm's b, MoeExperts' expert weights, EmbeddingLookup's
  // table) that this backend streams fastest; models load their weights in it unless told
  // otherwise. f32 by default (the CPU reference takes nothing else).
  virtual DType preferred_weight_dtype() const { return DType::kF32; }
  // Allocates memory on device() for callers that size their buffers at init.
  virtual Allocator& allocator() = 0;
  // Memory on device() for tensors kept as long as the backend's models' weights: allocated at load,
  // freed with their model (which must not outlive the backend). A backend may suballocate them from
  // large chunks, one device allocation per chunk instead of one per tensor (CudaBackend: a
  // ChunkArena, eagle3/chunk_arena.h); memory of such a tensor freed early then stays unused until
  // the rest of its chunk is freed too, so buffers freed sooner (workspaces, staging, a part copied
  // into a stacked weight and dropped) come from allocator(). Default: allocator().
  virtual Allocator& weight_allocator() { return allocator(); }
  // Host memory for staging inputs and outputs of a step: Copy between it and device() memory is
  // the fastest host transfer the backend has, and a copy recorded into a CUDA graph reads it at
  // replay time (pinned memory on CUDA). Plain host memory by default.
  virtual Allocator& staging_allocator() { return DefaultHostAllocator(); }

  // Host memory for a weight load to read checkpoint bytes into before it uploads them (one ring
  // per load, eagle3/upload_ring.h): Copy from it only enqueues the transfer, and the ring reuses
  // memory a tensor freed only after the work enqueued before the free has finished. nullptr: the
  // backend has none, and loads read into plain host memory (the default; the CPU reference, whose
  // host tensors are its weights). Destroy the ring before the backend, and never Copy from it on a
  // stream being captured (the transfer would read the memory at replay time).
  virtual absl::StatusOr<std::unique_ptr<UploadRing>> CreateUploadRing();

  // dst = src. Same shape and dtype; any non-negative strides on the host backend. A backend may
  // also accept a host side on a device backend (host <-> device transfer); others are refused. A
  // host src that came from neither staging_allocator() nor an UploadRing has been read when Copy
  // returns: the caller may free or reuse it at once (staging memory is read when the stream gets
  // there; so is ring memory, but the ring itself holds freed memory back until then).
  virtual absl::Status Copy(const TensorView& src, const TensorView& dst) = 0;

  // Linear layer (PyTorch layout), see GemmOptions. c and bias are f32. A backend that stores
  // weights in bf16 (preferred_weight_dtype() == kBF16) also takes `a` f32 with `b` bf16: `a` is
  // rounded to bf16 (round to nearest, ties to even) and the bf16 x bf16 products accumulate in
  // fp32, as a bf16 PyTorch linear layer computes; unless options.keep_f32_activations, which every
  // backend takes with that pair: `a` unrounded times b widened to f32. Otherwise the CPU reference
  // takes f32 only.
  //   a: [M, K], row-strided      b: [N, K] (weights), row-strided      c: [M, N], row-strided
  virtual absl::Status Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                            const GemmOptions& options) = 0;

  // Whether this backend's QuantizedGemm streams weights of `format` kept quantized in its memory, so
  // that a loader should keep them so (LoadLinearWeight in src/linear_weight.h) rather than
  // dequantize them at load into preferred_weight_dtype(). False by default: QuantizedGemm then
  // still works, dequantizing per call, as the reference does.
  virtual bool keeps_quantized(WeightFormat /*format*/) const { return false; }

  // Linear layer with weight-only quantized weights: c = alpha * a * W^T + beta * c + bias with
  // GemmOptions as in Gemm (b_is_weights: w's codes and scales are the weights), W = the f32
  // weights w describes (eagle3/quantized_weight_view.h; DequantizeWeight). c and bias are f32. A
  // backend may round W and `a` to bf16 as its Gemm does for bf16 weights (CudaBackend: see
  // cuda/cuda_backend_quantized.cc); the CPU reference computes W exactly and takes `a` f32 only.
  // options.keep_f32_activations is refused (InvalidArgument).
  //   a: [M, K], row-strided, K = w.k      w: Check()ed, codes and scales on device(), N = w.rows()
  //   c: [M, N], row-strided, no overlap with a, w's tensors or bias
  virtual absl::Status QuantizedGemm(const TensorView& a, const QuantizedWeightView& w, const TensorView& c,
                                     const GemmOptions& options) = 0;

  // Writes the warp-step tiles of w's row-major codes into `tiles` (QuantCodesLayout::kWarpTiles,
  // eagle3/quantized_weight_view.h): WithWarpTiledCodes(w, tiles) then describes the same weights.
  // Every byte of `tiles` is written (its padding as zeros).
  //   w: Check()ed, kRowMajor, on device(); int4: col0 % 8 == 0
  //   tiles: WarpTiledCodesShape(w), w.codes' dtype, contiguous, on device(), no overlap with w.codes
  virtual absl::Status TileQuantizedCodes(const QuantizedWeightView& w, const TensorView& tiles) = 0;

  // Whether a loader should keep a routed expert's weight `w` (a row-major view of a quantized
  // checkpoint's slice, wherever its codes are now: the loader places them) in warp tiles
  // (TileQuantizedCodes) for QuantizedMoeExperts, which then streams it faster and can read it so.
  // False by default.
  virtual bool tiles_expert_codes(const QuantizedWeightView& /*w*/) const { return false; }
  // The same for a weight that QuantizedGemm alone reads (every other Linear weight of a quantized
  // checkpoint). False by default.
  virtual bool tiles_gemm_codes(const QuantizedWeightView& /*w*/) const { return false; }

  // B independent linear layers in one call: c[i] = a[i] b[i]^T for i < B, with Gemm's options
  // (alpha, beta; a bias [N] is added to every item) and Gemm's dtype rules. Items are strided views
  // along dim 0, so per-head projections of one activation row need no copy (a head-major view of
  // [T, heads * d] has stride(0) = d and stride(1) = the row stride). Every item must satisfy Gemm's
  // contract, and the items of c must not overlap one another (item-major: stride(0) >= the
  // item's extent; or interleaved: stride(0) >= N and stride(1) >= B * stride(0)).
  //   a: [B, M, K]      b: [B, N, K]      c: [B, M, N]      dims 0 and 1 any stride, dim 2 unit
  // The default runs B Gemm calls; a backend may run one batched call instead (same results up to
  // fp32 summation order).
  virtual absl::Status BatchedGemm(const TensorView& a, const TensorView& b, const TensorView& c,
                                   const GemmOptions& options);

  // out = x * rsqrt(mean(x^2 over the row) + eps) * weight, in fp32 (HF LlamaRMSNorm /
  // DeepseekV2RMSNorm). eps >= 0.
  //   x: [T, H]      weight: [H]      out: [T, H] (may be x itself)
  virtual absl::Status RmsNorm(const TensorView& x, const TensorView& weight, float eps,
                               const TensorView& out) = 0;

  // Two RmsNorms over the same rows in one call: out0 = RmsNorm(x0) * weight0 and out1 =
  // RmsNorm(x1) * weight1, each with RmsNorm's arithmetic (a device backend computes each half as
  // its RmsNorm does, so the bits equal two RmsNorm calls). For two slices of one product's row
  // (MLA's q_a and kv_a layernorms over [qa | c | k_pe]), where a device backend saves a launch.
  // Each half satisfies RmsNorm's contract (an out may be its own x exactly); neither out may
  // overlap the other half's x, weight or out (slices of the same rows that share no element do
  // not overlap). Every check is made before anything is written.
  //   x0: [T, H0]      weight0: [H0]      out0: [T, H0] (may be x0 itself)
  //   x1: [T, H1]      weight1: [H1]      out1: [T, H1] (may be x1 itself)
  // The default checks the shapes, then runs RmsNorm on each half; a backend whose RmsNorm refuses
  // some dtypes overrides it to refuse them for both halves before writing either.
  virtual absl::Status RmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                                   const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                                   float eps);

  // residual += x; out = RmsNorm(residual) — the pre-norm block's fused residual add. The norm
  // reads the residual as stored (as HF does with `hidden + residual`).
  //   x: [T, H]      residual: [T, H], in/out      weight: [H]      out: [T, H] (may be x itself)
  virtual absl::Status AddRmsNorm(const TensorView& x, const TensorView& residual,
                                  const TensorView& weight, float eps, const TensorView& out) = 0;

  // out = silu(gate) * up where gate_up = [gate | up] (gate first, as in merged gate_up_proj).
  //   gate_up: [T, 2 * I]      out: [T, I]
  virtual absl::Status SiluMul(const TensorView& gate_up, const TensorView& out) = 0;

  // Vocab-parallel embedding: out[t] = table[ids[t] - vocab_start] when that row is in this shard,
  // else zeros (the all-reduce over ranks then completes the lookup). Negative ids are
  // InvalidArgument naming the position; ids beyond the full vocab are the caller's to check.
  //   ids: [T], i32 or i64      table: [V_shard, H]      vocab_start >= 0      out: [T, H]
  virtual absl::Status EmbeddingLookup(const TensorView& ids, const TensorView& table,
                                       int64_t vocab_start, const TensorView& out) = 0;

  // out = softmax(logits / temperature) per row, fp32, max-subtracted. temperature > 0 and finite.
  // NaN or +inf in a row, or a row with no finite logit, is InvalidArgument naming the row.
  //   logits: [R, V], V >= 1      out: [R, V] (may be logits itself)
  virtual absl::Status Softmax(const TensorView& logits, float temperature,
                               const TensorView& out) = 0;

  // out[r] = index of the largest logit of row r; ties go to the lowest index. A NaN anywhere in a
  // row is InvalidArgument naming the row.
  //   logits: [R, V], V >= 1      out: [R], i32 or i64
  virtual absl::Status Argmax(const TensorView& logits, const TensorView& out) = 0;

  // The k largest values of each row in descending order, ties lowest index first; NaN in a row is
  // InvalidArgument naming the row.
  //   values: [R, V]      1 <= k <= V      out_values: [R, k]      out_indices: [R, k], i32 or i64
  virtual absl::Status TopK(const TensorView& values, int k, const TensorView& out_values,
                            const TensorView& out_indices) = 0;

  // Rotary embedding in place on dims [offset, offset + rope_dim) of every head. Pair i = (a, b) of
  // a head of token t (pairing given by `style`) becomes (a c - b s, b c + a s) with c =
  // cos_sin[p][i], s = cos_sin[p][rope_dim/2 + i], p = positions[t] (the table, see rope_table.h,
  // holds any YaRN attention factor already). kAdjacentPairs leaves the pairs interleaved, where
  // DeepSeek's reference code de-interleaves q_pe/k_pe first: the q.k products are the same.
  // Positions are all checked before anything is written (InvalidArgument naming the token).
  //   x: [T, N, D], dims 0/1 any stride (elements distinct), dim 2 contiguous
  //   0 <= offset, offset + rope_dim <= D, rope_dim even and >= 2
  //   positions: [T], i32 or i64, each in [0, P)      cos_sin: [P, rope_dim], row-strided
  virtual absl::Status ApplyRope(const TensorView& x, int64_t offset, int64_t rope_dim,
                                 const TensorView& positions, const TensorView& cos_sin,
                                 RopeStyle style) = 0;

  // Masked multi-head attention (the non-absorbed MLA path for prefill/extend):
  //   out[t, n] = sum_s softmax_s(scale * q[t, n] . k[s, n] over allowed s) * v[s, n],
  // where mask[t][s] != 0 allows key s for query t; softmax in fp32, max-subtracted. A query row
  // with no allowed key is InvalidArgument naming it, found before anything is written. scale is
  // finite.
  //   q: [T, N, Dk]      k: [S, N, Dk]      v: [S, N, Dv]
  //   mask: [T, S], u8 or bool, row-strided      out: [T, N, Dv], elements distinct, no overlap
  //   with the inputs
  //   (3-D operands: dims 0/1 any stride, last dim contiguous)
  virtual absl::Status Attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& mask, float scale, const TensorView& out) = 0;

  // Absorbed MLA attention over one sequence's paged latent cache: keys are the cache rows (all W =
  // kv_lora_rank + rope dims, shared by every head), values their first `value_dim` columns (the
  // normalized latent c). Position s of the sequence lives at cache[page_table[s / page_size]]
  // [s % page_size]. Masking and scale as in Attention. The page entries used (the first ceil(S /
  // page_size)) and the mask rows are checked before anything is written.
  //   q: [T, N, W]      cache: [num_pages, page_size, W], contiguous      page_table: [>= ceil(S /
  //   page_size)], i32, contiguous, entries in [0, num_pages)      context_len S >= 1
  //   mask: [T, S]      out: [T, N, value_dim], 1 <= value_dim <= W
  virtual absl::Status LatentAttention(const TensorView& q, const TensorView& cache,
                                       const TensorView& page_table, int64_t context_len,
                                       const TensorView& mask, float scale, int64_t value_dim,
                                       const TensorView& out) = 0;

  // Absorbed MLA attention for a batch of sequences in one call, with every length on the device
  // (so a decode or tree-verify step has fixed launch shapes and can be captured in a CUDA graph).
  // Sequence b owns query rows [q_start[b], q_start[b + 1]) — its n_b newest tokens — and the keys
  // at positions [0, kv_len[b]) of its pages: position s at cache[page_tables[b][s / page_size]]
  // [s % page_size]; values are the first `value_dim` columns of the same rows. Query row i of
  // sequence b (0 <= i < n_b) allows every cached key s < kv_len[b] - n_b, and the new key
  // kv_len[b] - n_b + j (0 <= j < n_b) iff tree_mask[q_start[b] + i][j] != 0, or, with an empty
  // tree_mask, iff j <= i (causal). This is LatentAttention with mask row i = [1 x (kv_len - n_b),
  // new-token row i] per sequence. scale and value_dim as in LatentAttention. Data-dependent
  // conditions are checked before anything is written (InvalidArgument naming the sequence, or the
  // row): q_start[0] == 0, q_start nondecreasing, q_start[B] == T; n_b <= kv_len[b] <= max_kv_len and
  // kv_len[b] <= P * page_size; the page entries used in [0, num_pages); n_b <= M with a tree mask;
  // every query row allows a key. A sequence with n_b == 0 is skipped.
  //   q: [T, N, W]      cache: [num_pages, page_size, W], contiguous
  //   page_tables: [B, P], i32, row-strided      q_start: [B + 1], i32, contiguous
  //   kv_len: [B], i32, contiguous      max_kv_len >= 1: a host bound on every kv_len[b] (it sizes
  //   the launch; a captured graph keeps the bound it was captured with)
  //   tree_mask: [T, M], u8 or bool, row-strided; or, for causal, a default-constructed view or one
  //   with no elements (see HasTreeMask)
  //   out: [T, N, value_dim], 1 <= value_dim <= W
  virtual absl::Status BatchedLatentAttention(const TensorView& q, const TensorView& cache,
                                              const TensorView& page_tables, const TensorView& q_start,
                                              const TensorView& kv_len, int64_t max_kv_len,
                                              const TensorView& tree_mask, float scale,
                                              int64_t value_dim, const TensorView& out) = 0;

  // BatchedLatentAttention with a mask over every key of each sequence instead of over its new
  // tokens: query row t of sequence b allows key s < kv_len[b] iff key_mask[t][s] != 0 (columns at
  // or past kv_len[b] are never read), the mask form of BatchedPagedAttention. An MLA draft's tree
  // passes need it: their rows attend the committed context and only their own branch's earlier
  // tree rows, which are already cached, so no prefix is visible as a whole. Arguments, the
  // data-dependent checks (here n_b <= kv_len[b], and every query row must allow a key below its
  // kv_len: InvalidArgument naming the row) and the bf16 cache rounding as BatchedLatentAttention.
  //   key_mask: [T, max_kv_len], u8 or bool, row-strided
  // The default checks the arguments' shapes and returns Unimplemented: a backend runs it only when
  // it overrides it (CpuBackend and CudaBackend do).
  virtual absl::Status BatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                                     const TensorView& page_tables, const TensorView& q_start,
                                                     const TensorView& kv_len, int64_t max_kv_len,
                                                     const TensorView& key_mask, float scale, int64_t value_dim,
                                                     const TensorView& out);

  // Grouped-query attention for a batch of sequences over a paged K|V cache (the EAGLE-3 draft's),
  // every length on the device (graph-capturable, like BatchedLatentAttention). Each cache row holds
  // K of every kv head, then V of every kv head: key s of kv head g is row[g * D, (g + 1) * D),
  // its value row[(Nkv + g) * D, (Nkv + g + 1) * D). Sequence b owns query rows [q_start[b],
  // q_start[b + 1]) and the keys at positions [0, kv_len[b]) of its pages: position s at
  // cache[page_tables[b][s / page_size]][s % page_size]. Query row t of sequence b allows key s <
  // kv_len[b] iff mask[t][s] != 0 (columns >= kv_len[b] are never read); with an empty mask
  // (causal, so a step need not upload mask rows), row i of sequence b (0 <= i < n_b = q_start[b +
  // 1] - q_start[b]) allows key s iff s <= kv_len[b] - n_b + i: its own position and all before it.
  // Query head h uses kv head h / (Nq / Nkv). Softmax in fp32, max-subtracted; scale finite.
  // Data-dependent conditions are InvalidArgument naming the sequence, or the row: q_start[0] == 0,
  // q_start nondecreasing, q_start[B] == T; kv_len[b] <= min(max_kv_len, P * page_size); n_b <=
  // kv_len[b] when causal; the page entries used (j < ceil(kv_len[b] / page_size)) in [0,
  // num_pages); every query row allows a key. A sequence with no query rows is skipped. The CPU
  // reference checks all before writing; a device backend reports them at Synchronize and may have
  // written the rows of other sequences.
  //   q: [T, Nq, D]      cache: [num_pages, page_size, 2 * Nkv * D], contiguous (Nkv >= 1 divides Nq)
  //   page_tables: [B, P], i32, row-strided      q_start: [B + 1], i32      kv_len: [B], i32
  //   max_kv_len >= 1: a host bound on every kv_len[b] (a captured graph keeps it)
  //   mask: [T, max_kv_len], u8 or bool, row-strided; or, for causal, a default-constructed view or
  //   one with no elements (see HasTreeMask)
  //   out: [T, Nq, D], elements distinct, no overlap with the inputs
  //   (3-D operands: dims 0/1 any stride, last dim contiguous)
  virtual absl::Status BatchedPagedAttention(const TensorView& q, const TensorView& cache,
                                             const TensorView& page_tables, const TensorView& q_start,
                                             const TensorView& kv_len, int64_t max_kv_len,
                                             const TensorView& mask, float scale,
                                             const TensorView& out) = 0;

  // Paged cache rows: PagedWrite stores rows[t] at position positions[t] of the sequence whose
  // pages are page_table (slot cache[page_table[p / page_size]][p % page_size]); PagedRead loads
  // them back. A position outside [0, pages * page_size), or whose page entry is outside
  // [0, num_pages), is InvalidArgument naming the token and position; all are checked before
  // anything is written. Which row lands when PagedWrite gets the same slot twice is unspecified.
  //   rows/out: [T, W], row-strided      positions: [T], i32 or i64      page_table: [pages], i32
  //   cache: [num_pages, page_size, W], contiguous, page_size >= 1
  // The latent cache may be bf16 (both backends; other cache dtypes are InvalidArgument naming the
  // cache): PagedWrite rounds each f32 row to nearest even (NaN stays NaN), PagedRead widens
  // exactly, and LatentAttention / BatchedLatentAttention over a bf16 cache round q to bf16 and
  // multiply bf16 operands with fp32 accumulation (softmax in fp32, its weights rounded to bf16 for
  // the value product and not in the sum that divides it, as FlashMLA does). Where the rounding of
  // the weights happens relative to the maximum is the backend's: the CPU reference rounds
  // exp(score - row max), the CUDA kernel exp(score - running max) of its online softmax, so the
  // two agree to about bf16's precision, not bit for bit. BatchedPagedAttention takes f32 only.
  virtual absl::Status PagedWrite(const TensorView& rows, const TensorView& positions,
                                  const TensorView& page_table, const TensorView& cache) = 0;
  virtual absl::Status PagedRead(const TensorView& cache, const TensorView& page_table,
                                 const TensorView& positions, const TensorView& out) = 0;

  // What an MLA layer's new tokens need between their input product and the attention, as one op:
  // `rows` are their latent cache rows [c | k_pe] (W = latent + rope_dim wide, rope_dim =
  // cos_sin.dim(1)) as the product wrote them. c is normed in place (RmsNorm by norm_weight, eps)
  // unless norm_weight is empty; k_pe is rotated in place (ApplyRope at offset latent); each head's
  // q_pe (q_pe [T, H, rope_dim], not written) is rotated into q_rot; and every row is stored at its
  // slot of the cache (PagedWrite(rows, slots, slot_table, cache)). The results are bit for bit
  // those of ApplyRope of k_pe, RmsNorm, Copy(q_pe, q_rot), ApplyRope of q_rot and PagedWrite,
  // which the default runs in that order; a backend may run them as one kernel. Positions and slots
  // are checked as ApplyRope and PagedWrite check them (InvalidArgument naming the token); a bad slot
  // stores nothing in the cache (rows and q_rot may then hold their new values).
  //   rows: [T, W], row-strided      norm_weight: [latent], or empty (no norm)
  //   q_pe, q_rot: [T, H, rope_dim], dims 0 / 1 any stride, dim 2 contiguous; both empty (no heads)
  //   or H >= 1; q_rot overlaps nothing else. Empty: a default TensorView, or no elements.
  //   positions, cos_sin, style: as ApplyRope's      slots, slot_table, cache: as PagedWrite's
  //   positions, page_table and cache
  virtual absl::Status LatentRowsAndQueries(const TensorView& rows, const TensorView& norm_weight, float eps,
                                            const TensorView& q_pe, const TensorView& q_rot,
                                            const TensorView& positions, const TensorView& cos_sin, RopeStyle style,
                                            const TensorView& slots, const TensorView& slot_table,
                                            const TensorView& cache);

  // The commit after tree verification, every input on the device (graph-capturable): for each
  // sequence b and i < num_accepted[b], the row at position cache_len[b] + accepted[b][i] moves to
  // position cache_len[b] + i (positions through page_tables[b] as in PagedWrite), in place; rows
  // are copied bit for bit (any cache dtype the backend stores). Equal to moving the rows one by one
  // in increasing i. The slots touched must be distinct (no page shared by two sequences or listed
  // twice in one table within the positions moved; not checked). A sequence with
  // num_accepted[b] < 0 (a failed sequence of the device verifier) is skipped. Data-dependent
  // conditions (src/compact_accepted_check.h: num_accepted[b] <= max_nodes; offsets strictly
  // increasing in [0, max_nodes); positions inside P * page_size; their page entries in
  // [0, num_pages)) are InvalidArgument naming the sequence and entry; a sequence with a bad entry
  // is left unwritten, the others are compacted (on every backend), and the lowest bad sequence is
  // reported: by the call on the CPU, by Synchronize on a device backend.
  //   cache: [num_pages, page_size, W], contiguous      page_tables: [B, P], i32, row-strided
  //   cache_len: [B], i32 or i64      accepted: [B, max_nodes], i32, row-strided
  //   num_accepted: [B], i32
  virtual absl::Status CompactAccepted(const TensorView& cache, const TensorView& page_tables,
                                       const TensorView& cache_len, const TensorView& accepted,
                                       const TensorView& num_accepted) = 0;

  // DeepSeek MoE routing from router logits (docs/semantics.md), in fp32:
  //  - kSoftmax scores = softmax(logits); kGreedy: top_k of the scores; kGroupLimitedGreedy: group
  //    score = max of its experts' scores, keep the topk_group best groups, top_k among their
  //    experts. Weights = the chosen scores, then (top_k > 1 && norm_topk_prob) ? divide by
  //    their sum (+1e-20) : multiply by routed_scaling_factor.
  //  - kSigmoid scores = sigmoid(logits); kNoauxTc selects with scores + correction_bias: group
  //    score = sum of its two best biased scores, keep topk_group groups, top_k biased among their
  //    experts; weights = the unbiased scores of the chosen experts, divided by their sum (+1e-20)
  //    when norm_topk_prob, then always multiplied by routed_scaling_factor.
  // Experts of dropped groups are excluded outright (as SGLang and vLLM do; the reference code
  // fills their scores with 0, which differs only when kept biased scores are negative). Ties go to
  // the lower expert (or group) index; ids are in descending order of selection score.
  // Valid params: kSoftmax with kGreedy or kGroupLimitedGreedy, kSigmoid with kNoauxTc;
  // 1 <= top_k <= E; for the grouped methods n_group divides E, 1 <= topk_group <= n_group,
  // top_k <= topk_group * E / n_group, and kNoauxTc needs >= 2 experts per group (kGreedy ignores
  // the group params); routed_scaling_factor finite. A non-finite logit (named by row) or bias is
  // InvalidArgument, found before anything is written.
  //   logits: [T, E], row-strided      correction_bias: [E] for kNoauxTc, else nullptr
  //   ids: [T, top_k], i32, row-strided      weights: [T, top_k], row-strided
  virtual absl::Status MoeRoute(const TensorView& logits, const TensorView* correction_bias,
                                const MoeRoutingParams& params, const TensorView& ids,
                                const TensorView& weights) = 0;

  // Routed experts: out[t] (+)= sum_j weights[t, j] * down_e(silu(gate_e x[t]) * up_e x[t]) with
  // e = ids[t, j]; `accumulate` adds to out instead of overwriting it (without it, out is
  // write-only). ids are checked before anything is written (InvalidArgument naming [t, j]).
  //   x: [T, H]      ids: [T, k], i32, each in [0, experts.size())      weights: [T, k]
  //   experts: per expert, see ExpertWeights, the same I for all (row-strided)      out: [T, H],
  //   no overlap with any input
  virtual absl::Status MoeExperts(const TensorView& x, const TensorView& ids,
                                  const TensorView& weights, std::span<const ExpertWeights> experts,
                                  const TensorView& out, bool accumulate) = 0;

  // MoeExperts with the experts' weights kept quantized: the same contract (ids checked, accumulate,
  // x / weights / out shapes) with gate_e, up_e and down_e the f32 weights the views describe
  // (DequantizeWeight). A backend may round x and the activation silu(gate x) * up x to bf16 as its
  // QuantizedGemm rounds activations, and take the weights as its QuantizedGemm does (CudaBackend:
  // exact, with the scales applied to fp32 block and group sums; cuda/cuda_backend_quantized_moe.cc);
  // the CPU reference dequantizes exactly and takes x, weights and out in f32 only.
  //   x: [T, H]      ids: [T, k], i32, each in [0, experts.size())      weights: [T, k]
  //   experts: per expert, see QuantizedExpertWeights: Check()ed views on device(), one format and
  //   block size for all, gate / up rows() = I and k = H, down rows() = H and k = I
  //   out: [T, H], no overlap with any input
  virtual absl::Status QuantizedMoeExperts(const TensorView& x, const TensorView& ids,
                                           const TensorView& weights,
                                           std::span<const QuantizedExpertWeights> experts,
                                           const TensorView& out, bool accumulate) = 0;

  // ---- The speculative step's ops (tree build, verification, row gathers): a whole step stays on
  // the device. Data errors of the tree ops are per-sequence records, never a returned Status, so
  // that a step needs no host synchronization; shapes, dtypes and devices are checked as usual.

  // Bytes of the u8 workspace TreeBuildStep / TreeBuildFinalize need for `shape` on this backend
  // (0 when the shape is outside the backend's limits). Zero-fill it once before its first use; it
  // then serves every later build whose size it covers.
  virtual int64_t TreeBuildWorkspaceBytes(const TreeBuildShape& shape) const = 0;

  // Draft pass `step` (0 <= step < S, in order, once each) of BuildDraftTree (eagle3/draft_tree.h:
  // candidate indices, ties, double scores) for every sequence at once; the candidate store lives in
  // `workspace` between the calls. Step 0 resets every error record; a sequence whose logits row
  // holds NaN / +inf or nothing finite gets a record and is skipped by the later passes and by
  // TreeBuildFinalize. When step + 1 < S the pass writes the next frontier: for sequence b, rows
  // [b k, (b + 1) k) in decreasing score (ties: lower candidate index), which are the rows of the
  // next pass's logits.
  //   logits: [B * F, Vd] f32, row-strided; F = 1 at step 0, else k: row b F + f = the draft's
  //           logits after frontier row f of sequence b
  //   d2t: [Vd] i64 offsets (target = draft + d2t[draft], validated by the caller), or an empty
  //        view for the identity
  //   workspace: [>= TreeBuildWorkspaceBytes(shape)] u8, 16-byte aligned
  //   errors: [B, kTreeBuildErrorWidth] i64
  //   frontier_tokens: [B * k] i64: target ids       frontier_parents: [B * k] i32: the parent's
  //   row in this pass's logits (b F + f, so that a gather of this pass's rows by it lines up)
  virtual absl::Status TreeBuildStep(const TreeBuildShape& shape, int step, const TensorView& logits,
                                     const TensorView& d2t, const TensorView& workspace,
                                     const TensorView& errors, const TensorView& frontier_tokens,
                                     const TensorView& frontier_parents) = 0;

  // The trees after the last pass: for each sequence not in error, the DraftTree BuildDraftTree
  // returns for the same logits (node 0 the root, nodes in candidate order, parents first);
  // sequences in error write nothing.
  //   root_tokens: [B] i64      root_positions: [B] i64: RoPE position of each root
  //   tokens: [B, N] i64      parents: [B, N] i32, -1 for the root      positions: [B, N] i64:
  //   root position + depth      mask: [B * N, N] u8: row b N + i, column j = 1 iff node j is i or
  //   an ancestor of i (the tree mask of a target verify forward)
  virtual absl::Status TreeBuildFinalize(const TreeBuildShape& shape, const TensorView& workspace,
                                         const TensorView& errors, const TensorView& root_tokens,
                                         const TensorView& root_positions, const TensorView& tokens,
                                         const TensorView& parents, const TensorView& positions,
                                         const TensorView& mask) = 0;

  // TreeVerifier::Verify (eagle3/tree_verifier.h: greedy or lossless stochastic, the same Philox
  // coins, sequence b drawing stream b) for B trees of N nodes each, then the commit offsets of each
  // accepted path. Tree b: tokens[b], parents[b] with parents[0] = -1 and parents[i] < i; siblings
  // are tried in node order (as DraftTree::FromParents lists them). A sequence whose tree is
  // malformed, whose drafted tokens lie outside [0, V) or whose logits rows (all N, visited or
  // not) hold NaN / +inf or nothing finite gets an error record (checked in TreeVerifier's order),
  // num_accepted = commit_counts = -1, and writes nothing else. Sampling parameters are checked
  // (InvalidArgument).
  //   tokens: [B, N] i64 (the root's unused)      parents: [B, N] i32
  //   logits: [B * N, V] f32 (a backend may also take bf16), row-strided: row b N + i = the
  //           target's logits after node i
  //   seed_offset: [2] i64: the Philox key and counter base as bit patterns, read when the op runs
  //                (a captured step draws the coins of whatever the buffer then holds)
  virtual absl::Status TreeVerify(const TensorView& tokens, const TensorView& parents,
                                  const TensorView& logits, const SamplingParams& sampling,
                                  const TensorView& seed_offset, const TreeVerifyOutputs& out) = 0;

  // out[i] = src[index[i]], row by row, bit for bit (any dtype). With `groups` G > 1 the rows form
  // G equal groups and each index is local to its group: out[g q + j] = src[g m + index[g q + j]]
  // for q = n / G, m = R / G (a per-sequence gather over a batch of sequences of equal row counts).
  // An index outside [0, m) is InvalidArgument naming i: from the call on the CPU, from Synchronize
  // on a device backend (the other rows are written). G >= 1 divides R and n.
  //   src: [R, C] row-strided      index: [n] i32      out: [n, C] row-strided, src's dtype, no
  //   overlap with src
  virtual absl::Status GatherRows(const TensorView& src, const TensorView& index, const TensorView& out,
                                  int64_t groups = 1) = 0;

  // Attention rows of a tree's next level: out[i] = src[parent[i]], then out[i][column[i]] = 1 (a
  // node sees what its parent sees, and its own slot). Indices outside their range are
  // InvalidArgument naming i, as in GatherRows.
  //   src: [R, M] u8 row-strided      parent: [n] i32 in [0, R)      column: [n] i32 in [0, M)
  //   out: [n, M] u8 row-strided, no overlap with src
  virtual absl::Status ExtendMaskRows(const TensorView& src, const TensorView& parent,
                                      const TensorView& column, const TensorView& out) = 0;

  // Waits until every op issued so far has finished; reports deferred device errors.
  virtual absl::Status Synchronize() = 0;

  // Checks shared within a step. A device backend checks the index tensors of ApplyRope, PagedWrite
  // and BatchedLatentAttention[KeyMask] (positions, page tables, lengths, masks) with kernels ahead
  // of each call; a step passes the same tensors to every layer. Between BeginSharedChecks and the
  // matching EndSharedChecks the caller promises that the contents of the index tensors it passes to
  // those ops do not change; a call whose index tensors (data, dtype, shape, strides) and bounds
  // equal those of an earlier call of the same op in the scope then takes that call's verdict
  // instead of checking again: a bad entry still makes every such call write nothing, and is
  // reported once, by the next Synchronize. Scopes nest (the outermost one counts). The CPU
  // reference checks on the host at every call and ignores scopes. SharedChecksScope opens one.
  virtual void BeginSharedChecks() {}
  virtual void EndSharedChecks() {}

  // A hint with no effect on any result: a device backend starts reading `weights` into its
  // last-level cache, in order, up to a bound it sets from that cache's size (the views past it are
  // left out), so that the ops that read them a little later find them there instead of waiting on
  // device memory. A step issues it ahead of latency-bound work (a small batch's attention, the MoE
  // routing), while the memory would otherwise idle. What is read is each view's span, from its
  // first element to its last (strides included); empty views are skipped. The views must be on
  // this backend's device with non-negative strides (InvalidArgument naming the view otherwise), and
  // no work enqueued after this call may write them before the ops that read them (weights). The
  // CPU reference checks the views and does nothing else.
  virtual absl::Status PrefetchWeights(std::span<const TensorView> weights);

 protected:
  // Shape, stride, device, index-dtype and aliasing checks shared by every backend, so that the
  // contract above is enforced once. They do not check floating dtypes (backend policy).
  absl::Status CheckCopy(const TensorView& src, const TensorView& dst) const;
  absl::Status CheckGemm(const TensorView& a, const TensorView& b, const TensorView& c,
                         const GemmOptions& options) const;
  // w.Check(), then Gemm's checks with w's tensors in place of b (shapes against w.rows() and w.k).
  absl::Status CheckQuantizedGemm(const TensorView& a, const QuantizedWeightView& w, const TensorView& c,
                                  const GemmOptions& options) const;
  // TileQuantizedCodes' contract above (InvalidArgument naming "TileQuantizedCodes" and the tensor).
  absl::Status CheckTileQuantizedCodes(const QuantizedWeightView& w, const TensorView& tiles) const;
  // The batched shapes and the items' mutual overlap; each item is then checked by CheckGemm.
  absl::Status CheckBatchedGemm(const TensorView& a, const TensorView& b, const TensorView& c) const;
  // Item i of a [B, rows, cols] batch, as a [rows, cols] matrix view.
  static TensorView BatchItem(const TensorView& t, int64_t i);
  // An operand an op may leave out (LatentRowsAndQueries' norm_weight, q_pe, q_rot): a default
  // TensorView, or one without elements.
  static bool Absent(const TensorView& t) { return t.data() == nullptr || t.numel() == 0; }
  // residual: nullptr for plain RmsNorm.
  absl::Status CheckRmsNorm(const char* op, const TensorView& x, const TensorView* residual,
                            const TensorView& weight, float eps, const TensorView& out) const;
  // CheckRmsNorm's checks of each half (naming x0, weight0, out0 and x1, weight1, out1), equal row
  // counts, and no out overlapping the other half's x, weight or out; then `check_dtype` (the
  // backend's policy: the op name, the operand's name, the operand) of each of the six operands.
  using DTypeCheck = absl::FunctionRef<absl::Status(const char* op, const char* name, const TensorView& t)>;
  absl::Status CheckRmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                                const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                                float eps, DTypeCheck check_dtype) const;
  absl::Status CheckSiluMul(const TensorView& gate_up, const TensorView& out) const;
  absl::Status CheckEmbeddingLookup(const TensorView& ids, const TensorView& table,
                                    int64_t vocab_start, const TensorView& out) const;
  absl::Status CheckSoftmax(const TensorView& logits, float temperature,
                            const TensorView& out) const;
  absl::Status CheckArgmax(const TensorView& logits, const TensorView& out) const;
  absl::Status CheckTopK(const TensorView& values, int k, const TensorView& out_values,
                         const TensorView& out_indices) const;
  // The checks below cover what can be checked without reading tensor contents; each backend
  // checks the data-dependent conditions (positions, page entries, masks, ids) itself.
  absl::Status CheckApplyRope(const TensorView& x, int64_t offset, int64_t rope_dim,
                              const TensorView& positions, const TensorView& cos_sin) const;
  absl::Status CheckAttention(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& mask, float scale, const TensorView& out) const;
  absl::Status CheckLatentAttention(const TensorView& q, const TensorView& cache,
                                    const TensorView& page_table, int64_t context_len,
                                    const TensorView& mask, float scale, int64_t value_dim,
                                    const TensorView& out) const;
  absl::Status CheckBatchedLatentAttention(const TensorView& q, const TensorView& cache,
                                           const TensorView& page_tables, const TensorView& q_start,
                                           const TensorView& kv_len, int64_t max_kv_len,
                                           const TensorView& tree_mask, float scale,
                                           int64_t value_dim, const TensorView& out) const;
  // CheckBatchedLatentAttention's checks, and key_mask's [T, max_kv_len] shape and dtype.
  absl::Status CheckBatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                                  const TensorView& page_tables, const TensorView& q_start,
                                                  const TensorView& kv_len, int64_t max_kv_len,
                                                  const TensorView& key_mask, float scale, int64_t value_dim,
                                                  const TensorView& out) const;
  absl::Status CheckBatchedPagedAttention(const TensorView& q, const TensorView& cache,
                                          const TensorView& page_tables, const TensorView& q_start,
                                          const TensorView& kv_len, int64_t max_kv_len,
                                          const TensorView& mask, float scale,
                                          const TensorView& out) const;
  // LatentRowsAndQueries' shapes, dtypes and overlaps (its sub-ops' checks, each error prefixed
  // with the op's name).
  absl::Status CheckLatentRowsAndQueries(const TensorView& rows, const TensorView& norm_weight, float eps,
                                         const TensorView& q_pe, const TensorView& q_rot, const TensorView& positions,
                                         const TensorView& cos_sin, const TensorView& slots,
                                         const TensorView& slot_table, const TensorView& cache) const;
  // op is "PagedWrite" (rows is read, cache written) or "PagedRead" (cache read, rows written).
  absl::Status CheckPaged(const char* op, const TensorView& rows, const TensorView& positions,
                          const TensorView& page_table, const TensorView& cache) const;
  absl::Status CheckCompactAccepted(const TensorView& cache, const TensorView& page_tables,
                                    const TensorView& cache_len, const TensorView& accepted,
                                    const TensorView& num_accepted) const;
  absl::Status CheckMoeRoute(const TensorView& logits, const TensorView* correction_bias,
                             const MoeRoutingParams& params, const TensorView& ids,
                             const TensorView& weights) const;
  absl::Status CheckMoeExperts(const TensorView& x, const TensorView& ids,
                               const TensorView& weights, std::span<const ExpertWeights> experts,
                               const TensorView& out) const;
  // CheckMoeExperts' checks of x, ids, weights and out, then every view Check()ed (named
  // "experts[e].gate" / ".up" / ".down") on device(), one format and block size for all experts,
  // gate / up [I, H] and down [H, I] with I from experts[0] and H from x, and no view overlapping out.
  absl::Status CheckQuantizedMoeExperts(const TensorView& x, const TensorView& ids,
                                        const TensorView& weights,
                                        std::span<const QuantizedExpertWeights> experts,
                                        const TensorView& out) const;
  // Everything but the logits' floating dtype (backend policy) and the backend's size limits;
  // sampling parameters included.
  absl::Status CheckTreeVerify(const TensorView& tokens, const TensorView& parents,
                               const TensorView& logits, const SamplingParams& sampling,
                               const TensorView& seed_offset, const TreeVerifyOutputs& out) const;
  absl::Status CheckGatherRows(const TensorView& src, const TensorView& index, const TensorView& out,
                               int64_t groups) const;
  absl::Status CheckExtendMaskRows(const TensorView& src, const TensorView& parent,
                                   const TensorView& column, const TensorView& out) const;
  // The shape (DraftTreeParams' ranges, then this backend's limits: TreeBuildWorkspaceBytes), the
  // workspace's size and alignment, and every tensor but the logits' floating dtype.
  absl::Status CheckTreeBuildStep(const TreeBuildShape& shape, int step, const TensorView& logits,
                                  const TensorView& d2t, const TensorView& workspace,
                                  const TensorView& errors, const TensorView& frontier_tokens,
                                  const TensorView& frontier_parents) const;
  absl::Status CheckTreeBuildFinalize(const TreeBuildShape& shape, const TensorView& workspace,
                                      const TensorView& errors, const TensorView& root_tokens,
                                      const TensorView& root_positions, const TensorView& tokens,
                                      const TensorView& parents, const TensorView& positions,
                                      const TensorView& mask) const;
};

// Opens a shared-checks scope of `backend` (Backend::BeginSharedChecks) for its lifetime, or none
// when `open` is false.
class SharedChecksScope {
 public:
  SharedChecksScope(Backend& backend, bool open) : backend_(open ? &backend : nullptr) {
    if (backend_ != nullptr) backend_->BeginSharedChecks();
  }
  ~SharedChecksScope() {
    if (backend_ != nullptr) backend_->EndSharedChecks();
  }
  SharedChecksScope(const SharedChecksScope&) = delete;
  SharedChecksScope& operator=(const SharedChecksScope&) = delete;

 private:
  Backend* backend_;
};

}  // namespace eagle3
