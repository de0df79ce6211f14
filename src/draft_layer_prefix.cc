#include "eagle3/draft_layer_prefix.h"

#include "absl/strings/str_cat.h"

namespace eagle3 {

absl::StatusOr<std::string> DraftLayerPrefix(const Checkpoint& checkpoint) {
  bool layers = false, midlayer = false;
  for (const std::string& name : checkpoint.TensorNames()) {
    layers = layers || name.starts_with("layers.");
    midlayer = midlayer || name.starts_with(kDraftMidlayerPrefix);
  }
  if (layers && midlayer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft checkpoint '", checkpoint.dir(),
        "' has both midlayer.* and layers.* tensors; expected one decoder layer under one prefix"));
  }
  return std::string(layers ? kDraftLayersPrefix : kDraftMidlayerPrefix);
}

}  // namespace eagle3
