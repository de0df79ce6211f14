// DeviceTreeVerifier: eagle3::TreeVerifier on the GPU (DESIGN §3 "Verification"), for callers that
// hold their trees on the host and their target logits on the device. It validates what the CPU
// verifier validates (sampling parameters, each tree, the logits' shape, dtype and device, drafted
// tokens in [0, V)), uploads the flattened trees into buffers allocated at Create, runs
// LaunchTreeVerify (eagle3/cuda/verify_ops.h), synchronizes its stream and returns the same
// VerifyResults as TreeVerifier::Verify (same coins; see verify_ops.h for where float arithmetic can
// differ). Bad logits (NaN, +inf, a row without a finite logit) are found on the device and become
// the CPU verifier's InvalidArgument, naming the sequence, the row and the token id.
//
// An engine that keeps the decode step on the device calls LaunchTreeVerify directly on its own
// buffers instead; this class is the host-side convenience and the reference harness for it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "eagle3/draft_tree.h"
#include "eagle3/tensor_view.h"
#include "eagle3/tree_verifier.h"

namespace eagle3::cuda {

struct DeviceTreeVerifierOptions {
  int device = 0;                 // CUDA ordinal of the logits and of every buffer
  int max_batch = 32;             // sequences per Verify call
  int max_nodes = 64;             // nodes per tree (root included), <= kVerifyMaxNodes
  int64_t max_vocab = 163840;     // <= kVerifyMaxVocab
  cudaStream_t stream = nullptr;  // where Verify runs; nullptr: a stream the verifier creates
};

class DeviceTreeVerifier {
 public:
  // Allocates every buffer (device workspace, inputs, outputs; pinned host staging). InvalidArgument
  // for options out of range; ResourceExhausted / Internal for CUDA failures.
  static absl::StatusOr<std::unique_ptr<DeviceTreeVerifier>> Create(const DeviceTreeVerifierOptions& options = {});
  ~DeviceTreeVerifier();
  DeviceTreeVerifier(const DeviceTreeVerifier&) = delete;
  DeviceTreeVerifier& operator=(const DeviceTreeVerifier&) = delete;

  // Verifies trees[b] against rows [o_b, o_b + N_b) of `logits`, o_b = Σ_{c < b} N_c.
  //   trees:  at most max_batch valid DraftTrees of at most max_nodes nodes each
  //   logits: [Σ N_b, V], f32 or bf16, on CUDA device options.device, unit stride along V (rows
  //           may be strided), V <= max_vocab; written by work ordered before this call's stream
  //   sampling, seed, offset: as TreeVerifier::Verify (sequence b draws Philox stream b)
  // Synchronizes the stream before returning.
  absl::StatusOr<std::vector<VerifyResult>> Verify(std::span<const DraftTree> trees, const TensorView& logits,
                                                   const SamplingParams& sampling, uint64_t seed,
                                                   uint64_t offset);

  cudaStream_t stream() const;

 private:
  struct State;
  explicit DeviceTreeVerifier(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace eagle3::cuda
