// Writer for the safetensors format (the inverse of eagle3/safetensors.h).
#pragma once

#include <map>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

struct NamedTensor {
  std::string name;   // non-empty, unique, not "__metadata__"
  TensorView tensor;  // any shape and dtype, host, contiguous; data may be null only when empty
};

// Writes `tensors` (and `metadata` as "__metadata__", omitted when empty) to `path`. The data is
// laid out in order of decreasing element size, stable otherwise, and the header is padded with
// spaces to a multiple of 8 bytes, so every tensor's offset in the file is aligned to its element
// size and readers can view it in place. The file is written to a temporary next to `path`,
// flushed to disk and renamed over `path`, so readers never see a partial file. Errors:
// InvalidArgument (duplicate/empty name, device or non-contiguous tensor) naming the tensor, or
// the OS error naming the file.
absl::Status WriteSafetensors(const std::string& path, std::span<const NamedTensor> tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace eagle3
