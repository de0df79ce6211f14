// WeightLoader: how one tensor-parallel rank of a model reads its weights, for the model itself and
// for the blocks it is made of (MlaBlock, FeedForwardBlock): this rank's shard of a tensor of the
// model's weight schema, stored as the model's quantization says, checked against the checkpoint,
// dequantized on the host and placed on the backend's device. The blocks describe their tensors
// themselves (MlaAttentionWeights, ...); the loader holds them to the schema the model checked, so
// a block and its model cannot disagree about a tensor's shape or stored form.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/dtype.h"
#include "eagle3/quantization_config.h"
#include "eagle3/tensor.h"
#include "eagle3/upload_ring.h"
#include "eagle3/weight_load_stats.h"
#include "linear_weight.h"

namespace eagle3 {

class WeightLoader {
 public:
  enum class Checks {
    kEachRead,  // every read checks the checkpoint's tensors first (CheckStoredWeight)
    // The model ran CheckStoredWeight on every schema tensor before creating the loader (a target
    // checks a whole checkpoint before loading any of it): reads skip it, so that a large quantized
    // checkpoint's headers and weight_shape tensors are not read twice.
    kSchemaChecked,
  };

  // `schema`: every tensor the model reads, `forms` how each is stored (StoredForms of the schema,
  // same order; sizes must match). `checkpoint` and `backend` must outlive the loader; `quantization`
  // is copied.
  WeightLoader(const Checkpoint& checkpoint, const QuantizationConfig& quantization,
               const std::vector<WeightSpec>& schema, const std::vector<StoredForm>& forms, int tp_size, int rank,
               Backend& backend, Checks checks = Checks::kEachRead);
  // Waits for the uploads from the loader's UploadRing, if it made one, and frees it.
  ~WeightLoader();
  WeightLoader(WeightLoader&&) = default;
  WeightLoader& operator=(WeightLoader&&) = default;

  // The schema's tensor named `name`; Internal when the schema has none (a model asking for a
  // tensor it never checked).
  absl::StatusOr<WeightSpec> Spec(std::string_view name) const;

  // This rank's shard of `spec` on the host, dequantized and converted to `dtype` (f32, f16 or
  // bf16). Under Checks::kEachRead the checkpoint's tensors of it are checked first
  // (CheckStoredWeight): a missing one is NotFound, one of another shape InvalidArgument, each naming
  // the tensor, expected and actual. `spec` must be the schema's entry of its name (Internal
  // otherwise).
  absl::StatusOr<Tensor> ReadHost(const WeightSpec& spec, DType dtype) const;
  // The dtype the checkpoint stores `spec` in, for a tensor stored unquantized (a quantized one is
  // Internal), from the header alone. Checks as ReadHost.
  absl::StatusOr<DType> StoredDtype(const WeightSpec& spec) const;
  // ReadHost on the backend's device. On a backend with an UploadRing (Backend::CreateUploadRing,
  // made at the first load that uploads and kept until the loader is destroyed) the read goes into
  // the ring, and the upload overlaps the next reads; so do LoadLinear's.
  absl::StatusOr<Tensor> Load(const WeightSpec& spec, DType dtype);
  // Load of the schema's tensor named `name`.
  absl::StatusOr<Tensor> Load(std::string_view name, DType dtype);
  // A host tensor on the backend's device (the tensor itself on a host backend), in weight memory
  // (Backend::weight_allocator): for a tensor kept as long as the model.
  absl::StatusOr<Tensor> ToDevice(Tensor host);

  // Whether a linear weight is a part the caller copies into a stacked weight (StackLinearWeights)
  // and then frees. Such parts come from Backend::allocator() rather than the weight memory, whose
  // freed pieces return only with their whole chunk (Backend::weight_allocator).
  enum class StackPart {
    kNo,       // kept as long as the model in either form
    kIfDense,  // stacked when loaded dense, kept when kept quantized (a routed expert's gate / up)
    kYes,      // stacked in either form
  };
  // A Linear layer's weight (Gemm's b): this rank's shard of `spec`, kept quantized when the
  // checkpoint stores it so and keep_quantized() says to (LoadLinearWeight), else dense in
  // `dense_dtype`. Checks as ReadHost.
  // How a weight kept quantized lays out its codes (a part loaded to be stacked, StackPart::kYes,
  // is always row-major: LoadStackedLinear tiles the stacked weight).
  enum class Codes {
    kRowMajor,
    // Warp tiles where the backend takes them for QuantizedGemm (Backend::tiles_gemm_codes), for a
    // weight that only Backend::QuantizedGemm reads (LinearWeight::Apply).
    kGemmTiles,
    // Warp tiles where the backend takes them for QuantizedMoeExperts (Backend::tiles_expert_codes),
    // for a weight that only it reads (a routed expert's).
    kExpertTiles,
  };
  absl::StatusOr<LinearWeight> LoadLinear(const WeightSpec& spec, DType dense_dtype,
                                          StackPart stack_part = StackPart::kNo, Codes codes = Codes::kGemmTiles);
  // The shards of `specs` as one weight stacked by rows when StackLinearWeights can stack them (one
  // element; quantized, in warp tiles where the backend takes them for QuantizedGemm), else each
  // alone (in order). Every spec has the same column count. The parts are loaded as
  // StackPart::kYes, so where they cannot be stacked they stay in Backend::allocator().
  absl::StatusOr<std::vector<LinearWeight>> LoadStackedLinear(std::span<const WeightSpec> specs, DType dense_dtype);

  // Whether LoadLinear keeps quantized weights so; unset: when the backend streams the format
  // (Backend::keeps_quantized).
  void set_keep_quantized(std::optional<bool> keep) { keep_quantized_ = keep; }
  std::optional<bool> keep_quantized() const { return keep_quantized_; }

  // Counts every later load's time and bytes into *stats (WeightLoadStats; nullptr: none). `stats`
  // must outlive the loads.
  void set_stats(WeightLoadStats* stats) { stats_ = stats; }

  Backend& backend() const { return *backend_; }

 private:
  // The schema entry of `spec`'s name, checked equal to it.
  absl::StatusOr<size_t> Find(const WeightSpec& spec) const;
  // ReadHost into memory of `allocator`.
  absl::StatusOr<Tensor> ReadHostInto(const WeightSpec& spec, DType dtype, Allocator& allocator) const;
  // The loader's UploadRing, made on first use; nullptr on a host backend or one without a ring.
  absl::StatusOr<UploadRing*> Ring();

  const Checkpoint* checkpoint_;
  QuantizationConfig quantization_;
  std::vector<WeightSpec> schema_;
  std::vector<StoredForm> forms_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in schema_
  int tp_size_;
  int rank_;
  Backend* backend_;
  Checks checks_;
  std::optional<bool> keep_quantized_;
  WeightLoadStats* stats_ = nullptr;
  bool ring_made_ = false;
  std::unique_ptr<UploadRing> ring_;
  // Where Codes::kExpertTiles loads upload the row-major codes before tiling them: one buffer for
  // the whole load (LinearWeightLoad::tile_scratch), made on first use. Declared after ring_ so
  // that it is freed first (its upstream free waits for the device, hence for the uploads).
  std::unique_ptr<Allocator> tile_scratch_;
};

}  // namespace eagle3
