// The ranks of the tensor-parallel benchmarks (tp_step_benchmark, tp_e2e_benchmark): one per GPU
// of this host, GPUs 0 .. N-1, each with a CUDA backend and an NcclCommunicator on that backend's
// stream, and a way to run every rank's part at once (one host thread a rank, as an engine runs
// them).
#pragma once

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench_util.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/nccl_communicator.h"
#include "eagle3/status.h"

namespace eagle3::bench {

// The ranks: EAGLE3_BENCH_TP (2, 4 or 8), else the visible GPUs rounded down to 8, 4 or 2; 0 with
// fewer than 2 GPUs or an EAGLE3_BENCH_TP the host cannot give.
inline int BenchTpSize() {
  const int gpus = DeviceCount();
  const char* s = std::getenv("EAGLE3_BENCH_TP");
  int tp = s != nullptr && s[0] != '\0' ? std::atoi(s) : gpus >= 8 ? 8 : gpus >= 4 ? 4 : gpus >= 2 ? 2 : 0;
  if (tp != 2 && tp != 4 && tp != 8) tp = 0;
  return tp <= gpus ? tp : 0;
}

// Runs fn(r) for every rank r < tp at once, one host thread each with GPU r current (a rank waits
// in its collectives for the others); the first error, naming its rank.
inline absl::Status ForEachRank(int tp, const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> status(static_cast<size_t>(tp));
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      const cudaError_t e = cudaSetDevice(r);
      status[r] = e != cudaSuccess ? absl::InternalError(std::string("cudaSetDevice: ") + cudaGetErrorString(e))
                                   : fn(r);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < tp; ++r) {
    if (!status[r].ok()) {
      return absl::Status(status[r].code(), "rank " + std::to_string(r) + ": " + std::string(status[r].message()));
    }
  }
  return absl::OkStatus();
}

// tp ranks on GPUs 0 .. tp-1: rank 0 on the binary's shared backend (Backend(): one backend's
// workspaces on GPU 0, not two), the others on backends of the same options; communicators from
// NcclCommunicator::CreateAllLocal on the backends' streams.
struct TpRanks {
  int tp = 0;
  std::vector<cuda::CudaBackend*> backends;
  std::vector<std::unique_ptr<cuda::CudaBackend>> owned;
  std::vector<std::unique_ptr<cuda::NcclCommunicator>> comms;

  static absl::StatusOr<std::unique_ptr<TpRanks>> Create(int tp) {
    auto ranks = std::make_unique<TpRanks>();
    ranks->tp = tp;
    std::vector<int> devices;
    std::vector<cudaStream_t> streams;
    for (int r = 0; r < tp; ++r) {
      if (r == 0) {
        ranks->backends.push_back(Backend());
      } else {
        cuda::CudaBackendOptions options = Backend()->options();  // the sizes every benchmark uses
        options.device = r;
        options.stream = nullptr;
        EAGLE3_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaBackend> b, cuda::CudaBackend::Create(options));
        ranks->backends.push_back(b.get());
        ranks->owned.push_back(std::move(b));
      }
      devices.push_back(r);
      streams.push_back(ranks->backends.back()->stream());
    }
    EAGLE3_ASSIGN_OR_RETURN(ranks->comms, cuda::NcclCommunicator::CreateAllLocal(devices, streams));
    return ranks;
  }
};

}  // namespace eagle3::bench
