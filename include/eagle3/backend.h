// The op interface that model composition is written against (DESIGN §2): one implementation per
// device kind (eagle3::cpu::CpuBackend, the fp32 reference; the CUDA backend), checked against each
// other op by op.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "eagle3/allocator.h"
#include "eagle3/device.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// c = alpha * a * b^T + beta * c + bias (bias broadcast over rows, not scaled: the cuBLASLt bias
// epilogue order). beta == 0 means c is write-only: its old contents (even NaN) are never read.
struct GemmOptions {
  float alpha = 1.0f;
  float beta = 0.0f;
  const TensorView* bias = nullptr;  // [N], contiguous, backend device; nullptr for none
};

// Conventions for every op:
//  - Inputs and outputs are caller-allocated views on device(); ops never allocate, so a decode
//    step can run from fixed buffers (and be captured in a CUDA graph).
//  - 2-D operands [rows, cols] may be row-strided: stride(1) == 1 and stride(0) >= cols (for
//    example a Narrow along dim 1 of a wider buffer). 1-D operands are contiguous.
//  - Floating-point math is fp32 internally; which storage dtypes a backend accepts is its own
//    policy (the CPU reference takes f32 only) and violations name the dtype. Index tensors are i32
//    or i64 on every backend.
//  - Outputs must not overlap inputs, except where an op says that exact in-place use is allowed.
//  - Every op validates shapes, dtypes and devices first and returns InvalidArgument naming the op,
//    the tensor, the expected and the actual value (via TensorView::ToString()). Data-dependent
//    errors (NaN, negative ids) may leave outputs partially written.
//  - A backend object is driven by one thread at a time (like a CUDA stream); calls may run
//    asynchronously until Synchronize().
//
// Ops whose semantics are still being pinned down — RoPE/YaRN, MLA attention, MoE routing and
// experts, tree and verify ops, KV writes and compaction — are added by later issues.
class Backend {
 public:
  virtual ~Backend() = default;

  // Where the tensors of every op must live.
  virtual Device device() const = 0;
  // Allocates memory on device() for callers that size their buffers at init.
  virtual Allocator& allocator() = 0;

  // dst = src. Same shape and dtype; any non-negative strides on the host backend. A backend may
  // also accept a host side on a device backend (host <-> device transfer); others are refused.
  virtual absl::Status Copy(const TensorView& src, const TensorView& dst) = 0;

  // Linear layer (PyTorch layout), see GemmOptions.
  //   a: [M, K], row-strided      b: [N, K] (weights), row-strided      c: [M, N], row-strided
  virtual absl::Status Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                            const GemmOptions& options) = 0;

  // out = x * rsqrt(mean(x^2 over the row) + eps) * weight, in fp32 (HF LlamaRMSNorm /
  // DeepseekV2RMSNorm). eps >= 0.
  //   x: [T, H]      weight: [H]      out: [T, H] (may be x itself)
  virtual absl::Status RmsNorm(const TensorView& x, const TensorView& weight, float eps,
                               const TensorView& out) = 0;

  // residual += x; out = RmsNorm(residual) — the pre-norm block's fused residual add. The norm
  // reads the residual as stored (as HF does with `hidden + residual`).
  //   x: [T, H]      residual: [T, H], in/out      weight: [H]      out: [T, H] (may be x itself)
  virtual absl::Status AddRmsNorm(const TensorView& x, const TensorView& residual,
                                  const TensorView& weight, float eps, const TensorView& out) = 0;

  // out = silu(gate) * up where gate_up = [gate | up] (gate first, as in merged gate_up_proj).
  //   gate_up: [T, 2 * I]      out: [T, I]
  virtual absl::Status SiluMul(const TensorView& gate_up, const TensorView& out) = 0;

  // Vocab-parallel embedding: out[t] = table[ids[t] - vocab_start] when that row is in this shard,
  // else zeros (the all-reduce over ranks then completes the lookup). Negative ids are
  // InvalidArgument naming the position; ids beyond the full vocab are the caller's to check.
  //   ids: [T], i32 or i64      table: [V_shard, H]      vocab_start >= 0      out: [T, H]
  virtual absl::Status EmbeddingLookup(const TensorView& ids, const TensorView& table,
                                       int64_t vocab_start, const TensorView& out) = 0;

  // out = softmax(logits / temperature) per row, fp32, max-subtracted. temperature > 0 and finite.
  // NaN or +inf in a row, or a row with no finite logit, is InvalidArgument naming the row.
  //   logits: [R, V], V >= 1      out: [R, V] (may be logits itself)
  virtual absl::Status Softmax(const TensorView& logits, float temperature,
                               const TensorView& out) = 0;

  // out[r] = index of the largest logit of row r; ties go to the lowest index. A NaN anywhere in a
  // row is InvalidArgument naming the row.
  //   logits: [R, V], V >= 1      out: [R], i32 or i64
  virtual absl::Status Argmax(const TensorView& logits, const TensorView& out) = 0;

  // The k largest values of each row in descending order, ties lowest index first; NaN in a row is
  // InvalidArgument naming the row.
  //   values: [R, V]      1 <= k <= V      out_values: [R, k]      out_indices: [R, k], i32 or i64
  virtual absl::Status TopK(const TensorView& values, int k, const TensorView& out_values,
                            const TensorView& out_indices) = 0;

  // Waits until every op issued so far has finished; reports deferred device errors.
  virtual absl::Status Synchronize() = 0;

 protected:
  // Shape, stride, device, index-dtype and aliasing checks shared by every backend, so that the
  // contract above is enforced once. They do not check floating dtypes (backend policy).
  absl::Status CheckCopy(const TensorView& src, const TensorView& dst) const;
  absl::Status CheckGemm(const TensorView& a, const TensorView& b, const TensorView& c,
                         const GemmOptions& options) const;
  // residual: nullptr for plain RmsNorm.
  absl::Status CheckRmsNorm(const char* op, const TensorView& x, const TensorView* residual,
                            const TensorView& weight, float eps, const TensorView& out) const;
  absl::Status CheckSiluMul(const TensorView& gate_up, const TensorView& out) const;
  absl::Status CheckEmbeddingLookup(const TensorView& ids, const TensorView& table,
                                    int64_t vocab_start, const TensorView& out) const;
  absl::Status CheckSoftmax(const TensorView& logits, float temperature,
                            const TensorView& out) const;
  absl::Status CheckArgmax(const TensorView& logits, const TensorView& out) const;
  absl::Status CheckTopK(const TensorView& values, int k, const TensorView& out_values,
                         const TensorView& out_indices) const;
};

}  // namespace eagle3
