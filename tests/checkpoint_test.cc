#include "eagle3/checkpoint.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "eagle3/half.h"
#include "eagle3/safetensors.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/tensor_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::vector<float> RandomFloats(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

// Fixture data: a single-file checkpoint with float, bf16 and integer tensors.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    weight_ = RandomFloats(16 * 24, 1);
    weight_bf16_ = ToBf16(RandomFloats(16 * 24, 2));
    cube_ = RandomFloats(4 * 8 * 16, 3);
    vector_ = RandomFloats(16, 4);
    vocab_ = ToBf16(RandomFloats(1000 * 4, 5));
    ids_ = {1, -2, 3, int64_t{1} << 40};
    const std::vector<NamedTensor> tensors = {
        {"w.f32", TensorView(weight_.data(), DType::kF32, Shape{16, 24})},
        {"w.bf16", TensorView(weight_bf16_.data(), DType::kBF16, Shape{16, 24})},
        {"cube", TensorView(cube_.data(), DType::kF32, Shape{4, 8, 16})},
        {"vec", TensorView(vector_.data(), DType::kF32, Shape{16})},
        {"embed", TensorView(vocab_.data(), DType::kBF16, Shape{1000, 4})},
        {"ids", TensorView(ids_.data(), DType::kI64, Shape{4})},
        {"scalar", TensorView(vector_.data(), DType::kF32, Shape{})},
        {"model.layers.0.self_attn.o_proj.weight",
         TensorView(vocab_.data(), DType::kBF16, Shape{4, 1000})},
    };
    ASSERT_TRUE(WriteSafetensors(dir_.File("model.safetensors"), tensors).ok());
    auto checkpoint = Checkpoint::Open(dir_.path());
    ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
    checkpoint_ = std::move(*checkpoint);
  }

  ScopedTempDir dir_;
  std::vector<float> weight_, cube_, vector_;
  std::vector<uint16_t> weight_bf16_, vocab_;
  std::vector<int64_t> ids_;
  std::unique_ptr<Checkpoint> checkpoint_;
};

TEST_F(CheckpointTest, NamesInfoViewAndExpectShape) {
  EXPECT_EQ(checkpoint_->dir(), dir_.path());
  EXPECT_EQ(
      checkpoint_->TensorNames(),
      (std::vector<std::string>{"cube", "embed", "ids", "model.layers.0.self_attn.o_proj.weight",
                                "scalar", "vec", "w.bf16", "w.f32"}));
  EXPECT_TRUE(checkpoint_->Has("w.f32"));
  EXPECT_FALSE(checkpoint_->Has("w"));
  auto info = checkpoint_->Info("cube");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->shape, (Shape{4, 8, 16}));
  EXPECT_EQ(info->dtype, DType::kF32);
  auto file = checkpoint_->FileOf("cube");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*file, dir_.File("model.safetensors"));

  auto view = checkpoint_->View("w.f32");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(std::memcmp(view->data(), weight_.data(), weight_.size() * sizeof(float)), 0);

  auto missing = checkpoint_->Info("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'nope'"));
  EXPECT_THAT(missing.status().message(), HasSubstr(dir_.path()));

  EXPECT_TRUE(checkpoint_->ExpectShape("w.f32", Shape{16, 24}).ok());
  const absl::Status mismatch = checkpoint_->ExpectShape("w.f32", Shape{24, 16});
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mismatch.message(), "tensor 'w.f32' in '" + dir_.File("model.safetensors") +
                                    "' has shape [16, 24], expected [24, 16]");
}

TEST_F(CheckpointTest, ReadConverts) {
  auto same = checkpoint_->Read("w.f32", DType::kF32);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(std::memcmp(same->data(), weight_.data(), weight_.size() * sizeof(float)), 0);

  auto to_bf16 = checkpoint_->Read("w.f32", DType::kBF16);
  ASSERT_TRUE(to_bf16.ok()) << to_bf16.status();
  EXPECT_EQ(to_bf16->shape(), (Shape{16, 24}));
  for (size_t i = 0; i < weight_.size(); ++i) {
    ASSERT_EQ(to_bf16->data_as<uint16_t>()[i], FloatToBf16(weight_[i])) << i;
  }
  auto to_f32 = checkpoint_->Read("w.bf16", DType::kF32);
  ASSERT_TRUE(to_f32.ok());
  for (size_t i = 0; i < weight_bf16_.size(); ++i) {
    ASSERT_EQ(to_f32->data_as<float>()[i], Bf16ToFloat(weight_bf16_[i])) << i;
  }
  auto to_f16 = checkpoint_->Read("w.bf16", DType::kF16);
  ASSERT_TRUE(to_f16.ok());
  EXPECT_EQ(to_f16->data_as<uint16_t>()[5], FloatToF16(Bf16ToFloat(weight_bf16_[5])));

  auto scalar = checkpoint_->Read("scalar", DType::kF32);
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->rank(), 0);
  EXPECT_EQ(scalar->data_as<float>()[0], vector_[0]);

  auto ids64 = checkpoint_->Read("ids", DType::kI64);
  ASSERT_TRUE(ids64.ok());
  EXPECT_EQ(ids64->data_as<int64_t>()[3], int64_t{1} << 40);
  auto ids32 = checkpoint_->Read("ids", DType::kI32);  // 1 << 40 does not fit
  EXPECT_EQ(ids32.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(ids32.status().message(), HasSubstr("tensor 'ids'"));
  auto ids_float = checkpoint_->Read("ids", DType::kF32);
  EXPECT_EQ(ids_float.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids_float.status().message(), HasSubstr("cannot convert tensor 'ids'"));
  EXPECT_THAT(ids_float.status().message(), HasSubstr("from i64 to f32"));
  auto float_ids = checkpoint_->Read("w.f32", DType::kI32);
  EXPECT_EQ(float_ids.status().code(), absl::StatusCode::kInvalidArgument);
}

// Concatenates shards along `dim` and compares with the full tensor read as f32.
void ExpectShardsReassemble(const Checkpoint& checkpoint, const std::string& name, int dim, int tp,
                            DType dtype) {
  SCOPED_TRACE(name + " dim " + std::to_string(dim) + " tp " + std::to_string(tp));
  auto full = checkpoint.Read(name, dtype);
  ASSERT_TRUE(full.ok()) << full.status();
  const Shape& shape = full->shape();
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= shape[i];
  for (int i = dim + 1; i < shape.rank(); ++i) inner *= shape[i];
  const int64_t n = shape[dim], block = n / tp;
  const size_t esize = DTypeSize(dtype);
  std::vector<uint8_t> assembled(full->nbytes());
  for (int r = 0; r < tp; ++r) {
    auto shard = checkpoint.ReadShard(name, ShardSpec{dim, tp, r, 1}, dtype);
    ASSERT_TRUE(shard.ok()) << shard.status();
    Shape expected = shape;
    expected[dim] = block;
    ASSERT_EQ(shard->shape(), expected);
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(assembled.data() + ((o * n + r * block) * inner) * esize,
                  static_cast<const uint8_t*>(shard->data()) + (o * block * inner) * esize,
                  block * inner * esize);
    }
  }
  EXPECT_EQ(std::memcmp(assembled.data(), full->data(), full->nbytes()), 0);
}

TEST_F(CheckpointTest, ShardsReassembleExactly) {
  for (int tp : {1, 2, 8}) {
    for (int dim : {0, 1}) {
      ExpectShardsReassemble(*checkpoint_, "w.f32", dim, tp, DType::kF32);
      ExpectShardsReassemble(*checkpoint_, "w.bf16", dim, tp, DType::kBF16);
      ExpectShardsReassemble(*checkpoint_, "w.bf16", dim, tp, DType::kF32);  // converting
      ExpectShardsReassemble(*checkpoint_, "cube", dim + 1, tp, DType::kF32);
    }
    ExpectShardsReassemble(*checkpoint_, "vec", 0, tp, DType::kF32);
  }
}

// Column ranges of a 2-D tensor: every range (empty, whole, starting anywhere) equals the same
// columns of the whole tensor, converted or not; bad ranges and tensors are refused by name.
TEST_F(CheckpointTest, ReadColumnsEqualsTheWholeTensorsColumns) {
  auto whole = checkpoint_->Read("w.bf16", DType::kF32);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 24}, {0, 0}, {5, 5}, {3, 11}, {23, 24}, {0, 1}}) {
    SCOPED_TRACE(::testing::Message() << "[" << begin << ", " << end << ")");
    auto part = checkpoint_->ReadColumns("w.bf16", begin, end, DType::kF32);
    ASSERT_TRUE(part.ok()) << part.status();
    ASSERT_EQ(part->shape(), (Shape{16, end - begin}));
    for (int64_t r = 0; r < 16; ++r) {
      for (int64_t c = begin; c < end; ++c) {
        ASSERT_EQ(part->data_as<float>()[r * (end - begin) + c - begin], whole->data_as<float>()[r * 24 + c]);
      }
    }
  }
  auto same = checkpoint_->ReadColumns("w.bf16", 7, 19, DType::kBF16);
  ASSERT_TRUE(same.ok()) << same.status();
  for (int64_t r = 0; r < 16; ++r) {
    for (int64_t c = 7; c < 19; ++c) ASSERT_EQ(same->data_as<uint16_t>()[r * 12 + c - 7], weight_bf16_[r * 24 + c]);
  }
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{-1, 3}, {4, 3}, {0, 25}}) {
    const absl::Status status = checkpoint_->ReadColumns("w.f32", begin, end, DType::kF32).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("tensor 'w.f32'"));
    EXPECT_THAT(status.message(), HasSubstr("outside [0, 24]"));
  }
  const absl::Status cube = checkpoint_->ReadColumns("cube", 0, 1, DType::kF32).status();
  EXPECT_EQ(cube.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cube.message(), HasSubstr("needs a 2-D tensor"));
  EXPECT_EQ(checkpoint_->ReadColumns("nope", 0, 1, DType::kF32).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, VocabPaddingGivesZeroRows) {
  constexpr int kTp = 8;
  std::vector<uint16_t> assembled;
  for (int r = 0; r < kTp; ++r) {
    auto shard = checkpoint_->ReadShard("embed", ShardSpec{0, kTp, r, 512}, DType::kBF16);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_EQ(shard->shape(), (Shape{128, 4}));
    const uint16_t* p = shard->data_as<uint16_t>();
    assembled.insert(assembled.end(), p, p + 128 * 4);
  }
  ASSERT_EQ(assembled.size(), 1024u * 4);
  for (size_t i = 0; i < vocab_.size(); ++i) ASSERT_EQ(assembled[i], vocab_[i]) << i;
  for (size_t i = vocab_.size(); i < assembled.size(); ++i) ASSERT_EQ(assembled[i], 0) << i;

  // The same padding on dim 1 (columns) and into caller memory of another dtype.
  auto shape = checkpoint_->ShardShape("model.layers.0.self_attn.o_proj.weight",
                                       ShardSpec{1, kTp, kTp - 1, 512});
  ASSERT_TRUE(shape.ok()) << shape.status();
  ASSERT_EQ(*shape, (Shape{4, 128}));
  std::vector<float> out(4 * 128, -1.0f);
  ASSERT_TRUE(checkpoint_
                  ->ReadShardInto("model.layers.0.self_attn.o_proj.weight",
                                  ShardSpec{1, kTp, kTp - 1, 512},
                                  TensorView(out.data(), DType::kF32, *shape))
                  .ok());
  for (int row = 0; row < 4; ++row) {
    for (int col = 0; col < 128; ++col) {
      const int source_col = 7 * 128 + col;
      const float expected =
          source_col < 1000 ? Bf16ToFloat(vocab_[row * 1000 + source_col]) : 0.0f;
      ASSERT_EQ(out[row * 128 + col], expected) << row << "," << col;
    }
  }
}

TEST_F(CheckpointTest, ShardSpecErrors) {
  const std::string o_proj = "model.layers.0.self_attn.o_proj.weight";  // [4, 1000]
  auto status = checkpoint_->ReadShard(o_proj, ShardSpec{1, 16, 0, 1}, DType::kF32).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("tensor 'model.layers.0.self_attn.o_proj.weight' dim 1 = 1000 is not "
                        "divisible by tp_size 16"));
  struct Case {
    std::string name;
    ShardSpec spec;
    std::string substring;
  };
  const std::vector<Case> cases = {
      {"w.f32", {0, 0, 0, 1}, "tp_size 0 must be >= 1"},
      {"w.f32", {0, 2, 2, 1}, "rank 2 is out of range [0, 2)"},
      {"w.f32", {0, 2, -1, 1}, "rank -1 is out of range"},
      {"w.f32", {2, 2, 0, 1}, "shard dim 2 is out of range for shape [16, 24]"},
      {"vec", {1, 1, 0, 1}, "shard dim 1 is out of range for shape [16]"},
      {"scalar", {0, 1, 0, 1}, "shard dim 0 is out of range for shape []"},
      {"w.f32", {-1, 1, 0, 1}, "shard dim -1"},
      {"w.f32", {0, 8, 0, 0}, "pad_to_multiple 0 must be >= 1"},
      {"w.f32", {0, 8, 0, 100}, "pad_to_multiple 100 is not a multiple of tp_size 8"},
      {"w.f32", {0, 8, 0, int64_t{1} << 62}, "overflows"},
      {"ids", {0, 1, 0, 1}, "from i64 to f32"},
      {"nope", {0, 1, 0, 1}, "'nope' not found"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.substring);
    status = checkpoint_->ReadShard(c.name, c.spec, DType::kF32).status();
    EXPECT_FALSE(status.ok());
    EXPECT_THAT(status.message(), HasSubstr(c.substring));
    EXPECT_THAT(status.message(), HasSubstr("'" + c.name + "'"));
  }

  std::vector<float> small(8);
  status = checkpoint_->ReadShardInto("w.f32", ShardSpec{0, 2, 0, 1},
                                      TensorView(small.data(), DType::kF32, Shape{2, 4}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("shape [8, 24]"));
}

// An allocator that claims to be a device: reads must refuse it rather than write host data there.
class FakeDeviceAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cuda(0); }
  absl::StatusOr<void*> Allocate(size_t, size_t) override {
    return absl::InternalError("must not be called");
  }
  void Deallocate(void*, size_t) override {}
};

TEST_F(CheckpointTest, RefusesDeviceAllocators) {
  FakeDeviceAllocator device;
  auto read = checkpoint_->Read("w.f32", DType::kF32, device);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read.status().message(), HasSubstr("host allocator"));
  auto shard = checkpoint_->ReadShard("w.f32", ShardSpec{}, DType::kF32, device);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointShardedTest, IndexAndShards) {
  ScopedTempDir dir;
  std::vector<float> a = RandomFloats(6, 7), b = RandomFloats(8, 8);
  const NamedTensor ta{"layer.a", TensorView(a.data(), DType::kF32, Shape{2, 3})};
  const NamedTensor tb{"layer.b", TensorView(b.data(), DType::kF32, Shape{8})};
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00001-of-00002.safetensors"), {&ta, 1}).ok());
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), {&tb, 1}).ok());
  std::ofstream(dir.File("model.safetensors.index.json"))
      << R"({"metadata": {"total_size": 56}, "weight_map": {
             "layer.a": "model-00001-of-00002.safetensors",
             "layer.b": "model-00002-of-00002.safetensors"}})";
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->TensorNames(), (std::vector<std::string>{"layer.a", "layer.b"}));
  EXPECT_EQ(*(*checkpoint)->FileOf("layer.b"), dir.File("model-00002-of-00002.safetensors"));
  auto read = (*checkpoint)->Read("layer.b", DType::kF32);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(std::memcmp(read->data(), b.data(), b.size() * sizeof(float)), 0);
  auto shard = (*checkpoint)->ReadShard("layer.a", ShardSpec{1, 3, 2, 1}, DType::kF32);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_EQ(shard->shape(), (Shape{2, 1}));
  EXPECT_EQ(shard->data_as<float>()[0], a[2]);
  EXPECT_EQ(shard->data_as<float>()[1], a[5]);
}

TEST(CheckpointMisalignedTest, ConvertsFromOddOffsets) {
  ScopedTempDir dir;
  // One u8 byte first leaves the bf16 tensor [3, 4] at an odd file offset.
  std::string header = R"({"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("w":{"dtype":"BF16","shape":[3,4],"data_offsets":[1,25]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string image(8, '\0');
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  image += header;
  image += '\x7f';
  std::vector<float> values(12);
  for (int i = 0; i < 12; ++i) {
    values[i] = static_cast<float>(i) - 5.5f;
    const uint16_t bits = FloatToBf16(values[i]);
    image += static_cast<char>(bits & 0xff);
    image += static_cast<char>(bits >> 8);
  }
  std::ofstream(dir.File("model.safetensors"), std::ios::binary) << image;
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto full = (*checkpoint)->Read("w", DType::kF32);
  ASSERT_TRUE(full.ok()) << full.status();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(full->data_as<float>()[i], values[i]);
  auto shard = (*checkpoint)->ReadShard("w", ShardSpec{1, 2, 1, 1}, DType::kF32);
  ASSERT_TRUE(shard.ok()) << shard.status();
  for (int row = 0; row < 3; ++row) {
    for (int col = 0; col < 2; ++col) {
      EXPECT_EQ(shard->data_as<float>()[row * 2 + col], values[row * 4 + 2 + col]);
    }
  }
  auto view = (*checkpoint)->View("w");
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(view->data()) % 2, 0u);
  EXPECT_EQ(Bf16ToFloat(view->data_as<uint16_t>()[11]), values[11]);
}

// Columns [begin, end) of every row of 2-D `name` as the reader read them before it coalesced
// rows: one ReadBytes per row, converted row by row. InvalidArgument for an unknown tensor.
absl::StatusOr<Tensor> RowByRow(const SafetensorsFile& file, const std::string& name, int64_t begin, int64_t end,
                                DType dtype) {
  const TensorInfo* info = file.Find(name);
  if (info == nullptr) return absl::InvalidArgumentError("no tensor " + name);
  const int64_t rows = info->shape[0], columns = info->shape[1], width = end - begin;
  const size_t src_size = DTypeSize(info->dtype);
  EAGLE3_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(dtype, Shape{rows, width}));
  std::vector<uint64_t> row((static_cast<size_t>(width) * src_size + 7) / 8);
  for (int64_t r = 0; r < rows; ++r) {
    EAGLE3_RETURN_IF_ERROR(file.ReadBytes(*info, (r * columns + begin) * src_size, row.data(), width * src_size));
    EAGLE3_RETURN_IF_ERROR(ConvertTensor(TensorView(row.data(), info->dtype, Shape{width}),
                                         TensorView(static_cast<uint8_t*>(out.data()) + r * width * DTypeSize(dtype),
                                                    dtype, Shape{width})));
  }
  return out;
}

// Column slices read in few large reads (the rows of one read scattered from a scratch buffer)
// equal the row-by-row reads they replace, byte for byte: odd shapes larger than the scratch
// buffer, so that its loads end inside a row, slices starting inside a row, conversions or none,
// rows too far apart or too long to read together, ShardSpec's column blocks with and without
// padding; a conversion error names the row it is in, as a row-by-row read did; and a file changed
// since Open is still reported.
TEST(CheckpointColumnReadsTest, EqualRowByRowReads) {
  ScopedTempDir dir;
  const std::vector<uint16_t> odd = ToBf16(RandomFloats(1031 * 333, 11));  // rows of 666 bytes
  std::vector<uint8_t> fp8(2053 * 129);                                   // 265 KB: two scratch loads
  std::mt19937 rng(12);
  for (uint8_t& b : fp8) b = static_cast<uint8_t>(rng() % 0x7f);  // finite e4m3, both signs below
  for (size_t i = 0; i < fp8.size(); i += 3) fp8[i] |= 0x80;
  const std::vector<float> wide = RandomFloats(67 * 1500, 13);      // rows of 6000 bytes
  const std::vector<float> long_rows = RandomFloats(3 * 70000, 14);  // rows longer than the scratch
  std::vector<int32_t> words(300 * 37);
  for (size_t i = 0; i < words.size(); ++i) words[i] = static_cast<int32_t>(rng());
  std::vector<int64_t> ids(500 * 7);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) - 1000;
  ids[321 * 7 + 3] = int64_t{1} << 40;  // does not fit in i32
  const std::vector<NamedTensor> tensors = {
      {"odd", TensorView(const_cast<uint16_t*>(odd.data()), DType::kBF16, Shape{1031, 333})},
      {"fp8", TensorView(fp8.data(), DType::kF8E4M3, Shape{2053, 129})},
      {"wide", TensorView(const_cast<float*>(wide.data()), DType::kF32, Shape{67, 1500})},
      {"long", TensorView(const_cast<float*>(long_rows.data()), DType::kF32, Shape{3, 70000})},
      {"words", TensorView(words.data(), DType::kI32, Shape{300, 37})},
      {"ids", TensorView(ids.data(), DType::kI64, Shape{500, 7})},
  };
  const std::string path = dir.File("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();

  struct Case {
    std::string name;
    int64_t begin, end;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {"odd", 37, 101, DType::kF32},    {"odd", 37, 101, DType::kBF16}, {"odd", 0, 333, DType::kF32},
      {"odd", 332, 333, DType::kF16},   {"odd", 1, 2, DType::kBF16},    {"odd", 5, 5, DType::kF32},
      {"fp8", 64, 129, DType::kF32},    {"fp8", 3, 67, DType::kF8E4M3}, {"fp8", 0, 129, DType::kBF16},
      {"wide", 10, 20, DType::kF32},    {"wide", 1499, 1500, DType::kBF16},
      {"long", 100, 69000, DType::kBF16}, {"long", 7, 8, DType::kF32},
      {"words", 5, 9, DType::kI32},     {"words", 0, 37, DType::kI32},  {"ids", 0, 3, DType::kI32},
      {"ids", 4, 7, DType::kI64},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.name << " [" << c.begin << ", " << c.end << ") as "
                                      << DTypeName(c.dtype));
    auto expected = RowByRow(**file, c.name, c.begin, c.end, c.dtype);
    ASSERT_TRUE(expected.ok()) << expected.status();
    auto got = (*checkpoint)->ReadColumns(c.name, c.begin, c.end, c.dtype);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->shape(), expected->shape());
    EXPECT_EQ(std::memcmp(got->data(), expected->data(), got->nbytes()), 0);
  }

  // ShardSpec's column blocks: [1031, 333] in three, and padded to 336 in four (the last block
  // 81 columns and 3 of zeros).
  for (const auto& [tp, pad] : std::vector<std::pair<int, int64_t>>{{3, 1}, {4, 336}}) {
    for (int r = 0; r < tp; ++r) {
      for (DType dtype : {DType::kF32, DType::kBF16}) {
        SCOPED_TRACE(::testing::Message() << "tp " << tp << " rank " << r << " as " << DTypeName(dtype));
        auto got = (*checkpoint)->ReadShard("odd", ShardSpec{1, tp, r, pad}, dtype);
        ASSERT_TRUE(got.ok()) << got.status();
        const int64_t block = PaddedSize(333, pad) / tp, begin = block * r, end = std::min<int64_t>(begin + block, 333);
        auto expected = RowByRow(**file, "odd", begin, end, dtype);
        ASSERT_TRUE(expected.ok()) << expected.status();
        const size_t esize = DTypeSize(dtype);
        for (int64_t row = 0; row < 1031; ++row) {
          const uint8_t* g = static_cast<const uint8_t*>(got->data()) + row * block * esize;
          ASSERT_EQ(std::memcmp(g, static_cast<const uint8_t*>(expected->data()) + row * (end - begin) * esize,
                                (end - begin) * esize),
                    0)
              << row;
          for (size_t i = (end - begin) * esize; i < block * esize; ++i) ASSERT_EQ(g[i], 0) << row;
        }
      }
    }
  }

  // The value that does not fit sits in row 321, column 3: both reads name that row's first
  // element, 321 * 7 + begin, and its place in the row.
  const std::string named = "(elements from " + std::to_string(321 * 7 + 2) + "): ";
  const absl::Status columns = (*checkpoint)->ReadColumns("ids", 2, 5, DType::kI32).status();
  EXPECT_EQ(columns.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(columns.message(), HasSubstr("tensor 'ids' in '" + path + "' " + named));
  EXPECT_THAT(columns.message(), HasSubstr("element 1 = 1099511627776 does not fit in i32"));
  const absl::Status whole_rows = (*checkpoint)->ReadShard("ids", ShardSpec{1, 1, 0, 1}, DType::kI32).status();
  EXPECT_EQ(whole_rows.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(whole_rows.message(), HasSubstr("(elements from " + std::to_string(321 * 7) + "): "));
  EXPECT_THAT(whole_rows.message(), HasSubstr("element 3 = 1099511627776 does not fit in i32"));
  EXPECT_EQ((*checkpoint)->ReadColumns("ids", 4, 7, DType::kI32).status().code(), absl::StatusCode::kOk);

  // Rewritten in place after Open (same size, new modification time): the coalesced reads still
  // report it.
  const struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  const absl::Status changed = (*checkpoint)->ReadColumns("odd", 37, 101, DType::kF32).status();
  EXPECT_EQ(changed.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(changed.message(), HasSubstr("file changed while loading"));
}

// Reads split across threads (tensors of several pieces, see CheckpointReadOptions) return the
// tensors one thread returns: whole tensors converted or not, row and column shards with padding
// (the FP8 down_proj form: a column slice of a wide matrix, as stored and dequantized to bf16), and
// column ranges.
TEST(CheckpointReadThreadsTest, SplitReadsEqualOneThread) {
  ScopedTempDir dir;
  const std::vector<uint16_t> embed = ToBf16(RandomFloats(3000 * 700, 21));  // 4.2 MB
  std::vector<uint8_t> up(2048 * 1024), down(1024 * 2048);                   // 2 MB each
  std::mt19937 rng(22);
  for (uint8_t& b : up) b = static_cast<uint8_t>(rng() % 0x7f) | static_cast<uint8_t>((rng() & 1) << 7);
  for (uint8_t& b : down) b = static_cast<uint8_t>(rng() % 0x7f);
  const std::vector<float> dense = RandomFloats(700 * 1500, 23);  // 4.2 MB
  const std::vector<NamedTensor> tensors = {
      {"embed", TensorView(const_cast<uint16_t*>(embed.data()), DType::kBF16, Shape{3000, 700})},
      {"up", TensorView(up.data(), DType::kF8E4M3, Shape{2048, 1024})},
      {"down", TensorView(down.data(), DType::kF8E4M3, Shape{1024, 2048})},
      {"dense", TensorView(const_cast<float*>(dense.data()), DType::kF32, Shape{700, 1500})},
  };
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), tensors).ok());
  auto one = Checkpoint::Open(dir.path(), {.threads = 1});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)->read_threads(), 1);
  using Read = std::function<absl::StatusOr<Tensor>(const Checkpoint&)>;
  const std::vector<std::pair<std::string, Read>> reads = {
      {"embed as f32", [](const Checkpoint& c) { return c.Read("embed", DType::kF32); }},
      {"embed as bf16", [](const Checkpoint& c) { return c.Read("embed", DType::kBF16); }},
      {"embed rows, padded", [](const Checkpoint& c) { return c.ReadShard("embed", {0, 2, 1, 3072}, DType::kF32); }},
      {"up rows", [](const Checkpoint& c) { return c.ReadShard("up", {0, 2, 0, 1}, DType::kF8E4M3); }},
      {"up columns as bf16", [](const Checkpoint& c) { return c.ReadShard("up", {1, 4, 2, 1}, DType::kBF16); }},
      {"down columns", [](const Checkpoint& c) { return c.ReadShard("down", {1, 8, 3, 1}, DType::kF8E4M3); }},
      {"down columns as f32", [](const Checkpoint& c) { return c.ReadShard("down", {1, 8, 7, 1}, DType::kF32); }},
      {"dense columns, padded", [](const Checkpoint& c) { return c.ReadShard("dense", {1, 4, 3, 1504}, DType::kBF16); }},
      {"dense column range", [](const Checkpoint& c) { return c.ReadColumns("dense", 3, 1203, DType::kF32); }},
  };
  for (int threads : {2, 4, 0}) {
    auto split = Checkpoint::Open(dir.path(), {.threads = threads});
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_EQ((*split)->read_threads(), threads == 0 ? DefaultCheckpointReadThreads() : threads);
    for (const auto& [what, read] : reads) {
      SCOPED_TRACE(what + " on " + std::to_string(threads) + " threads");
      auto expected = read(**one);
      ASSERT_TRUE(expected.ok()) << expected.status();
      auto got = read(**split);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->shape(), expected->shape());
      ASSERT_EQ(got->dtype(), expected->dtype());
      EXPECT_EQ(std::memcmp(got->data(), expected->data(), got->nbytes()), 0);
    }
  }
}

TEST(CheckpointReadThreadsTest, RefusesThreadCountsOutOfRange) {
  ScopedTempDir dir;
  const std::vector<float> v = RandomFloats(4, 24);
  const std::vector<NamedTensor> tensors = {{"v", TensorView(const_cast<float*>(v.data()), DType::kF32, Shape{4})}};
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), tensors).ok());
  for (int threads : {-1, kMaxCheckpointReadThreads + 1}) {
    auto checkpoint = Checkpoint::Open(dir.path(), {.threads = threads});
    EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kInvalidArgument) << checkpoint.status();
    EXPECT_THAT(checkpoint.status().message(),
                HasSubstr("read threads " + std::to_string(threads) + " is out of range [0, 64]"));
  }
  EXPECT_GE(DefaultCheckpointReadThreads(), 1);
  EXPECT_LE(DefaultCheckpointReadThreads(), 8);
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->read_threads(), DefaultCheckpointReadThreads());
}

TEST(PaddedSizeTest, RoundsUp) {
  EXPECT_EQ(PaddedSize(1000, 512), 1024);
  EXPECT_EQ(PaddedSize(1024, 512), 1024);
  EXPECT_EQ(PaddedSize(0, 64), 0);
  EXPECT_EQ(PaddedSize(7, 1), 7);
  EXPECT_EQ(PaddedSize(129280, 64 * 8), 129536);  // DeepSeek-V3 vocab at TP=8
}

}  // namespace
}  // namespace eagle3
