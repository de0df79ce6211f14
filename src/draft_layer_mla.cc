// The MLA EAGLE-3 head's layer (DraftKind::kMla; docs/mla_drafts.md "The MLA EAGLE-3 draft"):
//
//   g   = fc(aux)                   first step (fc_norm: each tap RMS-normed first); later: fed back
//   x   = [input_layernorm(embed(tok)) | hidden_norm(g)]                      [T, 2H], embeddings first
//   r   = g (hidden_norm(g) with norm_before_residual) + o_proj(MLA(x))       MlaBlock, input width 2H
//   r  += down(silu(gate(h)) * up(h)),  h = post_attention_layernorm(r)      dense FeedForwardBlock
//   logits = lm_head(norm(r)) over the draft vocabulary; fed back r (norm(r) with norm_output)
//
// The attention is the target's MLA with a 2H input, over the draft's own paged latent cache (rows
// [kv_a_layernorm(c) | RoPE(k_pe)], kv_lora_rank + qk_rope_head_dim wide, replicated on every rank
// as the target's), with the draft's own RoPE / YaRN and softmax scale. Every RMSNorm, the latent
// ones included, uses the draft's rms_norm_eps. Tensor parallelism: fc, the norms, q_a and kv_a
// replicated; q_b / q_proj and kv_b by heads, o_proj and down by columns (partial sums all-reduced),
// gate / up by rows; the embedding and lm_head vocab-parallel (the scaffolding's).
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "draft_layer.h"
#include "eagle3_head_json.h"
#include "feed_forward_block.h"
#include "mla_block.h"
#include "view_slices.h"
#include "weight_loader.h"
#include "zero_fill.h"
#include "eagle3/checkpoint.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/mla_draft_weights.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

class MlaDraftLayer final : public DraftLayer {
 public:
  MlaDraftLayer(const MlaDraftConfig& config, const DeepseekV2Config& target, const DraftRank& rank,
                std::unique_ptr<Checkpoint> checkpoint, std::unique_ptr<Checkpoint> target_checkpoint,
                MlaDraftCheckpointLayout layout)
      : config_(config),
        target_(target),
        rank_(rank),
        checkpoint_(std::move(checkpoint)),
        target_checkpoint_(std::move(target_checkpoint)),
        layout_(std::move(layout)),
        attention_config_(config.attention()),
        dims_(MlaRankDims::Of(attention_config_, rank.options.tp_size)),
        ffn_config_(FeedForwardConfig::Dense(config.hidden_size, config.intermediate_size)),
        eps_(static_cast<float>(config.rms_norm_eps)) {}

  void AddBuffers(const std::string& tokens, const std::string& context, HostByteBudget& budget) const override;
  absl::Status Load(DraftHeadWeights& head) override;
  absl::Status Forward(const DraftLayerStep& step) override;

 private:
  MlaDraftConfig config_;
  DeepseekV2Config target_;
  const DraftRank& rank_;
  std::unique_ptr<Checkpoint> checkpoint_;         // the draft's; released after Load
  std::unique_ptr<Checkpoint> target_checkpoint_;  // only when the embedding is the target's
  MlaDraftCheckpointLayout layout_;
  MlaAttentionConfig attention_config_;
  MlaRankDims dims_;
  FeedForwardConfig ffn_config_;
  float eps_ = 0.0f;

  Tensor fc_;
  std::vector<Tensor> fc_norms_;
  Tensor input_ln_, hidden_norm_, post_ln_, final_norm_;
  std::optional<MlaBlock> attention_;
  std::optional<FeedForwardBlock> mlp_;
  Tensor cache_;  // [num_kv_pages, page_size, kv_lora_rank + qk_rope_head_dim]: the latent rows
  // Workspaces, sized at Load.
  std::optional<MlaWorkspace> mla_ws_;
  std::optional<FeedForwardWorkspace> ffn_ws_;
  Tensor aux_, g_, x_, r_, h_, partial_;
};

void MlaDraftLayer::AddBuffers(const std::string& tokens, const std::string& context, HostByteBudget& budget) const {
  const DraftModelOptions& o = rank_.options;
  const int64_t t = o.max_tokens_per_forward, s = o.max_context_len;
  const MlaRankDims& d = dims_;
  budget.Add(context + " x qk_rope_head_dim " + Str(d.rope) + " (RoPE table)", {s, d.rope}, 4);
  budget.Add(tokens + " x " + context + " (host attention mask)", {t, s}, 1);
  if (!rank_.backend->allocator().device().is_cpu()) return;
  budget.Add("num_kv_pages " + Str(o.num_kv_pages) + " x page_size " + Str(o.page_size) + " x latent width " +
                 Str(d.width) + " (KV cache)",
             {o.num_kv_pages, o.page_size, d.width}, 4);
  budget.Add(context + " x attention widths (context latent / k / v)",
             {s, d.width + d.heads * (d.nope + d.vdim + d.qk)}, 4);
  budget.Add(tokens + " x " + context + " (attention mask)", {t, s}, 1);
  budget.Add(tokens + " x layer widths (workspaces)",
             {t, config_.fc_input_width() + 6 * config_.hidden_size + (d.heads + 1) * d.width +
                     d.heads * (d.qk + d.vdim + d.latent) + d.q_lora +
                     3 * ffn_config_.WidestRankIntermediate(o.tp_size)},
             4);
}

absl::Status MlaDraftLayer::Load(DraftHeadWeights& head) {
  const DraftModelOptions& o = rank_.options;
  const DType wd = rank_.weight_dtype;
  Backend& be = *rank_.backend;
  // Draft weights are never quantized (the config parser refuses a quantization_config), and
  // CheckMlaDraftWeights checked every tensor of the schema when the draft was opened.
  std::vector<WeightSpec> schema = MlaDraftWeights(config_, layout_.layer_prefix);
  if (layout_.own_embedding) schema.push_back(MlaDraftEmbeddingWeight(config_));
  const std::vector<StoredForm> forms(schema.size(), StoredForm::kPlain);
  const QuantizationConfig unquantized;
  WeightLoader loader(*checkpoint_, unquantized, schema, forms, o.tp_size, o.rank, be,
                      WeightLoader::Checks::kSchemaChecked);
  const std::string& p = layout_.layer_prefix;
  EAGLE3_ASSIGN_OR_RETURN(fc_, loader.Load("fc.weight", wd));
  if (config_.fc_norm) {
    for (int64_t i = 0; i < config_.num_aux_layers(); ++i) {
      EAGLE3_ASSIGN_OR_RETURN(Tensor w, loader.Load("fc_norm." + Str(i) + ".weight", DType::kF32));
      fc_norms_.push_back(std::move(w));
    }
  }
  EAGLE3_ASSIGN_OR_RETURN(input_ln_, loader.Load(p + "input_layernorm.weight", DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(hidden_norm_, loader.Load(p + "hidden_norm.weight", DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(MlaBlock attention,
                          MlaBlock::Load(attention_config_, o.tp_size, p + "self_attn.", wd, loader));
  attention_.emplace(std::move(attention));
  EAGLE3_ASSIGN_OR_RETURN(post_ln_, loader.Load(p + "post_attention_layernorm.weight", DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(FeedForwardBlock mlp, FeedForwardBlock::Load(ffn_config_, p + "mlp.", wd, loader));
  mlp_.emplace(std::move(mlp));
  EAGLE3_ASSIGN_OR_RETURN(final_norm_, loader.Load("norm.weight", DType::kF32));
  if (!config_.tie_word_embeddings) {
    EAGLE3_ASSIGN_OR_RETURN(head.lm_head, loader.Load("lm_head.weight", wd));
  }
  if (layout_.own_embedding) {
    EAGLE3_ASSIGN_OR_RETURN(head.embed, loader.Load(MlaDraftEmbeddingWeight(config_), wd));
  } else {
    // The target's embedding, stored plain in every format.
    const std::vector<WeightSpec> embedding = {WeightSpec{DeepseekEmbeddingName(target_),
                                                          Shape{target_.vocab_size, target_.hidden_size},
                                                          TpSplit::kRows, /*vocab_padded=*/true}};
    WeightLoader target_loader(*target_checkpoint_, target_.quantization, embedding, StoredForms(target_, embedding),
                               o.tp_size, o.rank, be);
    EAGLE3_ASSIGN_OR_RETURN(head.embed, target_loader.Load(embedding[0], wd));
  }
  checkpoint_.reset();
  target_checkpoint_.reset();

  const int64_t t_max = o.max_tokens_per_forward, h = config_.hidden_size;
  EAGLE3_ASSIGN_OR_RETURN(cache_, rank_.Alloc(DType::kF32, Shape{o.num_kv_pages, o.page_size, dims_.width}));
  EAGLE3_RETURN_IF_ERROR(ZeroFill(be, cache_));  // unwritten slots read as zeros
  EAGLE3_ASSIGN_OR_RETURN(MlaWorkspace mla_ws, MlaWorkspace::Create(attention_config_, o.tp_size, t_max,
                                                                    o.max_context_len, be, "DraftModel"));
  mla_ws_.emplace(std::move(mla_ws));
  EAGLE3_ASSIGN_OR_RETURN(FeedForwardWorkspace ffn_ws, FeedForwardWorkspace::Create(ffn_config_, o.tp_size, t_max, be));
  ffn_ws_.emplace(std::move(ffn_ws));
  EAGLE3_ASSIGN_OR_RETURN(aux_, rank_.Alloc(DType::kF32, Shape{t_max, config_.fc_input_width()}));
  for (Tensor* t : {&g_, &r_, &h_, &partial_}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, rank_.Alloc(DType::kF32, Shape{t_max, h}));
  }
  EAGLE3_ASSIGN_OR_RETURN(x_, rank_.Alloc(DType::kF32, Shape{t_max, 2 * h}));
  return absl::OkStatus();
}

absl::Status MlaDraftLayer::Forward(const DraftLayerStep& step) {
  Backend& be = *rank_.backend;
  const RankCollectives ranks = rank_.Ranks();
  const int64_t t = step.rows, h = config_.hidden_size;
  // g: fc over the taps (each normed first with fc_norm), or the fed-back hidden as given.
  const TensorView g_t = Rows(g_, 0, t);
  if (step.from_target) {
    const TensorView aux_t = Rows(aux_, 0, t);
    EAGLE3_RETURN_IF_ERROR(be.Copy(step.input, aux_t));
    const int64_t ht = config_.target_hidden_size;
    for (size_t i = 0; i < fc_norms_.size(); ++i) {
      const TensorView slice = Block(aux_t, 0, t, static_cast<int64_t>(i) * ht, ht);
      EAGLE3_RETURN_IF_ERROR(be.RmsNorm(slice, fc_norms_[i], eps_, slice));
    }
    EAGLE3_RETURN_IF_ERROR(be.Gemm(aux_t, fc_, g_t, kWeightsGemm));
  } else {
    EAGLE3_RETURN_IF_ERROR(be.Copy(step.input, g_t));
  }

  // x = [input_layernorm(embed(token)) | hidden_norm(g)]; the residual is g or hidden_norm(g).
  const TensorView x_t = Rows(x_, 0, t), r_t = Rows(r_, 0, t), h_t = Rows(h_, 0, t);
  const TensorView partial_t = Rows(partial_, 0, t);
  EAGLE3_RETURN_IF_ERROR(be.RmsNorm(step.embedded, input_ln_, eps_, Block(x_t, 0, t, 0, h)));
  const TensorView normed_g = Block(x_t, 0, t, h, h);
  EAGLE3_RETURN_IF_ERROR(be.RmsNorm(g_t, hidden_norm_, eps_, normed_g));
  EAGLE3_RETURN_IF_ERROR(be.Copy(config_.norm_before_residual ? normed_g : g_t, r_t));

  // The 2H-wide rows through the MLA block: every sequence at once over the latent cache, the mask
  // over every key when the step has one (tree passes skip other branches' cached rows).
  MlaBatchedStep batched;
  batched.positions = step.positions;
  batched.slots = step.slots;
  batched.slot_iota = step.slot_iota;
  batched.page_tables = step.page_tables;
  batched.q_start = step.q_start;
  batched.kv_len = step.kv_len;
  batched.max_kv_len = step.max_kv_len;
  batched.key_mask = step.mask;
  if (step.kv_only) return attention_->WriteCacheRows(x_t, batched, cache_, *mla_ws_);
  EAGLE3_RETURN_IF_ERROR(attention_->ForwardBatched(x_t, batched, cache_, *mla_ws_, partial_t));
  EAGLE3_RETURN_IF_ERROR(ranks.AllReduce(partial_t));
  EAGLE3_RETURN_IF_ERROR(be.AddRmsNorm(partial_t, r_t, post_ln_, eps_, h_t));

  // The dense MLP, then r += mlp and head_in = norm(r).
  EAGLE3_RETURN_IF_ERROR(mlp_->Forward(h_t, *ffn_ws_, partial_t));
  EAGLE3_RETURN_IF_ERROR(ranks.AllReduce(partial_t));
  EAGLE3_RETURN_IF_ERROR(be.AddRmsNorm(partial_t, r_t, final_norm_, eps_, step.head_in));
  return be.Copy(config_.norm_output ? step.head_in : r_t, step.hidden_out);
}

}  // namespace

absl::StatusOr<OpenedDraft> OpenMlaDraft(const std::string& draft_dir, const std::string& target_dir,
                                         const DeepseekV2Config& target, const DraftRank& rank) {
  const DraftModelOptions& options = rank.options;
  OpenedDraft d;
  d.kind = DraftKind::kMla;
  EAGLE3_ASSIGN_OR_RETURN(MlaDraftConfig config, MlaDraftConfig::FromFile(draft_dir));
  // CheckDraftAgainstTarget reads aux ids as output-of-layer ids; under the other convention, or
  // when the ids are overridden, only the sizes are checked here and the tap (made next) checks the
  // ids in use.
  if (options.convention == LayerIdConvention::kOutputOfLayer && !options.aux_layer_ids_override.has_value()) {
    EAGLE3_RETURN_IF_ERROR(CheckDraftAgainstTarget(config, target));
  } else {
    EAGLE3_RETURN_IF_ERROR(eagle3_head::CheckHeadAgainstTarget(config.source, config.target_hidden_size,
                                                               config.vocab_size, std::nullopt, target));
  }
  EAGLE3_RETURN_IF_ERROR(config.ValidateForTp(options.tp_size));
  EAGLE3_ASSIGN_OR_RETURN(HiddenStateTap tap, Eagle3HeadTap(config.aux_layer_ids, config.source, target, options,
                                                            config.fc_input_width()));
  d.tap.emplace(std::move(tap));

  EAGLE3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(draft_dir));
  // Every tensor: the layer prefix, shapes (fc's input against the taps x the target's width, the
  // 2H-wide q_a / kv_a), dtypes, the embedding it shares, d2t / t2d present as the vocabulary needs.
  EAGLE3_ASSIGN_OR_RETURN(MlaDraftCheckpointLayout layout, CheckMlaDraftWeights(*checkpoint, config, target));
  std::unique_ptr<Checkpoint> target_checkpoint;
  if (!layout.own_embedding) {
    EAGLE3_ASSIGN_OR_RETURN(target_checkpoint, Checkpoint::Open(target_dir));
    const std::string embed_name = DeepseekEmbeddingName(target);
    if (!target_checkpoint->Has(embed_name)) {
      return absl::NotFoundError("target checkpoint '" + target_dir + "' has no tensor '" + embed_name +
                                 "', the embedding the draft shares");
    }
    EAGLE3_RETURN_IF_ERROR(target_checkpoint->ExpectShape(embed_name, Shape{target.vocab_size, target.hidden_size}));
  }
  EAGLE3_ASSIGN_OR_RETURN(d.d2t, ReadDraftVocabMapping(*checkpoint, config.vocab_size, config.draft_vocab_size));

  d.shape = DraftShape{config.hidden_size, d.tap->width(), config.vocab_size, config.draft_vocab_size,
                       config.latent_cache_width()};
  d.layer = std::make_unique<MlaDraftLayer>(config, target, rank, std::move(checkpoint), std::move(target_checkpoint),
                                            std::move(layout));
  d.mla_config = std::move(config);
  return d;
}

}  // namespace eagle3
