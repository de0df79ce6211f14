// Shared by the example programs: the backend and communicator one TP rank runs with, for
// --device cpu (CpuBackend, the in-process group as is) or --device cuda (CudaBackend on GPU
// rank % device count), and how target steps are launched. With --device cuda and tp > 1 the
// collectives (`--comm`) run over NCCL when every rank has its own GPU ("auto" or "nccl": rank 0's
// unique id reaches the others through the in-process group, and the communicator enqueues on the
// backend's stream, so graphs capture the collectives too), or are staged through the in-process
// group ("staged", or "auto" when ranks share a GPU: not capturable, so target steps run eagerly).
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
#ifdef EAGLE3_HAVE_NCCL
#include "eagle3/cuda/nccl_communicator.h"
#endif
#endif

namespace eagle3::examples {

struct RankContext {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> staged;  // device collectives, when needed
  Communicator* comm = nullptr;          // what the models use
  std::string comm_name = "none";        // "in-process", "nccl" or "host-staged" (tp > 1)
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

// `comm_mode`: "auto", "nccl" or "staged" (see the top of the file; ignored for --device cpu and tp 1).
inline absl::StatusOr<RankContext> MakeRankContext(std::string_view device, int rank, Communicator* host_comm,
                                                   bool graphs = false, std::string_view comm_mode = "auto") {
  RankContext ctx;
  if (comm_mode != "auto" && comm_mode != "nccl" && comm_mode != "staged") {
    return absl::InvalidArgumentError("--comm must be auto, nccl or staged, got " + std::string(comm_mode));
  }
  if (device == "cpu") {
    ctx.backend = std::make_unique<cpu::CpuBackend>();
    ctx.comm = host_comm;
    if (host_comm != nullptr) ctx.comm_name = "in-process";
    return ctx;
  }
#ifdef EAGLE3_WITH_CUDA
  if (device == "cuda") {
    const int count = cuda::CudaDeviceCount();
    if (count == 0) return absl::FailedPreconditionError("--device cuda: no CUDA device is visible");
    cuda::CudaBackendOptions options;
    options.device = rank % count;
    EAGLE3_ASSIGN_OR_RETURN(auto backend, cuda::CudaBackend::Create(options));
    bool capturable = host_comm == nullptr;
    if (host_comm != nullptr) {
      const int tp = host_comm->size();
      bool nccl = false;
#ifdef EAGLE3_HAVE_NCCL
      nccl = comm_mode == "nccl" || (comm_mode == "auto" && tp <= count);
#endif
      if (comm_mode == "nccl" && !nccl) {
        return absl::FailedPreconditionError("--comm nccl: this build has no NCCL");
      }
      if (nccl && tp > count) {
        return absl::FailedPreconditionError("--comm nccl needs one GPU per rank: tp " + std::to_string(tp) + ", " +
                                             std::to_string(count) + " visible GPUs (--comm staged shares them)");
      }
#ifdef EAGLE3_HAVE_NCCL
      if (nccl) {
        cuda::NcclUniqueId id{};
        if (rank == 0) {
          EAGLE3_ASSIGN_OR_RETURN(id, cuda::NcclCommunicator::NewUniqueId());
        }
        EAGLE3_RETURN_IF_ERROR(
            host_comm->Broadcast(TensorView(id.bytes, DType::kU8, Shape{static_cast<int64_t>(sizeof id.bytes)}), 0));
        EAGLE3_ASSIGN_OR_RETURN(ctx.staged, cuda::NcclCommunicator::CreateFromUniqueId(id, tp, rank, options.device,
                                                                                       backend->stream()));
        ctx.comm_name = "nccl";
        capturable = true;
      }
#endif
      if (!nccl) {
        EAGLE3_ASSIGN_OR_RETURN(ctx.staged, cuda::HostStagedCommunicator::Create(host_comm, options.device,
                                                                                  backend->stream(), 256 << 20));
        ctx.comm_name = "host-staged";
      }
      ctx.comm = ctx.staged.get();
    }
    if (graphs && capturable) ctx.launcher = std::make_unique<cuda::GraphStepLauncher>(backend->stream());
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
