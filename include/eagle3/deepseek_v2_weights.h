// The tensors of a DeepSeek-V2-family checkpoint: hub names, full shapes, and how tensor
// parallelism splits each one (docs/architecture.md, tensor parallelism). The loader, the checkpoint checker and
// the random-checkpoint generator all read this one table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/export.h"
#include "eagle3/shape.h"

namespace eagle3 {

enum class TpSplit {
  kReplicated,  // every rank holds the whole tensor (norms, q_a/kv_a, router)
  kRows,        // column-parallel [out, in] split on out; vocab tables
  kColumns,     // row-parallel [out, in] split on in (o_proj, down_proj)
};

struct EAGLE3_API WeightSpec {
  std::string name;  // hub spelling, e.g. "model.layers.3.mlp.experts.17.down_proj.weight"
  Shape shape;       // full (unsharded) shape
  TpSplit split = TpSplit::kReplicated;
  // Split dim zero-padded to a multiple of this before splitting: 64 * tp for the vocab-parallel
  // embedding and lm_head, 1 elsewhere (those dims must divide evenly; ValidateForTp checks).
  bool vocab_padded = false;

  // The slice rank `rank` of `tp_size` reads.
  ShardSpec ForRank(int tp_size, int rank) const;
  // The shape of every rank's slice at `tp_size` (1..64), as Checkpoint::ReadShard of ForRank gives
  // it: the full shape for a replicated tensor, else the split dim (vocab-padded first, at TP 1
  // too) divided by tp_size. InvalidArgument naming the tensor
  // when that dim does not divide evenly.
  absl::StatusOr<Shape> RankShape(int tp_size) const;
};

// Rows of the vocab-parallel tables are padded to a multiple of this per rank (64 · tp in total),
// as SGLang and vLLM pad them.
inline constexpr int64_t kVocabPadPerRank = 64;

// Every tensor of the model, in layer order: embedding, then per layer DeepseekDecoderLayerWeights,
// then the final norm and lm_head (absent when tie_word_embeddings). MTP layers
// (num_nextn_predict_layers) are not part of the target forward and are not listed (MtpWeights,
// mtp_weights.h, lists them).
// Every name carries config.tensor_prefix ("language_model." for Kimi-K2.5): this is the one place
// the checkpoint's naming of the language model is decided.
EAGLE3_API std::vector<WeightSpec> DeepseekV2Weights(const DeepseekV2Config& config);

// The tensors of decoder layer `layer`, named "<tensor_prefix>model.layers.<layer>.", in the order
// the loaders take them: input_layernorm, post_attention_layernorm, the attention
// (MlaAttentionWeights of MlaAttentionConfig::ForTarget under "self_attn.") and the MLP under
// "mlp." (IsMoeLayer(layer): router gate [+ e_score_correction_bias for noaux_tc], per-expert
// gate/up/down, shared experts; else the dense SiluMlpWeights). `layer` may be past the main layers:
// an MTP module's decoder layer (num_hidden_layers + k) is described by this same function, so the
// two cannot drift apart.
EAGLE3_API std::vector<WeightSpec> DeepseekDecoderLayerWeights(const DeepseekV2Config& config, int64_t layer);

// One SiLU MLP under `prefix` ("model.layers.0.mlp.", "layers.0.mlp."): gate_proj and up_proj
// [intermediate, hidden] split by rows (column-parallel), down_proj [hidden, intermediate] split by
// columns (row-parallel, reduced after), appended to `specs`.
EAGLE3_API void AppendSiluMlpWeights(std::string_view prefix, int64_t hidden, int64_t intermediate,
                                     std::vector<WeightSpec>& specs);

// One DeepSeek MoE block under `prefix` ("model.layers.3.mlp."): the router `gate.weight`
// [experts, hidden] (and `gate.e_score_correction_bias` [experts] when `correction_bias`),
// replicated; each routed expert `experts.{e}.` a SiLU MLP of `moe_intermediate`; the shared experts
// `shared_experts.` one SiLU MLP of moe_intermediate x shared_experts (none when 0). Appended to
// `specs`. The one list of a MoE layer's tensors: the weight schema and the block that loads them
// both read it.
EAGLE3_API void AppendMoeWeights(std::string_view prefix, int64_t hidden, int64_t experts,
                                 int64_t moe_intermediate, int64_t shared_experts, bool correction_bias,
                                 std::vector<WeightSpec>& specs);

// The target's token embedding as its checkpoint names it (the first of DeepseekV2Weights), which
// an EAGLE-3 draft without its own embedding shares.
EAGLE3_API std::string DeepseekEmbeddingName(const DeepseekV2Config& config);

// A checkpoint tensor name without config.tensor_prefix: the text model's hub spelling
// ("model.layers.3.mlp.gate.weight", "lm_head.weight") that compressed-tensors' ignore list and MTP
// layer numbering refer to. Empty when `name` lacks the prefix (not a language-model tensor).
EAGLE3_API std::string_view TextModelTensorName(std::string_view name, const DeepseekV2Config& config);

// Refuses a checkpoint holding a tensor that `specs` (DeepseekV2Weights(config)) does not list,
// each spec counted with the tensors it is stored as under config.quantization (its scales and
// packing, eagle3/detail/quantized_weights.h): an unused bias, a `weight_scale_inv` of an FP8
// checkpoint whose config.json lost its quantization_config (it would otherwise run without its
// scales), a misspelled name. The deliberate exceptions: tensors of MTP layers (`model.layers.<k>.*`
// with num_hidden_layers <= k < num_hidden_layers + num_nextn_predict_layers), which real
// DeepSeek-V3 checkpoints carry for the MTP drafter (CheckMtpWeights, mtp_weights.h, checks them),
// and in Kimi-K2.5's multimodal form the
// vision tower and projector (`vision_tower.*`, `mm_projector.*`), which eagle3 does not run.
// InvalidArgument names the first unknown tensor, its file, the config, how many more there are,
// and for `*weight_scale_inv`, `*weight_scale` and `*weight_packed` names a hint that the
// checkpoint looks quantized.
EAGLE3_API absl::Status CheckNoUnknownTensors(const Checkpoint& checkpoint, const DeepseekV2Config& config,
                                              const std::vector<WeightSpec>& specs);

}  // namespace eagle3
