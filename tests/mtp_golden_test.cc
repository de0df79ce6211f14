// DeepSeek-V3's MTP module as a drafter (DraftModel::CreateMtp, DraftKind::kMtp) against golden
// outputs (tools/make_golden.py: an independent PyTorch implementation of the module, cross-checked
// with one assembled from transformers' DeepSeek-V3 modules; tests/data/golden/README.md "MTP
// fixtures") on the v3_mtp target, at TP 1 and TP 8: a causal pass over every row fed the target's
// final hidden after model.norm, one row decoded from the last row's fed-back shared_head.norm(r),
// the CONTROL (the same pass fed the pre-norm boundary L must match the control outputs and miss
// the expected ones by the README's margin), the decode loop's trees, and the target's tap of that
// final normed hidden in both residual modes. Tolerance 1e-4 of the largest magnitude (bf16 weights
// read exactly, fp32 on both sides).
#include <cstdio>
#include <string>
#include <vector>

#include "drafter_golden_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/draft_model.h"
#include "eagle3/hidden_state_tap.h"
#include "eagle3/safetensors.h"
#include "eagle3/target_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using golden::GoldenDir;
using golden::ReadF32;
using golden::ReadI64;
using ::testing::HasSubstr;

constexpr double kTolerance = 1e-4;
constexpr double kScoreTolerance = 1e-4;

golden::DraftFactory Mtp(const std::string& target = "v3_mtp") {
  return [dir = GoldenDir(target)](const DraftModelOptions& o, Communicator* comm, Backend* backend) {
    return DraftModel::CreateMtp(dir, o, comm, backend);
  };
}

struct MtpGolden {
  std::unique_ptr<SafetensorsFile> file;
  std::vector<int64_t> tokens, token1;
  std::vector<float> hidden_in, hidden_in_prenorm;
};

MtpGolden LoadMtpGolden() {
  MtpGolden g;
  auto file = SafetensorsFile::Open(GoldenDir("v3_mtp") + "/mtp_expected.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return g;
  g.file = std::move(*file);
  g.tokens = ReadI64(*g.file, "tokens");
  g.token1 = ReadI64(*g.file, "token_step1");
  g.hidden_in = ReadF32(*g.file, "hidden_in");
  g.hidden_in_prenorm = ReadF32(*g.file, "hidden_in_prenorm");
  return g;
}

DraftModelOptions SmallOptions() {
  DraftModelOptions o;
  o.max_tokens_per_forward = 4;
  o.max_context_len = 8;
  o.page_size = 4;
  o.num_kv_pages = 2;
  return o;
}

TEST(MtpDraftTest, CreatesTheMtpKind) {
  cpu::CpuBackend backend;
  auto model = DraftModel::CreateMtp(GoldenDir("v3_mtp"), SmallOptions(), nullptr, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  auto target = DeepseekV2Config::FromFile(GoldenDir("v3_mtp"));
  ASSERT_TRUE(target.ok()) << target.status();
  const DraftModel& m = **model;
  EXPECT_EQ(m.kind(), DraftKind::kMtp);
  ASSERT_NE(m.mtp_config(), nullptr);
  EXPECT_EQ(m.mtp_config()->first_layer, target->num_hidden_layers);
  EXPECT_EQ(m.mla_config(), nullptr);
  EXPECT_EQ(m.config().hidden_size, 0);  // the Llama-style config is not this kind's
  const DraftShape& shape = m.shape();
  EXPECT_EQ(shape.hidden_size, target->hidden_size);
  EXPECT_EQ(shape.input_width, target->hidden_size);
  EXPECT_EQ(shape.vocab_size, target->vocab_size);
  EXPECT_EQ(shape.draft_vocab, target->vocab_size);  // the target's lm_head: the full vocabulary
  EXPECT_EQ(shape.kv_row_width, target->kv_lora_rank + target->qk_rope_head_dim);
  // The tap is the final normed hidden, the one tensor after the layer boundaries.
  EXPECT_EQ(m.tap().boundaries(), std::vector<int>{static_cast<int>(target->num_hidden_layers) + 1});
  EXPECT_EQ(m.tap().width(), target->hidden_size);
  EXPECT_THAT(m.tap().Describe(), HasSubstr("after model.norm"));
  ASSERT_EQ(static_cast<int64_t>(m.d2t().size()), target->vocab_size);
  EXPECT_TRUE(std::all_of(m.d2t().begin(), m.d2t().end(), [](int64_t d) { return d == 0; }));
}

TEST(MtpDraftTest, RefusesTargetsWithoutAModuleAndTapOverrides) {
  cpu::CpuBackend backend;
  // v3_noaux states num_nextn_predict_layers 0: no module to run.
  auto none = DraftModel::CreateMtp(GoldenDir("v3_noaux"), SmallOptions(), nullptr, &backend);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("num_nextn_predict_layers"));
  DraftModelOptions o = SmallOptions();
  o.aux_layer_ids_override = std::vector<int>{0};
  auto overridden = DraftModel::CreateMtp(GoldenDir("v3_mtp"), o, nullptr, &backend);
  ASSERT_FALSE(overridden.ok());
  EXPECT_EQ(overridden.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(overridden.status().message()), HasSubstr("aux_layer_ids_override"));
}

// The target's tap of its final hidden after model.norm (HiddenStateTap::FinalNormed) is the
// fixture's hidden_in (transformers' model.norm of the last boundary), in both residual modes; the
// pre-norm boundary L is hidden_in_prenorm.
TEST(MtpDraftTest, TargetTapsTheFinalNormedHidden) {
  const MtpGolden g = LoadMtpGolden();
  ASSERT_NE(g.file, nullptr);
  auto config = DeepseekV2Config::FromFile(GoldenDir("v3_mtp"));
  ASSERT_TRUE(config.ok()) << config.status();
  auto target_expected = SafetensorsFile::Open(GoldenDir("v3_mtp") + "/expected.safetensors");
  ASSERT_TRUE(target_expected.ok()) << target_expected.status();
  const std::vector<int64_t> prompt = ReadI64(**target_expected, "tokens");
  const int64_t t = static_cast<int64_t>(prompt.size()), h = config->hidden_size;
  const int layers = static_cast<int>(config->num_hidden_layers);
  auto normed = HiddenStateTap::FinalNormed(layers, h);
  ASSERT_TRUE(normed.ok()) << normed.status();
  const int last[] = {layers};
  auto prenorm = HiddenStateTap::Create(std::span<const int>(last), LayerIdConvention::kInputOfLayer, layers, h);
  ASSERT_TRUE(prenorm.ok()) << prenorm.status();
  struct Case {
    int tp;
    ResidualMode mode;
  };
  for (const Case c : {Case{1, ResidualMode::kReplicated}, Case{8, ResidualMode::kReplicated},
                       Case{8, ResidualMode::kTokenSharded}}) {
    for (const HiddenStateTap* tap : {&*normed, &*prenorm}) {
      TargetModelOptions options;
      options.tp_size = c.tp;
      options.residual_mode = c.mode;
      options.max_tokens_per_forward = t;
      options.max_context_len = t;
      options.page_size = 4;
      options.num_kv_pages = (t + 3) / 4;
      std::vector<int32_t> pages(static_cast<size_t>(options.num_kv_pages));
      for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);
      std::vector<std::vector<float>> aux(static_cast<size_t>(c.tp));
      const absl::Status status = RunRankThreads(c.tp, [&](int rank, Communicator* comm) -> absl::Status {
        cpu::CpuBackend backend;
        TargetModelOptions o = options;
        o.rank = rank;
        EAGLE3_ASSIGN_OR_RETURN(auto model, TargetModel::Create(GoldenDir("v3_mtp"), o, comm, &backend));
        std::vector<float> logits(static_cast<size_t>(config->vocab_size));
        std::vector<float>& a = aux[static_cast<size_t>(rank)];
        a.resize(static_cast<size_t>(t * h));
        SequenceInput in;
        in.tokens = prompt;
        in.page_table = pages;
        return model->Forward(std::span<const SequenceInput>(&in, 1),
                              TensorView(logits.data(), DType::kF32, Shape{1, config->vocab_size}), tap,
                              TensorView(a.data(), DType::kF32, Shape{t, h}));
      });
      ASSERT_TRUE(status.ok()) << status;
      const std::vector<float>& want = tap == &*normed ? g.hidden_in : g.hidden_in_prenorm;
      const std::string what = std::string(tap == &*normed ? "final normed" : "boundary L") + " tap, tp " +
                               std::to_string(c.tp) +
                               (c.mode == ResidualMode::kTokenSharded ? " token-sharded" : " replicated");
      EXPECT_LT(golden::RelError(aux[0], want), kTolerance) << what;
      for (int rank = 1; rank < c.tp; ++rank) EXPECT_EQ(aux[static_cast<size_t>(rank)], aux[0]) << what;
    }
  }
}

TEST(MtpDraftTest, BothStepsMatchTheReference) {
  const MtpGolden g = LoadMtpGolden();
  ASSERT_NE(g.file, nullptr);
  ASSERT_EQ(g.token1.size(), 1u);
  const std::vector<float> want[] = {ReadF32(*g.file, "logits_step0"), ReadF32(*g.file, "hidden_step0"),
                                     ReadF32(*g.file, "logits_step1"), ReadF32(*g.file, "hidden_step1")};
  const char* names[] = {"logits_step0", "hidden_step0", "logits_step1", "hidden_step1"};
  for (int tp : {1, 8}) {
    const golden::TwoSteps got = golden::RunTwoSteps(Mtp(), tp, g.tokens, g.hidden_in, g.token1);
    const std::vector<float>* outputs[] = {&got.logits0, &got.hidden0, &got.logits1, &got.hidden1};
    std::printf("  v3_mtp tp %d:", tp);
    for (int i = 0; i < 4; ++i) {
      const double error = golden::RelError(*outputs[i], want[i]);
      EXPECT_LT(error, kTolerance) << "tp " << tp << " " << names[i];
      std::printf(" %s %.2e", names[i], error);
    }
    std::printf("\n");
  }
}

// Fed the pre-norm boundary L instead of model.norm's output, the module matches the fixture's
// control and misses the expected logits by the margin the fixture states (control_vs_expected:
// max |difference| / max |logit|), far above the tolerance: what a drafter wired to the wrong
// tensor would show.
TEST(MtpDraftTest, ThePreNormControlDiffers) {
  const MtpGolden g = LoadMtpGolden();
  ASSERT_NE(g.file, nullptr);
  const std::vector<float> expected = ReadF32(*g.file, "logits_step0");
  const std::vector<float> control_logits = ReadF32(*g.file, "control_logits_step0");
  const std::vector<float> control_hidden = ReadF32(*g.file, "control_hidden_step0");
  const auto stated = g.file->metadata().find("control_vs_expected");
  ASSERT_NE(stated, g.file->metadata().end());
  const double margin = std::stod(stated->second);
  ASSERT_GT(margin, 100 * kTolerance);
  for (int tp : {1, 8}) {
    const golden::TwoSteps got = golden::RunTwoSteps(Mtp(), tp, g.tokens, g.hidden_in_prenorm, g.token1);
    EXPECT_LT(golden::RelError(got.logits0, control_logits), kTolerance) << "tp " << tp;
    EXPECT_LT(golden::RelError(got.hidden0, control_hidden), kTolerance) << "tp " << tp;
    const double miss = golden::RelError(got.logits0, expected);
    EXPECT_NEAR(miss, margin, 0.01 * margin) << "tp " << tp;
    std::printf("  control tp %d: misses logits_step0 by %.3e (stated %.3e)\n", tp, miss, margin);
  }
}

TEST(MtpTreeGoldenTest, FixtureIsConsistent) {
  const golden::GoldenTrees g = golden::LoadGoldenTrees(GoldenDir("v3_mtp") + "/mtp_tree.safetensors");
  ASSERT_FALSE(g.prompt.empty());
  ASSERT_GE(g.trees.size(), 2u);
  ASSERT_EQ(g.tokens.size(), g.prompt.size());
  EXPECT_TRUE(std::equal(g.prompt.begin() + 1, g.prompt.end(), g.tokens.begin()));
  EXPECT_EQ(g.tokens.back(), g.root);
}

class MtpTreeGoldenTest : public ::testing::TestWithParam<int> {};

TEST_P(MtpTreeGoldenTest, DecodeLoopTreesMatchTheReference) {
  const int tp = GetParam();
  const golden::GoldenTrees g = golden::LoadGoldenTrees(GoldenDir("v3_mtp") + "/mtp_tree.safetensors");
  ASSERT_GE(g.trees.size(), 2u);
  const MtpGolden m = LoadMtpGolden();
  ASSERT_NE(m.file, nullptr);
  const std::vector<golden::BuiltTrees> built = golden::BuildGoldenTrees(Mtp(), tp, g, m.hidden_in);
  golden::ExpectTreesMatch(built, g, tp, kTolerance, kScoreTolerance);
}

INSTANTIATE_TEST_SUITE_P(Tp, MtpTreeGoldenTest, ::testing::Values(1, 8),
                         [](const auto& info) { return "Tp" + std::to_string(info.param); });

}  // namespace
}  // namespace eagle3
