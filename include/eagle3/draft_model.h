// DraftModel: one tensor-parallel rank of a draft model on top of a DeepSeek-V2-family target
// (docs/semantics.md, docs/mla_drafts.md). Three kinds share the step (DraftKind): a row for target
// position p reads a hidden state at p and the token at p + 1 at RoPE position p, writes one row of
// the draft's own paged KV cache, and returns logits and a hidden state to feed back; later steps
// read the fed-back hidden of their parent row.
//  - kLlama: the Llama-style EAGLE-3 head (SpecForge's LlamaForCausalLMEagle3), described below.
//  - kMla: an MLA EAGLE-3 head (Eagle3DeepseekV2ForCausalLM: the Kimi-K2.5 drafts): the same step
//    with a DeepSeek MLA layer (input [embed | hidden] 2H wide) over a latent cache and a dense MLP
//    (src/draft_layer_mla.cc; docs/mla_drafts.md "The MLA EAGLE-3 draft").
//  - kMtp: DeepSeek-V3's MTP module from the target's own checkpoint (CreateMtp): first-step input
//    the target's final hidden after model.norm (HiddenStateTap::FinalNormed), one full decoder
//    layer (MLA + the MoE block, the target's stored forms dequantized at load), the target's
//    embedding and lm_head over the full vocabulary, shared_head.norm(r) fed back
//    (src/draft_layer_mtp.cc; docs/mla_drafts.md "DeepSeek-V3's MTP module").
//
// The Llama-style head:
//   g = fc(aux)                      on the first step after a target pass (aux = the tapped target
//                                    states, [T, k·Ht]); later steps feed back the draft's own hidden
//   x = concat(input_layernorm(embed(token)), hidden_norm(g))      embeddings first, [T, 2H]
//   residual = g (or hidden_norm(g) with norm_before_residual)
//   r = residual + o_proj(attn(q, k, v from x))                    GQA, NeoX rotate-half RoPE with
//   r = r + mlp(post_attention_layernorm(r))                       the draft config's rope scaling
//   logits = lm_head(norm(r)) over the draft vocabulary; r (un-normalized) is fed back
//
// Attention is Llama's: q/k/v = x W^T (no bias), RoPE on the whole head_dim (pairs (i, i + d/2))
// with the cos/sin table of the draft's own rope config (YaRN's attention factor folded into cos/sin,
// as transformers' LlamaRotaryEmbedding does), softmax scale head_dim^-0.5, num_key_value_heads
// shared by num_attention_heads / num_key_value_heads query heads each. The SiLU MLP is
// down(silu(gate x) * up x). Every RMSNorm uses rms_norm_eps.
//
// Variant keys of the config (all honoured; see Eagle3DraftConfig):
//   norm_before_fc  aux = input_norm(aux) over the whole [T, k·Ht] row (tensor `input_norm.weight`
//                   [k·Ht]; vLLM speculators' gpt-oss drafts) before fc;
//   fc_norm         each aux slice i = fc_norm.i(slice) ([Ht] each, tensors `fc_norm.{i}.weight`;
//                   EAGLE 3.1) before fc; mutually exclusive with norm_before_fc;
//   norm_output     the hidden fed back (hidden_out) is norm(r) instead of r (EAGLE 3.1); the logits
//                   are lm_head(norm(r)) either way.
//
// Alignment: the row for target position p pairs the target hidden at p with the token at p + 1 and
// uses RoPE position p. Draft ids map to target ids by offset: target = draft + d2t[draft].
//
// Tensor parallelism (every rank runs Forward with the same inputs and gets the same outputs): fc,
// norms and d2t replicated; q/k/v column-parallel by heads (num_key_value_heads must divide by tp),
// o_proj row-parallel + all-reduce; gate/up column-parallel, down row-parallel + all-reduce (the
// intermediate size must divide by tp); the embedding vocab-parallel (padded to 64·tp rows, all-
// reduce); lm_head vocab-parallel over the draft vocabulary (padded to 64·tp rows, all-gather). The
// residual stream is replicated on every rank. Each rank caches K (after RoPE) and V of its own
// kv heads: one paged cache of rows [K | V], 2 · (num_key_value_heads / tp) · head_dim wide. The MLA
// kinds split their layer as a target layer (heads; the MLP's intermediate dim, the MoE experts'
// slices; the MTP module's eh_proj by columns) and cache the latent rows, kv_lora_rank +
// qk_rope_head_dim wide, replicated on every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/communicator.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/dtype.h"
#include "eagle3/eagle3_draft_config.h"
#include "eagle3/export.h"
#include "eagle3/hidden_state_tap.h"
#include "eagle3/mla_draft_config.h"
#include "eagle3/model_rank_options.h"
#include "eagle3/mtp_config.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// The ModelRankOptions fields: max_context_len is also the RoPE table's length; weight_dtype covers
// every Gemm weight of the layer (fc, q/k/v (merged), o_proj, gate_up, down; the MLA kinds' q_a /
// q_b / q_proj, kv_a, kv_b, o_proj, eh_proj and expert weights), lm_head and the embedding (the
// draft's own or the target's it borrows), while fc.bias and the norms stay f32; the MTP router
// follows the target's rule (bf16 where weight_dtype and its stored dtype are bf16, else f32, its
// logits fp32 products of unrounded activations: TargetModelOptions).
struct DraftModelOptions : ModelRankOptions {
  // How the draft config's eagle_aux_hidden_state_layer_ids are read (SpecForge/SGLang: output of
  // layer k).
  LayerIdConvention convention = LayerIdConvention::kOutputOfLayer;
  // When set, these aux layer ids replace the config's eagle_aux_hidden_state_layer_ids (read under
  // `convention`, in concatenation order): a deliberate rewiring, to measure what a wrong tap costs
  // (eagle3-decode / eagle3-inspect accuracy --aux-layers). Checked like the config's ids: in range,
  // distinct boundaries, and as many taps as fc's input width needs.
  std::optional<std::vector<int>> aux_layer_ids_override;
};

// Which draft a DraftModel runs (see the file comment).
enum class DraftKind { kLlama, kMla, kMtp };

// The sizes every kind of draft has, which the engines that run a DraftModel read (SpeculativeStep,
// Eagle3Drafter, the tools); each kind's own config stays available from DraftModel.
struct DraftShape {
  int64_t hidden_size = 0;   // H: a fed-back hidden row (hidden_out; a later step's input)
  int64_t input_width = 0;   // a first step's input row (from_target): tap().width()
  int64_t vocab_size = 0;    // the target vocabulary: token ids are in [0, vocab_size)
  int64_t draft_vocab = 0;   // logits columns; draft id -> target id through d2t()
  int64_t kv_row_width = 0;  // one row of this rank's draft KV cache, f32 elements
};

// One sequence of a draft Forward. Its draft KV cache holds `cache_len` rows; the n new rows are
// written to slots cache_len .. cache_len + n - 1.
struct DraftSequenceInput {
  std::span<const int64_t> tokens;      // [n] target vocabulary ids (the token at p + 1 for row p)
  std::span<const int64_t> positions;   // [n] RoPE positions in [0, max_context_len); empty = cache_len + i
  std::span<const int32_t> page_table;  // pages of this sequence's draft cache; covers cache_len + n
  int64_t cache_len = 0;
  // Empty = causal over everything cached. Else [n, cache_len + n] row-major: mask[i * (cache_len
  // + n) + j] != 0 iff row i attends slot j (tree steps attend the context and their ancestors).
  // Row i must attend its own slot cache_len + i and no later new row (slot > cache_len + i).
  std::span<const uint8_t> mask;
  bool all_logits = false;  // logits for every row, or only the last
};

// The floating-point tensors of an EAGLE-3 draft checkpoint that `config` requires, with their full
// shapes and TP splits (SpecForge / SGLang names; `layer_prefix` is "midlayer." or "layers.0."):
// fc.weight, input_norm.weight (norm_before_fc) or fc_norm.{i}.weight (fc_norm), the layer's
// input_layernorm, hidden_norm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
// mlp.{gate,up,down}_proj, then norm.weight and lm_head.weight (absent when tie_word_embeddings).
// Not listed, handled by the loader: d2t (i64 [draft_vocab], required), t2d (bool [vocab], optional),
// fc.bias ([H], optional), embed_tokens.weight ([vocab, H], optional: the target's embedding
// otherwise).
EAGLE3_API std::vector<WeightSpec> Eagle3DraftWeights(const Eagle3DraftConfig& config,
                                                      std::string_view layer_prefix = "midlayer.");

// Device-side inputs and outputs of a staged draft step (as TargetStepIO): a set view replaces what
// Stage stages from the batch, or what Launch would copy into host staging. Every view is on the
// backend's device and contiguous; an empty (default) view keeps the host path. T = the staged rows.
struct DraftStepIO {
  // [T] i64 target-vocabulary ids (a device-built tree frontier, say); the batch's tokens then only
  // stand in for them in the host checks. The caller guarantees ids in [0, vocab_size).
  TensorView tokens;
  // [T, width] f32: the input rows (from_target: the tapped target states; else fed-back hidden).
  // Stage's `hidden` argument is then unused (pass an empty view).
  TensorView hidden;
  // [T, max_context_len] u8: attention mask rows (BatchedPagedAttention's, over each sequence's
  // slots); the batch's masks are then unused. Columns at or past a row's kv length are never read.
  // Unset with no batch masks: causal, computed on the device (no mask rows are staged).
  TensorView mask;
  // The rest of a step's metadata on the device, for a caller that issues several draft steps
  // without waiting (the staging buffers hold one step's inputs): with all five set, Launch copies
  // nothing from the host. Each replaces what Stage derives from the batch (which must describe
  // the same step: its checks run on the batch). Kept as given; not checked against the batch.
  TensorView positions;    // [T] i64 RoPE positions
  TensorView slots;        // [T] i64: row p of the flat cache, page_table[p / page_size] * page_size + p % page_size
  TensorView page_tables;  // [B, P] i32, P <= ceil(max_context_len / page_size), entries as the batch's
  TensorView q_start;      // [B + 1] i32: first row of each sequence, then T
  TensorView kv_len;       // [B] i32: cache_len + n of each sequence
  // [B] i32, only with every sequence bringing the same number n of rows: the row (in [0, n), local
  // to its sequence) whose logits are computed; replaces all_logits (then one logits row per
  // sequence). A row outside [0, n) is InvalidArgument at the next Synchronize on a device backend.
  TensorView logit_rows;
  // [LogitRows, draft_vocab] f32: the logits stay here (Finish takes an empty logits view).
  TensorView logits;
  // [T, shape().hidden_size] f32: hidden_out stays here (Finish takes an empty hidden_out view).
  TensorView hidden_out;
  // Only the rows' KV cache entries: the layer's input (fc, the norms; eh_proj for kMtp), the KV
  // projection (q/k/v; the latent row of the MLA kinds), RoPE and the cache write (bit for bit what a
  // full step writes), then nothing else: no attention, MLP, hidden or logits (logits, hidden_out and
  // logit_rows must be empty; there is nothing to Finish). A step that only keeps the draft's cache
  // in sync with the target, as SpeculativeStep's steps that draft nothing do.
  bool kv_only = false;
};

class EAGLE3_API DraftModel {
 public:
  // Loads the draft (config.json + safetensors: fc, midlayer.* or layers.0.*, norm, lm_head, d2t,
  // optional t2d and embed_tokens) and checks it against the target's config; the embedding is the
  // target's (vocab-parallel shard of `model.embed_tokens.weight` read from `target_dir`) unless the
  // draft ships its own. Everything is validated before the model exists: config against target
  // (hidden and vocab sizes, aux layer ids, fc width), TP divisibility, every tensor's presence and
  // shape (messages name the tensor, expected and actual shape), tensors the config does not
  // account for (refused, e.g. input_norm.weight without norm_before_fc), d2t's range (every
  // draft + d2t[draft] in [0, vocab), no target id twice) and t2d's agreement with d2t.
  // `communicator` may be null when tp_size == 1. `backend` must outlive the model.
  //
  // The kind follows the draft's config.json `architectures` (NamesMlaDraftArchitecture, as
  // CheckDraftPair decides): an MLA EAGLE-3 head (Eagle3DeepseekV2ForCausalLM /
  // Eagle3DeepseekV3ForCausalLM) is loaded as DraftKind::kMla with the same checks
  // (CheckMlaDraftWeights: layer prefix, every shape and dtype, the embedding it shares, d2t / t2d),
  // anything else as the Llama-style head.
  static absl::StatusOr<std::unique_ptr<DraftModel>> Create(const std::string& draft_dir,
                                                            const std::string& target_dir,
                                                            const DraftModelOptions& options,
                                                            Communicator* communicator, Backend* backend);
  // Loads MTP module 0 of the target's own checkpoint as a draft (DraftKind::kMtp; every draft step
  // runs that module, as the engines do with DeepSeek-V3's one module). Checked first: the config
  // states num_nextn_predict_layers (MtpConfig::FromTarget), the checkpoint holds the module in its
  // stored forms (CheckMtpWeights: a checkpoint without it is NotFound naming its first tensor), the
  // target splits over tp_size (DeepseekV2Config::ValidateForTp) and 2 * hidden_size divides by it
  // (eh_proj is split by columns). The module reads the target's final normed hidden
  // (tap() is HiddenStateTap::FinalNormed), so options.aux_layer_ids_override must be unset.
  static absl::StatusOr<std::unique_ptr<DraftModel>> CreateMtp(const std::string& target_dir,
                                                               const DraftModelOptions& options,
                                                               Communicator* communicator, Backend* backend);
  ~DraftModel();

  DraftKind kind() const;
  const DraftShape& shape() const;
  // The Llama-style head's config (kind() == kLlama); a default-constructed one for the other
  // kinds, whose configs are mla_config() and mtp_config(): read shape() for the sizes every kind
  // has.
  const Eagle3DraftConfig& config() const;
  const MlaDraftConfig* mla_config() const;  // kMla only, else null
  const MtpConfig* mtp_config() const;       // kMtp only, else null
  const DraftModelOptions& options() const;
  const HiddenStateTap& tap() const;       // the target tensors this draft reads first
  int64_t draft_vocab() const;
  std::span<const int64_t> d2t() const;    // [draft_vocab] offsets, validated at load (zeros: kMtp)

  static int64_t LogitRows(std::span<const DraftSequenceInput> batch);

  // One draft pass over the rows of `batch` (concatenated in order): writes the new rows' K/V to the
  // draft cache and returns logits and the hidden to feed back.
  //   hidden:     from_target ? [T, tap().width()] (aux) : [T, shape().hidden_size] (fed-back
  //               hidden_out), f32, host, contiguous
  //   logits:     [LogitRows(batch), draft_vocab], f32, host, contiguous
  //   hidden_out: [T, shape().hidden_size], f32, host, contiguous: every row's hidden to feed back
  //               (the un-normalized r, or norm(r) with norm_output; kMtp: shared_head.norm(r)).
  //               May be `hidden` itself.
  // Inputs are validated before anything is written (token ids in [0, vocab_size), positions,
  // page tables, capacity, masks, shapes): InvalidArgument / OutOfRange, cache unchanged.
  absl::Status Forward(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target,
                       const TensorView& logits, const TensorView& hidden_out);

  // Forward in three steps, for engines that capture the device work of a draft step in a CUDA graph
  // (eagle3/cuda/cuda_graph.h) and replay it, as TargetModel's Stage / Launch / Finish:
  //  - Stage validates `batch` and `hidden` as Forward does and writes the step's inputs (token ids,
  //    RoPE positions, cache slots, page tables, q_start / kv_len, the [T, max_context_len] mask
  //    rows, and the hidden rows) into the model's host staging buffers
  //    (Backend::staging_allocator(): pinned on CUDA). Host only: nothing is enqueued, and neither
  //    `batch` nor `hidden` is read after Stage returns.
  //  - Launch enqueues the whole step: copies of the staging buffers to the device, one PagedWrite
  //    of every new KV row, one batched attention over every sequence (BatchedPagedAttention; an
  //    MLA kind's BatchedLatentAttention, or BatchedLatentAttentionKeyMask when the step has mask
  //    rows), the MLP, and the logits and hidden_out into host staging. It never allocates, never
  //    waits and reads no staged value on the host, so a capture of it replays correctly for any
  //    later Stage with an equal StepSignature() (same from_target, sequence count, rows per
  //    sequence and all_logits flags; tokens, positions, cache lengths, pages, masks and hidden
  //    rows may all differ). Capture after one eager step of
  //    the same signature (first calls size the backend's scratch). Collectives must be capturable.
  //  - Finish waits for the backend, reports deferred device errors, and copies the logits and
  //    hidden_out (shapes as in Forward, against the staged batch) out.
  // Forward(batch, hidden, from_target, logits, hidden_out) == Stage + Launch + Finish.
  absl::Status Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target);
  // Stage with device-side inputs and outputs (see DraftStepIO; checked here, InvalidArgument naming
  // the view). The views are part of StepSignature().
  absl::Status Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target,
                     const DraftStepIO& io);
  absl::Status Launch();
  absl::Status Finish(const TensorView& logits, const TensorView& hidden_out);
  // What Launch's enqueued work depends on, for the staged batch (empty when nothing is staged).
  std::vector<int64_t> StepSignature() const;
  // Whether a batch is staged: every draft step takes the capturable path.
  bool StepIsCapturable() const;

 private:
  struct Impl;
  explicit DraftModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace eagle3
