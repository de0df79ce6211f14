#include "eagle3/deepseek_v2_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "config_test_util.h"
#include "eagle3/rope_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::eagle3::testing::ConfigPath;
using ::eagle3::testing::EditedConfig;
using ::eagle3::testing::ReadConfigText;
using ::eagle3::testing::WithoutQuantization;
using ::testing::HasSubstr;

constexpr char kV2[] = "deepseek-ai_DeepSeek-V2.json";
constexpr char kV2Lite[] = "deepseek-ai_DeepSeek-V2-Lite-Chat.json";
constexpr char kV2LiteTf5[] = "deepseek-ai_DeepSeek-V2-Lite-Chat.transformers5.json";
constexpr char kV3[] = "deepseek-ai_DeepSeek-V3.json";
constexpr char kK2[] = "moonshotai_Kimi-K2-Instruct.json";
constexpr char kK25[] = "moonshotai_Kimi-K2.5.json";

DeepseekV2Config Parse(const std::string& text, const std::string& source = "test") {
  absl::StatusOr<DeepseekV2Config> config = DeepseekV2Config::FromJson(text, source);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DeepseekV2Config();
}

// YaRN m^2 / sqrt(192), written out independently of the library.
double ExpectedYarnScale(double factor, double mscale_all_dim) {
  const double m = 0.1 * mscale_all_dim * std::log(factor) + 1.0;
  return m * m / std::sqrt(192.0);
}

TEST(DeepseekV2ConfigTest, DeepSeekV2) {
  const DeepseekV2Config c = Parse(ReadConfigText(kV2));
  EXPECT_EQ(c.model_type, DeepseekModelType::kDeepseekV2);
  EXPECT_EQ(c.vocab_size, 102400);
  EXPECT_EQ(c.hidden_size, 5120);
  EXPECT_EQ(c.intermediate_size, 12288);
  EXPECT_EQ(c.num_hidden_layers, 60);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.n_routed_experts, 160);
  EXPECT_EQ(c.moe_intermediate_size, 1536);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.routed_scaling_factor, 16.0);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(c.topk_method, TopkMethod::kGroupLimitedGreedy);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 3);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.moe_layer_freq, 1);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.latent_cache_width(), 576);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_EQ(c.rope.theta, 10000.0);
  EXPECT_EQ(c.rope.scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope.scaling.factor, 40.0);
  EXPECT_EQ(c.rope.scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope.scaling.beta_fast, 32.0);
  EXPECT_EQ(c.rope.scaling.beta_slow, 1.0);
  EXPECT_EQ(c.rope.scaling.mscale, 0.707);
  EXPECT_EQ(c.rope.scaling.mscale_all_dim, 0.707);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 100000);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{100001});
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.source, "test");
}

TEST(DeepseekV2ConfigTest, DeepSeekV2LiteHasNoQLoraAndGreedyRouting) {
  const DeepseekV2Config c = Parse(ReadConfigText(kV2Lite));
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 27);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.intermediate_size, 10944);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.latent_cache_width(), 576);
}

TEST(DeepseekV2ConfigTest, DeepSeekV3) {
  const DeepseekV2Config c = Parse(WithoutQuantization(kV3));
  EXPECT_EQ(c.model_type, DeepseekModelType::kDeepseekV3);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.n_routed_experts, 256);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.first_k_dense_replace, 3);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_EQ(c.rope.scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{1});
  EXPECT_EQ(c.latent_cache_width(), 576);
  EXPECT_NEAR(c.SoftmaxScale(), ExpectedYarnScale(40.0, 1.0), 1e-15);
}

TEST(DeepseekV2ConfigTest, KimiK2) {
  const DeepseekV2Config c = Parse(WithoutQuantization(kK2));
  EXPECT_EQ(c.model_type, DeepseekModelType::kKimiK2);
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.routed_scaling_factor, 2.827);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.rope.theta, 50000.0);
  EXPECT_EQ(c.rope.scaling.factor, 32.0);
  EXPECT_EQ(c.rope.scaling.beta_fast, 1.0);
  EXPECT_EQ(c.rope.scaling.beta_slow, 1.0);
  EXPECT_NEAR(c.SoftmaxScale(), ExpectedYarnScale(32.0, 1.0), 1e-15);
}

// Kimi-K2.5's multimodal config: the text backbone from text_config, INT4 group 32 with its ignore
// list, the vision part accepted unread, the checkpoint's language model under "language_model.".
TEST(DeepseekV2ConfigTest, KimiK25ReadsItsTextBackbone) {
  const DeepseekV2Config c = Parse(ReadConfigText(kK25));
  EXPECT_EQ(c.model_type, DeepseekModelType::kDeepseekV3);  // text_config's model_type
  EXPECT_EQ(c.tensor_prefix, "language_model.");
  EXPECT_EQ(c.vocab_size, 163840);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.routed_scaling_factor, 2.827);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c.n_group, 1);
  EXPECT_EQ(c.topk_group, 1);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.first_k_dense_replace, 1);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.max_position_embeddings, 262144);
  EXPECT_EQ(c.rope.theta, 50000.0);
  EXPECT_EQ(c.rope.scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(c.rope.scaling.factor, 64.0);
  EXPECT_EQ(c.rope.scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c.rope.scaling.beta_fast, 32.0);
  EXPECT_EQ(c.rope.scaling.beta_slow, 1.0);
  EXPECT_NEAR(c.SoftmaxScale(), ExpectedYarnScale(64.0, 1.0), 1e-15);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 163584);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{163585});
  EXPECT_EQ(c.num_nextn_predict_layers, 0);
  EXPECT_EQ(c.quantization.format, WeightFormat::kInt4Group);
  EXPECT_EQ(c.quantization.group_size, 32);
  EXPECT_EQ(c.quantization.ignore,
            (std::vector<std::string>{"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                                      "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"}));
  EXPECT_TRUE(c.ValidateForTp(8).ok());
  // The quantization_config in either place alone gives the same config.
  for (const bool top : {true, false}) {
    const DeepseekV2Config one = Parse(EditedConfig(kK25, [&](nlohmann::json& j) {
      (top ? j["text_config"] : j).erase("quantization_config");
    }));
    EXPECT_EQ(one.quantization, c.quantization) << top;
  }
  const DeepseekV2Config bf16 = Parse(EditedConfig(kK25, [](nlohmann::json& j) {
    j.erase("quantization_config");
    j["text_config"].erase("quantization_config");
  }));
  EXPECT_FALSE(bf16.quantization.quantized());
  // vision_config is not read: its contents do not matter.
  const DeepseekV2Config other_vision =
      Parse(EditedConfig(kK25, [](nlohmann::json& j) { j["vision_config"]["some_future_key"] = 1; }));
  EXPECT_EQ(other_vision.hidden_size, 7168);
}

TEST(DeepseekV2ConfigTest, KimiK25MalformedWrappersAreRefusedByKey) {
  const struct {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expected;
  } cases[] = {
      {"no text_config", [](nlohmann::json& j) { j.erase("text_config"); }, "missing required key 'text_config'"},
      {"text_config not an object", [](nlohmann::json& j) { j["text_config"] = 3; }, "text_config"},
      {"unknown top-level key", [](nlohmann::json& j) { j["audio_config"] = nlohmann::json::object(); },
       "key 'audio_config'"},
      {"unknown text_config key", [](nlohmann::json& j) { j["text_config"]["moe_router_jitter"] = 0.1; },
       "key 'text_config.moe_router_jitter'"},
      {"text_config missing a key", [](nlohmann::json& j) { j["text_config"].erase("kv_lora_rank"); },
       "text_config.kv_lora_rank"},
      {"the wrapper nested", [](nlohmann::json& j) { j["text_config"]["model_type"] = "kimi_k25"; },
       "text_config.model_type"},
      {"quantization_configs disagree",
       [](nlohmann::json& j) { j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 128; },
       "key 'quantization_config': differs from text_config.quantization_config"},
      {"tie_word_embeddings disagrees", [](nlohmann::json& j) { j["tie_word_embeddings"] = true; },
       "differs from text_config.tie_word_embeddings"},
      {"eos disagrees", [](nlohmann::json& j) { j["eos_token_id"] = 7; }, "differs from text_config.eos_token_id"},
      {"vision_config not an object", [](nlohmann::json& j) { j["vision_config"] = "moonvit"; }, "vision_config"},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<DeepseekV2Config> parsed = DeepseekV2Config::FromJson(EditedConfig(kK25, c.edit), "k25");
    ASSERT_FALSE(parsed.ok()) << c.what;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.expected)) << c.what;
  }
}

TEST(DeepseekV2ConfigTest, Fp8HubCheckpointsParseTheirQuantizationConfig) {
  for (const char* name : {kV3, kK2}) {
    absl::StatusOr<DeepseekV2Config> c = DeepseekV2Config::FromFile(ConfigPath(name));
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
    EXPECT_EQ(c->quantization.format, WeightFormat::kFp8Block) << name;
    EXPECT_EQ(c->quantization.block_out, 128);
    EXPECT_EQ(c->quantization.block_in, 128);
    EXPECT_EQ(c->quantization.activation_scheme, "dynamic");
    // The bf16 conversions' config: the same model, unquantized.
    const DeepseekV2Config bf16 = Parse(WithoutQuantization(name));
    EXPECT_FALSE(bf16.quantization.quantized());
    EXPECT_EQ(bf16.hidden_size, c->hidden_size);
  }
}

TEST(DeepseekV2ConfigTest, SoftmaxScaleOfV2IncludesYarnMscaleSquared) {
  const DeepseekV2Config c = Parse(ReadConfigText(kV2));
  // 1 + 0.1 * 0.707 * ln 40 = 1.26081; squared = 1.58964; / sqrt(192) = 0.114721.
  EXPECT_NEAR(c.SoftmaxScale(), ExpectedYarnScale(40.0, 0.707), 1e-15);
  EXPECT_NEAR(c.SoftmaxScale(), 0.11472138679292612, 1e-12);
  EXPECT_EQ(YarnGetMscale(40.0, 0.707), 0.1 * 0.707 * std::log(40.0) + 1.0);

  // No YaRN, or YaRN without mscale_all_dim: the plain 1/sqrt(d).
  const DeepseekV2Config plain =
      Parse(EditedConfig(kV2, [](nlohmann::json& j) { j["rope_scaling"] = nullptr; }));
  EXPECT_DOUBLE_EQ(plain.SoftmaxScale(), 1.0 / std::sqrt(192.0));
  const DeepseekV2Config no_all_dim = Parse(
      EditedConfig(kV2, [](nlohmann::json& j) { j["rope_scaling"].erase("mscale_all_dim"); }));
  EXPECT_DOUBLE_EQ(no_all_dim.SoftmaxScale(), 1.0 / std::sqrt(192.0));
}

TEST(DeepseekV2ConfigTest, IsMoeLayer) {
  const DeepseekV2Config v2 = Parse(ReadConfigText(kV2));
  EXPECT_FALSE(v2.IsMoeLayer(0));
  EXPECT_TRUE(v2.IsMoeLayer(1));
  EXPECT_TRUE(v2.IsMoeLayer(59));
  EXPECT_FALSE(v2.IsMoeLayer(60));
  EXPECT_FALSE(v2.IsMoeLayer(-1));

  const DeepseekV2Config v3 = Parse(WithoutQuantization(kV3));
  EXPECT_FALSE(v3.IsMoeLayer(2));
  EXPECT_TRUE(v3.IsMoeLayer(3));
  EXPECT_TRUE(v3.IsMoeLayer(60));

  // moe_layer_freq 2 after one dense layer: only even layers from 2 on are MoE.
  const DeepseekV2Config every_other =
      Parse(EditedConfig(kV2Lite, [](nlohmann::json& j) { j["moe_layer_freq"] = 2; }));
  EXPECT_FALSE(every_other.IsMoeLayer(1));
  EXPECT_TRUE(every_other.IsMoeLayer(2));
  EXPECT_FALSE(every_other.IsMoeLayer(3));
  EXPECT_TRUE(every_other.IsMoeLayer(26));

  // n_routed_experts null: a dense model, other MoE keys may be null too.
  const DeepseekV2Config dense = Parse(EditedConfig(kV2Lite, [](nlohmann::json& j) {
    j["n_routed_experts"] = nullptr;
    j["num_experts_per_tok"] = nullptr;
    j["n_shared_experts"] = nullptr;
  }));
  EXPECT_FALSE(dense.is_moe());
  for (int layer = 0; layer < 27; ++layer) EXPECT_FALSE(dense.IsMoeLayer(layer)) << layer;
}

TEST(DeepseekV2ConfigTest, ValidateForTp) {
  for (const std::string& text : {ReadConfigText(kV2), ReadConfigText(kV2Lite),
                                  WithoutQuantization(kV3), WithoutQuantization(kK2)}) {
    const DeepseekV2Config c = Parse(text);
    EXPECT_TRUE(c.ValidateForTp(8).ok()) << c.ValidateForTp(8);
    EXPECT_TRUE(c.ValidateForTp(1).ok());
  }
  const DeepseekV2Config lite = Parse(ReadConfigText(kV2Lite));
  EXPECT_EQ(lite.num_attention_heads, 16);
  EXPECT_TRUE(lite.ValidateForTp(16).ok());
  // 16 heads cannot be split over 32 ranks.
  EXPECT_THAT(lite.ValidateForTp(32).message(),
              HasSubstr("num_attention_heads = 16 is not divisible by tp_size 32"));
  absl::Status zero = lite.ValidateForTp(0);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.message(), HasSubstr("tp_size 0 is out of range [1, 64]"));
  EXPECT_FALSE(lite.ValidateForTp(65).ok());

  const DeepseekV2Config twenty_heads = Parse(EditedConfig(kV2Lite,
                                                           [](nlohmann::json& j) {
                                                             j["num_attention_heads"] = 20;
                                                             j["num_key_value_heads"] = 20;
                                                           }),
                                              "made-up.json");
  absl::Status s = twenty_heads.ValidateForTp(8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("num_attention_heads = 20 is not divisible by tp_size 8"));
  EXPECT_THAT(s.message(), HasSubstr("made-up.json"));
  EXPECT_TRUE(twenty_heads.ValidateForTp(4).ok());

  const DeepseekV2Config odd_experts =
      Parse(EditedConfig(kV2Lite, [](nlohmann::json& j) { j["moe_intermediate_size"] = 1404; }));
  EXPECT_THAT(odd_experts.ValidateForTp(8).message(),
              HasSubstr("moe_intermediate_size = 1404 is not divisible by tp_size 8"));
}

TEST(DeepseekV2ConfigTest, HubAndTransformers5FormsGiveTheSameConfig) {
  const DeepseekV2Config hub = Parse(ReadConfigText(kV2Lite));
  const DeepseekV2Config tf5 = Parse(ReadConfigText(kV2LiteTf5));
  EXPECT_EQ(hub.rope, tf5.rope);
  EXPECT_EQ(tf5.rope.scaling.type, RopeScaling::Type::kYarn);
  EXPECT_EQ(tf5.rope.theta, 10000.0);
  EXPECT_EQ(hub.SoftmaxScale(), tf5.SoftmaxScale());
  EXPECT_EQ(hub.hidden_size, tf5.hidden_size);
  EXPECT_EQ(hub.q_lora_rank, tf5.q_lora_rank);
  EXPECT_EQ(hub.n_routed_experts, tf5.n_routed_experts);

  // Both forms in one file are fine when they agree (transformers 5 may save rope_theta twice).
  const DeepseekV2Config both = Parse(EditedConfig(kV2LiteTf5, [](nlohmann::json& j) {
    j["rope_theta"] = 10000.0;
    j["rope_scaling"] = j["rope_parameters"];
    j["rope_scaling"].erase("rope_theta");
  }));
  EXPECT_EQ(both.rope, hub.rope);
}

TEST(DeepseekV2ConfigTest, TransformersInTreeDefaultsByModelType) {
  // transformers' in-tree DeepseekV3Config has no scoring_func / topk_method / moe_layer_freq.
  const DeepseekV2Config v3 = Parse(EditedConfig(kV3, [](nlohmann::json& j) {
    j.erase("quantization_config");
    j.erase("scoring_func");
    j.erase("topk_method");
    j.erase("moe_layer_freq");
    j["rope_interleave"] = true;
    j["head_dim"] = 64;
    j["qk_head_dim"] = 192;
  }));
  EXPECT_EQ(v3.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(v3.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(v3.moe_layer_freq, 1);
  const DeepseekV2Config v2 = Parse(EditedConfig(kV2Lite, [](nlohmann::json& j) {
    j.erase("scoring_func");
    j.erase("topk_method");
  }));
  EXPECT_EQ(v2.scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(v2.topk_method, TopkMethod::kGreedy);
}

TEST(DeepseekV2ConfigTest, EosListAndMissingTheta) {
  const DeepseekV2Config c = Parse(EditedConfig(kV2Lite, [](nlohmann::json& j) {
    j["eos_token_id"] = {100001, 100008};
    j.erase("rope_theta");
  }));
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{100001, 100008}));
  EXPECT_EQ(c.rope.theta, 10000.0);
}

TEST(DeepseekV2ConfigTest, FromFileAcceptsADirectoryAndNamesMissingFiles) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "eagle3_deepseek_config_dir";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(ConfigPath(kV2Lite), dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  absl::StatusOr<DeepseekV2Config> c = DeepseekV2Config::FromFile(dir.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->source, (dir / "config.json").string());

  absl::StatusOr<DeepseekV2Config> missing =
      DeepseekV2Config::FromFile((dir / "nope.json").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.json"));
  std::filesystem::remove_all(dir);
}

TEST(RopeConfigTest, YarnGetMscale) {
  EXPECT_EQ(YarnGetMscale(1.0, 0.707), 1.0);
  EXPECT_EQ(YarnGetMscale(0.5, 0.707), 1.0);
  EXPECT_EQ(YarnGetMscale(40.0, 0.0), 1.0);
  EXPECT_DOUBLE_EQ(YarnGetMscale(32.0, 1.0), 1.0 + 0.1 * std::log(32.0));
  EXPECT_EQ(RopeScalingTypeName(RopeScaling::Type::kYarn), "yarn");
}

TEST(RopeConfigTest, TypeSpellingsAndTransformers5Defaults) {
  // rope_type alone, and both spellings agreeing.
  const DeepseekV2Config rope_type = Parse(EditedConfig(kV2, [](nlohmann::json& j) {
    j["rope_scaling"].erase("type");
    j["rope_scaling"]["rope_type"] = "yarn";
  }));
  EXPECT_EQ(rope_type.rope.scaling.type, RopeScaling::Type::kYarn);
  const DeepseekV2Config linear = Parse(EditedConfig(kV2, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"type", "linear"}, {"rope_type", "linear"}, {"factor", 2}};
  }));
  EXPECT_EQ(linear.rope.scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(linear.rope.scaling.factor, 2.0);
  EXPECT_EQ(linear.rope.scaling.original_max_position_embeddings, 0);
  // transformers 5 standardizes a rope_parameters without a type to "default".
  const DeepseekV2Config tf5_default = Parse(EditedConfig(kV2, [](nlohmann::json& j) {
    j.erase("rope_scaling");
    j.erase("rope_theta");
    j["rope_parameters"] = {{"rope_theta", 50000}};
  }));
  EXPECT_EQ(tf5_default.rope.scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(tf5_default.rope.theta, 50000.0);
  const DeepseekV2Config explicit_default = Parse(EditedConfig(kV2, [](nlohmann::json& j) {
    j["rope_scaling"] = {{"type", "default"}};
  }));
  EXPECT_EQ(explicit_default.rope.scaling, RopeScaling());
}

}  // namespace
}  // namespace eagle3
