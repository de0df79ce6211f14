#include "eagle3/draft_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "batch_staging.h"
#include "rank_collectives.h"
#include "view_slices.h"
#include "vocab_parallel_head.h"
#include "zero_fill.h"
#include "eagle3/checkpoint.h"
#include "eagle3/detail/host_budget.h"
#include "eagle3/draft_layer_prefix.h"
#include "eagle3/rope_table.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/tensor.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

std::string JoinInts(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Str(v[i]);
  return s + "]";
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

bool IsHostContiguousF32(const TensorView& t, int64_t rows, int64_t cols) {
  return t.rank() == 2 && t.dim(0) == rows && t.dim(1) == cols && t.dtype() == DType::kF32 &&
         t.device().is_cpu() && t.is_contiguous();
}

}  // namespace

struct DraftModel::Impl {
  Eagle3DraftConfig config;
  DeepseekV2Config target;
  DraftModelOptions options;
  std::optional<HiddenStateTap> tap;
  Communicator* comm = nullptr;
  Backend* backend = nullptr;
  std::unique_ptr<Checkpoint> checkpoint;         // the draft's
  std::unique_ptr<Checkpoint> target_checkpoint;  // only when the embedding is the target's
  std::string prefix;                             // "midlayer." or "layers.0."
  std::vector<int64_t> d2t;
  DType weight_dtype = DType::kF32;  // resolved options.weight_dtype

  // Per-rank dims.
  int64_t hidden_dim = 0, head_dim = 0, heads = 0, kv_heads = 0, group = 0;  // group = heads per kv head
  int64_t q_width = 0, kv_width = 0, inter = 0;
  int64_t vocab_shard = 0, draft_vocab_shard = 0;
  float scale = 0.0f, eps = 0.0f;

  Tensor fc, fc_bias, input_norm;
  std::vector<Tensor> fc_norms;
  Tensor input_ln, hidden_norm, qkv_w, o_proj, post_ln, gate_up_w, down_w, final_norm, lm_head, embed;
  Tensor cache;    // [num_kv_pages, page_size, 2 * kv_width]: K (after RoPE) | V
  Tensor cos_sin;  // [max_context_len, head_dim]

  // Workspaces (backend device), sized at creation.
  Tensor aux, g, e, x, r, h, qkv, attn, partial, gate_up, act, lm_in, logits_shard, logits_all;
  Tensor tokens, positions, slots;
  // Device metadata of BatchedPagedAttention, and the identity page table of the flat-cache view
  // that PagedWrite stores every new row through (slots are cache rows).
  Tensor d_tables, d_starts, d_lens, d_mask, slot_iota;
  int64_t max_pages = 0;  // page entries kept per sequence: ceil(max_context_len / page_size)

  // The staged step (Stage -> Launch -> Finish): Launch's work depends only on what Signature()
  // lists; every value it reads comes from the staging buffers below.
  struct Step {
    bool staged = false;
    bool from_target = false;
    int64_t t = 0, out_rows = 0;
    std::vector<int64_t> n;           // rows per sequence
    std::vector<uint8_t> all_logits;  // per sequence
    DraftStepIO io;                   // device-side inputs / outputs (empty views: host path)
    bool causal = false;              // no sequence brings a mask: attention is causal by position
  } step;
  // Host staging (backend->staging_allocator(): pinned on CUDA). Inputs are written by Stage and
  // read by the copies Launch enqueues; outputs are written by Launch's copies and read by Finish.
  Tensor st_tokens, st_positions, st_slots, st_tables, st_starts, st_lens, st_mask, st_hidden;
  Tensor st_logits, st_hidden_out;

  absl::StatusOr<Tensor> Alloc(DType dtype, const Shape& shape) {
    return Tensor::Empty(dtype, shape, backend->allocator());
  }
  absl::StatusOr<Tensor> AllocStaging(DType dtype, const Shape& shape) {
    return Tensor::Empty(dtype, shape, backend->staging_allocator());
  }
  absl::StatusOr<Tensor> ToDevice(Tensor host) {
    if (backend->device().is_cpu()) return host;
    EAGLE3_ASSIGN_OR_RETURN(Tensor device, Alloc(host.dtype(), host.shape()));
    EAGLE3_RETURN_IF_ERROR(backend->Copy(host, device));
    return device;
  }
  // This rank's shard of `spec`, read straight into `dtype` (weight_dtype for Gemm weights and the
  // embedding, f32 for norms and fc.bias).
  absl::StatusOr<Tensor> LoadShard(const Checkpoint& from, const WeightSpec& spec, DType dtype) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor host, from.ReadShard(spec.name, spec.ForRank(options.tp_size, options.rank), dtype));
    return ToDevice(std::move(host));
  }
  // Rows of several shards stacked into one weight (merged q/k/v, gate/up: one Gemm each).
  absl::StatusOr<Tensor> LoadStacked(std::span<const WeightSpec* const> specs) {
    std::vector<Tensor> parts;
    int64_t rows = 0;
    for (const WeightSpec* spec : specs) {
      EAGLE3_ASSIGN_OR_RETURN(Tensor part, LoadShard(*checkpoint, *spec, weight_dtype));
      rows += part.dim(0);
      parts.push_back(std::move(part));
    }
    EAGLE3_ASSIGN_OR_RETURN(Tensor merged, Alloc(weight_dtype, Shape{rows, parts.front().dim(1)}));
    int64_t row = 0;
    for (const Tensor& part : parts) {
      EAGLE3_RETURN_IF_ERROR(backend->Copy(part, Rows(merged, row, part.dim(0))));
      row += part.dim(0);
    }
    return merged;
  }

  absl::Status CheckAgainstTarget() const;
  absl::Status CheckTensors(const std::vector<WeightSpec>& specs, bool own_embedding) const;
  absl::Status LoadVocabMapping();
  absl::Status LoadWeights(const std::vector<WeightSpec>& specs, bool own_embedding);
  absl::Status CheckBuffersFit() const;
  absl::Status AllocateWorkspaces();

  RankCollectives Ranks() const { return RankCollectives{options.tp_size, comm, backend}; }

  // device_hidden: the input rows come from DraftStepIO::hidden (`hidden` is not checked).
  absl::Status Validate(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target,
                        bool device_hidden) const;
  absl::Status ValidateOutputs(const TensorView& logits, const TensorView& hidden_out) const;
  absl::Status WriteKv();
  absl::Status Attention();
  absl::Status Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target,
                     const DraftStepIO& io);
  absl::Status CheckIO(const DraftStepIO& io) const;
  absl::Status Launch();
  absl::Status Finish(const TensorView& logits, const TensorView& hidden_out);
  std::vector<int64_t> Signature() const;
};

absl::Status DraftModel::Impl::CheckAgainstTarget() const {
  // CheckDraftAgainstTarget reads aux ids as output-of-layer ids; under the other convention, or when
  // the ids are overridden, the tap (created next) checks the ids in use.
  if (options.convention == LayerIdConvention::kOutputOfLayer && !options.aux_layer_ids_override.has_value()) {
    return CheckDraftAgainstTarget(config, target);
  }
  Eagle3DraftConfig sizes_only = config;
  sizes_only.aux_layer_ids.reset();
  return CheckDraftAgainstTarget(sizes_only, target);
}

absl::Status DraftModel::Impl::CheckTensors(const std::vector<WeightSpec>& specs, bool own_embedding) const {
  const std::string where = "draft checkpoint '" + checkpoint->dir() + "'";
  // fc's input width is where a wrong number of aux layers (or a wrong target) shows first.
  if (checkpoint->Has("fc.weight")) {
    EAGLE3_ASSIGN_OR_RETURN(TensorInfo fc_info, checkpoint->Info("fc.weight"));
    if (fc_info.shape.rank() == 2 && fc_info.shape[1] != config.fc_input_width()) {
      return absl::InvalidArgumentError(
          "tensor 'fc.weight' of the " + where + " has shape " + fc_info.shape.ToString() + ": its input width " +
          Str(fc_info.shape[1]) + " must be the number of aux layers (" + Str(config.num_aux_layers()) +
          ") x the target hidden size (" + Str(config.target_hidden_size) + ") = " + Str(config.fc_input_width()) +
          "; the draft was trained on other taps or another target");
    }
  }
  std::set<std::string, std::less<>> known = {"d2t", "t2d", "fc.bias", "embed_tokens.weight"};
  for (const WeightSpec& spec : specs) {
    known.insert(spec.name);
    if (!checkpoint->Has(spec.name)) {
      return absl::NotFoundError(where + " has no tensor '" + spec.name +
                                 "', which its config.json requires (expected shape " + spec.shape.ToString() + ")");
    }
    EAGLE3_RETURN_IF_ERROR(checkpoint->ExpectShape(spec.name, spec.shape));
  }
  if (checkpoint->Has("fc.bias")) EAGLE3_RETURN_IF_ERROR(checkpoint->ExpectShape("fc.bias", Shape{config.hidden_size}));
  if (own_embedding) {
    EAGLE3_RETURN_IF_ERROR(
        checkpoint->ExpectShape("embed_tokens.weight", Shape{config.vocab_size, config.hidden_size}));
  }
  // A tensor the config does not account for is a config that lost a key: refuse, never ignore.
  for (const std::string& name : checkpoint->TensorNames()) {
    if (known.count(name) != 0) continue;
    std::string why = "which the draft config (" + config.source + ") does not account for";
    if (name == "input_norm.weight") {
      why = "an RMSNorm before fc that only norm_before_fc: true enables, and the config (" + config.source +
            ") does not set it";
    } else if (StartsWith(name, "fc_norm.")) {
      why = "a per-aux-layer RMSNorm before fc that only fc_norm: true enables (one per aux layer), and the config (" +
            config.source + ") does not set it or names another number of aux layers";
    } else if (name == "lm_head.weight" && config.tie_word_embeddings) {
      why = "but the config (" + config.source + ") says tie_word_embeddings: true";
    }
    return absl::InvalidArgumentError(where + " has tensor '" + name + "', " + why + "; refusing to ignore it");
  }
  return absl::OkStatus();
}

absl::Status DraftModel::Impl::LoadVocabMapping() {
  const int64_t draft_vocab = config.draft_vocab_size;
  const int64_t vocab = config.vocab_size;
  const std::string where = "draft checkpoint '" + checkpoint->dir() + "'";
  if (!checkpoint->Has("d2t")) {
    if (draft_vocab == vocab) {  // no reduced vocabulary: the identity, as SGLang and vLLM read it
      d2t.assign(static_cast<size_t>(draft_vocab), 0);
      return absl::OkStatus();
    }
    return absl::NotFoundError(where + " has no tensor 'd2t', which maps its " + Str(draft_vocab) +
                               " draft ids to the target's " + Str(vocab) +
                               " (i64 [draft_vocab_size] offsets: target id = draft id + d2t[draft id])");
  }
  EAGLE3_ASSIGN_OR_RETURN(TensorInfo info, checkpoint->Info("d2t"));
  if (info.dtype != DType::kI64 && info.dtype != DType::kI32) {
    return absl::InvalidArgumentError("tensor 'd2t' of the " + where + " is " + std::string(DTypeName(info.dtype)) +
                                      "; expected integer offsets (i64)");
  }
  EAGLE3_RETURN_IF_ERROR(checkpoint->ExpectShape("d2t", Shape{draft_vocab}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor values, checkpoint->Read("d2t", DType::kI64));
  const int64_t* offsets = values.data_as<int64_t>();
  std::vector<int64_t> draft_of(static_cast<size_t>(vocab), -1);
  for (int64_t i = 0; i < draft_vocab; ++i) {
    const int64_t target_id = i + offsets[i];
    if (target_id < 0 || target_id >= vocab) {
      return absl::InvalidArgumentError(
          "tensor 'd2t' of the " + where + ": d2t[" + Str(i) + "] = " + Str(offsets[i]) + " maps draft id " + Str(i) +
          " to target id " + Str(target_id) + ", outside the target vocabulary [0, " + Str(vocab) +
          "); d2t holds offsets (target id = draft id + d2t[draft id]), not target ids");
    }
    int64_t& other = draft_of[static_cast<size_t>(target_id)];
    if (other >= 0) {
      return absl::InvalidArgumentError("tensor 'd2t' of the " + where + " maps draft ids " + Str(other) + " and " +
                                        Str(i) + " both to target id " + Str(target_id));
    }
    other = i;
  }
  if (checkpoint->Has("t2d")) {
    EAGLE3_ASSIGN_OR_RETURN(TensorInfo t2d_info, checkpoint->Info("t2d"));
    if (t2d_info.dtype != DType::kBool && t2d_info.dtype != DType::kU8) {
      return absl::InvalidArgumentError("tensor 't2d' of the " + where + " is " +
                                        std::string(DTypeName(t2d_info.dtype)) + "; expected bool");
    }
    EAGLE3_RETURN_IF_ERROR(checkpoint->ExpectShape("t2d", Shape{vocab}));
    EAGLE3_ASSIGN_OR_RETURN(TensorView t2d, checkpoint->View("t2d"));
    const uint8_t* mapped = t2d.data_as<const uint8_t>();
    for (int64_t x = 0; x < vocab; ++x) {
      const int64_t from = draft_of[static_cast<size_t>(x)];
      if ((mapped[x] != 0) == (from >= 0)) continue;
      return absl::InvalidArgumentError(
          "tensors 't2d' and 'd2t' of the " + where + " disagree: " +
          (from >= 0
               ? "d2t maps draft id " + Str(from) + " to target id " + Str(x) + " but t2d[" + Str(x) + "] is false"
               : "t2d[" + Str(x) + "] is true but no draft id maps to target id " + Str(x) + " through d2t"));
    }
  }
  d2t.assign(offsets, offsets + draft_vocab);
  return absl::OkStatus();
}

absl::Status DraftModel::Impl::LoadWeights(const std::vector<WeightSpec>& specs, bool own_embedding) {
  auto spec = [&](std::string_view name) -> const WeightSpec& {
    return *std::find_if(specs.begin(), specs.end(), [&](const WeightSpec& s) { return s.name == name; });
  };
  auto load = [&](std::string_view name) { return LoadShard(*checkpoint, spec(name), DType::kF32); };
  auto load_w = [&](std::string_view name) { return LoadShard(*checkpoint, spec(name), weight_dtype); };
  EAGLE3_ASSIGN_OR_RETURN(fc, load_w("fc.weight"));
  if (checkpoint->Has("fc.bias")) {
    EAGLE3_ASSIGN_OR_RETURN(fc_bias,
                            LoadShard(*checkpoint, WeightSpec{"fc.bias", Shape{config.hidden_size}}, DType::kF32));
  }
  if (config.norm_before_fc) {
    EAGLE3_ASSIGN_OR_RETURN(input_norm, load("input_norm.weight"));
  }
  if (config.fc_norm) {
    for (int64_t i = 0; i < config.num_aux_layers(); ++i) {
      EAGLE3_ASSIGN_OR_RETURN(Tensor w, load("fc_norm." + Str(i) + ".weight"));
      fc_norms.push_back(std::move(w));
    }
  }
  EAGLE3_ASSIGN_OR_RETURN(input_ln, load(prefix + "input_layernorm.weight"));
  EAGLE3_ASSIGN_OR_RETURN(hidden_norm, load(prefix + "hidden_norm.weight"));
  {
    const WeightSpec* qkv_specs[] = {&spec(prefix + "self_attn.q_proj.weight"),
                                     &spec(prefix + "self_attn.k_proj.weight"),
                                     &spec(prefix + "self_attn.v_proj.weight")};
    EAGLE3_ASSIGN_OR_RETURN(qkv_w, LoadStacked(qkv_specs));
  }
  EAGLE3_ASSIGN_OR_RETURN(o_proj, load_w(prefix + "self_attn.o_proj.weight"));
  EAGLE3_ASSIGN_OR_RETURN(post_ln, load(prefix + "post_attention_layernorm.weight"));
  {
    const WeightSpec* gate_up_specs[] = {&spec(prefix + "mlp.gate_proj.weight"), &spec(prefix + "mlp.up_proj.weight")};
    EAGLE3_ASSIGN_OR_RETURN(gate_up_w, LoadStacked(gate_up_specs));
  }
  EAGLE3_ASSIGN_OR_RETURN(down_w, load_w(prefix + "mlp.down_proj.weight"));
  EAGLE3_ASSIGN_OR_RETURN(final_norm, load("norm.weight"));
  if (!config.tie_word_embeddings) {
    EAGLE3_ASSIGN_OR_RETURN(lm_head, load_w("lm_head.weight"));
  }
  if (own_embedding) {
    EAGLE3_ASSIGN_OR_RETURN(
        embed, LoadShard(*checkpoint,
                         WeightSpec{"embed_tokens.weight", Shape{config.vocab_size, config.hidden_size}, TpSplit::kRows,
                                    true},
                         weight_dtype));
  } else {
    EAGLE3_ASSIGN_OR_RETURN(
        embed, LoadShard(*target_checkpoint,
                         WeightSpec{DeepseekEmbeddingName(target), Shape{target.vocab_size, target.hidden_size},
                                    TpSplit::kRows, true},
                         weight_dtype));
  }
  return absl::OkStatus();
}

absl::Status DraftModel::Impl::AllocateWorkspaces() {
  const int64_t t_max = options.max_tokens_per_forward;
  const int64_t s_max = options.max_context_len;
  const int64_t kv_row = 2 * kv_width;
  EAGLE3_ASSIGN_OR_RETURN(cache, Alloc(DType::kF32, Shape{options.num_kv_pages, options.page_size, kv_row}));
  EAGLE3_RETURN_IF_ERROR(ZeroFill(*backend, cache));  // unwritten slots read as zeros
  EAGLE3_ASSIGN_OR_RETURN(aux, Alloc(DType::kF32, Shape{t_max, config.fc_input_width()}));
  for (Tensor* t : {&g, &e, &r, &h, &partial, &lm_in}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, Alloc(DType::kF32, Shape{t_max, hidden_dim}));
  }
  EAGLE3_ASSIGN_OR_RETURN(x, Alloc(DType::kF32, Shape{t_max, 2 * hidden_dim}));
  EAGLE3_ASSIGN_OR_RETURN(qkv, Alloc(DType::kF32, Shape{t_max, q_width + kv_row}));
  EAGLE3_ASSIGN_OR_RETURN(attn, Alloc(DType::kF32, Shape{t_max, q_width}));
  EAGLE3_ASSIGN_OR_RETURN(gate_up, Alloc(DType::kF32, Shape{t_max, 2 * inter}));
  EAGLE3_ASSIGN_OR_RETURN(act, Alloc(DType::kF32, Shape{t_max, inter}));
  EAGLE3_ASSIGN_OR_RETURN(logits_shard, Alloc(DType::kF32, Shape{t_max, draft_vocab_shard}));
  EAGLE3_ASSIGN_OR_RETURN(logits_all, Alloc(DType::kF32, Shape{options.tp_size * t_max, draft_vocab_shard}));
  for (Tensor* t : {&tokens, &positions, &slots}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, Alloc(DType::kI64, Shape{t_max}));
  }
  {
    EAGLE3_ASSIGN_OR_RETURN(Tensor table, MakeRopeCosSin(config.rope, head_dim, s_max));
    EAGLE3_ASSIGN_OR_RETURN(cos_sin, ToDevice(std::move(table)));
  }
  // Staging and the attention metadata. Every sequence brings a row, so t_max bounds the sequences.
  max_pages = (s_max + options.page_size - 1) / options.page_size;
  for (Tensor* t : {&st_tokens, &st_positions, &st_slots}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, AllocStaging(DType::kI64, Shape{t_max}));
  }
  EAGLE3_ASSIGN_OR_RETURN(st_tables, AllocStaging(DType::kI32, Shape{t_max, max_pages}));
  EAGLE3_ASSIGN_OR_RETURN(st_starts, AllocStaging(DType::kI32, Shape{t_max + 1}));
  EAGLE3_ASSIGN_OR_RETURN(st_lens, AllocStaging(DType::kI32, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(st_mask, AllocStaging(DType::kU8, Shape{t_max, s_max}));
  EAGLE3_ASSIGN_OR_RETURN(st_hidden,
                          AllocStaging(DType::kF32, Shape{t_max * std::max(config.fc_input_width(), hidden_dim)}));
  EAGLE3_ASSIGN_OR_RETURN(st_logits, AllocStaging(DType::kF32, Shape{t_max, config.draft_vocab_size}));
  EAGLE3_ASSIGN_OR_RETURN(st_hidden_out, AllocStaging(DType::kF32, Shape{t_max, hidden_dim}));
  std::fill_n(st_mask.data_as<uint8_t>(), t_max * s_max, uint8_t{0});  // columns past a kv_len are never read
  EAGLE3_ASSIGN_OR_RETURN(d_tables, Alloc(DType::kI32, st_tables.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_starts, Alloc(DType::kI32, st_starts.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_lens, Alloc(DType::kI32, st_lens.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_mask, Alloc(DType::kU8, st_mask.shape()));
  EAGLE3_ASSIGN_OR_RETURN(slot_iota, DeviceIota(options.num_kv_pages * options.page_size, *backend));
  return absl::OkStatus();
}

absl::Status DraftModel::Impl::Validate(std::span<const DraftSequenceInput> batch, const TensorView& hidden,
                                        bool from_target, bool device_hidden) const {
  if (batch.empty()) return absl::InvalidArgumentError("DraftModel::Forward: empty batch");
  int64_t total = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const DraftSequenceInput& in = batch[s];
    const std::string seq = "DraftModel::Forward: sequence " + Str(static_cast<int64_t>(s));
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(seq + " has no rows");
    total += n;
    for (int64_t i = 0; i < n; ++i) {
      if (in.tokens[i] < 0 || in.tokens[i] >= config.vocab_size) {
        return absl::InvalidArgumentError(seq + " token " + Str(i) + " = " + Str(in.tokens[i]) +
                                          " is outside the target vocabulary [0, " + Str(config.vocab_size) +
                                          ") (draft rows take target ids: map draft ids through d2t first)");
      }
    }
    if (!in.positions.empty() && static_cast<int64_t>(in.positions.size()) != n) {
      return absl::InvalidArgumentError(seq + " has " + Str(static_cast<int64_t>(in.positions.size())) +
                                        " positions for " + Str(n) + " tokens");
    }
    if (in.cache_len < 0) return absl::InvalidArgumentError(seq + " cache_len " + Str(in.cache_len) + " < 0");
    const int64_t end = in.cache_len + n;
    const int64_t capacity = static_cast<int64_t>(in.page_table.size()) * options.page_size;
    if (end > options.max_context_len || end > capacity) {
      return absl::OutOfRangeError(seq + ": draft KV capacity exhausted: " + Str(in.cache_len) + " cached + " +
                                   Str(n) + " new rows need " + Str(end) + " slots; its " +
                                   Str(static_cast<int64_t>(in.page_table.size())) + " pages of " +
                                   Str(options.page_size) + " hold " + Str(capacity) + " and max_context_len is " +
                                   Str(options.max_context_len));
    }
    for (size_t p = 0; p < in.page_table.size(); ++p) {
      if (in.page_table[p] < 0 || in.page_table[p] >= options.num_kv_pages) {
        return absl::InvalidArgumentError(seq + " page_table[" + Str(static_cast<int64_t>(p)) + "] = " +
                                          Str(in.page_table[p]) + " is not a page of the draft cache [0, " +
                                          Str(options.num_kv_pages) + ")");
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = in.positions.empty() ? in.cache_len + i : in.positions[i];
      if (pos < 0 || pos >= options.max_context_len) {
        return absl::InvalidArgumentError(seq + " position " + Str(i) + " = " + Str(pos) +
                                          " is outside the RoPE table [0, max_context_len " +
                                          Str(options.max_context_len) + ")");
      }
    }
    if (!in.mask.empty()) {
      if (static_cast<int64_t>(in.mask.size()) != n * end) {
        return absl::InvalidArgumentError(seq + " mask has " + Str(static_cast<int64_t>(in.mask.size())) +
                                          " entries, expected [n, cache_len + n] = " + Str(n) + " x " + Str(end));
      }
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* row = &in.mask[static_cast<size_t>(i * end)];
        if (row[in.cache_len + i] == 0) {
          return absl::InvalidArgumentError(seq + " mask row " + Str(i) + " does not attend its own slot " +
                                            Str(in.cache_len + i));
        }
        for (int64_t j = in.cache_len + i + 1; j < end; ++j) {
          if (row[j] != 0) {
            return absl::InvalidArgumentError(seq + " mask row " + Str(i) + " attends slot " + Str(j) +
                                              ", a later new row (rows may attend the cache, earlier rows and "
                                              "themselves)");
          }
        }
      }
    }
  }
  if (total > options.max_tokens_per_forward) {
    return absl::OutOfRangeError("DraftModel::Forward: " + Str(total) + " rows exceed max_tokens_per_forward " +
                                 Str(options.max_tokens_per_forward));
  }
  const int64_t width = from_target ? tap->width() : config.hidden_size;
  if (!device_hidden && !IsHostContiguousF32(hidden, total, width)) {
    return absl::InvalidArgumentError(
        "DraftModel::Forward: hidden must be f32[" + Str(total) + ", " + Str(width) + "] contiguous on the host (" +
        (from_target ? "the aux states of the tap, " + tap->Describe() : std::string("the fed-back hidden_out rows")) +
        "), got " + hidden.ToString());
  }
  return absl::OkStatus();
}

// The outputs Finish fills, against the staged step.
absl::Status DraftModel::Impl::ValidateOutputs(const TensorView& logits, const TensorView& hidden_out) const {
  const int64_t rows = step.out_rows, total = step.t;
  if ((!step.io.logits.empty() && !logits.empty()) || (!step.io.hidden_out.empty() && !hidden_out.empty())) {
    return absl::InvalidArgumentError(
        "DraftModel::Finish: the staged step leaves its logits / hidden_out on the device (DraftStepIO); pass "
        "empty views for them");
  }
  if (step.io.logits.empty() && !IsHostContiguousF32(logits, rows, config.draft_vocab_size)) {
    return absl::InvalidArgumentError("DraftModel::Forward: logits must be f32[" + Str(rows) + ", " +
                                      Str(config.draft_vocab_size) + "] contiguous on the host, got " +
                                      logits.ToString());
  }
  if (step.io.hidden_out.empty() && !IsHostContiguousF32(hidden_out, total, config.hidden_size)) {
    return absl::InvalidArgumentError("DraftModel::Forward: hidden_out must be f32[" + Str(total) + ", " +
                                      Str(config.hidden_size) + "] contiguous on the host, got " +
                                      hidden_out.ToString());
  }
  return absl::OkStatus();
}

// K (after RoPE) | V of every new row into its cache slot, then every sequence's attention at once,
// lengths, page tables and mask rows from the device.
// The rows' K (after RoPE) and V into their cache slots.
absl::Status DraftModel::Impl::WriteKv() {
  const int64_t t = step.t;
  const int64_t kv_row = 2 * kv_width;
  const TensorView flat_cache(cache.data(), cache.dtype(), Shape{options.num_kv_pages * options.page_size, 1, kv_row},
                              cache.device());
  return backend->PagedWrite(Block(Rows(qkv, 0, t), 0, t, q_width, kv_row),
                             step.io.slots.empty() ? Rows(slots, 0, t) : step.io.slots, slot_iota, flat_cache);
}

absl::Status DraftModel::Impl::Attention() {
  const int64_t t = step.t;
  const int64_t b = static_cast<int64_t>(step.n.size());
  const TensorView qkv_t = Rows(qkv, 0, t);
  const DraftStepIO& io = step.io;
  return backend->BatchedPagedAttention(
      Heads(Block(qkv_t, 0, t, 0, q_width), heads, head_dim), cache,
      io.page_tables.empty() ? Rows(d_tables, 0, b) : io.page_tables,
      io.q_start.empty() ? Rows(d_starts, 0, b + 1) : io.q_start, io.kv_len.empty() ? Rows(d_lens, 0, b) : io.kv_len,
      options.max_context_len,
      !io.mask.empty() ? io.mask : step.causal ? TensorView() : Rows(d_mask, 0, t),  // empty: causal
      scale,
      Heads(Rows(attn, 0, t), heads, head_dim));
}

absl::Status DraftModel::Impl::CheckIO(const DraftStepIO& io) const {
  const std::string who = "DraftStepIO";
  const Device dev = backend->device();
  const int64_t t = step.t;
  const int64_t b = static_cast<int64_t>(step.n.size());
  const int64_t width = step.from_target ? tap->width() : hidden_dim;
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "tokens", io.tokens, DType::kI64, Shape{t}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "hidden", io.hidden, DType::kF32, Shape{t, width}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "mask", io.mask, DType::kU8, Shape{t, options.max_context_len}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "positions", io.positions, DType::kI64, Shape{t}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "slots", io.slots, DType::kI64, Shape{t}, dev));
  if (!io.page_tables.empty()) {
    const int64_t p = io.page_tables.rank() == 2 ? std::clamp<int64_t>(io.page_tables.dim(1), 1, max_pages) : max_pages;
    EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "page_tables", io.page_tables, DType::kI32, Shape{b, p}, dev));
  }
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "q_start", io.q_start, DType::kI32, Shape{b + 1}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "kv_len", io.kv_len, DType::kI32, Shape{b}, dev));
  if (io.kv_only && (!io.logits.empty() || !io.hidden_out.empty() || !io.logit_rows.empty())) {
    return absl::InvalidArgumentError(
        "DraftStepIO.kv_only: logits, hidden_out and logit_rows must be empty (a kv_only step computes none of them)");
  }
  int64_t rows = step.out_rows;
  if (!io.logit_rows.empty()) {
    if (std::any_of(step.n.begin(), step.n.end(), [&](int64_t n) { return n != step.n.front(); })) {
      return absl::InvalidArgumentError("DraftStepIO.logit_rows needs every sequence to bring the same number of rows");
    }
    EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "logit_rows", io.logit_rows, DType::kI32, Shape{b}, dev));
    rows = b;
  }
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "logits", io.logits, DType::kF32, Shape{rows, config.draft_vocab_size}, dev));
  return CheckStepView(who, "hidden_out", io.hidden_out, DType::kF32, Shape{t, hidden_dim}, dev);
}

absl::Status DraftModel::Impl::Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden,
                                     bool from_target, const DraftStepIO& io) {
  step.staged = false;
  EAGLE3_RETURN_IF_ERROR(Validate(batch, hidden, from_target, !io.hidden.empty()));
  step.from_target = from_target;
  step.causal = std::all_of(batch.begin(), batch.end(), [](const DraftSequenceInput& in) { return in.mask.empty(); });
  step.n.clear();
  step.all_logits.clear();
  step.out_rows = LogitRows(batch);
  int64_t* tok = st_tokens.data_as<int64_t>();
  int64_t* pos = st_positions.data_as<int64_t>();
  int64_t* slot = st_slots.data_as<int64_t>();
  const int64_t s_max = options.max_context_len, page_size = options.page_size;
  int64_t t = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const DraftSequenceInput& in = batch[b];
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    const int64_t end = in.cache_len + n;
    step.n.push_back(n);
    step.all_logits.push_back(in.all_logits ? 1 : 0);
    StageSequence(in.page_table, static_cast<int64_t>(b), t, end, max_pages, st_tables, st_starts, st_lens);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = in.cache_len + i;
      tok[t + i] = in.tokens[static_cast<size_t>(i)];
      pos[t + i] = in.positions.empty() ? p : in.positions[static_cast<size_t>(i)];
      slot[t + i] = in.page_table[static_cast<size_t>(p / page_size)] * page_size + p % page_size;
      if (!io.mask.empty() || step.causal) continue;
      // Mask row over the sequence's end = cache_len + n slots: the caller's, or causal.
      uint8_t* row = st_mask.data_as<uint8_t>() + (t + i) * s_max;
      for (int64_t j = 0; j < end; ++j) {
        row[j] = in.mask.empty() ? (j <= p ? 1 : 0) : (in.mask[static_cast<size_t>(i * end + j)] != 0 ? 1 : 0);
      }
    }
    t += n;
  }
  st_starts.data_as<int32_t>()[batch.size()] = static_cast<int32_t>(t);
  step.t = t;
  step.io = DraftStepIO();
  EAGLE3_RETURN_IF_ERROR(CheckIO(io));
  step.io = io;
  if (!io.logit_rows.empty()) step.out_rows = static_cast<int64_t>(batch.size());
  // The input rows, [t, width] contiguous at the start of st_hidden.
  if (io.hidden.empty()) std::copy_n(hidden.data_as<const float>(), hidden.numel(), st_hidden.data_as<float>());
  step.staged = true;
  return absl::OkStatus();
}

std::vector<int64_t> DraftModel::Impl::Signature() const {
  if (!step.staged) return {};
  std::vector<int64_t> sig = {step.from_target, step.causal, step.io.kv_only, static_cast<int64_t>(step.n.size())};
  sig.insert(sig.end(), step.n.begin(), step.n.end());
  sig.insert(sig.end(), step.all_logits.begin(), step.all_logits.end());
  for (const TensorView* v : {&step.io.tokens, &step.io.hidden, &step.io.mask, &step.io.logit_rows, &step.io.logits,
                              &step.io.hidden_out, &step.io.positions, &step.io.slots, &step.io.page_tables,
                              &step.io.q_start, &step.io.kv_len}) {
    sig.push_back(ViewAddress(*v));
  }
  return sig;
}

absl::Status DraftModel::Impl::Launch() {
  if (!step.staged) return absl::FailedPreconditionError("DraftModel::Launch: no batch is staged (call Stage first)");
  const int64_t t = step.t;
  const int64_t b = static_cast<int64_t>(step.n.size());
  const DraftStepIO& io = step.io;
  // Inputs the caller keeps on the device are read in place; the others are copied from staging.
  const TensorView tokens_t = io.tokens.empty() ? Rows(tokens, 0, t) : io.tokens;
  const TensorView pos_t = io.positions.empty() ? Rows(positions, 0, t) : io.positions;
  if (io.tokens.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_tokens, 0, t), tokens_t));
  if (io.positions.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_positions, 0, t), pos_t));
  if (io.slots.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_slots, 0, t), Rows(slots, 0, t)));
  if (io.page_tables.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_tables, 0, b), Rows(d_tables, 0, b)));
  if (io.q_start.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_starts, 0, b + 1), Rows(d_starts, 0, b + 1)));
  if (io.kv_len.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_lens, 0, b), Rows(d_lens, 0, b)));
  if (io.mask.empty() && !step.causal) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_mask, 0, t), Rows(d_mask, 0, t)));
  const int64_t width = step.from_target ? tap->width() : hidden_dim;
  const TensorView staged_hidden =
      io.hidden.empty() ? TensorView(st_hidden.data(), DType::kF32, Shape{t, width}, st_hidden.device()) : io.hidden;

  // g: fc over the (normalized) aux states, or the fed-back hidden as given.
  const TensorView g_t = Rows(g, 0, t);
  if (step.from_target) {
    const TensorView aux_t = Rows(aux, 0, t);
    EAGLE3_RETURN_IF_ERROR(backend->Copy(staged_hidden, aux_t));
    if (config.norm_before_fc) EAGLE3_RETURN_IF_ERROR(backend->RmsNorm(aux_t, input_norm, eps, aux_t));
    const int64_t ht = config.target_hidden_size;
    for (size_t i = 0; i < fc_norms.size(); ++i) {
      const TensorView slice = Block(aux_t, 0, t, static_cast<int64_t>(i) * ht, ht);
      EAGLE3_RETURN_IF_ERROR(backend->RmsNorm(slice, fc_norms[i], eps, slice));
    }
    GemmOptions fc_options = kWeightsGemm;
    const TensorView bias = fc_bias.view();
    if (!fc_bias.empty()) fc_options.bias = &bias;
    EAGLE3_RETURN_IF_ERROR(backend->Gemm(aux_t, fc, g_t, fc_options));
  } else {
    EAGLE3_RETURN_IF_ERROR(backend->Copy(staged_hidden, g_t));
  }

  // x = [input_layernorm(embed(token)) | hidden_norm(g)]; the residual is g or hidden_norm(g).
  const TensorView e_t = Rows(e, 0, t), x_t = Rows(x, 0, t), r_t = Rows(r, 0, t), h_t = Rows(h, 0, t);
  const TensorView partial_t = Rows(partial, 0, t);
  EAGLE3_RETURN_IF_ERROR(backend->EmbeddingLookup(tokens_t, embed, options.rank * vocab_shard, e_t));
  EAGLE3_RETURN_IF_ERROR(Ranks().AllReduce(e_t));
  EAGLE3_RETURN_IF_ERROR(backend->RmsNorm(e_t, input_ln, eps, Block(x_t, 0, t, 0, hidden_dim)));
  const TensorView normed_g = Block(x_t, 0, t, hidden_dim, hidden_dim);
  EAGLE3_RETURN_IF_ERROR(backend->RmsNorm(g_t, hidden_norm, eps, normed_g));
  EAGLE3_RETURN_IF_ERROR(backend->Copy(config.norm_before_residual ? normed_g : g_t, r_t));

  // Attention: this rank's q heads and kv heads; K is cached after RoPE.
  const TensorView qkv_t = Rows(qkv, 0, t);
  EAGLE3_RETURN_IF_ERROR(backend->Gemm(x_t, qkv_w, qkv_t, kWeightsGemm));
  // RoPE on the q heads and the k heads at once: they are adjacent in each qkv row ([q | k | v]) and
  // rotate alike (one launch and one position check instead of two of each on a device).
  EAGLE3_RETURN_IF_ERROR(backend->ApplyRope(Heads(Block(qkv_t, 0, t, 0, q_width + kv_width), heads + kv_heads,
                                                  head_dim),
                                            0, head_dim, pos_t, cos_sin, RopeStyle::kRotateHalf));
  EAGLE3_RETURN_IF_ERROR(WriteKv());
  if (io.kv_only) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(Attention());
  EAGLE3_RETURN_IF_ERROR(backend->Gemm(Rows(attn, 0, t), o_proj, partial_t, kWeightsGemm));
  EAGLE3_RETURN_IF_ERROR(Ranks().AllReduce(partial_t));
  EAGLE3_RETURN_IF_ERROR(backend->AddRmsNorm(partial_t, r_t, post_ln, eps, h_t));

  // MLP, then r += mlp and h = norm(r).
  const TensorView gate_up_t = Rows(gate_up, 0, t), act_t = Rows(act, 0, t);
  EAGLE3_RETURN_IF_ERROR(backend->Gemm(h_t, gate_up_w, gate_up_t, kWeightsGemm));
  EAGLE3_RETURN_IF_ERROR(backend->SiluMul(gate_up_t, act_t));
  EAGLE3_RETURN_IF_ERROR(backend->Gemm(act_t, down_w, partial_t, kWeightsGemm));
  EAGLE3_RETURN_IF_ERROR(Ranks().AllReduce(partial_t));
  EAGLE3_RETURN_IF_ERROR(backend->AddRmsNorm(partial_t, r_t, final_norm, eps, h_t));
  EAGLE3_RETURN_IF_ERROR(backend->Copy(config.norm_output ? h_t : r_t,
                                       io.hidden_out.empty() ? Rows(st_hidden_out, 0, t) : io.hidden_out));

  // lm_head over the requested rows, vocab-parallel, all-gathered into draft-vocabulary logits.
  int64_t out_rows = b;
  if (!io.logit_rows.empty()) {
    // One row per sequence, chosen on the device (indices local to each sequence's n rows).
    EAGLE3_RETURN_IF_ERROR(backend->GatherRows(h_t, io.logit_rows, Rows(lm_in, 0, b), b));
  } else {
    EAGLE3_ASSIGN_OR_RETURN(out_rows, CopyLogitRows(*backend, h_t, step.n, step.all_logits, lm_in));
  }
  return VocabParallelLogits(Ranks(), Rows(lm_in, 0, out_rows), lm_head.empty() ? embed : lm_head, logits_shard,
                             logits_all, config.draft_vocab_size,
                             io.logits.empty() ? Rows(st_logits, 0, out_rows) : io.logits);
}

absl::Status DraftModel::Impl::Finish(const TensorView& logits, const TensorView& hidden_out) {
  if (!step.staged) return absl::FailedPreconditionError("DraftModel::Finish: no batch is staged (call Stage first)");
  if (step.io.kv_only) {
    return absl::FailedPreconditionError("DraftModel::Finish: the staged step is kv_only (it has no outputs)");
  }
  EAGLE3_RETURN_IF_ERROR(ValidateOutputs(logits, hidden_out));
  EAGLE3_RETURN_IF_ERROR(backend->Synchronize());
  if (step.io.logits.empty()) {
    std::copy_n(st_logits.data_as<const float>(), step.out_rows * config.draft_vocab_size, logits.data_as<float>());
  }
  if (step.io.hidden_out.empty()) {
    std::copy_n(st_hidden_out.data_as<const float>(), step.t * hidden_dim, hidden_out.data_as<float>());
  }
  return absl::OkStatus();
}

DraftModel::DraftModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DraftModel::~DraftModel() = default;

const Eagle3DraftConfig& DraftModel::config() const { return impl_->config; }
const DraftModelOptions& DraftModel::options() const { return impl_->options; }
const HiddenStateTap& DraftModel::tap() const { return *impl_->tap; }
int64_t DraftModel::draft_vocab() const { return impl_->config.draft_vocab_size; }
std::span<const int64_t> DraftModel::d2t() const { return impl_->d2t; }

int64_t DraftModel::LogitRows(std::span<const DraftSequenceInput> batch) {
  int64_t rows = 0;
  for (const DraftSequenceInput& in : batch) rows += in.all_logits ? static_cast<int64_t>(in.tokens.size()) : 1;
  return rows;
}

absl::Status DraftModel::Forward(std::span<const DraftSequenceInput> batch, const TensorView& hidden,
                                 bool from_target, const TensorView& logits, const TensorView& hidden_out) {
  Impl& m = *impl_;
  EAGLE3_RETURN_IF_ERROR(m.Stage(batch, hidden, from_target, DraftStepIO()));
  EAGLE3_RETURN_IF_ERROR(m.ValidateOutputs(logits, hidden_out));
  EAGLE3_RETURN_IF_ERROR(m.Launch());
  return m.Finish(logits, hidden_out);
}

absl::Status DraftModel::Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden,
                               bool from_target) {
  return impl_->Stage(batch, hidden, from_target, DraftStepIO());
}

absl::Status DraftModel::Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target,
                               const DraftStepIO& io) {
  return impl_->Stage(batch, hidden, from_target, io);
}

absl::Status DraftModel::Launch() { return impl_->Launch(); }

absl::Status DraftModel::Finish(const TensorView& logits, const TensorView& hidden_out) {
  return impl_->Finish(logits, hidden_out);
}

std::vector<int64_t> DraftModel::StepSignature() const { return impl_->Signature(); }

bool DraftModel::StepIsCapturable() const { return impl_->step.staged; }

// The buffers AllocateWorkspaces sizes from the options and the configs, summed before anything is
// allocated: host staging always, the KV cache and workspaces when they live in host memory (a host
// backend; a device allocator reports its own exhaustion).
absl::Status DraftModel::Impl::CheckBuffersFit() const {
  const int64_t t = options.max_tokens_per_forward, s = options.max_context_len;
  const int64_t page_size = options.page_size, pages = options.num_kv_pages;
  const int64_t pages_per_seq = s / page_size + (s % page_size != 0 ? 1 : 0);
  const int64_t fc_in = config.fc_input_width();
  const std::string tokens = "max_tokens_per_forward " + Str(t);
  const std::string context = "max_context_len " + Str(s);
  HostByteBudget budget("DraftModel");
  budget.Add(tokens + " x " + context + " (mask staging)", {t, s}, 1);
  budget.Add(tokens + " x " + context + " / page_size " + Str(page_size) + " (page table staging)",
             {t, pages_per_seq}, 4);
  budget.Add(tokens + " x draft_vocab_size " + Str(config.draft_vocab_size) + " (logits staging)",
             {t, config.draft_vocab_size}, 4);
  budget.Add(tokens + " x fc input / hidden_size " + Str(hidden_dim) + " (hidden staging)",
             {t, std::max(fc_in, hidden_dim) + hidden_dim}, 4);
  budget.Add(context + " x head_dim " + Str(head_dim) + " (RoPE table)", {s, head_dim}, 4);
  if (backend->allocator().device().is_cpu()) {
    budget.Add("num_kv_pages " + Str(pages) + " x page_size " + Str(page_size) + " x 2 x kv width " + Str(kv_width) +
                   " (KV cache)",
               {pages, page_size, 2 * kv_width}, 4);
    budget.Add(tokens + " x " + context + " (mask)", {t, s}, 1);
    budget.Add("(tp_size + 1) x " + tokens + " x draft vocab shard " + Str(draft_vocab_shard) + " (logits)",
               {options.tp_size + 1, t, draft_vocab_shard}, 4);
    budget.Add(tokens + " x layer widths (workspaces)",
               {t, fc_in + 8 * hidden_dim + 2 * q_width + 2 * kv_width + 3 * inter}, 4);
    budget.Add("num_kv_pages " + Str(pages) + " x page_size " + Str(page_size) + " (slot ids)", {pages, page_size},
               8);
  }
  return budget.Check();
}

absl::StatusOr<std::unique_ptr<DraftModel>> DraftModel::Create(const std::string& draft_dir,
                                                               const std::string& target_dir,
                                                               const DraftModelOptions& options,
                                                               Communicator* communicator, Backend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("DraftModel: backend is null");
  EAGLE3_RETURN_IF_ERROR(options.Check("DraftModel", communicator));
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.options = options;
  m.comm = communicator;
  m.backend = backend;
  EAGLE3_ASSIGN_OR_RETURN(m.config, Eagle3DraftConfig::FromFile(draft_dir));
  EAGLE3_ASSIGN_OR_RETURN(m.target, DeepseekV2Config::FromFile(target_dir));
  const Eagle3DraftConfig& c = m.config;
  EAGLE3_RETURN_IF_ERROR(m.CheckAgainstTarget());
  if (c.norm_before_fc && c.fc_norm) {
    return absl::InvalidArgumentError(c.source +
                                      ": norm_before_fc and fc_norm are both true; they are alternative norms "
                                      "before fc (one over the whole aux row, or one per aux layer), never both");
  }
  const int tp = options.tp_size;
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"num_key_value_heads", c.num_key_value_heads},
                                   std::pair<const char*, int64_t>{"intermediate_size", c.intermediate_size}}) {
    if (value % tp != 0) {
      return absl::InvalidArgumentError(c.source + ": " + key + " = " + Str(value) + " is not divisible by tp_size " +
                                        Str(tp) + " (the draft's kv heads and MLP are split across the TP ranks)");
    }
  }
  {
    std::optional<std::span<const int>> ids;
    if (options.aux_layer_ids_override.has_value()) {
      ids = std::span<const int>(*options.aux_layer_ids_override);
    } else if (c.aux_layer_ids.has_value()) {
      ids = std::span<const int>(*c.aux_layer_ids);
    }
    const int layers = static_cast<int>(m.target.num_hidden_layers);
    absl::StatusOr<HiddenStateTap> tap =
        HiddenStateTap::Create(ids, options.convention, layers, m.target.hidden_size, c.fc_input_width());
    if (!tap.ok() && options.aux_layer_ids_override.has_value()) {
      return absl::Status(tap.status().code(), "DraftModelOptions::aux_layer_ids_override " +
                                                   JoinInts(*options.aux_layer_ids_override) + " (replacing " +
                                                   c.source + "'s aux layer ids): " +
                                                   std::string(tap.status().message()));
    }
    if (!tap.ok()) return tap.status();
    m.tap.emplace(*std::move(tap));
  }

  EAGLE3_ASSIGN_OR_RETURN(m.checkpoint, Checkpoint::Open(draft_dir));
  EAGLE3_ASSIGN_OR_RETURN(m.prefix, DraftLayerPrefix(*m.checkpoint));
  const bool own_embedding = m.checkpoint->Has("embed_tokens.weight");
  if (!own_embedding && c.hidden_size != m.target.hidden_size) {
    return absl::InvalidArgumentError(
        c.source + ": hidden_size = " + Str(c.hidden_size) + " differs from the target's hidden_size = " +
        Str(m.target.hidden_size) + " (" + m.target.source +
        "), so the draft cannot share the target's embedding, and its checkpoint has no embed_tokens.weight");
  }
  const std::vector<WeightSpec> specs = Eagle3DraftWeights(c, m.prefix);
  EAGLE3_RETURN_IF_ERROR(m.CheckTensors(specs, own_embedding));
  if (!own_embedding) {
    EAGLE3_ASSIGN_OR_RETURN(m.target_checkpoint, Checkpoint::Open(target_dir));
    const std::string embed_name = DeepseekEmbeddingName(m.target);
    if (!m.target_checkpoint->Has(embed_name)) {
      return absl::NotFoundError("target checkpoint '" + target_dir + "' has no tensor '" + embed_name +
                                 "', the embedding the draft shares");
    }
    EAGLE3_RETURN_IF_ERROR(
        m.target_checkpoint->ExpectShape(embed_name, Shape{m.target.vocab_size, m.target.hidden_size}));
  }
  EAGLE3_RETURN_IF_ERROR(m.LoadVocabMapping());

  m.hidden_dim = c.hidden_size;
  m.head_dim = c.head_dim;
  m.heads = c.num_attention_heads / tp;
  m.kv_heads = c.num_key_value_heads / tp;
  m.group = c.num_attention_heads / c.num_key_value_heads;
  m.q_width = m.heads * m.head_dim;
  m.kv_width = m.kv_heads * m.head_dim;
  m.inter = c.intermediate_size / tp;
  m.vocab_shard = PaddedSize(c.vocab_size, kVocabPadPerRank * tp) / tp;
  m.draft_vocab_shard = PaddedSize(c.draft_vocab_size, kVocabPadPerRank * tp) / tp;
  m.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  m.eps = static_cast<float>(c.rms_norm_eps);
  EAGLE3_ASSIGN_OR_RETURN(m.weight_dtype, ResolveWeightDtype(options.weight_dtype, *backend, "DraftModel"));
  EAGLE3_RETURN_IF_ERROR(m.CheckBuffersFit());
  EAGLE3_RETURN_IF_ERROR(m.LoadWeights(specs, own_embedding));
  EAGLE3_RETURN_IF_ERROR(m.AllocateWorkspaces());
  m.checkpoint.reset();
  m.target_checkpoint.reset();
  return std::unique_ptr<DraftModel>(new DraftModel(std::move(impl)));
}

}  // namespace eagle3
