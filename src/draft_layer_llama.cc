// The Llama-style EAGLE-3 head's layer (DraftKind::kLlama; the math in eagle3/draft_model.h): fc over
// the taps, [input_layernorm(embed) | hidden_norm(g)] into GQA attention with rotate-half RoPE over a
// paged [K | V] cache, a dense SiLU MLP, the draft's own norm and lm_head.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "draft_layer.h"
#include "draft_layer_common.h"
#include "view_slices.h"
#include "zero_fill.h"
#include "eagle3/checkpoint.h"
#include "eagle3/draft_layer_prefix.h"
#include "eagle3/rope_table.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.substr(0, prefix.size()) == prefix;
}

class LlamaDraftLayer final : public DraftLayer {
 public:
  LlamaDraftLayer(const Eagle3DraftConfig& config, const DeepseekV2Config& target, const DraftRank& rank,
                  std::unique_ptr<Checkpoint> checkpoint, std::unique_ptr<Checkpoint> target_checkpoint,
                  std::vector<WeightSpec> specs, std::string prefix, bool own_embedding)
      : config_(config),
        target_(target),
        rank_(rank),
        checkpoint_(std::move(checkpoint)),
        target_checkpoint_(std::move(target_checkpoint)),
        specs_(std::move(specs)),
        prefix_(std::move(prefix)),
        own_embedding_(own_embedding) {
    const int tp = rank.options.tp_size;
    hidden_ = config.hidden_size;
    head_dim_ = config.head_dim;
    heads_ = config.num_attention_heads / tp;
    kv_heads_ = config.num_key_value_heads / tp;
    q_width_ = heads_ * head_dim_;
    kv_width_ = kv_heads_ * head_dim_;
    inter_ = config.intermediate_size / tp;
    scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim)));
    eps_ = static_cast<float>(config.rms_norm_eps);
    input_.hidden_size = config.hidden_size;
    input_.target_hidden_size = config.target_hidden_size;
    input_.fc_input_width = config.fc_input_width();
    input_.eps = eps_;
    input_.norm_before_residual = config.norm_before_residual;
  }

  void AddBuffers(const std::string& tokens, const std::string& context, HostByteBudget& budget) const override;
  absl::Status Load(DraftHeadWeights& head) override;
  absl::Status Forward(const DraftLayerStep& step) override;

 private:
  // This rank's shard of `spec`, read straight into `dtype` (weight_dtype for Gemm weights and the
  // embedding, f32 for norms and fc.bias), on the device in weight memory (Backend::weight_allocator:
  // one device allocation per chunk of it instead of one per tensor); a `stack_part`, which
  // LoadStacked copies into its stacked weight and frees, in Backend::allocator() instead (freed
  // weight memory returns only with its whole chunk).
  absl::StatusOr<Tensor> LoadShard(const Checkpoint& from, const WeightSpec& spec, DType dtype,
                                   bool stack_part = false) const;
  // Rows of several shards stacked into one weight (merged q/k/v, gate/up: one Gemm each).
  absl::StatusOr<Tensor> LoadStacked(std::span<const WeightSpec* const> specs) const;
  absl::Status Attention(const DraftLayerStep& step) const;

  Eagle3DraftConfig config_;
  DeepseekV2Config target_;
  const DraftRank& rank_;
  std::unique_ptr<Checkpoint> checkpoint_;         // the draft's; released after Load
  std::unique_ptr<Checkpoint> target_checkpoint_;  // only when the embedding is the target's
  std::vector<WeightSpec> specs_;
  std::string prefix_;  // "midlayer." or "layers.0."
  bool own_embedding_ = false;

  // Per-rank dims.
  int64_t hidden_ = 0, head_dim_ = 0, heads_ = 0, kv_heads_ = 0;
  int64_t q_width_ = 0, kv_width_ = 0, inter_ = 0;
  float scale_ = 0.0f, eps_ = 0.0f;

  Eagle3Input input_;
  Tensor qkv_w_, o_proj_, post_ln_, gate_up_w_, down_w_, final_norm_;
  Tensor cache_;    // [num_kv_pages, page_size, 2 * kv_width]: K (after RoPE) | V
  Tensor cos_sin_;  // [max_context_len, head_dim]
  // Workspaces, sized at Load.
  Tensor r_, h_, qkv_, attn_, partial_, gate_up_, act_;
};

void LlamaDraftLayer::AddBuffers(const std::string& tokens, const std::string& context,
                                 HostByteBudget& budget) const {
  const DraftModelOptions& o = rank_.options;
  const int64_t t = o.max_tokens_per_forward, s = o.max_context_len;
  budget.Add(context + " x head_dim " + Str(head_dim_) + " (RoPE table)", {s, head_dim_}, 4);
  if (!rank_.backend->allocator().device().is_cpu()) return;
  budget.Add("num_kv_pages " + Str(o.num_kv_pages) + " x page_size " + Str(o.page_size) + " x 2 x kv width " +
                 Str(kv_width_) + " (KV cache)",
             {o.num_kv_pages, o.page_size, 2 * kv_width_}, 4);
  budget.Add(tokens + " x layer widths (workspaces)",
             {t, config_.fc_input_width() + 6 * hidden_ + 2 * q_width_ + 2 * kv_width_ + 3 * inter_}, 4);
}

absl::StatusOr<Tensor> LlamaDraftLayer::LoadShard(const Checkpoint& from, const WeightSpec& spec, DType dtype,
                                                  bool stack_part) const {
  const DraftModelOptions& o = rank_.options;
  EAGLE3_ASSIGN_OR_RETURN(Tensor host, from.ReadShard(spec.name, spec.ForRank(o.tp_size, o.rank), dtype));
  if (rank_.backend->device().is_cpu()) return host;
  Allocator& memory = stack_part ? rank_.backend->allocator() : rank_.backend->weight_allocator();
  EAGLE3_ASSIGN_OR_RETURN(Tensor device, Tensor::Empty(host.dtype(), host.shape(), memory));
  EAGLE3_RETURN_IF_ERROR(rank_.backend->Copy(host, device));
  return device;
}

absl::StatusOr<Tensor> LlamaDraftLayer::LoadStacked(std::span<const WeightSpec* const> specs) const {
  std::vector<Tensor> parts;
  int64_t rows = 0;
  for (const WeightSpec* spec : specs) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor part, LoadShard(*checkpoint_, *spec, rank_.weight_dtype, /*stack_part=*/true));
    rows += part.dim(0);
    parts.push_back(std::move(part));
  }
  EAGLE3_ASSIGN_OR_RETURN(Tensor merged, Tensor::Empty(rank_.weight_dtype, Shape{rows, parts.front().dim(1)},
                                                       rank_.backend->weight_allocator()));
  int64_t row = 0;
  for (const Tensor& part : parts) {
    EAGLE3_RETURN_IF_ERROR(rank_.backend->Copy(part, Rows(merged, row, part.dim(0))));
    row += part.dim(0);
  }
  return merged;
}

absl::Status LlamaDraftLayer::Load(DraftHeadWeights& head) {
  const DType weight_dtype = rank_.weight_dtype;
  auto spec = [&](std::string_view name) -> const WeightSpec& {
    return *std::find_if(specs_.begin(), specs_.end(), [&](const WeightSpec& s) { return s.name == name; });
  };
  auto load = [&](std::string_view name) { return LoadShard(*checkpoint_, spec(name), DType::kF32); };
  auto load_w = [&](std::string_view name) { return LoadShard(*checkpoint_, spec(name), weight_dtype); };
  EAGLE3_ASSIGN_OR_RETURN(input_.fc, load_w("fc.weight"));
  if (checkpoint_->Has("fc.bias")) {
    EAGLE3_ASSIGN_OR_RETURN(input_.fc_bias,
                            LoadShard(*checkpoint_, WeightSpec{"fc.bias", Shape{config_.hidden_size}}, DType::kF32));
  }
  if (config_.norm_before_fc) {
    EAGLE3_ASSIGN_OR_RETURN(input_.input_norm, load("input_norm.weight"));
  }
  if (config_.fc_norm) {
    for (int64_t i = 0; i < config_.num_aux_layers(); ++i) {
      EAGLE3_ASSIGN_OR_RETURN(Tensor w, load("fc_norm." + Str(i) + ".weight"));
      input_.fc_norms.push_back(std::move(w));
    }
  }
  EAGLE3_ASSIGN_OR_RETURN(input_.input_layernorm, load(prefix_ + "input_layernorm.weight"));
  EAGLE3_ASSIGN_OR_RETURN(input_.hidden_norm, load(prefix_ + "hidden_norm.weight"));
  {
    const WeightSpec* qkv_specs[] = {&spec(prefix_ + "self_attn.q_proj.weight"),
                                     &spec(prefix_ + "self_attn.k_proj.weight"),
                                     &spec(prefix_ + "self_attn.v_proj.weight")};
    EAGLE3_ASSIGN_OR_RETURN(qkv_w_, LoadStacked(qkv_specs));
  }
  EAGLE3_ASSIGN_OR_RETURN(o_proj_, load_w(prefix_ + "self_attn.o_proj.weight"));
  EAGLE3_ASSIGN_OR_RETURN(post_ln_, load(prefix_ + "post_attention_layernorm.weight"));
  {
    const WeightSpec* gate_up_specs[] = {&spec(prefix_ + "mlp.gate_proj.weight"),
                                         &spec(prefix_ + "mlp.up_proj.weight")};
    EAGLE3_ASSIGN_OR_RETURN(gate_up_w_, LoadStacked(gate_up_specs));
  }
  EAGLE3_ASSIGN_OR_RETURN(down_w_, load_w(prefix_ + "mlp.down_proj.weight"));
  EAGLE3_ASSIGN_OR_RETURN(final_norm_, load("norm.weight"));
  if (!config_.tie_word_embeddings) {
    EAGLE3_ASSIGN_OR_RETURN(head.lm_head, load_w("lm_head.weight"));
  }
  if (own_embedding_) {
    EAGLE3_ASSIGN_OR_RETURN(
        head.embed, LoadShard(*checkpoint_,
                              WeightSpec{"embed_tokens.weight", Shape{config_.vocab_size, config_.hidden_size},
                                         TpSplit::kRows, true},
                              weight_dtype));
  } else {
    EAGLE3_ASSIGN_OR_RETURN(
        head.embed, LoadShard(*target_checkpoint_,
                              WeightSpec{DeepseekEmbeddingName(target_), Shape{target_.vocab_size, target_.hidden_size},
                                         TpSplit::kRows, true},
                              weight_dtype));
  }
  checkpoint_.reset();
  target_checkpoint_.reset();

  const DraftModelOptions& o = rank_.options;
  const int64_t t_max = o.max_tokens_per_forward;
  EAGLE3_ASSIGN_OR_RETURN(cache_, rank_.Alloc(DType::kF32, Shape{o.num_kv_pages, o.page_size, 2 * kv_width_}));
  EAGLE3_RETURN_IF_ERROR(ZeroFill(*rank_.backend, cache_));  // unwritten slots read as zeros
  EAGLE3_RETURN_IF_ERROR(input_.Allocate(rank_, t_max));
  for (Tensor* t : {&r_, &h_, &partial_}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, rank_.Alloc(DType::kF32, Shape{t_max, hidden_}));
  }
  EAGLE3_ASSIGN_OR_RETURN(qkv_, rank_.Alloc(DType::kF32, Shape{t_max, q_width_ + 2 * kv_width_}));
  EAGLE3_ASSIGN_OR_RETURN(attn_, rank_.Alloc(DType::kF32, Shape{t_max, q_width_}));
  EAGLE3_ASSIGN_OR_RETURN(gate_up_, rank_.Alloc(DType::kF32, Shape{t_max, 2 * inter_}));
  EAGLE3_ASSIGN_OR_RETURN(act_, rank_.Alloc(DType::kF32, Shape{t_max, inter_}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor table, MakeRopeCosSin(config_.rope, head_dim_, o.max_context_len));
  if (rank_.backend->device().is_cpu()) {
    cos_sin_ = std::move(table);
  } else {
    EAGLE3_ASSIGN_OR_RETURN(cos_sin_, rank_.Alloc(DType::kF32, table.shape()));
    EAGLE3_RETURN_IF_ERROR(rank_.backend->Copy(table, cos_sin_));
  }
  return absl::OkStatus();
}

// Every sequence's attention at once, lengths, page tables and mask rows from the device.
absl::Status LlamaDraftLayer::Attention(const DraftLayerStep& step) const {
  const int64_t t = step.rows;
  return rank_.backend->BatchedPagedAttention(Heads(Block(Rows(qkv_, 0, t), 0, t, 0, q_width_), heads_, head_dim_),
                                              cache_, step.page_tables, step.q_start, step.kv_len, step.max_kv_len,
                                              step.mask, scale_, Heads(Rows(attn_, 0, t), heads_, head_dim_));
}

absl::Status LlamaDraftLayer::Forward(const DraftLayerStep& step) {
  Backend& be = *rank_.backend;
  const RankCollectives ranks = rank_.Ranks();
  const int64_t t = step.rows;
  // x = [input_layernorm(embed(token)) | hidden_norm(g)] and the residual.
  const TensorView r_t = Rows(r_, 0, t), h_t = Rows(h_, 0, t), x_t = input_.X(t);
  const TensorView partial_t = Rows(partial_, 0, t);
  EAGLE3_RETURN_IF_ERROR(input_.Build(be, step, r_t));

  // Attention: this rank's q heads and kv heads; K is cached after RoPE.
  const TensorView qkv_t = Rows(qkv_, 0, t);
  EAGLE3_RETURN_IF_ERROR(be.Gemm(x_t, qkv_w_, qkv_t, kWeightsGemm));
  // RoPE on the q heads and the k heads at once: they are adjacent in each qkv row ([q | k | v]) and
  // rotate alike (one launch and one position check instead of two of each on a device).
  EAGLE3_RETURN_IF_ERROR(be.ApplyRope(Heads(Block(qkv_t, 0, t, 0, q_width_ + kv_width_), heads_ + kv_heads_, head_dim_),
                                      0, head_dim_, step.positions, cos_sin_, RopeStyle::kRotateHalf));
  // The rows' K | V into their cache slots through a flat [num_pages * page_size, 1, W] view whose
  // page table is the identity.
  const DraftModelOptions& o = rank_.options;
  const int64_t kv_row = 2 * kv_width_;
  const TensorView flat_cache(cache_.data(), cache_.dtype(), Shape{o.num_kv_pages * o.page_size, 1, kv_row},
                              cache_.device());
  EAGLE3_RETURN_IF_ERROR(be.PagedWrite(Block(qkv_t, 0, t, q_width_, kv_row), step.slots, step.slot_iota, flat_cache));
  if (step.kv_only) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(Attention(step));
  EAGLE3_RETURN_IF_ERROR(be.Gemm(Rows(attn_, 0, t), o_proj_, partial_t, kWeightsGemm));
  EAGLE3_RETURN_IF_ERROR(ranks.AllReduce(partial_t));
  EAGLE3_RETURN_IF_ERROR(be.AddRmsNorm(partial_t, r_t, post_ln_, eps_, h_t));

  // MLP, then r += mlp and head_in = norm(r).
  const TensorView gate_up_t = Rows(gate_up_, 0, t), act_t = Rows(act_, 0, t);
  EAGLE3_RETURN_IF_ERROR(be.Gemm(h_t, gate_up_w_, gate_up_t, kWeightsGemm));
  EAGLE3_RETURN_IF_ERROR(be.SiluMul(gate_up_t, act_t));
  EAGLE3_RETURN_IF_ERROR(be.Gemm(act_t, down_w_, partial_t, kWeightsGemm));
  EAGLE3_RETURN_IF_ERROR(ranks.AllReduce(partial_t));
  EAGLE3_RETURN_IF_ERROR(be.AddRmsNorm(partial_t, r_t, final_norm_, eps_, step.head_in));
  return be.Copy(config_.norm_output ? step.head_in : r_t, step.hidden_out);
}

// The config against the target: CheckDraftAgainstTarget reads aux ids as output-of-layer ids;
// under the other convention, or when the ids are overridden, the tap (made next) checks the ids in
// use.
absl::Status CheckLlamaAgainstTarget(const Eagle3DraftConfig& config, const DeepseekV2Config& target,
                                     const DraftModelOptions& options) {
  if (options.convention == LayerIdConvention::kOutputOfLayer && !options.aux_layer_ids_override.has_value()) {
    return CheckDraftAgainstTarget(config, target);
  }
  Eagle3DraftConfig sizes_only = config;
  sizes_only.aux_layer_ids.reset();
  return CheckDraftAgainstTarget(sizes_only, target);
}

absl::Status CheckLlamaTensors(const Checkpoint& checkpoint, const Eagle3DraftConfig& config,
                               const std::vector<WeightSpec>& specs, bool own_embedding) {
  const std::string where = "draft checkpoint '" + checkpoint.dir() + "'";
  // fc's input width is where a wrong number of aux layers (or a wrong target) shows first.
  if (checkpoint.Has("fc.weight")) {
    EAGLE3_ASSIGN_OR_RETURN(TensorInfo fc_info, checkpoint.Info("fc.weight"));
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
    if (!checkpoint.Has(spec.name)) {
      return absl::NotFoundError(where + " has no tensor '" + spec.name +
                                 "', which its config.json requires (expected shape " + spec.shape.ToString() + ")");
    }
    EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape(spec.name, spec.shape));
  }
  if (checkpoint.Has("fc.bias")) EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape("fc.bias", Shape{config.hidden_size}));
  if (own_embedding) {
    EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape("embed_tokens.weight", Shape{config.vocab_size, config.hidden_size}));
  }
  // A tensor the config does not account for is a config that lost a key: refuse, never ignore.
  for (const std::string& name : checkpoint.TensorNames()) {
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

}  // namespace

absl::StatusOr<OpenedDraft> OpenLlamaDraft(const std::string& draft_dir, const std::string& target_dir,
                                           const DeepseekV2Config& target, const DraftRank& rank) {
  const DraftModelOptions& options = rank.options;
  OpenedDraft d;
  d.kind = DraftKind::kLlama;
  EAGLE3_ASSIGN_OR_RETURN(d.llama_config, Eagle3DraftConfig::FromFile(draft_dir));
  const Eagle3DraftConfig& c = d.llama_config;
  EAGLE3_RETURN_IF_ERROR(CheckLlamaAgainstTarget(c, target, options));
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
  EAGLE3_ASSIGN_OR_RETURN(HiddenStateTap tap, Eagle3HeadTap(c.aux_layer_ids, c.source, target, options,
                                                            c.fc_input_width()));
  d.tap.emplace(std::move(tap));

  EAGLE3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(draft_dir, {.threads = options.read_threads}));
  EAGLE3_ASSIGN_OR_RETURN(std::string prefix, DraftLayerPrefix(*checkpoint));
  const bool own_embedding = checkpoint->Has("embed_tokens.weight");
  if (!own_embedding && c.hidden_size != target.hidden_size) {
    return absl::InvalidArgumentError(
        c.source + ": hidden_size = " + Str(c.hidden_size) + " differs from the target's hidden_size = " +
        Str(target.hidden_size) + " (" + target.source +
        "), so the draft cannot share the target's embedding, and its checkpoint has no embed_tokens.weight");
  }
  std::vector<WeightSpec> specs = Eagle3DraftWeights(c, prefix);
  EAGLE3_RETURN_IF_ERROR(CheckLlamaTensors(*checkpoint, c, specs, own_embedding));
  std::unique_ptr<Checkpoint> target_checkpoint;
  if (!own_embedding) {
    EAGLE3_ASSIGN_OR_RETURN(target_checkpoint, OpenSharedEmbedding(target_dir, target, options.read_threads));
  }
  EAGLE3_ASSIGN_OR_RETURN(d.d2t, ReadDraftVocabMapping(*checkpoint, c.vocab_size, c.draft_vocab_size));

  const int64_t kv_width = c.num_key_value_heads / tp * c.head_dim;
  d.shape = DraftShape{c.hidden_size, d.tap->width(), c.vocab_size, c.draft_vocab_size, 2 * kv_width};
  d.layer = std::make_unique<LlamaDraftLayer>(c, target, rank, std::move(checkpoint), std::move(target_checkpoint),
                                              std::move(specs), std::move(prefix), own_embedding);
  return d;
}

}  // namespace eagle3
