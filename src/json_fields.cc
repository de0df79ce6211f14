#include "json_fields.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "file_io.h"

namespace eagle3::json_fields {
namespace {

// Messages quote at most this much of a key.
constexpr size_t kMaxQuotedKey = 80;

std::string QuotedKey(std::string_view key) {
  if (key.size() <= kMaxQuotedKey) return absl::StrCat("'", Sv(key), "'");
  return absl::StrCat("'", Sv(key.substr(0, kMaxQuotedKey)), "...' (", key.size(), " bytes)");
}

// A SAX handler that builds the DOM nlohmann's own parser would, within DomLimits: it stops at the
// first limit crossed, so time is linear in the text and memory bounded by the limits.
class BoundedDomBuilder {
 public:
  BoundedDomBuilder(std::string_view source, const DomLimits& limits)
      : source_(source), limits_(limits) {}

  nlohmann::json& root() { return root_; }
  // The first error; OK while none.
  const absl::Status& error() const { return error_; }

  bool null() { return Value(nullptr); }
  bool boolean(bool v) { return Value(v); }
  bool number_integer(int64_t v) { return Value(v); }
  bool number_unsigned(uint64_t v) { return Value(v); }
  bool number_float(double v, const std::string& /*text*/) { return Value(v); }
  bool string(std::string& v) { return CheckString(v, "string") && Value(std::move(v)); }
  bool binary(nlohmann::json::binary_t& /*v*/) {
    return Fail("binary values are not JSON");  // only binary formats produce them
  }
  bool start_object(size_t /*elements*/) { return Open(nlohmann::json::object()); }
  bool start_array(size_t /*elements*/) { return Open(nlohmann::json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(std::string& k) {
    if (!CheckString(k, "key")) return false;
    nlohmann::json& object = *stack_.back();
    if (object.contains(k)) {
      return Fail(absl::StrCat("duplicate key ", QuotedKey(k), " in ", Where(),
                               "; JSON readers disagree on which one wins"));
    }
    path_.back() = k;
    pending_ = &object[k];
    return true;
  }
  bool parse_error(size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::json::exception& e) {
    error_ = absl::InvalidArgumentError(absl::StrCat(Sv(source_), ": not valid JSON: ", e.what()));
    return false;
  }

 private:
  // "the top level" or "object 'model.vocab'".
  std::string Where() const {
    std::string path;
    for (size_t i = 0; i + 1 < path_.size(); ++i) {
      absl::StrAppend(&path, path.empty() ? "" : ".", path_[i]);
    }
    return path.empty() ? std::string("the top-level object")
                        : absl::StrCat("object ", QuotedKey(path));
  }

  bool Fail(std::string_view message) {
    error_ = absl::InvalidArgumentError(absl::StrCat(Sv(source_), ": ", Sv(message)));
    return false;
  }

  bool CheckString(const std::string& s, std::string_view kind) {
    if (s.size() <= limits_.max_string_bytes) return true;
    return Fail(absl::StrCat("a ", Sv(kind), " of ", s.size(), " bytes in ", Where(),
                             " exceeds the limit of ", limits_.max_string_bytes, " bytes for a ",
                             Sv(limits_.what)));
  }

  // Places a new value where the parser is (root, array element, or the pending object member).
  template <typename T>
  nlohmann::json* Insert(T&& value) {
    if (stack_.empty()) {
      root_ = nlohmann::json(std::forward<T>(value));
      return &root_;
    }
    nlohmann::json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.emplace_back(std::forward<T>(value));
      return &parent.back();
    }
    *pending_ = nlohmann::json(std::forward<T>(value));
    return pending_;
  }

  bool Count() {
    if (++values_ <= limits_.max_values) return true;
    return Fail(absl::StrCat("more than ", limits_.max_values, " JSON values (limit ",
                             limits_.max_values, " for a ", Sv(limits_.what), ")"));
  }

  template <typename T>
  bool Value(T&& value) {
    if (!Count()) return false;
    Insert(std::forward<T>(value));
    return true;
  }

  bool Open(nlohmann::json container) {
    if (!Count()) return false;
    if (static_cast<int>(stack_.size()) >= kMaxNestingDepth) {
      return Fail(absl::StrCat("JSON nests deeper than ", kMaxNestingDepth, " levels; not a ",
                               Sv(limits_.what)));
    }
    // An array element stays "[]" in the path; an object's current key replaces it on key().
    stack_.push_back(Insert(std::move(container)));
    path_.emplace_back(stack_.back()->is_array() ? "[]" : "");
    return true;
  }

  bool Close() {
    stack_.pop_back();
    path_.pop_back();
    return true;
  }

  std::string_view source_;
  const DomLimits& limits_;
  nlohmann::json root_;
  // Open containers, innermost last. The innermost one is the last element of its parent and no
  // sibling is added while it is open, so these pointers stay valid.
  std::vector<nlohmann::json*> stack_;
  std::vector<std::string> path_;  // per open container: the current key, or "[]"
  nlohmann::json* pending_ = nullptr;  // the member the next value of an object goes to
  uint64_t values_ = 0;
  absl::Status error_;
};

std::string_view TypeName(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return "boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "integer";
    case nlohmann::json::value_t::number_float:
      return "number";
    case nlohmann::json::value_t::string:
      return "string";
    case nlohmann::json::value_t::array:
      return "array";
    case nlohmann::json::value_t::object:
      return "object";
    case nlohmann::json::value_t::binary:
      return "binary";
    case nlohmann::json::value_t::discarded:
      return "discarded";
  }
  return "unknown";
}

std::string Truncated(std::string text) {
  constexpr size_t kMaxChars = 60;
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return text;
}

bool IsInteger(const nlohmann::json& value) {
  return value.is_number_integer() || value.is_number_unsigned();
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseObjectDocument(std::string_view text, std::string_view source,
                                                   const DomLimits& limits) {
  if (text.size() > limits.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(source), ": ", text.size(),
                                                   " bytes is too large for a ", Sv(limits.what),
                                                   " (limit ", limits.max_bytes, " bytes)"));
  }
  BoundedDomBuilder builder(source, limits);
  bool parsed = false;
  try {
    parsed = nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  } catch (const nlohmann::json::exception& e) {  // the SAX parser reports through parse_error
    return absl::InvalidArgumentError(absl::StrCat(Sv(source), ": not valid JSON: ", e.what()));
  }
  if (!parsed) {
    if (!builder.error().ok()) return builder.error();
    return absl::InvalidArgumentError(absl::StrCat(Sv(source), ": not valid JSON"));
  }
  nlohmann::json& document = builder.root();
  if (!document.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(source), ": expected a JSON object at the top level, got ", Describe(document)));
  }
  return std::move(document);
}

absl::StatusOr<std::string> ReadJsonFile(const std::string& path, const DomLimits& limits,
                                         std::string* resolved_path) {
  std::error_code ec;
  std::filesystem::path file(path);
  // is_directory stats without opening, so it cannot block on a FIFO.
  if (std::filesystem::is_directory(file, ec)) file /= std::string(limits.what);
  *resolved_path = file.string();
  return file_io::ReadRegularFile(*resolved_path, limits.max_bytes,
                                  absl::StrCat(Sv(limits.what), " or its directory"));
}

absl::StatusOr<std::string> ReadConfigFile(const std::string& path, std::string* resolved_path) {
  return ReadJsonFile(path, kConfigLimits, resolved_path);
}

bool IsOneOf(std::string_view name, std::span<const std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string Describe(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::array:
      return absl::StrCat("array of ", value.size(), " elements");
    case nlohmann::json::value_t::object:
      return absl::StrCat("object with ", value.size(), " keys");
    case nlohmann::json::value_t::null:
      return "null";
    default:
      return absl::StrCat(Sv(TypeName(value)), " ", Truncated(value.dump()));
  }
}

Object::Object(const nlohmann::json& json, std::string_view source, std::string_view path)
    : json_(&json), source_(source), path_(path) {}

std::string Object::Path(std::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", Sv(key));
}

const nlohmann::json* Object::Find(std::string_view key) const {
  const auto it = json_->find(key);
  return it == json_->end() ? nullptr : &*it;
}

bool Object::Contains(std::string_view key) const { return Find(key) != nullptr; }

std::vector<std::string> Object::Keys() const {
  std::vector<std::string> keys;
  keys.reserve(json_->size());
  for (const auto& [key, value] : json_->items()) keys.push_back(key);
  return keys;
}

bool Object::HasValue(std::string_view key) const {
  const nlohmann::json* value = Find(key);
  return value != nullptr && !value->is_null();
}

absl::Status Object::Error(absl::StatusCode code, std::string_view key,
                           std::string_view message) const {
  return absl::Status(code, absl::StrCat(source_, ": key '", Path(key), "': ", Sv(message)));
}

absl::Status Object::TypeError(std::string_view key, std::string_view expected,
                               const nlohmann::json& got) const {
  return Error(absl::StatusCode::kInvalidArgument, key,
               absl::StrCat("expected ", Sv(expected), ", got ", Describe(got)));
}

absl::Status Object::RequireValue(std::string_view key, std::string_view expected) const {
  const nlohmann::json* value = Find(key);
  if (value == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": missing required key '", Path(key), "'"));
  }
  if (value->is_null()) return TypeError(key, expected, *value);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Object::ToInt(std::string_view path_key, const nlohmann::json& value,
                                      int64_t min, int64_t max) const {
  if (!IsInteger(value)) return TypeError(path_key, "an integer", value);
  // Read through the stored representation: converting an out-of-range unsigned is lossy.
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Error(absl::StatusCode::kInvalidArgument, path_key,
                 absl::StrCat(value.get<uint64_t>(), " is out of range [", min, ", ", max, "]"));
  }
  const int64_t v = value.get<int64_t>();
  if (v < min || v > max) {
    return Error(absl::StatusCode::kInvalidArgument, path_key,
                 absl::StrCat(v, " is out of range [", min, ", ", max, "]"));
  }
  return v;
}

absl::StatusOr<double> Object::ToDouble(std::string_view key, const nlohmann::json& value) const {
  if (!value.is_number()) return TypeError(key, "a number", value);
  const double v = value.get<double>();
  if (!std::isfinite(v)) {
    return Error(absl::StatusCode::kInvalidArgument, key,
                 absl::StrCat("expected a finite number, got ", value.dump()));
  }
  return v;
}

absl::StatusOr<bool> Object::ToBool(std::string_view key, const nlohmann::json& value) const {
  if (!value.is_boolean()) return TypeError(key, "a boolean", value);
  return value.get<bool>();
}

absl::StatusOr<std::string> Object::ToString(std::string_view key,
                                             const nlohmann::json& value) const {
  if (!value.is_string()) return TypeError(key, "a string", value);
  return value.get<std::string>();
}

absl::StatusOr<std::vector<int64_t>> Object::ToIntArray(std::string_view key,
                                                        const nlohmann::json& value, int64_t min,
                                                        int64_t max) const {
  if (!value.is_array()) return TypeError(key, "an array of integers", value);
  std::vector<int64_t> out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    EAGLE3_ASSIGN_OR_RETURN(int64_t v,
                            ToInt(absl::StrCat(Sv(key), "[", i, "]"), value[i], min, max));
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Object> Object::ToObject(std::string_view key, const nlohmann::json& value) const {
  if (!value.is_object()) return TypeError(key, "an object", value);
  return Object(value, source_, Path(key));
}

template <typename T, typename Convert>
absl::StatusOr<std::optional<T>> Object::OptionalOf(std::string_view key, Convert convert) const {
  const nlohmann::json* value = Find(key);
  if (value == nullptr || value->is_null()) return std::optional<T>();
  absl::StatusOr<T> v = convert(*value);
  if (!v.ok()) return v.status();
  return std::optional<T>(*std::move(v));
}

absl::StatusOr<std::optional<int64_t>> Object::OptionalInt(std::string_view key, int64_t min,
                                                           int64_t max) const {
  return OptionalOf<int64_t>(
      key, [&](const nlohmann::json& value) { return ToInt(key, value, min, max); });
}

absl::StatusOr<std::optional<double>> Object::OptionalDouble(std::string_view key) const {
  return OptionalOf<double>(key, [&](const nlohmann::json& value) { return ToDouble(key, value); });
}

absl::StatusOr<std::optional<bool>> Object::OptionalBool(std::string_view key) const {
  return OptionalOf<bool>(key, [&](const nlohmann::json& value) { return ToBool(key, value); });
}

absl::StatusOr<std::optional<std::string>> Object::OptionalString(std::string_view key) const {
  return OptionalOf<std::string>(key,
                                 [&](const nlohmann::json& value) { return ToString(key, value); });
}

absl::StatusOr<std::optional<std::vector<int64_t>>> Object::OptionalIntArray(std::string_view key,
                                                                             int64_t min,
                                                                             int64_t max) const {
  return OptionalOf<std::vector<int64_t>>(
      key, [&](const nlohmann::json& value) { return ToIntArray(key, value, min, max); });
}

absl::StatusOr<std::optional<Object>> Object::OptionalSubObject(std::string_view key) const {
  return OptionalOf<Object>(key, [&](const nlohmann::json& value) { return ToObject(key, value); });
}

absl::StatusOr<int64_t> Object::Int(std::string_view key, int64_t min, int64_t max) const {
  EAGLE3_RETURN_IF_ERROR(RequireValue(key, "an integer"));
  return ToInt(key, *Find(key), min, max);
}

absl::StatusOr<double> Object::Double(std::string_view key) const {
  EAGLE3_RETURN_IF_ERROR(RequireValue(key, "a number"));
  return ToDouble(key, *Find(key));
}

absl::StatusOr<bool> Object::Bool(std::string_view key) const {
  EAGLE3_RETURN_IF_ERROR(RequireValue(key, "a boolean"));
  return ToBool(key, *Find(key));
}

absl::StatusOr<std::string> Object::String(std::string_view key) const {
  EAGLE3_RETURN_IF_ERROR(RequireValue(key, "a string"));
  return ToString(key, *Find(key));
}

absl::StatusOr<std::vector<int64_t>> Object::IntArray(std::string_view key, int64_t min,
                                                      int64_t max) const {
  EAGLE3_RETURN_IF_ERROR(RequireValue(key, "an array of integers"));
  return ToIntArray(key, *Find(key), min, max);
}

absl::StatusOr<Object> Object::SubObject(std::string_view key) const {
  EAGLE3_RETURN_IF_ERROR(RequireValue(key, "an object"));
  return ToObject(key, *Find(key));
}

absl::StatusOr<std::vector<int64_t>> Object::IntOrIntArray(std::string_view key, int64_t min,
                                                           int64_t max) const {
  const nlohmann::json* value = Find(key);
  if (value == nullptr || value->is_null()) return std::vector<int64_t>();
  if (IsInteger(*value)) {
    EAGLE3_ASSIGN_OR_RETURN(int64_t v, ToInt(key, *value, min, max));
    return std::vector<int64_t>{v};
  }
  if (!value->is_array()) return TypeError(key, "an integer or an array of integers", *value);
  return ToIntArray(key, *value, min, max);
}

absl::StatusOr<std::optional<std::vector<std::string>>> Object::OptionalStringArray(
    std::string_view key) const {
  const nlohmann::json* value = Find(key);
  if (value == nullptr || value->is_null()) return std::optional<std::vector<std::string>>();
  if (!value->is_array()) return TypeError(key, "an array of strings", *value);
  std::vector<std::string> out;
  out.reserve(value->size());
  for (size_t i = 0; i < value->size(); ++i) {
    EAGLE3_ASSIGN_OR_RETURN(std::string element,
                            ToString(absl::StrCat(Sv(key), "[", i, "]"), (*value)[i]));
    out.push_back(std::move(element));
  }
  return std::optional<std::vector<std::string>>(std::move(out));
}

absl::Status Object::CheckKnownKeys(
    std::initializer_list<std::span<const std::string_view>> known) const {
  for (const auto& [key, value] : json_->items()) {
    bool is_known = false;
    for (std::span<const std::string_view> names : known)
      is_known = is_known || IsOneOf(key, names);
    if (!is_known) {
      return Error(absl::StatusCode::kInvalidArgument, key,
                   absl::StrCat("unknown key (value ", Describe(value),
                                "); eagle3 refuses keys that may change the model's math. If it "
                                "is harmless, report it so it can be allowlisted"));
    }
  }
  return absl::OkStatus();
}

}  // namespace eagle3::json_fields
