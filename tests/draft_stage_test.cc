// DraftModel::Stage / Launch / Finish (the graph-capturable split of Forward) on the CPU reference:
// Stage + Launch + Finish ≡ Forward bit for bit over extend, fed-back, tree-masked and multi-sequence
// steps; a later Stage replaces the staged inputs (what a graph replay relies on); StepSignature is
// equal exactly when the launched work is the same; misuse is refused with a clear status.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

// A 3-layer V2 target with a 48-wide hidden and a 256-id vocabulary.
constexpr char kTarget[] = R"({
  "model_type": "deepseek_v2", "vocab_size": 256, "hidden_size": 48, "intermediate_size": 96,
  "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 4,
  "num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 1.0, "scoring_func": "softmax", "topk_method": "greedy",
  "norm_topk_prob": false, "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": null,
  "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
  "rms_norm_eps": 1e-6, "max_position_embeddings": 1024, "rope_theta": 10000,
  "tie_word_embeddings": false
})";
constexpr int64_t kHidden = 48, kVocab = 256, kDraftVocab = 100, kAux = 3 * kHidden;

// One draft call's inputs, owning what the spans point at.
struct Call {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<int32_t>> pages;
  std::vector<std::vector<uint8_t>> masks;
  std::vector<int64_t> cache_len;
  std::vector<bool> all_logits;
  std::vector<float> hidden;
  bool from_target = true;

  std::vector<DraftSequenceInput> Batch() const {
    std::vector<DraftSequenceInput> batch;
    for (size_t s = 0; s < tokens.size(); ++s) {
      DraftSequenceInput in;
      in.tokens = tokens[s];
      in.page_table = pages[s];
      in.cache_len = cache_len[s];
      in.mask = masks[s];
      in.all_logits = all_logits[s];
      batch.push_back(in);
    }
    return batch;
  }
  int64_t Rows() const {
    int64_t t = 0;
    for (const auto& v : tokens) t += static_cast<int64_t>(v.size());
    return t;
  }
  TensorView Hidden() const {
    return TensorView(const_cast<float*>(hidden.data()), DType::kF32,
                      Shape{Rows(), from_target ? kAux : kHidden});
  }
};

struct Outputs {
  std::vector<float> logits, hidden;
  TensorView Logits(int64_t rows) { return TensorView(logits.data(), DType::kF32, Shape{rows, kDraftVocab}); }
  TensorView Hidden(int64_t rows) { return TensorView(hidden.data(), DType::kF32, Shape{rows, kHidden}); }
};

// Sequence s of a call: n rows after cache_len, on pages {s, s + 8, s + 16, ...} reversed (pages
// shuffled between sequences); a tree mask (each row attends the cache, row 0 and itself) if `tree`.
void AddSequence(Call& call, int s, int64_t n, int64_t cache_len, bool tree, bool all_logits, std::mt19937& rng) {
  std::vector<int64_t> tokens(static_cast<size_t>(n));
  for (int64_t& v : tokens) v = std::uniform_int_distribution<int64_t>(0, kVocab - 1)(rng);
  std::vector<int32_t> pages;
  for (int p = 7; p >= 0; --p) pages.push_back(static_cast<int32_t>(s + 4 * p));
  std::vector<uint8_t> mask;
  if (tree) {
    const int64_t end = cache_len + n;
    mask.assign(static_cast<size_t>(n * end), 0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j <= cache_len; ++j) mask[static_cast<size_t>(i * end + j)] = 1;
      mask[static_cast<size_t>(i * end + cache_len + i)] = 1;
    }
  }
  call.tokens.push_back(tokens);
  call.pages.push_back(pages);
  call.masks.push_back(mask);
  call.cache_len.push_back(cache_len);
  call.all_logits.push_back(all_logits);
}

void FillHidden(Call& call, bool from_target, std::mt19937& rng) {
  call.from_target = from_target;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  call.hidden.resize(static_cast<size_t>(call.Rows() * (from_target ? kAux : kHidden)));
  for (float& v : call.hidden) v = normal(rng);
}

class DraftStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = DeepseekV2Config::FromJson(kTarget, "test target");
    ASSERT_TRUE(config.ok()) << config.status();
    RandomCheckpointOptions target_options;
    target_options.seed = 5;
    ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(*config, target_dir_.path(), target_options).ok());
    RandomDraftCheckpointOptions o;
    o.seed = 9;
    o.num_attention_heads = 8;
    o.num_key_value_heads = 2;  // GQA groups of 4
    o.head_dim = 12;
    o.draft_vocab_size = kDraftVocab;
    o.aux_layer_ids = {0, 1, 2};
    ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, draft_dir_.path(), o).ok());
  }

  std::unique_ptr<DraftModel> Model() {
    DraftModelOptions o;
    o.max_tokens_per_forward = 24;
    o.max_context_len = 40;
    o.num_kv_pages = 32;
    o.page_size = 4;
    auto model = DraftModel::Create(draft_dir_.path(), target_dir_.path(), o, nullptr, &backend_);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  static Outputs Sized(const Call& call) {
    Outputs out;
    out.logits.assign(static_cast<size_t>(DraftModel::LogitRows(call.Batch()) * kDraftVocab), -1.0f);
    out.hidden.assign(static_cast<size_t>(call.Rows() * kHidden), -1.0f);
    return out;
  }

  static Outputs Forward(DraftModel& model, const Call& call) {
    Outputs out = Sized(call);
    const int64_t rows = DraftModel::LogitRows(call.Batch());
    const absl::Status st =
        model.Forward(call.Batch(), call.Hidden(), call.from_target, out.Logits(rows), out.Hidden(call.Rows()));
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

  static Outputs Split(DraftModel& model, const Call& call) {
    Outputs out = Sized(call);
    const int64_t rows = DraftModel::LogitRows(call.Batch());
    EXPECT_TRUE(model.Stage(call.Batch(), call.Hidden(), call.from_target).ok());
    EXPECT_TRUE(model.StepIsCapturable());
    EXPECT_TRUE(model.Launch().ok());
    EXPECT_TRUE(model.Finish(out.Logits(rows), out.Hidden(call.Rows())).ok());
    return out;
  }

  // A context step from the target, a fed-back causal step, a tree step: three sequences.
  static std::vector<Call> Steps() {
    std::mt19937 rng(17);
    std::vector<Call> steps(3);
    for (int s = 0; s < 3; ++s) AddSequence(steps[0], s, 5 + s, 0, false, s == 1, rng);
    FillHidden(steps[0], true, rng);
    for (int s = 0; s < 3; ++s) AddSequence(steps[1], s, 1, 5 + s, false, false, rng);
    FillHidden(steps[1], false, rng);
    for (int s = 0; s < 3; ++s) AddSequence(steps[2], s, 3, 6 + s, true, true, rng);
    FillHidden(steps[2], false, rng);
    return steps;
  }

  cpu::CpuBackend backend_;
  ScopedTempDir target_dir_, draft_dir_;
};

TEST_F(DraftStageTest, StageLaunchFinishEqualsForwardBitForBit) {
  auto eager = Model();
  auto split = Model();
  ASSERT_TRUE(eager && split);
  for (const Call& call : Steps()) {
    const Outputs want = Forward(*eager, call);
    const Outputs got = Split(*split, call);
    EXPECT_EQ(got.logits, want.logits);
    EXPECT_EQ(got.hidden, want.hidden);
  }
}

TEST_F(DraftStageTest, LaterStageReplacesStagedInputs) {
  const std::vector<Call> steps = Steps();
  std::mt19937 rng(23);
  Call other;  // same signature as steps[0], other tokens, hidden and lengths
  for (int s = 0; s < 3; ++s) AddSequence(other, s, 5 + s, 2, false, s == 1, rng);
  FillHidden(other, true, rng);
  auto eager = Model();
  auto split = Model();
  ASSERT_TRUE(eager && split);
  const Outputs want = Forward(*eager, other);
  ASSERT_TRUE(split->Stage(steps[0].Batch(), steps[0].Hidden(), true).ok());
  const std::vector<int64_t> first = split->StepSignature();
  ASSERT_TRUE(split->Stage(other.Batch(), other.Hidden(), true).ok());
  EXPECT_EQ(split->StepSignature(), first);
  Outputs got = Sized(other);
  ASSERT_TRUE(split->Launch().ok());
  ASSERT_TRUE(split->Finish(got.Logits(DraftModel::LogitRows(other.Batch())), got.Hidden(other.Rows())).ok());
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.hidden, want.hidden);
}

TEST_F(DraftStageTest, SignatureFollowsTheLaunchedWork) {
  auto model = Model();
  ASSERT_TRUE(model);
  EXPECT_TRUE(model->StepSignature().empty());
  EXPECT_FALSE(model->StepIsCapturable());
  const std::vector<Call> steps = Steps();
  auto signature = [&](const Call& call) {
    EXPECT_TRUE(model->Stage(call.Batch(), call.Hidden(), call.from_target).ok());
    return model->StepSignature();
  };
  const std::vector<int64_t> base = signature(steps[1]);
  Call flags = steps[1];
  flags.all_logits[0] = true;
  EXPECT_NE(signature(flags), base);
  Call more = steps[1];
  std::mt19937 rng(1);
  AddSequence(more, 3, 1, 0, false, false, rng);
  FillHidden(more, false, rng);
  EXPECT_NE(signature(more), base);
  Call aux = steps[1];
  FillHidden(aux, true, rng);
  EXPECT_NE(signature(aux), base);
  Call values = steps[1];  // other tokens and lengths: the same work
  values.tokens[2][0] = 7;
  values.cache_len[0] = 1;
  FillHidden(values, false, rng);
  EXPECT_EQ(signature(values), base);
  // A batch with no masks attends causally on the device (no mask rows staged); one with masks
  // does other work, whatever the masks hold.
  Call masked = steps[1];
  masked.masks[1] = {1, 1, 0, 0, 0, 0, 0};
  masked.masks[1].back() = 1;
  const std::vector<int64_t> with_mask = signature(masked);
  EXPECT_NE(with_mask, base);
  masked.masks[1][0] = 0;
  EXPECT_EQ(signature(masked), with_mask);
}

// DraftStepIO::kv_only writes the rows' KV entries bit for bit as a full step does: a model that ran
// the context step kv_only then answers the next step exactly like one that ran it in full. It has
// no outputs (Finish refuses; output views are refused at Stage) and its own step signature.
TEST_F(DraftStageTest, KvOnlyWritesWhatAFullStepWrites) {
  auto full = Model();
  auto kv_only = Model();
  ASSERT_TRUE(full && kv_only);
  const std::vector<Call> steps = Steps();
  Forward(*full, steps[0]);
  DraftStepIO io;
  io.kv_only = true;
  ASSERT_TRUE(kv_only->Stage(steps[0].Batch(), steps[0].Hidden(), steps[0].from_target, io).ok());
  const std::vector<int64_t> kv_signature = kv_only->StepSignature();
  ASSERT_TRUE(kv_only->Launch().ok());
  std::vector<float> logits(static_cast<size_t>(DraftModel::LogitRows(steps[0].Batch()) * kDraftVocab));
  std::vector<float> hidden(static_cast<size_t>(steps[0].Rows() * kHidden));
  EXPECT_EQ(kv_only
                ->Finish(TensorView(logits.data(), DType::kF32, Shape{DraftModel::LogitRows(steps[0].Batch()), kDraftVocab}),
                         TensorView(hidden.data(), DType::kF32, Shape{steps[0].Rows(), kHidden}))
                .code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(kv_only->Stage(steps[0].Batch(), steps[0].Hidden(), steps[0].from_target).ok());
  EXPECT_NE(kv_only->StepSignature(), kv_signature);
  for (size_t i = 1; i < steps.size(); ++i) {
    const Outputs want = Forward(*full, steps[i]);
    const Outputs got = Forward(*kv_only, steps[i]);
    EXPECT_EQ(got.logits, want.logits) << "step " << i;
    EXPECT_EQ(got.hidden, want.hidden) << "step " << i;
  }
  DraftStepIO with_logits = io;
  with_logits.logits = TensorView(logits.data(), DType::kF32, Shape{DraftModel::LogitRows(steps[0].Batch()), kDraftVocab});
  const absl::Status refused = kv_only->Stage(steps[0].Batch(), steps[0].Hidden(), steps[0].from_target, with_logits);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("kv_only"));
}

TEST_F(DraftStageTest, MisuseIsRefused) {
  auto model = Model();
  ASSERT_TRUE(model);
  EXPECT_EQ(model->Launch().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> logits(kDraftVocab), hidden(kHidden);
  EXPECT_EQ(model->Finish(TensorView(logits.data(), DType::kF32, Shape{1, kDraftVocab}),
                          TensorView(hidden.data(), DType::kF32, Shape{1, kHidden}))
                .code(),
            absl::StatusCode::kFailedPrecondition);
  const Call call = Steps()[1];
  ASSERT_TRUE(model->Stage(call.Batch(), call.Hidden(), call.from_target).ok());
  ASSERT_TRUE(model->Launch().ok());
  // Outputs are checked against the staged batch (3 logit rows, 3 hidden rows).
  const absl::Status st = model->Finish(TensorView(logits.data(), DType::kF32, Shape{1, kDraftVocab}),
                                        TensorView(hidden.data(), DType::kF32, Shape{1, kHidden}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("logits must be f32[3, 100]"));
  // A bad Stage leaves nothing staged.
  Call bad = call;
  bad.tokens[0][0] = kVocab;
  EXPECT_EQ(model->Stage(bad.Batch(), bad.Hidden(), bad.from_target).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(model->StepIsCapturable());
  EXPECT_EQ(model->Launch().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace eagle3
