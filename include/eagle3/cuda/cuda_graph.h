// CudaGraph: captures the work a function enqueues on a stream into a CUDA graph, and replays it.
// For a decode step that issues the same launches every time (TargetModel::Stage / Launch /
// Finish): capture Launch once, then per step Stage (host only) + graph Launch + Finish.
#pragma once

#include <functional>
#include <memory>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/export.h"

namespace eagle3::cuda {

class EAGLE3_API CudaGraph {
 public:
  // Begins a capture on `stream` (thread-local mode: only this thread's unsafe calls break it),
  // calls `enqueue`, ends the capture and instantiates the graph. Nothing runs while capturing.
  // An error from `enqueue`, or any operation the capture cannot record (a host synchronization,
  // a synchronous copy from pageable memory, an allocation that synchronizes), is returned as a
  // Status naming what failed, and the stream is left out of capture mode.
  static absl::StatusOr<std::unique_ptr<CudaGraph>> Capture(cudaStream_t stream,
                                                            const std::function<absl::Status()>& enqueue);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Enqueues one replay on `stream` (asynchronous).
  absl::Status Launch(cudaStream_t stream);
  // Kernel, copy and other nodes the capture recorded.
  size_t num_nodes() const { return num_nodes_; }

 private:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, size_t num_nodes)
      : graph_(graph), exec_(exec), num_nodes_(num_nodes) {}
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t num_nodes_ = 0;
};

}  // namespace eagle3::cuda
