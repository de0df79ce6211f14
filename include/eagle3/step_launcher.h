// StepLauncher: how a decode loop enqueues a staged target step (TargetModel::Stage, then Launch,
// then Finish). The loop stages and finishes; the launcher decides how the device work is issued:
// eagerly, or by replaying CUDA graphs captured per step signature
// (eagle3/cuda/graph_step_launcher.h).
#pragma once

#include "absl/status/status.h"
#include "eagle3/target_model.h"

namespace eagle3 {

class StepLauncher {
 public:
  virtual ~StepLauncher() = default;
  // Enqueues the device work of the step staged in `model` (as model.Launch() would).
  virtual absl::Status Launch(TargetModel& model) = 0;
};

}  // namespace eagle3
