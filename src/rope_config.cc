#include "eagle3/rope_config.h"

#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "rope_config_json.h"

namespace eagle3 {
namespace {

using json_fields::IsOneOf;
using json_fields::Object;
using json_fields::Sv;
using Type = RopeScaling::Type;

constexpr int64_t kMaxPositions = int64_t{1} << 40;

// Every key a scaling block may hold; which ones apply depends on the type.
constexpr std::string_view kScalingKeys[] = {
    "type",
    "rope_type",
    "rope_theta",
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
    "low_freq_factor",
    "high_freq_factor",
};
constexpr std::string_view kLinearKeys[] = {"factor"};
constexpr std::string_view kYarnKeys[] = {"factor",          "original_max_position_embeddings",
                                          "beta_fast",       "beta_slow",
                                          "mscale",          "mscale_all_dim",
                                          "attention_factor"};
constexpr std::string_view kLlama3Keys[] = {"factor", "original_max_position_embeddings",
                                            "low_freq_factor", "high_freq_factor"};
// Types transformers knows but eagle3 does not implement.
constexpr std::string_view kUnimplementedTypes[] = {"dynamic", "longrope", "su", "mrope"};

// One scaling block (`rope_scaling` or `rope_parameters`) and the theta it states, if any.
struct ParsedBlock {
  RopeScaling scaling;
  std::optional<double> theta;
};

std::span<const std::string_view> KeysOf(Type type) {
  switch (type) {
    case Type::kNone:
      return {};
    case Type::kLinear:
      return kLinearKeys;
    case Type::kYarn:
      return kYarnKeys;
    case Type::kLlama3:
      return kLlama3Keys;
  }
  return {};
}

absl::StatusOr<double> PositiveDouble(const Object& block, std::string_view key) {
  EAGLE3_ASSIGN_OR_RETURN(double v, block.Double(key));
  if (!(v > 0)) {
    return block.Error(absl::StatusCode::kInvalidArgument, key, absl::StrCat(v, " must be > 0"));
  }
  return v;
}

absl::StatusOr<double> NonNegativeDoubleOr(const Object& block, std::string_view key,
                                           double default_value) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<double> v, block.OptionalDouble(key));
  if (v.has_value() && *v < 0) {
    return block.Error(absl::StatusCode::kInvalidArgument, key, absl::StrCat(*v, " must be >= 0"));
  }
  return v.value_or(default_value);
}

absl::StatusOr<Type> ResolveType(const Object& block, bool type_required) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> rope_type, block.OptionalString("rope_type"));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::string> legacy, block.OptionalString("type"));
  if (rope_type.has_value() && legacy.has_value() && *rope_type != *legacy) {
    return block.Error(absl::StatusCode::kInvalidArgument, "type",
                       absl::StrCat("'", *legacy, "' disagrees with ", block.Path("rope_type"),
                                    " '", *rope_type, "'"));
  }
  const std::string_view key = rope_type.has_value() ? "rope_type" : "type";
  const std::optional<std::string>& name = rope_type.has_value() ? rope_type : legacy;
  if (!name.has_value()) {
    // transformers-5 standardizes a missing type to "default"; the hub form has always named it.
    if (!type_required) return Type::kNone;
    return absl::InvalidArgumentError(absl::StrCat(Sv(block.source()), ": missing required key '",
                                                   block.Path("type"), "' (or '",
                                                   block.Path("rope_type"), "')"));
  }
  if (*name == "default") return Type::kNone;
  if (*name == "linear") return Type::kLinear;
  if (*name == "yarn") return Type::kYarn;
  if (*name == "llama3") return Type::kLlama3;
  if (IsOneOf(*name, kUnimplementedTypes)) {
    return block.Error(absl::StatusCode::kUnimplemented, key,
                       absl::StrCat("rope type '", *name,
                                    "' is not implemented (eagle3 supports default, linear, yarn, "
                                    "llama3)"));
  }
  return block.Error(
      absl::StatusCode::kInvalidArgument, key,
      absl::StrCat("unknown rope type '", *name, "' (expected default, linear, yarn or llama3)"));
}

absl::StatusOr<int64_t> OriginalMaxPositions(const Object& block, Type type) {
  if (!block.HasValue("original_max_position_embeddings")) {
    const std::string_view why =
        type == Type::kYarn
            ? ". transformers would fall back to max_position_embeddings and DeepSeek's reference "
              "code to 4096; with no agreed default eagle3 requires the key"
            : " (transformers requires it too)";
    return absl::InvalidArgumentError(absl::StrCat(Sv(block.source()), ": missing required key '",
                                                   block.Path("original_max_position_embeddings"),
                                                   "' for rope type '",
                                                   Sv(RopeScalingTypeName(type)), "'", Sv(why)));
  }
  return block.Int("original_max_position_embeddings", 1, kMaxPositions);
}

absl::StatusOr<ParsedBlock> ParseBlock(const Object& block, bool type_required) {
  EAGLE3_RETURN_IF_ERROR(block.CheckKnownKeys({kScalingKeys}));
  ParsedBlock out;
  RopeScaling& s = out.scaling;
  EAGLE3_ASSIGN_OR_RETURN(s.type, ResolveType(block, type_required));
  for (std::string_view key : kScalingKeys) {
    if (key == "type" || key == "rope_type" || key == "rope_theta") continue;
    if (block.Contains(key) && !IsOneOf(key, KeysOf(s.type))) {
      return block.Error(
          absl::StatusCode::kInvalidArgument, key,
          absl::StrCat("does not apply to rope type '", Sv(RopeScalingTypeName(s.type)),
                       "'; eagle3 refuses it rather than ignoring it"));
    }
  }
  if (block.HasValue("rope_theta")) {
    EAGLE3_ASSIGN_OR_RETURN(out.theta, PositiveDouble(block, "rope_theta"));
  }
  if (s.type == Type::kNone) return out;

  EAGLE3_ASSIGN_OR_RETURN(s.factor, PositiveDouble(block, "factor"));
  if (s.type == Type::kYarn) {
    EAGLE3_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                            OriginalMaxPositions(block, s.type));
    EAGLE3_ASSIGN_OR_RETURN(std::optional<double> beta_fast, block.OptionalDouble("beta_fast"));
    EAGLE3_ASSIGN_OR_RETURN(std::optional<double> beta_slow, block.OptionalDouble("beta_slow"));
    s.beta_fast = beta_fast.value_or(s.beta_fast);
    s.beta_slow = beta_slow.value_or(s.beta_slow);
    EAGLE3_ASSIGN_OR_RETURN(s.mscale, NonNegativeDoubleOr(block, "mscale", s.mscale));
    EAGLE3_ASSIGN_OR_RETURN(s.mscale_all_dim,
                            NonNegativeDoubleOr(block, "mscale_all_dim", s.mscale_all_dim));
    if (block.HasValue("attention_factor")) {
      EAGLE3_ASSIGN_OR_RETURN(s.attention_factor, PositiveDouble(block, "attention_factor"));
    }
  } else if (s.type == Type::kLlama3) {
    EAGLE3_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                            OriginalMaxPositions(block, s.type));
    EAGLE3_ASSIGN_OR_RETURN(s.low_freq_factor, PositiveDouble(block, "low_freq_factor"));
    EAGLE3_ASSIGN_OR_RETURN(s.high_freq_factor, PositiveDouble(block, "high_freq_factor"));
    // The llama3 ramp divides by (high - low).
    if (!(s.high_freq_factor > s.low_freq_factor)) {
      return block.Error(absl::StatusCode::kInvalidArgument, "high_freq_factor",
                         absl::StrCat(s.high_freq_factor, " must be > ",
                                      block.Path("low_freq_factor"), " = ", s.low_freq_factor));
    }
  }
  return out;
}

// "factor = 40 but rope_parameters.factor = 32" for the first field where the blocks differ.
std::string FirstDifference(const RopeScaling& a, std::string_view a_path, const RopeScaling& b,
                            std::string_view b_path) {
  if (a.type != b.type) {
    return absl::StrCat(Sv(a_path), " has rope type '", Sv(RopeScalingTypeName(a.type)), "' but ",
                        Sv(b_path), " has '", Sv(RopeScalingTypeName(b.type)), "'");
  }
  const auto number = [&](std::string_view field, double x, double y) -> std::string {
    if (x == y) return "";
    return absl::StrCat(Sv(a_path), ".", Sv(field), " = ", x, " but ", Sv(b_path), ".", Sv(field),
                        " = ", y);
  };
  const std::pair<std::string_view, std::pair<double, double>> fields[] = {
      {"factor", {a.factor, b.factor}},
      {"original_max_position_embeddings",
       {static_cast<double>(a.original_max_position_embeddings),
        static_cast<double>(b.original_max_position_embeddings)}},
      {"beta_fast", {a.beta_fast, b.beta_fast}},
      {"beta_slow", {a.beta_slow, b.beta_slow}},
      {"mscale", {a.mscale, b.mscale}},
      {"mscale_all_dim", {a.mscale_all_dim, b.mscale_all_dim}},
      {"low_freq_factor", {a.low_freq_factor, b.low_freq_factor}},
      {"high_freq_factor", {a.high_freq_factor, b.high_freq_factor}},
  };
  for (const auto& [field, values] : fields) {
    std::string diff = number(field, values.first, values.second);
    if (!diff.empty()) return diff;
  }
  if (a.attention_factor != b.attention_factor) {
    const auto show = [](const std::optional<double>& v) {
      return v.has_value() ? absl::StrCat(*v) : std::string("unset");
    };
    return absl::StrCat(Sv(a_path), ".attention_factor = ", show(a.attention_factor), " but ",
                        Sv(b_path), ".attention_factor = ", show(b.attention_factor));
  }
  return "";
}

}  // namespace

std::string_view RopeScalingTypeName(RopeScaling::Type type) {
  switch (type) {
    case Type::kNone:
      return "none";
    case Type::kLinear:
      return "linear";
    case Type::kYarn:
      return "yarn";
    case Type::kLlama3:
      return "llama3";
  }
  return "unknown";
}

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

absl::StatusOr<RopeConfig> ParseRopeConfig(const json_fields::Object& config,
                                           double default_theta) {
  std::optional<ParsedBlock> hub;
  std::optional<ParsedBlock> params;
  EAGLE3_ASSIGN_OR_RETURN(std::optional<Object> hub_block,
                          config.OptionalSubObject("rope_scaling"));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<Object> params_block,
                          config.OptionalSubObject("rope_parameters"));
  if (hub_block.has_value()) {
    EAGLE3_ASSIGN_OR_RETURN(hub, ParseBlock(*hub_block, /*type_required=*/true));
  }
  if (params_block.has_value()) {
    EAGLE3_ASSIGN_OR_RETURN(params, ParseBlock(*params_block, /*type_required=*/false));
  }

  // Every stated theta must agree; transformers-5 itself prefers the one inside rope_parameters.
  std::vector<std::pair<std::string, double>> thetas;
  if (config.HasValue("rope_theta")) {
    EAGLE3_ASSIGN_OR_RETURN(double theta, config.Double("rope_theta"));
    if (!(theta > 0)) {
      return config.Error(absl::StatusCode::kInvalidArgument, "rope_theta",
                          absl::StrCat(theta, " must be > 0"));
    }
    thetas.emplace_back(config.Path("rope_theta"), theta);
  }
  if (hub.has_value() && hub->theta.has_value()) {
    thetas.emplace_back(hub_block->Path("rope_theta"), *hub->theta);
  }
  if (params.has_value() && params->theta.has_value()) {
    thetas.emplace_back(params_block->Path("rope_theta"), *params->theta);
  }
  for (size_t i = 1; i < thetas.size(); ++i) {
    if (thetas[i].second != thetas[0].second) {
      return absl::InvalidArgumentError(
          absl::StrCat(Sv(config.source()), ": rope forms disagree: ", thetas[0].first, " = ",
                       thetas[0].second, " but ", thetas[i].first, " = ", thetas[i].second));
    }
  }

  RopeConfig rope;
  rope.theta = thetas.empty() ? default_theta : thetas[0].second;
  if (hub.has_value() && params.has_value() && hub->scaling != params->scaling) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(config.source()), ": rope forms disagree: ",
        FirstDifference(hub->scaling, hub_block->path(), params->scaling, params_block->path())));
  }
  if (hub.has_value()) {
    rope.scaling = hub->scaling;
  } else if (params.has_value()) {
    rope.scaling = params->scaling;
  }
  return rope;
}

}  // namespace eagle3
