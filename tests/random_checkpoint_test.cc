// The DeepSeek-V2 weight schema, the hub config writer and the random checkpoint generator, checked
// through the public checkpoint reader.
#include "eagle3/testing/random_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/testing/deepseek_v2_config_writer.h"
#include "gtest/gtest.h"
#include "weight_spec_test_util.h"

namespace eagle3 {
namespace {

// V3-style routing (sigmoid + correction bias), plain q_proj, tied embeddings, and a vocab that
// needs padding at TP 8: the branches of the schema the demo config does not take.
constexpr char kV3Like[] = R"({
  "model_type": "deepseek_v3", "vocab_size": 515, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 8,
  "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 4,
  "topk_group": 2, "norm_topk_prob": true, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
  "v_head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
  "tie_word_embeddings": true, "eos_token_id": [1, 2]
})";

class RandomCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = DeepseekV2Config::FromJson(kV3Like, "kV3Like");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("random_ckpt_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  DeepseekV2Config config_;
  std::filesystem::path root_;
};

using testing::FindSpec;

TEST_F(RandomCheckpointTest, SchemaFollowsTheConfig) {
  const auto specs = DeepseekV2Weights(config_);
  // Layer 0 dense, layers 1-2 MoE with 8 experts + shared + router + bias; no lm_head (tied).
  EXPECT_NE(FindSpec(specs, "model.layers.0.mlp.gate_proj.weight"), nullptr);
  EXPECT_EQ(FindSpec(specs, "model.layers.0.mlp.gate.weight"), nullptr);
  const WeightSpec* bias = FindSpec(specs, "model.layers.2.mlp.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->shape, Shape{8});
  EXPECT_NE(FindSpec(specs, "model.layers.1.mlp.experts.7.down_proj.weight"), nullptr);
  EXPECT_EQ(FindSpec(specs, "model.layers.1.mlp.experts.8.down_proj.weight"), nullptr);
  EXPECT_EQ(FindSpec(specs, "lm_head.weight"), nullptr);
  const WeightSpec* q = FindSpec(specs, "model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (Shape{8 * 24, 64}));
  EXPECT_EQ(q->split, TpSplit::kRows);
  const WeightSpec* o = FindSpec(specs, "model.layers.0.self_attn.o_proj.weight");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(o->split, TpSplit::kColumns);
  const WeightSpec* kv_a = FindSpec(specs, "model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  ASSERT_NE(kv_a, nullptr);
  EXPECT_EQ(kv_a->shape, (Shape{32 + 8, 64}));
  EXPECT_EQ(kv_a->split, TpSplit::kReplicated);
  const WeightSpec* shared = FindSpec(specs, "model.layers.1.mlp.shared_experts.down_proj.weight");
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->shape, (Shape{64, 16}));
  const WeightSpec* embed = FindSpec(specs, "model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_TRUE(embed->vocab_padded);
  EXPECT_EQ(embed->ForRank(8, 3).pad_to_multiple, 512);
  // 1 embed + 3 × (2 norms + 5 attention) + 3 dense + 2 × (router + bias + 8×3 + 3) + final norm.
  EXPECT_EQ(specs.size(), 1u + 3 * 7 + 3 + 2 * (2 + 24 + 3) + 1);
}

TEST_F(RandomCheckpointTest, HubConfigRoundTrips) {
  auto back = DeepseekV2Config::FromJson(DeepseekV2ConfigToHubJson(config_), "written");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << DeepseekV2ConfigToHubJson(config_);
  EXPECT_EQ(back->model_type, config_.model_type);
  EXPECT_EQ(back->q_lora_rank, config_.q_lora_rank);
  EXPECT_EQ(back->n_routed_experts, config_.n_routed_experts);
  EXPECT_EQ(back->topk_method, config_.topk_method);
  EXPECT_EQ(back->scoring_func, config_.scoring_func);
  EXPECT_EQ(back->rope, config_.rope);
  EXPECT_EQ(back->eos_token_ids, config_.eos_token_ids);
  EXPECT_EQ(back->tie_word_embeddings, config_.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(back->SoftmaxScale(), config_.SoftmaxScale());
  EXPECT_EQ(DeepseekV2ConfigToHubJson(*back), DeepseekV2ConfigToHubJson(config_));
}

// Bytes of a tensor as stored, for bit-exact comparisons.
std::vector<char> Bytes(const Checkpoint& ckpt, const std::string& name) {
  auto view = ckpt.View(name);
  EXPECT_TRUE(view.ok()) << view.status();
  const char* p = static_cast<const char*>(view->data());
  return std::vector<char>(p, p + view->nbytes());
}

TEST_F(RandomCheckpointTest, ValuesDependOnSeedAndNameNotOnSharding) {
  RandomCheckpointOptions one;
  one.num_shards = 1;
  one.seed = 11;
  RandomCheckpointOptions three = one;
  three.num_shards = 3;
  RandomCheckpointOptions other_seed = three;
  other_seed.seed = 12;
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, (root_ / "one").string(), one).ok());
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, (root_ / "three").string(), three).ok());
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, (root_ / "seed").string(), other_seed).ok());
  EXPECT_TRUE(std::filesystem::exists(root_ / "three" / "model-00003-of-00003.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(root_ / "three" / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(root_ / "one" / "model.safetensors"));

  auto a = Checkpoint::Open((root_ / "one").string());
  auto b = Checkpoint::Open((root_ / "three").string());
  auto c = Checkpoint::Open((root_ / "seed").string());
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status() << b.status() << c.status();
  const auto specs = DeepseekV2Weights(config_);
  ASSERT_EQ((*b)->TensorNames().size(), specs.size());
  for (const auto& spec : specs) {
    ASSERT_TRUE((*b)->ExpectShape(spec.name, spec.shape).ok()) << spec.name;
    auto info = (*b)->Info(spec.name);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->dtype, DType::kBF16);
    EXPECT_EQ(Bytes(**a, spec.name), Bytes(**b, spec.name)) << spec.name;
    EXPECT_NE(Bytes(**b, spec.name), Bytes(**c, spec.name)) << spec.name;
  }
  auto parsed = DeepseekV2Config::FromFile((root_ / "three").string());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->vocab_size, 515);
}

// TP=8 slices of every tensor reassemble to the full tensor (vocab rows 515..1023 are zero padding).
TEST_F(RandomCheckpointTest, RankSlicesReassembleToTheFullTensor) {
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, root_.string(), {}).ok());
  auto ckpt = Checkpoint::Open(root_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const int tp = 8;
  for (const auto& spec : DeepseekV2Weights(config_)) {
    auto full = (*ckpt)->Read(spec.name, DType::kF32);
    ASSERT_TRUE(full.ok()) << full.status();
    const int64_t rows = spec.shape[0];
    const int64_t cols = spec.shape.rank() > 1 ? spec.shape[1] : 1;
    for (int r = 0; r < tp; ++r) {
      auto shard = (*ckpt)->ReadShard(spec.name, spec.ForRank(tp, r), DType::kF32);
      ASSERT_TRUE(shard.ok()) << spec.name << ": " << shard.status();
      const float* s = shard->data_as<float>();
      const float* f = full->data_as<float>();
      if (spec.split == TpSplit::kReplicated) {
        ASSERT_EQ(shard->numel(), full->numel());
        ASSERT_EQ(std::memcmp(s, f, full->nbytes()), 0) << spec.name;
      } else if (spec.split == TpSplit::kRows) {
        const int64_t per_rank = shard->dim(0);
        EXPECT_EQ(per_rank * tp, spec.vocab_padded ? 1024 : rows) << spec.name;
        for (int64_t i = 0; i < per_rank; ++i) {
          const int64_t row = r * per_rank + i;
          for (int64_t j = 0; j < cols; ++j) {
            ASSERT_EQ(s[i * cols + j], row < rows ? f[row * cols + j] : 0.0f) << spec.name << " " << row;
          }
        }
      } else {
        const int64_t per_rank = shard->dim(1);
        ASSERT_EQ(per_rank * tp, cols) << spec.name;
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < per_rank; ++j) {
            ASSERT_EQ(s[i * per_rank + j], f[i * cols + r * per_rank + j]) << spec.name;
          }
        }
      }
    }
  }
}

TEST_F(RandomCheckpointTest, BadOptionsAreRefused) {
  RandomCheckpointOptions options;
  options.dtype = DType::kI32;
  absl::Status st = WriteRandomDeepseekV2Checkpoint(config_, root_.string(), options);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("i32"), std::string::npos) << st;
  options = {};
  options.num_shards = 0;
  st = WriteRandomDeepseekV2Checkpoint(config_, root_.string(), options);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("num_shards"), std::string::npos) << st;
}

}  // namespace
}  // namespace eagle3
