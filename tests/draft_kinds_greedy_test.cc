// Speculative greedy == plain greedy (docs/semantics.md) with the drafters that run DeepSeek layers:
// the MLA EAGLE-3 heads of the golden fixtures on the k25_int4 target (INT4 routed experts, Kimi-K2.5
// form) and DeepSeek-V3's MTP module of the v3_mtp target, each as a chain and as a tree, through the
// device step (SpeculativeStep on the CPU backend: device-side draft inputs, masks over every key of
// the tree passes) and through the host reference loop (SpeculativeDecoder + Eagle3Drafter). The
// drafts' weights are random, so acceptance is whatever it is; the outputs must not depend on it.
#include <memory>
#include <string>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/target_model.h"
#include "gtest/gtest.h"
#include "speculative_greedy_check.h"

namespace eagle3 {
namespace {

std::string Golden(const std::string& name) { return std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + name; }

// Room for three sequences of a prompt, 16 new tokens and a 10-node tree each.
TargetModelOptions TargetOptions() {
  TargetModelOptions o;
  o.max_tokens_per_forward = 64;
  o.max_context_len = 96;
  o.num_kv_pages = 96;
  o.page_size = 3;
  return o;
}

DraftModelOptions DraftOptions() {
  DraftModelOptions o;
  o.max_tokens_per_forward = 64;
  o.max_context_len = 96;
  o.num_kv_pages = 96;
  o.page_size = 5;
  return o;
}

class MlaDraftGreedyTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MlaDraftGreedyTest, SpeculativeGreedyEqualsPlain) {
  cpu::CpuBackend backend;
  auto target = TargetModel::Create(Golden("k25_int4"), TargetOptions(), nullptr, &backend);
  ASSERT_TRUE(target.ok()) << target.status();
  auto draft = DraftModel::Create(Golden(GetParam()), Golden("k25_int4"), DraftOptions(), nullptr, &backend);
  ASSERT_TRUE(draft.ok()) << draft.status();
  ASSERT_EQ((*draft)->kind(), DraftKind::kMla);
  SpeculativeGreedyRuns runs;
  ExpectSpeculativeGreedyEqualsPlain(target->get(), draft->get(), &backend, &runs);
  // Trees were drafted and verified, not roots alone.
  ASSERT_EQ(runs.stats.size(), 2u);
  for (const DecodeStats& stats : runs.stats) EXPECT_LT(stats.undrafted_steps, stats.device_steps);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MlaDraftGreedyTest, ::testing::Values("mla_draft_k25", "mla_draft_k25_eagle31"),
                         [](const auto& info) { return std::string(info.param); });

TEST(MtpDraftGreedyTest, SpeculativeGreedyEqualsPlain) {
  cpu::CpuBackend backend;
  auto target = TargetModel::Create(Golden("v3_mtp"), TargetOptions(), nullptr, &backend);
  ASSERT_TRUE(target.ok()) << target.status();
  auto draft = DraftModel::CreateMtp(Golden("v3_mtp"), DraftOptions(), nullptr, &backend);
  ASSERT_TRUE(draft.ok()) << draft.status();
  ASSERT_EQ((*draft)->kind(), DraftKind::kMtp);
  SpeculativeGreedyRuns runs;
  ExpectSpeculativeGreedyEqualsPlain(target->get(), draft->get(), &backend, &runs);
  ASSERT_EQ(runs.stats.size(), 2u);
  for (const DecodeStats& stats : runs.stats) EXPECT_LT(stats.undrafted_steps, stats.device_steps);
}

}  // namespace
}  // namespace eagle3
