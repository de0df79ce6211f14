// The fp32 CPU reference backend: the semantics every other backend is checked against in CI.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "eagle3/allocator.h"
#include "eagle3/backend.h"

namespace eagle3::cpu {

struct CpuBackendOptions {
  // Threads for Gemm (the caller's thread plus num_threads - 1 workers owned by the backend);
  // values below 1 mean 1. Keep 1 when each TP rank already runs on its own thread.
  int num_threads = 1;
  // Where allocator() hands out memory; nullptr means DefaultHostAllocator(). Must outlive the
  // backend and allocate host memory.
  Allocator* allocator = nullptr;
};

// Every op of Backend on host memory (Device::Cpu()), computing in fp32. Floating-point tensors
// must be f32 (convert other dtypes with ConvertTensor first); Copy moves any dtype. Synchronous:
// Synchronize() has nothing to wait for.
class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options = CpuBackendOptions());
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  int num_threads() const;

  Device device() const override { return Device::Cpu(); }
  Allocator& allocator() override { return *allocator_; }

  absl::Status Copy(const TensorView& src, const TensorView& dst) override;
  absl::Status Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                    const GemmOptions& options) override;
  absl::Status RmsNorm(const TensorView& x, const TensorView& weight, float eps,
                       const TensorView& out) override;
  absl::Status AddRmsNorm(const TensorView& x, const TensorView& residual, const TensorView& weight,
                          float eps, const TensorView& out) override;
  absl::Status SiluMul(const TensorView& gate_up, const TensorView& out) override;
  absl::Status EmbeddingLookup(const TensorView& ids, const TensorView& table, int64_t vocab_start,
                               const TensorView& out) override;
  absl::Status Softmax(const TensorView& logits, float temperature, const TensorView& out) override;
  absl::Status Argmax(const TensorView& logits, const TensorView& out) override;
  absl::Status TopK(const TensorView& values, int k, const TensorView& out_values,
                    const TensorView& out_indices) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  class WorkerPool;

  Allocator* allocator_;
  std::unique_ptr<WorkerPool> pool_;  // null when single-threaded
};

}  // namespace eagle3::cpu
