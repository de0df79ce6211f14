// Shared by the golden tests of the drafters that tools/make_golden.py writes fixtures for (the MLA
// EAGLE-3 draft, the MTP module): reading the fixtures, running a DraftModel's two golden steps and
// the decode loop's tree build at any TP (in-process ranks), comparing.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/draft_tree.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/safetensors.h"
#include "eagle3/status.h"
#include "eagle3/testing/rank_threads.h"
#include "gtest/gtest.h"

namespace eagle3::golden {

inline std::string GoldenDir(const std::string& name) { return std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + name; }

template <typename T>
std::vector<T> Read(const SafetensorsFile& file, const std::string& name, DType dtype) {
  auto v = file.View(name);
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) return {};
  EXPECT_EQ(v->dtype(), dtype) << name;
  if (v->dtype() != dtype) return {};
  return std::vector<T>(v->data_as<T>(), v->data_as<T>() + v->numel());
}
inline std::vector<float> ReadF32(const SafetensorsFile& file, const std::string& name) {
  return Read<float>(file, name, DType::kF32);
}
inline std::vector<int64_t> ReadI64(const SafetensorsFile& file, const std::string& name) {
  return Read<int64_t>(file, name, DType::kI64);
}

// Max |got - want| over the largest |want|.
inline double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return diff / scale;
}

// Makes one rank's draft (DraftModel::Create or CreateMtp over a fixture).
using DraftFactory = std::function<absl::StatusOr<std::unique_ptr<DraftModel>>(const DraftModelOptions&,
                                                                              Communicator*, Backend*)>;

// Makes one rank's backend: the CPU reference by default; a GPU test passes the CUDA backend's (at
// TP 1: the in-process communicator moves host memory).
using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>()>;
inline BackendFactory CpuBackends() {
  return []() -> absl::StatusOr<std::unique_ptr<Backend>> { return std::make_unique<cpu::CpuBackend>(); };
}

// How the golden runs load the draft: the rank's backend and the weight storage (unset: the
// backend's preference; a GPU test asks for f32, compared at f32 tolerances).
struct RunSetup {
  BackendFactory backends = CpuBackends();
  std::optional<DType> weight_dtype;
};

struct TwoSteps {
  std::vector<float> logits0, hidden0, logits1, hidden1;
};

// Step 0: one causal pass over the T rows of `tokens` at positions 0..T-1 from `input` ([T, input
// width], from_target), every row's logits; step 1: one row (`token1`) at position T fed the last
// row's hidden_out, attending the T cached rows and itself. On `tp` in-process ranks; every rank
// must return the same step-1 outputs. Rank 0's outputs.
inline TwoSteps RunTwoSteps(const DraftFactory& make, int tp, const std::vector<int64_t>& tokens,
                            const std::vector<float>& input, const std::vector<int64_t>& token1,
                            const RunSetup& setup = RunSetup()) {
  const int64_t t = static_cast<int64_t>(tokens.size());
  DraftModelOptions options;
  options.tp_size = tp;
  options.max_tokens_per_forward = t;
  options.max_context_len = t + 1;
  options.page_size = 4;
  options.num_kv_pages = (t + 1 + 3) / 4;
  options.weight_dtype = setup.weight_dtype;
  // Pages in reverse order: a layer that ignored the page table would read other rows.
  std::vector<int32_t> pages(static_cast<size_t>(options.num_kv_pages));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(pages.size() - 1 - p);
  std::vector<TwoSteps> out(static_cast<size_t>(tp));
  const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
    EAGLE3_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, setup.backends());
    DraftModelOptions o = options;
    o.rank = rank;
    EAGLE3_ASSIGN_OR_RETURN(auto model, make(o, comm, backend.get()));
    const DraftShape& shape = model->shape();
    TwoSteps& r = out[static_cast<size_t>(rank)];
    r.logits0.resize(static_cast<size_t>(t * shape.draft_vocab));
    r.hidden0.resize(static_cast<size_t>(t * shape.hidden_size));
    DraftSequenceInput in;
    in.tokens = tokens;
    in.page_table = pages;
    in.all_logits = true;
    EAGLE3_RETURN_IF_ERROR(
        model->Forward(std::span<const DraftSequenceInput>(&in, 1),
                       TensorView(const_cast<float*>(input.data()), DType::kF32, Shape{t, shape.input_width}),
                       /*from_target=*/true, TensorView(r.logits0.data(), DType::kF32, Shape{t, shape.draft_vocab}),
                       TensorView(r.hidden0.data(), DType::kF32, Shape{t, shape.hidden_size})));
    std::vector<float> fed(r.hidden0.end() - shape.hidden_size, r.hidden0.end());
    r.logits1.resize(static_cast<size_t>(shape.draft_vocab));
    r.hidden1.resize(static_cast<size_t>(shape.hidden_size));
    DraftSequenceInput next;
    next.tokens = token1;
    next.page_table = pages;
    next.cache_len = t;
    return model->Forward(std::span<const DraftSequenceInput>(&next, 1),
                          TensorView(fed.data(), DType::kF32, Shape{1, shape.hidden_size}), /*from_target=*/false,
                          TensorView(r.logits1.data(), DType::kF32, Shape{1, shape.draft_vocab}),
                          TensorView(r.hidden1.data(), DType::kF32, Shape{1, shape.hidden_size}));
  });
  EXPECT_TRUE(status.ok()) << "tp " << tp << ": " << status;
  for (int rank = 1; rank < tp; ++rank) {
    EXPECT_EQ(out[static_cast<size_t>(rank)].logits1, out[0].logits1) << "rank " << rank;
    EXPECT_EQ(out[static_cast<size_t>(rank)].hidden1, out[0].hidden1) << "rank " << rank;
  }
  return out[0];
}

struct GoldenTree {
  std::string name;
  DraftTreeParams params;
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents;
  std::vector<float> scores;
};

// A tree.safetensors (tests/data/golden/README.md): the prompt, its root, the extend pass's tokens,
// the root's draft logits and every tree shape, sorted by name.
struct GoldenTrees {
  std::vector<int64_t> prompt, tokens;
  int64_t root = -1;
  std::vector<float> root_logits;
  std::vector<GoldenTree> trees;
};

inline GoldenTrees LoadGoldenTrees(const std::string& path) {
  GoldenTrees g;
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return g;
  const SafetensorsFile& tree = **file;
  g.prompt = ReadI64(tree, "prompt");
  g.tokens = ReadI64(tree, "tokens");
  const std::vector<int64_t> root = ReadI64(tree, "root");
  EXPECT_EQ(root.size(), 1u);
  if (root.size() == 1) g.root = root[0];
  g.root_logits = ReadF32(tree, "root_logits");
  const std::string suffix = ".params";
  for (const TensorInfo& info : tree.tensors()) {
    if (!info.name.ends_with(suffix)) continue;
    GoldenTree t;
    t.name = info.name.substr(0, info.name.size() - suffix.size());
    const std::vector<int64_t> params = ReadI64(tree, info.name);
    EXPECT_EQ(params.size(), 3u) << info.name;
    if (params.size() != 3) continue;
    t.params.topk = static_cast<int>(params[0]);
    t.params.num_steps = static_cast<int>(params[1]);
    t.params.num_draft_tokens = static_cast<int>(params[2]);
    t.tokens = ReadI64(tree, t.name + ".tree_tokens");
    t.parents = Read<int32_t>(tree, t.name + ".tree_parents", DType::kI32);
    t.scores = ReadF32(tree, t.name + ".tree_scores");
    g.trees.push_back(std::move(t));
  }
  std::sort(g.trees.begin(), g.trees.end(), [](const GoldenTree& a, const GoldenTree& b) { return a.name < b.name; });
  return g;
}

struct BuiltTrees {
  std::vector<float> root_logits;  // the first build's extend pass
  std::vector<DraftTree> trees;    // one per golden tree, in order
};

// Every rank loads the draft and, for each tree shape, resets an Eagle3Drafter, extends it over the
// prompt rows from `input` ([T, input width]) and builds the tree as the decode loop does.
inline std::vector<BuiltTrees> BuildGoldenTrees(const DraftFactory& make, int tp, const GoldenTrees& g,
                                                const std::vector<float>& input, const RunSetup& setup = RunSetup()) {
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
  options.weight_dtype = setup.weight_dtype;
  std::vector<BuiltTrees> built(static_cast<size_t>(tp));
  const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
    EAGLE3_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, setup.backends());
    DraftModelOptions o = options;
    o.rank = rank;
    EAGLE3_ASSIGN_OR_RETURN(auto draft, make(o, comm, backend.get()));
    Eagle3Drafter drafter(draft.get(), 1);
    const int64_t dv = drafter.draft_vocab();
    const int64_t width = draft->shape().input_width;
    BuiltTrees& out = built[static_cast<size_t>(rank)];
    std::vector<float> root_logits(static_cast<size_t>(dv));
    std::vector<float> rows = input;
    for (const GoldenTree& golden : g.trees) {
      EAGLE3_RETURN_IF_ERROR(drafter.Reset(0));
      EAGLE3_RETURN_IF_ERROR(drafter.Extend(0, 0, g.tokens, TensorView(rows.data(), DType::kF32, Shape{t, width}),
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
  if (!status.ok()) built.assign(built.size(), BuiltTrees());
  return built;
}

// The built trees against the golden ones: root logits within `logit_tolerance` of the largest,
// tokens and parents exactly, scores within `score_tolerance`, every rank's trees alike.
inline void ExpectTreesMatch(const std::vector<BuiltTrees>& built, const GoldenTrees& g, int tp,
                             double logit_tolerance, double score_tolerance) {
  ASSERT_EQ(built[0].trees.size(), g.trees.size()) << "tp " << tp;
  const double root_error = RelError(built[0].root_logits, g.root_logits);
  EXPECT_LT(root_error, logit_tolerance) << "tp " << tp << ": root logits of the extend pass";
  std::printf("  tp %d: root logits %.2e", tp, root_error);
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
      EXPECT_LE(d, score_tolerance) << where << " node " << n;
    }
    std::printf(", %s scores %.2e", want.name.c_str(), worst);
    for (int rank = 1; rank < tp; ++rank) {
      const DraftTree& other = built[static_cast<size_t>(rank)].trees[i];
      EXPECT_EQ(other.tokens, got.tokens) << where << " rank " << rank;
      EXPECT_EQ(other.parents, got.parents) << where << " rank " << rank;
      EXPECT_EQ(other.scores, got.scores) << where << " rank " << rank;
    }
  }
  std::printf("\n");
}

}  // namespace eagle3::golden
