// The stored forms of quantized weights: int4 packing against compressed-tensors' own examples,
// the e4m3fn decoding of all 256 bytes, which schema tensors each hub format quantizes, TP slices
// (starting inside blocks, words and groups) against slices of the whole dequantized weight, and
// every malformed quantized checkpoint refused naming the tensor before anything is loaded.
#include "eagle3/detail/quantized_weights.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/half.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/target_model.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "checkpoint_rewrite.h"
#include "quantized_test_util.h"
#include "scoped_temp_dir.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

// compressed-tensors' tests/test_compressors/quantized_compressors/test_pack_quant.py packs these
// rows (pack_to_int32, num_bits 4) into these words: [1, 2, 3, 4] -> 52137 = 0x0000CBA9 (nibble
// j holds value j + 8, the first value lowest, zero nibbles pad the word) and [-8 .. -1] ->
// 1985229328 = 0x76543210.
TEST(Int4PackingTest, MatchesCompressedTensorsHandPackedWords) {
  struct Example {
    std::vector<int8_t> values;
    std::vector<int32_t> words;
  };
  const std::vector<Example> examples = {
      {{1, 2, 3, 4}, {52137}},
      {{-8, -7, -6, -5, -4, -3, -2, -1}, {1985229328}},
      {{1}, {9}},
  };
  for (const Example& e : examples) {
    const int64_t n = static_cast<int64_t>(e.values.size());
    std::vector<int32_t> words(static_cast<size_t>(Int4PackedWords(n)), -1);
    PackInt4Row(e.values.data(), n, words.data());
    EXPECT_EQ(words, e.words) << "n " << n;
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(Int4At(words.data(), j), e.values[static_cast<size_t>(j)]) << j;
  }
  // A nine-value row: 0, 7, -8, 1, 2, 3, 4, 5 -> nibbles 8, F, 0, 9, A, B, C, D (first lowest);
  // the ninth value starts a second word.
  const int8_t nine[] = {0, 7, -8, 1, 2, 3, 4, 5, -1};
  int32_t words[2];
  PackInt4Row(nine, 9, words);
  for (int j = 0; j < 9; ++j) EXPECT_EQ(Int4At(words, j), nine[j]) << j;
  EXPECT_EQ(static_cast<uint32_t>(words[0]), 0xDCBA90F8u);
  EXPECT_EQ(static_cast<uint32_t>(words[1]), 0x00000007u);  // -1 + 8, then zero padding
  // Negative words (top nibble >= 8) unpack through the unsigned view.
  const int32_t negative = static_cast<int32_t>(0xF0000000u);
  EXPECT_EQ(Int4At(&negative, 7), 7);
  EXPECT_EQ(Int4At(&negative, 0), -8);
}

// OCP e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal (m/8 2^-6);
// no infinities; S.1111.111 is NaN, S.1111.110 = ±448 the largest finite.
TEST(Fp8E4M3Test, DecodesEveryByteAsTheFormatDefines) {
  for (int b = 0; b < 256; ++b) {
    const int sign = b >> 7, exponent = (b >> 3) & 0xf, mantissa = b & 0x7;
    const float got = F8E4M3ToFloat(static_cast<uint8_t>(b));
    if (exponent == 15 && mantissa == 7) {
      EXPECT_TRUE(std::isnan(got)) << "byte " << b;
      continue;
    }
    const double magnitude =
        exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
    const float want = static_cast<float>(sign ? -magnitude : magnitude);
    EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << "byte " << b;  // -0 included
  }
  EXPECT_EQ(F8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(F8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(F8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::signbit(F8E4M3ToFloat(0x80)));
  EXPECT_TRUE(std::isnan(F8E4M3ToFloat(0xff)));
}

std::map<std::string, StoredForm> FormsByName(const DeepseekV2Config& config) {
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  std::map<std::string, StoredForm> out;
  for (size_t i = 0; i < specs.size(); ++i) out[specs[i].name] = forms[i];
  return out;
}

TEST(StoredFormsTest, Fp8QuantizesEveryLinearButLmHead) {
  const auto forms = FormsByName(QuantTestConfig(DeepseekV3Fp8Quantization()));
  for (const auto& [name, form] : forms) {
    const bool linear = name.ends_with("_proj.weight") || name.ends_with("_proj_with_mqa.weight");
    EXPECT_EQ(form, linear ? StoredForm::kFp8Block : StoredForm::kPlain) << name;
  }
  EXPECT_EQ(forms.at("lm_head.weight"), StoredForm::kPlain);
  EXPECT_EQ(forms.at("model.embed_tokens.weight"), StoredForm::kPlain);
  EXPECT_EQ(forms.at("model.layers.1.mlp.gate.weight"), StoredForm::kPlain);  // the router
  EXPECT_EQ(forms.at("model.layers.1.mlp.gate.e_score_correction_bias"), StoredForm::kPlain);
  EXPECT_EQ(forms.at("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), StoredForm::kFp8Block);
}

TEST(StoredFormsTest, KimiK2ThinkingInt4QuantizesOnlyTheRoutedExperts) {
  const auto forms = FormsByName(QuantTestConfig(KimiK2ThinkingInt4Quantization()));
  int quantized = 0;
  for (const auto& [name, form] : forms) {
    const bool routed = name.find(".mlp.experts.") != std::string::npos;
    EXPECT_EQ(form, routed ? StoredForm::kInt4Packed : StoredForm::kPlain) << name;
    quantized += form == StoredForm::kInt4Packed;
  }
  EXPECT_EQ(quantized, 2 * 8 * 3);  // two MoE layers of 8 experts, 3 projections each
  // With nothing ignored, every Linear is quantized, lm_head included.
  QuantizationConfig all = KimiK2ThinkingInt4Quantization();
  all.ignore = {"re:.*kv_b_proj"};  // prefix match: the weight's module name ends there
  for (const auto& [name, form] : FormsByName(QuantTestConfig(all))) {
    const bool linear =
        name.ends_with("_proj.weight") || name.ends_with("_proj_with_mqa.weight") || name == "lm_head.weight";
    EXPECT_EQ(form,
              linear && name.find("kv_b_proj") == std::string::npos ? StoredForm::kInt4Packed : StoredForm::kPlain)
        << name;
  }
}

class QuantizedSliceTest : public ::testing::TestWithParam<std::pair<std::string, QuantizationConfig>> {};

TEST_P(QuantizedSliceTest, TpSlicesEqualSlicesOfTheDequantizedWhole) {
  const DeepseekV2Config config = QuantTestConfig(GetParam().second);
  ScopedTempDir dir, plain_dir;
  WriteQuantTestCheckpoint(config, dir.path(), plain_dir.path());
  auto quantized = Checkpoint::Open(dir.path());
  auto plain = Checkpoint::Open(plain_dir.path());
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  int checked = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (forms[i] == StoredForm::kPlain) continue;
    ASSERT_TRUE(CheckStoredWeight(**quantized, specs[i], forms[i], config.quantization).ok()) << specs[i].name;
    for (int tp : {1, 2, 3, 4, 8}) {
      for (int rank = 0; rank < tp; ++rank) {
        const ShardSpec shard = specs[i].ForRank(tp, rank);
        auto want = (*plain)->ReadShard(specs[i].name, shard, DType::kF32);
        if (!want.ok()) continue;  // tp 3 does not divide this tensor's split dim
        auto got = ReadWeightShard(**quantized, specs[i], forms[i], config.quantization, shard, DType::kF32);
        ASSERT_TRUE(got.ok()) << specs[i].name << " tp " << tp << ": " << got.status();
        ASSERT_EQ(got->shape(), want->shape()) << specs[i].name;
        const float* g = got->data_as<float>();
        const float* w = want->data_as<float>();
        for (int64_t e = 0; e < got->numel(); ++e) {
          ASSERT_EQ(std::bit_cast<uint32_t>(g[e]), std::bit_cast<uint32_t>(w[e]))
              << specs[i].name << " tp " << tp << " rank " << rank << " element " << e;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedSliceTest, ::testing::ValuesIn(TestQuantizations()),
                         [](const auto& info) { return info.param.first; });

struct Malformed {
  std::string name;
  QuantizationConfig quantization;
  std::function<void(std::map<std::string, Tensor>&)> edit;
  std::function<void(nlohmann::json&)> edit_config;
  absl::StatusCode code;
  std::vector<std::string> substrings;
};

std::vector<Malformed> MalformedCases() {
  const QuantizationConfig fp8 = DeepseekV3Fp8Quantization();
  const QuantizationConfig int4 = KimiK2ThinkingInt4Quantization();
  const std::string q_a = "model.layers.0.self_attn.q_a_proj.weight";          // [64, 64]
  const std::string q_b = "model.layers.0.self_attn.q_b_proj.weight";          // [192, 64]
  const std::string expert = "model.layers.1.mlp.experts.3.down_proj.weight";  // [64, 96]
  auto no_config_edit = [](nlohmann::json&) {};
  const absl::StatusCode kNotFound = absl::StatusCode::kNotFound;
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  return {
      {"fp8_missing_scale",
       fp8,
       [=](auto& t) { t.erase(q_b + "_scale_inv"); },
       no_config_edit,
       kNotFound,
       {q_b + "_scale_inv'", "the block scales of '" + q_b + "'", "fp8-block"}},
      {"fp8_scale_wrong_shape",
       fp8,
       [=](auto& t) {
         t[q_b + "_scale_inv"] = Filled(DType::kF32, Shape{1, 1});
       },
       no_config_edit,
       kInvalid,
       {q_b + "_scale_inv'", "shape [1, 1], expected [2, 1]"}},
      {"fp8_weight_not_fp8",
       fp8,
       [=](auto& t) {
         t[q_a] = Filled(DType::kBF16, Shape{64, 64});
       },
       no_config_edit,
       kInvalid,
       {q_a + "'", "is BF16; expected F8_E4M3"}},
      {"fp8_scale_not_float",
       fp8,
       [=](auto& t) {
         t[q_a + "_scale_inv"] = Filled(DType::kI32, Shape{1, 1});
       },
       no_config_edit,
       kInvalid,
       {q_a + "_scale_inv'", "is I32; expected F32"}},
      {"fp8_scale_of_unquantized_lm_head",
       fp8,
       [=](auto& t) {
         t["lm_head.weight_scale_inv"] = Filled(DType::kF32, Shape{8, 1});
       },
       no_config_edit,
       kInvalid,
       {"lm_head.weight_scale_inv", "not used by the model", "leaves unquantized"}},
      {"fp8_config_lost",
       fp8,
       [](auto&) {},
       [](nlohmann::json& j) { j.erase("quantization_config"); },
       kInvalid,
       {"has no quantization_config", "Restore"}},
      {"int4_missing_scale",
       int4,
       [=](auto& t) { t.erase(expert + "_scale"); },
       no_config_edit,
       kNotFound,
       {expert + "_scale'", expert}},
      {"int4_scale_wrong_shape",
       int4,
       [=](auto& t) {
         t[expert + "_scale"] = Filled(DType::kBF16, Shape{64, 2});
       },
       no_config_edit,
       kInvalid,
       {expert + "_scale'", "shape [64, 2], expected [64, 3]"}},
      {"int4_packed_wrong_shape",
       int4,
       [=](auto& t) {
         t[expert + "_packed"] = Filled(DType::kI32, Shape{64, 13});
       },
       no_config_edit,
       kInvalid,
       {expert + "_packed'", "expected [64, 12]"}},
      {"int4_weight_shape_disagrees",
       int4,
       [=](auto& t) {
         Tensor s = Filled(DType::kI32, Shape{2});
         s.data_as<int32_t>()[0] = 64;
         s.data_as<int32_t>()[1] = 104;
         t[expert + "_shape"] = std::move(s);
       },
       no_config_edit,
       kInvalid,
       {expert + "_shape'", "holds [64, 104]", expert + "' is [64, 96]"}},
      {"int4_group_size_does_not_divide",
       int4,
       [](auto&) {},
       [](nlohmann::json& j) { j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 48; },
       kInvalid,
       {"model.layers.1.mlp.experts.0.gate_proj.weight'", "64 input columns", "group_size 48"}},
      {"int4_plain_weight_left_behind",
       int4,
       [=](auto& t) {
         t[expert] = Filled(DType::kBF16, Shape{64, 96});
       },
       no_config_edit,
       kInvalid,
       {expert + "'", "not used by the model"}},
  };
}

void PrintTo(const Malformed& c, std::ostream* os) { *os << c.name; }

class MalformedQuantizedCheckpointTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedQuantizedCheckpointTest, IsRefusedNamingTheTensor) {
  const Malformed& c = GetParam();
  ScopedTempDir dir;
  WriteQuantTestCheckpoint(QuantTestConfig(c.quantization), dir.path(), "");
  Rewrite(dir.path(), c.edit, c.edit_config);
  cpu::CpuBackend backend;
  TargetModelOptions options;
  options.max_tokens_per_forward = 8;
  options.max_context_len = 16;
  options.num_kv_pages = 4;
  options.page_size = 4;
  auto model = TargetModel::Create(dir.path(), options, nullptr, &backend);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), c.code) << model.status();
  for (const std::string& s : c.substrings) EXPECT_THAT(model.status().message(), HasSubstr(s));
}

INSTANTIATE_TEST_SUITE_P(Cases, MalformedQuantizedCheckpointTest, ::testing::ValuesIn(MalformedCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace eagle3
