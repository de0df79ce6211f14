#include "eagle3/draft_tree.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The fake draft: logits that depend on the whole draft-id path from the root (and the trial), either
// continuous or drawn from three levels so that ties are everywhere.
struct FakeDraft {
  uint64_t seed = 0;
  int64_t vocab = 0;
  bool tied = false;

  float Logit(const std::vector<int64_t>& path, int64_t id) const {
    uint64_t h = Mix(seed);
    for (const int64_t p : path) h = Mix(h ^ static_cast<uint64_t>(p + 1));
    const uint64_t r = Mix(h ^ (static_cast<uint64_t>(id) << 32));
    if (tied) return static_cast<float>(r % 3);
    return static_cast<float>(static_cast<double>(r >> 11) / 9007199254740992.0 * 6.0 - 3.0);
  }
};

struct ExpandCall {
  int rows = 0;
  std::vector<int32_t> depths;
};

// DraftExpandFn over a FakeDraft: walks each frontier candidate's parents to rebuild its path.
DraftExpandFn MakeExpand(const FakeDraft& draft, std::vector<ExpandCall>* calls) {
  return [draft, calls](std::span<const DraftCandidate> candidates, std::span<const int32_t> frontier,
                        const TensorView& logits) -> absl::Status {
    EXPECT_EQ(logits.dtype(), DType::kF32);
    EXPECT_EQ(logits.rank(), 2);
    EXPECT_EQ(logits.dim(0), static_cast<int64_t>(frontier.size()));
    EXPECT_EQ(logits.dim(1), draft.vocab);
    EXPECT_TRUE(logits.is_contiguous());
    ExpandCall call;
    call.rows = static_cast<int>(frontier.size());
    for (size_t r = 0; r < frontier.size(); ++r) {
      std::vector<int64_t> path;
      for (int32_t c = frontier[r]; c > 0; c = candidates[c].parent) path.push_back(candidates[c].draft_id);
      std::reverse(path.begin(), path.end());
      call.depths.push_back(candidates[frontier[r]].depth);
      float* row = logits.data_as<float>() + r * draft.vocab;
      for (int64_t id = 0; id < draft.vocab; ++id) row[id] = draft.Logit(path, id);
    }
    if (calls != nullptr) calls->push_back(call);
    return absl::OkStatus();
  };
}

// ---- Brute-force re-enumeration of the EAGLE-2 procedure ----------------------------------------
// Every path the beam rule reaches is enumerated level by level with its cumulative score and its
// rank key (level, frontier rank of its parent, rank among its parent's children) — the candidate
// index written as a tuple; then the best N-1 paths are picked by (score, key).

struct RefPath {
  double score = 0.0;
  std::tuple<int, int, int> key;  // (level, parent's frontier rank, child rank)
};

struct RefTree {
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents;
  std::vector<float> scores;
};

RefTree BruteForce(const FakeDraft& draft, int64_t root_token, const DraftTreeParams& params,
                   const std::vector<int64_t>& d2t) {
  std::map<std::vector<int64_t>, RefPath> reached;
  std::vector<std::vector<int64_t>> beam = {{}};  // level 0: the root's empty path
  std::map<std::vector<int64_t>, double> beam_score = {{{}, 0.0}};
  for (int level = 1; level <= params.num_steps; ++level) {
    std::vector<std::pair<std::vector<int64_t>, RefPath>> level_paths;
    for (int f = 0; f < static_cast<int>(beam.size()); ++f) {
      const std::vector<int64_t>& parent = beam[f];
      std::vector<std::pair<float, int64_t>> children;  // (logit, id) over the whole vocabulary
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t id = 0; id < draft.vocab; ++id) {
        children.emplace_back(draft.Logit(parent, id), id);
        max = std::max(max, static_cast<double>(children.back().first));
      }
      double sum = 0.0;
      for (const auto& [logit, id] : children) sum += std::exp(static_cast<double>(logit) - max);
      const double lse = max + std::log(sum);
      std::sort(children.begin(), children.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      for (int j = 0; j < params.topk; ++j) {
        std::vector<int64_t> path = parent;
        path.push_back(children[j].second);
        RefPath info;
        info.score = beam_score[parent] + (static_cast<double>(children[j].first) - lse);
        info.key = {level, f, j};
        level_paths.emplace_back(path, info);
      }
    }
    for (const auto& [path, info] : level_paths) reached[path] = info;
    std::sort(level_paths.begin(), level_paths.end(), [](const auto& a, const auto& b) {
      return a.second.score != b.second.score ? a.second.score > b.second.score : a.second.key < b.second.key;
    });
    beam.clear();
    beam_score.clear();
    for (int i = 0; i < params.topk && i < static_cast<int>(level_paths.size()); ++i) {
      beam.push_back(level_paths[i].first);
      beam_score[level_paths[i].first] = level_paths[i].second.score;
    }
  }
  std::vector<std::pair<std::vector<int64_t>, RefPath>> all(reached.begin(), reached.end());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.second.score != b.second.score ? a.second.score > b.second.score : a.second.key < b.second.key;
  });
  all.resize(static_cast<size_t>(params.num_draft_tokens - 1));
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.second.key < b.second.key; });

  RefTree ref;
  ref.tokens.push_back(root_token);
  ref.parents.push_back(-1);
  ref.scores.push_back(0.0f);
  std::map<std::vector<int64_t>, int32_t> node_of = {{{}, 0}};
  for (const auto& [path, info] : all) {
    const std::vector<int64_t> prefix(path.begin(), path.end() - 1);
    const auto parent = node_of.find(prefix);
    ref.parents.push_back(parent == node_of.end() ? -99 : parent->second);  // -99: closure broken
    const int64_t id = path.back();
    ref.tokens.push_back(d2t.empty() ? id : id + d2t[id]);
    ref.scores.push_back(static_cast<float>(info.score));
    node_of[path] = static_cast<int32_t>(ref.tokens.size() - 1);
  }
  return ref;
}

// Structural invariants every built tree satisfies.
void ExpectInvariants(const DraftTree& tree, const DraftTreeParams& params) {
  ASSERT_TRUE(tree.Validate().ok()) << tree.Validate();
  const int n = tree.size();
  ASSERT_EQ(n, params.num_draft_tokens);
  EXPECT_EQ(tree.parents[0], -1);
  EXPECT_EQ(tree.scores[0], 0.0f);
  for (int i = 1; i < n; ++i) {
    ASSERT_GE(tree.parents[i], 0);
    ASSERT_LT(tree.parents[i], i) << "parents precede children";
    EXPECT_EQ(tree.depths[i], tree.depths[tree.parents[i]] + 1);
    EXPECT_LE(tree.depths[i], params.num_steps);
    EXPECT_LE(tree.scores[i], tree.scores[tree.parents[i]]) << "a child never outscores its parent";
  }
  // Sibling lists: node order, and non-increasing score.
  for (int p = 0; p < n; ++p) {
    int prev = -1;
    for (int c = tree.first_child[p]; c != -1; c = tree.next_sibling[c]) {
      EXPECT_EQ(tree.parents[c], p);
      if (prev != -1) {
        EXPECT_GT(c, prev);
        EXPECT_LE(tree.scores[c], tree.scores[prev]) << "siblings by decreasing score";
      }
      prev = c;
    }
  }
  // Mask rows are the ancestor-or-self sets; the packed mask is the dense one.
  const std::vector<uint8_t> dense = tree.DenseMask();
  const std::vector<uint32_t> packed = tree.PackedMask();
  const int words = (n + 31) / 32;
  ASSERT_EQ(dense.size(), static_cast<size_t>(n) * n);
  ASSERT_EQ(packed.size(), static_cast<size_t>(n) * words);
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> ancestors(n, 0);
    for (int a = i; a != -1; a = tree.parents[a]) ancestors[a] = 1;
    for (int j = 0; j < n; ++j) {
      EXPECT_EQ(dense[i * n + j], ancestors[j]) << "row " << i << " column " << j;
      EXPECT_EQ((packed[i * words + j / 32] >> (j % 32)) & 1u, ancestors[j]) << "row " << i << " column " << j;
    }
  }
  const std::vector<int64_t> positions = tree.Positions(100);
  for (int i = 0; i < n; ++i) EXPECT_EQ(positions[i], 100 + tree.depths[i]);
}

struct Config {
  int topk, steps, tokens;
  int64_t vocab;
};

TEST(DraftTreeTest, MatchesBruteForceEnumeration) {
  const Config configs[] = {
      {1, 1, 2, 5},   {1, 4, 5, 7},   {1, 4, 3, 7},    {2, 3, 6, 9},    {2, 2, 7, 9},  {3, 3, 10, 16},
      {4, 3, 8, 16},  {4, 1, 5, 16},  {3, 4, 31, 12},  {4, 5, 20, 50},  {8, 3, 30, 40}, {5, 2, 2, 5},
  };
  int trials_run = 0;
  for (const Config& config : configs) {
    const DraftTreeParams params{config.topk, config.steps, config.tokens};
    ASSERT_TRUE(params.Validate(config.vocab).ok()) << params.Validate(config.vocab);
    for (int trial = 0; trial < 40; ++trial) {
      for (const bool tied : {false, true}) {
        SCOPED_TRACE("topk " + std::to_string(config.topk) + " steps " + std::to_string(config.steps) + " N " +
                     std::to_string(config.tokens) + " vocab " + std::to_string(config.vocab) + " trial " +
                     std::to_string(trial) + (tied ? " tied" : ""));
        const FakeDraft draft{static_cast<uint64_t>(1000 * trial + config.topk * 31 + config.steps), config.vocab,
                              tied};
        // Odd trials map ids through a d2t of non-negative offsets.
        std::vector<int64_t> d2t;
        if (trial % 2 == 1) {
          for (int64_t id = 0; id < config.vocab; ++id) d2t.push_back(static_cast<int64_t>(Mix(id + trial) % 1000));
        }
        std::vector<ExpandCall> calls;
        auto tree = BuildDraftTree(777, params, config.vocab, d2t, MakeExpand(draft, &calls));
        ASSERT_TRUE(tree.ok()) << tree.status();
        ExpectInvariants(*tree, params);

        ASSERT_EQ(static_cast<int>(calls.size()), config.steps);
        for (int s = 0; s < config.steps; ++s) {
          EXPECT_EQ(calls[s].rows, s == 0 ? 1 : config.topk);
          for (const int32_t d : calls[s].depths) EXPECT_EQ(d, s) << "the frontier of step " << s;
        }

        const RefTree ref = BruteForce(draft, 777, params, d2t);
        EXPECT_EQ(tree->tokens, ref.tokens);
        EXPECT_EQ(tree->parents, ref.parents);
        EXPECT_EQ(tree->scores, ref.scores);
        ++trials_run;
      }
    }
  }
  EXPECT_EQ(trials_run, 12 * 40 * 2);
}

TEST(DraftTreeTest, ChainIsTheGreedyPath) {
  // topk = 1: each step keeps the single best child, and the tree is the first N-1 of them.
  const FakeDraft draft{99, 11, false};
  const DraftTreeParams params{1, 6, 7};
  auto tree = BuildDraftTree(5, params, 11, {}, MakeExpand(draft, nullptr));
  ASSERT_TRUE(tree.ok()) << tree.status();
  std::vector<int64_t> path;
  for (int i = 1; i < 7; ++i) {
    EXPECT_EQ(tree->parents[i], i - 1);
    int64_t best = 0;
    for (int64_t id = 1; id < 11; ++id) {
      if (draft.Logit(path, id) > draft.Logit(path, best)) best = id;
    }
    EXPECT_EQ(tree->tokens[i], best) << "depth " << i;
    path.push_back(best);
  }
}

TEST(DraftTreeTest, TiesGoToLowerIdsAndEarlierCandidates) {
  // All logits equal: every child has log-prob -log(V); the root's top-k are ids 0..k-1, the frontier
  // is the first k candidates, and the final pick prefers shallower (higher-scoring) then earlier ones.
  const int64_t vocab = 6;
  const DraftTreeParams params{2, 3, 6};
  auto expand = [](std::span<const DraftCandidate>, std::span<const int32_t>, const TensorView& logits) {
    std::fill_n(logits.data_as<float>(), logits.numel(), 1.5f);
    return absl::OkStatus();
  };
  auto tree = BuildDraftTree(40, params, vocab, {}, expand);
  ASSERT_TRUE(tree.ok()) << tree.status();
  // Candidates: 1, 2 (depth 1, ids 0, 1); 3..6 (depth 2: children 0, 1 of candidate 1, then of 2);
  // 7..10 (depth 3). N - 1 = 5 picks: 1, 2, 3, 4, 5.
  EXPECT_THAT(tree->tokens, ElementsAre(40, 0, 1, 0, 1, 0));
  EXPECT_THAT(tree->parents, ElementsAre(-1, 0, 0, 1, 1, 2));
  const float logp = static_cast<float>(-std::log(6.0));
  EXPECT_FLOAT_EQ(tree->scores[1], logp);
  EXPECT_FLOAT_EQ(tree->scores[3], 2 * logp);
}

TEST(DraftTreeTest, MaskedLogitsAreNeverPreferred) {
  // -inf is a masked token: with enough finite logits none is picked.
  auto expand = [](std::span<const DraftCandidate>, std::span<const int32_t> frontier, const TensorView& logits) {
    float* data = logits.data_as<float>();
    for (size_t r = 0; r < frontier.size(); ++r) {
      for (int64_t id = 0; id < 8; ++id) {
        data[r * 8 + id] = id % 2 == 0 ? -std::numeric_limits<float>::infinity() : static_cast<float>(id);
      }
    }
    return absl::OkStatus();
  };
  auto tree = BuildDraftTree(0, DraftTreeParams{3, 2, 8}, 8, {}, expand);
  ASSERT_TRUE(tree.ok()) << tree.status();
  for (int i = 1; i < tree->size(); ++i) {
    EXPECT_EQ(tree->tokens[i] % 2, 1) << "node " << i;
    EXPECT_TRUE(std::isfinite(tree->scores[i]));
  }
}

void ExpectInvalid(const absl::Status& status, const std::string& text) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(text));
}

TEST(DraftTreeTest, ParamsAreValidated) {
  ExpectInvalid(DraftTreeParams{9, 3, 8}.Validate(8), "topk = 9 is out of range [1, 8]");
  ExpectInvalid(DraftTreeParams{0, 3, 8}.Validate(8), "topk = 0 is out of range [1, 8]");
  ExpectInvalid(DraftTreeParams{2, 0, 3}.Validate(8), "num_steps = 0 must be >= 1");
  ExpectInvalid(DraftTreeParams{2, 3, 12}.Validate(8), "num_draft_tokens = 12 is out of range [2, 11]");
  ExpectInvalid(DraftTreeParams{2, 3, 1}.Validate(8), "num_draft_tokens = 1 is out of range [2, 11]");
  ExpectInvalid(DraftTreeParams{1, 3, 2}.Validate(0), "draft_vocab = 0");
  EXPECT_TRUE((DraftTreeParams{2, 3, 11}.Validate(8).ok()));
  EXPECT_TRUE((DraftTreeParams{8, 1, 9}.Validate(8).ok()));
  // topk² does not overflow.
  ExpectInvalid(DraftTreeParams{70000, 3, 2}.Validate(60000), "topk = 70000");
  EXPECT_TRUE((DraftTreeParams{60000, 3, 1000}.Validate(60000).ok()));

  const FakeDraft draft{1, 8, false};
  ExpectInvalid(BuildDraftTree(3, DraftTreeParams{9, 3, 8}, 8, {}, MakeExpand(draft, nullptr)).status(),
                "topk = 9 is out of range [1, 8] (the draft vocabulary size)");
  ExpectInvalid(BuildDraftTree(3, DraftTreeParams{2, 3, 12}, 8, {}, MakeExpand(draft, nullptr)).status(),
                "1 + topk + (num_steps - 1) * topk^2 with topk = 2, num_steps = 3");
  ExpectInvalid(BuildDraftTree(-1, DraftTreeParams{2, 3, 5}, 8, {}, MakeExpand(draft, nullptr)).status(),
                "root token -1 is negative");
  ExpectInvalid(BuildDraftTree(3, DraftTreeParams{2, 3, 5}, 8, {}, nullptr).status(), "no draft expand callback");
}

TEST(DraftTreeTest, BadD2tIsRejected) {
  const FakeDraft draft{1, 8, false};
  std::vector<int64_t> d2t = {10, 10, 10, -5, 10, 10, 10, 10};
  ExpectInvalid(BuildDraftTree(3, DraftTreeParams{2, 2, 4}, 8, d2t, MakeExpand(draft, nullptr)).status(),
                "d2t[3] = -5 maps draft id 3 to target id -2 (< 0); d2t holds offsets");
  d2t[3] = -3;  // target 0 is fine
  EXPECT_TRUE(BuildDraftTree(3, DraftTreeParams{2, 2, 4}, 8, d2t, MakeExpand(draft, nullptr)).ok());
  d2t.pop_back();
  ExpectInvalid(BuildDraftTree(3, DraftTreeParams{2, 2, 4}, 8, d2t, MakeExpand(draft, nullptr)).status(),
                "d2t has 7 entries, the draft vocabulary 8");
}

TEST(DraftTreeTest, BadLogitsNameTheRow) {
  const FakeDraft draft{5, 8, false};
  // Poisons row `row` of step `step` at draft id 3.
  auto poisoned = [&draft](int step, int row, float value) -> DraftExpandFn {
    auto inner = MakeExpand(draft, nullptr);
    auto calls = std::make_shared<int>(0);
    return [=](std::span<const DraftCandidate> c, std::span<const int32_t> f, const TensorView& logits) {
      absl::Status st = inner(c, f, logits);
      if (*calls == step) logits.data_as<float>()[row * 8 + 3] = value;
      ++*calls;
      return st;
    };
  };
  const DraftTreeParams params{3, 3, 8};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto st = BuildDraftTree(3, params, 8, {}, poisoned(1, 2, nan)).status();
  ExpectInvalid(st, "logits of step 1 row 2 (candidate 3) has NaN at draft id 3");
  st = BuildDraftTree(3, params, 8, {}, poisoned(0, 0, nan)).status();
  ExpectInvalid(st, "logits of step 0 row 0 (candidate 0) has NaN at draft id 3");
  st = BuildDraftTree(3, params, 8, {}, poisoned(2, 1, inf)).status();
  ExpectInvalid(st, "logits of step 2 row 1");
  EXPECT_THAT(std::string(st.message()), HasSubstr("+inf at draft id 3"));

  auto all_masked = [](std::span<const DraftCandidate>, std::span<const int32_t>, const TensorView& logits) {
    std::fill_n(logits.data_as<float>(), logits.numel(), -std::numeric_limits<float>::infinity());
    return absl::OkStatus();
  };
  ExpectInvalid(BuildDraftTree(3, params, 8, {}, all_masked).status(), "no finite logit");

  auto failing = [](std::span<const DraftCandidate>, std::span<const int32_t>, const TensorView&) {
    return absl::ResourceExhaustedError("draft KV cache full");
  };
  st = BuildDraftTree(3, params, 8, {}, failing).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(st.message(), "draft KV cache full");
}

TEST(DraftTreeTest, FromParentsFillsListsAndDepths) {
  const std::vector<int64_t> tokens = {7, 1, 2, 3, 4, 5};
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2, 1};
  auto tree = DraftTree::FromParents(tokens, parents);
  ASSERT_TRUE(tree.ok()) << tree.status();
  EXPECT_THAT(tree->depths, ElementsAre(0, 1, 1, 2, 2, 2));
  EXPECT_THAT(tree->first_child, ElementsAre(1, 3, 4, -1, -1, -1));
  EXPECT_THAT(tree->next_sibling, ElementsAre(-1, 2, -1, 5, -1, -1));
  EXPECT_THAT(tree->scores, ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_EQ(tree->max_depth(), 2);
  EXPECT_TRUE(tree->Validate().ok());
  // Node 5's mask row: itself, node 1, the root.
  const std::vector<uint8_t> mask = tree->DenseMask();
  EXPECT_THAT(std::vector<uint8_t>(mask.begin() + 30, mask.end()), ElementsAre(1, 1, 0, 0, 0, 1));
  EXPECT_THAT(tree->PackedMask(), ElementsAre(0b1u, 0b11u, 0b101u, 0b1011u, 0b10101u, 0b100011u));

  ExpectInvalid(DraftTree::FromParents(tokens, std::vector<int32_t>{-1, 0, 0, 4, 2, 1}).status(),
                "node 3 has parent 4; parents must precede children");
  ExpectInvalid(DraftTree::FromParents(tokens, std::vector<int32_t>{0, 0, 0, 1, 2, 1}).status(),
                "node 0 is the root, its parent must be -1, got 0");
  ExpectInvalid(DraftTree::FromParents(tokens, std::vector<int32_t>{-1, 0}).status(), "6 tokens but 2 parents");
  ExpectInvalid(DraftTree::FromParents({}, {}).status(), "no nodes");
}

TEST(DraftTreeTest, PackedMaskSpansWords) {
  // A 70-node chain: row 69 sets bits 0..69 over three words.
  std::vector<int64_t> tokens(70, 1);
  std::vector<int32_t> parents(70);
  for (int i = 0; i < 70; ++i) parents[i] = i - 1;
  auto tree = DraftTree::FromParents(tokens, parents);
  ASSERT_TRUE(tree.ok());
  const std::vector<uint32_t> packed = tree->PackedMask();
  ASSERT_EQ(packed.size(), 70u * 3);
  EXPECT_THAT(std::vector<uint32_t>(packed.begin() + 69 * 3, packed.end()),
              ElementsAre(0xffffffffu, 0xffffffffu, 0x3fu));
  EXPECT_THAT(std::vector<uint32_t>(packed.begin() + 32 * 3, packed.begin() + 33 * 3),
              ElementsAre(0xffffffffu, 0x1u, 0u));
  EXPECT_EQ(tree->max_depth(), 69);
}

TEST(DraftTreeTest, ValidateNamesTheNodeAndTheFault) {
  const std::vector<int64_t> tokens = {7, 1, 2, 3, 4};
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 1};
  auto good = DraftTree::FromParents(tokens, parents);
  ASSERT_TRUE(good.ok());

  DraftTree t = *good;
  t.depths[3] = 5;
  ExpectInvalid(t.Validate(), "node 3 has depth 5, expected 2 (parent 1 has depth 1)");

  t = *good;
  t.parents[4] = 4;
  ExpectInvalid(t.Validate(), "node 4 has parent 4; parents must precede children");

  t = *good;
  t.first_child[2] = 3;  // node 3 belongs to node 1
  ExpectInvalid(t.Validate(), "node 3 is in the child list of node 2 (via first_child of node 2) but its parent is 1");

  t = *good;
  t.next_sibling[4] = 3;  // 3 -> 4 -> 3 -> ...
  ExpectInvalid(t.Validate(), "node 3 appears twice in the child list of node 1");

  t = *good;
  t.next_sibling[3] = -1;  // drops node 4
  ExpectInvalid(t.Validate(), "node 4 is missing from the child list of its parent 1");

  t = *good;
  t.first_child[1] = 9;
  ExpectInvalid(t.Validate(), "node 1 has first_child 9, out of range [1, 4] or -1");

  t = *good;
  t.next_sibling[0] = 1;
  ExpectInvalid(t.Validate(), "node 0 (root) has next_sibling 1, expected -1");

  t = *good;
  t.depths.pop_back();
  ExpectInvalid(t.Validate(), "depths has 4 entries, tokens has 5");

  t = *good;
  t.scores.clear();  // scores are optional
  EXPECT_TRUE(t.Validate().ok());

  // Another sibling order is a valid tree too.
  t = *good;
  t.first_child[1] = 4;
  t.next_sibling[4] = 3;
  t.next_sibling[3] = -1;
  EXPECT_TRUE(t.Validate().ok()) << t.Validate();

  ExpectInvalid(DraftTree{}.Validate(), "no nodes");
}

}  // namespace
}  // namespace eagle3
