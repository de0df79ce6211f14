#include "eagle3/mla_draft_config.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/eagle3_draft_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::eagle3::testing::ConfigPath;
using ::eagle3::testing::EditedConfig;
using ::eagle3::testing::ReadConfigText;
using ::eagle3::testing::WithoutQuantization;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// Fixture sources: tests/data/configs/README.md.
constexpr char kTorchSpecK25[] = "modeled_kimi-k25-eagle3-mla.torchspec-vllm-export.json";
constexpr char kModelOpt[] = "modeled_kimi-k2-eagle3-mla.modelopt-export.json";
constexpr char kTorchSpecK3[] = "lightseekorg_TorchSpec_kimi_k3_eagle3_mla.json";
constexpr char kTorchSpecMoe[] = "lightseekorg_TorchSpec_kimi_k25_eagle3_moe.json";

MlaDraftConfig Parse(const std::string& text) {
  absl::StatusOr<MlaDraftConfig> config = MlaDraftConfig::FromJson(text, "draft.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : MlaDraftConfig();
}

std::string Edited(const std::function<void(Json&)>& edit) {
  return EditedConfig(kTorchSpecK25, edit);
}

DeepseekV2Config Target(const std::string& text) {
  absl::StatusOr<DeepseekV2Config> config = DeepseekV2Config::FromJson(text, "target.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DeepseekV2Config();
}

// YaRN m^2 / sqrt(qk_head_dim), written out independently of the library.
double ExpectedYarnScale(double factor, double mscale_all_dim, double qk_head_dim) {
  const double m = 0.1 * mscale_all_dim * std::log(factor) + 1.0;
  return m * m / std::sqrt(qk_head_dim);
}

TEST(MlaDraftConfigTest, TorchSpecKimiK25Export) {
  absl::StatusOr<MlaDraftConfig> file = MlaDraftConfig::FromFile(ConfigPath(kTorchSpecK25));
  ASSERT_TRUE(file.ok()) << file.status();
  const MlaDraftConfig& c = *file;
  EXPECT_EQ(c.architecture, "Eagle3DeepseekV2ForCausalLM");
  EXPECT_EQ(c.model_type, DeepseekModelType::kKimiK2);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.target_hidden_size, 7168);  // defaulted
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.draft_vocab_size, 163840);
  EXPECT_TRUE(c.draft_vocab_size_stated);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 64);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.latent_cache_width(), 576);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.rope.theta, 50000.0);
  EXPECT_EQ(c.rope.scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope.scaling.factor, 64.0);
  EXPECT_EQ(c.rope.scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope.scaling.beta_fast, 1.0);
  EXPECT_EQ(c.rope.scaling.beta_slow, 1.0);
  EXPECT_EQ(c.rope.scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(c.num_hidden_layers, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
  ASSERT_TRUE(c.aux_layer_ids.has_value());
  EXPECT_EQ(*c.aux_layer_ids, (std::vector<int>{2, 30, 58}));
  EXPECT_FALSE(c.num_aux_hidden_states.has_value());
  EXPECT_FALSE(c.norm_before_residual);
  EXPECT_FALSE(c.fc_norm);
  EXPECT_FALSE(c.norm_output);
  EXPECT_EQ(c.num_aux_layers(), 3);
  EXPECT_EQ(c.fc_input_width(), 3 * 7168);
  EXPECT_THAT(c.source, HasSubstr(kTorchSpecK25));

  // The draft layer's attention reads the 2H [embed | hidden] row and writes H.
  const MlaAttentionConfig a = c.attention();
  EXPECT_EQ(a.input_width, 2 * 7168);
  EXPECT_EQ(a.output_width, 7168);
  EXPECT_EQ(a.num_heads, 64);
  EXPECT_EQ(a.latent_cache_width(), 576);
  EXPECT_DOUBLE_EQ(a.SoftmaxScale(), ExpectedYarnScale(64.0, 1.0, 192.0));

  EXPECT_TRUE(c.ValidateForTp(8).ok());
  const DeepseekV2Config k25 = Target(ReadConfigText("moonshotai_Kimi-K2.5.json"));
  EXPECT_TRUE(CheckDraftAgainstTarget(c, k25).ok()) << CheckDraftAgainstTarget(c, k25);
  const DeepseekV2Config k2 = Target(WithoutQuantization("moonshotai_Kimi-K2-Instruct.json"));
  EXPECT_TRUE(CheckDraftAgainstTarget(c, k2).ok()) << CheckDraftAgainstTarget(c, k2);
}

TEST(MlaDraftConfigTest, ModelOptExportWithTargetKeysAndGenericAttributes) {
  const MlaDraftConfig c = Parse(ReadConfigText(kModelOpt));
  EXPECT_EQ(c.model_type, DeepseekModelType::kKimiK2);
  // ModelOpt's template has no draft_vocab_size: the full vocabulary, and the fact is recorded.
  EXPECT_FALSE(c.draft_vocab_size_stated);
  EXPECT_EQ(c.draft_vocab_size, 163840);
  EXPECT_EQ(*c.aux_layer_ids, (std::vector<int>{1, 29, 57}));
  EXPECT_EQ(c.intermediate_size, 18432);  // the dense MLP, whatever n_routed_experts says
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.rope.scaling.factor, 64.0);
  EXPECT_TRUE(CheckDraftAgainstTarget(c, Target(ReadConfigText("moonshotai_Kimi-K2.5.json"))).ok());
}

TEST(MlaDraftConfigTest, TorchSpecTemplateWithRopeOn) {
  // The verbatim K3 template parses once its RoPE-free switch is off (or absent).
  for (const Json& nope : {Json(false), Json(nullptr)}) {
    const MlaDraftConfig c =
        Parse(EditedConfig(kTorchSpecK3, [&](Json& j) { j["mla_use_nope"] = nope; }));
    EXPECT_EQ(*c.aux_layer_ids, (std::vector<int>{1, 45, 89}));
    EXPECT_EQ(c.max_position_embeddings, 1048576);
    EXPECT_EQ(c.rope.scaling.factor, 32.0);
    EXPECT_EQ(c.rope.scaling.original_max_position_embeddings, 32768);
    EXPECT_EQ(c.rope.scaling.beta_fast, 32.0);
  }
}

TEST(MlaDraftConfigTest, ArchitectureAliasAndModelTypes) {
  const MlaDraftConfig v3 = Parse(Edited([](Json& j) {
    j["architectures"] = {"Eagle3DeepseekV3ForCausalLM"};
    j["model_type"] = "deepseek_v3";
  }));
  EXPECT_EQ(v3.architecture, "Eagle3DeepseekV3ForCausalLM");
  EXPECT_EQ(v3.model_type, DeepseekModelType::kDeepseekV3);
  const MlaDraftConfig v2 = Parse(Edited([](Json& j) { j["model_type"] = "deepseek_v2"; }));
  EXPECT_EQ(v2.model_type, DeepseekModelType::kDeepseekV2);
}

TEST(MlaDraftConfigTest, PlainQProjWhenQLoraRankIsNull) {
  const MlaDraftConfig c = Parse(Edited([](Json& j) { j["q_lora_rank"] = nullptr; }));
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_FALSE(c.attention().q_lora_rank.has_value());
}

TEST(MlaDraftConfigTest, Transformers5Form) {
  const MlaDraftConfig c = Parse(Edited([](Json& j) {
    j["rope_parameters"] = j["rope_scaling"];
    j["rope_parameters"]["rope_theta"] = 50000.0;
    j.erase("rope_scaling");
    j.erase("rope_theta");
    j["head_dim"] = 64;
    j["qk_head_dim"] = 192;
    j["rope_interleave"] = true;
    j["dtype"] = "bfloat16";
  }));
  EXPECT_EQ(c.rope.theta, 50000.0);
  EXPECT_EQ(c.rope.scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope.scaling.factor, 64.0);
}

TEST(MlaDraftConfigTest, NoRopeScaling) {
  const MlaDraftConfig c = Parse(Edited([](Json& j) { j["rope_scaling"] = nullptr; }));
  EXPECT_EQ(c.rope.scaling.type, RopeScaling::Type::kNone);
  EXPECT_DOUBLE_EQ(c.attention().SoftmaxScale(), 1.0 / std::sqrt(192.0));
}

TEST(MlaDraftConfigTest, Eagle31VariantKeys) {
  const MlaDraftConfig top = Parse(Edited([](Json& j) {
    j["fc_norm"] = true;
    j["norm_output"] = true;
  }));
  EXPECT_TRUE(top.fc_norm);
  EXPECT_TRUE(top.norm_output);
  EXPECT_FALSE(top.norm_before_residual);

  const MlaDraftConfig nested = Parse(Edited([](Json& j) {
    j["eagle_config"]["fc_norm"] = true;
    j["eagle_config"]["norm_before_residual"] = true;
    j["use_aux_norm"] = true;  // SGLang's older name, agreeing
  }));
  EXPECT_TRUE(nested.fc_norm);
  EXPECT_TRUE(nested.norm_before_residual);
  EXPECT_FALSE(nested.norm_output);

  // SGLang's older name alone sets the switch, either way.
  EXPECT_TRUE(Parse(Edited([](Json& j) { j["use_aux_norm"] = true; })).fc_norm);
  EXPECT_FALSE(Parse(Edited([](Json& j) { j["use_aux_norm"] = false; })).fc_norm);
}

TEST(MlaDraftConfigTest, AuxCountWithoutIdsAndWiderTarget) {
  const MlaDraftConfig counted = Parse(Edited([](Json& j) {
    j.erase("eagle_config");
    j["num_aux_hidden_states"] = 3;
  }));
  EXPECT_FALSE(counted.aux_layer_ids.has_value());
  EXPECT_EQ(counted.num_aux_layers(), 3);

  const MlaDraftConfig both = Parse(Edited([](Json& j) { j["num_aux_hidden_states"] = 3; }));
  EXPECT_EQ(both.num_aux_layers(), 3);

  const MlaDraftConfig narrow = Parse(Edited([](Json& j) {
    j["hidden_size"] = 4096;
    j["target_hidden_size"] = 7168;
    j["eagle_aux_hidden_state_layer_ids"] = {2, 30, 58, 59};
    j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {2, 30, 58, 59};
  }));
  EXPECT_EQ(narrow.fc_input_width(), 4 * 7168);
  EXPECT_EQ(narrow.attention().input_width, 2 * 4096);
  EXPECT_EQ(narrow.attention().output_width, 4096);
}

TEST(MlaDraftConfigTest, CheckAgainstTargetNamesWidthsVocabAndIds) {
  const DeepseekV2Config k2 = Target(WithoutQuantization("moonshotai_Kimi-K2-Instruct.json"));

  const MlaDraftConfig narrow = Parse(Edited([](Json& j) { j["target_hidden_size"] = 4096; }));
  const absl::Status width = CheckDraftAgainstTarget(narrow, k2);
  EXPECT_EQ(width.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(width.message(), HasSubstr("draft target_hidden_size = 4096 (draft.json)"));
  EXPECT_THAT(width.message(), HasSubstr("target hidden_size = 7168 (target.json)"));

  const DeepseekV2Config v3 = Target(WithoutQuantization("deepseek-ai_DeepSeek-V3.json"));
  const absl::Status vocab = CheckDraftAgainstTarget(Parse(ReadConfigText(kTorchSpecK25)), v3);
  EXPECT_THAT(vocab.message(), HasSubstr("draft vocab_size = 163840"));
  EXPECT_THAT(vocab.message(), HasSubstr("target vocab_size = 129280"));

  MlaDraftConfig ids = Parse(ReadConfigText(kTorchSpecK25));
  ids.aux_layer_ids = std::vector<int>{2, 30, 61};
  const absl::Status past_end = CheckDraftAgainstTarget(ids, k2);
  EXPECT_EQ(past_end.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past_end.message(), HasSubstr("eagle_aux_hidden_state_layer_ids[2] = 61"));
  EXPECT_THAT(past_end.message(), HasSubstr("valid ids are 0..60"));
  ids.aux_layer_ids = std::vector<int>{-1, 30, 58};
  EXPECT_THAT(CheckDraftAgainstTarget(ids, k2).message(), HasSubstr("There is no -1 = embedding"));

  const MlaDraftConfig four = Parse(Edited([](Json& j) {
    j.erase("eagle_config");
    j["num_aux_hidden_states"] = 4;
  }));
  EXPECT_EQ(four.fc_input_width(), 4 * 7168);
  const absl::Status taps = CheckDraftAgainstTarget(four, k2);
  EXPECT_EQ(taps.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(taps.message(), HasSubstr("num_aux_hidden_states = 4"));
  EXPECT_THAT(taps.message(), HasSubstr("default taps are 3"));
}

TEST(MlaDraftConfigTest, ValidateForTp) {
  const MlaDraftConfig c = Parse(ReadConfigText(kTorchSpecK25));
  for (int tp : {1, 2, 4, 8}) EXPECT_TRUE(c.ValidateForTp(tp).ok()) << tp;
  EXPECT_THAT(c.ValidateForTp(3).message(),
              HasSubstr("num_attention_heads = 64 is not divisible by tp_size 3"));
  EXPECT_THAT(c.ValidateForTp(0).message(), HasSubstr("tp_size 0 is out of range"));
  const MlaDraftConfig odd_mlp = Parse(Edited([](Json& j) { j["intermediate_size"] = 18436; }));
  EXPECT_THAT(odd_mlp.ValidateForTp(8).message(),
              HasSubstr("intermediate_size = 18436 is not divisible by tp_size 8"));
}

TEST(MlaDraftConfigTest, LlamaHeadsAndMlaDraftsAreReadByTheirOwnParsers) {
  const absl::StatusOr<MlaDraftConfig> llama = MlaDraftConfig::FromJson(
      ReadConfigText("sgl-project_SpecForge_kimi-k25-eagle3.json"), "llama.json");
  EXPECT_EQ(llama.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(llama.status().message(), HasSubstr("Llama-style EAGLE-3 head"));
  EXPECT_THAT(llama.status().message(), HasSubstr("Eagle3DraftConfig"));

  const absl::StatusOr<Eagle3DraftConfig> mla =
      Eagle3DraftConfig::FromJson(ReadConfigText(kTorchSpecK25), "mla.json");
  EXPECT_FALSE(mla.ok());
  EXPECT_THAT(mla.status().message(), HasSubstr("Eagle3DeepseekV2ForCausalLM"));
}

TEST(MlaDraftConfigTest, FromFileReportsAMissingFile) {
  const absl::StatusOr<MlaDraftConfig> missing = MlaDraftConfig::FromFile("/nonexistent/dir");
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/dir"));
}

// Every refusal: the edit applied to the modeled K2.5 export (or a verbatim fixture), the status
// code and the substrings the message must contain (the key and the values).
struct BadCase {
  std::string name;
  std::string json;
  absl::StatusCode code;
  std::vector<std::string> substrings;
};

std::vector<BadCase> BadCases() {
  using C = absl::StatusCode;
  return {
      {"no_architectures",
       Edited([](Json& j) { j.erase("architectures"); }),
       C::kInvalidArgument,
       {"missing required key 'architectures'"}},
      {"two_architectures",
       Edited([](Json& j) { j["architectures"].push_back("Eagle3DeepseekV3ForCausalLM"); }),
       C::kInvalidArgument,
       {"key 'architectures'", "exactly one architecture, got 2"}},
      {"unknown_architecture",
       Edited([](Json& j) { j["architectures"] = {"DeepseekV3ForCausalLM"}; }),
       C::kInvalidArgument,
       {"'DeepseekV3ForCausalLM' is not an MLA EAGLE-3 draft"}},
      {"no_model_type",
       Edited([](Json& j) { j.erase("model_type"); }),
       C::kInvalidArgument,
       {"missing required key 'model_type'"}},
      {"llama_model_type",
       Edited([](Json& j) { j["model_type"] = "llama"; }),
       C::kInvalidArgument,
       {"key 'model_type'", "'llama' is not a DeepSeek-family model type"}},
      {"unknown_key",
       Edited([](Json& j) { j["sliding_window"] = 4096; }),
       C::kInvalidArgument,
       {"key 'sliding_window'", "unknown key"}},
      {"no_q_lora_rank",
       Edited([](Json& j) { j.erase("q_lora_rank"); }),
       C::kInvalidArgument,
       {"missing required key 'q_lora_rank' (null for a plain q_proj)"}},
      {"no_kv_lora_rank",
       Edited([](Json& j) { j.erase("kv_lora_rank"); }),
       C::kInvalidArgument,
       {"missing required key 'kv_lora_rank'"}},
      {"zero_kv_lora_rank",
       Edited([](Json& j) { j["kv_lora_rank"] = 0; }),
       C::kInvalidArgument,
       {"key 'kv_lora_rank'", "0 is out of range"}},
      {"fractional_hidden",
       Edited([](Json& j) { j["hidden_size"] = 7168.5; }),
       C::kInvalidArgument,
       {"key 'hidden_size'", "expected an integer"}},
      {"odd_rope_dim",
       Edited([](Json& j) { j["qk_rope_head_dim"] = 63; }),
       C::kInvalidArgument,
       {"key 'qk_rope_head_dim'", "63 must be even"}},
      {"head_dim_not_rope_dim",
       Edited([](Json& j) { j["head_dim"] = 128; }),
       C::kInvalidArgument,
       {"key 'head_dim'", "128 differs from qk_rope_head_dim = 64"}},
      {"qk_head_dim_mismatch",
       Edited([](Json& j) { j["qk_head_dim"] = 128; }),
       C::kInvalidArgument,
       {"key 'qk_head_dim'", "128 differs from", "= 192"}},
      {"two_layers",
       Edited([](Json& j) { j["num_hidden_layers"] = 2; }),
       C::kUnimplemented,
       {"key 'num_hidden_layers'", "2 is not supported"}},
      {"gelu",
       Edited([](Json& j) { j["hidden_act"] = "gelu"; }),
       C::kUnimplemented,
       {"key 'hidden_act'", "'gelu' is not supported"}},
      {"attention_bias",
       Edited([](Json& j) { j["attention_bias"] = true; }),
       C::kUnimplemented,
       {"key 'attention_bias'", "true is not supported"}},
      {"mlp_bias",
       Edited([](Json& j) { j["mlp_bias"] = true; }),
       C::kUnimplemented,
       {"key 'mlp_bias'", "true is not supported"}},
      {"fc_bias",
       Edited([](Json& j) { j["bias"] = true; }),
       C::kUnimplemented,
       {"key 'bias'", "true is not supported"}},
      {"rope_not_interleaved",
       Edited([](Json& j) { j["rope_interleave"] = false; }),
       C::kUnimplemented,
       {"key 'rope_interleave'", "false is not supported", "adjacent pairs"}},
      {"rope_free_mla",
       ReadConfigText(kTorchSpecK3),
       C::kUnimplemented,
       {"key 'mla_use_nope'", "true is not supported", "RoPE-free MLA"}},
      {"moe_draft",
       ReadConfigText(kTorchSpecMoe),
       C::kUnimplemented,
       {"key 'use_moe'", "true is not supported", "kimi_k25_eagle3_moe"}},
      {"norm_before_fc",
       Edited([](Json& j) { j["norm_before_fc"] = true; }),
       C::kUnimplemented,
       {"key 'norm_before_fc'", "not supported", "fc_norm only"}},
      {"norm_before_fc_nested",
       Edited([](Json& j) { j["eagle_config"]["norm_before_fc"] = true; }),
       C::kUnimplemented,
       {"key 'norm_before_fc'", "in eagle_config"}},
      {"aux_norm_disagrees",
       Edited([](Json& j) {
         j["fc_norm"] = true;
         j["use_aux_norm"] = false;
       }),
       C::kInvalidArgument,
       {"key 'use_aux_norm'", "false disagrees with fc_norm = true"}},
      {"flag_disagrees",
       Edited([](Json& j) {
         j["norm_output"] = true;
         j["eagle_config"]["norm_output"] = false;
       }),
       C::kInvalidArgument,
       {"key 'norm_output'", "true disagrees with eagle_config.norm_output"}},
      {"aux_ids_disagree",
       Edited([](Json& j) {
         j["eagle_aux_hidden_state_layer_ids"] = {2, 30};
       }),
       C::kInvalidArgument,
       {"key 'eagle_aux_hidden_state_layer_ids'", "[2, 30] disagrees with",
        "eagle_config.eagle_aux_hidden_state_layer_ids = [2, 30, 58]"}},
      {"aux_ids_empty",
       Edited(
           [](Json& j) { j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = Json::array(); }),
       C::kInvalidArgument,
       {"eagle_config.eagle_aux_hidden_state_layer_ids", "is empty"}},
      {"aux_count_disagrees",
       Edited([](Json& j) { j["num_aux_hidden_states"] = 4; }),
       C::kInvalidArgument,
       {"key 'num_aux_hidden_states'", "4 differs from the 3 ids"}},
      {"no_aux_states",
       Edited([](Json& j) { j["eagle_config"]["use_aux_hidden_state"] = false; }),
       C::kUnimplemented,
       {"key 'eagle_config.use_aux_hidden_state'", "false is not supported"}},
      {"unknown_eagle_key",
       Edited([](Json& j) { j["eagle_config"]["draft_depth"] = 3; }),
       C::kInvalidArgument,
       {"key 'eagle_config.draft_depth'", "unknown key"}},
      {"no_embed_norm",
       Edited([](Json& j) { j["eagle_config"]["use_input_layernorm_in_first_layer"] = false; }),
       C::kUnimplemented,
       {"key 'eagle_config.use_input_layernorm_in_first_layer'", "false is not supported"}},
      {"no_last_norm",
       Edited([](Json& j) { j["eagle_config"]["use_last_layernorm"] = false; }),
       C::kUnimplemented,
       {"key 'eagle_config.use_last_layernorm'", "false is not supported"}},
      {"mtp_norms",
       Edited([](Json& j) { j["eagle_config"]["use_mtp_layernorm"] = true; }),
       C::kUnimplemented,
       {"key 'eagle_config.use_mtp_layernorm'", "true is not supported"}},
      {"next_layer_irregular",
       Edited([](Json& j) { j["eagle_config"]["next_layer_regular"] = false; }),
       C::kUnimplemented,
       {"key 'eagle_config.next_layer_regular'", "false is not supported"}},
      {"parallel_draft",
       Edited([](Json& j) { j["eagle_config"]["parallel_draft_step"] = 3; }),
       C::kUnimplemented,
       {"key 'eagle_config.parallel_draft_step'", "3 is not supported"}},
      {"draft_vocab_too_big",
       Edited([](Json& j) { j["draft_vocab_size"] = 163841; }),
       C::kInvalidArgument,
       {"key 'draft_vocab_size'", "163841 exceeds vocab_size = 163840"}},
      {"tied_reduced_vocab",
       Edited([](Json& j) {
         j["draft_vocab_size"] = 32000;
         j["tie_word_embeddings"] = true;
       }),
       C::kInvalidArgument,
       {"key 'tie_word_embeddings'", "draft_vocab_size (32000) == vocab_size (163840)"}},
      {"zero_eps",
       Edited([](Json& j) { j["rms_norm_eps"] = 0; }),
       C::kInvalidArgument,
       {"key 'rms_norm_eps'", "0 must be > 0"}},
      {"no_max_positions",
       Edited([](Json& j) { j.erase("max_position_embeddings"); }),
       C::kInvalidArgument,
       {"missing required key 'max_position_embeddings'"}},
      {"dynamic_rope",
       Edited([](Json& j) {
         j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       }),
       C::kUnimplemented,
       {"key 'rope_scaling.type'", "'dynamic' is not implemented"}},
      {"yarn_overflow",
       Edited([](Json& j) {
         j["rope_scaling"]["factor"] = 1e300;
         j["rope_scaling"]["mscale_all_dim"] = 1e300;
       }),
       C::kInvalidArgument,
       {"draft.json", "non-finite attention softmax scale"}},
      {"eos_out_of_vocab",
       Edited([](Json& j) { j["eos_token_id"] = 163840; }),
       C::kInvalidArgument,
       {"key 'eos_token_id'", "163840 is out of range"}},
  };
}

class MlaDraftConfigBadTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(MlaDraftConfigBadTest, IsRefusedWithAClearMessage) {
  const BadCase& c = GetParam();
  const absl::StatusOr<MlaDraftConfig> config = MlaDraftConfig::FromJson(c.json, "draft.json");
  ASSERT_FALSE(config.ok()) << c.name;
  EXPECT_EQ(config.status().code(), c.code) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr("draft.json")) << config.status();
  for (const std::string& s : c.substrings) {
    EXPECT_THAT(config.status().message(), HasSubstr(s)) << config.status();
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaDraftConfigBadTest, ::testing::ValuesIn(BadCases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace eagle3
