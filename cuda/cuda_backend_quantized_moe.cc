// CudaBackend::QuantizedMoeExperts: the routed experts of an FP8 block-scaled or INT4 group
// checkpoint with their weights kept quantized in device memory (kernels and numerics in
// quant_moe_ops.h). x, weights and out are f32; scales f32 (FP8) or bf16 (INT4, as the hub stores
// them: QuantizedGemm's rule).
//
// Path: the grouped quantized GEMV where every expert's views are on its layout with one shared
// layout (OnSharedGemvLayout: the experts of a hub checkpoint's TP slice), else the CUDA-core
// kernels; EAGLE3_QUANT_MOE_KERNEL=legacy forces the latter (the benchmark's A/B switch). Codes in
// warp tiles (QuantCodesLayout::kWarpTiles, as loads keep them where tiles_expert_codes says so)
// are read on the grouped path only; experts with tiled views off it are refused (InvalidArgument
// naming the first tiled view).
//
// Data-dependent errors follow MoeExperts: a token with an id outside [0, experts) keeps its out row
// and is reported by the next Synchronize() as InvalidArgument naming the token.
//
// Device memory, allocated on first use and reused afterwards (never per call in steady state):
//  - view tables: the experts span is host memory, so its pointers, strides and offsets are copied
//    to a device table of CudaBackendOptions::max_experts entries (168 bytes each). Tables are
//    cached by content, one per distinct expert set (each MoE layer keeps its own), up to
//    kMaxTables; a call whose set is cached uploads nothing, a new set costs one small host ->
//    device copy (over the least recently used table once the cache is full).
//  - the workspace (QuantMoeWorkspace): the pair grouping, the per-job item pointers, x and act in
//    bf16 and the outputs y f32 in per-job 8-row slots (QuantMoeSlotRows <= pairs + 8 (experts + 1)
//    rows) of one round of min(max_rows, what fits kYBytes of y) tokens: about 650 tokens at
//    V3 / K2.5 TP8 (top-8, H 7168, max_experts 512); longer calls run in several rounds. Sized at the
//    first call from its top_k, H and I; a call of more pairs a token (a joined shared expert's
//    ninth after a call of 8) runs as many tokens a round as the pairs fit, and only a call that needs
//    more rows, experts or pairs than fit allocates a larger one, keeping the old (a captured graph
//    may still use it).
// Neither first use may happen while the stream is being captured into a CUDA graph: run the step
// once before capturing (FailedPrecondition otherwise).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/status.h"
#include "quant_moe_ops.h"

namespace eagle3::cuda {
namespace {

constexpr const char* kOp = "QuantizedMoeExperts";
// Distinct expert sets kept on the device (a model's MoE layers, across models on this backend).
constexpr size_t kMaxTables = 256;
// Bytes of per-pair outputs one round may hold.
constexpr int64_t kYBytes = int64_t{256} << 20;

struct QuantMoeState {
  struct Table {
    std::vector<QuantMoeExpert> host;  // what `device` holds
    QuantMoeExpert* device = nullptr;  // capacity: CudaBackendOptions::max_experts entries
    uint64_t last_use = 0;
  };

  explicit QuantMoeState(DeviceAllocator* allocator) : allocator(allocator) {}
  ~QuantMoeState() {
    for (Table& table : tables) allocator->Deallocate(table.device, 0);
    for (const auto& [buffer, bytes] : workspaces) allocator->Deallocate(buffer, bytes);
  }
  QuantMoeState(const QuantMoeState&) = delete;
  QuantMoeState& operator=(const QuantMoeState&) = delete;

  DeviceAllocator* allocator;  // State::allocator, which outlives this
  std::vector<Table> tables;
  std::vector<QuantMoeExpert> wanted;  // the current call's table, reused across calls
  uint64_t clock = 0;
  std::vector<std::pair<void*, size_t>> workspaces;  // every one allocated, the current last
  QuantMoeWorkspace workspace;
};

// Device memory may be allocated, or uploaded from pageable memory, only outside a capture.
absl::Status CheckNotCapturing(cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing"));
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        kOp, ": ", what, " while the stream is being captured into a CUDA graph; run the step once before capturing"));
  }
  return absl::OkStatus();
}

// A checked view as the kernels' table holds it.
QuantMoeMatrix MatrixOf(const QuantizedWeightView& w) {
  QuantMoeMatrix m;
  m.codes = w.codes.data();
  m.scales = w.scales.data();
  m.codes_ld = w.codes.stride(0);
  m.scales_ld = w.scales.stride(0);
  m.row_off = w.row0 - w.scale_row0 * w.block_rows;
  m.col_off = w.col0 - w.scale_col0 * w.block_cols;
  m.nib0 = w.format == WeightFormat::kInt4Group ? w.col0 % kInt4PerWord : 0;
  if (w.warp_tiled()) {
    m.tiled = 1;
    m.codes_ld = 0;
  }
  return m;
}

// The device table of state.wanted, uploading it unless cached.
absl::StatusOr<const QuantMoeExpert*> DeviceTable(CudaBackend::State& s, QuantMoeState& state) {
  const size_t bytes = state.wanted.size() * sizeof(QuantMoeExpert);
  ++state.clock;
  QuantMoeState::Table* lru = nullptr;
  for (QuantMoeState::Table& table : state.tables) {
    if (table.host.size() == state.wanted.size() && std::memcmp(table.host.data(), state.wanted.data(), bytes) == 0) {
      table.last_use = state.clock;
      return table.device;
    }
    if (lru == nullptr || table.last_use < lru->last_use) lru = &table;
  }
  EAGLE3_RETURN_IF_ERROR(CheckNotCapturing(s.stream, "a new expert set"));
  QuantMoeState::Table* table = lru;
  if (state.tables.size() < kMaxTables) {
    const size_t capacity = static_cast<size_t>(s.options.max_experts) * sizeof(QuantMoeExpert);
    EAGLE3_ASSIGN_OR_RETURN(void* device, s.allocator.Allocate(capacity, alignof(QuantMoeExpert)));
    table = &state.tables.emplace_back();
    table->device = static_cast<QuantMoeExpert*>(device);
  }
  // Stream-ordered after every kernel that read the old contents; the pageable source is staged
  // before cudaMemcpyAsync returns.
  table->host = state.wanted;
  table->last_use = state.clock;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(table->device, table->host.data(), bytes, cudaMemcpyHostToDevice, s.stream),
      "QuantizedMoeExperts: uploading the expert view table"));
  return table->device;
}

// A workspace for rounds of this call's shape (see the file comment).
absl::StatusOr<QuantMoeWorkspace> Workspace(CudaBackend::State& s, QuantMoeState& state, int64_t top_k,
                                            int64_t num_experts, int64_t hidden, int64_t inter) {
  const QuantMoeWorkspace& have = state.workspace;
  const int64_t max_experts = std::max({have.max_experts, num_experts, s.options.max_experts});
  // y holds QuantMoeSlotRows(pairs, experts) <= min(8 pairs, pairs + 8 (experts + 1)) rows of hidden
  // floats.
  const int64_t rows = kYBytes / std::max<int64_t>(1, hidden * 4);
  const int64_t per_token = std::max<int64_t>(1, top_k);
  const int64_t fit = std::max<int64_t>({1, (rows - kQuantMoeJobPairs * (max_experts + 1)) / per_token,
                                         rows / (kQuantMoeJobPairs * per_token)});
  const int64_t round_tokens = std::max<int64_t>(1, std::min(s.options.max_rows, fit));
  if (have.max_tokens >= round_tokens && have.max_tokens * have.top_k >= round_tokens * top_k &&
      have.max_experts >= num_experts && have.hidden >= hidden && have.inter >= inter) {
    return have;
  }
  EAGLE3_RETURN_IF_ERROR(CheckNotCapturing(s.stream, "growing the workspace"));
  const int64_t max_tokens = std::max(have.max_tokens, round_tokens);
  const int64_t max_top_k = std::max(have.top_k, top_k);
  const int64_t max_hidden = std::max(have.hidden, hidden), max_inter = std::max(have.inter, inter);
  const size_t bytes = QuantMoeWorkspaceBytes(max_tokens, max_top_k, max_experts, max_hidden, max_inter);
  EAGLE3_ASSIGN_OR_RETURN(void* buffer, s.allocator.Allocate(bytes, 256));
  state.workspaces.emplace_back(buffer, bytes);
  // The folded combine's counters start at zero; the kernels leave them so.
  EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(buffer, 0, QuantMoeWorkspaceCountersBytes(max_hidden), s.stream),
                                    "QuantizedMoeExperts: zeroing the workspace's counters"));
  state.workspace = QuantMoeWorkspaceAt(buffer, max_tokens, max_top_k, max_experts, max_hidden, max_inter);
  return state.workspace;
}

// The A/B switch of benchmarks/cuda/quant_moe_benchmark.cc: EAGLE3_QUANT_MOE_KERNEL=legacy runs the
// CUDA-core kernels even where the grouped GEMV could run.
bool LegacyKernelsRequested() {
  static const bool legacy = [] {
    const char* value = std::getenv("EAGLE3_QUANT_MOE_KERNEL");
    return value != nullptr && std::string_view(value) == "legacy";
  }();
  return legacy;
}

QuantMoeGemvLayout LayoutOf(const QuantMoeMatrix& m) {
  return {m.codes_ld, m.scales_ld, m.row_off, m.col_off, m.tiled != 0};
}

bool SameLayout(const QuantMoeGemvLayout& a, const QuantMoeGemvLayout& b) {
  return a.codes_ld == b.codes_ld && a.scales_ld == b.scales_ld && a.row_off == b.row_off &&
         a.col_off == b.col_off && a.tiled == b.tiled;
}

// Whether the grouped-GEMV path takes the experts (quant_moe_ops.h): every matrix on the GEMV's
// layout, gate and up of every expert with one layout, down with one; sets shape's layouts.
bool OnSharedGemvLayout(const std::vector<QuantMoeExpert>& experts, QuantMoeShape& shape) {
  const int64_t hidden = shape.hidden, inter = shape.inter;
  if (hidden < 1 || inter < 1) return false;
  shape.gate_up = LayoutOf(experts[0].gate);
  shape.down = LayoutOf(experts[0].down);
  for (const QuantMoeExpert& e : experts) {
    const auto on = [&](const QuantMoeMatrix& m, int64_t rows, int64_t k) {
      return QuantMoeOnGemvLayout(m, rows, k, shape.format, shape.block_rows, shape.block_cols);
    };
    if (!on(e.gate, inter, hidden) || !on(e.up, inter, hidden) || !on(e.down, hidden, inter) ||
        !SameLayout(LayoutOf(e.gate), shape.gate_up) || !SameLayout(LayoutOf(e.up), shape.gate_up) ||
        !SameLayout(LayoutOf(e.down), shape.down)) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool CudaBackend::tiles_expert_codes(const QuantizedWeightView& w) const {
  if (!state_->options.quant_moe_tiled_experts || LegacyKernelsRequested() || w.warp_tiled() ||
      !w.Check("tiles_expert_codes").ok()) {
    return false;
  }
  // The grouped path's layout with the codes placed as a loader places them (16-byte aligned
  // tiles); the scales as they are.
  QuantMoeMatrix m = MatrixOf(w);
  m.codes = nullptr;
  m.codes_ld = 0;
  m.tiled = 1;
  const QuantMoeFormat format =
      w.format == WeightFormat::kInt4Group ? QuantMoeFormat::kInt4Group : QuantMoeFormat::kFp8Block;
  return QuantMoeOnGemvLayout(m, w.rows(), w.k, format, w.block_rows, w.block_cols);
}

absl::Status CudaBackend::QuantizedMoeExperts(const TensorView& x, const TensorView& ids, const TensorView& weights,
                                              std::span<const QuantizedExpertWeights> experts, const TensorView& out,
                                              bool accumulate) {
  EAGLE3_RETURN_IF_ERROR(CheckQuantizedMoeExperts(x, ids, weights, experts, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(kOp, "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32(kOp, "weights", weights));
  EAGLE3_RETURN_IF_ERROR(CheckF32(kOp, "out", out));
  // One format and scale dtype for all (CheckQuantizedMoeExperts): experts[0].gate's.
  if (!experts.empty() && experts[0].gate.format == WeightFormat::kInt4Group &&
      experts[0].gate.scales.dtype() != DType::kBF16) {
    return Invalid(kOp, "experts[0].gate.scales ", experts[0].gate.scales.ToString(),
                   " must be bf16 for int4-group weights on CudaBackend (as the hub stores them)");
  }
  State& s = *state_;
  const int64_t tokens = x.dim(0), top_k = ids.dim(1), hidden = x.dim(1);
  const int64_t num_experts = static_cast<int64_t>(experts.size());
  const int64_t inter = experts.empty() ? 0 : experts[0].gate.rows();
  if (num_experts > std::min(s.options.max_experts, kQuantMoeMaxExperts)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        kOp, ": ", num_experts, " experts given but the backend takes at most ",
        std::min(s.options.max_experts, kQuantMoeMaxExperts),
        " (CudaBackendOptions::max_experts sizes the view tables; the grouping kernel takes ", kQuantMoeMaxExperts,
        ")"));
  }
  if (tokens == 0) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "QuantizedMoeExperts: cudaSetDevice"));
  if (!s.quant_moe) s.quant_moe = std::make_shared<QuantMoeState>(&s.allocator);
  auto& state = *static_cast<QuantMoeState*>(s.quant_moe.get());

  QuantMoeShape shape;
  shape.format = QuantMoeFormat::kFp8Block;
  shape.hidden = hidden;
  shape.inter = inter;
  shape.num_experts = num_experts;
  shape.top_k = top_k;
  shape.gate_up_chunked = shape.down_chunked = true;
  state.wanted.resize(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const QuantizedExpertWeights& w = experts[e];
    QuantMoeExpert& entry = state.wanted[e];
    entry = {MatrixOf(w.gate), MatrixOf(w.up), MatrixOf(w.down)};
    if (e == 0) {
      shape.format = w.gate.format == WeightFormat::kInt4Group ? QuantMoeFormat::kInt4Group : QuantMoeFormat::kFp8Block;
      shape.block_rows = w.gate.block_rows;
      shape.block_cols = w.gate.block_cols;
    }
    shape.gate_up_chunked = shape.gate_up_chunked &&
                            QuantMoeChunked(entry.gate, inter, shape.format, shape.block_cols) &&
                            QuantMoeChunked(entry.up, inter, shape.format, shape.block_cols);
    shape.down_chunked = shape.down_chunked && QuantMoeChunked(entry.down, hidden, shape.format, shape.block_cols);
  }
  shape.grouped = num_experts > 0 && !LegacyKernelsRequested() && OnSharedGemvLayout(state.wanted, shape);
  if (!shape.grouped) {
    for (size_t e = 0; e < experts.size(); ++e) {
      const QuantizedExpertWeights& w = experts[e];
      for (const auto& [name, view] : {std::pair<const char*, const QuantizedWeightView*>{"gate", &w.gate},
                                       {"up", &w.up},
                                       {"down", &w.down}}) {
        if (!view->warp_tiled()) continue;
        return Invalid(kOp, "experts[", e, "].", name, ".codes ", view->codes.ToString(),
                       " are warp-tiled, which only the grouped GEMV path reads; these experts are off it (",
                       LegacyKernelsRequested() ? "EAGLE3_QUANT_MOE_KERNEL=legacy"
                                                : "their views do not share one layout on the GEMV's",
                       "): load them row-major (CudaBackendOptions::quant_moe_tiled_experts = false)");
      }
    }
  }
  shape.fold_grouping = s.options.quant_moe_fold_grouping;
  shape.fold_silu = s.options.quant_moe_fold_silu;
  shape.fold_combine = s.options.quant_moe_fold_combine;
  shape.direct_one_token = s.options.quant_moe_direct_decode;
  shape.direct_max_tokens = shape.format == QuantMoeFormat::kInt4Group ? s.options.quant_moe_direct_max_tokens_int4
                                                                      : s.options.quant_moe_direct_max_tokens_fp8;
  shape.combine_in_block = s.options.quant_moe_combine_in_block;
  shape.chain_round = s.options.quant_moe_chain_round;
  const QuantMoeExpert* table = nullptr;
  if (num_experts > 0) {
    EAGLE3_ASSIGN_OR_RETURN(table, DeviceTable(s, state));
  }
  EAGLE3_ASSIGN_OR_RETURN(const QuantMoeWorkspace workspace, Workspace(s, state, top_k, num_experts, hidden, inter));
  return CudaStatus(
      LaunchQuantMoeExperts(x.data_as<const float>(), x.stride(0), ids.data_as<const int32_t>(), ids.stride(0),
                            weights.data_as<const float>(), weights.stride(0), table, shape, tokens, workspace,
                            out.data_as<float>(), out.stride(0), accumulate, s.error_flag,
                            DeviceErrorCode(DeviceCheck::kQuantizedMoeExpertsId), s.options.programmatic_launch,
                            s.stream),
      "QuantizedMoeExperts: kernel launch");
}

}  // namespace eagle3::cuda
