// TargetModel steps captured in a CUDA graph and replayed ≡ the same steps run eagerly, bit for bit:
// decode (two sequences, growing lengths) and tree verify (new tree contents every replay), with
// taps; and a capture that cannot be recorded fails with a clear status instead of hanging.
#include <memory>
#include <string>
#include <vector>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/graph_step_launcher.h"
#include "eagle3/draft_model.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/speculative_decoder.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

const std::string kModel = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2_qlora_yarn";

struct Side {
  std::unique_ptr<cuda::CudaBackend> backend;
  std::unique_ptr<TargetModel> model;
};

class TargetGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    for (Side* side : {&eager_, &graphed_}) {
      auto backend = cuda::CudaBackend::Create();
      ASSERT_TRUE(backend.ok()) << backend.status();
      side->backend = std::move(*backend);
      TargetModelOptions o;
      o.weight_dtype = DType::kF32;  // the f32 path, compared at f32 tolerances
      o.max_tokens_per_forward = 32;
      o.max_context_len = 256;
      o.num_kv_pages = 64;
      o.page_size = 8;
      // The graphed side prefetches weights, the eager one does not: a hint, so the bits agree.
      o.prefetch_weights = side == &graphed_;
      auto model = TargetModel::Create(kModel, o, nullptr, side->backend.get());
      ASSERT_TRUE(model.ok()) << model.status();
      side->model = std::move(*model);
    }
    vocab_ = eager_.model->config().vocab_size;
    const int layers = static_cast<int>(eager_.model->config().num_hidden_layers);
    const int ids[] = {0, 1, 2};
    auto tap = HiddenStateTap::Create(std::span<const int>(ids), LayerIdConvention::kOutputOfLayer, layers,
                                      eager_.model->config().hidden_size);
    ASSERT_TRUE(tap.ok()) << tap.status();
    tap_ = std::make_unique<HiddenStateTap>(*tap);
  }

  struct Out {
    std::vector<float> logits, aux;
  };
  Out Alloc(std::span<const SequenceInput> batch) const {
    int64_t t = 0;
    for (const auto& in : batch) t += static_cast<int64_t>(in.tokens.size());
    Out o;
    o.logits.assign(static_cast<size_t>(TargetModel::LogitRows(batch) * vocab_), 0.0f);
    o.aux.assign(static_cast<size_t>(t * tap_->width()), 0.0f);
    return o;
  }
  TensorView L(Out& o, std::span<const SequenceInput> batch) const {
    return TensorView(o.logits.data(), DType::kF32, Shape{TargetModel::LogitRows(batch), vocab_});
  }
  TensorView A(Out& o) const {
    return TensorView(o.aux.data(), DType::kF32, Shape{static_cast<int64_t>(o.aux.size()) / tap_->width(), tap_->width()});
  }
  Out Eager(Side& side, std::span<const SequenceInput> batch) {
    Out o = Alloc(batch);
    const absl::Status st = side.model->Forward(batch, L(o, batch), tap_.get(), A(o));
    EXPECT_TRUE(st.ok()) << st;
    return o;
  }
  // Stage, then capture Launch when no graph exists yet (capturing runs nothing), replay, finish.
  Out Replay(std::unique_ptr<cuda::CudaGraph>* graph, std::vector<int64_t>* signature,
             std::span<const SequenceInput> batch) {
    Out o = Alloc(batch);
    TargetModel& m = *graphed_.model;
    absl::Status st = m.Stage(batch, tap_.get());
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_TRUE(m.StepIsCapturable());
    if (*graph == nullptr) {
      auto captured = cuda::CudaGraph::Capture(graphed_.backend->stream(), [&] { return m.Launch(); });
      EXPECT_TRUE(captured.ok()) << captured.status();
      if (!captured.ok()) return o;
      *graph = std::move(*captured);
      *signature = m.StepSignature();
    }
    EXPECT_EQ(m.StepSignature(), *signature) << "the staged batch does not fit the captured graph";
    st = (*graph)->Launch(graphed_.backend->stream());
    EXPECT_TRUE(st.ok()) << st;
    st = m.Finish(L(o, batch), A(o));
    EXPECT_TRUE(st.ok()) << st;
    return o;
  }

  Side eager_, graphed_;
  int64_t vocab_ = 0;
  std::unique_ptr<HiddenStateTap> tap_;
  std::vector<int32_t> pages0_ = {3, 7, 1, 12, 5, 9, 20, 2, 14, 30, 6, 8, 10, 11, 13, 15};
  std::vector<int32_t> pages1_ = {0, 4, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 31};
};

TEST_F(TargetGraphTest, DecodeAndTreeVerifyReplaysEqualEagerSteps) {
  std::vector<int64_t> p0 = {5, 9, 2, 7, 3, 8, 1}, p1 = {4, 4, 6, 10, 11};
  std::vector<SequenceInput> prefill = {SequenceInput{p0, {}, pages0_, 0, {}, false},
                                        SequenceInput{p1, {}, pages1_, 0, {}, false}};
  const Out pe = Eager(eager_, prefill), pg = Eager(graphed_, prefill);
  ASSERT_EQ(pe.logits, pg.logits);
  int64_t len0 = 7, len1 = 5;
  // Decode: one warm-up eager step on the graphed side, then capture + replays.
  std::unique_ptr<cuda::CudaGraph> decode;
  std::vector<int64_t> decode_sig;
  for (int step = 0; step < 6; ++step) {
    const std::vector<int64_t> t0 = {(3 * step + 1) % vocab_}, t1 = {(7 * step + 2) % vocab_};
    const std::vector<SequenceInput> batch = {SequenceInput{t0, {}, pages0_, len0, {}, false},
                                              SequenceInput{t1, {}, pages1_, len1, {}, false}};
    const Out want = Eager(eager_, batch);
    const Out got = step == 0 ? Eager(graphed_, batch) : Replay(&decode, &decode_sig, batch);
    EXPECT_EQ(got.logits, want.logits) << "decode step " << step;
    EXPECT_EQ(got.aux, want.aux) << "decode step " << step;
    ++len0;
    ++len1;
  }
  ASSERT_NE(decode, nullptr);
  EXPECT_GT(decode->num_nodes(), 20u);
  // Tree verify: 5-node trees (all logits), a different shape on each replay, then the same
  // accepted path committed on both sides.
  const std::vector<std::vector<uint8_t>> trees = {
      {1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1},
      {1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1},
      {1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1}};
  std::unique_ptr<cuda::CudaGraph> verify;
  std::vector<int64_t> verify_sig;
  for (size_t step = 0; step < 4; ++step) {
    const std::vector<uint8_t>& tree = trees[step % trees.size()];
    // Depth of node i = number of ancestors; positions follow depth.
    std::vector<int64_t> depth(5, 0), tok(5), pos0(5), pos1(5);
    for (int i = 0; i < 5; ++i) {
      for (int j = 0; j < i; ++j) depth[i] += tree[i * 5 + j];
      tok[i] = (11 * i + 5 * static_cast<int64_t>(step) + 3) % vocab_;
      pos0[i] = len0 + depth[i];
      pos1[i] = len1 + depth[i];
    }
    const std::vector<SequenceInput> batch = {SequenceInput{tok, pos0, pages0_, len0, tree, true},
                                              SequenceInput{tok, pos1, pages1_, len1, tree, true}};
    const Out want = Eager(eager_, batch);
    const Out got = step == 0 ? Eager(graphed_, batch) : Replay(&verify, &verify_sig, batch);
    EXPECT_EQ(got.logits, want.logits) << "verify step " << step;
    EXPECT_EQ(got.aux, want.aux) << "verify step " << step;
    const std::vector<int64_t> accepted = {0, 1};
    for (Side* side : {&eager_, &graphed_}) {
      ASSERT_TRUE(side->model->CommitAccepted(pages0_, len0, accepted).ok());
      ASSERT_TRUE(side->model->CommitAccepted(pages1_, len1, accepted).ok());
    }
    len0 += 2;
    len1 += 2;
  }
}

TEST_F(TargetGraphTest, UncapturableWorkFailsTheCaptureWithAStatus) {
  auto captured = cuda::CudaGraph::Capture(graphed_.backend->stream(), [&] { return graphed_.backend->Synchronize(); });
  ASSERT_FALSE(captured.ok());
  EXPECT_NE(std::string(captured.status().message()).find("CudaGraph"), std::string::npos) << captured.status();
  // The stream is usable afterwards.
  std::vector<int64_t> p = {1, 2, 3};
  const std::vector<SequenceInput> batch = {SequenceInput{p, {}, pages0_, 0, {}, false}};
  Out o = Alloc(batch);
  const absl::Status st = graphed_.model->Forward(batch, L(o, batch), tap_.get(), A(o));
  EXPECT_TRUE(st.ok()) << st;
}


// The decode loop with graphs (GraphStepLauncher) emits the same tokens as without, plain and
// speculative (greedy), and actually replays graphs.
TEST(GraphStepLauncherTest, DecodeLoopWithGraphsEqualsEagerLoop) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto backend = cuda::CudaBackend::Create();
  ASSERT_TRUE(backend.ok()) << backend.status();
  const std::string target_dir = kModel, draft_dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/draft_v2";
  TargetModelOptions topt;
  topt.weight_dtype = DType::kF32;  // the f32 path, compared at f32 tolerances
  topt.max_tokens_per_forward = 64;
  topt.max_context_len = 96;
  topt.num_kv_pages = 96;
  topt.page_size = 3;
  DraftModelOptions dopt;
  dopt.weight_dtype = DType::kF32;  // the f32 path, compared at f32 tolerances
  dopt.max_tokens_per_forward = 64;
  dopt.max_context_len = 96;
  dopt.num_kv_pages = 96;
  dopt.page_size = 5;
  const std::vector<std::vector<int64_t>> prompts = {{5, 17, 99, 3, 42, 8, 1}, {7, 7, 300}};
  for (bool speculative : {false, true}) {
    std::vector<std::vector<int64_t>> outputs[2];
    for (int graphs = 0; graphs < 2; ++graphs) {
      auto target = TargetModel::Create(target_dir, topt, nullptr, backend->get());
      ASSERT_TRUE(target.ok()) << target.status();
      auto draft = DraftModel::Create(draft_dir, target_dir, dopt, nullptr, backend->get());
      ASSERT_TRUE(draft.ok()) << draft.status();
      Eagle3Drafter drafter(draft->get(), static_cast<int>(prompts.size()));
      cuda::GraphStepLauncher launcher((*backend)->stream());
      DecodeOptions options;
      options.max_new_tokens = 20;
      options.tree = DraftTreeParams{2, 3, 6};
      if (graphs == 1) options.target_launcher = &launcher;
      SpeculativeDecoder decoder(target->get(), speculative ? &drafter : nullptr, options);
      auto got = decoder.Generate(prompts);
      ASSERT_TRUE(got.ok()) << got.status();
      outputs[graphs] = *got;
      if (graphs == 1) {
        EXPECT_GT(launcher.counts().replays, 3) << "speculative " << speculative;
        EXPECT_EQ(launcher.counts().failed_captures, 0);
      }
    }
    EXPECT_EQ(outputs[1], outputs[0]) << "speculative " << speculative;
  }
}

}  // namespace
}  // namespace eagle3
