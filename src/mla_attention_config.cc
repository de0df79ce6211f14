#include "eagle3/mla_attention_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "json_fields.h"

namespace eagle3 {
namespace {

using json_fields::Sv;

constexpr int kMaxTpSize = 64;

}  // namespace

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
