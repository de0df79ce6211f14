// How each tensor of the DeepSeek-V2-family weight schema (DeepseekV2Weights) is stored under the
// config's QuantizationConfig, the checks of its stored tensors, and the read of one rank's slice,
// dequantized to floating point or kept in its stored form.
//
// Stored forms of a weight `X.weight` [out, in] (see quantization_config.h for the sources):
//  - kPlain: `X.weight`, any f32 / f16 / bf16 (converted on read, as for an unquantized checkpoint).
//  - kFp8Block: `X.weight` F8_E4M3 [out, in] and `X.weight_scale_inv` (f32; bf16 / f16 accepted)
//    [ceil(out / bo), ceil(in / bi)]; w[r][c] = fp8[r][c] * scale_inv[r / bo][c / bi].
//  - kInt4Packed: `X.weight_packed` I32 [out, ceil(in / 8)] (int4_packing.h), `X.weight_scale`
//    (bf16; f16 / f32 accepted) [out, in / group], `X.weight_shape` (I32; I64, which
//    compressed-tensors' own compressor writes, accepted) = [out, in];
//    w[r][c] = q[r][c] * scale[r][c / group].
//
// Dequantization happens in f32 with one multiply per element, so the f32 weights are:
//  - int4: exact. q in [-8, 7] has at most 3 significant bits and a bf16 (f16) scale 8 (11), so the
//    product has at most 11 (14) and is an f32 value (an f32 scale may round it once, to nearest
//    even). compressed-tensors' own decompression multiplies in the scale's dtype, so its bf16
//    weights are these values rounded to bf16.
//  - fp8: an e4m3 value has at most 4 significant bits, an f32 scale 24, so the product is rounded
//    once to the nearest f32 (exact when the scale has at most 20 significant bits, e.g. the powers
//    of two of DeepSeek-V3.1's ue8m0 scales). That is the very value DeepSeek's weight_dequant
//    (inference/kernel.py: x.to(float32) * s in f32) computes, before it casts to bf16.
// A bf16 weight_dtype rounds these f32 values once more, as the bf16 conversions of the hub
// checkpoints (fp8_cast_bf16.py) did.
//
// Scales are indexed by the weight's GLOBAL row and column, so a tensor-parallel slice that starts
// inside a block or a group (odd TP sizes, tiny models) takes its scales from the right block.
//
// eagle3/detail/: internal, no compatibility promise (the loader and the random checkpoint writers
// share it).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/allocator.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/dtype.h"
#include "eagle3/export.h"
#include "eagle3/quantization_config.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"

namespace eagle3 {

enum class StoredForm : uint8_t { kPlain, kFp8Block, kInt4Packed };

// The stored tensor names of the weight `weight` ("X.weight"): "X.weight_scale_inv",
// "X.weight_packed", "X.weight_scale", "X.weight_shape".
EAGLE3_API std::string Fp8ScaleName(std::string_view weight);
EAGLE3_API std::string Int4PackedName(std::string_view weight);
EAGLE3_API std::string Int4ScaleName(std::string_view weight);
EAGLE3_API std::string Int4ShapeName(std::string_view weight);

// The stored form of each of `specs` (DeepseekV2Weights(config) or MtpWeights, same order). Only Linear weights
// (the *_proj matrices, kv_a_proj_with_mqa, and lm_head) are ever quantized; the embedding, norms, router,
// correction bias and an MTP module's eh_proj (a plain Linear in every engine) never are. fp8: every Linear but lm_head (DeepSeek's reference model creates its head in the default
// dtype). int4: every Linear whose module name (the weight's name without ".weight") no `ignore` entry matches.
EAGLE3_API std::vector<StoredForm> StoredForms(const DeepseekV2Config& config, const std::vector<WeightSpec>& specs);

// The checkpoint tensors that store `spec` in `form`: {X.weight}, {X.weight, X.weight_scale_inv} or
// {X.weight_packed, X.weight_scale, X.weight_shape}.
EAGLE3_API std::vector<std::string> StoredTensorNames(const WeightSpec& spec, StoredForm form);

// Checks that `checkpoint` stores `spec` as `form` under `quantization`: every tensor present (else
// NotFound), of an accepted dtype and of the expected shape, the scales' shape following from the
// weight's and the block / group size, the group size dividing `in`, weight_shape's values equal to
// [out, in] (else InvalidArgument). Each message names the tensor, its file and what was expected.
EAGLE3_API absl::Status CheckStoredWeight(const Checkpoint& checkpoint, const WeightSpec& spec, StoredForm form,
                                          const QuantizationConfig& quantization);

// The `shard` slice of `spec` (the slice Checkpoint::ReadShard gives for a plain tensor, padding
// zero), dequantized (DequantizeWeight of ReadQuantizedShard) and converted to `dtype` (f32, f16 or
// bf16), on the host, in memory of `allocator` (a host allocator; a dequantized weight's
// intermediates come from plain host memory). Run CheckStoredWeight first: this reads what it
// checked.
EAGLE3_API absl::StatusOr<Tensor> ReadWeightShard(const Checkpoint& checkpoint, const WeightSpec& spec, StoredForm form,
                                                  const QuantizationConfig& quantization, const ShardSpec& shard,
                                                  DType dtype, Allocator& allocator = DefaultHostAllocator());

// One rank's slice of a quantized weight in its stored form, on the host: `view` describes `codes`
// and `scales` (eagle3/quantized_weight_view.h) and points into them.
struct QuantizedShard {
  Tensor codes;   // kFp8Block: [rows, cols] f8e4m3. kInt4Packed: [rows, words] i32, word 0 = global word col0 / 8
  Tensor scales;  // f32: the scale blocks the slice touches, and no others
  QuantizedWeightView view;
};

// The `shard` slice of `spec`, stored as `form` (kFp8Block or kInt4Packed), kept in that form: the
// codes of the slice's rows and columns (an int4 column slice: the words holding them, read with
// Checkpoint::ReadColumns, so it may start inside a word) and the scales of the blocks or groups it
// touches, read as f32 (exact for every stored scale dtype). Scales keep their global indexing
// through view.scale_row0 / scale_col0. Vocab padding rows hold code 0 with scale 0, so they
// dequantize to +0 as ReadShard's zero padding. An int4 column slice reaching into padding
// columns (no model tensor has them) is InvalidArgument. Codes and scales are in memory of
// `allocator` (a host allocator). Run CheckStoredWeight first.
EAGLE3_API absl::StatusOr<QuantizedShard> ReadQuantizedShard(const Checkpoint& checkpoint, const WeightSpec& spec,
                                                             StoredForm form, const QuantizationConfig& quantization,
                                                             const ShardSpec& shard,
                                                             Allocator& allocator = DefaultHostAllocator());

}  // namespace eagle3
