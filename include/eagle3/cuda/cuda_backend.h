// CudaBackend: the Backend op interface on one CUDA device (eagle3::cuda target). Same semantics as
// the CPU reference (eagle3/cpu/cpu_backend.h), checked op by op by the parity tests; storage f32
// (and bf16 where an op says so: Gemm's b, MoeExperts' expert weights and EmbeddingLookup's table,
// see preferred_weight_dtype), accumulation in fp32. Ops are asynchronous on the backend's stream
// and never allocate or synchronize the host, except where an op must report a data-dependent error
// (noted per op in the implementation); Synchronize() waits and reports deferred errors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/export.h"

namespace eagle3::cuda {

struct CudaBackendOptions {
  int device = 0;
  cudaStream_t stream = nullptr;  // null: the backend creates (and owns) a non-blocking stream
  // cuBLASLt workspace, allocated once at creation.
  size_t gemm_workspace_bytes = 32u << 20;
  // Scratch for Gemm's bf16 copy of an f32 activation `a` (f32 a x bf16 b) and its f32 copy of bf16
  // weights (GemmOptions::keep_f32_activations past the GEMV path: N x K floats, 7.3 MB for a
  // DeepSeek-V3 router), allocated at creation (0: at first need). A larger operand grows it (never
  // while the stream is being captured), and the outgrown buffer is kept until the backend is
  // destroyed (a captured graph may read it).
  size_t activation_scratch_bytes = 16u << 20;
  // Upper bounds sized at creation for ops that need scratch (no allocation per call).
  int64_t max_rows = 4096;          // rows (tokens) of any op
  int64_t max_context_len = 65536;  // keys of one attention call
  int64_t max_experts = 512;
  // MoeExperts' grouped path (expert-sorted tiles on tensor cores) for calls with many (token,
  // expert) pairs (MoeExpertsUseGrouped in moe_ops.h); off: the per-pair path for every call.
  bool moe_grouped_experts = true;
  // The fewest tokens a call needs for the grouped path (besides 2 E pairs; MoeExpertsUseGrouped):
  // the default is where the per-pair path stops winning for DeepSeek's shapes on Hopper.
  int64_t moe_grouped_min_tokens = 40;
  // Gemm / BatchedGemm of up to kGemvMaxRows (gemv_ops.h) activation rows on the GEMV kernel (no
  // activation scratch, no conversion kernel) instead of cuBLASLt; off: cuBLASLt for every call.
  bool small_m_gemv = true;
  // Every kernel of the backend's ops is launched as a programmatic dependent of the kernel before
  // it (programmatic dependent launch, cuda/programmatic_launch.cuh): its launch overlaps that
  // kernel's end, and kernels that stream weights (the GEMV path of Gemm / BatchedGemm calls with
  // GemmOptions::b_is_weights) start their weight loads while it drains. Results are the same; off:
  // every kernel starts after the one before it has finished.
  bool programmatic_launch = true;
  // QuantizedGemm calls of up to this many activation rows (decode and tree-verify steps) stream the
  // quantized weights on the quantized GEMV kernels, 32 rows per pass (quant_gemv_ops.h); more rows
  // (prefill) dequantize the weight into bf16 scratch for cuBLASLt. 0: every call dequantizes.
  int64_t quantized_gemv_max_rows = 64;
  // FP8 block-scaled QuantizedGemm calls of at least this many activation rows, a multiple of 4
  // (the row counts cuBLASLt's block-scaled kernels take), run W8A8 when the weight slice allows it
  // (cuda/fp8_w8a8_layout.h: 128 x 128 blocks, the slice on block boundaries, K a multiple of 128, N
  // of 16) and cuBLASLt has a kernel for the shape: the
  // activations are quantized on the fly to e4m3 with one f32 scale per row per 128 columns
  // (DeepSeek's per-token-group scaling, cuda/act_quant_ops.h), then multiplied on cuBLASLt's
  // block-scaled FP8 tensor-core kernels. Other calls keep the paths above. Numerics differ from
  // them: each activation is rounded to 3 mantissa bits (e4m3 relative rounding up to 2^-4, about
  // 3% relative error of a product's result against the exact f32 one) instead of bf16's 8.
  // Keep it above quantized_gemv_max_rows (prefill only): a verify step on W8A8 would no longer
  // match a decode step's numerics (docs/semantics.md). 0: never, the default: the weight-only paths
  // keep every step's numerics bf16-exact in the activations (benchmarks/NOTES.md, W8A8).
  int64_t fp8_w8a8_min_rows = 0;
  // BatchedPagedAttention (the draft's attention) on its register kernel (PagedAttentionParams::
  // register_kernel in paged_attention_ops.h; cuda_paged_attention_test runs every case on both
  // kernels). Off: the shared-memory kernel, several times slower in the draft step at one token
  // (benchmarks/NOTES.md).
  bool paged_attention_registers = true;
  // QuantizedMoeExperts on the grouped-GEMV path groups the (token, expert) pairs of a small call
  // (decode, small verify steps: up to kQuantMoeFoldPairs = 128 pairs, cuda/quant_moe_ops.h) inside
  // the kernel that stages the experts' inputs rather than in a kernel of its own: one launch fewer
  // per MoE layer. Results are the same bits; off: the grouping kernel for every call.
  bool quant_moe_fold_grouping = true;
  // On that path, in calls of one token (decode), SiLU-mul is computed where the down product stages
  // its activations, and the experts' outputs are combined into the token's row by the down
  // product's last block of each tile of rows, instead of by two kernels of their own: two launches
  // fewer per MoE layer (larger calls keep the kernels, faster there). Results are the same bits;
  // off: the kernels (the reference the tests hold the folds to).
  bool quant_moe_fold_silu = true;
  bool quant_moe_fold_combine = true;
  // With both folds above, calls of one token launch no kernel to stage the experts' inputs either:
  // the gate-up product finds each routed expert's weights from the token's ids itself and rounds
  // the token's row to bf16 as it stages it, and a bad id is recorded by the products. Two kernels
  // per MoE layer at decode instead of three; the same bits. Off: the staging kernel.
  bool quant_moe_direct_decode = true;
  // With quant_moe_direct_decode, calls of 2 to this many tokens (small verify steps, batched
  // decode) run the same way: each (token, expert) pair found from its id by the products, one
  // launch for the gate-up products and one for the down products, whose blocks combine each
  // token's experts (at most 9 a token, codes tiled), instead of the grouping, staging, SiLU-mul and
  // combine kernels around them. An expert two of the call's tokens chose is read once for each.
  // Within the grouped path's tolerances of the reference, not its bits (the products are planned
  // for one row an expert rather than for jobs of 8). 1: one-token calls only. Tokens that share
  // experts favour the grouped path, which reads each once: INT4's default is below where direct
  // rounds stop gaining on uniform routings (14 tokens), near where they cross the grouped path on
  // routings whose consecutive tokens share about a third of their experts; FP8's is where they
  // stop gaining on uniform routings (benchmarks/NOTES.md).
  int64_t quant_moe_direct_max_tokens_int4 = 12;
  int64_t quant_moe_direct_max_tokens_fp8 = 4;
  // With quant_moe_direct_decode, a direct call (INT4 or FP8 experts) combines the experts' rows
  // inside the down product's blocks (each block a tile of hidden rows of one token's routed
  // experts, one warp an expert) instead of through per-tile counters and a last-block pass: no
  // fences or atomics, the same bits. Taken where the experts' codes are tiled and there are at
  // most 9 of them a token; calls of several tokens run direct only with it.
  bool quant_moe_combine_in_block = true;
  // With quant_moe_combine_in_block, such an INT4 call's gate-up and down products run as one kernel
  // whose blocks take the gate-up's units of work first and then the down product's tiles, each
  // down warp waiting (on a device counter) only for its own expert's gate-up rows: one kernel's
  // fixed costs instead of two's, and the down weights' first loads in flight while the gate-up
  // ends. The same bits; taken where the gate-up's plan keeps each block's K range in one tile.
  bool quant_moe_chain_round = true;
  // Models loaded on this backend keep their routed experts' quantized codes in warp-step tiles
  // (Backend::tiles_expert_codes, QuantCodesLayout::kWarpTiles): the grouped GEMV then reads each
  // kernel step's 16 rows as one contiguous 1 KiB block instead of 16 pieces a row stride apart.
  // The same bits either way; off: row-major (also when EAGLE3_QUANT_MOE_KERNEL=legacy, whose
  // CUDA-core kernels read row-major codes only).
  bool quant_moe_tiled_experts = true;
  // The same for the other quantized weights (QuantizedGemm's: attention projections, dense and
  // shared-expert MLPs) that its GEMV path takes (Backend::tiles_gemm_codes); its dequantizing path
  // reads the tiles too. Never while fp8_w8a8_min_rows is set (cuBLASLt reads row-major codes).
  // The same bits either way; off: row-major.
  bool quant_gemm_tiled_weights = true;
  // Latent attention calls (LatentAttention, BatchedLatentAttention) that split their keys merge the
  // splits' partial results in the attention kernel itself, in the last block to finish of each
  // tile of query rows, when the tile's partial results (splits x rows of a block x value_dim
  // floats) take at most this many bytes; larger ones launch a combine kernel, which spreads the
  // merge over many blocks. Results are the same (bitwise); 0: every split call launches the combine
  // kernel. The default folds only few splits of a 16-row tile (large batches, whose tiles already
  // fill the GPU): one block reading many splits' partials is slower than a combine kernel.
  int64_t latent_fold_combine_bytes = int64_t{128} << 10;
  // Pinned host memory of each weight load's UploadRing (CreateUploadRing), allocated once per load:
  // the load reads quantized codes and scales and weights stored as uploaded straight into it, and
  // Copy enqueues their transfers from there while the next tensors are read. A tensor larger than
  // the ring takes Copy's pageable path (StagedUpload). Large enough for every tensor of a
  // DeepSeek-V3 / Kimi-K2 TP 8 rank but its embedding and lm_head shards, and for several in flight.
  // 0: no ring (every load reads into pageable memory, as before the ring).
  size_t upload_ring_bytes = size_t{64} << 20;
  // Weight tensors (Backend::weight_allocator: every weight a model loads) are pieces of device
  // chunks of this many bytes (a ChunkArena over the backend's device allocator,
  // eagle3/chunk_arena.h): one cudaMalloc per chunk instead of one per tensor, two per quantized
  // weight (codes and scales). A tensor larger than half a chunk gets a cudaMalloc of its own, and so
  // does one the device has no room for a whole chunk for. Up to half a chunk may stay unused at the
  // end of each chunk, and a chunk is freed only with the last of its tensors. At least 256; 0: no
  // arena (weight_allocator() is allocator(), a cudaMalloc per tensor).
  size_t weight_arena_chunk_bytes = size_t{256} << 20;
};

class EAGLE3_API CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  cudaStream_t stream() const;
  const CudaBackendOptions& options() const;

  Device device() const override;
  // kBF16: weights stored in bf16 halve the bytes a decode step streams (fp32 accumulation).
  DType preferred_weight_dtype() const override { return DType::kBF16; }
  Allocator& allocator() override;
  // The weight arena over allocator() (options().weight_arena_chunk_bytes), or allocator() when that
  // is 0.
  Allocator& weight_allocator() override;
  // Pinned host memory (PinnedHostAllocator).
  Allocator& staging_allocator() override;
  // options().upload_ring_bytes of pinned memory with CUDA events on stream() as fences; nullptr
  // when that is 0.
  absl::StatusOr<std::unique_ptr<UploadRing>> CreateUploadRing() override;

  // Device <-> device: any strides up to rank 6 (a zero-stride source broadcasts). Host <-> device:
  // contiguous or pitched 2-D (row-strided) views; other host-side layouts are refused.
  absl::Status Copy(const TensorView& src, const TensorView& dst) override;
  // Paths and scratch: cuda/gemm.cc (keep_f32_activations up to kGemvMaxRows rows on the GEMV
  // kernel, beyond them through an f32 copy of b in the activation scratch).
  absl::Status Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                    const GemmOptions& options) override;
  // FP8 block-scaled and INT4 group weights stay quantized in device memory (QuantizedGemm streams
  // them; cuda/cuda_backend_quantized.cc).
  bool keeps_quantized(WeightFormat format) const override {
    return format == WeightFormat::kFp8Block || format == WeightFormat::kInt4Group;
  }
  // One kernel writing the tiles 16 bytes a thread.
  absl::Status TileQuantizedCodes(const QuantizedWeightView& w, const TensorView& tiles) override;
  // CudaBackendOptions::quant_moe_tiled_experts, unless EAGLE3_QUANT_MOE_KERNEL=legacy, for views
  // the grouped GEMV path takes (cuda/cuda_backend_quantized_moe.cc).
  bool tiles_expert_codes(const QuantizedWeightView& w) const override;
  // CudaBackendOptions::quant_gemm_tiled_weights, for views the GEMV path takes.
  bool tiles_gemm_codes(const QuantizedWeightView& w) const override;
  // a f32 or bf16; w's scales f32 (FP8) or bf16 (INT4); row-major or warp-tiled codes (the W8A8
  // path takes row-major ones only); see cuda/cuda_backend_quantized.cc for the
  // paths and their numerics. A call that dequantizes may grow the dequantization scratch (never
  // while the stream is being captured).
  absl::Status QuantizedGemm(const TensorView& a, const QuantizedWeightView& w, const TensorView& c,
                             const GemmOptions& options) override;
  // One strided-batched cuBLASLt call (f32 activations of a mixed product converted in one pass);
  // with a bias, K = 0 or keep_f32_activations on a mixed product, Backend's per-item loop (all
  // after the GEMV path, which takes up to kGemvMaxRows rows of every item in one launch).
  absl::Status BatchedGemm(const TensorView& a, const TensorView& b, const TensorView& c,
                           const GemmOptions& options) override;
  absl::Status RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override;
  // One launch for both halves, each bit for bit as RmsNorm computes it (LaunchRmsNormPair).
  absl::Status RmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                           const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                           float eps) override;
  absl::Status AddRmsNorm(const TensorView& x, const TensorView& residual, const TensorView& weight, float eps,
                          const TensorView& out) override;
  absl::Status SiluMul(const TensorView& gate_up, const TensorView& out) override;
  absl::Status EmbeddingLookup(const TensorView& ids, const TensorView& table, int64_t vocab_start,
                               const TensorView& out) override;
  absl::Status Softmax(const TensorView& logits, float temperature, const TensorView& out) override;
  absl::Status Argmax(const TensorView& logits, const TensorView& out) override;
  absl::Status TopK(const TensorView& values, int k, const TensorView& out_values,
                    const TensorView& out_indices) override;
  absl::Status ApplyRope(const TensorView& x, int64_t offset, int64_t rope_dim, const TensorView& positions,
                         const TensorView& cos_sin, RopeStyle style) override;
  absl::Status Attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& mask,
                         float scale, const TensorView& out) override;
  absl::Status LatentAttention(const TensorView& q, const TensorView& cache, const TensorView& page_table,
                               int64_t context_len, const TensorView& mask, float scale, int64_t value_dim,
                               const TensorView& out) override;
  absl::Status BatchedLatentAttention(const TensorView& q, const TensorView& cache,
                                      const TensorView& page_tables, const TensorView& q_start,
                                      const TensorView& kv_len, int64_t max_kv_len,
                                      const TensorView& tree_mask, float scale, int64_t value_dim,
                                      const TensorView& out) override;
  // The latent kernels of BatchedLatentAttention reading the mask over every key; its row check
  // (every row allows a key) at Synchronize like the op's other device-side errors.
  absl::Status BatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                             const TensorView& page_tables, const TensorView& q_start,
                                             const TensorView& kv_len, int64_t max_kv_len,
                                             const TensorView& key_mask, float scale, int64_t value_dim,
                                             const TensorView& out) override;
  // BatchedPagedAttention: f32 only; a kv head's query heads x head_dim must fit the kernel's shared
  // memory (PagedAttentionSharedBytes <= 48 KiB, e.g. 4 x 128 or 8 x 128); device-side errors at
  // Synchronize (cuda_backend_paged_attention.cc).
  absl::Status BatchedPagedAttention(const TensorView& q, const TensorView& cache,
                                     const TensorView& page_tables, const TensorView& q_start,
                                     const TensorView& kv_len, int64_t max_kv_len,
                                     const TensorView& mask, float scale,
                                     const TensorView& out) override;
  absl::Status PagedWrite(const TensorView& rows, const TensorView& positions, const TensorView& page_table,
                          const TensorView& cache) override;
  absl::Status PagedRead(const TensorView& cache, const TensorView& page_table, const TensorView& positions,
                         const TensorView& out) override;
  // One kernel (after the position checks ApplyRope and PagedWrite launch, shared with theirs in a
  // shared-checks scope); positions and slots of different index dtypes take the default's ops.
  absl::Status LatentRowsAndQueries(const TensorView& rows, const TensorView& norm_weight, float eps,
                                    const TensorView& q_pe, const TensorView& q_rot, const TensorView& positions,
                                    const TensorView& cos_sin, RopeStyle style, const TensorView& slots,
                                    const TensorView& slot_table, const TensorView& cache) override;
  // Any cache dtype of 2, 4 or 8 bytes (rows moved bit for bit); bad entries are reported by
  // Synchronize (cuda_backend_compact.cc).
  absl::Status CompactAccepted(const TensorView& cache, const TensorView& page_tables, const TensorView& cache_len,
                               const TensorView& accepted, const TensorView& num_accepted) override;
  absl::Status MoeRoute(const TensorView& logits, const TensorView* correction_bias, const MoeRoutingParams& params,
                        const TensorView& ids, const TensorView& weights) override;
  absl::Status MoeExperts(const TensorView& x, const TensorView& ids, const TensorView& weights,
                          std::span<const ExpertWeights> experts, const TensorView& out, bool accumulate) override;
  // x, weights and out f32; experts' scales f32 (FP8) or bf16 (INT4); see
  // cuda/cuda_backend_quantized_moe.cc for the kernels, numerics and device memory. A call with a new
  // expert set uploads its view table and a larger shape grows the workspace (never while the stream
  // is being captured).
  absl::Status QuantizedMoeExperts(const TensorView& x, const TensorView& ids, const TensorView& weights,
                                   std::span<const QuantizedExpertWeights> experts, const TensorView& out,
                                   bool accumulate) override;
  // The speculative step's ops (tree build: cuda/cuda_backend_tree.cc; verify and gathers: cuda/cuda_backend_verify.cc).
  int64_t TreeBuildWorkspaceBytes(const TreeBuildShape& shape) const override;
  absl::Status TreeBuildStep(const TreeBuildShape& shape, int step, const TensorView& logits,
                             const TensorView& d2t, const TensorView& workspace, const TensorView& errors,
                             const TensorView& frontier_tokens, const TensorView& frontier_parents) override;
  absl::Status TreeBuildFinalize(const TreeBuildShape& shape, const TensorView& workspace, const TensorView& errors,
                                 const TensorView& root_tokens, const TensorView& root_positions,
                                 const TensorView& tokens, const TensorView& parents, const TensorView& positions,
                                 const TensorView& mask) override;
  absl::Status TreeVerify(const TensorView& tokens, const TensorView& parents, const TensorView& logits,
                          const SamplingParams& sampling, const TensorView& seed_offset,
                          const TreeVerifyOutputs& out) override;
  absl::Status GatherRows(const TensorView& src, const TensorView& index, const TensorView& out,
                          int64_t groups = 1) override;
  absl::Status ExtendMaskRows(const TensorView& src, const TensorView& parent, const TensorView& column,
                              const TensorView& out) override;
  absl::Status Synchronize() override;
  // Shared checks (Backend::BeginSharedChecks; cuda/cuda_backend_attention.cc): inside a scope the
  // check kernels of ApplyRope, PagedWrite and BatchedLatentAttention[KeyMask] (and the batched
  // op's tile table) run once per distinct set of index tensors, each set with its own device flag.
  void BeginSharedChecks() override;
  absl::Status PrefetchWeights(std::span<const TensorView> weights) override;
  void EndSharedChecks() override;

  struct State;  // device handles and scratch, shared by the op implementation files

 private:
  explicit CudaBackend(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace eagle3::cuda
