#include "eagle3/deepseek_v2_config.h"

#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/mla_attention_config.h"
#include "eagle3/status.h"
#include "json_fields.h"
#include "mla_attention_config_json.h"
#include "pretrained_config_keys.h"
#include "quantization_config_json.h"
#include "rope_config_json.h"

namespace eagle3 {
namespace {

using json_fields::Object;
using json_fields::Sv;

// Sanity bound on every size and count: far above any real model, low enough that sums and
// products of a few of them cannot overflow int64.
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 40;
constexpr int kMaxTpSize = 64;

// Keys eagle3 reads. Anything else must be in kHarmlessKeys or parsing fails.
constexpr std::string_view kParsedKeys[] = {
    "model_type",
    "architectures",
    "quantization_config",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "n_routed_experts",
    "moe_intermediate_size",
    "n_shared_experts",
    "num_experts_per_tok",
    "routed_scaling_factor",
    "scoring_func",
    "topk_method",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "first_k_dense_replace",
    "moe_layer_freq",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "head_dim",     // transformers 5 saves head_dim = qk_rope_head_dim
    "qk_head_dim",  // transformers' V3 class saves qk_nope_head_dim + qk_rope_head_dim
    "rope_interleave",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "num_nextn_predict_layers",
};
// Keys with no effect on inference math: bookkeeping, dtype hints and training-only settings.
constexpr std::string_view kHarmlessKeys[] = {
    "_name_or_path",        "auto_map",          "torch_dtype", "dtype",
    "transformers_version", "initializer_range", "use_cache",   "pretraining_tp",
    "aux_loss_alpha",       "seq_aux",           "ep_size",     "attention_dropout",
};

// Kimi-K2.5's multimodal wrapper (model_type "kimi_k25"). Sources: the snapshot's config printed by
// transformers 5.7.0 in a public model report (tests/data/configs/moonshotai_Kimi-K2.5.json, with
// its tensor list), vLLM's KimiK25Config (vllm/transformers_utils/configs/kimi_k25.py: text_config a
// DeepseekV3Config, quantization_config propagated from text_config to the top level) and its
// loader (vllm/model_executor/models/kimi_k25.py), TensorRT-LLM's Kimi-K2.5 unit test config.
constexpr std::string_view kKimiK25Keys[] = {
    "model_type",       "architectures", "text_config",  "quantization_config",
    "vision_config",  // the vision tower and projector: not run by eagle3, so not read
    "bos_token_id",     "eos_token_id",  "pad_token_id", "tie_word_embeddings",
    "media_placeholder_token_id",  // the image/video token: eagle3 takes text only
    "use_unified_vision_chunk",    "video_placeholder",
    "ignore_index",  // training loss only
    "_name_or_path",    "auto_map",      "dtype",        "torch_dtype",
    "transformers_version",
};
absl::StatusOr<DeepseekModelType> ParseModelType(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(std::string name, root.String("model_type"));
  if (std::optional<DeepseekModelType> type = DeepseekModelTypeFromName(name)) return *type;
  return root.Error(absl::StatusCode::kInvalidArgument, "model_type",
                    absl::StrCat("unsupported model_type '", name,
                                 "' (eagle3 reads deepseek_v2, deepseek_v3, kimi_k2, and "
                                 "kimi_k25's text_config)"));
}

absl::StatusOr<ScoringFunc> ParseScoringFunc(const Object& root, DeepseekModelType type) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> name, root.OptionalString("scoring_func"));
  if (!name.has_value()) {
    return type == DeepseekModelType::kDeepseekV2 ? ScoringFunc::kSoftmax : ScoringFunc::kSigmoid;
  }
  for (ScoringFunc f : {ScoringFunc::kSoftmax, ScoringFunc::kSigmoid}) {
    if (*name == ScoringFuncName(f)) return f;
  }
  return root.Error(
      absl::StatusCode::kInvalidArgument, "scoring_func",
      absl::StrCat("unknown scoring_func '", *name, "' (expected softmax or sigmoid)"));
}

absl::StatusOr<TopkMethod> ParseTopkMethod(const Object& root, DeepseekModelType type) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> name, root.OptionalString("topk_method"));
  if (!name.has_value()) {
    return type == DeepseekModelType::kDeepseekV2 ? TopkMethod::kGreedy : TopkMethod::kNoauxTc;
  }
  for (TopkMethod m :
       {TopkMethod::kGreedy, TopkMethod::kGroupLimitedGreedy, TopkMethod::kNoauxTc}) {
    if (*name == TopkMethodName(m)) return m;
  }
  return root.Error(absl::StatusCode::kInvalidArgument, "topk_method",
                    absl::StrCat("unknown topk_method '", *name,
                                 "' (expected greedy, group_limited_greedy or noaux_tc)"));
}

absl::Status ParseMoe(const Object& root, DeepseekV2Config& c) {
  if (!root.Contains("n_routed_experts")) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(root.source()), ": missing required key 'n_routed_experts' (null for a dense model)"));
  }
  EAGLE3_ASSIGN_OR_RETURN(c.n_routed_experts, root.OptionalInt("n_routed_experts", 1, kMaxDim));
  if (!c.is_moe()) return absl::OkStatus();
  const int64_t experts = *c.n_routed_experts;

  EAGLE3_ASSIGN_OR_RETURN(c.moe_intermediate_size, root.Int("moe_intermediate_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(c.num_experts_per_tok, root.Int("num_experts_per_tok", 1, kMaxDim));
  if (c.num_experts_per_tok > experts) {
    return root.Error(absl::StatusCode::kInvalidArgument, "num_experts_per_tok",
                      absl::StrCat(c.num_experts_per_tok, " exceeds n_routed_experts = ", experts));
  }
  if (!root.Contains("n_shared_experts")) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(root.source()), ": missing required key 'n_shared_experts' (null for none)"));
  }
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> shared,
                          root.OptionalInt("n_shared_experts", 0, kMaxDim));
  c.n_shared_experts = shared.value_or(0);
  EAGLE3_ASSIGN_OR_RETURN(c.routed_scaling_factor, root.Double("routed_scaling_factor"));
  if (!(c.routed_scaling_factor > 0)) {
    return root.Error(absl::StatusCode::kInvalidArgument, "routed_scaling_factor",
                      absl::StrCat(c.routed_scaling_factor, " must be > 0"));
  }
  EAGLE3_ASSIGN_OR_RETURN(c.norm_topk_prob, root.Bool("norm_topk_prob"));
  EAGLE3_ASSIGN_OR_RETURN(c.first_k_dense_replace, root.Int("first_k_dense_replace", 0, kMaxDim));
  if (c.first_k_dense_replace > c.num_hidden_layers) {
    return root.Error(absl::StatusCode::kInvalidArgument, "first_k_dense_replace",
                      absl::StrCat(c.first_k_dense_replace,
                                   " exceeds num_hidden_layers = ", c.num_hidden_layers));
  }
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> freq,
                          root.OptionalInt("moe_layer_freq", 1, kMaxDim));
  c.moe_layer_freq = freq.value_or(1);

  EAGLE3_ASSIGN_OR_RETURN(c.scoring_func, ParseScoringFunc(root, c.model_type));
  EAGLE3_ASSIGN_OR_RETURN(c.topk_method, ParseTopkMethod(root, c.model_type));
  const ScoringFunc paired =
      c.topk_method == TopkMethod::kNoauxTc ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  if (c.scoring_func != paired) {
    return root.Error(absl::StatusCode::kUnimplemented, "scoring_func",
                      absl::StrCat("'", Sv(ScoringFuncName(c.scoring_func)), "' with topk_method '",
                                   Sv(TopkMethodName(c.topk_method)),
                                   "' is not implemented (DeepSeek's gates pair softmax with "
                                   "greedy/group_limited_greedy and sigmoid with noaux_tc)"));
  }

  if (c.topk_method == TopkMethod::kGreedy) {
    EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> groups, root.OptionalInt("n_group", 1, kMaxDim));
    EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> topk,
                            root.OptionalInt("topk_group", 1, kMaxDim));
    c.n_group = groups.value_or(1);
    c.topk_group = topk.value_or(1);
  } else {
    EAGLE3_ASSIGN_OR_RETURN(c.n_group, root.Int("n_group", 1, kMaxDim));
    EAGLE3_ASSIGN_OR_RETURN(c.topk_group, root.Int("topk_group", 1, kMaxDim));
  }
  if (c.topk_group > c.n_group) {
    return root.Error(absl::StatusCode::kInvalidArgument, "topk_group",
                      absl::StrCat(c.topk_group, " exceeds n_group = ", c.n_group));
  }
  if (experts % c.n_group != 0) {
    return root.Error(
        absl::StatusCode::kInvalidArgument, "n_group",
        absl::StrCat("n_routed_experts = ", experts, " is not divisible by n_group = ", c.n_group));
  }
  const int64_t per_group = experts / c.n_group;
  if (c.topk_method != TopkMethod::kGreedy && c.num_experts_per_tok > c.topk_group * per_group) {
    return root.Error(
        absl::StatusCode::kInvalidArgument, "num_experts_per_tok",
        absl::StrCat(c.num_experts_per_tok, " exceeds the ", c.topk_group * per_group,
                     " experts in the topk_group = ", c.topk_group, " selected groups"));
  }
  // noaux_tc scores each group by the sum of its top-2 experts.
  if (c.topk_method == TopkMethod::kNoauxTc && per_group < 2) {
    return root.Error(
        absl::StatusCode::kInvalidArgument, "n_group",
        absl::StrCat("noaux_tc needs at least 2 experts per group; n_routed_experts = ", experts,
                     " / n_group = ", c.n_group, " gives ", per_group));
  }
  return absl::OkStatus();
}

// Keys that only restate defaults eagle3 implements; any other value would change the math.
absl::Status CheckFixedSemantics(const Object& root, const DeepseekV2Config& c) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> act, root.OptionalString("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return root.Error(absl::StatusCode::kUnimplemented, "hidden_act",
                      absl::StrCat("'", *act, "' is not supported (only silu)"));
  }
  for (std::string_view key : {"attention_bias", "mlp_bias"}) {
    EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> bias, root.OptionalBool(key));
    if (bias.value_or(false)) {
      return root.Error(absl::StatusCode::kUnimplemented, key,
                        "true is not supported (the DeepSeek family has no biases)");
    }
  }
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> interleave, root.OptionalBool("rope_interleave"));
  if (!interleave.value_or(true)) {
    return root.Error(absl::StatusCode::kUnimplemented, "rope_interleave",
                      "false is not supported (DeepSeek rotates adjacent pairs)");
  }
  return CheckMlaCopiedKeys(root, MlaAttentionConfig::ForTarget(c));
}

// A text model's config: the whole config.json, or K2.5's text_config (`nested_keys` then holds
// the generic keys a nested config carries).
absl::StatusOr<DeepseekV2Config> ParseTextModel(const Object& root,
                                                std::span<const std::string_view> nested_keys) {
  DeepseekV2Config c;
  c.source = std::string(Sv(root.source()));
  EAGLE3_ASSIGN_OR_RETURN(c.model_type, ParseModelType(root));
  EAGLE3_RETURN_IF_ERROR(
      root.CheckKnownKeys({kParsedKeys, kHarmlessKeys, kRopeConfigKeys, nested_keys}));
  EAGLE3_ASSIGN_OR_RETURN(c.quantization, ParseQuantizationConfig(root));
  EAGLE3_RETURN_IF_ERROR(root.OptionalStringArray("architectures").status());

  EAGLE3_ASSIGN_OR_RETURN(c.vocab_size, root.Int("vocab_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(c.hidden_size, root.Int("hidden_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(c.intermediate_size, root.Int("intermediate_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(c.num_hidden_layers, root.Int("num_hidden_layers", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(c.num_attention_heads, root.Int("num_attention_heads", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                          root.OptionalInt("num_key_value_heads", 1, kMaxDim));
  c.num_key_value_heads = kv_heads.value_or(c.num_attention_heads);

  {
    MlaAttentionConfig mla;
    EAGLE3_RETURN_IF_ERROR(ParseMlaKeys(root, mla));
    CopyMlaKeys(mla, c);
  }

  EAGLE3_ASSIGN_OR_RETURN(c.rms_norm_eps, root.Double("rms_norm_eps"));
  if (!(c.rms_norm_eps > 0)) {
    return root.Error(absl::StatusCode::kInvalidArgument, "rms_norm_eps",
                      absl::StrCat(c.rms_norm_eps, " must be > 0"));
  }
  EAGLE3_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          root.Int("max_position_embeddings", 1, kMaxPositions));
  EAGLE3_ASSIGN_OR_RETURN(c.rope, ParseRopeConfig(root, /*default_theta=*/10000.0));

  EAGLE3_RETURN_IF_ERROR(MlaAttentionConfig::ForTarget(c).ValidateSoftmaxScale(root.source()));
  EAGLE3_RETURN_IF_ERROR(ParseMoe(root, c));
  EAGLE3_RETURN_IF_ERROR(CheckFixedSemantics(root, c));

  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> tie, root.OptionalBool("tie_word_embeddings"));
  c.tie_word_embeddings = tie.value_or(false);
  EAGLE3_ASSIGN_OR_RETURN(c.bos_token_id, root.OptionalInt("bos_token_id", 0, c.vocab_size - 1));
  EAGLE3_ASSIGN_OR_RETURN(c.eos_token_ids, root.IntOrIntArray("eos_token_id", 0, c.vocab_size - 1));
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("pad_token_id", -1, c.vocab_size - 1).status());
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> nextn,
                          root.OptionalInt("num_nextn_predict_layers", 0, kMaxDim));
  c.num_nextn_predict_layers = nextn.value_or(0);
  return c;
}

// A top-level key of the K2.5 wrapper that restates one of the text config: equal, or refused.
absl::Status CheckSameAsText(const Object& root, std::string_view key, bool same) {
  if (same) return absl::OkStatus();
  return root.Error(absl::StatusCode::kInvalidArgument, key,
                    absl::StrCat("differs from text_config.", Sv(key)));
}

// Kimi-K2.5: the text backbone from text_config; the vision part is accepted and not read.
absl::StatusOr<DeepseekV2Config> ParseKimiK25(const Object& root) {
  EAGLE3_RETURN_IF_ERROR(root.CheckKnownKeys({kKimiK25Keys}));
  EAGLE3_RETURN_IF_ERROR(root.OptionalStringArray("architectures").status());
  EAGLE3_ASSIGN_OR_RETURN(Object text, root.SubObject("text_config"));
  EAGLE3_ASSIGN_OR_RETURN(DeepseekV2Config c, ParseTextModel(text, kGenericPretrainedConfigKeys));
  c.tensor_prefix = std::string(kKimiK25TensorPrefix);

  // The published file's quantization_config is in text_config; KimiK25Config copies it to the top
  // level, so a saved config may carry it in either place or both.
  if (root.HasValue("quantization_config")) {
    EAGLE3_ASSIGN_OR_RETURN(QuantizationConfig top, ParseQuantizationConfig(root));
    if (text.HasValue("quantization_config")) {
      EAGLE3_RETURN_IF_ERROR(CheckSameAsText(root, "quantization_config", top == c.quantization));
    }
    c.quantization = std::move(top);
  }
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> tie, root.OptionalBool("tie_word_embeddings"));
  if (tie.has_value()) {
    EAGLE3_RETURN_IF_ERROR(CheckSameAsText(root, "tie_word_embeddings", *tie == c.tie_word_embeddings));
  }
  const int64_t last = c.vocab_size - 1;
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> bos, root.OptionalInt("bos_token_id", 0, last));
  if (bos.has_value() && c.bos_token_id.has_value()) {
    EAGLE3_RETURN_IF_ERROR(CheckSameAsText(root, "bos_token_id", bos == c.bos_token_id));
  }
  if (!c.bos_token_id.has_value()) c.bos_token_id = bos;
  EAGLE3_ASSIGN_OR_RETURN(std::vector<int64_t> eos, root.IntOrIntArray("eos_token_id", 0, last));
  if (!eos.empty() && !c.eos_token_ids.empty()) {
    EAGLE3_RETURN_IF_ERROR(CheckSameAsText(root, "eos_token_id", eos == c.eos_token_ids));
  }
  if (c.eos_token_ids.empty()) c.eos_token_ids = std::move(eos);
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("pad_token_id", -1, last).status());
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("media_placeholder_token_id", 0, last).status());
  EAGLE3_RETURN_IF_ERROR(root.OptionalSubObject("vision_config").status());
  return c;
}

absl::StatusOr<DeepseekV2Config> Parse(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(std::string model_type, root.String("model_type"));
  if (model_type == kKimiK25ModelType) return ParseKimiK25(root);
  return ParseTextModel(root, {});
}

}  // namespace

std::string_view DeepseekModelTypeName(DeepseekModelType type) {
  switch (type) {
    case DeepseekModelType::kDeepseekV2:
      return "deepseek_v2";
    case DeepseekModelType::kDeepseekV3:
      return "deepseek_v3";
    case DeepseekModelType::kKimiK2:
      return "kimi_k2";
  }
  return "unknown";
}

std::optional<DeepseekModelType> DeepseekModelTypeFromName(std::string_view name) {
  for (DeepseekModelType type : {DeepseekModelType::kDeepseekV2, DeepseekModelType::kDeepseekV3,
                                 DeepseekModelType::kKimiK2}) {
    if (name == DeepseekModelTypeName(type)) return type;
  }
  return std::nullopt;
}

std::string_view ScoringFuncName(ScoringFunc func) {
  switch (func) {
    case ScoringFunc::kSoftmax:
      return "softmax";
    case ScoringFunc::kSigmoid:
      return "sigmoid";
  }
  return "unknown";
}

std::string_view TopkMethodName(TopkMethod method) {
  switch (method) {
    case TopkMethod::kGreedy:
      return "greedy";
    case TopkMethod::kGroupLimitedGreedy:
      return "group_limited_greedy";
    case TopkMethod::kNoauxTc:
      return "noaux_tc";
  }
  return "unknown";
}

absl::StatusOr<DeepseekV2Config> DeepseekV2Config::FromJson(std::string_view json_text,
                                                            std::string_view source) {
  EAGLE3_ASSIGN_OR_RETURN(nlohmann::json document,
                          json_fields::ParseObjectDocument(json_text, source));
  return Parse(Object(document, source, ""));
}

absl::StatusOr<DeepseekV2Config> DeepseekV2Config::FromFile(const std::string& path) {
  std::string resolved;
  EAGLE3_ASSIGN_OR_RETURN(std::string text, json_fields::ReadConfigFile(path, &resolved));
  return FromJson(text, resolved);
}

bool DeepseekV2Config::IsMoeLayer(int64_t layer) const {
  return is_moe() && layer >= 0 && layer < num_hidden_layers + num_nextn_predict_layers &&
         layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
}

double DeepseekV2Config::SoftmaxScale() const { return MlaSoftmaxScale(qk_head_dim(), rope); }

absl::Status DeepseekV2Config::ValidateForTp(int tp_size) const {
  if (tp_size < 1 || tp_size > kMaxTpSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": tp_size ", tp_size, " is out of range [1, ", kMaxTpSize, "]"));
  }
  const auto check = [&](std::string_view name, int64_t value) -> absl::Status {
    if (value % tp_size == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", Sv(name), " = ", value,
                                                   " is not divisible by tp_size ", tp_size));
  };
  EAGLE3_RETURN_IF_ERROR(check("num_attention_heads", num_attention_heads));
  EAGLE3_RETURN_IF_ERROR(check("intermediate_size", intermediate_size));
  if (is_moe()) EAGLE3_RETURN_IF_ERROR(check("moe_intermediate_size", moe_intermediate_size));
  return absl::OkStatus();
}

}  // namespace eagle3
