#include "eagle3/mtp_config.h"

#include "absl/strings/str_cat.h"
#include "json_fields.h"

namespace eagle3 {

using json_fields::Sv;

absl::StatusOr<MtpConfig> MtpConfig::FromTarget(const DeepseekV2Config& target) {
  if (target.num_nextn_predict_layers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        target.source, ": key 'num_nextn_predict_layers' is ", target.num_nextn_predict_layers,
        " (absent counts as 0): this ", Sv(DeepseekModelTypeName(target.model_type)),
        " checkpoint carries no MTP module to draft with (DeepSeek-V3 / R1 carry one; "
        "Kimi-K2 / K2.5 and DeepSeek-V2 none)"));
  }
  // DeepSeek-V2 was trained without MTP; a module stated there has no defined meaning.
  if (target.model_type == DeepseekModelType::kDeepseekV2) {
    return absl::UnimplementedError(absl::StrCat(
        target.source, ": key 'num_nextn_predict_layers' = ", target.num_nextn_predict_layers,
        " on a deepseek_v2 model: MTP modules exist only in DeepSeek-V3-family checkpoints"));
  }
  MtpConfig c;
  c.num_modules = target.num_nextn_predict_layers;
  c.first_layer = target.num_hidden_layers;
  c.tensor_prefix = target.tensor_prefix;
  c.source = target.source;
  c.module_is_moe.reserve(static_cast<size_t>(c.num_modules));
  for (int64_t k = 0; k < c.num_modules; ++k) {
    c.module_is_moe.push_back(target.IsMoeLayer(c.LayerIndex(k)));
  }
  return c;
}

std::string MtpConfig::LayerPrefix(int64_t module) const {
  return absl::StrCat(tensor_prefix, "model.layers.", LayerIndex(module), ".");
}

}  // namespace eagle3
