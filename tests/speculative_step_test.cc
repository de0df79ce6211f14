// SpeculativeStep on the CPU reference backend: the same code path the CUDA backend runs. Greedy
// speculation through the step equals plain decoding (speculative_decoder_test.cc checks that for
// every golden target); here: the step against the host reference loop step by step, sampling,
// sequences leaving the batch, and the refusals of bad inputs before anything is written.
#include "eagle3/speculative_step.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/safetensors.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/speculative_decoder.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "eagle3/tools/tokenizer.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"
#include "speculative_step_testing.h"
#include "synthetic_acceptance.h"

namespace eagle3 {
namespace {

const std::string kGolden = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/";

// A target and its draft on `backend`, both with room for `tokens` rows per forward and `pages` pages
// of `page_size` (contexts up to `context`).
struct Pair {
  std::unique_ptr<TargetModel> target;
  std::unique_ptr<DraftModel> draft;
};
absl::StatusOr<Pair> LoadPair(const std::string& target_dir, const std::string& draft_dir, int64_t tokens,
                              int64_t context, int64_t pages, int64_t target_page_size, int64_t draft_page_size,
                              Backend* backend) {
  TargetModelOptions topt;
  topt.max_tokens_per_forward = tokens;
  topt.max_context_len = context;
  topt.num_kv_pages = pages;
  topt.page_size = target_page_size;
  DraftModelOptions dopt;
  dopt.max_tokens_per_forward = tokens;
  dopt.max_context_len = context;
  dopt.num_kv_pages = pages;
  dopt.page_size = draft_page_size;
  Pair pair;
  EAGLE3_ASSIGN_OR_RETURN(pair.target, TargetModel::Create(target_dir, topt, nullptr, backend));
  EAGLE3_ASSIGN_OR_RETURN(pair.draft, DraftModel::Create(draft_dir, target_dir, dopt, nullptr, backend));
  return pair;
}

// The shipped trained pair on `backend` (64 rows per forward, page size 8).
absl::StatusOr<Pair> LoadTrainedPair(Backend* backend, int64_t context, int64_t pages) {
  const std::string models = std::string(EAGLE3_TEST_DATA_DIR) + "/../../models/";
  return LoadPair(models + "tiny-v2-code", models + "tiny-v2-code-eagle3", 64, context, pages, 8, 8, backend);
}

// `texts` through the trained pair's tokenizer.
absl::StatusOr<std::vector<std::vector<int64_t>>> EncodeForTrainedPair(std::initializer_list<const char*> texts) {
  const std::string models = std::string(EAGLE3_TEST_DATA_DIR) + "/../../models/";
  EAGLE3_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::FromFile(models + "tiny-v2-code/tokenizer.json"));
  std::vector<std::vector<int64_t>> out;
  for (const char* text : texts) {
    EAGLE3_ASSIGN_OR_RETURN(std::vector<int64_t> ids, tokenizer.Encode(text));
    out.push_back(std::move(ids));
  }
  return out;
}

// Pages first, first + 1, ..., first + count - 1.
std::vector<int32_t> Pages(int first, int count) {
  std::vector<int32_t> pages(static_cast<size_t>(count));
  std::iota(pages.begin(), pages.end(), first);
  return pages;
}

class SpeculativeStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string target_dir = kGolden + "v2lite_greedy";
    auto config = DeepseekV2Config::FromFile(target_dir);
    ASSERT_TRUE(config.ok()) << config.status();
    RandomDraftCheckpointOptions draft_options;
    draft_options.seed = 5;
    draft_options.num_attention_heads = 8;
    draft_options.num_key_value_heads = 4;
    draft_options.aux_layer_ids = {0, 1, 2};
    ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, draft_dir_.path(), draft_options).ok());
    auto pair = LoadPair(target_dir, draft_dir_.path(), 64, 96, 96, 4, 3, &backend_);
    ASSERT_TRUE(pair.ok()) << pair.status();
    target_ = std::move(pair->target);
    draft_ = std::move(pair->draft);
  }

  cpu::CpuBackend backend_;
  ScopedTempDir draft_dir_;
  std::unique_ptr<TargetModel> target_;
  std::unique_ptr<DraftModel> draft_;
};

// Sampling through the device step draws the host reference loop's coins (the same Philox streams
// per sequence and step) over the same logits: the same tokens, for a batch whose sequences finish
// at different steps (so the step's root state is re-gathered as rows leave).
TEST_F(SpeculativeStepTest, SamplingMatchesTheHostReferenceLoop) {
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 99, 3, 42, 8, 1}, {7, 7, 30}, {11, 23}};
  for (const DraftTreeParams& tree : {DraftTreeParams{1, 3, 4}, DraftTreeParams{3, 3, 7}}) {
    DecodeOptions options;
    options.max_new_tokens = 12;
    options.tree = tree;
    options.sampling.temperature = 0.8f;
    options.sampling.top_p = 0.9f;
    options.seed = 11;
    options.eos_token_ids = {3};
    SpeculativeDecoder device(target_.get(), draft_.get(), &backend_, options);
    DecodeStats stats;
    auto got = device.Generate(prompts, &stats);
    ASSERT_TRUE(got.ok()) << got.status();
    Eagle3Drafter drafter(draft_.get(), static_cast<int>(prompts.size()));
    SpeculativeDecoder host(target_.get(), &drafter, options);
    auto want = host.Generate(prompts);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(*got, *want) << "topk " << tree.topk;
    EXPECT_EQ(stats.host_syncs, stats.device_steps);
  }
}

// One decoder, several Generate calls: the device step is kept (its buffers and graphs reused) and
// reseeded, so a repeated call samples exactly what a fresh decoder samples; a larger batch
// replaces the step, a smaller one reuses it.
TEST_F(SpeculativeStepTest, ReusedStepSamplesLikeAFreshOne) {
  const std::vector<std::vector<int64_t>> two = {{5, 17, 99, 3}, {7, 7, 30}};
  const std::vector<std::vector<int64_t>> three = {{5, 17, 99, 3}, {7, 7, 30}, {11, 23}};
  DecodeOptions options;
  options.max_new_tokens = 10;
  options.tree = {2, 3, 6};
  options.sampling.temperature = 0.9f;
  options.seed = 21;
  auto fresh = [&](std::span<const std::vector<int64_t>> prompts) {
    SpeculativeDecoder decoder(target_.get(), draft_.get(), &backend_, options);
    auto out = decoder.Generate(prompts);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<std::vector<int64_t>>();
  };
  SpeculativeDecoder reused(target_.get(), draft_.get(), &backend_, options);
  for (const auto* prompts : {&two, &two, &three, &two}) {
    auto got = reused.Generate(*prompts);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, fresh(*prompts)) << prompts->size() << " prompts";
  }
}

// What Run refuses, before anything is enqueued: the step's state (and the caches) are untouched, so
// the same step then runs as if the bad call had not happened.
TEST_F(SpeculativeStepTest, RefusesBadInputsBeforeWriting) {
  SpeculativeStepOptions options;
  options.max_batch = 2;
  options.trees = {{2, 3, 6}};
  auto created = SpeculativeStep::Create(target_.get(), draft_.get(), &backend_, options);
  ASSERT_TRUE(created.ok()) << created.status();
  SpeculativeStep& step = **created;
  const std::vector<int64_t> prompt = {5, 17, 99, 3};
  const std::vector<int32_t> tpages = Pages(0, 24), dpages = Pages(0, 32);
  auto first = step.Prefill(0, prompt, tpages, dpages);
  ASSERT_TRUE(first.ok()) << first.status();

  StepSequence seq;
  seq.row = 0;
  seq.root = *first;
  seq.cache_len = static_cast<int64_t>(prompt.size());
  seq.target_pages = tpages;
  seq.draft_pages = dpages;
  std::vector<StepOutput> out;
  auto expect_refused = [&](const StepSequence& bad, absl::StatusCode code, const std::string& text) {
    const absl::Status status = step.Run(std::span<const StepSequence>(&bad, 1), &out);
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_NE(std::string(status.message()).find(text), std::string::npos) << status;
  };
  StepSequence bad = seq;
  const std::vector<int32_t> short_draft = Pages(0, 3);  // 9 slots: fewer than cache_len + 6
  bad.draft_pages = short_draft;
  expect_refused(bad, absl::StatusCode::kOutOfRange, "draft KV slots");
  bad = seq;
  const std::vector<int32_t> short_target = Pages(0, 2);  // 8 slots: fewer than cache_len + 6
  bad.target_pages = short_target;
  expect_refused(bad, absl::StatusCode::kOutOfRange, "KV capacity exhausted");
  bad = seq;
  bad.root = target_->config().vocab_size;
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "root token");
  bad = seq;
  bad.row = 2;
  expect_refused(bad, absl::StatusCode::kInvalidArgument, "row 2");
  const std::vector<StepSequence> three = {seq, seq, seq};
  const absl::Status over = step.Run(three, &out);
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument) << over;
  const std::vector<StepSequence> same_row = {seq, seq};
  EXPECT_EQ(step.Run(same_row, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(step.counters().steps, 0);

  // A tree larger than the models' workspaces is refused at Create.
  SpeculativeStepOptions big = options;
  big.max_batch = 8;
  big.trees = {{4, 3, 12}};  // 8 x 12 target rows > 64
  auto refused = SpeculativeStep::Create(target_.get(), draft_.get(), &backend_, big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(std::string(refused.status().message()).find("max_tokens_per_forward"), std::string::npos);

  // After the refusals, the step continues exactly like a fresh one that never saw them.
  ASSERT_TRUE(step.Run(std::span<const StepSequence>(&seq, 1), &out).ok());
  auto fresh = SpeculativeStep::Create(target_.get(), draft_.get(), &backend_, options);
  ASSERT_TRUE(fresh.ok());
  auto fresh_first = (*fresh)->Prefill(0, prompt, tpages, dpages);
  ASSERT_TRUE(fresh_first.ok());
  EXPECT_EQ(*fresh_first, *first);
  std::vector<StepOutput> fresh_out;
  ASSERT_TRUE((*fresh)->Run(std::span<const StepSequence>(&seq, 1), &fresh_out).ok());
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(fresh_out.size(), 1u);
  EXPECT_EQ(out[0].tokens, fresh_out[0].tokens);
  EXPECT_EQ(step.counters().steps, 1);
  EXPECT_EQ(step.counters().host_syncs, 1);
}

// Prefill's refusals: a row outside max_batch, an empty prompt, a token outside the vocabulary.
TEST_F(SpeculativeStepTest, PrefillRefusesBadRowsAndPrompts) {
  SpeculativeStepOptions options;
  options.max_batch = 1;
  auto created = SpeculativeStep::Create(target_.get(), draft_.get(), &backend_, options);
  ASSERT_TRUE(created.ok()) << created.status();
  const std::vector<int32_t> pages = Pages(0, 24);
  const std::vector<int64_t> prompt = {1, 2};
  EXPECT_EQ((*created)->Prefill(1, prompt, pages, pages).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*created)->Prefill(0, {}, pages, pages).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> bad_token = {1, target_->config().vocab_size};
  EXPECT_EQ((*created)->Prefill(0, bad_token, pages, pages).status().code(), absl::StatusCode::kInvalidArgument);
}

// The switch-off by acceptance: a random draft accepts little, so a row asking for a mean accepted
// length of 1.9 pauses drafting (and resumes, and pauses again); a floor of 1 (every step emits at
// least one token) never pauses. Greedy tokens are plain greedy throughout; bad settings are refused.
TEST_F(SpeculativeStepTest, AcceptanceSwitchOffPausesDrafting) {
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 99, 3, 42, 8, 1}, {7, 7, 30}};
  DecodeOptions options;
  options.max_new_tokens = 30;
  SpeculativeDecoder plain(target_.get(), nullptr, &backend_, options);
  auto want = plain.Generate(prompts);
  ASSERT_TRUE(want.ok()) << want.status();
  SpeculationScheduleEntry row;
  row.max_batch = 8;
  row.tree = {2, 3, 6};
  options.acceptance_window = 2;
  options.acceptance_pause = 3;
  for (const double floor : {1.9, 1.0}) {
    row.min_accept_len = floor;
    options.schedule = {row};
    SpeculativeDecoder decoder(target_.get(), draft_.get(), &backend_, options);
    DecodeStats stats;
    auto got = decoder.Generate(prompts, &stats);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *want) << floor;
    if (floor > 1.0) {
      ASSERT_LT(stats.mean_accepted_length, 1.9);
      EXPECT_GE(stats.acceptance_pauses, 2);
      EXPECT_GE(stats.undrafted_steps, 3 * stats.acceptance_pauses - 3);
      EXPECT_GT(stats.device_steps, stats.undrafted_steps);  // drafting resumed
    } else {
      EXPECT_EQ(stats.acceptance_pauses, 0);
      EXPECT_EQ(stats.undrafted_steps, 0);
    }
  }
  row.min_accept_len = -1;
  options.schedule = {row};
  SpeculativeDecoder negative(target_.get(), draft_.get(), &backend_, options);
  EXPECT_EQ(negative.Generate(prompts).status().code(), absl::StatusCode::kInvalidArgument);
  row.min_accept_len = 2;
  options.schedule = {row};
  options.acceptance_window = 0;
  SpeculativeDecoder no_window(target_.get(), draft_.get(), &backend_, options);
  const absl::Status refused = no_window.Generate(prompts).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(refused.message()).find("acceptance_window"), std::string::npos) << refused;
}

// After a step that drafts nothing (which writes only the draft's KV rows), the next drafting step
// recomputes the roots from the kept taps: here with a sequence prefilled in between and the rows
// reordered, so the taps come from both places (the undrafted step, the prefill) through the row
// gather. Greedy tokens stay plain greedy, and the draft stays useful (the refreshed root logits are
// the draft's real ones: garbage there would sink acceptance).
TEST(SpeculativeStepTrainedPairTest, RootRefreshAfterUndraftedStepsKeepsTheDraftUseful) {
  cpu::CpuBackend backend;
  auto pair = LoadTrainedPair(&backend, 128, 32);
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto encoded = EncodeForTrainedPair({"def mul(a, b):\n    return a * b\n\n\ndef div(a, b):\n", "while True:\n"});
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::vector<std::vector<int64_t>> prompts = *encoded;
  constexpr int kNewTokens = 32;
  DecodeOptions plain_options;
  plain_options.max_new_tokens = kNewTokens + 8;
  SpeculativeDecoder plain(pair->target.get(), nullptr, plain_options);
  auto reference = plain.Generate(prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();

  SpeculativeStepOptions options;
  options.max_batch = 2;
  options.trees = {{4, 4, 12}};
  auto created = SpeculativeStep::Create(pair->target.get(), pair->draft.get(), &backend, options);
  ASSERT_TRUE(created.ok()) << created.status();
  SpeculativeStep& step = **created;
  const std::vector<std::vector<int32_t>> pages = {Pages(0, 16), Pages(16, 16)};
  std::vector<std::vector<int64_t>> got(2);
  std::vector<StepOutput> out;
  auto seq = [&](size_t i, int row) {
    return StepSequence{row, got[i].back(), static_cast<int64_t>(prompts[i].size() + got[i].size()) - 1, pages[i],
                        pages[i]};
  };
  auto first = step.Prefill(0, prompts[0], pages[0], pages[0]);
  ASSERT_TRUE(first.ok()) << first.status();
  got[0].push_back(*first);
  // Sequence 0 alone, drafting nothing twice.
  for (int i = 0; i < 2; ++i) {
    const StepSequence only = seq(0, 0);
    ASSERT_TRUE(step.Run(std::span<const StepSequence>(&only, 1), &out, kNoDraftTokens).ok());
    got[0].insert(got[0].end(), out[0].tokens.begin(), out[0].tokens.end());
  }
  // Sequence 1 joins at row 1; the next step lists it first (rows move) and drafts.
  first = step.Prefill(1, prompts[1], pages[1], pages[1]);
  ASSERT_TRUE(first.ok()) << first.status();
  got[1].push_back(*first);
  std::vector<size_t> order = {1, 0};
  std::vector<int> rows = {1, 0};
  int64_t drafted = 0, accepted = 0;
  for (int i = 0; std::min(got[0].size(), got[1].size()) < static_cast<size_t>(kNewTokens); ++i) {
    ASSERT_LT(i, 100);
    const int tree = i % 3 == 2 ? kNoDraftTokens : 0;  // off again every third step
    const std::vector<StepSequence> seqs = {seq(order[0], rows[0]), seq(order[1], rows[1])};
    const absl::Status ran = step.Run(seqs, &out, tree);
    ASSERT_TRUE(ran.ok()) << "step " << i << ": " << ran;
    for (size_t j = 0; j < 2; ++j) {
      got[order[j]].insert(got[order[j]].end(), out[j].tokens.begin(), out[j].tokens.end());
      if (tree != kNoDraftTokens) {
        drafted += 1;
        accepted += out[j].num_accepted;
      }
    }
    rows = {0, 1};  // each sequence's index in this step
  }
  for (size_t b = 0; b < 2; ++b) {
    got[b].resize(kNewTokens);
    EXPECT_EQ(got[b], std::vector<int64_t>((*reference)[b].begin(), (*reference)[b].begin() + kNewTokens)) << b;
  }
  EXPECT_GT(1.0 + static_cast<double>(accepted) / static_cast<double>(drafted), 1.5);
}

// The refreshed root state is the one a prefill of the same prefix leaves: after 1 to 3 steps that
// draft nothing, the first drafting step accepts exactly as many tokens as the same step of a fresh
// SpeculativeStep prefilled with everything up to the root (its draft rows all computed by full
// forwards). Greedy tokens match anyway; the accepted counts show whether the trees were the same.
TEST(SpeculativeStepTrainedPairTest, RefreshedRootsEqualAPrefillOfTheSamePrefix) {
  cpu::CpuBackend backend;
  auto pair = LoadTrainedPair(&backend, 128, 32);
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto prompts = EncodeForTrainedPair({"def square(x):\n    return x * x\n\n\ndef cube(x):\n", "class Point:\n    def __init__("});
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  SpeculativeStepOptions options;
  options.max_batch = 1;
  options.trees = {{4, 4, 12}};
  const std::vector<int32_t> pages1 = Pages(0, 16), pages2 = Pages(16, 16);
  int cases = 0;
  for (const std::vector<int64_t>& prompt : *prompts) {
    for (int off = 1; off <= 3; ++off) {
      auto s1 = SpeculativeStep::Create(pair->target.get(), pair->draft.get(), &backend, options);
      ASSERT_TRUE(s1.ok()) << s1.status();
      auto first = (*s1)->Prefill(0, prompt, pages1, pages1);
      ASSERT_TRUE(first.ok()) << first.status();
      std::vector<int64_t> seq = prompt;
      seq.push_back(*first);
      std::vector<StepOutput> out1, out2;
      for (int i = 0; i <= off; ++i) {
        const StepSequence s{0, seq.back(), static_cast<int64_t>(seq.size()) - 1, pages1, pages1};
        ASSERT_TRUE((*s1)->Run(std::span<const StepSequence>(&s, 1), &out1, i < off ? kNoDraftTokens : 0).ok());
        if (i < off) seq.insert(seq.end(), out1[0].tokens.begin(), out1[0].tokens.end());
      }
      auto s2 = SpeculativeStep::Create(pair->target.get(), pair->draft.get(), &backend, options);
      ASSERT_TRUE(s2.ok()) << s2.status();
      const std::vector<int64_t> prefix(seq.begin(), seq.end() - 1);
      auto root = (*s2)->Prefill(0, prefix, pages2, pages2);
      ASSERT_TRUE(root.ok()) << root.status();
      EXPECT_EQ(*root, seq.back());
      const StepSequence s{0, seq.back(), static_cast<int64_t>(prefix.size()), pages2, pages2};
      ASSERT_TRUE((*s2)->Run(std::span<const StepSequence>(&s, 1), &out2, 0).ok());
      EXPECT_EQ(out1[0].tokens, out2[0].tokens);
      EXPECT_EQ(out1[0].num_accepted, out2[0].num_accepted) << "prompt of " << prompt.size() << " tokens after " << off
                                                            << " undrafted steps";
      cases += 1;
    }
  }
  EXPECT_EQ(cases, 6);
}

// The benchmarks' synthetic acceptance (synthetic_acceptance.h) through the step's draft rewriter:
// with each tree's best path rewritten to the target's greedy continuation for a drawn m tokens,
// greedy verification accepts exactly the count RewriteBestPath reports, every step, and the tokens
// stay those of plain greedy decoding.
TEST_F(SpeculativeStepTest, SyntheticAcceptanceFixesTheAcceptedCount) {
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 99, 3, 42}, {7, 30, 2}};
  const std::vector<std::vector<int32_t>> tpages = {Pages(0, 12), Pages(12, 12)};
  const std::vector<std::vector<int32_t>> dpages = {Pages(0, 16), Pages(16, 16)};
  const int64_t vocab = target_->config().vocab_size;
  auto run_steps = [&](SpeculativeStep& step, std::vector<std::vector<int64_t>>& seqs, int steps, int tree,
                       const std::function<void(const std::vector<StepOutput>&)>& check) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto first = step.Prefill(static_cast<int>(i), prompts[i], tpages[i], dpages[i]);
      ASSERT_TRUE(first.ok()) << first.status();
      seqs[i] = prompts[i];
      seqs[i].push_back(*first);
    }
    std::vector<StepSequence> batch(prompts.size());
    std::vector<StepOutput> out;
    for (int s = 0; s < steps; ++s) {
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i] = StepSequence{static_cast<int>(i), seqs[i].back(), static_cast<int64_t>(seqs[i].size()) - 1,
                                tpages[i], dpages[i]};
      }
      ASSERT_TRUE(step.Run(batch, &out, tree).ok());
      check(out);
      for (size_t i = 0; i < batch.size(); ++i) seqs[i].insert(seqs[i].end(), out[i].tokens.begin(), out[i].tokens.end());
    }
  };
  // The target's greedy continuations: plain steps.
  SpeculativeStepOptions options;
  options.max_batch = 2;
  options.trees = {{2, 3, 6}};
  auto plain = SpeculativeStep::Create(target_.get(), nullptr, &backend_, options);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::vector<std::vector<int64_t>> reference(prompts.size());
  run_steps(**plain, reference, 30, kNoDraftTokens, [](const std::vector<StepOutput>&) {});

  auto spec = SpeculativeStep::Create(target_.get(), draft_.get(), &backend_, options);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const double alpha = SyntheticAlphaFor(2.4, 3);
  std::vector<int> expected(prompts.size(), -1);
  uint64_t draw = 0;
  // The CPU backend's buffers are host memory and its ops have run when the hook is called.
  SpeculativeStepTesting::SetDraftRewriter(**spec, [&](const DraftedTrees& trees) {
    for (int64_t b = 0; b < trees.batch; ++b) {
      const std::vector<int64_t>& ref = reference[static_cast<size_t>(b)];
      const int64_t root_position = trees.positions.data_as<int64_t>()[b * trees.nodes];
      const int m = SyntheticAcceptedCount(7, draw, static_cast<uint32_t>(b), alpha, 3);
      expected[static_cast<size_t>(b)] = RewriteBestPath(
          trees.tokens.data_as<int64_t>() + b * trees.nodes, trees.parents.data_as<int32_t>() + b * trees.nodes,
          static_cast<int>(trees.nodes), ref.data() + root_position + 1,
          static_cast<int>(ref.size()) - static_cast<int>(root_position) - 1, m, vocab);
    }
    ++draw;
    return absl::OkStatus();
  });
  std::vector<std::vector<int64_t>> got(prompts.size());
  int accepted = 0;
  run_steps(**spec, got, 6, 0, [&](const std::vector<StepOutput>& out) {
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].num_accepted, expected[i]) << "sequence " << i;
      accepted += out[i].num_accepted;
    }
  });
  EXPECT_GT(accepted, 0);
  EXPECT_EQ(draw, 6u);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(got[i].size(), reference[i].size());
    EXPECT_EQ(got[i], std::vector<int64_t>(reference[i].begin(), reference[i].begin() + got[i].size())) << i;
  }
}

// The mean accepted length of the draws is the one asked for, and SyntheticAlphaFor inverts
// SyntheticMeanAccepted.
TEST(SyntheticAcceptanceTest, DrawsHaveTheRequestedMean) {
  for (const double mean : {1.5, 2.4, 3.5}) {
    const double alpha = SyntheticAlphaFor(mean, 4);
    EXPECT_NEAR(SyntheticMeanAccepted(alpha, 4), mean, 1e-9);
    double sum = 0;
    const int draws = 20000;
    for (int i = 0; i < draws; ++i) sum += 1 + SyntheticAcceptedCount(3, static_cast<uint64_t>(i), 5, alpha, 4);
    EXPECT_NEAR(sum / draws, mean, 0.05) << mean;
  }
  // A hand tree: root 0; children 1, 2 (2 holds the continuation's first token); 3 under 1.
  int64_t tokens[] = {9, 4, 10, 6};
  const int32_t parents[] = {-1, 0, 0, 1};
  const int64_t continuation[] = {10, 11, 12};
  EXPECT_EQ(RewriteBestPath(tokens, parents, 4, continuation, 3, 3, 100), 2);  // the path is 2 deep
  EXPECT_EQ(tokens[1], 10);
  EXPECT_EQ(tokens[2], 11);  // the sibling no longer matches
  EXPECT_EQ(tokens[3], 11);
  int64_t again[] = {9, 4, 10, 6};
  EXPECT_EQ(RewriteBestPath(again, parents, 4, continuation, 3, 0, 100), 0);
  EXPECT_EQ(again[1], 4);
  EXPECT_EQ(again[2], 11);
}

// The shipped trained pair accepts most drafts, so the accept paths (the commit of several rows,
// the catch-up over a long path, bonus tokens at the leaves) run every step: greedy through the
// device step equals plain greedy for a batch of code prompts, chain and tree, with real
// acceptance; sampling equals the host reference loop.
TEST(SpeculativeStepTrainedPairTest, GreedyEqualsPlainAndSamplingEqualsTheHostLoop) {
  cpu::CpuBackend backend;
  auto pair = LoadTrainedPair(&backend, 160, 60);
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto& target = pair->target;
  auto& draft = pair->draft;
  auto encoded = EncodeForTrainedPair({"def fibonacci(n):\n    if n < 2:\n        return n\n",
                           "import os\n\nfor name in os.listdir(path):\n",
                           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"});
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::vector<std::vector<int64_t>> prompts = *encoded;
  DecodeOptions options;
  options.max_new_tokens = 32;
  SpeculativeDecoder plain(target.get(), nullptr, options);
  auto reference = plain.Generate(prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (const DraftTreeParams& tree : {DraftTreeParams{1, 4, 5}, DraftTreeParams{4, 4, 12}}) {
    DecodeOptions spec = options;
    spec.tree = tree;
    SpeculativeDecoder device(target.get(), draft.get(), &backend, spec);
    DecodeStats stats;
    auto got = device.Generate(prompts, &stats);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *reference) << "topk " << tree.topk;
    EXPECT_GT(stats.mean_accepted_length, 2.0) << "topk " << tree.topk;
    EXPECT_EQ(stats.host_syncs, stats.device_steps);

    spec.sampling.temperature = 0.7f;
    spec.seed = 21;
    SpeculativeDecoder sampled(target.get(), draft.get(), &backend, spec);
    auto sampled_got = sampled.Generate(prompts);
    ASSERT_TRUE(sampled_got.ok()) << sampled_got.status();
    Eagle3Drafter drafter(draft.get(), static_cast<int>(prompts.size()));
    SpeculativeDecoder host(target.get(), &drafter, spec);
    auto host_got = host.Generate(prompts);
    ASSERT_TRUE(host_got.ok()) << host_got.status();
    EXPECT_EQ(*sampled_got, *host_got) << "topk " << tree.topk;
  }
}

// DecodeStats::prefill_seconds: within total_seconds for the device step and the host loop, each
// speculative and plain; reading it adds no synchronization to the device step's (one per step).
TEST(SpeculativeStepTrainedPairTest, PrefillSecondsArePartOfTheTotal) {
  cpu::CpuBackend backend;
  auto pair = LoadTrainedPair(&backend, 160, 60);
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto prompts =
      EncodeForTrainedPair({"def fibonacci(n):\n", "import os\n\nfor name in os.listdir(path):\n"});
  ASSERT_TRUE(prompts.ok()) << prompts.status();
  DecodeOptions options;
  options.max_new_tokens = 8;
  auto generate = [&](SpeculativeDecoder decoder, const std::string& loop) {
    DecodeStats stats;
    auto got = decoder.Generate(*prompts, &stats);
    EXPECT_TRUE(got.ok()) << loop << ": " << got.status();
    EXPECT_GT(stats.prefill_seconds, 0) << loop;
    EXPECT_LT(stats.prefill_seconds, stats.total_seconds) << loop;  // the decode steps ran after it
    return stats;
  };
  for (DraftModel* draft : {pair->draft.get(), static_cast<DraftModel*>(nullptr)}) {
    const std::string kind = draft != nullptr ? "speculative" : "plain";
    const std::string loop = "device step, " + kind;
    const DecodeStats stats =
        generate(SpeculativeDecoder(pair->target.get(), draft, &backend, options), loop);
    EXPECT_EQ(stats.host_syncs, stats.device_steps) << kind;
  }
  Eagle3Drafter drafter(pair->draft.get(), static_cast<int>(prompts->size()));
  generate(SpeculativeDecoder(pair->target.get(), &drafter, options), "host loop, speculative");
  generate(SpeculativeDecoder(pair->target.get(), static_cast<Drafter*>(nullptr), options),
           "host loop, plain");
}

// A draft whose logits are NaN: the tree build records it on the device, and Run reports it after
// the step, naming the sequence, the pass and the draft id (the second, error-path transfer).
TEST(SpeculativeStepErrorTest, NaNDraftLogitsAreReportedAfterTheStep) {
  const std::string target_dir = kGolden + "v2lite_greedy";
  auto config = DeepseekV2Config::FromFile(target_dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ScopedTempDir draft_dir;
  RandomDraftCheckpointOptions draft_options;
  draft_options.num_attention_heads = 8;
  draft_options.num_key_value_heads = 4;
  draft_options.aux_layer_ids = {0, 1, 2};
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, draft_dir.path(), draft_options).ok());
  {
    // The same checkpoint with a NaN in every lm_head row.
    const std::string file = draft_dir.File("model.safetensors");
    auto in = SafetensorsFile::Open(file);
    ASSERT_TRUE(in.ok()) << in.status();
    std::vector<Tensor> copies;
    std::vector<NamedTensor> tensors;
    for (const TensorInfo& info : (*in)->tensors()) {
      auto view = (*in)->View(info.name);
      ASSERT_TRUE(view.ok());
      auto copy = Tensor::Empty(view->dtype(), view->shape());
      ASSERT_TRUE(copy.ok());
      std::memcpy(copy->data(), view->data(), view->nbytes());
      if (info.name == "lm_head.weight") {
        ASSERT_TRUE(copy->dtype() == DType::kF32 || copy->dtype() == DType::kBF16);
        for (int64_t r = 0; r < copy->dim(0); ++r) {
          if (copy->dtype() == DType::kF32) {
            copy->data_as<float>()[r * copy->dim(1)] = std::nanf("");
          } else {
            copy->data_as<uint16_t>()[r * copy->dim(1)] = 0x7FC0;  // bf16 quiet NaN
          }
        }
      }
      copies.push_back(*std::move(copy));
    }
    for (size_t i = 0; i < copies.size(); ++i) tensors.push_back({(*in)->tensors()[i].name, copies[i].view()});
    in->reset();
    ASSERT_TRUE(WriteSafetensors(file, tensors).ok());
  }
  cpu::CpuBackend backend;
  auto pair = LoadPair(target_dir, draft_dir.path(), 32, 64, 16, 4, 4, &backend);
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto& target = pair->target;
  auto& draft = pair->draft;
  DecodeOptions options;
  options.max_new_tokens = 4;
  options.tree = {2, 2, 4};
  SpeculativeDecoder decoder(target.get(), draft.get(), &backend, options);
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4, 5}};
  const absl::Status status = decoder.Generate(prompts).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("sequence 0: the draft's logits of tree pass 0, frontier row 0 hold NaN"),
            std::string::npos)
      << status;
}

// Steps that switch between two trees and drafting nothing, in any order, emit plain greedy's tokens:
// a step drafting nothing keeps the draft in sync, so the next drafting step proposes as well as
// ever (its acceptance stays high).
TEST(SpeculativeStepTrainedPairTest, SwitchingTreesAndSpeculationOffKeepsGreedyTokens) {
  cpu::CpuBackend backend;
  auto pair = LoadTrainedPair(&backend, 128, 32);
  ASSERT_TRUE(pair.ok()) << pair.status();
  auto& target = pair->target;
  auto& draft = pair->draft;
  auto encoded = EncodeForTrainedPair({"def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", "for i in range(10):\n"});
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::vector<std::vector<int64_t>> prompts = *encoded;
  constexpr int kNewTokens = 40;
  DecodeOptions plain_options;
  plain_options.max_new_tokens = kNewTokens;
  SpeculativeDecoder plain(target.get(), nullptr, plain_options);
  auto reference = plain.Generate(prompts);
  ASSERT_TRUE(reference.ok()) << reference.status();

  SpeculativeStepOptions options;
  options.max_batch = 2;
  options.trees = {{4, 4, 12}, {1, 3, 4}};
  auto step = SpeculativeStep::Create(target.get(), draft.get(), &backend, options);
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<std::vector<int64_t>> got(prompts.size());
  std::vector<StepSequence> seqs(prompts.size());
  std::vector<std::vector<int32_t>> pages(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    pages[b] = Pages(static_cast<int>(b) * 16, 16);
  }
  for (size_t b = 0; b < prompts.size(); ++b) {
    auto first = (*step)->Prefill(static_cast<int>(b), prompts[b], pages[b], pages[b]);
    ASSERT_TRUE(first.ok()) << first.status();
    got[b].push_back(*first);
    seqs[b] = StepSequence{static_cast<int>(b), *first, static_cast<int64_t>(prompts[b].size()), pages[b], pages[b]};
  }
  const std::vector<int> pattern = {0, kNoDraftTokens, 1, kNoDraftTokens, kNoDraftTokens, 0, 1, 1, kNoDraftTokens};
  int64_t drafted_steps = 0, drafted_tokens = 0;
  for (size_t i = 0; std::min(got[0].size(), got[1].size()) < static_cast<size_t>(kNewTokens); ++i) {
    ASSERT_LT(i, 200u);
    const int tree = pattern[i % pattern.size()];
    std::vector<StepOutput> out;
    const absl::Status ran = (*step)->Run(seqs, &out, tree);
    ASSERT_TRUE(ran.ok()) << "step " << i << ": " << ran;
    for (size_t b = 0; b < seqs.size(); ++b) {
      if (tree == kNoDraftTokens) EXPECT_EQ(out[b].num_accepted, 0);
      if (tree != kNoDraftTokens) {
        drafted_steps += 1;
        drafted_tokens += out[b].num_accepted;
      }
      got[b].insert(got[b].end(), out[b].tokens.begin(), out[b].tokens.end());
      seqs[b].row = static_cast<int>(b);
      seqs[b].cache_len += static_cast<int64_t>(out[b].tokens.size());
      seqs[b].root = out[b].tokens.back();
    }
  }
  for (size_t b = 0; b < prompts.size(); ++b) {
    got[b].resize(kNewTokens);
    EXPECT_EQ(got[b], (*reference)[b]) << "sequence " << b;
  }
  // The draft stays useful across the switches: most drafting steps accept more than one token.
  EXPECT_GT(static_cast<double>(drafted_tokens) / static_cast<double>(drafted_steps), 1.5);
  EXPECT_EQ((*step)->Run(seqs, nullptr, 2).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace eagle3
