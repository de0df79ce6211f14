// Quantized targets on the CPU reference: a checkpoint in a hub quantized form gives exactly the
// logits of the same model written unquantized with its dequantized f32 weights, TP=2/8 ≡ TP=1 in
// both residual modes, speculative greedy ≡ plain greedy next to an unquantized draft, and the
// draft loads the same whether its target is quantized or not. Kimi-K2.5's multimodal checkpoint
// form gives the logits of the same model in the plain kimi_k2 form.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/draft_model.h"
#include "eagle3/eagle3_draft_config.h"
#include "eagle3/pair_check.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "eagle3/testing/rank_threads.h"
#include "gmock/gmock.h"
#include "feed_forward_block.h"
#include "gtest/gtest.h"
#include "quantized_test_util.h"
#include "weight_loader.h"
#include "scoped_temp_dir.h"
#include "speculative_greedy_check.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

TargetModelOptions Options(int tp, ResidualMode mode) {
  TargetModelOptions o;
  o.tp_size = tp;
  o.residual_mode = mode;
  o.max_tokens_per_forward = 64;
  o.max_context_len = 96;
  o.num_kv_pages = 96;
  o.page_size = 3;
  return o;
}

// Rank 0's logits of every position of one prompt from the target in `dir` (vocabulary `vocab`),
// after checking every rank has the same bits.
std::vector<float> TargetLogits(const std::string& dir, int64_t vocab, int tp, ResidualMode mode,
                                std::optional<bool> keep_quantized = std::nullopt) {
  std::vector<int64_t> prompt(13);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>((37 * i + 11) % 1000);
  std::vector<int32_t> pages = {5, 2, 9, 0, 7};
  std::vector<std::vector<float>> logits(static_cast<size_t>(tp));
  const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
    cpu::CpuBackend backend;
    TargetModelOptions o = Options(tp, mode);
    o.rank = rank;
    o.keep_quantized = keep_quantized;
    EAGLE3_ASSIGN_OR_RETURN(auto model, TargetModel::Create(dir, o, comm, &backend));
    SequenceInput in;
    in.tokens = prompt;
    in.page_table = pages;
    in.all_logits = true;
    const SequenceInput batch[] = {in};
    std::vector<float>& out = logits[static_cast<size_t>(rank)];
    out.resize(prompt.size() * static_cast<size_t>(vocab));
    return model->Forward(batch,
                          TensorView(out.data(), DType::kF32, Shape{static_cast<int64_t>(prompt.size()), vocab}));
  });
  EXPECT_TRUE(status.ok()) << status;
  for (int rank = 1; rank < tp; ++rank) EXPECT_EQ(logits[rank], logits[0]) << "rank " << rank;
  return logits[0];
}

class QuantizedTargetTest : public ::testing::TestWithParam<std::pair<std::string, QuantizationConfig>> {
 protected:
  void SetUp() override {
    config_ = QuantTestConfig(GetParam().second);
    WriteQuantTestCheckpoint(config_, dir_.path(), plain_dir_.path());
  }

  std::vector<float> Logits(const std::string& dir, int tp, ResidualMode mode,
                            std::optional<bool> keep_quantized = std::nullopt) const {
    return TargetLogits(dir, config_.vocab_size, tp, mode, keep_quantized);
  }

  DeepseekV2Config config_;
  ScopedTempDir dir_, plain_dir_;
};

TEST_P(QuantizedTargetTest, LogitsEqualTheDequantizedCheckpointsExactly) {
  const std::vector<float> quantized = Logits(dir_.path(), 1, ResidualMode::kReplicated);
  const std::vector<float> plain = Logits(plain_dir_.path(), 1, ResidualMode::kReplicated);
  ASSERT_FALSE(quantized.empty());
  EXPECT_EQ(quantized, plain);
}

TEST_P(QuantizedTargetTest, TensorParallelMatchesTp1InBothResidualModes) {
  const std::vector<float> ref = Logits(dir_.path(), 1, ResidualMode::kReplicated);
  for (int tp : {2, 8}) {
    for (ResidualMode mode : {ResidualMode::kReplicated, ResidualMode::kTokenSharded}) {
      const std::vector<float> got = Logits(dir_.path(), tp, mode);
      ASSERT_EQ(got.size(), ref.size());
      double diff = 0, scale = 1;
      for (size_t i = 0; i < ref.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(got[i] - ref[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
      }
      EXPECT_LT(diff / scale, 1e-5) << "tp " << tp << " mode " << static_cast<int>(mode);
      // The same TP run of the dequantized checkpoint gives the same bits.
      EXPECT_EQ(got, Logits(plain_dir_.path(), tp, mode)) << "tp " << tp;
    }
  }
}

// Weights kept quantized in memory (QuantizedGemm: what CudaBackend does by default; forced on the
// CPU reference, which dequantizes per product) give the dequantized checkpoint's logits within fp32
// summation order: the dequantized checkpoint's dense shared expert joins its dense routed experts'
// op (FeedForwardBlock: one expert's product per token, not the dense MLP's GEMM), and so does the
// quantized one where it is quantized like the routed experts; where gate and up are applied as two
// weights (this config's 16-row FP8 slices at TP 8 start inside a block) the CPU Gemm's blocking
// depends on N. (Kimi-K2-Thinking's form keeps its shared expert dense beside quantized routed
// experts: a SiLU MLP of its own there.)
TEST_P(QuantizedTargetTest, WeightsKeptQuantizedGiveTheDequantizedLogits) {
  for (int tp : {1, 8}) {
    for (ResidualMode mode : {ResidualMode::kReplicated, ResidualMode::kTokenSharded}) {
      if (tp == 1 && mode == ResidualMode::kTokenSharded) continue;
      const std::string what = "tp " + std::to_string(tp) + " mode " + std::to_string(static_cast<int>(mode));
      const std::vector<float> kept = Logits(dir_.path(), tp, mode, /*keep_quantized=*/true);
      const std::vector<float> plain = Logits(plain_dir_.path(), tp, mode);
      ASSERT_EQ(kept.size(), plain.size()) << what;
      ASSERT_FALSE(kept.empty()) << what;
      double diff = 0, scale = 1;
      for (size_t i = 0; i < plain.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(kept[i] - plain[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(plain[i])));
      }
      EXPECT_LT(diff / scale, 1e-6) << what;
    }
  }
}

// The MoE layer's shared expert: kept quantized like the routed experts (FP8, and INT4 where the
// checkpoint quantizes it), it runs as one more expert of QuantizedMoeExperts up to 32 rows and as
// its own MLP past them; dense beside INT4 experts (the Kimi-K2-Thinking form) always its own MLP.
// Either way the layer's output is the dequantized checkpoint's (whose dense shared expert joins its
// dense routed experts the same way) within fp32 summation order.
TEST_P(QuantizedTargetTest, TheSharedExpertJoinsTheRoutedExpertsUpTo32Rows) {
  const FeedForwardConfig ffn = FeedForwardConfig::ForTargetLayer(config_, 1);
  const std::string prefix = "model.layers.1.mlp.";
  const std::vector<WeightSpec> specs = ffn.Weights(prefix);
  cpu::CpuBackend backend;
  const auto load = [&](const std::string& dir, const DeepseekV2Config& config, bool keep,
                        std::unique_ptr<Checkpoint>& checkpoint) -> absl::StatusOr<FeedForwardBlock> {
    EAGLE3_ASSIGN_OR_RETURN(checkpoint, Checkpoint::Open(dir));
    WeightLoader loader(*checkpoint, config.quantization, specs, StoredForms(config, specs), 1, 0, backend);
    loader.set_keep_quantized(keep);
    return FeedForwardBlock::Load(ffn, prefix, DType::kF32, loader);
  };
  DeepseekV2Config plain_config = config_;
  plain_config.quantization = QuantizationConfig{};
  std::unique_ptr<Checkpoint> kept_ckpt, plain_ckpt;
  auto kept = load(dir_.path(), config_, /*keep=*/true, kept_ckpt);
  auto plain = load(plain_dir_.path(), plain_config, /*keep=*/false, plain_ckpt);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(kept->shared_joins_experts(), GetParam().first != "int4_k2");
  // The dequantized checkpoint's dense shared expert joins its dense routed experts.
  EXPECT_TRUE(plain->shared_joins_experts());
  EXPECT_EQ(plain->shared_slots(), 1);
  auto ws = FeedForwardWorkspace::Create(ffn, 1, 40, backend);
  ASSERT_TRUE(ws.ok()) << ws.status();
  const int64_t h = config_.hidden_size;
  std::vector<float> x(40 * h);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  for (const int64_t t : {int64_t{5}, int64_t{32}, int64_t{33}, int64_t{40}}) {
    std::vector<float> got(t * h), want(t * h);
    const TensorView xv(x.data(), DType::kF32, Shape{t, h});
    ASSERT_TRUE(kept->Forward(xv, *ws, TensorView(got.data(), DType::kF32, Shape{t, h})).ok()) << t;
    ASSERT_TRUE(plain->Forward(xv, *ws, TensorView(want.data(), DType::kF32, Shape{t, h})).ok()) << t;
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
    }
    EXPECT_LT(diff / scale, 1e-6) << "rows " << t;
  }
  if (!kept->shared_joins_experts()) return;
  // A workspace sized for the block's config without its shared expert has no slot for it: refused
  // by name, nothing written.
  FeedForwardConfig no_shared = ffn;
  no_shared.n_shared_experts = 0;
  auto narrow = FeedForwardWorkspace::Create(no_shared, 1, 40, backend);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  std::vector<float> out(5 * h, 7.0f);
  const absl::Status refused = kept->Forward(TensorView(x.data(), DType::kF32, Shape{5, h}), *narrow,
                                             TensorView(out.data(), DType::kF32, Shape{5, h}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("expert slots per row, the block needs"), std::string::npos) << refused;
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return v == 7.0f; }));
}

DraftModelOptions DraftOptions() {
  DraftModelOptions o;
  o.max_tokens_per_forward = 64;
  o.max_context_len = 96;
  o.num_kv_pages = 96;
  o.page_size = 5;
  return o;
}

void WriteDraft(const DeepseekV2Config& target, const std::string& dir) {
  RandomDraftCheckpointOptions options;
  options.seed = 3;
  options.num_attention_heads = 8;
  options.num_key_value_heads = 4;
  options.aux_layer_ids = {0, 1, 2};
  const absl::Status status = WriteRandomEagle3DraftCheckpoint(target, dir, options);
  ASSERT_TRUE(status.ok()) << status;
}

// The draft's logits and hidden rows (concatenated) for three tokens from fixed aux states, next to
// the target in `target_dir` (whose embedding it shares); empty on failure.
std::vector<float> DraftOutputs(const std::string& draft_dir, const std::string& target_dir,
                                int64_t target_hidden) {
  cpu::CpuBackend backend;
  auto draft = DraftModel::Create(draft_dir, target_dir, DraftOptions(), nullptr, &backend);
  EXPECT_TRUE(draft.ok()) << draft.status();
  if (!draft.ok()) return {};
  const std::vector<int64_t> tokens = {5, 17, 99};
  const std::vector<int32_t> pages = {0, 1};
  std::vector<float> hidden(3 * static_cast<size_t>((*draft)->tap().width()));
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<float>((i * 7919) % 101) / 50.0f - 1.0f;
  DraftSequenceInput in;
  in.tokens = tokens;
  in.page_table = pages;
  in.all_logits = true;
  const DraftSequenceInput batch[] = {in};
  std::vector<float> logits(3 * static_cast<size_t>((*draft)->draft_vocab()));
  std::vector<float> hidden_out(3 * static_cast<size_t>(target_hidden));
  const absl::Status status = (*draft)->Forward(
      batch, TensorView(hidden.data(), DType::kF32, Shape{3, (*draft)->tap().width()}), /*from_target=*/true,
      TensorView(logits.data(), DType::kF32, Shape{3, (*draft)->draft_vocab()}),
      TensorView(hidden_out.data(), DType::kF32, Shape{3, target_hidden}));
  EXPECT_TRUE(status.ok()) << status;
  logits.insert(logits.end(), hidden_out.begin(), hidden_out.end());
  return logits;
}

TEST_P(QuantizedTargetTest, SpeculativeGreedyEqualsPlainGreedyWithAnUnquantizedDraft) {
  ScopedTempDir draft_dir;
  WriteDraft(config_, draft_dir.path());
  cpu::CpuBackend backend;
  auto target = TargetModel::Create(dir_.path(), Options(1, ResidualMode::kReplicated), nullptr, &backend);
  ASSERT_TRUE(target.ok()) << target.status();
  auto draft = DraftModel::Create(draft_dir.path(), dir_.path(), DraftOptions(), nullptr, &backend);
  ASSERT_TRUE(draft.ok()) << draft.status();
  ExpectSpeculativeGreedyEqualsPlain(target->get(), draft->get(), &backend);
}

// Engines have shipped an unquantized draft inheriting its target's quantization_config (it then
// fails to load, or loads garbage and accepts nothing). eagle3's draft reads its own unquantized
// checkpoint and the target's unquantized embedding whatever the target's quantization_config: its
// outputs next to the quantized target equal those next to the dequantized one.
TEST_P(QuantizedTargetTest, TheDraftIgnoresTheTargetsQuantization) {
  ScopedTempDir draft_dir;
  WriteDraft(config_, draft_dir.path());
  std::vector<std::vector<float>> outputs;
  for (const std::string& target_dir : {dir_.path(), plain_dir_.path()}) {
    outputs.push_back(DraftOutputs(draft_dir.path(), target_dir, config_.hidden_size));
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  // A draft config carrying a quantization_config is refused, not half-applied.
  auto refused = Eagle3DraftConfig::FromJson(
      R"({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
          "quantization_config": {"quant_method": "fp8"}})",
      "draft.json");
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("quantization_config"));
}

// The pair check names each model's weight format.
TEST_P(QuantizedTargetTest, PairCheckNamesEachModelsWeightFormat) {
  ScopedTempDir draft_dir;
  WriteDraft(config_, draft_dir.path());
  const PairReport report = CheckDraftPair(dir_.path(), draft_dir.path());
  EXPECT_TRUE(report.ok()) << (report.problems.empty() ? "" : report.problems[0]);
  EXPECT_THAT(report.facts, ::testing::Contains("target weights: " + config_.quantization.Describe()));
  EXPECT_THAT(report.facts, ::testing::Contains("draft weights: unquantized"));
  EXPECT_THAT(config_.quantization.Describe(), HasSubstr(WeightFormatName(config_.quantization.format)));
  const PairReport plain = CheckDraftPair(plain_dir_.path(), draft_dir.path());
  EXPECT_THAT(plain.facts, ::testing::Contains("target weights: unquantized"));
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedTargetTest, ::testing::ValuesIn(TestQuantizations()),
                         [](const auto& info) { return info.param.first; });

// Kimi-K2.5's multimodal form: config.json with the text model as text_config, the language
// model's tensors under "language_model.", vision tower and projector tensors beside them.
class KimiK25FormTest : public ::testing::TestWithParam<std::pair<std::string, QuantizationConfig>> {
 protected:
  void SetUp() override {
    plain_ = QuantTestConfig(GetParam().second);
    plain_.model_type = DeepseekModelType::kKimiK2;
    k25_ = plain_;
    k25_.tensor_prefix = std::string(kKimiK25TensorPrefix);
  }

  static void Write(const DeepseekV2Config& config, const std::string& dir) {
    RandomCheckpointOptions options;
    options.seed = 11;
    options.num_shards = 2;
    const absl::Status status = WriteRandomDeepseekV2Checkpoint(config, dir, options);
    ASSERT_TRUE(status.ok()) << status;
  }

  DeepseekV2Config plain_, k25_;
  ScopedTempDir plain_dir_, k25_dir_;
};

// The text backbone loads and its logits equal the plain kimi_k2 form's bit for bit.
TEST_P(KimiK25FormTest, LogitsEqualThePlainKimiK2FormExactly) {
  Write(plain_, plain_dir_.path());
  Write(k25_, k25_dir_.path());
  auto read = DeepseekV2Config::FromFile(k25_dir_.path());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->tensor_prefix, kKimiK25TensorPrefix);
  EXPECT_EQ(read->quantization, plain_.quantization);
  EXPECT_EQ(read->num_hidden_layers, plain_.num_hidden_layers);
  auto checkpoint = Checkpoint::Open(k25_dir_.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_TRUE((*checkpoint)->Has("language_model.lm_head.weight"));
  EXPECT_TRUE((*checkpoint)->Has("language_model.model.layers.0.self_attn.q_a_proj.weight"));
  EXPECT_TRUE((*checkpoint)->Has("vision_tower.patch_embed.proj.weight"));
  EXPECT_TRUE((*checkpoint)->Has("mm_projector.proj.0.weight"));
  EXPECT_FALSE((*checkpoint)->Has("lm_head.weight"));
  for (const auto& [tp, mode] : {std::pair{1, ResidualMode::kReplicated}, std::pair{2, ResidualMode::kTokenSharded}}) {
    const std::vector<float> k25 = TargetLogits(k25_dir_.path(), plain_.vocab_size, tp, mode);
    ASSERT_FALSE(k25.empty());
    EXPECT_EQ(k25, TargetLogits(plain_dir_.path(), plain_.vocab_size, tp, mode)) << "tp " << tp;
  }
}

// A language-model tensor missing from the checkpoint is refused by its prefixed name: written with
// tied embeddings (no lm_head), read as untied.
TEST_P(KimiK25FormTest, AMissingLanguageModelTensorIsRefusedByName) {
  k25_.tie_word_embeddings = true;
  Write(k25_, k25_dir_.path());
  const std::string path = (std::filesystem::path(k25_dir_.path()) / "config.json").string();
  nlohmann::json config;
  std::ifstream(path) >> config;
  config["tie_word_embeddings"] = false;
  config["text_config"]["tie_word_embeddings"] = false;
  std::ofstream(path, std::ios::trunc) << config.dump(2);
  cpu::CpuBackend backend;
  auto target = TargetModel::Create(k25_dir_.path(), Options(1, ResidualMode::kReplicated), nullptr, &backend);
  ASSERT_FALSE(target.ok());
  EXPECT_THAT(target.status().message(), HasSubstr("'language_model.lm_head.weight'"));
}

// The vision tower and projector are skipped by the Kimi-K2.5 form only: read under another
// prefix, every tensor of the checkpoint, the vision ones included, counts as unknown.
TEST_P(KimiK25FormTest, VisionTensorsAreSkippedOnlyInTheKimiK25Form) {
  Write(k25_, k25_dir_.path());
  auto checkpoint = Checkpoint::Open(k25_dir_.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_TRUE(CheckNoUnknownTensors(**checkpoint, k25_, DeepseekV2Weights(k25_)).ok());
  DeepseekV2Config other = k25_;
  other.tensor_prefix = "text_model.";
  const absl::Status refused = CheckNoUnknownTensors(**checkpoint, other, DeepseekV2Weights(other));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.message(), HasSubstr("is not used by the model"));
  const size_t all = (*checkpoint)->TensorNames().size();
  EXPECT_THAT(refused.message(), HasSubstr("(and " + std::to_string(all - 1) + " more unknown tensors)"));
}

// An EAGLE-3 draft without its own embedding shares the language model's, under its prefix: next to
// the Kimi-K2.5 form it gives the outputs it gives next to the plain kimi_k2 form.
TEST_P(KimiK25FormTest, AnEagle3DraftSharesTheLanguageModelsEmbedding) {
  Write(plain_, plain_dir_.path());
  Write(k25_, k25_dir_.path());
  ScopedTempDir draft_dir;
  WriteDraft(plain_, draft_dir.path());
  EXPECT_EQ(DeepseekEmbeddingName(k25_), "language_model.model.embed_tokens.weight");
  const std::vector<float> k25 = DraftOutputs(draft_dir.path(), k25_dir_.path(), plain_.hidden_size);
  ASSERT_FALSE(k25.empty());
  EXPECT_EQ(k25, DraftOutputs(draft_dir.path(), plain_dir_.path(), plain_.hidden_size));
}

INSTANTIATE_TEST_SUITE_P(Formats, KimiK25FormTest,
                         ::testing::Values(std::pair{std::string("bf16"), QuantizationConfig{}},
                                           std::pair{std::string("int4_k25"), KimiK2ThinkingInt4Quantization()}),
                         [](const auto& info) { return info.param.first; });

}  // namespace
}  // namespace eagle3
