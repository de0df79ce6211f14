// Typed, bounds-checked reads from nlohmann::json objects, with error messages that name the source
// file and the full JSON path of the key ("config.json: key 'rope_scaling.factor': ...").
// Private to src/: nlohmann::json must never reach a public header.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace eagle3::json_fields {

// Debian's abseil has its own string_view, so std::string_view reaches absl::StrCat through this.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Deeper nesting than any config needs; bounding it keeps every later walk of the tree shallow.
inline constexpr int kMaxNestingDepth = 64;

// Parses `text` as one JSON document whose top level is an object. Errors name `source`.
absl::StatusOr<nlohmann::json> ParseObjectDocument(std::string_view text, std::string_view source);

// Reads a config file. `path` may name the file or a directory holding `config.json`;
// `*resolved_path` receives the file actually read (used as the source name in messages).
absl::StatusOr<std::string> ReadConfigFile(const std::string& path, std::string* resolved_path);

// Whether `name` is one of `names`.
bool IsOneOf(std::string_view name, std::span<const std::string_view> names);

// Short description of a value for messages: `string "abc"`, `integer 3`, `array of 2 elements`.
// Never recurses into containers.
std::string Describe(const nlohmann::json& value);

// A view of one JSON object plus where it came from. The referenced json must outlive the view.
class Object {
 public:
  // `path` is the JSON path of this object ("" for the document root, "rope_scaling" for a member).
  Object(const nlohmann::json& json, std::string_view source, std::string_view path);

  std::string_view source() const { return source_; }
  // JSON path of this object itself ("" for the document root).
  std::string_view path() const { return path_; }
  // Full JSON path of `key` inside this object: "rope_scaling.factor".
  std::string Path(std::string_view key) const;

  bool Contains(std::string_view key) const;  // present, possibly null
  bool HasValue(std::string_view key) const;  // present and not null

  // Required getters fail when the key is missing or null; optional ones return std::nullopt then.
  // Integers must be JSON integers (no 4096.0) within [min, max].
  absl::StatusOr<int64_t> Int(std::string_view key, int64_t min, int64_t max) const;
  absl::StatusOr<std::optional<int64_t>> OptionalInt(std::string_view key, int64_t min,
                                                     int64_t max) const;
  // Numbers may be written as integers or floats; non-finite values are refused.
  absl::StatusOr<double> Double(std::string_view key) const;
  absl::StatusOr<std::optional<double>> OptionalDouble(std::string_view key) const;
  absl::StatusOr<bool> Bool(std::string_view key) const;
  absl::StatusOr<std::optional<bool>> OptionalBool(std::string_view key) const;
  absl::StatusOr<std::string> String(std::string_view key) const;
  absl::StatusOr<std::optional<std::string>> OptionalString(std::string_view key) const;
  // Array of integers, each within [min, max]; a bad element is named by index ("ids[1]").
  absl::StatusOr<std::vector<int64_t>> IntArray(std::string_view key, int64_t min,
                                                int64_t max) const;
  absl::StatusOr<std::optional<std::vector<int64_t>>> OptionalIntArray(std::string_view key,
                                                                       int64_t min,
                                                                       int64_t max) const;
  // An integer or an array of integers (e.g. `eos_token_id`); empty when missing or null.
  absl::StatusOr<std::vector<int64_t>> IntOrIntArray(std::string_view key, int64_t min,
                                                     int64_t max) const;
  // Array whose elements are all strings.
  absl::StatusOr<std::optional<std::vector<std::string>>> OptionalStringArray(
      std::string_view key) const;
  absl::StatusOr<Object> SubObject(std::string_view key) const;
  absl::StatusOr<std::optional<Object>> OptionalSubObject(std::string_view key) const;

  // Refuses the first key in none of the `known` lists: eagle3 will not silently drop a key that
  // may change the model's math.
  absl::Status CheckKnownKeys(std::initializer_list<std::span<const std::string_view>> known) const;

  // "<source>: key '<path>': <message>" with the given code.
  absl::Status Error(absl::StatusCode code, std::string_view key, std::string_view message) const;

 private:
  // The member for `key`, or nullptr when absent.
  const nlohmann::json* Find(std::string_view key) const;
  // Error for a present value of the wrong JSON type.
  absl::Status TypeError(std::string_view key, std::string_view expected,
                         const nlohmann::json& got) const;
  // Fails unless `key` is present and not null; `expected` names the type for the message.
  absl::Status RequireValue(std::string_view key, std::string_view expected) const;
  // std::nullopt when `key` is absent or null, else convert(value).
  template <typename T, typename Convert>
  absl::StatusOr<std::optional<T>> OptionalOf(std::string_view key, Convert convert) const;
  // Conversions of a present, non-null value; `key` names it in messages.
  absl::StatusOr<int64_t> ToInt(std::string_view key, const nlohmann::json& value, int64_t min,
                                int64_t max) const;
  absl::StatusOr<double> ToDouble(std::string_view key, const nlohmann::json& value) const;
  absl::StatusOr<bool> ToBool(std::string_view key, const nlohmann::json& value) const;
  absl::StatusOr<std::string> ToString(std::string_view key, const nlohmann::json& value) const;
  absl::StatusOr<std::vector<int64_t>> ToIntArray(std::string_view key, const nlohmann::json& value,
                                                  int64_t min, int64_t max) const;
  absl::StatusOr<Object> ToObject(std::string_view key, const nlohmann::json& value) const;

  const nlohmann::json* json_;
  std::string source_;
  std::string path_;
};

}  // namespace eagle3::json_fields
