#include "tensor_reads.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "eagle3/half.h"
#include "eagle3/safetensors.h"
#include "eagle3/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scoped_temp_dir.h"
#include "thread_pool.h"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// `n` pseudo-random floats in [-2, 2), 1/1024 apart.
std::vector<float> RandomFloats(int64_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  std::generate(v.begin(), v.end(), [&rng] { return std::ldexp(static_cast<float>(rng() % 4096) - 2048.0f, -10); });
  return v;
}

// The file offset of the data section: every byte after it belongs to a tensor.
uint64_t DataOffset(const std::string& path, const SafetensorsFile& file) {
  uint64_t end = 0;
  for (const TensorInfo& info : file.tensors()) end = std::max(end, info.end);
  return fs::file_size(path) - end;
}

// `runs` of `info` read as `dtype` into a buffer of the runs' extent, prefilled with 0xA5 (so that
// what lies between runs is compared too), on `pool` (null: the calling thread alone).
absl::StatusOr<std::vector<uint8_t>> ReadInto(const SafetensorsFile::Reader& reader, const TensorInfo& info,
                                              const ElementRuns& runs, DType dtype, ThreadPool* pool) {
  std::vector<uint64_t> words(((runs.count - 1) * runs.dst_stride + runs.run) * DTypeSize(dtype) / 8 + 1);
  std::memset(words.data(), 0xA5, words.size() * 8);
  const absl::Status read = ReadElementRuns(reader, info, runs, words.data(), dtype, pool, "test read");
  if (!read.ok()) return read;
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(words.data());
  return std::vector<uint8_t>(bytes, bytes + words.size() * 8);
}

// Reads cut into pieces on 2, 3 and 4 threads write the bytes the one-thread read writes, and no
// others: one range (whole tensors, an unaligned part) same-dtype and converted, back-to-back rows
// converted, column slices read coalesced (FP8 as it is stored, bf16 to f32, into wider rows), run
// by run (gaps of pages) and rows longer than the scratch buffer. Each case moves at least two
// pieces' worth of bytes, so that the pools split it.
TEST(TensorReadsTest, SplitReadsWriteWhatOneThreadWrites) {
  ScopedTempDir dir;
  const std::vector<float> f32 = RandomFloats(1300 * 1100, 1);
  std::vector<uint16_t> bf16(1100 * 1300);
  const std::vector<float> bf16_values = RandomFloats(1100 * 1300, 2);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = FloatToBf16(bf16_values[i]);
  std::vector<uint8_t> fp8(2048 * 1000);
  std::mt19937 rng(3);
  for (uint8_t& b : fp8) b = static_cast<uint8_t>(rng() % 0x7f) | static_cast<uint8_t>((rng() & 1) << 7);
  std::vector<int64_t> ids(400000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919 % 2000003) - 1000000;
  const std::vector<float> wide = RandomFloats(400 * 4096, 4);
  const std::vector<float> long_rows = RandomFloats(6 * 70000, 5);
  const std::string path = dir.File("model.safetensors");
  const std::vector<NamedTensor> tensors = {
      {"f32", TensorView(const_cast<float*>(f32.data()), DType::kF32, Shape{1300, 1100})},
      {"bf16", TensorView(bf16.data(), DType::kBF16, Shape{1100, 1300})},
      {"fp8", TensorView(fp8.data(), DType::kF8E4M3, Shape{2048, 1000})},
      {"ids", TensorView(ids.data(), DType::kI64, Shape{400000})},
      {"wide", TensorView(const_cast<float*>(wide.data()), DType::kF32, Shape{400, 4096})},
      {"long", TensorView(const_cast<float*>(long_rows.data()), DType::kF32, Shape{6, 70000})},
  };
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto reader = (*file)->OpenReader();
  ASSERT_TRUE(reader.ok()) << reader.status();

  struct Case {
    std::string name;
    ElementRuns runs;
    DType dtype;
  };
  auto whole = [](int64_t n) { return ElementRuns{.first = 0, .run = n, .stride = n, .count = 1, .dst_stride = n}; };
  auto columns = [](int64_t row, int64_t begin, int64_t end, int64_t rows, int64_t dst_row) {
    return ElementRuns{.first = begin, .run = end - begin, .stride = row, .count = rows, .dst_stride = dst_row};
  };
  const std::vector<Case> cases = {
      {"f32", whole(1300 * 1100), DType::kF32},
      {"f32", whole(1300 * 1100), DType::kBF16},
      {"f32", {.first = 12345, .run = 1300 * 1100 - 20000, .stride = 1300 * 1100 - 20000, .count = 1,
               .dst_stride = 1300 * 1100 - 20000},
       DType::kF16},
      {"f32", {.first = 0, .run = 1100, .stride = 1100, .count = 1300, .dst_stride = 1100}, DType::kBF16},
      {"bf16", whole(1100 * 1300), DType::kF32},
      {"bf16", columns(1300, 100, 425, 1100, 325), DType::kBF16},
      {"bf16", columns(1300, 100, 425, 1100, 325), DType::kF32},
      {"bf16", columns(1300, 100, 425, 1100, 400), DType::kF32},
      {"fp8", whole(2048 * 1000), DType::kF8E4M3},
      {"fp8", whole(2048 * 1000), DType::kBF16},
      {"fp8", columns(1000, 250, 500, 2048, 250), DType::kF8E4M3},
      {"fp8", columns(1000, 250, 500, 2048, 250), DType::kF32},
      {"ids", whole(400000), DType::kI32},
      {"wide", columns(4096, 0, 2048, 400, 2048), DType::kF32},
      {"wide", columns(4096, 1000, 3048, 400, 2100), DType::kBF16},
      {"long", columns(70000, 1000, 69000, 6, 68000), DType::kF32},
      {"long", columns(70000, 1000, 69000, 6, 68000), DType::kF16},
  };
  ThreadPool two(2), three(3), four(4);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.name << " first " << c.runs.first << " run " << c.runs.run << " stride "
                                      << c.runs.stride << " count " << c.runs.count << " into " << c.runs.dst_stride
                                      << " as " << DTypeName(c.dtype));
    const TensorInfo* info = (*file)->Find(c.name);
    ASSERT_NE(info, nullptr);
    auto alone = ReadInto(*reader, *info, c.runs, c.dtype, nullptr);
    ASSERT_TRUE(alone.ok()) << alone.status();
    for (ThreadPool* pool : {&two, &three, &four}) {
      auto split = ReadInto(*reader, *info, c.runs, c.dtype, pool);
      ASSERT_TRUE(split.ok()) << split.status();
      EXPECT_TRUE(*split == *alone) << pool->threads() << " threads";
    }
  }
  // The one-thread read itself is the file's bytes.
  auto bytes = ReadInto(*reader, *(*file)->Find("f32"), whole(1300 * 1100), DType::kF32, &four);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(std::memcmp(bytes->data(), f32.data(), f32.size() * sizeof(float)), 0);
}

// A file cut short after the reader opened it: every piece from the cut on fails, and the status is
// the first of them in the file, the same on every run; one thread reads the tensor in one pread.
TEST(TensorReadsTest, ReadErrorIsThePieceFirstInTheFile) {
  ScopedTempDir dir;
  const std::vector<float> small = RandomFloats(16, 6);
  const std::vector<float> big = RandomFloats(1 << 20, 7);  // 4 MiB: 8 pieces
  const std::string path = dir.File("model.safetensors");
  const std::vector<NamedTensor> tensors = {
      {"a", TensorView(const_cast<float*>(small.data()), DType::kF32, Shape{16})},
      {"big", TensorView(const_cast<float*>(big.data()), DType::kF32, Shape{1024, 1024})},
  };
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorInfo* info = (*file)->Find("big");
  ASSERT_NE(info, nullptr);
  const uint64_t start = DataOffset(path, **file) + info->begin;
  auto reader = (*file)->OpenReader();
  ASSERT_TRUE(reader.ok()) << reader.status();
  const uint64_t cut = 5 * kReadPieceBytes / 2 + 1000;  // inside piece 2
  fs::resize_file(path, start + cut);

  const ElementRuns all{.first = 0, .run = 1 << 20, .stride = 1 << 20, .count = 1, .dst_stride = 1 << 20};
  const absl::Status alone = ReadInto(*reader, *info, all, DType::kF32, nullptr).status();
  EXPECT_EQ(alone.code(), absl::StatusCode::kDataLoss) << alone;
  EXPECT_THAT(alone.message(), HasSubstr(path + ": file changed while loading: expected 4194304 bytes at offset " +
                                         std::to_string(start) + ", read " + std::to_string(cut)));
  EXPECT_THAT(alone.message(), HasSubstr("(reading tensor 'big')"));

  const uint64_t piece = 2 * kReadPieceBytes;
  const std::string expected = path + ": file changed while loading: expected " + std::to_string(kReadPieceBytes) +
                               " bytes at offset " + std::to_string(start + piece) + ", read " +
                               std::to_string(cut - piece);
  ThreadPool pool(4);
  for (int run = 0; run < 20; ++run) {
    const absl::Status split = ReadInto(*reader, *info, all, DType::kF32, &pool).status();
    ASSERT_EQ(split.code(), absl::StatusCode::kDataLoss) << split;
    ASSERT_THAT(split.message(), HasSubstr(expected)) << "run " << run;
    ASSERT_THAT(split.message(), HasSubstr("(reading tensor 'big')"));
  }

  // The left half of every row, read coalesced in pieces of whole rows: the piece that holds the
  // cut fails, in the load that holds it (so it read some bytes), on every run; a converted read too.
  const ElementRuns left{.first = 0, .run = 512, .stride = 1024, .count = 1024, .dst_stride = 512};
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const absl::Status first = ReadInto(*reader, *info, left, dtype, &pool).status();
    ASSERT_EQ(first.code(), absl::StatusCode::kDataLoss) << first;
    EXPECT_THAT(first.message(), HasSubstr(path + ": file changed while loading: expected "));
    EXPECT_THAT(first.message(), HasSubstr("(reading tensor 'big')"));
    EXPECT_THAT(first.message(), Not(HasSubstr(", read 0 ")));
    for (int run = 0; run < 20; ++run) {
      ASSERT_EQ(ReadInto(*reader, *info, left, dtype, &pool).status(), first) << "run " << run;
    }
  }
  // Wholly before the cut: read as ever.
  const ElementRuns head{.first = 0, .run = 1 << 18, .stride = 1 << 18, .count = 1, .dst_stride = 1 << 18};
  auto before = ReadInto(*reader, *info, head, DType::kF32, &pool);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(std::memcmp(before->data(), big.data(), sizeof(float) << 18), 0);
}

// Values that do not convert, in two pieces: the status names the first, as a read on one thread
// does, in a range and in column runs.
TEST(TensorReadsTest, ConversionErrorIsTheFirstInTheFile) {
  ScopedTempDir dir;
  std::vector<int64_t> ids(1200 * 500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 1000) - 500;
  ids[200 * 500 + 150] = int64_t{1} << 40;  // row 200, column 150
  ids[900 * 500 + 300] = -(int64_t{1} << 41);
  const std::string path = dir.File("model.safetensors");
  const std::vector<NamedTensor> tensors = {{"ids", TensorView(ids.data(), DType::kI64, Shape{1200, 500})}};
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto reader = (*file)->OpenReader();
  ASSERT_TRUE(reader.ok()) << reader.status();
  const TensorInfo* info = (*file)->Find("ids");
  ASSERT_NE(info, nullptr);
  const ElementRuns all{.first = 0, .run = 600000, .stride = 600000, .count = 1, .dst_stride = 600000};
  const ElementRuns slice{.first = 100, .run = 300, .stride = 500, .count = 1200, .dst_stride = 300};
  ThreadPool pool(4);
  for (const ElementRuns& runs : {all, slice}) {
    const absl::Status alone = ReadInto(*reader, *info, runs, DType::kI32, nullptr).status();
    EXPECT_EQ(alone.code(), absl::StatusCode::kOutOfRange) << alone;
    EXPECT_THAT(alone.message(), HasSubstr("1099511627776 does not fit in i32"));
    for (int run = 0; run < 20; ++run) {
      ASSERT_EQ(ReadInto(*reader, *info, runs, DType::kI32, &pool).status(), alone) << "run " << run;
    }
  }
}

}  // namespace
}  // namespace eagle3
