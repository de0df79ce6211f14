#include "eagle3/target_model.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batch_staging.h"
#include "rank_collectives.h"
#include "view_slices.h"
#include "vocab_parallel_head.h"
#include "zero_fill.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/detail/host_budget.h"
#include "eagle3/moe_routing.h"
#include "eagle3/rope_table.h"
#include "eagle3/status.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_convert.h"

namespace eagle3 {
namespace {

// New tokens per sequence up to which kAuto takes the absorbed path (decode, tree verify); longer
// extends reconstruct k/v, which costs fewer flops per new token.
constexpr int64_t kAbsorbedMaxNewTokens = 64;

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

std::string Str(int64_t v) { return std::to_string(v); }

// Columns [col, col + cols) of each of the n heads of a [rows, n * d] buffer, head-major:
// [n, rows, cols] with strides [d, row stride, 1] (a BatchedGemm operand, one item per head).
TensorView HeadMajor(const TensorView& t, int64_t n, int64_t d, int64_t col, int64_t cols) {
  auto* data = static_cast<char*>(t.data()) + col * static_cast<int64_t>(DTypeSize(t.dtype()));
  return TensorView(data, t.dtype(), Shape{n, t.dim(0), cols}, Shape{d, t.stride(0), 1}, t.device());
}

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
  struct Layer {
    Tensor input_ln, post_ln;
    Tensor q_a, q_a_ln, q_b;  // q_b holds q_proj when q_lora_rank is null (q_a empty)
    Tensor kv_a, kv_a_ln, kv_b, w_uk_t, o_proj;
    bool moe = false;
    Tensor gate_up, down;  // dense MLP
    Tensor router, correction_bias;
    std::vector<Tensor> expert_tensors;  // gate_up, down for each expert
    std::vector<ExpertWeights> experts;
    Tensor shared_gate_up, shared_down;
    int64_t shared_inter = 0;
    Tensor cache;  // [num_pages, page_size, W]
  };

  DeepseekV2Config config;
  TargetModelOptions options;
  Communicator* comm = nullptr;
  Backend* backend = nullptr;
  std::unique_ptr<Checkpoint> checkpoint;
  DType weight_dtype = DType::kF32;  // resolved options.weight_dtype
  DType cache_dtype = DType::kF32;   // resolved options.kv_cache_dtype

  // Per-rank dims.
  int64_t heads = 0;        // attention heads on this rank
  int64_t latent = 0;       // kv_lora_rank (R)
  int64_t rope = 0;         // qk_rope_head_dim (P)
  int64_t width = 0;        // R + P, one latent cache row
  int64_t nope = 0, qk = 0, vdim = 0;
  int64_t vocab_shard = 0;  // padded vocab / tp
  int64_t inter_max = 0;    // widest MLP slice on this rank (dense, shared)
  float scale = 0.0f;

  Tensor embed, final_ln, lm_head;  // lm_head empty when tied to embed
  std::vector<Layer> layers;
  Tensor cos_sin;  // [max_context_len, P]

  // Workspaces (backend device), sized at creation.
  Tensor r, h, h_full, partial, local, zeros, qa, q, attn_v, q_lat, o_lat;
  Tensor ctx_lat, ctx_kv, ctx_k, mask, gate_up, act, router_logits, ids, weights;
  Tensor lm_in, logits_shard, logits_all, tap_rows;
  Tensor tokens, positions, slots, iota, page_table;
  Tensor commit_i32, commit_len;  // CommitAccepted's inputs: [num_accepted, accepted...], [cache_len]
  std::vector<uint8_t> host_mask;

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

  // W_UV of every head: rows [h (nope + vdim) + nope, + vdim) of kv_b, as [heads, vdim, latent].
  TensorView WUv(const Layer& L) const {
    const int64_t elem = static_cast<int64_t>(DTypeSize(L.kv_b.dtype()));
    return TensorView(static_cast<char*>(L.kv_b.data()) + nope * latent * elem, L.kv_b.dtype(),
                      Shape{heads, vdim, latent}, Shape{(nope + vdim) * latent, latent, 1}, L.kv_b.device());
  }

  absl::StatusOr<Tensor> Alloc(DType dtype, const Shape& shape) {
    return Tensor::Empty(dtype, shape, backend->allocator());
  }

  absl::Status Upload(const TensorView& host, const TensorView& device) {
    return backend->Copy(host, device);
  }

  // A host tensor on the backend's device (itself on a host backend).
  absl::StatusOr<Tensor> ToDevice(Tensor host) {
    if (backend->device().is_cpu()) return host;
    EAGLE3_ASSIGN_OR_RETURN(Tensor device, Alloc(host.dtype(), host.shape()));
    EAGLE3_RETURN_IF_ERROR(Upload(host, device));
    return device;
  }
  // This rank's shard of `spec`, stored as `form`, read (dequantized) on the host into `dtype`.
  absl::StatusOr<Tensor> ReadHostShard(const WeightSpec& spec, StoredForm form, DType dtype) const {
    return ReadWeightShard(*checkpoint, spec, form, config.quantization, spec.ForRank(options.tp_size, options.rank),
                           dtype);
  }
  // The same on the backend's device.
  absl::StatusOr<Tensor> LoadShard(const WeightSpec& spec, StoredForm form, DType dtype) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor host, ReadHostShard(spec, form, dtype));
    return ToDevice(std::move(host));
  }

  absl::Status LoadWeights();
  absl::Status CheckBuffersFit() const;
  absl::Status AllocateWorkspaces();

  RankCollectives Ranks() const { return RankCollectives{options.tp_size, comm, backend}; }

  absl::StatusOr<Tensor> AllocStaging(DType dtype, const Shape& shape) {
    return Tensor::Empty(dtype, shape, backend->staging_allocator());
  }
  bool Absorbed(int64_t n) const {
    return options.attention_path == AttentionPath::kAbsorbed ||
           (options.attention_path == AttentionPath::kAuto && n <= kAbsorbedMaxNewTokens);
  }

  absl::Status ValidateBatch(std::span<const SequenceInput> batch, const HiddenStateTap* tap) const;
  absl::Status ValidateOutputs(const TensorView& logits, const TensorView& aux) const;
  absl::Status Attention(int layer, const TensorView& x);
  absl::Status AttentionPerSequence(int layer, const TensorView& x);
  absl::Status Mlp(int layer, const TensorView& x);
  absl::Status Capture(int boundary, int64_t t);
  absl::Status Stage(std::span<const SequenceInput> batch, const HiddenStateTap* tap, const TargetStepIO& io);
  absl::Status CheckIO(const TargetStepIO& io) const;
  absl::Status Launch();
  absl::Status Finish(const TensorView& logits, const TensorView& aux);
  std::vector<int64_t> Signature() const;
};

absl::Status TargetModel::Impl::LoadWeights() {
  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  // How each weight is stored (quantized ones with their scales), from config.json's
  // quantization_config: the target's alone, never the draft's.
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  // Every tensor is checked before any is loaded, so a bad checkpoint fails fast and completely.
  for (size_t i = 0; i < specs.size(); ++i) {
    EAGLE3_RETURN_IF_ERROR(CheckStoredWeight(*checkpoint, specs[i], forms[i], config.quantization));
  }
  EAGLE3_RETURN_IF_ERROR(CheckNoUnknownTensors(*checkpoint, config, specs));
  size_t next = 0;
  // The next tensor of the schema, in `dtype`: weight_dtype for Gemm weights and the embedding, f32
  // for norms, the router and its bias.
  auto take_as = [&](std::string_view suffix, DType dtype) -> absl::StatusOr<Tensor> {
    const size_t i = next++;
    const WeightSpec& spec = specs[i];
    if (spec.name.size() < suffix.size() ||
        spec.name.compare(spec.name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      return absl::InternalError("weight schema order: expected *" + std::string(suffix) + ", got " +
                                 spec.name);
    }
    return LoadShard(spec, forms[i], dtype);
  };
  auto take = [&](std::string_view suffix) { return take_as(suffix, DType::kF32); };
  auto take_w = [&](std::string_view suffix) { return take_as(suffix, weight_dtype); };
  // A merged [2I, H] gate_up from the separate gate_proj and up_proj shards.
  auto take_gate_up = [&]() -> absl::StatusOr<Tensor> {
    EAGLE3_ASSIGN_OR_RETURN(Tensor gate, take_w("gate_proj.weight"));
    EAGLE3_ASSIGN_OR_RETURN(Tensor up, take_w("up_proj.weight"));
    EAGLE3_ASSIGN_OR_RETURN(Tensor merged, Alloc(weight_dtype, Shape{2 * gate.dim(0), gate.dim(1)}));
    EAGLE3_RETURN_IF_ERROR(backend->Copy(gate, Rows(merged, 0, gate.dim(0))));
    EAGLE3_RETURN_IF_ERROR(backend->Copy(up, Rows(merged, gate.dim(0), up.dim(0))));
    return merged;
  };

  EAGLE3_ASSIGN_OR_RETURN(embed, take_w("embed_tokens.weight"));
  layers.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    Layer& L = layers[static_cast<size_t>(l)];
    EAGLE3_ASSIGN_OR_RETURN(L.input_ln, take("input_layernorm.weight"));
    EAGLE3_ASSIGN_OR_RETURN(L.post_ln, take("post_attention_layernorm.weight"));
    if (config.q_lora_rank.has_value()) {
      EAGLE3_ASSIGN_OR_RETURN(L.q_a, take_w("q_a_proj.weight"));
      EAGLE3_ASSIGN_OR_RETURN(L.q_a_ln, take("q_a_layernorm.weight"));
      EAGLE3_ASSIGN_OR_RETURN(L.q_b, take_w("q_b_proj.weight"));
    } else {
      EAGLE3_ASSIGN_OR_RETURN(L.q_b, take_w("q_proj.weight"));
    }
    EAGLE3_ASSIGN_OR_RETURN(L.kv_a, take_w("kv_a_proj_with_mqa.weight"));
    EAGLE3_ASSIGN_OR_RETURN(L.kv_a_ln, take("kv_a_layernorm.weight"));
    EAGLE3_ASSIGN_OR_RETURN(L.kv_b, take_w("kv_b_proj.weight"));
    EAGLE3_ASSIGN_OR_RETURN(L.o_proj, take_w("o_proj.weight"));
    // W_UK per head, transposed to [R, nope] so that q_nope · W_UK is one Gemm against it (from the
    // f32 values; rounding to bf16 afterwards gives the same values as kv_b's bf16 copy).
    {
      EAGLE3_ASSIGN_OR_RETURN(Tensor host_kv_b, ReadHostShard(specs[next - 2], forms[next - 2], DType::kF32));
      EAGLE3_ASSIGN_OR_RETURN(Tensor host_t, Tensor::Empty(DType::kF32, Shape{heads, latent, nope}));
      const float* src = host_kv_b.data_as<float>();
      float* dst = host_t.data_as<float>();
      for (int64_t n = 0; n < heads; ++n) {
        for (int64_t i = 0; i < nope; ++i) {
          for (int64_t c = 0; c < latent; ++c) {
            dst[(n * latent + c) * nope + i] = src[(n * (nope + vdim) + i) * latent + c];
          }
        }
      }
      if (weight_dtype != DType::kF32) {
        EAGLE3_ASSIGN_OR_RETURN(Tensor converted, Tensor::Empty(weight_dtype, host_t.shape()));
        EAGLE3_RETURN_IF_ERROR(ConvertTensor(host_t, converted));
        host_t = std::move(converted);
      }
      EAGLE3_ASSIGN_OR_RETURN(L.w_uk_t, ToDevice(std::move(host_t)));
    }
    L.moe = config.IsMoeLayer(l);
    if (!L.moe) {
      EAGLE3_ASSIGN_OR_RETURN(L.gate_up, take_gate_up());
      EAGLE3_ASSIGN_OR_RETURN(L.down, take_w("down_proj.weight"));
    } else {
      EAGLE3_ASSIGN_OR_RETURN(L.router, take("gate.weight"));
      if (config.topk_method == TopkMethod::kNoauxTc) {
        EAGLE3_ASSIGN_OR_RETURN(L.correction_bias, take("e_score_correction_bias"));
      }
      for (int64_t e = 0; e < *config.n_routed_experts; ++e) {
        EAGLE3_ASSIGN_OR_RETURN(Tensor gu, take_gate_up());
        EAGLE3_ASSIGN_OR_RETURN(Tensor dn, take_w("down_proj.weight"));
        L.expert_tensors.push_back(std::move(gu));
        L.expert_tensors.push_back(std::move(dn));
      }
      for (size_t e = 0; e < L.expert_tensors.size(); e += 2) {
        L.experts.push_back(ExpertWeights{L.expert_tensors[e].view(), L.expert_tensors[e + 1].view()});
      }
      if (config.n_shared_experts > 0) {
        EAGLE3_ASSIGN_OR_RETURN(L.shared_gate_up, take_gate_up());
        EAGLE3_ASSIGN_OR_RETURN(L.shared_down, take_w("down_proj.weight"));
        L.shared_inter = L.shared_down.dim(1);
      }
    }
    EAGLE3_ASSIGN_OR_RETURN(L.cache, Alloc(cache_dtype, Shape{options.num_kv_pages, options.page_size, width}));
    EAGLE3_RETURN_IF_ERROR(ZeroFill(*backend, L.cache));
  }
  EAGLE3_ASSIGN_OR_RETURN(final_ln, take("model.norm.weight"));
  if (!config.tie_word_embeddings) {
    EAGLE3_ASSIGN_OR_RETURN(lm_head, take_w("lm_head.weight"));
  }
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
  EAGLE3_ASSIGN_OR_RETURN(qa, Alloc(DType::kF32, Shape{t_max, config.q_lora_rank.value_or(1)}));
  EAGLE3_ASSIGN_OR_RETURN(q, Alloc(DType::kF32, Shape{t_max, heads * qk}));
  EAGLE3_ASSIGN_OR_RETURN(attn_v, Alloc(DType::kF32, Shape{t_max, heads * vdim}));
  // q_lat row t: the absorbed query of each head, then (as head `heads`) token t's latent cache row,
  // so that one ApplyRope rotates the heads' q_pe and the row's k_pe together (Attention).
  EAGLE3_ASSIGN_OR_RETURN(q_lat, Alloc(DType::kF32, Shape{t_max, (heads + 1) * width}));
  EAGLE3_ASSIGN_OR_RETURN(o_lat, Alloc(DType::kF32, Shape{t_max, heads * latent}));
  EAGLE3_ASSIGN_OR_RETURN(ctx_lat, Alloc(DType::kF32, Shape{s_max, width}));
  EAGLE3_ASSIGN_OR_RETURN(ctx_kv, Alloc(DType::kF32, Shape{s_max, heads * (nope + vdim)}));
  EAGLE3_ASSIGN_OR_RETURN(ctx_k, Alloc(DType::kF32, Shape{s_max, heads * qk}));
  EAGLE3_ASSIGN_OR_RETURN(mask, Alloc(DType::kU8, Shape{t_max * s_max}));
  EAGLE3_ASSIGN_OR_RETURN(gate_up, Alloc(DType::kF32, Shape{t_max, 2 * inter_max}));
  EAGLE3_ASSIGN_OR_RETURN(act, Alloc(DType::kF32, Shape{t_max, inter_max}));
  const int64_t experts = config.n_routed_experts.value_or(1);
  const int64_t top_k = std::max<int64_t>(config.num_experts_per_tok, 1);
  EAGLE3_ASSIGN_OR_RETURN(router_logits, Alloc(DType::kF32, Shape{t_max, experts}));
  EAGLE3_ASSIGN_OR_RETURN(ids, Alloc(DType::kI32, Shape{t_max, top_k}));
  EAGLE3_ASSIGN_OR_RETURN(weights, Alloc(DType::kF32, Shape{t_max, top_k}));
  EAGLE3_ASSIGN_OR_RETURN(lm_in, Alloc(DType::kF32, Shape{t_max, h_dim}));
  EAGLE3_ASSIGN_OR_RETURN(logits_shard, Alloc(DType::kF32, Shape{t_max, vocab_shard}));
  EAGLE3_ASSIGN_OR_RETURN(logits_all, Alloc(DType::kF32, Shape{options.tp_size * t_max, vocab_shard}));
  EAGLE3_ASSIGN_OR_RETURN(tokens, Alloc(DType::kI64, Shape{t_pad}));
  EAGLE3_ASSIGN_OR_RETURN(positions, Alloc(DType::kI64, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(slots, Alloc(DType::kI64, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(page_table, Alloc(DType::kI32, Shape{options.num_kv_pages}));
  EAGLE3_ASSIGN_OR_RETURN(commit_i32, Alloc(DType::kI32, Shape{t_max + 1}));
  EAGLE3_ASSIGN_OR_RETURN(commit_len, Alloc(DType::kI64, Shape{1}));
  {
    EAGLE3_ASSIGN_OR_RETURN(Tensor host_iota, Tensor::Empty(DType::kI64, Shape{s_max}));
    for (int64_t i = 0; i < s_max; ++i) host_iota.data_as<int64_t>()[i] = i;
    EAGLE3_ASSIGN_OR_RETURN(iota, Alloc(DType::kI64, Shape{s_max}));
    EAGLE3_RETURN_IF_ERROR(Upload(host_iota, iota));
  }
  {
    EAGLE3_ASSIGN_OR_RETURN(Tensor host_table, Tensor::Empty(DType::kF32, Shape{s_max, rope}));
    EAGLE3_RETURN_IF_ERROR(FillRopeCosSin(config.rope, rope, host_table));
    EAGLE3_ASSIGN_OR_RETURN(cos_sin, Alloc(DType::kF32, host_table.shape()));
    EAGLE3_RETURN_IF_ERROR(Upload(host_table, cos_sin));
  }
  EAGLE3_RETURN_IF_ERROR(AssignHostVector(host_mask, t_max * s_max, uint8_t{0},
                                          "TargetModel: max_tokens_per_forward x max_context_len host mask"));

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
  if (!step.tap.has_value()) return absl::OkStatus();
  const int slot = step.tap->SlotOf(boundary);
  if (slot < 0) return absl::OkStatus();
  const int64_t hd = config.hidden_size;
  TensorView full = Rows(r, 0, t);
  if (options.residual_mode == ResidualMode::kTokenSharded) {
    // The residual is token-sharded: the tap must see every token's full stream, so gather it.
    const int64_t t_pad = RoundUp(t, options.tp_size);
    EAGLE3_RETURN_IF_ERROR(Ranks().AllGather(Rows(r, 0, t_pad / options.tp_size), Rows(tap_rows, 0, t_pad)));
    full = Rows(tap_rows, 0, t);
  }
  const TensorView aux = !step.io.aux.empty()
                             ? step.io.aux
                             : TensorView(st_aux.data(), DType::kF32, Shape{t, step.tap->width()}, st_aux.device());
  return backend->Copy(full, Block(aux, 0, t, slot * hd, hd));
}

absl::Status TargetModel::Impl::Attention(int layer, const TensorView& x) {
  Layer& L = layers[static_cast<size_t>(layer)];
  const int64_t t = x.dim(0);
  TensorView q_t = Rows(q, 0, t);
  if (!L.q_a.empty()) {
    TensorView qa_t = Rows(qa, 0, t);
    EAGLE3_RETURN_IF_ERROR(backend->Gemm(x, L.q_a, qa_t, kWeightsGemm));
    EAGLE3_RETURN_IF_ERROR(backend->RmsNorm(qa_t, L.q_a_ln, static_cast<float>(config.rms_norm_eps), qa_t));
    EAGLE3_RETURN_IF_ERROR(backend->Gemm(qa_t, L.q_b, q_t, kWeightsGemm));
  } else {
    EAGLE3_RETURN_IF_ERROR(backend->Gemm(x, L.q_b, q_t, kWeightsGemm));
  }
  // The latent cache row [c | k_pe] = kv_a x, written straight into q_lat's last head; then
  // kv_a_layernorm(c) in place and (below) the rotation of k_pe: what every later query reads.
  const TensorView q_lat_t = Rows(q_lat, 0, t);
  const TensorView rows_t = Block(q_lat_t, 0, t, heads * width, width);
  EAGLE3_RETURN_IF_ERROR(backend->Gemm(x, L.kv_a, rows_t, kWeightsGemm));
  const TensorView c_t = Block(rows_t, 0, t, 0, latent);
  EAGLE3_RETURN_IF_ERROR(backend->RmsNorm(c_t, L.kv_a_ln, static_cast<float>(config.rms_norm_eps), c_t));
  const TensorView pos_t = step.io.positions.empty() ? Rows(positions, 0, t) : step.io.positions;
  const TensorView q3 = Heads(q_t, heads, qk);

  if (step.batched) {
    // Every sequence at once, lengths and page tables from the device (graph-capturable).
    const TensorView q_lat3 = Heads(q_lat_t, heads, width);
    const TensorView o_lat3 = Heads(Rows(o_lat, 0, t), heads, latent);
    EAGLE3_RETURN_IF_ERROR(backend->BatchedGemm(HeadMajor(q_t, heads, qk, 0, nope), L.w_uk_t,
                                                HeadMajor(q_lat_t, heads, width, 0, latent), kWeightsGemm));
    EAGLE3_RETURN_IF_ERROR(backend->Copy(q3.Narrow(2, nope, rope), q_lat3.Narrow(2, latent, rope)));
    // q_pe of every head and the cache row's k_pe: heads + 1 rows of q_lat, rotated alike (one launch
    // and one position check instead of two of each on a device).
    EAGLE3_RETURN_IF_ERROR(backend->ApplyRope(Heads(q_lat_t, heads + 1, width), latent, rope, pos_t, cos_sin,
                                              RopeStyle::kAdjacentPairs));
    const TensorView flat_cache(L.cache.data(), L.cache.dtype(),
                                Shape{options.num_kv_pages * options.page_size, 1, width}, L.cache.device());
    EAGLE3_RETURN_IF_ERROR(backend->PagedWrite(rows_t, Rows(slots, 0, t), slot_iota, flat_cache));
    const int64_t b = static_cast<int64_t>(step.n.size());
    const TensorView tree = !step.io.tree_mask.empty() ? step.io.tree_mask
                            : step.has_tree            ? Rows(d_tree_mask, 0, t)
                                                       : TensorView();
    EAGLE3_RETURN_IF_ERROR(backend->BatchedLatentAttention(q_lat3, L.cache, Rows(d_tables, 0, b), Rows(d_starts, 0, b + 1),
                                                           Rows(d_lens, 0, b), options.max_context_len, tree, scale,
                                                           latent, o_lat3));
    EAGLE3_RETURN_IF_ERROR(backend->BatchedGemm(HeadMajor(Rows(o_lat, 0, t), heads, latent, 0, latent), WUv(L),
                                                HeadMajor(Rows(attn_v, 0, t), heads, vdim, 0, vdim), kWeightsGemm));
    return backend->Gemm(Rows(attn_v, 0, t), L.o_proj, Rows(partial, 0, t), kWeightsGemm);
  }

  // Per sequence: q3 (every head's q_pe) and the cache rows' k_pe rotated apart, since the
  // unabsorbed path attends with q3 itself.
  EAGLE3_RETURN_IF_ERROR(backend->ApplyRope(Heads(rows_t, 1, width), latent, rope, pos_t, cos_sin,
                                            RopeStyle::kAdjacentPairs));
  EAGLE3_RETURN_IF_ERROR(backend->ApplyRope(q3, nope, rope, pos_t, cos_sin, RopeStyle::kAdjacentPairs));
  int64_t offset = 0;
  for (const SequenceInput& in : step.batch) {
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    const int64_t s = in.cache_len + n;
    // Only the pages this step uses (a caller's table may be longer than the device buffer).
    const int64_t used_pages = (s + options.page_size - 1) / options.page_size;
    const TensorView pt = Rows(page_table, 0, used_pages);
    EAGLE3_RETURN_IF_ERROR(
        Upload(TensorView(const_cast<int32_t*>(in.page_table.data()), DType::kI32, Shape{used_pages}), pt));
    EAGLE3_RETURN_IF_ERROR(backend->PagedWrite(Rows(rows_t, offset, n), Rows(slots, offset, n), pt, L.cache));
    // Mask [n, s]: the whole cached prefix, then causal or tree among the new tokens.
    for (int64_t i = 0; i < n; ++i) {
      uint8_t* row = &host_mask[static_cast<size_t>(i * s)];
      std::fill(row, row + in.cache_len, uint8_t{1});
      for (int64_t j = 0; j < n; ++j) {
        row[in.cache_len + j] = in.tree_mask.empty() ? (j <= i ? 1 : 0) : in.tree_mask[static_cast<size_t>(i * n + j)];
      }
    }
    const TensorView mask_t = TensorView(mask.data(), DType::kU8, Shape{n, s}, mask.device());
    EAGLE3_RETURN_IF_ERROR(Upload(TensorView(host_mask.data(), DType::kU8, Shape{n, s}), mask_t));

    const TensorView q_s = q3.Narrow(0, offset, n);
    const TensorView out_s = Heads(Rows(attn_v, offset, n), heads, vdim);
    if (Absorbed(n)) {
      const TensorView q_lat_s = Heads(Rows(q_lat, 0, n), heads, width);
      const TensorView o_lat_s = Heads(Rows(o_lat, 0, n), heads, latent);
      EAGLE3_RETURN_IF_ERROR(backend->BatchedGemm(HeadMajor(Rows(q_t, offset, n), heads, qk, 0, nope), L.w_uk_t,
                                                  HeadMajor(Rows(q_lat, 0, n), heads, width, 0, latent), kWeightsGemm));
      EAGLE3_RETURN_IF_ERROR(backend->Copy(q_s.Narrow(2, nope, rope), q_lat_s.Narrow(2, latent, rope)));
      EAGLE3_RETURN_IF_ERROR(backend->LatentAttention(q_lat_s, L.cache, pt, s, mask_t, scale, latent, o_lat_s));
      EAGLE3_RETURN_IF_ERROR(backend->BatchedGemm(HeadMajor(Rows(o_lat, 0, n), heads, latent, 0, latent), WUv(L),
                                                  HeadMajor(Rows(attn_v, offset, n), heads, vdim, 0, vdim), kWeightsGemm));
    } else {
      const TensorView lat = Rows(ctx_lat, 0, s);
      EAGLE3_RETURN_IF_ERROR(backend->PagedRead(L.cache, pt, Rows(iota, 0, s), lat));
      const TensorView kv = Rows(ctx_kv, 0, s);
      EAGLE3_RETURN_IF_ERROR(backend->Gemm(Block(lat, 0, s, 0, latent), L.kv_b, kv, kWeightsGemm));
      const TensorView kv3 = Heads(kv, heads, nope + vdim);
      const TensorView k3 = Heads(Rows(ctx_k, 0, s), heads, qk);
      EAGLE3_RETURN_IF_ERROR(backend->Copy(kv3.Narrow(2, 0, nope), k3.Narrow(2, 0, nope)));
      // k_pe is shared by every head: broadcast it with a zero head stride.
      const TensorView k_pe = TensorView(lat.data_as<float>() + latent, DType::kF32, Shape{s, heads, rope},
                                         Shape{width, 0, 1}, lat.device());
      EAGLE3_RETURN_IF_ERROR(backend->Copy(k_pe, k3.Narrow(2, nope, rope)));
      EAGLE3_RETURN_IF_ERROR(backend->Attention(q_s, k3, kv3.Narrow(2, nope, vdim), mask_t, scale, out_s));
    }
    offset += n;
  }
  return backend->Gemm(Rows(attn_v, 0, t), L.o_proj, Rows(partial, 0, t), kWeightsGemm);
}

absl::Status TargetModel::Impl::Mlp(int layer, const TensorView& x) {
  Layer& L = layers[static_cast<size_t>(layer)];
  const int64_t t = x.dim(0);
  const TensorView out = Rows(partial, 0, t);
  // SiLU MLP of width `inter` (gate_up: [2 * inter, H]); beta 1 accumulates into `out`.
  auto mlp = [&](const Tensor& gu_w, const Tensor& down_w, int64_t inter, float beta) -> absl::Status {
    const TensorView gu = Block(gate_up, 0, t, 0, 2 * inter);
    const TensorView a = Block(act, 0, t, 0, inter);
    EAGLE3_RETURN_IF_ERROR(backend->Gemm(x, gu_w, gu, kWeightsGemm));
    EAGLE3_RETURN_IF_ERROR(backend->SiluMul(gu, a));
    GemmOptions accumulate = kWeightsGemm;
    accumulate.beta = beta;
    return backend->Gemm(a, down_w, out, accumulate);
  };
  if (!L.moe) return mlp(L.gate_up, L.down, L.down.dim(1), 0.0f);
  const TensorView logits_t = Rows(router_logits, 0, t);
  EAGLE3_RETURN_IF_ERROR(backend->Gemm(x, L.router, logits_t, kWeightsGemm));
  const TensorView ids_t = Rows(ids, 0, t), w_t = Rows(weights, 0, t);
  const TensorView bias = L.correction_bias.view();
  EAGLE3_RETURN_IF_ERROR(backend->MoeRoute(logits_t, L.correction_bias.empty() ? nullptr : &bias,
                                           MoeRoutingParams::FromConfig(config), ids_t, w_t));
  EAGLE3_RETURN_IF_ERROR(backend->MoeExperts(x, ids_t, w_t, L.experts, out, /*accumulate=*/false));
  // Shared experts join the routed output before the one reduction that follows.
  if (!L.shared_down.empty()) return mlp(L.shared_gate_up, L.shared_down, L.shared_inter, 1.0f);
  return absl::OkStatus();
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
          Str(kAbsorbedMaxNewTokens) + " new tokens each under AttentionPath::kAuto)");
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
    for (int b = 0; b <= config.num_hidden_layers; ++b) sig.push_back(step.tap->SlotOf(b));
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

  const int num_layers = static_cast<int>(config.num_hidden_layers);
  for (int l = 0; l < num_layers; ++l) {
    EAGLE3_ASSIGN_OR_RETURN(TensorView x, full_input());
    EAGLE3_RETURN_IF_ERROR(Attention(l, x));
    EAGLE3_RETURN_IF_ERROR(reduce(&reduced));
    EAGLE3_RETURN_IF_ERROR(backend->AddRmsNorm(reduced, r_t, layers[static_cast<size_t>(l)].post_ln, eps, h_t));
    EAGLE3_ASSIGN_OR_RETURN(x, full_input());
    EAGLE3_RETURN_IF_ERROR(Mlp(l, x));
    EAGLE3_RETURN_IF_ERROR(reduce(&reduced));
    const Tensor& next_norm = l + 1 < num_layers ? layers[static_cast<size_t>(l + 1)].input_ln : final_ln;
    EAGLE3_RETURN_IF_ERROR(backend->AddRmsNorm(reduced, r_t, next_norm, eps, h_t));
    EAGLE3_RETURN_IF_ERROR(Capture(l + 1, t));
  }

  // lm_head on the requested rows, vocab-parallel, then all-gathered into full-vocabulary logits.
  EAGLE3_ASSIGN_OR_RETURN(TensorView final_hidden, full_input());
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
    budget.Add(tokens + " x attention widths (queries)", {t, (heads + 1) * width + heads * (qk + vdim + latent)}, 4);
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
  EAGLE3_ASSIGN_OR_RETURN(impl->checkpoint, Checkpoint::Open(checkpoint_dir));
  impl->heads = c.num_attention_heads / options.tp_size;
  impl->latent = c.kv_lora_rank;
  impl->rope = c.qk_rope_head_dim;
  impl->width = c.latent_cache_width();
  impl->nope = c.qk_nope_head_dim;
  impl->qk = c.qk_head_dim();
  impl->vdim = c.v_head_dim;
  impl->vocab_shard = PaddedSize(c.vocab_size, kVocabPadPerRank * options.tp_size) / options.tp_size;
  impl->inter_max = std::max<int64_t>(
      {c.intermediate_size / options.tp_size, c.moe_intermediate_size * c.n_shared_experts / options.tp_size, 1});
  impl->scale = static_cast<float>(c.SoftmaxScale());
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
