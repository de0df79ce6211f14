// HiddenStateTap: which residual-stream tensors of the target the EAGLE-3 draft sees (docs/semantics.md).
//
// Boundary b in [0, L] of an L-layer target names one tensor: b = 0 the embedding output (input of
// layer 0), b = i the fully reduced `hidden + residual` after layer i-1 (input of layer i), b = L the
// output of the last layer before the final norm. Engines disagree on layer ids: SGLang, TensorRT-LLM
// and SpecForge configs mean "output of layer k" (b = k + 1), vLLM means "input of layer k" (b = k).
// The convention is explicit here and the resolution is reported by Describe().
//
// One more tensor is not a layer boundary: the final hidden after `model.norm`, the lm_head's input,
// which DeepSeek-V3's MTP module reads (docs/mla_drafts.md). FinalNormed() taps it alone, as
// boundary L + 1 (final_norm_boundary()); no layer id names it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eagle3/export.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

enum class LayerIdConvention {
  kOutputOfLayer,  // id k = output of layer k = boundary k + 1 (SGLang, TensorRT-LLM, SpecForge)
  kInputOfLayer,   // id k = input of layer k = boundary k (vLLM)
};

class EAGLE3_API HiddenStateTap {
 public:
  // Boundaries used when a draft config names no aux layers: {2, L/2, L-3} (SGLang's default
  // capture points, which are layer inputs). Create needs L >= 7 for them to be distinct.
  static std::vector<int> DefaultBoundaries(int num_layers);

  // Resolves `layer_ids` (std::nullopt: the defaults) under `convention` for a target with
  // `num_layers` layers of width `hidden_size`. A negative or out-of-range id is InvalidArgument
  // that explains the convention (there is no "-1 = embedding": the embedding is boundary 0, i.e.
  // input-of-layer id 0). Duplicate boundaries are refused. When `fc_input_width` is given, k taps of
  // width H must give k * H == fc_input_width.
  static absl::StatusOr<HiddenStateTap> Create(std::optional<std::span<const int>> layer_ids,
                                               LayerIdConvention convention, int num_layers,
                                               int64_t hidden_size,
                                               std::optional<int64_t> fc_input_width = std::nullopt);

  // The tap of the final normed hidden alone: [T, hidden_size], the tensor the target's lm_head
  // reads (after model.norm), for an L = `num_layers` target. InvalidArgument for non-positive sizes.
  static absl::StatusOr<HiddenStateTap> FinalNormed(int num_layers, int64_t hidden_size);

  // Boundaries in config order (the order of the concatenation).
  const std::vector<int>& boundaries() const { return boundaries_; }
  int num_layers() const { return num_layers_; }
  int64_t hidden_size() const { return hidden_size_; }
  int64_t width() const { return static_cast<int64_t>(boundaries_.size()) * hidden_size_; }
  // Index of boundary b in the concatenation, or -1 when it is not tapped.
  int SlotOf(int boundary) const;
  // L + 1: the boundary number of the final normed hidden (FinalNormed).
  int final_norm_boundary() const { return num_layers_ + 1; }

  // One line for logs: "aux layer ids [1, 15, 28] (output-of-layer) -> boundaries [2, 16, 29] of
  // 0..32 (0 = embedding output, 32 = before the final norm); aux width 3 x 7168 = 21504".
  std::string Describe() const;

 private:
  HiddenStateTap() = default;

  std::vector<int> boundaries_;
  std::vector<int> layer_ids_;  // as given (empty when defaulted)
  LayerIdConvention convention_ = LayerIdConvention::kOutputOfLayer;
  int num_layers_ = 0;
  int64_t hidden_size_ = 0;
};

}  // namespace eagle3
