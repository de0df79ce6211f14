#include "weight_loader.h"

#include <chrono>
#include <utility>

#include "eagle3/status.h"
#include "host_read_timer.h"
#include "reused_buffer_allocator.h"

namespace eagle3 {

WeightLoader::WeightLoader(const Checkpoint& checkpoint, const QuantizationConfig& quantization,
                           const std::vector<WeightSpec>& schema, const std::vector<StoredForm>& forms, int tp_size,
                           int rank, Backend& backend, Checks checks)
    : checkpoint_(&checkpoint),
      quantization_(quantization),
      schema_(schema),
      forms_(forms),
      tp_size_(tp_size),
      rank_(rank),
      backend_(&backend),
      checks_(checks) {
  for (size_t i = 0; i < schema_.size(); ++i) index_.emplace(schema_[i].name, i);
}

WeightLoader::~WeightLoader() = default;

absl::StatusOr<UploadRing*> WeightLoader::Ring() {
  if (!ring_made_) {
    ring_made_ = true;
    if (!backend_->device().is_cpu()) {
      const auto start = std::chrono::steady_clock::now();
      EAGLE3_ASSIGN_OR_RETURN(ring_, backend_->CreateUploadRing());
      if (stats_ != nullptr) {
        stats_->device_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
    }
  }
  return ring_.get();
}

absl::StatusOr<WeightSpec> WeightLoader::Spec(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::InternalError("weight '" + std::string(name) + "' is not in the model's weight schema");
  }
  return schema_[it->second];
}

absl::StatusOr<size_t> WeightLoader::Find(const WeightSpec& spec) const {
  if (forms_.size() != schema_.size()) {
    return absl::InternalError("WeightLoader: " + std::to_string(forms_.size()) + " stored forms for a schema of " +
                               std::to_string(schema_.size()) + " tensors");
  }
  const auto it = index_.find(spec.name);
  if (it == index_.end()) {
    return absl::InternalError("weight '" + spec.name + "' is not in the model's weight schema");
  }
  const WeightSpec& listed = schema_[it->second];
  if (listed.shape != spec.shape || listed.split != spec.split || listed.vocab_padded != spec.vocab_padded) {
    return absl::InternalError("weight '" + spec.name + "': a block expects shape " + spec.shape.ToString() +
                               ", the model's weight schema lists " + listed.shape.ToString() +
                               " (or another tensor-parallel split)");
  }
  return it->second;
}

absl::StatusOr<Tensor> WeightLoader::ReadHost(const WeightSpec& spec, DType dtype) const {
  return ReadHostInto(spec, dtype, DefaultHostAllocator());
}

absl::StatusOr<Tensor> WeightLoader::ReadHostInto(const WeightSpec& spec, DType dtype, Allocator& allocator) const {
  EAGLE3_ASSIGN_OR_RETURN(const size_t i, Find(spec));
  if (checks_ == Checks::kEachRead) {
    EAGLE3_RETURN_IF_ERROR(CheckStoredWeight(*checkpoint_, spec, forms_[i], quantization_));
  }
  return ReadWeightShard(*checkpoint_, spec, forms_[i], quantization_, spec.ForRank(tp_size_, rank_), dtype,
                         allocator);
}

absl::StatusOr<DType> WeightLoader::StoredDtype(const WeightSpec& spec) const {
  EAGLE3_ASSIGN_OR_RETURN(const size_t i, Find(spec));
  if (forms_[i] != StoredForm::kPlain) {
    return absl::InternalError("WeightLoader::StoredDtype: weight '" + spec.name + "' is stored quantized");
  }
  if (checks_ == Checks::kEachRead) {
    EAGLE3_RETURN_IF_ERROR(CheckStoredWeight(*checkpoint_, spec, forms_[i], quantization_));
  }
  EAGLE3_ASSIGN_OR_RETURN(const TensorInfo info, checkpoint_->Info(spec.name));
  return info.dtype;
}

absl::StatusOr<Tensor> WeightLoader::ToDevice(Tensor host) {
  if (backend_->device().is_cpu()) return host;
  const auto start = std::chrono::steady_clock::now();
  EAGLE3_ASSIGN_OR_RETURN(Tensor device, Tensor::Empty(host.dtype(), host.shape(), backend_->weight_allocator()));
  EAGLE3_RETURN_IF_ERROR(backend_->Copy(host, device));
  if (stats_ != nullptr) {
    stats_->device_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  return device;
}

absl::StatusOr<Tensor> WeightLoader::Load(const WeightSpec& spec, DType dtype) {
  EAGLE3_ASSIGN_OR_RETURN(UploadRing* const ring, Ring());
  const HostReadTimer timer(ring);
  EAGLE3_ASSIGN_OR_RETURN(Tensor host,
                          ReadHostInto(spec, dtype, ring != nullptr ? *ring : DefaultHostAllocator()));
  if (stats_ != nullptr) {
    ++stats_->tensors;
    stats_->host_bytes += static_cast<int64_t>(host.nbytes());
    timer.AddTo(*stats_);
  }
  // The host tensor is freed when ToDevice returns; a ring holds its memory until the copy is done.
  return ToDevice(std::move(host));
}

absl::StatusOr<Tensor> WeightLoader::Load(std::string_view name, DType dtype) {
  EAGLE3_ASSIGN_OR_RETURN(const WeightSpec spec, Spec(name));
  return Load(spec, dtype);
}

absl::StatusOr<LinearWeight> WeightLoader::LoadLinear(const WeightSpec& spec, DType dense_dtype,
                                                      StackPart stack_part, Codes codes) {
  EAGLE3_ASSIGN_OR_RETURN(const size_t i, Find(spec));
  if (checks_ == Checks::kEachRead) {
    EAGLE3_RETURN_IF_ERROR(CheckStoredWeight(*checkpoint_, spec, forms_[i], quantization_));
  }
  EAGLE3_ASSIGN_OR_RETURN(UploadRing* const ring, Ring());
  LinearWeightLoad load;
  load.dense_dtype = dense_dtype;
  load.keep_quantized = keep_quantized_;
  load.stats = stats_;
  load.upload_ring = ring;
  if (stack_part != StackPart::kNo) load.dense_allocator = &backend_->allocator();
  if (stack_part == StackPart::kYes) load.quantized_allocator = &backend_->allocator();
  if (codes != Codes::kRowMajor && stack_part != StackPart::kYes && !backend_->device().is_cpu()) {
    if (tile_scratch_ == nullptr) tile_scratch_ = std::make_unique<ReusedBufferAllocator>(backend_->allocator());
    load.warp_tiles =
        codes == Codes::kExpertTiles ? LinearWeightLoad::WarpTiles::kExperts : LinearWeightLoad::WarpTiles::kGemm;
    load.tile_scratch = tile_scratch_.get();
  }
  return LoadLinearWeight(*backend_, *checkpoint_, spec, forms_[i], quantization_, spec.ForRank(tp_size_, rank_), load);
}

absl::StatusOr<std::vector<LinearWeight>> WeightLoader::LoadStackedLinear(std::span<const WeightSpec> specs,
                                                                          DType dense_dtype) {
  if (specs.empty()) return absl::InternalError("WeightLoader::LoadStackedLinear: no tensors to stack");
  std::vector<LinearWeight> parts;
  for (const WeightSpec& spec : specs) {
    EAGLE3_ASSIGN_OR_RETURN(LinearWeight part, LoadLinear(spec, dense_dtype, StackPart::kYes));
    if (!parts.empty() && part.cols() != parts.front().cols()) {
      return absl::InternalError("WeightLoader::LoadStackedLinear: '" + spec.name + "' has " +
                                 std::to_string(part.cols()) + " columns, '" + specs.front().name + "' " +
                                 std::to_string(parts.front().cols()));
    }
    parts.push_back(std::move(part));
  }
  if (parts.size() == 1) return parts;
  EAGLE3_ASSIGN_OR_RETURN(std::optional<LinearWeight> stacked,
                          StackLinearWeights(*backend_, parts, /*gemm_tiles=*/true));
  if (!stacked.has_value()) return parts;
  std::vector<LinearWeight> one;
  one.push_back(std::move(*stacked));
  return one;
}

}  // namespace eagle3
