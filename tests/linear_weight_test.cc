// LoadLinearWeight and LinearWeight::Apply on the CPU backend over random quantized checkpoints (the
// forms of TestQuantizations()): every quantized Linear at TP 1 and every rank of TP 8, loaded dense
// (the CPU backend's default) and kept quantized (forced), each applied to the same activations
// equal to Gemm over the slice of the unquantized checkpoint, bit for bit (vocab padding rows
// included); the quantized form is the slice's stored bytes at its global offsets; INT4 scales that
// are not bf16 values (or NaN) load dense, f32 ones that are (signed zeros and infinities included)
// stay quantized.
#include "linear_weight.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_rewrite.h"
#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/half.h"
#include "eagle3/tensor.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gtest/gtest.h"
#include "host_tensor_util.h"
#include "quantized_test_util.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

bool BitwiseEqual(const TensorView& a, const TensorView& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.is_contiguous() && b.is_contiguous() &&
         std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// LinearWeight::Apply of `w` to `a`, into a fresh c.
Tensor Applied(cpu::CpuBackend& cpu, const LinearWeight& w, const Tensor& a) {
  Tensor c = *Tensor::Zeros(DType::kF32, Shape{a.dim(0), w.rows()});
  const absl::Status status = w.Apply(cpu, a, c);
  EXPECT_TRUE(status.ok()) << status;
  return c;
}

class LinearWeightTest : public ::testing::TestWithParam<std::pair<std::string, QuantizationConfig>> {};

TEST_P(LinearWeightTest, DenseAndQuantizedLoadsApplyAsThePlainSlice) {
  const DeepseekV2Config config = QuantTestConfig(GetParam().second);
  ScopedTempDir dir, plain_dir;
  WriteQuantTestCheckpoint(config, dir.path(), plain_dir.path());
  auto quantized = Checkpoint::Open(dir.path());
  auto plain = Checkpoint::Open(plain_dir.path());
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  const bool fp8 = config.quantization.format == WeightFormat::kFp8Block;
  cpu::CpuBackend cpu;
  int checked = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (forms[i] == StoredForm::kPlain) continue;
    const WeightSpec& spec = specs[i];
    for (int tp : {1, 8}) {
      for (int rank = 0; rank < tp; ++rank) {
        const ShardSpec shard = spec.ForRank(tp, rank);
        auto want = (*plain)->ReadShard(spec.name, shard, DType::kF32);
        if (!want.ok()) continue;  // tp 8 does not divide this tensor's split dim
        const std::string what = spec.name + " tp " + std::to_string(tp) + " rank " + std::to_string(rank);
        auto dense = LoadLinearWeight(cpu, **quantized, spec, forms[i], config.quantization, shard);
        auto kept = LoadLinearWeight(cpu, **quantized, spec, forms[i], config.quantization, shard,
                                     LinearWeightLoad{.keep_quantized = true});
        ASSERT_TRUE(dense.ok()) << what << ": " << dense.status();
        ASSERT_TRUE(kept.ok()) << what << ": " << kept.status();
        ASSERT_FALSE(dense->quantized()) << what;
        EXPECT_TRUE(BitwiseEqual(dense->dense(), *want)) << what;
        ASSERT_TRUE(kept->quantized()) << what;
        const QuantizedWeightView& view = kept->quantized_view();
        ASSERT_EQ(kept->rows(), want->dim(0)) << what;
        ASSERT_EQ(kept->cols(), want->dim(1)) << what;
        const bool split = tp > 1 && spec.split != TpSplit::kReplicated;
        EXPECT_EQ(view.row0, split && shard.dim == 0 ? rank * want->dim(0) : 0) << what;
        EXPECT_EQ(view.col0, split && shard.dim == 1 ? rank * want->dim(1) : 0) << what;
        EXPECT_EQ(view.scales.dtype(), fp8 ? DType::kF32 : DType::kBF16) << what;
        EXPECT_EQ(view.block_cols, fp8 ? config.quantization.block_in : config.quantization.group_size) << what;
        // Only the scale blocks the slice touches are kept.
        EXPECT_EQ(view.scale_col0, view.col0 / view.block_cols) << what;
        EXPECT_EQ(view.scales.dim(1), (view.col0 + view.k - 1) / view.block_cols + 1 - view.scale_col0) << what;
        EXPECT_LT(kept->bytes(), dense->bytes()) << what;

        const Tensor a = RandomF32(Shape{3, want->dim(1)}, static_cast<uint32_t>(i * 64 + tp * 8 + rank));
        Tensor reference = *Tensor::Zeros(DType::kF32, Shape{3, want->dim(0)});
        ASSERT_TRUE(cpu.Gemm(a, *want, reference, kWeightsGemm).ok());
        EXPECT_TRUE(BitwiseEqual(Applied(cpu, *dense, a), reference)) << what << " dense";
        EXPECT_TRUE(BitwiseEqual(Applied(cpu, *kept, a), reference)) << what << " kept quantized";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, LinearWeightTest, ::testing::ValuesIn(TestQuantizations()),
                         [](const auto& info) { return info.param.first; });

// StackLinearWeights over a dense MLP's gate and up slices, kept quantized and dense: where it
// stacks, the stacked weight's product is the parts' products side by side, bit for bit; INT4 rows
// and dense weights always stack, FP8 slices only when they hold whole 128-row blocks (TP 1 here; the
// 16-row TP 8 slices start inside a block), and a dense part never stacks with a quantized one.
TEST_P(LinearWeightTest, GateAndUpStackWhereTheirBlocksAllow) {
  const DeepseekV2Config config = QuantTestConfig(GetParam().second);
  ScopedTempDir dir, plain_dir;
  WriteQuantTestCheckpoint(config, dir.path(), plain_dir.path());
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  auto find = [&](const std::string& name) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].name == name) return i;
    }
    ADD_FAILURE() << name << " is not in the schema";
    return size_t{0};
  };
  const size_t gate = find("model.layers.0.mlp.gate_proj.weight"), up = find("model.layers.0.mlp.up_proj.weight");
  if (forms[gate] == StoredForm::kPlain) GTEST_SKIP() << "the dense MLP is not quantized in " << GetParam().first;
  const bool int4 = config.quantization.format == WeightFormat::kInt4Group;
  cpu::CpuBackend cpu;
  for (int tp : {1, 8}) {
    for (int rank = 0; rank < tp; ++rank) {
      const std::string what = "tp " + std::to_string(tp) + " rank " + std::to_string(rank);
      std::vector<LinearWeight> kept, dense;
      for (size_t i : {gate, up}) {
        auto k = LoadLinearWeight(cpu, **checkpoint, specs[i], forms[i], config.quantization,
                                  specs[i].ForRank(tp, rank), LinearWeightLoad{.keep_quantized = true});
        auto d = LoadLinearWeight(cpu, **checkpoint, specs[i], forms[i], config.quantization,
                                  specs[i].ForRank(tp, rank));
        ASSERT_TRUE(k.ok() && d.ok()) << what;
        kept.push_back(std::move(*k));
        dense.push_back(std::move(*d));
      }
      const Tensor a = RandomF32(Shape{3, kept[0].cols()}, static_cast<uint32_t>(tp * 8 + rank));
      const Tensor g = Applied(cpu, kept[0], a), u = Applied(cpu, kept[1], a);
      Tensor side_by_side = *Tensor::Empty(DType::kF32, Shape{3, g.dim(1) + u.dim(1)});
      for (int64_t r = 0; r < 3; ++r) {
        std::memcpy(side_by_side.data_as<float>() + r * side_by_side.dim(1), g.data_as<float>() + r * g.dim(1),
                    sizeof(float) * g.dim(1));
        std::memcpy(side_by_side.data_as<float>() + r * side_by_side.dim(1) + g.dim(1),
                    u.data_as<float>() + r * u.dim(1), sizeof(float) * u.dim(1));
      }
      auto stacked = StackLinearWeights(cpu, kept);
      ASSERT_TRUE(stacked.ok()) << what << ": " << stacked.status();
      const bool whole_blocks = kept[0].quantized_view().row0 % kept[0].quantized_view().block_rows == 0 &&
                                kept[0].rows() % kept[0].quantized_view().block_rows == 0;
      EXPECT_EQ(stacked->has_value(), int4 || whole_blocks) << what;
      if (int4) EXPECT_TRUE(stacked->has_value()) << what;
      if (stacked->has_value()) {
        EXPECT_TRUE((*stacked)->quantized()) << what;
        EXPECT_TRUE(BitwiseEqual(Applied(cpu, **stacked, a), side_by_side)) << what;
      }
      auto stacked_dense = StackLinearWeights(cpu, dense);
      ASSERT_TRUE(stacked_dense.ok() && stacked_dense->has_value()) << what;
      EXPECT_TRUE(BitwiseEqual(Applied(cpu, **stacked_dense, a), side_by_side)) << what << " dense";
      std::vector<LinearWeight> mixed;
      mixed.push_back(std::move(dense[0]));
      mixed.push_back(std::move(kept[1]));
      auto none = StackLinearWeights(cpu, mixed);
      ASSERT_TRUE(none.ok()) << what;
      EXPECT_FALSE(none->has_value()) << what;
    }
  }
}

// Rank 3 of 8's slice of an INT4 expert whose scales the checkpoint stores in f32, as
// `scale(its bf16 value, index)`, loaded by LoadLinearWeight with keep_quantized: kept quantized when
// every scale is a bf16 value, else dense and equal to ReadWeightShard's dequantized slice.
template <typename ScaleFn>
void LoadInt4WithF32Scales(ScaleFn scale, bool expect_quantized) {
  const DeepseekV2Config config = QuantTestConfig(KimiK2ThinkingInt4Quantization());
  ScopedTempDir dir, plain_dir;
  WriteQuantTestCheckpoint(config, dir.path(), plain_dir.path());
  const std::string expert = "model.layers.1.mlp.experts.3.down_proj.weight";  // [64, 96]
  Rewrite(dir.path(), [&](std::map<std::string, Tensor>& tensors) {
    const Tensor& bf16 = tensors.at(Int4ScaleName(expert));
    Tensor f32 = *Tensor::Empty(DType::kF32, bf16.shape());
    for (int64_t j = 0; j < bf16.numel(); ++j) {
      f32.data_as<float>()[j] = scale(Bf16ToFloat(bf16.data_as<uint16_t>()[j]), j);
    }
    tensors[Int4ScaleName(expert)] = std::move(f32);
  });
  auto checkpoint = Checkpoint::Open(dir.path());
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  cpu::CpuBackend cpu;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name != expert) continue;
    ASSERT_EQ(forms[i], StoredForm::kInt4Packed);
    ASSERT_TRUE(CheckStoredWeight(**checkpoint, specs[i], forms[i], config.quantization).ok());
    const ShardSpec shard = specs[i].ForRank(8, 3);
    auto w = LoadLinearWeight(cpu, **checkpoint, specs[i], forms[i], config.quantization, shard,
                              LinearWeightLoad{.keep_quantized = true});
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->quantized(), expect_quantized);
    if (expect_quantized) return;
    auto want = ReadWeightShard(**checkpoint, specs[i], forms[i], config.quantization, shard, DType::kF32);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(BitwiseEqual(w->dense(), *want));
    return;
  }
  FAIL() << expert << " is not in the schema";
}

TEST(LinearWeightLoadTest, Int4ScalesThatAreNotBf16LoadDense) {
  LoadInt4WithF32Scales([](float s, int64_t) { return s * (1.0f + 0x1p-20f); }, /*expect_quantized=*/false);
  // One NaN among bf16 values (scales [64, 3]: index 4 is row 1's group 1, which rank 3's columns 36..47
  // use): a NaN never equals itself after a round trip through bf16.
  LoadInt4WithF32Scales([](float s, int64_t j) { return j == 4 ? std::bit_cast<float>(0x7fc00000u) : s; },
                        /*expect_quantized=*/false);
}

TEST(LinearWeightLoadTest, F32Int4ScalesThatAreBf16ValuesStayQuantized) {
  LoadInt4WithF32Scales([](float s, int64_t) { return s; }, /*expect_quantized=*/true);
  LoadInt4WithF32Scales(
      [](float s, int64_t j) { return j == 1 ? -0.0f : j == 4 ? std::bit_cast<float>(0x7f800000u) : s; },
      /*expect_quantized=*/true);
}

TEST(LinearWeightLoadTest, AnEmptyWeightIsRefused) {
  cpu::CpuBackend cpu;
  const Tensor a = RandomF32(Shape{1, 4}, 1);
  Tensor c = *Tensor::Zeros(DType::kF32, Shape{1, 4});
  const absl::Status status = LinearWeight().Apply(cpu, a, c);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
}

}  // namespace
}  // namespace eagle3
