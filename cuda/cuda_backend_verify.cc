// CudaBackend's verification and row-gather ops of the speculative step. TreeVerify is three
// kernels and no host synchronization: the trees' lists from the parents
// (LaunchTreeListsFromParents), the verifier (LaunchTreeVerify) and the commit offsets
// (LaunchVerifyCommitOffsets). Its scratch (the lists and the verifier's workspace) is allocated on
// the first eager call and grown only when a larger shape comes, keeping the outgrown buffers (a
// captured graph may still use them); growing it while the stream is being captured is
// FailedPrecondition: run the step once before capturing. GatherRows and ExtendMaskRows are one
// kernel each; their bad indices reach Synchronize through the error flag.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "compact_ops.h"
#include "eagle3/cuda/cuda_backend.h"
#include "step_ops.h"
#include "verify_ops.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

// Byte offsets inside one scratch buffer for B trees of N nodes over V logits.
struct VerifyScratchLayout {
  size_t workspace_bytes, row_offsets, first_child, next_sibling, bytes;
  VerifyScratchLayout(int64_t batch, int64_t nodes, int64_t vocab) {
    const int64_t rows = batch * nodes;
    workspace_bytes = TreeVerifyWorkspaceBytes(rows, vocab);  // at offset 0
    row_offsets = Align256(workspace_bytes);
    first_child = row_offsets + Align256(static_cast<size_t>(batch + 1) * sizeof(int32_t));
    next_sibling = first_child + Align256(static_cast<size_t>(rows) * sizeof(int32_t));
    bytes = next_sibling + Align256(static_cast<size_t>(rows) * sizeof(int32_t));
  }
};

struct VerifyScratch {
  explicit VerifyScratch(DeviceAllocator* allocator) : allocator(allocator) {}
  ~VerifyScratch() {
    for (const auto& [buffer, bytes] : buffers) allocator->Deallocate(buffer, bytes);
  }
  VerifyScratch(const VerifyScratch&) = delete;
  VerifyScratch& operator=(const VerifyScratch&) = delete;

  DeviceAllocator* allocator;  // State::allocator, which outlives this
  std::vector<std::pair<void*, size_t>> buffers;
};

// `bytes` of TreeVerify scratch: the current buffer, or a new one at least twice its size.
absl::StatusOr<char*> VerifyScratchBuffer(CudaBackend::State& s, size_t bytes) {
  if (!s.verify_scratch) s.verify_scratch = std::make_shared<VerifyScratch>(&s.allocator);
  auto& scratch = *static_cast<VerifyScratch*>(s.verify_scratch.get());
  const size_t have = scratch.buffers.empty() ? 0 : scratch.buffers.back().second;
  if (have >= bytes) return static_cast<char*>(scratch.buffers.back().first);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamIsCapturing(s.stream, &capture), "TreeVerify: cudaStreamIsCapturing"));
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "TreeVerify: its scratch needs ", bytes, " bytes but ", have,
        " are allocated, and the stream is being captured into a CUDA graph (no allocation there); run the "
        "step once with this shape before capturing"));
  }
  const size_t grown = std::max(bytes, 2 * have);
  EAGLE3_ASSIGN_OR_RETURN(void* buffer, s.allocator.Allocate(grown, 256));
  scratch.buffers.emplace_back(buffer, grown);
  return static_cast<char*>(buffer);
}

// Bytes between rows of a row-strided matrix as a kernel reads it (a single row: its own size).
int64_t RowStrideBytes(const TensorView& t) {
  const auto elem = static_cast<int64_t>(DTypeSize(t.dtype()));
  return (t.dim(0) > 1 ? t.stride(0) : t.dim(1)) * elem;
}

}  // namespace

absl::Status CudaBackend::TreeVerify(const TensorView& tokens, const TensorView& parents, const TensorView& logits,
                                     const SamplingParams& sampling, const TensorView& seed_offset,
                                     const TreeVerifyOutputs& out) {
  const char* op = "TreeVerify";
  EAGLE3_RETURN_IF_ERROR(CheckTreeVerify(tokens, parents, logits, sampling, seed_offset, out));
  if (logits.dtype() != DType::kF32 && logits.dtype() != DType::kBF16) {
    return Invalid(op, "logits is ", logits.ToString(), " but CudaBackend::", op, " takes f32 or bf16 logits (got ",
                   std::string(DTypeName(logits.dtype())), ")");
  }
  const int64_t batch = tokens.dim(0);
  const int64_t nodes = tokens.dim(1);
  const int64_t vocab = logits.dim(1);
  const int64_t rows = batch * nodes;
  if (nodes > kVerifyMaxNodes || vocab > kVerifyMaxVocab || rows > (int64_t{1} << 31) / 64) {
    return Invalid(op, "tokens ", tokens.ToString(), " and logits ", logits.ToString(),
                   " exceed CudaBackend's limits: N <= ", kVerifyMaxNodes, " nodes, V <= ", kVerifyMaxVocab,
                   ", B * N <= ", (int64_t{1} << 31) / 64);
  }
  if (batch == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "TreeVerify: cudaSetDevice"));
  const VerifyScratchLayout layout(batch, nodes, vocab);
  EAGLE3_ASSIGN_OR_RETURN(char* scratch, VerifyScratchBuffer(s, layout.bytes));
  auto* row_offsets = reinterpret_cast<int32_t*>(scratch + layout.row_offsets);
  auto* first_child = reinterpret_cast<int32_t*>(scratch + layout.first_child);
  auto* next_sibling = reinterpret_cast<int32_t*>(scratch + layout.next_sibling);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      LaunchTreeListsFromParents(parents.data_as<const int32_t>(), static_cast<int32_t>(batch),
                                 static_cast<int32_t>(nodes), row_offsets, first_child, next_sibling,
                                 s.options.programmatic_launch, s.stream),
      "TreeVerify: LaunchTreeListsFromParents"));
  TreeVerifyLaunchParams p;
  p.batch = static_cast<int32_t>(batch);
  p.row_offsets = row_offsets;
  p.total_rows = rows;
  p.max_nodes = static_cast<int32_t>(nodes);
  p.tokens = tokens.data_as<const int64_t>();
  p.first_child = first_child;
  p.next_sibling = next_sibling;
  p.logits = logits.data();
  p.logits_type = logits.dtype() == DType::kF32 ? VerifyLogitsType::kF32 : VerifyLogitsType::kBf16;
  p.ld = rows > 1 ? logits.stride(0) : vocab;
  p.vocab = vocab;
  p.temperature = sampling.temperature;
  p.top_k = sampling.top_k;
  p.top_p = sampling.top_p;
  // Read by the kernels when they run, so a captured call draws the coins the buffer then holds.
  p.seed_offset = seed_offset.data_as<const uint64_t>();
  p.workspace = scratch;
  p.workspace_bytes = layout.workspace_bytes;
  p.num_accepted = out.num_accepted.data_as<int32_t>();
  p.accepted_nodes = out.accepted.data_as<int32_t>();
  p.out_tokens = out.out_tokens.data_as<int64_t>();
  static_assert(sizeof(VerifyError) == kVerifyErrorWidth * sizeof(int64_t));
  p.errors = out.errors.data_as<VerifyError>();
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(LaunchTreeVerify(p, s.options.programmatic_launch, s.stream), "TreeVerify: LaunchTreeVerify"));
  return CudaStatus(LaunchVerifyCommitOffsets(p.num_accepted, p.accepted_nodes, p.batch, p.max_nodes,
                                              out.commit_offsets.data_as<int32_t>(),
                                              out.commit_counts.data_as<int32_t>(), s.options.programmatic_launch,
                                              s.stream),
                    "TreeVerify: LaunchVerifyCommitOffsets");
}

absl::Status CudaBackend::GatherRows(const TensorView& src, const TensorView& index, const TensorView& out,
                                     int64_t groups) {
  EAGLE3_RETURN_IF_ERROR(CheckGatherRows(src, index, out, groups));
  if (index.dim(0) == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "GatherRows: cudaSetDevice"));
  const int64_t row_bytes = src.dim(1) * static_cast<int64_t>(DTypeSize(src.dtype()));
  return CudaStatus(LaunchGatherRows(src.data(), RowStrideBytes(src), src.dim(0), groups, index.data_as<const int32_t>(),
                                     index.dim(0), out.data(), RowStrideBytes(out), row_bytes, s.error_flag,
                                     DeviceErrorCode(DeviceCheck::kGatherRowsIndex), s.options.programmatic_launch,
                                     s.stream),
                    "GatherRows: kernel launch");
}

absl::Status CudaBackend::ExtendMaskRows(const TensorView& src, const TensorView& parent, const TensorView& column,
                                         const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckExtendMaskRows(src, parent, column, out));
  if (parent.dim(0) == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "ExtendMaskRows: cudaSetDevice"));
  return CudaStatus(LaunchExtendMaskRows(src.data_as<const uint8_t>(), RowStrideBytes(src), src.dim(0),
                                         parent.data_as<const int32_t>(), column.data_as<const int32_t>(),
                                         parent.dim(0), out.data_as<uint8_t>(), RowStrideBytes(out), src.dim(1),
                                         s.error_flag, DeviceErrorCode(DeviceCheck::kExtendMaskRowsIndex),
                                         s.options.programmatic_launch, s.stream),
                    "ExtendMaskRows: kernel launch");
}

}  // namespace eagle3::cuda
