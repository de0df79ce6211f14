#include "eagle3/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "eagle3/tensor_convert.h"
#include "nlohmann/json.hpp"

namespace eagle3 {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// An index lists tensor names and shard files: megabytes even for the largest models.
constexpr uintmax_t kMaxIndexBytes = uintmax_t{256} << 20;
// Misaligned sources are converted through an aligned scratch buffer of this many bytes.
constexpr size_t kBounceBytes = size_t{64} << 10;

// Debian's abseil has its own string_view, so std::string_view goes through this explicitly.
std::string Quote(std::string_view s) {
  return absl::StrCat("'", absl::string_view(s.data(), s.size()), "'");
}

absl::StatusOr<std::string> ReadIndexFile(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot stat ", Quote(path.string())));
  }
  if (size > kMaxIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Quote(path.string()), " is ", size, " bytes, over the index cap of ", kMaxIndexBytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", Quote(path.string())));
  }
  return text;
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

// Parses the index into tensor -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> ParseIndex(const std::string& text,
                                                              const std::string& source) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": index is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": index must be a JSON object, got ", root.type_name()));
  }
  auto it = root.find("weight_map");
  if (it == root.end()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": index has no 'weight_map'"));
  }
  if (!it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": index 'weight_map' must be an object, got ", it->type_name()));
  }
  if (it->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": index 'weight_map' is empty"));
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, shard] : it->items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": weight_map entry for tensor ", Quote(tensor),
                       " must be a file name string, got ", shard.type_name()));
    }
    std::string file = shard.get<std::string>();
    if (!IsSafeRelativePath(file)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": weight_map entry for tensor ", Quote(tensor), " names shard ",
                       Quote(file), ", which is not a relative path inside the checkpoint"));
    }
    weight_map.emplace(tensor, std::move(file));
  }
  return weight_map;
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

// Converts `n` elements from `src` (any alignment; e.g. inside the mapping) to `dst` (aligned).
// `bounce` is scratch for misaligned sources, sized on first use and reused across calls.
absl::Status CopyConvert(const uint8_t* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                         std::vector<uint64_t>& bounce) {
  if (n == 0) return absl::OkStatus();
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(n) * DTypeSize(src_dtype));
    return absl::OkStatus();
  }
  if (IsAligned(src, src_dtype)) {
    return ConvertTensor(TensorView(const_cast<uint8_t*>(src), src_dtype, Shape{n}),
                         TensorView(dst, dst_dtype, Shape{n}));
  }
  // A typed load from a misaligned address is undefined behaviour: stage through aligned memory.
  bounce.resize(kBounceBytes / sizeof(uint64_t));
  const int64_t block = static_cast<int64_t>(kBounceBytes / DTypeSize(src_dtype));
  for (int64_t i = 0; i < n; i += block) {
    const int64_t count = std::min(block, n - i);
    std::memcpy(bounce.data(), src + i * DTypeSize(src_dtype),
                static_cast<size_t>(count) * DTypeSize(src_dtype));
    EAGLE3_RETURN_IF_ERROR(
        ConvertTensor(TensorView(bounce.data(), src_dtype, Shape{count}),
                      TensorView(static_cast<uint8_t*>(dst) + i * DTypeSize(dst_dtype), dst_dtype,
                                 Shape{count})));
  }
  return absl::OkStatus();
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

}  // namespace

int64_t PaddedSize(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint directory ", Quote(dir), " does not exist or is not a directory"));
  }
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->dir_ = dir;
  const fs::path single = fs::path(dir) / kSingleFileName;
  const fs::path index = fs::path(dir) / kIndexFileName;

  if (fs::exists(single, ec)) {
    EAGLE3_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single.string()));
    for (const TensorInfo& info : file->tensors()) {
      checkpoint->tensors_.emplace(info.name, Entry{file.get(), &info});
    }
    checkpoint->files_.push_back(std::move(file));
    return checkpoint;
  }
  if (!fs::exists(index, ec)) {
    return absl::NotFoundError(absl::StrCat("no ", std::string(kSingleFileName), " or ",
                                            std::string(kIndexFileName),
                                            " in checkpoint directory ", Quote(dir)));
  }

  const std::string index_path = index.string();
  EAGLE3_ASSIGN_OR_RETURN(std::string text, ReadIndexFile(index));
  EAGLE3_ASSIGN_OR_RETURN(auto weight_map, ParseIndex(text, index_path));

  // Shard -> first tensor the index maps to it (named when the shard is missing).
  std::map<std::string, std::string> shards;
  for (const auto& [tensor, shard] : weight_map) shards.emplace(shard, tensor);

  std::map<std::string, std::string, std::less<>> holder;  // tensor -> shard that stores it
  for (const auto& [shard, first_tensor] : shards) {
    const fs::path path = fs::path(dir) / shard;
    if (!fs::exists(path, ec)) {
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
  EAGLE3_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(dtype, entry.info->shape, allocator));
  std::vector<uint64_t> bounce;
  const absl::Status status = CopyConvert(entry.file->RawData(*entry.info), entry.info->dtype,
                                          out.data(), dtype, entry.info->shape.numel(), bounce);
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat(Where(name, *entry.file), ": ", status.message()));
  }
  return out;
}

absl::StatusOr<Tensor> Checkpoint::ReadShard(std::string_view name, const ShardSpec& spec,
                                             DType dtype, Allocator& allocator) const {
  EAGLE3_RETURN_IF_ERROR(CheckHostAllocator(name, allocator));
  EAGLE3_ASSIGN_OR_RETURN(Shape shape, ShardShape(name, spec));
  EAGLE3_ASSIGN_OR_RETURN(Tensor out, Tensor::Empty(dtype, shape, allocator));
  EAGLE3_RETURN_IF_ERROR(ReadShardInto(name, spec, out));
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

  const size_t src_size = DTypeSize(info.dtype);
  const size_t dst_size = DTypeSize(out.dtype());
  const uint8_t* src = file.RawData(info);
  uint8_t* dst = static_cast<uint8_t*>(out.data());
  const int64_t copy = plan.real * plan.inner;
  const int64_t pad = (plan.length - plan.real) * plan.inner;
  std::vector<uint64_t> bounce;
  // One contiguous run per outer index: the whole block for dim 0, a column block per row for 1.
  for (int64_t o = 0; o < plan.outer; ++o) {
    const int64_t dst_offset = o * plan.length * plan.inner;
    if (copy > 0) {
      const int64_t src_offset = (o * plan.n + plan.start) * plan.inner;
      const absl::Status status =
          CopyConvert(src + src_offset * src_size, info.dtype, dst + dst_offset * dst_size,
                      out.dtype(), copy, bounce);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat(where, " (run starting at element ",
                                                        src_offset, "): ", status.message()));
      }
    }
    if (pad > 0) std::memset(dst + (dst_offset + copy) * dst_size, 0, pad * dst_size);
  }
  return absl::OkStatus();
}

}  // namespace eagle3
