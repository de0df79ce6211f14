// Shared by the example programs: the backend and communicator one TP rank runs with, for
// --device cpu (CpuBackend, the in-process group as is) or --device cuda (CudaBackend on GPU
// rank % device count, collectives staged through the in-process group), and how target steps are
// launched (CUDA graphs on one GPU rank when asked for: the host-staged collectives of tp > 1 are
// not capturable).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/communicator.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/status.h"
#include "eagle3/step_launcher.h"
#ifdef EAGLE3_WITH_CUDA
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/graph_step_launcher.h"
#include "eagle3/cuda/host_staged_communicator.h"
#endif

namespace eagle3::examples {

struct RankContext {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> staged;  // device collectives, when needed
  Communicator* comm = nullptr;          // what the models use
  std::unique_ptr<StepLauncher> launcher;  // null: eager target steps
  // "graphs: R replays, C captures, E eager steps" when a graph launcher ran, else empty.
  std::string LauncherSummary() const {
#ifdef EAGLE3_WITH_CUDA
    if (const auto* g = dynamic_cast<const cuda::GraphStepLauncher*>(launcher.get())) {
      const auto& c = g->counts();
      return "CUDA graphs: " + std::to_string(c.replays) + " replays, " + std::to_string(c.captures) + " captures, " +
             std::to_string(c.eager) + " eager steps, " + std::to_string(c.failed_captures) + " failed captures";
    }
#endif
    return "";
  }
};

inline absl::StatusOr<RankContext> MakeRankContext(std::string_view device, int rank, Communicator* host_comm,
                                                   bool graphs = false) {
  RankContext ctx;
  if (device == "cpu") {
    ctx.backend = std::make_unique<cpu::CpuBackend>();
    ctx.comm = host_comm;
    return ctx;
  }
#ifdef EAGLE3_WITH_CUDA
  if (device == "cuda") {
    const int count = cuda::CudaDeviceCount();
    if (count == 0) return absl::FailedPreconditionError("--device cuda: no CUDA device is visible");
    cuda::CudaBackendOptions options;
    options.device = rank % count;
    EAGLE3_ASSIGN_OR_RETURN(auto backend, cuda::CudaBackend::Create(options));
    if (host_comm != nullptr) {
      EAGLE3_ASSIGN_OR_RETURN(ctx.staged, cuda::HostStagedCommunicator::Create(host_comm, options.device,
                                                                                backend->stream(), 256 << 20));
      ctx.comm = ctx.staged.get();
    }
    if (graphs && host_comm == nullptr) ctx.launcher = std::make_unique<cuda::GraphStepLauncher>(backend->stream());
    ctx.backend = std::move(backend);
    return ctx;
  }
#endif
  return absl::InvalidArgumentError("--device must be cpu" +
#ifdef EAGLE3_WITH_CUDA
                                    std::string(" or cuda") +
#else
                                    std::string(" (this build has no CUDA backend)") +
#endif
                                    ", got " + std::string(device));
}

}  // namespace eagle3::examples
