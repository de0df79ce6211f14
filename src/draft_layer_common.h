// The pieces the draft layer kinds share (internal to src/): the EAGLE-3 input both EAGLE-3 heads
// build (src/draft_layer_llama.cc, src/draft_layer_mla.cc), and the MLA decoder layer the MLA
// EAGLE-3 head and the MTP module both run (src/draft_layer_mla.cc, src/draft_layer_mtp.cc). One
// implementation each, so that a fix to either reaches every kind that runs it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "draft_layer.h"
#include "feed_forward_block.h"
#include "mla_block.h"
#include "weight_loader.h"
#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/detail/host_budget.h"
#include "eagle3/mla_attention_config.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// The target's checkpoint at `target_dir`, checked to hold the embedding an EAGLE-3 head without its
// own shares ([vocab_size, hidden_size] under DeepseekEmbeddingName(target)); NotFound naming the
// tensor otherwise. `read_threads`: CheckpointReadOptions::threads of the opened checkpoint.
absl::StatusOr<std::unique_ptr<Checkpoint>> OpenSharedEmbedding(const std::string& target_dir,
                                                                const DeepseekV2Config& target, int read_threads);

// An EAGLE-3 head's input (eagle3/draft_model.h, docs/mla_drafts.md):
//
//   g = fc(aux)         from the target (norm_before_fc: aux RMS-normed whole first; fc_norm: each
//                       target-hidden-wide tap normed first; fc.bias when present); later: fed back
//   x = [input_layernorm(embed(tok)) | hidden_norm(g)]       [T, 2H], embeddings first
//   r = g, or hidden_norm(g) with norm_before_residual       the residual the layer adds to
//
// The kind loads the weights (each with its own loader) and calls Allocate once; every tensor is on
// the rank's backend device, f32 unless said.
struct Eagle3Input {
  int64_t hidden_size = 0;         // H
  int64_t target_hidden_size = 0;  // the width of one tap
  int64_t fc_input_width = 0;      // taps x target_hidden_size
  float eps = 0.0f;
  bool norm_before_residual = false;

  Tensor fc;                     // [H, fc_input_width] in weight_dtype
  Tensor fc_bias;                // [H]; empty: none
  Tensor input_norm;             // [fc_input_width] (norm_before_fc); empty: none
  std::vector<Tensor> fc_norms;  // [target_hidden_size] each (fc_norm, one per tap); empty: none
  Tensor input_layernorm;        // [H]
  Tensor hidden_norm;            // [H]
  // Workspaces: [max_tokens, fc_input_width], [max_tokens, H], [max_tokens, 2H].
  Tensor aux, g, x;

  // The workspaces for at most `max_tokens` rows.
  absl::Status Allocate(const DraftRank& rank, int64_t max_tokens);
  // x (the first step.rows rows of `x`, returned by X) and r from the step's input and embedded rows.
  //   r: [step.rows, H] f32, device
  absl::Status Build(Backend& backend, const DraftLayerStep& step, const TensorView& r) const;
  TensorView X(int64_t rows) const;
};

// The MLA decoder layer of the MLA EAGLE-3 head and of the MTP module: MLA attention over the
// draft's own paged latent cache (rows kv_lora_rank + qk_rope_head_dim wide, replicated on every
// rank), post_attention_layernorm, the feed-forward block (dense or MoE), the final norm:
//
//   r += o_proj(MLA(x));  h = post_attention_layernorm(r);  r += FFN(h)
//   head_in = final_norm(r);  hidden_out = head_in (feed_back_normed) or r
//
// o_proj and the FFN give this rank's partial sums, all-reduced over the ranks.
class MlaDraftDecoder {
 public:
  MlaDraftDecoder(const MlaAttentionConfig& attention, const FeedForwardConfig& ffn, const DraftRank& rank,
                  float eps);

  const MlaRankDims& dims() const { return dims_; }
  const FeedForwardConfig& ffn_config() const { return ffn_config_; }

  // The host bytes of the RoPE table and masks, and on a host backend of the cache and the layer's
  // workspaces, `own_width` more f32 columns per token for the kind's own workspaces.
  void AddBuffers(const std::string& tokens, const std::string& context, int64_t own_width,
                  HostByteBudget& budget) const;
  // This rank's self_attn., post_attention_layernorm and mlp. tensors under `layer_prefix`.
  absl::Status LoadWeights(const std::string& layer_prefix, DType weight_dtype, WeightLoader& loader);
  // The latent cache (zeroed: unwritten slots read as zeros) and the MLA and FFN workspaces.
  absl::Status Allocate();

  // The layer over the step's rows from the attention input `x`; r, h and partial are the kind's
  // [step.rows, H] f32 device workspaces, r holding the residual on entry. With step.kv_only only
  // the rows' latent cache rows are written.
  //   x: [step.rows, input_width] f32, row-strided, device; may be `h` (read before h is written)
  //   final_norm: [H] f32, device
  absl::Status Forward(const DraftLayerStep& step, const TensorView& x, const TensorView& r, const TensorView& h,
                       const TensorView& partial, const Tensor& final_norm, bool feed_back_normed);

 private:
  MlaAttentionConfig attention_config_;
  FeedForwardConfig ffn_config_;
  const DraftRank& rank_;
  MlaRankDims dims_;
  float eps_ = 0.0f;

  Tensor post_ln_;
  std::optional<MlaBlock> attention_;
  std::optional<FeedForwardBlock> mlp_;
  Tensor cache_;  // [num_kv_pages, page_size, kv_lora_rank + qk_rope_head_dim]: the latent rows
  std::optional<MlaWorkspace> mla_ws_;
  std::optional<FeedForwardWorkspace> ffn_ws_;
};

}  // namespace eagle3
