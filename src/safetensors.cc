#include "eagle3/safetensors.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <optional>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "file_io.h"
#include "nlohmann/json.hpp"

namespace eagle3 {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxQuotedValue = 256;

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

// One JSON value as the SAX parser reports it: a scalar with its value, or the start of a
// container (whose contents are never needed for a message).
struct Value {
  enum class Kind { kNull, kBoolean, kInteger, kUnsigned, kFloat, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  int64_t integer = 0;
  uint64_t unsigned_integer = 0;
  const std::string* text = nullptr;  // kFloat: as written; kString: the contents

  // Non-negative JSON integer as uint64; nullopt for negatives, floats and non-numbers.
  std::optional<uint64_t> NonNegativeInteger() const {
    if (kind == Kind::kUnsigned) return unsigned_integer;
    if (kind == Kind::kInteger && integer >= 0) return static_cast<uint64_t>(integer);
    return std::nullopt;
  }

  std::string_view TypeName() const {
    switch (kind) {
      case Kind::kNull:
        return "null";
      case Kind::kBoolean:
        return "boolean";
      case Kind::kInteger:
      case Kind::kUnsigned:
      case Kind::kFloat:
        return "number";
      case Kind::kString:
        return "string";
      case Kind::kArray:
        return "array";
      case Kind::kObject:
        return "object";
    }
    return "value";
  }

  // JSON text of a scalar, truncated so a hostile header cannot produce huge errors; empty for
  // containers and null.
  std::string Text() const {
    std::string out;
    switch (kind) {
      case Kind::kBoolean:
        out = boolean ? "true" : "false";
        break;
      case Kind::kInteger:
        out = absl::StrCat(integer);
        break;
      case Kind::kUnsigned:
        out = absl::StrCat(unsigned_integer);
        break;
      case Kind::kFloat:
        out = *text;
        break;
      case Kind::kString:
        out = Json(text->substr(0, std::min(text->size(), kMaxQuotedValue)))
                  .dump(-1, ' ', false, Json::error_handler_t::replace);
        if (text->size() > kMaxQuotedValue) out += "...";
        break;
      default:
        break;
    }
    return out;
  }

  // "number 1.5", "string \"F32\"", "array", "null".
  std::string Brief() const {
    const std::string value = Text();
    return value.empty() ? std::string(TypeName())
                         : absl::StrCat(std::string(TypeName()), " ", value);
  }
};

// Streams the header's SAX events into TensorInfo records, refusing at the first event that breaks
// the schema or a limit. Nothing but the records, the metadata and the names seen is stored.
class HeaderParser {
 public:
  HeaderParser(const std::string& source, uint64_t data_size)
      : source_(source), data_size_(data_size) {}

  // SAX interface (nlohmann::json::sax_parse). Each returns false to stop the parse.
  bool null() { return OnValue(Value{}); }
  bool boolean(bool v) {
    Value value{Value::Kind::kBoolean};
    value.boolean = v;
    return OnValue(value);
  }
  bool number_integer(int64_t v) {
    Value value{Value::Kind::kInteger};
    value.integer = v;
    return OnValue(value);
  }
  bool number_unsigned(uint64_t v) {
    Value value{Value::Kind::kUnsigned};
    value.unsigned_integer = v;
    return OnValue(value);
  }
  bool number_float(double /*v*/, const std::string& text) {
    Value value{Value::Kind::kFloat};
    value.text = &text;
    return OnValue(value);
  }
  bool string(std::string& s) {
    Value value{Value::Kind::kString};
    value.text = &s;
    return OnValue(value);
  }
  bool binary(Json::binary_t& /*v*/) { return Fail("header holds a binary value"); }
  bool start_object(size_t /*elements*/) { return OnValue(Value{Value::Kind::kObject}); }
  bool start_array(size_t /*elements*/) { return OnValue(Value{Value::Kind::kArray}); }
  bool end_object();
  bool end_array();
  bool key(std::string& name);
  bool parse_error(size_t /*position*/, const std::string& /*last_token*/,
                   const Json::exception& e) {
    if (over_limit_) return Fail("");  // reports the tensor count instead
    error_ = Invalid(source_, absl::StrCat("header is not valid JSON: ", e.what()));
    return false;
  }

  // The first error, OK while none.
  const absl::Status& error() const { return error_; }
  // The parsed entries, once the parse succeeded.
  std::deque<TensorInfo>& tensors() { return tensors_; }
  std::map<std::string, std::string>& metadata() { return metadata_; }

 private:
  enum class State {
    kStart,          // before the header object
    kRoot,           // in the header object, before a key or its end
    kRootValue,      // after a tensor name or "__metadata__"
    kEntry,          // in a tensor entry, before a key or its end
    kEntryValue,     // after "dtype", "shape" or "data_offsets"
    kShape,          // in the shape array
    kOffsets,        // in the data_offsets array
    kMetadata,       // in "__metadata__", before a key or its end
    kMetadataValue,  // after a metadata key
    kSkip,           // in an entry past kMaxSafetensorsTensors: counted, not stored
    kDone,           // after the header object
  };
  enum class Field { kDType, kShape, kOffsets };

  bool OnValue(const Value& value);
  bool OnEntryValue(const Value& value);
  bool FinishEntry();

  std::string Named() const { return absl::StrCat("tensor ", Quote(entry_.name)); }
  bool Fail(const std::string& message) {
    if (over_limit_) {
      // Past the limit nothing else is checked: the count is the error worth reporting.
      error_ = Invalid(source_, absl::StrCat("header lists more than ", kMaxSafetensorsTensors,
                                             " tensors (limit ", kMaxSafetensorsTensors,
                                             "); the header is malformed after tensor ",
                                             tensor_count_));
    } else {
      error_ = Invalid(source_, message);
    }
    return false;
  }
  bool OffsetsError(const std::string& got) {
    return Fail(absl::StrCat(Named(),
                             " data_offsets must be two non-negative integers [begin, end], got ",
                             got));
  }

  const std::string& source_;
  const uint64_t data_size_;
  State state_ = State::kStart;
  absl::Status error_;

  // A deque keeps element addresses stable, so `names_` can view the names stored in it.
  std::deque<TensorInfo> tensors_;
  std::unordered_set<std::string_view> names_;
  std::map<std::string, std::string> metadata_;
  bool seen_metadata_ = false;
  bool root_key_is_metadata_ = false;
  std::string metadata_key_;
  size_t tensor_count_ = 0;  // entries seen, stored or not
  bool over_limit_ = false;
  int skip_depth_ = 0;

  // The entry being parsed.
  TensorInfo entry_;
  Field field_ = Field::kDType;
  bool has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
  std::vector<int64_t> dims_;
  size_t rank_ = 0;  // elements seen in the shape array (dims_ keeps at most kMaxRank)
  int64_t numel_ = 1;
  size_t offsets_seen_ = 0;
  uint64_t offsets_[2] = {0, 0};
};

bool HeaderParser::key(std::string& name) {
  switch (state_) {
    case State::kRoot: {
      if (name == "__metadata__") {
        if (seen_metadata_) return Fail("duplicate __metadata__ in the header");
        seen_metadata_ = true;
        root_key_is_metadata_ = true;
        state_ = State::kRootValue;
        return true;
      }
      root_key_is_metadata_ = false;
      if (++tensor_count_ > kMaxSafetensorsTensors) {
        over_limit_ = true;
        state_ = State::kSkip;
        skip_depth_ = 0;
        return true;
      }
      if (name.size() > kMaxTensorNameBytes) {
        return Fail(absl::StrCat("tensor name ", Quote(name), " is ", name.size(),
                                 " bytes, over the limit of ", kMaxTensorNameBytes));
      }
      if (names_.count(name) != 0) {
        return Fail(absl::StrCat("duplicate tensor name ", Quote(name), " in the header"));
      }
      entry_ = TensorInfo();
      entry_.name = std::move(name);
      state_ = State::kRootValue;
      return true;
    }
    case State::kSkip:
      return true;
    case State::kEntry: {
      bool* seen = nullptr;
      if (name == "dtype") {
        field_ = Field::kDType;
        seen = &has_dtype_;
      } else if (name == "shape") {
        field_ = Field::kShape;
        seen = &has_shape_;
      } else if (name == "data_offsets") {
        field_ = Field::kOffsets;
        seen = &has_offsets_;
      } else {
        return Fail(absl::StrCat(Named(), " has unexpected key ", Quote(name),
                                 " (expected exactly dtype, shape, data_offsets)"));
      }
      if (*seen) {
        return Fail(absl::StrCat("duplicate key ", Quote(name), " in header entry ",
                                 Quote(entry_.name)));
      }
      *seen = true;
      state_ = State::kEntryValue;
      return true;
    }
    case State::kMetadata:
      if (name.size() > kMaxTensorNameBytes) {
        return Fail(absl::StrCat("__metadata__ key ", Quote(name), " is ", name.size(),
                                 " bytes, over the limit of ", kMaxTensorNameBytes));
      }
      if (metadata_.count(name) != 0) {
        return Fail(absl::StrCat("duplicate key ", Quote(name), " in header entry '__metadata__'"));
      }
      if (metadata_.size() >= kMaxSafetensorsMetadataEntries) {
        return Fail(absl::StrCat("__metadata__ has more than ", kMaxSafetensorsMetadataEntries,
                                 " entries (limit ", kMaxSafetensorsMetadataEntries, ")"));
      }
      metadata_key_ = std::move(name);
      state_ = State::kMetadataValue;
      return true;
    default:
      return Fail("unexpected key");  // the parser only reports keys inside objects
  }
}

bool HeaderParser::OnValue(const Value& value) {
  const bool is_object = value.kind == Value::Kind::kObject;
  const bool is_container = is_object || value.kind == Value::Kind::kArray;
  switch (state_) {
    case State::kStart:
      if (!is_object) {
        return Fail(absl::StrCat("header must be a JSON object, got ", std::string(value.TypeName())));
      }
      state_ = State::kRoot;
      return true;
    case State::kRootValue:
      if (root_key_is_metadata_) {
        if (!is_object) {
          return Fail(absl::StrCat("__metadata__ must be an object of string -> string, got ",
                                   value.Brief()));
        }
        state_ = State::kMetadata;
        return true;
      }
      if (!is_object) {
        return Fail(absl::StrCat(Named(), " entry must be an object, got ", value.Brief()));
      }
      has_dtype_ = has_shape_ = has_offsets_ = false;
      state_ = State::kEntry;
      return true;
    case State::kEntryValue:
      return OnEntryValue(value);
    case State::kShape: {
      const size_t index = rank_++;
      const std::optional<uint64_t> dim = value.NonNegativeInteger();
      if (!dim) {
        return Fail(absl::StrCat(Named(), " shape dim ", index, " is ",
                                 is_container ? std::string(value.TypeName()) : value.Text(),
                                 "; expected a non-negative integer"));
      }
      // Accumulated in the order Shape::numel() multiplies, so numel() cannot overflow later.
      if (*dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel_, static_cast<int64_t>(*dim), &numel_)) {
        return Fail(absl::StrCat(Named(), " shape has more elements than fit in 64 bits (dim ",
                                 index, " is ", *dim, ")"));
      }
      if (dims_.size() < static_cast<size_t>(Shape::kMaxRank)) {
        dims_.push_back(static_cast<int64_t>(*dim));
      }
      return true;
    }
    case State::kOffsets: {
      const size_t index = offsets_seen_++;
      const std::optional<uint64_t> offset = value.NonNegativeInteger();
      if (!offset) {
        return OffsetsError(absl::StrCat("element ", index, " = ",
                                         is_container ? std::string(value.TypeName())
                                                      : value.Brief()));
      }
      if (index < 2) offsets_[index] = *offset;
      return true;
    }
    case State::kMetadataValue:
      if (value.kind != Value::Kind::kString) {
        const std::string_view type = value.TypeName();
        const bool vowel = type == "array" || type == "object";
        const std::string text = value.Text();
        return Fail(absl::StrCat("__metadata__ key ", Quote(metadata_key_), " has ",
                                 vowel ? "an " : "a ", std::string(type), " value",
                                 text.empty() ? "" : " ", text, "; expected a string"));
      }
      metadata_.emplace(std::move(metadata_key_), *value.text);
      state_ = State::kMetadata;
      return true;
    case State::kSkip:
      if (is_container) {
        // The schema nests two levels below the header object; deeper is not worth walking.
        if (++skip_depth_ > 2) return Fail("");
      } else if (skip_depth_ == 0) {
        state_ = State::kRoot;
      }
      return true;
    default:
      return Fail("unexpected value");  // the parser reports values only where JSON allows them
  }
}

bool HeaderParser::OnEntryValue(const Value& value) {
  switch (field_) {
    case Field::kDType: {
      if (value.kind != Value::Kind::kString) {
        return Fail(absl::StrCat(Named(), " dtype must be a string, got ", value.Brief()));
      }
      const std::optional<DType> dtype = ParseSafetensorsDType(*value.text);
      if (!dtype) {
        return Fail(absl::StrCat(Named(), " has unknown dtype ", value.Text(),
                                 " (known: ", KnownDTypes(), ")"));
      }
      entry_.dtype = *dtype;
      state_ = State::kEntry;
      return true;
    }
    case Field::kShape:
      if (value.kind != Value::Kind::kArray) {
        return Fail(absl::StrCat(Named(), " shape must be an array, got ", value.Brief()));
      }
      dims_.clear();
      rank_ = 0;
      numel_ = 1;
      state_ = State::kShape;
      return true;
    case Field::kOffsets:
      if (value.kind != Value::Kind::kArray) return OffsetsError(value.Brief());
      offsets_seen_ = 0;
      state_ = State::kOffsets;
      return true;
  }
  return Fail("unexpected entry field");
}

bool HeaderParser::end_array() {
  if (state_ == State::kShape) {
    if (rank_ > static_cast<size_t>(Shape::kMaxRank)) {
      return Fail(absl::StrCat(Named(), " shape has rank ", rank_, ", more than the supported ",
                               Shape::kMaxRank));
    }
    Shape::FromSpan(dims_, &entry_.shape);  // rank checked above
    state_ = State::kEntry;
    return true;
  }
  if (state_ == State::kOffsets) {
    if (offsets_seen_ != 2) return OffsetsError(absl::StrCat(offsets_seen_, " elements"));
    entry_.begin = offsets_[0];
    entry_.end = offsets_[1];
    state_ = State::kEntry;
    return true;
  }
  if (state_ == State::kSkip) {
    if (--skip_depth_ == 0) state_ = State::kRoot;
    return true;
  }
  return Fail("unexpected end of array");  // arrays open only in the states above
}

bool HeaderParser::end_object() {
  switch (state_) {
    case State::kEntry:
      if (!FinishEntry()) return false;
      state_ = State::kRoot;
      return true;
    case State::kMetadata:
      state_ = State::kRoot;
      return true;
    case State::kRoot:
      if (over_limit_) {
        error_ = Invalid(source_, absl::StrCat("header lists ", tensor_count_,
                                               " tensors, over the limit of ",
                                               kMaxSafetensorsTensors));
        return false;
      }
      state_ = State::kDone;
      return true;
    case State::kSkip:
      if (--skip_depth_ == 0) state_ = State::kRoot;
      return true;
    default:
      return Fail("unexpected end of object");
  }
}

bool HeaderParser::FinishEntry() {
  if (!has_dtype_) return Fail(absl::StrCat(Named(), " has no 'dtype'"));
  if (!has_shape_) return Fail(absl::StrCat(Named(), " has no 'shape'"));
  if (!has_offsets_) return Fail(absl::StrCat(Named(), " has no 'data_offsets'"));
  TensorInfo& info = entry_;
  const std::string span = absl::StrCat("data_offsets [", info.begin, ", ", info.end, ")");
  if (info.begin > info.end) return Fail(absl::StrCat(Named(), " ", span, " has begin > end"));
  if (info.end > data_size_) {
    return Fail(absl::StrCat(Named(), " ", span, " runs past the end of the data section (",
                             data_size_, " bytes)"));
  }
  uint64_t bytes = 0;
  const std::string dtype(SafetensorsDTypeName(info.dtype));
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel_), DTypeSize(info.dtype), &bytes)) {
    return Fail(absl::StrCat(Named(), " shape ", info.shape.ToString(), " of ", dtype,
                             " has more bytes than fit in 64 bits"));
  }
  if (bytes != info.end - info.begin) {
    return Fail(absl::StrCat(Named(), " shape ", info.shape.ToString(), " of ", dtype, " needs ",
                             bytes, " bytes but ", span, " span ", info.end - info.begin,
                             " bytes"));
  }
  tensors_.push_back(std::move(entry_));
  names_.insert(tensors_.back().name);
  return true;
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

uint64_t LittleEndian64(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// Checks the header length read from the prefix of a file of `file_size` bytes.
absl::Status CheckHeaderLength(uint64_t header_size, uint64_t file_size,
                               const std::string& source) {
  if (header_size == 0) return Invalid(source, "header length is 0");
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return Invalid(source, absl::StrCat("header length ", header_size, " exceeds the cap of ",
                                        kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (header_size > file_size - 8) {
    return Invalid(source, absl::StrCat("header length ", header_size,
                                        " runs past the end of the file (file is ", file_size,
                                        " bytes, header needs ", 8 + header_size, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(
    std::string_view header_json, uint64_t data_size, std::string_view source,
    std::map<std::string, std::string>* metadata) {
  const std::string src(source);
  if (header_json.size() > kMaxSafetensorsHeaderBytes) {
    return Invalid(src, absl::StrCat("header is ", header_json.size(), " bytes, over the cap of ",
                                     kMaxSafetensorsHeaderBytes));
  }
  HeaderParser parser(src, data_size);
  bool parsed = false;
  try {
    parsed = Json::sax_parse(header_json.begin(), header_json.end(), &parser);
  } catch (const Json::exception& e) {  // the SAX parser reports through parse_error
    return Invalid(src, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!parsed) {
    if (!parser.error().ok()) return parser.error();
    return Invalid(src, "header is not valid JSON");
  }
  std::vector<TensorInfo> tensors;
  tensors.reserve(parser.tensors().size());
  for (TensorInfo& info : parser.tensors()) tensors.push_back(std::move(info));
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  EAGLE3_RETURN_IF_ERROR(CheckCoverage(tensors, data_size, src));
  // Handed out only when the whole header is valid.
  if (metadata != nullptr) *metadata = std::move(parser.metadata());
  return tensors;
}

absl::StatusOr<SafetensorsLayout> ParseSafetensorsBuffer(std::span<const uint8_t> file,
                                                         std::string_view source) {
  const std::string src(source);
  if (file.size() < 8) return TooShort(file.size(), src);
  const uint64_t header_size = LittleEndian64(file.data());
  EAGLE3_RETURN_IF_ERROR(CheckHeaderLength(header_size, file.size(), src));
  SafetensorsLayout layout;
  layout.data_offset = 8 + header_size;
  layout.data_size = file.size() - layout.data_offset;
  const std::string_view header(reinterpret_cast<const char*>(file.data()) + 8, header_size);
  EAGLE3_ASSIGN_OR_RETURN(
      layout.tensors, ParseSafetensorsHeader(header, layout.data_size, source, &layout.metadata));
  return layout;
}

SafetensorsFile::SafetensorsFile() = default;
SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  EAGLE3_ASSIGN_OR_RETURN(file_io::File opened,
                          file_io::OpenRegularFile(path, "safetensors file"));
  const uint64_t size = opened.size();
  if (size < 8) return TooShort(size, path);
  uint8_t prefix[8];
  EAGLE3_RETURN_IF_ERROR(opened.ReadAt(0, prefix, sizeof(prefix)));
  const uint64_t header_size = LittleEndian64(prefix);
  EAGLE3_RETURN_IF_ERROR(CheckHeaderLength(header_size, size, path));
  std::string header(static_cast<size_t>(header_size), '\0');
  EAGLE3_RETURN_IF_ERROR(opened.ReadAt(8, header.data(), header.size()));
  EAGLE3_RETURN_IF_ERROR(opened.CheckUnchanged());
  opened.Close();  // readers reopen it; see the class comment

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  SafetensorsLayout& layout = file->layout_;
  layout.data_offset = 8 + header_size;
  layout.data_size = size - layout.data_offset;
  EAGLE3_ASSIGN_OR_RETURN(layout.tensors,
                          ParseSafetensorsHeader(header, layout.data_size, path, &layout.metadata));
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    file->index_.emplace(layout.tensors[i].name, i);
  }
  file->file_ = std::make_unique<const file_io::File>(std::move(opened));
  return file;
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &layout_.tensors[it->second];
}

SafetensorsFile::Reader::Reader(const SafetensorsFile* owner, std::unique_ptr<file_io::File> file)
    : owner_(owner), file_(std::move(file)) {}
SafetensorsFile::Reader::Reader(Reader&&) noexcept = default;
SafetensorsFile::Reader& SafetensorsFile::Reader::operator=(Reader&&) noexcept = default;
SafetensorsFile::Reader::~Reader() = default;

absl::StatusOr<SafetensorsFile::Reader> SafetensorsFile::OpenReader() const {
  EAGLE3_ASSIGN_OR_RETURN(file_io::File reopened, file_->Reopen());
  return Reader(this, std::make_unique<file_io::File>(std::move(reopened)));
}

absl::Status SafetensorsFile::Reader::Read(const TensorInfo& info, uint64_t offset, void* out,
                                           size_t n) const {
  const std::vector<TensorInfo>& tensors = owner_->layout_.tensors;
  if (&info < tensors.data() || &info >= tensors.data() + tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(info.name),
                                                   " is not an entry of '", owner_->path_, "'"));
  }
  const uint64_t bytes = info.end - info.begin;
  if (offset > bytes || n > bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "read of bytes [", offset, ", ", offset + n, ") is outside tensor ", Quote(info.name),
        " (", bytes, " bytes) in '", owner_->path_, "'"));
  }
  const absl::Status status =
      file_->ReadAt(owner_->layout_.data_offset + info.begin + offset, out, n);
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (reading tensor ", Quote(info.name), ")"));
}

absl::Status SafetensorsFile::Reader::CheckUnchanged() const { return file_->CheckUnchanged(); }

absl::Status SafetensorsFile::ReadBytes(const TensorInfo& info, uint64_t offset, void* out,
                                        size_t n) const {
  EAGLE3_ASSIGN_OR_RETURN(const Reader reader, OpenReader());
  EAGLE3_RETURN_IF_ERROR(reader.Read(info, offset, out, n));
  return reader.CheckUnchanged();
}

absl::StatusOr<TensorView> SafetensorsFile::View(std::string_view name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("tensor ", Quote(name), " not found in '", path_, "'"));
  }
  std::lock_guard<std::mutex> lock(views_mutex_);
  auto it = views_.find(name);
  if (it == views_.end()) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(info->dtype, info->shape));
    EAGLE3_RETURN_IF_ERROR(ReadBytes(*info, 0, copy.data(), info->end - info->begin));
    it = views_.emplace(info->name, std::move(copy)).first;
  }
  return it->second.view();
}

}  // namespace eagle3
