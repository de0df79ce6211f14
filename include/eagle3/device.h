// Where a tensor's bytes live.
#pragma once

#include <string>

#include "eagle3/export.h"

namespace eagle3 {

enum class DeviceType { kCpu, kCuda };

struct EAGLE3_API Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU.

  static constexpr Device Cpu() { return Device{DeviceType::kCpu, 0}; }
  static constexpr Device Cuda(int index) { return Device{DeviceType::kCuda, index}; }

  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  friend bool operator==(const Device&, const Device&) = default;

  std::string ToString() const;  // "cpu", "cuda:1"
};

}  // namespace eagle3
