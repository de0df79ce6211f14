#include "feed_forward_block.h"

#include <algorithm>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "view_slices.h"
#include "absl/strings/str_cat.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

// One routed expert's gate, up and down weights (specs[next], [next + 1], [next + 2]). The caller
// stacks gate and up where they are dense and frees them, so those come from the backend's
// allocator() (WeightLoader::StackPart::kIfDense); quantized, they are kept, in warp tiles where the
// backend takes them (only QuantizedMoeExperts reads them). That op reads tiles only where it reads
// all three weights on its fast path, so the three are tiled together or not at all: down (whose
// slice starts at the rank's column, the one a backend may not take) is loaded first, and gate and
// up are tiled only after it.
absl::StatusOr<std::vector<LinearWeight>> LoadRoutedExpert(std::span<const WeightSpec> specs, size_t next,
                                                           DType weight_dtype, WeightLoader& loader) {
  using Codes = WeightLoader::Codes;
  const auto tiled = [](const LinearWeight& w) { return w.quantized() && w.quantized_view().warp_tiled(); };
  EAGLE3_ASSIGN_OR_RETURN(LinearWeight down, loader.LoadLinear(specs[next + 2], weight_dtype,
                                                               WeightLoader::StackPart::kNo, Codes::kExpertTiles));
  const Codes gate_up_codes = tiled(down) ? Codes::kExpertTiles : Codes::kRowMajor;
  std::vector<LinearWeight> parts;
  for (size_t i = next; i < next + 2; ++i) {
    EAGLE3_ASSIGN_OR_RETURN(LinearWeight w, loader.LoadLinear(specs[i], weight_dtype,
                                                              WeightLoader::StackPart::kIfDense, gate_up_codes));
    parts.push_back(std::move(w));
  }
  if (tiled(down) && !(tiled(parts[0]) && tiled(parts[1]))) {
    // The backend took down's slice in tiles but not gate's or up's: down again, row-major (its
    // tiles stay unused in the weight memory; no published checkpoint's slices come here).
    EAGLE3_ASSIGN_OR_RETURN(down, loader.LoadLinear(specs[next + 2], weight_dtype, WeightLoader::StackPart::kNo,
                                                    Codes::kRowMajor));
  }
  parts.push_back(std::move(down));
  return parts;
}

}  // namespace

FeedForwardConfig FeedForwardConfig::ForTargetLayer(const DeepseekV2Config& config, int64_t layer) {
  FeedForwardConfig f;
  f.hidden_size = config.hidden_size;
  f.moe = config.IsMoeLayer(layer);
  f.intermediate_size = config.intermediate_size;
  f.n_routed_experts = config.n_routed_experts.value_or(0);
  f.moe_intermediate_size = config.moe_intermediate_size;
  f.n_shared_experts = config.n_shared_experts;
  f.routing = MoeRoutingParams::FromConfig(config);
  return f;
}

FeedForwardConfig FeedForwardConfig::Dense(int64_t hidden_size, int64_t intermediate_size) {
  FeedForwardConfig f;
  f.hidden_size = hidden_size;
  f.intermediate_size = intermediate_size;
  return f;
}

std::vector<WeightSpec> FeedForwardConfig::Weights(std::string_view prefix) const {
  const std::string m(prefix);
  const int64_t h = hidden_size;
  std::vector<WeightSpec> specs;
  if (!moe) {
    AppendSiluMlpWeights(m, h, intermediate_size, specs);
    return specs;
  }
  AppendMoeWeights(m, h, n_routed_experts, moe_intermediate_size, n_shared_experts,
                   routing.topk_method == TopkMethod::kNoauxTc, specs);
  return specs;
}

int64_t FeedForwardConfig::WidestRankIntermediate(int tp_size) const {
  return std::max<int64_t>({intermediate_size / tp_size, moe_intermediate_size * n_shared_experts / tp_size, 1});
}

absl::StatusOr<FeedForwardWorkspace> FeedForwardWorkspace::Create(const FeedForwardConfig& config, int tp_size,
                                                                  int64_t max_tokens, Backend& backend) {
  FeedForwardWorkspace ws;
  ws.max_tokens = max_tokens;
  ws.intermediate = config.WidestRankIntermediate(tp_size);
  const int64_t t_max = max_tokens;
  const int64_t experts = std::max<int64_t>(config.n_routed_experts, 1);
  const int64_t top_k = std::max<int64_t>(config.routing.top_k, 1);
  auto alloc = [&](DType dtype, const Shape& shape) { return Tensor::Empty(dtype, shape, backend.allocator()); };
  EAGLE3_ASSIGN_OR_RETURN(ws.gate_up, alloc(DType::kF32, Shape{t_max, 2 * ws.intermediate}));
  EAGLE3_ASSIGN_OR_RETURN(ws.act, alloc(DType::kF32, Shape{t_max, ws.intermediate}));
  EAGLE3_ASSIGN_OR_RETURN(ws.router_logits, alloc(DType::kF32, Shape{t_max, experts}));
  // A column more per shared expert, for where they join the routed ones (FeedForwardBlock::Forward):
  // slot top_k + i names joined expert n_routed_experts + i with weight 1, written here once; the
  // routing writes only the first top_k columns.
  const int64_t shared = std::max<int64_t>(config.n_shared_experts, 0);
  const int64_t slots = top_k + shared;
  EAGLE3_ASSIGN_OR_RETURN(ws.ids, alloc(DType::kI32, Shape{t_max, slots}));
  EAGLE3_ASSIGN_OR_RETURN(ws.weights, alloc(DType::kF32, Shape{t_max, slots}));
  if (slots > top_k) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor ids, Tensor::Zeros(DType::kI32, Shape{t_max, slots}));
    EAGLE3_ASSIGN_OR_RETURN(Tensor weights, Tensor::Zeros(DType::kF32, Shape{t_max, slots}));
    for (int64_t t = 0; t < t_max; ++t) {
      for (int64_t i = 0; i < shared; ++i) {
        ids.view().data_as<int32_t>()[t * slots + top_k + i] = static_cast<int32_t>(config.n_routed_experts + i);
        weights.view().data_as<float>()[t * slots + top_k + i] = 1.0f;
      }
    }
    EAGLE3_RETURN_IF_ERROR(backend.Copy(ids.view(), ws.ids.view()));
    EAGLE3_RETURN_IF_ERROR(backend.Copy(weights.view(), ws.weights.view()));
    EAGLE3_RETURN_IF_ERROR(backend.Synchronize());
  }
  return ws;
}

absl::StatusOr<FeedForwardBlock::SiluMlpWeights> FeedForwardBlock::LoadSiluMlp(std::span<const WeightSpec> specs,
                                                                                size_t* next, DType dtype,
                                                                                WeightLoader& loader) {
  SiluMlpWeights mlp;
  EAGLE3_ASSIGN_OR_RETURN(mlp.gate_up, loader.LoadStackedLinear(specs.subspan(*next, 2), dtype));
  EAGLE3_ASSIGN_OR_RETURN(mlp.down, loader.LoadLinear(specs[*next + 2], dtype));
  mlp.inter = mlp.down.cols();
  *next += 3;
  return mlp;
}

DType FeedForwardBlock::RouterDtype(DType stored, DType weight_dtype) {
  return stored == DType::kBF16 && weight_dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

absl::StatusOr<FeedForwardBlock> FeedForwardBlock::Load(const FeedForwardConfig& config, std::string_view prefix,
                                                        DType weight_dtype, WeightLoader& loader) {
  FeedForwardBlock b;
  b.backend_ = &loader.backend();
  b.moe_ = config.moe;
  b.routing_ = config.routing;
  const std::vector<WeightSpec> specs = config.Weights(prefix);
  size_t next = 0;
  if (!config.moe) {
    EAGLE3_ASSIGN_OR_RETURN(b.dense_, LoadSiluMlp(specs, &next, weight_dtype, loader));
    return b;
  }
  EAGLE3_ASSIGN_OR_RETURN(const DType router_stored, loader.StoredDtype(specs[next]));
  EAGLE3_ASSIGN_OR_RETURN(b.router_, loader.Load(specs[next++], RouterDtype(router_stored, weight_dtype)));
  if (config.routing.topk_method == TopkMethod::kNoauxTc) {
    EAGLE3_ASSIGN_OR_RETURN(b.correction_bias_, loader.Load(specs[next++], DType::kF32));
  }
  for (int64_t e = 0; e < config.n_routed_experts; ++e, next += 3) {
    EAGLE3_ASSIGN_OR_RETURN(std::vector<LinearWeight> parts, LoadRoutedExpert(specs, next, weight_dtype, loader));
    const bool quantized = parts[0].quantized();
    if (parts[1].quantized() != quantized || parts[2].quantized() != quantized ||
        (e > 0 && quantized == b.quantized_experts_.empty())) {
      return absl::InvalidArgumentError("FeedForwardBlock '" + std::string(prefix) + "': expert " + std::to_string(e) +
                                        " (" + specs[next].name + ") is not stored in the form of the others: "
                                        "every routed expert must be quantized alike");
    }
    if (quantized) {
      b.quantized_experts_.push_back(
          QuantizedExpertWeights{parts[0].quantized_view(), parts[1].quantized_view(), parts[2].quantized_view()});
      for (LinearWeight& w : parts) b.expert_weights_.push_back(std::move(w));
      continue;
    }
    EAGLE3_ASSIGN_OR_RETURN(std::optional<LinearWeight> gate_up,
                            StackLinearWeights(loader.backend(), std::span(parts).first(2)));
    if (!gate_up.has_value()) return absl::InternalError("FeedForwardBlock: dense gate and up did not stack");
    b.experts_.push_back(ExpertWeights{gate_up->dense(), parts[2].dense()});
    b.expert_weights_.push_back(std::move(*gate_up));
    b.expert_weights_.push_back(std::move(parts[2]));
  }
  if (config.n_shared_experts > 0) EAGLE3_RETURN_IF_ERROR(b.LoadShared(config, specs, next, weight_dtype, loader));
  return b;
}

namespace {

// Rows up to which a shared expert joins the routed experts' op. Past them its own MLP is cheaper:
// the op's backends group each expert's rows in batches (CudaBackend: 8 rows per job, each job
// reading the expert's weights), so a shared expert, which every row takes, would be read once per
// batch, where its own products read it once per pass of up to 32 rows.
constexpr int64_t kSharedJoinMaxTokens = 32;
// The same for dense shared experts (LoadDenseShared). The dense op's decode path names an expert's
// weights once per (row, slot), so a joined shared expert is named once per row; the repeats come
// from L2, and the join pays up to 8 rows and not by 16 (benchmarks/NOTES.md, BM_MoeDecode join).
constexpr int64_t kDenseSharedJoinMaxTokens = 8;

// Whether `shared` can be one more expert of the routed ones' op: the same format, block sizes,
// scale dtype and shape.
bool AlikeExpert(const QuantizedExpertWeights& shared, const QuantizedExpertWeights& routed) {
  const auto alike = [](const QuantizedWeightView& a, const QuantizedWeightView& b) {
    return a.format == b.format && a.block_rows == b.block_rows && a.block_cols == b.block_cols &&
           a.scales.dtype() == b.scales.dtype() && a.rows() == b.rows() && a.k == b.k;
  };
  return alike(shared.gate, routed.gate) && alike(shared.up, routed.up) && alike(shared.down, routed.down);
}

}  // namespace

absl::Status FeedForwardBlock::LoadDenseShared(const FeedForwardConfig& config, std::span<const WeightSpec> specs,
                                               size_t next, DType weight_dtype, WeightLoader& loader) {
  using StackPart = WeightLoader::StackPart;
  std::vector<LinearWeight> parts;
  for (size_t i = next; i < next + 3; ++i) {
    EAGLE3_ASSIGN_OR_RETURN(LinearWeight w, loader.LoadLinear(specs[i], weight_dtype,
                                                              i == next + 2 ? StackPart::kNo : StackPart::kYes));
    parts.push_back(std::move(w));
  }
  const ExpertWeights& routed = experts_.front();
  const int64_t slots = config.n_shared_experts;
  const int64_t slice = routed.down.dim(1);  // the routed experts' intermediate width on this rank
  const auto dense_like = [&](const LinearWeight& w, int64_t rows, int64_t cols) {
    return !w.quantized() && w.dense().dtype() == routed.gate_up.dtype() && w.rows() == rows && w.cols() == cols;
  };
  const int64_t hidden = routed.gate_up.dim(1);
  const bool joins = slice > 0 && dense_like(parts[0], slots * slice, hidden) &&
                     dense_like(parts[1], slots * slice, hidden) && dense_like(parts[2], hidden, slots * slice);
  if (!joins) return SetSharedMlp(loader.backend(), parts, /*keep_stacked_parts=*/false);
  // [gate_0; up_0; gate_1; up_1; ...]: slice i's gate and up rows side by side, so that each slice
  // is one expert's [2 I, H] gate_up (ExpertWeights) and its down the matching columns of down.
  Backend& backend = loader.backend();
  const TensorView gate = parts[0].dense(), up = parts[1].dense();
  EAGLE3_ASSIGN_OR_RETURN(Tensor stacked, Tensor::Empty(gate.dtype(), Shape{2 * slots * slice, hidden},
                                                         backend.weight_allocator()));
  for (int64_t i = 0; i < slots; ++i) {
    EAGLE3_RETURN_IF_ERROR(backend.Copy(Rows(gate, i * slice, slice), Rows(stacked, 2 * i * slice, slice)));
    EAGLE3_RETURN_IF_ERROR(backend.Copy(Rows(up, i * slice, slice), Rows(stacked, (2 * i + 1) * slice, slice)));
  }
  // The parts are freed on return: the copies must have read them.
  EAGLE3_RETURN_IF_ERROR(backend.Synchronize());
  shared_.gate_up.push_back(LinearWeight(std::move(stacked)));
  shared_.down = std::move(parts[2]);
  shared_.inter = slots * slice;
  shared_.act_block = slice;
  const TensorView gate_up = shared_.gate_up.front().dense(), down = shared_.down.dense();
  // Gemm rounds f32 activations against bf16 weights; so does the joined form then, so that a call
  // joined (few rows) and one not (more rows: a verify) differ by summation order only.
  const bool bf16_activations = gate_up.dtype() == DType::kBF16;
  for (int64_t i = 0; i < slots; ++i) {
    experts_.push_back(ExpertWeights{Rows(gate_up, 2 * i * slice, 2 * slice), down.Narrow(1, i * slice, slice),
                                     bf16_activations});
  }
  shared_slots_ = slots;
  return absl::OkStatus();
}

absl::Status FeedForwardBlock::LoadShared(const FeedForwardConfig& config, std::span<const WeightSpec> specs,
                                          size_t next, DType weight_dtype, WeightLoader& loader) {
  if (quantized_experts_.empty() && !experts_.empty()) {
    return LoadDenseShared(config, specs, next, weight_dtype, loader);
  }
  if (config.n_shared_experts != 1 || quantized_experts_.empty()) {
    EAGLE3_ASSIGN_OR_RETURN(shared_, LoadSiluMlp(specs, &next, weight_dtype, loader));
    return absl::OkStatus();
  }
  // One shared expert beside quantized routed ones: gate, up and down read apart, so that where
  // they are quantized like the routed experts (DeepSeek-V3 / R1, Kimi-K2-Instruct FP8) they can
  // also serve as one more routed expert (Forward).
  // Where the routed experts' codes are warp-tiled, the joined expert's must be too: down is loaded
  // in tiles where QuantizedGemm also takes them (its own MLP and the join then share them), gate
  // and up are parts to stack and free (from the backend's allocator()), and the join gets tiled
  // copies of what is not tiled yet. Otherwise everything stays row-major: quantized gate and up are
  // kept where the shared expert joins the routed ones, and where it does not (quantized unlike
  // them) they are freed after the stack below, their bytes unused in the weight memory until the
  // model is freed.
  const QuantizedExpertWeights& routed = quantized_experts_[0];
  const bool tiled = routed.gate.warp_tiled() || routed.up.warp_tiled() || routed.down.warp_tiled();
  std::vector<LinearWeight> parts;
  for (size_t i = next; i < next + 3; ++i) {
    const bool down = i == next + 2;
    const auto stack_part = down    ? WeightLoader::StackPart::kNo
                            : tiled ? WeightLoader::StackPart::kYes
                                    : WeightLoader::StackPart::kIfDense;
    const auto codes = down && tiled ? WeightLoader::Codes::kGemmTiles : WeightLoader::Codes::kRowMajor;
    EAGLE3_ASSIGN_OR_RETURN(LinearWeight w, loader.LoadLinear(specs[i], weight_dtype, stack_part, codes));
    parts.push_back(std::move(w));
  }
  bool joins = false;
  if (parts[0].quantized() && parts[1].quantized() && parts[2].quantized()) {
    QuantizedExpertWeights shared{parts[0].quantized_view(), parts[1].quantized_view(), parts[2].quantized_view()};
    joins = AlikeExpert(shared, routed);
    const QuantizedWeightView* const want[3] = {&routed.gate, &routed.up, &routed.down};
    QuantizedWeightView* const views[3] = {&shared.gate, &shared.up, &shared.down};
    for (int i = 0; i < 3 && joins; ++i) {
      const bool tiles_ok = views[i]->warp_tiled() || CanWarpTile(*views[i]);
      if (want[i]->warp_tiled() ? !tiles_ok : views[i]->warp_tiled()) joins = false;
    }
    for (int i = 0; i < 3 && joins; ++i) {
      if (!want[i]->warp_tiled() || views[i]->warp_tiled()) continue;
      EAGLE3_ASSIGN_OR_RETURN(LinearWeight copy, WarpTiledCopy(loader.backend(), parts[i]));
      *views[i] = copy.quantized_view();
      expert_weights_.push_back(std::move(copy));
    }
    if (joins) {
      quantized_experts_.push_back(shared);
      shared_slots_ = 1;
    }
  }
  // The parts stay only where the joined expert's views point into them.
  return SetSharedMlp(loader.backend(), parts, /*keep_stacked_parts=*/joins && !tiled);
}

absl::Status FeedForwardBlock::SetSharedMlp(Backend& backend, std::vector<LinearWeight>& parts,
                                            bool keep_stacked_parts) {
  // Gate and up stacked where they can be (a copy). Moving a LinearWeight keeps its device memory
  // where it is, so views into the parts stay valid.
  EAGLE3_ASSIGN_OR_RETURN(std::optional<LinearWeight> gate_up,
                          StackLinearWeights(backend, std::span(parts).first(2), /*gemm_tiles=*/true));
  if (gate_up.has_value()) {
    shared_.gate_up.push_back(std::move(*gate_up));
    if (keep_stacked_parts) {
      expert_weights_.push_back(std::move(parts[0]));
      expert_weights_.push_back(std::move(parts[1]));
    }
  } else {
    shared_.gate_up.push_back(std::move(parts[0]));
    shared_.gate_up.push_back(std::move(parts[1]));
  }
  shared_.down = std::move(parts[2]);
  shared_.inter = shared_.down.cols();
  return absl::OkStatus();
}

absl::Status FeedForwardBlock::SiluMlp(const TensorView& x, const SiluMlpWeights& mlp, float beta,
                                       FeedForwardWorkspace& ws, const TensorView& out) const {
  const int64_t t = x.dim(0);
  const TensorView gu = Block(ws.gate_up, 0, t, 0, 2 * mlp.inter);
  const TensorView a = Block(ws.act, 0, t, 0, mlp.inter);
  int64_t col = 0;
  for (const LinearWeight& part : mlp.gate_up) {
    EAGLE3_RETURN_IF_ERROR(part.Apply(*backend_, x, Block(gu, 0, t, col, part.rows())));
    col += part.rows();
  }
  if (mlp.act_block == 0) {
    EAGLE3_RETURN_IF_ERROR(backend_->SiluMul(gu, a));
  } else {
    // gu is [gate_0 | up_0 | gate_1 | up_1 | ...]: each slice's activations into its columns of a.
    const int64_t b = mlp.act_block;
    for (int64_t c = 0; c < mlp.inter; c += b) {
      EAGLE3_RETURN_IF_ERROR(backend_->SiluMul(Block(gu, 0, t, 2 * c, 2 * b), Block(a, 0, t, c, b)));
    }
  }
  GemmOptions accumulate = kWeightsGemm;
  accumulate.beta = beta;
  return mlp.down.Apply(*backend_, a, out, accumulate);
}

void FeedForwardBlock::AppendTokenWeights(std::vector<TensorView>& out) const {
  for (const Tensor* t : {&router_, &correction_bias_}) {
    if (!t->empty()) out.push_back(t->view());
  }
  for (const SiluMlpWeights* mlp : {&shared_, &dense_}) {
    for (const LinearWeight& part : mlp->gate_up) part.AppendTensors(out);
    mlp->down.AppendTensors(out);
  }
}

absl::Status FeedForwardBlock::Forward(const TensorView& x, FeedForwardWorkspace& ws, const TensorView& out,
                                       std::span<const TensorView> prefetch) const {
  const int64_t t = x.dim(0);
  if (x.rank() != 2 || t > ws.max_tokens) {
    return absl::InvalidArgumentError("FeedForwardBlock: x must be [T <= " + std::to_string(ws.max_tokens) +
                                      ", H], got " + x.ToString());
  }
  const int64_t widest = std::max(dense_.inter, shared_.inter);
  if (widest > ws.intermediate) {
    return absl::InvalidArgumentError("FeedForwardBlock: the workspace holds an intermediate width of " +
                                      std::to_string(ws.intermediate) + ", the block needs " + std::to_string(widest));
  }
  if (!moe_) return SiluMlp(x, dense_, 0.0f, ws, out);
  const int64_t k = routing_.top_k;
  const int64_t needed = k + shared_slots_;
  if (ws.ids.view().dim(1) < needed) {
    return absl::InvalidArgumentError("FeedForwardBlock: the workspace holds " + std::to_string(ws.ids.view().dim(1)) +
                                      " expert slots per row, the block needs " + std::to_string(needed));
  }
  const TensorView logits_t = Rows(ws.router_logits, 0, t);
  // Router logits in fp32 from x as it is, whichever dtype the router is kept in.
  EAGLE3_RETURN_IF_ERROR(backend_->Gemm(x, router_, logits_t, kF32ActivationsWeightsGemm));
  const TensorView bias = correction_bias_.view();
  EAGLE3_RETURN_IF_ERROR(backend_->MoeRoute(logits_t, correction_bias_.empty() ? nullptr : &bias, routing_,
                                            Block(ws.ids, 0, t, 0, k), Block(ws.weights, 0, t, 0, k)));
  if (!prefetch.empty()) EAGLE3_RETURN_IF_ERROR(backend_->PrefetchWeights(prefetch));
  // While the shared experts join (SharedJoins) they take every row's slots after its top_k (weight
  // 1: the workspace's extra columns), added after the routed slots in the op's one sum; past the
  // join a dense call names the routed experts alone (DenseExpertsFor).
  const bool join = SharedJoins(t);
  const int64_t slots = k + (join ? shared_slots_ : 0);
  const TensorView ids_t = Block(ws.ids, 0, t, 0, slots), w_t = Block(ws.weights, 0, t, 0, slots);
  if (quantized_experts_.empty()) {
    EAGLE3_RETURN_IF_ERROR(backend_->MoeExperts(x, ids_t, w_t, DenseExpertsFor(t), out, /*accumulate=*/false));
  } else {
    EAGLE3_RETURN_IF_ERROR(backend_->QuantizedMoeExperts(x, ids_t, w_t, quantized_experts_, out, /*accumulate=*/false));
  }
  // Otherwise the shared MLP joins the routed output before the one reduction that follows.
  if (shared_.inter > 0 && !join) return SiluMlp(x, shared_, 1.0f, ws, out);
  return absl::OkStatus();
}

bool FeedForwardBlock::SharedJoins(int64_t rows) const {
  return shared_slots_ > 0 &&
         rows <= (quantized_experts_.empty() ? kDenseSharedJoinMaxTokens : kSharedJoinMaxTokens);
}

std::span<const ExpertWeights> FeedForwardBlock::DenseExpertsFor(int64_t rows) const {
  const std::span<const ExpertWeights> all(experts_);
  // Quantized experts keep their joined shared expert in quantized_experts_: experts_ is empty then.
  if (!quantized_experts_.empty() || SharedJoins(rows)) return all;
  return all.first(all.size() - static_cast<size_t>(shared_slots_));
}

}  // namespace eagle3
