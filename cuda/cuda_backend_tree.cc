// CudaBackend::TreeBuildStep / TreeBuildFinalize: one launch each of the tree-build kernels
// (eagle3/cuda/tree_ops.h) on the backend's stream, on the caller's workspace and error records (a
// TreeBuildError is one [kTreeBuildErrorWidth] i64 row). No allocation and no synchronization, so a
// captured step replays them.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/tree_ops.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

static_assert(sizeof(TreeBuildError) == kTreeBuildErrorWidth * sizeof(int64_t),
              "an errors row is one TreeBuildError");

// The first of the kernels' limits `shape` exceeds, or an empty string.
std::string LimitExceeded(const TreeBuildShape& shape) {
  if (shape.batch > kTreeMaxBatch) return absl::StrCat("batch = ", shape.batch, " > ", kTreeMaxBatch);
  if (shape.topk > kTreeMaxTopk) return absl::StrCat("topk = ", shape.topk, " > ", kTreeMaxTopk);
  if (shape.num_steps > kTreeMaxSteps) {
    return absl::StrCat("num_steps = ", shape.num_steps, " > ", kTreeMaxSteps);
  }
  if (shape.num_draft_tokens > kTreeMaxNodes) {
    return absl::StrCat("num_draft_tokens = ", shape.num_draft_tokens, " > ", kTreeMaxNodes);
  }
  if (shape.vocab > kTreeMaxVocab) return absl::StrCat("vocab = ", shape.vocab, " > ", kTreeMaxVocab);
  return "";
}

// Before the shared checks, which see only that TreeBuildWorkspaceBytes is 0.
absl::Status CheckLimits(const char* op, const TreeBuildShape& shape) {
  const std::string exceeded = LimitExceeded(shape);
  if (exceeded.empty()) return absl::OkStatus();
  return Invalid(op, "TreeBuildShape ", exceeded, ", beyond the CUDA tree-build kernels' limit");
}

TreeBuildParams ParamsOf(const TreeBuildShape& shape, const TensorView& workspace,
                         const TensorView& errors) {
  TreeBuildParams p;
  p.batch = static_cast<int32_t>(shape.batch);
  p.topk = shape.topk;
  p.num_steps = shape.num_steps;
  p.num_draft_tokens = shape.num_draft_tokens;
  p.vocab = shape.vocab;
  p.workspace = workspace.data();
  p.workspace_bytes = static_cast<size_t>(workspace.numel());
  p.errors = errors.data_as<TreeBuildError>();
  return p;
}

}  // namespace

int64_t CudaBackend::TreeBuildWorkspaceBytes(const TreeBuildShape& shape) const {
  if (shape.batch < 0 || shape.topk < 1 || shape.num_steps < 1 || !LimitExceeded(shape).empty()) {
    return 0;
  }
  return static_cast<int64_t>(
      cuda::TreeBuildWorkspaceBytes(static_cast<int32_t>(shape.batch), shape.topk, shape.num_steps));
}

absl::Status CudaBackend::TreeBuildStep(const TreeBuildShape& shape, int step, const TensorView& logits,
                                        const TensorView& d2t, const TensorView& workspace,
                                        const TensorView& errors, const TensorView& frontier_tokens,
                                        const TensorView& frontier_parents) {
  const char* op = "TreeBuildStep";
  EAGLE3_RETURN_IF_ERROR(CheckLimits(op, shape));
  EAGLE3_RETURN_IF_ERROR(
      CheckTreeBuildStep(shape, step, logits, d2t, workspace, errors, frontier_tokens, frontier_parents));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "logits", logits));
  if (shape.batch == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "TreeBuildStep: cudaSetDevice"));
  TreeFrontier frontier;
  frontier.tokens = frontier_tokens.data_as<int64_t>();
  frontier.parent_global_rows = frontier_parents.data_as<int32_t>();
  // A single row may have any stride; the kernel still needs ld >= vocab.
  const int64_t ld = logits.dim(0) > 1 ? logits.stride(0) : shape.vocab;
  return CudaStatus(LaunchTreeBuildStep(ParamsOf(shape, workspace, errors), step, logits.data_as<const float>(),
                                        ld, d2t.empty() ? nullptr : d2t.data_as<const int64_t>(), frontier,
                                        s.options.programmatic_launch, s.stream),
                    "TreeBuildStep: kernel launch");
}

absl::Status CudaBackend::TreeBuildFinalize(const TreeBuildShape& shape, const TensorView& workspace,
                                            const TensorView& errors, const TensorView& root_tokens,
                                            const TensorView& root_positions, const TensorView& tokens,
                                            const TensorView& parents, const TensorView& positions,
                                            const TensorView& mask) {
  const char* op = "TreeBuildFinalize";
  EAGLE3_RETURN_IF_ERROR(CheckLimits(op, shape));
  EAGLE3_RETURN_IF_ERROR(CheckTreeBuildFinalize(shape, workspace, errors, root_tokens, root_positions, tokens,
                                                parents, positions, mask));
  if (shape.batch == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "TreeBuildFinalize: cudaSetDevice"));
  TreeBuildOutputs out;
  out.root_tokens = root_tokens.data_as<const int64_t>();
  out.root_positions = root_positions.data_as<const int64_t>();
  out.tokens = tokens.data_as<int64_t>();
  out.parents = parents.data_as<int32_t>();
  out.positions = positions.data_as<int64_t>();
  out.mask = mask.data_as<uint8_t>();  // [B, N, N] is [B * N, N]
  return CudaStatus(LaunchTreeBuildFinalize(ParamsOf(shape, workspace, errors), out,
                                            s.options.programmatic_launch, s.stream),
                    "TreeBuildFinalize: kernel launch");
}

}  // namespace eagle3::cuda
