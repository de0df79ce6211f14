// quantization_config in config.json: both published forms parse with every key (DeepSeek-V3's FP8,
// Kimi-K2-Thinking's compressed-tensors INT4), round-trip through the hub writer, and every other
// method, format or setting is refused naming config.json, the key path, what eagle3 expects and
// what it got.
#include "eagle3/quantization_config.h"

#include <ostream>
#include <string>
#include <vector>

#include "config_test_util.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/testing/deepseek_v2_config_writer.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::eagle3::testing::EditedConfig;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kV3[] = "deepseek-ai_DeepSeek-V3.json";
constexpr char kK2[] = "moonshotai_Kimi-K2-Instruct.json";

// Kimi-K2-Thinking's quantization_config as published (every key, in the hub's order).
Json KimiK2ThinkingQuantizationJson() {
  return Json::parse(R"({
    "config_groups": {
      "group_0": {
        "input_activations": null,
        "output_activations": null,
        "targets": ["Linear"],
        "weights": {
          "actorder": null, "block_structure": null, "dynamic": false, "group_size": 32,
          "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
          "symmetric": true, "type": "int"
        }
      }
    },
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
               "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": null,
    "quant_method": "compressed-tensors",
    "quantization_status": "compressed"
  })");
}

// Kimi-K2's hub config with Kimi-K2-Thinking's quantization_config, edited by `edit`.
std::string K2Thinking(const std::function<void(Json&)>& edit = [](Json&) {}) {
  return EditedConfig(kK2, [&](Json& j) {
    j["quantization_config"] = KimiK2ThinkingQuantizationJson();
    edit(j["quantization_config"]);
  });
}
// DeepSeek-V3's hub config with its quantization_config edited by `edit`.
std::string V3(const std::function<void(Json&)>& edit) {
  return EditedConfig(kV3, [&](Json& j) { edit(j["quantization_config"]); });
}

TEST(QuantizationConfigTest, DeepseekV3Fp8) {
  auto c = DeepseekV2Config::FromJson(::eagle3::testing::ReadConfigText(kV3), kV3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization, DeepseekV3Fp8Quantization());
  EXPECT_EQ(c->quantization.Describe(), "fp8-block e4m3, 128x128 blocks");
  EXPECT_EQ(WeightFormatName(c->quantization.format), "fp8-block");
}

TEST(QuantizationConfigTest, DeepseekV31ScaleFmtAndGeneralBlocks) {
  auto c = DeepseekV2Config::FromJson(V3([](Json& q) {
                                        q["scale_fmt"] = "ue8m0";
                                        q["weight_block_size"] = {64, 32};
                                      }),
                                      "v31.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization.scale_fmt, "ue8m0");
  EXPECT_EQ(c->quantization.block_out, 64);
  EXPECT_EQ(c->quantization.block_in, 32);
}

TEST(QuantizationConfigTest, KimiK2ThinkingInt4) {
  auto c = DeepseekV2Config::FromJson(K2Thinking(), "k2-thinking.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quantization, KimiK2ThinkingInt4Quantization());
  EXPECT_EQ(c->quantization.group_size, 32);
  EXPECT_EQ(c->quantization.ignore.size(), 4u);
  EXPECT_EQ(WeightFormatName(c->quantization.format), "int4-group");
  // The optional keys of compressed-tensors' QuantizationConfig that carry no math.
  auto extra = DeepseekV2Config::FromJson(K2Thinking([](Json& q) {
                                            q["global_compression_ratio"] = 3.2;
                                            q["version"] = "0.12.2";
                                            q["sparsity_config"] = Json::object();
                                            q["config_groups"]["group_0"]["format"] = "pack-quantized";
                                            q["config_groups"]["group_0"]["weights"]["scale_dtype"] = nullptr;
                                          }),
                                          "k2-thinking.json");
  EXPECT_TRUE(extra.ok()) << extra.status();
}

TEST(QuantizationConfigTest, HubWriterRoundTripsBothForms) {
  for (const QuantizationConfig& q : {DeepseekV3Fp8Quantization(), KimiK2ThinkingInt4Quantization()}) {
    auto base = DeepseekV2Config::FromJson(::eagle3::testing::WithoutQuantization(kK2), kK2);
    ASSERT_TRUE(base.ok()) << base.status();
    DeepseekV2Config c = *base;
    c.quantization = q;
    auto back = DeepseekV2Config::FromJson(DeepseekV2ConfigToHubJson(c), "written.json");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->quantization, q) << q.Describe();
  }
}

struct Refusal {
  std::string name;
  std::string json;
  absl::StatusCode code;
  std::vector<std::string> substrings;
};

std::vector<Refusal> Refusals() {
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  const absl::StatusCode kUnimplemented = absl::StatusCode::kUnimplemented;
  auto method = [](const std::string& m) {
    return EditedConfig(kV3, [&](Json& j) { j["quantization_config"] = {{"quant_method", m}}; });
  };
  std::vector<Refusal> cases;
  for (const char* m : {"awq", "gptq", "bitsandbytes", "modelopt", "mxfp4", "fbgemm_fp8"}) {
    cases.push_back({std::string("method_") + m,
                     method(m),
                     kUnimplemented,
                     {"bad.json", "key 'quantization_config.quant_method'", std::string("'") + m + "' is not supported",
                      "'fp8'", "'compressed-tensors'"}});
  }
  const std::vector<Refusal> more = {
      {"not_an_object",
       EditedConfig(kV3, [](Json& j) { j["quantization_config"] = "fp8"; }),
       kInvalid,
       {"key 'quantization_config'", "expected an object"}},
      {"no_method", V3([](Json& q) { q.erase("quant_method"); }), kInvalid, {"key 'quantization_config.quant_method'"}},
      {"fp8_fmt_e5m2",
       V3([](Json& q) { q["fmt"] = "e5m2"; }),
       kUnimplemented,
       {"key 'quantization_config.fmt'", "expected 'e4m3', got 'e5m2'"}},
      {"fp8_static_activations",
       V3([](Json& q) { q["activation_scheme"] = "static"; }),
       kUnimplemented,
       {"key 'quantization_config.activation_scheme'", "expected 'dynamic', got 'static'"}},
      {"fp8_per_tensor",
       V3([](Json& q) { q.erase("weight_block_size"); }),
       kUnimplemented,
       {"key 'quantization_config.weight_block_size'", "per-tensor FP8"}},
      {"fp8_block_one_dim",
       V3([](Json& q) { q["weight_block_size"] = {128}; }),
       kInvalid,
       {"key 'quantization_config.weight_block_size'", "expected [rows, columns], got 1 values"}},
      {"fp8_block_zero",
       V3([](Json& q) {
         q["weight_block_size"] = {128, 0};
       }),
       kInvalid,
       {"key 'quantization_config.weight_block_size[1]'"}},
      {"fp8_scale_fmt",
       V3([](Json& q) { q["scale_fmt"] = "e8m0fnu"; }),
       kUnimplemented,
       {"key 'quantization_config.scale_fmt'", "expected 'ue8m0' or null, got 'e8m0fnu'"}},
      {"fp8_unknown_key",
       V3([](Json& q) { q["modules_to_not_convert"] = {"lm_head"}; }),
       kInvalid,
       {"key 'quantization_config.modules_to_not_convert'", "unknown key"}},
      {"ct_format_nvfp4",
       K2Thinking([](Json& q) { q["format"] = "nvfp4-pack-quantized"; }),
       kUnimplemented,
       {"key 'quantization_config.format'", "expected 'pack-quantized'", "got 'nvfp4-pack-quantized'"}},
      {"ct_status_frozen",
       K2Thinking([](Json& q) { q["quantization_status"] = "frozen"; }),
       kUnimplemented,
       {"key 'quantization_config.quantization_status'", "expected 'compressed', got 'frozen'"}},
      {"ct_kv_cache_scheme",
       K2Thinking([](Json& q) {
         q["kv_cache_scheme"] = {{"num_bits", 8}};
       }),
       kUnimplemented,
       {"key 'quantization_config.kv_cache_scheme'", "must be null"}},
      {"ct_two_groups",
       K2Thinking([](Json& q) { q["config_groups"]["group_1"] = q["config_groups"]["group_0"]; }),
       kUnimplemented,
       {"key 'quantization_config.config_groups'", "expected one group, got 2"}},
      {"ct_targets",
       K2Thinking([](Json& q) { q["config_groups"]["group_0"]["targets"] = {"re:.*experts.*"}; }),
       kUnimplemented,
       {"key 'quantization_config.config_groups.group_0.targets'", "expected [\"Linear\"]"}},
      {"ct_w4a8",
       K2Thinking([](Json& q) {
         q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}, {"type", "float"}};
       }),
       kUnimplemented,
       {"key 'quantization_config.config_groups.group_0.input_activations'", "weight-only"}},
      {"ct_8_bits",
       K2Thinking([](Json& q) { q["config_groups"]["group_0"]["weights"]["num_bits"] = 8; }),
       kUnimplemented,
       {"key 'quantization_config.config_groups.group_0.weights.num_bits'", "expected 4, got 8"}},
      {"ct_float4",
       K2Thinking([](Json& q) { q["config_groups"]["group_0"]["weights"]["type"] = "float"; }),
       kUnimplemented,
       {"weights.type'", "expected 'int', got 'float'"}},
      {"ct_asymmetric",
       K2Thinking([](Json& q) { q["config_groups"]["group_0"]["weights"]["symmetric"] = false; }),
       kUnimplemented,
       {"weights.symmetric'", "weight_zero_point"}},
      {"ct_channel",
       K2Thinking([](Json& q) { q["config_groups"]["group_0"]["weights"]["strategy"] = "channel"; }),
       kUnimplemented,
       {"weights.strategy'", "expected 'group', got 'channel'"}},
      {"ct_group_size_zero",
       K2Thinking([](Json& q) { q["config_groups"]["group_0"]["weights"]["group_size"] = 0; }),
       kInvalid,
       {"weights.group_size'"}},
      {"ct_actorder",
       K2Thinking([](Json& q) { q["config_groups"]["group_0"]["weights"]["actorder"] = "group"; }),
       kUnimplemented,
       {"weights.actorder'", "weight_g_idx"}},
      {"ct_unknown_weights_key",
       K2Thinking([](Json& q) { q["config_groups"]["group_0"]["weights"]["bits"] = 4; }),
       kInvalid,
       {"weights.bits'", "unknown key"}},
      {"ct_bad_regex",
       K2Thinking([](Json& q) { q["ignore"].push_back("re:.*(experts"); }),
       kInvalid,
       {"key 'quantization_config.ignore[4]'", "'re:.*(experts' is not a valid regex"}},
  };
  cases.insert(cases.end(), more.begin(), more.end());
  return cases;
}

void PrintTo(const Refusal& c, std::ostream* os) { *os << c.name; }

class QuantizationConfigRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(QuantizationConfigRefusalTest, IsRefusedNamingTheKey) {
  const Refusal& c = GetParam();
  auto config = DeepseekV2Config::FromJson(c.json, "bad.json");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), c.code) << config.status();
  for (const std::string& s : c.substrings) EXPECT_THAT(config.status().message(), HasSubstr(s));
}

INSTANTIATE_TEST_SUITE_P(Cases, QuantizationConfigRefusalTest, ::testing::ValuesIn(Refusals()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace eagle3
