// TargetModel invariants on random-weight checkpoints (CPU reference backend): TP=1 ≡ TP=2/4/8 in both
// residual modes, prefill + decode ≡ one forward, absorbed ≡ non-absorbed attention, a tree-masked
// forward ≡ each branch decoded alone, a mixed batch ≡ each sequence alone, commit of an accepted
// path ≡ having decoded it, and bad input leaving the cache unchanged.
#include "eagle3/target_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/half.h"
#include "eagle3/status.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/rank_threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

// V2 with q-LoRA, YaRN and group-limited routing; vocab 1000 needs padding at TP 8 (to 1024).
constexpr char kV2Config[] = R"({
  "model_type": "deepseek_v2", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 8,
  "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 3,
  "routed_scaling_factor": 2.0, "scoring_func": "softmax", "topk_method": "group_limited_greedy",
  "n_group": 4, "topk_group": 2, "norm_topk_prob": false, "first_k_dense_replace": 1,
  "moe_layer_freq": 1, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
  "rope_theta": 10000, "rope_scaling": {"type": "yarn", "factor": 4.0,
  "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
  "mscale_all_dim": 0.707}, "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1
})";

// V3: plain q_proj, sigmoid/noaux_tc with correction bias, normalize-then-scale, tied embeddings.
constexpr char kV3Config[] = R"({
  "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 8,
  "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 4,
  "topk_group": 2, "norm_topk_prob": true, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
  "v_head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000,
  "rope_scaling": null, "tie_word_embeddings": true, "eos_token_id": 1
})";

struct Result {
  std::vector<float> logits;
  std::vector<float> aux;
};

// Max |a - b| relative to the largest |b| (at least 1).
double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

class TargetModelTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto config = DeepseekV2Config::FromJson(GetParam(), "test config");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    RandomCheckpointOptions options;
    options.seed = 5;
    ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, dir_.path(), options).ok());
    const int ids[] = {0, 1, 2};
    auto tap = HiddenStateTap::Create(std::span<const int>(ids), LayerIdConvention::kInputOfLayer, 3, 64);
    ASSERT_TRUE(tap.ok()) << tap.status();
    tap_ = std::make_unique<HiddenStateTap>(*tap);
  }

  TargetModelOptions Options(int tp, ResidualMode mode, AttentionPath path = AttentionPath::kAuto) const {
    TargetModelOptions o;
    o.tp_size = tp;
    o.residual_mode = mode;
    o.attention_path = path;
    o.max_tokens_per_forward = 32;
    o.max_context_len = 64;
    o.num_kv_pages = 32;
    o.page_size = 4;
    return o;
  }

  // One model per rank; `steps` are run in order on every rank; returns rank 0's outputs of each
  // step and checks that every rank produced the same bits.
  std::vector<Result> Run(const TargetModelOptions& base, const std::vector<std::vector<SequenceInput>>& steps,
                          bool with_tap = true) {
    const int tp = base.tp_size;
    std::vector<std::vector<Result>> results(static_cast<size_t>(tp));
    const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
      cpu::CpuBackend backend;
      TargetModelOptions o = base;
      o.rank = rank;
      EAGLE3_ASSIGN_OR_RETURN(auto model, TargetModel::Create(dir_.path(), o, comm, &backend));
      for (const auto& batch : steps) {
        int64_t tokens = 0;
        for (const auto& s : batch) tokens += static_cast<int64_t>(s.tokens.size());
        Result r;
        r.logits.resize(static_cast<size_t>(TargetModel::LogitRows(batch) * config_.vocab_size));
        r.aux.resize(static_cast<size_t>(tokens * tap_->width()));
        TensorView logits(r.logits.data(), DType::kF32, Shape{TargetModel::LogitRows(batch), config_.vocab_size});
        TensorView aux(r.aux.data(), DType::kF32, Shape{tokens, tap_->width()});
        EAGLE3_RETURN_IF_ERROR(model->Forward(batch, logits, with_tap ? tap_.get() : nullptr,
                                              with_tap ? aux : TensorView()));
        results[static_cast<size_t>(rank)].push_back(std::move(r));
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
    for (int rank = 1; rank < tp && status.ok(); ++rank) {
      for (size_t s = 0; s < results[rank].size(); ++s) {
        EXPECT_EQ(results[rank][s].logits, results[0][s].logits) << "rank " << rank << " step " << s;
        EXPECT_EQ(results[rank][s].aux, results[0][s].aux) << "rank " << rank << " step " << s;
      }
    }
    return results[0];
  }

  // The body of Bf16KvCacheStoresRoundedRows for one attention path.
  void ExpectBf16CacheStoresRoundedRows(AttentionPath path);

  std::vector<int64_t> Prompt(int n, int salt = 0) const {
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[i] = (37 * i + 11 + 101 * salt) % config_.vocab_size;
    return t;
  }

  DeepseekV2Config config_;
  ScopedTempDir dir_, dir2_;
  const std::vector<uint8_t> mask_chain_ = {1, 0, 1, 1};  // node 1 is node 0's child
  std::unique_ptr<HiddenStateTap> tap_;
  std::vector<int32_t> pages0_ = {3, 7, 1, 12, 5, 9, 20, 2, 14, 30, 6, 8, 10, 11, 13, 15};
  std::vector<int32_t> pages1_ = {0, 4, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 31};
};

TEST_P(TargetModelTest, TensorParallelMatchesTp1InBothResidualModes) {
  const auto prompt = Prompt(11);
  SequenceInput in;
  in.tokens = prompt;
  in.page_table = pages0_;
  in.all_logits = true;
  const auto ref = Run(Options(1, ResidualMode::kReplicated), {{in}});
  ASSERT_EQ(ref.size(), 1u);
  for (int tp : {2, 4, 8}) {
    for (ResidualMode mode : {ResidualMode::kReplicated, ResidualMode::kTokenSharded}) {
      const auto got = Run(Options(tp, mode), {{in}});
      ASSERT_EQ(got.size(), 1u) << "tp " << tp;
      EXPECT_LT(RelDiff(got[0].logits, ref[0].logits), 1e-5) << "tp " << tp << " mode " << static_cast<int>(mode);
      EXPECT_LT(RelDiff(got[0].aux, ref[0].aux), 1e-5) << "tp " << tp << " mode " << static_cast<int>(mode);
    }
  }
  // Tap slot 0 is boundary 0, the embedding output: row t is the token's embedding row.
  EXPECT_NE(ref[0].aux[0], 0.0f);
}

TEST_P(TargetModelTest, PrefillThenDecodeMatchesOneForward) {
  const auto prompt = Prompt(9);
  SequenceInput full;
  full.tokens = prompt;
  full.page_table = pages0_;
  full.all_logits = true;
  const auto ref = Run(Options(1, ResidualMode::kReplicated), {{full}});
  std::vector<std::vector<SequenceInput>> steps;
  const int k = 4;
  SequenceInput prefill;
  prefill.tokens = std::span<const int64_t>(prompt.data(), k);
  prefill.page_table = pages0_;
  prefill.all_logits = true;
  steps.push_back({prefill});
  for (int i = k; i < 9; ++i) {
    SequenceInput step;
    step.tokens = std::span<const int64_t>(prompt.data() + i, 1);
    step.page_table = pages0_;
    step.cache_len = i;
    steps.push_back({step});
  }
  for (int tp : {1, 2}) {
    const auto got = Run(Options(tp, ResidualMode::kTokenSharded), steps);
    ASSERT_EQ(got.size(), steps.size());
    const int64_t v = config_.vocab_size, w = tap_->width();
    for (int i = 0; i < 9; ++i) {
      const Result& r = i < k ? got[0] : got[static_cast<size_t>(i - k + 1)];
      const int64_t row = i < k ? i : 0;
      std::vector<float> a(r.logits.begin() + row * v, r.logits.begin() + (row + 1) * v);
      std::vector<float> b(ref[0].logits.begin() + i * v, ref[0].logits.begin() + (i + 1) * v);
      EXPECT_LT(RelDiff(a, b), 1e-5) << "position " << i << " tp " << tp;
      std::vector<float> ta(r.aux.begin() + row * w, r.aux.begin() + (row + 1) * w);
      std::vector<float> tb(ref[0].aux.begin() + i * w, ref[0].aux.begin() + (i + 1) * w);
      EXPECT_LT(RelDiff(ta, tb), 1e-5) << "position " << i;
    }
  }
}

TEST_P(TargetModelTest, AbsorbedMatchesNonAbsorbed) {
  const auto prompt = Prompt(10, 3);
  SequenceInput prefill;
  prefill.tokens = std::span<const int64_t>(prompt.data(), 7);
  prefill.page_table = pages1_;
  prefill.all_logits = true;
  SequenceInput extend;
  extend.tokens = std::span<const int64_t>(prompt.data() + 7, 3);
  extend.page_table = pages1_;
  extend.cache_len = 7;
  extend.all_logits = true;
  const auto a = Run(Options(1, ResidualMode::kReplicated, AttentionPath::kAbsorbed), {{prefill}, {extend}});
  const auto b = Run(Options(1, ResidualMode::kReplicated, AttentionPath::kNonAbsorbed), {{prefill}, {extend}});
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_LT(RelDiff(a[s].logits, b[s].logits), 1e-5) << "step " << s;
    EXPECT_LT(RelDiff(a[s].aux, b[s].aux), 1e-5) << "step " << s;
  }
}

// A page table longer than the cache's page pool (its entries valid; only the first pages used):
// the per-sequence path uploads only the pages the step uses, with the same results as a short table.
TEST_P(TargetModelTest, PageTableLongerThanThePoolUsesItsFirstPages) {
  const auto prompt = Prompt(10, 4);
  std::vector<int32_t> long_table(64);  // num_kv_pages is 32
  for (size_t i = 0; i < long_table.size(); ++i) long_table[i] = static_cast<int32_t>(i < pages1_.size() ? pages1_[i] : 0);
  for (const AttentionPath path : {AttentionPath::kAbsorbed, AttentionPath::kNonAbsorbed}) {
    SequenceInput short_in, long_in;
    short_in.tokens = long_in.tokens = prompt;
    short_in.page_table = pages1_;
    long_in.page_table = long_table;
    short_in.all_logits = long_in.all_logits = true;
    const auto a = Run(Options(1, ResidualMode::kReplicated, path), {{short_in}});
    const auto b = Run(Options(1, ResidualMode::kReplicated, path), {{long_in}});
    ASSERT_EQ(a.size(), 1u);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(a[0].logits, b[0].logits);
  }
  // A sequence that needs more pages than the pool has can only list a page twice: refused.
  cpu::CpuBackend backend;
  TargetModelOptions o = Options(1, ResidualMode::kReplicated);
  o.num_kv_pages = 2;
  auto model = TargetModel::Create(dir_.path(), o, nullptr, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> repeating = {0, 1, 0, 1};
  SequenceInput in;
  in.tokens = prompt;
  in.page_table = repeating;
  std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
  const absl::Status st = (*model)->Forward(std::span<const SequenceInput>(&in, 1),
                                            TensorView(logits.data(), DType::kF32, Shape{1, config_.vocab_size}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("more than the cache's num_kv_pages = 2"), std::string::npos) << st;
  // CommitAccepted likewise: moves spanning more page entries than the pool, and a negative cache_len.
  const std::vector<int64_t> spanning = {0, 12};
  const absl::Status commit = (*model)->CommitAccepted(repeating, 0, spanning);
  EXPECT_EQ(commit.code(), absl::StatusCode::kInvalidArgument) << commit;
  EXPECT_NE(commit.message().find("more than the cache's num_kv_pages 2"), std::string::npos) << commit;
  const std::vector<int64_t> first = {0};
  const absl::Status negative = (*model)->CommitAccepted(repeating, -1, first);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  EXPECT_NE(negative.message().find("cache_len -1"), std::string::npos) << negative;
}

// Create's load statistics count every schema tensor once, and their times are parts of the whole
// (the check before any read, then each tensor's read and its device copy, disjoint intervals).
TEST_P(TargetModelTest, LoadStatsCountEveryWeight) {
  int64_t tp1_bytes = 0;
  for (const int tp : {1, 2}) {
    std::vector<WeightLoadStats> stats(static_cast<size_t>(tp));
    const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
      cpu::CpuBackend backend;
      TargetModelOptions o = Options(tp, ResidualMode::kReplicated);
      o.rank = rank;
      EAGLE3_ASSIGN_OR_RETURN(auto model, TargetModel::Create(dir_.path(), o, comm, &backend));
      stats[static_cast<size_t>(rank)] = model->load_stats();
      return absl::OkStatus();
    });
    ASSERT_TRUE(status.ok()) << status;
    for (int rank = 0; rank < tp; ++rank) {
      const WeightLoadStats& s = stats[static_cast<size_t>(rank)];
      const std::string what = "tp " + std::to_string(tp) + " rank " + std::to_string(rank);
      EXPECT_EQ(s.tensors, static_cast<int64_t>(DeepseekV2Weights(config_).size())) << what;
      EXPECT_GT(s.host_bytes, 0) << what;
      EXPECT_GT(s.read_seconds, 0.0) << what;
      EXPECT_GE(s.device_seconds, 0.0) << what;
      EXPECT_GE(s.total_seconds, s.check_seconds + s.read_seconds + s.device_seconds) << what;
      // A rank reads its own shards: fewer bytes than the whole model at TP 2.
      if (tp == 1) tp1_bytes = s.host_bytes;
      if (tp == 2) EXPECT_LT(s.host_bytes, tp1_bytes) << what;
    }
  }
}

// A tree over a 5-token prefix: root r (last verified token) with children a, b; a has child c.
// Nodes in order [r, a, b, c]; parents [-1, 0, 0, 1]. Branch r-a-c and branch r-b decoded alone must
// give the same logits as their nodes in the tree forward.
TEST_P(TargetModelTest, TreeMaskedForwardMatchesEachBranch) {
  const auto prefix = Prompt(5, 1);
  const std::vector<int64_t> nodes = {prefix.back() == 7 ? 8 : 7, 21, 33, 45};
  const std::vector<int64_t> positions = {5, 6, 6, 7};
  const std::vector<uint8_t> mask = {1, 0, 0, 0,  //
                                     1, 1, 0, 0,  //
                                     1, 0, 1, 0,  //
                                     1, 1, 0, 1};
  SequenceInput pre;
  pre.tokens = prefix;
  pre.page_table = pages0_;
  SequenceInput tree;
  tree.tokens = nodes;
  tree.positions = positions;
  tree.tree_mask = mask;
  tree.page_table = pages0_;
  tree.cache_len = 5;
  tree.all_logits = true;
  const auto got = Run(Options(2, ResidualMode::kReplicated), {{pre}, {tree}});
  ASSERT_EQ(got.size(), 2u);
  const int64_t v = config_.vocab_size;
  const std::vector<std::vector<int>> branches = {{0, 1, 3}, {0, 2}};
  for (const auto& branch : branches) {
    std::vector<int64_t> seq = prefix;
    for (int node : branch) seq.push_back(nodes[static_cast<size_t>(node)]);
    SequenceInput alone;
    alone.tokens = seq;
    alone.page_table = pages1_;
    alone.all_logits = true;
    const auto ref = Run(Options(1, ResidualMode::kReplicated), {{alone}});
    ASSERT_EQ(ref.size(), 1u);
    for (size_t d = 0; d < branch.size(); ++d) {
      const int64_t node = branch[d];
      std::vector<float> a(got[1].logits.begin() + node * v, got[1].logits.begin() + (node + 1) * v);
      const int64_t row = 5 + static_cast<int64_t>(d);
      std::vector<float> b(ref[0].logits.begin() + row * v, ref[0].logits.begin() + (row + 1) * v);
      EXPECT_LT(RelDiff(a, b), 1e-5) << "node " << node;
    }
  }
}

TEST_P(TargetModelTest, MixedBatchMatchesEachSequenceAlone) {
  const auto p0 = Prompt(6, 2), p1 = Prompt(3, 4);
  SequenceInput s0;
  s0.tokens = p0;
  s0.page_table = pages0_;
  s0.all_logits = true;
  SequenceInput s1;
  s1.tokens = p1;
  s1.page_table = pages1_;
  const auto together = Run(Options(4, ResidualMode::kTokenSharded), {{s0, s1}});
  const auto alone0 = Run(Options(1, ResidualMode::kReplicated), {{s0}});
  const auto alone1 = Run(Options(1, ResidualMode::kReplicated), {{s1}});
  ASSERT_EQ(together.size(), 1u);
  const int64_t v = config_.vocab_size;
  std::vector<float> first(together[0].logits.begin(), together[0].logits.begin() + 6 * v);
  std::vector<float> second(together[0].logits.begin() + 6 * v, together[0].logits.end());
  EXPECT_LT(RelDiff(first, alone0[0].logits), 1e-5);
  EXPECT_LT(RelDiff(second, alone1[0].logits), 1e-5);
}

// Verify a 3-node chain, accept nodes 0 and 2 of a tree [r, a, b] (b a sibling of a): after the
// commit, decoding the next token must match a cache that was built by decoding r, b directly.
TEST_P(TargetModelTest, CommitAcceptedMatchesDecodingThePath) {
  const auto prefix = Prompt(4, 5);
  const std::vector<int64_t> nodes = {9, 23, 57};
  const std::vector<int64_t> positions = {4, 5, 5};
  const std::vector<uint8_t> mask = {1, 0, 0, 1, 1, 0, 1, 0, 1};
  const std::vector<int64_t> next = {77};
  const std::vector<int64_t> accepted = {0, 2};

  cpu::CpuBackend backend;
  auto model = TargetModel::Create(dir_.path(), Options(1, ResidualMode::kReplicated), nullptr, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> logits(static_cast<size_t>(3 * config_.vocab_size));
  auto view = [&](int64_t rows) {
    return TensorView(logits.data(), DType::kF32, Shape{rows, config_.vocab_size});
  };
  SequenceInput pre;
  pre.tokens = prefix;
  pre.page_table = pages0_;
  ASSERT_TRUE((*model)->Forward(std::span<const SequenceInput>(&pre, 1), view(1)).ok());
  SequenceInput tree;
  tree.tokens = nodes;
  tree.positions = positions;
  tree.tree_mask = mask;
  tree.page_table = pages0_;
  tree.cache_len = 4;
  tree.all_logits = true;
  ASSERT_TRUE((*model)->Forward(std::span<const SequenceInput>(&tree, 1), view(3)).ok());
  ASSERT_TRUE((*model)->CommitAccepted(pages0_, 4, accepted).ok());
  SequenceInput step;
  step.tokens = next;
  step.page_table = pages0_;
  step.cache_len = 6;
  ASSERT_TRUE((*model)->Forward(std::span<const SequenceInput>(&step, 1), view(1)).ok());
  const std::vector<float> got(logits.begin(), logits.begin() + config_.vocab_size);

  std::vector<int64_t> path = prefix;
  path.push_back(nodes[0]);
  path.push_back(nodes[2]);
  path.push_back(next[0]);
  SequenceInput alone;
  alone.tokens = path;
  alone.page_table = pages1_;
  const auto ref = Run(Options(1, ResidualMode::kReplicated), {{alone}}, /*with_tap=*/false);
  EXPECT_LT(RelDiff(got, ref[0].logits), 1e-5);
}

// CommitAcceptedOnDevice over a batch ≡ CommitAccepted per sequence (same cache afterwards, seen
// through the next decode step of every sequence, bit for bit): a sequence with num_accepted = -1
// is skipped; one with a bad entry is named, left unwritten in every layer, and the others are
// still compacted in every layer.
TEST_P(TargetModelTest, CommitAcceptedOnDeviceEqualsCommitAcceptedPerSequence) {
  const std::vector<std::vector<int32_t>> pages = {
      {pages0_.begin(), pages0_.begin() + 5}, {pages0_.begin() + 5, pages0_.begin() + 10},
      {pages1_.begin(), pages1_.begin() + 5}};
  const std::vector<int64_t> prefix_len = {5, 3, 4};
  constexpr int64_t kChain = 6, kMaxNodes = 8;
  const std::vector<std::vector<int32_t>> keep = {{0, 2, 3, 5}, {}, {0, 1, 4, 5}};  // [1]: skipped
  // The prefixes, then a 6-token chain per sequence (the verify forward).
  auto prepare = [&](TargetModel& model) {
    std::vector<std::vector<int64_t>> tokens;
    std::vector<SequenceInput> batch(3);
    for (int s = 0; s < 3; ++s) tokens.push_back(Prompt(static_cast<int>(prefix_len[s]), s));
    for (int s = 0; s < 3; ++s) {
      batch[s].tokens = tokens[s];
      batch[s].page_table = pages[s];
    }
    std::vector<float> logits(static_cast<size_t>(3 * config_.vocab_size));
    EXPECT_TRUE(model.Forward(batch, TensorView(logits.data(), DType::kF32, Shape{3, config_.vocab_size})).ok());
    tokens.clear();
    for (int s = 0; s < 3; ++s) tokens.push_back(Prompt(kChain, 10 + s));
    for (int s = 0; s < 3; ++s) {
      batch[s].tokens = tokens[s];
      batch[s].cache_len = prefix_len[s];
    }
    EXPECT_TRUE(model.Forward(batch, TensorView(logits.data(), DType::kF32, Shape{3, config_.vocab_size})).ok());
  };
  // One more token per sequence on top of the committed caches; returns the logits.
  auto next = [&](TargetModel& model) {
    std::vector<SequenceInput> batch(3);
    const std::vector<int64_t> token = {42};
    for (int s = 0; s < 3; ++s) {
      batch[s].tokens = token;
      batch[s].page_table = pages[s];
      batch[s].cache_len = prefix_len[s] + (s == 1 ? kChain : static_cast<int64_t>(keep[s].size()));
    }
    std::vector<float> logits(static_cast<size_t>(3 * config_.vocab_size));
    EXPECT_TRUE(model.Forward(batch, TensorView(logits.data(), DType::kF32, Shape{3, config_.vocab_size})).ok());
    return logits;
  };
  auto create = [&](cpu::CpuBackend& backend) {
    auto model = TargetModel::Create(dir_.path(), Options(1, ResidualMode::kReplicated), nullptr, &backend);
    EXPECT_TRUE(model.ok()) << model.status();
    return std::move(model).value();
  };

  cpu::CpuBackend backend_host;
  auto host = create(backend_host);
  prepare(*host);
  for (int s : {0, 2}) {
    const std::vector<int64_t> accepted(keep[s].begin(), keep[s].end());
    ASSERT_TRUE(host->CommitAccepted(pages[s], prefix_len[s], accepted).ok());
  }
  const std::vector<float> want = next(*host);

  // The batch inputs (host memory is the CPU backend's device memory).
  std::vector<int32_t> tables;
  for (const auto& p : pages) tables.insert(tables.end(), p.begin(), p.end());
  std::vector<int64_t> cache_len = prefix_len;
  std::vector<int32_t> accepted(3 * kMaxNodes, 0);
  for (int s = 0; s < 3; ++s) std::copy(keep[s].begin(), keep[s].end(), accepted.begin() + s * kMaxNodes);
  accepted[kMaxNodes] = 4;  // sequence 1: entries that would be bad, never read while skipped
  accepted[kMaxNodes + 1] = 1;
  std::vector<int32_t> num = {4, -1, 4};
  const TensorView tables_t(tables.data(), DType::kI32, Shape{3, 5});
  const TensorView len_t(cache_len.data(), DType::kI64, Shape{3});
  const TensorView accepted_t(accepted.data(), DType::kI32, Shape{3, kMaxNodes});
  const TensorView num_t(num.data(), DType::kI32, Shape{3});
  {
    cpu::CpuBackend backend;
    auto model = create(backend);
    prepare(*model);
    const absl::Status st = model->CommitAcceptedOnDevice(tables_t, len_t, accepted_t, num_t);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(next(*model), want);
  }
  {
    num[1] = 2;  // now read: accepted[1] = {4, 1} is not increasing
    cpu::CpuBackend backend;
    auto model = create(backend);
    prepare(*model);
    const absl::Status st = model->CommitAcceptedOnDevice(tables_t, len_t, accepted_t, num_t);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("CompactAccepted: sequence 1, entry 1"));
    EXPECT_EQ(next(*model), want);
  }
  // Shapes are checked: a [3] accepted is not [B, max_nodes].
  const absl::Status st = host->CommitAcceptedOnDevice(tables_t, len_t, num_t, num_t);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("accepted"));
  // CommitAccepted's offsets must lie among the rows a Forward can write.
  const std::vector<int64_t> beyond = {0, 32};
  const absl::Status far = host->CommitAccepted(pages0_, 0, beyond);
  EXPECT_EQ(far.code(), absl::StatusCode::kInvalidArgument) << far;
  EXPECT_THAT(std::string(far.message()), HasSubstr("max_tokens_per_forward = 32"));
}

TEST_P(TargetModelTest, BadInputIsRefusedAndLeavesTheCacheUnchanged) {
  cpu::CpuBackend backend;
  auto model = TargetModel::Create(dir_.path(), Options(1, ResidualMode::kReplicated), nullptr, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto prompt = Prompt(6, 6);
  std::vector<float> logits(static_cast<size_t>(6 * config_.vocab_size));
  auto view = [&](int64_t rows) {
    return TensorView(logits.data(), DType::kF32, Shape{rows, config_.vocab_size});
  };
  SequenceInput pre;
  pre.tokens = std::span<const int64_t>(prompt.data(), 5);
  pre.page_table = pages0_;
  ASSERT_TRUE((*model)->Forward(std::span<const SequenceInput>(&pre, 1), view(1)).ok());

  struct Case {
    const char* name;
    SequenceInput input;
    absl::StatusCode code;
    const char* message;
  };
  const std::vector<int64_t> bad_token = {config_.vocab_size};
  const std::vector<int64_t> two = {3, 4};
  const std::vector<int64_t> far_position = {64};
  const std::vector<uint8_t> later = {1, 1, 0, 1};
  const std::vector<uint8_t> no_self = {1, 0, 1, 0};
  const std::vector<int32_t> one_page = {3};
  const std::vector<int32_t> bad_page = {3, 7, 99};
  const std::vector<int64_t> wrong_depth = {5, 7};
  std::vector<Case> cases;
  auto add = [&](const char* name, SequenceInput in, absl::StatusCode code, const char* message) {
    in.cache_len = in.cache_len == 0 ? 5 : in.cache_len;
    if (in.page_table.empty()) in.page_table = pages0_;
    cases.push_back({name, in, code, message});
  };
  SequenceInput in;
  in.tokens = bad_token;
  add("token id >= vocab", in, absl::StatusCode::kInvalidArgument, "outside the vocabulary [0, ");
  in = {};
  in.tokens = std::span<const int64_t>(prompt.data() + 5, 1);
  in.positions = far_position;
  add("position out of range", in, absl::StatusCode::kInvalidArgument, "position 0 = 64");
  in = {};
  in.tokens = two;
  in.page_table = one_page;
  add("KV capacity exhausted", in, absl::StatusCode::kOutOfRange, "KV capacity exhausted");
  in = {};
  in.tokens = two;
  in.page_table = bad_page;
  add("page outside the cache", in, absl::StatusCode::kInvalidArgument, "page_table[2] = 99");
  in = {};
  in.tokens = two;
  in.tree_mask = later;
  add("node attends a later node", in, absl::StatusCode::kInvalidArgument, "parents must precede children");
  in = {};
  in.tokens = two;
  in.tree_mask = no_self;
  add("node does not attend itself", in, absl::StatusCode::kInvalidArgument, "does not attend to itself");
  in = {};
  in.tokens = two;
  in.positions = wrong_depth;
  in.tree_mask = std::span<const uint8_t>(mask_chain_);
  add("child position not parent + 1", in, absl::StatusCode::kInvalidArgument, "expected its parent's");
  for (const Case& c : cases) {
    absl::Status st = (*model)->Forward(std::span<const SequenceInput>(&c.input, 1), view(1));
    EXPECT_EQ(st.code(), c.code) << c.name << ": " << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.message)) << c.name;
  }
  // A wrong logits buffer is refused too.
  SequenceInput step;
  step.tokens = std::span<const int64_t>(prompt.data() + 5, 1);
  step.page_table = pages0_;
  step.cache_len = 5;
  absl::Status st = (*model)->Forward(std::span<const SequenceInput>(&step, 1), view(2));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("logits must be f32[1, "));

  // None of the refused calls touched the cache: the next token's logits equal a fresh run's.
  ASSERT_TRUE((*model)->Forward(std::span<const SequenceInput>(&step, 1), view(1)).ok());
  const std::vector<float> got(logits.begin(), logits.begin() + config_.vocab_size);
  SequenceInput alone;
  alone.tokens = prompt;
  alone.page_table = pages1_;
  const auto ref = Run(Options(1, ResidualMode::kReplicated), {{alone}}, /*with_tap=*/false);
  EXPECT_LT(RelDiff(got, ref[0].logits), 1e-6);
}

// Create zeroes every layer's KV cache, and kv_cache(l) shows what a step writes: after a 6-token
// prefill the rows of positions 0..5 (through the page table: pages 3 and 7) hold values, every
// other row of every layer is still zero. Layers outside the model give a null view.
TEST_P(TargetModelTest, KvCacheStartsZeroedAndShowsTheRowsAStepWrote) {
  cpu::CpuBackend backend;
  const TargetModelOptions o = Options(1, ResidualMode::kReplicated);
  auto model = TargetModel::Create(dir_.path(), o, nullptr, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  const int layers = static_cast<int>(config_.num_hidden_layers);
  const int64_t width = config_.kv_lora_rank + config_.qk_rope_head_dim;
  EXPECT_EQ((*model)->kv_cache(-1).data(), nullptr);
  EXPECT_EQ((*model)->kv_cache(layers).data(), nullptr);
  // Rows (page * page_size + slot) holding a nonzero element, per layer.
  const auto written_rows = [&](int layer) {
    const TensorView c = (*model)->kv_cache(layer);
    EXPECT_EQ(c.shape(), (Shape{o.num_kv_pages, o.page_size, width}));
    EXPECT_EQ(c.dtype(), DType::kF32);
    std::vector<int64_t> rows;
    const float* data = c.data_as<const float>();
    for (int64_t r = 0; r < o.num_kv_pages * o.page_size; ++r) {
      if (std::any_of(data + r * width, data + (r + 1) * width, [](float v) { return v != 0.0f; })) {
        rows.push_back(r);
      }
    }
    return rows;
  };
  for (int l = 0; l < layers; ++l) EXPECT_THAT(written_rows(l), ::testing::IsEmpty()) << "layer " << l;

  const auto prompt = Prompt(6, 2);
  SequenceInput pre;
  pre.tokens = prompt;
  pre.page_table = pages0_;
  std::vector<float> logits(static_cast<size_t>(config_.vocab_size));
  ASSERT_TRUE((*model)->Forward(std::span<const SequenceInput>(&pre, 1),
                                TensorView(logits.data(), DType::kF32, Shape{1, config_.vocab_size}))
                  .ok());
  std::vector<int64_t> want;
  for (int64_t s = 0; s < 6; ++s) want.push_back(pages0_[s / o.page_size] * o.page_size + s % o.page_size);
  std::sort(want.begin(), want.end());
  for (int l = 0; l < layers; ++l) EXPECT_EQ(written_rows(l), want) << "layer " << l;
}

// kv_cache_dtype bf16 (eagle3/backend.h's bf16 cache semantics, on the CPU reference too): the
// cache is bf16 and zeroed at Create; layer 0's rows are the f32 model's rows rounded to bf16 (its
// input, the embedding, is the same on both); every layer's attention then reads the rounded rows,
// so the logits move by about bf16's precision, no more.
TEST_P(TargetModelTest, Bf16KvCacheStoresRoundedRows) {
  for (const AttentionPath path : {AttentionPath::kAuto, AttentionPath::kNonAbsorbed}) {
    SCOPED_TRACE(path == AttentionPath::kAuto ? "absorbed" : "non-absorbed");
    ExpectBf16CacheStoresRoundedRows(path);
  }
}

void TargetModelTest::ExpectBf16CacheStoresRoundedRows(AttentionPath path) {
  cpu::CpuBackend backend;
  TargetModelOptions o = Options(1, ResidualMode::kReplicated, path);
  auto f32_model = TargetModel::Create(dir_.path(), o, nullptr, &backend);
  ASSERT_TRUE(f32_model.ok()) << f32_model.status();
  o.kv_cache_dtype = DType::kBF16;
  auto bf16_model = TargetModel::Create(dir_.path(), o, nullptr, &backend);
  ASSERT_TRUE(bf16_model.ok()) << bf16_model.status();
  const int layers = static_cast<int>(config_.num_hidden_layers);
  const int64_t width = config_.kv_lora_rank + config_.qk_rope_head_dim;
  const int64_t slots = o.num_kv_pages * o.page_size;
  for (int l = 0; l < layers; ++l) {
    const TensorView c = (*bf16_model)->kv_cache(l);
    ASSERT_EQ(c.dtype(), DType::kBF16) << "layer " << l;
    const uint16_t* bits = c.data_as<const uint16_t>();
    EXPECT_TRUE(std::all_of(bits, bits + slots * width, [](uint16_t b) { return b == 0; })) << "layer " << l;
  }

  const auto prompt = Prompt(7, 3);
  std::vector<SequenceInput> steps(2);
  steps[0].tokens = prompt;
  steps[0].page_table = pages0_;
  const std::vector<int64_t> next = {prompt[2]};
  steps[1].tokens = next;
  steps[1].page_table = pages0_;
  steps[1].cache_len = static_cast<int64_t>(prompt.size());
  double max_rel = 0.0;
  for (const SequenceInput& in : steps) {
    std::vector<float> want(static_cast<size_t>(config_.vocab_size)), got(want.size());
    const Shape shape{1, config_.vocab_size};
    ASSERT_TRUE((*f32_model)->Forward(std::span<const SequenceInput>(&in, 1), TensorView(want.data(), DType::kF32, shape)).ok());
    ASSERT_TRUE((*bf16_model)->Forward(std::span<const SequenceInput>(&in, 1), TensorView(got.data(), DType::kF32, shape)).ok());
    float scale = 1e-30f, diff = 0.0f;
    for (size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, std::abs(want[i]));
      diff = std::max(diff, std::abs(got[i] - want[i]));
    }
    max_rel = std::max(max_rel, static_cast<double>(diff / scale));
  }
  EXPECT_GT(max_rel, 0.0) << "the bf16 cache changed nothing: not rounded?";
  EXPECT_LT(max_rel, 3e-2);

  // Layer 0, every written slot: bf16 bits == the f32 row rounded to nearest even.
  const float* f32_rows = (*f32_model)->kv_cache(0).data_as<const float>();
  const uint16_t* bf16_rows = (*bf16_model)->kv_cache(0).data_as<const uint16_t>();
  int64_t written = 0;
  for (int64_t s = 0; s <= static_cast<int64_t>(prompt.size()); ++s) {
    const int64_t slot = pages0_[s / o.page_size] * o.page_size + s % o.page_size;
    for (int64_t d = 0; d < width; ++d) {
      ASSERT_EQ(bf16_rows[slot * width + d], FloatToBf16(f32_rows[slot * width + d])) << "position " << s << " dim " << d;
    }
    written += f32_rows[slot * width] != 0.0f ? 1 : 0;
  }
  EXPECT_EQ(written, static_cast<int64_t>(prompt.size()) + 1);
}

TEST_P(TargetModelTest, MissingOrMisshapedTensorsAreNamed) {
  ScopedTempDir broken;
  auto config = config_;
  config.kv_lora_rank = 16;  // the checkpoint's kv_b_proj etc. were written for 32
  RandomCheckpointOptions options;
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, broken.path(), options).ok());
  // Rewrite config.json only: config and checkpoint now disagree.
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config, dir2_.path(), options).ok());
  std::filesystem::copy_file(std::filesystem::path(dir2_.path()) / "config.json",
                             std::filesystem::path(broken.path()) / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  cpu::CpuBackend backend;
  auto model = TargetModel::Create(broken.path(), Options(1, ResidualMode::kReplicated), nullptr, &backend);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("kv_a_proj_with_mqa.weight"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("expected [24, 64]"));

  std::filesystem::remove(std::filesystem::path(dir_.path()) / "model.safetensors.index.json");
  auto missing = TargetModel::Create(dir_.path(), Options(1, ResidualMode::kReplicated), nullptr, &backend);
  EXPECT_FALSE(missing.ok());
}

// Storage dtypes: the CPU reference (f32 only) refuses bf16 weights at Create, naming the option
// and the dtype; a dtype that is neither f32 nor bf16 is InvalidArgument naming the option.
TEST_P(TargetModelTest, WeightAndCacheDtypesAreCheckedAtCreate) {
  cpu::CpuBackend backend;
  EXPECT_EQ(backend.preferred_weight_dtype(), DType::kF32);
  TargetModelOptions o = Options(1, ResidualMode::kReplicated);
  o.weight_dtype = DType::kBF16;
  auto bf16 = TargetModel::Create(dir_.path(), o, nullptr, &backend);
  ASSERT_FALSE(bf16.ok());
  EXPECT_EQ(bf16.status().code(), absl::StatusCode::kInvalidArgument) << bf16.status();
  EXPECT_THAT(std::string(bf16.status().message()), HasSubstr("weight_dtype bf16"));
  EXPECT_THAT(std::string(bf16.status().message()), HasSubstr("CpuBackend takes f32 only"));
  o.weight_dtype = DType::kI32;
  auto i32 = TargetModel::Create(dir_.path(), o, nullptr, &backend);
  ASSERT_FALSE(i32.ok());
  EXPECT_EQ(i32.status().code(), absl::StatusCode::kInvalidArgument) << i32.status();
  EXPECT_THAT(std::string(i32.status().message()), HasSubstr("weight_dtype is i32"));
  o.weight_dtype = DType::kF32;
  o.kv_cache_dtype = DType::kF16;
  auto f16_cache = TargetModel::Create(dir_.path(), o, nullptr, &backend);
  ASSERT_FALSE(f16_cache.ok());
  EXPECT_EQ(f16_cache.status().code(), absl::StatusCode::kInvalidArgument) << f16_cache.status();
  EXPECT_THAT(std::string(f16_cache.status().message()), HasSubstr("kv_cache_dtype is f16"));
  // Unset means the backend's preference (f32 here): the model loads and runs.
  o.weight_dtype.reset();
  o.kv_cache_dtype.reset();
  EXPECT_TRUE(TargetModel::Create(dir_.path(), o, nullptr, &backend).ok());
}

INSTANTIATE_TEST_SUITE_P(Configs, TargetModelTest, ::testing::Values(kV2Config, kV3Config),
                         [](const auto& info) { return info.index == 0 ? "V2" : "V3"; });

}  // namespace
}  // namespace eagle3
