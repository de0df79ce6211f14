// DraftModel's MLA and MTP kinds beyond their golden outputs: what they refuse when created (each
// message naming the key or tensor, the expected and the actual), and the kv_only step (the rows'
// latent cache entries alone) writing exactly what a full step writes.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_rewrite.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/draft_model.h"
#include "eagle3/safetensors.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/rank_threads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

std::string Golden(const std::string& name) { return std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + name; }

DraftModelOptions SmallOptions() {
  DraftModelOptions o;
  o.max_tokens_per_forward = 16;
  o.max_context_len = 16;
  o.page_size = 4;
  o.num_kv_pages = 4;
  return o;
}

// A copy of a single-file draft fixture in `dir`.
void CopyDraft(const std::string& name, const ScopedTempDir& dir) {
  for (const char* file : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(Golden(name) + "/" + file, dir.File(file));
  }
}

TEST(MlaDraftRefusalTest, ATargetOfAnotherWidth) {
  cpu::CpuBackend backend;
  // mla_draft_k25 reads 64-wide taps; v3_mtp's hidden states are 32 wide.
  auto model = DraftModel::Create(Golden("mla_draft_k25"), Golden("v3_mtp"), SmallOptions(), nullptr, &backend);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("target_hidden_size = 64"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("target hidden_size = 32"));
}

TEST(MlaDraftRefusalTest, TensorsOfTheWrongShape) {
  struct Case {
    std::string tensor;
    Shape shape;
    std::string needle;
  };
  // fc over two taps instead of three; q_a_proj and kv_a_proj_with_mqa reading H instead of the 2H
  // [embed | hidden] row.
  for (const Case& c : {Case{"fc.weight", Shape{64, 128}, "fc.weight"},
                        Case{"midlayer.self_attn.q_a_proj.weight", Shape{32, 64}, "midlayer.self_attn.q_a_proj.weight"},
                        Case{"midlayer.self_attn.kv_a_proj_with_mqa.weight", Shape{48, 64},
                             "midlayer.self_attn.kv_a_proj_with_mqa.weight"}}) {
    SCOPED_TRACE(c.tensor);
    ScopedTempDir dir;
    CopyDraft("mla_draft_k25", dir);
    Rewrite(dir.path(), [&](std::map<std::string, Tensor>& tensors) {
      tensors[c.tensor] = Filled(DType::kBF16, c.shape);
    });
    cpu::CpuBackend backend;
    auto model = DraftModel::Create(dir.path(), Golden("k25_int4"), SmallOptions(), nullptr, &backend);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(c.needle));
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(c.shape.ToString()));
  }
}

TEST(MlaDraftRefusalTest, AMissingTensorAndAnUnknownOne) {
  cpu::CpuBackend backend;
  {
    ScopedTempDir dir;
    CopyDraft("mla_draft_k25_eagle31", dir);
    Rewrite(dir.path(),
            [](std::map<std::string, Tensor>& tensors) { tensors.erase("layers.0.self_attn.kv_b_proj.weight"); });
    auto model = DraftModel::Create(dir.path(), Golden("k25_int4"), SmallOptions(), nullptr, &backend);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound) << model.status();
    EXPECT_THAT(std::string(model.status().message()), HasSubstr("layers.0.self_attn.kv_b_proj.weight"));
  }
  {
    ScopedTempDir dir;
    CopyDraft("mla_draft_k25", dir);
    Rewrite(dir.path(), [](std::map<std::string, Tensor>& tensors) {
      tensors.emplace("midlayer.self_attn.q_norm.weight", Filled(DType::kBF16, Shape{64}));
    });
    auto model = DraftModel::Create(dir.path(), Golden("k25_int4"), SmallOptions(), nullptr, &backend);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
    EXPECT_THAT(std::string(model.status().message()), HasSubstr("midlayer.self_attn.q_norm.weight"));
  }
}

TEST(MlaDraftRefusalTest, HeadsThatDoNotSplit) {
  // 8 heads over 16 ranks: refused before anything is read, naming the key.
  const absl::Status status = RunRankThreads(16, [](int rank, Communicator* comm) -> absl::Status {
    cpu::CpuBackend backend;
    DraftModelOptions o = SmallOptions();
    o.tp_size = 16;
    o.rank = rank;
    return DraftModel::Create(Golden("mla_draft_k25"), Golden("k25_int4"), o, comm, &backend).status();
  });
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("tp_size 16"));
}

// A V3-style target config (v3_mtp's) with `edit` applied, written with random weights into `dir`.
DeepseekV2Config WriteTarget(const ScopedTempDir& dir, bool write_mtp,
                             const std::function<void(DeepseekV2Config&)>& edit = [](DeepseekV2Config&) {}) {
  auto config = DeepseekV2Config::FromFile(Golden("v3_mtp"));
  EXPECT_TRUE(config.ok()) << config.status();
  edit(*config);
  RandomCheckpointOptions options;
  options.num_shards = 1;
  options.write_mtp = write_mtp;
  const absl::Status written = WriteRandomDeepseekV2Checkpoint(*config, dir.path(), options);
  EXPECT_TRUE(written.ok()) << written;
  return *config;
}

TEST(MtpDraftRefusalTest, ACheckpointWithoutTheModule) {
  ScopedTempDir dir;
  const DeepseekV2Config config = WriteTarget(dir, /*write_mtp=*/false);
  cpu::CpuBackend backend;
  auto model = DraftModel::CreateMtp(dir.path(), SmallOptions(), nullptr, &backend);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound) << model.status();
  const std::string layer = "model.layers." + std::to_string(config.num_hidden_layers) + ".";
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("has no MTP module 0"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr(layer + "enorm.weight"));
}

TEST(MtpDraftRefusalTest, AnIncompleteModule) {
  ScopedTempDir dir;
  const DeepseekV2Config config = WriteTarget(dir, /*write_mtp=*/true);
  const std::string missing =
      "model.layers." + std::to_string(config.num_hidden_layers) + ".mlp.experts.3.up_proj.weight";
  Rewrite(dir.path(), [&](std::map<std::string, Tensor>& tensors) { ASSERT_EQ(tensors.erase(missing), 1u); });
  cpu::CpuBackend backend;
  auto model = DraftModel::CreateMtp(dir.path(), SmallOptions(), nullptr, &backend);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound) << model.status();
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("is incomplete"));
  EXPECT_THAT(std::string(model.status().message()), HasSubstr(missing));
}

TEST(MtpDraftRefusalTest, AnEhProjThatDoesNotSplitByColumns) {
  // 4 heads and the MLPs split over 4 ranks, but eh_proj's 2 x 33 = 66 columns do not.
  ScopedTempDir dir;
  WriteTarget(dir, /*write_mtp=*/true, [](DeepseekV2Config& c) {
    c.hidden_size = 33;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 4;
  });
  const absl::Status status = RunRankThreads(4, [&](int rank, Communicator* comm) -> absl::Status {
    cpu::CpuBackend backend;
    DraftModelOptions o = SmallOptions();
    o.tp_size = 4;
    o.rank = rank;
    return DraftModel::CreateMtp(dir.path(), o, comm, &backend).status();
  });
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("2 x hidden_size = 66 is not divisible by tp_size 4"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("eh_proj.weight"));
}

// kv_only writes the rows' latent cache entries bit for bit as a full step: a row decoded after a
// kv_only pass over the prompt rows equals the same row decoded after a full pass.
void ExpectKvOnlyWritesWhatAFullStepWrites(const std::function<absl::StatusOr<std::unique_ptr<DraftModel>>(
                                               const DraftModelOptions&, Backend*)>& make) {
  const std::vector<int64_t> tokens = {3, 9, 27, 81, 43, 2, 7};
  const int64_t t = static_cast<int64_t>(tokens.size());
  const std::vector<int32_t> pages = {3, 0, 2, 1};
  std::vector<float> results[2];
  for (int kv_only = 0; kv_only < 2; ++kv_only) {
    cpu::CpuBackend backend;
    auto model = make(SmallOptions(), &backend);
    ASSERT_TRUE(model.ok()) << model.status();
    DraftModel& m = **model;
    const DraftShape& shape = m.shape();
    std::vector<float> input(static_cast<size_t>(t * shape.input_width));
    for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>((i * 37) % 11) * 0.1f - 0.5f;
    DraftSequenceInput in;
    in.tokens = tokens;
    in.page_table = pages;
    const TensorView rows(input.data(), DType::kF32, Shape{t, shape.input_width});
    if (kv_only) {
      DraftStepIO io;
      io.kv_only = true;
      ASSERT_TRUE(m.Stage(std::span<const DraftSequenceInput>(&in, 1), rows, /*from_target=*/true, io).ok());
      ASSERT_TRUE(m.Launch().ok());
    } else {
      std::vector<float> logits(static_cast<size_t>(shape.draft_vocab));
      std::vector<float> hidden(static_cast<size_t>(t * shape.hidden_size));
      ASSERT_TRUE(m.Forward(std::span<const DraftSequenceInput>(&in, 1), rows, /*from_target=*/true,
                            TensorView(logits.data(), DType::kF32, Shape{1, shape.draft_vocab}),
                            TensorView(hidden.data(), DType::kF32, Shape{t, shape.hidden_size}))
                      .ok());
    }
    std::vector<float> fed(static_cast<size_t>(shape.hidden_size), 0.25f);
    const int64_t next_token[] = {5};
    DraftSequenceInput next;
    next.tokens = next_token;
    next.page_table = pages;
    next.cache_len = t;
    std::vector<float>& out = results[kv_only];
    out.resize(static_cast<size_t>(shape.draft_vocab + shape.hidden_size));
    ASSERT_TRUE(m.Forward(std::span<const DraftSequenceInput>(&next, 1),
                          TensorView(fed.data(), DType::kF32, Shape{1, shape.hidden_size}), /*from_target=*/false,
                          TensorView(out.data(), DType::kF32, Shape{1, shape.draft_vocab}),
                          TensorView(out.data() + shape.draft_vocab, DType::kF32, Shape{1, shape.hidden_size}))
                    .ok());
  }
  EXPECT_EQ(results[0], results[1]);
}

TEST(DraftKindsTest, MlaKvOnlyWritesWhatAFullStepWrites) {
  ExpectKvOnlyWritesWhatAFullStepWrites([](const DraftModelOptions& o, Backend* backend) {
    return DraftModel::Create(Golden("mla_draft_k25"), Golden("k25_int4"), o, nullptr, backend);
  });
}

TEST(DraftKindsTest, MtpKvOnlyWritesWhatAFullStepWrites) {
  ExpectKvOnlyWritesWhatAFullStepWrites([](const DraftModelOptions& o, Backend* backend) {
    return DraftModel::CreateMtp(Golden("v3_mtp"), o, nullptr, backend);
  });
}

}  // namespace
}  // namespace eagle3
