// Every malformed or unsupported config is refused with a precise Status: the right code and a
// message naming the key (full JSON path) and the offending value.
#include <string>
#include <vector>

#include "config_test_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/eagle3_draft_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::eagle3::testing::EditedConfig;
using ::eagle3::testing::ReadConfigText;
using ::eagle3::testing::WithoutQuantization;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kV2[] = "deepseek-ai_DeepSeek-V2.json";
constexpr char kV2Lite[] = "deepseek-ai_DeepSeek-V2-Lite-Chat.json";
constexpr char kV3Draft[] = "sgl-project_SpecForge_deepseek-v3-671b-eagle3.json";

enum class Parser {
  kTarget,          // DeepseekV2Config::FromJson
  kTargetTp8,       // ... then ValidateForTp(8)
  kDraft,           // Eagle3DraftConfig::FromJson
  kDraftAgainstV3,  // ... then CheckDraftAgainstTarget with DeepSeek-V3
};

struct Case {
  std::string name;
  std::string json;
  Parser parser;
  absl::StatusCode code;
  std::vector<std::string> substrings;
};

std::string Target(const std::function<void(Json&)>& edit) { return EditedConfig(kV2Lite, edit); }
std::string Draft(const std::function<void(Json&)>& edit) { return EditedConfig(kV3Draft, edit); }

std::vector<Case> Cases() {
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const absl::StatusCode kUnimplemented = absl::StatusCode::kUnimplemented;
  return {
      {"not_json",
       R"({"model_type": "deepseek_v2", )",
       Parser::kTarget,
       kInvalid,
       {"bad.json", "not valid JSON"}},
      {"top_level_not_object",
       "[1, 2, 3]",
       Parser::kTarget,
       kInvalid,
       {"expected a JSON object at the top level", "array of 3 elements"}},
      {"deep_nesting",
       std::string(100, '[') + std::string(100, ']'),
       Parser::kDraft,
       kInvalid,
       {"nests deeper than 64"}},
      {"missing_required_key",
       Target([](Json& j) { j.erase("hidden_size"); }),
       Parser::kTarget,
       kInvalid,
       {"missing required key 'hidden_size'"}},
      {"missing_q_lora_rank",
       Target([](Json& j) { j.erase("q_lora_rank"); }),
       Parser::kTarget,
       kInvalid,
       {"missing required key 'q_lora_rank'", "null for a plain q_proj"}},
      {"string_for_int",
       Target([](Json& j) { j["num_hidden_layers"] = "27"; }),
       Parser::kTarget,
       kInvalid,
       {"key 'num_hidden_layers'", "expected an integer", "string \"27\""}},
      {"float_for_int",
       Target([](Json& j) { j["hidden_size"] = 2048.5; }),
       Parser::kTarget,
       kInvalid,
       {"key 'hidden_size'", "expected an integer", "number 2048.5"}},
      {"huge_float_for_int",
       Target([](Json& j) { j["kv_lora_rank"] = 1e300; }),
       Parser::kTarget,
       kInvalid,
       {"key 'kv_lora_rank'", "expected an integer"}},
      {"huge_unsigned",
       Target([](Json& j) { j["vocab_size"] = 18446744073709551615ull; }),
       Parser::kTarget,
       kInvalid,
       {"key 'vocab_size'", "18446744073709551615 is out of range"}},
      {"zero_dim",
       Target([](Json& j) { j["qk_rope_head_dim"] = 0; }),
       Parser::kTarget,
       kInvalid,
       {"key 'qk_rope_head_dim'", "0 is out of range [1, "}},
      {"negative_dim",
       Target([](Json& j) { j["num_hidden_layers"] = -3; }),
       Parser::kTarget,
       kInvalid,
       {"key 'num_hidden_layers'", "-3 is out of range"}},
      {"null_required",
       Target([](Json& j) { j["rms_norm_eps"] = nullptr; }),
       Parser::kTarget,
       kInvalid,
       {"key 'rms_norm_eps'", "expected a number, got null"}},
      {"heads_not_divisible_by_tp",
       Target([](Json& j) {
         j["num_attention_heads"] = 20;
         j["num_key_value_heads"] = 20;
       }),
       Parser::kTargetTp8,
       kInvalid,
       {"num_attention_heads = 20 is not divisible by tp_size 8"}},
      {"unknown_model_type",
       Target([](Json& j) { j["model_type"] = "llama"; }),
       Parser::kTarget,
       kInvalid,
       {"key 'model_type'", "unsupported model_type 'llama'"}},
      {"rope_unknown_type",
       Target([](Json& j) { j["rope_scaling"]["type"] = "ntk"; }),
       Parser::kTarget,
       kInvalid,
       {"key 'rope_scaling.type'", "unknown rope type 'ntk'"}},
      {"rope_dynamic",
       Target([](Json& j) {
         j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       }),
       Parser::kTarget,
       kUnimplemented,
       {"key 'rope_scaling.type'", "'dynamic' is not implemented"}},
      {"rope_longrope_in_parameters",
       Target([](Json& j) {
         j["rope_parameters"] = {{"rope_type", "longrope"}};
       }),
       Parser::kTarget,
       kUnimplemented,
       {"key 'rope_parameters.rope_type'", "longrope"}},
      {"rope_factor_zero",
       Target([](Json& j) { j["rope_scaling"]["factor"] = 0; }),
       Parser::kTarget,
       kInvalid,
       {"key 'rope_scaling.factor'", "0 must be > 0"}},
      {"rope_factor_not_number",
       Target([](Json& j) { j["rope_scaling"]["factor"] = "40"; }),
       Parser::kTarget,
       kInvalid,
       {"key 'rope_scaling.factor'", "expected a number", "\"40\""}},
      {"rope_scaling_not_object",
       Target([](Json& j) { j["rope_scaling"] = 40; }),
       Parser::kTarget,
       kInvalid,
       {"key 'rope_scaling'", "expected an object", "integer 40"}},
      {"rope_type_spellings_disagree",
       Target([](Json& j) { j["rope_scaling"]["rope_type"] = "linear"; }),
       Parser::kTarget,
       kInvalid,
       {"key 'rope_scaling.type'", "'yarn' disagrees with rope_scaling.rope_type"}},
      {"rope_key_not_for_type",
       Target([](Json& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}, {"beta_fast", 32}};
       }),
       Parser::kTarget,
       kInvalid,
       {"key 'rope_scaling.beta_fast'", "does not apply", "'linear'"}},
      {"yarn_without_original_context",
       Target([](Json& j) { j["rope_scaling"].erase("original_max_position_embeddings"); }),
       Parser::kTarget,
       kInvalid,
       {"rope_scaling.original_max_position_embeddings", "max_position_embeddings", "4096"}},
      {"rope_forms_disagree_on_factor",
       Target([](Json& j) {
         j["rope_parameters"] = j["rope_scaling"];
         j["rope_parameters"]["factor"] = 32;
       }),
       Parser::kTarget,
       kInvalid,
       {"rope_scaling.factor = 40 but rope_parameters.factor = 32"}},
      {"rope_forms_disagree_on_theta",
       Target([](Json& j) {
         j["rope_parameters"] = j["rope_scaling"];
         j["rope_parameters"]["rope_theta"] = 50000;
       }),
       Parser::kTarget,
       kInvalid,
       {"rope_theta = 10000 but rope_parameters.rope_theta = 50000"}},
      {"unknown_semantic_key",
       Target([](Json& j) { j["use_mla"] = false; }),
       Parser::kTarget,
       kInvalid,
       {"key 'use_mla'", "unknown key", "may change the model's math"}},
      {"quantization_config_unknown_method",
       Target([](Json& j) {
         j["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
       }),
       Parser::kTarget,
       kUnimplemented,
       {"key 'quantization_config.quant_method'", "'awq' is not supported", "'fp8'", "'compressed-tensors'"}},
      {"experts_per_token_exceeds_experts",
       Target([](Json& j) { j["num_experts_per_tok"] = 65; }),
       Parser::kTarget,
       kInvalid,
       {"key 'num_experts_per_tok'", "65 exceeds n_routed_experts = 64"}},
      {"topk_group_exceeds_n_group",
       EditedConfig(kV2, [](Json& j) { j["topk_group"] = 9; }),
       Parser::kTarget,
       kInvalid,
       {"key 'topk_group'", "9 exceeds n_group = 8"}},
      {"experts_not_divisible_by_groups",
       EditedConfig(kV2, [](Json& j) { j["n_group"] = 7; }),
       Parser::kTarget,
       kInvalid,
       {"key 'n_group'", "n_routed_experts = 160 is not divisible by n_group = 7"}},
      {"sigmoid_with_greedy",
       Target([](Json& j) { j["scoring_func"] = "sigmoid"; }),
       Parser::kTarget,
       kUnimplemented,
       {"key 'scoring_func'", "'sigmoid' with topk_method 'greedy'"}},
      {"first_k_dense_beyond_layers",
       Target([](Json& j) { j["first_k_dense_replace"] = 28; }),
       Parser::kTarget,
       kInvalid,
       {"key 'first_k_dense_replace'", "28 exceeds num_hidden_layers = 27"}},
      {"moe_layer_freq_zero",
       Target([](Json& j) { j["moe_layer_freq"] = 0; }),
       Parser::kTarget,
       kInvalid,
       {"key 'moe_layer_freq'", "0 is out of range [1, "}},
      {"eos_out_of_vocab",
       Target([](Json& j) {
         j["eos_token_id"] = {100001, 102400};
       }),
       Parser::kTarget,
       kInvalid,
       {"key 'eos_token_id[1]'", "102400 is out of range [0, 102399]"}},
      {"attention_bias",
       Target([](Json& j) { j["attention_bias"] = true; }),
       Parser::kTarget,
       kUnimplemented,
       {"key 'attention_bias'"}},
      {"yarn_scale_overflow",
       Target([](Json& j) { j["rope_scaling"]["mscale_all_dim"] = 1e300; }),
       Parser::kTarget,
       kInvalid,
       {"non-finite attention softmax scale"}},
      {"aux_ids_not_integers",
       Draft([](Json& j) {
         j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, "a", 57};
       }),
       Parser::kDraft,
       kInvalid,
       {"key 'eagle_config.eagle_aux_hidden_state_layer_ids[1]'", "expected an integer",
        "string \"a\""}},
      {"aux_ids_not_array",
       Draft([](Json& j) { j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = "1,29,57"; }),
       Parser::kDraft,
       kInvalid,
       {"key 'eagle_config.eagle_aux_hidden_state_layer_ids'", "expected an array of integers"}},
      {"aux_ids_disagree",
       Draft([](Json& j) {
         j["eagle_aux_hidden_state_layer_ids"] = {2, 30, 58};
       }),
       Parser::kDraft,
       kInvalid,
       {"key 'eagle_aux_hidden_state_layer_ids'", "[2, 30, 58] disagrees with",
        "eagle_config.eagle_aux_hidden_state_layer_ids = [1, 29, 57]"}},
      {"aux_ids_empty",
       Draft(
           [](Json& j) { j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = Json::array(); }),
       Parser::kDraft,
       kInvalid,
       {"eagle_config.eagle_aux_hidden_state_layer_ids", "is empty"}},
      {"variant_flags_disagree",
       Draft([](Json& j) {
         j["norm_before_fc"] = true;
         j["eagle_config"]["norm_before_fc"] = false;
       }),
       Parser::kDraft,
       kInvalid,
       {"key 'norm_before_fc'", "eagle_config.norm_before_fc = false"}},
      {"unknown_eagle_config_key",
       Draft([](Json& j) { j["eagle_config"]["use_mtp_layernorm"] = true; }),
       Parser::kDraft,
       kInvalid,
       {"key 'eagle_config.use_mtp_layernorm'", "unknown key"}},
      {"draft_two_layers",
       Draft([](Json& j) { j["num_hidden_layers"] = 2; }),
       Parser::kDraft,
       kUnimplemented,
       {"key 'num_hidden_layers'", "2 is not supported"}},
      {"draft_eagle1_architecture",
       Draft([](Json& j) { j["architectures"] = {"EagleLlamaForCausalLM"}; }),
       Parser::kDraft,
       kUnimplemented,
       {"key 'architectures'", "'EagleLlamaForCausalLM' is not supported"}},
      {"draft_not_a_draft",
       Draft([](Json& j) { j["architectures"] = {"DeepseekV3ForCausalLM"}; }),
       Parser::kDraft,
       kInvalid,
       {"key 'architectures'", "'DeepseekV3ForCausalLM' is not an EAGLE-3 draft"}},
      {"draft_vocab_exceeds_vocab",
       Draft([](Json& j) { j["draft_vocab_size"] = 200000; }),
       Parser::kDraft,
       kInvalid,
       {"key 'draft_vocab_size'", "200000 exceeds vocab_size = 129280"}},
      {"aux_id_negative",
       Draft([](Json& j) {
         j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {-1, 29, 57};
       }),
       Parser::kDraftAgainstV3,
       kInvalid,
       {"eagle_aux_hidden_state_layer_ids[0] = -1 is negative", "output-of-layer convention",
        "There is no -1 = embedding", "boundary 0"}},
      {"aux_id_past_last_layer",
       Draft([](Json& j) {
         j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {1, 29, 61};
       }),
       Parser::kDraftAgainstV3,
       kInvalid,
       {"eagle_aux_hidden_state_layer_ids[2] = 61", "valid ids are 0..60"}},
      {"draft_target_hidden_mismatch",
       Draft([](Json& j) { j["target_hidden_size"] = 4096; }),
       Parser::kDraftAgainstV3,
       kInvalid,
       {"draft target_hidden_size = 4096", "target hidden_size = 7168", "target.json"}},
  };
}

absl::Status RunCase(const Case& c) {
  switch (c.parser) {
    case Parser::kTarget:
      return DeepseekV2Config::FromJson(c.json, "bad.json").status();
    case Parser::kTargetTp8: {
      absl::StatusOr<DeepseekV2Config> target = DeepseekV2Config::FromJson(c.json, "bad.json");
      if (!target.ok()) return target.status();
      return target->ValidateForTp(8);
    }
    case Parser::kDraft:
      return Eagle3DraftConfig::FromJson(c.json, "bad.json").status();
    case Parser::kDraftAgainstV3: {
      absl::StatusOr<Eagle3DraftConfig> draft = Eagle3DraftConfig::FromJson(c.json, "bad.json");
      if (!draft.ok()) return draft.status();
      absl::StatusOr<DeepseekV2Config> target = DeepseekV2Config::FromJson(
          WithoutQuantization("deepseek-ai_DeepSeek-V3.json"), "target.json");
      if (!target.ok()) return target.status();
      return CheckDraftAgainstTarget(*draft, *target);
    }
  }
  return absl::InternalError("unreachable");
}

TEST(BadConfigTest, EachCaseFailsWithCodeAndPreciseMessage) {
  const std::vector<Case> cases = Cases();
  ASSERT_GE(cases.size(), 14u);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const absl::Status status = RunCase(c);
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), c.code) << status;
    for (const std::string& s : c.substrings) EXPECT_THAT(status.message(), HasSubstr(s));
  }
}

}  // namespace
}  // namespace eagle3
