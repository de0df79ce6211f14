#include "eagle3/mtp_config.h"

#include <string>
#include <vector>

#include "config_test_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::eagle3::testing::EditedConfig;
using ::eagle3::testing::ReadConfigText;
using ::eagle3::testing::WithoutQuantization;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kV3[] = "deepseek-ai_DeepSeek-V3.json";

DeepseekV2Config Target(const std::string& text) {
  absl::StatusOr<DeepseekV2Config> config = DeepseekV2Config::FromJson(text, "target.json");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DeepseekV2Config();
}

TEST(MtpConfigTest, DeepSeekV3HasOneMoeModuleAtLayer61) {
  for (const std::string& text : {ReadConfigText(kV3), WithoutQuantization(kV3)}) {
    const DeepseekV2Config v3 = Target(text);
    absl::StatusOr<MtpConfig> mtp = MtpConfig::FromTarget(v3);
    ASSERT_TRUE(mtp.ok()) << mtp.status();
    EXPECT_EQ(mtp->num_modules, 1);
    EXPECT_EQ(mtp->first_layer, 61);
    EXPECT_EQ(mtp->LayerIndex(0), 61);
    EXPECT_EQ(mtp->module_is_moe, std::vector<bool>{true});
    EXPECT_EQ(mtp->LayerPrefix(0), "model.layers.61.");
    EXPECT_EQ(mtp->source, "target.json");
    // One module drafts every step.
    for (int64_t step = 0; step < 5; ++step) EXPECT_EQ(mtp->ModuleForStep(step), 0);
  }
}

TEST(MtpConfigTest, SeveralModulesRunInTurn) {
  const DeepseekV2Config c = Target(EditedConfig(kV3, [](Json& j) {
    j["num_nextn_predict_layers"] = 3;
    j.erase("quantization_config");
  }));
  absl::StatusOr<MtpConfig> mtp = MtpConfig::FromTarget(c);
  ASSERT_TRUE(mtp.ok()) << mtp.status();
  EXPECT_EQ(mtp->num_modules, 3);
  EXPECT_EQ(mtp->LayerIndex(2), 63);
  EXPECT_EQ(mtp->LayerPrefix(2), "model.layers.63.");
  EXPECT_EQ(
      (std::vector<int64_t>{mtp->ModuleForStep(0), mtp->ModuleForStep(1), mtp->ModuleForStep(2),
                            mtp->ModuleForStep(3), mtp->ModuleForStep(4)}),
      (std::vector<int64_t>{0, 1, 2, 0, 1}));
  EXPECT_EQ(mtp->module_is_moe, (std::vector<bool>{true, true, true}));
}

TEST(MtpConfigTest, ModuleMlpFollowsTheLayerRuleByCheckpointIndex) {
  // moe_layer_freq 2: layer 61 is dense, 62 MoE (the rule vLLM applies to the MTP layer's index).
  const DeepseekV2Config c = Target(EditedConfig(kV3, [](Json& j) {
    j["num_nextn_predict_layers"] = 2;
    j["moe_layer_freq"] = 2;
    j.erase("quantization_config");
  }));
  EXPECT_FALSE(c.IsMoeLayer(61));
  EXPECT_TRUE(c.IsMoeLayer(62));
  EXPECT_FALSE(c.IsMoeLayer(63));  // past the last MTP layer
  absl::StatusOr<MtpConfig> mtp = MtpConfig::FromTarget(c);
  ASSERT_TRUE(mtp.ok()) << mtp.status();
  EXPECT_EQ(mtp->module_is_moe, (std::vector<bool>{false, true}));

  // A dense V3-family model with an MTP module: dense module.
  const DeepseekV2Config dense = Target(EditedConfig(kV3, [](Json& j) {
    j["n_routed_experts"] = nullptr;
    j.erase("quantization_config");
  }));
  EXPECT_EQ(MtpConfig::FromTarget(dense)->module_is_moe, std::vector<bool>{false});
}

TEST(MtpConfigTest, KimiK25UsesItsTensorPrefixButHasNoModule) {
  const DeepseekV2Config k25 = Target(ReadConfigText("moonshotai_Kimi-K2.5.json"));
  const absl::Status none = MtpConfig::FromTarget(k25).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.message(), HasSubstr("target.json"));
  EXPECT_THAT(none.message(), HasSubstr("key 'num_nextn_predict_layers' is 0"));
  EXPECT_THAT(none.message(), HasSubstr("carries no MTP module"));

  // Were one stated, its names would carry K2.5's language-model prefix.
  const DeepseekV2Config with_one = Target(EditedConfig("moonshotai_Kimi-K2.5.json", [](Json& j) {
    j["text_config"]["num_nextn_predict_layers"] = 1;
  }));
  EXPECT_EQ(MtpConfig::FromTarget(with_one)->LayerPrefix(0), "language_model.model.layers.61.");
}

TEST(MtpConfigTest, RefusesTargetsWithoutModules) {
  for (const char* name : {"moonshotai_Kimi-K2-Instruct.json", "deepseek-ai_DeepSeek-V2.json",
                           "deepseek-ai_DeepSeek-V2-Lite-Chat.json"}) {
    const absl::Status none = MtpConfig::FromTarget(Target(WithoutQuantization(name))).status();
    EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(none.message(), HasSubstr("num_nextn_predict_layers")) << name;
  }
  // The key absent reads as 0.
  const DeepseekV2Config absent = Target(EditedConfig(kV3, [](Json& j) {
    j.erase("num_nextn_predict_layers");
    j.erase("quantization_config");
  }));
  EXPECT_THAT(MtpConfig::FromTarget(absent).status().message(), HasSubstr("absent counts as 0"));
}

TEST(MtpConfigTest, RefusesModulesOnDeepSeekV2) {
  const DeepseekV2Config v2 = Target(EditedConfig(
      "deepseek-ai_DeepSeek-V2.json", [](Json& j) { j["num_nextn_predict_layers"] = 1; }));
  const absl::Status status = MtpConfig::FromTarget(v2).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("deepseek_v2"));
  EXPECT_THAT(status.message(), HasSubstr("num_nextn_predict_layers' = 1"));
}

}  // namespace
}  // namespace eagle3
