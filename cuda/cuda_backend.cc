// CudaBackend core: creation and teardown, Synchronize (deferred device errors), Copy, and the row
// ops RmsNorm, RmsNormPair, AddRmsNorm, SiluMul, EmbeddingLookup, Softmax, Argmax, TopK. Gemm is in
// gemm.cc; the attention and MoE ops are in their own files.
#include "eagle3/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "core_ops.h"
#include "pinned_upload_backing.h"
#include "prefetch_ops.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

// Builds no string unless the launch failed (ops run many times per decode step).
absl::Status Launched(const char* op, cudaError_t error) {
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(error, absl::StrCat(op, ": kernel launch"));
}

// The Status for a code read from the error flag (format: cuda_backend_state.h).
absl::Status DeviceError(int code) {
  const int64_t index = code & kDeviceErrorMaxIndex;
  const std::string where =
      index == kDeviceErrorMaxIndex ? absl::StrCat(">= ", index) : absl::StrCat(index);
  const char* found = " (found on the device by an earlier call; reported by Synchronize)";
  switch (static_cast<DeviceCheck>(code >> kDeviceErrorIndexBits)) {
    case DeviceCheck::kEmbeddingNegativeId:
      return Invalid("EmbeddingLookup", "ids[", where, "] is negative", found);
    case DeviceCheck::kSoftmaxBadRow:
      return Invalid("Softmax", "row ", where, " of logits has NaN or +inf, or no finite logit",
                     found);
    case DeviceCheck::kArgmaxNaN:
      return Invalid("Argmax", "row ", where, " of logits has NaN", found);
    case DeviceCheck::kTopKNaN:
      return Invalid("TopK", "row ", where, " of values has NaN", found);
    case DeviceCheck::kRopePosition:
      return Invalid("ApplyRope", "positions[", where, "] is outside the cos_sin table", found);
    case DeviceCheck::kAttentionMaskRow:
      return Invalid("Attention", "mask row ", where, " allows no key", found);
    case DeviceCheck::kLatentAttentionPage:
      return Invalid("LatentAttention", "page_table[", where, "] is outside [0, num_pages)", found);
    case DeviceCheck::kLatentAttentionMaskRow:
      return Invalid("LatentAttention", "mask row ", where, " allows no key", found);
    case DeviceCheck::kPagedWritePosition:
      return Invalid("PagedWrite", "token ", where,
                     ": its position, or the page entry for it, is out of range", found);
    case DeviceCheck::kPagedReadPosition:
      return Invalid("PagedRead", "token ", where,
                     ": its position, or the page entry for it, is out of range", found);
    case DeviceCheck::kMoeRouteLogits:
      return Invalid("MoeRoute", "row ", where, " of logits has a non-finite value", found);
    case DeviceCheck::kMoeRouteBias:
      return Invalid("MoeRoute", "correction_bias[", where, "] is not finite", found);
    case DeviceCheck::kMoeExpertsId:
      return Invalid("MoeExperts", "token ", where, " has an expert id outside [0, experts)",
                     found);
    case DeviceCheck::kQuantizedMoeExpertsId:
      return Invalid("QuantizedMoeExperts", "token ", where, " has an expert id outside [0, experts)",
                     found);
    case DeviceCheck::kBatchedLatentAttention: {
      const int64_t b = index / 8;
      const char* what[] = {"q_start[0] must be 0",
                            ": q_start[b + 1] must be in [q_start[b], T]",
                            ": kv_len[b] must be in [n = its new tokens, min(max_kv_len, P * page_size)]",
                            ": its new tokens do not fit tree_mask (n > M)",
                            ": a page entry it uses (page_tables[b][j], j < ceil(kv_len[b] / page_size)) is "
                            "outside [0, num_pages)",
                            ": a row of tree_mask allows no key and the sequence has no cached prefix",
                            "q_start[B] must be T",
                            ": a row of key_mask (BatchedLatentAttentionKeyMask) allows none of its keys"};
      const int64_t condition = index % 8;
      if (condition == 0) return Invalid("BatchedLatentAttention", what[0], found);
      if (condition == 6) return Invalid("BatchedLatentAttention", what[6], " (B = ", b, ")", found);
      return Invalid("BatchedLatentAttention", "sequence ", b, what[condition], found);
    }
    case DeviceCheck::kCompactAccepted:
      return CompactAcceptedDeviceError(index, found);
    case DeviceCheck::kBatchedPagedAttention:
      return BatchedPagedAttentionDeviceError(index, found);
    case DeviceCheck::kGatherRowsIndex:
      return Invalid("GatherRows", "index[", where, "] is outside [0, R) of src", found);
    case DeviceCheck::kExtendMaskRowsIndex:
      if (index == kDeviceErrorMaxIndex) {
        return Invalid("ExtendMaskRows", "parent[i] or column[i] is out of range for some i >= ", index / 2,
                       found);
      }
      return Invalid("ExtendMaskRows", index % 2 == 0 ? "parent[" : "column[", index / 2,
                     index % 2 == 0 ? "] is outside [0, R) of src" : "] is outside [0, M) of src", found);
    case DeviceCheck::kNone:
      break;
  }
  return absl::InternalError(
      absl::StrCat("CudaBackend: the device error flag holds unknown code ", code));
}

// A copy's dims after dropping size-1 dims and merging neighbours that are contiguous with each
// other in both views: a copy of rows of a matrix becomes rank 2, a contiguous one rank 1.
struct CopyLayout {
  int rank = 0;
  int64_t shape[kStridedCopyMaxRank] = {};
  int64_t src[kStridedCopyMaxRank] = {};
  int64_t dst[kStridedCopyMaxRank] = {};
};

CopyLayout Collapse(const TensorView& src, const TensorView& dst) {
  CopyLayout l;
  for (int d = 0; d < src.rank(); ++d) {
    const int64_t n = src.dim(d);
    if (n == 1) continue;
    const int p = l.rank - 1;
    if (p >= 0 && l.src[p] == n * src.stride(d) && l.dst[p] == n * dst.stride(d)) {
      l.shape[p] *= n;
      l.src[p] = src.stride(d);
      l.dst[p] = dst.stride(d);
    } else {
      l.shape[l.rank] = n;
      l.src[l.rank] = src.stride(d);
      l.dst[l.rank] = dst.stride(d);
      ++l.rank;
    }
  }
  return l;
}

}  // namespace

CudaBackend::CudaBackend(std::unique_ptr<State> state) : state_(std::move(state)) {}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const CudaBackendOptions& options) {
  const int count = CudaDeviceCount();
  if (count == 0) return absl::FailedPreconditionError("CudaBackend: no CUDA device is visible");
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CudaBackend: CUDA device ", options.device,
                                                   " does not exist (", count, " visible)"));
  }
  if (options.max_rows < 1 || options.max_context_len < 1 || options.max_experts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaBackend: max_rows (", options.max_rows, "), max_context_len (",
        options.max_context_len, ") and max_experts (", options.max_experts, ") must be >= 1"));
  }
  if (options.moe_grouped_min_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("CudaBackend: moe_grouped_min_tokens (",
                                                   options.moe_grouped_min_tokens, ") must be >= 1"));
  }
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"quant_moe_direct_max_tokens_int4",
                                                                     options.quant_moe_direct_max_tokens_int4},
                                     {"quant_moe_direct_max_tokens_fp8", options.quant_moe_direct_max_tokens_fp8}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaBackend: ", name, " (", value, ") must be >= 1 (1: one-token calls only)"));
    }
  }
  auto state = std::make_unique<State>();
  state->options = options;
  state->allocator = DeviceAllocator(options.device);
  if (options.weight_arena_chunk_bytes > 0) {
    absl::StatusOr<std::unique_ptr<ChunkArena>> arena =
        ChunkArena::Create(state->allocator, {.chunk_bytes = options.weight_arena_chunk_bytes});
    if (!arena.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("CudaBackend: weight_arena_chunk_bytes (",
                                                     options.weight_arena_chunk_bytes, "; 0 turns the arena off): ",
                                                     arena.status().message()));
    }
    state->weight_arena = std::move(*arena);
  }
  // The backend owns each resource as soon as it exists: on a failure below, its destructor
  // releases what was created.
  std::unique_ptr<CudaBackend> backend(new CudaBackend(std::move(state)));
  State& s = *backend->state_;
  const std::string on = absl::StrCat(" on cuda:", options.device);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "CudaBackend: cudaSetDevice" + on));
  if (options.stream == nullptr) {
    EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
                                      "CudaBackend: cudaStreamCreateWithFlags" + on));
    s.owns_stream = true;
  } else {
    s.stream = options.stream;
  }
  if (const cublasStatus_t status = cublasLtCreate(&s.lt); status != CUBLAS_STATUS_SUCCESS) {
    s.lt = nullptr;
    return absl::InternalError(absl::StrCat("CudaBackend: cublasLtCreate", on, ": ",
                                            cublasLtGetStatusName(status), " (",
                                            cublasLtGetStatusString(status), ")"));
  }
  if (options.gemm_workspace_bytes > 0) {
    EAGLE3_ASSIGN_OR_RETURN(s.gemm_workspace,
                            s.allocator.Allocate(options.gemm_workspace_bytes, 256));
  }
  if (options.activation_scratch_bytes > 0) {
    EAGLE3_ASSIGN_OR_RETURN(void* scratch,
                            s.allocator.Allocate(options.activation_scratch_bytes, 256));
    s.activation_scratch.emplace_back(scratch, options.activation_scratch_bytes);
  }
  int l2_bytes = 0;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, options.device),
                                    "CudaBackend: cudaDeviceGetAttribute(L2 cache size)" + on));
  s.l2_bytes = l2_bytes;
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetAttribute(&s.multiprocessors, cudaDevAttrMultiProcessorCount, options.device),
                 "CudaBackend: cudaDeviceGetAttribute(multiprocessors)" + on));
  EAGLE3_ASSIGN_OR_RETURN(void* flag, s.allocator.Allocate(sizeof(int), 256));
  s.error_flag = static_cast<int*>(flag);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(s.error_flag, 0, sizeof(int), s.stream),
                                    "CudaBackend: clearing the error flag" + on));
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(s.stream), "CudaBackend: cudaStreamSynchronize" + on));
  return backend;
}

CudaBackend::~CudaBackend() {
  State& s = *state_;
  UseBackendDevice(s);
  if (s.stream != nullptr) cudaStreamSynchronize(s.stream);  // work in flight may use the buffers
  const std::pair<void*, size_t> buffers[] = {{s.gemm_workspace, s.options.gemm_workspace_bytes},
                                              {s.error_flag, sizeof(int)},
                                              {s.attention_scratch, s.attention_scratch_bytes},
                                              {s.moe_scratch, s.moe_scratch_bytes},
                                              {s.paged_partials, s.paged_partials_bytes}};
  for (const auto& [p, bytes] : buffers) {
    if (p != nullptr) s.allocator.Deallocate(p, bytes);
  }
  for (const auto& [p, bytes] : s.activation_scratch) s.allocator.Deallocate(p, bytes);
  if (s.lt != nullptr) cublasLtDestroy(s.lt);
  if (s.owns_stream && s.stream != nullptr) cudaStreamDestroy(s.stream);
  cudaGetLastError();  // a teardown failure must not be reported by a later, unrelated launch
}

cudaStream_t CudaBackend::stream() const { return state_->stream; }

const CudaBackendOptions& CudaBackend::options() const { return state_->options; }

Device CudaBackend::device() const { return Device::Cuda(state_->options.device); }

Allocator& CudaBackend::allocator() { return state_->allocator; }

Allocator& CudaBackend::weight_allocator() {
  if (state_->weight_arena == nullptr) return state_->allocator;
  return *state_->weight_arena;
}

Allocator& CudaBackend::staging_allocator() { return state_->pinned; }

absl::StatusOr<std::unique_ptr<UploadRing>> CudaBackend::CreateUploadRing() {
  State& s = *state_;
  if (s.options.upload_ring_bytes == 0) return std::unique_ptr<UploadRing>();
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "CreateUploadRing: cudaSetDevice"));
  absl::StatusOr<std::unique_ptr<PinnedUploadBacking>> backing =
      PinnedUploadBacking::Create(s.pinned, s.options.upload_ring_bytes, s.options.device, s.stream);
  if (!backing.ok()) {
    return absl::Status(backing.status().code(),
                        absl::StrCat("CreateUploadRing: the ring's ", s.options.upload_ring_bytes,
                                     " pinned bytes (CudaBackendOptions::upload_ring_bytes; 0 loads without "
                                     "the ring): ",
                                     backing.status().message()));
  }
  return std::make_unique<UploadRing>(std::move(*backing));
}

absl::Status CudaBackend::Synchronize() {
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "Synchronize: cudaSetDevice"));
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(s.stream), "Synchronize: cudaStreamSynchronize"));
  int code = 0;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(&code, s.error_flag, sizeof code, cudaMemcpyDeviceToHost, s.stream),
      "Synchronize: reading the error flag"));
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(s.stream), "Synchronize: reading the error flag"));
  if (code == 0) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(s.error_flag, 0, sizeof(int), s.stream),
                                    "Synchronize: clearing the error flag"));
  return DeviceError(code);
}

// Contiguous pairs are one cudaMemcpyAsync, rows at fixed pitches one cudaMemcpy2DAsync (either
// direction); anything else device-side is the strided copy kernel (a zero-stride source
// broadcasts; a destination mapping several elements to one address gets one of them). Other
// host-side layouts are refused. Host memory that is not pinned makes a transfer synchronous, as
// CUDA does; a large contiguous one to the device (weights at load) goes through the backend's
// pinned buffers (StagedUpload) unless the stream is being captured. A pinned source (staging
// memory, an UploadRing's) is a DMA that Copy only enqueues.
namespace {

// A contiguous host-to-device copy through StagedUpload when src is pageable and the stream is not
// being captured (a captured copy must read src at replay time); false: not taken.
absl::StatusOr<bool> UploadStaged(CudaBackend::State& s, const TensorView& src, const TensorView& dst) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamIsCapturing(s.stream, &capture), "Copy: cudaStreamIsCapturing"));
  if (capture != cudaStreamCaptureStatusNone) return false;
  cudaPointerAttributes attributes{};
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaPointerGetAttributes(&attributes, src.data()), "Copy: cudaPointerGetAttributes"));
  if (attributes.type != cudaMemoryTypeUnregistered) return false;
  EAGLE3_RETURN_IF_ERROR(s.upload.Copy(dst.data(), src.data(), src.nbytes(), s.stream));
  return true;
}

}  // namespace

absl::Status CudaBackend::Copy(const TensorView& src, const TensorView& dst) {
  EAGLE3_RETURN_IF_ERROR(CheckCopy(src, dst));
  const Device dev = device();
  for (const auto& [name, t] :
       {std::pair<const char*, const TensorView*>{"src", &src}, {"dst", &dst}}) {
    if (t->device() != dev && !t->device().is_cpu()) {
      return Invalid("Copy", name, " is ", t->ToString(), " but this backend runs on ",
                     dev.ToString(), " (it copies within that device and to or from the host)");
    }
  }
  const bool src_on_device = src.device() == dev;
  const bool dst_on_device = dst.device() == dev;
  if (!src_on_device && !dst_on_device) {
    return Invalid("Copy", "neither src ", src.ToString(), " nor dst ", dst.ToString(), " is on ",
                   dev.ToString());
  }
  if (src.numel() == 0) return absl::OkStatus();
  if (src_on_device && dst_on_device && src.data() == dst.data()) {
    return absl::OkStatus();  // CheckCopy let through only the identical view
  }
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "Copy: cudaSetDevice"));
  const cudaMemcpyKind kind = !src_on_device  ? cudaMemcpyHostToDevice
                              : dst_on_device ? cudaMemcpyDeviceToDevice
                                              : cudaMemcpyDeviceToHost;
  const size_t elem = DTypeSize(src.dtype());
  CopyLayout l = Collapse(src, dst);
  if (l.rank == 1 && (l.src[0] != 1 || l.dst[0] != 1)) {  // a strided vector: rows of one element
    l = {2, {l.shape[0], 1}, {l.src[0], 1}, {l.dst[0], 1}};
  }
  cudaError_t error = cudaSuccess;
  if (l.rank <= 1 && kind == cudaMemcpyHostToDevice && src.nbytes() >= StagedUpload::kMinBytes) {
    EAGLE3_ASSIGN_OR_RETURN(const bool staged, UploadStaged(s, src, dst));
    if (staged) return absl::OkStatus();
  }
  if (l.rank <= 1) {
    error = cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), kind, s.stream);
  } else if (l.rank == 2 && l.src[1] == 1 && l.dst[1] == 1 && l.src[0] >= l.shape[1] &&
             l.dst[0] >= l.shape[1]) {
    error = cudaMemcpy2DAsync(dst.data(), l.dst[0] * elem, src.data(), l.src[0] * elem,
                              l.shape[1] * elem, l.shape[0], kind, s.stream);
  } else if (kind == cudaMemcpyDeviceToDevice) {
    error = LaunchStridedCopy(src.data(), l.src, dst.data(), l.dst, l.shape, l.rank,
                              static_cast<int>(elem), s.options.programmatic_launch, s.stream);
  } else {
    return Invalid("Copy",
                   "a copy between host and device needs both views contiguous, or both rows "
                   "of contiguous elements at a fixed pitch (row-strided 2-D); src ",
                   src.ToString(), " strides ", src.strides().ToString(), ", dst ", dst.ToString(),
                   " strides ", dst.strides().ToString(),
                   "; copy through a contiguous device buffer first");
  }
  if (error == cudaSuccess) return absl::OkStatus();
  return CudaStatus(error, absl::StrCat("Copy from ", src.ToString(), " to ", dst.ToString()));
}

// The views' spans in order while they fit 3/5 of the L2: the rest of the cache keeps what the step
// reads meanwhile (activations, cache rows, the streaming weights' lines in flight), and an earlier
// prefetched line evicted before its reader runs would be read twice. Each launch takes up to
// kMaxPrefetchRanges spans.
absl::Status CudaBackend::PrefetchWeights(std::span<const TensorView> weights) {
  EAGLE3_RETURN_IF_ERROR(Backend::PrefetchWeights(weights));
  State& s = *state_;
  const int64_t budget = s.l2_bytes * 3 / 5;
  int64_t taken = 0;
  PrefetchRanges ranges;
  const auto launch = [&]() -> absl::Status {
    if (ranges.count == 0) return absl::OkStatus();
    const PrefetchRanges full = ranges;
    ranges = PrefetchRanges();
    return Launched("PrefetchWeights",
                    LaunchL2Prefetch(full, 2 * std::max(s.multiprocessors, 1), s.options.programmatic_launch,
                                           s.stream));
  };
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "PrefetchWeights: cudaSetDevice"));
  for (const TensorView& w : weights) {
    if (w.empty() || w.numel() == 0) continue;
    const int64_t size = static_cast<int64_t>(DTypeSize(w.dtype()));
    // A view whose dim-0 slices lie apart (W_UV's heads within kv_b) is read slice by slice, without
    // the gaps between them.
    int64_t inner_last = 0;  // element offset of a slice's last element
    for (int i = 1; i < w.rank(); ++i) inner_last += (w.dim(i) - 1) * w.stride(i);
    const bool apart = w.rank() >= 2 && w.dim(0) > 1 && w.stride(0) > inner_last + 1;
    const int64_t pieces = apart ? w.dim(0) : 1;
    const int64_t piece_bytes = (apart || w.rank() == 0 ? inner_last + 1 : (w.dim(0) - 1) * w.stride(0) + inner_last + 1) * size;
    if (taken + pieces * piece_bytes > budget) break;
    taken += pieces * piece_bytes;
    for (int64_t p = 0; p < pieces; ++p) {
      if (ranges.count == kMaxPrefetchRanges) EAGLE3_RETURN_IF_ERROR(launch());
      AddPrefetchRange(static_cast<const char*>(w.data()) + p * (apart ? w.stride(0) : 0) * size, piece_bytes, ranges);
    }
  }
  return launch();
}

absl::Status CudaBackend::RmsNorm(const TensorView& x, const TensorView& weight, float eps,
                                  const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckRmsNorm("RmsNorm", x, nullptr, weight, eps, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("RmsNorm", "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32("RmsNorm", "weight", weight));
  EAGLE3_RETURN_IF_ERROR(CheckF32("RmsNorm", "out", out));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(*state_), "RmsNorm: cudaSetDevice"));
  return Launched("RmsNorm", LaunchRmsNorm(x.data_as<const float>(), x.stride(0), nullptr, 0,
                                           weight.data_as<const float>(), eps, out.data_as<float>(),
                                           out.stride(0), x.dim(0), x.dim(1),
                                           state_->options.programmatic_launch, state_->stream));
}

absl::Status CudaBackend::RmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                                      const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                                      float eps) {
  EAGLE3_RETURN_IF_ERROR(CheckRmsNormPair(x0, weight0, out0, x1, weight1, out1, eps, CheckF32));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(*state_), "RmsNormPair: cudaSetDevice"));
  return Launched("RmsNormPair",
                  LaunchRmsNormPair(x0.data_as<const float>(), x0.stride(0), weight0.data_as<const float>(),
                                    out0.data_as<float>(), out0.stride(0), x0.dim(1), x1.data_as<const float>(),
                                    x1.stride(0), weight1.data_as<const float>(), out1.data_as<float>(),
                                    out1.stride(0), x1.dim(1), x0.dim(0), eps, state_->options.programmatic_launch,
                                    state_->stream));
}

absl::Status CudaBackend::AddRmsNorm(const TensorView& x, const TensorView& residual,
                                     const TensorView& weight, float eps, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckRmsNorm("AddRmsNorm", x, &residual, weight, eps, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("AddRmsNorm", "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32("AddRmsNorm", "residual", residual));
  EAGLE3_RETURN_IF_ERROR(CheckF32("AddRmsNorm", "weight", weight));
  EAGLE3_RETURN_IF_ERROR(CheckF32("AddRmsNorm", "out", out));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(*state_), "AddRmsNorm: cudaSetDevice"));
  return Launched(
      "AddRmsNorm",
      LaunchRmsNorm(x.data_as<const float>(), x.stride(0), residual.data_as<float>(),
                    residual.stride(0), weight.data_as<const float>(), eps, out.data_as<float>(),
                    out.stride(0), x.dim(0), x.dim(1), state_->options.programmatic_launch,
                    state_->stream));
}

absl::Status CudaBackend::SiluMul(const TensorView& gate_up, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckSiluMul(gate_up, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("SiluMul", "gate_up", gate_up));
  EAGLE3_RETURN_IF_ERROR(CheckF32("SiluMul", "out", out));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(*state_), "SiluMul: cudaSetDevice"));
  return Launched("SiluMul", LaunchSiluMul(gate_up.data_as<const float>(), gate_up.stride(0),
                                           out.data_as<float>(), out.stride(0), out.dim(0),
                                           out.dim(1), state_->options.programmatic_launch,
                                           state_->stream));
}

// The table is f32 or bf16 (out f32). Negative ids are found on the device: Synchronize reports
// the lowest such token; its out row is zeros meanwhile.
absl::Status CudaBackend::EmbeddingLookup(const TensorView& ids, const TensorView& table,
                                          int64_t vocab_start, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckEmbeddingLookup(ids, table, vocab_start, out));
  if (table.dtype() != DType::kBF16) {
    EAGLE3_RETURN_IF_ERROR(CheckF32("EmbeddingLookup", "table", table));
  }
  EAGLE3_RETURN_IF_ERROR(CheckF32("EmbeddingLookup", "out", out));
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "EmbeddingLookup: cudaSetDevice"));
  const int code = DeviceErrorCode(DeviceCheck::kEmbeddingNegativeId);
  const auto launch = [&](const auto* id_data) {
    const auto with_table = [&](const auto* table_data) {
      return LaunchEmbeddingLookup(id_data, ids.dim(0), table_data, table.stride(0), table.dim(0),
                                   vocab_start, out.data_as<float>(), out.stride(0), table.dim(1),
                                   s.error_flag, code, s.options.programmatic_launch, s.stream);
    };
    return table.dtype() == DType::kBF16 ? with_table(table.data_as<const uint16_t>())
                                         : with_table(table.data_as<const float>());
  };
  return Launched("EmbeddingLookup", ids.dtype() == DType::kI32
                                         ? launch(ids.data_as<const int32_t>())
                                         : launch(ids.data_as<const int64_t>()));
}

// A bad row is found on the device: Synchronize reports the lowest; that row of out is unwritten.
absl::Status CudaBackend::Softmax(const TensorView& logits, float temperature,
                                  const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckSoftmax(logits, temperature, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Softmax", "logits", logits));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Softmax", "out", out));
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "Softmax: cudaSetDevice"));
  return Launched("Softmax", LaunchSoftmax(logits.data_as<const float>(), logits.stride(0),
                                           temperature, out.data_as<float>(), out.stride(0),
                                           logits.dim(0), logits.dim(1), s.error_flag,
                                           DeviceErrorCode(DeviceCheck::kSoftmaxBadRow),
                                           s.options.programmatic_launch, s.stream));
}

// A NaN row is found on the device: Synchronize reports the lowest; its out entry is unwritten.
absl::Status CudaBackend::Argmax(const TensorView& logits, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckArgmax(logits, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32("Argmax", "logits", logits));
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "Argmax: cudaSetDevice"));
  const int code = DeviceErrorCode(DeviceCheck::kArgmaxNaN);
  const auto launch = [&](auto* out_data) {
    return LaunchArgmax(logits.data_as<const float>(), logits.stride(0), logits.dim(0),
                        logits.dim(1), out_data, s.error_flag, code, s.options.programmatic_launch,
                        s.stream);
  };
  return Launched("Argmax", out.dtype() == DType::kI32 ? launch(out.data_as<int32_t>())
                                                       : launch(out.data_as<int64_t>()));
}

// k is bounded by kTopKMaxK (the selection is sorted in shared memory). A NaN row is found on the
// device: Synchronize reports the lowest; that row of the outputs is unwritten.
absl::Status CudaBackend::TopK(const TensorView& values, int k, const TensorView& out_values,
                               const TensorView& out_indices) {
  EAGLE3_RETURN_IF_ERROR(CheckTopK(values, k, out_values, out_indices));
  EAGLE3_RETURN_IF_ERROR(CheckF32("TopK", "values", values));
  EAGLE3_RETURN_IF_ERROR(CheckF32("TopK", "out_values", out_values));
  if (k > kTopKMaxK) {
    return Invalid("TopK", "k = ", k, " exceeds CudaBackend's limit of ", kTopKMaxK);
  }
  if (values.dim(1) > std::numeric_limits<int32_t>::max()) {
    return Invalid("TopK", "values ", values.ToString(),
                   " has more than 2^31 - 1 columns, CudaBackend's limit");
  }
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "TopK: cudaSetDevice"));
  const int code = DeviceErrorCode(DeviceCheck::kTopKNaN);
  const auto launch = [&](auto* index_data) {
    return LaunchTopK(values.data_as<const float>(), values.stride(0), values.dim(0), values.dim(1),
                      k, out_values.data_as<float>(), out_values.stride(0), index_data,
                      out_indices.stride(0), s.error_flag, code, s.options.programmatic_launch,
                      s.stream);
  };
  return Launched("TopK", out_indices.dtype() == DType::kI32
                              ? launch(out_indices.data_as<int32_t>())
                              : launch(out_indices.data_as<int64_t>()));
}

}  // namespace eagle3::cuda
