// The weight schema against the published sizes of the real models: total and activated parameter
// counts follow from every tensor's name and shape, so a wrong shape or a missing expert shows here.
#include "eagle3/deepseek_v2_weights.h"

#include <string>

#include "config_test_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

// The published V3 / K2 checkpoints are FP8 (quantization_config); their bf16 conversions have the
// same config without that key and the same tensor shapes.
DeepseekV2Config LoadAsBf16(const std::string& file) {
  auto config = DeepseekV2Config::FromJson(testing::WithoutQuantization(file), file);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DeepseekV2Config{};
}

struct Counts {
  double total = 0;
  // Per token: all but the routed experts a token does not use and the embedding table (a lookup
  // reads one row), as the model cards count.
  double activated = 0;
};

Counts CountParameters(const DeepseekV2Config& c) {
  Counts counts;
  double routed = 0, embedding = 0;
  for (const WeightSpec& spec : DeepseekV2Weights(c)) {
    const double n = static_cast<double>(spec.shape.numel());
    counts.total += n;
    if (spec.name.find(".mlp.experts.") != std::string::npos) routed += n;
    if (spec.name == "model.embed_tokens.weight") embedding = n;
  }
  const double experts = c.n_routed_experts.value_or(1);
  counts.activated = counts.total - embedding - routed + routed * c.num_experts_per_tok / experts;
  return counts;
}

struct Published {
  const char* file;
  double total;      // model cards: "236B total parameters, 21B activated", ...
  double activated;
};

class PublishedSizeTest : public ::testing::TestWithParam<Published> {};

TEST_P(PublishedSizeTest, ParameterCountsMatchTheModelCard) {
  const Published& p = GetParam();
  const Counts counts = CountParameters(LoadAsBf16(p.file));
  EXPECT_NEAR(counts.total / p.total, 1.0, 0.01) << p.file << " total " << counts.total;
  // Cards round activated counts to two or three digits.
  EXPECT_NEAR(counts.activated / p.activated, 1.0, 0.05) << p.file << " activated " << counts.activated;
}

INSTANTIATE_TEST_SUITE_P(
    RealModels, PublishedSizeTest,
    ::testing::Values(Published{"deepseek-ai_DeepSeek-V2-Lite-Chat.json", 15.7e9, 2.4e9},
                      Published{"deepseek-ai_DeepSeek-V2.json", 236e9, 21e9},
                      Published{"deepseek-ai_DeepSeek-V3.json", 671e9, 37e9},
                      Published{"moonshotai_Kimi-K2-Instruct.json", 1.03e12, 32e9}));

// At TP 8, every split dim of every real model divides evenly, and each rank holds 1/8 of each
// sharded tensor (vocab tables padded to 64 · 8).
TEST(DeepseekV2WeightsTest, RealModelsShardEightWays) {
  for (const char* file : {"deepseek-ai_DeepSeek-V2.json", "deepseek-ai_DeepSeek-V3.json",
                           "moonshotai_Kimi-K2-Instruct.json", "deepseek-ai_DeepSeek-V2-Lite-Chat.json"}) {
    const DeepseekV2Config c = LoadAsBf16(file);
    ASSERT_TRUE(c.ValidateForTp(8).ok()) << file;
    for (const WeightSpec& spec : DeepseekV2Weights(c)) {
      if (spec.split == TpSplit::kReplicated) continue;
      const ShardSpec shard = spec.ForRank(8, 7);
      const int64_t dim = spec.shape[shard.dim];
      const int64_t padded = spec.vocab_padded ? PaddedSize(dim, 512) : dim;
      ASSERT_EQ(padded % 8, 0) << file << " " << spec.name;
    }
  }
}

}  // namespace
}  // namespace eagle3
