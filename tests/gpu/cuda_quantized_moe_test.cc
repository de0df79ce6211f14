// CudaBackend::QuantizedMoeExperts against the CPU reference (QuantizedMoeExperts on the host
// views: exact dequantization, f32 activations), for FP8 block-scaled and INT4 group experts:
//  - edge shapes (I = 40 and H = 200, multiples of neither 16 nor 32; slices starting inside a
//    scale block, a group and a packed word, the CUDA-core kernels' value-at-a-time path; aligned
//    slices whose rows still end in a partial chunk, the chunked path; one aligned layout shared by
//    every expert, the grouped-GEMV path), 1, 4, 16 and 64 tokens, accumulate on and off;
//  - the real TP8-rank shapes (the grouped-GEMV path) and the graph test below;
//  - the real TP8-rank shapes (rank 3's slices): Kimi-K2.5 INT4 (H 7168, 384 experts, I 2048 / 8 =
//    256, top-8) and DeepSeek-V3 FP8 (H 7168, 256 experts, I 256, top-8) at 1, 4, 16 and 64 tokens;
//  - a captured CUDA graph's replay bit for bit equal to an eager call, and two eager calls bit for
//    bit equal (no float atomics);
//  - the folds (the default) bit for bit equal to the kernels they replace (CudaBackendOptions::
//    quant_moe_fold_grouping, _fold_silu and _fold_combine off): the grouping in the slots kernel
//    (calls of up to kQuantMoeFoldPairs pairs), SiLU-mul in the down product's staging and the
//    combine in its last blocks (calls of one token), at the V3 (with the shared expert) and K2 rank
//    shapes: 1, 2, 4, 8, 12 tokens and the largest folded call, experts of several jobs, accumulate on
//    and off, bad ids, a call of no jobs, and the first call again after the others; every call
//    also on the experts' codes in warp tiles (TileQuantizedCodes, as loads keep them), bit for bit
//    equal to the row-major ones, and tiled and row-major experts mixed in one call refused; calls
//    of 2 to quant_moe_direct_max_tokens tokens, which run direct by default, held to the kernels
//    within the bf16 model's tolerance and to themselves bit for bit (skewed routings included:
//    every token the same experts, each read once a token);
//  - a bad id reported by Synchronize naming the token, whose out row is kept; INT4 f32 scales
//    refused. Skipped where no CUDA device is visible.
//
// Tolerances, as max |gpu - ref| / max |ref| over a call's output:
//  - 2e-3 against a bf16 model of the kernels (x and act rounded to bf16, exact weights, double
//    sums: every path applies the FP8 block and INT4 group scales to fp32 sums of exact products):
//    only fp32 summation order differs from it, plus an act value that lands on the other
//    side of a bf16 rounding boundary (one ulp, 2^-8 relative, of one of I terms of a down product);
//    a wrong block, group, nibble or row moves results by whole weights, orders of magnitude above.
//  - 1e-2 against the exact CPU reference: the bf16 rounding of x and act (relative 2^-9 each,
//    random signs, through two products).
#include <cuda_runtime_api.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/half.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parity_util.h"
#include "quant_moe_ops.h"
#include "quantized_moe_util.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

constexpr double kModelTol = 2e-3;
constexpr double kExactTol = 1e-2;

constexpr int64_t kInter = 40;
constexpr int64_t kHidden = 200;

// Slices inside blocks, groups and words (the value-at-a-time path).
std::vector<ExpertSlices> OddLayouts() {
  return {
      {300, 448, 256, 320, Slice{70, kInter, 36, kHidden}, Slice{20, kHidden, 100, kInter}},
      {200, 512, 300, 192, Slice{129, kInter, 257, kHidden}, Slice{97, kHidden, 131, kInter}},
  };
}
// Slices on the chunk grid (the chunked path), rows still starting inside blocks.
std::vector<ExpertSlices> AlignedLayouts() {
  return {
      {kInter, 256, kHidden, 128, Slice{0, kInter, 0, kHidden}, Slice{0, kHidden, 80, kInter}},
      {200, 256, 300, 256, Slice{130, kInter, 0, kHidden}, Slice{97, kHidden, 96, kInter}},
  };
}

float Bf16Round(float v) { return Bf16ToFloat(FloatToBf16(v)); }

// The bf16 model of the kernels (see the file comment): exact weights, x and act rounded to bf16.
Tensor Bf16Model(const QuantizedExperts& experts, const Tensor& x, const Tensor& ids, const Tensor& weights,
                 const Tensor& out0, bool accumulate) {
  const auto weight = [&](const Tensor& t, int64_t i) { return static_cast<double>(t.data_as<float>()[i]); };
  const int64_t tokens = x.dim(0), hidden = x.dim(1), k = ids.dim(1);
  Tensor out = *Tensor::Empty(DType::kF32, x.shape());
  std::vector<float> xb(hidden), act;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < hidden; ++c) xb[c] = Bf16Round(x.data_as<float>()[t * hidden + c]);
    std::vector<double> o(hidden, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids.data_as<int32_t>()[t * k + j];
      const Tensor& gu = experts.dense_gate_up[e];
      const Tensor& down = experts.dense_down[e];
      const int64_t inter = down.dim(1);
      act.assign(inter, 0.0f);
      for (int64_t i = 0; i < inter; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < hidden; ++c) {
          g += weight(gu, i * hidden + c) * xb[c];
          u += weight(gu, (inter + i) * hidden + c) * xb[c];
        }
        act[i] = Bf16Round(static_cast<float>(g / (1.0 + std::exp(-g)) * u));
      }
      const double w = weights.data_as<float>()[t * k + j];
      for (int64_t h = 0; h < hidden; ++h) {
        double y = 0;
        for (int64_t i = 0; i < inter; ++i) y += weight(down, h * inter + i) * act[i];
        o[h] += w * y;
      }
    }
    for (int64_t h = 0; h < hidden; ++h) {
      const double start = accumulate ? out0.data_as<float>()[t * hidden + h] : 0.0;
      out.data_as<float>()[t * hidden + h] = static_cast<float>(start + o[h]);
    }
  }
  return out;
}

Tensor Filled(const Shape& shape, float value) {
  Tensor t = *Tensor::Empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = value;
  return t;
}

void ExpectBitwiseEqual(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(a.data_as<float>()[i]), std::bit_cast<uint32_t>(b.data_as<float>()[i]))
        << what << ": element " << i;
  }
}

class CudaQuantizedMoeTest : public parity::ParityTest {
 protected:
  // Device copies of every global matrix of `experts` and the views of the same slices of them.
  struct DeviceExperts {
    std::vector<Tensor> tensors;
    std::vector<QuantizedExpertWeights> views;
  };
  DeviceExperts ToDevice(const QuantizationConfig& quantization, const QuantizedExperts& experts) {
    DeviceExperts d;
    d.tensors.reserve(experts.matrices.size() * 2);
    for (const QuantizedMatrix& m : experts.matrices) {
      d.tensors.push_back(Upload(m.codes));
      d.tensors.push_back(Upload(m.scales));
    }
    for (size_t e = 0; e < experts.views.size(); ++e) {
      const auto at = [&](size_t matrix, const Slice& s) {
        return SliceView(quantization, d.tensors[2 * (3 * e + matrix)], d.tensors[2 * (3 * e + matrix) + 1], s);
      };
      d.views.push_back({at(0, experts.gate_up_slices[e]), at(1, experts.gate_up_slices[e]),
                         at(2, experts.down_slices[e])});
    }
    return d;
  }

  // GPU vs the bf16 model and the CPU reference for `tokens` tokens of top-k routing.
  void CheckCall(const QuantizationConfig& quantization, const QuantizedExperts& experts, const DeviceExperts& d,
                 int64_t tokens, int64_t top_k, bool accumulate, uint32_t seed) {
    SCOPED_TRACE(testing::Message() << tokens << " tokens, top-" << top_k << (accumulate ? ", accumulate" : ""));
    const int64_t hidden = experts.views[0].gate.k;
    const Tensor x = Random(Shape{tokens, hidden}, seed);
    Tensor ids, weights;
    RandomRouting(tokens, top_k, static_cast<int64_t>(experts.views.size()), seed + 1, ids, weights);
    const Tensor out0 = accumulate ? Random(Shape{tokens, hidden}, seed + 2) : Filled(Shape{tokens, hidden}, NAN);
    Tensor d_out = Upload(out0);
    const Tensor d_x = Upload(x), d_ids = Upload(ids), d_weights = Upload(weights);
    const absl::Status status = gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d.views, d_out, accumulate);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_TRUE(gpu_->Synchronize().ok());
    const Tensor got = Download(d_out);
    Tensor want = *Tensor::Empty(DType::kF32, Shape{tokens, hidden});
    std::memcpy(want.data(), out0.data(), out0.nbytes());
    ASSERT_TRUE(cpu_.QuantizedMoeExperts(x, ids, weights, experts.views, want, accumulate).ok());
    EXPECT_LE(parity::RelError(got, want), kExactTol);
    if (!experts.dense.empty()) {
      EXPECT_LE(parity::RelError(got, Bf16Model(experts, x, ids, weights, out0, accumulate)), kModelTol);
    }
  }

  // grouped: every expert with one layout (whole scale grids), which the grouped-GEMV path needs.
  void CheckEdgeShapes(const QuantizationConfig& quantization, const std::vector<ExpertSlices>& layouts,
                       uint64_t seed, bool grouped = false) {
    const QuantizedExperts experts = MakeQuantizedExperts(quantization, 9, layouts, seed, /*mixed_scales=*/!grouped);
    const DeviceExperts d = ToDevice(quantization, experts);
    for (const int64_t tokens : {1, 4, 16, 64}) {
      for (const bool accumulate : {false, true}) {
        CheckCall(quantization, experts, d, tokens, 3, accumulate, 40);
      }
    }
  }
};

TEST_F(CudaQuantizedMoeTest, Fp8EdgeShapesValueAtATime) { CheckEdgeShapes(DeepseekV3Fp8Quantization(), OddLayouts(), 1); }
TEST_F(CudaQuantizedMoeTest, Fp8EdgeShapesChunked) { CheckEdgeShapes(DeepseekV3Fp8Quantization(), AlignedLayouts(), 2); }
TEST_F(CudaQuantizedMoeTest, Int4EdgeShapesValueAtATime) {
  CheckEdgeShapes(KimiK2ThinkingInt4Quantization(), OddLayouts(), 3);
}
TEST_F(CudaQuantizedMoeTest, Int4EdgeShapesChunked) {
  CheckEdgeShapes(KimiK2ThinkingInt4Quantization(), AlignedLayouts(), 4);
}
// One shared layout on the quantized GEMV's grid: the grouped-GEMV path, with rows and columns that
// end inside a tile, a 16-byte chunk and a scale block.
TEST_F(CudaQuantizedMoeTest, Fp8EdgeShapesGroupedGemv) {
  CheckEdgeShapes(DeepseekV3Fp8Quantization(), {AlignedLayouts()[1]}, 5, /*grouped=*/true);
}
TEST_F(CudaQuantizedMoeTest, Int4EdgeShapesGroupedGemv) {
  CheckEdgeShapes(KimiK2ThinkingInt4Quantization(), {AlignedLayouts()[1]}, 6, /*grouped=*/true);
}

// The grouped path plans a round of one token for jobs of one pair (QuantMoeJobPairsFor): tokens
// that name an expert twice (top-5 over 3 experts: two repeats per token) must still be computed
// whole, by more jobs; and rounds of other sizes (8-pair jobs) alike; on a backend whose rounds are
// single tokens too (max_rows 1: a workspace sized for one token).
TEST_F(CudaQuantizedMoeTest, GroupedGemvTokensNamingAnExpertTwice) {
  for (const QuantizationConfig& quantization : {DeepseekV3Fp8Quantization(), KimiK2ThinkingInt4Quantization()}) {
    SCOPED_TRACE(quantization.format == WeightFormat::kInt4Group ? "int4" : "fp8");
    const QuantizedExperts experts =
        MakeQuantizedExperts(quantization, 3, {AlignedLayouts()[1]}, 7, /*mixed_scales=*/false);
    const DeviceExperts d = ToDevice(quantization, experts);
    for (const int64_t tokens : {1, 2, 3, 7, 8, 9, 17}) {
      CheckCall(quantization, experts, d, tokens, 5, /*accumulate=*/false, 50);
    }
    cuda::CudaBackendOptions options = Options();
    options.max_rows = 1;
    auto one_row = cuda::CudaBackend::Create(options);
    ASSERT_TRUE(one_row.ok()) << one_row.status();
    std::swap(gpu_, *one_row);
    const DeviceExperts d1 = ToDevice(quantization, experts);
    for (const int64_t tokens : {1, 3}) {
      CheckCall(quantization, experts, d1, tokens, 5, /*accumulate=*/true, 60);
    }
    std::swap(gpu_, *one_row);
  }
}

// Every expert of a real TP8 rank (rank 3: gate / up rows and down columns [768, 1024) of the
// global I = 2048), random codes and scales written directly (no dense copy: the reference
// dequantizes the touched experts itself). One tensor per kind holds every expert's slice.
struct RankExperts {
  QuantizationConfig quantization;
  Tensor gate_codes, up_codes, down_codes, gate_scales, up_scales, down_scales;  // host
  std::vector<QuantizedExpertWeights> views;                                     // host views
};

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

RankExperts MakeRankExperts(const QuantizationConfig& quantization, int64_t num_experts, int64_t hidden,
                            int64_t inter, int64_t rank) {
  RankExperts r;
  r.quantization = quantization;
  const bool fp8 = quantization.format == WeightFormat::kFp8Block;
  const int64_t br = fp8 ? quantization.block_out : 1, bc = fp8 ? quantization.block_in : quantization.group_size;
  const int64_t row0 = rank * inter;  // gate / up rows, down columns
  uint64_t state = 12345 + num_experts;
  const auto codes = [&](int64_t rows, int64_t cols) {  // per expert [rows, cols]
    Tensor t = fp8 ? *Tensor::Empty(DType::kF8E4M3, Shape{num_experts * rows, cols})
                   : *Tensor::Empty(DType::kI32, Shape{num_experts * rows, Int4PackedWords(cols)});
    auto* bytes = static_cast<uint8_t*>(t.data());
    for (size_t i = 0; i < t.nbytes(); ++i) {
      const uint8_t v = static_cast<uint8_t>(SplitMix(state));
      // fp8: exponents 4..11 (magnitudes 2^-3 .. 2^4), never NaN; int4: any nibble.
      bytes[i] = fp8 ? static_cast<uint8_t>((v & 0x80u) | (0x20u + (v & 0x3fu))) : v;
    }
    return t;
  };
  const auto scales = [&](int64_t rows, int64_t cols, float size) {  // per expert [rows, cols] blocks
    Tensor t = *Tensor::Empty(fp8 ? DType::kF32 : DType::kBF16, Shape{num_experts * rows, cols});
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float s = size * (0.5f + static_cast<float>(SplitMix(state) % 1024) / 1024.0f);
      if (fp8) t.data_as<float>()[i] = s;
      else t.data_as<uint16_t>()[i] = FloatToBf16(s);
    }
    return t;
  };
  // Block rows / columns of the rank's slice (tight scales: only those held).
  const int64_t s_row0 = row0 / br, s_rows = (row0 + inter - 1) / br + 1 - s_row0;
  const int64_t s_col0 = row0 / bc, s_cols = (row0 + inter - 1) / bc + 1 - s_col0;
  const int64_t h_blocks_r = (hidden + br - 1) / br, h_blocks_c = (hidden + bc - 1) / bc;
  const float size = fp8 ? 0.02f : 0.01f;
  r.gate_codes = codes(inter, hidden);
  r.up_codes = codes(inter, hidden);
  r.down_codes = codes(hidden, inter);
  r.gate_scales = scales(s_rows, h_blocks_c, size);
  r.up_scales = scales(s_rows, h_blocks_c, size);
  r.down_scales = scales(h_blocks_r, s_cols, size);
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto view = [&](const Tensor& c, const Tensor& s, int64_t rows, int64_t k, int64_t vrow0, int64_t vcol0,
                          int64_t srows, int64_t srow0, int64_t scol0) {
      QuantizedWeightView w;
      w.format = quantization.format;
      w.codes = c.view().Narrow(0, e * rows, rows);
      w.scales = s.view().Narrow(0, e * srows, srows);
      w.k = k;
      w.row0 = vrow0;
      w.col0 = vcol0;
      w.scale_row0 = srow0;
      w.scale_col0 = scol0;
      w.block_rows = br;
      w.block_cols = bc;
      return w;
    };
    r.views.push_back({view(r.gate_codes, r.gate_scales, inter, hidden, row0, 0, s_rows, s_row0, 0),
                       view(r.up_codes, r.up_scales, inter, hidden, row0, 0, s_rows, s_row0, 0),
                       view(r.down_codes, r.down_scales, hidden, inter, 0, row0, h_blocks_r, 0, s_col0)});
  }
  return r;
}

class CudaQuantizedMoeRankTest : public CudaQuantizedMoeTest {
 protected:
  // The rank's views over device copies of its tensors.
  std::vector<QuantizedExpertWeights> ToDevice(const RankExperts& r) {
    for (const Tensor* t : {&r.gate_codes, &r.up_codes, &r.down_codes, &r.gate_scales, &r.up_scales, &r.down_scales}) {
      device_.push_back(Upload(*t));
    }
    std::vector<QuantizedExpertWeights> views = r.views;
    const auto move = [&](QuantizedWeightView& w, const Tensor& host_codes, const Tensor& d_codes,
                          const Tensor& host_scales, const Tensor& d_scales) {
      const auto rebase = [](const TensorView& v, const Tensor& host, const Tensor& dev) {
        const ptrdiff_t offset = static_cast<const char*>(v.data()) - static_cast<const char*>(host.data());
        return TensorView(static_cast<char*>(dev.data()) + offset, v.dtype(), v.shape(), v.strides(), dev.device());
      };
      w.codes = rebase(w.codes, host_codes, d_codes);
      w.scales = rebase(w.scales, host_scales, d_scales);
    };
    for (QuantizedExpertWeights& w : views) {
      move(w.gate, r.gate_codes, device_[0], r.gate_scales, device_[3]);
      move(w.up, r.up_codes, device_[1], r.up_scales, device_[4]);
      move(w.down, r.down_codes, device_[2], r.down_scales, device_[5]);
    }
    return views;
  }

  void CheckRank(const QuantizationConfig& quantization, int64_t num_experts) {
    const RankExperts r = MakeRankExperts(quantization, num_experts, 7168, 256, 3);
    const std::vector<QuantizedExpertWeights> d_views = ToDevice(r);
    for (const int64_t tokens : {1, 4, 16, 64}) {
      SCOPED_TRACE(testing::Message() << tokens << " tokens");
      const Tensor x = Random(Shape{tokens, 7168}, 7);
      Tensor ids, weights;
      RandomRouting(tokens, 8, num_experts, 8 + static_cast<uint32_t>(tokens), ids, weights);
      const Tensor d_x = Upload(x), d_ids = Upload(ids), d_weights = Upload(weights);
      Tensor d_out = Upload(Filled(Shape{tokens, 7168}, NAN));
      ASSERT_TRUE(gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d_views, d_out, false).ok());
      const Tensor got = Download(d_out);
      Tensor want = Filled(Shape{tokens, 7168}, 0.0f);
      ASSERT_TRUE(cpu_.QuantizedMoeExperts(x, ids, weights, r.views, want, false).ok());
      EXPECT_LE(parity::RelError(got, want), kExactTol);
      // A second call gives the same bits (fixed summation order, no float atomics).
      ASSERT_TRUE(gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d_views, d_out, false).ok());
      ExpectBitwiseEqual(Download(d_out), got, "second run");
    }
  }

  std::vector<Tensor> device_;
};

TEST_F(CudaQuantizedMoeRankTest, KimiK25Int4Tp8Rank) { CheckRank(KimiK2ThinkingInt4Quantization(), 384); }
TEST_F(CudaQuantizedMoeRankTest, DeepseekV3Fp8Tp8Rank) { CheckRank(DeepseekV3Fp8Quantization(), 256); }

TEST_F(CudaQuantizedMoeRankTest, CapturedGraphReplaysAsEager) {
  const RankExperts r = MakeRankExperts(KimiK2ThinkingInt4Quantization(), 384, 7168, 256, 3);
  const std::vector<QuantizedExpertWeights> d_views = ToDevice(r);
  Tensor ids, weights;
  RandomRouting(16, 8, 384, 21, ids, weights);
  Tensor d_x = Upload(Random(Shape{16, 7168}, 20));
  const Tensor d_ids = Upload(ids), d_weights = Upload(weights);
  Tensor d_out = Upload(Filled(Shape{16, 7168}, 0.0f));
  // The first call allocates the workspace and uploads the table; the capture then needs neither.
  ASSERT_TRUE(gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d_views, d_out, true).ok());
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] {
    return gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d_views, d_out, false);
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(gpu_->Copy(Random(Shape{16, 7168}, 22), d_x).ok());
  ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
  const Tensor replayed = Download(d_out);
  ASSERT_TRUE(gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d_views, d_out, false).ok());
  ExpectBitwiseEqual(Download(d_out), replayed, "eager after replay");
}

// The grouping folded into the slots kernel (calls of at most kQuantMoeFoldPairs pairs, the default)
// against the grouping kernel (CudaBackendOptions::quant_moe_fold_grouping off, on a backend of its
// own): the same bits, and both within tolerance of the CPU reference, at the V3 FP8 rank shape
// (256 routed experts, top-8 and the shared expert as id 256 in every token's last slot, as
// FeedForwardBlock joins it at decode) and the K2 INT4 one (384 experts, top-8).
class CudaQuantizedMoeFoldTest : public CudaQuantizedMoeRankTest {
 protected:
  static constexpr int64_t kRankHidden = 7168, kRankInter = 256;

  void SetUp() override {
    CudaQuantizedMoeRankTest::SetUp();
    if (gpu_ == nullptr) return;  // skipped
    cuda::CudaBackendOptions options = Options();
    options.quant_moe_fold_grouping = false;
    options.quant_moe_fold_silu = false;
    options.quant_moe_fold_combine = false;
    auto backend = cuda::CudaBackend::Create(options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    separate_ = std::move(*backend);
    // The folds with the slots kernel at one token (gpu_'s one-token calls launch none).
    cuda::CudaBackendOptions staged = Options();
    staged.quant_moe_direct_decode = false;
    auto staged_backend = cuda::CudaBackend::Create(staged);
    ASSERT_TRUE(staged_backend.ok()) << staged_backend.status();
    staged_ = std::move(*staged_backend);
  }

  // Top-8 routing over `routed` experts, random or skewed (every token a permutation of experts
  // 0..7: each of them has a pair per token, so past 8 tokens its pairs fill several jobs), then,
  // with `shared`, expert `routed` in a last slot of weight 1.
  static void Routing(int64_t tokens, int64_t routed, bool shared, bool skewed, uint32_t seed, Tensor& ids,
                      Tensor& weights) {
    Tensor top_ids, top_weights;
    RandomRouting(tokens, 8, skewed ? 8 : routed, seed, top_ids, top_weights);
    const int64_t k = shared ? 9 : 8;
    ids = *Tensor::Empty(DType::kI32, Shape{tokens, k});
    weights = *Tensor::Empty(DType::kF32, Shape{tokens, k});
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const bool top = j < 8;
        ids.data_as<int32_t>()[t * k + j] = top ? top_ids.data_as<int32_t>()[t * 8 + j] : static_cast<int32_t>(routed);
        weights.data_as<float>()[t * k + j] = top ? top_weights.data_as<float>()[t * 8 + j] : 1.0f;
      }
    }
  }

  // `views` with their codes in warp tiles (as CudaBackend's loads keep routed experts), the tiles
  // kept in `tiles`.
  std::vector<QuantizedExpertWeights> Tiled(const std::vector<QuantizedExpertWeights>& views,
                                            std::vector<Tensor>& tiles) {
    std::vector<QuantizedExpertWeights> tiled = views;
    for (QuantizedExpertWeights& w : tiled) {
      for (QuantizedWeightView* v : {&w.gate, &w.up, &w.down}) {
        EXPECT_TRUE(gpu_->tiles_expert_codes(*v));
        Tensor t = *Tensor::Empty(v->codes.dtype(), WarpTiledCodesShape(*v), gpu_->allocator());
        EXPECT_TRUE(gpu_->TileQuantizedCodes(*v, t).ok());
        *v = WithWarpTiledCodes(*v, t);
        tiles.push_back(std::move(t));
      }
    }
    return tiled;
  }

  // One call on `backend` over an out filled with `fill`; out on the host, and what the backend's
  // Synchronize then returns in `sync`. The inputs are uploaded on gpu_'s stream, which the other
  // backend does not share: gpu_ is synchronized first.
  Tensor Call(cuda::CudaBackend& backend, const Tensor& d_x, const Tensor& d_ids, const Tensor& d_weights,
              const std::vector<QuantizedExpertWeights>& d_views, float fill, absl::Status& sync,
              bool accumulate = false) {
    Tensor d_out = Upload(Filled(Shape{d_x.dim(0), d_x.dim(1)}, fill));
    EXPECT_TRUE(gpu_->Synchronize().ok());
    EXPECT_TRUE(backend.QuantizedMoeExperts(d_x, d_ids, d_weights, d_views, d_out, accumulate).ok());
    sync = backend.Synchronize();
    return Download(d_out);
  }

  void CheckFold(const QuantizationConfig& quantization, int64_t routed, bool shared) {
    const int64_t top_k = shared ? 9 : 8, num_experts = routed + (shared ? 1 : 0);
    const int64_t direct_max = quantization.format == WeightFormat::kInt4Group
                                   ? gpu_->options().quant_moe_direct_max_tokens_int4
                                   : gpu_->options().quant_moe_direct_max_tokens_fp8;
    const RankExperts r = MakeRankExperts(quantization, num_experts, kRankHidden, kRankInter, 3);
    const std::vector<QuantizedExpertWeights> d_views = ToDevice(r);
    // The same experts with their codes in warp tiles (as CudaBackend's loads keep routed experts):
    // every call below must give the row-major views' bits.
    std::vector<Tensor> tiles;
    std::vector<QuantizedExpertWeights> d_tiled;
    ASSERT_NO_FATAL_FAILURE(d_tiled = Tiled(d_views, tiles));
    // Tokens of the largest call the fold takes.
    const int64_t folded = cuda::kQuantMoeFoldPairs / top_k;
    ASSERT_GE(folded, 8);

    // A call of `tokens` tokens (seeded by its size and kind) on both backends: out of the fold. A
    // direct call of several tokens (quant_moe_direct_max_tokens) is not the kernels' bits: it is
    // held to the kernels within the bf16 model's tolerance (only fp32 summation order differs),
    // to itself bit for bit, and to the reference; the staged backend's folds stay the kernels' bits.
    const auto check = [&](int64_t tokens, bool skewed) {
      const bool direct = tokens > 1 && tokens <= direct_max;
      SCOPED_TRACE(testing::Message() << tokens << " tokens" << (skewed ? ", skewed" : "")
                                      << (tokens * top_k <= cuda::kQuantMoeFoldPairs ? ", folded" : ", not folded")
                                      << (direct ? ", direct" : ""));
      const uint32_t seed = static_cast<uint32_t>(2 * tokens + (skewed ? 1 : 0));
      const Tensor x = Random(Shape{tokens, kRankHidden}, seed);
      Tensor ids, weights;
      Routing(tokens, routed, shared, skewed, seed, ids, weights);
      const Tensor d_x = Upload(x), d_ids = Upload(ids), d_weights = Upload(weights);
      absl::Status sync;
      Tensor got = Call(*gpu_, d_x, d_ids, d_weights, d_views, NAN, sync);
      EXPECT_TRUE(sync.ok()) << sync;
      const Tensor separate = Call(*separate_, d_x, d_ids, d_weights, d_views, NAN, sync);
      EXPECT_TRUE(sync.ok()) << sync;
      // Accumulating into out (the residual stream's way): the folded combine reads it as the
      // combine kernel does.
      const Tensor got_acc = Call(*gpu_, d_x, d_ids, d_weights, d_views, 0.75f, sync, true);
      EXPECT_TRUE(sync.ok()) << sync;
      const Tensor separate_acc = Call(*separate_, d_x, d_ids, d_weights, d_views, 0.75f, sync, true);
      EXPECT_TRUE(sync.ok()) << sync;
      if (direct) {
        EXPECT_LE(parity::RelError(got, separate), kModelTol);
        EXPECT_LE(parity::RelError(got_acc, separate_acc), kModelTol);
        ExpectBitwiseEqual(Call(*gpu_, d_x, d_ids, d_weights, d_views, NAN, sync), got, "direct: a second call");
        EXPECT_TRUE(sync.ok()) << sync;
      } else {
        ExpectBitwiseEqual(got, separate, "folded vs the grouping kernel");
        ExpectBitwiseEqual(got_acc, separate_acc, "accumulate: folded vs the kernels");
      }
      ExpectBitwiseEqual(Call(*staged_, d_x, d_ids, d_weights, d_tiled, NAN, sync), separate,
                         "folded with the slots kernel vs the kernels");
      EXPECT_TRUE(sync.ok()) << sync;
      ExpectBitwiseEqual(Call(*staged_, d_x, d_ids, d_weights, d_views, 0.75f, sync, true), separate_acc,
                         "accumulate, folded with the slots kernel vs the kernels");
      EXPECT_TRUE(sync.ok()) << sync;
      ExpectBitwiseEqual(Call(*gpu_, d_x, d_ids, d_weights, d_tiled, NAN, sync), got, "warp tiles vs row-major");
      EXPECT_TRUE(sync.ok()) << sync;
      ExpectBitwiseEqual(Call(*separate_, d_x, d_ids, d_weights, d_tiled, 0.75f, sync, true), separate_acc,
                         "accumulate, kernels: warp tiles vs row-major");
      EXPECT_TRUE(sync.ok()) << sync;
      Tensor want = Filled(Shape{tokens, kRankHidden}, 0.0f);
      EXPECT_TRUE(cpu_.QuantizedMoeExperts(x, ids, weights, r.views, want, false).ok());
      EXPECT_LE(parity::RelError(got, want), kExactTol);
      return got;
    };
    // Job counts rising call after call, so that a job count or job list the fold left stale in
    // the workspace would leave out jobs of the next call; then jobs of 8 pairs and experts of
    // several jobs (skewed), one token past the fold (the grouping kernel on both backends).
    const Tensor first = check(1, false);
    for (const int64_t tokens : {int64_t{2}, int64_t{4}, int64_t{8}, int64_t{12}, folded}) check(tokens, false);
    check(4, true);  // direct: every token's experts the same 8, each read once a token
    check(folded, true);
    check(folded + 1, false);

    // Bad ids (token 1's slot 2 past the table, token 3's slot 0 negative): every path (direct on
    // gpu_, folded on staged_, the kernels) reports the lowest bad token, keeps its row and the other
    // bad token's, and computes the good tokens' rows; the folds are the kernels' bits.
    {
      const Tensor x = Random(Shape{4, kRankHidden}, 8);
      Tensor ids, weights;
      Routing(4, routed, shared, false, 8, ids, weights);
      Tensor want = Filled(Shape{4, kRankHidden}, 0.0f);
      ASSERT_TRUE(cpu_.QuantizedMoeExperts(x, ids, weights, r.views, want, false).ok());
      ids.data_as<int32_t>()[1 * top_k + 2] = static_cast<int32_t>(num_experts);
      ids.data_as<int32_t>()[3 * top_k] = -1;
      const Tensor d_x = Upload(x), d_ids = Upload(ids), d_weights = Upload(weights);
      Tensor outs[3];
      for (const int path : {0, 1, 2}) {
        SCOPED_TRACE(path == 0 ? "default (direct)" : path == 1 ? "folded" : "grouping kernel");
        absl::Status sync;
        cuda::CudaBackend& backend = path == 0 ? *gpu_ : path == 1 ? *staged_ : *separate_;
        outs[path] = Call(backend, d_x, d_ids, d_weights, path == 0 ? d_tiled : d_views, 5.0f, sync);
        const Tensor& got = outs[path];
        EXPECT_THAT(std::string(sync.message()),
                    testing::AllOf(HasSubstr("QuantizedMoeExperts"), HasSubstr("token 1")));
        for (const int64_t t : {1, 3}) {
          for (int64_t h = 0; h < kRankHidden; ++h) {
            ASSERT_EQ(got.data_as<float>()[t * kRankHidden + h], 5.0f) << "token " << t << ", column " << h;
          }
        }
        for (const int64_t t : {0, 2}) {
          EXPECT_LE(parity::RelError(got.view().Narrow(0, t, 1), want.view().Narrow(0, t, 1)), kExactTol)
              << "token " << t;
        }
      }
      ExpectBitwiseEqual(outs[1], outs[2], "bad ids: folded vs the grouping kernel");
    }
    // Every id bad: a round of no jobs.
    {
      Tensor ids = *Tensor::Empty(DType::kI32, Shape{1, top_k});
      for (int64_t j = 0; j < top_k; ++j) ids.data_as<int32_t>()[j] = -1;
      const Tensor d_x = Upload(Random(Shape{1, kRankHidden}, 9)), d_ids = Upload(ids);
      const Tensor d_weights = Upload(Filled(Shape{1, top_k}, 1.0f));
      absl::Status sync;
      const Tensor got = Call(*gpu_, d_x, d_ids, d_weights, d_views, 5.0f, sync);
      EXPECT_THAT(std::string(sync.message()), HasSubstr("token 0"));
      for (int64_t h = 0; h < kRankHidden; ++h) ASSERT_EQ(got.data_as<float>()[h], 5.0f) << "column " << h;
    }
    // One token with one bad id among good ones (a decode step): its good pairs make jobs, whose
    // down product runs; the folded combine must still keep the token's row, as the kernel does.
    {
      Tensor ids, weights;
      Routing(1, routed, shared, false, 10, ids, weights);
      ids.data_as<int32_t>()[2] = static_cast<int32_t>(num_experts);
      const Tensor d_x = Upload(Random(Shape{1, kRankHidden}, 10)), d_ids = Upload(ids);
      const Tensor d_weights = Upload(weights);
      for (const int path : {0, 1, 2}) {
        SCOPED_TRACE(path == 0 ? "folded, direct" : path == 1 ? "kernels" : "folded with the slots kernel");
        absl::Status sync;
        cuda::CudaBackend& backend = path == 0 ? *gpu_ : path == 1 ? *separate_ : *staged_;
        const Tensor got = Call(backend, d_x, d_ids, d_weights, d_views, 5.0f, sync, path != 1);
        EXPECT_THAT(std::string(sync.message()), HasSubstr("token 0"));
        for (int64_t h = 0; h < kRankHidden; ++h) ASSERT_EQ(got.data_as<float>()[h], 5.0f) << "column " << h;
      }
    }
    // The first call again: the same bits (nothing left over from the calls between).
    ExpectBitwiseEqual(check(1, false), first, "the first call again");

    // Tiled and row-major experts mixed in one call: off the grouped path's shared layout, which
    // alone reads tiles, so refused naming the first tiled view.
    {
      std::vector<QuantizedExpertWeights> mixed = d_views;
      mixed[1].gate = d_tiled[1].gate;
      Tensor ids, weights;
      Routing(1, routed, shared, false, 11, ids, weights);
      Tensor d_out = Upload(Filled(Shape{1, kRankHidden}, 0.0f));
      const absl::Status status = gpu_->QuantizedMoeExperts(Upload(Random(Shape{1, kRankHidden}, 11)), Upload(ids),
                                                            Upload(weights), mixed, d_out, false);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
      EXPECT_THAT(std::string(status.message()),
                  testing::AllOf(HasSubstr("experts[1].gate.codes"), HasSubstr("warp-tiled"))) << status;
    }
  }

  std::unique_ptr<cuda::CudaBackend> separate_;
  std::unique_ptr<cuda::CudaBackend> staged_;
};

TEST_F(CudaQuantizedMoeFoldTest, DeepseekV3Fp8WithSharedExpert) {
  CheckFold(DeepseekV3Fp8Quantization(), 256, /*shared=*/true);
}
TEST_F(CudaQuantizedMoeFoldTest, KimiK25Int4) { CheckFold(KimiK2ThinkingInt4Quantization(), 384, /*shared=*/false); }

// A V3 step's MoE call joins the shared expert as a ninth pair up to a few rows and runs the top-8
// alone past them, in either order on one backend: a fresh backend's workspace, sized by a top-8
// call at the rank's shape (whose pair capacity then also holds the 9-pair call's rounds), must
// take the 9-pair call that follows (once refused as a workspace of too small a top_k), and the
// reverse order likewise.
TEST_F(CudaQuantizedMoeFoldTest, MorePairsATokenThanTheFirstCall) {
  const RankExperts r = MakeRankExperts(DeepseekV3Fp8Quantization(), 257, kRankHidden, kRankInter, 5);
  const std::vector<QuantizedExpertWeights> d_views = ToDevice(r);
  for (const bool shared_first : {false, true}) {
    SCOPED_TRACE(shared_first ? "9 pairs first" : "8 pairs first");
    auto fresh = cuda::CudaBackend::Create(Options());
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    for (const bool shared : {shared_first, !shared_first}) {
      SCOPED_TRACE(shared ? "9 pairs" : "8 pairs");
      const uint32_t seed = shared ? 71 : 72;
      const Tensor x = Random(Shape{2, kRankHidden}, seed);
      Tensor ids, weights;
      Routing(2, 256, shared, /*skewed=*/false, seed, ids, weights);
      absl::Status sync;
      const Tensor got = Call(**fresh, Upload(x), Upload(ids), Upload(weights), d_views, 0.0f, sync);
      EXPECT_TRUE(sync.ok()) << sync;
      Tensor want = Filled(Shape{2, kRankHidden}, 0.0f);
      ASSERT_TRUE(cpu_.QuantizedMoeExperts(x, ids, weights, r.views, want, false).ok());
      EXPECT_LE(parity::RelError(got, want), kExactTol);
    }
  }
}

// One-token INT4 calls on warp-tiled experts, whose gate-up and down products the default backend
// runs as one kernel (CudaBackendOptions::quant_moe_chain_round), against a backend that launches
// them apart: the same bits call after call (the chain's counters reset by each call: a stale one
// would skip or repeat work, or hang the next), accumulating or not, with a bad id (the token's row
// kept, the error reported, the next call whole again), and replayed from a captured graph.
TEST_F(CudaQuantizedMoeFoldTest, KimiK25Int4ChainedRound) {
  cuda::CudaBackendOptions options = Options();
  options.quant_moe_chain_round = false;
  auto backend = cuda::CudaBackend::Create(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::unique_ptr<cuda::CudaBackend> unchained = std::move(*backend);
  const RankExperts r = MakeRankExperts(KimiK2ThinkingInt4Quantization(), 384, kRankHidden, kRankInter, 4);
  const std::vector<QuantizedExpertWeights> d_views = ToDevice(r);
  std::vector<Tensor> tiles;
  std::vector<QuantizedExpertWeights> d_tiled;
  ASSERT_NO_FATAL_FAILURE(d_tiled = Tiled(d_views, tiles));
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE(testing::Message() << "call " << call);
    const Tensor x = Random(Shape{1, kRankHidden}, 30 + call);
    Tensor ids, weights;
    Routing(1, 384, /*shared=*/false, /*skewed=*/false, 30 + call, ids, weights);
    const bool bad = call == 2;
    if (bad) ids.data_as<int32_t>()[5] = 384;
    const Tensor d_x = Upload(x), d_ids = Upload(ids), d_weights = Upload(weights);
    for (const bool accumulate : {false, true}) {
      absl::Status sync, sync_ref;
      const float fill = accumulate ? 0.5f : 3.0f;
      const Tensor got = Call(*gpu_, d_x, d_ids, d_weights, d_tiled, fill, sync, accumulate);
      const Tensor want = Call(*unchained, d_x, d_ids, d_weights, d_tiled, fill, sync_ref, accumulate);
      ExpectBitwiseEqual(got, want, accumulate ? "accumulate: chained vs two kernels" : "chained vs two kernels");
      if (bad) {
        EXPECT_THAT(std::string(sync.message()), HasSubstr("token 0"));
        EXPECT_THAT(std::string(sync_ref.message()), HasSubstr("token 0"));
        for (int64_t h = 0; h < kRankHidden; ++h) ASSERT_EQ(got.data_as<float>()[h], fill) << "column " << h;
      } else {
        EXPECT_TRUE(sync.ok()) << sync;
        Tensor cpu_want = Filled(Shape{1, kRankHidden}, fill);
        EXPECT_TRUE(cpu_.QuantizedMoeExperts(x, ids, weights, r.views, cpu_want, accumulate).ok());
        EXPECT_LE(parity::RelError(got, cpu_want), kExactTol);
      }
    }
  }
  // Captured and replayed: the eager call's bits.
  Tensor ids, weights;
  Routing(1, 384, /*shared=*/false, /*skewed=*/false, 40, ids, weights);
  Tensor d_x = Upload(Random(Shape{1, kRankHidden}, 40));
  const Tensor d_ids = Upload(ids), d_weights = Upload(weights);
  Tensor d_out = Upload(Filled(Shape{1, kRankHidden}, 0.0f));
  ASSERT_TRUE(gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d_tiled, d_out, false).ok());
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] {
    return gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d_tiled, d_out, false);
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(gpu_->Copy(Random(Shape{1, kRankHidden}, 41), d_x).ok());
  for (int replay = 0; replay < 3; ++replay) ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
  const Tensor replayed = Download(d_out);
  ASSERT_TRUE(gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d_tiled, d_out, false).ok());
  ExpectBitwiseEqual(Download(d_out), replayed, "eager after replay");
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

TEST_F(CudaQuantizedMoeTest, NewExpertSetWhileCapturingIsRefused) {
  const QuantizedExperts experts = MakeQuantizedExperts(DeepseekV3Fp8Quantization(), 3, AlignedLayouts(), 5);
  const DeviceExperts d = ToDevice(DeepseekV3Fp8Quantization(), experts);
  Tensor ids, weights;
  RandomRouting(2, 2, 3, 1, ids, weights);
  const Tensor d_x = Upload(Random(Shape{2, kHidden}, 2)), d_ids = Upload(ids), d_weights = Upload(weights);
  Tensor d_out = Upload(Filled(Shape{2, kHidden}, 0.0f));
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] {
    return gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d.views, d_out, false);
  });
  ASSERT_FALSE(graph.ok());
  EXPECT_THAT(std::string(graph.status().message()), HasSubstr("QuantizedMoeExperts"));
}

TEST_F(CudaQuantizedMoeTest, BadIdReportedBySynchronizeAndRowKept) {
  const QuantizedExperts experts = MakeQuantizedExperts(KimiK2ThinkingInt4Quantization(), 3, OddLayouts(), 6);
  const DeviceExperts d = ToDevice(KimiK2ThinkingInt4Quantization(), experts);
  Tensor ids, weights;
  RandomRouting(3, 2, 3, 1, ids, weights);
  ids.data_as<int32_t>()[3] = 3;  // token 1, slot 1
  const Tensor d_x = Upload(Random(Shape{3, kHidden}, 2)), d_ids = Upload(ids), d_weights = Upload(weights);
  Tensor d_out = Upload(Filled(Shape{3, kHidden}, 5.0f));
  ASSERT_TRUE(gpu_->QuantizedMoeExperts(d_x, d_ids, d_weights, d.views, d_out, false).ok());
  const absl::Status status = gpu_->Synchronize();
  EXPECT_THAT(std::string(status.message()), testing::AllOf(HasSubstr("QuantizedMoeExperts"), HasSubstr("token 1")));
  const Tensor got = Download(d_out);
  EXPECT_EQ(got.data_as<float>()[kHidden], 5.0f);
  EXPECT_NE(got.data_as<float>()[0], 5.0f);
}

TEST_F(CudaQuantizedMoeTest, Int4F32ScalesRefused) {
  const QuantizedExperts experts = MakeQuantizedExperts(KimiK2ThinkingInt4Quantization(), 2, AlignedLayouts(), 7);
  DeviceExperts d = ToDevice(KimiK2ThinkingInt4Quantization(), experts);
  std::vector<Tensor> f32;
  for (QuantizedExpertWeights& w : d.views) {
    for (QuantizedWeightView* v : {&w.gate, &w.up, &w.down}) {
      f32.push_back(Upload(F32Copy(Download(v->scales))));
      v->scales = f32.back();
    }
  }
  Tensor ids, weights;
  RandomRouting(1, 2, 2, 1, ids, weights);
  Tensor d_out = Upload(Filled(Shape{1, kHidden}, 0.0f));
  const absl::Status status =
      gpu_->QuantizedMoeExperts(Upload(Random(Shape{1, kHidden}, 1)), Upload(ids), Upload(weights), d.views, d_out,
                                false);
  EXPECT_THAT(std::string(status.message()), testing::AllOf(HasSubstr("QuantizedMoeExperts"), HasSubstr("bf16")));
}

}  // namespace
}  // namespace eagle3
