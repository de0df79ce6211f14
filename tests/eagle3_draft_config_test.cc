#include "eagle3/eagle3_draft_config.h"

#include <string>
#include <vector>

#include "config_test_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::eagle3::testing::ConfigPath;
using ::eagle3::testing::EditedConfig;
using ::eagle3::testing::ReadConfigText;
using ::eagle3::testing::WithoutQuantization;
using ::testing::HasSubstr;

constexpr char kV3Draft[] = "sgl-project_SpecForge_deepseek-v3-671b-eagle3.json";
constexpr char kR1Draft[] = "sgl-project_SpecForge_deepseek-r1-671b-eagle3.json";
constexpr char kK2Draft[] = "sgl-project_SpecForge_kimi-k2-eagle3.json";
constexpr char kK25Draft[] = "sgl-project_SpecForge_kimi-k25-eagle3.json";

Eagle3DraftConfig ParseDraft(const std::string& text) {
  absl::StatusOr<Eagle3DraftConfig> config = Eagle3DraftConfig::FromJson(text, "draft.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : Eagle3DraftConfig();
}

DeepseekV2Config Target(const std::string& fp8_hub_config) {
  absl::StatusOr<DeepseekV2Config> config =
      DeepseekV2Config::FromJson(WithoutQuantization(fp8_hub_config), "target.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DeepseekV2Config();
}

TEST(Eagle3DraftConfigTest, SpecForgeDeepSeekV3Draft) {
  absl::StatusOr<Eagle3DraftConfig> file = Eagle3DraftConfig::FromFile(ConfigPath(kV3Draft));
  ASSERT_TRUE(file.ok()) << file.status();
  const Eagle3DraftConfig& c = *file;
  EXPECT_EQ(c.architecture, "LlamaForCausalLMEagle3");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.target_hidden_size, 7168);  // defaulted
  EXPECT_EQ(c.num_attention_heads, 56);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // 7168 / 56
  EXPECT_EQ(c.intermediate_size, 40960);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.draft_vocab_size, 32000);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_EQ(c.rope.theta, 10000.0);  // Llama's default: the file names no theta
  EXPECT_EQ(c.rope.scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c.num_hidden_layers, 1);
  EXPECT_FALSE(c.tie_word_embeddings);
  ASSERT_TRUE(c.aux_layer_ids.has_value());
  EXPECT_EQ(*c.aux_layer_ids, (std::vector<int>{1, 29, 57}));
  EXPECT_FALSE(c.norm_before_residual);
  EXPECT_FALSE(c.norm_before_fc);
  EXPECT_FALSE(c.fc_norm);
  EXPECT_FALSE(c.norm_output);
  EXPECT_EQ(c.fc_input_width(), 3 * 7168);
  EXPECT_THAT(c.source, HasSubstr(kV3Draft));

  EXPECT_TRUE(CheckDraftAgainstTarget(c, Target("deepseek-ai_DeepSeek-V3.json")).ok());
}

TEST(Eagle3DraftConfigTest, SpecForgeKimiDrafts) {
  const DeepseekV2Config k2 = Target("moonshotai_Kimi-K2-Instruct.json");
  for (const char* name : {kK2Draft, kK25Draft}) {
    const Eagle3DraftConfig c = ParseDraft(ReadConfigText(name));
    EXPECT_EQ(c.hidden_size, 7168) << name;
    EXPECT_EQ(c.num_attention_heads, 64);
    EXPECT_EQ(c.num_key_value_heads, 64);
    EXPECT_EQ(c.head_dim, 128);  // explicit; 64 * 128 != 7168
    EXPECT_EQ(c.intermediate_size, 18432);
    EXPECT_EQ(c.vocab_size, 163840);
    EXPECT_EQ(c.draft_vocab_size, 32000);
    EXPECT_EQ(c.rope.theta, 1000000.0);
    EXPECT_EQ(c.rope.scaling.type, RopeScaling::Type::kNone);  // "rope_scaling": null
    EXPECT_EQ(c.rms_norm_eps, 1e-6);
    EXPECT_EQ(*c.aux_layer_ids, (std::vector<int>{2, 30, 58}));
    EXPECT_TRUE(CheckDraftAgainstTarget(c, k2).ok()) << CheckDraftAgainstTarget(c, k2);
  }
  EXPECT_EQ(ParseDraft(ReadConfigText(kK2Draft)).model_type, "kimi_k2");
}

TEST(Eagle3DraftConfigTest, SpecForgeR1DraftHasWideHeads) {
  const Eagle3DraftConfig c = ParseDraft(ReadConfigText(kR1Draft));
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.head_dim, 224);
  EXPECT_EQ(c.intermediate_size, 29568);
}

TEST(Eagle3DraftConfigTest, VariantKeysAtTopLevelOrInEagleConfig) {
  const Eagle3DraftConfig top = ParseDraft(EditedConfig(kV3Draft, [](nlohmann::json& j) {
    j["norm_before_residual"] = true;
    j["fc_norm"] = true;
  }));
  EXPECT_TRUE(top.norm_before_residual);
  EXPECT_TRUE(top.fc_norm);
  EXPECT_FALSE(top.norm_before_fc);
  EXPECT_FALSE(top.norm_output);

  // NVIDIA ModelOpt checkpoints write them inside eagle_config.
  const Eagle3DraftConfig nested = ParseDraft(EditedConfig(kV3Draft, [](nlohmann::json& j) {
    j["eagle_config"]["norm_before_fc"] = true;
    j["eagle_config"]["norm_output"] = true;
    j["norm_output"] = true;
  }));
  EXPECT_TRUE(nested.norm_before_fc);
  EXPECT_TRUE(nested.norm_output);
  EXPECT_FALSE(nested.norm_before_residual);
}

TEST(Eagle3DraftConfigTest, TopLevelAuxIdsTargetHiddenAndVllmAlias) {
  const Eagle3DraftConfig c = ParseDraft(EditedConfig(kV3Draft, [](nlohmann::json& j) {
    j.erase("eagle_config");
    j["eagle_aux_hidden_state_layer_ids"] = {2, 30};
    j["architectures"] = {"Eagle3LlamaForCausalLM"};
    j["hidden_size"] = 4096;
    j["num_attention_heads"] = 32;
    j["target_hidden_size"] = 7168;
  }));
  EXPECT_EQ(c.architecture, "Eagle3LlamaForCausalLM");
  EXPECT_EQ(*c.aux_layer_ids, (std::vector<int>{2, 30}));
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.target_hidden_size, 7168);
  EXPECT_EQ(c.fc_input_width(), 2 * 7168);

  const Eagle3DraftConfig no_ids =
      ParseDraft(EditedConfig(kV3Draft, [](nlohmann::json& j) { j.erase("eagle_config"); }));
  EXPECT_FALSE(no_ids.aux_layer_ids.has_value());
  EXPECT_EQ(no_ids.fc_input_width(), 3 * 7168);
}

TEST(Eagle3DraftConfigTest, DraftRopeScalingIncludingLlama3AndTransformers5) {
  const Eagle3DraftConfig llama3 = ParseDraft(EditedConfig(kV3Draft, [](nlohmann::json& j) {
    j["rope_theta"] = 500000.0;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  }));
  EXPECT_EQ(llama3.rope.theta, 500000.0);
  EXPECT_EQ(llama3.rope.scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(llama3.rope.scaling.factor, 8.0);
  EXPECT_EQ(llama3.rope.scaling.high_freq_factor, 4.0);
  EXPECT_EQ(llama3.rope.scaling.original_max_position_embeddings, 8192);

  const Eagle3DraftConfig yarn = ParseDraft(EditedConfig(kV3Draft, [](nlohmann::json& j) {
    j["rope_parameters"] = {{"rope_type", "yarn"},
                            {"rope_theta", 10000},
                            {"factor", 4.0},
                            {"original_max_position_embeddings", 32768},
                            {"attention_factor", 0.8782488562869419}};
  }));
  EXPECT_EQ(yarn.rope.scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(yarn.rope.scaling.attention_factor, 0.8782488562869419);
  EXPECT_EQ(yarn.rope.scaling.beta_fast, 32.0);
}

TEST(Eagle3DraftConfigTest, CheckAgainstTargetExplainsTheLayerIdConvention) {
  const DeepseekV2Config v3 = Target("deepseek-ai_DeepSeek-V3.json");
  Eagle3DraftConfig draft = ParseDraft(ReadConfigText(kV3Draft));
  draft.aux_layer_ids = std::vector<int>{0, 60};
  EXPECT_TRUE(CheckDraftAgainstTarget(draft, v3).ok());

  draft.aux_layer_ids = std::vector<int>{1, 61};
  absl::Status past_end = CheckDraftAgainstTarget(draft, v3);
  EXPECT_EQ(past_end.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past_end.message(), HasSubstr("eagle_aux_hidden_state_layer_ids[1] = 61"));
  EXPECT_THAT(past_end.message(), HasSubstr("valid ids are 0..60"));
  EXPECT_THAT(past_end.message(), HasSubstr("target.json"));

  draft.aux_layer_ids = std::vector<int>{-1, 29};
  absl::Status negative = CheckDraftAgainstTarget(draft, v3);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("[0] = -1 is negative"));
  EXPECT_THAT(negative.message(), HasSubstr("output-of-layer convention"));
  EXPECT_THAT(negative.message(), HasSubstr("There is no -1 = embedding"));
  EXPECT_THAT(negative.message(), HasSubstr("boundary 0"));

  // A V3 draft against the Kimi target: widths agree, vocabularies do not.
  draft.aux_layer_ids.reset();
  absl::Status vocab = CheckDraftAgainstTarget(draft, Target("moonshotai_Kimi-K2-Instruct.json"));
  EXPECT_THAT(vocab.message(), HasSubstr("draft vocab_size = 129280"));
  EXPECT_THAT(vocab.message(), HasSubstr("target vocab_size = 163840"));
}

}  // namespace
}  // namespace eagle3
