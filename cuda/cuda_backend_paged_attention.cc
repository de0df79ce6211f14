// CudaBackend::BatchedPagedAttention (kernels in paged_attention_kernels.cu): f32 queries, cache and
// output. No host synchronization. Scratch: kPartialBytes of partial results for the split register
// kernel, allocated on the first call that is not being captured into a CUDA graph (a call captured
// before any eager one runs the kernel unsplit: the same results, one block per row and kv head).
//
// Data-dependent errors (q_start, kv_len, page entries, mask rows, causal rows beyond kv_len) are
// found on the device and reported by the next Synchronize() as InvalidArgument naming the sequence
// or row (the conditions are listed in cuda/paged_attention_ops.h); the op itself returns
// OK, and may have written the rows of the sequences that were good.
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "eagle3/cuda/cuda_backend.h"
#include "paged_attention_ops.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

// BatchedPagedAttention's number in the error flag's DeviceCheck registry (cuda_backend_state.h;
// DeviceError in cuda_backend.cc maps it to BatchedPagedAttentionDeviceError).
constexpr DeviceCheck kBatchedPagedAttentionCheck = DeviceCheck::kBatchedPagedAttention;
// The split kernel's partials: a split takes tokens x q_heads x (head_dim + 2) floats (the
// DeepSeek-V3 draft at TP 1: 7280 per split at one token, 466K at 64 tokens).
constexpr size_t kPartialBytes = size_t{4} << 20;

// Allocates the partials and reads the multiprocessor count on the first call outside a capture.
absl::Status PreparePartials(CudaBackend::State& s) {
  if (s.paged_partials != nullptr) return absl::OkStatus();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamIsCapturing(s.stream, &capture),
                                    "BatchedPagedAttention: cudaStreamIsCapturing"));
  if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&s.multiprocessors, cudaDevAttrMultiProcessorCount, s.options.device),
      "BatchedPagedAttention: cudaDeviceGetAttribute"));
  EAGLE3_ASSIGN_OR_RETURN(s.paged_partials, s.allocator.Allocate(kPartialBytes, 256));
  s.paged_partials_bytes = kPartialBytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status BatchedPagedAttentionDeviceError(int64_t index, const char* found) {
  const char* op = "BatchedPagedAttention";
  if (index >= kDeviceErrorMaxIndex) {
    return Invalid(op, "a sequence or row >= ", kDeviceErrorMaxIndex / 8, " has bad metadata", found);
  }
  const int64_t at = index / 8;
  switch (index % 8) {
    case 0:
      return Invalid(op, "q_start[0] must be 0", found);
    case 1:
      return Invalid(op, "sequence ", at, ": q_start[b + 1] must be in [q_start[b], T]", found);
    case 2:
      return Invalid(op, "sequence ", at, ": kv_len[b] must be in [0, min(max_kv_len, P * page_size)]", found);
    case 3:
      return Invalid(op, "sequence ", at,
                     ": a page entry it uses (page_tables[b][j], j < ceil(kv_len[b] / page_size)) is outside "
                     "[0, num_pages)",
                     found);
    case 4:
      return Invalid(op, "row ", at, " of mask allows no key below its sequence's kv_len", found);
    case 5:
      return Invalid(op, "q_start[B] must be T (B = ", at, ")", found);
    case 6:
      return Invalid(op, "sequence ", at,
                     ": with no mask (causal) its q_start[b + 1] - q_start[b] query rows must not exceed kv_len[b]",
                     found);
    default:
      return absl::InternalError(absl::StrCat(op, ": unknown device error index ", index));
  }
}

absl::Status CudaBackend::BatchedPagedAttention(const TensorView& q, const TensorView& cache,
                                                const TensorView& page_tables, const TensorView& q_start,
                                                const TensorView& kv_len, int64_t max_kv_len,
                                                const TensorView& mask, float scale, const TensorView& out) {
  const char* op = "BatchedPagedAttention";
  EAGLE3_RETURN_IF_ERROR(
      CheckBatchedPagedAttention(q, cache, page_tables, q_start, kv_len, max_kv_len, mask, scale, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "cache", cache));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  const int64_t dim = q.dim(2);
  const int64_t kv_heads = cache.dim(2) / (2 * dim);
  const int64_t group = q.dim(1) / kv_heads;
  const int64_t shared = PagedAttentionSharedBytes(group, dim);
  if (shared > kPagedAttentionMaxSharedBytes) {
    return Invalid(op, "q ", q.ToString(), " puts ", group, " query heads of head_dim ", dim,
                   " on each kv head: the kernel would need ", shared, " bytes of shared memory, CudaBackend has ",
                   kPagedAttentionMaxSharedBytes);
  }
  if (max_kv_len > std::numeric_limits<int32_t>::max()) {
    return Invalid(op, "max_kv_len = ", max_kv_len, " exceeds the i32 range of kv_len");
  }
  if (kv_heads > 65535 || q.dim(0) > std::numeric_limits<int32_t>::max()) {
    return Invalid(op, "q ", q.ToString(), " with ", kv_heads, " kv heads exceeds the launch grid");
  }
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), absl::StrCat(op, ": cudaSetDevice")));
  PagedAttentionParams p;
  p.q = q.data_as<const float>();
  p.q_token_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.cache = cache.data_as<const float>();
  p.num_pages = cache.dim(0);
  p.page_size = cache.dim(1);
  p.page_tables = page_tables.data_as<const int32_t>();
  p.page_table_stride = page_tables.stride(0);
  p.pages_per_seq = page_tables.dim(1);
  p.q_start = q_start.data_as<const int32_t>();
  p.kv_len = kv_len.data_as<const int32_t>();
  p.batch = page_tables.dim(0);
  p.tokens = q.dim(0);
  p.max_kv_len = max_kv_len;
  if (HasTreeMask(mask)) {  // else causal: a null mask
    p.mask = mask.data_as<const uint8_t>();
    p.mask_stride = mask.stride(0);
  }
  p.q_heads = q.dim(1);
  p.kv_heads = kv_heads;
  p.head_dim = dim;
  p.scale = scale;
  p.out = out.data_as<float>();
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.register_kernel = s.options.paged_attention_registers;
  if (p.register_kernel) {
    EAGLE3_RETURN_IF_ERROR(PreparePartials(s));
    p.partials = static_cast<float*>(s.paged_partials);
    p.partial_floats = static_cast<int64_t>(s.paged_partials_bytes / sizeof(float));
    p.target_blocks = 2 * static_cast<int64_t>(s.multiprocessors);
  }
  return CudaStatus(LaunchBatchedPagedAttention(
                        p, s.error_flag, DeviceErrorCode(kBatchedPagedAttentionCheck),
                        s.options.programmatic_launch, s.stream),
                    "BatchedPagedAttention: kernel launch");
}

}  // namespace eagle3::cuda
