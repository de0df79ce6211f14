// CudaBackend: DeepSeek MoE routing and routed experts (kernels in moe_route_kernels.cu,
// moe_experts_kernels.cu and moe_grouped_kernels.cu). Everything f32, except that the routed
// experts' weights may all be bf16 instead (x, weights, out stay f32).
//
// Data-dependent errors. The CPU reference checks logits, biases and expert ids before it writes
// anything. Here they live on the device: the kernels check them as they go, leave the offending
// token's output row unwritten (other rows are written), and record the first bad row / token / bias
// entry in the error flag; the next Synchronize() reports it as InvalidArgument naming the op and
// the index (DeviceCheck in cuda_backend_state.h). The op itself returns OK.
//
// Device memory, all allocated on first use and reused afterwards (never per call in steady state):
//  - act scratch (State::moe_scratch): [max_rows, top_k, I] f32, sized from
//    CudaBackendOptions::max_rows and the first call's top_k and I (32 MiB for max_rows 4096,
//    top_k 8, I 256: V3 at TP8; 256 MiB at TP1). A later call with a larger top_k * I regrows it
//    (after waiting for the stream); a call with more than max_rows tokens is refused.
//  - expert pointer tables (State::moe_tables): the experts span is host memory, so its device
//    pointers and row strides are copied to a device table of max_experts entries (16 KiB at 512).
//    Tables are cached by content, one per distinct expert set (each MoE layer of a model keeps
//    its own), up to kMaxExpertTables; a call whose set is cached, or is the leading entries of a
//    cached set, uploads nothing. A new set costs one small host -> device copy (into a new table,
//    or over the least recently used one once the cache is full; the copy is stream-ordered after
//    the kernels that read the old contents).
//  - grouped-path workspace (State::moe_grouped_scratch; calls with many tokens, see
//    MoeExpertsUseGrouped in moe_ops.h): the expert-sorted pair list, the tile list and the
//    per-pair outputs y [pairs, H] f32 of one chunk of tokens. A chunk holds min(max_rows, what fits
//    kGroupedPartialBytes = 256 MiB of y) tokens: 1170 tokens at V3 TP8 (top-8, H 7168), 2184 at
//    V2 TP8 (top-6, H 5120); longer calls run in several rounds. Sized at the first grouped call
//    from its top_k and H; a later call with a larger top_k * H allocates a larger one, keeping
//    the old (a captured graph may still use it).
// None of these first uses may happen while the stream is being captured into a CUDA graph: run
// the step once before capturing (FailedPrecondition otherwise).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "eagle3/cuda/cuda_backend.h"
#include "moe_ops.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

// Device copies of expert pointer tables, keyed by their content.
struct MoeTableCache {
  struct Table {
    std::vector<MoeExpertPointers> host;  // what `device` holds
    MoeExpertPointers* device = nullptr;  // capacity: CudaBackendOptions::max_experts entries
    uint64_t last_use = 0;
  };

  explicit MoeTableCache(DeviceAllocator* allocator) : allocator(allocator) {}
  ~MoeTableCache() {
    for (Table& table : tables) allocator->Deallocate(table.device, 0);
  }
  MoeTableCache(const MoeTableCache&) = delete;
  MoeTableCache& operator=(const MoeTableCache&) = delete;

  DeviceAllocator* allocator;  // State::allocator, which outlives the cache
  std::vector<Table> tables;
  std::vector<MoeExpertPointers> wanted;  // the current call's table, reused across calls
  uint64_t clock = 0;
};

// Distinct expert sets kept on the device (a model's MoE layers, across models on this backend).
constexpr size_t kMaxExpertTables = 256;

// Whether `cached` serves a call naming `wanted`: the same entries, or more after them (the kernels
// never read past the call's expert count, so a layer's routed experts alone use the table of the
// routed and joined shared experts it also runs, without an upload, e.g. under a graph capture).
bool TableServes(const std::vector<MoeExpertPointers>& cached, const std::vector<MoeExpertPointers>& wanted) {
  if (cached.size() < wanted.size()) return false;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const MoeExpertPointers& a = cached[i];
    const MoeExpertPointers& b = wanted[i];
    if (a.gate_up != b.gate_up || a.down != b.down || a.gate_up_stride != b.gate_up_stride ||
        a.down_stride != b.down_stride || a.bf16_activations != b.bf16_activations) {
      return false;
    }
  }
  return true;
}

// Device memory may be allocated, freed or uploaded from pageable memory only outside a capture.
absl::Status CheckNotCapturing(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EAGLE3_RETURN_IF_ERROR(
      CudaStatus(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing"));
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError(
        absl::StrCat("MoeExperts: ", what,
                     " while the stream is being captured into a CUDA graph; run the step once "
                     "before capturing"));
  }
  return absl::OkStatus();
}

// The device table of `experts` (validated by CheckMoeExperts), uploading it unless cached.
absl::StatusOr<const MoeExpertPointers*> ExpertTable(CudaBackend::State& state,
                                                     std::span<const ExpertWeights> experts) {
  if (!state.moe_tables) state.moe_tables = std::make_shared<MoeTableCache>(&state.allocator);
  auto& cache = *static_cast<MoeTableCache*>(state.moe_tables.get());
  cache.wanted.resize(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const TensorView& gate_up = experts[e].gate_up;
    const TensorView& down = experts[e].down;
    cache.wanted[e] = {gate_up.data(), down.data(), gate_up.stride(0), down.stride(0),
                       experts[e].bf16_activations ? 1 : 0};
  }
  ++cache.clock;
  MoeTableCache::Table* lru = nullptr;
  for (MoeTableCache::Table& table : cache.tables) {
    if (TableServes(table.host, cache.wanted)) {
      table.last_use = cache.clock;
      return table.device;
    }
    if (lru == nullptr || table.last_use < lru->last_use) lru = &table;
  }
  EAGLE3_RETURN_IF_ERROR(CheckNotCapturing(state.stream, "a new expert set"));
  MoeTableCache::Table* table = lru;
  if (cache.tables.size() < kMaxExpertTables) {
    const size_t bytes = static_cast<size_t>(state.options.max_experts) * sizeof(MoeExpertPointers);
    EAGLE3_ASSIGN_OR_RETURN(void* device,
                            state.allocator.Allocate(bytes, alignof(MoeExpertPointers)));
    table = &cache.tables.emplace_back();
    table->device = static_cast<MoeExpertPointers*>(device);
  }
  // Stream-ordered after every kernel that read the old contents; the pageable source is staged
  // before cudaMemcpyAsync returns, so `host` may change afterwards.
  table->host = cache.wanted;
  table->last_use = cache.clock;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(table->device, table->host.data(),
                                                    table->host.size() * sizeof(MoeExpertPointers),
                                                    cudaMemcpyHostToDevice, state.stream),
                                    "MoeExperts: uploading the expert pointer table"));
  return table->device;
}

// The act scratch for `floats` values of a call with this top_k and I.
absl::StatusOr<float*> ActScratch(CudaBackend::State& state, int64_t floats, int64_t top_k,
                                  int64_t inter) {
  const size_t needed = static_cast<size_t>(floats) * sizeof(float);
  if (needed <= state.moe_scratch_bytes) return static_cast<float*>(state.moe_scratch);
  EAGLE3_RETURN_IF_ERROR(CheckNotCapturing(state.stream, "growing the act scratch"));
  const size_t bytes = static_cast<size_t>(state.options.max_rows * top_k * inter) * sizeof(float);
  if (state.moe_scratch != nullptr) {  // kernels already queued may still read it
    EAGLE3_RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(state.stream), "cudaStreamSynchronize"));
    state.allocator.Deallocate(state.moe_scratch, state.moe_scratch_bytes);
    state.moe_scratch = nullptr;
    state.moe_scratch_bytes = 0;
  }
  EAGLE3_ASSIGN_OR_RETURN(state.moe_scratch, state.allocator.Allocate(bytes, 256));
  state.moe_scratch_bytes = bytes;
  return static_cast<float*>(state.moe_scratch);
}

// Bytes of per-pair outputs a grouped round may hold (see the file comment).
constexpr int64_t kGroupedPartialBytes = int64_t{256} << 20;

// Every grouped-path workspace allocated (the current one last), freed with the backend.
struct MoeGroupedScratch {
  explicit MoeGroupedScratch(DeviceAllocator* allocator) : allocator(allocator) {}
  ~MoeGroupedScratch() {
    for (const auto& [buffer, bytes] : buffers) allocator->Deallocate(buffer, bytes);
  }
  MoeGroupedScratch(const MoeGroupedScratch&) = delete;
  MoeGroupedScratch& operator=(const MoeGroupedScratch&) = delete;

  DeviceAllocator* allocator;  // State::allocator, which outlives this
  std::vector<std::pair<void*, size_t>> buffers;
  MoeGroupedWorkspace current;
};

// The grouped-path workspace for calls with this top_k and H: chunks of min(max_rows, what fits
// kGroupedPartialBytes) tokens.
absl::StatusOr<MoeGroupedWorkspace> GroupedWorkspace(CudaBackend::State& state, int64_t top_k,
                                                     int64_t hidden) {
  if (!state.moe_grouped_scratch) {
    state.moe_grouped_scratch = std::make_shared<MoeGroupedScratch>(&state.allocator);
  }
  auto& scratch = *static_cast<MoeGroupedScratch*>(state.moe_grouped_scratch.get());
  const int64_t fit = std::max<int64_t>(1, kGroupedPartialBytes / (top_k * hidden * 4));
  const int64_t pairs = std::min(state.options.max_rows, fit) * top_k;
  const MoeGroupedWorkspace& have = scratch.current;
  if (have.max_pairs >= pairs && have.hidden >= hidden &&
      have.max_experts >= state.options.max_experts) {
    return have;
  }
  EAGLE3_RETURN_IF_ERROR(CheckNotCapturing(state.stream, "growing the grouped-path workspace"));
  const int64_t max_pairs = std::max(have.max_pairs, pairs);
  const int64_t max_hidden = std::max(have.hidden, hidden);
  const size_t bytes =
      MoeGroupedWorkspaceBytes(max_pairs, state.options.max_experts, max_hidden);
  EAGLE3_ASSIGN_OR_RETURN(void* buffer, state.allocator.Allocate(bytes, 256));
  scratch.buffers.emplace_back(buffer, bytes);
  scratch.current =
      MoeGroupedWorkspaceAt(buffer, max_pairs, state.options.max_experts, max_hidden);
  return scratch.current;
}

}  // namespace

absl::Status CudaBackend::MoeRoute(const TensorView& logits, const TensorView* correction_bias,
                                   const MoeRoutingParams& params, const TensorView& ids,
                                   const TensorView& weights) {
  const char* op = "MoeRoute";
  EAGLE3_RETURN_IF_ERROR(CheckMoeRoute(logits, correction_bias, params, ids, weights));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "logits", logits));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "weights", weights));
  if (correction_bias != nullptr) {
    EAGLE3_RETURN_IF_ERROR(CheckF32(op, "correction_bias", *correction_bias));
  }
  const int64_t experts = logits.dim(1);
  if (experts > kMoeRouteMaxExperts) {
    return Invalid(op, "logits ", logits.ToString(), " has ", experts,
                   " experts; the CUDA router takes at most ", kMoeRouteMaxExperts);
  }
  const bool grouped = params.topk_method != TopkMethod::kGreedy;
  const bool noaux = params.topk_method == TopkMethod::kNoauxTc;
  MoeRouteLaunchParams p;
  p.top_k = params.top_k;
  p.n_group = grouped ? params.n_group : 1;
  p.topk_group = grouped ? params.topk_group : 1;
  p.sigmoid = params.scoring_func == ScoringFunc::kSigmoid;
  p.group_top2 = noaux;
  // V2 (softmax): normalize XOR scale. V3/K2 (sigmoid): normalize if asked, then always scale.
  p.normalize = params.norm_topk_prob && (noaux || params.top_k > 1);
  p.scale = (noaux || !p.normalize) ? params.routed_scaling_factor : 1.0f;
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "MoeRoute: cudaSetDevice"));
  return CudaStatus(
      LaunchMoeRoute(logits.data_as<const float>(), logits.stride(0),
                     correction_bias ? correction_bias->data_as<const float>() : nullptr,
                     logits.dim(0), experts, p, ids.data_as<int32_t>(), ids.stride(0),
                     weights.data_as<float>(), weights.stride(0), s.error_flag,
                     DeviceErrorCode(DeviceCheck::kMoeRouteLogits),
                     DeviceErrorCode(DeviceCheck::kMoeRouteBias), s.options.programmatic_launch,
                     s.stream),
      "MoeRoute: kernel launch");
}

absl::Status CudaBackend::MoeExperts(const TensorView& x, const TensorView& ids,
                                     const TensorView& weights,
                                     std::span<const ExpertWeights> experts, const TensorView& out,
                                     bool accumulate) {
  const char* op = "MoeExperts";
  EAGLE3_RETURN_IF_ERROR(CheckMoeExperts(x, ids, weights, experts, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "weights", weights));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  // One weight dtype for every expert: experts[0].gate_up's, f32 or bf16.
  const DType weight_dtype = experts.empty() ? DType::kF32 : experts[0].gate_up.dtype();
  if (weight_dtype != DType::kF32 && weight_dtype != DType::kBF16) {
    return Invalid(op, "experts[0].gate_up is ", experts[0].gate_up.ToString(),
                   " but CudaBackend::MoeExperts takes expert weights in f32 or bf16");
  }
  for (size_t e = 0; e < experts.size(); ++e) {
    for (const auto& [name, w] : {std::pair<const char*, const TensorView*>{"gate_up", &experts[e].gate_up},
                                  {"down", &experts[e].down}}) {
      if (w->dtype() != weight_dtype) {
        return Invalid(op, "experts[", e, "].", name, " is ", w->ToString(), " but experts[0].gate_up is ",
                       std::string(DTypeName(weight_dtype)),
                       ": every expert's weights must share one dtype (mixed f32 / bf16 experts)");
      }
    }
  }
  State& s = *state_;
  const int64_t tokens = x.dim(0);
  const int64_t top_k = ids.dim(1);
  const int64_t hidden = x.dim(1);
  const int64_t inter = experts.empty() ? 0 : experts[0].down.dim(1);
  const int64_t num_experts = static_cast<int64_t>(experts.size());
  if (tokens > s.options.max_rows) {
    return absl::ResourceExhaustedError(absl::StrCat(
        op, ": x ", x.ToString(), " has ", tokens, " tokens but the backend was created with ",
        "CudaBackendOptions::max_rows = ", s.options.max_rows,
        " (the act scratch is sized from it)"));
  }
  if (num_experts > s.options.max_experts) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, ": ", num_experts, " experts given but the backend was created with ",
                     "CudaBackendOptions::max_experts = ", s.options.max_experts,
                     " (the pointer tables are sized from it)"));
  }
  if (top_k > kMoeExpertsMaxSlots) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ids ", ids.ToString(), " has ", top_k,
                                                   " slots per token; the CUDA kernels take at most ",
                                                   kMoeExpertsMaxSlots));
  }
  if (tokens == 0) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "MoeExperts: cudaSetDevice"));
  const MoeExpertPointers* table = nullptr;
  if (num_experts > 0) {
    EAGLE3_ASSIGN_OR_RETURN(table, ExpertTable(s, experts));
  }
  const MoeWeightType weight_type =
      weight_dtype == DType::kBF16 ? MoeWeightType::kBF16 : MoeWeightType::kF32;
  // The grouped kernels keep x unrounded: experts that round it take the per-pair path.
  const bool any_bf16_activations = std::any_of(experts.begin(), experts.end(),
                                                [](const ExpertWeights& e) { return e.bf16_activations; });
  if (s.options.moe_grouped_experts && !any_bf16_activations &&
      MoeExpertsUseGrouped(tokens, top_k, num_experts, hidden, inter,
                           s.options.moe_grouped_min_tokens)) {
    EAGLE3_ASSIGN_OR_RETURN(const MoeGroupedWorkspace workspace,
                            GroupedWorkspace(s, top_k, hidden));
    const int64_t chunk = std::min(tokens, workspace.max_pairs / top_k);
    EAGLE3_ASSIGN_OR_RETURN(float* act, ActScratch(s, chunk * top_k * inter, top_k, inter));
    return CudaStatus(
        LaunchMoeExpertsGrouped(x.data_as<const float>(), x.stride(0),
                                ids.data_as<const int32_t>(), ids.stride(0),
                                weights.data_as<const float>(), weights.stride(0), table,
                                weight_type, num_experts, tokens, top_k, hidden, inter, act,
                                workspace, out.data_as<float>(), out.stride(0), accumulate,
                                s.error_flag, DeviceErrorCode(DeviceCheck::kMoeExpertsId),
                                s.options.programmatic_launch, s.stream),
        "MoeExperts: grouped kernel launch");
  }
  float* act = nullptr;
  if (top_k > 0 && inter > 0) {
    EAGLE3_ASSIGN_OR_RETURN(act, ActScratch(s, tokens * top_k * inter, top_k, inter));
  }
  return CudaStatus(
      LaunchMoeExperts(x.data_as<const float>(), x.stride(0), ids.data_as<const int32_t>(),
                       ids.stride(0), weights.data_as<const float>(), weights.stride(0), table,
                       weight_type, num_experts, tokens, top_k, hidden, inter, act,
                       out.data_as<float>(), out.stride(0), accumulate, s.error_flag,
                       DeviceErrorCode(DeviceCheck::kMoeExpertsId), s.options.programmatic_launch,
                       s.stream),
      "MoeExperts: kernel launch");
}

}  // namespace eagle3::cuda
