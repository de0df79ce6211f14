// DeviceTreeVerifier: host-side validation, upload of the flattened trees, LaunchTreeVerify, and the
// device's per-sequence error records turned into the CPU verifier's Status messages.
#include "eagle3/cuda/device_tree_verifier.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_status.h"
#include "compact_ops.h"
#include "verify_ops.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

size_t Align16(size_t n) { return (n + 15) / 16 * 16; }

// Byte offsets of the arrays inside one buffer (the same layout on the host and the device, so
// one copy moves them all).
struct InputLayout {
  size_t seed_offset, row_offsets, tokens, first_child, next_sibling, bytes;
  InputLayout(int64_t batch, int64_t rows) {
    seed_offset = 0;  // {seed, offset}: staged with the trees, so a graph replay draws the new coins
    row_offsets = Align16(2 * sizeof(uint64_t));
    tokens = row_offsets + Align16(static_cast<size_t>(batch + 1) * sizeof(int32_t));
    first_child = tokens + Align16(static_cast<size_t>(rows) * sizeof(int64_t));
    next_sibling = first_child + Align16(static_cast<size_t>(rows) * sizeof(int32_t));
    bytes = next_sibling + Align16(static_cast<size_t>(rows) * sizeof(int32_t));
  }
};

// The results; Launch downloads the first download_bytes (the commit arrays stay on the device).
struct OutputLayout {
  size_t num_accepted, accepted_nodes, tokens, errors, download_bytes, commit_offsets, commit_counts, bytes;
  OutputLayout(int64_t batch, int64_t max_nodes) {
    num_accepted = 0;
    accepted_nodes = Align16(static_cast<size_t>(batch) * sizeof(int32_t));
    tokens = accepted_nodes + Align16(static_cast<size_t>(batch * max_nodes) * sizeof(int32_t));
    errors = tokens + Align16(static_cast<size_t>(batch * max_nodes) * sizeof(int64_t));
    download_bytes = errors + Align16(static_cast<size_t>(batch) * sizeof(VerifyError));
    commit_offsets = download_bytes;
    commit_counts = commit_offsets + Align16(static_cast<size_t>(batch * max_nodes) * sizeof(int32_t));
    bytes = commit_counts + Align16(static_cast<size_t>(batch) * sizeof(int32_t));
  }
};

std::string Str(int64_t v) { return std::to_string(v); }

// The CPU verifier's message for a device error record of sequence b.
absl::Status DeviceError(int64_t b, const VerifyError& e, int64_t vocab) {
  const std::string seq = "verify: sequence " + Str(b) + ": ";
  switch (static_cast<VerifyErrorKind>(e.kind)) {
    case VerifyErrorKind::kNaN:
      return absl::InvalidArgumentError(seq + "target logits row " + Str(e.row) + " has NaN at token id " +
                                        Str(e.token));
    case VerifyErrorKind::kPosInf:
      return absl::InvalidArgumentError(seq + "target logits row " + Str(e.row) + " has +inf at token id " +
                                        Str(e.token));
    case VerifyErrorKind::kNoFiniteLogit:
      return absl::InvalidArgumentError(seq + "target logits row " + Str(e.row) +
                                        " has no finite logit (all -inf)");
    case VerifyErrorKind::kTokenOutOfRange:
      return absl::InvalidArgumentError(seq + "node " + Str(e.row) + " token " + Str(e.token) +
                                        " is out of range [0, " + Str(vocab) + ")");
    case VerifyErrorKind::kBadTree:
      return absl::InvalidArgumentError(seq + "node " + Str(e.row) +
                                        ": the device could not follow its first_child / next_sibling entries");
    case VerifyErrorKind::kNone:
      break;
  }
  return absl::InternalError(seq + "unknown device error kind " + Str(e.kind));
}

}  // namespace

struct DeviceTreeVerifier::State {
  DeviceTreeVerifierOptions options;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  int64_t max_rows = 0;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  char* device_in = nullptr;
  char* device_out = nullptr;
  char* host_in = nullptr;  // pinned
  char* host_out = nullptr;  // pinned
  // The staged step (Stage -> Launch -> Finish).
  bool staged = false;
  int64_t batch = 0, rows = 0;
  std::vector<int32_t> sizes;  // nodes per staged tree; capacity max_batch, reserved at Create
  TensorView logits;
  SamplingParams sampling;
  uint64_t seed = 0, offset = 0;

  ~State() {
    cudaSetDevice(options.device);
    if (stream != nullptr) cudaStreamSynchronize(stream);
    cudaFree(workspace);
    cudaFree(device_in);
    cudaFree(device_out);
    cudaFreeHost(host_in);
    cudaFreeHost(host_out);
    if (owns_stream && stream != nullptr) cudaStreamDestroy(stream);
  }
};

DeviceTreeVerifier::DeviceTreeVerifier(std::unique_ptr<State> state) : state_(std::move(state)) {}
DeviceTreeVerifier::~DeviceTreeVerifier() = default;

cudaStream_t DeviceTreeVerifier::stream() const { return state_->stream; }

absl::StatusOr<std::unique_ptr<DeviceTreeVerifier>> DeviceTreeVerifier::Create(
    const DeviceTreeVerifierOptions& options) {
  if (options.max_batch < 1 || options.max_nodes < 1 || options.max_nodes > kVerifyMaxNodes ||
      options.max_vocab < 1 || options.max_vocab > kVerifyMaxVocab || options.device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceTreeVerifier: options max_batch = ", options.max_batch, ", max_nodes = ", options.max_nodes,
        ", max_vocab = ", options.max_vocab, ", device = ", options.device,
        "; expected max_batch >= 1, max_nodes in [1, ", kVerifyMaxNodes, "], max_vocab in [1, ",
        kVerifyMaxVocab, "], device >= 0"));
  }
  auto state = std::make_unique<State>();
  State& s = *state;
  s.options = options;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options.device), "DeviceTreeVerifier: cudaSetDevice"));
  if (options.stream != nullptr) {
    s.stream = options.stream;
  } else {
    EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
                                      "DeviceTreeVerifier: cudaStreamCreate"));
    s.owns_stream = true;
  }
  s.max_rows = static_cast<int64_t>(options.max_batch) * options.max_nodes;
  s.workspace_bytes = TreeVerifyWorkspaceBytes(s.max_rows, options.max_vocab);
  const InputLayout in(options.max_batch, s.max_rows);
  const OutputLayout out(options.max_batch, options.max_nodes);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&s.workspace, s.workspace_bytes), "DeviceTreeVerifier: cudaMalloc"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&s.device_in), in.bytes),
                                    "DeviceTreeVerifier: cudaMalloc"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMalloc(reinterpret_cast<void**>(&s.device_out), out.bytes),
                                    "DeviceTreeVerifier: cudaMalloc"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(reinterpret_cast<void**>(&s.host_in), in.bytes),
                                    "DeviceTreeVerifier: cudaMallocHost"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(reinterpret_cast<void**>(&s.host_out), out.download_bytes),
                                    "DeviceTreeVerifier: cudaMallocHost"));
  s.sizes.reserve(static_cast<size_t>(options.max_batch));
  return std::unique_ptr<DeviceTreeVerifier>(new DeviceTreeVerifier(std::move(state)));
}

absl::StatusOr<std::vector<VerifyResult>> DeviceTreeVerifier::Verify(std::span<const DraftTree> trees,
                                                                     const TensorView& logits,
                                                                     const SamplingParams& sampling,
                                                                     uint64_t seed, uint64_t offset) {
  EAGLE3_RETURN_IF_ERROR(Stage(trees, logits, sampling, seed, offset));
  EAGLE3_RETURN_IF_ERROR(Launch());
  return Finish();
}

absl::Status DeviceTreeVerifier::Stage(std::span<const DraftTree> trees, const TensorView& logits,
                                       const SamplingParams& sampling, uint64_t seed, uint64_t offset) {
  State& s = *state_;
  s.staged = false;
  s.batch = 0;
  const int64_t batch = static_cast<int64_t>(trees.size());
  if (batch > s.options.max_batch) {
    return absl::InvalidArgumentError("verify: batch of " + Str(batch) + " sequences exceeds max_batch " +
                                      Str(s.options.max_batch) + " of this DeviceTreeVerifier");
  }
  EAGLE3_RETURN_IF_ERROR(sampling.Validate());
  int64_t rows = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const DraftTree& tree = trees[b];
    if (absl::Status st = tree.Validate(); !st.ok()) {
      return absl::InvalidArgumentError("verify: sequence " + Str(b) + ": " + std::string(st.message()));
    }
    if (tree.size() > s.options.max_nodes) {
      return absl::InvalidArgumentError("verify: sequence " + Str(b) + ": tree of " + Str(tree.size()) +
                                        " nodes exceeds max_nodes " + Str(s.options.max_nodes) +
                                        " of this DeviceTreeVerifier");
    }
    rows += tree.size();
  }
  const int64_t vocab = logits.rank() == 2 ? logits.dim(1) : 0;
  if (batch > 0) {
    const bool dtype_ok = logits.dtype() == DType::kF32 || logits.dtype() == DType::kBF16;
    if (logits.rank() != 2 || !dtype_ok || !logits.device().is_cuda() ||
        logits.device().index != s.options.device || logits.dim(0) != rows || vocab < 1 ||
        vocab > s.options.max_vocab || (vocab > 1 && logits.stride(1) != 1) ||
        (rows > 1 && logits.stride(0) < vocab) || logits.data() == nullptr) {
      return absl::InvalidArgumentError(
          "verify: target logits are " + logits.ToString() + (logits.data() == nullptr ? " (null)" : "") +
          ", expected f32 or bf16[" + Str(rows) + ", V] on cuda:" + Str(s.options.device) +
          " with unit stride along the vocabulary, V in [1, " + Str(s.options.max_vocab) + "] (" + Str(rows) +
          " tree nodes over " + Str(batch) + " sequences)");
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    const DraftTree& tree = trees[b];
    for (int i = 1; i < tree.size(); ++i) {
      if (tree.tokens[i] < 0 || tree.tokens[i] >= vocab) {
        return absl::InvalidArgumentError("verify: sequence " + Str(b) + ": node " + Str(i) + " token " +
                                          Str(tree.tokens[i]) + " is out of range [0, " + Str(vocab) + ")");
      }
    }
  }

  // Flatten into the pinned staging buffer (Launch uploads it in one copy).
  const InputLayout in(s.options.max_batch, s.max_rows);
  auto* seed_offset = reinterpret_cast<uint64_t*>(s.host_in + in.seed_offset);
  seed_offset[0] = seed;
  seed_offset[1] = offset;
  auto* row_offsets = reinterpret_cast<int32_t*>(s.host_in + in.row_offsets);
  auto* tokens = reinterpret_cast<int64_t*>(s.host_in + in.tokens);
  auto* first_child = reinterpret_cast<int32_t*>(s.host_in + in.first_child);
  auto* next_sibling = reinterpret_cast<int32_t*>(s.host_in + in.next_sibling);
  s.sizes.clear();
  int32_t row = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const DraftTree& tree = trees[b];
    row_offsets[b] = row;
    std::memcpy(tokens + row, tree.tokens.data(), tree.tokens.size() * sizeof(int64_t));
    std::memcpy(first_child + row, tree.first_child.data(), tree.first_child.size() * sizeof(int32_t));
    std::memcpy(next_sibling + row, tree.next_sibling.data(), tree.next_sibling.size() * sizeof(int32_t));
    row += tree.size();
    s.sizes.push_back(tree.size());
  }
  row_offsets[batch] = row;
  s.batch = batch;
  s.rows = rows;
  s.logits = logits;
  s.sampling = sampling;
  s.seed = seed;
  s.offset = offset;
  s.staged = true;
  return absl::OkStatus();
}

absl::Status DeviceTreeVerifier::Launch() {
  State& s = *state_;
  if (!s.staged) return absl::FailedPreconditionError("DeviceTreeVerifier::Launch: nothing is staged");
  if (s.batch == 0) return absl::OkStatus();
  const InputLayout in(s.options.max_batch, s.max_rows);
  const OutputLayout out(s.options.max_batch, s.options.max_nodes);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(s.options.device), "DeviceTreeVerifier: cudaSetDevice"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(s.device_in, s.host_in, in.bytes, cudaMemcpyHostToDevice, s.stream),
                                    "DeviceTreeVerifier: upload"));
  const TensorView& logits = s.logits;
  const int64_t vocab = logits.dim(1);
  TreeVerifyLaunchParams p;
  p.batch = static_cast<int32_t>(s.batch);
  p.row_offsets = reinterpret_cast<const int32_t*>(s.device_in + in.row_offsets);
  p.total_rows = s.rows;
  p.max_nodes = s.options.max_nodes;
  p.tokens = reinterpret_cast<const int64_t*>(s.device_in + in.tokens);
  p.first_child = reinterpret_cast<const int32_t*>(s.device_in + in.first_child);
  p.next_sibling = reinterpret_cast<const int32_t*>(s.device_in + in.next_sibling);
  p.logits = logits.data();
  p.logits_type = logits.dtype() == DType::kF32 ? VerifyLogitsType::kF32 : VerifyLogitsType::kBf16;
  p.ld = s.rows > 1 ? logits.stride(0) : vocab;
  p.vocab = vocab;
  p.temperature = s.sampling.temperature;
  p.top_k = s.sampling.top_k;
  p.top_p = s.sampling.top_p;
  p.seed = s.seed;
  p.offset = s.offset;
  p.seed_offset = reinterpret_cast<const uint64_t*>(s.device_in + in.seed_offset);
  p.workspace = s.workspace;
  p.workspace_bytes = s.workspace_bytes;
  p.num_accepted = reinterpret_cast<int32_t*>(s.device_out + out.num_accepted);
  p.accepted_nodes = reinterpret_cast<int32_t*>(s.device_out + out.accepted_nodes);
  p.out_tokens = reinterpret_cast<int64_t*>(s.device_out + out.tokens);
  p.errors = reinterpret_cast<VerifyError*>(s.device_out + out.errors);
  // Programmatic launches: the kernels wait for the work before them, so only their launches overlap.
  EAGLE3_RETURN_IF_ERROR(CudaStatus(LaunchTreeVerify(p, /*programmatic=*/true, s.stream), "verify: LaunchTreeVerify"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      LaunchVerifyCommitOffsets(p.num_accepted, p.accepted_nodes, p.batch, p.max_nodes,
                                reinterpret_cast<int32_t*>(s.device_out + out.commit_offsets),
                                reinterpret_cast<int32_t*>(s.device_out + out.commit_counts),
                                /*programmatic=*/true, s.stream),
      "verify: LaunchVerifyCommitOffsets"));
  return CudaStatus(cudaMemcpyAsync(s.host_out, s.device_out, out.download_bytes, cudaMemcpyDeviceToHost, s.stream),
                    "DeviceTreeVerifier: download");
}

absl::StatusOr<std::vector<VerifyResult>> DeviceTreeVerifier::Finish() {
  State& s = *state_;
  if (!s.staged) return absl::FailedPreconditionError("DeviceTreeVerifier::Finish: nothing is staged");
  std::vector<VerifyResult> results;
  if (s.batch == 0) return results;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(s.options.device), "DeviceTreeVerifier: cudaSetDevice"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(s.stream), "DeviceTreeVerifier: cudaStreamSynchronize"));
  const OutputLayout out(s.options.max_batch, s.options.max_nodes);
  const auto* num_accepted = reinterpret_cast<const int32_t*>(s.host_out + out.num_accepted);
  const auto* accepted_nodes = reinterpret_cast<const int32_t*>(s.host_out + out.accepted_nodes);
  const auto* out_tokens = reinterpret_cast<const int64_t*>(s.host_out + out.tokens);
  const auto* errors = reinterpret_cast<const VerifyError*>(s.host_out + out.errors);
  for (int64_t b = 0; b < s.batch; ++b) {
    if (errors[b].kind != static_cast<int64_t>(VerifyErrorKind::kNone)) {
      return DeviceError(b, errors[b], s.logits.dim(1));
    }
  }
  results.resize(static_cast<size_t>(s.batch));
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t n = num_accepted[b];
    const int32_t size = s.sizes[static_cast<size_t>(b)];
    if (n < 0 || n >= size) {
      return absl::InternalError("verify: sequence " + Str(b) + ": the device reported " + Str(n) +
                                 " accepted nodes for a tree of " + Str(size));
    }
    const int64_t at = b * s.options.max_nodes;
    results[b].accepted_nodes.assign(accepted_nodes + at, accepted_nodes + at + n);
    results[b].tokens.assign(out_tokens + at, out_tokens + at + n + 1);
  }
  return results;
}

namespace {

// The staged batch's part of one device result array: [batch] or, for a matrix, [batch, max_nodes].
TensorView OutputView(const DeviceTreeVerifierOptions& options, char* device_out, int64_t batch,
                      size_t OutputLayout::*field, DType dtype, bool matrix) {
  const OutputLayout out(options.max_batch, options.max_nodes);
  void* data = device_out + out.*field;
  const Device device = Device::Cuda(options.device);
  if (!matrix) return TensorView(data, dtype, Shape{batch}, Shape{1}, device);
  return TensorView(data, dtype, Shape{batch, options.max_nodes}, Shape{options.max_nodes, 1}, device);
}

}  // namespace

TensorView DeviceTreeVerifier::num_accepted() const {
  return OutputView(state_->options, state_->device_out, state_->batch, &OutputLayout::num_accepted, DType::kI32, false);
}
TensorView DeviceTreeVerifier::accepted_nodes() const {
  return OutputView(state_->options, state_->device_out, state_->batch, &OutputLayout::accepted_nodes, DType::kI32, true);
}
TensorView DeviceTreeVerifier::out_tokens() const {
  return OutputView(state_->options, state_->device_out, state_->batch, &OutputLayout::tokens, DType::kI64, true);
}
TensorView DeviceTreeVerifier::commit_offsets() const {
  return OutputView(state_->options, state_->device_out, state_->batch, &OutputLayout::commit_offsets, DType::kI32, true);
}
TensorView DeviceTreeVerifier::commit_counts() const {
  return OutputView(state_->options, state_->device_out, state_->batch, &OutputLayout::commit_counts, DType::kI32, false);
}

}  // namespace eagle3::cuda
