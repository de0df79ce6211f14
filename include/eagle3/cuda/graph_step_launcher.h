// GraphStepLauncher: replays a captured CUDA graph for every step whose signature it has seen
// before: target steps (TargetModel::StepSignature), or any step's work (LaunchWork, as
// SpeculativeStep enqueues a whole speculative step). A signature's first step runs eagerly (first calls size
// the backend's scratch), its second is captured and replayed, later ones are replayed. Steps that
// are not capturable (TargetModel::StepIsCapturable: long extends) always run eagerly. A capture
// that fails (for example a host-staged collective) marks the signature eager and is counted.
// Graphs are kept per model (one launcher may serve several live models); call Clear() when a model
// is destroyed, before another one could take its address.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/export.h"
#include "eagle3/step_launcher.h"

namespace eagle3::cuda {

class EAGLE3_API GraphStepLauncher final : public StepLauncher {
 public:
  // `stream`: the stream of the model's CudaBackend. At most `max_graphs` graphs are kept (the
  // least recently used is dropped beyond that).
  explicit GraphStepLauncher(cudaStream_t stream, int max_graphs = 16)
      : stream_(stream), max_graphs_(max_graphs) {}

  absl::Status Launch(TargetModel& model) override;
  // The first call of a signature runs `enqueue` eagerly, the second captures it, later ones replay
  // the capture; a failed capture marks the signature eager. Include in `signature` whatever tells
  // apart the owners of the buffers the work uses (for example an object's address).
  absl::Status LaunchWork(const std::vector<int64_t>& signature, const std::function<absl::Status()>& enqueue) override;

  struct Counts {
    int64_t eager = 0, captures = 0, replays = 0, failed_captures = 0;
  };
  const Counts& counts() const { return counts_; }
  // Drops every graph (and what was learned about each signature).
  void Clear() { entries_.clear(); }

 private:
  struct Entry {
    int64_t seen = 0;
    int64_t last_use = 0;
    bool eager_only = false;
    std::unique_ptr<CudaGraph> graph;
  };
  cudaStream_t stream_;
  int max_graphs_;
  int64_t clock_ = 0;
  std::map<std::vector<int64_t>, Entry> entries_;
  Counts counts_;
};

}  // namespace eagle3::cuda
