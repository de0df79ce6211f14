#include "eagle3/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "file_io.h"
#include "nlohmann/json.hpp"
#include "tensor_reads.h"
#include "thread_pool.h"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// Messages quote at most this much of a name.
constexpr size_t kMaxQuoted = 256;

// Debian's abseil has its own string_view, so std::string_view goes through this explicitly.
std::string Quote(std::string_view s) {
  const bool cut = s.size() > kMaxQuoted;
  if (cut) s = s.substr(0, kMaxQuoted);
  return absl::StrCat("'", absl::string_view(s.data(), s.size()), cut ? "...'" : "'");
}

// A shard name from the index must stay inside the checkpoint directory.
bool IsSafeRelativePath(const std::string& name) {
  if (name.empty()) return false;
  const fs::path p(name);
  if (p.is_absolute()) return false;
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  return true;
}

// Streams an index's SAX events into tensor -> shard, storing nothing but weight_map.
class IndexParser {
 public:
  explicit IndexParser(std::string_view source) : source_(source) {}

  bool null() { return OnScalar("null", nullptr); }
  bool boolean(bool /*v*/) { return OnScalar("boolean", nullptr); }
  bool number_integer(int64_t /*v*/) { return OnScalar("number", nullptr); }
  bool number_unsigned(uint64_t /*v*/) { return OnScalar("number", nullptr); }
  bool number_float(double /*v*/, const std::string& /*text*/) {
    return OnScalar("number", nullptr);
  }
  bool string(std::string& s) { return OnScalar("string", &s); }
  bool binary(Json::binary_t& /*v*/) { return Fail("the index holds a binary value"); }
  bool start_object(size_t /*elements*/) { return OnContainer("object"); }
  bool start_array(size_t /*elements*/) { return OnContainer("array"); }
  bool end_object() { return OnEnd(); }
  bool end_array() { return OnEnd(); }
  bool key(std::string& name);
  bool parse_error(size_t /*position*/, const std::string& /*last_token*/,
                   const Json::exception& e) {
    if (over_limit_) return Fail("");
    return Fail(absl::StrCat("index is not valid JSON: ", e.what()));
  }

  const absl::Status& error() const { return error_; }
  bool has_weight_map() const { return has_weight_map_; }
  std::map<std::string, std::string>& weight_map() { return weight_map_; }

 private:
  enum class State {
    kStart,           // before the top-level object
    kRoot,            // in the top-level object, before a key or its end
    kRootValue,       // after a top-level key
    kWeightMap,       // in weight_map, before a key or its end
    kWeightMapValue,  // after a tensor name
    kSkip,            // in a value that is not stored
    kDone,
  };

  bool Fail(std::string_view message) {
    const absl::string_view m(message.data(), message.size());
    error_ = absl::InvalidArgumentError(
        over_limit_ ? absl::StrCat(source_, ": index 'weight_map' lists more than ",
                                   kMaxSafetensorsIndexTensors, " tensors (limit ",
                                   kMaxSafetensorsIndexTensors,
                                   "); the index is malformed after entry ", entries_)
                    : absl::StrCat(source_, ": ", m));
    return false;
  }
  bool OnScalar(std::string_view type, const std::string* text);
  bool OnContainer(std::string_view type);
  bool OnEnd();
  bool EnterSkip(State back);

  const std::string source_;
  State state_ = State::kStart;
  absl::Status error_;
  std::map<std::string, std::string> weight_map_;
  bool has_weight_map_ = false;
  bool root_key_is_weight_map_ = false;
  std::string tensor_;       // the weight_map key awaiting its shard
  size_t entries_ = 0;       // weight_map entries seen, stored or not
  bool over_limit_ = false;
  State skip_return_ = State::kRoot;  // where a skipped value ends up
  int skip_depth_ = 0;                // open containers inside the skipped value
};

bool IndexParser::key(std::string& name) {
  switch (state_) {
    case State::kRoot:
      root_key_is_weight_map_ = name == "weight_map";
      if (root_key_is_weight_map_ && has_weight_map_) {
        return Fail("index has 'weight_map' twice");
      }
      state_ = State::kRootValue;
      return true;
    case State::kWeightMap:
      if (++entries_ > kMaxSafetensorsIndexTensors) {
        over_limit_ = true;
        skip_depth_ = 0;
        skip_return_ = State::kWeightMap;
        state_ = State::kSkip;
        return true;
      }
      if (name.size() > kMaxTensorNameBytes) {
        return Fail(absl::StrCat("weight_map tensor name ", Quote(name), " is ", name.size(),
                                 " bytes, over the limit of ", kMaxTensorNameBytes));
      }
      if (weight_map_.count(name) != 0) {
        return Fail(absl::StrCat("weight_map lists tensor ", Quote(name), " twice"));
      }
      tensor_ = std::move(name);
      state_ = State::kWeightMapValue;
      return true;
    case State::kSkip:
      return true;
    default:
      return Fail("unexpected key");  // the parser only reports keys inside objects
  }
}

bool IndexParser::EnterSkip(State back) {
  skip_return_ = back;
  skip_depth_ = 1;
  state_ = State::kSkip;
  return true;
}

bool IndexParser::OnContainer(std::string_view type) {
  switch (state_) {
    case State::kStart:
      if (type != "object") {
        return Fail(absl::StrCat("index must be a JSON object, got ",
                                 absl::string_view(type.data(), type.size())));
      }
      state_ = State::kRoot;
      return true;
    case State::kRootValue:
      if (!root_key_is_weight_map_) return EnterSkip(State::kRoot);
      if (type != "object") {
        return Fail(absl::StrCat("index 'weight_map' must be an object, got ",
                                 absl::string_view(type.data(), type.size())));
      }
      has_weight_map_ = true;
      state_ = State::kWeightMap;
      return true;
    case State::kWeightMapValue:
      return Fail(absl::StrCat("weight_map entry for tensor ", Quote(tensor_),
                               " must be a file name string, got ",
                               absl::string_view(type.data(), type.size())));
    case State::kSkip:
      // Depth counts from the top-level object, which holds the skipped value.
      if (++skip_depth_ + 1 > kMaxSafetensorsIndexDepth) {
        return Fail(absl::StrCat("index JSON nests deeper than ", kMaxSafetensorsIndexDepth,
                                 " levels"));
      }
      return true;
    default:
      return Fail("unexpected value");
  }
}

bool IndexParser::OnScalar(std::string_view type, const std::string* text) {
  switch (state_) {
    case State::kStart:
      return Fail(absl::StrCat("index must be a JSON object, got ",
                               absl::string_view(type.data(), type.size())));
    case State::kRootValue:
      if (root_key_is_weight_map_) {
        return Fail(absl::StrCat("index 'weight_map' must be an object, got ",
                                 absl::string_view(type.data(), type.size())));
      }
      state_ = State::kRoot;
      return true;
    case State::kWeightMapValue: {
      if (text == nullptr) {
        return Fail(absl::StrCat("weight_map entry for tensor ", Quote(tensor_),
                                 " must be a file name string, got ",
                                 absl::string_view(type.data(), type.size())));
      }
      if (text->size() > kMaxTensorNameBytes || !IsSafeRelativePath(*text)) {
        return Fail(absl::StrCat("weight_map entry for tensor ", Quote(tensor_), " names shard ",
                                 Quote(*text),
                                 ", which is not a relative path inside the checkpoint"));
      }
      weight_map_.emplace(std::move(tensor_), *text);
      state_ = State::kWeightMap;
      return true;
    }
    case State::kSkip:
      if (skip_depth_ == 0) state_ = skip_return_;
      return true;
    default:
      return Fail("unexpected value");
  }
}

bool IndexParser::OnEnd() {
  switch (state_) {
    case State::kWeightMap:
      if (over_limit_) {
        error_ = absl::InvalidArgumentError(
            absl::StrCat(source_, ": index 'weight_map' lists ", entries_,
                         " tensors, over the limit of ", kMaxSafetensorsIndexTensors));
        return false;
      }
      state_ = State::kRoot;
      return true;
    case State::kRoot:
      state_ = State::kDone;
      return true;
    case State::kSkip:
      if (--skip_depth_ == 0) state_ = skip_return_;
      return true;
    default:
      return Fail("unexpected end of a container");
  }
}

absl::StatusOr<std::string> ReadIndexFile(const std::string& path) {
  return file_io::ReadRegularFile(path, kMaxSafetensorsIndexBytes, "safetensors index");
}

bool IsFloatTarget(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

bool CanConvert(DType from, DType to) {
  if (from == to) return true;
  if (IsFloatingPoint(from) && IsFloatTarget(to)) return true;
  return (from == DType::kI32 && to == DType::kI64) || (from == DType::kI64 && to == DType::kI32);
}

bool IsAligned(const void* p, DType dtype) {
  return reinterpret_cast<uintptr_t>(p) % DTypeSize(dtype) == 0;
}

// A shard viewed as [outer, split, inner] over the tensor [outer, n, inner].
struct ShardPlan {
  Shape shape;         // the slice's shape
  int64_t outer = 1;   // product of dims before the split dim
  int64_t inner = 1;   // product of dims after it
  int64_t n = 0;       // real size of the split dim
  int64_t start = 0;   // first index of this rank's block along the split dim
  int64_t length = 0;  // block length (padded size / tp_size)
  int64_t real = 0;    // indices of the block that exist in the tensor; the rest is padding
};

std::string Where(std::string_view name, const SafetensorsFile& file) {
  return absl::StrCat("tensor ", Quote(name), " in ", Quote(file.path()));
}

absl::Status CheckConvertible(std::string_view name, const SafetensorsFile& file, DType from,
                              DType to) {
  if (CanConvert(from, to)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("cannot convert ", Where(name, file), " from ",
                                                 std::string(DTypeName(from)), " to ",
                                                 std::string(DTypeName(to))));
}

absl::Status CheckHostAllocator(std::string_view name, const Allocator& allocator) {
  if (allocator.device().is_cpu()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("reading tensor ", Quote(name),
                                                 " needs a host allocator, got ",
                                                 allocator.device().ToString()));
}

// Tensor::Empty for a read of tensor `name`; an allocation failure (a host allocator out of memory,
// an UploadRing's fence failing) names the tensor.
absl::StatusOr<Tensor> EmptyFor(std::string_view name, DType dtype, const Shape& shape, Allocator& allocator) {
  absl::StatusOr<Tensor> out = Tensor::Empty(dtype, shape, allocator);
  if (out.ok()) return out;
  return absl::Status(out.status().code(),
                      absl::StrCat("reading tensor ", Quote(name), ": ", out.status().message()));
}

absl::StatusOr<ShardPlan> PlanShard(std::string_view name, const SafetensorsFile& file,
                                    const TensorInfo& info, const ShardSpec& spec) {
  const std::string where = Where(name, file);
  const Shape& shape = info.shape;
  if (spec.tp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": tp_size ", spec.tp_size, " must be >= 1"));
  }
  if (spec.rank < 0 || spec.rank >= spec.tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": rank ", spec.rank, " is out of range [0, ", spec.tp_size, ")"));
  }
  if (spec.dim < 0 || spec.dim >= shape.rank()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": shard dim ", spec.dim,
                                                   " is out of range for shape ", shape.ToString(),
                                                   " (rank ", shape.rank(), ")"));
  }
  if (spec.pad_to_multiple < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": pad_to_multiple ", spec.pad_to_multiple, " must be >= 1"));
  }
  if (spec.pad_to_multiple > 1 && spec.pad_to_multiple % spec.tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": pad_to_multiple ",
                                                   spec.pad_to_multiple,
                                                   " is not a multiple of tp_size ", spec.tp_size));
  }
  ShardPlan plan;
  plan.n = shape[spec.dim];
  if (plan.n > std::numeric_limits<int64_t>::max() - (spec.pad_to_multiple - 1)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": dim ", spec.dim, " = ", plan.n,
                                                   " padded to a multiple of ",
                                                   spec.pad_to_multiple, " overflows int64"));
  }
  const int64_t padded = PaddedSize(plan.n, spec.pad_to_multiple);
  if (padded % spec.tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quote(name), " dim ", spec.dim, " = ",
                                                   plan.n, " is not divisible by tp_size ",
                                                   spec.tp_size, " (in ", Quote(file.path()), ")"));
  }
  plan.length = padded / spec.tp_size;
  plan.start = plan.length * spec.rank;
  plan.real = std::clamp<int64_t>(plan.n - plan.start, 0, plan.length);
  for (int i = 0; i < spec.dim; ++i) plan.outer *= shape[i];
  for (int i = spec.dim + 1; i < shape.rank(); ++i) plan.inner *= shape[i];
  plan.shape = shape;
  plan.shape[spec.dim] = plan.length;
  int64_t elements = 0;  // the source shape's numel is known to fit; the padded one may not
  if (__builtin_mul_overflow(plan.outer, plan.length, &elements) ||
      __builtin_mul_overflow(elements, plan.inner, &elements)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": shard shape ", plan.shape.ToString(), " overflows int64"));
  }
  return plan;
}

// Whether something exists at `path` (stat only: never opens, so never blocks). Errors other than
// "no such entry" (e.g. permission denied on the directory) are reported, not taken for absence.
absl::StatusOr<bool> Exists(const fs::path& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) return false;
  if (ec) {
    return absl::ErrnoToStatus(ec.value(), absl::StrCat(path.string(), ": cannot stat"));
  }
  return true;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseSafetensorsIndex(std::string_view text,
                                                                         std::string_view source) {
  const std::string src(source);
  if (text.size() > kMaxSafetensorsIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": index is ", text.size(),
                                                   " bytes, over the limit of ",
                                                   kMaxSafetensorsIndexBytes));
  }
  IndexParser parser(src);
  bool parsed = false;
  try {
    parsed = Json::sax_parse(text.begin(), text.end(), &parser);
  } catch (const Json::exception& e) {  // the SAX parser reports through parse_error
    return absl::InvalidArgumentError(
        absl::StrCat(src, ": index is not valid JSON: ", e.what()));
  }
  if (!parsed) {
    if (!parser.error().ok()) return parser.error();
    return absl::InvalidArgumentError(absl::StrCat(src, ": index is not valid JSON"));
  }
  if (!parser.has_weight_map()) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": index has no 'weight_map'"));
  }
  if (parser.weight_map().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(src, ": index 'weight_map' is empty"));
  }
  return std::move(parser.weight_map());
}

int64_t PaddedSize(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

int DefaultCheckpointReadThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
}

Checkpoint::Checkpoint() = default;
Checkpoint::~Checkpoint() = default;

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir,
                                                             const CheckpointReadOptions& options) {
  if (options.threads < 0 || options.threads > kMaxCheckpointReadThreads) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint ", Quote(dir), ": read threads ", options.threads,
                                                   " is out of range [0, ", kMaxCheckpointReadThreads,
                                                   "] (0 = the default, ", DefaultCheckpointReadThreads(), ")"));
  }
  std::error_code ec;
  const fs::file_status dir_status = fs::status(dir, ec);
  if (dir_status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", Quote(dir),
                                            " does not exist"));
  }
  if (ec) {
    return absl::ErrnoToStatus(ec.value(),
                               absl::StrCat("checkpoint directory ", Quote(dir), ": cannot stat"));
  }
  if (dir_status.type() != fs::file_type::directory) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory ", Quote(dir), " is not a directory"));
  }
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->dir_ = dir;
  checkpoint->read_threads_ = options.threads == 0 ? DefaultCheckpointReadThreads() : options.threads;
  if (checkpoint->read_threads_ > 1) checkpoint->pool_ = std::make_unique<ThreadPool>(checkpoint->read_threads_);
  const fs::path single = fs::path(dir) / kSingleFileName;
  const fs::path index = fs::path(dir) / kIndexFileName;

  // A FIFO, directory or device under either name exists here and is refused, without blocking,
  // by the open below.
  EAGLE3_ASSIGN_OR_RETURN(const bool has_single, Exists(single));
  if (has_single) {
    EAGLE3_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single.string()));
    for (const TensorInfo& info : file->tensors()) {
      checkpoint->tensors_.emplace(info.name, Entry{file.get(), &info});
    }
    checkpoint->files_.push_back(std::move(file));
    return checkpoint;
  }
  EAGLE3_ASSIGN_OR_RETURN(const bool has_index, Exists(index));
  if (!has_index) {
    return absl::NotFoundError(absl::StrCat("no ", std::string(kSingleFileName), " or ",
                                            std::string(kIndexFileName),
                                            " in checkpoint directory ", Quote(dir)));
  }

  const std::string index_path = index.string();
  EAGLE3_ASSIGN_OR_RETURN(std::string text, ReadIndexFile(index_path));
  EAGLE3_ASSIGN_OR_RETURN(auto weight_map, ParseSafetensorsIndex(text, index_path));
  text = std::string();  // the index text is not needed past the parse

  // Shard -> first tensor the index maps to it (named when the shard is missing).
  std::map<std::string, std::string> shards;
  for (const auto& [tensor, shard] : weight_map) shards.emplace(shard, tensor);

  std::map<std::string, std::string, std::less<>> holder;  // tensor -> shard that stores it
  for (const auto& [shard, first_tensor] : shards) {
    const fs::path path = fs::path(dir) / shard;
    EAGLE3_ASSIGN_OR_RETURN(const bool has_shard, Exists(path));
    if (!has_shard) {
      return absl::NotFoundError(absl::StrCat("shard ", Quote(shard), " (holding tensor ",
                                              Quote(first_tensor), " per ", Quote(index_path),
                                              ") not found in ", Quote(dir)));
    }
    EAGLE3_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path.string()));
    for (const TensorInfo& info : file->tensors()) {
      auto [it, inserted] = holder.emplace(info.name, shard);
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", Quote(info.name), " is stored in both shard ",
                         Quote(it->second), " and shard ", Quote(shard), " of ", Quote(dir)));
      }
      checkpoint->tensors_.emplace(info.name, Entry{file.get(), &info});
    }
    checkpoint->files_.push_back(std::move(file));
  }
  for (const auto& [tensor, shard] : weight_map) {
    auto it = holder.find(tensor);
    if (it == holder.end()) {
      return absl::NotFoundError(absl::StrCat("tensor ", Quote(tensor), " is mapped to shard ",
                                              Quote(shard), " by ", Quote(index_path),
                                              " but that shard does not contain it"));
    }
    if (it->second != shard) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quote(tensor), " is mapped to shard ", Quote(shard), " by ",
                       Quote(index_path), " but is stored in shard ", Quote(it->second)));
    }
  }
  for (const auto& [tensor, shard] : holder) {
    if (!weight_map.contains(tensor)) {
      return absl::InvalidArgumentError(absl::StrCat("shard ", Quote(shard), " holds tensor ",
                                                     Quote(tensor), " that ", Quote(index_path),
                                                     " does not list"));
    }
  }
  return checkpoint;
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

bool Checkpoint::Has(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

absl::StatusOr<Checkpoint::Entry> Checkpoint::Lookup(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor ", Quote(name), " not found in checkpoint ", Quote(dir_)));
  }
  return it->second;
}

absl::StatusOr<TensorInfo> Checkpoint::Info(std::string_view name) const {
  EAGLE3_ASSIGN_OR_RETURN(Entry entry, Lookup(name));
  return *entry.info;
}

absl::StatusOr<std::string> Checkpoint::FileOf(std::string_view name) const {
  EAGLE3_ASSIGN_OR_RETURN(Entry entry, Lookup(name));
  return entry.file->path();
}

absl::StatusOr<TensorView> Checkpoint::View(std::string_view name) const {
  EAGLE3_ASSIGN_OR_RETURN(Entry entry, Lookup(name));
  return entry.file->View(name);
}

absl::Status Checkpoint::ExpectShape(std::string_view name, const Shape& expected) const {
  EAGLE3_ASSIGN_OR_RETURN(Entry entry, Lookup(name));
  if (entry.info->shape == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", Quote(name), " in ", Quote(entry.file->path()), " has shape ",
                   entry.info->shape.ToString(), ", expected ", expected.ToString()));
}

absl::StatusOr<Shape> Checkpoint::ShardShape(std::string_view name, const ShardSpec& spec) const {
  EAGLE3_ASSIGN_OR_RETURN(Entry entry, Lookup(name));
  EAGLE3_ASSIGN_OR_RETURN(ShardPlan plan, PlanShard(name, *entry.file, *entry.info, spec));
  return plan.shape;
}

absl::StatusOr<Tensor> Checkpoint::Read(std::string_view name, DType dtype,
                                        Allocator& allocator) const {
  EAGLE3_ASSIGN_OR_RETURN(Entry entry, Lookup(name));
  EAGLE3_RETURN_IF_ERROR(CheckConvertible(name, *entry.file, entry.info->dtype, dtype));
  EAGLE3_RETURN_IF_ERROR(CheckHostAllocator(name, allocator));
  EAGLE3_ASSIGN_OR_RETURN(Tensor out, EmptyFor(name, dtype, entry.info->shape, allocator));
  EAGLE3_ASSIGN_OR_RETURN(const SafetensorsFile::Reader reader, entry.file->OpenReader());
  const int64_t numel = entry.info->shape.numel();
  const ElementRuns all{.first = 0, .run = numel, .stride = numel, .count = 1, .dst_stride = numel};
  EAGLE3_RETURN_IF_ERROR(
      ReadElementRuns(reader, *entry.info, all, out.data(), dtype, pool_.get(), Where(name, *entry.file)));
  EAGLE3_RETURN_IF_ERROR(reader.CheckUnchanged());
  return out;
}

absl::StatusOr<Tensor> Checkpoint::ReadShard(std::string_view name, const ShardSpec& spec,
                                             DType dtype, Allocator& allocator) const {
  EAGLE3_RETURN_IF_ERROR(CheckHostAllocator(name, allocator));
  EAGLE3_ASSIGN_OR_RETURN(Shape shape, ShardShape(name, spec));
  EAGLE3_ASSIGN_OR_RETURN(Tensor out, EmptyFor(name, dtype, shape, allocator));
  EAGLE3_RETURN_IF_ERROR(ReadShardInto(name, spec, out));
  return out;
}

absl::StatusOr<Tensor> Checkpoint::ReadColumns(std::string_view name, int64_t begin, int64_t end, DType dtype,
                                               Allocator& allocator) const {
  EAGLE3_ASSIGN_OR_RETURN(Entry entry, Lookup(name));
  const SafetensorsFile& file = *entry.file;
  const TensorInfo& info = *entry.info;
  const std::string where = Where(name, file);
  if (info.shape.rank() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a column range needs a 2-D tensor, its shape is ", info.shape.ToString()));
  }
  const int64_t rows = info.shape[0], columns = info.shape[1];
  if (begin < 0 || begin > end || end > columns) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": columns [", begin, ", ", end,
                                                   ") are outside [0, ", columns, "] of shape ",
                                                   info.shape.ToString()));
  }
  EAGLE3_RETURN_IF_ERROR(CheckConvertible(name, file, info.dtype, dtype));
  EAGLE3_RETURN_IF_ERROR(CheckHostAllocator(name, allocator));
  EAGLE3_ASSIGN_OR_RETURN(Tensor out, EmptyFor(name, dtype, Shape{rows, end - begin}, allocator));
  const int64_t width = end - begin;
  if (width == 0) return out;
  EAGLE3_ASSIGN_OR_RETURN(const SafetensorsFile::Reader reader, file.OpenReader());
  const ElementRuns runs{.first = begin, .run = width, .stride = columns, .count = rows, .dst_stride = width};
  EAGLE3_RETURN_IF_ERROR(ReadElementRuns(reader, info, runs, out.data(), dtype, pool_.get(), where));
  EAGLE3_RETURN_IF_ERROR(reader.CheckUnchanged());
  return out;
}

absl::Status Checkpoint::ReadShardInto(std::string_view name, const ShardSpec& spec,
                                       const TensorView& out) const {
  EAGLE3_ASSIGN_OR_RETURN(Entry entry, Lookup(name));
  const SafetensorsFile& file = *entry.file;
  const TensorInfo& info = *entry.info;
  EAGLE3_ASSIGN_OR_RETURN(ShardPlan plan, PlanShard(name, file, info, spec));
  const std::string where = Where(name, file);
  if (!out.device().is_cpu() || !out.is_contiguous() || !(out.shape() == plan.shape) ||
      (out.data() == nullptr && out.numel() > 0) || !IsAligned(out.data(), out.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": shard output must be a host, contiguous, element-aligned tensor of shape ",
        plan.shape.ToString(), ", got ", out.ToString(),
        out.is_contiguous() ? "" : " (non-contiguous)"));
  }
  EAGLE3_RETURN_IF_ERROR(CheckConvertible(name, file, info.dtype, out.dtype()));

  const size_t dst_size = DTypeSize(out.dtype());
  uint8_t* dst = static_cast<uint8_t*>(out.data());
  const int64_t copy = plan.real * plan.inner;
  const int64_t pad = (plan.length - plan.real) * plan.inner;
  EAGLE3_ASSIGN_OR_RETURN(const SafetensorsFile::Reader reader, file.OpenReader());
  // One run per outer index: the whole block for dim 0, a column block per row for 1.
  const ElementRuns runs{.first = plan.start * plan.inner,
                         .run = copy,
                         .stride = plan.n * plan.inner,
                         .count = plan.outer,
                         .dst_stride = plan.length * plan.inner};
  EAGLE3_RETURN_IF_ERROR(ReadElementRuns(reader, info, runs, dst, out.dtype(), pool_.get(), where));
  if (pad > 0) {
    for (int64_t o = 0; o < plan.outer; ++o) {
      std::memset(dst + (o * plan.length * plan.inner + copy) * dst_size, 0, pad * dst_size);
    }
  }
  return reader.CheckUnchanged();
}

}  // namespace eagle3
