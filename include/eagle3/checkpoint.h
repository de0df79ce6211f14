// A Hugging Face checkpoint directory: either one `model.safetensors`, or
// `model.safetensors.index.json` ({"metadata": {...}, "weight_map": {tensor: shard file}}) plus the
// shard files it names. Tensors are read with pread, never memory-mapped (see SafetensorsFile):
// copied and converted (Read), or as tensor-parallel slices read straight from the file
// (ReadShard) without materializing the whole tensor. A file truncated or rewritten while it is
// loaded gives DataLoss, never a signal.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/export.h"
#include "eagle3/safetensors.h"
#include "eagle3/shape.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// Which tensor-parallel slice of a tensor to read. The split dim is first zero-padded up to a
// multiple of `pad_to_multiple`, then cut into `tp_size` equal blocks; rank r gets block r.
struct ShardSpec {
  // 0 = rows: column-parallel weights [out, in] split on out, vocab tables, 1-D vectors.
  // 1 = columns: row-parallel weights [out, in] split on in. Any dim < rank is accepted.
  int dim = 0;
  int tp_size = 1;
  int rank = 0;
  // E.g. 64 * tp_size for vocab-parallel embeddings and lm_head. 1 = no padding. The padded size
  // must be divisible by tp_size.
  int64_t pad_to_multiple = 1;
};

// Size cap of model.safetensors.index.json. A real index is about 100 bytes per tensor: ~9 MB for
// DeepSeek-V3's 92k tensors.
inline constexpr uint64_t kMaxSafetensorsIndexBytes = uint64_t{64} << 20;
// Most weight_map entries an index may list: the same bound as one safetensors header.
inline constexpr size_t kMaxSafetensorsIndexTensors = kMaxSafetensorsTensors;

// Parses model.safetensors.index.json text into tensor -> shard file name, in one streaming (SAX)
// pass linear in the text: only weight_map is stored; "metadata" and any other top-level key are
// skipped without being stored (nesting at most kMaxSafetensorsIndexDepth). Tensor and shard names
// are at most kMaxTensorNameBytes, shard names must be relative paths inside the checkpoint, and
// a tensor listed twice is refused. Memory: at most about 150 bytes per entry plus its two names,
// so at most about 150 MiB + the text size at the caps. Errors are InvalidArgument naming
// `source` and, for a limit, the limit and the actual value.
inline constexpr int kMaxSafetensorsIndexDepth = 16;
EAGLE3_API absl::StatusOr<std::map<std::string, std::string>> ParseSafetensorsIndex(std::string_view text,
                                                                                    std::string_view source);

// `n` rounded up to a multiple of `multiple`. Requires n >= 0, multiple >= 1 and no int64
// overflow (ReadShard checks these for you).
EAGLE3_API int64_t PaddedSize(int64_t n, int64_t multiple);

// Thread-safe for concurrent const calls (e.g. one loader thread per TP rank).
class EAGLE3_API Checkpoint {
 public:
  static constexpr std::string_view kSingleFileName = "model.safetensors";
  static constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

  // Opens and validates every file up front (headers only; tensor bytes are read on demand).
  // When both a single file and an index are present, the single file is used (transformers'
  // precedence). Errors: NotFound (no checkpoint files, missing shard: names the shard and a tensor
  // mapped to it; tensor listed in the index but absent from its shard), InvalidArgument (malformed
  // index or safetensors; a tensor in two shards; a shard holding a tensor the index does not
  // list), FailedPrecondition (a checkpoint file that is a directory, FIFO or device: refused
  // without blocking), PermissionDenied and other OS errors with their strerror text, each naming
  // the file, tensor or key.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  std::vector<std::string> TensorNames() const;  // sorted
  bool Has(std::string_view name) const;

  // Offsets in the returned info are relative to the data section of the tensor's file.
  absl::StatusOr<TensorInfo> Info(std::string_view name) const;  // NotFound names tensor and dir
  // Path of the file holding the tensor.
  absl::StatusOr<std::string> FileOf(std::string_view name) const;

  // Read-only host view of the whole tensor; see SafetensorsFile::View (the first call reads the
  // tensor into memory this Checkpoint keeps). Valid while this Checkpoint lives.
  absl::StatusOr<TensorView> View(std::string_view name) const;

  // InvalidArgument "tensor 'x' in '<file>' has shape [a, b], expected [c, d]" on mismatch.
  absl::Status ExpectShape(std::string_view name, const Shape& expected) const;

  // The whole tensor converted to `dtype`. `allocator` must be a host allocator. Conversions: any
  // of f32/f16/bf16/f8_e4m3 to f32/f16/bf16, i32 <-> i64, and same-dtype copies. Like every read
  // below, DataLoss "<file>: file changed while loading: ..." when the file was truncated,
  // rewritten or replaced since Open (see SafetensorsFile).
  absl::StatusOr<Tensor> Read(std::string_view name, DType dtype,
                              Allocator& allocator = DefaultHostAllocator()) const;

  // The `spec` slice (shape: the tensor's, with dim `spec.dim` = padded size / tp_size), converted
  // to `dtype` as in Read; padding rows/columns are zero. Reads only the slice's bytes.
  absl::StatusOr<Tensor> ReadShard(std::string_view name, const ShardSpec& spec, DType dtype,
                                   Allocator& allocator = DefaultHostAllocator()) const;

  // Same into caller memory. `out`: host, contiguous, exactly the slice shape, any dtype the
  // source converts to (see Read).
  absl::Status ReadShardInto(std::string_view name, const ShardSpec& spec,
                             const TensorView& out) const;

  // Columns [begin, end) of every row of a 2-D tensor, shape [rows, end - begin], converted to
  // `dtype` as in Read. Reads only those bytes (one run per row): for slices that do not follow
  // ShardSpec's even split, such as the int4 words and group scales under a column slice that
  // starts inside a word or a group. InvalidArgument naming the tensor for a tensor not 2-D or a
  // range outside 0 <= begin <= end <= columns.
  absl::StatusOr<Tensor> ReadColumns(std::string_view name, int64_t begin, int64_t end, DType dtype,
                                     Allocator& allocator = DefaultHostAllocator()) const;

  // The slice shape ReadShard would produce, after validating `spec` against the tensor.
  absl::StatusOr<Shape> ShardShape(std::string_view name, const ShardSpec& spec) const;

 private:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };

  Checkpoint() = default;
  absl::StatusOr<Entry> Lookup(std::string_view name) const;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
};

}  // namespace eagle3
