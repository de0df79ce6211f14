#include "eagle3/eagle3_draft_config.h"

#include <iterator>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "eagle3/status.h"
#include "json_fields.h"
#include "rope_config_json.h"

namespace eagle3 {
namespace {

using json_fields::IsOneOf;
using json_fields::Object;
using json_fields::Sv;

constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 40;

constexpr std::string_view kAuxIdsKey = "eagle_aux_hidden_state_layer_ids";
constexpr std::string_view kVariantKeys[] = {"norm_before_residual", "norm_before_fc", "fc_norm",
                                             "norm_output"};

// Spellings of the EAGLE-3 Llama head: SGLang/SpecForge's and vLLM's alias.
constexpr std::string_view kEagle3Architectures[] = {"LlamaForCausalLMEagle3",
                                                     "Eagle3LlamaForCausalLM"};
// Other draft formats a user may hand in by mistake.
constexpr std::string_view kOtherDraftArchitectures[] = {
    "EagleLlamaForCausalLM", "LlamaForCausalLMEagle", "Eagle3Speculator", "EagleSpeculator"};

constexpr std::string_view kParsedKeys[] = {
    "architectures",
    "model_type",
    "hidden_size",
    "target_hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "draft_vocab_size",
    "rms_norm_eps",
    "max_position_embeddings",
    "num_hidden_layers",
    "hidden_act",
    "tie_word_embeddings",
    "eagle_config",
    kAuxIdsKey,
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "norm_output",
    "attention_bias",
    "mlp_bias",
    "use_sliding_window",
    "sliding_window",     // inert unless use_sliding_window is true
    "max_window_layers",  // likewise
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
};
constexpr std::string_view kHarmlessKeys[] = {
    "_name_or_path",     "torch_dtype", "dtype",          "transformers_version",
    "initializer_range", "use_cache",   "pretraining_tp", "attention_dropout",
};
constexpr std::string_view kEagleConfigKeys[] = {
    kAuxIdsKey, "use_aux_hidden_state", "norm_before_residual", "norm_before_fc",
    "fc_norm",  "norm_output",
};

absl::StatusOr<std::string> ParseArchitecture(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::vector<std::string>> names,
                          root.OptionalStringArray("architectures"));
  if (!names.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(root.source()), ": missing required key 'architectures'"));
  }
  if (names->size() != 1) {
    return root.Error(absl::StatusCode::kInvalidArgument, "architectures",
                      absl::StrCat("expected exactly one architecture, got ", names->size()));
  }
  const std::string& name = names->front();
  if (IsOneOf(name, kEagle3Architectures)) return name;
  if (IsOneOf(name, kOtherDraftArchitectures)) {
    return root.Error(absl::StatusCode::kUnimplemented, "architectures",
                      absl::StrCat("'", name,
                                   "' is not supported; eagle3 reads EAGLE-3 Llama heads "
                                   "(LlamaForCausalLMEagle3 / Eagle3LlamaForCausalLM)"));
  }
  return root.Error(absl::StatusCode::kInvalidArgument, "architectures",
                    absl::StrCat("'", name,
                                 "' is not an EAGLE-3 draft (expected LlamaForCausalLMEagle3 or "
                                 "Eagle3LlamaForCausalLM)"));
}

// A flag that may be written at the top level or inside eagle_config; both must agree.
absl::StatusOr<bool> VariantFlag(const Object& root, const std::optional<Object>& eagle,
                                 std::string_view key) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> top, root.OptionalBool(key));
  std::optional<bool> nested;
  if (eagle.has_value()) {
    EAGLE3_ASSIGN_OR_RETURN(nested, eagle->OptionalBool(key));
  }
  if (top.has_value() && nested.has_value() && *top != *nested) {
    return root.Error(absl::StatusCode::kInvalidArgument, key,
                      absl::StrCat(*top ? "true" : "false", " disagrees with ", eagle->Path(key),
                                   " = ", *nested ? "true" : "false"));
  }
  return top.value_or(nested.value_or(false));
}

absl::StatusOr<std::optional<std::vector<int>>> ParseAuxIds(const Object& root,
                                                            const std::optional<Object>& eagle) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> top,
                          root.OptionalIntArray(kAuxIdsKey, -kMaxDim, kMaxDim));
  std::optional<std::vector<int64_t>> nested;
  if (eagle.has_value()) {
    EAGLE3_ASSIGN_OR_RETURN(nested, eagle->OptionalIntArray(kAuxIdsKey, -kMaxDim, kMaxDim));
  }
  if (top.has_value() && nested.has_value() && *top != *nested) {
    return root.Error(
        absl::StatusCode::kInvalidArgument, kAuxIdsKey,
        absl::StrCat("[", absl::StrJoin(*top, ", "), "] disagrees with ", eagle->Path(kAuxIdsKey),
                     " = [", absl::StrJoin(*nested, ", "), "]"));
  }
  const std::optional<std::vector<int64_t>>& ids = top.has_value() ? top : nested;
  if (!ids.has_value()) return std::optional<std::vector<int>>();
  if (ids->empty()) {
    const Object& where = top.has_value() ? root : *eagle;
    return where.Error(absl::StatusCode::kInvalidArgument, kAuxIdsKey,
                       "is empty; fc needs at least one captured target layer");
  }
  return std::optional<std::vector<int>>(std::vector<int>(ids->begin(), ids->end()));
}

absl::Status CheckEagleConfig(const std::optional<Object>& eagle) {
  if (!eagle.has_value()) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(eagle->CheckKnownKeys({kEagleConfigKeys}));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> use_aux, eagle->OptionalBool("use_aux_hidden_state"));
  if (!use_aux.value_or(true)) {
    return eagle->Error(absl::StatusCode::kUnimplemented, "use_aux_hidden_state",
                        "false is not supported: an EAGLE-3 head reads captured target states");
  }
  return absl::OkStatus();
}

absl::Status CheckFixedSemantics(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> act, root.OptionalString("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return root.Error(absl::StatusCode::kUnimplemented, "hidden_act",
                      absl::StrCat("'", *act, "' is not supported (only silu)"));
  }
  for (std::string_view key : {"attention_bias", "mlp_bias", "use_sliding_window"}) {
    EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> on, root.OptionalBool(key));
    if (on.value_or(false)) {
      return root.Error(absl::StatusCode::kUnimplemented, key,
                        "true is not supported by the EAGLE-3 Llama head");
    }
  }
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("sliding_window", 0, kMaxPositions).status());
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("max_window_layers", 0, kMaxDim).status());
  return absl::OkStatus();
}

absl::Status ParseShape(const Object& root, Eagle3DraftConfig& c) {
  EAGLE3_ASSIGN_OR_RETURN(c.hidden_size, root.Int("hidden_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> target_hidden,
                          root.OptionalInt("target_hidden_size", 1, kMaxDim));
  c.target_hidden_size = target_hidden.value_or(c.hidden_size);
  EAGLE3_ASSIGN_OR_RETURN(c.num_attention_heads, root.Int("num_attention_heads", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                          root.OptionalInt("num_key_value_heads", 1, kMaxDim));
  c.num_key_value_heads = kv_heads.value_or(c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return root.Error(absl::StatusCode::kInvalidArgument, "num_key_value_heads",
                      absl::StrCat(c.num_key_value_heads, " does not divide num_attention_heads = ",
                                   c.num_attention_heads));
  }
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim,
                          root.OptionalInt("head_dim", 1, kMaxDim));
  if (head_dim.has_value()) {
    c.head_dim = *head_dim;
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    return root.Error(absl::StatusCode::kInvalidArgument, "hidden_size",
                      absl::StrCat(c.hidden_size, " is not divisible by num_attention_heads = ",
                                   c.num_attention_heads, " and no head_dim is given"));
  } else {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // Rotate-half RoPE pairs the two halves of each head.
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(root.source()), ": head_dim ", c.head_dim, " must be even for RoPE"));
  }
  EAGLE3_ASSIGN_OR_RETURN(c.intermediate_size, root.Int("intermediate_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(c.vocab_size, root.Int("vocab_size", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> draft_vocab,
                          root.OptionalInt("draft_vocab_size", 1, kMaxDim));
  c.draft_vocab_size = draft_vocab.value_or(c.vocab_size);
  if (c.draft_vocab_size > c.vocab_size) {
    return root.Error(absl::StatusCode::kInvalidArgument, "draft_vocab_size",
                      absl::StrCat(c.draft_vocab_size, " exceeds vocab_size = ", c.vocab_size));
  }
  EAGLE3_ASSIGN_OR_RETURN(c.num_hidden_layers, root.Int("num_hidden_layers", 1, kMaxDim));
  if (c.num_hidden_layers != 1) {
    return root.Error(absl::StatusCode::kUnimplemented, "num_hidden_layers",
                      absl::StrCat(c.num_hidden_layers,
                                   " is not supported; eagle3 runs single-layer EAGLE-3 heads"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Eagle3DraftConfig> Parse(const Object& root) {
  Eagle3DraftConfig c;
  c.source = std::string(Sv(root.source()));
  EAGLE3_ASSIGN_OR_RETURN(c.architecture, ParseArchitecture(root));
  EAGLE3_RETURN_IF_ERROR(root.CheckKnownKeys({kParsedKeys, kHarmlessKeys, kRopeConfigKeys}));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> model_type, root.OptionalString("model_type"));
  c.model_type = model_type.value_or("");

  EAGLE3_RETURN_IF_ERROR(ParseShape(root, c));
  EAGLE3_ASSIGN_OR_RETURN(c.rms_norm_eps, root.Double("rms_norm_eps"));
  if (!(c.rms_norm_eps > 0)) {
    return root.Error(absl::StatusCode::kInvalidArgument, "rms_norm_eps",
                      absl::StrCat(c.rms_norm_eps, " must be > 0"));
  }
  EAGLE3_ASSIGN_OR_RETURN(c.max_position_embeddings,
                          root.Int("max_position_embeddings", 1, kMaxPositions));
  EAGLE3_ASSIGN_OR_RETURN(c.rope, ParseRopeConfig(root, /*default_theta=*/10000.0));
  EAGLE3_RETURN_IF_ERROR(CheckFixedSemantics(root));

  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> tie, root.OptionalBool("tie_word_embeddings"));
  c.tie_word_embeddings = tie.value_or(false);
  // A tied lm_head is the embedding, which has vocab_size rows, not draft_vocab_size.
  if (c.tie_word_embeddings && c.draft_vocab_size != c.vocab_size) {
    return root.Error(absl::StatusCode::kInvalidArgument, "tie_word_embeddings",
                      absl::StrCat("true needs draft_vocab_size (", c.draft_vocab_size,
                                   ") == vocab_size (", c.vocab_size, ")"));
  }
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("bos_token_id", 0, c.vocab_size - 1).status());
  EAGLE3_RETURN_IF_ERROR(root.IntOrIntArray("eos_token_id", 0, c.vocab_size - 1).status());
  EAGLE3_RETURN_IF_ERROR(root.OptionalInt("pad_token_id", -1, c.vocab_size - 1).status());

  EAGLE3_ASSIGN_OR_RETURN(std::optional<Object> eagle, root.OptionalSubObject("eagle_config"));
  EAGLE3_RETURN_IF_ERROR(CheckEagleConfig(eagle));
  EAGLE3_ASSIGN_OR_RETURN(c.aux_layer_ids, ParseAuxIds(root, eagle));
  bool* const flags[] = {&c.norm_before_residual, &c.norm_before_fc, &c.fc_norm, &c.norm_output};
  for (size_t i = 0; i < std::size(kVariantKeys); ++i) {
    EAGLE3_ASSIGN_OR_RETURN(*flags[i], VariantFlag(root, eagle, kVariantKeys[i]));
  }
  return c;
}

}  // namespace

absl::StatusOr<Eagle3DraftConfig> Eagle3DraftConfig::FromJson(std::string_view json_text,
                                                              std::string_view source) {
  EAGLE3_ASSIGN_OR_RETURN(nlohmann::json document,
                          json_fields::ParseObjectDocument(json_text, source));
  return Parse(Object(document, source, ""));
}

absl::StatusOr<Eagle3DraftConfig> Eagle3DraftConfig::FromFile(const std::string& path) {
  std::string resolved;
  EAGLE3_ASSIGN_OR_RETURN(std::string text, json_fields::ReadConfigFile(path, &resolved));
  return FromJson(text, resolved);
}

absl::Status CheckDraftAgainstTarget(const Eagle3DraftConfig& draft,
                                     const DeepseekV2Config& target) {
  if (draft.target_hidden_size != target.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft target_hidden_size = ", draft.target_hidden_size, " (", draft.source,
        ") does not match target hidden_size = ", target.hidden_size, " (", target.source, ")"));
  }
  if (draft.vocab_size != target.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft vocab_size = ", draft.vocab_size, " (", draft.source,
        ") does not match target vocab_size = ", target.vocab_size, " (", target.source, ")"));
  }
  if (!draft.aux_layer_ids.has_value()) return absl::OkStatus();
  const int64_t layers = target.num_hidden_layers;
  const std::vector<int>& ids = *draft.aux_layer_ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 0 && ids[i] < layers) continue;
    const std::string what =
        absl::StrCat(draft.source, ": ", Sv(kAuxIdsKey), "[", i, "] = ", ids[i]);
    const std::string convention = absl::StrCat(
        "ids use the output-of-layer convention: id k is the output of target layer k "
        "(boundary k+1), valid ids are 0..",
        layers - 1, " for the ", layers, "-layer target (", target.source, ")");
    if (ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is negative; ", convention,
                       ". There is no -1 = embedding: the embedding output is boundary 0, which no "
                       "output-of-layer id names"));
    }
    return absl::InvalidArgumentError(absl::StrCat(what, " is out of range; ", convention));
  }
  return absl::OkStatus();
}

}  // namespace eagle3
