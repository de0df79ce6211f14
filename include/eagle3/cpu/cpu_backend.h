// The fp32 CPU reference backend: the semantics every other backend is checked against in CI.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "eagle3/allocator.h"
#include "eagle3/backend.h"
#include "eagle3/export.h"

namespace eagle3::cpu {

struct CpuBackendOptions {
  // Threads for Gemm (the caller's thread plus num_threads - 1 workers owned by the backend);
  // values below 1 mean 1. Keep 1 when each TP rank already runs on its own thread.
  int num_threads = 1;
  // Where allocator() hands out memory; nullptr means DefaultHostAllocator(). Must outlive the
  // backend and allocate host memory.
  Allocator* allocator = nullptr;
};

// Every op of Backend on host memory (Device::Cpu()), computing in fp32. Floating-point tensors
// must be f32 (convert other dtypes with ConvertTensor first), except Gemm's bf16 weights under
// GemmOptions::keep_f32_activations (widened exactly: the f32 product of the same values); Copy
// moves any dtype. Synchronous: Synchronize() has nothing to wait for. Attention, LatentAttention,
// BatchedLatentAttention, BatchedLatentAttentionKeyMask, BatchedPagedAttention, MoeRoute,
// MoeExperts, QuantizedMoeExperts, QuantizedGemm and Gemm with bf16 weights use a scratch buffer
// owned by the backend that grows to the largest size asked for (context length, expert count, 3 *
// expert intermediate size, a quantized or bf16 weight's N x K, one quantized expert's 3 I H
// weights plus T k H per-slot outputs) and is then reused: reserve it with a first call at the
// largest shapes if no call may allocate.
class EAGLE3_API CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options = CpuBackendOptions());
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  int num_threads() const;

  Device device() const override { return Device::Cpu(); }
  Allocator& allocator() override { return *allocator_; }

  absl::Status Copy(const TensorView& src, const TensorView& dst) override;
  absl::Status Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                    const GemmOptions& options) override;
  // Dequantizes w exactly (DequantizeWeight) into the scratch, then runs Gemm: the result is Gemm's
  // with the f32 weights ReadWeightShard loads. keeps_quantized() is false: models load quantized
  // checkpoints dequantized on this backend.
  absl::Status QuantizedGemm(const TensorView& a, const QuantizedWeightView& w, const TensorView& c,
                             const GemmOptions& options) override;
  // The host tiler (eagle3/detail/quant_tiles.h), the reference of every backend's.
  absl::Status TileQuantizedCodes(const QuantizedWeightView& w, const TensorView& tiles) override;
  absl::Status RmsNorm(const TensorView& x, const TensorView& weight, float eps,
                       const TensorView& out) override;
  // Checks both halves' dtypes (f32) before writing either, then runs Backend's default (two
  // RmsNorm calls).
  absl::Status RmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                           const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                           float eps) override;
  absl::Status AddRmsNorm(const TensorView& x, const TensorView& residual, const TensorView& weight,
                          float eps, const TensorView& out) override;
  absl::Status SiluMul(const TensorView& gate_up, const TensorView& out) override;
  absl::Status EmbeddingLookup(const TensorView& ids, const TensorView& table, int64_t vocab_start,
                               const TensorView& out) override;
  absl::Status Softmax(const TensorView& logits, float temperature, const TensorView& out) override;
  absl::Status Argmax(const TensorView& logits, const TensorView& out) override;
  absl::Status TopK(const TensorView& values, int k, const TensorView& out_values,
                    const TensorView& out_indices) override;
  absl::Status ApplyRope(const TensorView& x, int64_t offset, int64_t rope_dim,
                         const TensorView& positions, const TensorView& cos_sin,
                         RopeStyle style) override;
  absl::Status Attention(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& mask, float scale, const TensorView& out) override;
  absl::Status LatentAttention(const TensorView& q, const TensorView& cache,
                               const TensorView& page_table, int64_t context_len,
                               const TensorView& mask, float scale, int64_t value_dim,
                               const TensorView& out) override;
  absl::Status BatchedLatentAttention(const TensorView& q, const TensorView& cache,
                                      const TensorView& page_tables, const TensorView& q_start,
                                      const TensorView& kv_len, int64_t max_kv_len,
                                      const TensorView& tree_mask, float scale, int64_t value_dim,
                                      const TensorView& out) override;
  absl::Status BatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                             const TensorView& page_tables, const TensorView& q_start,
                                             const TensorView& kv_len, int64_t max_kv_len,
                                             const TensorView& key_mask, float scale, int64_t value_dim,
                                             const TensorView& out) override;
  absl::Status BatchedPagedAttention(const TensorView& q, const TensorView& cache,
                                     const TensorView& page_tables, const TensorView& q_start,
                                     const TensorView& kv_len, int64_t max_kv_len,
                                     const TensorView& mask, float scale,
                                     const TensorView& out) override;
  absl::Status PagedWrite(const TensorView& rows, const TensorView& positions,
                          const TensorView& page_table, const TensorView& cache) override;
  absl::Status PagedRead(const TensorView& cache, const TensorView& page_table,
                         const TensorView& positions, const TensorView& out) override;
  // Moves rows of any dtype (bytes; the f32-only policy is for arithmetic).
  absl::Status CompactAccepted(const TensorView& cache, const TensorView& page_tables,
                               const TensorView& cache_len, const TensorView& accepted,
                               const TensorView& num_accepted) override;
  absl::Status MoeRoute(const TensorView& logits, const TensorView* correction_bias,
                        const MoeRoutingParams& params, const TensorView& ids,
                        const TensorView& weights) override;
  absl::Status MoeExperts(const TensorView& x, const TensorView& ids, const TensorView& weights,
                          std::span<const ExpertWeights> experts, const TensorView& out,
                          bool accumulate) override;
  // Dequantizes each expert that ids reference (DequantizeWeight, exact) into the scratch, one at a
  // time, and computes MoeExperts' arithmetic on it (src/cpu/cpu_backend_quantized_moe.cc).
  absl::Status QuantizedMoeExperts(const TensorView& x, const TensorView& ids, const TensorView& weights,
                                   std::span<const QuantizedExpertWeights> experts, const TensorView& out,
                                   bool accumulate) override;
  // The speculative step's ops (tree build: src/cpu/cpu_backend_tree.cc; verify and gathers: src/cpu/cpu_backend_verify.cc).
  int64_t TreeBuildWorkspaceBytes(const TreeBuildShape& shape) const override;
  absl::Status TreeBuildStep(const TreeBuildShape& shape, int step, const TensorView& logits,
                             const TensorView& d2t, const TensorView& workspace, const TensorView& errors,
                             const TensorView& frontier_tokens, const TensorView& frontier_parents) override;
  absl::Status TreeBuildFinalize(const TreeBuildShape& shape, const TensorView& workspace, const TensorView& errors,
                                 const TensorView& root_tokens, const TensorView& root_positions,
                                 const TensorView& tokens, const TensorView& parents, const TensorView& positions,
                                 const TensorView& mask) override;
  absl::Status TreeVerify(const TensorView& tokens, const TensorView& parents, const TensorView& logits,
                          const SamplingParams& sampling, const TensorView& seed_offset,
                          const TreeVerifyOutputs& out) override;
  absl::Status GatherRows(const TensorView& src, const TensorView& index, const TensorView& out,
                          int64_t groups = 1) override;
  absl::Status ExtendMaskRows(const TensorView& src, const TensorView& parent, const TensorView& column,
                              const TensorView& out) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  class WorkerPool;

  // At least n floats of scratch_, valid until the next call.
  float* Scratch(int64_t n);

  Allocator* allocator_;
  std::unique_ptr<WorkerPool> pool_;  // null when single-threaded
  std::vector<float> scratch_;
};

}  // namespace eagle3::cpu
