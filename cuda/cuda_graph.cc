#include "eagle3/cuda/cuda_graph.h"

#include <string>

#include "cuda_status.h"
#include "eagle3/status.h"

namespace eagle3::cuda {

absl::StatusOr<std::unique_ptr<CudaGraph>> CudaGraph::Capture(cudaStream_t stream,
                                                              const std::function<absl::Status()>& enqueue) {
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                                    "CudaGraph: cudaStreamBeginCapture"));
  const absl::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (!enqueued.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // an invalidated capture leaves its error behind
    return absl::Status(enqueued.code(), "CudaGraph: the captured work failed: " + std::string(enqueued.message()));
  }
  if (ended != cudaSuccess || graph == nullptr) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    return absl::FailedPreconditionError(
        std::string("CudaGraph: the capture was invalidated (") + cudaGetErrorName(ended) + ": " +
        cudaGetErrorString(ended) +
        "): the captured work made a call a graph cannot record (a host synchronization, a copy from "
        "pageable host memory, a first-time allocation); run one eager step first and use capturable "
        "collectives");
  }
  size_t nodes = 0;
  cudaGraphGetNodes(graph, nullptr, &nodes);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  if (instantiated != cudaSuccess) {
    cudaGraphDestroy(graph);
    return CudaStatus(instantiated, "CudaGraph: cudaGraphInstantiate");
  }
  return std::unique_ptr<CudaGraph>(new CudaGraph(graph, exec, nodes));
}

CudaGraph::~CudaGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
}

absl::Status CudaGraph::Launch(cudaStream_t stream) {
  return CudaStatus(cudaGraphLaunch(exec_, stream), "CudaGraph: cudaGraphLaunch");
}

}  // namespace eagle3::cuda
