// CudaBackend: RoPE, attention over dense and paged keys, paged cache rows (kernels behind
// attention_ops.h, which lists their files). f32 operands; the paged latent cache of LatentAttention,
// BatchedLatentAttention, PagedWrite and PagedRead may also be bf16 (PagedWrite rounds to nearest
// even; the attention ops run the tensor-core kernel on it, with q rounded to bf16: see
// attention_ops.h).
//
// Data-dependent errors. The CPU reference checks positions, page entries and mask rows before it
// writes anything and returns InvalidArgument at once. Here those tensors live on the device, so
// the checks run as kernels ahead of the op's writing kernels (cuda/attention_ops.h): a bad
// entry makes the op write nothing and is reported by the next Synchronize() as InvalidArgument
// naming the op and the entry (DeviceCheck in cuda_backend_state.h). The op itself returns OK.
//
// Shared checks (Backend::BeginSharedChecks). Inside a scope, ApplyRope, PagedWrite and
// BatchedLatentAttention[KeyMask] key their index tensors and bounds; the first call of a key runs
// the checks into a flag slot of its own, and later calls of the key skip the check kernels (and
// the batched op's tile table) and have their writers read that slot. Each key keeps its slot for
// the scope, so a verdict is never overwritten by another op's check; the tile table is one buffer,
// so a batched call of a new key retires the earlier batched keys. Outside a scope, or when the
// slots run out, every call checks into slot 0.
//
// Scratch (State::attention_scratch), allocated once, on the first call of any of these ops (not
// while the stream is being captured into a CUDA graph: run the step once before capturing):
// kFlagBytes for the flag slots that link an op's checks to its writers, kTileTableBytes for
// BatchedLatentAttention's tile table (kLatentMaxBatch + 1 ints: a call with more sequences is
// InvalidArgument), kFoldCounterBytes for the latent kernels' arrival counters (LatentFold: zeroed
// once here, and every launch that uses them leaves them zero; a call with more output tiles than
// counters launches the combine kernel), then kPartialBytes for the partial results of split
// attention. The split count
// adapts to the scratch (it is chosen on the host from T, N, value_dim and max_kv_len), so no call
// is refused for its size: 32 MiB holds every decode shape of the DeepSeek models at full
// parallelism (B <= 64 sequences of 1 token x 16 heads at TP 8 or 128 at TP 1, value_dim 512:
// T N (value_dim + 2) floats per split, 15 splits at B = 64 x 16 heads, up to 1020 at B = 1);
// tree verify (B x up to 64 rows) needs fewer splits, its token tiles fill the GPU, and beyond the
// scratch the call runs unsplit. Independent of CudaBackendOptions::max_rows and max_context_len.
//
// BatchedLatentAttention and LatentAttention (key width <= kLatentMaxKeyDim) run the pipelined
// latent kernel (attention_ops.h); wider LatentAttention rows and Attention run the split kernel.
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "attention_ops.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
namespace {

constexpr size_t kFlagBytes = 256;
constexpr int kFlagSlots = static_cast<int>(kFlagBytes / sizeof(int));
constexpr size_t kTileTableBytes = ((kLatentMaxBatch + 1) * sizeof(int32_t) + 255) / 256 * 256;
// Arrival counters of the folded latent merge, one per output tile (token tile x head tile): a
// decode step of kLatentMaxBatch sequences of 32 heads in 16-row tiles; a call with more tiles (such
// calls rarely split their keys) launches the combine kernel.
constexpr int64_t kFoldCounters = 2 * kLatentMaxBatch;
constexpr size_t kFoldCounterBytes = kFoldCounters * sizeof(int);
constexpr size_t kPartialBytes = size_t{32} << 20;

// What an op's launchers need from the scratch.
struct Scratch {
  int* bad = nullptr;  // flag slot 0: the per-call flag, zeroed by Prepare or the op's first check
  int32_t* tile_table = nullptr;
  int* fold_counters = nullptr;  // [kFoldCounters], zero between launches
  float* partials = nullptr;
  int64_t partial_floats = 0;
};

// Who zeroes the per-call flag ahead of the op's checks.
enum class FlagClear {
  kMemset,      // Prepare, with cudaMemsetAsync
  kFirstCheck,  // the op's first check kernel (clear_flag, attention_ops.h)
};

// Makes the backend's device current, allocates the scratch on first use, and zeroes the per-call
// flag ahead of the op's checks unless its first check does.
absl::StatusOr<Scratch> Prepare(CudaBackend::State& state, const char* op, FlagClear clear) {
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(state), absl::StrCat(op, ": cudaSetDevice")));
  if (state.attention_scratch == nullptr) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    EAGLE3_RETURN_IF_ERROR(
        CudaStatus(cudaStreamIsCapturing(state.stream, &capture), "cudaStreamIsCapturing"));
    if (capture != cudaStreamCaptureStatusNone) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, ": the attention scratch would be allocated while the stream is being "
                           "captured into a CUDA graph; run the step once before capturing"));
    }
    const size_t bytes = kFlagBytes + kTileTableBytes + kFoldCounterBytes + kPartialBytes;
    EAGLE3_ASSIGN_OR_RETURN(state.attention_scratch, state.allocator.Allocate(bytes, 256));
    state.attention_scratch_bytes = bytes;
    EAGLE3_RETURN_IF_ERROR(
        CudaStatus(cudaMemsetAsync(static_cast<char*>(state.attention_scratch) + kFlagBytes + kTileTableBytes, 0,
                                   kFoldCounterBytes, state.stream),
                   absl::StrCat(op, ": clearing the fold counters")));
  }
  char* base = static_cast<char*>(state.attention_scratch);
  Scratch scratch;
  scratch.bad = reinterpret_cast<int*>(base);
  scratch.tile_table = reinterpret_cast<int32_t*>(base + kFlagBytes);
  scratch.fold_counters = reinterpret_cast<int*>(base + kFlagBytes + kTileTableBytes);
  scratch.partials = reinterpret_cast<float*>(base + kFlagBytes + kTileTableBytes + kFoldCounterBytes);
  scratch.partial_floats = static_cast<int64_t>(
      (state.attention_scratch_bytes - kFlagBytes - kTileTableBytes - kFoldCounterBytes) / sizeof(float));
  if (clear == FlagClear::kMemset) {
    EAGLE3_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(scratch.bad, 0, sizeof(int), state.stream),
                                      absl::StrCat(op, ": clearing the check flag")));
  }
  return scratch;
}

// The ops whose checks a shared-checks scope shares (the first element of a key).
enum class SharedOp : int64_t { kRetired = 0, kApplyRope, kPagedWrite, kBatchedLatent };

// Where an op's writers read their verdict, and whether its checks must run first (clearing it).
struct CheckSite {
  int* bad;
  bool check;
};

// A key's element for an index tensor: its data, dtype and layout (contents are the caller's
// promise, Backend::BeginSharedChecks).
void AppendTensor(std::vector<int64_t>& key, const TensorView& t) {
  key.push_back(static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data())));
  key.push_back(static_cast<int64_t>(t.dtype()));
  key.push_back(t.rank());
  for (int64_t d = 0; d < t.rank(); ++d) {
    key.push_back(t.dim(d));
    key.push_back(t.stride(d));
  }
}

// The flag slot and check decision for a call of `op` whose key's other elements fill_key appends
// (built only inside a scope, in the state's reused key buffer: no allocation per call).
template <typename FillKey>
CheckSite SharedCheck(CudaBackend::State& s, const Scratch& scratch, SharedOp op, FillKey&& fill_key) {
  if (s.shared_checks_depth == 0) return {scratch.bad, true};
  std::vector<int64_t>& key = s.shared_check_key;
  key.clear();
  key.push_back(static_cast<int64_t>(op));
  fill_key(key);
  for (const auto& [known, slot] : s.shared_checks) {
    if (known == key) return {scratch.bad + slot, false};
  }
  const int slot = static_cast<int>(s.shared_checks.size()) + 1;
  if (slot >= kFlagSlots) return {scratch.bad, true};
  if (key.front() == static_cast<int64_t>(SharedOp::kBatchedLatent)) {
    // This call's check rewrites the tile table that the earlier batched keys' calls would reuse.
    for (auto& entry : s.shared_checks) {
      if (entry.first.front() == key.front()) entry.first.front() = static_cast<int64_t>(SharedOp::kRetired);
    }
  }
  s.shared_checks.emplace_back(key, slot);
  return {scratch.bad + slot, true};
}

// Calls fn with positions' data as const int32_t* or const int64_t* (validated i32 / i64).
template <typename Fn>
cudaError_t WithIndices(const TensorView& positions, Fn fn) {
  if (positions.dtype() == DType::kI32) return fn(positions.data_as<const int32_t>());
  return fn(positions.data_as<const int64_t>());
}

// The attention kernel stages a chunk of key rows and kBlockRows query rows in shared memory.
absl::Status CheckSharedMemory(const CudaBackend::State& state, const char* op, int64_t key_dim,
                               int64_t value_dim, bool paged) {
  int limit = 0;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, state.options.device),
      absl::StrCat(op, ": cudaDeviceGetAttribute")));
  const size_t needed = AttentionSharedBytes(key_dim, value_dim, paged);
  if (needed > static_cast<size_t>(limit)) {
    return Invalid(op, "key width ", key_dim, " and value width ", value_dim, " need ", needed,
                   " bytes of shared memory per block in the CUDA attention kernel; cuda:",
                   state.options.device, " allows ", limit);
  }
  return absl::OkStatus();
}

// Where the latent kernels may merge their splits (CudaBackendOptions::latent_fold_combine_bytes).
LatentFold Fold(const CudaBackend::State& state, const Scratch& scratch) {
  return {scratch.fold_counters, kFoldCounters, state.options.latent_fold_combine_bytes};
}

// Latent-kernel params for q, cache and out (the mask fields are the caller's).
LatentLaunchParams LatentParams(const TensorView& q, const TensorView& cache, float scale,
                                int64_t value_dim, const TensorView& out) {
  LatentLaunchParams p;
  p.q = q.data_as<const float>();
  p.q_token_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  if (cache.dtype() == DType::kBF16) {
    p.cache_bf16 = cache.data_as<const uint16_t>();
  } else {
    p.cache = cache.data_as<const float>();
  }
  p.page_size = cache.dim(1);
  p.num_pages = cache.dim(0);
  p.out = out.data_as<float>();
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.tokens = q.dim(0);
  p.heads = q.dim(1);
  p.key_dim = q.dim(2);
  p.value_dim = value_dim;
  p.scale = scale;
  return p;
}

// The latent kernel stages 48 rows of key_dim floats (the bf16 kernel 144 rows of key_dim bf16 in
// its 16-row blocks; its 64-row blocks are used only where they fit); the device must allow its
// shared memory.
absl::Status CheckLatentSharedMemory(const CudaBackend::State& state, const char* op,
                                     int64_t key_dim, bool bf16) {
  int limit = 0;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, state.options.device),
      absl::StrCat(op, ": cudaDeviceGetAttribute")));
  const size_t needed = bf16 ? LatentBf16SharedBytes(key_dim) : LatentSharedBytes(key_dim);
  if (key_dim > kLatentMaxKeyDim || needed > static_cast<size_t>(limit)) {
    return Invalid(op, "key width W = ", key_dim, " is too wide for the CUDA latent attention kernel (W <= ",
                   kLatentMaxKeyDim, ", ", needed, " bytes of shared memory per block; cuda:",
                   state.options.device, " allows ", limit, ")");
  }
  return absl::OkStatus();
}

// Attention params for the query and output views (3-D, last dim contiguous) and the mask.
AttentionLaunchParams QueryParams(const TensorView& q, const TensorView& mask, float scale,
                                  const TensorView& out) {
  AttentionLaunchParams p;
  p.q = q.data_as<const float>();
  p.q_token_stride = q.stride(0);
  p.q_head_stride = q.stride(1);
  p.mask = mask.data_as<const uint8_t>();
  p.mask_stride = mask.stride(0);
  p.out = out.data_as<float>();
  p.out_token_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.tokens = q.dim(0);
  p.heads = q.dim(1);
  p.keys = mask.dim(1);
  p.key_dim = q.dim(2);
  p.value_dim = out.dim(2);
  p.scale = scale;
  return p;
}

// ApplyRope's position check (positions within cos_sin's rows) for `tokens` tokens, at its shared-check
// key, launched when the site asks for it; `earlier`: a check just launched by the same call, whose
// flag this one adds to instead of clearing where the two share it (outside a shared-checks scope).
absl::StatusOr<CheckSite> RopePositionCheck(CudaBackend::State& s, const Scratch& scratch, const char* op,
                                            int64_t tokens, const TensorView& positions, const TensorView& cos_sin,
                                            const CheckSite* earlier = nullptr) {
  const CheckSite site = SharedCheck(s, scratch, SharedOp::kApplyRope, [&](std::vector<int64_t>& key) {
    key.insert(key.end(), {tokens, cos_sin.dim(0)});
    AppendTensor(key, positions);
  });
  if (!site.check) return site;
  const bool clear = earlier == nullptr || !(earlier->check && earlier->bad == site.bad);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(WithIndices(positions,
                                                [&](const auto* pos) {
                                                  return LaunchCheckIndexRange(
                                                      pos, tokens, cos_sin.dim(0), site.bad, s.error_flag,
                                                      DeviceErrorCode(DeviceCheck::kRopePosition), clear,
                                                      s.options.programmatic_launch, s.stream);
                                                }),
                                    absl::StrCat(op, ": position check launch")));
  return site;
}

// PagedWrite's position check (positions within page_table's pages, entries within the cache), as
// RopePositionCheck.
absl::StatusOr<CheckSite> PagedPositionCheck(CudaBackend::State& s, const Scratch& scratch, const char* op,
                                             int64_t tokens, const TensorView& positions,
                                             const TensorView& page_table, const TensorView& cache,
                                             const CheckSite* earlier = nullptr) {
  const CheckSite site = SharedCheck(s, scratch, SharedOp::kPagedWrite, [&](std::vector<int64_t>& key) {
    key.insert(key.end(), {tokens, cache.dim(0), cache.dim(1)});
    AppendTensor(key, positions);
    AppendTensor(key, page_table);
  });
  if (!site.check) return site;
  const bool clear = earlier == nullptr || !(earlier->check && earlier->bad == site.bad);
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      WithIndices(positions,
                  [&](const auto* pos) {
                    return LaunchCheckPagedPositions(pos, tokens, page_table.data_as<const int32_t>(),
                                                     page_table.dim(0), cache.dim(1), cache.dim(0), site.bad,
                                                     s.error_flag, DeviceErrorCode(DeviceCheck::kPagedWritePosition),
                                                     clear, s.options.programmatic_launch, s.stream);
                  }),
      absl::StrCat(op, ": position check launch")));
  return site;
}

}  // namespace

absl::Status CudaBackend::ApplyRope(const TensorView& x, int64_t offset, int64_t rope_dim,
                                    const TensorView& positions, const TensorView& cos_sin,
                                    RopeStyle style) {
  const char* op = "ApplyRope";
  EAGLE3_RETURN_IF_ERROR(CheckApplyRope(x, offset, rope_dim, positions, cos_sin));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "cos_sin", cos_sin));
  State& s = *state_;
  EAGLE3_ASSIGN_OR_RETURN(const Scratch scratch, Prepare(s, op, FlagClear::kFirstCheck));
  EAGLE3_ASSIGN_OR_RETURN(const CheckSite site, RopePositionCheck(s, scratch, op, x.dim(0), positions, cos_sin));
  return CudaStatus(WithIndices(positions,
                                [&](const auto* pos) {
                                  return LaunchApplyRope(
                                      x.data_as<float>(), x.dim(0), x.dim(1), x.stride(0),
                                      x.stride(1), offset, rope_dim, pos,
                                      cos_sin.data_as<const float>(), cos_sin.stride(0),
                                      style == RopeStyle::kAdjacentPairs, site.bad,
                                      s.options.programmatic_launch, s.stream);
                                }),
                    "ApplyRope: kernel launch");
}

absl::Status CudaBackend::Attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& mask, float scale, const TensorView& out) {
  const char* op = "Attention";
  EAGLE3_RETURN_IF_ERROR(CheckAttention(q, k, v, mask, scale, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "k", k));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "v", v));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CheckSharedMemory(s, op, q.dim(2), v.dim(2), false));
  EAGLE3_ASSIGN_OR_RETURN(const Scratch scratch, Prepare(s, op, FlagClear::kMemset));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      LaunchCheckMaskRows(mask.data_as<const uint8_t>(), mask.dim(0), mask.dim(1), mask.stride(0),
                          scratch.bad, s.error_flag,
                          DeviceErrorCode(DeviceCheck::kAttentionMaskRow),
                          s.options.programmatic_launch, s.stream),
      "Attention: mask check launch"));
  AttentionLaunchParams p = QueryParams(q, mask, scale, out);
  p.k = k.data_as<const float>();
  p.k_key_stride = k.stride(0);
  p.k_head_stride = k.stride(1);
  p.v = v.data_as<const float>();
  p.v_key_stride = v.stride(0);
  p.v_head_stride = v.stride(1);
  return CudaStatus(LaunchAttention(p, scratch.partials, scratch.partial_floats, scratch.bad,
                                    s.options.programmatic_launch, s.stream),
                    "Attention: kernel launch");
}

absl::Status CudaBackend::LatentAttention(const TensorView& q, const TensorView& cache,
                                          const TensorView& page_table, int64_t context_len,
                                          const TensorView& mask, float scale, int64_t value_dim,
                                          const TensorView& out) {
  const char* op = "LatentAttention";
  EAGLE3_RETURN_IF_ERROR(
      CheckLatentAttention(q, cache, page_table, context_len, mask, scale, value_dim, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  State& s = *state_;
  const bool bf16 = cache.dtype() == DType::kBF16;
  // A bf16 cache has no fallback: the split kernel reads f32 keys.
  if (bf16) EAGLE3_RETURN_IF_ERROR(CheckLatentSharedMemory(s, op, q.dim(2), true));
  const bool fast = bf16 || CheckLatentSharedMemory(s, op, q.dim(2), false).ok();
  if (!fast) EAGLE3_RETURN_IF_ERROR(CheckSharedMemory(s, op, q.dim(2), value_dim, true));
  EAGLE3_ASSIGN_OR_RETURN(const Scratch scratch, Prepare(s, op, FlagClear::kFirstCheck));
  const int64_t page_size = cache.dim(1);
  // The CPU reference checks the page entries first, then the mask rows: so do the kernels, in
  // stream order, and the flag keeps the first failure.
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      LaunchCheckIndexRange(page_table.data_as<const int32_t>(),
                            (context_len + page_size - 1) / page_size, cache.dim(0), scratch.bad,
                            s.error_flag, DeviceErrorCode(DeviceCheck::kLatentAttentionPage),
                            /*clear_flag=*/true, s.options.programmatic_launch, s.stream),
      "LatentAttention: page check launch"));
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      LaunchCheckMaskRows(mask.data_as<const uint8_t>(), mask.dim(0), mask.dim(1), mask.stride(0),
                          scratch.bad, s.error_flag,
                          DeviceErrorCode(DeviceCheck::kLatentAttentionMaskRow),
                          s.options.programmatic_launch, s.stream),
      "LatentAttention: mask check launch"));
  if (fast) {
    LatentLaunchParams lp = LatentParams(q, cache, scale, value_dim, out);
    lp.page_tables = page_table.data_as<const int32_t>();
    lp.pages_per_seq = page_table.dim(0);
    lp.max_kv_len = context_len;
    lp.mask = mask.data_as<const uint8_t>();
    lp.mask_stride = mask.stride(0);
    return CudaStatus(
        LaunchLatentAttention(lp, scratch.partials, scratch.partial_floats, Fold(s, scratch), scratch.bad,
                              s.options.programmatic_launch, s.stream),
        "LatentAttention: kernel launch");
  }
  AttentionLaunchParams p = QueryParams(q, mask, scale, out);
  p.paged = true;
  p.cache = cache.data_as<const float>();
  p.page_table = page_table.data_as<const int32_t>();
  p.page_size = page_size;
  return CudaStatus(LaunchAttention(p, scratch.partials, scratch.partial_floats, scratch.bad,
                                    s.options.programmatic_launch, s.stream),
                    "LatentAttention: kernel launch");
}

namespace {

// One batched latent launch over every sequence, its mask either over each sequence's new rows
// (tree_mask; empty: causal) or over every key (key_mask), after the op's shape checks.
absl::Status LaunchBatchedLatent(CudaBackend::State& s, const char* op, const TensorView& q, const TensorView& cache,
                                 const TensorView& page_tables, const TensorView& q_start, const TensorView& kv_len,
                                 int64_t max_kv_len, const TensorView& tree_mask, const TensorView& key_mask,
                                 float scale, int64_t value_dim, const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q", q));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  if (page_tables.dim(0) > kLatentMaxBatch) {
    return Invalid(op, "page_tables ", page_tables.ToString(), " holds ", page_tables.dim(0),
                   " sequences; CudaBackend takes at most ", kLatentMaxBatch, " per call");
  }
  if (max_kv_len > std::numeric_limits<int32_t>::max()) {
    return Invalid(op, "max_kv_len = ", max_kv_len, " exceeds the i32 range of kv_len");
  }
  EAGLE3_RETURN_IF_ERROR(CheckLatentSharedMemory(s, op, q.dim(2), cache.dtype() == DType::kBF16));
  EAGLE3_ASSIGN_OR_RETURN(const Scratch scratch, Prepare(s, op, FlagClear::kFirstCheck));
  LatentLaunchParams p = LatentParams(q, cache, scale, value_dim, out);
  p.page_tables = page_tables.data_as<const int32_t>();
  p.page_table_stride = page_tables.stride(0);
  p.pages_per_seq = page_tables.dim(1);
  p.batch = page_tables.dim(0);
  p.q_start = q_start.data_as<const int32_t>();
  p.kv_len = kv_len.data_as<const int32_t>();
  p.max_kv_len = max_kv_len;
  if (HasTreeMask(tree_mask)) {  // the shared definition (backend.h): else causal
    p.tree_mask = tree_mask.data_as<const uint8_t>();
    p.tree_mask_stride = tree_mask.stride(0);
    p.tree_width = tree_mask.dim(1);
  }
  if (HasTreeMask(key_mask)) {
    p.mask = key_mask.data_as<const uint8_t>();
    p.mask_stride = key_mask.stride(0);
  }
  // The check's verdict and the tile table depend on the metadata and on the launch geometry's
  // inputs (LaunchBatchedLatentAttention).
  const CheckSite site = SharedCheck(s, scratch, SharedOp::kBatchedLatent, [&](std::vector<int64_t>& key) {
    key.insert(key.end(), {q.dim(0), q.dim(1), q.dim(2), value_dim, max_kv_len, cache.dim(0), cache.dim(1),
                           static_cast<int64_t>(cache.dtype())});
    for (const TensorView* t : {&page_tables, &q_start, &kv_len, &tree_mask, &key_mask}) AppendTensor(key, *t);
  });
  return CudaStatus(LaunchBatchedLatentAttention(
                        p, scratch.tile_table, scratch.partials, scratch.partial_floats, Fold(s, scratch),
                        site.bad, s.error_flag, DeviceErrorCode(DeviceCheck::kBatchedLatentAttention), site.check,
                        s.options.programmatic_launch, s.stream),
                    absl::StrCat(op, ": kernel launch"));
}

}  // namespace

absl::Status CudaBackend::BatchedLatentAttention(const TensorView& q, const TensorView& cache,
                                                 const TensorView& page_tables,
                                                 const TensorView& q_start, const TensorView& kv_len,
                                                 int64_t max_kv_len, const TensorView& tree_mask,
                                                 float scale, int64_t value_dim,
                                                 const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckBatchedLatentAttention(q, cache, page_tables, q_start, kv_len,
                                                     max_kv_len, tree_mask, scale, value_dim, out));
  return LaunchBatchedLatent(*state_, "BatchedLatentAttention", q, cache, page_tables, q_start, kv_len, max_kv_len,
                             tree_mask, TensorView(), scale, value_dim, out);
}

absl::Status CudaBackend::BatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                                        const TensorView& page_tables, const TensorView& q_start,
                                                        const TensorView& kv_len, int64_t max_kv_len,
                                                        const TensorView& key_mask, float scale, int64_t value_dim,
                                                        const TensorView& out) {
  EAGLE3_RETURN_IF_ERROR(CheckBatchedLatentAttentionKeyMask(q, cache, page_tables, q_start, kv_len, max_kv_len,
                                                            key_mask, scale, value_dim, out));
  return LaunchBatchedLatent(*state_, "BatchedLatentAttentionKeyMask", q, cache, page_tables, q_start, kv_len,
                             max_kv_len, TensorView(), key_mask, scale, value_dim, out);
}

absl::Status CudaBackend::PagedWrite(const TensorView& rows, const TensorView& positions,
                                     const TensorView& page_table, const TensorView& cache) {
  const char* op = "PagedWrite";
  EAGLE3_RETURN_IF_ERROR(CheckPaged(op, rows, positions, page_table, cache));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "rows", rows));
  State& s = *state_;
  EAGLE3_ASSIGN_OR_RETURN(const Scratch scratch, Prepare(s, op, FlagClear::kFirstCheck));
  const int32_t* pages = page_table.data_as<const int32_t>();
  EAGLE3_ASSIGN_OR_RETURN(const CheckSite site,
                          PagedPositionCheck(s, scratch, op, rows.dim(0), positions, page_table, cache));
  const bool bf16 = cache.dtype() == DType::kBF16;
  return CudaStatus(WithIndices(positions,
                                [&](const auto* pos) {
                                  const float* from = rows.data_as<const float>();
                                  if (bf16) {
                                    return LaunchPagedWrite(from, rows.stride(0), rows.dim(0),
                                                            rows.dim(1), pos, pages, cache.dim(1),
                                                            cache.data_as<uint16_t>(), site.bad,
                                                            s.options.programmatic_launch, s.stream);
                                  }
                                  return LaunchPagedWrite(from, rows.stride(0), rows.dim(0),
                                                          rows.dim(1), pos, pages, cache.dim(1),
                                                          cache.data_as<float>(), site.bad,
                                                          s.options.programmatic_launch, s.stream);
                                }),
                    "PagedWrite: kernel launch");
}

absl::Status CudaBackend::LatentRowsAndQueries(const TensorView& rows, const TensorView& norm_weight, float eps,
                                               const TensorView& q_pe, const TensorView& q_rot,
                                               const TensorView& positions, const TensorView& cos_sin, RopeStyle style,
                                               const TensorView& slots, const TensorView& slot_table,
                                               const TensorView& cache) {
  const char* op = "LatentRowsAndQueries";
  if (positions.dtype() != slots.dtype()) {
    return Backend::LatentRowsAndQueries(rows, norm_weight, eps, q_pe, q_rot, positions, cos_sin, style, slots,
                                         slot_table, cache);
  }
  EAGLE3_RETURN_IF_ERROR(
      CheckLatentRowsAndQueries(rows, norm_weight, eps, q_pe, q_rot, positions, cos_sin, slots, slot_table, cache));
  const bool norm = !Absent(norm_weight), queries = !Absent(q_pe);
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "rows", rows));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "cos_sin", cos_sin));
  if (norm) EAGLE3_RETURN_IF_ERROR(CheckF32(op, "norm_weight", norm_weight));
  if (queries) {
    EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q_pe", q_pe));
    EAGLE3_RETURN_IF_ERROR(CheckF32(op, "q_rot", q_rot));
  }
  State& s = *state_;
  EAGLE3_ASSIGN_OR_RETURN(const Scratch scratch, Prepare(s, op, FlagClear::kFirstCheck));
  // ApplyRope's and PagedWrite's checks at their keys, so that a shared-checks scope runs each once
  // whichever op asks first; outside a scope the slot check adds to the position check's flag.
  EAGLE3_ASSIGN_OR_RETURN(const CheckSite rope_site,
                          RopePositionCheck(s, scratch, op, rows.dim(0), positions, cos_sin));
  EAGLE3_ASSIGN_OR_RETURN(const CheckSite paged_site,
                          PagedPositionCheck(s, scratch, op, rows.dim(0), slots, slot_table, cache, &rope_site));
  const int32_t* table = slot_table.data_as<const int32_t>();
  LatentRowsParams a;
  a.rows = rows.data_as<float>();
  a.rows_stride = rows.stride(0);
  a.tokens = rows.dim(0);
  a.rope = cos_sin.dim(1);
  a.width = rows.dim(1);
  a.latent = a.width - a.rope;
  a.norm = norm;
  a.norm_weight = norm ? norm_weight.data_as<const float>() : nullptr;
  a.eps = eps;
  if (queries) {
    a.q_pe = q_pe.data_as<const float>();
    a.q_rot = q_rot.data_as<float>();
    a.heads = q_pe.dim(1);
    a.q_pe_stride[0] = q_pe.stride(0);
    a.q_pe_stride[1] = q_pe.stride(1);
    a.q_rot_stride[0] = q_rot.stride(0);
    a.q_rot_stride[1] = q_rot.stride(1);
  }
  a.cos_sin = cos_sin.data_as<const float>();
  a.table_stride = cos_sin.stride(0);
  a.adjacent_pairs = style == RopeStyle::kAdjacentPairs;
  a.slot_table = table;
  a.page_size = cache.dim(1);
  a.rope_bad = rope_site.bad;
  a.paged_bad = paged_site.bad;
  const bool bf16 = cache.dtype() == DType::kBF16;
  return CudaStatus(WithIndices(positions,
                                [&](const auto* pos) {
                                  using Id = std::remove_cv_t<std::remove_pointer_t<decltype(pos)>>;
                                  const Id* slot_ids = slots.data_as<const Id>();
                                  if (bf16) {
                                    return LaunchLatentRows(a, pos, slot_ids, cache.data_as<uint16_t>(),
                                                            s.options.programmatic_launch, s.stream);
                                  }
                                  return LaunchLatentRows(a, pos, slot_ids, cache.data_as<float>(),
                                                          s.options.programmatic_launch, s.stream);
                                }),
                    "LatentRowsAndQueries: kernel launch");
}

absl::Status CudaBackend::PagedRead(const TensorView& cache, const TensorView& page_table,
                                    const TensorView& positions, const TensorView& out) {
  const char* op = "PagedRead";
  EAGLE3_RETURN_IF_ERROR(CheckPaged(op, out, positions, page_table, cache));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  State& s = *state_;
  EAGLE3_ASSIGN_OR_RETURN(const Scratch scratch, Prepare(s, op, FlagClear::kFirstCheck));
  const int32_t* pages = page_table.data_as<const int32_t>();
  EAGLE3_RETURN_IF_ERROR(CudaStatus(
      WithIndices(positions,
                  [&](const auto* pos) {
                    return LaunchCheckPagedPositions(
                        pos, out.dim(0), pages, page_table.dim(0), cache.dim(1), cache.dim(0),
                        scratch.bad, s.error_flag,
                        DeviceErrorCode(DeviceCheck::kPagedReadPosition),
                        /*clear_flag=*/true, s.options.programmatic_launch, s.stream);
                  }),
      "PagedRead: position check launch"));
  const bool bf16 = cache.dtype() == DType::kBF16;
  return CudaStatus(WithIndices(positions,
                                [&](const auto* pos) {
                                  if (bf16) {
                                    return LaunchPagedRead(cache.data_as<const uint16_t>(), pages,
                                                           cache.dim(1), pos, out.dim(0),
                                                           out.dim(1), out.data_as<float>(),
                                                           out.stride(0), scratch.bad,
                                                           s.options.programmatic_launch, s.stream);
                                  }
                                  return LaunchPagedRead(cache.data_as<const float>(), pages,
                                                         cache.dim(1), pos, out.dim(0), out.dim(1),
                                                         out.data_as<float>(), out.stride(0),
                                                         scratch.bad, s.options.programmatic_launch,
                                                         s.stream);
                                }),
                    "PagedRead: kernel launch");
}

void CudaBackend::BeginSharedChecks() { ++state_->shared_checks_depth; }

void CudaBackend::EndSharedChecks() {
  State& s = *state_;
  if (s.shared_checks_depth == 0) return;
  if (--s.shared_checks_depth == 0) s.shared_checks.clear();
}

}  // namespace eagle3::cuda
