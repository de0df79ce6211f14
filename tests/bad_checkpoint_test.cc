// Malformed checkpoints: each must fail Checkpoint::Open with the right code and a message that
// names the offending file, tensor or key. Nothing may crash.
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string LengthPrefix(uint64_t n) {
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>(n >> (8 * i));
  return prefix;
}

void WriteBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A safetensors file with the given header text and data bytes.
void WriteSafetensorsImage(const fs::path& path, const std::string& header,
                           const std::string& data) {
  WriteBytes(path, LengthPrefix(header.size()) + header + data);
}

// A well-formed shard holding f32 tensors of shape [1] with the given names.
void WriteShard(const fs::path& path, const std::vector<std::string>& names) {
  static float value = 1.0f;
  std::vector<NamedTensor> tensors;
  for (const std::string& name : names) {
    tensors.push_back({name, TensorView(&value, DType::kF32, Shape{1})});
  }
  ASSERT_TRUE(WriteSafetensors(path.string(), tensors).ok());
}

std::string Entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape +
         ",\"data_offsets\":" + offsets + "}";
}

constexpr char kSingle[] = "model.safetensors";
constexpr char kIndex[] = "model.safetensors.index.json";
constexpr char kShard1[] = "model-00001-of-00002.safetensors";
constexpr char kShard2[] = "model-00002-of-00002.safetensors";

struct BadCase {
  std::string name;
  std::function<void(const fs::path& dir)> build;
  absl::StatusCode code;
  std::vector<std::string> substrings;  // the message must contain each
};

std::vector<BadCase> Cases() {
  const auto single = [](const std::string& header, const std::string& data) {
    return [=](const fs::path& dir) { WriteSafetensorsImage(dir / kSingle, header, data); };
  };
  const std::string w12 = Entry("w", "F32", "[3]", "[0,12]");
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const auto kNotFound = absl::StatusCode::kNotFound;
  return {
      {"truncated file shorter than the length prefix",
       [](const fs::path& dir) { WriteBytes(dir / kSingle, std::string("\x10\x00\x00", 3)); },
       kInvalid,
       {kSingle, "file is 3 bytes, shorter than the 8-byte header length prefix"}},
      {"header length zero",
       [](const fs::path& dir) { WriteBytes(dir / kSingle, LengthPrefix(0)); },
       kInvalid,
       {kSingle, "header length is 0"}},
      {"header length past end of file",
       [](const fs::path& dir) { WriteBytes(dir / kSingle, LengthPrefix(1000) + "{}"); },
       kInvalid,
       {kSingle, "header length 1000 runs past the end of the file"}},
      {"header length over the cap",
       [](const fs::path& dir) {
         WriteBytes(dir / kSingle, LengthPrefix(uint64_t{1} << 40) + "{}");
       },
       kInvalid,
       {kSingle, "header length 1099511627776 exceeds the cap"}},
      {"header not JSON", single("{\"w\": nope}", ""), kInvalid, {kSingle, "not valid JSON"}},
      {"header is a JSON array",
       single("[1, 2]", ""),
       kInvalid,
       {kSingle, "header must be a JSON object, got array"}},
      {"duplicate tensor name",
       single("{" + w12 + "," + w12 + "}", std::string(12, '\0')),
       kInvalid,
       {kSingle, "duplicate tensor name 'w'"}},
      {"unknown dtype",
       single("{" + Entry("w", "F64", "[3]", "[0,24]") + "}", std::string(24, 'x')),
       kInvalid,
       {kSingle, "tensor 'w' has unknown dtype \"F64\""}},
      {"negative dim",
       single("{" + Entry("w", "F32", "[3,-1]", "[0,12]") + "}", std::string(12, 'x')),
       kInvalid,
       {kSingle, "tensor 'w' shape dim 1 is -1"}},
      {"non-integer dim",
       single("{" + Entry("w", "F32", "[1.5]", "[0,4]") + "}", std::string(4, 'x')),
       kInvalid,
       {kSingle, "tensor 'w' shape dim 0 is 1.5"}},
      {"rank above the maximum",
       single("{" + Entry("w", "U8", "[1,1,1,1,1,1,1]", "[0,1]") + "}", "x"),
       kInvalid,
       {kSingle, "tensor 'w' shape has rank 7"}},
      {"shape times dtype differs from span",
       single("{" + Entry("w", "BF16", "[2,3]", "[0,10]") + "}", std::string(10, 'x')),
       kInvalid,
       {kSingle,
        "tensor 'w' shape [2, 3] of BF16 needs 12 bytes but data_offsets [0, 10) span 10"}},
      {"begin after end",
       single("{" + Entry("w", "F32", "[1]", "[8,4]") + "}", std::string(8, 'x')),
       kInvalid,
       {kSingle, "tensor 'w' data_offsets [8, 4) has begin > end"}},
      {"span past the data end",
       single("{" + Entry("w", "F32", "[4]", "[0,16]") + "}", std::string(12, 'x')),
       kInvalid,
       {kSingle,
        "tensor 'w' data_offsets [0, 16) runs past the end of the data section (12 bytes)"}},
      {"overlapping spans",
       single(
           "{" + Entry("a", "F32", "[2]", "[0,8]") + "," + Entry("b", "F32", "[2]", "[4,12]") + "}",
           std::string(12, 'x')),
       kInvalid,
       {kSingle, "tensor 'b' data [4, 12) overlaps tensor 'a' data [0, 8)"}},
      {"gap between spans",
       single(
           "{" + Entry("a", "F32", "[1]", "[0,4]") + "," + Entry("b", "F32", "[1]", "[8,12]") + "}",
           std::string(12, 'x')),
       kInvalid,
       {kSingle, "gap of 4 unused bytes [4, 8) before tensor 'b'"}},
      {"unused trailing bytes",
       single("{" + w12 + "}", std::string(16, 'x')),
       kInvalid,
       {kSingle, "4 unused trailing bytes after tensor 'w'"}},
      {"data_offsets not a pair",
       single("{" + Entry("w", "F32", "[3]", "[0,12,16]") + "}", std::string(12, 'x')),
       kInvalid,
       {kSingle, "tensor 'w' data_offsets must be two non-negative integers"}},
      {"entry with an extra key",
       single(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"crc":1}})", "xxxx"),
       kInvalid,
       {kSingle, "tensor 'w' has unexpected key 'crc'"}},
      {"metadata value not a string",
       single(R"({"__metadata__":{"format":"pt","step":100},)" + w12 + "}", std::string(12, 'x')),
       kInvalid,
       {kSingle, "__metadata__ key 'step' has a number value"}},
      {"metadata not an object",
       single(R"({"__metadata__":["pt"]})", ""),
       kInvalid,
       {kSingle, "__metadata__ must be an object"}},
      {"no checkpoint files at all",
       [](const fs::path& dir) { WriteBytes(dir / "config.json", "{}"); },
       kNotFound,
       {"no model.safetensors or model.safetensors.index.json in checkpoint directory"}},
      {"index not JSON",
       [](const fs::path& dir) { WriteBytes(dir / kIndex, "{\"weight_map\": "); },
       kInvalid,
       {kIndex, "index is not valid JSON"}},
      {"index without weight_map",
       [](const fs::path& dir) { WriteBytes(dir / kIndex, R"({"metadata": {}})"); },
       kInvalid,
       {kIndex, "index has no 'weight_map'"}},
      {"index weight_map value not a string",
       [](const fs::path& dir) { WriteBytes(dir / kIndex, R"({"weight_map": {"a": 1}})"); },
       kInvalid,
       {kIndex, "weight_map entry for tensor 'a' must be a file name string"}},
      {"index shard escapes the directory",
       [](const fs::path& dir) {
         WriteBytes(dir / kIndex, R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
       },
       kInvalid,
       {kIndex, "tensor 'a'", "'../elsewhere.safetensors'"}},
      {"missing shard file",
       [](const fs::path& dir) {
         WriteShard(dir / kShard1, {"a"});
         WriteBytes(dir / kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 +
                                      R"(", "b": ")" + kShard2 + R"("}})");
       },
       kNotFound,
       {"shard '" + std::string(kShard2) + "'", "tensor 'b'", "not found"}},
      {"index names a tensor absent from its shard",
       [](const fs::path& dir) {
         WriteShard(dir / kShard1, {"a"});
         WriteShard(dir / kShard2, {"b"});
         WriteBytes(dir / kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 +
                                      R"(", "b": ")" + kShard2 + R"(", "c": ")" + kShard2 +
                                      R"("}})");
       },
       kNotFound,
       {"tensor 'c'", kShard2, "does not contain it"}},
      {"index maps a tensor to the wrong shard",
       [](const fs::path& dir) {
         WriteShard(dir / kShard1, {"a", "b"});
         WriteShard(dir / kShard2, {"c"});
         WriteBytes(dir / kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 +
                                      R"(", "b": ")" + kShard2 + R"(", "c": ")" + kShard2 +
                                      R"("}})");
       },
       kInvalid,
       {"tensor 'b' is mapped to shard '" + std::string(kShard2), kShard1}},
      {"tensor stored in two shards",
       [](const fs::path& dir) {
         WriteShard(dir / kShard1, {"a", "shared"});
         WriteShard(dir / kShard2, {"b", "shared"});
         WriteBytes(dir / kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 +
                                      R"(", "b": ")" + kShard2 + R"(", "shared": ")" + kShard1 +
                                      R"("}})");
       },
       kInvalid,
       {"tensor 'shared' is stored in both shard", kShard1, kShard2}},
      {"shard holds a tensor the index does not list",
       [](const fs::path& dir) {
         WriteShard(dir / kShard1, {"a", "stray"});
         WriteBytes(dir / kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"("}})");
       },
       kInvalid,
       {kShard1, "tensor 'stray'", "does not list"}},
      {"model.safetensors is a directory",
       [](const fs::path& dir) { fs::create_directory(dir / kSingle); },
       absl::StatusCode::kFailedPrecondition,
       {kSingle, "is a directory, not a regular file"}},
      {"shard is a directory",
       [](const fs::path& dir) {
         fs::create_directory(dir / kShard1);
         WriteBytes(dir / kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"("}})");
       },
       absl::StatusCode::kFailedPrecondition,
       {kShard1, "is a directory, not a regular file"}},
      {"index lists a tensor twice",
       [](const fs::path& dir) {
         WriteShard(dir / kShard1, {"a"});
         WriteBytes(dir / kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 +
                                      R"(", "a": ")" + kShard2 + R"("}})");
       },
       kInvalid,
       {kIndex, "weight_map lists tensor 'a' twice"}},
      {"index tensor name over the length limit",
       [](const fs::path& dir) {
         WriteBytes(dir / kIndex, R"({"weight_map": {")" + std::string(2000, 'n') + R"(": "s"}})");
       },
       kInvalid,
       {kIndex, "is 2000 bytes, over the limit of 1024"}},
      {"malformed shard inside an index",
       [](const fs::path& dir) {
         WriteSafetensorsImage(dir / kShard1, "{" + Entry("a", "I8", "[1]", "[0,1]") + "}", "x");
         WriteBytes(dir / kIndex, std::string(R"({"weight_map": {"a": ")") + kShard1 + R"("}})");
       },
       kInvalid,
       {kShard1, "tensor 'a' has unknown dtype \"I8\""}},
  };
}

TEST(BadCheckpointTest, EveryMalformedCheckpointFailsWithAPreciseStatus) {
  const std::vector<BadCase> cases = Cases();
  ASSERT_GE(cases.size(), 14u);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    ScopedTempDir dir;
    ASSERT_FALSE(dir.path().empty());
    c.build(dir.path());
    auto checkpoint = Checkpoint::Open(dir.path());
    ASSERT_FALSE(checkpoint.ok()) << "opened a malformed checkpoint";
    const absl::Status& status = checkpoint.status();
    EXPECT_EQ(status.code(), c.code) << status;
    for (const std::string& s : c.substrings) {
      EXPECT_THAT(std::string(status.message()), HasSubstr(s));
    }
    const std::string& first = c.substrings.front();
    if (c.code == absl::StatusCode::kNotFound || first == kSingle || first == kIndex ||
        first == kShard1) {
      // Messages about a file carry its full path, so the user can find it.
      EXPECT_THAT(std::string(status.message()), HasSubstr(dir.path()));
    }
  }
}

}  // namespace
}  // namespace eagle3
