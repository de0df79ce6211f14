#include "eagle3/safetensors.h"

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "eagle3/half.h"
#include "eagle3/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A file image: 8-byte little-endian header length, header, data.
std::string FileImage(const std::string& header, const std::string& data) {
  std::string image(8, '\0');
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  return image + header + data;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16,  DType::kBF16, DType::kI32,
                                DType::kI64, DType::kBool, DType::kU8,   DType::kF8E4M3};

// Deterministic bytes for a tensor; bool gets 0/1 only.
std::vector<uint8_t> PatternBytes(DType dtype, int64_t numel, int seed) {
  std::vector<uint8_t> bytes(static_cast<size_t>(numel) * DTypeSize(dtype));
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<uint8_t>((i * 131 + seed * 17 + 7) & 0xff);
    if (dtype == DType::kBool) bytes[i] &= 1;
  }
  return bytes;
}

TEST(SafetensorsTest, RoundTripEveryDTypeWithScalarsAndEmptyTensors) {
  ScopedTempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::vector<Shape> shapes = {Shape{}, Shape{3}, Shape{2, 3, 4}, Shape{0, 5}};
  std::vector<std::vector<uint8_t>> storage;
  std::vector<NamedTensor> tensors;
  int seed = 0;
  for (DType dtype : kAllDTypes) {
    for (const Shape& shape : shapes) {
      storage.push_back(PatternBytes(dtype, shape.numel(), seed++));
      tensors.push_back({std::string(DTypeName(dtype)) + "." + shape.ToString(),
                         TensorView(storage.back().data(), dtype, shape)});
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "round trip"}};
  const std::string path = dir.File("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ((*file)->metadata(), metadata);
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(tensors[i].name);
    const TensorInfo* info = (*file)->Find(tensors[i].name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, tensors[i].tensor.dtype());
    EXPECT_EQ(info->shape, tensors[i].tensor.shape());
    EXPECT_EQ(info->end - info->begin, tensors[i].tensor.nbytes());
    auto view = (*file)->View(tensors[i].name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->shape(), tensors[i].tensor.shape());
    EXPECT_TRUE(view->device().is_cpu());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(view->data()) % DTypeSize(info->dtype), 0u);
    const std::vector<uint8_t> bytes(static_cast<const uint8_t*>(view->data()),
                                     static_cast<const uint8_t*>(view->data()) + view->nbytes());
    EXPECT_EQ(bytes, storage[i]);
    // ReadBytes reads any sub-range of the same bytes.
    std::vector<uint8_t> raw(storage[i].size());
    ASSERT_TRUE((*file)->ReadBytes(*info, 0, raw.data(), raw.size()).ok());
    EXPECT_EQ(raw, storage[i]);
    if (raw.size() > 1) {
      uint8_t last = 0;
      ASSERT_TRUE((*file)->ReadBytes(*info, raw.size() - 1, &last, 1).ok());
      EXPECT_EQ(last, storage[i].back());
    }
    const absl::Status outside = (*file)->ReadBytes(*info, 1, raw.data(), raw.size());
    EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument) << outside;
    EXPECT_THAT(outside.message(), HasSubstr("is outside tensor"));
  }
  EXPECT_EQ((*file)->Find("missing"), nullptr);
  auto missing = (*file)->View("missing");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'missing'"));
  EXPECT_THAT(missing.status().message(), HasSubstr(path));
}

TEST(SafetensorsTest, Bf16ValuesAreBitExact) {
  ScopedTempDir dir;
  const std::vector<uint16_t> bits = {0x0000,
                                      0x8000,  // +0, -0
                                      0x7f80,
                                      0xff80,  // +inf, -inf
                                      0x7fc1,
                                      0xffa5,  // NaNs with payloads
                                      0x0001,
                                      0x807f,  // subnormals
                                      FloatToBf16(3.140625f),
                                      FloatToBf16(-65504.0f),
                                      0x7f7f};  // max finite
  std::vector<uint16_t> data = bits;
  const NamedTensor t{
      "x", TensorView(data.data(), DType::kBF16, Shape{static_cast<int64_t>(bits.size())})};
  const std::string path = dir.File("bf16.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {&t, 1}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto view = (*file)->View("x");
  ASSERT_TRUE(view.ok());
  for (size_t i = 0; i < bits.size(); ++i) {
    EXPECT_EQ(view->data_as<const uint16_t>()[i], bits[i]) << "element " << i;
  }
}

TEST(SafetensorsTest, TensorsAreInDataOrderAndWriterAlignsByElementSize) {
  ScopedTempDir dir;
  std::vector<uint8_t> u8(3, 1);
  std::vector<uint16_t> bf16(5, 2);
  std::vector<int64_t> i64(2, 3);
  std::vector<float> f32(3, 4.0f);
  const std::vector<NamedTensor> tensors = {
      {"a_u8", TensorView(u8.data(), DType::kU8, Shape{3})},
      {"b_bf16", TensorView(bf16.data(), DType::kBF16, Shape{5})},
      {"c_i64", TensorView(i64.data(), DType::kI64, Shape{2})},
      {"d_f32", TensorView(f32.data(), DType::kF32, Shape{3})}};
  const std::string path = dir.File("order.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> names;
  for (const TensorInfo& info : (*file)->tensors()) names.push_back(info.name);
  EXPECT_EQ(names, (std::vector<std::string>{"c_i64", "d_f32", "b_bf16", "a_u8"}));
  std::ifstream in(path, std::ios::binary);
  uint8_t prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | prefix[i];
  EXPECT_EQ(header_size % 8, 0u) << "header must be padded to a multiple of 8 bytes";
}

TEST(SafetensorsTest, MisalignedTensorIsViewedAligned) {
  ScopedTempDir dir;
  // A u8 byte first puts the bf16 tensor at an odd address; the header is padded to 8 bytes.
  std::string header = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[1,9]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string data =
      std::string("\x05", 1) + std::string("\x80\x3f\x00\x40\x40\x40\x80\x40", 8);
  const std::string path = dir.File("odd.safetensors");
  WriteBytes(path, FileImage(header, data));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorInfo* info = (*file)->Find("b");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->begin, 1u);  // odd offset in the file
  auto view = (*file)->View("b");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(view->data()) % 2, 0u);
  EXPECT_EQ(Bf16ToFloat(view->data_as<const uint16_t>()[0]), 1.0f);
  EXPECT_EQ(Bf16ToFloat(view->data_as<const uint16_t>()[3]), 4.0f);
  auto again = (*file)->View("b");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), view->data()) << "the tensor is read once";
}

TEST(SafetensorsTest, WriterReplacesAtomicallyAndLeavesNoTemporaries) {
  ScopedTempDir dir;
  const std::string path = dir.File("w.safetensors");
  std::vector<float> one = {1.0f}, two = {2.0f, 3.0f};
  const NamedTensor first{"x", TensorView(one.data(), DType::kF32, Shape{1})};
  const NamedTensor second{"y", TensorView(two.data(), DType::kF32, Shape{2})};
  ASSERT_TRUE(WriteSafetensors(path, {&first, 1}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {&second, 1}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Find("x"), nullptr);
  EXPECT_NE((*file)->Find("y"), nullptr);
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename(), "w.safetensors");
    ++entries;
  }
  EXPECT_EQ(entries, 1);

  // An empty tensor list is a valid file with an empty data section.
  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  auto empty = SafetensorsFile::Open(path);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE((*empty)->tensors().empty());
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  ScopedTempDir dir;
  const std::string path = dir.File("bad.safetensors");
  std::vector<float> data(6);
  const TensorView view(data.data(), DType::kF32, Shape{2, 3});
  struct Case {
    std::vector<NamedTensor> tensors;
    std::string substring;
  };
  const std::vector<Case> cases = {
      {{{"w", view}, {"w", view}}, "duplicate tensor 'w'"},
      {{{"", view}}, "empty tensor name"},
      {{{"__metadata__", view}}, "reserved"},
      {{{"t", view.Narrow(1, 0, 2)}}, "tensor 't'"},
      {{{"d", TensorView(data.data(), DType::kF32, Shape{2, 3}, Shape{3, 1}, Device::Cuda(0))}},
       "only host tensors"},
      {{{"n", TensorView(nullptr, DType::kF32, Shape{2})}}, "null data"},
      {{{"\xff\xfe", view}}, "cannot encode"},  // names must be valid UTF-8
  };
  for (const Case& c : cases) {
    const absl::Status status = WriteSafetensors(path, c.tensors);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.substring;
    EXPECT_THAT(status.message(), HasSubstr(c.substring));
    EXPECT_THAT(status.message(), HasSubstr(path));
  }
  EXPECT_FALSE(fs::exists(path));
  const absl::Status no_dir = WriteSafetensors(dir.File("no/such/dir/x.safetensors"), {});
  EXPECT_EQ(no_dir.code(), absl::StatusCode::kNotFound) << no_dir;
  EXPECT_THAT(no_dir.message(), HasSubstr("no/such/dir/x.safetensors"));
}

TEST(SafetensorsTest, OpenReportsOsErrors) {
  ScopedTempDir dir;
  auto missing = SafetensorsFile::Open(dir.File("nope.safetensors"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.safetensors"));
  auto directory = SafetensorsFile::Open(dir.path());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(directory.status().message(), HasSubstr("not a regular file"));
}

// ---- Header parsing -------------------------------------------------------------------------

absl::Status ParseError(const std::string& header, uint64_t data_size) {
  return ParseSafetensorsHeader(header, data_size, "h.safetensors").status();
}

TEST(SafetensorsHeaderTest, ParsesValidHeaderInDataOrder) {
  std::map<std::string, std::string> metadata;
  auto tensors = ParseSafetensorsHeader(
      R"({"__metadata__":{"format":"pt"},
          "z":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
          "empty":{"dtype":"BF16","shape":[0,4],"data_offsets":[8,8]},
          "a":{"dtype":"I64","shape":[],"data_offsets":[8,16]}}   )",
      16, "h.safetensors", &metadata);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 3u);
  EXPECT_EQ((*tensors)[0].name, "z");
  EXPECT_EQ((*tensors)[1].name, "empty");  // [8, 8) sorts before [8, 16)
  EXPECT_EQ((*tensors)[2].name, "a");
  EXPECT_EQ((*tensors)[2].shape.rank(), 0);
  EXPECT_EQ((*tensors)[2].dtype, DType::kI64);
  EXPECT_EQ((*tensors)[1].shape, (Shape{0, 4}));
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  // No tensors at all, no data: valid.
  EXPECT_TRUE(ParseSafetensorsHeader("{}", 0, "h").ok());
  // A header that fails validation leaves the caller's metadata alone.
  EXPECT_FALSE(
      ParseSafetensorsHeader(R"({"__metadata__":{"a":"b"},"w":1})", 0, "h", &metadata).ok());
  EXPECT_EQ(metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
}

TEST(SafetensorsHeaderTest, RejectsMalformedEntries) {
  struct Case {
    std::string header;
    uint64_t data_size;
    std::vector<std::string> substrings;
  };
  const std::vector<Case> cases = {
      {R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})",
       4,
       {"duplicate key 'dtype'", "entry 'w'"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})",
       4,
       {"tensor 'w'", "unexpected key 'extra'"}},
      {R"({"w":{"dtype":"F32","shape":[1]}})", 4, {"tensor 'w'", "no 'data_offsets'"}},
      {R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})",
       4,
       {"tensor 'w'", "dtype must be a string"}},
      {R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[0,4]}})",
       4,
       {"tensor 'w'", "rank 7"}},
      {R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})",
       8,
       {"tensor 'w'", "dim 0 is 2.0"}},
      {R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})",
       8,
       {"tensor 'w'", "dim 0 is \"2\""}},
      {R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})",
       0,
       {"tensor 'w'", "more elements than fit in 64 bits"}},
      {R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,0]}})",
       0,
       {"tensor 'w'", "more elements"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
       4,
       {"tensor 'w'", "data_offsets must be"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})",
       4,
       {"tensor 'w'", "data_offsets must be"}},
      {R"({"w":"F32"})", 4, {"tensor 'w'", "must be an object"}},
      {R"({"__metadata__":null})", 0, {"__metadata__ must be an object"}},
      {R"({"__metadata__":{"a":{"b":"c"}}})", 0, {"__metadata__ key 'a'"}},
      // Containers are refused wherever the schema has none, at their first byte.
      {"[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]", 0, {"header must be a JSON object, got array"}},
      {R"({"w":{"dtype":"F32","shape":[[[[1]]]],"data_offsets":[0,4]}})",
       4,
       {"tensor 'w' shape dim 0 is array"}},
      {R"({"__metadata__":{"a":"b"},"__metadata__":{"a":"b"}})", 0, {"duplicate __metadata__"}},
      {R"({"__metadata__":{"a":"b","a":"c"}})", 0, {"duplicate key 'a'", "'__metadata__'"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":{"begin":0}}})",
       4,
       {"tensor 'w' data_offsets must be two non-negative integers", "got object"}},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} trailing)",
       4,
       {"not valid JSON"}},
      {"{\"" + std::string(kMaxTensorNameBytes + 1, 'n') +
           R"(":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})",
       0,
       {"is 1025 bytes, over the limit of 1024"}},
      {R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
           "e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
       4,
       {"tensor 'e'", "overlaps tensor 'a'"}},
      {"", 0, {"not valid JSON"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    const absl::Status status = ParseError(c.header, c.data_size);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("h.safetensors"));
    for (const std::string& s : c.substrings)
      EXPECT_THAT(std::string(status.message()), HasSubstr(s));
  }
}

TEST(SafetensorsHeaderTest, BufferParserChecksLengthPrefix) {
  const std::string header = R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  const std::string image = FileImage(header, "ab");
  auto layout =
      ParseSafetensorsBuffer({reinterpret_cast<const uint8_t*>(image.data()), image.size()}, "mem");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->data_offset, 8 + header.size());
  EXPECT_EQ(layout->data_size, 2u);
  ASSERT_EQ(layout->tensors.size(), 1u);

  const std::string zero = FileImage("", "");
  auto status =
      ParseSafetensorsBuffer({reinterpret_cast<const uint8_t*>(zero.data()), zero.size()}, "mem")
          .status();
  EXPECT_THAT(status.message(), HasSubstr("mem: header length is 0"));
  const std::string one_past = image.substr(0, 8 + header.size() - 1);
  status = ParseSafetensorsBuffer(
               {reinterpret_cast<const uint8_t*>(one_past.data()), one_past.size()}, "mem")
               .status();
  EXPECT_THAT(status.message(), HasSubstr("runs past the end of the file"));
}

}  // namespace
}  // namespace eagle3
