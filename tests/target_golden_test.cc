// The target forward against golden outputs of HF transformers (tools/make_golden.py): logits and
// the residual stream at every boundary, at TP 1 and TP 8 in both residual modes, through both
// attention paths. Weights are bf16 and read exactly; both sides compute in fp32, so the tolerance
// is 1e-4 of the tensor's largest magnitude. The quantized fixtures (v3_fp8: DeepSeek-V3's FP8
// block-scaled form; k25_int4: Kimi-K2.5's multimodal form with compressed-tensors int4 routed
// experts) hold the hub's quantized tensors, and their expected outputs come from transformers run
// on the weights those dequantize to: the CPU reference dequantizes them exactly at load, so the
// same tolerance holds, and TP 8 agrees with TP 1. v3_mtp's checkpoint also carries DeepSeek-V3's
// MTP module (layer num_hidden_layers), which the target forward must load around and not run.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/quantization_config.h"
#include "eagle3/safetensors.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/testing/rank_threads.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

constexpr double kTolerance = 1e-4;

struct Outputs {
  std::vector<float> logits, aux;
};

struct Golden {
  std::string dir;
  DeepseekV2Config config;
  std::vector<int64_t> tokens;
  std::unique_ptr<SafetensorsFile> expected;
};

Golden LoadGolden(const std::string& name) {
  Golden g;
  g.dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + name;
  auto config = DeepseekV2Config::FromFile(g.dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (config.ok()) g.config = *config;
  auto expected = SafetensorsFile::Open(g.dir + "/expected.safetensors");
  EXPECT_TRUE(expected.ok()) << expected.status();
  if (!expected.ok()) return g;
  g.expected = std::move(*expected);
  auto tokens = g.expected->View("tokens");
  EXPECT_TRUE(tokens.ok()) << tokens.status();
  if (tokens.ok()) g.tokens.assign(tokens->data_as<int64_t>(), tokens->data_as<int64_t>() + tokens->numel());
  return g;
}

Outputs RunTarget(const Golden& g, int tp, ResidualMode mode, AttentionPath path, const HiddenStateTap& tap) {
  const int64_t t = static_cast<int64_t>(g.tokens.size());
  TargetModelOptions options;
  options.tp_size = tp;
  options.residual_mode = mode;
  options.attention_path = path;
  options.max_tokens_per_forward = t;
  options.max_context_len = t;
  options.page_size = 4;
  options.num_kv_pages = (t + 3) / 4;
  std::vector<int32_t> pages(static_cast<size_t>(options.num_kv_pages));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(pages.size() - 1 - p);
  std::vector<Outputs> out(static_cast<size_t>(tp));
  const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
    cpu::CpuBackend backend;
    TargetModelOptions o = options;
    o.rank = rank;
    EAGLE3_ASSIGN_OR_RETURN(auto model, TargetModel::Create(g.dir, o, comm, &backend));
    Outputs& r = out[static_cast<size_t>(rank)];
    r.logits.resize(static_cast<size_t>(t * g.config.vocab_size));
    r.aux.resize(static_cast<size_t>(t * tap.width()));
    SequenceInput in;
    in.tokens = g.tokens;
    in.page_table = pages;
    in.all_logits = true;
    return model->Forward(std::span<const SequenceInput>(&in, 1),
                          TensorView(r.logits.data(), DType::kF32, Shape{t, g.config.vocab_size}), &tap,
                          TensorView(r.aux.data(), DType::kF32, Shape{t, tap.width()}));
  });
  EXPECT_TRUE(status.ok()) << status;
  return out[0];
}

// Max |got - want| over the largest |want|.
double RelError(const float* got, const float* want, int64_t n) {
  double diff = 0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return diff / scale;
}

void ExpectMatchesGolden(const Golden& g, const Outputs& got, const HiddenStateTap& tap, const std::string& what) {
  const int64_t t = static_cast<int64_t>(g.tokens.size());
  auto logits = g.expected->View("logits");
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->numel(), t * g.config.vocab_size);
  const double logits_error = RelError(got.logits.data(), logits->data_as<float>(), logits->numel());
  EXPECT_LT(logits_error, kTolerance) << what << " logits";
  double worst_boundary = 0;
  const int64_t hd = g.config.hidden_size;
  for (int b = 0; b <= g.config.num_hidden_layers; ++b) {
    auto want = g.expected->View("boundary." + std::to_string(b));
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<float> column(static_cast<size_t>(t * hd));
    for (int64_t i = 0; i < t; ++i) {
      std::copy_n(got.aux.begin() + i * tap.width() + b * hd, hd, column.begin() + i * hd);
    }
    const double error = RelError(column.data(), want->data_as<float>(), t * hd);
    worst_boundary = std::max(worst_boundary, error);
    EXPECT_LT(error, kTolerance) << what << " boundary " << b;
  }
  std::printf("  %-18s logits rel. error %.2e, worst boundary %.2e\n", what.c_str(), logits_error, worst_boundary);
}

class TargetGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TargetGoldenTest, LogitsAndEveryBoundaryMatchTransformers) {
  const Golden g = LoadGolden(GetParam());
  ASSERT_NE(g.expected, nullptr);
  ASSERT_FALSE(g.tokens.empty());
  const int layers = static_cast<int>(g.config.num_hidden_layers);
  std::vector<int> all(static_cast<size_t>(layers + 1));
  for (int b = 0; b <= layers; ++b) all[static_cast<size_t>(b)] = b;
  auto tap = HiddenStateTap::Create(std::span<const int>(all), LayerIdConvention::kInputOfLayer, layers,
                                    g.config.hidden_size);
  ASSERT_TRUE(tap.ok()) << tap.status();
  ExpectMatchesGolden(g, RunTarget(g, 1, ResidualMode::kReplicated, AttentionPath::kNonAbsorbed, *tap), *tap,
                      "tp1 non-absorbed");
  ExpectMatchesGolden(g, RunTarget(g, 1, ResidualMode::kReplicated, AttentionPath::kAbsorbed, *tap), *tap,
                      "tp1 absorbed");
  ExpectMatchesGolden(g, RunTarget(g, 8, ResidualMode::kReplicated, AttentionPath::kAuto, *tap), *tap,
                      "tp8 replicated");
  ExpectMatchesGolden(g, RunTarget(g, 8, ResidualMode::kTokenSharded, AttentionPath::kAuto, *tap), *tap,
                      "tp8 token-sharded");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TargetGoldenTest,
                         ::testing::Values("v2_qlora_yarn", "v2lite_greedy", "v3_noaux", "v3_fp8", "k25_int4",
                                           "v3_mtp"),
                         [](const auto& info) { return std::string(info.param); });

struct QuantizedFixture {
  const char* name;
  WeightFormat format;
  const char* tensor_prefix;
};

// gtest prints test parameters through this (instead of their bytes).
void PrintTo(const QuantizedFixture& f, std::ostream* os) { *os << f.name; }

class QuantizedTargetGoldenTest : public ::testing::TestWithParam<QuantizedFixture> {};

// The fixture is read in its quantized form (not as some unquantized fallback), and TP 8 gives the
// logits and boundaries of TP 1 in both residual modes, within 1e-5 of the largest magnitude: rank
// slices start inside FP8 blocks and int4 words / groups, so a slice dequantized with the scales of
// its rank-local rows or columns would show here.
TEST_P(QuantizedTargetGoldenTest, QuantizedFormIsReadAndTp8MatchesTp1) {
  const Golden g = LoadGolden(GetParam().name);
  ASSERT_NE(g.expected, nullptr);
  EXPECT_EQ(g.config.quantization.format, GetParam().format) << g.config.quantization.Describe();
  EXPECT_EQ(g.config.tensor_prefix, GetParam().tensor_prefix);
  const int layers = static_cast<int>(g.config.num_hidden_layers);
  std::vector<int> all(static_cast<size_t>(layers + 1));
  for (int b = 0; b <= layers; ++b) all[static_cast<size_t>(b)] = b;
  auto tap = HiddenStateTap::Create(std::span<const int>(all), LayerIdConvention::kInputOfLayer, layers,
                                    g.config.hidden_size);
  ASSERT_TRUE(tap.ok()) << tap.status();
  const Outputs tp1 = RunTarget(g, 1, ResidualMode::kReplicated, AttentionPath::kAuto, *tap);
  ASSERT_FALSE(tp1.logits.empty());
  for (ResidualMode mode : {ResidualMode::kReplicated, ResidualMode::kTokenSharded}) {
    const Outputs tp8 = RunTarget(g, 8, mode, AttentionPath::kAuto, *tap);
    ASSERT_EQ(tp8.logits.size(), tp1.logits.size());
    ASSERT_EQ(tp8.aux.size(), tp1.aux.size());
    const double logits = RelError(tp8.logits.data(), tp1.logits.data(), static_cast<int64_t>(tp1.logits.size()));
    const double aux = RelError(tp8.aux.data(), tp1.aux.data(), static_cast<int64_t>(tp1.aux.size()));
    EXPECT_LT(logits, 1e-5) << "mode " << static_cast<int>(mode);
    EXPECT_LT(aux, 1e-5) << "mode " << static_cast<int>(mode);
    std::printf("  tp8 vs tp1 (mode %d): logits %.2e, boundaries %.2e\n", static_cast<int>(mode), logits, aux);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantizedTargetGoldenTest,
                         ::testing::Values(QuantizedFixture{"v3_fp8", WeightFormat::kFp8Block, ""},
                                           QuantizedFixture{"k25_int4", WeightFormat::kInt4Group, "language_model."}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace eagle3
