// Hostile and broken model files: every load returns a Status (no hang, no signal, no exception,
// no silent acceptance) whose message names the file, tensor or key and the expected and actual
// values. Covers pathological-but-valid JSON (parse time linear, memory bounded by stated limits),
// files that are not what they seem (FIFOs, directories, unreadable files, files changed while
// loading), and target checkpoints holding tensors the model does not use.
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/eagle3_draft_config.h"
#include "eagle3/safetensors.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/tools/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "json_fields.h"
#include "nlohmann/json.hpp"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Json = nlohmann::json;

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string LengthPrefix(uint64_t n) {
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>(n >> (8 * i));
  return prefix;
}

// A valid header listing `n` zero-size tensors.
std::string ZeroSizeHeader(size_t n) {
  std::string header = "{";
  header.reserve(n * 56 + 2);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) header += ',';
    header += "\"t" + std::to_string(i) + R"(":{"dtype":"F32","shape":[0],"data_offsets":[0,0]})";
  }
  return header + "}";
}

// `n` members `"a<i>":{}` of one object: the input that made the callback parser quadratic.
std::string EmptyObjectMembers(size_t n) {
  std::string text;
  text.reserve(n * 10);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) text += ',';
    text += "\"a" + std::to_string(i) + "\":{}";
  }
  return text;
}

// Runs `fn` on a thread; fails the test if it has not returned within 20 s, and then releases a
// reader blocked on one of `fifos` by opening the FIFO's write end, so the test itself cannot hang.
template <typename Fn>
auto RunPromptly(Fn fn, const std::vector<std::string>& fifos) {
  auto future = std::async(std::launch::async, fn);
  if (future.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "the loader blocked on a FIFO";
    for (const std::string& fifo : fifos) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  }
  return future.get();
}

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 const std::vector<std::string>& substrings) {
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& s : substrings) EXPECT_THAT(std::string(status.message()), HasSubstr(s));
}

// ---- Class 1: parse time linear in the input, memory bounded --------------------------------

TEST(HostileJsonTest, HeaderWith200kZeroSizeTensorsParses) {
  const std::string header = ZeroSizeHeader(200000);
  auto tensors = ParseSafetensorsHeader(header, 0, "big.safetensors");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(tensors->size(), 200000u);
  // The same through a file on disk.
  ScopedTempDir dir;
  const std::string path = dir.File("big.safetensors");
  WriteBytes(path, LengthPrefix(header.size()) + header);
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 200000u);
  EXPECT_NE((*file)->Find("t199999"), nullptr);
}

TEST(HostileJsonTest, HeaderOverTheTensorLimitIsRefusedWithTheCount) {
  const std::string header = ZeroSizeHeader(kMaxSafetensorsTensors + 1);
  ExpectError(ParseSafetensorsHeader(header, 0, "huge.safetensors").status(),
              absl::StatusCode::kInvalidArgument,
              {"huge.safetensors", "header lists 1048577 tensors, over the limit of 1048576"});
}

TEST(HostileJsonTest, ThreeMegabytesOfEmptyObjectsAreRefusedAtOnce) {
  const std::string members = EmptyObjectMembers(300000);  // about 3 MB
  ASSERT_GT(members.size(), 3u << 20);
  ExpectError(ParseSafetensorsHeader("{" + members + "}", 0, "h.safetensors").status(),
              absl::StatusCode::kInvalidArgument, {"h.safetensors", "tensor 'a0' has no 'dtype'"});
  std::string array = "[";
  for (int i = 0; i < 1500000; ++i) array += i == 0 ? "{}" : ",{}";
  ExpectError(ParseSafetensorsHeader(array + "]", 0, "h.safetensors").status(),
              absl::StatusCode::kInvalidArgument, {"header must be a JSON object, got array"});
  // Nested objects: refused at the first level the schema does not have.
  const std::string nested = std::string(1 << 20, '{');
  ExpectError(ParseSafetensorsHeader(nested, 0, "h.safetensors").status(),
              absl::StatusCode::kInvalidArgument, {"h.safetensors"});
  // The same members as tokenizer.json, which is DOM-parsed under a value limit: still linear.
  ExpectError(Tokenizer::FromJson("{" + members + "}", "tokenizer.json").status(),
              absl::StatusCode::kInvalidArgument, {"tokenizer.json"});
}

TEST(HostileJsonTest, IndexIsParsedInOnePassWithLimits) {
  std::string index = R"({"metadata":{"total_size":0},"weight_map":{)";
  for (int i = 0; i < 200000; ++i) {
    if (i > 0) index += ',';
    index += "\"model.layers." + std::to_string(i) + ".weight\":\"model-00001.safetensors\"";
  }
  index += "}}";
  auto map = ParseSafetensorsIndex(index, "idx.json");
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->size(), 200000u);

  std::string over = R"({"weight_map":{)";
  for (size_t i = 0; i <= kMaxSafetensorsIndexTensors; ++i) {
    if (i > 0) over += ',';
    over += "\"" + std::to_string(i) + "\":\"s.safetensors\"";
  }
  ExpectError(ParseSafetensorsIndex(over + "}}", "idx.json").status(),
              absl::StatusCode::kInvalidArgument,
              {"idx.json", "index 'weight_map' lists 1048577 tensors, over the limit of 1048576"});

  const std::string deep = R"({"metadata":)" + std::string(100000, '[') +
                           std::string(100000, ']') + R"(,"weight_map":{"a":"s.safetensors"}})";
  ExpectError(ParseSafetensorsIndex(deep, "idx.json").status(),
              absl::StatusCode::kInvalidArgument,
              {"idx.json", "nests deeper than 16 levels"});
  ExpectError(ParseSafetensorsIndex(R"({"weight_map":{)" + EmptyObjectMembers(300000) + "}}",
                                    "idx.json")
                  .status(),
              absl::StatusCode::kInvalidArgument,
              {"idx.json", "weight_map entry for tensor 'a0' must be a file name string, got "
                           "object"});
  ExpectError(
      ParseSafetensorsIndex(R"({"weight_map":{"a":"x.safetensors","a":"y.safetensors"}})", "i")
          .status(),
      absl::StatusCode::kInvalidArgument, {"weight_map lists tensor 'a' twice"});
  ExpectError(ParseSafetensorsIndex(R"({"weight_map":{},"weight_map":{}})", "i").status(),
              absl::StatusCode::kInvalidArgument, {"'weight_map' twice"});
  ExpectError(ParseSafetensorsIndex(std::string(kMaxSafetensorsIndexBytes + 1, ' '), "i").status(),
              absl::StatusCode::kInvalidArgument, {"over the limit of 67108864"});
  // Other top-level keys are skipped, not stored.
  EXPECT_TRUE(
      ParseSafetensorsIndex(R"({"x":[1,{"y":null}],"weight_map":{"a":"s.safetensors"}})", "i").ok());
}

size_t HeapInUse() {
  const struct mallinfo2 info = ::mallinfo2();
  return info.uordblks + info.hblkhd;
}

// The DOM of a config or tokenizer.json costs at most kDomBytesPerValue per value beyond the text,
// for the most expensive shapes JSON allows, right at the value limit.
TEST(HostileJsonTest, DomMemoryStaysWithinTheStatedBound) {
  using json_fields::kConfigLimits;
  using json_fields::kDomBytesPerValue;
  const size_t members = kConfigLimits.max_values - 1;  // + the top-level object
  std::vector<std::string> shapes(3, "{");
  for (size_t i = 0; i < members; ++i) {
    const std::string key = (i > 0 ? ",\"" : "\"") + std::to_string(i) + "\":";
    shapes[0] += key + "{}";
    shapes[1] += key + "\"\"";
    shapes[2] += key + "[]";
  }
  for (std::string& text : shapes) {
    text += "}";
    SCOPED_TRACE(text.substr(0, 20));
    const size_t before = HeapInUse();
    auto document = json_fields::ParseObjectDocument(text, "config.json");
    ASSERT_TRUE(document.ok()) << document.status();
    const size_t used = HeapInUse() - before;
    EXPECT_LE(used, kConfigLimits.max_values * kDomBytesPerValue) << used;
  }
  // One value more is refused.
  ExpectError(json_fields::ParseObjectDocument(shapes[0].substr(0, shapes[0].size() - 1) +
                                                   ",\"x\":1}",
                                               "config.json")
                  .status(),
              absl::StatusCode::kInvalidArgument, {"more than 65536 JSON values"});
  // A tokenizer-sized document (129280 vocab entries, 127000 merges) parses.
  std::string tokenizer = "{\"vocab\":{";
  for (int i = 0; i < 129280; ++i) {
    tokenizer += (i > 0 ? ",\"tok" : "\"tok") + std::to_string(i) + "\":" + std::to_string(i);
  }
  tokenizer += "},\"merges\":[";
  for (int i = 0; i < 127000; ++i) {
    tokenizer += (i > 0 ? ",\"tok" : "\"tok") + std::to_string(i) + " x\"";
  }
  tokenizer += "]}";
  EXPECT_TRUE(json_fields::ParseObjectDocument(tokenizer, "tokenizer.json",
                                               json_fields::kTokenizerLimits)
                  .ok());
}

// The tiny V3 config of target_model_test, with MTP layers as a parameter.
std::string TinyV3Config(int nextn) {
  Json j = Json::parse(R"({
    "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
    "moe_intermediate_size": 16, "num_hidden_layers": 3, "num_attention_heads": 8,
    "num_key_value_heads": 8, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "n_group": 4, "topk_group": 2, "norm_topk_prob": true,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": null, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 4096, "rope_theta": 10000, "rope_scaling": null,
    "tie_word_embeddings": true, "eos_token_id": 1})");
  if (nextn > 0) j["num_nextn_predict_layers"] = nextn;
  return j.dump();
}

TEST(HostileJsonTest, ConfigsAreBoundedAndRefuseDuplicateKeys) {
  const std::string valid = TinyV3Config(0);
  ASSERT_TRUE(DeepseekV2Config::FromJson(valid, "config.json").ok());
  // A duplicate key: JSON readers disagree on which one wins.
  const std::string duplicate = "{\"hidden_size\": 32, " + valid.substr(1);
  ExpectError(DeepseekV2Config::FromJson(duplicate, "config.json").status(),
              absl::StatusCode::kInvalidArgument,
              {"config.json", "duplicate key 'hidden_size' in the top-level object"});
  std::string many = "{\"x\":[0";
  for (int i = 0; i < 70000; ++i) many += ",0";
  ExpectError(DeepseekV2Config::FromJson(many + "]}", "config.json").status(),
              absl::StatusCode::kInvalidArgument,
              {"config.json", "more than 65536 JSON values (limit 65536 for a config.json)"});
  ExpectError(Eagle3DraftConfig::FromJson("{\"x\":\"" + std::string(70000, 's') + "\"}",
                                          "draft.json")
                  .status(),
              absl::StatusCode::kInvalidArgument,
              {"draft.json", "a string of 70000 bytes", "limit of 65536 bytes"});
  ExpectError(DeepseekV2Config::FromJson(std::string(2 << 20, ' '), "config.json").status(),
              absl::StatusCode::kInvalidArgument,
              {"config.json", "2097152 bytes is too large for a config.json (limit 1048576"});
  ExpectError(DeepseekV2Config::FromJson(std::string(1 << 19, '['), "config.json").status(),
              absl::StatusCode::kInvalidArgument, {"nests deeper than 64"});
  // tokenizer.json has its own, larger limits.
  std::string values = "{\"x\":[0";
  for (int i = 0; i < (1 << 21); ++i) values += ",0";
  ExpectError(Tokenizer::FromJson(values + "]}", "tokenizer.json").status(),
              absl::StatusCode::kInvalidArgument,
              {"tokenizer.json", "more than 2097152 JSON values"});
}

// ---- Class 2: files that are not what they seem ---------------------------------------------

class HostileFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(dir_.path().empty()); }
  std::string Path(const std::string& name) const { return dir_.File(name); }
  void MakeFifo(const std::string& name) {
    ASSERT_EQ(::mkfifo(Path(name).c_str(), 0600), 0) << name;
  }
  ScopedTempDir dir_;
};

TEST_F(HostileFilesTest, FifosAreRefusedWithoutBlocking) {
  const std::string st = "model.safetensors";
  MakeFifo(st);
  MakeFifo("config.json");
  MakeFifo("tokenizer.json");
  const std::vector<std::string> fifos = {Path(st), Path("config.json"), Path("tokenizer.json")};
  const auto fifo_error = [&](const std::string& name) {
    return std::vector<std::string>{Path(name), "is a FIFO, not a regular file"};
  };
  ExpectError(RunPromptly([&] { return Checkpoint::Open(dir_.path()).status(); }, fifos),
              absl::StatusCode::kFailedPrecondition, fifo_error(st));
  ExpectError(RunPromptly([&] { return SafetensorsFile::Open(Path(st)).status(); }, fifos),
              absl::StatusCode::kFailedPrecondition, fifo_error(st));
  ExpectError(RunPromptly([&] { return DeepseekV2Config::FromFile(dir_.path()).status(); }, fifos),
              absl::StatusCode::kFailedPrecondition, fifo_error("config.json"));
  ExpectError(
      RunPromptly([&] { return Eagle3DraftConfig::FromFile(Path("config.json")).status(); }, fifos),
      absl::StatusCode::kFailedPrecondition, fifo_error("config.json"));
  ExpectError(RunPromptly([&] { return Tokenizer::FromFile(dir_.path()).status(); }, fifos),
              absl::StatusCode::kFailedPrecondition, fifo_error("tokenizer.json"));
}

TEST_F(HostileFilesTest, FifoIndexAndShardAreRefusedWithoutBlocking) {
  MakeFifo("model.safetensors.index.json");
  const std::vector<std::string> fifos = {Path("model.safetensors.index.json"),
                                          Path("shard.safetensors")};
  ExpectError(RunPromptly([&] { return Checkpoint::Open(dir_.path()).status(); }, fifos),
              absl::StatusCode::kFailedPrecondition,
              {Path("model.safetensors.index.json"), "is a FIFO, not a regular file"});
  fs::remove(Path("model.safetensors.index.json"));
  WriteBytes(Path("model.safetensors.index.json"),
             R"({"weight_map": {"w": "shard.safetensors"}})");
  MakeFifo("shard.safetensors");
  ExpectError(RunPromptly([&] { return Checkpoint::Open(dir_.path()).status(); }, fifos),
              absl::StatusCode::kFailedPrecondition,
              {Path("shard.safetensors"), "is a FIFO, not a regular file"});
}

TEST_F(HostileFilesTest, DirectoriesAreNamedAsSuch) {
  fs::create_directory(Path("model.safetensors"));
  ExpectError(Checkpoint::Open(dir_.path()).status(), absl::StatusCode::kFailedPrecondition,
              {Path("model.safetensors"), "is a directory, not a regular file"});
  fs::create_directory(Path("config.json"));
  ExpectError(DeepseekV2Config::FromFile(dir_.path()).status(),
              absl::StatusCode::kFailedPrecondition,
              {Path("config.json"), "is a directory, not a regular file"});
  fs::create_directory(Path("tokenizer.json"));
  ExpectError(Tokenizer::FromFile(dir_.path()).status(), absl::StatusCode::kFailedPrecondition,
              {Path("tokenizer.json"), "is a directory, not a regular file"});
  // A missing file is still NotFound.
  ExpectError(Tokenizer::FromFile(Path("none.json")).status(), absl::StatusCode::kNotFound,
              {Path("none.json"), "no such file"});
}

TEST_F(HostileFilesTest, UnreadableFilesReportTheReason) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  for (const char* name : {"model.safetensors", "config.json", "tokenizer.json"}) {
    WriteBytes(Path(name), "{}");
    ASSERT_EQ(::chmod(Path(name).c_str(), 0), 0);
  }
  const std::vector<std::string> reason = {"cannot open", "Permission denied"};
  auto with = [&](const std::string& name) {
    std::vector<std::string> out = reason;
    out.push_back(Path(name));
    return out;
  };
  ExpectError(Checkpoint::Open(dir_.path()).status(), absl::StatusCode::kPermissionDenied,
              with("model.safetensors"));
  ExpectError(DeepseekV2Config::FromFile(dir_.path()).status(),
              absl::StatusCode::kPermissionDenied, with("config.json"));
  ExpectError(Tokenizer::FromFile(dir_.path()).status(), absl::StatusCode::kPermissionDenied,
              with("tokenizer.json"));
}

// Two f32 tensors: "a<suffix>" [4] then "b<suffix>" [4], 32 data bytes after the header.
std::string WriteTwoTensors(const std::string& path, float base, const std::string& suffix = "") {
  std::vector<float> a = {base, base + 1, base + 2, base + 3};
  std::vector<float> b = {base + 4, base + 5, base + 6, base + 7};
  const std::vector<NamedTensor> tensors = {
      {"a" + suffix, TensorView(a.data(), DType::kF32, Shape{4})},
      {"b" + suffix, TensorView(b.data(), DType::kF32, Shape{4})}};
  EXPECT_TRUE(WriteSafetensors(path, tensors).ok());
  return path;
}

TEST_F(HostileFilesTest, TruncatedAfterOpenIsDataLossNotSigbus) {
  const std::string path = WriteTwoTensors(Path("model.safetensors"), 0.0f);
  auto checkpoint = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto reader = (*file)->OpenReader();
  ASSERT_TRUE(reader.ok()) << reader.status();
  // Cut the file inside the second tensor, as a copy still in progress or a crashed writer would,
  // between the open and the reads.
  const uint64_t size = fs::file_size(path);
  fs::resize_file(path, size - 6);
  const TensorInfo* b = (*file)->Find("b");
  ASSERT_NE(b, nullptr);
  float out[4];
  ExpectError(reader->Read(*b, 0, out, sizeof(out)), absl::StatusCode::kDataLoss,
              {path, "file changed while loading: expected 16 bytes at offset", "read 10",
               "tensor 'b'"});
  const TensorInfo* a = (*file)->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(reader->Read(*a, 0, out, sizeof(out)).ok());  // wholly before the cut
  ExpectError(reader->CheckUnchanged(), absl::StatusCode::kDataLoss,
              {path, "file changed while loading: it was 152 bytes when opened and is now 146"});
  // Every later read reopens the file and sees it is no longer the one opened.
  const std::vector<std::string> changed = {path, "file changed while loading: it was 152 bytes"};
  ExpectError((*checkpoint)->Read("a", DType::kF32).status(), absl::StatusCode::kDataLoss,
              changed);
  ExpectError((*checkpoint)->Read("b", DType::kBF16).status(), absl::StatusCode::kDataLoss,
              changed);
  ShardSpec spec;
  spec.tp_size = 2;
  spec.rank = 1;
  ExpectError((*checkpoint)->ReadShard("b", spec, DType::kF32).status(),
              absl::StatusCode::kDataLoss, changed);
  ExpectError((*checkpoint)->View("b").status(), absl::StatusCode::kDataLoss, changed);
}

TEST_F(HostileFilesTest, RewrittenOrReplacedFileIsDataLoss) {
  const std::string path = WriteTwoTensors(Path("model.safetensors"), 0.0f);
  {
    auto checkpoint = Checkpoint::Open(dir_.path());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    // Same size, new bytes, new modification time.
    const std::string replacement = ReadBytes(WriteTwoTensors(Path("other.safetensors"), 100.0f));
    ASSERT_EQ(replacement.size(), fs::file_size(path));
    std::fstream(path, std::ios::in | std::ios::out | std::ios::binary) << replacement;
    const struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
    ExpectError((*checkpoint)->Read("a", DType::kF32).status(), absl::StatusCode::kDataLoss,
                {path, "file changed while loading: modified after it was opened"});
  }
  WriteTwoTensors(path, 0.0f);
  auto checkpoint = Checkpoint::Open(dir_.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  // An atomic replace (write elsewhere, rename over): another file, never mixed with the old one.
  fs::rename(WriteTwoTensors(Path("new.safetensors"), 100.0f), path);
  ExpectError((*checkpoint)->Read("a", DType::kF32).status(), absl::StatusCode::kDataLoss,
              {path, "replaced by another file since it was opened"});
  // Replaced by a FIFO: refused without blocking, like at Open.
  fs::remove(path);
  MakeFifo("model.safetensors");
  ExpectError(RunPromptly([&] { return (*checkpoint)->Read("a", DType::kF32).status(); }, {path}),
              absl::StatusCode::kFailedPrecondition, {path, "is a FIFO, not a regular file"});
}

// Open checkpoints hold no file descriptors: many shards times many in-process ranks would
// otherwise exhaust them.
TEST_F(HostileFilesTest, OpenCheckpointsHoldNoDescriptors) {
  const auto open_fds = [] {
    int count = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++count;
    return count;
  };
  for (int i = 0; i < 8; ++i) {
    WriteTwoTensors(Path("s" + std::to_string(i) + ".safetensors"), static_cast<float>(i),
                    std::to_string(i));
  }
  std::string index = R"({"weight_map":{)";
  for (int i = 0; i < 8; ++i) {
    const std::string shard = "\"s" + std::to_string(i) + ".safetensors\"";
    index += (i > 0 ? "," : "") + std::string("\"a") + std::to_string(i) + "\":" + shard +
             ",\"b" + std::to_string(i) + "\":" + shard;
  }
  WriteBytes(Path("model.safetensors.index.json"), index + "}}");
  const int before = open_fds();
  std::vector<std::unique_ptr<Checkpoint>> ranks;
  for (int rank = 0; rank < 8; ++rank) {
    auto checkpoint = Checkpoint::Open(dir_.path());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    ranks.push_back(*std::move(checkpoint));
  }
  EXPECT_EQ(open_fds(), before);
  // Reads reopen the shard and close it again: "a7" holds 7, 8, 9, 10.
  auto a7 = ranks[7]->Read("a7", DType::kF32);
  ASSERT_TRUE(a7.ok()) << a7.status();
  EXPECT_EQ(a7->view().data_as<const float>()[3], 10.0f);
  EXPECT_EQ(open_fds(), before);
}

TEST_F(HostileFilesTest, HeaderPromisingMoreDataThanTheFileHasIsRefused) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  WriteBytes(Path("model.safetensors"), LengthPrefix(header.size()) + header + "12345678");
  ExpectError(Checkpoint::Open(dir_.path()).status(), absl::StatusCode::kInvalidArgument,
              {Path("model.safetensors"), "tensor 'w' data_offsets [0, 16) runs past the end of "
                                          "the data section (8 bytes)"});
}

// ---- Class 6: tensors the target model does not use -----------------------------------------

class UnknownTensorTest : public ::testing::Test {
 protected:
  // A random tiny-V3 checkpoint in two shards, in a fresh directory, plus `extra` (each a [2] f32
  // tensor) in a third shard listed by the index.
  absl::Status Build(int nextn, const std::vector<std::string>& extra) {
    dir_ = std::make_unique<ScopedTempDir>();
    EAGLE3_ASSIGN_OR_RETURN(config_, DeepseekV2Config::FromJson(TinyV3Config(nextn), "cfg"));
    RandomCheckpointOptions options;
    options.dtype = DType::kF32;
    EAGLE3_RETURN_IF_ERROR(WriteRandomDeepseekV2Checkpoint(config_, dir_->path(), options));
    EAGLE3_ASSIGN_OR_RETURN(config_, DeepseekV2Config::FromFile(dir_->path()));
    if (extra.empty()) return absl::OkStatus();
    static const float kValues[2] = {1.0f, 2.0f};
    std::vector<NamedTensor> tensors;
    for (const std::string& name : extra) {
      tensors.push_back({name, TensorView(const_cast<float*>(kValues), DType::kF32, Shape{2})});
    }
    EAGLE3_RETURN_IF_ERROR(WriteSafetensors(dir_->File(kExtraShard), tensors));
    const std::string index_path = dir_->File("model.safetensors.index.json");
    Json index = Json::parse(ReadBytes(index_path));
    for (const std::string& name : extra) index["weight_map"][name] = kExtraShard;
    WriteBytes(index_path, index.dump());
    return absl::OkStatus();
  }

  absl::Status Check() {
    auto checkpoint = Checkpoint::Open(dir_->path());
    if (!checkpoint.ok()) return checkpoint.status();
    return CheckNoUnknownTensors(**checkpoint, config_, DeepseekV2Weights(config_));
  }

  static constexpr char kExtraShard[] = "model-extra.safetensors";
  std::unique_ptr<ScopedTempDir> dir_;
  DeepseekV2Config config_;
};

TEST_F(UnknownTensorTest, CleanCheckpointPasses) {
  ASSERT_TRUE(Build(0, {}).ok());
  EXPECT_TRUE(Check().ok()) << Check();
}

TEST_F(UnknownTensorTest, ExtraTensorsAreRefusedByName) {
  for (const std::string& name :
       {std::string("model.layers.0.self_attn.o_proj.bias"),
        std::string("model.layers.1.self_attn.rotary_emb.inv_freq"),
        std::string("model.norm.weight "), std::string("model.layers.01.mlp.gate.weight"),
        std::string("lm_head.weight")}) {  // tied embeddings: an lm_head is not used
    SCOPED_TRACE(name);
    ASSERT_TRUE(Build(0, {name}).ok());
    const absl::Status status = Check();
    ExpectError(status, absl::StatusCode::kInvalidArgument,
                {"tensor '" + name + "'", dir_->File(kExtraShard), "is not used by the model",
                 dir_->File("config.json"), "refusing to ignore it"});
    EXPECT_THAT(std::string(status.message()), ::testing::Not(HasSubstr("quantized")));
  }
}

TEST_F(UnknownTensorTest, ScalesWithoutQuantizationConfigGetAHint) {
  ASSERT_TRUE(Build(0, {"model.layers.1.mlp.experts.0.down_proj.weight_scale_inv",
                        "model.layers.0.self_attn.o_proj.bias"})
                  .ok());
  ExpectError(Check(), absl::StatusCode::kInvalidArgument,
              {"tensor 'model.layers.0.self_attn.o_proj.bias'", "(and 1 more unknown tensor)",
               "looks quantized", "'model.layers.1.mlp.experts.0.down_proj.weight_scale_inv'",
               "has no quantization_config"});
}

TEST_F(UnknownTensorTest, MtpLayersAreIgnoredOnlyWhenTheConfigHasThem) {
  // num_hidden_layers = 3: with one MTP layer, model.layers.3.* is the MTP layer.
  ASSERT_TRUE(Build(1, {"model.layers.3.eh_proj.weight", "model.layers.3.enorm.weight"}).ok());
  EXPECT_TRUE(Check().ok()) << Check();
  ASSERT_TRUE(Build(1, {"model.layers.4.eh_proj.weight"}).ok());
  ExpectError(Check(), absl::StatusCode::kInvalidArgument, {"'model.layers.4.eh_proj.weight'"});
  ASSERT_TRUE(Build(0, {"model.layers.3.eh_proj.weight"}).ok());
  ExpectError(Check(), absl::StatusCode::kInvalidArgument, {"'model.layers.3.eh_proj.weight'"});
}

TEST_F(UnknownTensorTest, TargetModelCreateRefusesAnExtraBias) {
  ASSERT_TRUE(Build(0, {"model.layers.0.mlp.gate_proj.bias"}).ok());
  cpu::CpuBackend backend;
  TargetModelOptions options;
  options.max_tokens_per_forward = 8;
  options.max_context_len = 16;
  options.num_kv_pages = 8;
  options.page_size = 4;
  auto model = TargetModel::Create(dir_->path(), options, nullptr, &backend);
  ExpectError(model.status(), absl::StatusCode::kInvalidArgument,
              {"tensor 'model.layers.0.mlp.gate_proj.bias'", dir_->File(kExtraShard),
               "refusing to ignore it"});
}

}  // namespace
}  // namespace eagle3
