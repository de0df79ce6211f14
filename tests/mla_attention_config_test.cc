#include "eagle3/mla_attention_config.h"

#include <cmath>
#include <string>

#include "config_test_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/mla_draft_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::eagle3::testing::EditedConfig;
using ::eagle3::testing::ReadConfigText;
using ::eagle3::testing::WithoutQuantization;
using ::testing::HasSubstr;
using Json = nlohmann::json;

DeepseekV2Config Target(const std::string& text) {
  absl::StatusOr<DeepseekV2Config> config = DeepseekV2Config::FromJson(text, "target.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DeepseekV2Config();
}

TEST(MlaAttentionConfigTest, TargetLayers) {
  const DeepseekV2Config v3 = Target(WithoutQuantization("deepseek-ai_DeepSeek-V3.json"));
  const MlaAttentionConfig a = MlaAttentionConfig::ForTarget(v3);
  EXPECT_EQ(a.input_width, 7168);
  EXPECT_EQ(a.output_width, 7168);
  EXPECT_EQ(a.num_heads, 128);
  EXPECT_EQ(a.q_lora_rank, 1536);
  EXPECT_EQ(a.kv_lora_rank, 512);
  EXPECT_EQ(a.qk_head_dim(), 192);
  EXPECT_EQ(a.v_head_dim, 128);
  EXPECT_EQ(a.latent_cache_width(), 576);
  EXPECT_EQ(a.rms_norm_eps, v3.rms_norm_eps);
  EXPECT_EQ(a.rope, v3.rope);
  // The target's softmax scale is the shared formula's.
  EXPECT_EQ(a.SoftmaxScale(), v3.SoftmaxScale());
  const double m = 0.1 * 1.0 * std::log(40.0) + 1.0;  // V3: YaRN x40, mscale_all_dim 1.0
  EXPECT_DOUBLE_EQ(a.SoftmaxScale(), m * m / std::sqrt(192.0));

  // V2-Lite: plain q_proj.
  const MlaAttentionConfig lite = MlaAttentionConfig::ForTarget(
      Target(ReadConfigText("deepseek-ai_DeepSeek-V2-Lite-Chat.json")));
  EXPECT_FALSE(lite.q_lora_rank.has_value());
}

// An MLA draft whose dims and RoPE equal its target's describes the same block but for the 2H
// input: the one MLA layer implementation serves both.
TEST(MlaAttentionConfigTest, DraftDiffersFromItsTargetOnlyInInputWidth) {
  const DeepseekV2Config k25 = Target(ReadConfigText("moonshotai_Kimi-K2.5.json"));
  absl::StatusOr<MlaDraftConfig> draft = MlaDraftConfig::FromJson(
      EditedConfig("modeled_kimi-k25-eagle3-mla.torchspec-vllm-export.json",
                   [](Json& j) { j["rope_scaling"]["beta_fast"] = 32.0; }),
      "draft.json");
  ASSERT_TRUE(draft.ok()) << draft.status();
  const MlaAttentionConfig target = MlaAttentionConfig::ForTarget(k25);
  MlaAttentionConfig drafted = draft->attention();
  EXPECT_EQ(drafted.input_width, 2 * target.input_width);
  drafted.input_width = target.input_width;
  EXPECT_EQ(drafted, target);
}

TEST(MlaAttentionConfigTest, ValidateForTp) {
  const MlaAttentionConfig a =
      MlaAttentionConfig::ForTarget(Target(WithoutQuantization("deepseek-ai_DeepSeek-V3.json")));
  EXPECT_TRUE(a.ValidateForTp(8, "v3").ok());
  EXPECT_TRUE(a.ValidateForTp(64, "v3").ok());
  EXPECT_THAT(a.ValidateForTp(3, "v3").message(),
              HasSubstr("v3: num_attention_heads = 128 is not divisible by tp_size 3"));
  EXPECT_THAT(a.ValidateForTp(65, "v3").message(), HasSubstr("tp_size 65 is out of range [1, 64]"));
}

TEST(MlaAttentionConfigTest, SoftmaxScaleWithoutYarnIsPlain) {
  RopeConfig rope;
  EXPECT_DOUBLE_EQ(MlaSoftmaxScale(192, rope), 1.0 / std::sqrt(192.0));
  rope.scaling.type = RopeScaling::Type::kYarn;
  rope.scaling.factor = 40.0;
  rope.scaling.mscale_all_dim = 0.0;  // unset: no correction
  EXPECT_DOUBLE_EQ(MlaSoftmaxScale(192, rope), 1.0 / std::sqrt(192.0));
}

}  // namespace
}  // namespace eagle3
