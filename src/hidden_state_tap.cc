#include "eagle3/hidden_state_tap.h"

#include <algorithm>
#include <string>

#include "absl/status/status.h"

namespace eagle3 {
namespace {

std::string Join(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const char* ConventionName(LayerIdConvention c) {
  return c == LayerIdConvention::kOutputOfLayer ? "output-of-layer" : "input-of-layer";
}

}  // namespace

std::vector<int> HiddenStateTap::DefaultBoundaries(int num_layers) {
  return {2, num_layers / 2, num_layers - 3};
}

absl::StatusOr<HiddenStateTap> HiddenStateTap::Create(std::optional<std::span<const int>> layer_ids,
                                                      LayerIdConvention convention, int num_layers,
                                                      int64_t hidden_size,
                                                      std::optional<int64_t> fc_input_width) {
  if (num_layers < 1 || hidden_size < 1) {
    return absl::InvalidArgumentError("hidden state tap: num_layers (" + std::to_string(num_layers) +
                                      ") and hidden_size (" + std::to_string(hidden_size) +
                                      ") must be positive");
  }
  HiddenStateTap tap;
  tap.convention_ = convention;
  tap.num_layers_ = num_layers;
  tap.hidden_size_ = hidden_size;
  if (!layer_ids.has_value()) {
    if (num_layers < 7) {
      return absl::InvalidArgumentError(
          "hidden state tap: the default boundaries {2, L/2, L-3} are distinct only from 7 layers on, "
          "the target has " + std::to_string(num_layers) + "; name the aux layer ids explicitly");
    }
    tap.boundaries_ = DefaultBoundaries(num_layers);
  } else {
    const bool output_of = convention == LayerIdConvention::kOutputOfLayer;
    const int max_id = output_of ? num_layers - 1 : num_layers;
    for (size_t i = 0; i < layer_ids->size(); ++i) {
      const int id = (*layer_ids)[i];
      if (id < 0 || id > max_id) {
        return absl::InvalidArgumentError(
            "aux layer id [" + std::to_string(i) + "] = " + std::to_string(id) + " is out of range [0, " +
            std::to_string(max_id) + "] for a " + std::to_string(num_layers) + "-layer target in the " +
            ConventionName(convention) + " convention (" +
            (output_of ? "id k = output of layer k = boundary k+1"
                       : "id k = input of layer k = boundary k") +
            "); there is no -1 for the embedding: the embedding output is boundary 0, i.e. "
            "input-of-layer id 0");
      }
      tap.boundaries_.push_back(output_of ? id + 1 : id);
    }
    tap.layer_ids_.assign(layer_ids->begin(), layer_ids->end());
    if (tap.boundaries_.empty()) {
      return absl::InvalidArgumentError("aux layer ids are empty: the draft needs at least one tap");
    }
  }
  std::vector<int> sorted = tap.boundaries_;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("aux layer ids resolve to duplicate boundaries " +
                                      Join(tap.boundaries_));
  }
  if (fc_input_width.has_value() && tap.width() != *fc_input_width) {
    return absl::InvalidArgumentError(
        "hidden state tap width " + std::to_string(tap.boundaries_.size()) + " x " +
        std::to_string(hidden_size) + " = " + std::to_string(tap.width()) +
        " does not match the draft fc input width " + std::to_string(*fc_input_width));
  }
  return tap;
}

absl::StatusOr<HiddenStateTap> HiddenStateTap::FinalNormed(int num_layers, int64_t hidden_size) {
  if (num_layers < 1 || hidden_size < 1) {
    return absl::InvalidArgumentError("hidden state tap: num_layers (" + std::to_string(num_layers) +
                                      ") and hidden_size (" + std::to_string(hidden_size) +
                                      ") must be positive");
  }
  HiddenStateTap tap;
  tap.num_layers_ = num_layers;
  tap.hidden_size_ = hidden_size;
  tap.boundaries_ = {num_layers + 1};
  return tap;
}

int HiddenStateTap::SlotOf(int boundary) const {
  for (size_t i = 0; i < boundaries_.size(); ++i) {
    if (boundaries_[i] == boundary) return static_cast<int>(i);
  }
  return -1;
}

std::string HiddenStateTap::Describe() const {
  if (boundaries_.size() == 1 && boundaries_[0] == final_norm_boundary()) {
    return "the final hidden after model.norm (the lm_head's input, boundary " +
           std::to_string(final_norm_boundary()) + " after the layer boundaries 0.." + std::to_string(num_layers_) +
           "); width " + std::to_string(hidden_size_);
  }
  std::string s = layer_ids_.empty()
                      ? std::string("default taps")
                      : "aux layer ids " + Join(layer_ids_) + " (" + ConventionName(convention_) + ")";
  s += " -> boundaries " + Join(boundaries_) + " of 0.." + std::to_string(num_layers_) +
       " (0 = embedding output, " + std::to_string(num_layers_) + " = before the final norm); aux width " +
       std::to_string(boundaries_.size()) + " x " + std::to_string(hidden_size_) + " = " +
       std::to_string(width());
  return s;
}

}  // namespace eagle3
