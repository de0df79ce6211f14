// Feeds arbitrary bytes as a whole safetensors file image to the parser that SafetensorsFile::Open
// uses. Besides the sanitizers' checks, an accepted file must satisfy the layout invariants.
#include <cstddef>
#include <cstdint>
#include <span>

#include "eagle3/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto layout = eagle3::ParseSafetensorsBuffer(std::span<const uint8_t>(data, size), "fuzz");
  if (!layout.ok()) {
    if (layout.status().message().empty()) __builtin_trap();  // every error must explain itself
    return 0;
  }
  if (layout->data_offset + layout->data_size != size) __builtin_trap();
  uint64_t cursor = 0;  // accepted tensors tile the data section exactly, in order
  for (const eagle3::TensorInfo& t : layout->tensors) {
    if (t.begin != cursor || t.end < t.begin) __builtin_trap();
    if (static_cast<uint64_t>(t.shape.numel()) * eagle3::DTypeSize(t.dtype) != t.end - t.begin) {
      __builtin_trap();
    }
    cursor = t.end;
  }
  if (cursor != layout->data_size) __builtin_trap();
  return 0;
}
