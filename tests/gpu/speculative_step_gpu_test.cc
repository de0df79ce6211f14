// SpeculativeStep on the CUDA backend: the shipped trained pair (f32 weights, so that CPU and CUDA
// agree on every greedy decision) decodes a batch of code prompts through the device step with the
// same tokens as on the CPU reference backend; whole steps captured in CUDA graphs and replayed give
// the same tokens as eager steps (greedy and sampled); speculative greedy equals plain greedy.
#include <memory>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/graph_step_launcher.h"
#include "eagle3/draft_model.h"
#include "eagle3/speculative_decoder.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/tools/tokenizer.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

const std::string kModels = std::string(EAGLE3_TEST_DATA_DIR) + "/../../models/";

struct Pair {
  std::unique_ptr<TargetModel> target;
  std::unique_ptr<DraftModel> draft;
};

absl::StatusOr<Pair> LoadPair(Backend* backend) {
  TargetModelOptions topt;
  topt.weight_dtype = DType::kF32;
  topt.max_tokens_per_forward = 64;
  topt.max_context_len = 192;
  topt.num_kv_pages = 72;
  topt.page_size = 8;
  DraftModelOptions dopt;
  dopt.weight_dtype = DType::kF32;
  dopt.max_tokens_per_forward = 64;
  dopt.max_context_len = 192;
  dopt.num_kv_pages = 72;
  dopt.page_size = 8;
  Pair pair;
  EAGLE3_ASSIGN_OR_RETURN(pair.target, TargetModel::Create(kModels + "tiny-v2-code", topt, nullptr, backend));
  EAGLE3_ASSIGN_OR_RETURN(pair.draft, DraftModel::Create(kModels + "tiny-v2-code-eagle3", kModels + "tiny-v2-code",
                                                         dopt, nullptr, backend));
  return pair;
}

class SpeculativeStepGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    auto backend = cuda::CudaBackend::Create();
    ASSERT_TRUE(backend.ok()) << backend.status();
    gpu_ = std::move(*backend);
    auto gpu_pair = LoadPair(gpu_.get());
    ASSERT_TRUE(gpu_pair.ok()) << gpu_pair.status();
    gpu_pair_ = std::move(*gpu_pair);
    auto cpu_pair = LoadPair(&cpu_);
    ASSERT_TRUE(cpu_pair.ok()) << cpu_pair.status();
    cpu_pair_ = std::move(*cpu_pair);
    auto tokenizer = Tokenizer::FromFile(kModels + "tiny-v2-code/tokenizer.json");
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    for (const char* text : {"def fibonacci(n):\n    if n < 2:\n        return n\n",
                             "import os\n\nfor name in os.listdir(path):\n",
                             "class Stack:\n    def __init__(self):\n        self.items = []\n"}) {
      auto ids = tokenizer->Encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status();
      prompts_.push_back(*ids);
    }
  }

  std::vector<std::vector<int64_t>> Decode(const Pair& pair, Backend* backend, DecodeOptions options,
                                           StepLauncher* launcher = nullptr, bool speculative = true,
                                           DecodeStats* stats = nullptr) {
    options.target_launcher = launcher;
    SpeculativeDecoder decoder(pair.target.get(), speculative ? pair.draft.get() : nullptr, backend, options);
    auto out = decoder.Generate(prompts_, stats);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *out : std::vector<std::vector<int64_t>>();
  }

  cpu::CpuBackend cpu_;
  std::unique_ptr<cuda::CudaBackend> gpu_;
  Pair gpu_pair_, cpu_pair_;
  std::vector<std::vector<int64_t>> prompts_;
};

TEST_F(SpeculativeStepGpuTest, GreedyMatchesTheCpuStepAndPlainDecoding) {
  DecodeOptions options;
  options.max_new_tokens = 40;
  const auto plain = Decode(gpu_pair_, gpu_.get(), options, nullptr, /*speculative=*/false);
  for (const DraftTreeParams& tree : {DraftTreeParams{1, 4, 5}, DraftTreeParams{4, 4, 12}}) {
    options.tree = tree;
    DecodeStats stats;
    const auto gpu = Decode(gpu_pair_, gpu_.get(), options, nullptr, true, &stats);
    const auto cpu = Decode(cpu_pair_, &cpu_, options);
    EXPECT_EQ(gpu, cpu) << "topk " << tree.topk;
    EXPECT_EQ(gpu, plain) << "topk " << tree.topk;
    EXPECT_GT(stats.mean_accepted_length, 2.0);
    EXPECT_EQ(stats.host_syncs, stats.device_steps);
  }
}

TEST_F(SpeculativeStepGpuTest, GraphReplaysEqualEagerSteps) {
  for (const float temperature : {0.0f, 0.8f}) {
    DecodeOptions options;
    options.max_new_tokens = 48;
    options.tree = {4, 4, 12};
    options.sampling.temperature = temperature;
    options.seed = 5;
    options.eos_token_ids = {0};
    const auto eager = Decode(gpu_pair_, gpu_.get(), options);
    cuda::GraphStepLauncher launcher(gpu_->stream());
    const auto graphed = Decode(gpu_pair_, gpu_.get(), options, &launcher);
    EXPECT_EQ(graphed, eager) << "temperature " << temperature;
    EXPECT_GT(launcher.counts().replays, 0);
    EXPECT_EQ(launcher.counts().failed_captures, 0);
    // Plain decoding through the same step, captured too.
    cuda::GraphStepLauncher plain_launcher(gpu_->stream());
    EXPECT_EQ(Decode(gpu_pair_, gpu_.get(), options, &plain_launcher, false),
              Decode(gpu_pair_, gpu_.get(), options, nullptr, false));
    EXPECT_GT(plain_launcher.counts().replays, 0);
  }
}

// Steps that draft nothing (the draft kept in sync by its KV rows only) alternating with drafting
// steps that first refresh the roots, eager and graph-replayed: an unreachable min_accept_len with
// a window of one drafting step pauses drafting for two steps after every drafting step. Greedy
// tokens equal the CPU step's and plain decoding's; the drafting steps still accept as a fresh
// draft does (refreshed roots are the draft's real state).
TEST_F(SpeculativeStepGpuTest, UndraftedStepsAndRefreshedRootsKeepGreedyTokens) {
  DecodeOptions options;
  options.max_new_tokens = 40;
  const auto plain = Decode(gpu_pair_, gpu_.get(), options, nullptr, /*speculative=*/false);
  SpeculationScheduleEntry row;
  row.max_batch = 8;
  row.tree = {4, 4, 12};
  row.min_accept_len = 100;
  options.schedule = {row};
  options.acceptance_window = 1;
  options.acceptance_pause = 2;
  DecodeStats eager_stats, graph_stats;
  const auto eager = Decode(gpu_pair_, gpu_.get(), options, nullptr, true, &eager_stats);
  cuda::GraphStepLauncher launcher(gpu_->stream());
  const auto graphed = Decode(gpu_pair_, gpu_.get(), options, &launcher, true, &graph_stats);
  const auto cpu = Decode(cpu_pair_, &cpu_, options);
  EXPECT_EQ(eager, plain);
  EXPECT_EQ(graphed, plain);
  EXPECT_EQ(cpu, plain);
  EXPECT_GT(launcher.counts().replays, 0);
  EXPECT_EQ(launcher.counts().failed_captures, 0);
  for (const DecodeStats* st : {&eager_stats, &graph_stats}) {
    EXPECT_GE(st->acceptance_pauses, 3);
    EXPECT_GE(st->undrafted_steps, 2 * st->acceptance_pauses - 2);
    EXPECT_GT(st->mean_accepted_length, 2.0);
  }
}

}  // namespace
}  // namespace eagle3
