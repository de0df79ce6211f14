#include "draft_layer_common.h"

#include <string>
#include <utility>

#include "view_slices.h"
#include "zero_fill.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/status.h"

namespace eagle3 {

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenSharedEmbedding(const std::string& target_dir,
                                                                const DeepseekV2Config& target, int read_threads) {
  EAGLE3_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint,
                          Checkpoint::Open(target_dir, {.threads = read_threads}));
  const std::string embed_name = DeepseekEmbeddingName(target);
  if (!checkpoint->Has(embed_name)) {
    return absl::NotFoundError("target checkpoint '" + target_dir + "' has no tensor '" + embed_name +
                               "', the embedding the draft shares");
  }
  EAGLE3_RETURN_IF_ERROR(checkpoint->ExpectShape(embed_name, Shape{target.vocab_size, target.hidden_size}));
  return checkpoint;
}

absl::Status Eagle3Input::Allocate(const DraftRank& rank, int64_t max_tokens) {
  EAGLE3_ASSIGN_OR_RETURN(aux, rank.Alloc(DType::kF32, Shape{max_tokens, fc_input_width}));
  EAGLE3_ASSIGN_OR_RETURN(g, rank.Alloc(DType::kF32, Shape{max_tokens, hidden_size}));
  EAGLE3_ASSIGN_OR_RETURN(x, rank.Alloc(DType::kF32, Shape{max_tokens, 2 * hidden_size}));
  return absl::OkStatus();
}

TensorView Eagle3Input::X(int64_t rows) const { return Rows(x, 0, rows); }

absl::Status Eagle3Input::Build(Backend& be, const DraftLayerStep& step, const TensorView& r) const {
  const int64_t t = step.rows, h = hidden_size;
  // g: fc over the (normalized) taps, or the fed-back hidden as given.
  const TensorView g_t = Rows(g, 0, t);
  if (step.from_target) {
    const TensorView aux_t = Rows(aux, 0, t);
    EAGLE3_RETURN_IF_ERROR(be.Copy(step.input, aux_t));
    if (!input_norm.empty()) EAGLE3_RETURN_IF_ERROR(be.RmsNorm(aux_t, input_norm, eps, aux_t));
    for (size_t i = 0; i < fc_norms.size(); ++i) {
      const TensorView slice = Block(aux_t, 0, t, static_cast<int64_t>(i) * target_hidden_size, target_hidden_size);
      EAGLE3_RETURN_IF_ERROR(be.RmsNorm(slice, fc_norms[i], eps, slice));
    }
    GemmOptions fc_options = kWeightsGemm;
    const TensorView bias = fc_bias.view();
    if (!fc_bias.empty()) fc_options.bias = &bias;
    EAGLE3_RETURN_IF_ERROR(be.Gemm(aux_t, fc, g_t, fc_options));
  } else {
    EAGLE3_RETURN_IF_ERROR(be.Copy(step.input, g_t));
  }
  // x = [input_layernorm(embed(token)) | hidden_norm(g)]; the residual is g or hidden_norm(g).
  const TensorView x_t = X(t);
  EAGLE3_RETURN_IF_ERROR(be.RmsNorm(step.embedded, input_layernorm, eps, Block(x_t, 0, t, 0, h)));
  const TensorView normed_g = Block(x_t, 0, t, h, h);
  EAGLE3_RETURN_IF_ERROR(be.RmsNorm(g_t, hidden_norm, eps, normed_g));
  return be.Copy(norm_before_residual ? normed_g : g_t, r);
}

namespace {
std::string Str(int64_t v) { return std::to_string(v); }
}  // namespace

MlaDraftDecoder::MlaDraftDecoder(const MlaAttentionConfig& attention, const FeedForwardConfig& ffn,
                                 const DraftRank& rank, float eps)
    : attention_config_(attention),
      ffn_config_(ffn),
      rank_(rank),
      dims_(MlaRankDims::Of(attention, rank.options.tp_size)),
      eps_(eps) {}

void MlaDraftDecoder::AddBuffers(const std::string& tokens, const std::string& context, int64_t own_width,
                                 HostByteBudget& budget) const {
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
             {t, own_width + (d.heads + 1) * d.width + d.heads * (d.qk + d.vdim + d.latent) + d.q_lora +
                     3 * ffn_config_.WidestRankIntermediate(o.tp_size)},
             4);
}

absl::Status MlaDraftDecoder::LoadWeights(const std::string& layer_prefix, DType weight_dtype,
                                          WeightLoader& loader) {
  EAGLE3_ASSIGN_OR_RETURN(MlaBlock attention, MlaBlock::Load(attention_config_, rank_.options.tp_size,
                                                             layer_prefix + "self_attn.", weight_dtype, loader));
  attention_.emplace(std::move(attention));
  EAGLE3_ASSIGN_OR_RETURN(post_ln_, loader.Load(layer_prefix + "post_attention_layernorm.weight", DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(FeedForwardBlock mlp,
                          FeedForwardBlock::Load(ffn_config_, layer_prefix + "mlp.", weight_dtype, loader));
  mlp_.emplace(std::move(mlp));
  return absl::OkStatus();
}

absl::Status MlaDraftDecoder::Allocate() {
  const DraftModelOptions& o = rank_.options;
  Backend& be = *rank_.backend;
  const int64_t t_max = o.max_tokens_per_forward;
  EAGLE3_ASSIGN_OR_RETURN(cache_, rank_.Alloc(DType::kF32, Shape{o.num_kv_pages, o.page_size, dims_.width}));
  EAGLE3_RETURN_IF_ERROR(ZeroFill(be, cache_));  // unwritten slots read as zeros
  EAGLE3_ASSIGN_OR_RETURN(MlaWorkspace mla_ws, MlaWorkspace::Create(attention_config_, o.tp_size, t_max,
                                                                    o.max_context_len, be, "DraftModel"));
  mla_ws_.emplace(std::move(mla_ws));
  EAGLE3_ASSIGN_OR_RETURN(FeedForwardWorkspace ffn_ws, FeedForwardWorkspace::Create(ffn_config_, o.tp_size, t_max, be));
  ffn_ws_.emplace(std::move(ffn_ws));
  return absl::OkStatus();
}

absl::Status MlaDraftDecoder::Forward(const DraftLayerStep& step, const TensorView& x, const TensorView& r,
                                      const TensorView& h, const TensorView& partial, const Tensor& final_norm,
                                      bool feed_back_normed) {
  Backend& be = *rank_.backend;
  const RankCollectives ranks = rank_.Ranks();
  // Every sequence at once over the latent cache, the mask over every key when the step has one
  // (tree passes skip other branches' cached rows).
  MlaBatchedStep batched;
  batched.positions = step.positions;
  batched.slots = step.slots;
  batched.slot_iota = step.slot_iota;
  batched.page_tables = step.page_tables;
  batched.q_start = step.q_start;
  batched.kv_len = step.kv_len;
  batched.max_kv_len = step.max_kv_len;
  batched.key_mask = step.mask;
  if (step.kv_only) return attention_->WriteCacheRows(x, batched, cache_, *mla_ws_);
  EAGLE3_RETURN_IF_ERROR(attention_->ForwardBatched(x, batched, cache_, *mla_ws_, partial));
  EAGLE3_RETURN_IF_ERROR(ranks.AllReduce(partial));
  EAGLE3_RETURN_IF_ERROR(be.AddRmsNorm(partial, r, post_ln_, eps_, h));
  // The feed-forward block, then r += ffn and head_in = final_norm(r).
  EAGLE3_RETURN_IF_ERROR(mlp_->Forward(h, *ffn_ws_, partial));
  EAGLE3_RETURN_IF_ERROR(ranks.AllReduce(partial));
  EAGLE3_RETURN_IF_ERROR(be.AddRmsNorm(partial, r, final_norm, eps_, step.head_in));
  return be.Copy(feed_back_normed ? step.head_in : r, step.hidden_out);
}

}  // namespace eagle3
