// Reader for the safetensors format (https://github.com/huggingface/safetensors):
//   [u64 little-endian header length N][N bytes of JSON header][data section]
// The header maps tensor names to {dtype, shape, data_offsets: [begin, end)} (offsets relative to
// the data section) plus an optional "__metadata__" object of string -> string. Every byte of the
// data section must belong to exactly one tensor: overlaps, gaps and unused trailing bytes are
// rejected, as the reference implementation does.
//
// Headers are untrusted input. They are parsed in one streaming (SAX) pass, linear in the header
// size, straight into TensorInfo records: no JSON tree is built, and a value of the wrong type is
// refused at its first byte, so nesting never exceeds the schema's three levels (header object,
// tensor entry, shape / data_offsets array). The limits below bound time and memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/dtype.h"
#include "eagle3/export.h"
#include "eagle3/shape.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

namespace file_io {
class File;  // src/file_io.h
}  // namespace file_io

// Header length cap: a real header is kilobytes to a few megabytes; anything larger is corrupt or
// hostile and would otherwise make us parse arbitrary amounts of JSON.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = uint64_t{100} << 20;  // 100 MiB
// Most tensors one header may list. A whole DeepSeek-V3 or Kimi-K2 checkpoint in a single file
// holds 100k-150k tensors. Parsing and indexing take about 300 bytes per tensor plus twice its
// name, so an open file at these caps holds at most about 300 MiB + 2 x 100 MiB.
inline constexpr size_t kMaxSafetensorsTensors = size_t{1} << 20;
// Most "__metadata__" entries (real files carry a handful, e.g. {"format": "pt"}).
inline constexpr size_t kMaxSafetensorsMetadataEntries = size_t{1} << 16;
// Longest tensor name or "__metadata__" key, in bytes; real names are under 200. Metadata values
// are bounded only by the header cap.
inline constexpr size_t kMaxTensorNameBytes = 1024;

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
// (optional, may be null) receives "__metadata__". Errors are InvalidArgument; those about a limit
// above state the limit and the actual value.
EAGLE3_API absl::StatusOr<std::vector<TensorInfo>> ParseSafetensorsHeader(
               std::string_view header_json, uint64_t data_size, std::string_view source,
               std::map<std::string, std::string>* metadata = nullptr);

// Parses a whole file image (length prefix, header, and the bounds of the data section). `file`:
// the complete file contents; only the length prefix and header are read. Used by the fuzzer; it
// runs the same checks SafetensorsFile::Open runs on the prefix and header it reads from disk.
EAGLE3_API absl::StatusOr<SafetensorsLayout> ParseSafetensorsBuffer(std::span<const uint8_t> file,
                                                                    std::string_view source);

// An open safetensors file. Only the header is read by Open; tensor bytes are read on demand with
// pread into caller or owned memory, never memory-mapped, so a file truncated or rewritten while
// it is loaded gives a DataLoss status, never SIGBUS. No descriptor is held between reads: each
// Reader reopens the file and checks it is the one Open parsed (same device, inode, size and
// modification time), so a replaced or modified file is reported, and many shards opened by many
// in-process ranks do not exhaust file descriptors. Not copyable or movable (views point into
// it); own it through the unique_ptr that Open returns. All const methods are thread-safe.
class EAGLE3_API SafetensorsFile {
 public:
  // Never blocks on a FIFO or device. Errors: NotFound (no such file), PermissionDenied and other
  // OS errors (with strerror), FailedPrecondition ("is a directory, not a regular file", "is a
  // FIFO, ..."), InvalidArgument (malformed contents, message names the file and the offending
  // item), DataLoss (the file changed while its header was read).
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

  // Host view of the tensor's bytes (contiguous, element-aligned, the file's dtype and shape). The
  // first call reads the tensor into a buffer owned by this object; later calls return that
  // buffer, which lives as long as this object. Do not write through the view. For large tensors
  // prefer ReadBytes (or Checkpoint::Read / ReadShard), which do not keep a copy. Errors: NotFound
  // names the tensor and file; DataLoss as in Reader.
  absl::StatusOr<TensorView> View(std::string_view name) const;

  // The file opened for a batch of reads (e.g. the runs of one tensor-parallel slice), closed on
  // destruction. Movable. Read and CheckUnchanged may run on several threads at once (each read is
  // its own pread: no shared file position); moving or destroying it may not overlap them.
  class Reader {
   public:
    Reader(Reader&&) noexcept;
    Reader& operator=(Reader&&) noexcept;
    ~Reader();

    // Copies bytes [offset, offset + n) of the tensor's data into `out` (any alignment). `info`
    // must come from the file's tensors() / Find(). InvalidArgument when the range is outside the
    // tensor; DataLoss "<path>: file changed while loading: expected <n> bytes at offset <o>,
    // read <m> ... (reading tensor '<name>')" when the file shrank.
    absl::Status Read(const TensorInfo& info, uint64_t offset, void* out, size_t n) const;

    // DataLoss "<path>: file changed while loading: ..." when the file's size or modification
    // time changed since Open. Call it after the reads of one tensor. One fstat.
    absl::Status CheckUnchanged() const;

   private:
    friend class SafetensorsFile;
    Reader(const SafetensorsFile* owner, std::unique_ptr<file_io::File> file);

    const SafetensorsFile* owner_;
    std::unique_ptr<file_io::File> file_;
  };

  // Reopens the file for reading. Errors: as Open for the file itself (removed, now a FIFO, ...),
  // DataLoss "<path>: file changed while loading: ..." when it was replaced or modified since Open.
  absl::StatusOr<Reader> OpenReader() const;

  // One-shot read: OpenReader, Reader::Read, Reader::CheckUnchanged.
  absl::Status ReadBytes(const TensorInfo& info, uint64_t offset, void* out, size_t n) const;

 private:
  SafetensorsFile();

  std::string path_;
  std::unique_ptr<const file_io::File> file_;  // identity at Open; descriptor closed
  SafetensorsLayout layout_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in layout_.tensors

  // Tensors read by View, kept for the views' lifetime.
  mutable std::mutex views_mutex_;
  mutable std::map<std::string, Tensor, std::less<>> views_;
};

}  // namespace eagle3
