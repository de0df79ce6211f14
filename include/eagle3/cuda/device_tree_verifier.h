// DeviceTreeVerifier: eagle3::TreeVerifier on the GPU (docs/semantics.md, verification), for callers that
// hold their trees on the host and their target logits on the device. It validates what the CPU
// verifier validates (sampling parameters, each tree, the logits' shape, dtype and device, drafted
// tokens in [0, V)), uploads the flattened trees into buffers allocated at Create, runs
// LaunchTreeVerify (cuda/verify_ops.h), synchronizes its stream and returns the same
// VerifyResults as TreeVerifier::Verify (same coins; see verify_ops.h for where float arithmetic can
// differ). Bad logits (NaN, +inf, a row without a finite logit) are found on the device and become
// the CPU verifier's InvalidArgument, naming the sequence, the row and the token id.
//
// Verify = Stage + Launch + Finish. An engine that keeps the decode step on the device calls Stage,
// then Launch (capturable in a CUDA graph together with TargetModel::CommitAcceptedOnDevice, which
// takes commit_offsets() / commit_counts() directly), and Finish only where it needs the results on
// the host.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "eagle3/draft_tree.h"
#include "eagle3/export.h"
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

class EAGLE3_API DeviceTreeVerifier {
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
  // Synchronizes the stream before returning. Equal to Stage, Launch, Finish.
  absl::StatusOr<std::vector<VerifyResult>> Verify(std::span<const DraftTree> trees, const TensorView& logits,
                                                   const SamplingParams& sampling, uint64_t seed,
                                                   uint64_t offset);

  // Verify in three steps:
  //  - Stage validates as Verify does and flattens the trees into pinned staging. Host only:
  //    nothing is enqueued and nothing allocated. The logits view, sampling, seed and offset are
  //    kept for Launch; `trees` is not kept. It overwrites the staging the previous Launch (or
  //    replay) uploads from: call Finish (or synchronize stream()) before the next Stage.
  //  - Launch enqueues on stream(): the upload of the staged trees (an async copy from pinned
  //    memory, which a captured graph reads at replay time), the verify kernels, the commit offsets
  //    (LaunchVerifyCommitOffsets, cuda/compact_ops.h) and the download of the results into
  //    pinned memory. It never allocates, waits or reads a result on the host, so it can be captured.
  //    A capture keeps the batch size, the total node count, the logits view (pointer, V, row
  //    stride, dtype) and the sampling parameters of the Stage before it: a replay is valid after a
  //    later Stage with all of these equal (tree shapes and tokens may differ). The seed and offset
  //    travel with the staged trees, so a replay draws the coins of the Stage before it.
  //  - Finish waits for the stream and returns Verify's results (device errors as Verify reports
  //    them) for the last Launch or replay.
  // FailedPrecondition for Launch or Finish before any Stage.
  absl::Status Stage(std::span<const DraftTree> trees, const TensorView& logits, const SamplingParams& sampling,
                     uint64_t seed, uint64_t offset);
  absl::Status Launch();
  absl::StatusOr<std::vector<VerifyResult>> Finish();

  // The device results Launch writes, for the staged batch of B sequences (B = 0 before any Stage);
  // valid once the stream has run Launch's work, overwritten by the next Launch. cuda:options.device.
  //   num_accepted:   [B] i32: accepted drafted nodes, -1 for a sequence with an error
  //   accepted_nodes: [B, max_nodes] i32: the accepted node ids, root excluded (num_accepted each)
  //   out_tokens:     [B, max_nodes] i64: their tokens, then the bonus / correction token
  //   commit_offsets: [B, max_nodes] i32: {0, accepted_nodes...}: the KV offsets (from the cache_len
  //                   the trees were verified at: node i sits at offset i) to keep, the root first
  //   commit_counts:  [B] i32: num_accepted + 1, or -1 for a sequence with an error (skipped by
  //                   Backend::CompactAccepted / TargetModel::CommitAcceptedOnDevice)
  TensorView num_accepted() const;
  TensorView accepted_nodes() const;
  TensorView out_tokens() const;
  TensorView commit_offsets() const;
  TensorView commit_counts() const;

  cudaStream_t stream() const;

 private:
  struct State;
  explicit DeviceTreeVerifier(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace eagle3::cuda
