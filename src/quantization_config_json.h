// Parsing of QuantizationConfig from a config.json object. Private: only .cc files include it.
#pragma once

#include "absl/status/statusor.h"
#include "eagle3/quantization_config.h"
#include "json_fields.h"

namespace eagle3 {

// Reads `quantization_config` of `config` (the config.json root): absent or null gives
// kUnquantized. Every key of both published forms is read or known to be harmless; anything else
// is refused: InvalidArgument for a malformed or unknown key, Unimplemented for a well-formed
// setting eagle3 does not run (another quant_method, format, bit width, block structure, activation
// quantization, ...), each naming the file, the key path, what eagle3 expects and what it got.
absl::StatusOr<QuantizationConfig> ParseQuantizationConfig(const json_fields::Object& config);

}  // namespace eagle3
