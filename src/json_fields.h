// Typed, bounds-checked reads from nlohmann::json objects, with error messages that name the source
// file and the full JSON path of the key ("config.json: key 'rope_scaling.factor': ...").
// Private to src/: nlohmann::json must never reach a public header. Not installed; the EAGLE3_API
// marks only let eagle3::tools (the tokenizer, tools/tokenizer/) link a shared libeagle3.
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
#include "eagle3/export.h"

namespace eagle3::json_fields {

// Debian's abseil has its own string_view, so std::string_view reaches absl::StrCat through this.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Deeper nesting than any config needs; bounding it keeps every later walk of the tree shallow.
inline constexpr int kMaxNestingDepth = 64;

// Limits for parsing an untrusted JSON file into a DOM. The parse is one SAX pass, linear in the
// text, that stops at the first limit crossed (no quadratic callback parser). The DOM then takes
// at most max_bytes of string data plus about kDomBytesPerValue per value, which is the memory
// bound stated for each use below.
struct DomLimits {
  std::string_view what;      // the expected file, for messages: "config.json"
  uint64_t max_bytes;         // file / text size
  uint64_t max_values;        // scalars, arrays and objects, all counted
  uint64_t max_string_bytes;  // any one string or key
};

// An upper estimate of one value's DOM cost with libstdc++: the worst shape, an object member
// whose value is an empty object, takes a 96-byte std::map node (key string and json included)
// plus the 64-byte allocation of the inner object's map. Strings longer than the inline buffer
// add their bytes, which max_bytes bounds. hostile_files_test measures this.
inline constexpr uint64_t kDomBytesPerValue = 160;

// config.json of a target or draft: a few KiB in practice, a few hundred values. At most
// 1 MiB + 65536 * 160 B = 11 MiB of DOM.
inline constexpr DomLimits kConfigLimits = {"config.json", uint64_t{1} << 20, uint64_t{1} << 16,
                                            uint64_t{64} << 10};
// tokenizer.json: about 10 MB and 300k-1M values for real BPE vocabularies (vocab + merges, 3
// values per merge in the newer pair form, + added tokens); a precompiled normalizer is the
// longest string, a few hundred KB. At most 32 MiB + 2^21 * 160 B = 352 MiB of DOM.
inline constexpr DomLimits kTokenizerLimits = {"tokenizer.json", uint64_t{32} << 20,
                                               uint64_t{1} << 21, uint64_t{1} << 20};

// Parses `text` as one JSON document whose top level is an object, within `limits` and
// kMaxNestingDepth. Duplicate keys are refused (JSON parsers disagree on which one wins). Errors
// are InvalidArgument naming `source`, the limit and the actual value.
EAGLE3_API absl::StatusOr<nlohmann::json> ParseObjectDocument(std::string_view text, std::string_view source,
                                                              const DomLimits& limits = kConfigLimits);

// Reads a JSON file of at most `limits.max_bytes`. `path` may name the file or a directory holding
// `limits.what`; `*resolved_path` receives the file actually read (the source name in messages).
// FIFOs, devices and directories are refused before any blocking open (see file_io.h).
EAGLE3_API absl::StatusOr<std::string> ReadJsonFile(const std::string& path, const DomLimits& limits,
                                                    std::string* resolved_path);

// ReadJsonFile with kConfigLimits: `path` is a config.json or its directory.
EAGLE3_API absl::StatusOr<std::string> ReadConfigFile(const std::string& path, std::string* resolved_path);

// Whether `name` is one of `names`.
EAGLE3_API bool IsOneOf(std::string_view name, std::span<const std::string_view> names);

// Short description of a value for messages: `string "abc"`, `integer 3`, `array of 2 elements`.
// Never recurses into containers.
EAGLE3_API std::string Describe(const nlohmann::json& value);

// A view of one JSON object plus where it came from. The referenced json must outlive the view.
class EAGLE3_API Object {
 public:
  // `path` is the JSON path of this object ("" for the document root, "rope_scaling" for a member).
  Object(const nlohmann::json& json, std::string_view source, std::string_view path);

  std::string_view source() const { return source_; }
  // JSON path of this object itself ("" for the document root).
  std::string_view path() const { return path_; }
  // Full JSON path of `key` inside this object: "rope_scaling.factor".
  std::string Path(std::string_view key) const;

  bool Contains(std::string_view key) const;  // present, possibly null
  // Every key of this object, in the order nlohmann::json keeps them (sorted).
  std::vector<std::string> Keys() const;
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
