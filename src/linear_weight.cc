#include "linear_weight.h"

#include <bit>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/status.h"
#include "eagle3/tensor_convert.h"
#include "host_read_timer.h"
#include "view_slices.h"

namespace eagle3 {
namespace {

WeightFormat FormatOf(StoredForm form) {
  return form == StoredForm::kFp8Block ? WeightFormat::kFp8Block : WeightFormat::kInt4Group;
}

// Whether every f32 scale is a bf16 value (the hub's INT4 scales are stored in bf16): one whose low
// 16 bits are zero, NaN excepted (it would not compare equal after the round trip through bf16).
// Branch-free, so that the scan of every weight's scales vectorizes.
bool AllBf16(const Tensor& scales) {
  const float* s = scales.data_as<const float>();
  const int64_t n = scales.numel();
  uint32_t low_bits = 0, nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(s[i]);
    low_bits |= u & 0xffffu;
    nan |= static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  }
  return low_bits == 0 && nan == 0;
}

// Elements per 16 bytes of a codes row: the GEMV kernels load 16-byte chunks of every row.
int64_t RowAlignment(DType codes_dtype) { return 16 / static_cast<int64_t>(DTypeSize(codes_dtype)); }

// `host` [rows, cols] in new memory of `device_allocator` (on `backend`'s device), each row starting
// `align` elements after the last.
absl::StatusOr<Tensor> UploadPadded(Backend& backend, Allocator& device_allocator, const Tensor& host, int64_t align,
                                    TensorView* view) {
  const int64_t rows = host.dim(0), cols = host.dim(1);
  const int64_t ld = (cols + align - 1) / align * align;
  EAGLE3_ASSIGN_OR_RETURN(Tensor device, Tensor::Empty(host.dtype(), Shape{rows, ld}, device_allocator));
  *view = TensorView(device.data(), host.dtype(), Shape{rows, cols}, Shape{ld, 1}, device.device());
  EAGLE3_RETURN_IF_ERROR(backend.Copy(host, *view));
  return device;
}

// The codes of row-major `view` (on the backend's device) in warp tiles in new memory of
// `allocator`; `view` is set to describe them.
absl::StatusOr<Tensor> TileCodes(Backend& backend, Allocator& allocator, QuantizedWeightView& view) {
  EAGLE3_ASSIGN_OR_RETURN(Tensor tiles, Tensor::Empty(view.codes.dtype(), WarpTiledCodesShape(view), allocator));
  EAGLE3_RETURN_IF_ERROR(backend.TileQuantizedCodes(view, tiles.view()));
  view = WithWarpTiledCodes(view, tiles.view());
  return tiles;
}

// Whether `backend` takes row-major `w` in warp tiles for the op `tiles` names.
bool TakesTiles(const Backend& backend, const QuantizedWeightView& w, LinearWeightLoad::WarpTiles tiles) {
  if (!CanWarpTile(w)) return false;
  switch (tiles) {
    case LinearWeightLoad::WarpTiles::kGemm:
      return backend.tiles_gemm_codes(w);
    case LinearWeightLoad::WarpTiles::kExperts:
      return backend.tiles_expert_codes(w);
    case LinearWeightLoad::WarpTiles::kNone:
      break;
  }
  return false;
}

// `host`'s tensors on `backend`'s device in memory of `device_allocator` (the tensors themselves on a
// host backend), INT4 scales converted to bf16 in memory of `host_allocator` first. tile_scratch
// (with `tiles`): the codes in warp tiles where the backend takes them, uploaded row-major into
// memory of *tile_scratch first.
absl::StatusOr<LinearWeight> LoadQuantized(Backend& backend, QuantizedShard host, Allocator& host_allocator,
                                           Allocator& device_allocator, Allocator* tile_scratch,
                                           LinearWeightLoad::WarpTiles tiles) {
  if (host.view.format == WeightFormat::kInt4Group) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor bf16, Tensor::Empty(DType::kBF16, host.scales.shape(), host_allocator));
    EAGLE3_RETURN_IF_ERROR(ConvertTensor(host.scales, bf16));
    host.scales = std::move(bf16);
  }
  QuantizedWeightView view = host.view;
  view.scales = host.scales.view();
  if (backend.device().is_cpu()) return LinearWeight(std::move(host.codes), std::move(host.scales), view);
  // Decided on the host view: the device copy keeps the scales' layout, and the codes go to tiles.
  const bool tile = tile_scratch != nullptr && TakesTiles(backend, view, tiles);
  EAGLE3_ASSIGN_OR_RETURN(Tensor scales, Tensor::Empty(host.scales.dtype(), host.scales.shape(), device_allocator));
  EAGLE3_RETURN_IF_ERROR(backend.Copy(host.scales, scales));
  view.scales = scales.view();
  EAGLE3_ASSIGN_OR_RETURN(Tensor codes, UploadPadded(backend, tile ? *tile_scratch : device_allocator, host.codes,
                                                     RowAlignment(host.codes.dtype()), &view.codes));
  if (tile) {
    // The row-major upload is freed when this returns; the backend runs the tiling before any
    // later upload into that memory.
    EAGLE3_ASSIGN_OR_RETURN(codes, TileCodes(backend, device_allocator, view));
  }
  // No synchronize: Copy has read pageable host tensors when it returns, and an UploadRing holds its
  // memory back until the copies from it are done (Backend::Copy), so the transfers overlap the next
  // weight's read; the model synchronizes once its weights are loaded.
  return LinearWeight(std::move(codes), std::move(scales), view);
}

// `error` of placing weight `name` on the device, naming the weight.
absl::Status PlacingError(const std::string& name, const absl::Status& error) {
  return absl::Status(error.code(), absl::StrCat("loading weight '", name, "' onto the device: ", error.message()));
}

// A device copy of `host` in memory of `device_allocator` (`host` freed by the caller at once:
// Backend::Copy allows it, and an UploadRing holds its memory back until the copy is done).
absl::StatusOr<Tensor> Upload(Backend& backend, Allocator& device_allocator, const Tensor& host) {
  EAGLE3_ASSIGN_OR_RETURN(Tensor device, Tensor::Empty(host.dtype(), host.shape(), device_allocator));
  EAGLE3_RETURN_IF_ERROR(backend.Copy(host, device));
  return device;
}

// Whether quantized `w` can be a row range of a weight stacked with `first` (StackLinearWeights'
// rule), followed by other parts when `not_last`.
bool StacksAlike(const QuantizedWeightView& w, const QuantizedWeightView& first, bool not_last) {
  const bool alike = !w.warp_tiled() && !first.warp_tiled() && w.format == first.format && w.k == first.k &&
                     w.col0 == first.col0 &&
                     w.scale_col0 == first.scale_col0 && w.block_rows == first.block_rows &&
                     w.block_cols == first.block_cols && w.codes.dtype() == first.codes.dtype() &&
                     w.scales.dtype() == first.scales.dtype() && w.codes.dim(1) == first.codes.dim(1) &&
                     w.scales.dim(1) == first.scales.dim(1);
  const bool aligned = w.block_rows > 0 && w.row0 % w.block_rows == 0 && w.scale_row0 == w.row0 / w.block_rows &&
                       (!not_last || w.rows() % w.block_rows == 0);
  return alike && aligned;
}

// Row blocks of scales a quantized slice of `rows` rows starting on a block row uses.
int64_t ScaleRows(const QuantizedWeightView& w) { return (w.rows() + w.block_rows - 1) / w.block_rows; }

absl::StatusOr<LinearWeight> StackDense(Backend& backend, std::span<const LinearWeight> parts) {
  const Tensor& first = parts.front().dense_tensor();
  int64_t rows = 0;
  for (const LinearWeight& p : parts) rows += p.rows();
  EAGLE3_ASSIGN_OR_RETURN(Tensor merged,
                          Tensor::Empty(first.dtype(), Shape{rows, first.dim(1)}, backend.weight_allocator()));
  int64_t row = 0;
  for (const LinearWeight& p : parts) {
    EAGLE3_RETURN_IF_ERROR(backend.Copy(p.dense_tensor(), Rows(merged, row, p.rows())));
    row += p.rows();
  }
  return LinearWeight(std::move(merged));
}

absl::StatusOr<LinearWeight> StackQuantized(Backend& backend, std::span<const LinearWeight> parts, bool gemm_tiles) {
  const QuantizedWeightView& first = parts.front().quantized_view();
  int64_t rows = 0, scale_rows = 0;
  for (const LinearWeight& p : parts) {
    rows += p.rows();
    scale_rows += ScaleRows(p.quantized_view());
  }
  // Codes rows keep the parts' row stride (its 16-byte padding on a device). Stacked into temporary
  // memory where they are tiled afterwards (the view's rows and columns decide, not the codes).
  const int64_t ld = first.codes.stride(0);
  QuantizedWeightView probe = first;
  probe.codes = TensorView(first.codes.data(), first.codes.dtype(), Shape{rows, first.codes.dim(1)}, Shape{ld, 1},
                           first.codes.device());
  probe.row0 = 0;
  probe.scale_row0 = 0;
  probe.scales = TensorView(first.scales.data(), first.scales.dtype(), Shape{scale_rows, first.scales.dim(1)},
                            first.scales.strides(), first.scales.device());
  const bool tile = gemm_tiles && TakesTiles(backend, probe, LinearWeightLoad::WarpTiles::kGemm);
  EAGLE3_ASSIGN_OR_RETURN(Tensor codes, Tensor::Empty(first.codes.dtype(), Shape{rows, ld},
                                                      tile ? backend.allocator() : backend.weight_allocator()));
  EAGLE3_ASSIGN_OR_RETURN(Tensor scales, Tensor::Empty(first.scales.dtype(), Shape{scale_rows, first.scales.dim(1)},
                                                       backend.weight_allocator()));
  int64_t row = 0, scale_row = 0;
  for (const LinearWeight& p : parts) {
    const QuantizedWeightView& v = p.quantized_view();
    const TensorView src_codes(v.codes.data(), v.codes.dtype(), Shape{v.rows(), ld}, Shape{ld, 1}, v.codes.device());
    EAGLE3_RETURN_IF_ERROR(backend.Copy(src_codes, Rows(codes, row, v.rows())));
    EAGLE3_RETURN_IF_ERROR(backend.Copy(Rows(v.scales, 0, ScaleRows(v)), Rows(scales, scale_row, ScaleRows(v))));
    row += v.rows();
    scale_row += ScaleRows(v);
  }
  QuantizedWeightView view = first;
  view.codes = TensorView(codes.data(), codes.dtype(), Shape{rows, first.codes.dim(1)}, Shape{ld, 1}, codes.device());
  view.scales = scales.view();
  view.row0 = 0;
  view.scale_row0 = 0;
  if (tile) {
    // The stacked row-major codes are freed when this returns (CUDA's free waits for the tiling).
    EAGLE3_ASSIGN_OR_RETURN(codes, TileCodes(backend, backend.weight_allocator(), view));
  }
  return LinearWeight(std::move(codes), std::move(scales), view);
}

}  // namespace

absl::StatusOr<std::optional<LinearWeight>> StackLinearWeights(Backend& backend, std::span<const LinearWeight> parts,
                                                               bool gemm_tiles) {
  if (parts.empty()) return absl::InternalError("StackLinearWeights: no weights to stack");
  const LinearWeight& first = parts.front();
  bool dense = true, quantized = true;
  for (size_t i = 0; i < parts.size(); ++i) {
    const LinearWeight& p = parts[i];
    if (p.quantized()) {
      dense = false;
      quantized = quantized && StacksAlike(p.quantized_view(), first.quantized_view(), i + 1 < parts.size());
    } else {
      quantized = false;
      dense = dense && !p.dense_tensor().empty() && p.dense_tensor().rank() == 2 &&
              p.dense_tensor().dtype() == first.dense_tensor().dtype() && p.cols() == first.cols();
    }
  }
  if (!dense && !quantized) return std::optional<LinearWeight>();
  EAGLE3_ASSIGN_OR_RETURN(LinearWeight stacked,
                          dense ? StackDense(backend, parts) : StackQuantized(backend, parts, gemm_tiles));
  // The caller may free the parts once this returns: the copies must have read them.
  EAGLE3_RETURN_IF_ERROR(backend.Synchronize());
  return std::optional<LinearWeight>(std::move(stacked));
}

bool CanWarpTile(const QuantizedWeightView& w) {
  if (w.warp_tiled()) return false;
  if (w.format == WeightFormat::kFp8Block) return true;
  return w.format == WeightFormat::kInt4Group && w.col0 % kInt4PerWord == 0;
}

absl::StatusOr<LinearWeight> WarpTiledCopy(Backend& backend, const LinearWeight& w) {
  QuantizedWeightView view = w.quantized_view();
  if (!w.quantized() || !CanWarpTile(view)) {
    return absl::InvalidArgumentError(absl::StrCat("WarpTiledCopy: the weight (codes ", view.codes.ToString(),
                                                   ", col0 ", view.col0,
                                                   ") is not a row-major quantized slice that warp tiles can hold"));
  }
  EAGLE3_ASSIGN_OR_RETURN(Tensor tiles, TileCodes(backend, backend.weight_allocator(), view));
  EAGLE3_ASSIGN_OR_RETURN(Tensor scales, Tensor::Empty(view.scales.dtype(), view.scales.shape(),
                                                       backend.weight_allocator()));
  EAGLE3_RETURN_IF_ERROR(backend.Copy(view.scales, scales));
  view.scales = scales.view();
  return LinearWeight(std::move(tiles), std::move(scales), view);
}

LinearWeight::LinearWeight(Tensor dense) : dense_(std::move(dense)) {}

LinearWeight::LinearWeight(Tensor codes, Tensor scales, const QuantizedWeightView& view)
    : codes_(std::move(codes)), scales_(std::move(scales)), view_(view) {}

int64_t LinearWeight::rows() const { return quantized() ? view_.rows() : (dense_.rank() == 2 ? dense_.dim(0) : 0); }

int64_t LinearWeight::cols() const { return quantized() ? view_.k : (dense_.rank() == 2 ? dense_.dim(1) : 0); }

void LinearWeight::AppendTensors(std::vector<TensorView>& out) const {
  for (const Tensor* t : {&dense_, &codes_, &scales_}) {
    if (!t->empty()) out.push_back(t->view());
  }
}

absl::Status LinearWeight::Apply(Backend& backend, const TensorView& a, const TensorView& c,
                                 const GemmOptions& options) const {
  if (quantized()) return backend.QuantizedGemm(a, view_, c, options);
  if (dense_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("LinearWeight::Apply: the weight is empty (a ", a.ToString(), ", c ", c.ToString(), ")"));
  }
  return backend.Gemm(a, dense_, c, options);
}

absl::StatusOr<LinearWeight> LoadLinearWeight(Backend& backend, const Checkpoint& checkpoint, const WeightSpec& spec,
                                              StoredForm form, const QuantizationConfig& quantization,
                                              const ShardSpec& shard, const LinearWeightLoad& load) {
  WeightLoadStats unused;
  WeightLoadStats& stats = load.stats != nullptr ? *load.stats : unused;
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  // On a host backend the host tensors are the weights: never ring memory.
  UploadRing* const ring = backend.device().is_cpu() ? nullptr : load.upload_ring;
  Allocator& host_allocator = ring != nullptr ? *ring : DefaultHostAllocator();
  // Weights kept as long as their model come from the backend's weight memory: one device
  // allocation per chunk of it instead of one per tensor (Backend::weight_allocator).
  Allocator& dense_allocator = load.dense_allocator != nullptr ? *load.dense_allocator : backend.weight_allocator();
  Allocator& quantized_allocator =
      load.quantized_allocator != nullptr ? *load.quantized_allocator : backend.weight_allocator();
  ++stats.tensors;
  if (form != StoredForm::kPlain && load.keep_quantized.value_or(backend.keeps_quantized(FormatOf(form)))) {
    const HostReadTimer read(ring);
    EAGLE3_ASSIGN_OR_RETURN(QuantizedShard host,
                            ReadQuantizedShard(checkpoint, spec, form, quantization, shard, host_allocator));
    read.AddTo(stats);
    if (form == StoredForm::kFp8Block || AllBf16(host.scales)) {
      stats.host_bytes += static_cast<int64_t>(host.codes.nbytes() + host.scales.nbytes());
      const Clock::time_point start = Clock::now();
      Allocator* const tile_scratch = load.warp_tiles == LinearWeightLoad::WarpTiles::kNone ? nullptr
                                      : load.tile_scratch != nullptr                       ? load.tile_scratch
                                                                                           : &backend.allocator();
      absl::StatusOr<LinearWeight> loaded =
          LoadQuantized(backend, std::move(host), host_allocator, quantized_allocator, tile_scratch, load.warp_tiles);
      stats.device_seconds += since(start);
      if (!loaded.ok()) return PlacingError(spec.name, loaded.status());
      if (loaded->quantized_view().warp_tiled()) ++stats.tiled_tensors;
      return loaded;
    }
  }
  const HostReadTimer read(ring);
  EAGLE3_ASSIGN_OR_RETURN(Tensor host, ReadWeightShard(checkpoint, spec, form, quantization, shard, load.dense_dtype,
                                                       host_allocator));
  read.AddTo(stats);
  stats.host_bytes += static_cast<int64_t>(host.nbytes());
  if (backend.device().is_cpu()) return LinearWeight(std::move(host));
  const Clock::time_point start = Clock::now();
  absl::StatusOr<Tensor> device = Upload(backend, dense_allocator, host);
  stats.device_seconds += since(start);
  if (!device.ok()) return PlacingError(spec.name, device.status());
  return LinearWeight(std::move(*device));
}

}  // namespace eagle3
