// HostStagedCommunicator: a Communicator for device buffers built on a host-memory communicator
// (e.g. an InProcessGroup rank): each collective copies the device buffer to pinned host memory,
// runs the host collective, and copies the result back. It lets several TP ranks share one GPU in
// one process — how TP = 8 sharding is tested on a single H200 — and needs no NCCL. It synchronizes
// the stream around every collective: for tests and tools, not for serving (use NcclCommunicator).
#pragma once

#include <cstddef>
#include <memory>

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "eagle3/communicator.h"
#include "eagle3/export.h"

namespace eagle3::cuda {

class EAGLE3_API HostStagedCommunicator final : public Communicator {
 public:
  // `host` must outlive this object and live in host memory; `max_bytes` bounds the receive buffer
  // of any collective (pinned staging of 2 x max_bytes is allocated here, once).
  static absl::StatusOr<std::unique_ptr<HostStagedCommunicator>> Create(Communicator* host, int device,
                                                                        cudaStream_t stream, size_t max_bytes);
  ~HostStagedCommunicator() override;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  Device device() const override { return Device::Cuda(device_); }

  absl::Status AllReduceSum(const TensorView& send, const TensorView& recv) override;
  absl::Status AllGather(const TensorView& send, const TensorView& recv) override;
  absl::Status ReduceScatterSum(const TensorView& send, const TensorView& recv) override;
  absl::Status Broadcast(const TensorView& buffer, int root) override;

 private:
  HostStagedCommunicator(Communicator* host, int device, cudaStream_t stream, size_t max_bytes, char* staging);
  // Stages `send` (device) into host memory, runs `collective` on the host views, copies the host
  // result into `recv` (device).
  template <typename Collective>
  absl::Status Staged(const TensorView& send, const TensorView& recv, const char* op, Collective&& collective);

  Communicator* host_;
  int device_;
  cudaStream_t stream_;
  size_t max_bytes_;
  char* staging_;  // pinned: [0, max_bytes) send, [max_bytes, 2 max_bytes) recv
};

}  // namespace eagle3::cuda
