// Shared by the example programs: "a,b,c" command-line lists of integers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace eagle3::examples {

// "a,b,c" as integers; `flag` names the flag in the message of an item that is not one.
inline absl::StatusOr<std::vector<int64_t>> ParseIds(std::string_view flag, const std::string& text) {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') {
      return absl::InvalidArgumentError(std::string(flag) + ": '" + item + "' is not an integer (in '" + text + "')");
    }
    ids.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

}  // namespace eagle3::examples
