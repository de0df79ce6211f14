// The layer blocks on their own (CPU reference backend), in the shape only the MLA EAGLE-3 draft
// gives them: an MlaBlock whose q_a / kv_a take a 2H input loads its checkpoint, refuses an H-wide
// one by name, runs its batched and per-sequence paths to the same result, and its TP ranks' o_proj
// partial sums add up to the TP1 output with the latent rows replicated bit for bit. q_a (or a plain
// q_proj) and kv_a stacked into one weight give what the two weights give, f32 and FP8, and a pair
// that cannot stack stays two weights. Also: the blocks' tensor lists equal the target layer's
// (DeepseekDecoderLayerWeights), and bad shapes, workspaces and schema names are refused.
#include "mla_block.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "batch_staging.h"
#include "feed_forward_block.h"
#include "weight_loader.h"
#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/mla_attention_weights.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHidden = 32;
constexpr char kPrefix[] = "layers.0.self_attn.";

// An MLA block of 4 heads reading `input_width` columns and writing kHidden; a plain q_proj when
// q_lora is 0.
MlaAttentionConfig Attention(int64_t input_width, int64_t q_lora = 16) {
  MlaAttentionConfig a;
  a.input_width = input_width;
  a.output_width = kHidden;
  a.num_heads = 4;
  if (q_lora > 0) a.q_lora_rank = q_lora;
  a.kv_lora_rank = 16;
  a.qk_nope_head_dim = 8;
  a.qk_rope_head_dim = 4;
  a.v_head_dim = 8;
  a.rms_norm_eps = 1e-6;
  a.rope.theta = 10000;
  return a;
}

// n deterministic values uniform in [center - scale, center + scale).
std::vector<float> Values(int64_t n, uint64_t seed, float center, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = center + scale * (static_cast<float>((s >> 40) & 0xFFFFFF) / 16777216.0f * 2 - 1);
  }
  return v;
}

// Every tensor of `specs` in dir/model.safetensors: norms f32 around 1, matrices ~ 1/sqrt(in), f32
// or, where `forms` says kFp8Block, FP8 codes with their block scales under `quantization`.
void WriteCheckpoint(const std::string& dir, const std::vector<WeightSpec>& specs,
                     const std::vector<StoredForm>& forms = {}, const QuantizationConfig& quantization = {}) {
  std::vector<std::vector<float>> data;
  data.reserve(specs.size());
  std::vector<Tensor> stored;
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Shape& shape = specs[i].shape;
    if (!forms.empty() && forms[i] == StoredForm::kFp8Block) {
      auto weight = RandomQuantizedWeightOf(specs[i], StoredForm::kFp8Block, quantization, i + 1);
      ASSERT_TRUE(weight.ok()) << weight.status();
      for (auto& [name, tensor] : weight->stored) {
        tensors.push_back(NamedTensor{name, tensor.view()});
        stored.push_back(std::move(tensor));
      }
      continue;
    }
    const bool norm = shape.rank() == 1;
    const float scale = norm ? 0.1f : 1.0f / std::sqrt(static_cast<float>(shape[1]));
    data.push_back(Values(shape.numel(), i + 1, norm ? 1.0f : 0.0f, scale));
    tensors.push_back(NamedTensor{specs[i].name, TensorView(data.back().data(), DType::kF32, shape)});
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
}

WeightLoader PlainLoader(const Checkpoint& checkpoint, const std::vector<WeightSpec>& schema, int tp, int rank,
                         Backend& backend) {
  return WeightLoader(checkpoint, QuantizationConfig{}, schema, std::vector<StoredForm>(schema.size(), StoredForm::kPlain),
                      tp, rank, backend);
}

// Every matrix of `specs` (q_a, q_b or q_proj, kv_a, kv_b, o_proj) FP8 block-quantized; the norms
// plain.
std::vector<StoredForm> Fp8Forms(const std::vector<WeightSpec>& specs) {
  std::vector<StoredForm> forms;
  for (const WeightSpec& spec : specs) {
    forms.push_back(spec.shape.rank() == 2 ? StoredForm::kFp8Block : StoredForm::kPlain);
  }
  return forms;
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

TEST(MlaBlockTest, TwoHWideBlockRefusesHWideWeightsByName) {
  for (int64_t q_lora : {16, 0}) {
    ScopedTempDir dir;
    WriteCheckpoint(dir.path(), MlaAttentionWeights(Attention(kHidden, q_lora), kPrefix));
    auto checkpoint = Checkpoint::Open(dir.path());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    cpu::CpuBackend backend;
    const MlaAttentionConfig wide = Attention(2 * kHidden, q_lora);
    WeightLoader loader = PlainLoader(**checkpoint, MlaAttentionWeights(wide, kPrefix), 1, 0, backend);
    const auto block = MlaBlock::Load(wide, 1, kPrefix, DType::kF32, loader);
    ASSERT_FALSE(block.ok());
    EXPECT_EQ(block.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(block.status().message());
    if (q_lora > 0) {
      EXPECT_THAT(message, HasSubstr("layers.0.self_attn.q_a_proj.weight"));
      EXPECT_THAT(message, HasSubstr("has shape [16, 32], expected [16, 64]"));
    } else {
      EXPECT_THAT(message, HasSubstr("layers.0.self_attn.q_proj.weight"));
      EXPECT_THAT(message, HasSubstr("has shape [48, 32], expected [48, 64]"));
    }
  }
}

// Two sequences on 8 pages of 2 rows, run through two steps: a prefill (5 and 3 new rows), then 1
// and 2 more rows over their cached prefixes.
class MlaBlockRunTest : public ::testing::Test {
 protected:
  static constexpr int64_t kPages = 8, kPageSize = 2, kMaxTokens = 8, kMaxContext = 6;

  enum class Path { kBatched, kAbsorbed, kNonAbsorbed };

  struct Output {
    std::vector<float> out;    // both steps' [T, kHidden] outputs, concatenated
    std::vector<float> cache;  // the latent cache after them
    bool stacked = false;      // MlaBlock::input_projections_stacked()
  };

  void SetUp() override { Write(Attention(2 * kHidden), /*fp8=*/false); }

  // A checkpoint of `config` for Run: f32, or every matrix FP8 in DeepSeek-V3's 128 x 128 blocks
  // (loaded kept quantized, as CudaBackend keeps it).
  void Write(const MlaAttentionConfig& config, bool fp8) {
    config_ = config;
    const std::vector<WeightSpec> specs = MlaAttentionWeights(config_, kPrefix);
    forms_ = fp8 ? Fp8Forms(specs) : std::vector<StoredForm>(specs.size(), StoredForm::kPlain);
    quantization_ = fp8 ? DeepseekV3Fp8Quantization() : QuantizationConfig{};
    dir_ = std::make_unique<ScopedTempDir>();
    WriteCheckpoint(dir_->path(), specs, forms_, quantization_);
    auto checkpoint = Checkpoint::Open(dir_->path());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = std::move(*checkpoint);
  }

  Output Run(Path path, int tp, int rank,
             MlaBlock::InputProjections projections = MlaBlock::InputProjections::kStackWherePossible) {
    Output result;
    cpu::CpuBackend backend;
    WeightLoader loader(*checkpoint_, quantization_, MlaAttentionWeights(config_, kPrefix), forms_, tp, rank, backend);
    loader.set_keep_quantized(true);
    auto block = MlaBlock::Load(config_, tp, kPrefix, DType::kF32, loader, projections);
    EXPECT_TRUE(block.ok()) << block.status();
    if (block.ok()) result.stacked = block->input_projections_stacked();
    auto ws = MlaWorkspace::Create(config_, tp, kMaxTokens, kMaxContext, backend, "test");
    EXPECT_TRUE(ws.ok()) << ws.status();
    auto cache = Tensor::Zeros(DType::kF32, Shape{kPages, kPageSize, config_.latent_cache_width()});
    auto slot_iota = DeviceIota(kPages * kPageSize, backend);
    auto page_table = Tensor::Empty(DType::kI32, Shape{kPages});
    if (!block.ok() || !ws.ok() || !cache.ok() || !slot_iota.ok() || !page_table.ok()) return result;
    const std::vector<std::vector<int32_t>> pages = {{5, 1, 6}, {0, 3, 7}};
    const std::vector<std::vector<int64_t>> steps = {{5, 3}, {1, 2}};  // new rows per sequence
    std::vector<int64_t> cache_len = {0, 0};
    uint64_t seed = 100;
    for (const std::vector<int64_t>& n : steps) {
      const int64_t t = n[0] + n[1];
      std::vector<int64_t> positions, flat_slots, seq_slots;
      std::vector<int32_t> tables, q_start = {0}, kv_len;
      std::vector<std::vector<int64_t>> tokens;
      std::vector<SequenceInput> sequences;
      for (size_t b = 0; b < 2; ++b) {
        for (int64_t i = 0; i < n[b]; ++i) {
          const int64_t p = cache_len[b] + i;
          positions.push_back(p);
          seq_slots.push_back(p);
          flat_slots.push_back(pages[b][static_cast<size_t>(p / kPageSize)] * kPageSize + p % kPageSize);
        }
        tables.insert(tables.end(), pages[b].begin(), pages[b].end());
        q_start.push_back(q_start.back() + static_cast<int32_t>(n[b]));
        kv_len.push_back(static_cast<int32_t>(cache_len[b] + n[b]));
        tokens.emplace_back(static_cast<size_t>(n[b]), 0);
      }
      for (size_t b = 0; b < 2; ++b) {
        SequenceInput in;
        in.tokens = tokens[b];
        in.page_table = pages[b];
        in.cache_len = cache_len[b];
        sequences.push_back(in);
      }
      std::vector<float> x = Values(t * config_.input_width, seed++, 0.0f, 1.0f);
      std::vector<float> out(static_cast<size_t>(t * kHidden));
      const TensorView x_view(x.data(), DType::kF32, Shape{t, config_.input_width});
      const TensorView out_view(out.data(), DType::kF32, Shape{t, kHidden});
      const TensorView pos_view(positions.data(), DType::kI64, Shape{t});
      absl::Status status;
      if (path == Path::kBatched) {
        MlaBatchedStep step;
        step.positions = pos_view;
        step.slots = TensorView(flat_slots.data(), DType::kI64, Shape{t});
        step.slot_iota = *slot_iota;
        step.page_tables = TensorView(tables.data(), DType::kI32, Shape{2, 3});
        step.q_start = TensorView(q_start.data(), DType::kI32, Shape{3});
        step.kv_len = TensorView(kv_len.data(), DType::kI32, Shape{2});
        step.max_kv_len = kMaxContext;
        status = block->ForwardBatched(x_view, step, *cache, *ws, out_view);
      } else {
        MlaSequenceStep step;
        step.positions = pos_view;
        step.slots = TensorView(seq_slots.data(), DType::kI64, Shape{t});
        step.sequences = sequences;
        step.page_size = kPageSize;
        step.path = path == Path::kAbsorbed ? AttentionPath::kAbsorbed : AttentionPath::kNonAbsorbed;
        step.page_table = *page_table;
        status = block->ForwardPerSequence(x_view, step, *cache, *ws, out_view);
      }
      EXPECT_TRUE(status.ok()) << status;
      result.out.insert(result.out.end(), out.begin(), out.end());
      for (size_t b = 0; b < 2; ++b) cache_len[b] += n[b];
    }
    result.cache.assign(cache->data_as<float>(), cache->data_as<float>() + cache->numel());
    return result;
  }

  // Every path's outputs and cache with q_a (or q_proj) and kv_a stacked where they can be equal those
  // with two weights bit for bit, at TP 1 and on both ranks of TP 2 (q_a and kv_a are replicated:
  // every rank stacks the whole pair; q_proj is the rank's heads); `stacks`: whether the block stacks
  // them.
  void ExpectStackedEqualsApart(bool stacks) {
    for (const Path path : {Path::kBatched, Path::kAbsorbed, Path::kNonAbsorbed}) {
      for (const auto [tp, rank] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{2, 1}}) {
        const std::string what = "path " + std::to_string(static_cast<int>(path)) + ", tp " + std::to_string(tp) +
                                 " rank " + std::to_string(rank);
        const Output stacked = Run(path, tp, rank);
        const Output apart = Run(path, tp, rank, MlaBlock::InputProjections::kApart);
        EXPECT_EQ(stacked.stacked, stacks) << what;
        EXPECT_FALSE(apart.stacked) << what;
        ASSERT_EQ(stacked.out.size(), static_cast<size_t>(11 * kHidden)) << what;
        EXPECT_GT(*std::max_element(stacked.out.begin(), stacked.out.end()), 0.0f) << what;
        EXPECT_EQ(stacked.out, apart.out) << what;
        EXPECT_EQ(stacked.cache, apart.cache) << what;
      }
    }
  }

  MlaAttentionConfig config_;
  std::vector<StoredForm> forms_;
  QuantizationConfig quantization_;
  std::unique_ptr<ScopedTempDir> dir_;
  std::unique_ptr<Checkpoint> checkpoint_;
};

TEST_F(MlaBlockRunTest, PathsAgreeAndRanksSumToTp1) {
  const Output batched = Run(Path::kBatched, 1, 0);
  ASSERT_EQ(batched.out.size(), static_cast<size_t>(11 * kHidden));
  EXPECT_GT(*std::max_element(batched.out.begin(), batched.out.end()), 0.0f);
  const Output absorbed = Run(Path::kAbsorbed, 1, 0);
  const Output reconstructed = Run(Path::kNonAbsorbed, 1, 0);
  EXPECT_LT(RelDiff(absorbed.out, batched.out), 1e-5);
  EXPECT_LT(RelDiff(reconstructed.out, batched.out), 1e-4);
  // Every path writes the same latent rows: kv_a_layernorm(c) and k_pe rotated alike.
  EXPECT_EQ(absorbed.cache, batched.cache);
  EXPECT_EQ(reconstructed.cache, batched.cache);
  // TP 2: each rank's heads give a partial sum of o_proj; the latent rows are every rank's.
  const Output rank0 = Run(Path::kBatched, 2, 0);
  const Output rank1 = Run(Path::kBatched, 2, 1);
  ASSERT_EQ(rank0.out.size(), batched.out.size());
  ASSERT_EQ(rank1.out.size(), batched.out.size());
  std::vector<float> sum(batched.out.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = rank0.out[i] + rank1.out[i];
  EXPECT_LT(RelDiff(sum, batched.out), 1e-5);
  EXPECT_GT(RelDiff(rank0.out, batched.out), 1e-3);  // a rank alone is not the whole sum
  EXPECT_EQ(rank0.cache, batched.cache);
  EXPECT_EQ(rank1.cache, batched.cache);
}

TEST_F(MlaBlockRunTest, StackedInputProjectionsGiveTheTwoWeightsOutputs) {
  ExpectStackedEqualsApart(/*stacks=*/true);
}

// FP8 kept quantized: a q_a of one whole 128-row block stacks over kv_a's partial block (the scale
// rows of both, in order); a q_a of 16 rows ends inside its block, so the pair stays two weights.
TEST_F(MlaBlockRunTest, Fp8InputProjectionsStackOnlyOverWholeBlocks) {
  Write(Attention(2 * kHidden, /*q_lora=*/128), /*fp8=*/true);
  ExpectStackedEqualsApart(/*stacks=*/true);
  Write(Attention(2 * kHidden, /*q_lora=*/16), /*fp8=*/true);
  ExpectStackedEqualsApart(/*stacks=*/false);
}

// A plain q_proj (DeepSeek-V2-Lite) stacks with kv_a the same way ([q_proj; kv_a]: q lands before
// the cache row, in the row the absorbed queries follow), and the paths still agree.
TEST_F(MlaBlockRunTest, WithoutQLoraQProjStacksWithKvA) {
  Write(Attention(2 * kHidden, /*q_lora=*/0), /*fp8=*/false);
  ExpectStackedEqualsApart(/*stacks=*/true);
  const Output batched = Run(Path::kBatched, 1, 0);
  EXPECT_LT(RelDiff(Run(Path::kAbsorbed, 1, 0).out, batched.out), 1e-5);
  EXPECT_LT(RelDiff(Run(Path::kNonAbsorbed, 1, 0).out, batched.out), 1e-4);
}

TEST_F(MlaBlockRunTest, RefusesBadShapesAndWorkspaces) {
  cpu::CpuBackend backend;
  WeightLoader loader = PlainLoader(*checkpoint_, MlaAttentionWeights(config_, kPrefix), 1, 0, backend);
  auto block = MlaBlock::Load(config_, 1, kPrefix, DType::kF32, loader);
  ASSERT_TRUE(block.ok()) << block.status();
  auto ws = MlaWorkspace::Create(config_, 1, kMaxTokens, kMaxContext, backend, "test");
  ASSERT_TRUE(ws.ok()) << ws.status();
  auto narrow_ws = MlaWorkspace::Create(Attention(kHidden), 1, kMaxTokens, kMaxContext, backend, "test");
  ASSERT_TRUE(narrow_ws.ok()) << narrow_ws.status();
  auto cache = Tensor::Zeros(DType::kF32, Shape{kPages, kPageSize, config_.latent_cache_width()});
  ASSERT_TRUE(cache.ok());
  std::vector<float> x(static_cast<size_t>((kMaxTokens + 1) * 2 * kHidden));
  std::vector<float> out(static_cast<size_t>((kMaxTokens + 1) * kHidden));
  const TensorView out1(out.data(), DType::kF32, Shape{1, kHidden});
  const MlaBatchedStep step;  // never reached: the shapes are checked first

  // x as wide as a target layer's input.
  absl::Status st = block->ForwardBatched(TensorView(x.data(), DType::kF32, Shape{1, kHidden}), step, *cache, *ws, out1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("input_width 64"));
  // More rows than the workspace holds.
  st = block->ForwardBatched(TensorView(x.data(), DType::kF32, Shape{kMaxTokens + 1, 2 * kHidden}), step, *cache, *ws,
                             TensorView(out.data(), DType::kF32, Shape{kMaxTokens + 1, kHidden}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("T <= 8"));
  // A workspace sized for an H-wide block.
  MlaSequenceStep seq_step;
  st = block->ForwardPerSequence(TensorView(x.data(), DType::kF32, Shape{1, 2 * kHidden}), seq_step, *cache,
                                 *narrow_ws, out1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("workspace was sized for another attention"));
}

TEST(WeightLoaderTest, RefusesTensorsOutsideTheSchema) {
  ScopedTempDir dir;
  const std::vector<WeightSpec> specs = MlaAttentionWeights(Attention(kHidden), kPrefix);
  WriteCheckpoint(dir.path(), specs);
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  cpu::CpuBackend backend;
  WeightLoader loader = PlainLoader(**checkpoint, specs, 1, 0, backend);
  EXPECT_TRUE(loader.Load(specs[0], DType::kF32).ok());
  auto missing = loader.Load("layers.0.self_attn.k_proj.weight", DType::kF32);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(missing.status().message(), HasSubstr("'layers.0.self_attn.k_proj.weight' is not in the model"));
  // A block describing a listed tensor with another shape than the model checked.
  WeightSpec other = specs[0];
  other.shape = Shape{16, 2 * kHidden};
  auto mismatch = loader.Load(other, DType::kF32);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(mismatch.status().message(), HasSubstr("the model's weight schema lists [16, 32]"));
}

// DeepSeek-V3-style MoE (noaux_tc: router bias; a shared expert) after one dense layer; and V2's
// routing, which has no bias, with two shared experts.
constexpr char kV3Config[] = R"({
  "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 8,
  "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 4,
  "topk_group": 2, "norm_topk_prob": true, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
  "v_head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000,
  "rope_scaling": null, "tie_word_embeddings": true, "eos_token_id": 1
})";
constexpr char kV2Config[] = R"({
  "model_type": "deepseek_v2", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 8,
  "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 3,
  "routed_scaling_factor": 2.0, "scoring_func": "softmax", "topk_method": "group_limited_greedy",
  "n_group": 4, "topk_group": 2, "norm_topk_prob": false, "first_k_dense_replace": 1,
  "moe_layer_freq": 1, "q_lora_rank": 48, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
  "qk_rope_head_dim": 8, "v_head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
  "rope_theta": 10000, "rope_scaling": null, "tie_word_embeddings": false, "eos_token_id": 1
})";

TEST(FeedForwardBlockTest, WeightsAreTheTargetLayersMlp) {
  for (const char* json : {kV3Config, kV2Config}) {
    auto config = DeepseekV2Config::FromJson(json, "test config");
    ASSERT_TRUE(config.ok()) << config.status();
    for (int64_t layer : {0, 1}) {
      const std::vector<WeightSpec> all = DeepseekDecoderLayerWeights(*config, layer);
      // The layer's list: the two norms, the attention, then the MLP.
      const size_t mlp_start = 2 + MlaAttentionWeights(MlaAttentionConfig::ForTarget(*config), "").size();
      const std::string prefix = "model.layers." + std::to_string(layer) + ".mlp.";
      const std::vector<WeightSpec> mlp = FeedForwardConfig::ForTargetLayer(*config, layer).Weights(prefix);
      ASSERT_EQ(mlp.size(), all.size() - mlp_start) << "layer " << layer;
      EXPECT_EQ(mlp.size() > 3, layer == 1);
      for (size_t i = 0; i < mlp.size(); ++i) {
        const WeightSpec& want = all[mlp_start + i];
        EXPECT_EQ(mlp[i].name, want.name);
        EXPECT_EQ(mlp[i].shape, want.shape) << want.name;
        EXPECT_EQ(mlp[i].split, want.split) << want.name;
        EXPECT_EQ(mlp[i].vocab_padded, want.vocab_padded) << want.name;
      }
    }
  }
}

TEST(FeedForwardBlockTest, RefusesBadShapesAndWorkspaces) {
  ScopedTempDir dir;
  const FeedForwardConfig config = FeedForwardConfig::Dense(kHidden, 48);
  const std::vector<WeightSpec> specs = config.Weights("layers.0.mlp.");
  WriteCheckpoint(dir.path(), specs);
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  cpu::CpuBackend backend;
  WeightLoader loader = PlainLoader(**checkpoint, specs, 1, 0, backend);
  auto block = FeedForwardBlock::Load(config, "layers.0.mlp.", DType::kF32, loader);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_FALSE(block->moe());
  auto ws = FeedForwardWorkspace::Create(config, 1, 4, backend);
  auto narrow = FeedForwardWorkspace::Create(FeedForwardConfig::Dense(kHidden, 16), 1, 4, backend);
  ASSERT_TRUE(ws.ok() && narrow.ok());
  std::vector<float> x(5 * kHidden, 0.5f), out(5 * kHidden);
  const TensorView x2(x.data(), DType::kF32, Shape{2, kHidden}), out2(out.data(), DType::kF32, Shape{2, kHidden});
  EXPECT_TRUE(block->Forward(x2, *ws, out2).ok());
  absl::Status st = block->Forward(x2, *narrow, out2);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("intermediate width of 16, the block needs 48"));
  st = block->Forward(TensorView(x.data(), DType::kF32, Shape{5, kHidden}), *ws,
                      TensorView(out.data(), DType::kF32, Shape{5, kHidden}));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("T <= 4"));
}

}  // namespace
}  // namespace eagle3
