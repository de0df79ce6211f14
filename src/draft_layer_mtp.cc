// DeepSeek-V3's MTP module as a draft layer (DraftKind::kMtp; docs/mla_drafts.md "DeepSeek-V3's MTP
// module"), module 0 of the target's own checkpoint (MtpConfig::LayerPrefix):
//
//   e = enorm(embed(token_{p+1}))          the target's embedding                       [T, H]
//   x = eh_proj([e | hnorm(h_p)])          embeddings first (the engines' order)         [T, 2H] -> [T, H]
//   r = x + o_proj(MLA(input_layernorm(x)))
//   r = r + MoE(post_attention_layernorm(r))   the MLP the layer index selects (MoE for V3)
//   o = shared_head.norm(r);  logits = lm_head(o)   the target's lm_head, full vocabulary (no d2t)
//
// h_p is the target's final hidden after model.norm on the first step (HiddenStateTap::FinalNormed,
// the tensor its lm_head reads: vLLM, SGLang, TensorRT-LLM and DeepSeek's own code feed it), and the
// parent row's o on later steps (SGLang, TensorRT-LLM, vLLM after #45895). The decoder layer is a
// target layer (MlaBlock at the target's dims and RoPE over the draft's own latent cache,
// FeedForwardBlock), its Linears read in the target's stored forms and dequantized at load. No
// embedding mask at position 0 (vLLM's; SGLang and TensorRT-LLM have none).
//
// Tensor parallelism: the norms replicated, the decoder layer as a target layer's, and eh_proj by
// columns: every rank holds the whole [e | hnorm(h)] row and multiplies its 2H / tp columns, the
// partial sums all-reduced (mtp_weights.h says why).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "draft_layer.h"
#include "draft_layer_common.h"
#include "feed_forward_block.h"
#include "view_slices.h"
#include "weight_loader.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/mla_attention_config.h"
#include "eagle3/mtp_weights.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// The module every draft step runs: the first (DeepSeek-V3 and R1 carry one).
constexpr int64_t kModule = 0;

class MtpDraftLayer final : public DraftLayer {
 public:
  MtpDraftLayer(const DeepseekV2Config& target, const MtpConfig& mtp, const DraftRank& rank,
                std::unique_ptr<Checkpoint> checkpoint)
      : target_(target),
        mtp_(mtp),
        rank_(rank),
        checkpoint_(std::move(checkpoint)),
        decoder_(MlaAttentionConfig::ForTarget(target), FeedForwardConfig::ForTargetLayer(target, mtp.LayerIndex(kModule)),
                 rank, static_cast<float>(target.rms_norm_eps)),
        eps_(static_cast<float>(target.rms_norm_eps)) {}

  void AddBuffers(const std::string& tokens, const std::string& context, HostByteBudget& budget) const override;
  absl::Status Load(DraftHeadWeights& head) override;
  absl::Status Forward(const DraftLayerStep& step) override;

 private:
  DeepseekV2Config target_;
  MtpConfig mtp_;
  const DraftRank& rank_;
  std::unique_ptr<Checkpoint> checkpoint_;  // the target's; released after Load
  MlaDraftDecoder decoder_;
  float eps_ = 0.0f;

  Tensor enorm_, hnorm_, eh_proj_, input_ln_, shared_head_norm_;
  // Workspaces, sized at Load.
  Tensor cat_, r_, h_, partial_;
};

void MtpDraftLayer::AddBuffers(const std::string& tokens, const std::string& context, HostByteBudget& budget) const {
  // The concat, r, h, partial and the hidden rows; the router's logits and top-k beside them.
  decoder_.AddBuffers(tokens, context,
                      5 * target_.hidden_size + 2 * std::max<int64_t>(decoder_.ffn_config().n_routed_experts, 1),
                      budget);
}

absl::Status MtpDraftLayer::Load(DraftHeadWeights& head) {
  const DraftModelOptions& o = rank_.options;
  const DType wd = rank_.weight_dtype;
  Backend& be = *rank_.backend;
  // The module's tensors, then the target's embedding and lm_head (the module's own copies of them
  // are never read: mtp_weights.h). Read in their stored forms (quantized Linears dequantized here)
  // and checked on the way: the module was checked whole when opened, the two shared tensors are
  // checked as they are read.
  std::vector<WeightSpec> schema = MtpModuleWeights(target_, mtp_, kModule);
  for (const WeightSpec& spec : DeepseekV2Weights(target_)) {
    if (spec.name == DeepseekEmbeddingName(target_) || spec.name == target_.tensor_prefix + "lm_head.weight") {
      schema.push_back(spec);
    }
  }
  WeightLoader loader(*checkpoint_, target_.quantization, schema, StoredForms(target_, schema), o.tp_size, o.rank, be);
  loader.set_keep_quantized(o.keep_quantized);
  const std::string p = mtp_.LayerPrefix(kModule);
  EAGLE3_ASSIGN_OR_RETURN(enorm_, loader.Load(p + "enorm.weight", DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(hnorm_, loader.Load(p + "hnorm.weight", DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(eh_proj_, loader.Load(p + "eh_proj.weight", wd));
  EAGLE3_ASSIGN_OR_RETURN(input_ln_, loader.Load(p + "input_layernorm.weight", DType::kF32));
  EAGLE3_RETURN_IF_ERROR(decoder_.LoadWeights(p, wd, loader));
  EAGLE3_ASSIGN_OR_RETURN(shared_head_norm_, loader.Load(p + "shared_head.norm.weight", DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(head.embed, loader.Load(DeepseekEmbeddingName(target_), wd));
  if (!target_.tie_word_embeddings) {
    EAGLE3_ASSIGN_OR_RETURN(head.lm_head, loader.Load(target_.tensor_prefix + "lm_head.weight", wd));
  }
  checkpoint_.reset();

  const int64_t t_max = o.max_tokens_per_forward, h = target_.hidden_size;
  EAGLE3_RETURN_IF_ERROR(decoder_.Allocate());
  EAGLE3_ASSIGN_OR_RETURN(cat_, rank_.Alloc(DType::kF32, Shape{t_max, 2 * h}));
  for (Tensor* t : {&r_, &h_, &partial_}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, rank_.Alloc(DType::kF32, Shape{t_max, h}));
  }
  return absl::OkStatus();
}

absl::Status MtpDraftLayer::Forward(const DraftLayerStep& step) {
  Backend& be = *rank_.backend;
  const RankCollectives ranks = rank_.Ranks();
  const int64_t t = step.rows, h = target_.hidden_size;
  // [enorm(e) | hnorm(h)], embeddings first; the first step's h is the target's normed final hidden,
  // a later step's the parent's o: the same width, normed alike.
  const TensorView cat_t = Rows(cat_, 0, t);
  const TensorView r_t = Rows(r_, 0, t), h_t = Rows(h_, 0, t), partial_t = Rows(partial_, 0, t);
  EAGLE3_RETURN_IF_ERROR(be.RmsNorm(step.embedded, enorm_, eps_, Block(cat_t, 0, t, 0, h)));
  // The input rows may sit in host staging (the step's staged hidden): onto the device first, into
  // h_, free until input_layernorm writes it.
  EAGLE3_RETURN_IF_ERROR(be.Copy(step.input, h_t));
  EAGLE3_RETURN_IF_ERROR(be.RmsNorm(h_t, hnorm_, eps_, Block(cat_t, 0, t, h, h)));
  // eh_proj over this rank's columns of the concat, summed over the ranks: the residual stream.
  const int64_t cols = eh_proj_.dim(1);
  EAGLE3_RETURN_IF_ERROR(be.Gemm(Block(cat_t, 0, t, rank_.options.rank * cols, cols), eh_proj_, r_t, kWeightsGemm));
  EAGLE3_RETURN_IF_ERROR(ranks.AllReduce(r_t));
  EAGLE3_RETURN_IF_ERROR(be.RmsNorm(r_t, input_ln_, eps_, h_t));
  // The decoder layer (MoE for V3), then o = shared_head.norm(r): the head's input and the hidden
  // fed back alike.
  return decoder_.Forward(step, h_t, r_t, h_t, partial_t, shared_head_norm_, /*feed_back_normed=*/true);
}

}  // namespace

absl::StatusOr<OpenedDraft> OpenMtpDraft(const std::string& target_dir, const DeepseekV2Config& target,
                                         const DraftRank& rank) {
  const DraftModelOptions& options = rank.options;
  OpenedDraft d;
  d.kind = DraftKind::kMtp;
  if (options.aux_layer_ids_override.has_value()) {
    return absl::InvalidArgumentError(
        "DraftModelOptions::aux_layer_ids_override is set, but the MTP module reads the target's final hidden "
        "after model.norm, not layer taps: leave it unset for CreateMtp");
  }
  EAGLE3_ASSIGN_OR_RETURN(MtpConfig mtp, MtpConfig::FromTarget(target));
  EAGLE3_RETURN_IF_ERROR(target.ValidateForTp(options.tp_size));
  if ((2 * target.hidden_size) % options.tp_size != 0) {
    return absl::InvalidArgumentError(target.source + ": 2 x hidden_size = " + Str(2 * target.hidden_size) +
                                      " is not divisible by tp_size " + Str(options.tp_size) + " (" +
                                      mtp.LayerPrefix(kModule) + "eh_proj.weight is split by columns)");
  }
  EAGLE3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, Checkpoint::Open(target_dir, {.threads = options.read_threads}));
  EAGLE3_RETURN_IF_ERROR(CheckMtpWeights(*checkpoint, target, mtp));
  EAGLE3_ASSIGN_OR_RETURN(HiddenStateTap tap,
                          HiddenStateTap::FinalNormed(static_cast<int>(target.num_hidden_layers), target.hidden_size));
  d.tap.emplace(std::move(tap));
  d.d2t.assign(static_cast<size_t>(target.vocab_size), 0);  // the target's own vocabulary
  const MlaAttentionConfig attention = MlaAttentionConfig::ForTarget(target);
  d.shape = DraftShape{target.hidden_size, target.hidden_size, target.vocab_size, target.vocab_size,
                       attention.latent_cache_width()};
  d.layer = std::make_unique<MtpDraftLayer>(target, mtp, rank, std::move(checkpoint));
  d.mtp_config = std::move(mtp);
  return d;
}

}  // namespace eagle3
