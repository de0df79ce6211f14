#include "eagle3_head_json.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "eagle3/status.h"

namespace eagle3::eagle3_head {
namespace {

using json_fields::Object;
using json_fields::Sv;

// Aux ids are range-checked against the target later; this bound only keeps them in int range and
// lets a negative id through to the check that explains the convention.
constexpr int64_t kMaxId = int64_t{1} << 24;

}  // namespace

absl::StatusOr<std::string> SingleArchitecture(const Object& root) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::vector<std::string>> names,
                          root.OptionalStringArray("architectures"));
  if (!names.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(root.source()), ": missing required key 'architectures'"));
  }
  if (names->size() != 1) {
    return root.Error(absl::StatusCode::kInvalidArgument, "architectures",
                      absl::StrCat("expected exactly one architecture, got ", names->size()));
  }
  return names->front();
}

absl::StatusOr<bool> VariantFlag(const Object& root, const std::optional<Object>& eagle,
                                 std::string_view key) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> top, root.OptionalBool(key));
  std::optional<bool> nested;
  if (eagle.has_value()) {
    EAGLE3_ASSIGN_OR_RETURN(nested, eagle->OptionalBool(key));
  }
  if (top.has_value() && nested.has_value() && *top != *nested) {
    return root.Error(absl::StatusCode::kInvalidArgument, key,
                      absl::StrCat(*top ? "true" : "false", " disagrees with ", eagle->Path(key),
                                   " = ", *nested ? "true" : "false"));
  }
  return top.value_or(nested.value_or(false));
}

absl::StatusOr<std::optional<std::vector<int>>> ParseAuxLayerIds(
    const Object& root, const std::optional<Object>& eagle) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> top,
                          root.OptionalIntArray(kAuxIdsKey, -kMaxId, kMaxId));
  std::optional<std::vector<int64_t>> nested;
  if (eagle.has_value()) {
    EAGLE3_ASSIGN_OR_RETURN(nested, eagle->OptionalIntArray(kAuxIdsKey, -kMaxId, kMaxId));
  }
  if (top.has_value() && nested.has_value() && *top != *nested) {
    return root.Error(
        absl::StatusCode::kInvalidArgument, kAuxIdsKey,
        absl::StrCat("[", absl::StrJoin(*top, ", "), "] disagrees with ", eagle->Path(kAuxIdsKey),
                     " = [", absl::StrJoin(*nested, ", "), "]"));
  }
  const std::optional<std::vector<int64_t>>& ids = top.has_value() ? top : nested;
  if (!ids.has_value()) return std::optional<std::vector<int>>();
  if (ids->empty()) {
    const Object& where = top.has_value() ? root : *eagle;
    return where.Error(absl::StatusCode::kInvalidArgument, kAuxIdsKey,
                       "is empty; fc needs at least one captured target layer");
  }
  return std::optional<std::vector<int>>(std::vector<int>(ids->begin(), ids->end()));
}

absl::Status CheckEagleConfig(const std::optional<Object>& eagle,
                              std::initializer_list<std::span<const std::string_view>> known) {
  if (!eagle.has_value()) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(eagle->CheckKnownKeys(known));
  EAGLE3_ASSIGN_OR_RETURN(std::optional<bool> use_aux, eagle->OptionalBool("use_aux_hidden_state"));
  if (!use_aux.value_or(true)) {
    return eagle->Error(absl::StatusCode::kUnimplemented, "use_aux_hidden_state",
                        "false is not supported: an EAGLE-3 head reads captured target states");
  }
  return absl::OkStatus();
}

absl::Status CheckHeadAgainstTarget(std::string_view draft_source, int64_t target_hidden_size,
                                    int64_t vocab_size,
                                    const std::optional<std::vector<int>>& aux_layer_ids,
                                    const DeepseekV2Config& target) {
  if (target_hidden_size != target.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft target_hidden_size = ", target_hidden_size, " (", Sv(draft_source),
        ") does not match target hidden_size = ", target.hidden_size, " (", target.source, ")"));
  }
  if (vocab_size != target.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft vocab_size = ", vocab_size, " (", Sv(draft_source),
        ") does not match target vocab_size = ", target.vocab_size, " (", target.source, ")"));
  }
  if (!aux_layer_ids.has_value()) return absl::OkStatus();
  const int64_t layers = target.num_hidden_layers;
  const std::vector<int>& ids = *aux_layer_ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= 0 && ids[i] < layers) continue;
    const std::string what =
        absl::StrCat(Sv(draft_source), ": ", Sv(kAuxIdsKey), "[", i, "] = ", ids[i]);
    const std::string convention = absl::StrCat(
        "ids use the output-of-layer convention: id k is the output of target layer k "
        "(boundary k+1), valid ids are 0..",
        layers - 1, " for the ", layers, "-layer target (", target.source, ")");
    if (ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " is negative; ", convention,
                       ". There is no -1 = embedding: the embedding output is boundary 0, which no "
                       "output-of-layer id names"));
    }
    return absl::InvalidArgumentError(absl::StrCat(what, " is out of range; ", convention));
  }
  return absl::OkStatus();
}

}  // namespace eagle3::eagle3_head
