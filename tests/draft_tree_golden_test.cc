// The EAGLE-2 dynamic tree the decode loop builds after a prompt (DraftModel + Eagle3Drafter +
// BuildDraftTree, driven as SpeculativeDecoder and eagle3-inspect's draft command drive them) against
// tests/data/golden/draft_v2/tree.safetensors: an independent PyTorch build (tools/make_golden.py)
// over the fp32 draft reference, for several tree shapes, at TP 1, 2 and 8. The extend pass uses the
// fixture's stored aux states (the target's tapped boundaries) and prompt, so no target model runs.
// Every selection in the golden trees has a log-prob gap of at least 1e-4, so tokens and parents must
// match exactly; the cumulative scores within 1e-4.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/draft_tree.h"
#include "eagle3/eagle3_draft_config.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/safetensors.h"
#include "eagle3/status.h"
#include "eagle3/testing/rank_threads.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

constexpr double kScoreTolerance = 1e-4;
constexpr double kLogitTolerance = 1e-4;  // of the largest |logit|

template <typename T>
std::vector<T> Read(const SafetensorsFile& file, const std::string& name, DType dtype) {
  auto v = file.View(name);
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) return {};
  EXPECT_EQ(v->dtype(), dtype) << name;
  if (v->dtype() != dtype) return {};
  return std::vector<T>(v->data_as<T>(), v->data_as<T>() + v->numel());
}

struct GoldenTree {
  std::string name;
  DraftTreeParams params;
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents;
  std::vector<float> scores;
};

struct Golden {
  std::string dir, target_dir;
  std::vector<int64_t> prompt, tokens;  // tokens: the extend pass's, prompt[1:] then the root
  int64_t root = -1;
  std::vector<float> aux, root_logits;
  int64_t draft_vocab = 0, aux_width = 0;
  std::vector<GoldenTree> trees;
};

Golden LoadGolden() {
  Golden g;
  g.dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/draft_v2";
  g.target_dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2_qlora_yarn";
  auto config = Eagle3DraftConfig::FromFile(g.dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return g;
  g.draft_vocab = config->draft_vocab_size;
  g.aux_width = config->fc_input_width();
  auto expected = SafetensorsFile::Open(g.dir + "/expected.safetensors");
  auto tree = SafetensorsFile::Open(g.dir + "/tree.safetensors");
  EXPECT_TRUE(expected.ok()) << expected.status();
  EXPECT_TRUE(tree.ok()) << tree.status();
  if (!expected.ok() || !tree.ok()) return g;
  g.aux = Read<float>(**expected, "aux", DType::kF32);
  g.prompt = Read<int64_t>(**tree, "prompt", DType::kI64);
  g.tokens = Read<int64_t>(**tree, "tokens", DType::kI64);
  const std::vector<int64_t> root = Read<int64_t>(**tree, "root", DType::kI64);
  EXPECT_EQ(root.size(), 1u);
  if (root.size() == 1) g.root = root[0];
  g.root_logits = Read<float>(**tree, "root_logits", DType::kF32);
  // Tree shapes: every "<name>.params" (topk, num_steps, num_draft_tokens).
  const std::string suffix = ".params";
  for (const TensorInfo& info : (*tree)->tensors()) {
    if (info.name.size() <= suffix.size() ||
        info.name.compare(info.name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    GoldenTree t;
    t.name = info.name.substr(0, info.name.size() - suffix.size());
    const std::vector<int64_t> params = Read<int64_t>(**tree, info.name, DType::kI64);
    EXPECT_EQ(params.size(), 3u) << info.name;
    if (params.size() != 3) continue;
    t.params.topk = static_cast<int>(params[0]);
    t.params.num_steps = static_cast<int>(params[1]);
    t.params.num_draft_tokens = static_cast<int>(params[2]);
    t.tokens = Read<int64_t>(**tree, t.name + ".tree_tokens", DType::kI64);
    t.parents = Read<int32_t>(**tree, t.name + ".tree_parents", DType::kI32);
    t.scores = Read<float>(**tree, t.name + ".tree_scores", DType::kF32);
    g.trees.push_back(std::move(t));
  }
  std::sort(g.trees.begin(), g.trees.end(), [](const GoldenTree& a, const GoldenTree& b) { return a.name < b.name; });
  return g;
}

struct Built {
  std::vector<float> root_logits;  // from the first build's Extend
  std::vector<DraftTree> trees;    // one per golden tree, in order
};

// Every rank loads the draft, and for each tree shape resets the drafter, extends it over the prompt
// rows and builds the tree exactly as the decode loop does.
std::vector<Built> BuildTrees(const Golden& g, int tp) {
  const int64_t t = static_cast<int64_t>(g.tokens.size());
  int64_t max_tree_rows = 0;
  for (const GoldenTree& tree : g.trees) {
    max_tree_rows = std::max<int64_t>(max_tree_rows, int64_t{tree.params.topk} * (tree.params.num_steps - 1));
  }
  DraftModelOptions options;
  options.tp_size = tp;
  options.max_tokens_per_forward = t;
  options.max_context_len = t + max_tree_rows;
  options.page_size = 4;
  options.num_kv_pages = (options.max_context_len + 3) / 4;
  std::vector<Built> built(static_cast<size_t>(tp));
  const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
    cpu::CpuBackend backend;
    DraftModelOptions o = options;
    o.rank = rank;
    EAGLE3_ASSIGN_OR_RETURN(auto draft, DraftModel::Create(g.dir, g.target_dir, o, comm, &backend));
    Eagle3Drafter drafter(draft.get(), 1);
    const int64_t dv = drafter.draft_vocab();
    Built& out = built[static_cast<size_t>(rank)];
    std::vector<float> root_logits(static_cast<size_t>(dv));
    std::vector<float> aux = g.aux;
    for (const GoldenTree& golden : g.trees) {
      EAGLE3_RETURN_IF_ERROR(drafter.Reset(0));
      EAGLE3_RETURN_IF_ERROR(drafter.Extend(0, 0, g.tokens, TensorView(aux.data(), DType::kF32, Shape{t, g.aux_width}),
                                            TensorView(root_logits.data(), DType::kF32, Shape{dv})));
      if (out.root_logits.empty()) out.root_logits = root_logits;
      DraftExpandFn expand = [&](std::span<const DraftCandidate> candidates, std::span<const int32_t> frontier,
                                 const TensorView& logits) -> absl::Status {
        if (frontier.size() == 1 && frontier[0] == 0) {
          std::copy(root_logits.begin(), root_logits.end(), logits.data_as<float>());
          return absl::OkStatus();
        }
        return drafter.Expand(0, candidates, frontier, logits);
      };
      EAGLE3_ASSIGN_OR_RETURN(DraftTree tree, BuildDraftTree(g.root, golden.params, dv, draft->d2t(), expand));
      out.trees.push_back(std::move(tree));
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << "tp " << tp << ": " << status;
  return built;
}

TEST(DraftTreeGoldenTest, FixtureIsConsistent) {
  const Golden g = LoadGolden();
  ASSERT_FALSE(g.prompt.empty());
  ASSERT_GE(g.trees.size(), 2u);
  // The extend tokens are the prompt shifted by one, then the root.
  ASSERT_EQ(g.tokens.size(), g.prompt.size());
  EXPECT_TRUE(std::equal(g.prompt.begin() + 1, g.prompt.end(), g.tokens.begin()));
  EXPECT_EQ(g.tokens.back(), g.root);
  // The root is the target's argmax after the prompt (the target fixture's last logits row).
  auto target = SafetensorsFile::Open(g.target_dir + "/expected.safetensors");
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(Read<int64_t>(**target, "tokens", DType::kI64), g.prompt);
  auto logits = (*target)->View("logits");
  ASSERT_TRUE(logits.ok()) << logits.status();
  const int64_t vocab = logits->dim(1);
  const float* last = logits->data_as<float>() + (logits->dim(0) - 1) * vocab;
  EXPECT_EQ(std::max_element(last, last + vocab) - last, g.root);
  for (const GoldenTree& t : g.trees) {
    EXPECT_EQ(static_cast<int>(t.tokens.size()), t.params.num_draft_tokens) << t.name;
    EXPECT_EQ(t.parents.size(), t.tokens.size()) << t.name;
    EXPECT_EQ(t.scores.size(), t.tokens.size()) << t.name;
  }
}

class DraftTreeGoldenTpTest : public ::testing::TestWithParam<int> {};

TEST_P(DraftTreeGoldenTpTest, DecodeLoopTreesMatchTheReference) {
  const int tp = GetParam();
  const Golden g = LoadGolden();
  ASSERT_GE(g.trees.size(), 2u);
  ASSERT_EQ(static_cast<int64_t>(g.root_logits.size()), g.draft_vocab);
  const std::vector<Built> built = BuildTrees(g, tp);
  ASSERT_EQ(built[0].trees.size(), g.trees.size());

  // The extend pass first: the root's children come from its last row.
  double diff = 0, scale = 1e-30;
  ASSERT_EQ(built[0].root_logits.size(), g.root_logits.size());
  for (size_t i = 0; i < g.root_logits.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(built[0].root_logits[i] - g.root_logits[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(g.root_logits[i])));
  }
  EXPECT_LT(diff / scale, kLogitTolerance) << "tp " << tp << ": root logits of the extend pass";
  std::printf("  tp %d: root logits %.2e", tp, diff / scale);

  for (size_t i = 0; i < g.trees.size(); ++i) {
    const GoldenTree& want = g.trees[i];
    const DraftTree& got = built[0].trees[i];
    const std::string where = "tp " + std::to_string(tp) + " tree " + want.name;
    EXPECT_TRUE(got.Validate().ok()) << where << ": " << got.Validate();
    EXPECT_EQ(got.tokens, want.tokens) << where;
    EXPECT_EQ(got.parents, want.parents) << where;
    ASSERT_EQ(got.scores.size(), want.scores.size()) << where;
    double worst = 0;
    for (size_t n = 0; n < want.scores.size(); ++n) {
      const double d = std::fabs(static_cast<double>(got.scores[n]) - want.scores[n]);
      worst = std::max(worst, d);
      EXPECT_LE(d, kScoreTolerance) << where << " node " << n << ": score " << got.scores[n] << ", want "
                                    << want.scores[n];
    }
    std::printf(", %s scores %.2e", want.name.c_str(), worst);
    // Every rank builds the same tree.
    for (int rank = 1; rank < tp; ++rank) {
      const DraftTree& other = built[static_cast<size_t>(rank)].trees[i];
      EXPECT_EQ(other.tokens, got.tokens) << where << " rank " << rank;
      EXPECT_EQ(other.parents, got.parents) << where << " rank " << rank;
      EXPECT_EQ(other.scores, got.scores) << where << " rank " << rank;
    }
  }
  std::printf("\n");
}

INSTANTIATE_TEST_SUITE_P(Tp, DraftTreeGoldenTpTest, ::testing::Values(1, 2, 8),
                         [](const auto& info) { return "Tp" + std::to_string(info.param); });

}  // namespace
}  // namespace eagle3
