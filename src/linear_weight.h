// One Linear layer's weight W [N, K] on a backend's device, held in the form that backend multiplies
// fastest: dense in a floating dtype (Backend::Gemm), or, for a quantized checkpoint on a backend
// that streams the format (Backend::keeps_quantized), in the checkpoint's stored form
// (Backend::QuantizedGemm), which keeps an FP8 weight at 1 byte and an INT4 weight at about 0.56
// bytes per element instead of bf16's 2. Model code applies it without knowing which.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/dtype.h"
#include "eagle3/quantization_config.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"
#include "eagle3/upload_ring.h"
#include "eagle3/weight_load_stats.h"

namespace eagle3 {

class LinearWeight {
 public:
  LinearWeight() = default;  // empty: Apply refuses it
  // Dense: [N, K], a dtype the backend's Gemm takes as b, on the backend's device.
  explicit LinearWeight(Tensor dense);
  // Quantized: `view` describes `codes` and `scales` (its codes and scales are views into them),
  // on the backend's device.
  LinearWeight(Tensor codes, Tensor scales, const QuantizedWeightView& view);

  // The tensors it owns, for StackLinearWeights: the dense weights, or the codes (with their row
  // padding) and scales the quantized view points into.
  const Tensor& dense_tensor() const { return dense_; }
  const Tensor& codes_tensor() const { return codes_; }
  const Tensor& scales_tensor() const { return scales_; }

  bool quantized() const { return view_.format != WeightFormat::kUnquantized; }
  int64_t rows() const;  // N
  int64_t cols() const;  // K
  // The dense weights; an empty view when quantized().
  const TensorView& dense() const { return dense_.view(); }
  // The quantized weights; format kUnquantized when dense.
  const QuantizedWeightView& quantized_view() const { return view_; }
  // Device memory held (codes with their row padding, scales; or the dense tensor).
  size_t bytes() const { return dense_.nbytes() + codes_.nbytes() + scales_.nbytes(); }
  // Appends the device tensors a product with it reads (the dense weights; or the codes and the
  // scales) to `out`, for Backend::PrefetchWeights. Nothing when empty.
  void AppendTensors(std::vector<TensorView>& out) const;

  // c = alpha * a * W^T + beta * c + bias (GemmOptions): backend.Gemm with the dense weights or
  // backend.QuantizedGemm with the quantized ones, whose contracts (dtypes, strides, overlap) hold.
  //   a: [M, K], row-strided, backend device      c: [M, N], row-strided, backend device
  absl::Status Apply(Backend& backend, const TensorView& a, const TensorView& c,
                     const GemmOptions& options = kWeightsGemm) const;

 private:
  Tensor dense_;
  Tensor codes_;
  Tensor scales_;
  QuantizedWeightView view_;
};

// The weights of `parts` stacked by rows into one weight on `backend`'s device ([sum of rows, K]: the
// gate and up projections of a SiLU MLP become one product), when they can be one:
//  - every part dense, of one dtype and column count;
//  - every part quantized alike (row-major codes, format, k, col0, block sizes and the scale columns they hold), each
//    slice starting on a scale-block row (row0 % block_rows == 0, its scales from that block on) and
//    every part but the last holding whole blocks of rows: the stacked scales are then the parts'
//    scale rows in order, indexed from global row 0. INT4 rows (block_rows 1) always stack; FP8
//    slices stack when their rows are whole 128-row blocks (every published checkpoint's MLP slices
//    at TP <= 8).
// Otherwise std::nullopt: the caller applies the parts one by one (same results: each output column
// is one part's row, computed alike). `parts` is not modified; the copies are done when this returns,
// so the caller may free the parts at once. The stacked weight is kept as long as its model:
// backend.weight_allocator() memory; parts loaded only to be stacked belong in backend.allocator()
// (LinearWeightLoad::dense_allocator).
// gemm_tiles: a quantized stacked weight gets its codes in warp tiles where the backend takes them
// for QuantizedGemm (Backend::tiles_gemm_codes; the rows are stacked in backend.allocator() memory
// first, freed once tiled).
absl::StatusOr<std::optional<LinearWeight>> StackLinearWeights(Backend& backend, std::span<const LinearWeight> parts,
                                                               bool gemm_tiles = false);

// How LoadLinearWeight stores a weight.
struct LinearWeightLoad {
  // Storage dtype of dense weights (f32, f16 or bf16; usually backend.preferred_weight_dtype()).
  DType dense_dtype = DType::kF32;
  // Keep a quantized weight in its stored form. Unset: when backend.keeps_quantized(its format).
  std::optional<bool> keep_quantized;
  // Where the load's time goes (host reads, device copies) is added here; nullptr: not counted.
  WeightLoadStats* stats = nullptr;
  // On a device backend, the host tensors read for the upload come from it (the load's ring,
  // Backend::CreateUploadRing); nullptr: plain host memory. Unused on a host backend, whose host
  // tensors are the weights.
  UploadRing* upload_ring = nullptr;
  // Device memory for the weight loaded dense / kept quantized; nullptr: backend.weight_allocator(),
  // for a weight kept as long as its model. A caller that copies the weight into a stacked one and
  // frees it (StackLinearWeights) passes backend.allocator() for the forms it stacks: freed weight
  // memory returns only with its whole chunk (Backend::weight_allocator).
  Allocator* dense_allocator = nullptr;
  Allocator* quantized_allocator = nullptr;
  // Kept quantized on a device backend that takes the weight so for the op that reads it: the codes
  // in warp-step tiles (QuantCodesLayout::kWarpTiles, Backend::TileQuantizedCodes) in memory of
  // quantized_allocator. kGemm: a weight that Backend::QuantizedGemm alone reads
  // (Backend::tiles_gemm_codes); kExperts: a routed expert's, which QuantizedMoeExperts alone reads
  // (Backend::tiles_expert_codes). The row-major codes are uploaded into memory of `tile_scratch`
  // first (nullptr: backend.allocator()), which may be a ReusedBufferAllocator: the tiling kernel
  // reads them before the backend runs the next upload.
  enum class WarpTiles { kNone, kGemm, kExperts };
  WarpTiles warp_tiles = WarpTiles::kNone;
  Allocator* tile_scratch = nullptr;
};

// Whether `w`'s codes can be laid out in warp tiles (Backend::TileQuantizedCodes): a quantized,
// row-major view, INT4 slices starting on a whole packed word.
bool CanWarpTile(const QuantizedWeightView& w);

// A copy of quantized `w` (CanWarpTile) with its codes in warp tiles and its own scales, in
// backend.weight_allocator() memory: for a weight also read row-major elsewhere (a shared expert
// that joins the routed experts' op). Does not synchronize (the backend orders the copies before
// later work; `w` must stay alive until then).
absl::StatusOr<LinearWeight> WarpTiledCopy(Backend& backend, const LinearWeight& w);

// The `shard` slice of `spec`, stored as `form` under `quantization` (run CheckStoredWeight first),
// on `backend`'s device:
//  - kept quantized (form kFp8Block / kInt4Packed and LinearWeightLoad::keep_quantized): the codes and
//    the scales the slice needs, as ReadQuantizedShard reads them (global scale indexing kept), with
//    INT4 scales stored in bf16 (the hub's dtype, which CudaBackend's kernels read). An INT4 weight
//    whose scales are not all bf16 values (an f16 / f32 checkpoint) is loaded dense instead, so that
//    nothing is rounded. On a device, each codes row starts on a 16-byte boundary (the row stride is
//    padded) so that the GEMV kernels' 16-byte loads can take every slice;
//  - otherwise dense in load.dense_dtype (ReadWeightShard: dequantized at load for a quantized form).
// Does not synchronize: the copies may still run when it returns (its host tensors are freed at once,
// as Backend::Copy allows), and work enqueued on the backend after it sees them done.
absl::StatusOr<LinearWeight> LoadLinearWeight(Backend& backend, const Checkpoint& checkpoint, const WeightSpec& spec,
                                              StoredForm form, const QuantizationConfig& quantization,
                                              const ShardSpec& shard, const LinearWeightLoad& load = {});

}  // namespace eagle3
