#include "eagle3/target_model.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batch_staging.h"
#include "feed_forward_block.h"
#include "mla_block.h"
#include "rank_collectives.h"
#include "view_slices.h"
#include "vocab_parallel_head.h"
#include "weight_loader.h"
#include "zero_fill.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/detail/host_budget.h"
#include "eagle3/mla_attention_config.h"
#include "eagle3/status.h"
#include "eagle3/tensor.h"

namespace eagle3 {
namespace {

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

std::string Str(int64_t v) { return std::to_string(v); }

// Valid storage dtypes of weights and of the latent cache; `what` names the option.
absl::Status CheckStorageDtype(DType dtype, const std::string& what) {
  if (dtype == DType::kF32 || dtype == DType::kBF16) return absl::OkStatus();
  return absl::InvalidArgumentError(what + " is " + std::string(DTypeName(dtype)) + "; only f32 and bf16 are supported");
}

}  // namespace

absl::StatusOr<DType> ResolveWeightDtype(std::optional<DType> requested, Backend& backend, const std::string& who) {
  const DType dtype = requested.value_or(backend.preferred_weight_dtype());
  EAGLE3_RETURN_IF_ERROR(CheckStorageDtype(dtype, who + ": weight_dtype"));
  // Probe: the backend runs (or refuses) the Gemm every weight takes part in, before any loading.
  EAGLE3_ASSIGN_OR_RETURN(Tensor a, Tensor::Empty(DType::kF32, Shape{1, 1}, backend.allocator()));
  EAGLE3_ASSIGN_OR_RETURN(Tensor b, Tensor::Empty(dtype, Shape{1, 1}, backend.allocator()));
  EAGLE3_ASSIGN_OR_RETURN(Tensor c, Tensor::Empty(DType::kF32, Shape{1, 1}, backend.allocator()));
  if (const absl::Status probe = backend.Gemm(a, b, c, kWeightsGemm); !probe.ok()) {
    return absl::Status(probe.code(), who + ": weight_dtype " + std::string(DTypeName(dtype)) +
                                          " is not supported by this backend (" + std::string(probe.message()) +
                                          ")");
  }
  // The probe's buffers are freed when this returns: let the backend finish with them first.
  EAGLE3_RETURN_IF_ERROR(backend.Synchronize());
  return dtype;
}

struct TargetModel::Impl {
  // A decoder layer: input_layernorm, attention, post_attention_layernorm, feed-forward; its latent
  // KV cache.
  struct Layer {
    Tensor input_ln, post_ln;
    MlaBlock attention;
    FeedForwardBlock mlp;
    Tensor cache;  // [num_pages, page_size, W]
    // What the batched step prefetches (TargetModelOptions::prefetch_weights) during the attention
    // (MlaBatchedStep::prefetch) and once the MoE has routed (FeedForwardBlock::Forward); empty
    // when off.
    std::vector<TensorView> attention_prefetch, mlp_prefetch;
  };

  DeepseekV2Config config;
  TargetModelOptions options;
  Communicator* comm = nullptr;
  Backend* backend = nullptr;
  std::unique_ptr<Checkpoint> checkpoint;
  DType weight_dtype = DType::kF32;  // resolved options.weight_dtype
  DType cache_dtype = DType::kF32;   // resolved options.kv_cache_dtype

  MlaAttentionConfig attention;  // every layer's (MlaAttentionConfig::ForTarget)
  MlaRankDims mla;               // its dims on this rank
  FeedForwardConfig ffn;         // the dense and MoE shapes every layer's MLP takes one of
  int64_t vocab_shard = 0;       // padded vocab / tp
  int64_t inter_max = 0;         // widest MLP slice on this rank (dense, shared)

  Tensor embed, final_ln, lm_head;  // lm_head empty when tied to embed
  std::vector<Layer> layers;

  // Workspaces (backend device), sized at creation. The layers share the blocks' scratch.
  MlaWorkspace mla_ws;
  FeedForwardWorkspace ffn_ws;
  Tensor r, h, h_full, partial, local, zeros;
  Tensor lm_in, logits_shard, logits_all, tap_rows;
  Tensor tokens, positions, slots, page_table;
  Tensor commit_i32, commit_len;  // CommitAccepted's inputs: [num_accepted, accepted...], [cache_len]

  // The staged step (Stage -> Launch -> Finish). Launch's device work depends only on what
  // StepSignature() lists; the values it reads come from the staging buffers.
  struct Step {
    bool staged = false;
    bool batched = false;   // every sequence absorbed: one BatchedLatentAttention per layer
    bool has_tree = false;  // batched: tree_mask rows staged (else causal)
    std::optional<HiddenStateTap> tap;
    int64_t t = 0, out_rows = 0;
    std::vector<int64_t> n;            // new tokens per sequence
    std::vector<uint8_t> all_logits;   // per sequence
    std::span<const SequenceInput> batch;  // per-sequence path only: read again by Launch
    TargetStepIO io;                       // device-side inputs / outputs (empty views: host path)
  } step;
  // Host staging (backend->staging_allocator(): pinned on CUDA) written by Stage and read by the
  // copies Launch enqueues; outputs written by Launch's copies and read by Finish.
  Tensor st_tokens, st_positions, st_slots, st_tables, st_starts, st_lens, st_mask, st_logits, st_aux;
  int64_t staging_generation = 0;  // bumped when st_aux grows (a captured graph then goes stale)
  // Device side of the batched path.
  Tensor d_tables, d_starts, d_lens, d_tree_mask, slot_iota;
  int64_t max_pages = 0;  // page entries kept per sequence: ceil(max_context_len / page_size)

  absl::StatusOr<Tensor> Alloc(DType dtype, const Shape& shape) {
    return Tensor::Empty(dtype, shape, backend->allocator());
  }

  absl::Status Upload(const TensorView& host, const TensorView& device) {
    return backend->Copy(host, device);
  }

  absl::Status LoadWeights();
  WeightLoadStats load_stats;  // LoadWeights' times
  absl::Status CheckBuffersFit() const;
  absl::Status AllocateWorkspaces();

  RankCollectives Ranks() const { return RankCollectives{options.tp_size, comm, backend}; }

  absl::StatusOr<Tensor> AllocStaging(DType dtype, const Shape& shape) {
    return Tensor::Empty(dtype, shape, backend->staging_allocator());
  }
  bool Absorbed(int64_t n) const { return MlaAbsorbed(options.attention_path, n); }

  absl::Status ValidateBatch(std::span<const SequenceInput> batch, const HiddenStateTap* tap) const;
  absl::Status ValidateOutputs(const TensorView& logits, const TensorView& aux) const;
  absl::Status Attention(int layer, const TensorView& x);
  // The tap's copy of boundary `boundary` (the residual stream r, gathered in the token-sharded
  // mode), when the step's tap holds it.
  absl::Status Capture(int boundary, int64_t t);
  // The tap's copy of `full` ([t, H], every token's row), when the step's tap holds `boundary`.
  absl::Status CaptureRows(int boundary, const TensorView& full);
  absl::Status Stage(std::span<const SequenceInput> batch, const HiddenStateTap* tap, const TargetStepIO& io);
  absl::Status CheckIO(const TargetStepIO& io) const;
  absl::Status Launch();
  absl::Status Finish(const TensorView& logits, const TensorView& aux);
  std::vector<int64_t> Signature() const;
};

absl::Status TargetModel::Impl::LoadWeights() {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  // How each weight is stored (quantized ones with their scales), from config.json's
  // quantization_config: the target's alone, never the draft's.
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  // Every tensor is checked before any is loaded, so a bad checkpoint fails fast and completely.
  for (size_t i = 0; i < specs.size(); ++i) {
    EAGLE3_RETURN_IF_ERROR(CheckStoredWeight(*checkpoint, specs[i], forms[i], config.quantization));
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoUnknownTensors(*checkpoint, config, specs));
  load_stats.check_seconds = since(start);
  WeightLoader loader(*checkpoint, config.quantization, specs, forms, options.tp_size, options.rank, *backend,
                      WeightLoader::Checks::kSchemaChecked);
  loader.set_keep_quantized(options.keep_quantized);
  loader.set_stats(&load_stats);
  // Gemm weights and the embedding in weight_dtype; norms (and, in FeedForwardBlock, the router's
  // bias) in f32, the router as FeedForwardBlock::RouterDtype says.
  EAGLE3_ASSIGN_OR_RETURN(embed, loader.Load(DeepseekEmbeddingName(config), weight_dtype));
  layers.reserve(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string prefix = config.tensor_prefix + "model.layers." + Str(l) + ".";
    EAGLE3_ASSIGN_OR_RETURN(Tensor input_ln, loader.Load(prefix + "input_layernorm.weight", DType::kF32));
    EAGLE3_ASSIGN_OR_RETURN(Tensor post_ln, loader.Load(prefix + "post_attention_layernorm.weight", DType::kF32));
    EAGLE3_ASSIGN_OR_RETURN(MlaBlock block,
                            MlaBlock::Load(attention, options.tp_size, prefix + "self_attn.", weight_dtype, loader,
                                           options.stack_attention_inputs
                                               ? MlaBlock::InputProjections::kStackWherePossible
                                               : MlaBlock::InputProjections::kApart));
    EAGLE3_ASSIGN_OR_RETURN(
        FeedForwardBlock mlp,
        FeedForwardBlock::Load(FeedForwardConfig::ForTargetLayer(config, l), prefix + "mlp.", weight_dtype, loader));
    EAGLE3_ASSIGN_OR_RETURN(Tensor cache, Alloc(cache_dtype, Shape{options.num_kv_pages, options.page_size, mla.width}));
    EAGLE3_RETURN_IF_ERROR(ZeroFill(*backend, cache));
    layers.push_back(Layer{std::move(input_ln), std::move(post_ln), std::move(block), std::move(mlp), std::move(cache), {}, {}});
  }
  if (options.prefetch_weights) {
    for (size_t l = 0; l < layers.size(); ++l) {
      layers[l].attention.AppendOutputWeights(layers[l].attention_prefetch);
      layers[l].mlp.AppendTokenWeights(layers[l].attention_prefetch);
      if (l + 1 < layers.size()) layers[l + 1].attention.AppendInputWeights(layers[l].mlp_prefetch);
    }
  }
  EAGLE3_ASSIGN_OR_RETURN(final_ln, loader.Load(config.tensor_prefix + "model.norm.weight", DType::kF32));
  if (!config.tie_word_embeddings) {
    EAGLE3_ASSIGN_OR_RETURN(lm_head, loader.Load(config.tensor_prefix + "lm_head.weight", weight_dtype));
  }
  // The weights' transfers overlap the reads (no synchronize per tensor): the load ends when the
  // last one has arrived, and a failed transfer is reported here.
  EAGLE3_RETURN_IF_ERROR(backend->Synchronize());
  load_stats.total_seconds = since(start);
  return absl::OkStatus();
}

absl::Status TargetModel::Impl::AllocateWorkspaces() {
  const int64_t t_max = options.max_tokens_per_forward;
  const int64_t t_pad = RoundUp(t_max, options.tp_size);
  const int64_t s_max = options.max_context_len;
  const int64_t h_dim = config.hidden_size;
  const bool sharded = options.residual_mode == ResidualMode::kTokenSharded;
  const int64_t t_res = sharded ? t_pad / options.tp_size : t_max;
  EAGLE3_ASSIGN_OR_RETURN(r, Alloc(DType::kF32, Shape{t_res, h_dim}));
  EAGLE3_ASSIGN_OR_RETURN(h, Alloc(DType::kF32, Shape{t_res, h_dim}));
  EAGLE3_ASSIGN_OR_RETURN(local, Alloc(DType::kF32, Shape{t_res, h_dim}));
  EAGLE3_ASSIGN_OR_RETURN(h_full, Alloc(DType::kF32, Shape{t_pad, h_dim}));
  EAGLE3_ASSIGN_OR_RETURN(partial, Alloc(DType::kF32, Shape{t_pad, h_dim}));
  EAGLE3_ASSIGN_OR_RETURN(tap_rows, Alloc(DType::kF32, Shape{t_pad, h_dim}));
  {
    EAGLE3_ASSIGN_OR_RETURN(Tensor host_zeros, Tensor::Zeros(DType::kF32, Shape{options.tp_size, h_dim}));
    EAGLE3_ASSIGN_OR_RETURN(zeros, Alloc(DType::kF32, host_zeros.shape()));
    EAGLE3_RETURN_IF_ERROR(Upload(host_zeros, zeros));
  }
  EAGLE3_ASSIGN_OR_RETURN(mla_ws, MlaWorkspace::Create(attention, options.tp_size, t_max, s_max, *backend, "TargetModel"));
  EAGLE3_ASSIGN_OR_RETURN(ffn_ws, FeedForwardWorkspace::Create(ffn, options.tp_size, t_max, *backend));
  EAGLE3_ASSIGN_OR_RETURN(lm_in, Alloc(DType::kF32, Shape{t_max, h_dim}));
  EAGLE3_ASSIGN_OR_RETURN(logits_shard, Alloc(DType::kF32, Shape{t_max, vocab_shard}));
  EAGLE3_ASSIGN_OR_RETURN(logits_all, Alloc(DType::kF32, Shape{options.tp_size * t_max, vocab_shard}));
  EAGLE3_ASSIGN_OR_RETURN(tokens, Alloc(DType::kI64, Shape{t_pad}));
  EAGLE3_ASSIGN_OR_RETURN(positions, Alloc(DType::kI64, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(slots, Alloc(DType::kI64, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(page_table, Alloc(DType::kI32, Shape{options.num_kv_pages}));
  EAGLE3_ASSIGN_OR_RETURN(commit_i32, Alloc(DType::kI32, Shape{t_max + 1}));
  EAGLE3_ASSIGN_OR_RETURN(commit_len, Alloc(DType::kI64, Shape{1}));

  // Staging and the batched path's device metadata. Sequences <= tokens, so t_max bounds both.
  max_pages = (s_max + options.page_size - 1) / options.page_size;
  EAGLE3_ASSIGN_OR_RETURN(st_tokens, AllocStaging(DType::kI64, Shape{t_pad}));
  EAGLE3_ASSIGN_OR_RETURN(st_positions, AllocStaging(DType::kI64, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(st_slots, AllocStaging(DType::kI64, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(st_tables, AllocStaging(DType::kI32, Shape{t_max, max_pages}));
  EAGLE3_ASSIGN_OR_RETURN(st_starts, AllocStaging(DType::kI32, Shape{t_max + 1}));
  EAGLE3_ASSIGN_OR_RETURN(st_lens, AllocStaging(DType::kI32, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(st_mask, AllocStaging(DType::kU8, Shape{t_max, t_max}));
  EAGLE3_ASSIGN_OR_RETURN(st_logits, AllocStaging(DType::kF32, Shape{t_max, config.vocab_size}));
  // Room for the three taps of an EAGLE-3 draft; a wider tap regrows it in Stage.
  EAGLE3_ASSIGN_OR_RETURN(st_aux, AllocStaging(DType::kF32, Shape{t_max, 3 * h_dim}));
  EAGLE3_ASSIGN_OR_RETURN(d_tables, Alloc(DType::kI32, st_tables.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_starts, Alloc(DType::kI32, st_starts.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_lens, Alloc(DType::kI32, st_lens.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_tree_mask, Alloc(DType::kU8, st_mask.shape()));
  // The batched path writes KV rows through a flat [num_pages * page_size, 1, W] view of the cache
  // whose page table is the identity.
  EAGLE3_ASSIGN_OR_RETURN(slot_iota, DeviceIota(options.num_kv_pages * options.page_size, *backend));
  return absl::OkStatus();
}

absl::Status TargetModel::Impl::ValidateBatch(std::span<const SequenceInput> batch,
                                              const HiddenStateTap* tap) const {
  if (batch.empty()) return absl::InvalidArgumentError("Forward: empty batch");
  int64_t total = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const SequenceInput& in = batch[s];
    const std::string seq = "sequence " + Str(static_cast<int64_t>(s));
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (n == 0) return absl::InvalidArgumentError("Forward: " + seq + " has no new tokens");
    total += n;
    for (int64_t i = 0; i < n; ++i) {
      if (in.tokens[i] < 0 || in.tokens[i] >= config.vocab_size) {
        return absl::InvalidArgumentError("Forward: " + seq + " token " + Str(i) + " = " + Str(in.tokens[i]) +
                                          " is outside the vocabulary [0, " + Str(config.vocab_size) + ")");
      }
    }
    if (!in.positions.empty() && static_cast<int64_t>(in.positions.size()) != n) {
      return absl::InvalidArgumentError("Forward: " + seq + " has " + Str(static_cast<int64_t>(in.positions.size())) +
                                        " positions for " + Str(n) + " tokens");
    }
    if (in.cache_len < 0) {
      return absl::InvalidArgumentError("Forward: " + seq + " cache_len " + Str(in.cache_len) + " < 0");
    }
    const int64_t end = in.cache_len + n;
    const int64_t capacity = static_cast<int64_t>(in.page_table.size()) * options.page_size;
    if (end > options.max_context_len || end > capacity) {
      return absl::OutOfRangeError("Forward: KV capacity exhausted for " + seq + ": " + Str(in.cache_len) +
                                   " cached + " + Str(n) + " new tokens need " + Str(end) + " slots; its " +
                                   Str(static_cast<int64_t>(in.page_table.size())) + " pages of " +
                                   Str(options.page_size) + " hold " + Str(capacity) +
                                   " and max_context_len is " + Str(options.max_context_len));
    }
    // The pages the step uses; a sequence needing more pages than the cache has lists one twice.
    const int64_t used_pages = (end + options.page_size - 1) / options.page_size;
    if (used_pages > options.num_kv_pages) {
      return absl::InvalidArgumentError("Forward: " + seq + " needs " + Str(used_pages) + " pages for " + Str(end) +
                                        " tokens, more than the cache's num_kv_pages = " +
                                        Str(options.num_kv_pages) + " (its page table must repeat a page)");
    }
    for (size_t p = 0; p < in.page_table.size(); ++p) {
      if (in.page_table[p] < 0 || in.page_table[p] >= options.num_kv_pages) {
        return absl::InvalidArgumentError("Forward: " + seq + " page_table[" + Str(static_cast<int64_t>(p)) +
                                          "] = " + Str(in.page_table[p]) + " is not a page of this cache [0, " +
                                          Str(options.num_kv_pages) + ")");
      }
    }
    auto position = [&](int64_t i) { return in.positions.empty() ? in.cache_len + i : in.positions[i]; };
    for (int64_t i = 0; i < n; ++i) {
      if (position(i) < 0 || position(i) >= options.max_context_len) {
        return absl::InvalidArgumentError("Forward: " + seq + " position " + Str(i) + " = " + Str(position(i)) +
                                          " is outside [0, max_context_len " + Str(options.max_context_len) + ")");
      }
    }
    if (!in.tree_mask.empty()) {
      if (static_cast<int64_t>(in.tree_mask.size()) != n * n) {
        return absl::InvalidArgumentError("Forward: " + seq + " tree_mask has " +
                                          Str(static_cast<int64_t>(in.tree_mask.size())) + " entries, expected " +
                                          Str(n) + " x " + Str(n));
      }
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* row = &in.tree_mask[static_cast<size_t>(i * n)];
        if (row[i] == 0) {
          return absl::InvalidArgumentError("Forward: " + seq + " tree_mask row " + Str(i) + " does not attend to itself");
        }
        for (int64_t j = i + 1; j < n; ++j) {
          if (row[j] != 0) {
            return absl::InvalidArgumentError("Forward: " + seq + " tree_mask: node " + Str(i) + " attends node " +
                                              Str(j) + ", which comes later; parents must precede children");
          }
        }
        int64_t parent = -1;
        for (int64_t j = i - 1; j >= 0 && parent < 0; --j) parent = row[j] != 0 ? j : -1;
        for (int64_t j = 0; j < i; ++j) {
          const bool expected = j == parent || (parent >= 0 && j < parent &&
                                                in.tree_mask[static_cast<size_t>(parent * n + j)] != 0);
          if ((row[j] != 0) != expected) {
            return absl::InvalidArgumentError(
                "Forward: " + seq + " tree_mask row " + Str(i) + " is not its parent's row plus itself (node " +
                Str(i) + ", parent " + Str(parent) + ", column " + Str(j) + ")");
          }
        }
        if (parent >= 0 && position(i) != position(parent) + 1) {
          return absl::InvalidArgumentError("Forward: " + seq + " position of tree node " + Str(i) + " is " +
                                            Str(position(i)) + ", expected its parent's (" + Str(parent) + ") + 1 = " +
                                            Str(position(parent) + 1));
        }
      }
    }
  }
  if (total > options.max_tokens_per_forward) {
    return absl::OutOfRangeError("Forward: " + Str(total) + " new tokens exceed max_tokens_per_forward " +
                                 Str(options.max_tokens_per_forward));
  }
  if (tap != nullptr &&
      (tap->num_layers() != config.num_hidden_layers || tap->hidden_size() != config.hidden_size)) {
    return absl::InvalidArgumentError("Forward: the tap was made for " + Str(tap->num_layers()) + " layers x " +
                                      Str(tap->hidden_size()) + ", the target has " +
                                      Str(config.num_hidden_layers) + " x " + Str(config.hidden_size));
  }
  return absl::OkStatus();
}

// The outputs Finish fills, against the staged step.
absl::Status TargetModel::Impl::ValidateOutputs(const TensorView& logits, const TensorView& aux) const {
  if (!step.io.logits.empty() || !step.io.aux.empty()) {
    if ((!step.io.logits.empty() && !logits.empty()) || (!step.io.aux.empty() && step.tap.has_value() && !aux.empty())) {
      return absl::InvalidArgumentError(
          "Finish: the staged step leaves its logits / aux on the device (TargetStepIO); pass empty views for them");
    }
  }
  if (step.io.logits.empty() && (logits.rank() != 2 || logits.dim(0) != step.out_rows || logits.dim(1) != config.vocab_size ||
      logits.dtype() != DType::kF32 || !logits.device().is_cpu() || !logits.is_contiguous())) {
    return absl::InvalidArgumentError("Forward: logits must be f32[" + Str(step.out_rows) + ", " +
                                      Str(config.vocab_size) + "] contiguous on the host, got " + logits.ToString());
  }
  if (step.tap.has_value() && step.io.aux.empty()) {
    const int64_t width = step.tap->width();
    if (aux.rank() != 2 || aux.dim(0) != step.t || aux.dim(1) != width || aux.dtype() != DType::kF32 ||
        !aux.device().is_cpu() || !aux.is_contiguous()) {
      return absl::InvalidArgumentError("Forward: aux must be f32[" + Str(step.t) + ", " + Str(width) +
                                        "] contiguous on the host, got " + aux.ToString());
    }
  }
  return absl::OkStatus();
}

absl::Status TargetModel::Impl::Capture(int boundary, int64_t t) {
  if (!step.tap.has_value() || step.tap->SlotOf(boundary) < 0) return absl::OkStatus();
  TensorView full = Rows(r, 0, t);
  if (options.residual_mode == ResidualMode::kTokenSharded) {
    // The residual is token-sharded: the tap must see every token's full stream, so gather it.
    const int64_t t_pad = RoundUp(t, options.tp_size);
    EAGLE3_RETURN_IF_ERROR(Ranks().AllGather(Rows(r, 0, t_pad / options.tp_size), Rows(tap_rows, 0, t_pad)));
    full = Rows(tap_rows, 0, t);
  }
  return CaptureRows(boundary, full);
}

absl::Status TargetModel::Impl::CaptureRows(int boundary, const TensorView& full) {
  if (!step.tap.has_value()) return absl::OkStatus();
  const int slot = step.tap->SlotOf(boundary);
  if (slot < 0) return absl::OkStatus();
  const int64_t hd = config.hidden_size, t = full.dim(0);
  const TensorView aux = !step.io.aux.empty()
                             ? step.io.aux
                             : TensorView(st_aux.data(), DType::kF32, Shape{t, step.tap->width()}, st_aux.device());
  return backend->Copy(full, Block(aux, 0, t, slot * hd, hd));
}

// Layer `layer`'s attention over x (the normed hidden of every token), its o_proj partial sums into
// `partial`: the batched path when the step takes it, else sequence by sequence.
absl::Status TargetModel::Impl::Attention(int layer, const TensorView& x) {
  const Layer& L = layers[static_cast<size_t>(layer)];
  const int64_t t = x.dim(0);
  const TensorView pos_t = step.io.positions.empty() ? Rows(positions, 0, t) : step.io.positions;
  const TensorView out = Rows(partial, 0, t);
  if (step.batched) {
    const int64_t b = static_cast<int64_t>(step.n.size());
    MlaBatchedStep batched;
    batched.positions = pos_t;
    batched.slots = Rows(slots, 0, t);
    batched.slot_iota = slot_iota;
    batched.page_tables = Rows(d_tables, 0, b);
    batched.q_start = Rows(d_starts, 0, b + 1);
    batched.kv_len = Rows(d_lens, 0, b);
    batched.max_kv_len = options.max_context_len;
    batched.tree_mask = !step.io.tree_mask.empty() ? step.io.tree_mask
                        : step.has_tree            ? Rows(d_tree_mask, 0, t)
                                                   : TensorView();
    batched.prefetch = L.attention_prefetch;
    return L.attention.ForwardBatched(x, batched, L.cache, mla_ws, out);
  }
  MlaSequenceStep per_sequence;
  per_sequence.positions = pos_t;
  per_sequence.slots = Rows(slots, 0, t);
  per_sequence.sequences = step.batch;
  per_sequence.page_size = options.page_size;
  per_sequence.path = options.attention_path;
  per_sequence.page_table = page_table;
  return L.attention.ForwardPerSequence(x, per_sequence, L.cache, mla_ws, out);
}

absl::Status TargetModel::Impl::CheckIO(const TargetStepIO& io) const {
  const std::string who = "TargetStepIO";
  const Device dev = backend->device();
  const int64_t t = step.t;
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "tokens", io.tokens, DType::kI64, Shape{t}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "positions", io.positions, DType::kI64, Shape{t}, dev));
  if (!io.tree_mask.empty()) {
    const int64_t n_max = *std::max_element(step.n.begin(), step.n.end());
    const int64_t m = io.tree_mask.rank() == 2 ? std::max(io.tree_mask.dim(1), n_max) : n_max;
    EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "tree_mask", io.tree_mask, DType::kU8, Shape{t, m}, dev));
    if (!step.batched) {
      return absl::InvalidArgumentError(
          "TargetStepIO.tree_mask needs the batched path (every sequence absorbed: at most " +
          Str(kMlaAbsorbedMaxNewTokens) + " new tokens each under AttentionPath::kAuto)");
    }
  }
  EAGLE3_RETURN_IF_ERROR(
      CheckStepView(who, "logits", io.logits, DType::kF32, Shape{step.out_rows, config.vocab_size}, dev));
  if (!io.aux.empty()) {
    if (!step.tap.has_value()) return absl::InvalidArgumentError("TargetStepIO.aux is set but the step has no tap");
    EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "aux", io.aux, DType::kF32, Shape{t, step.tap->width()}, dev));
  }
  return absl::OkStatus();
}

absl::Status TargetModel::Impl::Stage(std::span<const SequenceInput> batch, const HiddenStateTap* tap,
                                      const TargetStepIO& io) {
  step.staged = false;
  EAGLE3_RETURN_IF_ERROR(ValidateBatch(batch, tap));
  if (tap != nullptr && tap->width() > st_aux.dim(1)) {
    // A wider tap than the staging holds: regrow it (host only; graphs captured before go stale,
    // which the signature shows).
    EAGLE3_ASSIGN_OR_RETURN(st_aux, AllocStaging(DType::kF32, Shape{options.max_tokens_per_forward, tap->width()}));
    ++staging_generation;
  }
  Step& st = step;
  st.tap.reset();
  if (tap != nullptr) st.tap = *tap;
  st.batch = batch;
  st.n.clear();
  st.all_logits.clear();
  st.batched = true;
  st.has_tree = false;
  st.out_rows = LogitRows(batch);
  for (const SequenceInput& in : batch) {
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    st.n.push_back(n);
    st.all_logits.push_back(in.all_logits ? 1 : 0);
    st.batched = st.batched && Absorbed(n);
    st.has_tree = st.has_tree || !in.tree_mask.empty();
  }
  // Token ids, RoPE positions and cache slots of the concatenated batch: slots are positions in the
  // sequence on the per-sequence path, rows of the flat cache on the batched path.
  int64_t* tok = st_tokens.data_as<int64_t>();
  int64_t* pos = st_positions.data_as<int64_t>();
  int64_t* slot = st_slots.data_as<int64_t>();
  int64_t t = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceInput& in = batch[b];
    const int64_t n = st.n[b];
    if (st.batched) {
      StageSequence(in.page_table, static_cast<int64_t>(b), t, in.cache_len + n, max_pages, st_tables, st_starts,
                    st_lens);
      if (st.has_tree) {
        // Rows [t, t + n) of the [T, M] mask: the sequence's tree, or causal when it has none.
        for (int64_t i = 0; i < n; ++i) {
          uint8_t* row = st_mask.data_as<uint8_t>() + (t + i) * st_mask.dim(1);
          for (int64_t j = 0; j < n; ++j) {
            row[j] = in.tree_mask.empty() ? (j <= i ? 1 : 0) : (in.tree_mask[static_cast<size_t>(i * n + j)] != 0);
          }
        }
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      tok[t + i] = in.tokens[static_cast<size_t>(i)];
      pos[t + i] = in.positions.empty() ? in.cache_len + i : in.positions[static_cast<size_t>(i)];
      const int64_t p = in.cache_len + i;
      slot[t + i] = st.batched ? in.page_table[static_cast<size_t>(p / options.page_size)] * options.page_size +
                                     p % options.page_size
                               : p;
    }
    t += n;
  }
  st.t = t;
  if (st.batched) st_starts.data_as<int32_t>()[batch.size()] = static_cast<int32_t>(t);
  st.io = TargetStepIO();
  EAGLE3_RETURN_IF_ERROR(CheckIO(io));
  st.io = io;
  st.has_tree = st.has_tree || !io.tree_mask.empty();
  const int64_t t_pad = options.residual_mode == ResidualMode::kTokenSharded ? RoundUp(t, options.tp_size) : t;
  std::fill(tok + t, tok + t_pad, int64_t{0});  // padding rows look up token 0; never read
  st.staged = true;
  return absl::OkStatus();
}

std::vector<int64_t> TargetModel::Impl::Signature() const {
  if (!step.staged) return {};
  std::vector<int64_t> sig = {staging_generation, step.batched, step.has_tree, static_cast<int64_t>(step.n.size())};
  sig.insert(sig.end(), step.n.begin(), step.n.end());
  sig.insert(sig.end(), step.all_logits.begin(), step.all_logits.end());
  if (step.tap.has_value()) {
    for (int b = 0; b <= step.tap->final_norm_boundary(); ++b) sig.push_back(step.tap->SlotOf(b));
  }
  for (const TensorView* v : {&step.io.tokens, &step.io.positions, &step.io.tree_mask, &step.io.logits, &step.io.aux}) {
    sig.push_back(ViewAddress(*v));
  }
  return sig;
}

absl::Status TargetModel::Impl::Launch() {
  if (!step.staged) return absl::FailedPreconditionError("Launch: no batch is staged (call Stage first)");
  const bool sharded = options.residual_mode == ResidualMode::kTokenSharded;
  const int tp = options.tp_size;
  const float eps = static_cast<float>(config.rms_norm_eps);
  const int64_t t = step.t;
  const int64_t t_pad = sharded ? RoundUp(t, tp) : t;
  const int64_t t_local = sharded ? t_pad / tp : t;
  EAGLE3_RETURN_IF_ERROR(Upload(Rows(st_tokens, 0, t_pad), Rows(tokens, 0, t_pad)));
  // Device tokens replace the staged ones (padding rows of the sharded mode stay staged zeros).
  if (!step.io.tokens.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(step.io.tokens, Rows(tokens, 0, t)));
  if (step.io.positions.empty()) EAGLE3_RETURN_IF_ERROR(Upload(Rows(st_positions, 0, t), Rows(positions, 0, t)));
  EAGLE3_RETURN_IF_ERROR(Upload(Rows(st_slots, 0, t), Rows(slots, 0, t)));
  if (step.batched) {
    const int64_t b = static_cast<int64_t>(step.n.size());
    EAGLE3_RETURN_IF_ERROR(Upload(Rows(st_tables, 0, b), Rows(d_tables, 0, b)));
    EAGLE3_RETURN_IF_ERROR(Upload(Rows(st_starts, 0, b + 1), Rows(d_starts, 0, b + 1)));
    EAGLE3_RETURN_IF_ERROR(Upload(Rows(st_lens, 0, b), Rows(d_lens, 0, b)));
    if (step.has_tree && step.io.tree_mask.empty()) {
      EAGLE3_RETURN_IF_ERROR(Upload(Rows(st_mask, 0, t), Rows(d_tree_mask, 0, t)));
    }
  }
  // Reduces the partial sums of `partial` (rows [0, t)) into `dst`: all-reduce, or reduce-scatter to
  // this rank's tokens (padding rows zeroed first so they stay zero).
  auto reduce = [&](TensorView* dst) -> absl::Status {
    if (!sharded) {
      *dst = Rows(partial, 0, t);
      return Ranks().AllReduce(*dst);
    }
    if (t_pad > t) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(zeros, 0, t_pad - t), Rows(partial, t, t_pad - t)));
    *dst = Rows(local, 0, t_local);
    return Ranks().ReduceScatter(Rows(partial, 0, t_pad), *dst);
  };
  // The normed hidden of every token, as attention and the MLP need it.
  auto full_input = [&]() -> absl::StatusOr<TensorView> {
    if (!sharded) return Rows(h, 0, t);
    EAGLE3_RETURN_IF_ERROR(Ranks().AllGather(Rows(h, 0, t_local), Rows(h_full, 0, t_pad)));
    return Rows(h_full, 0, t);
  };

  const int64_t vocab_start = options.rank * vocab_shard;
  const int64_t t_embed = sharded ? t_pad : t;
  EAGLE3_RETURN_IF_ERROR(backend->EmbeddingLookup(Rows(tokens, 0, t_embed), embed, vocab_start, Rows(partial, 0, t_embed)));
  TensorView reduced;
  EAGLE3_RETURN_IF_ERROR(reduce(&reduced));
  const TensorView r_t = Rows(r, 0, t_local), h_t = Rows(h, 0, t_local);
  EAGLE3_RETURN_IF_ERROR(backend->Copy(reduced, r_t));
  EAGLE3_RETURN_IF_ERROR(Capture(0, t));
  EAGLE3_RETURN_IF_ERROR(backend->RmsNorm(r_t, layers[0].input_ln, eps, h_t));

  // Every layer's batched attention takes the same index tensors, staged above and unchanged until
  // the step ends: their device checks run once (the per-sequence path rewrites its page table and
  // mask per sequence, so it checks at every call).
  const SharedChecksScope shared_checks(*backend, step.batched);
  const int num_layers = static_cast<int>(config.num_hidden_layers);
  for (int l = 0; l < num_layers; ++l) {
    EAGLE3_ASSIGN_OR_RETURN(TensorView x, full_input());
    EAGLE3_RETURN_IF_ERROR(Attention(l, x));
    EAGLE3_RETURN_IF_ERROR(reduce(&reduced));
    EAGLE3_RETURN_IF_ERROR(backend->AddRmsNorm(reduced, r_t, layers[static_cast<size_t>(l)].post_ln, eps, h_t));
    EAGLE3_ASSIGN_OR_RETURN(x, full_input());
    const Layer& L = layers[static_cast<size_t>(l)];
    EAGLE3_RETURN_IF_ERROR(
        L.mlp.Forward(x, ffn_ws, Rows(partial, 0, t), step.batched ? std::span(L.mlp_prefetch) : std::span<const TensorView>()));
    EAGLE3_RETURN_IF_ERROR(reduce(&reduced));
    const Tensor& next_norm = l + 1 < num_layers ? layers[static_cast<size_t>(l + 1)].input_ln : final_ln;
    EAGLE3_RETURN_IF_ERROR(backend->AddRmsNorm(reduced, r_t, next_norm, eps, h_t));
    EAGLE3_RETURN_IF_ERROR(Capture(l + 1, t));
  }

  // lm_head on the requested rows, vocab-parallel, then all-gathered into full-vocabulary logits.
  EAGLE3_ASSIGN_OR_RETURN(TensorView final_hidden, full_input());
  // The final normed hidden, the lm_head's input (HiddenStateTap::FinalNormed: the MTP module's
  // input), taken where it is whole on every rank.
  if (step.tap.has_value()) EAGLE3_RETURN_IF_ERROR(CaptureRows(step.tap->final_norm_boundary(), final_hidden));
  EAGLE3_ASSIGN_OR_RETURN(const int64_t out_rows, CopyLogitRows(*backend, final_hidden, step.n, step.all_logits, lm_in));
  const TensorView logits =
      !step.io.logits.empty()
          ? step.io.logits
          : TensorView(st_logits.data(), DType::kF32, Shape{out_rows, config.vocab_size}, st_logits.device());
  return VocabParallelLogits(Ranks(), Rows(lm_in, 0, out_rows), lm_head.empty() ? embed : lm_head, logits_shard,
                             logits_all, config.vocab_size, logits);
}

absl::Status TargetModel::Impl::Finish(const TensorView& logits, const TensorView& aux) {
  if (!step.staged) return absl::FailedPreconditionError("Finish: no batch is staged (call Stage first)");
  EAGLE3_RETURN_IF_ERROR(ValidateOutputs(logits, aux));
  EAGLE3_RETURN_IF_ERROR(backend->Synchronize());
  if (step.io.logits.empty()) {
    std::copy_n(st_logits.data_as<const float>(), step.out_rows * config.vocab_size, logits.data_as<float>());
  }
  if (step.tap.has_value() && step.io.aux.empty()) {
    std::copy_n(st_aux.data_as<const float>(), step.t * step.tap->width(), aux.data_as<float>());
  }
  return absl::OkStatus();
}


TargetModel::TargetModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TargetModel::~TargetModel() = default;

const DeepseekV2Config& TargetModel::config() const { return impl_->config; }
const TargetModelOptions& TargetModel::options() const { return impl_->options; }

const WeightLoadStats& TargetModel::load_stats() const { return impl_->load_stats; }

TensorView TargetModel::kv_cache(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(impl_->layers.size())) return TensorView();
  return impl_->layers[static_cast<size_t>(layer)].cache.view();
}

int64_t TargetModel::LogitRows(std::span<const SequenceInput> batch) {
  int64_t rows = 0;
  for (const SequenceInput& in : batch) rows += in.all_logits ? static_cast<int64_t>(in.tokens.size()) : 1;
  return rows;
}

// The buffers AllocateWorkspaces (and LoadWeights' KV cache) size from the options and the config,
// summed before anything is allocated. Host staging and the host mask always count; the KV cache
// and the workspaces count when they live in host memory (a host backend): a device allocator
// reports its own exhaustion as ResourceExhausted.
absl::Status TargetModel::Impl::CheckBuffersFit() const {
  const int64_t t = options.max_tokens_per_forward, s = options.max_context_len;
  const int64_t page_size = options.page_size, pages = options.num_kv_pages;
  const int64_t h_dim = config.hidden_size, vocab = config.vocab_size;
  const int64_t heads = mla.heads, latent = mla.latent, rope = mla.rope, width = mla.width;
  const int64_t nope = mla.nope, qk = mla.qk, vdim = mla.vdim;
  const int64_t pages_per_seq = s / page_size + (s % page_size != 0 ? 1 : 0);
  const std::string tokens = "max_tokens_per_forward " + Str(t);
  const std::string context = "max_context_len " + Str(s);
  HostByteBudget budget("TargetModel");
  budget.Add(tokens + " x " + context + " (host attention mask)", {t, s}, 1);
  budget.Add(tokens + " x vocab_size " + Str(vocab) + " (logits staging)", {t, vocab}, 4);
  budget.Add(tokens + " x " + context + " / page_size " + Str(page_size) + " (page table staging)",
             {t, pages_per_seq}, 4);
  budget.Add(tokens + " x " + tokens + " (tree mask staging)", {t, t}, 1);
  budget.Add(tokens + " x 3 x hidden_size " + Str(h_dim) + " (tap staging)", {t, 3, h_dim}, 4);
  budget.Add(context + " x qk_rope_head_dim " + Str(rope) + " (RoPE table)", {s, rope}, 4);
  budget.Add(context + " (position iota)", {s, 2}, 8);
  if (backend->allocator().device().is_cpu()) {
    budget.Add("num_hidden_layers " + Str(config.num_hidden_layers) + " x num_kv_pages " + Str(pages) +
                   " x page_size " + Str(page_size) + " x latent width " + Str(width) + " (KV cache)",
               {config.num_hidden_layers, pages, page_size, width}, DTypeSize(cache_dtype));
    budget.Add(tokens + " x " + context + " (attention mask)", {t, s}, 1);
    budget.Add(context + " x attention widths (context latent / k / v)", {s, width + heads * (nope + vdim + qk)}, 4);
    budget.Add("(tp_size + 1) x " + tokens + " x vocab shard " + Str(vocab_shard) + " (logits)",
               {options.tp_size + 1, t, vocab_shard}, 4);
    budget.Add(tokens + " x 7 x hidden_size " + Str(h_dim) + " (residual streams)", {t + options.tp_size, 7, h_dim},
               4);
    budget.Add(tokens + " x attention widths (queries)",
               {t, mla.q_lora + (heads + 1) * width + heads * (qk + vdim + latent)}, 4);
    budget.Add(tokens + " x 3 x intermediate " + Str(inter_max) + " (MLP)", {t, 3, inter_max}, 4);
    budget.Add("num_kv_pages " + Str(pages) + " x page_size " + Str(page_size) + " (slot ids)", {pages, page_size},
               8);
  }
  return budget.Check();
}

absl::StatusOr<std::unique_ptr<TargetModel>> TargetModel::Create(const std::string& checkpoint_dir,
                                                                 const TargetModelOptions& options,
                                                                 Communicator* communicator, Backend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("TargetModel: backend is null");
  EAGLE3_RETURN_IF_ERROR(options.Check("TargetModel", communicator));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->comm = communicator;
  impl->backend = backend;
  EAGLE3_ASSIGN_OR_RETURN(impl->config, DeepseekV2Config::FromFile(checkpoint_dir));
  EAGLE3_RETURN_IF_ERROR(impl->config.ValidateForTp(options.tp_size));
  const DeepseekV2Config& c = impl->config;
  if (options.max_context_len > c.max_position_embeddings && !options.allow_long_context) {
    return absl::InvalidArgumentError(
        "TargetModel: max_context_len " + Str(options.max_context_len) + " exceeds max_position_embeddings " +
        Str(c.max_position_embeddings) + " of " + checkpoint_dir +
        "/config.json: positions beyond it are outside what the model was trained for; lower max_context_len, "
        "or set TargetModelOptions::allow_long_context to run them anyway");
  }
  EAGLE3_ASSIGN_OR_RETURN(impl->checkpoint, Checkpoint::Open(checkpoint_dir, {.threads = options.read_threads}));
  impl->attention = MlaAttentionConfig::ForTarget(c);
  impl->mla = MlaRankDims::Of(impl->attention, options.tp_size);
  // Layer 0's form is as good as any: both forms' shapes are set in every layer's config.
  impl->ffn = FeedForwardConfig::ForTargetLayer(c, 0);
  impl->vocab_shard = PaddedSize(c.vocab_size, kVocabPadPerRank * options.tp_size) / options.tp_size;
  impl->inter_max = impl->ffn.WidestRankIntermediate(options.tp_size);
  EAGLE3_ASSIGN_OR_RETURN(impl->weight_dtype, ResolveWeightDtype(options.weight_dtype, *backend, "TargetModel"));
  impl->cache_dtype = options.kv_cache_dtype.value_or(DType::kF32);
  EAGLE3_RETURN_IF_ERROR(CheckStorageDtype(impl->cache_dtype, "TargetModel: kv_cache_dtype"));
  EAGLE3_RETURN_IF_ERROR(impl->CheckBuffersFit());
  EAGLE3_RETURN_IF_ERROR(impl->LoadWeights());
  EAGLE3_RETURN_IF_ERROR(impl->AllocateWorkspaces());
  return std::unique_ptr<TargetModel>(new TargetModel(std::move(impl)));
}

absl::Status TargetModel::Forward(std::span<const SequenceInput> batch, const TensorView& logits,
                                  const HiddenStateTap* tap, const TensorView& aux) {
  Impl& m = *impl_;
  EAGLE3_RETURN_IF_ERROR(m.Stage(batch, tap, TargetStepIO()));
  EAGLE3_RETURN_IF_ERROR(m.ValidateOutputs(logits, aux));
  EAGLE3_RETURN_IF_ERROR(m.Launch());
  EAGLE3_RETURN_IF_ERROR(m.Finish(logits, aux));
  m.step.batch = {};  // the caller's spans are not kept beyond the call
  return absl::OkStatus();
}

absl::Status TargetModel::Stage(std::span<const SequenceInput> batch, const HiddenStateTap* tap) {
  return impl_->Stage(batch, tap, TargetStepIO());
}

absl::Status TargetModel::Stage(std::span<const SequenceInput> batch, const HiddenStateTap* tap,
                                const TargetStepIO& io) {
  return impl_->Stage(batch, tap, io);
}

absl::Status TargetModel::Launch() { return impl_->Launch(); }

absl::Status TargetModel::Finish(const TensorView& logits, const TensorView& aux) {
  return impl_->Finish(logits, aux);
}

std::vector<int64_t> TargetModel::StepSignature() const { return impl_->Signature(); }

bool TargetModel::StepIsCapturable() const { return impl_->step.staged && impl_->step.batched; }

absl::Status TargetModel::CommitAccepted(std::span<const int32_t> page_table, int64_t cache_len,
                                         std::span<const int64_t> accepted) {
  Impl& m = *impl_;
  const int64_t a = static_cast<int64_t>(accepted.size());
  const int64_t max_nodes = m.options.max_tokens_per_forward;
  if (a > max_nodes) {
    return absl::InvalidArgumentError("CommitAccepted: " + Str(a) + " accepted tokens exceed max_tokens_per_forward " +
                                      Str(max_nodes));
  }
  const int64_t capacity = static_cast<int64_t>(page_table.size()) * m.options.page_size;
  for (int64_t j = 0; j < a; ++j) {
    if (accepted[j] < 0 || accepted[j] >= max_nodes || (j > 0 && accepted[j] <= accepted[j - 1]) ||
        cache_len < 0 || cache_len + accepted[j] >= capacity) {
      return absl::InvalidArgumentError("CommitAccepted: accepted[" + Str(j) + "] = " + Str(accepted[j]) +
                                        " must be increasing, in [0, max_tokens_per_forward = " + Str(max_nodes) +
                                        ") and inside the page table (" + Str(capacity) + " slots from cache_len " +
                                        Str(cache_len) + ")");
    }
  }
  for (size_t p = 0; p < page_table.size(); ++p) {
    if (page_table[p] < 0 || page_table[p] >= m.options.num_kv_pages) {
      return absl::InvalidArgumentError("CommitAccepted: page_table[" + Str(static_cast<int64_t>(p)) + "] = " +
                                        Str(page_table[p]) + " is not a page of this cache");
    }
  }
  if (a == 0) return absl::OkStatus();
  // The one-sequence batch CommitAcceptedOnDevice takes: [num_accepted, accepted...] and cache_len.
  // Only the page entries the moves touch travel (m.page_table holds num_kv_pages entries; the
  // caller's table may be longer), with cache_len taken relative to the first of them.
  const int64_t first_page = cache_len / m.options.page_size;
  const int64_t pages = (cache_len + accepted[a - 1]) / m.options.page_size + 1 - first_page;
  if (pages > m.options.num_kv_pages) {
    return absl::InvalidArgumentError("CommitAccepted: the moved positions [" + Str(cache_len) + ", " +
                                      Str(cache_len + accepted[a - 1]) + "] span " + Str(pages) +
                                      " entries of page_table, more than the cache's num_kv_pages " +
                                      Str(m.options.num_kv_pages) + " (so they repeat a page)");
  }
  std::vector<int32_t> args(static_cast<size_t>(a + 1));
  args[0] = static_cast<int32_t>(a);
  for (int64_t j = 0; j < a; ++j) args[static_cast<size_t>(j + 1)] = static_cast<int32_t>(accepted[j]);
  int64_t len = cache_len - first_page * m.options.page_size;
  const TensorView pt = Rows(m.page_table, 0, pages);
  EAGLE3_RETURN_IF_ERROR(m.Upload(
      TensorView(const_cast<int32_t*>(page_table.data()) + first_page, DType::kI32, Shape{pages}), pt));
  EAGLE3_RETURN_IF_ERROR(m.Upload(TensorView(args.data(), DType::kI32, Shape{a + 1}), Rows(m.commit_i32, 0, a + 1)));
  EAGLE3_RETURN_IF_ERROR(m.Upload(TensorView(&len, DType::kI64, Shape{1}), m.commit_len));
  EAGLE3_RETURN_IF_ERROR(CommitAcceptedOnDevice(pt.Reshape(Shape{1, pages}), m.commit_len,
                                                Rows(m.commit_i32, 1, max_nodes).Reshape(Shape{1, max_nodes}),
                                                Rows(m.commit_i32, 0, 1)));
  return m.backend->Synchronize();
}

absl::Status TargetModel::CommitAcceptedOnDevice(const TensorView& page_tables, const TensorView& cache_len,
                                                 const TensorView& accepted, const TensorView& num_accepted) {
  Impl& m = *impl_;
  // Every layer, even after an error: a bad sequence is then skipped in all of them alike.
  absl::Status first_error;
  for (auto& layer : m.layers) {
    absl::Status st = m.backend->CompactAccepted(layer.cache, page_tables, cache_len, accepted, num_accepted);
    if (!st.ok() && first_error.ok()) first_error = std::move(st);
  }
  return first_error;
}

}  // namespace eagle3
