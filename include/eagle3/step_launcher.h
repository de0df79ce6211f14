// StepLauncher: how a decode loop enqueues the device work of a step. The loop stages (host only)
// and waits; the launcher decides how the device work is issued: eagerly, or by replaying CUDA
// graphs captured per step signature (eagle3/cuda/graph_step_launcher.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "eagle3/export.h"
#include "eagle3/target_model.h"

namespace eagle3 {

class EAGLE3_API StepLauncher {
 public:
  virtual ~StepLauncher() = default;
  // Enqueues the device work of the step staged in `model` (as model.Launch() would).
  virtual absl::Status Launch(TargetModel& model) = 0;
  // Enqueues a step's device work through `enqueue`, which issues it without any host
  // synchronization and whose device work depends only on `signature` (shapes and buffer addresses;
  // the values it reads come from buffers the caller fills before each step). The caller has
  // already staged the step's host inputs, so a launcher may replay a capture of an earlier
  // `enqueue` with an equal signature instead of calling it. Eager by default.
  virtual absl::Status LaunchWork(const std::vector<int64_t>& signature, const std::function<absl::Status()>& enqueue) {
    (void)signature;
    return enqueue();
  }
};

}  // namespace eagle3
