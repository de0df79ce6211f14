// The cos/sin table that Backend::ApplyRope consumes, computed from a RopeConfig (docs/semantics.md).
//
// Row p of the table is [cos(p * f_0) .. cos(p * f_{h-1}) | sin(p * f_0) .. sin(p * f_{h-1})] * a,
// h = rope_dim / 2, with f_i the scaled inverse frequencies (RopeInvFreq) and a the attention
// factor (RopeAttentionFactor). Angles, cos and sin are computed in double and rounded to f32 once,
// so each entry is within 1 ulp of the exact value. transformers and DeepSeek's reference code form
// the angle p * f_i in fp32, whose error grows with p: their entries differ from these by up to
// about 1.2e-7 * p * max_i f_i (5e-4 at p = 4096, 2e-2 at p = 163840 for f_0 = 1). Compare against
// them with that tolerance, or at small positions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/export.h"
#include "eagle3/rope_config.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// Inverse frequency of each rotated pair i in [0, rope_dim / 2), scaling applied:
//  - kNone: theta^(-2i / rope_dim).
//  - kLinear: that / factor (the same as dividing positions by factor).
//  - kYarn: DeepSeek's DeepseekV2YarnRotaryEmbedding / transformers' _compute_yarn_parameters: with
//    low = max(floor(d(beta_fast)), 0), high = min(ceil(d(beta_slow)), rope_dim - 1),
//    d(r) = rope_dim * ln(original_max_position_embeddings / (2 pi r)) / (2 ln theta), and the
//    ramp r_i = clamp((i - low) / (high - low), 0, 1) (high += 0.001 when low == high):
//    f_i = (theta^(-2i/rope_dim) / factor) * r_i + theta^(-2i/rope_dim) * (1 - r_i).
//  - kLlama3: transformers' _compute_llama3_parameters (wavelengths above
//    original / low_freq_factor divided by factor, below original / high_freq_factor kept, smooth
//    interpolation between).
// InvalidArgument for an odd or non-positive rope_dim or parameters that would give non-finite
// frequencies (theta <= 0, factor <= 0, beta <= 0, original_max_position_embeddings <= 0,
// low_freq_factor == high_freq_factor).
EAGLE3_API absl::StatusOr<std::vector<double>> RopeInvFreq(const RopeConfig& rope, int64_t rope_dim);

// The factor cos and sin are multiplied by: for kYarn the explicit attention_factor when set, else
// YarnGetMscale(factor, mscale) / YarnGetMscale(factor, mscale_all_dim) (DeepSeek's reference
// `_mscale`, also vLLM's and SGLang's; 1 for the real V2/V3/K2 configs, whose mscale equals
// mscale_all_dim). 1 for the other types. Note: transformers uses YarnGetMscale(factor, 1) when
// either mscale or mscale_all_dim is absent, which differs from this only for a config stating
// mscale != 1 without mscale_all_dim.
EAGLE3_API double RopeAttentionFactor(const RopeConfig& rope);

// Fills `out` with the table for positions 0 .. P-1.
//   out: [P, rope_dim], f32, host, row-strided (stride(1) == 1, stride(0) >= rope_dim)
EAGLE3_API absl::Status FillRopeCosSin(const RopeConfig& rope, int64_t rope_dim, const TensorView& out);

// A new [num_positions, rope_dim] f32 table; `allocator` must hand out host memory (copy the table
// to a device with Backend::Copy).
EAGLE3_API absl::StatusOr<Tensor> MakeRopeCosSin(const RopeConfig& rope, int64_t rope_dim,
                                                 int64_t num_positions,
                                                 Allocator& allocator = DefaultHostAllocator());

}  // namespace eagle3
