// The members every JSON file of the example programs opens with (issue 19), so that a result can
// be traced to the run that made it whichever tool and subcommand wrote it:
//   "tool"      "eagle3-decode" or "eagle3-inspect"
//   "command"   the subcommand ("target", "draft", "check", "accuracy"); null for eagle3-decode
//   "version"   the library's version (eagle3/version.h)
//   "settings"  every flag the command takes, as parsed, defaults included, under the flag's
//               name without the dashes ("--max-new-tokens" -> "max_new_tokens")
//   "device"    {"backend": "cpu"} or {"backend": "cuda", "ordinal": N} (rank 0's, whose results
//               the file holds); null when the command runs no model
//   "seed"      the seed the run drew its random numbers from; null when it draws none
//   "seconds"   wall time (std::chrono::steady_clock) of each phase the command has (eagle3-decode:
//               an object of phases per run, plain and speculative)
// followed by the command's own members. Also the one JSON string escaping of the tools.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "eagle3/device.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/version.h"

namespace eagle3::examples {

// JSON string literal of UTF-8 text.
inline std::string JsonString(std::string_view text) {
  std::string s = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': s += "\\\""; break;
      case '\\': s += "\\\\"; break;
      case '\n': s += "\\n"; break;
      case '\r': s += "\\r"; break;
      case '\t': s += "\\t"; break;
      default:
        if (const unsigned code = static_cast<unsigned char>(c); code < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", code);
          s += buf;
        } else {
          s += c;
        }
    }
  }
  return s + "\"";
}

// A JSON number; NaN and the infinities, which JSON cannot hold, as null.
inline std::string JsonNumber(double value) {
  if (!std::isfinite(value)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.7g", value);  // a float's digits: 0.9f reads back as 0.9
  return buf;
}

// A JSON array of integers ("[5, 17, 99]", also how the tools print id lists).
template <typename Ints>
std::string JsonInts(const Ints& values) {
  std::string s = "[";
  bool first = true;
  for (const auto value : values) {
    s += (first ? "" : ", ") + std::to_string(value);
    first = false;
  }
  return s + "]";
}

// One JSON object, built member by member in order.
class JsonObject {
 public:
  JsonObject& String(std::string_view key, std::string_view value) {
    return Raw(key, JsonString(value));
  }
  // A path flag: empty (not given) as null.
  JsonObject& PathOrNull(std::string_view key, std::string_view value) {
    return Raw(key, value.empty() ? "null" : JsonString(value));
  }
  JsonObject& Int(std::string_view key, int64_t value) { return Raw(key, std::to_string(value)); }
  JsonObject& Uint(std::string_view key, uint64_t value) { return Raw(key, std::to_string(value)); }
  JsonObject& Number(std::string_view key, double value) { return Raw(key, JsonNumber(value)); }
  JsonObject& Bool(std::string_view key, bool value) { return Raw(key, value ? "true" : "false"); }
  // `json` as it is: a nested object or array, or null.
  JsonObject& Raw(std::string_view key, std::string_view json) {
    if (!members_.empty()) members_ += ", ";
    members_ += JsonString(key);
    members_ += ": ";
    members_ += json;
    return *this;
  }
  // `other`'s members after these.
  JsonObject& Append(const JsonObject& other) {
    if (!members_.empty() && !other.members_.empty()) members_ += ", ";
    members_ += other.members_;
    return *this;
  }
  std::string str() const { return "{" + members_ + "}"; }

 private:
  std::string members_;
};

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Wall time per phase of a command, in the order first timed; a phase timed again adds up.
class PhaseSeconds {
 public:
  void Add(std::string_view phase, double seconds) {
    for (auto& [name, total] : phases_) {
      if (name == phase) {
        total += seconds;
        return;
      }
    }
    phases_.emplace_back(std::string(phase), seconds);
  }
  // Runs `fn` (returning a value, e.g. a Status) and adds its wall time to `phase`.
  template <typename Fn>
  auto Time(std::string_view phase, Fn&& fn) {
    const Clock::time_point start = Clock::now();
    auto result = std::forward<Fn>(fn)();
    Add(phase, SecondsSince(start));
    return result;
  }
  double Get(std::string_view phase) const {
    for (const auto& [name, total] : phases_) {
      if (name == phase) return total;
    }
    return 0;
  }
  JsonObject Json() const {
    JsonObject out;
    for (const auto& [name, total] : phases_) out.Number(name, total);
    return out;
  }

 private:
  std::vector<std::pair<std::string, double>> phases_;
};

inline std::string DeviceJson(const Device& device) {
  if (!device.is_cuda()) return JsonObject().String("backend", "cpu").str();
  return JsonObject().String("backend", "cuda").Int("ordinal", device.index).str();
}

// The members above; the JSON a tool writes is Json(its own members).
struct RunReport {
  std::string tool;
  std::optional<std::string> command;  // none: the tool has no subcommands
  JsonObject settings;
  std::optional<Device> device;  // none: no model ran
  std::optional<uint64_t> seed;  // none: nothing random was drawn
  JsonObject seconds;

  // The file's text: these members, then the command's own.
  std::string Json(const JsonObject& more) const {
    JsonObject out;
    out.String("tool", tool)
        .Raw("command", command.has_value() ? JsonString(*command) : "null")
        .String("version", EAGLE3_VERSION_STRING)
        .Raw("settings", settings.str())
        .Raw("device", device.has_value() ? DeviceJson(*device) : "null")
        .Raw("seed", seed.has_value() ? std::to_string(*seed) : "null")
        .Raw("seconds", seconds.str())
        .Append(more);
    return out.str() + "\n";
  }
};

// Writes `json` to `path` as every tool output is written (atomically, never over `inputs`, see
// eagle3/safetensors_writer.h); a refusal names `flag`.
inline absl::Status WriteJsonFile(std::string_view flag, const std::string& path,
                                  std::string_view json, std::span<const std::string> inputs) {
  const absl::Status written = WriteFileAtomically(path, json, inputs);
  if (!written.ok()) {
    return absl::Status(written.code(), std::string(flag) + ": " + std::string(written.message()));
  }
  std::printf("wrote %s\n", path.c_str());
  return absl::OkStatus();
}

}  // namespace eagle3::examples
