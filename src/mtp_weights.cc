#include "eagle3/mtp_weights.h"

#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "drafter_weight_checks.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

std::string FileOf(const Checkpoint& checkpoint, const std::string& name) {
  const absl::StatusOr<std::string> file = checkpoint.FileOf(name);
  return file.ok() ? *file : std::string("?");
}

// The tensors `checkpoint` holds under `prefix`, in name order.
std::vector<std::string> TensorsUnder(const Checkpoint& checkpoint, std::string_view prefix) {
  std::vector<std::string> names;
  for (std::string& name : checkpoint.TensorNames()) {
    if (name.starts_with(prefix)) names.push_back(std::move(name));
  }
  return names;
}

absl::Status CheckModule(const Checkpoint& checkpoint, const DeepseekV2Config& target, const MtpConfig& mtp,
                         int64_t module) {
  const std::string prefix = mtp.LayerPrefix(module);
  const int64_t layer = mtp.LayerIndex(module);
  const std::vector<WeightSpec> specs = MtpModuleWeights(target, mtp, module);
  const std::vector<StoredForm> forms = StoredForms(target, specs);
  const std::vector<std::string> present = TensorsUnder(checkpoint, prefix);
  if (present.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "checkpoint '", checkpoint.dir(), "' has no MTP module ", module, ": no tensor of its layer ", layer,
        " ('", prefix, "*'), starting with '", specs.front().name, "' (expected shape ",
        specs.front().shape.ToString(), "), although ", target.source, " says num_nextn_predict_layers = ",
        target.num_nextn_predict_layers, ". Conversions that drop the MTP layer cannot draft with it; use the "
        "original checkpoint or an EAGLE-3 draft"));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const absl::Status status = CheckDrafterWeight(checkpoint, specs[i], forms[i], target.quantization);
    if (status.ok()) continue;
    return absl::Status(status.code(), absl::StrCat("MTP module ", module, " (layer ", layer, ") is incomplete: ",
                                                    status.message()));
  }
  std::unordered_set<std::string> known;
  for (size_t i = 0; i < specs.size(); ++i) {
    for (std::string& name : StoredTensorNames(specs[i], forms[i])) known.insert(std::move(name));
  }
  for (const WeightSpec& copy : MtpSharedCopyWeights(target, mtp, module)) {
    known.insert(copy.name);
    if (!checkpoint.Has(copy.name)) continue;
    EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape(copy.name, copy.shape));
    EAGLE3_RETURN_IF_ERROR(CheckTensorDtype(checkpoint, copy.name, {DType::kF32, DType::kF16, DType::kBF16},
                                            "F32, F16 or BF16", "a copy of the target's embedding or head"));
  }
  for (const std::string& name : present) {
    if (known.count(name) != 0) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", checkpoint.dir(), "': tensor '", name, "' in '", FileOf(checkpoint, name),
        "' is in MTP module ", module, "'s layer ", layer, " but not part of the module that ", target.source,
        " describes (quantization_config: ", target.quantization.Describe(),
        "); refusing to run the module without it"));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<WeightSpec> MtpModuleWeights(const DeepseekV2Config& target, const MtpConfig& mtp, int64_t module) {
  const int64_t h = target.hidden_size;
  const std::string p = mtp.LayerPrefix(module);
  std::vector<WeightSpec> specs = {
      WeightSpec{p + "enorm.weight", Shape{h}, TpSplit::kReplicated},
      WeightSpec{p + "hnorm.weight", Shape{h}, TpSplit::kReplicated},
      WeightSpec{p + "eh_proj.weight", Shape{h, 2 * h}, TpSplit::kColumns},
  };
  for (WeightSpec& spec : DeepseekDecoderLayerWeights(target, mtp.LayerIndex(module))) {
    specs.push_back(std::move(spec));
  }
  specs.push_back(WeightSpec{p + "shared_head.norm.weight", Shape{h}, TpSplit::kReplicated});
  return specs;
}

std::vector<WeightSpec> MtpWeights(const DeepseekV2Config& target, const MtpConfig& mtp) {
  std::vector<WeightSpec> specs;
  for (int64_t k = 0; k < mtp.num_modules; ++k) {
    for (WeightSpec& spec : MtpModuleWeights(target, mtp, k)) specs.push_back(std::move(spec));
  }
  return specs;
}

std::vector<WeightSpec> MtpSharedCopyWeights(const DeepseekV2Config& target, const MtpConfig& mtp,
                                             int64_t module) {
  const std::string p = mtp.LayerPrefix(module);
  const Shape table{target.vocab_size, target.hidden_size};
  return {WeightSpec{p + "embed_tokens.weight", table, TpSplit::kRows, /*vocab_padded=*/true},
          WeightSpec{p + "shared_head.head.weight", table, TpSplit::kRows, /*vocab_padded=*/true}};
}

absl::Status CheckMtpWeights(const Checkpoint& checkpoint, const DeepseekV2Config& target, const MtpConfig& mtp) {
  for (int64_t k = 0; k < mtp.num_modules; ++k) EAGLE3_RETURN_IF_ERROR(CheckModule(checkpoint, target, mtp, k));
  return absl::OkStatus();
}

}  // namespace eagle3
