// MlaBlock: one rank's share of one multi-head latent attention block (MlaAttentionConfig), the
// attention every DeepSeek layer eagle3 runs is made of: the target's decoder layers, DeepSeek-V3's
// MTP layer and an MLA EAGLE-3 draft layer (docs/mla_drafts.md, "Proposed C++ design"). From the
// normalized input rows x it computes q (q_a -> q_a_layernorm -> q_b, or q_proj), the latent cache
// row [kv_a_layernorm(c) | RoPE(k_pe)] of every new token (q_a and kv_a as one product where their
// weights stack), writes those rows into the caller's paged latent cache, attends, and leaves
// o_proj's output, this rank's heads only, for the caller to reduce over the ranks.
//
// Two attention paths (docs/semantics.md):
//  - batched: every sequence at once, absorbed (W_UK folded into q, attention over the latent rows,
//    W_UV after), lengths and page tables on the device: the launch sequence does not depend on
//    them, so a step can be captured in a CUDA graph;
//  - per sequence: absorbed, or with k/v reconstructed from the latent rows through kv_b (fewer
//    flops per new token for long extends), each sequence's page table and mask uploaded from the
//    host.
//
// The block owns its weights only. Its scratch (MlaWorkspace) belongs to the model, so a model's
// blocks share one; the cache and the step's metadata are the caller's too, which lets a target
// with one cache per layer and a draft with its own small cache run the same code.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/dtype.h"
#include "eagle3/mla_attention_config.h"
#include "eagle3/target_model.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"
#include "linear_weight.h"
#include "weight_loader.h"

namespace eagle3 {

// New tokens per sequence up to which AttentionPath::kAuto takes the absorbed path (decode, tree
// verify); longer extends reconstruct k/v, which costs fewer flops per new token.
inline constexpr int64_t kMlaAbsorbedMaxNewTokens = 64;

// Whether a sequence bringing `new_tokens` rows attends absorbed under `path`.
inline bool MlaAbsorbed(AttentionPath path, int64_t new_tokens) {
  return path == AttentionPath::kAbsorbed || (path == AttentionPath::kAuto && new_tokens <= kMlaAbsorbedMaxNewTokens);
}

// The dims of one rank's share of an MLA block: whole heads (MlaAttentionConfig::ValidateForTp).
struct MlaRankDims {
  int64_t input_width = 0;  // columns of x
  int64_t heads = 0;        // attention heads on this rank
  int64_t q_lora = 0;       // q_lora_rank; 0 for a plain q_proj
  int64_t latent = 0;       // kv_lora_rank (R)
  int64_t rope = 0;         // qk_rope_head_dim (P)
  int64_t width = 0;        // R + P: one latent cache row
  int64_t nope = 0;         // qk_nope_head_dim
  int64_t qk = 0;           // nope + P
  int64_t vdim = 0;         // v_head_dim

  // `config`'s dims on one of `tp_size` ranks (tp_size divides num_heads).
  static MlaRankDims Of(const MlaAttentionConfig& config, int tp_size);

  friend bool operator==(const MlaRankDims&, const MlaRankDims&) = default;
};

// Scratch of MlaBlock::Forward*, sized for at most `max_tokens` new rows and `max_context_len`
// positions per sequence; every block of the same dims may share one (one runs at a time). All
// device buffers are on the backend's device, f32 unless said.
struct MlaWorkspace {
  MlaRankDims dims;
  int64_t max_tokens = 0;
  int64_t max_context_len = 0;
  Tensor q;       // [T, heads * qk] with q-LoRA (q_b's output); empty for a plain q_proj (see Q())
  Tensor attn_v;  // [T, heads * vdim]: attention output, o_proj's input
  // Row t: [lead | c | k_pe | the absorbed query of each head]: the product of x before the cache row
  // (lead columns: q_a's output, q_lora wide; with a plain q_proj its q, heads * qk wide), token t's
  // latent cache row (width), then each head's [q_nope W_UK | q_pe] (width each). That product and
  // kv_a both read x, so a block whose two weights stack writes [lead | c | k_pe] with one product.
  // The column ranges, every row:
  Tensor lat;                     // [T, Lead() + (heads + 1) * width]
  int64_t Lead() const;           // q_lora, or heads * qk for a plain q_proj
  TensorView Qa() const;          // [T, Lead()]: qa, or a plain q_proj's q
  TensorView QaCacheRow() const;  // [T, Lead() + width]: [lead | c | k_pe], a stacked product's output
  TensorView CacheRow() const;    // [T, width]: [c | k_pe]
  TensorView QLat() const;        // [T, heads * width]: the heads
  TensorView Q() const;           // [T, heads * qk]: every head's [q_nope | q_pe] (q, or Qa() when plain)
  Tensor o_lat;                   // [T, heads * latent]: absorbed attention output, before W_UV
  Tensor ctx_lat, ctx_kv, ctx_k;  // [S, width], [S, heads * (nope + vdim)], [S, heads * qk]: k/v rebuilt
  Tensor mask;                    // u8 [T * S]: per-sequence path mask
  Tensor iota;                    // i64 [S]: 0, 1, ...: the positions PagedRead reads back
  Tensor cos_sin;                 // [S, rope]: the config's RoPE table (rope_table.h)
  std::vector<uint8_t> host_mask;  // [T * S]: per-sequence mask, built on the host

  // Buffers for blocks of `config` on one of `tp_size` ranks. `who` names the model in
  // ResourceExhausted messages.
  static absl::StatusOr<MlaWorkspace> Create(const MlaAttentionConfig& config, int tp_size, int64_t max_tokens,
                                             int64_t max_context_len, Backend& backend, const std::string& who);
};

// The batched path's step: the metadata of every sequence on the device (BatchedLatentAttention).
struct MlaBatchedStep {
  TensorView positions;    // [T] i64, device: RoPE position of each new row
  TensorView slots;        // [T] i64, device: the flat-cache row (page * page_size + offset) of each
  TensorView slot_iota;    // [num_pages * page_size] i32, device: 0, 1, ...: the flat view's page table
  TensorView page_tables;  // [B, P] i32, device, row-strided
  TensorView q_start;      // [B + 1] i32, device
  TensorView kv_len;       // [B] i32, device
  int64_t max_kv_len = 0;  // host bound on every kv_len (sizes the launch)
  TensorView tree_mask;    // [T, M] u8, device: over each sequence's new rows; empty: causal
  // [T, max_kv_len] u8, device: over each sequence's every key (BatchedLatentAttentionKeyMask),
  // for a draft's tree passes, whose rows skip cached rows of other branches. At most one of
  // tree_mask and key_mask is set.
  TensorView key_mask;
  // Weights the step reads after this attention (AppendOutputWeights first), prefetched
  // (Backend::PrefetchWeights) while its latency-bound kernels run: RoPE, the cache write, the
  // attention. Empty: none.
  std::span<const TensorView> prefetch;
};

// The per-sequence path's step.
struct MlaSequenceStep {
  TensorView positions;  // [T] i64, device: RoPE position of each new row
  TensorView slots;      // [T] i64, device: each new row's position in its sequence
  // The sequences, in row order: their new-token counts, cache_len, page tables and tree masks (host).
  std::span<const SequenceInput> sequences;
  int64_t page_size = 0;
  AttentionPath path = AttentionPath::kAuto;  // per sequence, by MlaAbsorbed
  TensorView page_table;  // [>= pages of the longest sequence] i32, device: scratch the tables go to
};

class MlaBlock {
 public:
  // Whether Load stacks the products of x, q_a_proj (or a plain q_proj) and kv_a_proj_with_mqa, into
  // one weight [q_a; kv_a] (or [q_proj; kv_a]).
  enum class InputProjections {
    kStackWherePossible,  // where StackLinearWeights can: one product writes [lead | c | k_pe]
    kApart,               // two weights, two products (the reference the stacked block must match)
  };

  // Loads rank `rank` of `tp_size`'s shard of the block's tensors (MlaAttentionWeights(config,
  // prefix), "model.layers.12.self_attn.", "layers.0.self_attn.") through `loader`: q_a / q_b (or
  // q_proj), kv_a and o_proj as LinearWeights (kept quantized as the loader says, else in
  // `weight_dtype`), kv_b dense in `weight_dtype`, norms in f32, and W_UK per head transposed to
  // [R, nope] from kv_b's f32 values. q_a (or q_proj: this rank's heads) and kv_a (replicated: every
  // rank's is the whole tensor) are stacked as `input_projections` says, the parts then freed.
  // A checkpoint tensor of another shape (an H-wide q_a_proj for a 2H-wide block) is InvalidArgument
  // naming it when `loader` checks each read (WeightLoader::Checks::kEachRead).
  static absl::StatusOr<MlaBlock> Load(const MlaAttentionConfig& config, int tp_size, std::string_view prefix,
                                       DType weight_dtype, WeightLoader& loader,
                                       InputProjections input_projections = InputProjections::kStackWherePossible);

  const MlaAttentionConfig& config() const { return config_; }
  const MlaRankDims& dims() const { return dims_; }
  // Whether q_a (or q_proj) and kv_a are one stacked weight (Project runs one product for both).
  bool input_projections_stacked() const { return q_kv_a_.rows() > 0; }

  // The batched path. Writes every new row's latent cache row into `cache` at step.slots and
  // attends every sequence over its pages.
  //   x: [T, input_width] f32, row-strided, device, T <= ws.max_tokens
  //   cache: [num_pages, page_size, width] (f32 or bf16), contiguous, device
  //   out: [T, output_width] f32, device: o_proj of this rank's heads (a partial sum over ranks)
  absl::Status ForwardBatched(const TensorView& x, const MlaBatchedStep& step, const TensorView& cache,
                              MlaWorkspace& ws, const TensorView& out) const;
  // The per-sequence path; x, cache and out as ForwardBatched.
  absl::Status ForwardPerSequence(const TensorView& x, const MlaSequenceStep& step, const TensorView& cache,
                                  MlaWorkspace& ws, const TensorView& out) const;
  // Only the new rows' latent cache rows, written at step.slots as ForwardBatched writes them (bit
  // for bit: kv_a, kv_a_layernorm, RoPE of k_pe at step.positions), without q_b or attention: a
  // draft step that only keeps its cache in step with the target. With q_a and kv_a stacked, the
  // same stacked product (q_a's part included) as ForwardBatched's, so that the bits agree. Reads
  // step.positions, slots and slot_iota; x and cache as ForwardBatched.
  absl::Status WriteCacheRows(const TensorView& x, const MlaBatchedStep& step, const TensorView& cache,
                              MlaWorkspace& ws) const;

  // The weights ForwardBatched reads before its attention (q_a and kv_a or their stack, q_b, W_UK),
  // in the order it reads them, appended to `out`: what a step prefetches for this block while the
  // layer before it runs.
  void AppendInputWeights(std::vector<TensorView>& out) const;
  // The weights ForwardBatched reads after its attention (W_UV, o_proj), appended to `out`.
  void AppendOutputWeights(std::vector<TensorView>& out) const;

 private:
  MlaBlock() = default;

  // x and ws against the block's dims (InvalidArgument naming what differs).
  absl::Status CheckShapes(const TensorView& x, const MlaWorkspace& ws) const;
  // q into ws.Q(), the latent rows [kv_a_layernorm(c) | k_pe] into ws.CacheRow() (k_pe not yet
  // rotated); the rows [0, T). With norm_latent false, c is left unnormed where its norm is a launch
  // of its own (not q_a_layernorm's pair): LatentNormed() says whether Project normed it.
  absl::Status Project(const TensorView& x, MlaWorkspace& ws, bool norm_latent = true) const;
  // Whether Project(..., norm_latent = false) norms c: with q_a_layernorm, in one launch with it.
  bool LatentNormedWithQa() const { return !q_a_ln_.empty() && input_projections_stacked(); }
  // The input product into ws's rows [0, T): [c | k_pe] into ws.CacheRow(), and with stacked
  // weights q_a's output into ws.Qa(); nothing normed.
  absl::Status InputProduct(const TensorView& x, MlaWorkspace& ws) const;
  // InputProduct, then kv_a_layernorm of c: the latent rows (WriteCacheRows' part of Project).
  absl::Status ProjectLatent(const TensorView& x, MlaWorkspace& ws) const;
  // c of rows [0, T) of ws.CacheRow(): what kv_a_layernorm norms in place.
  TensorView Latent(const MlaWorkspace& ws, int64_t t) const;
  // W_UV of every head: rows [h (nope + vdim) + nope, + vdim) of kv_b, as [heads, vdim, latent].
  TensorView WUv() const;

  Backend* backend_ = nullptr;
  MlaAttentionConfig config_;
  MlaRankDims dims_;
  float eps_ = 0.0f;    // rms_norm_eps
  float scale_ = 0.0f;  // SoftmaxScale()
  // The projections may stay quantized (LinearWeight); kv_b is always dense, as W_UK and W_UV are
  // per-head slices of it that BatchedGemm takes.
  LinearWeight q_kv_a_;  // [q_a; kv_a] or [q_proj; kv_a] when they stack (q_a_ / q_b_ and kv_a_ then empty)
  LinearWeight q_a_;     // empty for a plain q_proj, or stacked
  Tensor q_a_ln_;        // empty for a plain q_proj
  LinearWeight q_b_;     // q_b_proj, or q_proj when q_lora_rank is unset (empty when that is stacked)
  LinearWeight kv_a_;    // empty when stacked
  Tensor kv_a_ln_, kv_b_;
  Tensor w_uk_t_;  // [heads, latent, nope]
  LinearWeight o_proj_;
};

}  // namespace eagle3
