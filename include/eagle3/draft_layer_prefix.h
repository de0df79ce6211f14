// The two namings of the one decoder layer in EAGLE-3 draft checkpoints, Llama-style and MLA heads
// alike: "midlayer." (SpecForge, SGLang, TorchSpec's native form) and "layers.0." (vLLM,
// speculators, TorchSpec's --vllm export, ModelOpt). vLLM renames midlayer. to layers.0. and SGLang
// the reverse, so a loader accepts both and reads which one a checkpoint uses.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "eagle3/checkpoint.h"
#include "eagle3/export.h"

namespace eagle3 {

inline constexpr std::string_view kDraftLayersPrefix = "layers.0.";
inline constexpr std::string_view kDraftMidlayerPrefix = "midlayer.";

// The layer prefix `checkpoint` uses: kDraftLayersPrefix when it holds tensors named "layers.*",
// else kDraftMidlayerPrefix (also when it holds no layer tensor at all: the weight check then names
// the first missing one). InvalidArgument when it holds both midlayer.* and layers.* tensors, or a
// tensor under layers.N. with N other than 0 (naming it): one exported draft layer is always
// layers.0.; a layer numbered after the target's layers (vLLM's start_layer_id, in its module
// names) or a second layer would otherwise surface as a missing layers.0. tensor.
EAGLE3_API absl::StatusOr<std::string> DraftLayerPrefix(const Checkpoint& checkpoint);

}  // namespace eagle3
