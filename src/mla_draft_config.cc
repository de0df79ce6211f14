#include "eagle3/mla_draft_config.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "eagle3_head_json.h"
#include "json_fields.h"
#include "mla_attention_config_json.h"
#include "pretrained_config_keys.h"
#include "rope_config_json.h"

namespace eagle3 {
namespace {

using json_fields::IsOneOf;
using json_fields::Object;
using json_fields::Sv;

constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 40;

// vLLM registers both names for the one model (deepseek_eagle3.py); TorchSpec, SGLang and ModelOpt
// write the first.
constexpr std::string_view kMlaArchitectures[] = {"Eagle3DeepseekV2ForCausalLM",
                                                  "Eagle3DeepseekV3ForCausalLM"};
// EAGLE-3 heads with a Llama decoder layer: Eagle3DraftConfig reads them.
constexpr std::string_view kLlamaArchitectures[] = {"LlamaForCausalLMEagle3",
                                                    "Eagle3LlamaForCausalLM"};

constexpr std::string_view kParsedKeys[] = {
    "architectures",
    "model_type",
    "hidden_size",
    "target_hidden_size",
    "intermediate_size",
    "vocab_size",
    "draft_vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "head_dim",         // transformers 5 saves head_dim = qk_rope_head_dim
    "qk_head_dim",      // transformers' V3 class saves qk_nope_head_dim + qk_rope_head_dim
    "rope_interleave",  // transformers' V3 class: true = adjacent pairs
    "mla_use_nope",     // TorchSpec's Kimi-K3 drafts (RoPE-free MLA)
    "rms_norm_eps",
    "max_position_embeddings",
    "num_hidden_layers",
    "hidden_act",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "bias",     // SGLang's fc bias switch
    "use_moe",  // TorchSpec's MoE variant of the draft layer
    "eagle_config",
    eagle3_head::kAuxIdsKey,
    "num_aux_hidden_states",
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "use_aux_norm",  // SGLang's older spelling of fc_norm
    "norm_output",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
};
// Keys with no effect on inference math: bookkeeping, dtype hints, training-only settings.
constexpr std::string_view kHarmlessKeys[] = {
    "_name_or_path",        "auto_map",           "torch_dtype",       "dtype",
    "transformers_version", "_torchspec_version", "initializer_range", "use_cache",
    "pretraining_tp",       "attention_dropout",  "train_router",
};
// The target's MoE and MTP keys. ModelOpt's Kimi-K2 export template copies them into the draft's
// config; vLLM ("Always use MLP (not MoE) for Eagle3"), SGLang and ATOM build the draft layer with
// a dense MLP regardless. They only mean something together with use_moe, which is refused.
constexpr std::string_view kInertTargetKeys[] = {
    "n_routed_experts",
    "n_shared_experts",
    "moe_intermediate_size",
    "num_experts_per_tok",
    "moe_layer_freq",
    "first_k_dense_replace",
    "n_group",
    "topk_group",
    "topk_method",
    "scoring_func",
    "routed_scaling_factor",
    "norm_topk_prob",
    "aux_loss_alpha",
    "seq_aux",
    "ep_size",
    "num_nextn_predict_layers",
};
// eagle_config keys ModelOpt writes next to the common ones (hf_spec_export.py templates); each is
// accepted only with the value that describes a plain EAGLE-3 head (CheckModelOptFlags).
constexpr std::string_view kModelOptEagleKeys[] = {
    "use_input_layernorm_in_first_layer",
    "use_last_layernorm",
    "use_mtp_layernorm",
    "next_layer_regular",
    "parallel_draft_step",
    "parallel_draft_heads_num_layers",
};

absl::StatusOr<std::string> ParseArchitecture(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(const std::string name, eagle3_head::SingleArchitecture(root));
  if (IsOneOf(name, kMlaArchitectures)) return name;
  if (IsOneOf(name, kLlamaArchitectures)) {
    return root.Error(absl::StatusCode::kInvalidArgument, "architectures",
                      absl::StrCat("'", name,
                                   "' is a Llama-style EAGLE-3 head, not an MLA draft; read it "
                                   "with Eagle3DraftConfig"));
  }
  return root.Error(absl::StatusCode::kInvalidArgument, "architectures",
                    absl::StrCat("'", name,
                                 "' is not an MLA EAGLE-3 draft (expected "
                                 "Eagle3DeepseekV2ForCausalLM or Eagle3DeepseekV3ForCausalLM)"));
}

absl::StatusOr<DeepseekModelType> ParseModelType(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(std::string name, root.String("model_type"));
  if (std::optional<DeepseekModelType> type = DeepseekModelTypeFromName(name)) return *type;
  return root.Error(absl::StatusCode::kInvalidArgument, "model_type",
                    absl::StrCat("'", name,
                                 "' is not a DeepSeek-family model type (expected deepseek_v2, "
                                 "deepseek_v3 or kimi_k2: engines take the MLA path by it)"));
}

// A boolean key that eagle3 implements only at one value; absent or null means that value.
absl::Status RequireFlag(const Object& object, std::string_view key, bool implemented,
                         std::string_view why) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> value, object.OptionalBool(key));
  if (!value.has_value() || *value == implemented) return absl::OkStatus();
  return object.Error(absl::StatusCode::kUnimplemented, key,
                      absl::StrCat(*value ? "true" : "false", " is not supported: ", Sv(why)));
}

absl::Status CheckModelOptFlags(const Object& eagle) {
  EAGLE3_RETURN_IF_ERROR(RequireFlag(
      eagle, "use_input_layernorm_in_first_layer", true,
      "an EAGLE-3 layer normalizes the embedding (input_layernorm) before the concatenation"));
  EAGLE3_RETURN_IF_ERROR(RequireFlag(eagle, "use_last_layernorm", true,
                                     "an EAGLE-3 head applies its final norm before lm_head"));
  EAGLE3_RETURN_IF_ERROR(RequireFlag(
      eagle, "use_mtp_layernorm", false,
      "ModelOpt's MTP-style layernorms are not part of the EAGLE-3 layer the engines run"));
  EAGLE3_RETURN_IF_ERROR(RequireFlag(eagle, "next_layer_regular", true,
                                     "eagle3 implements the value ModelOpt's export writes"));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> parallel,
                          eagle.OptionalInt("parallel_draft_step", 1, kMaxDim));
  if (parallel.value_or(1) != 1) {
    return eagle.Error(absl::StatusCode::kUnimplemented, "parallel_draft_step",
                       absl::StrCat(*parallel,
                                    " is not supported: parallel draft heads (EAGLE-Medusa) are "
                                    "not run; only 1 (one token per draft step)"));
  }
  // Sizes the parallel heads, which parallel_draft_step = 1 does not build.
  return eagle.OptionalInt("parallel_draft_heads_num_layers", 0, kMaxDim).status();
}

absl::Status CheckFixedSemantics(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> act, root.OptionalString("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return root.Error(absl::StatusCode::kUnimplemented, "hidden_act",
                      absl::StrCat("'", *act, "' is not supported (only silu)"));
  }
  for (std::string_view key : {"attention_bias", "mlp_bias", "bias"}) {
    EAGLE3_RETURN_IF_ERROR(RequireFlag(
        root, key, false, "the MLA EAGLE-3 draft has no biases (fc, attention and MLP)"));
  }
  EAGLE3_RETURN_IF_ERROR(
      RequireFlag(root, "rope_interleave", true, "MLA rotates adjacent pairs of the rope dims"));
  EAGLE3_RETURN_IF_ERROR(RequireFlag(
      root, "mla_use_nope", false,
      "RoPE-free MLA (Kimi-K3 drafts) is not implemented; eagle3 rotates the rope dims"));
  EAGLE3_RETURN_IF_ERROR(RequireFlag(
      root, "use_moe", false,
      "a MoE draft layer (TorchSpec's kimi_k25_eagle3_moe) is run by no engine; eagle3 runs the "
      "dense MLP"));
  return absl::OkStatus();
}

absl::Status ParseMla(const Object& root, MlaDraftConfig& c) {
  EAGLE3_ASSIGN_OR_RETURN(c.num_attention_heads, root.Int("num_attention_heads", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                          root.OptionalInt("num_key_value_heads", 1, kMaxDim));
  c.num_key_value_heads = kv_heads.value_or(c.num_attention_heads);
  MlaAttentionConfig mla;
  EAGLE3_RETURN_IF_ERROR(ParseMlaKeys(root, mla));
  CopyMlaKeys(mla, c);
  return CheckMlaCopiedKeys(root, mla);
}

absl::Status ParseShape(const Object& root, MlaDraftConfig& c) {
  EAGLE3_ASSIGN_OR_RETURN(c.hidden_size, root.Int("hidden_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> target_hidden,
                          root.OptionalInt("target_hidden_size", 1, kMaxDim));
  c.target_hidden_size = target_hidden.value_or(c.hidden_size);
  EAGLE3_ASSIGN_OR_RETURN(c.intermediate_size, root.Int("intermediate_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(c.vocab_size, root.Int("vocab_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> draft_vocab,
                          root.OptionalInt("draft_vocab_size", 1, kMaxDim));
  c.draft_vocab_size_stated = draft_vocab.has_value();
  c.draft_vocab_size = draft_vocab.value_or(c.vocab_size);
  if (c.draft_vocab_size > c.vocab_size) {
    return root.Error(absl::StatusCode::kInvalidArgument, "draft_vocab_size",
                      absl::StrCat(c.draft_vocab_size, " exceeds vocab_size = ", c.vocab_size));
  }
  EAGLE3_ASSIGN_OR_RETURN(c.num_hidden_layers, root.Int("num_hidden_layers", 1, kMaxDim));
  if (c.num_hidden_layers != 1) {
    return root.Error(absl::StatusCode::kUnimplemented, "num_hidden_layers",
                      absl::StrCat(c.num_hidden_layers,
                                   " is not supported; vLLM, SGLang and eagle3 run single-layer "
                                   "MLA EAGLE-3 heads"));
  }
  return ParseMla(root, c);
}

// fc_norm and SGLang's older `use_aux_norm` name one switch (SGLang: fc_norm or use_aux_norm).
// Either alone sets it; written both, they must agree.
absl::StatusOr<bool> ParseFcNorm(const Object& root, const std::optional<Object>& eagle) {
  EAGLE3_ASSIGN_OR_RETURN(bool fc_norm, eagle3_head::VariantFlag(root, eagle, "fc_norm"));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> aux_norm, root.OptionalBool("use_aux_norm"));
  const bool fc_norm_stated =
      root.HasValue("fc_norm") || (eagle.has_value() && eagle->HasValue("fc_norm"));
  if (aux_norm.has_value() && !fc_norm_stated) return *aux_norm;
  if (aux_norm.has_value() && *aux_norm != fc_norm) {
    return root.Error(absl::StatusCode::kInvalidArgument, "use_aux_norm",
                      absl::StrCat(*aux_norm ? "true" : "false",
                                   " disagrees with fc_norm = ", fc_norm ? "true" : "false",
                                   " (SGLang reads them as one switch)"));
  }
  return fc_norm;
}

absl::Status ParseAux(const Object& root, const std::optional<Object>& eagle, MlaDraftConfig& c) {
  EAGLE3_ASSIGN_OR_RETURN(c.aux_layer_ids, eagle3_head::ParseAuxLayerIds(root, eagle));
  EAGLE3_ASSIGN_OR_RETURN(c.num_aux_hidden_states,
                          root.OptionalInt("num_aux_hidden_states", 1, kMaxDim));
  if (c.num_aux_hidden_states.has_value() && c.aux_layer_ids.has_value() &&
      *c.num_aux_hidden_states != static_cast<int64_t>(c.aux_layer_ids->size())) {
    return root.Error(
        absl::StatusCode::kInvalidArgument, "num_aux_hidden_states",
        absl::StrCat(*c.num_aux_hidden_states, " differs from the ", c.aux_layer_ids->size(),
                     " ids of ", Sv(eagle3_head::kAuxIdsKey)));
  }
  return absl::OkStatus();
}

absl::StatusOr<MlaDraftConfig> Parse(const Object& root) {
  MlaDraftConfig c;
  c.source = std::string(Sv(root.source()));
  EAGLE3_ASSIGN_OR_RETURN(c.architecture, ParseArchitecture(root));
  EAGLE3_RETURN_IF_ERROR(root.CheckKnownKeys({kParsedKeys, kHarmlessKeys, kRopeConfigKeys,
                                              kInertTargetKeys, kGenericPretrainedConfigKeys}));
  EAGLE3_ASSIGN_OR_RETURN(c.model_type, ParseModelType(root));
  // First: a draft of another kind (MoE layer, RoPE-free MLA) is named as such, not by whatever
  // shape key it happens to lack.
  EAGLE3_RETURN_IF_ERROR(CheckFixedSemantics(root));
  EAGLE3_RETURN_IF_ERROR(ParseShape(root, c));

  EAGLE3_ASSIGN_OR_RETURN(c.rms_norm_eps, root.Double("rms_norm_eps"));
  if (!(c.rms_norm_eps > 0)) {
    return root.Error(absl::StatusCode::kInvalidArgument, "rms_norm_eps",
                      absl::StrCat(c.rms_norm_eps, " must be > 0"));
  }
  EAGLE3_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          root.Int("max_position_embeddings", 1, kMaxPositions));
  EAGLE3_ASSIGN_OR_RETURN(c.rope, ParseRopeConfig(root, /*default_theta=*/10000.0));
  EAGLE3_RETURN_IF_ERROR(c.attention().ValidateSoftmaxScale(c.source));

  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> tie, root.OptionalBool("tie_word_embeddings"));
  c.tie_word_embeddings = tie.value_or(false);
  // A tied lm_head is the embedding, which has vocab_size rows, not draft_vocab_size.
  if (c.tie_word_embeddings && c.draft_vocab_size != c.vocab_size) {
    return root.Error(absl::StatusCode::kInvalidArgument, "tie_word_embeddings",
                      absl::StrCat("true needs draft_vocab_size (", c.draft_vocab_size,
                                   ") == vocab_size (", c.vocab_size, ")"));
  }
  const int64_t last = c.vocab_size - 1;
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("bos_token_id", 0, last).status());
  EAGLE3_RETURN_IF_ERROR(root.IntOrIntArray("eos_token_id", 0, last).status());
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("pad_token_id", -1, last).status());

  EAGLE3_ASSIGN_OR_RETURN(std::optional<Object> eagle, root.OptionalSubObject("eagle_config"));
  EAGLE3_RETURN_IF_ERROR(
      eagle3_head::CheckEagleConfig(eagle, {eagle3_head::kEagleConfigKeys, kModelOptEagleKeys}));
  if (eagle.has_value()) EAGLE3_RETURN_IF_ERROR(CheckModelOptFlags(*eagle));
  EAGLE3_RETURN_IF_ERROR(ParseAux(root, eagle, c));
  EAGLE3_ASSIGN_OR_RETURN(c.norm_before_residual,
                          eagle3_head::VariantFlag(root, eagle, "norm_before_residual"));
  EAGLE3_ASSIGN_OR_RETURN(c.fc_norm, ParseFcNorm(root, eagle));
  EAGLE3_ASSIGN_OR_RETURN(c.norm_output, eagle3_head::VariantFlag(root, eagle, "norm_output"));
  // Read like the other variant flags (top level or eagle_config), then refused when set.
  EAGLE3_ASSIGN_OR_RETURN(bool norm_before_fc,
                          eagle3_head::VariantFlag(root, eagle, "norm_before_fc"));
  if (norm_before_fc) {
    return root.Error(absl::StatusCode::kUnimplemented, "norm_before_fc",
                      "true (at the top level or in eagle_config) is not supported: no engine "
                      "defines an input norm over the concatenated taps for the MLA draft (vLLM "
                      "and SGLang read fc_norm only)");
  }
  return c;
}

}  // namespace

absl::StatusOr<MlaDraftConfig> MlaDraftConfig::FromJson(std::string_view json_text,
                                                        std::string_view source) {
  EAGLE3_ASSIGN_OR_RETURN(nlohmann::json document,
                          json_fields::ParseObjectDocument(json_text, source));
  return Parse(Object(document, source, ""));
}

absl::StatusOr<MlaDraftConfig> MlaDraftConfig::FromFile(const std::string& path) {
  std::string resolved;
  EAGLE3_ASSIGN_OR_RETURN(std::string text, json_fields::ReadConfigFile(path, &resolved));
  return FromJson(text, resolved);
}

absl::StatusOr<bool> NamesMlaDraftArchitecture(const std::string& path) {
  std::string resolved;
  EAGLE3_ASSIGN_OR_RETURN(std::string text, json_fields::ReadConfigFile(path, &resolved));
  EAGLE3_ASSIGN_OR_RETURN(nlohmann::json document, json_fields::ParseObjectDocument(text, resolved));
  const auto it = document.find("architectures");
  if (it == document.end() || !it->is_array() || it->size() != 1 || !(*it)[0].is_string()) return false;
  return IsOneOf((*it)[0].get<std::string>(), kMlaArchitectures);
}

int64_t MlaDraftConfig::num_aux_layers() const {
  if (aux_layer_ids.has_value()) return static_cast<int64_t>(aux_layer_ids->size());
  return num_aux_hidden_states.value_or(3);
}

MlaAttentionConfig MlaDraftConfig::attention() const {
  MlaAttentionConfig a;
  a.input_width = 2 * hidden_size;
  a.output_width = hidden_size;
  a.num_heads = num_attention_heads;
  a.q_lora_rank = q_lora_rank;
  a.kv_lora_rank = kv_lora_rank;
  a.qk_nope_head_dim = qk_nope_head_dim;
  a.qk_rope_head_dim = qk_rope_head_dim;
  a.v_head_dim = v_head_dim;
  a.rms_norm_eps = rms_norm_eps;
  a.rope = rope;
  return a;
}

absl::Status MlaDraftConfig::ValidateForTp(int tp_size) const {
  EAGLE3_RETURN_IF_ERROR(attention().ValidateForTp(tp_size, source));
  if (intermediate_size % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(source,
                                                   ": intermediate_size = ", intermediate_size,
                                                   " is not divisible by tp_size ", tp_size));
  }
  return absl::OkStatus();
}

absl::Status CheckDraftAgainstTarget(const MlaDraftConfig& draft, const DeepseekV2Config& target) {
  EAGLE3_RETURN_IF_ERROR(eagle3_head::CheckHeadAgainstTarget(
      draft.source, draft.target_hidden_size, draft.vocab_size, draft.aux_layer_ids, target));
  // Without ids the taps are the default three boundaries; fc must read exactly three.
  if (!draft.aux_layer_ids.has_value() && draft.num_aux_layers() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        draft.source, ": num_aux_hidden_states = ", draft.num_aux_layers(), " but no ",
        Sv(eagle3_head::kAuxIdsKey),
        " name the taps; the default taps are 3 (boundaries 2, L/2, L-3): list the ids"));
  }
  return absl::OkStatus();
}

}  // namespace eagle3
