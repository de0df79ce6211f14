// Helpers shared by the config tests: read the real configs in tests/data/configs and derive
// variants of them by editing the parsed JSON.
#pragma once

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace eagle3::testing {

inline std::string ConfigPath(const std::string& name) {
  return std::string(EAGLE3_TEST_DATA_DIR) + "/configs/" + name;
}

inline std::string ReadConfigText(const std::string& name) {
  std::ifstream in(ConfigPath(name), std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The named config with `edit` applied, as JSON text.
inline std::string EditedConfig(const std::string& name,
                                const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json json = nlohmann::json::parse(ReadConfigText(name));
  edit(json);
  return json.dump(2);
}

// The FP8 hub configs without their quantization_config: what the bf16 conversions ship.
inline std::string WithoutQuantization(const std::string& name) {
  return EditedConfig(name, [](nlohmann::json& j) { j.erase("quantization_config"); });
}

}  // namespace eagle3::testing
