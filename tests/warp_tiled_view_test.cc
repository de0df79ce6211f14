// Warp-tiled quantized codes (QuantCodesLayout::kWarpTiles) on the CPU backend: for FP8 (128 x 128
// and odd blocks) and INT4 (group 32) slices that start inside a scale block, group or 128-column
// unit, with partial 16-row groups and k off the 128 grid, CpuBackend::TileQuantizedCodes writes
// the tiles of the host tiler (eagle3::TileQuantizedCodes) at the places QuantTileOffset names,
// zeros elsewhere, and the tiled view dequantizes, multiplies (QuantizedGemm) and runs routed
// experts (QuantizedMoeExperts, tiled and row-major experts mixed) to the row-major view's bits.
// Also WarpTiledCodesShape of the real rank shapes and of empty slices, CanWarpTile and
// WarpTiledCopy (src/linear_weight.h), and every inconsistent tiled view or tiling call refused
// naming the op and the tensor.
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/detail/quant_tiles.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host_tensor_util.h"
#include "linear_weight.h"
#include "quantized_moe_util.h"
#include "quantized_view_util.h"

namespace eagle3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A byte no tiler writes on purpose: tiles start filled with it so that a byte the tiler skips
// (padding it should zero) shows.
constexpr uint8_t kPoison = 0xa5;

bool IsInt4(const QuantizedWeightView& w) { return w.format == WeightFormat::kInt4Group; }

// Tiles of WarpTiledCodesShape(w) in w.codes' dtype, poisoned, then written by the CPU backend.
Tensor TileOnCpu(const QuantizedWeightView& w) {
  Tensor tiles = *Tensor::Empty(w.codes.dtype(), WarpTiledCodesShape(w));
  std::memset(tiles.data(), kPoison, tiles.nbytes());
  cpu::CpuBackend cpu;
  const absl::Status status = cpu.TileQuantizedCodes(w, tiles);
  EXPECT_TRUE(status.ok()) << status;
  return tiles;
}

// One matrix and the slices of it to tile.
struct MatrixCase {
  std::string name;
  QuantizationConfig quantization;
  int64_t n = 0, k = 0;
  std::vector<Slice> slices;
  bool f32_scales = false;  // int4: the scales converted to f32 (a backend may take either)
};

QuantizationConfig OddFp8Blocks() {
  QuantizationConfig q = DeepseekV3Fp8Quantization();
  q.block_out = 24;
  q.block_in = 40;
  return q;
}

std::vector<MatrixCase> Cases() {
  // FP8 slices: whole 16-row groups and 128-column units; starting at column 48 inside block 0;
  // 37 rows (a partial last group); one row; k off the 128 grid; only the touched scales held.
  const std::vector<Slice> fp8 = {
      {0, 320, 0, 384, false},    // aligned: 20 groups x 6 steps, no padding
      {0, 320, 0, 400, false},    // the whole matrix: k = 400, a partial last unit
      {64, 37, 48, 250, false},   // inside block (0, 0), 37 rows
      {160, 100, 176, 150, true},
      {200, 1, 300, 100, true},   // one row; its unit spills past the matrix's last column
      {3, 16, 128, 256, false},   // one whole group starting at row 3 (inside a scale block)
  };
  // INT4 slices (group 32, 8 values a word): col0 on a word but off the 32 grid (8, 24, 40), k off
  // the 128 grid and off a whole word (35: the last word half used), partial groups.
  const std::vector<Slice> int4 = {
      {0, 48, 0, 256, false},  {8, 37, 8, 150, true},  {0, 48, 24, 200, false},
      {47, 1, 200, 56, true},  {5, 20, 32, 35, false}, {8, 24, 40, 216, true},
  };
  return {
      {"fp8 128x128", DeepseekV3Fp8Quantization(), 320, 400, fp8},
      {"fp8 24x40", OddFp8Blocks(), 100, 130,
       {{30, 50, 17, 90, true}, {0, 100, 0, 130, false}, {7, 33, 80, 50, false}}},
      {"int4 g32 bf16 scales", KimiK2ThinkingInt4Quantization(), 48, 256, int4},
      {"int4 g32 f32 scales", KimiK2ThinkingInt4Quantization(), 48, 256, int4, true},
  };
}

// Runs `body` on the row-major view of each slice of each case.
void ForEachSlice(const std::function<void(const QuantizedWeightView&, const std::string&)>& body) {
  uint64_t seed = 40;
  for (const MatrixCase& mc : Cases()) {
    const QuantizedMatrix m = RandomQuantizedMatrix(mc.quantization, mc.n, mc.k, ++seed);
    const Tensor f32_scales = mc.f32_scales ? F32Copy(m.scales) : Tensor();
    const TensorView& scales = mc.f32_scales ? f32_scales.view() : m.scales.view();
    for (const Slice& s : mc.slices) {
      const std::string what = mc.name + " " + ::testing::PrintToString(s);
      SCOPED_TRACE(what);
      const QuantizedWeightView w = SliceView(mc.quantization, m.codes, scales, s);
      ASSERT_TRUE(w.Check("test").ok()) << w.Check("test");
      body(w, what);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(WarpTiledViewTest, TiledViewDescribesTheSameWeights) {
  ForEachSlice([](const QuantizedWeightView& w, const std::string& what) {
    const Tensor tiles = TileOnCpu(w);
    const QuantizedWeightView tiled = WithWarpTiledCodes(w, tiles);
    ASSERT_TRUE(tiled.Check("test").ok()) << tiled.Check("test");
    EXPECT_TRUE(tiled.warp_tiled());
    EXPECT_EQ(tiled.rows(), w.rows());
    EXPECT_EQ(tiled.codes.data(), tiles.data());
    // The scales and indices are w's: only the codes moved.
    EXPECT_EQ(tiled.scales.data(), w.scales.data());
    EXPECT_EQ(tiled.k, w.k);
    EXPECT_EQ(tiled.col0, w.col0);

    Tensor row_major = *Tensor::Empty(DType::kF32, Shape{w.rows(), w.k});
    Tensor from_tiles = *Tensor::Empty(DType::kF32, Shape{w.rows(), w.k});
    ASSERT_TRUE(DequantizeWeight(w, row_major).ok());
    const absl::Status status = DequantizeWeight(tiled, from_tiles);
    ASSERT_TRUE(status.ok()) << status;
    ExpectBitwiseEqual(from_tiles, row_major, what + " DequantizeWeight");
  });
}

TEST(WarpTiledViewTest, QuantizedGemmOverTilesMatchesRowMajor) {
  ForEachSlice([](const QuantizedWeightView& w, const std::string& what) {
    cpu::CpuBackend cpu;
    const Tensor tiles = TileOnCpu(w);
    const QuantizedWeightView tiled = WithWarpTiledCodes(w, tiles);
    const Tensor bias = RandomF32(Shape{w.rows()}, 2);
    for (int64_t m : {1, 5}) {
      const Tensor a = RandomF32(Shape{m, w.k}, 1);
      const Tensor c0 = RandomF32(Shape{m, w.rows()}, 3);
      for (const GemmOptions& options :
           {GemmOptions{}, GemmOptions{.alpha = 0.75f, .beta = 0.5f, .bias = &bias.view(), .b_is_weights = true}}) {
        Tensor got = Clone(c0), want = Clone(c0);
        const absl::Status status = cpu.QuantizedGemm(a, tiled, got, options);
        ASSERT_TRUE(status.ok()) << status;
        ASSERT_TRUE(cpu.QuantizedGemm(a, w, want, options).ok());
        ExpectBitwiseEqual(got, want, what + " M " + std::to_string(m));
      }
    }
  });
}

TEST(WarpTiledViewTest, BackendTilesAreTheHostTilersAtQuantTileOffset) {
  ForEachSlice([](const QuantizedWeightView& w, const std::string&) {
    const bool int4 = IsInt4(w);
    const Tensor tiles = TileOnCpu(w);
    const int64_t bytes = static_cast<int64_t>(tiles.nbytes());
    ASSERT_EQ(bytes, QuantTiledBytes(int4, w.rows(), w.k, w.col0));

    // The free function over the same codes, into differently poisoned memory: every byte must
    // be written, so the two agree whatever was there before.
    std::vector<uint8_t> host(static_cast<size_t>(bytes), static_cast<uint8_t>(~kPoison));
    TileQuantizedCodes(int4, static_cast<const uint8_t*>(w.codes.data()), w.codes.stride(0), w.rows(), w.k, w.col0,
                       host.data());
    ASSERT_EQ(std::memcmp(host.data(), tiles.data(), host.size()), 0);

    // Every byte of every row where QuantTileOffset puts it, and nothing but zeros elsewhere.
    const auto* out = static_cast<const uint8_t*>(tiles.data());
    const int64_t steps = QuantTileSteps(int4, w.k, w.col0), shift = QuantTileShift(int4, w.col0);
    const int64_t row_bytes = int4 ? 4 * ((w.k + 7) / 8) : w.k;
    const int64_t row_stride_bytes = w.codes.stride(0) * static_cast<int64_t>(DTypeSize(w.codes.dtype()));
    std::vector<bool> mapped(static_cast<size_t>(bytes), false);
    for (int64_t r = 0; r < w.rows(); ++r) {
      const auto* src = static_cast<const uint8_t*>(w.codes.data()) + r * row_stride_bytes;
      for (int64_t b = 0; b < row_bytes; ++b) {
        const int64_t at = QuantTileOffset(int4, steps, shift, r, b);
        ASSERT_GE(at, 0);
        ASSERT_LT(at, bytes);
        ASSERT_FALSE(mapped[at]) << "row " << r << " byte " << b << " lands on a byte already taken";
        mapped[at] = true;
        ASSERT_EQ(out[at], src[b]) << "row " << r << " byte " << b;
      }
    }
    for (int64_t i = 0; i < bytes; ++i) {
      if (!mapped[i]) ASSERT_EQ(out[i], 0) << "padding byte " << i;
    }
  });
}

// Expert slices whose INT4 columns start on a packed word (the tiles need it) but off the 32 grid
// and inside a 128 block, and one layout on the grid.
constexpr int64_t kInter = 40;
constexpr int64_t kHidden = 200;

std::vector<ExpertSlices> TileableLayouts() {
  return {
      {300, 448, 256, 320, Slice{70, kInter, 40, kHidden}, Slice{20, kHidden, 104, kInter}},
      {kInter, 256, kHidden, 128, Slice{0, kInter, 0, kHidden}, Slice{0, kHidden, 80, kInter}},
      {200, 512, 300, 192, Slice{129, kInter, 256, kHidden}, Slice{97, kHidden, 152, kInter}},
  };
}

void CheckTiledExperts(const QuantizationConfig& quantization, uint64_t seed) {
  constexpr int64_t kExperts = 5, kTokens = 6, kTopK = 3;
  const QuantizedExperts experts = MakeQuantizedExperts(quantization, kExperts, TileableLayouts(), seed);
  // Experts 0, 2 and 4 wholly tiled, expert 1 only its down projection, expert 3 row-major: the
  // CPU backend dequantizes each view on its own, so any mix is one set of weights.
  std::vector<Tensor> tiles;
  std::vector<QuantizedExpertWeights> mixed = experts.views;
  auto tile = [&](QuantizedWeightView& w) {
    tiles.push_back(TileOnCpu(w));
    w = WithWarpTiledCodes(w, tiles.back());
  };
  tiles.reserve(3 * kExperts);
  for (int64_t e = 0; e < kExperts; ++e) {
    if (e % 2 == 0) {
      tile(mixed[e].gate);
      tile(mixed[e].up);
    }
    if (e != 3) tile(mixed[e].down);
  }
  cpu::CpuBackend cpu;
  const Tensor x = RandomF32(Shape{kTokens, kHidden}, 1);
  Tensor ids, weights;
  RandomRouting(kTokens, kTopK, kExperts, 2, ids, weights);
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    Tensor got = Filled(Shape{kTokens, kHidden}, 0.5f), want = Filled(Shape{kTokens, kHidden}, 0.5f);
    const absl::Status status = cpu.QuantizedMoeExperts(x, ids, weights, mixed, got, accumulate);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(cpu.QuantizedMoeExperts(x, ids, weights, experts.views, want, accumulate).ok());
    ExpectBitwiseEqual(got, want, "QuantizedMoeExperts");
  }
}

TEST(WarpTiledViewTest, Fp8TiledExpertsMatchRowMajor) { CheckTiledExperts(DeepseekV3Fp8Quantization(), 300); }

TEST(WarpTiledViewTest, Int4TiledExpertsMatchRowMajor) { CheckTiledExperts(KimiK2ThinkingInt4Quantization(), 400); }

// A view with only its shape fields set: WarpTiledCodesShape reads rows(), k, col0 and format.
QuantizedWeightView ShapeOnly(WeightFormat format, int64_t rows, int64_t k, int64_t col0) {
  QuantizedWeightView w;
  w.format = format;
  w.codes = TensorView(nullptr, format == WeightFormat::kFp8Block ? DType::kF8E4M3 : DType::kI32,
                       Shape{rows, format == WeightFormat::kFp8Block ? k : Int4PackedWords(k)});
  w.k = k;
  w.col0 = col0;
  return w;
}

TEST(WarpTiledViewTest, CodesShapeOfTheRealRankShapes) {
  // A V3 FP8 routed expert's gate at TP 8 (256 x 7168): 16 groups x 112 steps of 1 KiB.
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kFp8Block, 256, 7168, 0)), (Shape{1792, 1024}));
  // K2 INT4 (256 x 7168 values): 16 groups x 56 steps of 256 words.
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kInt4Group, 256, 7168, 0)), (Shape{896, 256}));
  // Its down projection (7168 x 256): whole units.
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kFp8Block, 7168, 256, 0)), (Shape{1792, 1024}));
  // Starting at column 48 the row spills into a 57th 128-column unit: 114 steps.
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kFp8Block, 256, 7168, 48)), (Shape{16 * 114, 1024}));
  // A partial group counts whole: 17 rows are two groups.
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kInt4Group, 17, 128, 0)), (Shape{2, 256}));
  // A tiled view's rows are tiled_rows, not its codes' rows.
  QuantizedWeightView tiled = ShapeOnly(WeightFormat::kFp8Block, 1792, 1024, 0);
  tiled.layout = QuantCodesLayout::kWarpTiles;
  tiled.k = 7168;
  tiled.tiled_rows = 256;
  EXPECT_EQ(WarpTiledCodesShape(tiled), (Shape{1792, 1024}));
}

TEST(WarpTiledViewTest, EmptySlicesHaveNoTiles) {
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kFp8Block, 0, 7168, 0)), (Shape{0, 1024}));
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kFp8Block, 256, 0, 0)), (Shape{0, 1024}));
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kFp8Block, 256, 0, 48)), (Shape{0, 1024}));
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kInt4Group, 0, 7168, 0)), (Shape{0, 256}));
  EXPECT_EQ(WarpTiledCodesShape(ShapeOnly(WeightFormat::kInt4Group, 256, 0, 0)), (Shape{0, 256}));
}

// An empty slice tiles into no tiles, and its tiled view is as valid as the row-major one: a
// loader tiles whatever rank slice it is handed, empty ones included.
TEST(WarpTiledViewTest, EmptySlicesTileAndDequantize) {
  cpu::CpuBackend cpu;
  const QuantizedMatrix fp8 = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 64, 256, 5);
  const QuantizedMatrix int4 = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 64, 256, 6);
  struct EmptyCase {
    const QuantizedMatrix* m;
    Slice slice;
  };
  const std::vector<EmptyCase> cases = {
      {&fp8, {16, 0, 48, 100, false}},  // no rows
      {&fp8, {16, 20, 0, 0, false}},    // no columns, on the 128 grid
      {&fp8, {16, 20, 48, 0, false}},   // no columns, inside a unit
      {&int4, {16, 0, 8, 100, false}},
      {&int4, {16, 20, 0, 0, false}},
      {&int4, {16, 20, 64, 0, false}},
  };
  for (const EmptyCase& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.slice) + (c.m == &fp8 ? " fp8" : " int4"));
    const QuantizedWeightView w = SliceView(c.m->quantization, c.m->codes, c.m->scales, c.slice);
    ASSERT_TRUE(w.Check("test").ok()) << w.Check("test");
    Tensor tiles = *Tensor::Empty(w.codes.dtype(), WarpTiledCodesShape(w));
    ASSERT_EQ(tiles.dim(0), 0);
    const absl::Status tiled_status = cpu.TileQuantizedCodes(w, tiles);
    ASSERT_TRUE(tiled_status.ok()) << tiled_status;
    const QuantizedWeightView tiled = WithWarpTiledCodes(w, tiles);
    EXPECT_EQ(tiled.rows(), c.slice.rows);
    const absl::Status check = tiled.Check("test");
    ASSERT_TRUE(check.ok()) << check;
    Tensor out = *Tensor::Empty(DType::kF32, Shape{c.slice.rows, c.slice.cols});
    EXPECT_TRUE(DequantizeWeight(tiled, out).ok());
  }
}

TEST(WarpTiledViewTest, CanWarpTileTakesRowMajorSlicesStartingOnAWord) {
  const QuantizedMatrix fp8 = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 64, 256, 21);
  const QuantizedMatrix int4 = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 64, 256, 22);
  const QuantizedWeightView fp8_view = SliceView(fp8.quantization, fp8.codes, fp8.scales, Slice{0, 37, 48, 160});
  EXPECT_TRUE(CanWarpTile(fp8_view));
  EXPECT_TRUE(CanWarpTile(SliceView(int4.quantization, int4.codes, int4.scales, Slice{0, 37, 8, 160})));
  EXPECT_TRUE(CanWarpTile(SliceView(int4.quantization, int4.codes, int4.scales, Slice{0, 37, 24, 160})));
  // Column 12: value 4 of a word.
  EXPECT_FALSE(CanWarpTile(SliceView(int4.quantization, int4.codes, int4.scales, Slice{0, 37, 12, 160})));
  const Tensor tiles = TileOnCpu(fp8_view);
  EXPECT_FALSE(CanWarpTile(WithWarpTiledCodes(fp8_view, tiles))) << "tiled already";
  EXPECT_FALSE(CanWarpTile(QuantizedWeightView{})) << "unquantized";
}

// A quantized LinearWeight owning copies of m's codes and scales, viewing slice s.
LinearWeight OwnedSlice(const QuantizedMatrix& m, const Slice& s) {
  Tensor codes = Clone(m.codes), scales = Clone(m.scales);
  const QuantizedWeightView view = SliceView(m.quantization, codes, scales, s);
  return LinearWeight(std::move(codes), std::move(scales), view);
}

TEST(WarpTiledViewTest, WarpTiledCopyMultipliesLikeTheOriginal) {
  cpu::CpuBackend cpu;
  const QuantizedMatrix fp8 = RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 320, 400, 23);
  const QuantizedMatrix int4 = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 48, 256, 24);
  // Tight scales: the copy's scales are a strided view of the original's, copied contiguous.
  for (const auto& [m, s] : std::vector<std::pair<const QuantizedMatrix*, Slice>>{
           {&fp8, {64, 37, 48, 250, true}}, {&fp8, {0, 320, 0, 400, false}}, {&int4, {8, 37, 8, 150, true}}}) {
    SCOPED_TRACE(::testing::PrintToString(s));
    const LinearWeight w = OwnedSlice(*m, s);
    absl::StatusOr<LinearWeight> copy = WarpTiledCopy(cpu, w);
    ASSERT_TRUE(copy.ok()) << copy.status();
    const QuantizedWeightView& v = copy->quantized_view();
    EXPECT_TRUE(v.warp_tiled());
    EXPECT_FALSE(w.quantized_view().warp_tiled()) << "the original stays row-major";
    EXPECT_EQ(copy->rows(), s.rows);
    EXPECT_EQ(copy->cols(), s.cols);
    // Its own tensors: the original may be freed (a shared expert's row-major MLP is a separate
    // weight), and the view points into them.
    EXPECT_NE(copy->codes_tensor().data(), w.codes_tensor().data());
    EXPECT_NE(copy->scales_tensor().data(), w.scales_tensor().data());
    EXPECT_EQ(v.codes.data(), copy->codes_tensor().data());
    EXPECT_EQ(v.scales.data(), copy->scales_tensor().data());
    ASSERT_TRUE(v.Check("test").ok()) << v.Check("test");

    const Tensor a = RandomF32(Shape{3, s.cols}, 1);
    Tensor got = *Tensor::Empty(DType::kF32, Shape{3, s.rows}), want = *Tensor::Empty(DType::kF32, Shape{3, s.rows});
    const absl::Status status = copy->Apply(cpu, a, got);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(w.Apply(cpu, a, want).ok());
    ExpectBitwiseEqual(got, want, "Apply");
  }
}

TEST(WarpTiledViewTest, WarpTiledCopyRefusesWhatTilesCannotHold) {
  cpu::CpuBackend cpu;
  const QuantizedMatrix int4 = RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 48, 256, 25);
  const LinearWeight off_word = OwnedSlice(int4, Slice{8, 37, 12, 150, true});
  const LinearWeight dense(RandomF32(Shape{4, 8}, 1));
  absl::StatusOr<LinearWeight> tiled = WarpTiledCopy(cpu, OwnedSlice(int4, Slice{8, 37, 8, 150, true}));
  ASSERT_TRUE(tiled.ok()) << tiled.status();
  for (const LinearWeight* w : std::vector<const LinearWeight*>{&off_word, &dense, &*tiled}) {
    const absl::StatusOr<LinearWeight> copy = WarpTiledCopy(cpu, *w);
    EXPECT_EQ(copy.status().code(), absl::StatusCode::kInvalidArgument) << copy.status();
    EXPECT_THAT(std::string(copy.status().message()), HasSubstr("WarpTiledCopy: "));
  }
}

// The fixture's views: a valid FP8 slice inside a block and a valid INT4 slice off the 32 grid,
// with their tiles.
class WarpTiledBadInputTest : public ::testing::Test {
 protected:
  WarpTiledBadInputTest()
      : fp8_(RandomQuantizedMatrix(DeepseekV3Fp8Quantization(), 64, 256, 11)),
        int4_(RandomQuantizedMatrix(KimiK2ThinkingInt4Quantization(), 64, 256, 12)),
        fp8_view_(SliceView(fp8_.quantization, fp8_.codes, fp8_.scales, Slice{0, 37, 48, 160, true})),
        int4_view_(SliceView(int4_.quantization, int4_.codes, int4_.scales, Slice{0, 37, 8, 160, true})),
        fp8_tiles_(TileOnCpu(fp8_view_)),
        int4_tiles_(TileOnCpu(int4_view_)) {}

  QuantizedWeightView Fp8Tiled() const { return WithWarpTiledCodes(fp8_view_, fp8_tiles_); }
  QuantizedWeightView Int4Tiled() const { return WithWarpTiledCodes(int4_view_, int4_tiles_); }

  // DequantizeWeight and QuantizedGemm over `w` both refuse it naming themselves and every needle.
  void ExpectViewRefused(const QuantizedWeightView& w, const std::vector<std::string>& needles) {
    Tensor out = *Tensor::Empty(DType::kF32, Shape{37, 160});
    const absl::Status dequantize = DequantizeWeight(w, out);
    EXPECT_EQ(dequantize.code(), absl::StatusCode::kInvalidArgument) << dequantize;
    EXPECT_THAT(std::string(dequantize.message()), HasSubstr("DequantizeWeight: "));
    const Tensor a = RandomF32(Shape{2, 160}, 1);
    Tensor c = RandomF32(Shape{2, 37}, 2);
    const absl::Status gemm = cpu_.QuantizedGemm(a, w, c, {});
    EXPECT_EQ(gemm.code(), absl::StatusCode::kInvalidArgument) << gemm;
    EXPECT_THAT(std::string(gemm.message()), HasSubstr("QuantizedGemm: "));
    for (const std::string& n : needles) {
      EXPECT_THAT(std::string(dequantize.message()), HasSubstr(n));
      EXPECT_THAT(std::string(gemm.message()), HasSubstr(n));
    }
  }

  // TileQuantizedCodes(w, tiles) refuses naming itself and every needle, and leaves tiles as
  // they were (the checks come before any write).
  void ExpectTileRefused(const QuantizedWeightView& w, const TensorView& tiles,
                         const std::vector<std::string>& needles) {
    std::vector<uint8_t> before;
    if (tiles.device().is_cpu() && tiles.data() != nullptr) {
      const auto* data = static_cast<const uint8_t*>(tiles.data());
      before.assign(data, data + tiles.nbytes());
    }
    const absl::Status status = cpu_.TileQuantizedCodes(w, tiles);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("TileQuantizedCodes: "));
    for (const std::string& n : needles) EXPECT_THAT(std::string(status.message()), HasSubstr(n));
    if (!before.empty()) {
      EXPECT_EQ(std::memcmp(before.data(), tiles.data(), before.size()), 0) << "tiles written by a refused call";
    }
  }

  cpu::CpuBackend cpu_;
  QuantizedMatrix fp8_, int4_;
  QuantizedWeightView fp8_view_, int4_view_;
  Tensor fp8_tiles_, int4_tiles_;
};

TEST_F(WarpTiledBadInputTest, GoodViewsPass) {
  EXPECT_TRUE(Fp8Tiled().Check("test").ok()) << Fp8Tiled().Check("test");
  EXPECT_TRUE(Int4Tiled().Check("test").ok()) << Int4Tiled().Check("test");
  // 37 rows from column 48 (fp8) / 8 (int4): 3 groups of 4 steps / 2 steps.
  EXPECT_EQ(fp8_tiles_.shape(), (Shape{12, 1024}));
  EXPECT_EQ(int4_tiles_.shape(), (Shape{6, 256}));
}

TEST_F(WarpTiledBadInputTest, CheckRefusesCodesOfTheWrongShape) {
  QuantizedWeightView w = Fp8Tiled();
  w.codes = fp8_tiles_.view().Narrow(0, 0, fp8_tiles_.dim(0) - 1);  // a tile short
  ExpectViewRefused(w, {"w.codes", "warp tiles", "[12, 1024]"});
  // Bytes enough, but as [24, 512] rows.
  w.codes = fp8_tiles_.view().Reshape(Shape{24, 512});
  ExpectViewRefused(w, {"w.codes", "[12, 1024]"});
  // tiled_rows past the tiles' groups: the tiles would have to be 4 groups.
  w = Fp8Tiled();
  w.tiled_rows = 37 + 16;
  ExpectViewRefused(w, {"w.codes", "[16, 1024]"});
  // The row-major codes under a tiled layout.
  w = Int4Tiled();
  w.codes = int4_view_.codes;
  ExpectViewRefused(w, {"w.codes", "[6, 256]"});
}

TEST_F(WarpTiledBadInputTest, CheckRefusesNonContiguousCodes) {
  // The right shape, a row stride of two tiles.
  const Tensor wide = *Tensor::Zeros(DType::kF8E4M3, Shape{12, 2048});
  QuantizedWeightView w = Fp8Tiled();
  w.codes = wide.view().Narrow(1, 0, 1024);
  ExpectViewRefused(w, {"w.codes", "contiguous"});
}

TEST_F(WarpTiledBadInputTest, CheckRefusesNegativeTiledRows) {
  QuantizedWeightView w = Fp8Tiled();
  w.tiled_rows = -1;
  ExpectViewRefused(w, {"w.tiled_rows", "-1"});
  w = Int4Tiled();
  w.tiled_rows = -16;
  ExpectViewRefused(w, {"w.tiled_rows", "-16"});
}

TEST_F(WarpTiledBadInputTest, CheckRefusesInt4TilesOffAPackedWord) {
  // Column 12 is value 4 of a word: the tiles hold whole words, so they cannot start there.
  QuantizedWeightView w = Int4Tiled();
  w.col0 = 12;
  ExpectViewRefused(w, {"w.col0", "12", "multiple of 8"});
}

TEST_F(WarpTiledBadInputTest, CheckRefusesAnUnknownLayout) {
  QuantizedWeightView w = Fp8Tiled();
  w.layout = static_cast<QuantCodesLayout>(7);
  ExpectViewRefused(w, {"w.layout", "7"});
  // Whatever the codes: an unknown layout is not read as row-major either.
  w = fp8_view_;
  w.layout = static_cast<QuantCodesLayout>(7);
  ExpectViewRefused(w, {"w.layout", "7"});
}

TEST_F(WarpTiledBadInputTest, MoeExpertsRefuseABadTiledExpertNamingIt) {
  // The CPU MoE op checks each expert's view with its name in front.
  std::vector<Tensor> tiles;
  const QuantizedExperts experts = MakeQuantizedExperts(DeepseekV3Fp8Quantization(), 2, TileableLayouts(), 13);
  std::vector<QuantizedExpertWeights> views = experts.views;
  tiles.push_back(TileOnCpu(views[1].up));
  views[1].up = WithWarpTiledCodes(views[1].up, tiles.back());
  views[1].up.tiled_rows = -1;
  const Tensor x = RandomF32(Shape{2, kHidden}, 1);
  Tensor ids, weights;
  RandomRouting(2, 2, 2, 4, ids, weights);
  Tensor out = Filled(Shape{2, kHidden}, 0.0f);
  const absl::Status status = cpu_.QuantizedMoeExperts(x, ids, weights, views, out, false);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("QuantizedMoeExperts"), HasSubstr("experts[1].up"), HasSubstr("w.tiled_rows")));
}

TEST_F(WarpTiledBadInputTest, TileRefusesAnAlreadyTiledView) {
  Tensor tiles = *Tensor::Zeros(DType::kF8E4M3, fp8_tiles_.shape());
  ExpectTileRefused(Fp8Tiled(), tiles, {"w.codes", "warp-tiled already"});
}

TEST_F(WarpTiledBadInputTest, TileRefusesTilesOfTheWrongShape) {
  for (const Shape& shape : {Shape{11, 1024}, Shape{13, 1024}, Shape{24, 512}, Shape{12 * 1024}}) {
    SCOPED_TRACE(shape.ToString());
    Tensor tiles = *Tensor::Zeros(DType::kF8E4M3, shape);
    ExpectTileRefused(fp8_view_, tiles, {"tiles", "[12, 1024]"});
  }
  Tensor tiles = *Tensor::Zeros(DType::kI32, Shape{6, 1024});  // int4: 256 words a tile, not 1024
  ExpectTileRefused(int4_view_, tiles, {"tiles", "[6, 256]"});
}

TEST_F(WarpTiledBadInputTest, TileRefusesTilesOfTheWrongDtype) {
  Tensor u8 = *Tensor::Zeros(DType::kU8, Shape{12, 1024});
  ExpectTileRefused(fp8_view_, u8, {"tiles", "f8_e4m3"});
  // INT4 tiles are i32 words; f32 tiles of the right shape are not.
  Tensor f32 = *Tensor::Zeros(DType::kF32, Shape{6, 256});
  ExpectTileRefused(int4_view_, f32, {"tiles", "i32"});
}

TEST_F(WarpTiledBadInputTest, TileRefusesNonContiguousTiles) {
  Tensor wide = *Tensor::Zeros(DType::kF8E4M3, Shape{12, 2048});
  ExpectTileRefused(fp8_view_, wide.view().Narrow(1, 0, 1024), {"tiles", "contiguous"});
  Tensor wide_int4 = *Tensor::Zeros(DType::kI32, Shape{6, 512});
  ExpectTileRefused(int4_view_, wide_int4.view().Narrow(1, 256, 256), {"tiles", "contiguous"});
}

TEST_F(WarpTiledBadInputTest, TileRefusesTilesOnAnotherDevice) {
  const TensorView on_gpu(fp8_tiles_.data(), DType::kF8E4M3, fp8_tiles_.shape(), Shape{1024, 1}, Device::Cuda(0));
  ExpectTileRefused(fp8_view_, on_gpu, {"tiles", "cpu"});
}

TEST_F(WarpTiledBadInputTest, TileRefusesInt4SlicesOffAPackedWord) {
  const QuantizedWeightView w =
      SliceView(int4_.quantization, int4_.codes, int4_.scales, Slice{0, 37, 12, 160, true});
  ASSERT_TRUE(w.Check("test").ok()) << w.Check("test");  // a valid row-major view
  Tensor tiles = *Tensor::Zeros(DType::kI32, WarpTiledCodesShape(w));
  ExpectTileRefused(w, tiles, {"w.col0", "12", "multiple of 8"});
}

TEST_F(WarpTiledBadInputTest, TileRefusesABadView) {
  QuantizedWeightView w = fp8_view_;
  w.layout = static_cast<QuantCodesLayout>(7);
  Tensor tiles = *Tensor::Zeros(DType::kF8E4M3, fp8_tiles_.shape());
  ExpectTileRefused(w, tiles, {"w.layout", "7"});
  w = fp8_view_;
  w.scale_col0 = 1;  // the slice's first block column is 0
  ExpectTileRefused(w, tiles, {"w.scales"});
}

TEST_F(WarpTiledBadInputTest, TileRefusesTilesOverlappingTheCodes) {
  // One buffer: the codes in its first rows, the tiles starting inside them.
  const Tensor buffer = *Tensor::Zeros(DType::kF8E4M3, Shape{96, 256});
  std::memcpy(buffer.data(), fp8_.codes.data(), fp8_.codes.nbytes());  // rows 0..63: the matrix
  QuantizedWeightView w = fp8_view_;
  w.codes = buffer.view().Narrow(0, 0, 37).Narrow(1, 48, 160);
  const Shape shape = WarpTiledCodesShape(w);  // 12 KiB: rows 16 .. 63 of the buffer
  const TensorView tiles(static_cast<uint8_t*>(buffer.data()) + 16 * 256, DType::kF8E4M3, shape);
  ExpectTileRefused(w, tiles, {"tiles", "overlaps", "w.codes"});
  // Just past the codes' last byte it is fine.
  const int64_t end = 36 * 256 + 48 + 160;
  const TensorView after(static_cast<uint8_t*>(buffer.data()) + end, DType::kF8E4M3, shape);
  const absl::Status status = cpu_.TileQuantizedCodes(w, after);
  EXPECT_TRUE(status.ok()) << status;
}

}  // namespace
}  // namespace eagle3
