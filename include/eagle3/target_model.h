// TargetModel: one tensor-parallel rank of a DeepSeek-V2-family target (docs/architecture.md).
//
// Each rank owns its weight shard, its copy of the paged latent KV cache (replicated on every rank,
// as MLA's single latent head is) and fixed workspaces sized at creation, and talks to the other
// ranks through a Communicator. Every rank calls Forward with the same inputs; all ranks return the
// same logits and taps. The model's math is written once here against the Backend op interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/communicator.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/dtype.h"
#include "eagle3/export.h"
#include "eagle3/hidden_state_tap.h"
#include "eagle3/model_rank_options.h"
#include "eagle3/tensor_view.h"
#include "eagle3/weight_load_stats.h"

namespace eagle3 {

enum class ResidualMode {
  kReplicated,    // every rank holds all tokens' residual; o_proj / MLP partials are all-reduced
  kTokenSharded,  // rank r holds tokens [r*T/tp, (r+1)*T/tp); reduce-scatter + all-gather
};

enum class AttentionPath {
  kAuto,          // absorbed when a sequence brings few new tokens (decode, tree verify)
  kAbsorbed,      // W_UK folded into q, attention over the latent cache, W_UV after
  kNonAbsorbed,   // k/v reconstructed from the latent cache through kv_b_proj
};

// The ModelRankOptions fields: rows are tokens; the KV cache is the latent cache; weight_dtype covers
// every Gemm weight (q_a/q_b or q_proj, kv_a, kv_b and the W_UK / W_UV taken from it, o_proj, dense,
// routed and shared expert gate_up/down, lm_head) and the embedding table; the MoE router
// (`gate.weight`) is kept in bf16 where weight_dtype is bf16 and the checkpoint stores it in bf16
// (the same values at half the bytes), else f32, and its logits are fp32 products of unrounded
// activations either way (FeedForwardBlock::RouterDtype, GemmOptions::keep_f32_activations);
// e_score_correction_bias stays f32 with the norms.
struct TargetModelOptions : ModelRankOptions {
  ResidualMode residual_mode = ResidualMode::kReplicated;
  AttentionPath attention_path = AttentionPath::kAuto;
  // Storage of the per-layer latent KV cache: kF32 or kBF16 (half the bytes a step reads and
  // writes; rounding as eagle3/backend.h's PagedWrite / LatentAttention describe, on every backend);
  // unset = kF32.
  std::optional<DType> kv_cache_dtype;
  // Create refuses max_context_len > the config's max_position_embeddings (InvalidArgument naming
  // both), since positions beyond it are outside what the model was trained for and its RoPE
  // scaling was fitted to (vLLM refuses them too). Set this to run such contexts anyway, knowingly
  // (eagle3-decode / eagle3-inspect --allow-long-context).
  bool allow_long_context = false;
  // Whether each attention's q_a (or plain q_proj) and kv_a, which read the same input, run as one
  // product over their weights stacked by rows where the two stack (same stored form; MlaBlock): one
  // weight stream instead of two. Off: two products, as the checkpoint lays them out. The outputs are the same up
  // to the backend's summation order.
  bool stack_attention_inputs = true;
  // The batched step asks the backend to prefetch weights into its cache (Backend::PrefetchWeights)
  // ahead of latency-bound work: during a layer's attention, its W_UV and o_proj and the weights
  // every token of its MLP reads (router, shared expert); once its MoE has routed, the next layer's
  // attention inputs. A hint: results are the same either way. Off by default: the V3 FP8 rank's
  // graphed steps measured slower with it (benchmarks/NOTES.md, issue 18, 2026-12-04).
  bool prefetch_weights = false;
};

// The weight dtype a model loads: `requested`, or else backend.preferred_weight_dtype(). Only kF32
// and kBF16 are valid (InvalidArgument naming `who`.weight_dtype otherwise), and the backend must
// run a Gemm with f32 activations and weights of that dtype (its refusal is returned, prefixed by
// `who`). Shared by TargetModel and DraftModel.
EAGLE3_API absl::StatusOr<DType> ResolveWeightDtype(std::optional<DType> requested, Backend& backend,
                                                    const std::string& who);

// One sequence of a Forward batch. Its cache holds `cache_len` tokens; the n new tokens are written
// to cache slots cache_len .. cache_len + n - 1.
struct SequenceInput {
  std::span<const int64_t> tokens;     // [n], each in [0, vocab_size)
  // [n] RoPE positions; empty = cache_len + i. With a tree mask, a node's position is its parent's
  // plus one (positions follow depth, slots follow order).
  std::span<const int64_t> positions;
  std::span<const int32_t> page_table;  // pages of this sequence, in order; covers cache_len + n
  int64_t cache_len = 0;
  // Empty = causal. Else [n, n] row-major: tree_mask[i * n + j] != 0 iff new token i attends new
  // token j. Must describe a forest in topological order: row i = {i} or row(parent) + {i} for a
  // parent earlier than i.
  std::span<const uint8_t> tree_mask;
  bool all_logits = false;  // logits for every new token (verify) or only the last (decode)
};

// Device-side inputs and outputs of a staged step, for a decode loop that keeps the whole step on
// the backend's device (eagle3/speculative_step.h): a set view replaces what Stage stages from the
// batch, or what Launch would copy into host staging. Every view is on the backend's device and
// contiguous; an empty (default) view keeps the host path. T = the staged batch's new tokens.
struct TargetStepIO {
  // [T] i64: the new tokens (a tree built on the device, say). The batch's tokens then only stand
  // in for them in the host checks; the caller guarantees ids in [0, vocab_size).
  TensorView tokens;
  // [T] i64 RoPE positions. The batch's positions (or cache_len + i) must bound them from above,
  // since capacity is checked against those.
  TensorView positions;
  // [T, M] u8: tree mask rows of the batched path (BatchedLatentAttention's tree_mask, row i of a
  // sequence over its own new tokens, M >= the largest n). The batch's tree masks are then unused.
  TensorView tree_mask;
  // [LogitRows(batch), vocab_size] f32: the logits stay here (Finish takes an empty logits view).
  TensorView logits;
  // [T, tap width] f32: the tapped states stay here (Finish takes an empty aux view).
  TensorView aux;
};

class EAGLE3_API TargetModel {
 public:
  // Loads rank `options.rank`'s shard from a HF checkpoint directory (config.json + safetensors).
  // `communicator` may be null when tp_size == 1; otherwise its size/rank must match. `backend`
  // must outlive the model. Every tensor is checked against the config's schema (message names the
  // tensor, the expected and the actual shape). Every layer's KV cache starts zeroed (a slot no step
  // wrote reads as zeros, never as whatever the allocation held). Capacities beyond the config's
  // max_position_embeddings are InvalidArgument unless options.allow_long_context; buffers the
  // options and config size are checked (overflow, and against HostMemoryLimit() for host buffers and
  // for a host backend's workspaces) before anything is allocated: ResourceExhausted naming the
  // options and keys behind the largest.
  static absl::StatusOr<std::unique_ptr<TargetModel>> Create(const std::string& checkpoint_dir,
                                                             const TargetModelOptions& options,
                                                             Communicator* communicator,
                                                             Backend* backend);
  ~TargetModel();

  const DeepseekV2Config& config() const;
  const TargetModelOptions& options() const;
  // How Create's weight loading spent its time (host reads, device copies).
  const WeightLoadStats& load_stats() const;

  // Layer `layer`'s latent KV cache, on the backend's device: [num_kv_pages, page_size,
  // kv_lora_rank + qk_rope_head_dim] in options().kv_cache_dtype (f32 unset), contiguous; position s
  // of a sequence lives at row [page_table[s / page_size]][s % page_size] (the normalized latent,
  // then the rotated k_pe). For engines that inspect or export KV; writing it directly bypasses
  // the model's checks. A default-constructed (null) view for a layer outside
  // [0, num_hidden_layers).
  TensorView kv_cache(int layer) const;

  // Rows of logits one Forward returns: sum over sequences of (all_logits ? n : 1).
  static int64_t LogitRows(std::span<const SequenceInput> batch);

  // Runs the new tokens of `batch` through the model, writes their latent KV rows, and returns
  // full-vocabulary logits for the requested rows (sequence order). When `tap` is given, also fills
  // `aux` with the tapped boundaries of every new token, concatenated in tap order (or, for
  // HiddenStateTap::FinalNormed, the final hidden after model.norm that the lm_head reads).
  //   logits: [LogitRows(batch), vocab_size], f32, host, contiguous
  //   aux:    [total new tokens, tap->width()], f32, host, contiguous (ignored without tap)
  // Inputs are validated before anything is written: bad token ids, positions, page tables, tree
  // masks or exhausted capacity are InvalidArgument / OutOfRange and leave the cache unchanged.
  absl::Status Forward(std::span<const SequenceInput> batch, const TensorView& logits,
                       const HiddenStateTap* tap = nullptr, const TensorView& aux = TensorView());

  // Forward in three steps, for engines that capture the device work of a step in a CUDA graph
  // (eagle3/cuda/cuda_graph.h) and replay it:
  //  - Stage validates `batch` (and `tap`) as Forward does and writes the step's inputs (token ids,
  //    positions, cache slots, page tables, lengths, tree masks) into the model's host staging
  //    buffers (Backend::staging_allocator(): pinned on CUDA). Host only: nothing is enqueued. The
  //    tap is copied; `batch` is read again by Launch only when StepIsCapturable() is false.
  //  - Launch enqueues the whole step on the backend: copies of the staging buffers to the device,
  //    every layer, the logits and taps into host staging. It never allocates, never waits and
  //    reads no staged value on the host, so a capture of it replays correctly for any later
  //    Stage with an equal StepSignature() (same sequence count, new tokens per sequence,
  //    all_logits flags, tree masks present or not, tap; the lengths, positions, tokens, pages and
  //    tree contents may all differ). Capture after one eager step of the same signature (first
  //    calls size the backends' scratch). Collectives must be capturable (NCCL; not host-staged).
  //  - Finish waits for the backend, reports deferred device errors, and copies the logits
  //    (and aux, with a tap) out. logits / aux as in Forward.
  // Forward(batch, logits, tap, aux) == Stage + Launch + Finish.
  absl::Status Stage(std::span<const SequenceInput> batch, const HiddenStateTap* tap = nullptr);
  // Stage with device-side inputs and outputs (see TargetStepIO; checked here, InvalidArgument naming
  // the view). A device tree_mask needs the batched path (every sequence absorbed). The views are
  // part of StepSignature(): a captured graph replays reading and writing the same buffers.
  absl::Status Stage(std::span<const SequenceInput> batch, const HiddenStateTap* tap, const TargetStepIO& io);
  absl::Status Launch();
  absl::Status Finish(const TensorView& logits, const TensorView& aux = TensorView());
  // What Launch's enqueued work depends on, for the staged batch (empty when nothing is staged).
  std::vector<int64_t> StepSignature() const;
  // Whether the staged batch takes the graph-capturable path: every sequence on the absorbed
  // attention path (decode and tree verify; AttentionPath::kAuto takes it up to 64 new tokens per
  // sequence), so attention is one BatchedLatentAttention per layer with its lengths on the device.
  bool StepIsCapturable() const;

  // After verification: keeps the new tokens at offsets `accepted` (strictly increasing, relative
  // to cache_len) and moves their KV rows to slots cache_len, cache_len + 1, ... in every layer. The
  // sequence's cache length becomes cache_len + accepted.size(); rows beyond it are dead.
  // Validated on the host (InvalidArgument, the cache unchanged), then one
  // Backend::CompactAccepted per layer; synchronizes. Offsets must also be below
  // max_tokens_per_forward (no row beyond is ever written by a Forward).
  absl::Status CommitAccepted(std::span<const int32_t> page_table, int64_t cache_len,
                              std::span<const int64_t> accepted);

  // CommitAccepted for a batch with every input on the backend's device: one
  // Backend::CompactAccepted per layer (see its contract in eagle3/backend.h). Sequence b keeps
  // its rows at offsets accepted[b][0 .. num_accepted[b]) from cache_len[b] and moves them to
  // cache_len[b], cache_len[b] + 1, ...; num_accepted[b] < 0 skips it (a sequence the device
  // verifier failed). Enqueues only: no allocation, no host synchronization and no host read of any
  // input, so it can be captured in a CUDA graph (with DeviceTreeVerifier::Launch, whose
  // commit_offsets() / commit_counts() are accepted / num_accepted for trees verified at cache_len).
  // Shape errors are returned; bad entries are InvalidArgument naming the sequence and entry, from
  // this call on the CPU backend and from the next Synchronize (the next Finish or CommitAccepted)
  // on a device backend. Either way every layer is treated alike: a bad sequence is left unwritten
  // in all of them, the others are compacted in all of them.
  //   page_tables: [B, P], i32, row-strided, entries in [0, num_kv_pages)
  //   cache_len:   [B], i32 or i64
  //   accepted:    [B, max_nodes], i32, row-strided: offsets strictly increasing in [0, max_nodes)
  //   num_accepted: [B], i32, <= max_nodes
  absl::Status CommitAcceptedOnDevice(const TensorView& page_tables, const TensorView& cache_len,
                                      const TensorView& accepted, const TensorView& num_accepted);

 private:
  struct Impl;
  explicit TargetModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace eagle3
