#include "eagle3/cuda/graph_step_launcher.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "eagle3/status.h"

namespace eagle3::cuda {

absl::Status GraphStepLauncher::Launch(TargetModel& model) {
  if (!model.StepIsCapturable()) {
    ++counts_.eager;
    return model.Launch();
  }
  // Graphs belong to one model's buffers: the key is the model and its step signature.
  std::vector<int64_t> key = model.StepSignature();
  key.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(&model)));
  return LaunchWork(key, [&] { return model.Launch(); });
}

absl::Status GraphStepLauncher::LaunchWork(const std::vector<int64_t>& signature,
                                           const std::function<absl::Status()>& enqueue) {
  Entry& e = entries_[signature];
  e.last_use = ++clock_;
  ++e.seen;
  if (e.graph == nullptr && (e.eager_only || e.seen == 1)) {
    ++counts_.eager;
    return enqueue();
  }
  if (e.graph == nullptr) {
    auto captured = CudaGraph::Capture(stream_, enqueue);
    if (!captured.ok()) {
      // Not capturable on this setup: run this and every later step of the signature eagerly.
      e.eager_only = true;
      ++counts_.failed_captures;
      ++counts_.eager;
      return enqueue();
    }
    e.graph = std::move(*captured);
    ++counts_.captures;
    // Keep at most max_graphs_ graphs: drop the least recently used other one.
    int64_t graphs = 0;
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.graph == nullptr) continue;
      ++graphs;
      if (&it->second != &e && (oldest == entries_.end() || it->second.last_use < oldest->second.last_use)) {
        oldest = it;
      }
    }
    if (graphs > max_graphs_ && oldest != entries_.end()) oldest->second.graph.reset();
  }
  ++counts_.replays;
  return e.graph->Launch(stream_);
}

}  // namespace eagle3::cuda
