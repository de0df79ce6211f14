#include "eagle3/mla_attention_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "json_fields.h"
#include "mla_attention_config_json.h"

namespace eagle3 {
namespace {

using json_fields::Object;
using json_fields::Sv;

constexpr int kMaxTpSize = 64;
constexpr int64_t kMaxDim = int64_t{1} << 24;

}  // namespace

absl::Status ParseMlaKeys(const Object& root, MlaAttentionConfig& mla) {
  if (!root.Contains("q_lora_rank")) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(root.source()), ": missing required key 'q_lora_rank' (null for a plain q_proj)"));
  }
  EAGLE3_ASSIGN_OR_RETURN(mla.q_lora_rank, root.OptionalInt("q_lora_rank", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(mla.kv_lora_rank, root.Int("kv_lora_rank", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(mla.qk_nope_head_dim, root.Int("qk_nope_head_dim", 1, kMaxDim));
  EAGLE3_ASSIGN_OR_RETURN(mla.qk_rope_head_dim, root.Int("qk_rope_head_dim", 1, kMaxDim));
  // Rotation works on pairs of dims.
  if (mla.qk_rope_head_dim % 2 != 0) {
    return root.Error(absl::StatusCode::kInvalidArgument, "qk_rope_head_dim",
                      absl::StrCat(mla.qk_rope_head_dim, " must be even"));
  }
  EAGLE3_ASSIGN_OR_RETURN(mla.v_head_dim, root.Int("v_head_dim", 1, kMaxDim));
  return absl::OkStatus();
}

absl::Status CheckMlaCopiedKeys(const Object& root, const MlaAttentionConfig& mla) {
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, root.OptionalInt("head_dim", 1, kMaxDim));
  if (head_dim.has_value() && *head_dim != mla.qk_rope_head_dim) {
    return root.Error(absl::StatusCode::kInvalidArgument, "head_dim",
                      absl::StrCat(*head_dim, " differs from qk_rope_head_dim = ", mla.qk_rope_head_dim,
                                   " (transformers sets head_dim = qk_rope_head_dim)"));
  }
  EAGLE3_ASSIGN_OR_RETURN(std::optional<int64_t> qk_head_dim,
                          root.OptionalInt("qk_head_dim", 1, 2 * kMaxDim));
  if (qk_head_dim.has_value() && *qk_head_dim != mla.qk_head_dim()) {
    return root.Error(
        absl::StatusCode::kInvalidArgument, "qk_head_dim",
        absl::StrCat(*qk_head_dim, " differs from qk_nope_head_dim + qk_rope_head_dim = ", mla.qk_head_dim()));
  }
  return absl::OkStatus();
}

MlaAttentionConfig MlaAttentionConfig::ForTarget(const DeepseekV2Config& target) {
  MlaAttentionConfig a;
  a.input_width = target.hidden_size;
  a.output_width = target.hidden_size;
  a.num_heads = target.num_attention_heads;
  a.q_lora_rank = target.q_lora_rank;
  a.kv_lora_rank = target.kv_lora_rank;
  a.qk_nope_head_dim = target.qk_nope_head_dim;
  a.qk_rope_head_dim = target.qk_rope_head_dim;
  a.v_head_dim = target.v_head_dim;
  a.rms_norm_eps = target.rms_norm_eps;
  a.rope = target.rope;
  return a;
}

double MlaAttentionConfig::SoftmaxScale() const { return MlaSoftmaxScale(qk_head_dim(), rope); }

absl::Status MlaAttentionConfig::ValidateSoftmaxScale(std::string_view source) const {
  const double scale = SoftmaxScale();
  if (std::isfinite(scale) && scale > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      Sv(source), ": rope scaling factor ", rope.scaling.factor, " with mscale_all_dim ",
      rope.scaling.mscale_all_dim, " gives a non-finite attention softmax scale"));
}

absl::Status MlaAttentionConfig::ValidateForTp(int tp_size, std::string_view source) const {
  if (tp_size < 1 || tp_size > kMaxTpSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source), ": tp_size ", tp_size, " is out of range [1, ", kMaxTpSize, "]"));
  }
  if (num_heads % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(source),
                                                   ": num_attention_heads = ", num_heads,
                                                   " is not divisible by tp_size ", tp_size));
  }
  return absl::OkStatus();
}

double MlaSoftmaxScale(int64_t qk_head_dim, const RopeConfig& rope) {
  double m = 1.0;
  if (rope.scaling.type == RopeScaling::Type::kYarn) {
    m = YarnGetMscale(rope.scaling.factor, rope.scaling.mscale_all_dim);
  }
  return m * m / std::sqrt(static_cast<double>(qk_head_dim));
}

}  // namespace eagle3
