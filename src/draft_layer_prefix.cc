#include "eagle3/draft_layer_prefix.h"

#include "absl/strings/str_cat.h"

namespace eagle3 {

absl::StatusOr<std::string> DraftLayerPrefix(const Checkpoint& checkpoint) {
  bool layers = false, midlayer = false;
  for (const std::string& name : checkpoint.TensorNames()) {
    layers = layers || name.starts_with("layers.");
    midlayer = midlayer || name.starts_with(kDraftMidlayerPrefix);
    // A layer numbered other than 0: an engine's in-memory module name (vLLM numbers the draft's
    // layer after the target's, start_layer_id), or a draft of more than one layer. Neither is a
    // layout the exporters write, and read as layers.0. it would only show as a missing tensor.
    if (name.starts_with("layers.") && !name.starts_with(kDraftLayersPrefix)) {
      const size_t dot = name.find('.', 7);
      const std::string layer = name.substr(0, dot == std::string::npos ? name.size() : dot + 1);
      const std::string layers0(kDraftLayersPrefix), midlayer0(kDraftMidlayerPrefix);
      return absl::InvalidArgumentError(
          "draft checkpoint '" + checkpoint.dir() + "' has tensor '" + name + "' under '" + layer +
          "'; an EAGLE-3 draft's one decoder layer is named '" + layers0 + "' or '" + midlayer0 +
          "' (a layer numbered by the target's layer count is an engine's in-memory name, not an export; rename '" +
          layer + "' to '" + layers0 + "')");
    }
  }
  if (layers && midlayer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft checkpoint '", checkpoint.dir(),
        "' has both midlayer.* and layers.* tensors; expected one decoder layer under one prefix"));
  }
  return std::string(layers ? kDraftLayersPrefix : kDraftMidlayerPrefix);
}

}  // namespace eagle3
