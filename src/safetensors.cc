#include "eagle3/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "nlohmann/json.hpp"

namespace eagle3 {
namespace {

using Json = nlohmann::json;

// A valid header nests three levels (object -> entry -> shape array); deeper input is rejected
// early instead of building a huge tree.
constexpr int kMaxJsonDepth = 8;
constexpr size_t kMaxQuotedValue = 256;

// JSON text of a value for messages, truncated so a hostile header cannot produce huge errors.
std::string Brief(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > kMaxQuotedValue) text = text.substr(0, kMaxQuotedValue) + "...";
  return text;
}

// Debian's abseil has its own string_view, so std::string_view goes through this explicitly.
std::string Quote(std::string_view s) {
  const bool cut = s.size() > kMaxQuotedValue;
  if (cut) s = s.substr(0, kMaxQuotedValue);
  return absl::StrCat("'", absl::string_view(s.data(), s.size()), cut ? "...'" : "'");
}

absl::Status Invalid(const std::string& source, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

std::string KnownDTypes() {
  std::string known;
  for (int i = 0; i <= static_cast<int>(DType::kF8E4M3); ++i) {
    absl::StrAppend(&known, i == 0 ? "" : ", ",
                    std::string(SafetensorsDTypeName(static_cast<DType>(i))));
  }
  return known;
}

// Non-negative JSON integer as uint64; nullopt for negatives, floats and non-numbers.
std::optional<uint64_t> NonNegativeInteger(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  return std::nullopt;
}

struct DepthExceeded {};

// Parses `text`, rejecting duplicate keys in any object (nlohmann would silently keep the last one,
// which for a safetensors header means two tensors claiming one name with one of them dropped).
absl::StatusOr<Json> ParseJsonStrict(std::string_view text, const std::string& source) {
  struct Frame {
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> frames;
  std::string duplicate;         // first duplicated key
  std::string duplicate_parent;  // key of the object holding it
  bool has_duplicate = false;
  bool duplicate_at_top = false;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        if (depth > kMaxJsonDepth) throw DepthExceeded{};
        frames.push_back({});
        break;
      case Json::parse_event_t::array_start:
        if (depth > kMaxJsonDepth) throw DepthExceeded{};
        break;
      case Json::parse_event_t::key:
        if (!frames.empty()) {
          Frame& frame = frames.back();
          frame.last_key = parsed.get<std::string>();
          if (!frame.keys.insert(frame.last_key).second && !has_duplicate) {
            has_duplicate = true;
            duplicate = frame.last_key;
            duplicate_at_top = frames.size() == 1;
            if (frames.size() >= 2) duplicate_parent = frames[frames.size() - 2].last_key;
          }
        }
        break;
      case Json::parse_event_t::object_end:
        if (!frames.empty()) frames.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text.begin(), text.end(), callback);
  } catch (const DepthExceeded&) {
    return Invalid(source, absl::StrCat("header JSON nests deeper than ", kMaxJsonDepth,
                                        " levels; a safetensors header needs 3"));
  } catch (const Json::exception& e) {
    return Invalid(source, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (has_duplicate) {
    if (duplicate_at_top) {
      return Invalid(
          source, duplicate == "__metadata__"
                      ? std::string("duplicate __metadata__ in the header")
                      : absl::StrCat("duplicate tensor name ", Quote(duplicate), " in the header"));
    }
    return Invalid(source, absl::StrCat("duplicate key ", Quote(duplicate), " in header entry ",
                                        Quote(duplicate_parent)));
  }
  return root;
}

absl::Status ParseMetadata(const Json& value, const std::string& source,
                           std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) {
    return Invalid(source, absl::StrCat("__metadata__ must be an object of string -> string, got ",
                                        value.type_name(), " ", Brief(value)));
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return Invalid(source,
                     absl::StrCat("__metadata__ key ", Quote(key), " has a ", item.type_name(),
                                  " value ", Brief(item), "; expected a string"));
    }
    (*metadata)[key] = item.get<std::string>();
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorInfo> ParseEntry(const std::string& name, const Json& entry,
                                      uint64_t data_size, const std::string& source) {
  const std::string tensor = absl::StrCat("tensor ", Quote(name));
  if (!entry.is_object()) {
    return Invalid(source, absl::StrCat(tensor, " entry must be an object, got ", entry.type_name(),
                                        " ", Brief(entry)));
  }
  for (const auto& [key, unused] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return Invalid(source, absl::StrCat(tensor, " has unexpected key ", Quote(key),
                                          " (expected exactly dtype, shape, data_offsets)"));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) return Invalid(source, absl::StrCat(tensor, " has no '", key, "'"));
  }

  TensorInfo info;
  info.name = name;

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return Invalid(source, absl::StrCat(tensor, " dtype must be a string, got ", Brief(dtype)));
  }
  const std::optional<DType> parsed_dtype = ParseSafetensorsDType(dtype.get<std::string>());
  if (!parsed_dtype) {
    return Invalid(source, absl::StrCat(tensor, " has unknown dtype ", Brief(dtype),
                                        " (known: ", KnownDTypes(), ")"));
  }
  info.dtype = *parsed_dtype;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) {
    return Invalid(source, absl::StrCat(tensor, " shape must be an array, got ", Brief(shape)));
  }
  if (shape.size() > static_cast<size_t>(Shape::kMaxRank)) {
    return Invalid(source, absl::StrCat(tensor, " shape has rank ", shape.size(),
                                        ", more than the supported ", Shape::kMaxRank));
  }
  std::vector<int64_t> dims;
  int64_t numel = 1;  // accumulated in the order Shape::numel() multiplies, so it cannot overflow
  for (size_t i = 0; i < shape.size(); ++i) {
    const std::optional<uint64_t> dim = NonNegativeInteger(shape[i]);
    if (!dim) {
      return Invalid(source, absl::StrCat(tensor, " shape dim ", i, " is ", Brief(shape[i]),
                                          "; expected a non-negative integer"));
    }
    if (*dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(numel, static_cast<int64_t>(*dim), &numel)) {
      return Invalid(source, absl::StrCat(tensor, " shape ", Brief(shape),
                                          " has more elements than fit in 64 bits"));
    }
    dims.push_back(static_cast<int64_t>(*dim));
  }
  Shape::FromSpan(dims, &info.shape);  // rank checked above

  const Json& offsets = entry["data_offsets"];
  std::optional<uint64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = NonNegativeInteger(offsets[0]);
    end = NonNegativeInteger(offsets[1]);
  }
  if (!begin || !end) {
    return Invalid(source, absl::StrCat(tensor,
                                        " data_offsets must be two non-negative integers"
                                        " [begin, end], got ",
                                        Brief(offsets)));
  }
  info.begin = *begin;
  info.end = *end;
  const std::string span = absl::StrCat("data_offsets [", info.begin, ", ", info.end, ")");
  if (info.begin > info.end) {
    return Invalid(source, absl::StrCat(tensor, " ", span, " has begin > end"));
  }
  if (info.end > data_size) {
    return Invalid(source,
                   absl::StrCat(tensor, " ", span, " runs past the end of the data section (",
                                data_size, " bytes)"));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), DTypeSize(info.dtype), &bytes)) {
    return Invalid(source, absl::StrCat(tensor, " shape ", info.shape.ToString(), " of ",
                                        std::string(SafetensorsDTypeName(info.dtype)),
                                        " has more bytes than fit in 64 bits"));
  }
  if (bytes != info.end - info.begin) {
    return Invalid(source,
                   absl::StrCat(tensor, " shape ", info.shape.ToString(), " of ",
                                std::string(SafetensorsDTypeName(info.dtype)), " needs ", bytes,
                                " bytes but ", span, " span ", info.end - info.begin, " bytes"));
  }
  return info;
}

// Every data byte must belong to exactly one tensor: no overlap, no gap, no unused tail.
absl::Status CheckCoverage(const std::vector<TensorInfo>& tensors, uint64_t data_size,
                           const std::string& source) {
  uint64_t cursor = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    const std::string span = absl::StrCat("[", t.begin, ", ", t.end, ")");
    if (t.begin < cursor) {
      return Invalid(source, absl::StrCat("tensor ", Quote(t.name), " data ", span,
                                          " overlaps tensor ", Quote(previous->name), " data [",
                                          previous->begin, ", ", previous->end, ")"));
    }
    if (t.begin > cursor) {
      return Invalid(source, absl::StrCat("gap of ", t.begin - cursor, " unused bytes [", cursor,
                                          ", ", t.begin, ") before tensor ", Quote(t.name),
                                          "; safetensors data must be packed"));
    }
    cursor = t.end;
    if (t.end > t.begin) previous = &t;
  }
  if (cursor != data_size) {
    return Invalid(source, absl::StrCat(data_size - cursor, " unused trailing bytes after ",
                                        previous ? "tensor " + Quote(previous->name) : "the header",
                                        " (data section is ", data_size, " bytes, tensors end at ",
                                        cursor, ")"));
  }
  return absl::OkStatus();
}

absl::Status TooShort(uint64_t size, const std::string& source) {
  return Invalid(source, absl::StrCat("file is ", size,
                                      " bytes, shorter than the 8-byte header length prefix"));
}

}  // namespace

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(
    std::string_view header_json, uint64_t data_size, std::string_view source,
    std::map<std::string, std::string>* metadata) {
  const std::string src(source);
  EAGLE3_ASSIGN_OR_RETURN(Json root, ParseJsonStrict(header_json, src));
  if (!root.is_object()) {
    return Invalid(src, absl::StrCat("header must be a JSON object, got ", root.type_name()));
  }
  std::vector<TensorInfo> tensors;
  tensors.reserve(root.size());
  std::map<std::string, std::string>
      parsed_metadata;  // handed out only when the whole header is valid
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      EAGLE3_RETURN_IF_ERROR(ParseMetadata(value, src, &parsed_metadata));
      continue;
    }
    EAGLE3_ASSIGN_OR_RETURN(TensorInfo info, ParseEntry(key, value, data_size, src));
    tensors.push_back(std::move(info));
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  EAGLE3_RETURN_IF_ERROR(CheckCoverage(tensors, data_size, src));
  if (metadata != nullptr) *metadata = std::move(parsed_metadata);
  return tensors;
}

absl::StatusOr<SafetensorsLayout> ParseSafetensorsBuffer(std::span<const uint8_t> file,
                                                         std::string_view source) {
  const std::string src(source);
  if (file.size() < 8) return TooShort(file.size(), src);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | file[i];  // little-endian
  if (header_size == 0) return Invalid(src, "header length is 0");
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return Invalid(src, absl::StrCat("header length ", header_size, " exceeds the cap of ",
                                     kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_size > file.size() - 8) {
    return Invalid(
        src, absl::StrCat("header length ", header_size, " runs past the end of the file (file is ",
                          file.size(), " bytes, header needs ", 8 + header_size, ")"));
  }
  SafetensorsLayout layout;
  layout.data_offset = 8 + header_size;
  layout.data_size = file.size() - layout.data_offset;
  const std::string_view header(reinterpret_cast<const char*>(file.data()) + 8, header_size);
  EAGLE3_ASSIGN_OR_RETURN(
      layout.tensors, ParseSafetensorsHeader(header, layout.data_size, source, &layout.metadata));
  return layout;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open safetensors file '", path, "'"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::ErrnoToStatus(error, absl::StrCat("cannot stat '", path, "'"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat("'", path, "' is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return TooShort(size, path);
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (mapping == MAP_FAILED) {
    return absl::ErrnoToStatus(map_error, absl::StrCat("cannot mmap '", path, "'"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->base_ = static_cast<const uint8_t*>(mapping);
  file->mapped_size_ = size;  // the destructor unmaps from here on, on every return path
  EAGLE3_ASSIGN_OR_RETURN(file->layout_, ParseSafetensorsBuffer({file->base_, size}, path));
  for (size_t i = 0; i < file->layout_.tensors.size(); ++i) {
    file->index_.emplace(file->layout_.tensors[i].name, i);
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), mapped_size_);
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &layout_.tensors[it->second];
}

absl::StatusOr<TensorView> SafetensorsFile::View(std::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("tensor ", Quote(name), " not found in '", path_, "'"));
  }
  const uint8_t* bytes = RawData(*info);
  // TensorView carries a mutable pointer; the mapping is PROT_READ, so this view is read-only.
  void* data = const_cast<uint8_t*>(bytes);
  if (reinterpret_cast<uintptr_t>(bytes) % DTypeSize(info->dtype) == 0) {
    return TensorView(data, info->dtype, info->shape);
  }
  std::lock_guard<std::mutex> lock(aligned_copies_mutex_);
  auto it = aligned_copies_.find(name);
  if (it == aligned_copies_.end()) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(info->dtype, info->shape));
    std::memcpy(copy.data(), bytes, info->end - info->begin);
    it = aligned_copies_.emplace(info->name, std::move(copy)).first;
  }
  return it->second.view();
}

}  // namespace eagle3
