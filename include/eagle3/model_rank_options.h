// ModelRankOptions: what every model rank (TargetModel, DraftModel) is given besides its checkpoint:
// its place in the tensor-parallel group, the capacities its fixed buffers are sized for, and the
// storage of its weights. Each model's options add their own fields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "eagle3/communicator.h"
#include "eagle3/dtype.h"
#include "eagle3/export.h"

namespace eagle3 {

struct EAGLE3_API ModelRankOptions {
  int tp_size = 1;
  int rank = 0;
  int64_t max_tokens_per_forward = 256;  // new rows over all sequences of one step
  int64_t max_context_len = 4096;        // cached + new rows of one sequence
  int64_t num_kv_pages = 256;            // pages in this rank's KV cache (per layer)
  int64_t page_size = 64;                // rows per page (1 allowed)
  // Storage of the model's Gemm weights and embedding (each model's header lists them): kF32 or
  // kBF16; unset = backend->preferred_weight_dtype(). Norm weights stay f32. Shards are read straight
  // into this dtype; a backend that cannot run it is refused at Create (ResolveWeightDtype).
  std::optional<DType> weight_dtype;
  // A quantized checkpoint's Linear weights (FP8 block-scaled, INT4 group): kept in their stored
  // form in the backend's memory and multiplied by Backend::QuantizedGemm (true), or dequantized at
  // load into weight_dtype (false). Unset: kept when the backend streams the format
  // (Backend::keeps_quantized: CudaBackend does, the CPU reference does not). kv_b, the embedding,
  // the lm_head, norms and the router are never quantized in memory.
  std::optional<bool> keep_quantized;
  // Threads each large checkpoint read of the load is split across (CheckpointReadOptions::threads):
  // 0 = DefaultCheckpointReadThreads() (min(8, hardware threads)), 1 = one thread, at most
  // kMaxCheckpointReadThreads. Per rank: ranks loading at once in one process each use this many.
  int read_threads = 0;

  // Upper bound of every capacity above: far beyond any real workload, low enough that sums and
  // round-ups of capacities never overflow int64 (buffer sizes are checked separately, at Create,
  // against the memory this process can use: ResourceExhausted naming the options).
  static constexpr int64_t kMaxCapacity = int64_t{1} << 40;

  // InvalidArgument naming `who` unless 0 <= rank < tp_size, `communicator` has that size and rank
  // when tp_size > 1 (it may be null at tp 1), every capacity is in [1, kMaxCapacity] and
  // read_threads in [0, kMaxCheckpointReadThreads].
  absl::Status Check(const std::string& who, const Communicator* communicator) const;
};

}  // namespace eagle3
