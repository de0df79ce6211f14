#include "drafter_weight_checks.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::Status CheckTensorDtype(const Checkpoint& checkpoint, std::string_view name,
                              std::initializer_list<DType> accepted, std::string_view expected,
                              std::string_view why) {
  EAGLE3_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Info(name));
  for (DType dtype : accepted) {
    if (info.dtype == dtype) return absl::OkStatus();
  }
  const absl::StatusOr<std::string> file = checkpoint.FileOf(name);
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", Sv(name), "' in '", file.ok() ? *file : std::string("?"), "' is ",
      Sv(SafetensorsDTypeName(info.dtype)), "; expected ", Sv(expected), " (", Sv(why), ")"));
}

absl::Status CheckDrafterWeight(const Checkpoint& checkpoint, const WeightSpec& spec, StoredForm form,
                                const QuantizationConfig& quantization) {
  EAGLE3_RETURN_IF_ERROR(CheckStoredWeight(checkpoint, spec, form, quantization));
  if (form != StoredForm::kPlain) return absl::OkStatus();
  return CheckTensorDtype(checkpoint, spec.name, {DType::kF32, DType::kF16, DType::kBF16},
                          "F32, F16 or BF16",
                          "an unquantized weight; a float8 or integer tensor here has no scales to "
                          "read it with");
}

}  // namespace eagle3
