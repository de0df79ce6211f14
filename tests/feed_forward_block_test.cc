// FeedForwardBlock's MoE on its own (CPU reference backend): dense shared experts of
// n_shared_experts x the routed experts' width join the routed experts' op as that many experts (one
// slice of their intermediate dim each) up to 8 rows, and run as one MLP whose gate_up rows are
// interleaved by slice past that; both give the block's math as written here from the checkpoint's
// tensors (the routing through the backend's MoeRoute, the authority on it), at TP 1 and summed
// over TP 2 ranks.
#include "feed_forward_block.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/dtype.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/testing/random_checkpoint.h"
#include "forwarding_backend.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"
#include "weight_loader.h"

namespace eagle3 {
namespace {

// V2's MoE form: two shared experts (one MLP of 2 x 24), 8 routed experts of 24, top 3.
constexpr char kConfig[] = R"({
  "model_type": "deepseek_v2", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64,
  "moe_intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 3,
  "routed_scaling_factor": 1.5, "scoring_func": "softmax", "topk_method": "greedy",
  "norm_topk_prob": false, "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": null,
  "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
  "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "rope_theta": 10000, "rope_scaling": null,
  "tie_word_embeddings": false, "eos_token_id": 1
})";

constexpr int64_t kMaxRows = 40;

class FeedForwardBlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = DeepseekV2Config::FromJson(kConfig, "test config");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    RandomCheckpointOptions options;
    options.seed = 7;
    options.num_shards = 1;
    options.dtype = DType::kF32;
    ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, dir_.path(), options).ok());
    auto checkpoint = Checkpoint::Open(dir_.path());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = std::move(*checkpoint);
  }

  // Tensor `name` of the checkpoint as f32 values.
  std::vector<float> Read(const std::string& name) {
    auto t = checkpoint_->Read(name, DType::kF32);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    const float* p = t->data_as<float>();
    return std::vector<float>(p, p + t->numel());
  }

  // out = w x for w [n, k], x [k], in double.
  static std::vector<double> MatVec(const std::vector<float>& w, int64_t n, int64_t k, const std::vector<double>& x) {
    std::vector<double> out(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < k; ++j) out[i] += static_cast<double>(w[i * k + j]) * x[j];
    }
    return out;
  }

  // A SiLU MLP of width `inter` over x.
  std::vector<double> Mlp(const std::string& prefix, int64_t inter, const std::vector<double>& x) {
    const int64_t h = config_.hidden_size;
    const std::vector<double> g = MatVec(Read(prefix + "gate_proj.weight"), inter, h, x);
    const std::vector<double> u = MatVec(Read(prefix + "up_proj.weight"), inter, h, x);
    std::vector<double> a(static_cast<size_t>(inter));
    for (int64_t i = 0; i < inter; ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    return MatVec(Read(prefix + "down_proj.weight"), h, inter, a);
  }

  DeepseekV2Config config_;
  ScopedTempDir dir_;
  std::unique_ptr<Checkpoint> checkpoint_;
};

TEST_F(FeedForwardBlockTest, DenseSharedExpertsJoinAsSlicesAndRunAsOneMlpPastThem) {
  const int64_t h = config_.hidden_size, inter = config_.moe_intermediate_size;
  const FeedForwardConfig ffn = FeedForwardConfig::ForTargetLayer(config_, 1);
  ASSERT_TRUE(ffn.moe);
  const std::string prefix = "model.layers.1.mlp.";
  const std::vector<WeightSpec> specs = ffn.Weights(prefix);
  cpu::CpuBackend backend;

  std::vector<float> x(static_cast<size_t>(kMaxRows * h));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  // The routing, by the backend's MoeRoute over the router's f32 logits.
  std::vector<float> logits(static_cast<size_t>(kMaxRows * ffn.n_routed_experts));
  {
    const std::vector<float> router = Read(prefix + "gate.weight");
    for (int64_t t = 0; t < kMaxRows; ++t) {
      for (int64_t e = 0; e < ffn.n_routed_experts; ++e) {
        double s = 0;
        for (int64_t j = 0; j < h; ++j) s += static_cast<double>(router[e * h + j]) * x[t * h + j];
        logits[t * ffn.n_routed_experts + e] = static_cast<float>(s);
      }
    }
  }
  const int64_t k = ffn.routing.top_k;
  std::vector<int32_t> ids(static_cast<size_t>(kMaxRows * k));
  std::vector<float> weights(static_cast<size_t>(kMaxRows * k));
  ASSERT_TRUE(backend
                  .MoeRoute(TensorView(logits.data(), DType::kF32, Shape{kMaxRows, ffn.n_routed_experts}), nullptr,
                            ffn.routing, TensorView(ids.data(), DType::kI32, Shape{kMaxRows, k}),
                            TensorView(weights.data(), DType::kF32, Shape{kMaxRows, k}))
                  .ok());
  std::vector<double> want(static_cast<size_t>(kMaxRows * h));
  for (int64_t t = 0; t < kMaxRows; ++t) {
    const std::vector<double> xt(x.begin() + t * h, x.begin() + (t + 1) * h);
    std::vector<double> y = Mlp(prefix + "shared_experts.", ffn.n_shared_experts * inter, xt);
    for (int64_t j = 0; j < k; ++j) {
      const std::vector<double> e = Mlp(prefix + "experts." + std::to_string(ids[t * k + j]) + ".", inter, xt);
      for (int64_t i = 0; i < h; ++i) y[i] += weights[t * k + j] * e[i];
    }
    std::copy(y.begin(), y.end(), want.begin() + t * h);
  }

  for (const int tp : {1, 2}) {
    std::vector<FeedForwardBlock> ranks;
    std::vector<std::unique_ptr<WeightLoader>> loaders;
    for (int rank = 0; rank < tp; ++rank) {
      loaders.push_back(std::make_unique<WeightLoader>(*checkpoint_, config_.quantization, specs,
                                                       StoredForms(config_, specs), tp, rank, backend));
      auto block = FeedForwardBlock::Load(ffn, prefix, DType::kF32, *loaders.back());
      ASSERT_TRUE(block.ok()) << block.status();
      EXPECT_TRUE(block->shared_joins_experts());
      EXPECT_EQ(block->shared_slots(), ffn.n_shared_experts) << "tp " << tp;
      ranks.push_back(std::move(*block));
    }
    auto ws = FeedForwardWorkspace::Create(ffn, tp, kMaxRows, backend);
    ASSERT_TRUE(ws.ok()) << ws.status();
    // 1 and 8 rows: joined; 9, 33 and 40: the shared MLP on its own.
    for (const int64_t t : {int64_t{1}, int64_t{8}, int64_t{9}, int64_t{33}, int64_t{40}}) {
      std::vector<double> got(static_cast<size_t>(t * h), 0.0);
      for (const FeedForwardBlock& block : ranks) {
        std::vector<float> part(static_cast<size_t>(t * h));
        ASSERT_TRUE(block
                        .Forward(TensorView(x.data(), DType::kF32, Shape{t, h}), *ws,
                                 TensorView(part.data(), DType::kF32, Shape{t, h}))
                        .ok());
        for (size_t i = 0; i < part.size(); ++i) got[i] += part[i];
      }
      double diff = 0, scale = 1e-30;
      for (size_t i = 0; i < got.size(); ++i) {
        diff = std::max(diff, std::fabs(got[i] - want[i]));
        scale = std::max(scale, std::fabs(want[i]));
      }
      EXPECT_LT(diff / scale, 1e-5) << "tp " << tp << ", rows " << t;
    }
  }
}

// The table Forward hands the routed experts' op: while the shared experts join (up to 8 rows) the
// routed experts and then the shared slices, flagged bf16_activations where the weights are bf16;
// past the join the routed experts alone, so that no flagged expert keeps a many-row call off a
// backend's faster path (CudaBackend runs a call naming a flagged expert per pair).
TEST_F(FeedForwardBlockTest, ExpertTableHoldsTheSharedSlicesOnlyWhileTheyJoin) {
  const FeedForwardConfig ffn = FeedForwardConfig::ForTargetLayer(config_, 1);
  const std::string prefix = "model.layers.1.mlp.";
  const std::vector<WeightSpec> specs = ffn.Weights(prefix);
  cpu::CpuBackend backend;
  const size_t routed = static_cast<size_t>(ffn.n_routed_experts);
  const size_t slots = static_cast<size_t>(ffn.n_shared_experts);
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    WeightLoader loader(*checkpoint_, config_.quantization, specs, StoredForms(config_, specs), 1, 0, backend);
    auto block = FeedForwardBlock::Load(ffn, prefix, dtype, loader);
    ASSERT_TRUE(block.ok()) << block.status();
    for (const int64_t rows : {int64_t{1}, int64_t{8}}) {
      EXPECT_TRUE(block->SharedJoins(rows)) << rows;
      const std::span<const ExpertWeights> table = block->DenseExpertsFor(rows);
      ASSERT_EQ(table.size(), routed + slots) << rows;
      for (size_t e = 0; e < table.size(); ++e) {
        EXPECT_EQ(table[e].bf16_activations, dtype == DType::kBF16 && e >= routed) << rows << " rows, expert " << e;
      }
    }
    for (const int64_t rows : {int64_t{9}, int64_t{40}}) {
      EXPECT_FALSE(block->SharedJoins(rows)) << rows;
      const std::span<const ExpertWeights> table = block->DenseExpertsFor(rows);
      ASSERT_EQ(table.size(), routed) << rows;
      for (const ExpertWeights& e : table) EXPECT_FALSE(e.bf16_activations) << rows;
    }
  }
}

// The table Forward itself hands MoeExperts (seen through a backend that records the calls) is
// DenseExpertsFor's: the shared slices, flagged in bf16, while they join; the routed experts alone
// past the join. The recorder reads the calls, not the values: it runs no expert (the CPU reference
// takes no bf16 experts), and it runs bf16 weights' Gemm with f32 activations kept (the one bf16
// form the reference takes).
class MoeExpertsRecorder : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  struct Call {
    int64_t rows;
    size_t experts;
    size_t flagged;
  };
  absl::Status MoeExperts(const TensorView& x, const TensorView& /*ids*/, const TensorView& /*weights*/,
                          std::span<const ExpertWeights> experts, const TensorView& /*out*/,
                          bool /*accumulate*/) override {
    const auto flagged = std::count_if(experts.begin(), experts.end(),
                                       [](const ExpertWeights& e) { return e.bf16_activations; });
    calls.push_back({x.dim(0), experts.size(), static_cast<size_t>(flagged)});
    return absl::OkStatus();
  }
  absl::Status Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                    const GemmOptions& options) override {
    GemmOptions widened = options;
    widened.keep_f32_activations = widened.keep_f32_activations || b.dtype() == DType::kBF16;
    return inner_.Gemm(a, b, c, widened);
  }
  std::vector<Call> calls;
};

TEST_F(FeedForwardBlockTest, ForwardPassesTheTableDenseExpertsForNames) {
  const int64_t h = config_.hidden_size;
  const FeedForwardConfig ffn = FeedForwardConfig::ForTargetLayer(config_, 1);
  const std::string prefix = "model.layers.1.mlp.";
  const std::vector<WeightSpec> specs = ffn.Weights(prefix);
  cpu::CpuBackend cpu;
  MoeExpertsRecorder backend(cpu);
  const size_t routed = static_cast<size_t>(ffn.n_routed_experts);
  const size_t slots = static_cast<size_t>(ffn.n_shared_experts);
  std::vector<float> x(static_cast<size_t>(kMaxRows * h));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::cos(0.29 * static_cast<double>(i)));
  std::vector<float> out(x.size());
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    WeightLoader loader(*checkpoint_, config_.quantization, specs, StoredForms(config_, specs), 1, 0, backend);
    auto block = FeedForwardBlock::Load(ffn, prefix, dtype, loader);
    ASSERT_TRUE(block.ok()) << block.status();
    auto ws = FeedForwardWorkspace::Create(ffn, 1, kMaxRows, backend);
    ASSERT_TRUE(ws.ok()) << ws.status();
    for (const int64_t rows : {int64_t{1}, int64_t{8}, int64_t{9}, int64_t{40}}) {
      backend.calls.clear();
      ASSERT_TRUE(block
                      ->Forward(TensorView(x.data(), DType::kF32, Shape{rows, h}), *ws,
                                TensorView(out.data(), DType::kF32, Shape{rows, h}))
                      .ok())
          << rows;
      ASSERT_EQ(backend.calls.size(), 1u) << rows << " rows";
      const MoeExpertsRecorder::Call& call = backend.calls[0];
      EXPECT_EQ(call.rows, rows);
      const bool join = block->SharedJoins(rows);  // 1 and 8 rows (the test above)
      EXPECT_EQ(call.experts, join ? routed + slots : routed) << rows << " rows";
      EXPECT_EQ(call.flagged, join && dtype == DType::kBF16 ? slots : 0) << rows << " rows";
    }
  }
}

}  // namespace
}  // namespace eagle3
