// Reading a tensor's elements from an open safetensors file into host memory, converted on the way:
// one range of elements (a whole tensor, a row-split shard) or runs of them (the rows of a column
// slice), in as few preads as it can, and with large reads cut into pieces that a ThreadPool reads
// at once (pread has no shared file position). Private to src/: Checkpoint's reads go through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "eagle3/dtype.h"
#include "eagle3/safetensors.h"
#include "thread_pool.h"

namespace eagle3 {

// `count` runs of `run` elements of a tensor, run i starting at element first + i * stride, for
// element i * dst_stride of the destination: the rows of a column slice; count 1 is one range.
struct ElementRuns {
  int64_t first = 0;
  int64_t run = 0;
  int64_t stride = 0;      // >= run when count > 1
  int64_t count = 0;
  int64_t dst_stride = 0;  // >= run when count > 1
};

// The file bytes one piece of a split read moves, about. A read moving fewer than twice this stays
// whole on the calling thread. Large enough that waking a helper costs little beside copying a
// piece; small enough that a DeepSeek-V3 TP8 rank's expert weights (1.8 MB each, most of its bytes)
// still make several pieces. A multiple of the conversion block, so that pieces convert the blocks
// a whole read does, and of the page size.
inline constexpr size_t kReadPieceBytes = size_t{512} << 10;

// Reads `runs` of tensor `info` through `reader` into `dst` as `dst_dtype`. Same-dtype runs back to
// back are one read straight into `dst`; conversions stage through a scratch buffer a block at a
// time; runs with gaps under a page are read together, gaps included, and scattered; other runs are
// a pread each. When `pool` has more than one thread and the preads move at least
// 2 * kReadPieceBytes, the work is cut into pieces of about kReadPieceBytes (whole runs, or blocks of
// one range) that the pool's threads read at once; the bytes written are the same either way.
//   info: an entry of the reader's file; the runs lie inside it: first >= 0, run >= 0, count >= 0,
//     first + (count - 1) * stride + run <= numel
//   dst: host memory for (count - 1) * dst_stride + run elements of `dst_dtype`, element-aligned;
//     only the runs' elements are written
//   dst_dtype: info.dtype, or one it converts to (f32/f16/bf16/f8_e4m3 to f32/f16/bf16, i32 <-> i64)
//   pool: may be null (the calling thread reads it all)
// Errors: a read error names the file and the tensor (DataLoss "<file>: file changed while loading:
// ... (reading tensor '<name>')" when the file shrank); a conversion error is prefixed with `where`
// and names the first element of its run or block. When several pieces fail, the error of the one
// first in the file is returned, so the status does not depend on timing; it is what a read on one
// thread returns, but for the offset and size a read error quotes, which are its piece's.
absl::Status ReadElementRuns(const SafetensorsFile::Reader& reader, const TensorInfo& info, const ElementRuns& runs,
                             void* dst, DType dst_dtype, ThreadPool* pool, const std::string& where);

}  // namespace eagle3
