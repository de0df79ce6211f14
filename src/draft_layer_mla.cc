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
#include "draft_layer_common.h"
#include "eagle3_head_json.h"
#include "feed_forward_block.h"
#include "view_slices.h"
#include "weight_loader.h"
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
        decoder_(config.attention(), FeedForwardConfig::Dense(config.hidden_size, config.intermediate_size), rank,
                 static_cast<float>(config.rms_norm_eps)) {
    input_.hidden_size = config.hidden_size;
    input_.target_hidden_size = config.target_hidden_size;
    input_.fc_input_width = config.fc_input_width();
    input_.eps = static_cast<float>(config.rms_norm_eps);
    input_.norm_before_residual = config.norm_before_residual;
  }

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
  Eagle3Input input_;
  MlaDraftDecoder decoder_;
  Tensor final_norm_;
  // Workspaces, sized at Load.
  Tensor r_, h_, partial_;
};

void MlaDraftLayer::AddBuffers(const std::string& tokens, const std::string& context, HostByteBudget& budget) const {
  decoder_.AddBuffers(tokens, context, config_.fc_input_width() + 6 * config_.hidden_size, budget);
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
  EAGLE3_ASSIGN_OR_RETURN(input_.fc, loader.Load("fc.weight", wd));
  if (config_.fc_norm) {
    for (int64_t i = 0; i < config_.num_aux_layers(); ++i) {
      EAGLE3_ASSIGN_OR_RETURN(Tensor w, loader.Load("fc_norm." + Str(i) + ".weight", DType::kF32));
      input_.fc_norms.push_back(std::move(w));
    }
  }
  EAGLE3_ASSIGN_OR_RETURN(input_.input_layernorm, loader.Load(p + "input_layernorm.weight", DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(input_.hidden_norm, loader.Load(p + "hidden_norm.weight", DType::kF32));
  EAGLE3_RETURN_IF_ERROR(decoder_.LoadWeights(p, wd, loader));
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

  const int64_t t_max = o.max_tokens_per_forward;
  EAGLE3_RETURN_IF_ERROR(decoder_.Allocate());
  EAGLE3_RETURN_IF_ERROR(input_.Allocate(rank_, t_max));
  for (Tensor* t : {&r_, &h_, &partial_}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, rank_.Alloc(DType::kF32, Shape{t_max, config_.hidden_size}));
  }
  return absl::OkStatus();
}

absl::Status MlaDraftLayer::Forward(const DraftLayerStep& step) {
  const int64_t t = step.rows;
  // The EAGLE-3 input's 2H-wide rows through the MLA decoder layer (dense MLP).
  const TensorView r_t = Rows(r_, 0, t);
  EAGLE3_RETURN_IF_ERROR(input_.Build(*rank_.backend, step, r_t));
  return decoder_.Forward(step, input_.X(t), r_t, Rows(h_, 0, t), Rows(partial_, 0, t), final_norm_,
                          config_.norm_output);
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

  EAGLE3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(draft_dir, {.threads = options.read_threads}));
  // Every tensor: the layer prefix, shapes (fc's input against the taps x the target's width, the
  // 2H-wide q_a / kv_a), dtypes, the embedding it shares, d2t / t2d present as the vocabulary needs.
  EAGLE3_ASSIGN_OR_RETURN(MlaDraftCheckpointLayout layout, CheckMlaDraftWeights(*checkpoint, config, target));
  std::unique_ptr<Checkpoint> target_checkpoint;
  if (!layout.own_embedding) {
    EAGLE3_ASSIGN_OR_RETURN(target_checkpoint, OpenSharedEmbedding(target_dir, target, options.read_threads));
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
