// The MLA EAGLE-3 draft's weight schema (mla_draft_weights.h) on the Kimi-K2.5 draft's real shapes
// at TP 1 and TP 8, against the target's own attention description, on tiny random drafts in both
// layer namings, and every refusal of CheckMlaDraftWeights / CheckDraftPair naming the tensor.
#include "eagle3/mla_draft_weights.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint_rewrite.h"
#include "config_test_util.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/mla_attention_weights.h"
#include "eagle3/mla_draft_config.h"
#include "eagle3/pair_check.h"
#include "eagle3/testing/deepseek_v2_config_writer.h"
#include "eagle3/testing/random_draft_checkpoint.h"
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

std::string Joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& line : lines) s += line + "\n";
  return s;
}

TEST(MlaDraftWeightsTest, KimiK25DraftAtTp1AndTp8) {
  auto draft = MlaDraftConfig::FromFile(testing::ConfigPath("modeled_kimi-k25-eagle3-mla.torchspec-vllm-export.json"));
  ASSERT_TRUE(draft.ok()) << draft.status();
  const std::vector<WeightSpec> specs = MlaDraftWeights(*draft, kDraftLayersPrefix);
  double total = 0;
  for (const WeightSpec& spec : specs) total += static_cast<double>(spec.shape.numel());
  // docs/mla_drafts.md: 1.84 B parameters without embed_tokens at the full vocabulary.
  EXPECT_NEAR(total / 1.84e9, 1.0, 0.01) << total;
  EXPECT_EQ(specs.front().name, "fc.weight");
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  const std::map<std::string, std::pair<Shape, Shape>> expected = {
      {"fc.weight", {Shape{7168, 21504}, Shape{7168, 21504}}},
      {"layers.0.input_layernorm.weight", {Shape{7168}, Shape{7168}}},
      {"layers.0.hidden_norm.weight", {Shape{7168}, Shape{7168}}},
      {"layers.0.self_attn.q_a_proj.weight", {Shape{1536, 14336}, Shape{1536, 14336}}},
      {"layers.0.self_attn.q_a_layernorm.weight", {Shape{1536}, Shape{1536}}},
      {"layers.0.self_attn.q_b_proj.weight", {Shape{12288, 1536}, Shape{1536, 1536}}},
      {"layers.0.self_attn.kv_a_proj_with_mqa.weight", {Shape{576, 14336}, Shape{576, 14336}}},
      {"layers.0.self_attn.kv_a_layernorm.weight", {Shape{512}, Shape{512}}},
      {"layers.0.self_attn.kv_b_proj.weight", {Shape{16384, 512}, Shape{2048, 512}}},
      {"layers.0.self_attn.o_proj.weight", {Shape{7168, 8192}, Shape{7168, 1024}}},
      {"layers.0.post_attention_layernorm.weight", {Shape{7168}, Shape{7168}}},
      {"layers.0.mlp.gate_proj.weight", {Shape{18432, 7168}, Shape{2304, 7168}}},
      {"layers.0.mlp.down_proj.weight", {Shape{7168, 18432}, Shape{7168, 2304}}},
      {"norm.weight", {Shape{7168}, Shape{7168}}},
      {"lm_head.weight", {Shape{163840, 7168}, Shape{20480, 7168}}},
  };
  ASSERT_EQ(specs.size(), expected.size() + 1);  // + up_proj
  for (const auto& [name, shapes] : expected) {
    const WeightSpec* spec = FindSpec(specs, name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_EQ(RankShapeOf(*spec, 1), shapes.first) << name;
    EXPECT_EQ(RankShapeOf(*spec, 8), shapes.second) << name;
  }
  EXPECT_EQ(RankShapeOf(MlaDraftEmbeddingWeight(*draft), 8), (Shape{20480, 7168}));
  // TorchSpec's native naming only moves the layer.
  EXPECT_NE(FindSpec(MlaDraftWeights(*draft, kDraftMidlayerPrefix), "midlayer.self_attn.q_a_proj.weight"), nullptr);
}

// The draft's attention is the target's attention description with a 2H input: same names, same
// splits, the same shapes but for the input width of q_a and kv_a.
TEST(MlaDraftWeightsTest, AttentionIsSlicedAsTheTargets) {
  auto target = DeepseekV2Config::FromFile(testing::ConfigPath("moonshotai_Kimi-K2.5.json"));
  ASSERT_TRUE(target.ok()) << target.status();
  auto draft = MlaDraftConfig::FromFile(testing::ConfigPath("modeled_kimi-k25-eagle3-mla.torchspec-vllm-export.json"));
  ASSERT_TRUE(draft.ok()) << draft.status();
  const std::string target_prefix = "language_model.model.layers.0.self_attn.";
  const std::vector<WeightSpec> target_attention = MlaAttentionWeights(MlaAttentionConfig::ForTarget(*target),
                                                                       target_prefix);
  const std::vector<WeightSpec> draft_specs = MlaDraftWeights(*draft, kDraftLayersPrefix);
  const std::vector<WeightSpec> layer = DeepseekDecoderLayerWeights(*target, 0);
  for (const WeightSpec& t : target_attention) {
    EXPECT_NE(FindSpec(layer, t.name), nullptr) << t.name;  // the target's layers list exactly these
    const std::string suffix = t.name.substr(target_prefix.size());
    const WeightSpec* d = FindSpec(draft_specs, "layers.0.self_attn." + suffix);
    ASSERT_NE(d, nullptr) << suffix;
    EXPECT_EQ(d->split, t.split) << suffix;
    Shape widened = t.shape;
    if (suffix == "q_a_proj.weight" || suffix == "kv_a_proj_with_mqa.weight") widened[1] *= 2;
    EXPECT_EQ(d->shape, widened) << suffix;
  }
}

// A tiny target (H 64, 3 layers, vocab 1000) and random MLA drafts for it.
class TinyMlaDraftTest : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = QuantTestConfig(QuantizationConfig{});
    std::ofstream(target_dir_.File("config.json")) << DeepseekV2ConfigToHubJson(target_);
    auto reread = DeepseekV2Config::FromFile(target_dir_.path());
    ASSERT_TRUE(reread.ok()) << reread.status();
    target_ = *reread;
  }

  static RandomDraftCheckpointOptions Options() {
    RandomDraftCheckpointOptions o;
    o.seed = 3;
    o.dtype = DType::kF32;
    o.mla = RandomDraftCheckpointOptions::MlaShape{};
    o.aux_layer_ids = {0, 1, 2};
    o.layer_prefix = std::string(kDraftLayersPrefix);
    return o;
  }

  void Write(const RandomDraftCheckpointOptions& o, const DeepseekV2Config* for_target = nullptr) {
    const absl::Status status =
        WriteRandomEagle3DraftCheckpoint(for_target != nullptr ? *for_target : target_, draft_dir_.path(), o);
    ASSERT_TRUE(status.ok()) << status;
  }

  absl::StatusOr<MlaDraftCheckpointLayout> Check() {
    auto draft = MlaDraftConfig::FromFile(draft_dir_.path());
    if (!draft.ok()) return draft.status();
    auto checkpoint = Checkpoint::Open(draft_dir_.path());
    if (!checkpoint.ok()) return checkpoint.status();
    return CheckMlaDraftWeights(**checkpoint, *draft, target_);
  }

  DeepseekV2Config target_;
  ScopedTempDir target_dir_, draft_dir_;
};

TEST_F(TinyMlaDraftTest, BothLayerNamingsAndVariantsPassAndShardAsTheSchemaSays) {
  struct Variant {
    std::string prefix;
    bool fc_norm;
    std::optional<int64_t> q_lora_rank;
    int64_t draft_vocab;
    bool embed;
  };
  for (const Variant& v : {Variant{"layers.0.", false, 16, 500, false}, Variant{"midlayer.", true, std::nullopt, 1000, true},
                           Variant{"midlayer.", false, 16, 1000, false}}) {
    SCOPED_TRACE(v.prefix + (v.fc_norm ? " fc_norm" : "") + (v.q_lora_rank ? "" : " q_proj"));
    ScopedTempDir dir;
    RandomDraftCheckpointOptions o = Options();
    o.layer_prefix = v.prefix;
    o.fc_norm = v.fc_norm;
    o.mla->q_lora_rank = v.q_lora_rank;
    o.draft_vocab_size = v.draft_vocab;
    o.write_embed_tokens = v.embed;
    o.write_t2d = v.draft_vocab < 1000;
    ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(target_, dir.path(), o).ok());
    auto draft = MlaDraftConfig::FromFile(dir.path());
    ASSERT_TRUE(draft.ok()) << draft.status();
    auto checkpoint = Checkpoint::Open(dir.path());
    ASSERT_TRUE(checkpoint.ok());
    absl::StatusOr<MlaDraftCheckpointLayout> layout = CheckMlaDraftWeights(**checkpoint, *draft, target_);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->layer_prefix, v.prefix);
    EXPECT_EQ(layout->own_embedding, v.embed);
    EXPECT_TRUE(layout->has_d2t);
    EXPECT_EQ(layout->has_t2d, v.draft_vocab < 1000);

    std::vector<WeightSpec> specs = MlaDraftWeights(*draft, v.prefix);
    if (v.embed) specs.push_back(MlaDraftEmbeddingWeight(*draft));
    EXPECT_EQ(FindSpec(specs, v.prefix + "self_attn.q_proj.weight") != nullptr, !v.q_lora_rank.has_value());
    for (int tp : {1, 8}) {
      for (const WeightSpec& spec : specs) {
        for (int rank : {0, tp - 1}) {
          absl::StatusOr<Shape> read = (*checkpoint)->ShardShape(spec.name, spec.ForRank(tp, rank));
          ASSERT_TRUE(read.ok()) << spec.name << " " << read.status();
          EXPECT_EQ(*read, RankShapeOf(spec, tp)) << spec.name << " tp " << tp;
        }
      }
    }
    const std::string p = v.prefix + "self_attn.";
    EXPECT_EQ(RankShapeOf(*FindSpec(specs, p + "kv_a_proj_with_mqa.weight"), 8), (Shape{40, 128}));
    EXPECT_EQ(RankShapeOf(*FindSpec(specs, p + "kv_b_proj.weight"), 8), (Shape{32, 32}));
    EXPECT_EQ(RankShapeOf(*FindSpec(specs, p + "o_proj.weight"), 8), (Shape{64, 16}));
    EXPECT_EQ(RankShapeOf(*FindSpec(specs, "lm_head.weight"), 1), (Shape{v.draft_vocab == 500 ? 512 : 1024, 64}));

    const PairReport report = CheckDraftPair(target_dir_.path(), dir.path());
    EXPECT_TRUE(report.ok()) << Joined(report.problems);
    const std::string facts = Joined(report.facts);
    EXPECT_THAT(facts, HasSubstr("draft: MLA EAGLE-3 head (Eagle3DeepseekV2ForCausalLM, kimi_k2), hidden 64"));
    EXPECT_THAT(facts, HasSubstr("target weights: unquantized"));
    EXPECT_THAT(facts, HasSubstr("draft weights: unquantized"));
    EXPECT_THAT(facts, HasSubstr("draft layer under '" + v.prefix + "'"));
    EXPECT_THAT(facts, HasSubstr("fc input width 192 = 3 taps x target hidden 64"));
  }
}

TEST_F(TinyMlaDraftTest, ALayerNumberedAfterTheTargetIsRefusedNamingTheTensor) {
  // The draft's layer under the target's layer count, as vLLM's draft module names it in memory.
  const std::string layer = "layers." + std::to_string(target_.num_hidden_layers) + ".";
  RandomDraftCheckpointOptions o = Options();
  o.layer_prefix = layer;
  Write(o);
  const absl::StatusOr<MlaDraftCheckpointLayout> layout = Check();
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(layout.status().message(), HasSubstr("has tensor '" + layer));
  EXPECT_THAT(layout.status().message(), HasSubstr("rename '" + layer + "' to 'layers.0.'"));
  // eagle3-inspect check's pair report says the same.
  const PairReport report = CheckDraftPair(target_dir_.path(), draft_dir_.path());
  EXPECT_FALSE(report.ok());
  EXPECT_THAT(Joined(report.problems), HasSubstr("rename '" + layer + "' to 'layers.0.'"));
}

TEST_F(TinyMlaDraftTest, ToolsTellTheTwoHeadKindsApart) {
  Write(Options());
  EXPECT_TRUE(*NamesMlaDraftArchitecture(draft_dir_.path()));
  ScopedTempDir llama;
  RandomDraftCheckpointOptions o;
  o.aux_layer_ids = {0, 1, 2};
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(target_, llama.path(), o).ok());
  EXPECT_FALSE(*NamesMlaDraftArchitecture(llama.path()));
  EXPECT_FALSE(NamesMlaDraftArchitecture(llama.File("missing")).ok());
  const PairReport report = CheckDraftPair(target_dir_.path(), llama.path());
  EXPECT_TRUE(report.ok()) << Joined(report.problems);
  EXPECT_THAT(Joined(report.facts), HasSubstr("draft: Llama-style EAGLE-3 head"));
}

// A draft trained for a wider target (H 96): the pair check names the key, fc.weight and the
// embedding it cannot share.
TEST_F(TinyMlaDraftTest, DraftForAnotherTargetWidthIsRefusedNamingTheTensors) {
  DeepseekV2Config wider = target_;
  wider.hidden_size = 96;
  Write(Options(), &wider);
  const absl::StatusOr<MlaDraftCheckpointLayout> layout = Check();
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(layout.status().message(),
              AllOf(HasSubstr("has no tensor 'embed_tokens.weight' (expected shape [1000, 96])"),
                    HasSubstr("'model.embed_tokens.weight' is [1000, 64]"),
                    HasSubstr("hidden_size 96 differs from the target's hidden_size 64")));
  const PairReport report = CheckDraftPair(target_dir_.path(), draft_dir_.path());
  const std::string problems = Joined(report.problems);
  EXPECT_THAT(problems, HasSubstr("target_hidden_size = 96"));
  EXPECT_THAT(problems, HasSubstr("fc.weight is [96, 288], expected [96, 3 taps x 64 = 192]"));
  EXPECT_THAT(problems, HasSubstr("'embed_tokens.weight'"));
}

struct Refusal {
  std::string name;
  std::function<void(std::map<std::string, Tensor>&)> edit;
  absl::StatusCode code;
  std::vector<std::string> message;
};

class MlaDraftRefusalTest : public TinyMlaDraftTest, public ::testing::WithParamInterface<Refusal> {};

TEST_P(MlaDraftRefusalTest, IsRefusedNamingTheTensor) {
  const Refusal& r = GetParam();
  Write(Options());
  Rewrite(draft_dir_.path(), r.edit);
  const absl::StatusOr<MlaDraftCheckpointLayout> layout = Check();
  EXPECT_EQ(layout.status().code(), r.code) << layout.status();
  for (const std::string& part : r.message) EXPECT_THAT(layout.status().message(), HasSubstr(part));
  const PairReport report = CheckDraftPair(target_dir_.path(), draft_dir_.path());
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(Joined(report.problems), HasSubstr(r.message.front()));
}

std::vector<Refusal> Refusals() {
  const std::string a = "layers.0.self_attn.";
  const absl::StatusCode kNotFound = absl::StatusCode::kNotFound;
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  return {
      {"missing_kv_a",
       [=](auto& t) { t.erase(a + "kv_a_proj_with_mqa.weight"); },
       kNotFound,
       {"'" + a + "kv_a_proj_with_mqa.weight'", "expected shape [40, 128]"}},
      {"q_a_reads_h_not_2h",
       [=](auto& t) { t[a + "q_a_proj.weight"] = Filled(DType::kF32, Shape{16, 64}); },
       kInvalid,
       {"'" + a + "q_a_proj.weight'", "has shape [16, 64], expected [16, 128]"}},
      {"missing_hidden_norm",
       [](auto& t) { t.erase("layers.0.hidden_norm.weight"); },
       kNotFound,
       {"'layers.0.hidden_norm.weight'"}},
      {"weight_as_integers",
       [](auto& t) { t["layers.0.mlp.up_proj.weight"] = Filled(DType::kI32, Shape{128, 64}); },
       kInvalid,
       {"'layers.0.mlp.up_proj.weight'", "is I32; expected F32, F16 or BF16"}},
      {"both_layer_namings",
       [](auto& t) { t["midlayer.hidden_norm.weight"] = Filled(DType::kF32, Shape{64}); },
       kInvalid,
       {"has both midlayer.* and layers.* tensors"}},
      {"no_layer",
       [](auto& t) {
         for (auto it = t.begin(); it != t.end();) it = it->first.starts_with("layers.") ? t.erase(it) : ++it;
       },
       kNotFound,
       {"has no tensor 'midlayer.input_layernorm.weight'"}},
      {"missing_d2t_with_reduced_vocab",
       [](auto& t) { t.erase("d2t"); },
       kNotFound,
       {"has no tensor 'd2t'", "maps its 500 draft ids to the target's 1000"}},
      {"d2t_as_floats",
       [](auto& t) { t["d2t"] = Filled(DType::kF32, Shape{500}); },
       kInvalid,
       {"tensor 'd2t'", "is F32; expected I64"}},
      {"t2d_of_another_vocabulary",
       [](auto& t) { t["t2d"] = Filled(DType::kBool, Shape{999}); },
       kInvalid,
       {"tensor 't2d'", "has shape [999], expected [1000]"}},
      {"embedding_of_another_width",
       [](auto& t) { t["embed_tokens.weight"] = Filled(DType::kF32, Shape{1000, 32}); },
       kInvalid,
       {"'embed_tokens.weight'", "has shape [1000, 32], expected [1000, 64]"}},
      {"fc_norm_without_the_key",
       [](auto& t) { t["fc_norm.0.weight"] = Filled(DType::kF32, Shape{64}); },
       kInvalid,
       {"has tensor 'fc_norm.0.weight'", "fc_norm: true enables"}},
      {"fc_bias",
       [](auto& t) { t["fc.bias"] = Filled(DType::kF32, Shape{64}); },
       kInvalid,
       {"has tensor 'fc.bias'", "refusing to ignore it"}},
      {"lm_head_of_another_vocabulary",
       [](auto& t) { t["lm_head.weight"] = Filled(DType::kF32, Shape{400, 64}); },
       kInvalid,
       {"'lm_head.weight'", "has shape [400, 64], expected [500, 64]"}},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaDraftRefusalTest, ::testing::ValuesIn(Refusals()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace eagle3
