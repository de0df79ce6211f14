// Hostile and broken inputs through the library API (issue 17): sizes that cannot fit are a
// ResourceExhausted Status naming the options (never std::bad_alloc, never an allocation of that
// size), contexts beyond max_position_embeddings are refused unless asked for, the writers refuse
// what they must not replace, and the pair check warns about taps listed out of layer order.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/detail/host_budget.h"
#include "eagle3/draft_model.h"
#include "eagle3/pair_check.h"
#include "eagle3/safetensors.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/target_model.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A small V2 target whose max_position_embeddings is `positions`.
std::string Config(int64_t positions) {
  return R"({
  "model_type": "deepseek_v2", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
  "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_attention_heads": 8,
  "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
  "routed_scaling_factor": 1.0, "scoring_func": "softmax", "topk_method": "greedy", "n_group": 1,
  "topk_group": 1, "norm_topk_prob": false, "first_k_dense_replace": 1, "moe_layer_freq": 1,
  "q_lora_rank": null, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
  "v_head_dim": 16, "rms_norm_eps": 1e-6, "max_position_embeddings": )" +
         std::to_string(positions) + R"(, "rope_theta": 10000, "rope_scaling": null,
  "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1})";
}

class HostileModelOptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = DeepseekV2Config::FromJson(Config(int64_t{1} << 40), "test config");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(config_, target_.path()).ok());
    RandomDraftCheckpointOptions draft;
    draft.num_attention_heads = 4;
    draft.num_key_value_heads = 2;
    draft.aux_layer_ids = {0, 1, 2};
    ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(config_, draft_.path(), draft).ok());
  }
  DeepseekV2Config config_;
  ScopedTempDir target_, draft_;
  cpu::CpuBackend backend_;
};

// A tree/context configuration whose host mask alone (max_tokens_per_forward x max_context_len
// bytes) no host holds: ResourceExhausted naming both options, before any allocation.
TEST_F(HostileModelOptionsTest, TargetBuffersBeyondMemoryAreResourceExhausted) {
  TargetModelOptions o;
  o.max_tokens_per_forward = int64_t{1} << 30;
  o.max_context_len = int64_t{1} << 30;
  o.num_kv_pages = 16;
  o.page_size = 16;
  auto model = TargetModel::Create(target_.path(), o, nullptr, &backend_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted) << model.status();
  EXPECT_THAT(model.status().message(),
              AllOf(HasSubstr("TargetModel"), HasSubstr("max_tokens_per_forward 1073741824"),
                    HasSubstr("max_context_len 1073741824"), HasSubstr("bytes of memory this process can use")));

  // Products beyond 64 bits are caught as such.
  o.max_tokens_per_forward = int64_t{1} << 40;
  o.max_context_len = int64_t{1} << 40;
  model = TargetModel::Create(target_.path(), o, nullptr, &backend_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted) << model.status();
  EXPECT_THAT(model.status().message(), HasSubstr("overflows 64-bit"));

  // A KV cache no host holds names the pages and the config's width.
  o = TargetModelOptions();
  o.max_tokens_per_forward = 16;
  o.max_context_len = 64;
  o.num_kv_pages = int64_t{1} << 36;
  o.page_size = 64;
  model = TargetModel::Create(target_.path(), o, nullptr, &backend_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted) << model.status();
  EXPECT_THAT(model.status().message(), AllOf(HasSubstr("num_kv_pages 68719476736"), HasSubstr("KV cache")));
}

TEST_F(HostileModelOptionsTest, CapacitiesBeyondTheirBoundAreInvalid) {
  TargetModelOptions o;
  o.max_context_len = (int64_t{1} << 40) + 1;
  auto model = TargetModel::Create(target_.path(), o, nullptr, &backend_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_THAT(model.status().message(), HasSubstr("max_context_len 1099511627777 is out of range [1, 1099511627776]"));
}

TEST_F(HostileModelOptionsTest, ReadThreadsOutOfRangeAreInvalid) {
  TargetModelOptions o;
  o.max_context_len = 64;
  o.read_threads = 65;
  auto model = TargetModel::Create(target_.path(), o, nullptr, &backend_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_THAT(model.status().message(), HasSubstr("TargetModel: read_threads 65 is out of range [0, 64]"));
  DraftModelOptions d;
  d.max_context_len = 64;
  d.read_threads = -1;
  auto draft = DraftModel::Create(draft_.path(), target_.path(), d, nullptr, &backend_);
  EXPECT_EQ(draft.status().code(), absl::StatusCode::kInvalidArgument) << draft.status();
  EXPECT_THAT(draft.status().message(), HasSubstr("read_threads -1 is out of range [0, 64]"));
  o.read_threads = 3;
  model = TargetModel::Create(target_.path(), o, nullptr, &backend_);
  EXPECT_TRUE(model.ok()) << model.status();
}

TEST_F(HostileModelOptionsTest, DraftBuffersBeyondMemoryAreResourceExhausted) {
  DraftModelOptions o;
  o.max_tokens_per_forward = int64_t{1} << 30;
  o.max_context_len = int64_t{1} << 30;
  o.num_kv_pages = 16;
  o.page_size = 16;
  auto model = DraftModel::Create(draft_.path(), target_.path(), o, nullptr, &backend_);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kResourceExhausted) << model.status();
  EXPECT_THAT(model.status().message(), AllOf(HasSubstr("DraftModel"), HasSubstr("max_tokens_per_forward 1073741824"),
                                              HasSubstr("max_context_len 1073741824")));
}

// max_context_len beyond max_position_embeddings: refused naming both, unless allow_long_context.
TEST(HostileTargetOptionsTest, ContextBeyondMaxPositionEmbeddingsNeedsAllowLongContext) {
  ScopedTempDir dir;
  auto config = DeepseekV2Config::FromJson(Config(64), "test config");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(*config, dir.path()).ok());
  cpu::CpuBackend backend;
  TargetModelOptions o;
  o.max_tokens_per_forward = 8;
  o.max_context_len = 65;
  o.num_kv_pages = 8;
  o.page_size = 16;
  auto refused = TargetModel::Create(dir.path(), o, nullptr, &backend);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("max_context_len 65"), HasSubstr("max_position_embeddings 64"),
                    HasSubstr("allow_long_context")));
  o.max_context_len = 64;
  EXPECT_TRUE(TargetModel::Create(dir.path(), o, nullptr, &backend).ok());
  o.max_context_len = 65;
  o.allow_long_context = true;
  auto allowed = TargetModel::Create(dir.path(), o, nullptr, &backend);
  EXPECT_TRUE(allowed.ok()) << allowed.status();
}

TEST(HostByteBudgetTest, NamesTheLargestBufferAndCatchesOverflow) {
  HostByteBudget budget("who", /*limit=*/1000);
  budget.Add("small", {10, 10}, 4);
  EXPECT_TRUE(budget.Check().ok());
  budget.Add("big (a x b)", {30, 30}, 1);
  EXPECT_EQ(budget.total(), 1300u);
  const absl::Status over = budget.Check();
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), AllOf(HasSubstr("who: "), HasSubstr("need 1300 bytes"), HasSubstr("the 1000 bytes"),
                                    HasSubstr("big (a x b) = 900 bytes")));
  HostByteBudget overflow("who", 0);
  overflow.Add("huge", {int64_t{1} << 40, int64_t{1} << 40}, 4);
  EXPECT_THAT(overflow.Check().message(), HasSubstr("who: huge overflows 64-bit byte counts"));
  EXPECT_GT(HostMemoryLimit(), 0u);
}

TEST(HostByteBudgetTest, AssignHostVectorReportsInsteadOfThrowing) {
  std::vector<float> v;
  const absl::Status status = AssignHostVector(v, int64_t{1} << 62, 0.0f, "the thing");
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("the thing"));
  EXPECT_TRUE(AssignHostVector(v, 3, 1.0f, "small").ok());
  EXPECT_EQ(v.size(), 3u);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(OutputFileTest, RefusesNonRegularTargets) {
  ScopedTempDir dir;
  const absl::Status device = WriteFileAtomically("/dev/null", "x");
  EXPECT_EQ(device.code(), absl::StatusCode::kInvalidArgument) << device;
  EXPECT_THAT(device.message(), AllOf(HasSubstr("'/dev/null'"), HasSubstr("is a character device")));
  struct stat st = {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << "the device node is left alone";

  const absl::Status directory = WriteSafetensors(dir.path(), {});
  EXPECT_EQ(directory.code(), absl::StatusCode::kInvalidArgument) << directory;
  EXPECT_THAT(directory.message(), HasSubstr("is a directory"));

  const std::string fifo = dir.File("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const absl::Status pipe = WriteFileAtomically(fifo, "x");
  EXPECT_THAT(pipe.message(), HasSubstr("is a FIFO"));
}

TEST(OutputFileTest, RefusesReadOnlyTargetsAndKeepsTheirContents) {
  ScopedTempDir dir;
  const std::string path = dir.File("kept.json");
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  const absl::Status status = WriteFileAtomically(path, "new");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr(path), HasSubstr("is read-only")));
  EXPECT_EQ(ReadFile(path), "old");
  struct stat st = {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
}

TEST(OutputFileTest, KeepsTheModeOfAReplacedFile) {
  ScopedTempDir dir;
  const std::string path = dir.File("mode.json");
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  ASSERT_TRUE(WriteFileAtomically(path, "new").ok());
  EXPECT_EQ(ReadFile(path), "new");
  struct stat st = {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

// The output naming an input (itself, a hard link to it, or a file of an input directory) is
// refused and the input kept.
TEST(OutputFileTest, RefusesTheInputsThemselves) {
  ScopedTempDir dir;
  const std::string checkpoint = dir.File("ckpt");
  fs::create_directory(checkpoint);
  const std::string shard = checkpoint + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(shard, {}).ok());
  const std::string before = ReadFile(shard);
  const std::string inputs[] = {checkpoint};
  float value = 1;
  const NamedTensor tensor{"x", TensorView(&value, DType::kF32, Shape{1})};
  for (const std::string& spelling : {shard, checkpoint + "/./model.safetensors"}) {
    const absl::Status status = WriteSafetensors(spelling, {&tensor, 1}, {}, inputs);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("is one of the input files"));
  }
  const std::string link = dir.File("hard_link.safetensors");
  ASSERT_EQ(::link(shard.c_str(), link.c_str()), 0);
  const std::string file_inputs[] = {shard};
  EXPECT_THAT(WriteSafetensors(link, {&tensor, 1}, {}, file_inputs).message(), HasSubstr("is one of the input files"));
  EXPECT_EQ(ReadFile(shard), before);
  // Anything else is written.
  EXPECT_TRUE(WriteSafetensors(dir.File("out.safetensors"), {&tensor, 1}, {}, inputs).ok());
}

// A legal 255-byte name works (the temporary's name is short and fixed), no temporary is left, and
// a final symbolic link is kept while the file it names is replaced.
TEST(OutputFileTest, LongNamesAndSymbolicLinks) {
  ScopedTempDir dir;
  const std::string name(255, 'n');
  ASSERT_TRUE(WriteFileAtomically(dir.File(name), "long").ok());
  EXPECT_EQ(ReadFile(dir.File(name)), "long");
  const std::string target = dir.File("target.json");
  ASSERT_TRUE(WriteFileAtomically(target, "old").ok());
  fs::create_symlink(target, dir.File("link.json"));
  ASSERT_TRUE(WriteFileAtomically(dir.File("link.json"), "new").ok());
  EXPECT_TRUE(fs::is_symlink(dir.File("link.json")));
  EXPECT_EQ(ReadFile(target), "new");
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".eagle3-"), std::string::npos) << entry.path();
    ++entries;
  }
  EXPECT_EQ(entries, 3);
}

// Aux ids listed out of layer order: still a valid pair, with a warning saying which order the draft
// receives and which order SGLang / vLLM capture.
TEST(PairCheckTest, WarnsAboutAuxIdsOutOfLayerOrder) {
  ScopedTempDir target, draft;
  auto config = DeepseekV2Config::FromJson(Config(4096), "test config");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(*config, target.path()).ok());
  RandomDraftCheckpointOptions options;
  options.num_attention_heads = 4;
  options.num_key_value_heads = 2;
  options.aux_layer_ids = {2, 0, 1};
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, draft.path(), options).ok());
  const PairReport report = CheckDraftPair(target.path(), draft.path());
  EXPECT_TRUE(report.ok()) << (report.problems.empty() ? "" : report.problems[0]);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_THAT(report.warnings[0], AllOf(HasSubstr("[2, 0, 1] are not in layer order"),
                                        HasSubstr("receives boundaries [3, 1, 2] in that order"),
                                        HasSubstr("SGLang and vLLM capture"), HasSubstr("[1, 2, 3]")));
  options.aux_layer_ids = {0, 1, 2};
  ScopedTempDir ordered;
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, ordered.path(), options).ok());
  EXPECT_TRUE(CheckDraftPair(target.path(), ordered.path()).warnings.empty());
}

}  // namespace
}  // namespace eagle3
