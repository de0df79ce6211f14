#include "eagle3/device.h"

namespace eagle3 {

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace eagle3
