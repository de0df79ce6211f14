#include "tensor_reads.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "eagle3/status.h"
#include "eagle3/tensor_convert.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {
namespace {

// Converted and coalesced reads stage through a scratch buffer of at most this many bytes: enough
// rows for one pread to move many, few enough that they are still in the L2 cache when they are
// scattered or converted.
constexpr size_t kBounceBytes = size_t{256} << 10;
// Runs of a strided read (a column slice's rows) with gaps shorter than a page are read together,
// gaps included, and scattered from the scratch buffer: such a gap holds no whole page, so the
// coalesced read touches no page that the run-by-run reads would not, and copying less than a page
// costs about as much as the pread it saves.
constexpr size_t kPageBytes = 4096;
static_assert(kReadPieceBytes % kBounceBytes == 0 && kReadPieceBytes % kPageBytes == 0);

// Aligned scratch for converted and coalesced reads: allocated on first use at the size asked for
// (never zeroed: every byte used is read first) and reused for the later reads of one tensor.
class Bounce {
 public:
  // At least `bytes` bytes, 8-byte aligned.
  uint8_t* Get(size_t bytes) {
    if (bytes > bytes_) {
      data_ = std::make_unique_for_overwrite<uint64_t[]>((bytes + 7) / 8);
      bytes_ = bytes;
    }
    return reinterpret_cast<uint8_t*>(data_.get());
  }

 private:
  std::unique_ptr<uint64_t[]> data_;
  size_t bytes_ = 0;
};

// `n` elements from `src` (dtype `src_dtype`) into `dst`; conversion errors are prefixed with
// `where` and the tensor element `first` that `src` starts at.
absl::Status Convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, int64_t first,
                     const std::string& where) {
  const absl::Status converted =
      ConvertTensor(TensorView(const_cast<void*>(src), src_dtype, Shape{n}), TensorView(dst, dst_dtype, Shape{n}));
  if (converted.ok()) return converted;
  return absl::Status(converted.code(),
                      absl::StrCat(where, " (elements from ", first, "): ", converted.message()));
}

// Reads elements [first, first + n) of tensor `info` through `reader` into `dst` (element-aligned)
// as `dst_dtype`. Same-dtype reads go straight into `dst`; conversions stage through `bounce`, one
// block per pread. Read errors (DataLoss when the file changed) name the file and tensor; conversion
// errors are prefixed with `where`.
absl::Status ReadConvert(const SafetensorsFile::Reader& reader, const TensorInfo& info, int64_t first, int64_t n,
                         void* dst, DType dst_dtype, Bounce& bounce, const std::string& where) {
  if (n == 0) return absl::OkStatus();
  const size_t src_size = DTypeSize(info.dtype);
  const size_t dst_size = DTypeSize(dst_dtype);
  if (info.dtype == dst_dtype) {
    return reader.Read(info, static_cast<uint64_t>(first) * src_size, dst, static_cast<size_t>(n) * src_size);
  }
  const int64_t block = std::min(n, static_cast<int64_t>(kBounceBytes / src_size));
  uint8_t* scratch = bounce.Get(static_cast<size_t>(block) * src_size);
  for (int64_t i = 0; i < n; i += block) {
    const int64_t count = std::min(block, n - i);
    EAGLE3_RETURN_IF_ERROR(reader.Read(info, static_cast<uint64_t>(first + i) * src_size, scratch,
                                       static_cast<size_t>(count) * src_size));
    EAGLE3_RETURN_IF_ERROR(Convert(scratch, info.dtype, static_cast<uint8_t*>(dst) + i * dst_size, dst_dtype, count,
                                   first + i, where));
  }
  return absl::OkStatus();
}

// Whether ReadRuns reads runs `stride_bytes` apart together, gaps included: gaps under a page, and
// a stride and a run fit the scratch buffer.
bool Coalesces(uint64_t stride_bytes, uint64_t run_bytes) {
  return stride_bytes - run_bytes < kPageBytes && stride_bytes + run_bytes <= kBounceBytes;
}

// Whether ReadRuns reads `runs` as one range of elements (see ReadConvert).
bool IsOneRange(const ElementRuns& runs, DType src_dtype, DType dst_dtype) {
  return runs.count == 1 || (runs.stride == runs.run && runs.dst_stride == runs.run && src_dtype == dst_dtype);
}

// Reads `runs` of tensor `info` into `dst` (element-aligned) as `dst_dtype`: the results and errors
// of a ReadConvert per run, in as few preads as it can. Runs back to back in the file and in `dst`,
// of one dtype, are one read; runs with gaps under a page (kPageBytes) are read a bounce buffer at a
// time, gaps included, and scattered; others are a pread each.
absl::Status ReadRuns(const SafetensorsFile::Reader& reader, const TensorInfo& info, const ElementRuns& runs, void* dst,
                      DType dst_dtype, Bounce& bounce, const std::string& where) {
  if (runs.count == 0 || runs.run == 0) return absl::OkStatus();
  const size_t src_size = DTypeSize(info.dtype);
  const size_t dst_size = DTypeSize(dst_dtype);
  uint8_t* out = static_cast<uint8_t*>(dst);
  if (IsOneRange(runs, info.dtype, dst_dtype)) {
    return ReadConvert(reader, info, runs.first, runs.run * runs.count, dst, dst_dtype, bounce, where);
  }
  const uint64_t stride_bytes = static_cast<uint64_t>(runs.stride) * src_size;
  const uint64_t run_bytes = static_cast<uint64_t>(runs.run) * src_size;
  if (!Coalesces(stride_bytes, run_bytes)) {
    for (int64_t i = 0; i < runs.count; ++i) {
      EAGLE3_RETURN_IF_ERROR(ReadConvert(reader, info, runs.first + i * runs.stride, runs.run,
                                         out + i * runs.dst_stride * dst_size, dst_dtype, bounce, where));
    }
    return absl::OkStatus();
  }
  // Runs per chunk: k runs span (k - 1) strides and a run.
  const int64_t per_chunk =
      std::min<int64_t>(runs.count, static_cast<int64_t>((kBounceBytes - run_bytes) / stride_bytes) + 1);
  uint8_t* scratch = bounce.Get(static_cast<size_t>((per_chunk - 1) * stride_bytes + run_bytes));
  for (int64_t i = 0; i < runs.count; i += per_chunk) {
    const int64_t k = std::min(per_chunk, runs.count - i);
    EAGLE3_RETURN_IF_ERROR(reader.Read(info, static_cast<uint64_t>(runs.first + i * runs.stride) * src_size, scratch,
                                       static_cast<size_t>((k - 1) * stride_bytes + run_bytes)));
    uint8_t* to = out + i * runs.dst_stride * dst_size;
    if (info.dtype == dst_dtype) {
      for (int64_t j = 0; j < k; ++j) {
        std::memcpy(to + j * runs.dst_stride * dst_size, scratch + j * stride_bytes, run_bytes);
      }
      continue;
    }
    // Runs bound for back-to-back destinations are packed in the scratch buffer and converted in
    // one call (a ConvertTensor call per run costs more than a short run's conversion). A failed
    // call is redone run by run, so that its error names the run as a run-by-run read's does.
    uint64_t pitch = stride_bytes;
    if (runs.dst_stride == runs.run) {
      for (int64_t j = 1; j < k; ++j) std::memmove(scratch + j * run_bytes, scratch + j * stride_bytes, run_bytes);
      pitch = run_bytes;
      if (Convert(scratch, info.dtype, to, dst_dtype, k * runs.run, runs.first + i * runs.stride, where).ok()) continue;
    }
    for (int64_t j = 0; j < k; ++j) {
      EAGLE3_RETURN_IF_ERROR(Convert(scratch + j * pitch, info.dtype, to + j * runs.dst_stride * dst_size, dst_dtype,
                                     runs.run, runs.first + (i + j) * runs.stride, where));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadElementRuns(const SafetensorsFile::Reader& reader, const TensorInfo& info, const ElementRuns& runs,
                             void* dst, DType dst_dtype, ThreadPool* pool, const std::string& where) {
  if (runs.count == 0 || runs.run == 0) return absl::OkStatus();
  const size_t src_size = DTypeSize(info.dtype);
  const size_t dst_size = DTypeSize(dst_dtype);
  // Pieces are `per_piece` units each: elements of one range (a multiple of ReadConvert's block), or
  // whole runs, costed at the file bytes ReadRuns moves for each.
  const bool one_range = IsOneRange(runs, info.dtype, dst_dtype);
  int64_t units = runs.count;
  int64_t per_piece = 0;
  if (one_range) {
    units = runs.run * runs.count;
    per_piece = static_cast<int64_t>(kReadPieceBytes / src_size);
  } else {
    const uint64_t stride_bytes = static_cast<uint64_t>(runs.stride) * src_size;
    const uint64_t run_bytes = static_cast<uint64_t>(runs.run) * src_size;
    const uint64_t run_cost = Coalesces(stride_bytes, run_bytes) ? stride_bytes : run_bytes;
    per_piece = std::max<int64_t>(1, static_cast<int64_t>(kReadPieceBytes / run_cost));
  }
  const int64_t pieces = units / per_piece + (units % per_piece != 0);
  if (pool == nullptr || pool->threads() < 2 || pieces < 2) {
    Bounce bounce;
    return ReadRuns(reader, info, runs, dst, dst_dtype, bounce, where);
  }

  uint8_t* out = static_cast<uint8_t*>(dst);
  std::vector<Bounce> bounces(static_cast<size_t>(pool->threads()));  // one per slot
  std::vector<absl::Status> errors(static_cast<size_t>(pieces));
  // The first piece in the file known to have failed: pieces after it are skipped, since its error
  // (or an earlier piece's) is the one returned.
  std::atomic<int64_t> first_failed{pieces};
  pool->ParallelFor(pieces, [&](int64_t p, int slot) {
    if (p > first_failed.load(std::memory_order_relaxed)) return;
    const int64_t begin = p * per_piece;
    const int64_t n = std::min(per_piece, units - begin);
    ElementRuns piece = runs;
    uint8_t* to = out;
    if (one_range) {
      piece = ElementRuns{.first = runs.first + begin, .run = n, .stride = n, .count = 1, .dst_stride = n};
      to += begin * dst_size;
    } else {
      piece.first = runs.first + begin * runs.stride;
      piece.count = n;
      to += begin * runs.dst_stride * dst_size;
    }
    absl::Status read = ReadRuns(reader, info, piece, to, dst_dtype, bounces[static_cast<size_t>(slot)], where);
    if (read.ok()) return;
    errors[static_cast<size_t>(p)] = std::move(read);
    int64_t seen = first_failed.load(std::memory_order_relaxed);
    while (p < seen && !first_failed.compare_exchange_weak(seen, p, std::memory_order_relaxed)) {
    }
  });
  for (absl::Status& error : errors) {
    if (!error.ok()) return std::move(error);
  }
  return absl::OkStatus();
}

}  // namespace eagle3
