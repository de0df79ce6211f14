#include "eagle3/eagle3_draft_config.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "eagle3_head_json.h"
#include "json_fields.h"
#include "rope_config_json.h"

namespace eagle3 {
namespace {

using json_fields::IsOneOf;
using json_fields::Object;
using json_fields::Sv;

constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 40;

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
    eagle3_head::kAuxIdsKey,
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

absl::StatusOr<std::string> ParseArchitecture(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(const std::string name, eagle3_head::SingleArchitecture(root));
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
  EAGLE3_RETURN_IF_ERROR(eagle3_head::CheckEagleConfig(eagle, {eagle3_head::kEagleConfigKeys}));
  EAGLE3_ASSIGN_OR_RETURN(c.aux_layer_ids, eagle3_head::ParseAuxLayerIds(root, eagle));
  bool* const flags[] = {&c.norm_before_residual, &c.norm_before_fc, &c.fc_norm, &c.norm_output};
  for (size_t i = 0; i < std::size(kVariantKeys); ++i) {
    EAGLE3_ASSIGN_OR_RETURN(*flags[i], eagle3_head::VariantFlag(root, eagle, kVariantKeys[i]));
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
  return eagle3_head::CheckHeadAgainstTarget(draft.source, draft.target_hidden_size,
                                             draft.vocab_size, draft.aux_layer_ids, target);
}

}  // namespace eagle3
