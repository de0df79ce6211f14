// TargetModel::Stage / Launch / Finish (the graph-capturable split of Forward) on the CPU reference:
// Stage + Launch + Finish ≡ Forward bit for bit on the batched (capturable) and per-sequence paths;
// a later Stage replaces the staged inputs (what a graph replay relies on); StepSignature is equal
// exactly when the launched work is the same; misuse is refused with a clear status.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/testing/random_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

constexpr char kConfig[] = R"({
  "model_type": "deepseek_v2", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
  "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
  "num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 1.5, "scoring_func": "softmax", "topk_method": "greedy",
  "norm_topk_prob": false, "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": 24,
  "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
  "rms_norm_eps": 1e-6, "max_position_embeddings": 512, "rope_theta": 10000,
  "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1
})";

struct Outputs {
  std::vector<float> logits, aux;
};

class TargetModelStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = DeepseekV2Config::FromJson(kConfig, "test config");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, dir_.path(), RandomCheckpointOptions{}).ok());
    const int ids[] = {0, 2};
    auto tap = HiddenStateTap::Create(std::span<const int>(ids), LayerIdConvention::kInputOfLayer, 3, 32);
    ASSERT_TRUE(tap.ok()) << tap.status();
    tap_ = std::make_unique<HiddenStateTap>(*tap);
  }

  std::unique_ptr<TargetModel> Model(AttentionPath path = AttentionPath::kAuto) {
    TargetModelOptions o;
    o.attention_path = path;
    o.max_tokens_per_forward = 96;
    o.max_context_len = 128;
    o.num_kv_pages = 40;
    o.page_size = 8;
    auto model = TargetModel::Create(dir_.path(), o, nullptr, &backend_);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  static int64_t Tokens(std::span<const SequenceInput> batch) {
    int64_t t = 0;
    for (const SequenceInput& in : batch) t += static_cast<int64_t>(in.tokens.size());
    return t;
  }
  Outputs Empty(std::span<const SequenceInput> batch) const {
    Outputs o;
    o.logits.assign(static_cast<size_t>(TargetModel::LogitRows(batch) * config_.vocab_size), -1.0f);
    o.aux.assign(static_cast<size_t>(Tokens(batch) * tap_->width()), -1.0f);
    return o;
  }
  TensorView LogitsView(Outputs& o, std::span<const SequenceInput> batch) const {
    return TensorView(o.logits.data(), DType::kF32, Shape{TargetModel::LogitRows(batch), config_.vocab_size});
  }
  TensorView AuxView(Outputs& o, std::span<const SequenceInput> batch) const {
    return TensorView(o.aux.data(), DType::kF32, Shape{Tokens(batch), tap_->width()});
  }
  Outputs Forward(TargetModel& model, std::span<const SequenceInput> batch) {
    Outputs o = Empty(batch);
    const absl::Status st = model.Forward(batch, LogitsView(o, batch), tap_.get(), AuxView(o, batch));
    EXPECT_TRUE(st.ok()) << st;
    return o;
  }
  Outputs ThreeSteps(TargetModel& model, std::span<const SequenceInput> batch) {
    Outputs o = Empty(batch);
    absl::Status st = model.Stage(batch, tap_.get());
    if (st.ok()) st = model.Launch();
    if (st.ok()) st = model.Finish(LogitsView(o, batch), AuxView(o, batch));
    EXPECT_TRUE(st.ok()) << st;
    return o;
  }
  std::vector<int64_t> Prompt(int n, int salt) const {
    std::vector<int64_t> t(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) t[i] = (31 * i + 7 + 53 * salt) % config_.vocab_size;
    return t;
  }

  cpu::CpuBackend backend_;
  DeepseekV2Config config_;
  ScopedTempDir dir_;
  std::unique_ptr<HiddenStateTap> tap_;
  std::vector<int32_t> pages0_ = {3, 7, 1, 12, 5, 9, 20, 2, 14, 30, 6, 8, 10, 11, 13, 15};
  std::vector<int32_t> pages1_ = {0, 4, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 31};
};

// Prefill of two sequences, two decode steps, then a tree verify next to a causal extend: each
// step through Forward on one model and Stage/Launch/Finish on another gives the same bits.
TEST_F(TargetModelStageTest, ThreeStepsEqualForwardOnEveryKindOfStep) {
  for (AttentionPath path : {AttentionPath::kAuto, AttentionPath::kNonAbsorbed}) {
    auto a = Model(path), b = Model(path);
    ASSERT_TRUE(a && b);
    const auto p0 = Prompt(13, 0), p1 = Prompt(5, 1);
    std::vector<std::vector<SequenceInput>> steps;
    SequenceInput s0{p0, {}, pages0_, 0, {}, true}, s1{p1, {}, pages1_, 0, {}, false};
    steps.push_back({s0, s1});
    const std::vector<int64_t> d0 = {17}, d1 = {42}, e0 = {18}, e1 = {99};
    steps.push_back({SequenceInput{d0, {}, pages0_, 13, {}, false}, SequenceInput{d1, {}, pages1_, 5, {}, false}});
    steps.push_back({SequenceInput{e0, {}, pages0_, 14, {}, false}, SequenceInput{e1, {}, pages1_, 6, {}, false}});
    // Tree: 0 -> {1, 2}, 1 -> {3}; positions follow depth.
    const std::vector<int64_t> tree_tokens = {5, 6, 7, 8}, tree_pos = {15, 16, 16, 17};
    const std::vector<uint8_t> tree = {1, 0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 1};
    const std::vector<int64_t> ext = {1, 2, 3};
    steps.push_back({SequenceInput{tree_tokens, tree_pos, pages0_, 15, tree, true},
                     SequenceInput{ext, {}, pages1_, 7, {}, true}});
    for (size_t i = 0; i < steps.size(); ++i) {
      const Outputs want = Forward(*a, steps[i]);
      const Outputs got = ThreeSteps(*b, steps[i]);
      EXPECT_EQ(got.logits, want.logits) << "step " << i << " path " << static_cast<int>(path);
      EXPECT_EQ(got.aux, want.aux) << "step " << i << " path " << static_cast<int>(path);
      EXPECT_EQ(b->StepIsCapturable(), path == AttentionPath::kAuto) << "step " << i;
    }
  }
}

// What a graph replay relies on: Launch uses whatever was staged last, and the signature ignores
// the values (lengths, tokens, pages, tree contents) but not the structure.
TEST_F(TargetModelStageTest, LaterStageReplacesTheInputsAndSignatureTracksStructure) {
  auto a = Model(), b = Model();
  ASSERT_TRUE(a && b);
  const auto p0 = Prompt(9, 2), p1 = Prompt(9, 3);
  const std::vector<SequenceInput> pre = {SequenceInput{p0, {}, pages0_, 0, {}, false},
                                          SequenceInput{p1, {}, pages1_, 0, {}, false}};
  Forward(*a, pre);
  Forward(*b, pre);
  const std::vector<int64_t> x0 = {11}, x1 = {12}, y0 = {200}, y1 = {201};
  const std::vector<SequenceInput> first = {SequenceInput{x0, {}, pages0_, 9, {}, false},
                                            SequenceInput{x1, {}, pages1_, 9, {}, false}};
  const std::vector<SequenceInput> other = {SequenceInput{y0, {}, pages1_, 9, {}, false},
                                            SequenceInput{y1, {}, pages0_, 9, {}, false}};
  ASSERT_TRUE(b->Stage(first, tap_.get()).ok());
  const std::vector<int64_t> sig = b->StepSignature();
  ASSERT_TRUE(b->Stage(other, tap_.get()).ok());  // swapped pages, other tokens: same structure
  EXPECT_EQ(b->StepSignature(), sig);
  ASSERT_TRUE(b->Launch().ok());
  Outputs got = Empty(other);
  ASSERT_TRUE(b->Finish(LogitsView(got, other), AuxView(got, other)).ok());
  const Outputs want = Forward(*a, other);
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.aux, want.aux);

  // Structure changes change the signature.
  const std::vector<int64_t> two = {1, 2};
  const std::vector<SequenceInput> longer = {SequenceInput{two, {}, pages0_, 10, {}, false},
                                             SequenceInput{x1, {}, pages1_, 10, {}, false}};
  ASSERT_TRUE(b->Stage(longer, tap_.get()).ok());
  EXPECT_NE(b->StepSignature(), sig);
  std::vector<SequenceInput> all = first;
  all[1].all_logits = true;
  ASSERT_TRUE(b->Stage(all, tap_.get()).ok());
  EXPECT_NE(b->StepSignature(), sig);
  ASSERT_TRUE(b->Stage(first, nullptr).ok());
  EXPECT_NE(b->StepSignature(), sig);
  const std::vector<uint8_t> self = {1};
  std::vector<SequenceInput> treed = first;
  treed[0].tree_mask = self;
  ASSERT_TRUE(b->Stage(treed, tap_.get()).ok());
  EXPECT_NE(b->StepSignature(), sig);
  ASSERT_TRUE(b->Stage(first, tap_.get()).ok());
  EXPECT_EQ(b->StepSignature(), sig);
}

// A long extend takes the per-sequence path (not capturable); next to a decode it still equals
// each sequence alone.
TEST_F(TargetModelStageTest, LongExtendIsNotCapturableAndMixedBatchesStayExact) {
  auto a = Model(), b = Model();
  ASSERT_TRUE(a && b);
  const auto p0 = Prompt(70, 4), p1 = Prompt(3, 5);
  const std::vector<SequenceInput> mixed = {SequenceInput{p0, {}, pages0_, 0, {}, true},
                                            SequenceInput{p1, {}, pages1_, 0, {}, true}};
  ASSERT_TRUE(b->Stage(mixed, nullptr).ok());
  EXPECT_FALSE(b->StepIsCapturable());
  const Outputs together = Forward(*b, mixed);
  const Outputs first = Forward(*a, std::span<const SequenceInput>(&mixed[0], 1));
  const Outputs second = Forward(*a, std::span<const SequenceInput>(&mixed[1], 1));
  std::vector<float> alone = first.logits;
  alone.insert(alone.end(), second.logits.begin(), second.logits.end());
  // Equal up to GEMM blocking (row counts differ): relative to the largest logit.
  ASSERT_EQ(together.logits.size(), alone.size());
  double diff = 0, scale = 1;
  for (size_t i = 0; i < alone.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(together.logits[i] - alone[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(alone[i])));
  }
  EXPECT_LT(diff / scale, 1e-5);
}

TEST_F(TargetModelStageTest, MisuseIsRefused) {
  auto m = Model();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->Launch().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> buf(static_cast<size_t>(config_.vocab_size));
  const TensorView one_row(buf.data(), DType::kF32, Shape{1, config_.vocab_size});
  EXPECT_EQ(m->Finish(one_row).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(m->StepSignature().empty());

  const std::vector<int64_t> bad = {static_cast<int64_t>(config_.vocab_size)};
  const std::vector<SequenceInput> batch = {SequenceInput{bad, {}, pages0_, 0, {}, false}};
  const absl::Status st = m->Stage(batch, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("sequence 0 token 0"));
  EXPECT_EQ(m->Launch().code(), absl::StatusCode::kFailedPrecondition) << "a failed Stage leaves nothing staged";

  const std::vector<int64_t> ok = {3, 4};
  const std::vector<SequenceInput> good = {SequenceInput{ok, {}, pages0_, 0, {}, true}};
  ASSERT_TRUE(m->Stage(good, nullptr).ok());
  ASSERT_TRUE(m->Launch().ok());
  const absl::Status wrong = m->Finish(one_row);  // two rows were asked for
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.message()), HasSubstr("logits must be f32[2, 300]"));
}

}  // namespace
}  // namespace eagle3
