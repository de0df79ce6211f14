// Checks of a drafter's checkpoint tensors shared by the MTP module (mtp_weights.cc) and the MLA
// EAGLE-3 draft (mla_draft_weights.cc): each required tensor present in its stored form, of an
// accepted dtype and of its full shape; each message names the tensor, its file, what was expected
// and what was found.
#pragma once

#include <initializer_list>
#include <string_view>

#include "absl/status/status.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/dtype.h"
#include "eagle3/quantization_config.h"

namespace eagle3 {

// CheckStoredWeight, and for a plain weight a floating-point dtype (F32, F16 or BF16): a plain
// F8_E4M3 weight would be read without its scales, an integer one is no weight at all. NotFound
// when a stored tensor is missing, InvalidArgument otherwise.
absl::Status CheckDrafterWeight(const Checkpoint& checkpoint, const WeightSpec& spec, StoredForm form,
                                const QuantizationConfig& quantization);

// `name` (present in `checkpoint`) is stored as one of `accepted`: InvalidArgument "tensor '<name>'
// in '<file>' is <dtype>; expected <expected> (<why>)" otherwise.
absl::Status CheckTensorDtype(const Checkpoint& checkpoint, std::string_view name,
                              std::initializer_list<DType> accepted, std::string_view expected,
                              std::string_view why);

}  // namespace eagle3
