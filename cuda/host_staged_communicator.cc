#include "eagle3/cuda/host_staged_communicator.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "cuda_status.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

absl::Status CheckDeviceBuffer(const TensorView& t, int device, const char* op, const char* name) {
  if (!t.device().is_cuda() || t.device().index != device || !t.is_contiguous()) {
    return absl::InvalidArgumentError(std::string("HostStagedCommunicator::") + op + ": " + name +
                                      " must be contiguous on cuda:" + std::to_string(device) + ", got " +
                                      t.ToString());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostStagedCommunicator>> HostStagedCommunicator::Create(Communicator* host, int device,
                                                                                      cudaStream_t stream,
                                                                                      size_t max_bytes) {
  if (host == nullptr || !host->device().is_cpu()) {
    return absl::InvalidArgumentError("HostStagedCommunicator needs a host-memory communicator");
  }
  void* staging = nullptr;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&staging, 2 * max_bytes), "cudaMallocHost for collective staging"));
  return std::unique_ptr<HostStagedCommunicator>(
      new HostStagedCommunicator(host, device, stream, max_bytes, static_cast<char*>(staging)));
}

HostStagedCommunicator::HostStagedCommunicator(Communicator* host, int device, cudaStream_t stream, size_t max_bytes,
                                               char* staging)
    : host_(host), device_(device), stream_(stream), max_bytes_(max_bytes), staging_(staging) {}

HostStagedCommunicator::~HostStagedCommunicator() { cudaFreeHost(staging_); }

template <typename Collective>
absl::Status HostStagedCommunicator::Staged(const TensorView& send, const TensorView& recv, const char* op,
                                            Collective&& collective) {
  EAGLE3_RETURN_IF_ERROR(CheckDeviceBuffer(send, device_, op, "send"));
  EAGLE3_RETURN_IF_ERROR(CheckDeviceBuffer(recv, device_, op, "recv"));
  if (send.nbytes() > max_bytes_ || recv.nbytes() > max_bytes_) {
    return absl::OutOfRangeError(std::string("HostStagedCommunicator::") + op + ": " +
                                 std::to_string(std::max(send.nbytes(), recv.nbytes())) +
                                 " bytes exceed the staging capacity " + std::to_string(max_bytes_));
  }
  const TensorView host_send(staging_, send.dtype(), send.shape());
  const TensorView host_recv(staging_ + max_bytes_, recv.dtype(), recv.shape());
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(staging_, send.data(), send.nbytes(), cudaMemcpyDeviceToHost, stream_),
                                    "collective staging copy to the host"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "collective staging"));
  EAGLE3_RETURN_IF_ERROR(collective(host_send, host_recv));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(recv.data(), staging_ + max_bytes_, recv.nbytes(), cudaMemcpyHostToDevice, stream_),
      "collective staging copy to the device"));
  // The staging buffer is reused by the next collective: the copy must have left it.
  return CudaStatus(cudaStreamSynchronize(stream_), "collective staging");
}

absl::Status HostStagedCommunicator::AllReduceSum(const TensorView& send, const TensorView& recv) {
  return Staged(send, recv, "AllReduceSum",
                [&](const TensorView& s, const TensorView& r) { return host_->AllReduceSum(s, r); });
}

absl::Status HostStagedCommunicator::AllGather(const TensorView& send, const TensorView& recv) {
  return Staged(send, recv, "AllGather", [&](const TensorView& s, const TensorView& r) { return host_->AllGather(s, r); });
}

absl::Status HostStagedCommunicator::ReduceScatterSum(const TensorView& send, const TensorView& recv) {
  return Staged(send, recv, "ReduceScatterSum",
                [&](const TensorView& s, const TensorView& r) { return host_->ReduceScatterSum(s, r); });
}

absl::Status HostStagedCommunicator::Broadcast(const TensorView& buffer, int root) {
  return Staged(buffer, buffer, "Broadcast", [&](const TensorView& s, const TensorView& r) {
    // In place on the host copy (send and recv stage separately: copy across first).
    std::memcpy(r.data(), s.data(), s.nbytes());
    return host_->Broadcast(r, root);
  });
}

}  // namespace eagle3::cuda
