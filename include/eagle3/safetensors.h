// Reader for the safetensors format (https://github.com/huggingface/safetensors):
//   [u64 little-endian header length N][N bytes of JSON header][data section]
// The header maps tensor names to {dtype, shape, data_offsets: [begin, end)} (offsets relative to
// the data section) plus an optional "__metadata__" object of string -> string. Every byte of the
// data section must belong to exactly one tensor: overlaps, gaps and unused trailing bytes are
// rejected, as the reference implementation does.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "eagle3/dtype.h"
#include "eagle3/shape.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// Header length cap: a real header is kilobytes to a few megabytes; anything larger is corrupt or
// hostile and would otherwise make us parse arbitrary amounts of JSON.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;  // 100 MiB

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // [begin, end): byte offsets relative to the start of the data section
  uint64_t end = 0;
};

// Result of parsing a whole file image.
struct SafetensorsLayout {
  std::vector<TensorInfo> tensors;              // in data order (see ParseSafetensorsHeader)
  std::map<std::string, std::string> metadata;  // "__metadata__", empty when absent
  uint64_t data_offset = 0;                     // file offset of the data section (8 + N)
  uint64_t data_size = 0;                       // bytes in the data section
};

// Parses and validates the JSON header (the N bytes after the 8-byte length). `data_size` is the
// number of bytes in the data section; `source` names the file in error messages. The returned
// tensors are ordered by data offset (storage order), ties (empty tensors) by name. `metadata`
// (optional, may be null) receives "__metadata__". Errors are InvalidArgument.
absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(
    std::string_view header_json, uint64_t data_size, std::string_view source,
    std::map<std::string, std::string>* metadata = nullptr);

// Parses a whole file image (length prefix, header, and the bounds of the data section). `file`:
// the complete file contents; only the length prefix and header are read. Used by
// SafetensorsFile::Open and by the fuzzer, so both exercise the same checks.
absl::StatusOr<SafetensorsLayout> ParseSafetensorsBuffer(std::span<const uint8_t> file,
                                                         std::string_view source);

// A safetensors file mapped read-only into memory. Not copyable or movable (views point into it);
// own it through the unique_ptr that Open returns. All const methods are thread-safe. The mapping
// stays valid for the object's lifetime; truncating the file on disk meanwhile is undefined (the
// OS raises SIGBUS on access), as with any mmap reader.
class SafetensorsFile {
 public:
  // Errors: NotFound (no such file), PermissionDenied, FailedPrecondition (not a regular file),
  // InvalidArgument (malformed contents, message names the file and the offending item).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Ordered by data offset (the order the bytes sit in the file), ties by name.
  const std::vector<TensorInfo>& tensors() const { return layout_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return layout_.metadata; }

  // nullptr when the file holds no tensor of that name.
  const TensorInfo* Find(std::string_view name) const;

  // Read-only host view of the tensor's bytes (contiguous, the file's dtype and shape); writing
  // through it faults. Valid while this object lives. Safetensors offsets need not be aligned, and
  // a misaligned typed pointer is undefined behaviour, so: when the bytes sit at an address aligned
  // to the element size (always so for files from WriteSafetensors or the safetensors library,
  // which order tensors by decreasing element size after an 8-byte padded header), the view points
  // into the mapping (zero-copy); otherwise the first call copies the tensor once into an aligned
  // buffer owned by this object and later calls return that. NotFound names the tensor and file.
  absl::StatusOr<TensorView> View(std::string_view name) const;

  // Raw bytes of a tensor inside the mapping, with no alignment guarantee: `info` must come from
  // this file's tensors() / Find(). For readers that copy (memcpy) rather than dereference.
  const uint8_t* RawData(const TensorInfo& info) const {
    return base_ + layout_.data_offset + info.begin;
  }

 private:
  SafetensorsFile() = default;

  std::string path_;
  const uint8_t* base_ = nullptr;  // start of the mapping (the file's first byte)
  size_t mapped_size_ = 0;
  SafetensorsLayout layout_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in layout_.tensors

  // Aligned copies of tensors whose bytes are misaligned in the mapping (see View).
  mutable std::mutex aligned_copies_mutex_;
  mutable std::map<std::string, Tensor, std::less<>> aligned_copies_;
};

}  // namespace eagle3
