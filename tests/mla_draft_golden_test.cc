// The MLA EAGLE-3 draft (DraftKind::kMla) against golden outputs (tools/make_golden.py: an
// independent PyTorch implementation of the draft step, cross-checked with transformers' DeepSeek-V3
// modules; tests/data/golden/README.md "MLA EAGLE-3 draft fixtures") on the k25_int4 target, at TP 1
// and TP 8: a causal pass over every row from the stored taps, one row decoded from the last row's
// fed-back hidden, and the decode loop's trees after the prompt (mla_draft_k25/tree.safetensors).
// Weights are bf16 and read exactly; both sides compute in fp32, so the tolerance is 1e-4 of the
// tensor's largest magnitude, and every tree selection has a log-prob gap of at least 2e-4, so tokens
// and parents must match exactly.
#include <cstdio>
#include <string>
#include <vector>

#include "drafter_golden_util.h"
#include "eagle3/draft_model.h"
#include "eagle3/mla_draft_config.h"
#include "eagle3/safetensors.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using golden::GoldenDir;
using golden::ReadF32;
using golden::ReadI64;

constexpr double kTolerance = 1e-4;
constexpr double kScoreTolerance = 1e-4;
constexpr char kTarget[] = "k25_int4";

golden::DraftFactory MlaDraft(const std::string& name) {
  return [dir = GoldenDir(name)](const DraftModelOptions& o, Communicator* comm, Backend* backend) {
    return DraftModel::Create(dir, GoldenDir(kTarget), o, comm, backend);
  };
}

class MlaDraftGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MlaDraftGoldenTest, LoadsAsTheMlaKind) {
  cpu::CpuBackend backend;
  DraftModelOptions o;
  o.max_tokens_per_forward = 4;
  o.max_context_len = 8;
  o.page_size = 4;
  o.num_kv_pages = 2;
  auto model = DraftModel::Create(GoldenDir(GetParam()), GoldenDir(kTarget), o, nullptr, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  auto config = MlaDraftConfig::FromFile(GoldenDir(GetParam()));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*model)->kind(), DraftKind::kMla);
  ASSERT_NE((*model)->mla_config(), nullptr);
  EXPECT_EQ((*model)->mtp_config(), nullptr);
  const DraftShape& shape = (*model)->shape();
  EXPECT_EQ(shape.hidden_size, config->hidden_size);
  EXPECT_EQ(shape.input_width, config->fc_input_width());
  EXPECT_EQ(shape.input_width, (*model)->tap().width());
  EXPECT_EQ(shape.draft_vocab, config->draft_vocab_size);
  EXPECT_EQ(shape.vocab_size, config->vocab_size);
  // The latent cache row, replicated on every rank: kv_lora_rank + qk_rope_head_dim.
  EXPECT_EQ(shape.kv_row_width, config->kv_lora_rank + config->qk_rope_head_dim);
}

TEST_P(MlaDraftGoldenTest, BothStepsMatchTheReference) {
  const std::string dir = GoldenDir(GetParam());
  auto expected = SafetensorsFile::Open(dir + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const SafetensorsFile& e = **expected;
  const std::vector<int64_t> tokens = ReadI64(e, "tokens"), token1 = ReadI64(e, "token_step1");
  const std::vector<float> aux = ReadF32(e, "aux");
  ASSERT_FALSE(tokens.empty());
  ASSERT_EQ(token1.size(), 1u);
  const std::vector<float> want[] = {ReadF32(e, "logits_step0"), ReadF32(e, "hidden_step0"),
                                     ReadF32(e, "logits_step1"), ReadF32(e, "hidden_step1")};
  const char* names[] = {"logits_step0", "hidden_step0", "logits_step1", "hidden_step1"};
  for (int tp : {1, 8}) {
    const golden::TwoSteps got = golden::RunTwoSteps(MlaDraft(GetParam()), tp, tokens, aux, token1);
    const std::vector<float>* outputs[] = {&got.logits0, &got.hidden0, &got.logits1, &got.hidden1};
    std::printf("  %-22s tp %d:", GetParam(), tp);
    for (int i = 0; i < 4; ++i) {
      const double error = golden::RelError(*outputs[i], want[i]);
      EXPECT_LT(error, kTolerance) << GetParam() << " tp " << tp << " " << names[i];
      std::printf(" %s %.2e", names[i], error);
    }
    std::printf("\n");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlaDraftGoldenTest, ::testing::Values("mla_draft_k25", "mla_draft_k25_eagle31"),
                         [](const auto& info) { return std::string(info.param); });

TEST(MlaDraftTreeGoldenTest, FixtureIsConsistent) {
  const golden::GoldenTrees g = golden::LoadGoldenTrees(GoldenDir("mla_draft_k25") + "/tree.safetensors");
  ASSERT_FALSE(g.prompt.empty());
  ASSERT_GE(g.trees.size(), 2u);
  ASSERT_EQ(g.tokens.size(), g.prompt.size());
  EXPECT_TRUE(std::equal(g.prompt.begin() + 1, g.prompt.end(), g.tokens.begin()));
  EXPECT_EQ(g.tokens.back(), g.root);
  for (const golden::GoldenTree& t : g.trees) {
    EXPECT_EQ(static_cast<int>(t.tokens.size()), t.params.num_draft_tokens) << t.name;
    EXPECT_EQ(t.parents.size(), t.tokens.size()) << t.name;
  }
}

class MlaDraftTreeGoldenTest : public ::testing::TestWithParam<int> {};

// The decode loop's trees (Eagle3Drafter + BuildDraftTree over the extend pass from the fixture's
// taps): the tree passes attend the committed rows and only their own branch's cached tree rows.
TEST_P(MlaDraftTreeGoldenTest, DecodeLoopTreesMatchTheReference) {
  const int tp = GetParam();
  const golden::GoldenTrees g = golden::LoadGoldenTrees(GoldenDir("mla_draft_k25") + "/tree.safetensors");
  ASSERT_GE(g.trees.size(), 2u);
  auto expected = SafetensorsFile::Open(GoldenDir("mla_draft_k25") + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status();
  const std::vector<float> aux = ReadF32(**expected, "aux");
  const std::vector<golden::BuiltTrees> built = golden::BuildGoldenTrees(MlaDraft("mla_draft_k25"), tp, g, aux);
  golden::ExpectTreesMatch(built, g, tp, kTolerance, kScoreTolerance);
}

INSTANTIATE_TEST_SUITE_P(Tp, MlaDraftTreeGoldenTest, ::testing::Values(1, 8),
                         [](const auto& info) { return "Tp" + std::to_string(info.param); });

}  // namespace
}  // namespace eagle3
