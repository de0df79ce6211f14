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

class ThreadPool;  // src/thread_pool.h

// The most threads one checkpoint read may be split across.
inline constexpr int kMaxCheckpointReadThreads = 64;

// min(8, std::thread::hardware_concurrency()), at least 1: what CheckpointReadOptions::threads = 0
// means. Capped because the ranks of a host load at once, each with its own threads, and copies out
// of the page cache are bounded by memory bandwidth rather than by cores.
EAGLE3_API int DefaultCheckpointReadThreads();

// How a Checkpoint reads tensor bytes.
struct CheckpointReadOptions {
  // Threads one read is split across. A read whose preads move at least 1 MiB of the file (a
  // whole tensor, a shard's block of rows, the rows of a column slice) is cut into pieces of about
  // 512 KiB that the calling thread and up to threads - 1 helper threads read at once; the
  // Checkpoint starts the helpers on its first such read and joins them when it is destroyed.
  // Smaller reads stay on the calling thread. The bytes read are the same for every count, and so
  // are the statuses but for the offset and size a read error quotes (its piece's; when several
  // pieces fail, the one first in the file). A read waits for every piece a helper has taken, so on
  // a host whose cores are busy with other work (a helper preempted mid-piece) splitting can be
  // slower than one thread: set 1 there. 0 = DefaultCheckpointReadThreads(); 1 = every read on the
  // calling thread alone, as one pread where it can; at most kMaxCheckpointReadThreads.
  int threads = 0;
};

// Thread-safe for concurrent const calls (e.g. one loader thread per TP rank); concurrent reads share
// the Checkpoint's helper threads (each caller also reads pieces of its own read, so none waits for
// a helper to come free).
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
  // the file, tensor or key; InvalidArgument for `options.threads` outside [0,
  // kMaxCheckpointReadThreads].
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir,
                                                          const CheckpointReadOptions& options = {});
  ~Checkpoint();
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  // Threads a large read is split across (CheckpointReadOptions::threads, 0 resolved), >= 1.
  int read_threads() const { return read_threads_; }
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

  Checkpoint();
  absl::StatusOr<Entry> Lookup(std::string_view name) const;

  std::string dir_;
  int read_threads_ = 1;
  std::unique_ptr<ThreadPool> pool_;  // null when read_threads_ is 1
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
};

}  // namespace eagle3
