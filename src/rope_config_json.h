// Parsing of RopeConfig from a config.json object. Private: only .cc files include it.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "eagle3/rope_config.h"
#include "json_fields.h"

namespace eagle3 {

// Top-level keys ParseRopeConfig reads; config parsers add them to their allowlists.
inline constexpr std::string_view kRopeConfigKeys[] = {"rope_theta", "rope_scaling",
                                                       "rope_parameters"};

// Reads the hub form and/or the transformers-5 form from `config` (see rope_config.h).
// `default_theta` applies when no form states a theta (10000 for both Llama and DeepSeek configs).
absl::StatusOr<RopeConfig> ParseRopeConfig(const json_fields::Object& config, double default_theta);

}  // namespace eagle3
