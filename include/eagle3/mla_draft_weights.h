// The checkpoint tensors of an MLA EAGLE-3 draft (MlaDraftConfig): names, full shapes,
// tensor-parallel splits, and the check that a draft checkpoint holds them (docs/mla_drafts.md,
// "Checkpoint tensors").
//
// Names are top level, the decoder layer under one of two prefixes: "layers.0." (vLLM-format
// exports: TorchSpec --vllm, ModelOpt, the published Kimi-K2.6 EAGLE 3.1 draft) or "midlayer."
// (TorchSpec's native form). vLLM renames midlayer. to layers.0. and SGLang the reverse, so both
// load; DraftLayerPrefix (draft_layer_prefix.h, shared with the Llama-style head) says which one a
// checkpoint uses.
//
// The layer's attention is MlaAttentionWeights of MlaDraftConfig::attention(), the function that
// describes the target's attention, so q_a_proj / kv_a_proj_with_mqa (or q_proj) read the 2H-wide
// [input_layernorm(embed) | hidden_norm(hidden)] row and every split is the target's: q_a, kv_a and
// the norms replicated, q_b / q_proj and kv_b by heads, o_proj by columns. The MLP is the dense SiLU
// MLP of the Llama-style head (rows / columns), fc [H, taps * Ht] and fc_norm replicated (as vLLM's
// ReplicatedLinear), lm_head and the optional embedding vocab-parallel. Draft weights are never
// quantized (a draft config with a quantization_config is refused when read).
//
// Shared with the target: the embedding, unless the checkpoint ships embed_tokens.weight (vLLM's
// rule, which the Llama-style head follows too); nothing else — lm_head, the norms and the layer
// are the draft's own.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/draft_layer_prefix.h"
#include "eagle3/export.h"
#include "eagle3/mla_draft_config.h"

namespace eagle3 {

// The floating-point tensors `draft` requires, in the order a loader takes them (P = layer_prefix):
//   fc.weight [H, taps * Ht] replicated; with fc_norm, fc_norm.{i}.weight [Ht] replicated per tap;
//   P.input_layernorm.weight [H], P.hidden_norm.weight [H] replicated;
//   the attention: MlaAttentionWeights(draft.attention(), P + "self_attn.") (input width 2H);
//   P.post_attention_layernorm.weight [H] replicated;
//   the MLP: AppendSiluMlpWeights(P + "mlp.", H, intermediate_size);
//   norm.weight [H] replicated;
//   lm_head.weight [draft_vocab_size, H] vocab-parallel rows (absent when tie_word_embeddings).
// Optional, not listed: embed_tokens.weight (MlaDraftEmbeddingWeight); d2t (i64 [draft_vocab_size]
// offsets, required when draft_vocab_size < vocab_size) and t2d (bool [vocab_size]), replicated.
EAGLE3_API std::vector<WeightSpec> MlaDraftWeights(const MlaDraftConfig& draft, std::string_view layer_prefix);

// The draft's own embedding, embed_tokens.weight [vocab_size, H], vocab-parallel rows: read when the
// checkpoint has it, the target's otherwise.
EAGLE3_API WeightSpec MlaDraftEmbeddingWeight(const MlaDraftConfig& draft);

// What CheckMlaDraftWeights found.
struct MlaDraftCheckpointLayout {
  std::string layer_prefix;    // kDraftLayersPrefix or kDraftMidlayerPrefix
  bool own_embedding = false;  // embed_tokens.weight present; else the target's embedding is shared
  bool has_d2t = false;
  bool has_t2d = false;
};

// Checks the draft `checkpoint` against `draft` and the `target` it drafts for: the layer prefix
// (DraftLayerPrefix); every tensor of MlaDraftWeights present, F32 / F16 / BF16, of its full
// shape; embed_tokens.weight, when present, [vocab_size, H]; without it, H equal to the target's
// hidden_size (the target's embedding rows are H wide); d2t present when the vocabulary is reduced,
// I64 or I32 [draft_vocab_size]; t2d, when present, BOOL or U8 [vocab_size]; no other tensor. Each
// error names the tensor (its file, the expected and actual shape or dtype): NotFound for a missing
// one, InvalidArgument otherwise. d2t's values (in range, injective, consistent with t2d) are the
// loader's and the pair check's to read.
EAGLE3_API absl::StatusOr<MlaDraftCheckpointLayout> CheckMlaDraftWeights(const Checkpoint& checkpoint,
                                                                         const MlaDraftConfig& draft,
                                                                         const DeepseekV2Config& target);

}  // namespace eagle3
