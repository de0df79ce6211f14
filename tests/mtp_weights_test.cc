// The MTP module's weight schema (mtp_weights.h) on DeepSeek-V3's real shapes at TP 1 and TP 8, on a
// tiny V3-style target whose random hub checkpoint carries an MTP layer (unquantized and FP8), and
// every refusal of CheckMtpWeights / CheckMtpPair naming the tensor.
#include "eagle3/mtp_weights.h"

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_rewrite.h"
#include "config_test_util.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/mtp_config.h"
#include "eagle3/pair_check.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "quantized_test_util.h"
#include "scoped_temp_dir.h"
#include "weight_spec_test_util.h"

namespace eagle3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using testing::FindSpec;
using testing::RankShapeOf;

DeepseekV2Config V3(bool fp8) {
  const std::string name = "deepseek-ai_DeepSeek-V3.json";
  auto config = DeepseekV2Config::FromJson(
      fp8 ? testing::ReadConfigText(name) : testing::WithoutQuantization(name), name);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : DeepseekV2Config{};
}

TEST(MtpWeightsTest, DeepSeekV3ModuleAtTp1AndTp8) {
  const DeepseekV2Config v3 = V3(/*fp8=*/true);
  const MtpConfig mtp = *MtpConfig::FromTarget(v3);
  const std::vector<WeightSpec> specs = MtpModuleWeights(v3, mtp, 0);
  const std::vector<WeightSpec> layer = DeepseekDecoderLayerWeights(v3, 61);
  ASSERT_EQ(specs.size(), layer.size() + 4);
  EXPECT_EQ(specs[0].name, "model.layers.61.enorm.weight");
  EXPECT_EQ(specs[1].name, "model.layers.61.hnorm.weight");
  EXPECT_EQ(specs[2].name, "model.layers.61.eh_proj.weight");
  EXPECT_EQ(specs[2].shape, (Shape{7168, 14336}));
  EXPECT_EQ(specs[2].split, TpSplit::kColumns);
  EXPECT_EQ(specs.back().name, "model.layers.61.shared_head.norm.weight");
  // The decoder layer is the target's own description of layer 61: MLA + the MoE block.
  for (size_t i = 0; i < layer.size(); ++i) {
    EXPECT_EQ(specs[3 + i].name, layer[i].name);
    EXPECT_EQ(specs[3 + i].shape, layer[i].shape);
    EXPECT_EQ(specs[3 + i].split, layer[i].split);
  }
  EXPECT_NE(FindSpec(specs, "model.layers.61.mlp.experts.255.down_proj.weight"), nullptr);
  EXPECT_NE(FindSpec(specs, "model.layers.61.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_EQ(FindSpec(specs, "model.layers.61.embed_tokens.weight"), nullptr);  // shared, not read

  // One rank's slices.
  const std::map<std::string, std::pair<Shape, Shape>> expected = {
      {"model.layers.61.enorm.weight", {Shape{7168}, Shape{7168}}},
      {"model.layers.61.eh_proj.weight", {Shape{7168, 14336}, Shape{7168, 1792}}},
      {"model.layers.61.self_attn.q_a_proj.weight", {Shape{1536, 7168}, Shape{1536, 7168}}},
      {"model.layers.61.self_attn.q_b_proj.weight", {Shape{24576, 1536}, Shape{3072, 1536}}},
      {"model.layers.61.self_attn.kv_a_proj_with_mqa.weight", {Shape{576, 7168}, Shape{576, 7168}}},
      {"model.layers.61.self_attn.kv_b_proj.weight", {Shape{32768, 512}, Shape{4096, 512}}},
      {"model.layers.61.self_attn.o_proj.weight", {Shape{7168, 16384}, Shape{7168, 2048}}},
      {"model.layers.61.mlp.gate.weight", {Shape{256, 7168}, Shape{256, 7168}}},
      {"model.layers.61.mlp.experts.7.gate_proj.weight", {Shape{2048, 7168}, Shape{256, 7168}}},
      {"model.layers.61.mlp.experts.7.down_proj.weight", {Shape{7168, 2048}, Shape{7168, 256}}},
      {"model.layers.61.mlp.shared_experts.up_proj.weight", {Shape{2048, 7168}, Shape{256, 7168}}},
      {"model.layers.61.shared_head.norm.weight", {Shape{7168}, Shape{7168}}},
  };
  for (const auto& [name, shapes] : expected) {
    const WeightSpec* spec = FindSpec(specs, name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_EQ(RankShapeOf(*spec, 1), shapes.first) << name;
    EXPECT_EQ(RankShapeOf(*spec, 8), shapes.second) << name;
  }
  for (const WeightSpec& spec : specs) EXPECT_TRUE(spec.RankShape(8).ok()) << spec.name;

  // FP8: the layer's Linears carry block scales, eh_proj and the norms are plain.
  const std::vector<StoredForm> forms = StoredForms(v3, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    const bool linear = specs[i].name.ends_with("_proj.weight") || specs[i].name.ends_with("_with_mqa.weight");
    const bool eh_proj = specs[i].name == "model.layers.61.eh_proj.weight";
    EXPECT_EQ(forms[i], linear && !eh_proj ? StoredForm::kFp8Block : StoredForm::kPlain) << specs[i].name;
  }
  // The shared copies the hub checkpoint stores with the module: vocab-parallel like the target's.
  const std::vector<WeightSpec> copies = MtpSharedCopyWeights(v3, mtp, 0);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].name, "model.layers.61.embed_tokens.weight");
  EXPECT_EQ(copies[1].name, "model.layers.61.shared_head.head.weight");
  EXPECT_EQ(RankShapeOf(copies[1], 8), (Shape{129536 / 8, 7168}));  // padded to 64 * 8 rows
}

TEST(MtpWeightsTest, TheTargetsLayersAreDescribedByTheSameFunction) {
  const DeepseekV2Config v3 = V3(/*fp8=*/false);
  const std::vector<WeightSpec> all = DeepseekV2Weights(v3);
  size_t next = 1;  // after the embedding
  for (int64_t layer = 0; layer < v3.num_hidden_layers; ++layer) {
    for (const WeightSpec& spec : DeepseekDecoderLayerWeights(v3, layer)) {
      ASSERT_LT(next, all.size());
      EXPECT_EQ(all[next++].name, spec.name);
    }
  }
  EXPECT_EQ(all[next].name, "model.norm.weight");
  // Several modules follow one another, each under its own layer.
  DeepseekV2Config two = v3;
  two.num_nextn_predict_layers = 2;
  const MtpConfig mtp = *MtpConfig::FromTarget(two);
  const std::vector<WeightSpec> specs = MtpWeights(two, mtp);
  ASSERT_EQ(specs.size(), 2 * MtpModuleWeights(two, mtp, 0).size());
  EXPECT_EQ(specs[specs.size() / 2].name, "model.layers.62.enorm.weight");
}

TEST(MtpWeightsTest, EhProjMustSplitEvenly) {
  DeepseekV2Config c = QuantTestConfig(QuantizationConfig{});
  c.num_nextn_predict_layers = 1;
  const MtpConfig mtp = *MtpConfig::FromTarget(c);
  const WeightSpec eh_proj = MtpModuleWeights(c, mtp, 0)[2];
  EXPECT_EQ(RankShapeOf(eh_proj, 8), (Shape{64, 16}));
  const absl::StatusOr<Shape> odd = eh_proj.RankShape(3);
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(odd.status().message(),
              AllOf(HasSubstr("model.layers.3.eh_proj.weight"), HasSubstr("128 is not divisible by tp_size 3")));
}

// A tiny V3-style target (MoE from layer 1, q-LoRA, 3 layers) with one MTP module at layer 3.
class TinyMtpTest : public ::testing::Test {
 protected:
  void Write(const QuantizationConfig& quantization, bool write_mtp, int shards) {
    config_ = QuantTestConfig(quantization);
    config_.num_nextn_predict_layers = 1;
    RandomCheckpointOptions options;
    options.seed = 5;
    options.num_shards = shards;
    options.dtype = DType::kF32;
    options.write_mtp = write_mtp;
    const absl::Status status = WriteRandomDeepseekV2Checkpoint(config_, dir_.path(), options);
    ASSERT_TRUE(status.ok()) << status;
    auto reread = DeepseekV2Config::FromFile(dir_.path());
    ASSERT_TRUE(reread.ok()) << reread.status();
    config_ = *reread;
  }

  absl::Status Check() {
    auto checkpoint = Checkpoint::Open(dir_.path());
    if (!checkpoint.ok()) return checkpoint.status();
    auto mtp = MtpConfig::FromTarget(config_);
    if (!mtp.ok()) return mtp.status();
    return CheckMtpWeights(**checkpoint, config_, *mtp);
  }

  ScopedTempDir dir_;
  DeepseekV2Config config_;
};

TEST_F(TinyMtpTest, HubCheckpointWithMtpLayerPassesAndShardsAsTheSchemaSays) {
  Write(QuantizationConfig{}, /*write_mtp=*/true, /*shards=*/2);
  ASSERT_TRUE(Check().ok()) << Check();
  auto checkpoint = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(checkpoint.ok());
  // The target's own check still ignores the MTP layer.
  EXPECT_TRUE(CheckNoUnknownTensors(**checkpoint, config_, DeepseekV2Weights(config_)).ok());
  const MtpConfig mtp = *MtpConfig::FromTarget(config_);
  // The module's copies hold the target's values (DeepSeek-V3 stores them so).
  auto embed = (*checkpoint)->Read("model.embed_tokens.weight", DType::kF32);
  auto copy = (*checkpoint)->Read("model.layers.3.embed_tokens.weight", DType::kF32);
  ASSERT_TRUE(embed.ok() && copy.ok());
  EXPECT_EQ(0, std::memcmp(embed->data(), copy->data(), embed->nbytes()));
  // Every rank's slice, as read from the checkpoint, has the schema's rank shape at TP 1 and TP 8.
  std::vector<WeightSpec> specs = MtpWeights(config_, mtp);
  for (const WeightSpec& copy_spec : MtpSharedCopyWeights(config_, mtp, 0)) specs.push_back(copy_spec);
  for (int tp : {1, 8}) {
    for (const WeightSpec& spec : specs) {
      for (int rank : {0, tp - 1}) {
        absl::StatusOr<Shape> read = (*checkpoint)->ShardShape(spec.name, spec.ForRank(tp, rank));
        ASSERT_TRUE(read.ok()) << spec.name << " " << read.status();
        EXPECT_EQ(*read, RankShapeOf(spec, tp)) << spec.name << " tp " << tp;
      }
    }
  }
  EXPECT_EQ(RankShapeOf(*FindSpec(specs, "model.layers.3.self_attn.q_b_proj.weight"), 8), (Shape{24, 64}));
  EXPECT_EQ(RankShapeOf(*FindSpec(specs, "model.layers.3.mlp.experts.5.down_proj.weight"), 8), (Shape{64, 12}));

  const PairReport report = CheckMtpPair(dir_.path());
  EXPECT_TRUE(report.ok()) << report.problems.front();
  std::string facts;
  for (const std::string& fact : report.facts) facts += fact + "\n";
  EXPECT_THAT(facts, HasSubstr("MTP module 0: layer 3 ('model.layers.3.*'), MoE MLP"));
  EXPECT_THAT(facts, HasSubstr("target weights: unquantized"));
  EXPECT_THAT(facts, HasSubstr("eh_proj, enorm, hnorm and shared_head.norm unquantized"));
  EXPECT_THAT(facts, HasSubstr("the target's model.embed_tokens.weight and lm_head.weight"));
  EXPECT_THAT(facts, HasSubstr("stores 2 copy(ies)"));
}

TEST_F(TinyMtpTest, Fp8ModuleTakesTheTargetsFormsAndAPlainEhProj) {
  Write(DeepseekV3Fp8Quantization(), /*write_mtp=*/true, /*shards=*/1);
  ASSERT_TRUE(Check().ok()) << Check();
  auto checkpoint = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_TRUE((*checkpoint)->Has("model.layers.3.self_attn.q_b_proj.weight_scale_inv"));
  EXPECT_TRUE((*checkpoint)->Has("model.layers.3.mlp.experts.0.up_proj.weight_scale_inv"));
  EXPECT_FALSE((*checkpoint)->Has("model.layers.3.eh_proj.weight_scale_inv"));
  EXPECT_EQ((*checkpoint)->Info("model.layers.3.eh_proj.weight")->dtype, DType::kF32);

  const PairReport report = CheckMtpPair(dir_.path());
  EXPECT_TRUE(report.ok());
  std::string facts;
  for (const std::string& fact : report.facts) facts += fact + "\n";
  EXPECT_THAT(facts, HasSubstr("MTP weights: the decoder layer as the target's (fp8"));

  // A missing block scale of the module's layer is named.
  Rewrite(dir_.path(), [](auto& t) { t.erase("model.layers.3.self_attn.q_b_proj.weight_scale_inv"); });
  const absl::Status status = Check();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("MTP module 0 (layer 3) is incomplete"),
                                      HasSubstr("'model.layers.3.self_attn.q_b_proj.weight_scale_inv'")));
}

TEST_F(TinyMtpTest, CheckpointWithoutTheMtpLayerIsRefusedNamingItsFirstTensor) {
  Write(QuantizationConfig{}, /*write_mtp=*/false, /*shards=*/2);  // config says 1 module, index has none
  const absl::Status status = Check();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("has no MTP module 0"), HasSubstr("layer 3 ('model.layers.3.*')"),
                    HasSubstr("'model.layers.3.enorm.weight' (expected shape [64])"),
                    HasSubstr("num_nextn_predict_layers = 1")));
  const PairReport report = CheckMtpPair(dir_.path());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], AllOf(HasSubstr("has no MTP module 0"), HasSubstr("model.layers.3.enorm.weight")));
}

TEST_F(TinyMtpTest, SharedCopiesAreOptional) {
  Write(QuantizationConfig{}, /*write_mtp=*/true, /*shards=*/1);
  Rewrite(dir_.path(), [](auto& t) {
    t.erase("model.layers.3.embed_tokens.weight");
    t.erase("model.layers.3.shared_head.head.weight");
  });
  EXPECT_TRUE(Check().ok()) << Check();
  const PairReport report = CheckMtpPair(dir_.path());
  EXPECT_TRUE(report.ok());
  for (const std::string& fact : report.facts) EXPECT_THAT(fact, ::testing::Not(HasSubstr("copy(ies)")));
}

TEST_F(TinyMtpTest, TargetWithoutMtpModulesIsAProblemOfTheConfig) {
  Write(QuantizationConfig{}, /*write_mtp=*/true, /*shards=*/1);
  Rewrite(dir_.path(), [](auto& t) {
    for (auto it = t.begin(); it != t.end();) it = it->first.starts_with("model.layers.3.") ? t.erase(it) : ++it;
  }, [](nlohmann::json& j) { j.erase("num_nextn_predict_layers"); });
  const PairReport report = CheckMtpPair(dir_.path());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_THAT(report.problems[0], AllOf(HasSubstr("MTP: "), HasSubstr("num_nextn_predict_layers"),
                                        HasSubstr("carries no MTP module")));
}

struct Refusal {
  std::string name;
  std::function<void(std::map<std::string, Tensor>&)> edit;
  absl::StatusCode code;
  std::vector<std::string> message;
};

class MtpRefusalTest : public TinyMtpTest, public ::testing::WithParamInterface<Refusal> {};

TEST_P(MtpRefusalTest, IsRefusedNamingTheTensor) {
  const Refusal& r = GetParam();
  Write(QuantizationConfig{}, /*write_mtp=*/true, /*shards=*/1);
  Rewrite(dir_.path(), r.edit);
  const absl::Status status = Check();
  EXPECT_EQ(status.code(), r.code) << status;
  for (const std::string& part : r.message) EXPECT_THAT(status.message(), HasSubstr(part));
  // The pair check reports the same as a problem.
  const PairReport report = CheckMtpPair(dir_.path());
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(report.problems.back(), HasSubstr(r.message.front()));
}

std::vector<Refusal> Refusals() {
  const std::string p = "model.layers.3.";
  const absl::StatusCode kNotFound = absl::StatusCode::kNotFound;
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  return {
      {"missing_eh_proj",
       [=](auto& t) { t.erase(p + "eh_proj.weight"); },
       kNotFound,
       {"'" + p + "eh_proj.weight'", "MTP module 0 (layer 3) is incomplete", "expected shape [64, 128]"}},
      {"missing_expert",
       [=](auto& t) { t.erase(p + "mlp.experts.6.gate_proj.weight"); },
       kNotFound,
       {"'" + p + "mlp.experts.6.gate_proj.weight'", "is incomplete"}},
      {"missing_shared_head_norm",
       [=](auto& t) { t.erase(p + "shared_head.norm.weight"); },
       kNotFound,
       {"'" + p + "shared_head.norm.weight'", "is incomplete"}},
      {"eh_proj_one_h_wide",
       [=](auto& t) { t[p + "eh_proj.weight"] = Filled(DType::kF32, Shape{64, 64}); },
       kInvalid,
       {"'" + p + "eh_proj.weight'", "has shape [64, 64], expected [64, 128]"}},
      {"attention_of_another_width",
       [=](auto& t) { t[p + "self_attn.kv_a_proj_with_mqa.weight"] = Filled(DType::kF32, Shape{40, 32}); },
       kInvalid,
       {"'" + p + "self_attn.kv_a_proj_with_mqa.weight'", "has shape [40, 32], expected [40, 64]"}},
      {"eh_proj_fp8_without_scales",
       [=](auto& t) { t[p + "eh_proj.weight"] = Filled(DType::kF8E4M3, Shape{64, 128}); },
       kInvalid,
       {"'" + p + "eh_proj.weight'", "is F8_E4M3; expected F32, F16 or BF16"}},
      {"norm_as_integers",
       [=](auto& t) { t[p + "enorm.weight"] = Filled(DType::kI32, Shape{64}); },
       kInvalid,
       {"'" + p + "enorm.weight'", "is I32; expected F32, F16 or BF16"}},
      {"unknown_scale_in_the_module",
       [=](auto& t) { t[p + "eh_proj.weight_scale_inv"] = Filled(DType::kF32, Shape{1, 1}); },
       kInvalid,
       {"'" + p + "eh_proj.weight_scale_inv'", "is in MTP module 0's layer 3 but not part of the module"}},
      {"shared_copy_of_another_vocabulary",
       [=](auto& t) { t[p + "shared_head.head.weight"] = Filled(DType::kF32, Shape{999, 64}); },
       kInvalid,
       {"'" + p + "shared_head.head.weight'", "has shape [999, 64], expected [1000, 64]"}},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, MtpRefusalTest, ::testing::ValuesIn(Refusals()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace eagle3
