// Private: what the CudaBackend op implementation files share (host code only; no .cu includes it).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core_ops.h"
#include "eagle3/chunk_arena.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/pinned_host_allocator.h"
#include "fp8_w8a8_gemm.h"
#include "staged_upload.h"

namespace eagle3::cuda {

// Device-side data checks and the error flag (State::error_flag).
//
// A kernel that finds bad data records code = (check << kDeviceErrorIndexBits) | index in the flag,
// index = the row / token / entry named below (saturating at kDeviceErrorMaxIndex = 2^24 - 1), with
// RecordDeviceError (cuda/core_kernels.cuh): the first failing op keeps the flag, and within it the
// lowest index. Launchers take `int* error_flag, int error_code` with error_code =
// DeviceErrorCode(check). Synchronize() waits for the stream, reads and clears the flag, and turns
// a nonzero code into InvalidArgument naming the op and the index (messages in cuda_backend.cc).
// The numbers are part of the flag's format: add new checks at the end.
enum class DeviceCheck : int {
  kNone = 0,
  kEmbeddingNegativeId = 1,     // EmbeddingLookup: token t with ids[t] < 0
  kSoftmaxBadRow = 2,           // Softmax: row r holds NaN or +inf, or no finite logit
  kArgmaxNaN = 3,               // Argmax: row r holds NaN
  kTopKNaN = 4,                 // TopK: row r holds NaN
  kRopePosition = 5,            // ApplyRope: token t with positions[t] outside [0, P)
  kAttentionMaskRow = 6,        // Attention: query row t allows no key
  kLatentAttentionPage = 7,     // LatentAttention: page_table[i] outside [0, num_pages)
  kLatentAttentionMaskRow = 8,  // LatentAttention: query row t allows no key
  kPagedWritePosition = 9,      // PagedWrite: token t, position or its page entry out of range
  kPagedReadPosition = 10,      // PagedRead: token t, position or its page entry out of range
  kMoeRouteLogits = 11,         // MoeRoute: row t holds a non-finite logit
  kMoeRouteBias = 12,           // MoeRoute: correction_bias[e] is not finite
  kMoeExpertsId = 13,           // MoeExperts: token t has an id outside [0, experts)
  kBatchedLatentAttention = 14,  // BatchedLatentAttention: 8 * sequence + condition (attention_ops.h)
  // 15 is not assigned.
  kCompactAccepted = 16,         // CompactAccepted: CompactErrorIndex (compact_accepted_check.h)
  kBatchedPagedAttention = 17,   // BatchedPagedAttention: 8 * sequence-or-row + condition (paged_attention_ops.h)
  kGatherRowsIndex = 18,         // GatherRows: index[i] outside [0, R)
  kExtendMaskRowsIndex = 19,     // ExtendMaskRows: 2 * i + (0: parent[i], 1: column[i]) out of range
  kQuantizedMoeExpertsId = 20,   // QuantizedMoeExperts: token t has an id outside [0, experts)
};

constexpr int DeviceErrorCode(DeviceCheck check) {
  return static_cast<int>(check) << kDeviceErrorIndexBits;
}

struct CudaBackend::State {
  CudaBackendOptions options;
  cudaStream_t stream = nullptr;
  bool owns_stream = false;
  cublasLtHandle_t lt = nullptr;
  void* gemm_workspace = nullptr;
  // Device flag an op sets when it meets bad data (NaN logits, out-of-range ids); read and cleared
  // by Synchronize(), which turns it into a Status naming the op.
  int* error_flag = nullptr;
  DeviceAllocator allocator{0};
  // Backend::weight_allocator(): chunks from `allocator`, declared after it so that it is destroyed
  // first. Every weight tensor has been freed by then (models must not outlive the backend), and
  // with it every chunk. Null when options.weight_arena_chunk_bytes is 0.
  std::unique_ptr<ChunkArena> weight_arena;
  PinnedHostAllocator pinned;  // Backend::staging_allocator()
  // Copy's path for large transfers from pageable host memory (weights at load); its buffers come
  // from `pinned`, declared before it so that they are freed first.
  StagedUpload upload{pinned};
  // Scratch buffers owned by the op files, created on first use within the options' bounds
  // (allocation happens once; later calls reuse them).
  void* attention_scratch = nullptr;
  size_t attention_scratch_bytes = 0;
  // Shared checks (Backend::BeginSharedChecks; cuda_backend_attention.cc): the open scopes, and
  // per op and set of index tensors already checked in the outermost one, the flag slot holding
  // its verdict.
  int shared_checks_depth = 0;
  std::vector<std::pair<std::vector<int64_t>, int>> shared_checks;
  std::vector<int64_t> shared_check_key;  // the key being looked up, reused from call to call
  void* moe_scratch = nullptr;
  size_t moe_scratch_bytes = 0;
  // BatchedPagedAttention's partial results (cuda_backend_paged_attention.cc).
  void* paged_partials = nullptr;
  size_t paged_partials_bytes = 0;
  int multiprocessors = 0;  // of options.device, read on first use
  int64_t l2_bytes = 0;     // of options.device, read at creation (PrefetchWeights' bound)
  // Gemm's bf16 copies of f32 activations (gemm.cc): every buffer allocated, the current (largest)
  // last. None is freed before the backend is destroyed: a captured graph may still read it.
  std::vector<std::pair<void*, size_t>> activation_scratch;
  // (The destructor frees the workspace, the flag and the scratch above through `allocator`, which
  // must be what allocated them.)
  // cuBLASLt algorithms chosen by the heuristic, per problem key (gemm.cc): one query per shape.
  std::map<std::array<int64_t, 15>, cublasLtMatmulAlgo_t> gemm_algos;
  // Device copies of MoeExperts' expert pointer tables, cached by content (a MoeTableCache, see
  // cuda_backend_moe.cc; it frees its tables through `allocator` when destroyed).
  std::shared_ptr<void> moe_tables;
  // MoeExperts' grouped-path workspaces (a MoeGroupedScratch, see cuda_backend_moe.cc): every one
  // allocated, the current (largest) last; none is freed before the backend is destroyed, since a
  // captured graph may still use it.
  std::shared_ptr<void> moe_grouped_scratch;
  // QuantizedGemm's bf16 copies of dequantized weights (a DequantScratch, see
  // cuda_backend_quantized.cc): every buffer allocated, the current (largest) last, none freed
  // before the backend is destroyed.
  std::shared_ptr<void> dequant_scratch;
  // QuantizedGemm's W8A8 products (CudaBackendOptions::fp8_w8a8_min_rows): cuBLASLt's algorithm per
  // problem. Their e4m3 activations and scales live in dequant_scratch.
  Fp8W8A8Gemm fp8_w8a8;
  // QuantizedMoeExperts' expert view tables (cached by content) and its workspaces (every one
  // allocated, the current last, none freed before the backend is destroyed): a QuantMoeState, see
  // cuda_backend_quantized_moe.cc.
  std::shared_ptr<void> quant_moe;
  // TreeVerify's tree lists and verify workspace (a VerifyScratch, see cuda_backend_verify.cc):
  // every buffer allocated, the current (largest) last, none freed before the backend is destroyed.
  std::shared_ptr<void> verify_scratch;
};

// Every op (and Create, Synchronize, the destructor) first makes the backend's device current on
// the calling thread: a kernel launch fails on a stream of another device, and a rank thread need
// not have called cudaSetDevice itself. The device stays current afterwards.
inline cudaError_t UseBackendDevice(const CudaBackend::State& state) {
  return cudaSetDevice(state.options.device);
}

}  // namespace eagle3::cuda
