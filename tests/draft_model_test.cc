// DraftModel invariants on random checkpoints (CPU reference backend): TP=1 ≡ TP=2/4/8, one extend
// pass ≡ row by row with a growing cache, a mixed batch ≡ each sequence alone, a tree-masked step ≡
// each branch alone, the variant keys doing exactly what they say (checked by hand or through an
// invariant each), both layer prefixes, and bad checkpoints / bad inputs refused with a message that
// names the problem, leaving the cache unchanged.
#include "eagle3/draft_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/in_process_group.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "eagle3/testing/rank_threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A small V2 target (3 layers, hidden 64, vocab 1000: padded to 1024 at TP 8).
constexpr char kTargetConfig[] = R"({
  "model_type": "deepseek_v2", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 8,
  "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 1.0, "scoring_func": "softmax", "topk_method": "greedy",
  "n_group": 1, "topk_group": 1, "norm_topk_prob": false, "first_k_dense_replace": 1,
  "moe_layer_freq": 1, "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
  "rope_theta": 10000, "rope_scaling": null, "tie_word_embeddings": false
})";

constexpr int64_t kHidden = 64;
constexpr int64_t kVocab = 1000;
constexpr int64_t kDraftVocab = 300;  // at TP 8: 64 rows per rank, rank 4 holds 44, ranks 5-7 padding
constexpr int64_t kAuxWidth = 3 * kHidden;

// GQA (16 query heads on 8 kv heads, head_dim 16 != hidden / heads), YaRN over a 16-token original
// context so that every test position is in the scaled regime, aux ids {0, 1, 2} (boundaries 1-3).
RandomDraftCheckpointOptions DraftOptions() {
  RandomDraftCheckpointOptions o;
  o.seed = 11;
  o.num_attention_heads = 16;
  o.num_key_value_heads = 8;
  o.head_dim = 16;
  o.intermediate_size = 128;
  o.draft_vocab_size = kDraftVocab;
  o.rope.theta = 10000;
  o.rope.scaling.type = RopeScaling::Type::kYarn;
  o.rope.scaling.factor = 4.0;
  o.rope.scaling.original_max_position_embeddings = 16;
  o.aux_layer_ids = {0, 1, 2};
  return o;
}

std::vector<float> RandomValues(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int64_t> Tokens(int n, int salt) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (37 * i + 11 + 101 * salt) % kVocab;
  return t;
}

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

std::vector<float> RowsOf(const std::vector<float>& v, int64_t width, int64_t first, int64_t count) {
  return std::vector<float>(v.begin() + first * width, v.begin() + (first + count) * width);
}

// hidden_norm-style RMSNorm of each row (eps 1e-6, the random drafts' rms_norm_eps) in double.
std::vector<float> RmsNormRows(const std::vector<float>& x, const std::vector<float>& w) {
  const size_t width = w.size();
  std::vector<float> out(x.size());
  for (size_t r = 0; r < x.size() / width; ++r) {
    double ms = 0;
    for (size_t i = 0; i < width; ++i) ms += static_cast<double>(x[r * width + i]) * x[r * width + i];
    const double inv = 1.0 / std::sqrt(ms / static_cast<double>(width) + 1e-6);
    for (size_t i = 0; i < width; ++i) out[r * width + i] = static_cast<float>(x[r * width + i] * inv * w[i]);
  }
  return out;
}

std::vector<float> ReadF32(const std::string& dir, const std::string& name) {
  auto checkpoint = Checkpoint::Open(dir);
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
  if (!checkpoint.ok()) return {};
  auto t = (*checkpoint)->Read(name, DType::kF32);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  return std::vector<float>(t->data_as<float>(), t->data_as<float>() + t->numel());
}

// One Forward call: its sequences, its input rows and where they come from.
struct Step {
  std::vector<DraftSequenceInput> batch;
  std::vector<float> hidden;
  bool from_target = true;
};

struct Output {
  std::vector<float> logits, hidden;
};

class DraftModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto config = DeepseekV2Config::FromJson(kTargetConfig, "test target");
    ASSERT_TRUE(config.ok()) << config.status();
    target_config_ = new DeepseekV2Config(*config);
    target_dir_ = new ScopedTempDir();
    RandomCheckpointOptions options;
    options.seed = 3;
    ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(*target_config_, target_dir_->path(), options).ok());
    draft_dir_ = new ScopedTempDir();
    ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*target_config_, draft_dir_->path(), DraftOptions()).ok());
  }
  static void TearDownTestSuite() {
    delete draft_dir_;
    delete target_dir_;
    delete target_config_;
  }

  static DraftModelOptions Options(int tp) {
    DraftModelOptions o;
    o.tp_size = tp;
    o.max_tokens_per_forward = 32;
    o.max_context_len = 64;
    o.num_kv_pages = 32;
    o.page_size = 4;
    return o;
  }

  // A draft written from `options` into a fresh directory kept alive by the fixture.
  std::string WriteDraft(const RandomDraftCheckpointOptions& options) {
    dirs_.push_back(std::make_unique<ScopedTempDir>());
    EXPECT_TRUE(WriteRandomEagle3DraftCheckpoint(*target_config_, dirs_.back()->path(), options).ok());
    return dirs_.back()->path();
  }

  // A copy of the draft in `from` with its tensors and config.json edited.
  std::string EditDraft(const std::string& from, const std::function<void(std::map<std::string, Tensor>&)>& tensors,
                        const std::function<void(nlohmann::json&)>& config = nullptr) {
    dirs_.push_back(std::make_unique<ScopedTempDir>());
    const std::string to = dirs_.back()->path();
    auto checkpoint = Checkpoint::Open(from);
    EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
    std::map<std::string, Tensor> all;
    for (const std::string& name : (*checkpoint)->TensorNames()) {
      auto info = (*checkpoint)->Info(name);
      auto t = (*checkpoint)->Read(name, info->dtype);
      EXPECT_TRUE(t.ok()) << t.status();
      all.emplace(name, std::move(*t));
    }
    if (tensors) tensors(all);
    std::vector<NamedTensor> named;
    for (const auto& [name, t] : all) named.push_back({name, t});
    EXPECT_TRUE(WriteSafetensors(to + "/model.safetensors", named).ok());
    std::ifstream in(from + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    if (config) config(j);
    std::ofstream(to + "/config.json") << j.dump(2);
    return to;
  }

  absl::Status CreateStatus(const std::string& draft, int tp = 1) {
    std::shared_ptr<InProcessGroup> group;
    std::unique_ptr<Communicator> comm;
    if (tp > 1) {
      group = *InProcessGroup::Create(tp);
      comm = *group->Rank(0);
    }
    cpu::CpuBackend backend;
    return DraftModel::Create(draft, target_dir_->path(), Options(tp), comm.get(), &backend).status();
  }

  // One model per rank runs `steps` in order; returns rank 0's outputs and checks that every rank
  // produced the same bits.
  std::vector<Output> Run(int tp, const std::vector<Step>& steps, const std::string& draft = "") {
    const std::string dir = draft.empty() ? draft_dir_->path() : draft;
    std::vector<std::vector<Output>> results(static_cast<size_t>(tp));
    const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
      cpu::CpuBackend backend;
      DraftModelOptions o = Options(tp);
      o.rank = rank;
      EAGLE3_ASSIGN_OR_RETURN(auto model, DraftModel::Create(dir, target_dir_->path(), o, comm, &backend));
      for (const Step& step : steps) {
        int64_t rows = 0;
        for (const auto& s : step.batch) rows += static_cast<int64_t>(s.tokens.size());
        const int64_t width = step.from_target ? kAuxWidth : kHidden;
        Output out;
        const int64_t logit_rows = DraftModel::LogitRows(step.batch);
        out.logits.resize(static_cast<size_t>(logit_rows * kDraftVocab));
        out.hidden.resize(static_cast<size_t>(rows * kHidden));
        EAGLE3_RETURN_IF_ERROR(model->Forward(
            step.batch, TensorView(const_cast<float*>(step.hidden.data()), DType::kF32, Shape{rows, width}),
            step.from_target, TensorView(out.logits.data(), DType::kF32, Shape{logit_rows, kDraftVocab}),
            TensorView(out.hidden.data(), DType::kF32, Shape{rows, kHidden})));
        results[static_cast<size_t>(rank)].push_back(std::move(out));
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(status.ok()) << status;
    for (int rank = 1; rank < tp && status.ok(); ++rank) {
      for (size_t s = 0; s < results[rank].size(); ++s) {
        EXPECT_EQ(results[rank][s].logits, results[0][s].logits) << "rank " << rank << " step " << s;
        EXPECT_EQ(results[rank][s].hidden, results[0][s].hidden) << "rank " << rank << " step " << s;
      }
    }
    return results[0];
  }

  // A causal step over `tokens` after `cache_len` cached rows of pages0_.
  Step Causal(const std::vector<int64_t>& tokens, int64_t cache_len, std::vector<float> hidden, bool from_target,
              bool all_logits = true) {
    Step step;
    DraftSequenceInput in;
    in.tokens = tokens;
    in.page_table = pages0_;
    in.cache_len = cache_len;
    in.all_logits = all_logits;
    step.batch.push_back(in);
    step.hidden = std::move(hidden);
    step.from_target = from_target;
    return step;
  }

  static DeepseekV2Config* target_config_;
  static ScopedTempDir* target_dir_;
  static ScopedTempDir* draft_dir_;
  std::vector<std::unique_ptr<ScopedTempDir>> dirs_;
  std::vector<int32_t> pages0_ = {3, 7, 1, 12, 5, 9, 20, 2, 14, 30, 6, 8, 10, 11, 13, 15};
  std::vector<int32_t> pages1_ = {0, 4, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 31};
};

DeepseekV2Config* DraftModelTest::target_config_ = nullptr;
ScopedTempDir* DraftModelTest::target_dir_ = nullptr;
ScopedTempDir* DraftModelTest::draft_dir_ = nullptr;

TEST_F(DraftModelTest, TensorParallelMatchesTp1) {
  const auto tokens = Tokens(11, 0);
  const auto next = Tokens(3, 1);
  const std::vector<Step> steps = {Causal(tokens, 0, RandomValues(11 * kAuxWidth, 1), true),
                                   Causal(next, 11, RandomValues(3 * kHidden, 2), false)};
  const auto ref = Run(1, steps);
  ASSERT_EQ(ref.size(), 2u);
  for (int tp : {2, 4, 8}) {
    const auto got = Run(tp, steps);
    ASSERT_EQ(got.size(), 2u) << "tp " << tp;
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_LT(RelDiff(got[s].logits, ref[s].logits), 1e-5) << "tp " << tp << " step " << s;
      EXPECT_LT(RelDiff(got[s].hidden, ref[s].hidden), 1e-5) << "tp " << tp << " step " << s;
    }
  }
  // The logits are not degenerate: rows differ and are spread.
  EXPECT_NE(RowsOf(ref[0].logits, kDraftVocab, 0, 1), RowsOf(ref[0].logits, kDraftVocab, 1, 1));
}

TEST_F(DraftModelTest, ExtendMatchesRowByRowWithAGrowingCache) {
  const int n = 7;
  const auto tokens = Tokens(n, 2);
  const auto aux = RandomValues(n * kAuxWidth, 3);
  const auto ref = Run(1, {Causal(tokens, 0, aux, true)});
  ASSERT_EQ(ref.size(), 1u);
  std::vector<Step> steps;
  std::vector<std::vector<int64_t>> one(n);
  for (int i = 0; i < n; ++i) {
    one[i] = {tokens[i]};
    steps.push_back(Causal(one[i], i, RowsOf(aux, kAuxWidth, i, 1), true));
  }
  const auto got = Run(1, steps);
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    EXPECT_LT(RelDiff(got[i].logits, RowsOf(ref[0].logits, kDraftVocab, i, 1)), 1e-5) << "row " << i;
    EXPECT_LT(RelDiff(got[i].hidden, RowsOf(ref[0].hidden, kHidden, i, 1)), 1e-5) << "row " << i;
  }
  // Only the last row's logits when all_logits is false.
  const auto last = Run(1, {Causal(tokens, 0, aux, true, /*all_logits=*/false)});
  EXPECT_LT(RelDiff(last[0].logits, RowsOf(ref[0].logits, kDraftVocab, n - 1, 1)), 1e-6);
}

TEST_F(DraftModelTest, MixedBatchMatchesEachSequenceAlone) {
  const auto a = Tokens(5, 3), b = Tokens(4, 4);
  const auto aux_a = RandomValues(5 * kAuxWidth, 4), aux_b = RandomValues(4 * kAuxWidth, 5);
  Step both;
  DraftSequenceInput in_a, in_b;
  in_a.tokens = a;
  in_a.page_table = pages0_;
  in_a.all_logits = true;
  in_b.tokens = b;
  in_b.page_table = pages1_;
  in_b.all_logits = false;
  both.batch = {in_a, in_b};
  both.hidden = aux_a;
  both.hidden.insert(both.hidden.end(), aux_b.begin(), aux_b.end());
  const auto got = Run(2, {both});
  const auto alone_a = Run(1, {Causal(a, 0, aux_a, true)});
  Step only_b = Causal(b, 0, aux_b, true, false);
  only_b.batch[0].page_table = pages1_;
  const auto alone_b = Run(1, {only_b});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_LT(RelDiff(RowsOf(got[0].logits, kDraftVocab, 0, 5), alone_a[0].logits), 1e-5);
  EXPECT_LT(RelDiff(RowsOf(got[0].logits, kDraftVocab, 5, 1), alone_b[0].logits), 1e-5);
  EXPECT_LT(RelDiff(RowsOf(got[0].hidden, kHidden, 0, 5), alone_a[0].hidden), 1e-5);
  EXPECT_LT(RelDiff(RowsOf(got[0].hidden, kHidden, 5, 4), alone_b[0].hidden), 1e-5);
}

// Context of c rows, then one tree step: nodes 0 and 1 are siblings (depth 1), node 2 is node 0's
// child and node 3 node 1's (depth 2). Each branch decoded alone after the same context must give
// the same rows.
TEST_F(DraftModelTest, TreeMaskedStepMatchesEachBranchAlone) {
  const int c = 6;
  const auto context = Tokens(c, 5);
  const auto aux = RandomValues(c * kAuxWidth, 6);
  const std::vector<int64_t> nodes = {17, 901, 333, 42};
  const std::vector<int64_t> positions = {c, c, c + 1, c + 1};
  const int parent[] = {-1, -1, 0, 1};
  const auto node_hidden = RandomValues(4 * kHidden, 7);
  const int64_t s = c + 4;
  std::vector<uint8_t> mask(static_cast<size_t>(4 * s), 0);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < c; ++j) mask[static_cast<size_t>(i * s + j)] = 1;
    for (int a = i; a >= 0; a = parent[a]) mask[static_cast<size_t>(i * s + c + a)] = 1;
  }
  Step tree;
  DraftSequenceInput in;
  in.tokens = nodes;
  in.positions = positions;
  in.page_table = pages0_;
  in.cache_len = c;
  in.mask = mask;
  in.all_logits = true;
  tree.batch = {in};
  tree.hidden = node_hidden;
  tree.from_target = false;
  const auto got = Run(4, {Causal(context, 0, aux, true), tree});
  ASSERT_EQ(got.size(), 2u);
  for (int leaf : {2, 3}) {
    const int root = parent[leaf];
    const std::vector<int64_t> branch = {nodes[root], nodes[leaf]};
    std::vector<float> hidden = RowsOf(node_hidden, kHidden, root, 1);
    const auto leaf_hidden = RowsOf(node_hidden, kHidden, leaf, 1);
    hidden.insert(hidden.end(), leaf_hidden.begin(), leaf_hidden.end());
    const auto alone = Run(1, {Causal(context, 0, aux, true), Causal(branch, c, hidden, false)});
    ASSERT_EQ(alone.size(), 2u);
    EXPECT_LT(RelDiff(RowsOf(got[1].logits, kDraftVocab, root, 1), RowsOf(alone[1].logits, kDraftVocab, 0, 1)), 1e-5)
        << "node " << root;
    EXPECT_LT(RelDiff(RowsOf(got[1].logits, kDraftVocab, leaf, 1), RowsOf(alone[1].logits, kDraftVocab, 1, 1)), 1e-5)
        << "node " << leaf;
    EXPECT_LT(RelDiff(RowsOf(got[1].hidden, kHidden, leaf, 1), RowsOf(alone[1].hidden, kHidden, 1, 1)), 1e-5)
        << "node " << leaf;
  }
}

// With norm_before_residual both uses of g see hidden_norm(g), so scaling the fed-back hidden
// changes nothing; without it the residual is g itself and the output moves.
TEST_F(DraftModelTest, NormBeforeResidualMakesTheResidualHiddenNormOfG) {
  RandomDraftCheckpointOptions o = DraftOptions();
  o.norm_before_residual = true;
  const std::string nbr = WriteDraft(o);
  const auto tokens = Tokens(4, 6);
  const auto g = RandomValues(4 * kHidden, 8, 3.0f);
  std::vector<float> g2 = g;
  for (float& v : g2) v *= 2.5f;
  const auto base = Run(1, {Causal(tokens, 0, g, false)});
  const auto scaled_base = Run(1, {Causal(tokens, 0, g2, false)});
  const auto with = Run(1, {Causal(tokens, 0, g, false)}, nbr);
  const auto scaled_with = Run(1, {Causal(tokens, 0, g2, false)}, nbr);
  EXPECT_LT(RelDiff(scaled_with[0].logits, with[0].logits), 1e-5);
  EXPECT_LT(RelDiff(scaled_with[0].hidden, with[0].hidden), 1e-5);
  EXPECT_GT(RelDiff(scaled_base[0].logits, base[0].logits), 1e-2);
  EXPECT_GT(RelDiff(with[0].logits, base[0].logits), 1e-2);
  // The same weights otherwise (values depend on seed and name only): 2 ranks agree too.
  const auto with_tp2 = Run(2, {Causal(tokens, 0, g, false)}, nbr);
  EXPECT_LT(RelDiff(with_tp2[0].logits, with[0].logits), 1e-5);
}

// norm_before_fc ≡ feeding input_norm(aux) to the plain draft; fc_norm ≡ feeding each aux slice
// through its own fc_norm.i; norm_output ≡ the plain draft's hidden_out through the final norm.
TEST_F(DraftModelTest, VariantKeysMatchHandComputations) {
  const auto tokens = Tokens(5, 7);
  const auto aux = RandomValues(5 * kAuxWidth, 9, 2.0f);
  const auto plain = Run(1, {Causal(tokens, 0, aux, true)});

  RandomDraftCheckpointOptions o = DraftOptions();
  o.norm_before_fc = true;
  const std::string nbf = WriteDraft(o);
  const auto normed_aux = RmsNormRows(aux, ReadF32(nbf, "input_norm.weight"));
  const auto nbf_out = Run(2, {Causal(tokens, 0, aux, true)}, nbf);
  const auto plain_on_normed = Run(1, {Causal(tokens, 0, normed_aux, true)});
  EXPECT_LT(RelDiff(nbf_out[0].logits, plain_on_normed[0].logits), 1e-5);
  EXPECT_LT(RelDiff(nbf_out[0].hidden, plain_on_normed[0].hidden), 1e-5);
  EXPECT_GT(RelDiff(nbf_out[0].logits, plain[0].logits), 1e-2);

  o = DraftOptions();
  o.fc_norm = true;
  const std::string fcn = WriteDraft(o);
  std::vector<float> slice_normed(aux.size());
  for (int k = 0; k < 3; ++k) {
    std::vector<float> slice;
    for (int64_t r = 0; r < 5; ++r) {
      const auto row = aux.begin() + r * kAuxWidth;
      slice.insert(slice.end(), row + k * kHidden, row + (k + 1) * kHidden);
    }
    const auto normed = RmsNormRows(slice, ReadF32(fcn, "fc_norm." + std::to_string(k) + ".weight"));
    for (int64_t r = 0; r < 5; ++r) {
      std::copy_n(normed.begin() + r * kHidden, kHidden, slice_normed.begin() + r * kAuxWidth + k * kHidden);
    }
  }
  const auto fcn_out = Run(2, {Causal(tokens, 0, aux, true)}, fcn);
  const auto plain_on_slices = Run(1, {Causal(tokens, 0, slice_normed, true)});
  EXPECT_LT(RelDiff(fcn_out[0].logits, plain_on_slices[0].logits), 1e-5);
  EXPECT_GT(RelDiff(fcn_out[0].logits, nbf_out[0].logits), 1e-2);

  o = DraftOptions();
  o.norm_output = true;
  const std::string nout = WriteDraft(o);
  const auto nout_out = Run(2, {Causal(tokens, 0, aux, true)}, nout);
  EXPECT_LT(RelDiff(nout_out[0].logits, plain[0].logits), 1e-5);
  EXPECT_LT(RelDiff(nout_out[0].hidden, RmsNormRows(plain[0].hidden, ReadF32(nout, "norm.weight"))), 1e-5);
}

// g = fc(aux) (+ fc.bias when the checkpoint has one): the aux path equals feeding that g directly.
TEST_F(DraftModelTest, FcWithBiasMatchesFeedingItsOutput) {
  const auto tokens = Tokens(3, 10);
  const auto aux = RandomValues(3 * kAuxWidth, 13);
  const std::vector<float> bias_values = RandomValues(kHidden, 14);
  const std::string biased = EditDraft(draft_dir_->path(), [&](std::map<std::string, Tensor>& t) {
    auto bias = Tensor::Empty(DType::kF32, Shape{kHidden});
    std::copy(bias_values.begin(), bias_values.end(), bias->data_as<float>());
    t.emplace("fc.bias", std::move(*bias));
  });
  const auto fc = ReadF32(draft_dir_->path(), "fc.weight");
  ASSERT_EQ(fc.size(), static_cast<size_t>(kHidden * kAuxWidth));
  std::vector<float> g(static_cast<size_t>(3 * kHidden));
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t o = 0; o < kHidden; ++o) {
      double sum = bias_values[static_cast<size_t>(o)];
      for (int64_t i = 0; i < kAuxWidth; ++i) {
        sum += static_cast<double>(aux[static_cast<size_t>(r * kAuxWidth + i)]) *
               fc[static_cast<size_t>(o * kAuxWidth + i)];
      }
      g[static_cast<size_t>(r * kHidden + o)] = static_cast<float>(sum);
    }
  }
  const auto via_aux = Run(2, {Causal(tokens, 0, aux, true)}, biased);
  const auto via_g = Run(1, {Causal(tokens, 0, g, false)});
  EXPECT_LT(RelDiff(via_aux[0].logits, via_g[0].logits), 1e-5);
  EXPECT_LT(RelDiff(via_aux[0].hidden, via_g[0].hidden), 1e-5);
}

TEST_F(DraftModelTest, LayersPrefixAndOwnEmbedding) {
  const auto tokens = Tokens(4, 8);
  const auto aux = RandomValues(4 * kAuxWidth, 10);
  const auto ref = Run(1, {Causal(tokens, 0, aux, true)});
  // vLLM's spelling of the layer (and no t2d, which is optional): the same weights, renamed.
  const std::string renamed = EditDraft(draft_dir_->path(), [](std::map<std::string, Tensor>& t) {
    std::map<std::string, Tensor> out;
    for (auto& [name, tensor] : t) {
      if (name == "t2d") continue;
      const bool mid = name.rfind("midlayer.", 0) == 0;
      out.emplace(mid ? "layers.0." + name.substr(9) : name, std::move(tensor));
    }
    t = std::move(out);
  });
  const auto layers = Run(2, {Causal(tokens, 0, aux, true)}, renamed);
  EXPECT_LT(RelDiff(layers[0].logits, ref[0].logits), 1e-5);
  // One layer under both prefixes is ambiguous.
  const std::string both = EditDraft(renamed, [](std::map<std::string, Tensor>& t) {
    t.emplace("midlayer.hidden_norm.weight", std::move(*Tensor::Zeros(DType::kBF16, Shape{kHidden})));
  });
  EXPECT_THAT(CreateStatus(both).message(), HasSubstr("both midlayer.* and layers.* tensors"));

  // The draft's own embedding: the same model with the target's embedding rows copied in matches.
  auto target = Checkpoint::Open(target_dir_->path());
  ASSERT_TRUE(target.ok());
  auto embed = (*target)->Read("model.embed_tokens.weight", DType::kBF16);
  ASSERT_TRUE(embed.ok());
  const std::string own = EditDraft(draft_dir_->path(), [&](std::map<std::string, Tensor>& t) {
    t.emplace("embed_tokens.weight", std::move(*embed));
  });
  const auto own_out = Run(8, {Causal(tokens, 0, aux, true)}, own);
  EXPECT_LT(RelDiff(own_out[0].logits, ref[0].logits), 1e-5);
}

// tiled_values: every tensor is its untiled first kRandomDraftTileValues values, repeated (the same
// seed and name give the same draws), and the checkpoint loads and runs.
TEST_F(DraftModelTest, TiledValuesRepeatTheFirstDraws) {
  RandomDraftCheckpointOptions options = DraftOptions();
  options.dtype = DType::kF32;
  options.intermediate_size = 2048;  // MLP weights of 131072 values: twice the tile
  const std::string full_dir = WriteDraft(options);
  options.tiled_values = true;
  const std::string tiled_dir = WriteDraft(options);
  auto full = Checkpoint::Open(full_dir);
  auto tiled = Checkpoint::Open(tiled_dir);
  ASSERT_TRUE(full.ok() && tiled.ok());
  int64_t checked = 0;
  for (const std::string name :
       {"midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight"}) {
    auto a = (*full)->Read(name, DType::kF32);
    auto b = (*tiled)->Read(name, DType::kF32);
    ASSERT_TRUE(a.ok() && b.ok()) << name;
    ASSERT_GT(a->numel(), kRandomDraftTileValues) << name << ": too small to show the tiling";
    const float* x = a->data_as<const float>();
    const float* y = b->data_as<const float>();
    for (int64_t i = 0; i < b->numel(); ++i) {
      ASSERT_EQ(y[i], x[i % kRandomDraftTileValues]) << name << " [" << i << "]";
    }
    EXPECT_NE(x[kRandomDraftTileValues], x[0]) << name << ": the untiled tensor does not repeat";
    ++checked;
  }
  EXPECT_EQ(checked, 3);
  // A tensor within one tile is drawn whole either way.
  auto fc_full = (*full)->Read("fc.weight", DType::kF32);
  auto fc_tiled = (*tiled)->Read("fc.weight", DType::kF32);
  ASSERT_TRUE(fc_full.ok() && fc_tiled.ok());
  ASSERT_LE(fc_full->numel(), kRandomDraftTileValues);
  EXPECT_TRUE(std::equal(fc_full->data_as<const float>(), fc_full->data_as<const float>() + fc_full->numel(),
                         fc_tiled->data_as<const float>()));
  cpu::CpuBackend backend;
  EXPECT_TRUE(DraftModel::Create(tiled_dir, target_dir_->path(), Options(1), nullptr, &backend).ok());
}

TEST_F(DraftModelTest, LoadsTheVocabularyMapping) {
  cpu::CpuBackend backend;
  auto model = DraftModel::Create(draft_dir_->path(), target_dir_->path(), Options(1), nullptr, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->draft_vocab(), kDraftVocab);
  ASSERT_EQ((*model)->d2t().size(), static_cast<size_t>(kDraftVocab));
  int64_t previous = -1;
  for (int64_t i = 0; i < kDraftVocab; ++i) {
    const int64_t target_id = i + (*model)->d2t()[static_cast<size_t>(i)];
    EXPECT_GT(target_id, previous);  // the generator's subset is sorted
    EXPECT_LT(target_id, kVocab);
    previous = target_id;
  }
  EXPECT_EQ((*model)->tap().boundaries(), (std::vector<int>{1, 2, 3}));
}

TEST_F(DraftModelTest, BadCheckpointsAreRefusedWithTheReason) {
  const std::string base = draft_dir_->path();
  auto i64_edit = [](const std::string& name, int64_t index, int64_t value) {
    return [=](std::map<std::string, Tensor>& t) { t.at(name).data_as<int64_t>()[index] = value; };
  };
  absl::Status st = CreateStatus(EditDraft(base, i64_edit("d2t", 5, kVocab)));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("d2t[5] = 1000"), HasSubstr("outside the target vocabulary [0, 1000)"),
                                  HasSubstr("offsets")));

  st = CreateStatus(EditDraft(base, [](std::map<std::string, Tensor>& t) {
    int64_t* d = t.at("d2t").data_as<int64_t>();
    d[1] = d[0] - 1;  // draft id 1 -> the target id of draft id 0
  }));
  EXPECT_THAT(st.message(), HasSubstr("maps draft ids 0 and 1 both to target id"));

  st = CreateStatus(EditDraft(base, [](std::map<std::string, Tensor>& t) {
    uint8_t* m = t.at("t2d").data_as<uint8_t>();
    for (int64_t x = 0; x < kVocab; ++x) {
      if (m[x] == 0) {
        m[x] = 1;
        break;
      }
    }
  }));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("'t2d' and 'd2t'"), HasSubstr("is true but no draft id maps")));

  st = CreateStatus(EditDraft(base, [](std::map<std::string, Tensor>& t) { t.erase("d2t"); }));
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("no tensor 'd2t'"));

  // Two aux layer ids, but fc was trained on three.
  st = CreateStatus(EditDraft(base, nullptr, [](nlohmann::json& j) {
    j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {0, 2};
  }));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("'fc.weight'"), HasSubstr("input width 192"),
                                  HasSubstr("number of aux layers (2) x the target hidden size (64) = 128")));

  st = CreateStatus(EditDraft(base, nullptr, [](nlohmann::json& j) { j["vocab_size"] = 1024; }));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("vocab_size = 1024"), HasSubstr("target vocab_size = 1000")));

  st = CreateStatus(EditDraft(base, nullptr, [](nlohmann::json& j) { j["target_hidden_size"] = 96; }));
  EXPECT_THAT(st.message(), AllOf(HasSubstr("target_hidden_size = 96"), HasSubstr("hidden_size = 64")));

  RandomDraftCheckpointOptions narrow = DraftOptions();
  narrow.hidden_size = 48;
  narrow.num_attention_heads = 4;
  narrow.num_key_value_heads = 4;
  st = CreateStatus(WriteDraft(narrow));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("hidden_size = 48"), HasSubstr("cannot share the target's embedding")));

  st = CreateStatus(EditDraft(base, [](std::map<std::string, Tensor>& t) {
    auto wrong = Tensor::Zeros(DType::kBF16, Shape{128, 64});
    t.at("midlayer.self_attn.k_proj.weight") = std::move(*wrong);
  }));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("midlayer.self_attn.k_proj.weight"), HasSubstr("[128, 64]"),
                                  HasSubstr("expected [128, 128]")));

  st = CreateStatus(EditDraft(base, [](std::map<std::string, Tensor>& t) { t.erase("midlayer.hidden_norm.weight"); }));
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("midlayer.hidden_norm.weight"), HasSubstr("[64]")));

  // A norm the config does not enable is a lost config key, not something to skip.
  st = CreateStatus(EditDraft(base, [](std::map<std::string, Tensor>& t) {
    t.emplace("input_norm.weight", std::move(*Tensor::Zeros(DType::kBF16, Shape{kAuxWidth})));
  }));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("input_norm.weight"), HasSubstr("norm_before_fc")));

  st = CreateStatus(EditDraft(base, nullptr, [](nlohmann::json& j) {
    j["norm_before_fc"] = true;
    j["fc_norm"] = true;
  }));
  EXPECT_THAT(st.message(), HasSubstr("norm_before_fc and fc_norm are both true"));

  RandomDraftCheckpointOptions few_kv = DraftOptions();
  few_kv.num_key_value_heads = 2;
  const std::string few = WriteDraft(few_kv);
  EXPECT_TRUE(CreateStatus(few, 2).ok());
  st = CreateStatus(few, 4);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("num_key_value_heads = 2"), HasSubstr("not divisible by tp_size 4")));

  // An aux layer id beyond the 3-layer target, in the output-of-layer convention.
  st = CreateStatus(EditDraft(base, nullptr, [](nlohmann::json& j) {
    j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {0, 1, 3};
  }));
  EXPECT_THAT(st.message(), AllOf(HasSubstr("[2] = 3"), HasSubstr("output-of-layer")));
}

// The CPU reference refuses bf16 weights at Create (naming the option and the dtype); a dtype
// that is neither f32 nor bf16 is InvalidArgument naming the option.
TEST_F(DraftModelTest, WeightDtypeIsCheckedAtCreate) {
  cpu::CpuBackend backend;
  DraftModelOptions o = Options(1);
  o.weight_dtype = DType::kBF16;
  auto bf16 = DraftModel::Create(draft_dir_->path(), target_dir_->path(), o, nullptr, &backend);
  ASSERT_FALSE(bf16.ok());
  EXPECT_EQ(bf16.status().code(), absl::StatusCode::kInvalidArgument) << bf16.status();
  EXPECT_THAT(std::string(bf16.status().message()), HasSubstr("DraftModel: weight_dtype bf16"));
  EXPECT_THAT(std::string(bf16.status().message()), HasSubstr("CpuBackend takes f32 only"));
  o.weight_dtype = DType::kI32;
  auto i32 = DraftModel::Create(draft_dir_->path(), target_dir_->path(), o, nullptr, &backend);
  ASSERT_FALSE(i32.ok());
  EXPECT_EQ(i32.status().code(), absl::StatusCode::kInvalidArgument) << i32.status();
  EXPECT_THAT(std::string(i32.status().message()), HasSubstr("DraftModel: weight_dtype is i32"));
  o.weight_dtype = DType::kF32;
  EXPECT_TRUE(DraftModel::Create(draft_dir_->path(), target_dir_->path(), o, nullptr, &backend).ok());
}

TEST_F(DraftModelTest, BadInputsAreRefusedAndLeaveTheCacheUnchanged) {
  cpu::CpuBackend backend;
  auto model = DraftModel::Create(draft_dir_->path(), target_dir_->path(), Options(1), nullptr, &backend);
  ASSERT_TRUE(model.ok()) << model.status();
  DraftModel& m = **model;
  const int c = 5;
  const auto context = Tokens(c, 9);
  auto aux = RandomValues(c * kAuxWidth, 11);
  std::vector<float> logits(static_cast<size_t>(c * kDraftVocab)), hidden(static_cast<size_t>(c * kHidden));
  DraftSequenceInput in;
  in.tokens = context;
  in.page_table = pages0_;
  in.all_logits = true;
  auto forward = [&](const DraftSequenceInput& seq, std::vector<float>& input, bool from_target, int64_t width) {
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    const int64_t rows = DraftModel::LogitRows(std::span<const DraftSequenceInput>(&seq, 1));
    logits.assign(static_cast<size_t>(rows * kDraftVocab), 0.0f);
    hidden.assign(static_cast<size_t>(n * kHidden), 0.0f);
    return m.Forward(std::span<const DraftSequenceInput>(&seq, 1),
                     TensorView(input.data(), DType::kF32, Shape{n, width}), from_target,
                     TensorView(logits.data(), DType::kF32, Shape{rows, kDraftVocab}),
                     TensorView(hidden.data(), DType::kF32, Shape{n, kHidden}));
  };
  ASSERT_TRUE(forward(in, aux, true, kAuxWidth).ok());

  // The step after the context, to compare before and after the refused calls.
  const std::vector<int64_t> next = {77, 78};
  auto step_hidden = RandomValues(2 * kHidden, 12);
  DraftSequenceInput step;
  step.tokens = next;
  step.page_table = pages0_;
  step.cache_len = c;
  step.all_logits = true;
  ASSERT_TRUE(forward(step, step_hidden, false, kHidden).ok());
  const std::vector<float> want_logits = logits, want_hidden = hidden;

  // Each refused call would, if it wrote anything, overwrite context rows 0 and 1.
  DraftSequenceInput clobber = step;
  clobber.cache_len = 0;
  DraftSequenceInput bad = clobber;
  const std::vector<int64_t> big = {77, kVocab};
  bad.tokens = big;
  absl::Status st = forward(bad, step_hidden, false, kHidden);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("token 1 = 1000"), HasSubstr("outside the target vocabulary [0, 1000)")));

  bad = clobber;
  const std::vector<uint8_t> short_mask(5, 1);
  bad.mask = short_mask;
  st = forward(bad, step_hidden, false, kHidden);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("mask has 5 entries"), HasSubstr("2 x 2")));
  std::vector<uint8_t> mask(4, 1);  // [2, 0 + 2]: row 0 also attends row 1's slot 1
  bad.mask = mask;
  st = forward(bad, step_hidden, false, kHidden);
  EXPECT_THAT(st.message(), HasSubstr("mask row 0 attends slot 1, a later new row"));
  mask[0] = 0;
  mask[1] = 0;
  bad.mask = mask;
  st = forward(bad, step_hidden, false, kHidden);
  EXPECT_THAT(st.message(), HasSubstr("mask row 0 does not attend its own slot 0"));

  bad = clobber;
  const std::vector<int64_t> far = {63, 64};
  bad.positions = far;
  st = forward(bad, step_hidden, false, kHidden);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("position 1 = 64"), HasSubstr("max_context_len 64")));

  bad = step;
  const std::vector<int32_t> few_pages = {3};
  bad.page_table = few_pages;
  st = forward(bad, step_hidden, false, kHidden);
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("capacity exhausted"), HasSubstr("need 7 slots")));

  bad = clobber;
  std::vector<int32_t> wild_pages = pages0_;
  wild_pages[1] = 32;
  bad.page_table = wild_pages;
  st = forward(bad, step_hidden, false, kHidden);
  EXPECT_THAT(st.message(), HasSubstr("page_table[1] = 32"));

  // Fed-back rows are [T, hidden_size]; aux rows are [T, 3 x 64].
  st = forward(clobber, step_hidden, true, kHidden);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), AllOf(HasSubstr("hidden must be f32[2, 192]"), HasSubstr("boundaries")));

  ASSERT_TRUE(forward(step, step_hidden, false, kHidden).ok());
  EXPECT_EQ(logits, want_logits);
  EXPECT_EQ(hidden, want_hidden);
}

}  // namespace
}  // namespace eagle3
