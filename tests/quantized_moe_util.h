// Shared by the QuantizedMoeExperts tests (cpu and gpu): random routed experts stored quantized
// (quantized_view_util.h's matrices), each gate / up / down a tensor-parallel-style slice of its own
// global matrix, with the dense f32 ExpertWeights they dequantize to (the MoeExperts reference).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/quantization_config.h"
#include "eagle3/tensor.h"
#include "quantized_view_util.h"

namespace eagle3 {

// Where one expert's slices lie in their global matrices: gate and up are [I, H] slices of global
// [gate_rows, gate_cols] matrices, down an [H, I] slice of a global [down_rows, down_cols] one.
struct ExpertSlices {
  int64_t gate_rows = 0, gate_cols = 0, down_rows = 0, down_cols = 0;
  Slice gate_up;  // rows I, cols H (the same slice of gate and of up)
  Slice down;     // rows H, cols I
};

struct QuantizedExperts {
  std::vector<QuantizedMatrix> matrices;         // 3 per expert: gate, up, down
  std::vector<QuantizedExpertWeights> views;     // host views into `matrices`
  std::vector<Tensor> dense_gate_up, dense_down;  // [2 I, H] and [H, I] f32 per expert
  std::vector<ExpertWeights> dense;              // views of the dense tensors
  std::vector<Slice> gate_up_slices, down_slices;  // per expert, as `views` took them
};

// `count` experts stored as `quantization`, expert e's slices those of layouts[e % layouts.size()]
// (all with the same I and H); with mixed_scales, scales alternately the whole grid and only the
// touched blocks (experts of different layouts), else every expert's the whole grid (one layout,
// as a hub checkpoint's TP slice has).
inline QuantizedExperts MakeQuantizedExperts(const QuantizationConfig& quantization, int64_t count,
                                             const std::vector<ExpertSlices>& layouts, uint64_t seed,
                                             bool mixed_scales = true) {
  QuantizedExperts out;
  out.matrices.reserve(static_cast<size_t>(3 * count));
  for (int64_t e = 0; e < count; ++e) {
    const ExpertSlices& l = layouts[static_cast<size_t>(e) % layouts.size()];
    Slice gate_up = l.gate_up, down = l.down;
    gate_up.tight_scales = down.tight_scales = mixed_scales && e % 2 == 1;
    const uint64_t s = seed + 3 * static_cast<uint64_t>(e);
    out.matrices.push_back(RandomQuantizedMatrix(quantization, l.gate_rows, l.gate_cols, s));
    out.matrices.push_back(RandomQuantizedMatrix(quantization, l.gate_rows, l.gate_cols, s + 1));
    out.matrices.push_back(RandomQuantizedMatrix(quantization, l.down_rows, l.down_cols, s + 2));
  }
  for (int64_t e = 0; e < count; ++e) {
    const ExpertSlices& l = layouts[static_cast<size_t>(e) % layouts.size()];
    Slice gate_up = l.gate_up, down = l.down;
    gate_up.tight_scales = down.tight_scales = mixed_scales && e % 2 == 1;
    out.gate_up_slices.push_back(gate_up);
    out.down_slices.push_back(down);
    const QuantizedMatrix& g = out.matrices[3 * e];
    const QuantizedMatrix& u = out.matrices[3 * e + 1];
    const QuantizedMatrix& d = out.matrices[3 * e + 2];
    out.views.push_back({SliceView(quantization, g.codes, g.scales, gate_up),
                         SliceView(quantization, u.codes, u.scales, gate_up),
                         SliceView(quantization, d.codes, d.scales, down)});
    const Tensor gate = DequantizedSlice(g, gate_up), up = DequantizedSlice(u, gate_up);
    Tensor gu = *Tensor::Empty(DType::kF32, Shape{2 * gate_up.rows, gate_up.cols});
    std::memcpy(gu.data(), gate.data(), gate.nbytes());
    std::memcpy(static_cast<char*>(gu.data()) + gate.nbytes(), up.data(), up.nbytes());
    out.dense_gate_up.push_back(std::move(gu));
    out.dense_down.push_back(DequantizedSlice(d, down));
  }
  for (int64_t e = 0; e < count; ++e) out.dense.push_back({out.dense_gate_up[e], out.dense_down[e]});
  return out;
}

// Random routing: ids [tokens, k] i32 with distinct experts per token, weights [tokens, k] f32 in
// (0, 1).
inline void RandomRouting(int64_t tokens, int64_t k, int64_t experts, uint32_t seed, Tensor& ids,
                          Tensor& weights) {
  ids = *Tensor::Empty(DType::kI32, Shape{tokens, k});
  weights = *Tensor::Empty(DType::kF32, Shape{tokens, k});
  std::mt19937 rng(seed);
  std::vector<int32_t> perm(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) perm[e] = static_cast<int32_t>(e);
  std::uniform_real_distribution<float> weight(0.05f, 1.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < k; ++j) {
      ids.data_as<int32_t>()[t * k + j] = perm[static_cast<size_t>(j % experts)];
      weights.data_as<float>()[t * k + j] = weight(rng);
    }
  }
}

}  // namespace eagle3
