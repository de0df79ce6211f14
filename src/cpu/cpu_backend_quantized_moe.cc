// CpuBackend::QuantizedMoeExperts: the routed experts of a quantized checkpoint, kept quantized by
// the caller and dequantized here exactly (DequantizeWeight), one touched expert at a time, so that
// the scratch holds one expert's f32 weights rather than every expert's.
//
// Arithmetic is MoeExperts' (src/cpu/cpu_backend_moe.cc) on the dequantized weights: per (token,
// slot) gate x, up x, act = silu(gate x) * up x, y = down act, all fp32; then per token
// out (+)= sum over slots j, in order, of weights[t, j] * y[t, j]. Each expert's slots are computed
// when that expert is dequantized, so their y rows wait in the scratch ([T, k, H]) until every
// expert is done.
#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "cpu/cpu_backend_internal.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/status.h"

namespace eagle3::cpu {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

}  // namespace

absl::Status CpuBackend::QuantizedMoeExperts(const TensorView& x, const TensorView& ids,
                                             const TensorView& weights,
                                             std::span<const QuantizedExpertWeights> experts,
                                             const TensorView& out, bool accumulate) {
  const char* op = "QuantizedMoeExperts";
  EAGLE3_RETURN_IF_ERROR(CheckQuantizedMoeExperts(x, ids, weights, experts, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "weights", weights));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  const int64_t num_experts = static_cast<int64_t>(experts.size());
  EAGLE3_RETURN_IF_ERROR(CheckExpertIds(op, ids, num_experts));
  const int64_t tokens = x.dim(0);
  const int64_t k = ids.dim(1);
  const int64_t hidden = x.dim(1);
  const int64_t inter = experts.empty() ? 0 : experts[0].gate.rows();

  // Scratch: gate [I, H] | up [I, H] | down [H, I] | y [T * k, H] | gate x, up x, act [3 I].
  const int64_t matrix = inter * hidden;
  float* gate = Scratch(3 * matrix + tokens * k * hidden + 3 * inter);
  float* up = gate + matrix;
  float* down = up + matrix;
  float* y = down + matrix;
  float* gate_x = y + tokens * k * hidden;
  float* up_x = gate_x + inter;
  float* act = up_x + inter;

  // Slots per expert, in (t, j) order.
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < tokens; ++t) {
    const int32_t* id = ids.data_as<const int32_t>() + t * ids.stride(0);
    for (int64_t j = 0; j < k; ++j) slots[id[j]].push_back(t * k + j);
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    if (slots[e].empty()) continue;
    const QuantizedExpertWeights& w = experts[e];
    EAGLE3_RETURN_IF_ERROR(DequantizeWeight(w.gate, TensorView(gate, DType::kF32, Shape{inter, hidden})));
    EAGLE3_RETURN_IF_ERROR(DequantizeWeight(w.up, TensorView(up, DType::kF32, Shape{inter, hidden})));
    EAGLE3_RETURN_IF_ERROR(DequantizeWeight(w.down, TensorView(down, DType::kF32, Shape{hidden, inter})));
    const ConstMatrixMap gate_m(gate, inter, hidden), up_m(up, inter, hidden), down_m(down, hidden, inter);
    for (const int64_t slot : slots[e]) {
      const ConstVectorMap xt(Row(x, slot / k), hidden);
      VectorMap(gate_x, inter).noalias() = gate_m * xt;
      VectorMap(up_x, inter).noalias() = up_m * xt;
      for (int64_t i = 0; i < inter; ++i) {
        const float g = gate_x[i];
        act[i] = g / (1.0f + std::exp(-g)) * up_x[i];
      }
      VectorMap(y + slot * hidden, hidden).noalias() = down_m * ConstVectorMap(act, inter);
    }
  }
  for (int64_t t = 0; t < tokens; ++t) {
    VectorMap o(Row(out, t), hidden);
    if (!accumulate) o.setZero();  // out is write-only then: stale NaNs must not leak in
    const float* wt = Row(weights, t);
    for (int64_t j = 0; j < k; ++j) o += wt[j] * ConstVectorMap(y + (t * k + j) * hidden, hidden);
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cpu
