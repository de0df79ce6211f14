// The two published forms of quantization_config. Sources of every key:
//  - FP8: deepseek-ai/DeepSeek-V3 config.json (tests/data/configs/deepseek-ai_DeepSeek-V3.json, the
//    hub file) and moonshotai/Kimi-K2-Instruct; `scale_fmt` from DeepSeek-V3.1 / V3.2 configs;
//    semantics from deepseek-ai/DeepSeek-V3 inference/model.py and kernel.py (weight_dequant).
//  - compressed-tensors: the pydantic models of neuralmagic/compressed-tensors
//    (src/compressed_tensors/quantization/quant_config.py, quant_scheme.py, quant_args.py) for the
//    key set, and the config Moonshot ships with Kimi-K2-Thinking (one group "group_0" targeting
//    Linear: num_bits 4, type int, symmetric, strategy group, group_size 32, dynamic false,
//    actorder / block_structure null, observer "minmax"; format "pack-quantized";
//    quantization_status "compressed"; kv_cache_scheme null; ignore ["lm_head",
//    "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]).
#include "eagle3/quantization_config.h"

#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "eagle3/status.h"
#include "json_fields.h"
#include "quantization_config_json.h"

namespace eagle3 {
namespace {

using json_fields::Object;
using json_fields::Sv;

constexpr std::string_view kKey = "quantization_config";
// A block or group wider than any weight dimension eagle3 accepts means a malformed config.
constexpr int64_t kMaxBlock = int64_t{1} << 24;

constexpr std::string_view kFp8Keys[] = {"quant_method", "fmt", "activation_scheme",
                                         "weight_block_size", "scale_fmt"};
constexpr std::string_view kCompressedTensorsKeys[] = {
    "quant_method",    "format",           "config_groups",
    "ignore",          "kv_cache_scheme",  "quantization_status",
    "sparsity_config", "transform_config", "global_compression_ratio",
    "version"};
constexpr std::string_view kSchemeKeys[] = {"targets", "weights", "input_activations",
                                            "output_activations", "format"};
constexpr std::string_view kWeightArgsKeys[] = {
    "num_bits", "type",     "symmetric", "group_size",      "strategy",    "block_structure",
    "dynamic",  "actorder", "observer",  "observer_kwargs", "scale_dtype", "zp_dtype"};

absl::Status Unimplemented(const Object& o, std::string_view key, std::string_view message) {
  return o.Error(absl::StatusCode::kUnimplemented, key, message);
}

// `key` must be absent or null: set, it would change what the stored tensors mean.
absl::Status RequireUnset(const Object& o, std::string_view key, std::string_view why) {
  if (!o.HasValue(key)) return absl::OkStatus();
  return Unimplemented(o, key, absl::StrCat("must be null or absent: ", Sv(why)));
}

// A string key that must equal `expected` (`required`: it may not be absent either).
absl::Status ExpectString(const Object& o, std::string_view key, std::string_view expected,
                          bool required, std::string_view what) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> value, o.OptionalString(key));
  if (!value.has_value()) {
    if (!required) return absl::OkStatus();
    return o.Error(absl::StatusCode::kInvalidArgument, key,
                   absl::StrCat("missing; expected '", Sv(expected), "'"));
  }
  if (*value == expected) return absl::OkStatus();
  return Unimplemented(
      o, key, absl::StrCat("expected '", Sv(expected), "', got '", *value, "' (", Sv(what), ")"));
}

absl::StatusOr<QuantizationConfig> ParseFp8(const Object& q) {
  EAGLE3_RETURN_IF_ERROR(q.CheckKnownKeys({kFp8Keys}));
  QuantizationConfig c;
  c.format = WeightFormat::kFp8Block;
  EAGLE3_RETURN_IF_ERROR(ExpectString(q, "fmt", "e4m3", /*required=*/true,
                                      "eagle3 reads OCP e4m3fn weights, DeepSeek's format"));
  EAGLE3_ASSIGN_OR_RETURN(c.activation_scheme, q.String("activation_scheme"));
  if (c.activation_scheme != "dynamic") {
    return Unimplemented(q, "activation_scheme",
                         absl::StrCat("expected 'dynamic', got '", c.activation_scheme,
                                      "' (static activation scales need input_scale tensors)"));
  }
  if (!q.HasValue("weight_block_size")) {
    return Unimplemented(q, "weight_block_size",
                         "missing: per-tensor FP8 is not implemented; eagle3 reads block-scaled "
                         "FP8 (weight_block_size [128, 128] in DeepSeek-V3)");
  }
  EAGLE3_ASSIGN_OR_RETURN(std::vector<int64_t> block,
                          q.IntArray("weight_block_size", 1, kMaxBlock));
  if (block.size() != 2) {
    return q.Error(absl::StatusCode::kInvalidArgument, "weight_block_size",
                   absl::StrCat("expected [rows, columns], got ", block.size(), " values"));
  }
  c.block_out = block[0];
  c.block_in = block[1];
  EAGLE3_ASSIGN_OR_RETURN(c.scale_fmt, q.OptionalString("scale_fmt"));
  if (c.scale_fmt.has_value() && *c.scale_fmt != "ue8m0") {
    return Unimplemented(q, "scale_fmt",
                         absl::StrCat("expected 'ue8m0' or null, got '", *c.scale_fmt, "'"));
  }
  return c;
}

// The `weights` QuantizationArgs of the one config group.
absl::Status ParseWeightArgs(const Object& w, QuantizationConfig& c) {
  EAGLE3_RETURN_IF_ERROR(w.CheckKnownKeys({kWeightArgsKeys}));
  EAGLE3_ASSIGN_OR_RETURN(int64_t bits, w.Int("num_bits", 1, 64));
  if (bits != 4) {
    return Unimplemented(w, "num_bits", absl::StrCat("expected 4, got ", bits));
  }
  EAGLE3_RETURN_IF_ERROR(ExpectString(w, "type", "int", /*required=*/true,
                                      "eagle3 reads integer weights; float4 is another format"));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> symmetric, w.OptionalBool("symmetric"));
  if (!symmetric.value_or(true)) {
    return Unimplemented(w, "symmetric",
                         "expected true, got false (asymmetric weights need weight_zero_point)");
  }
  EAGLE3_RETURN_IF_ERROR(ExpectString(w, "strategy", "group", /*required=*/true,
                                      "eagle3 reads one scale per group of input columns"));
  EAGLE3_ASSIGN_OR_RETURN(c.group_size, w.Int("group_size", 1, kMaxBlock));
  EAGLE3_RETURN_IF_ERROR(RequireUnset(w, "block_structure", "only the group strategy is read"));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> dynamic, w.OptionalBool("dynamic"));
  if (dynamic.value_or(false)) {
    return Unimplemented(w, "dynamic", "expected false: stored weights have static scales");
  }
  EAGLE3_RETURN_IF_ERROR(
      RequireUnset(w, "actorder", "activation ordering permutes the groups through weight_g_idx"));
  EAGLE3_RETURN_IF_ERROR(RequireUnset(w, "zp_dtype", "symmetric weights have no zero point"));
  // Harmless: how the scales were computed, and a dtype hint the scale tensor itself states.
  EAGLE3_RETURN_IF_ERROR(w.OptionalString("observer").status());
  EAGLE3_RETURN_IF_ERROR(w.OptionalSubObject("observer_kwargs").status());
  return w.OptionalString("scale_dtype").status();
}

absl::StatusOr<QuantizationConfig> ParseCompressedTensors(const Object& q) {
  EAGLE3_RETURN_IF_ERROR(q.CheckKnownKeys({kCompressedTensorsKeys}));
  QuantizationConfig c;
  c.format = WeightFormat::kInt4Group;
  EAGLE3_ASSIGN_OR_RETURN(std::string format, q.String("format"));
  if (format != "pack-quantized") {
    return Unimplemented(
        q, "format",
        absl::StrCat("expected 'pack-quantized' (int4 packed into int32), got '", format, "'"));
  }
  EAGLE3_RETURN_IF_ERROR(ExpectString(q, "quantization_status", "compressed", /*required=*/false,
                                      "only compressed (packed) checkpoints store int4 weights"));
  EAGLE3_RETURN_IF_ERROR(RequireUnset(q, "kv_cache_scheme", "eagle3's KV cache is unquantized"));
  EAGLE3_RETURN_IF_ERROR(RequireUnset(q, "transform_config", "weight transforms are not read"));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<Object> sparsity, q.OptionalSubObject("sparsity_config"));
  if (sparsity.has_value() && !sparsity->Keys().empty()) {
    return Unimplemented(q, "sparsity_config",
                         "must be null or empty: sparse weights are not read");
  }
  EAGLE3_RETURN_IF_ERROR(q.OptionalDouble("global_compression_ratio").status());
  EAGLE3_RETURN_IF_ERROR(q.OptionalString("version").status());

  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::vector<std::string>> ignore,
                          q.OptionalStringArray("ignore"));
  c.ignore = ignore.value_or(std::vector<std::string>());
  for (size_t i = 0; i < c.ignore.size(); ++i) {
    const std::string& entry = c.ignore[i];
    if (entry.rfind("re:", 0) != 0) continue;
    try {
      std::regex(entry.substr(3), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return q.Error(absl::StatusCode::kInvalidArgument, absl::StrCat("ignore[", i, "]"),
                     absl::StrCat("'", entry, "' is not a valid regex: ", e.what()));
    }
  }

  EAGLE3_ASSIGN_OR_RETURN(Object groups, q.SubObject("config_groups"));
  const std::vector<std::string> names = groups.Keys();
  if (names.size() != 1) {
    return Unimplemented(
        q, "config_groups",
        absl::StrCat("expected one group, got ", names.size(), " (", absl::StrJoin(names, ", "),
                     "); eagle3 reads one scheme for every quantized Linear"));
  }
  EAGLE3_ASSIGN_OR_RETURN(Object group, groups.SubObject(names[0]));
  EAGLE3_RETURN_IF_ERROR(group.CheckKnownKeys({kSchemeKeys}));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::vector<std::string>> targets,
                          group.OptionalStringArray("targets"));
  if (!targets.has_value() || *targets != std::vector<std::string>{"Linear"}) {
    return Unimplemented(
        group, "targets",
        absl::StrCat("expected [\"Linear\"], got [",
                     targets.has_value() ? absl::StrJoin(*targets, ", ") : "", "]"));
  }
  EAGLE3_RETURN_IF_ERROR(ExpectString(group, "format", "pack-quantized", /*required=*/false,
                                      "a group's format overrides the checkpoint's"));
  EAGLE3_RETURN_IF_ERROR(
      RequireUnset(group, "input_activations",
                   "eagle3 runs weight-only quantization (activations unquantized)"));
  EAGLE3_RETURN_IF_ERROR(RequireUnset(
      group, "output_activations", "eagle3 runs weight-only quantization (outputs unquantized)"));
  EAGLE3_ASSIGN_OR_RETURN(Object weights, group.SubObject("weights"));
  EAGLE3_RETURN_IF_ERROR(ParseWeightArgs(weights, c));
  return c;
}

}  // namespace

std::string_view WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kUnquantized:
      return "unquantized";
    case WeightFormat::kFp8Block:
      return "fp8-block";
    case WeightFormat::kInt4Group:
      return "int4-group";
  }
  return "unknown";
}

std::string QuantizationConfig::Describe() const {
  switch (format) {
    case WeightFormat::kUnquantized:
      return "unquantized";
    case WeightFormat::kFp8Block:
      return absl::StrCat("fp8-block e4m3, ", block_out, "x", block_in, " blocks");
    case WeightFormat::kInt4Group:
      return absl::StrCat("int4-group symmetric, group ", group_size,
                          " (compressed-tensors pack-quantized), ", ignore.size(), " ignore entr",
                          ignore.size() == 1 ? "y" : "ies");
  }
  return "unknown";
}

absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const Object& config) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<Object> q, config.OptionalSubObject(kKey));
  if (!q.has_value()) return QuantizationConfig{};
  EAGLE3_ASSIGN_OR_RETURN(std::string method, q->String("quant_method"));
  if (method == "fp8") return ParseFp8(*q);
  if (method == "compressed-tensors") return ParseCompressedTensors(*q);
  return Unimplemented(
      *q, "quant_method",
      absl::StrCat("'", method,
                   "' is not supported; eagle3 reads 'fp8' (block-scaled e4m3, DeepSeek-V3 / "
                   "Kimi-K2-Instruct) and 'compressed-tensors' (pack-quantized int4, "
                   "Kimi-K2-Thinking / K2.5)"));
}

}  // namespace eagle3
