// FeedForwardBlock: one rank's share of the feed-forward half of a DeepSeek decoder layer: a dense
// SiLU MLP, or the MoE block (router, MoeRoute, routed experts through MoeExperts, shared experts),
// as the target's layers, DeepSeek-V3's MTP layer (MoE) and an MLA EAGLE-3 draft layer (dense) run
// it (docs/mla_drafts.md, "Proposed C++ design"). Its output is this rank's partial sum (column
// slices of the intermediate dim, every routed expert's slice): the caller reduces it over the
// ranks, once, shared experts included.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/dtype.h"
#include "eagle3/moe_routing.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"
#include "linear_weight.h"
#include "weight_loader.h"

namespace eagle3 {

// The shapes of one feed-forward block (full, before tensor parallelism).
struct FeedForwardConfig {
  int64_t hidden_size = 0;
  bool moe = false;
  int64_t intermediate_size = 0;  // the dense MLP's width
  // MoE: n_routed_experts routed experts of moe_intermediate_size each, and n_shared_experts shared
  // ones stored as one MLP of n_shared_experts * moe_intermediate_size.
  int64_t n_routed_experts = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_shared_experts = 0;
  MoeRoutingParams routing;  // kNoauxTc: the router has an e_score_correction_bias

  // Layer `layer` of `config` (IsMoeLayer picks the form). The dense and the MoE fields are both
  // set, whichever the layer is, so that FeedForwardWorkspace sizes for every layer of a model from
  // any of them.
  static FeedForwardConfig ForTargetLayer(const DeepseekV2Config& config, int64_t layer);
  // A dense SiLU MLP (an MLA EAGLE-3 draft layer).
  static FeedForwardConfig Dense(int64_t hidden_size, int64_t intermediate_size);

  // The tensors under `prefix` ("model.layers.3.mlp.", "layers.0.mlp."), in the order
  // DeepseekDecoderLayerWeights lists a layer's MLP: gate_proj / up_proj / down_proj; or the router
  // gate.weight (replicated) [+ gate.e_score_correction_bias], each expert's, the shared one's.
  std::vector<WeightSpec> Weights(std::string_view prefix) const;
  // The widest SiLU MLP intermediate slice on one of `tp_size` ranks over both forms (dense, shared
  // experts), at least 1.
  int64_t WidestRankIntermediate(int tp_size) const;
};

// Scratch of FeedForwardBlock::Forward for at most `max_tokens` rows, on the backend's device; every
// block of a model may share one (one runs at a time).
struct FeedForwardWorkspace {
  int64_t max_tokens = 0;
  int64_t intermediate = 0;  // columns of act
  Tensor gate_up;            // [T, 2 * intermediate] f32
  Tensor act;                // [T, intermediate] f32: silu(gate) * up
  Tensor router_logits;      // [T, max(n_routed_experts, 1)] f32
  // [T, max(top_k, 1) + n_shared_experts] i32 / f32: each row's routed experts and their weights;
  // the extra columns hold the shared experts' slots (ids n_routed_experts + i, weight 1), for the
  // shared experts that join the routed ones (FeedForwardBlock::Forward).
  Tensor ids;
  Tensor weights;

  // Buffers for every block `config` describes (dense and MoE alike) on one of `tp_size` ranks.
  static absl::StatusOr<FeedForwardWorkspace> Create(const FeedForwardConfig& config, int tp_size,
                                                     int64_t max_tokens, Backend& backend);
};

class FeedForwardBlock {
 public:
  // Loads this rank's shard of config.Weights(prefix) through `loader`: the dense and shared MLPs'
  // projections as LinearWeights (kept quantized as the loader says, else in `weight_dtype`; gate|up
  // stacked into one [2 I, H] weight where StackLinearWeights can); the routed experts the same way:
  // kept quantized for Backend::QuantizedMoeExperts, or dense in `weight_dtype` (gate|up stacked)
  // for MoeExperts; the router in RouterDtype and its bias in f32. Router logits are fp32 products
  // of the unrounded activations either way (GemmOptions::keep_f32_activations).
  static absl::StatusOr<FeedForwardBlock> Load(const FeedForwardConfig& config, std::string_view prefix,
                                               DType weight_dtype, WeightLoader& loader);

  // The dtype the router (`gate.weight`) is kept in, from the dtype the checkpoint stores it in:
  // bf16 where both that and `weight_dtype` (the backend's preferred_weight_dtype() unless the
  // model was told otherwise) are bf16, so the values are the stored ones at half the bytes a
  // step streams; else f32 (the CPU reference; an f32 or f16 checkpoint, whose values bf16 could
  // round).
  static DType RouterDtype(DType stored, DType weight_dtype);

  bool moe() const { return moe_; }
  // Whether the shared experts run as more experts of the routed experts' op (Forward): one shared
  // expert kept quantized like the routed ones (up to 32 rows), or dense routed experts and a dense
  // shared MLP of n_shared_experts times their width (up to 8 rows), which joins as n_shared_experts
  // experts (one slice of its intermediate dim each: SiLU MLPs add up over such slices).
  bool shared_joins_experts() const { return shared_slots_ > 0; }
  // The slots the shared experts take when they join (0 when they do not).
  int64_t shared_slots() const { return shared_slots_; }

  // out = this rank's partial sum of the block over x, shared experts added before the caller's one
  // reduction.
  //   x: [T, H] f32, row-strided, device, T <= ws.max_tokens      out: [T, H] f32, device, no
  //   overlap with x
  // prefetch: weights read after this block (the next layer's attention inputs), prefetched
  // (Backend::PrefetchWeights) once a MoE block has routed, while its experts run; a dense block
  // does not issue it.
  absl::Status Forward(const TensorView& x, FeedForwardWorkspace& ws, const TensorView& out,
                       std::span<const TensorView> prefetch = {}) const;

  // Whether the shared experts join the routed experts' op in a call of `rows` rows.
  bool SharedJoins(int64_t rows) const;
  // The dense expert table Forward passes to MoeExperts for `rows` rows: the routed experts, then
  // the shared slices while they join. Past the join the slices are left out, so that their
  // bf16_activations flags do not keep the routed call off a backend's faster path for many rows
  // (CudaBackend runs a call naming a flagged expert per pair).
  std::span<const ExpertWeights> DenseExpertsFor(int64_t rows) const;

  // The weights every token of a step reads, in the order Forward reads them (the router and its
  // bias, the shared MLP; a dense block's MLP), appended to `out`: what a step prefetches for this
  // block while its attention runs. The routed experts are known only once routed.
  void AppendTokenWeights(std::vector<TensorView>& out) const;

 private:
  FeedForwardBlock() = default;

  // A SiLU MLP's weights: gate and up as one stacked [2 I, H] weight, or as two [I, H] ones when
  // they do not stack (quantized slices that start inside a scale block); down [H, I].
  struct SiluMlpWeights {
    std::vector<LinearWeight> gate_up;
    LinearWeight down;
    int64_t inter = 0;  // I; 0: no such MLP
    // 0: gate_up's rows are [gate; up]. Else they are [gate_0; up_0; gate_1; up_1; ...], blocks of
    // act_block rows of gate and of up in turn (act_block divides I; one stacked weight): the dense
    // shared experts that join the routed ones, slice i being joined expert i.
    int64_t act_block = 0;
  };

  // The next MLP of Weights' order (gate, up, down) from specs[*next], as LinearWeights.
  static absl::StatusOr<SiluMlpWeights> LoadSiluMlp(std::span<const WeightSpec> specs, size_t* next, DType dtype,
                                                    WeightLoader& loader);
  // The shared experts' MLP from specs[next]: one expert of the routed experts' form and shape joins
  // them (shared_slots_), and so do dense shared experts beside dense routed ones
  // (LoadDenseShared); the MLP is shared_ either way.
  absl::Status LoadShared(const FeedForwardConfig& config, std::span<const WeightSpec> specs, size_t next,
                          DType weight_dtype, WeightLoader& loader);
  // Dense gate, up and down of the shared experts (specs[next], + 1, + 2) as shared_: when they are
  // n_shared_experts slices of the routed experts' width, gate_up interleaved by slice (act_block)
  // and each slice appended to experts_ as one more expert (shared_slots_); else [gate; up] stacked.
  absl::Status LoadDenseShared(const FeedForwardConfig& config, std::span<const WeightSpec> specs, size_t next,
                               DType weight_dtype, WeightLoader& loader);
  // shared_ from the shared experts' gate, up and down (`parts`, moved from): gate and up stacked
  // where they can be, the parts then kept in expert_weights_ where keep_stacked_parts (views of a
  // joined expert point into them), else freed.
  absl::Status SetSharedMlp(Backend& backend, std::vector<LinearWeight>& parts, bool keep_stacked_parts);
  // `mlp` over x; beta 1 accumulates into `out`.
  absl::Status SiluMlp(const TensorView& x, const SiluMlpWeights& mlp, float beta, FeedForwardWorkspace& ws,
                       const TensorView& out) const;

  Backend* backend_ = nullptr;
  bool moe_ = false;
  MoeRoutingParams routing_;
  SiluMlpWeights dense_;  // the dense MLP
  Tensor router_, correction_bias_;
  // The routed experts, dense or kept quantized (one form for all: a checkpoint quantizes all or none).
  std::vector<LinearWeight> expert_weights_;  // dense: gate_up, down; quantized: gate, up, down
  std::vector<ExpertWeights> experts_;                 // dense views of expert_weights_
  std::vector<QuantizedExpertWeights> quantized_experts_;  // quantized views of expert_weights_
  SiluMlpWeights shared_;  // the shared experts' MLP (the joined experts' weights are views into it where dense)
  // Joined shared experts: the last shared_slots_ entries of experts_ / quantized_experts_, in every
  // row's slots top_k, top_k + 1, ... (the workspace's extra columns).
  int64_t shared_slots_ = 0;
};

}  // namespace eagle3
