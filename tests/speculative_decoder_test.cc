// The decode loop's central invariant: speculative greedy output ≡ plain greedy output, token for
// token, for a batch of prompts of different lengths, chain and tree, on every golden target. The
// drafter here is an oracle that knows the plain continuation (so drafts are long and mostly right)
// and, with `noise`, proposes wrong tokens too (so rejection paths are exercised).
#include "eagle3/speculative_decoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"
#include "speculative_greedy_check.h"

namespace eagle3 {
namespace {

// Proposes the reference continuation with high probability; other tokens get random logits.
class OracleDrafter final : public Drafter {
 public:
  OracleDrafter(int64_t vocab, std::vector<std::vector<int64_t>> reference, bool noise)
      : vocab_(vocab), reference_(std::move(reference)), noise_(noise), rng_(17) {}

  int64_t draft_vocab() const override { return vocab_; }
  std::span<const int64_t> d2t() const override { return {}; }
  const HiddenStateTap* tap() const override { return nullptr; }
  absl::Status Reset(int seq) override {
    root_position_[seq] = -1;
    return absl::OkStatus();
  }
  absl::Status Extend(int seq, int64_t first_position, std::span<const int64_t> tokens, const TensorView& aux,
                      const TensorView& root_logits) override {
    EXPECT_EQ(aux.numel(), 0);
    root_position_[seq] = first_position + static_cast<int64_t>(tokens.size());
    Fill(seq, root_position_[seq] + 1, /*on_path=*/true, root_logits.data_as<float>());
    return absl::OkStatus();
  }
  absl::Status Expand(int seq, std::span<const DraftCandidate> candidates, std::span<const int32_t> frontier,
                      const TensorView& logits) override {
    const auto& ref = reference_[static_cast<size_t>(seq)];
    for (size_t i = 0; i < frontier.size(); ++i) {
      // On the reference path iff every node from the root down matches it.
      const DraftCandidate& c = candidates[static_cast<size_t>(frontier[i])];
      bool on_path = true;
      for (int32_t n = frontier[i]; n > 0; n = candidates[static_cast<size_t>(n)].parent) {
        const int64_t pos = root_position_[seq] + candidates[static_cast<size_t>(n)].depth;
        on_path = on_path && pos < static_cast<int64_t>(ref.size()) && ref[pos] == candidates[static_cast<size_t>(n)].token;
      }
      Fill(seq, root_position_[seq] + c.depth + 1, on_path, logits.data_as<float>() + i * vocab_);
    }
    return absl::OkStatus();
  }

 private:
  void Fill(int seq, int64_t position, bool on_path, float* row) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t v = 0; v < vocab_; ++v) row[v] = dist(rng_);
    const auto& ref = reference_[static_cast<size_t>(seq)];
    // With noise, one proposal in three is steered to a wrong token.
    const bool steer_wrong = noise_ && std::uniform_int_distribution<int>(0, 2)(rng_) == 0;
    if (on_path && position < static_cast<int64_t>(ref.size())) {
      const int64_t target = steer_wrong ? (ref[position] + 1) % vocab_ : ref[position];
      row[target] = 20.0f;
    }
  }

  int64_t vocab_;
  std::vector<std::vector<int64_t>> reference_;
  bool noise_;
  std::mt19937 rng_;
  std::map<int, int64_t> root_position_;
};

class SpeculativeGreedyTest : public ::testing::TestWithParam<const char*> {};

TEST_P(SpeculativeGreedyTest, MatchesPlainGreedyTokenForToken) {
  const std::string dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + GetParam();
  cpu::CpuBackend backend;
  TargetModelOptions topt;
  topt.max_tokens_per_forward = 64;
  topt.max_context_len = 96;
  topt.num_kv_pages = 96;
  topt.page_size = 3;
  auto target = TargetModel::Create(dir, topt, nullptr, &backend);
  ASSERT_TRUE(target.ok()) << target.status();
  const int64_t vocab = (*target)->config().vocab_size;
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 99, 3, 42, 8, 1}, {7, 7, 300 % vocab}, {11, 23}};

  DecodeOptions options;
  options.max_new_tokens = 20;
  SpeculativeDecoder plain(target->get(), nullptr, options);
  DecodeStats plain_stats;
  auto reference = plain.Generate(prompts, &plain_stats);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(plain_stats.generated_tokens, 60);

  std::vector<std::vector<int64_t>> full;
  for (size_t b = 0; b < prompts.size(); ++b) {
    full.push_back(prompts[b]);
    full.back().insert(full.back().end(), (*reference)[b].begin(), (*reference)[b].end());
  }
  struct Case {
    const char* name;
    DraftTreeParams tree;
    bool noise;
  };
  const std::vector<Case> shapes = {{"chain", {1, 4, 5}, false},
                                     {"chain with wrong drafts", {1, 4, 5}, true},
                                     {"tree", {3, 3, 8}, false},
                                     {"tree with wrong drafts", {3, 3, 8}, true},
                                     {"wide tree", {4, 4, 16}, true}};
  for (const Case& shape : shapes) {
    OracleDrafter drafter(vocab, full, shape.noise);
    DecodeOptions spec_options = options;
    spec_options.tree = shape.tree;
    SpeculativeDecoder spec(target->get(), &drafter, spec_options);
    DecodeStats stats;
    auto got = spec.Generate(prompts, &stats);
    ASSERT_TRUE(got.ok()) << shape.name << ": " << got.status();
    EXPECT_EQ(*got, *reference) << shape.name;
    EXPECT_EQ(stats.generated_tokens, 60) << shape.name;
    // The oracle's drafts are mostly accepted: far fewer target passes than tokens.
    EXPECT_GT(stats.mean_accepted_length, shape.noise ? 1.5 : 3.0) << shape.name;
    EXPECT_LT(stats.target_passes, plain_stats.target_passes) << shape.name;
    ASSERT_EQ(stats.acceptance_by_depth.size(), static_cast<size_t>(shape.tree.num_steps));
  }
}

INSTANTIATE_TEST_SUITE_P(GoldenTargets, SpeculativeGreedyTest,
                         ::testing::Values("v2_qlora_yarn", "v2lite_greedy", "v3_noaux", "v3_fp8", "k25_int4"),
                         [](const auto& info) { return std::string(info.param); });

// A real EAGLE-3 draft with random weights (written for each golden target) through Eagle3Drafter:
// its trees are mostly rejected, which exercises the rejection and bonus paths and the draft KV
// bookkeeping, for a batch of prompts of different lengths, chain and tree.
// kv_cache_dtype: the target's cache dtype (f32 unset).
void ExpectRandomDraftBatchMatchesPlainGreedy(const std::string& golden, std::optional<DType> kv_cache_dtype) {
  const std::string target_dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + golden;
  auto config = DeepseekV2Config::FromFile(target_dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ScopedTempDir draft_dir;
  RandomDraftCheckpointOptions draft_options;
  draft_options.seed = 3;
  draft_options.num_attention_heads = 8;
  draft_options.num_key_value_heads = 4;
  draft_options.aux_layer_ids = {0, 1, 2};
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, draft_dir.path(), draft_options).ok());
  cpu::CpuBackend backend;
  TargetModelOptions topt;
  topt.max_tokens_per_forward = 64;
  topt.max_context_len = 96;
  topt.num_kv_pages = 96;
  topt.page_size = 3;
  topt.kv_cache_dtype = kv_cache_dtype;
  auto target = TargetModel::Create(target_dir, topt, nullptr, &backend);
  ASSERT_TRUE(target.ok()) << target.status();
  DraftModelOptions dopt;
  dopt.max_tokens_per_forward = 64;
  dopt.max_context_len = 96;
  dopt.num_kv_pages = 96;
  dopt.page_size = 5;
  auto draft = DraftModel::Create(draft_dir.path(), target_dir, dopt, nullptr, &backend);
  ASSERT_TRUE(draft.ok()) << draft.status();
  SpeculativeGreedyRuns runs;
  ExpectSpeculativeGreedyEqualsPlain(target->get(), draft->get(), &backend, &runs);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  ASSERT_EQ(runs.stats.size(), 2u);
  for (const DecodeStats& stats : runs.stats) {
    EXPECT_EQ(stats.generated_tokens, 48);
    EXPECT_GE(stats.mean_accepted_length, 1.0);
  }
}

TEST_P(SpeculativeGreedyTest, RandomDraftBatchMatchesPlainGreedy) {
  ExpectRandomDraftBatchMatchesPlainGreedy(GetParam(), std::nullopt);
}

// The same with the target's latent cache in bf16: verification writes a tree's rows and the
// commit moves the accepted ones bit for bit, so the rounded rows a verified token leaves are the
// ones plain decoding writes for it.
TEST_P(SpeculativeGreedyTest, RandomDraftBatchMatchesPlainGreedyWithABf16Cache) {
  ExpectRandomDraftBatchMatchesPlainGreedy(GetParam(), DType::kBF16);
}

// Same seed, same tokens; another seed, (almost surely) other tokens. Sampling at temperature 1.
// The near-tie allowance of the greedy check: a difference from plain greedy at a token whose logit
// is far from the chosen one fails at any tolerance below the gap (and at 0, equality), and passes
// once the tolerance covers it.
TEST(SpeculativeDecoderTest, NearTieAllowanceRejectsADifferenceThatIsNotATie) {
  const std::string dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2lite_greedy";
  cpu::CpuBackend backend;
  TargetModelOptions topt;
  topt.max_tokens_per_forward = 8;  // the re-run prefix spans several chunks
  topt.max_context_len = 64;
  topt.num_kv_pages = 64;
  topt.page_size = 3;
  auto target = TargetModel::Create(dir, topt, nullptr, &backend);
  ASSERT_TRUE(target.ok()) << target.status();
  const std::vector<std::vector<int64_t>> prompts = SpeculativeGreedyPrompts((*target)->config().vocab_size);
  SpeculativeDecoder plain(target->get(), nullptr, SpeculativeGreedyOptions());
  auto reference = plain.Generate(prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  constexpr size_t kAt = 5;
  // The token with the lowest logit after the prefix: as far from a tie as the logits allow.
  const std::vector<float> logits = LogitsAfter(target->get(), prompts[0], (*reference)[0], kAt);
  ASSERT_EQ(logits.size(), static_cast<size_t>((*target)->config().vocab_size));
  const size_t lowest = static_cast<size_t>(std::min_element(logits.begin(), logits.end()) - logits.begin());
  ASSERT_EQ(static_cast<int64_t>(static_cast<size_t>(std::max_element(logits.begin(), logits.end()) - logits.begin())),
            (*reference)[0][kAt])
      << "the re-run prefix's argmax is plain greedy's token";
  float largest = 0.0f;
  for (const float v : logits) largest = std::max(largest, std::fabs(v));
  const double gap = (logits[static_cast<size_t>((*reference)[0][kAt])] - logits[lowest]) / largest;
  std::vector<std::vector<int64_t>> got = *reference;
  got[0][kAt] = static_cast<int64_t>(lowest);
  EXPECT_NONFATAL_FAILURE(ExpectGreedyEqualUpToNearTies(target->get(), prompts, got, *reference, 0.5 * gap, "t"),
                          "not a near-tie");
  EXPECT_NONFATAL_FAILURE(ExpectGreedyEqualUpToNearTies(target->get(), prompts, got, *reference, 0.0, "t"), "t");
  ExpectGreedyEqualUpToNearTies(target->get(), prompts, got, *reference, 1.01 * gap, "t");
  // Tokens after the first difference are not compared: the two runs have left each other.
  got[0][kAt + 1] = static_cast<int64_t>(lowest);
  ExpectGreedyEqualUpToNearTies(target->get(), prompts, got, *reference, 1.01 * gap, "t");
}

TEST(SpeculativeDecoderTest, SamplingIsReproducibleFromTheSeed) {
  const std::string dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2lite_greedy";
  cpu::CpuBackend backend;
  TargetModelOptions topt;
  topt.max_context_len = 64;
  topt.num_kv_pages = 16;
  topt.page_size = 8;
  auto target = TargetModel::Create(dir, topt, nullptr, &backend);
  ASSERT_TRUE(target.ok()) << target.status();
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}};
  std::vector<std::vector<int64_t>> full = {{1, 2, 3}};
  auto run = [&](uint64_t seed, bool speculative) {
    DecodeOptions options;
    options.max_new_tokens = 24;
    options.sampling.temperature = 1.0f;
    options.seed = seed;
    options.tree = {2, 3, 6};
    OracleDrafter drafter((*target)->config().vocab_size, full, true);
    SpeculativeDecoder decoder(target->get(), speculative ? &drafter : nullptr, options);
    auto out = decoder.Generate(prompts);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? (*out)[0] : std::vector<int64_t>();
  };
  EXPECT_EQ(run(7, false), run(7, false));
  EXPECT_NE(run(7, false), run(8, false));
  EXPECT_EQ(run(7, true), run(7, true));
}

TEST(SpeculativeDecoderTest, RefusesWhatDoesNotFit) {
  const std::string dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2lite_greedy";
  cpu::CpuBackend backend;
  TargetModelOptions topt;
  topt.max_context_len = 16;
  topt.num_kv_pages = 4;
  topt.page_size = 4;
  auto target = TargetModel::Create(dir, topt, nullptr, &backend);
  ASSERT_TRUE(target.ok()) << target.status();
  DecodeOptions options;
  options.max_new_tokens = 20;
  SpeculativeDecoder plain(target->get(), nullptr, options);
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}};
  auto out = plain.Generate(prompts);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(out.status().message()).find("need 24 KV slots"), std::string::npos) << out.status();

  OracleDrafter drafter((*target)->config().vocab_size, {{1, 2, 3}}, false);
  options.max_new_tokens = 4;
  options.tree = {8, 2, 4};
  options.tree.topk = static_cast<int>((*target)->config().vocab_size) + 1;  // topk > draft vocab
  SpeculativeDecoder spec(target->get(), &drafter, options);
  out = spec.Generate(prompts);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument) << out.status();
}

}  // namespace
}  // namespace eagle3
