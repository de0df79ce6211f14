#include "mla_block.h"

#include <algorithm>
#include <utility>

#include "view_slices.h"
#include "eagle3/detail/host_budget.h"
#include "eagle3/mla_attention_weights.h"
#include "eagle3/rope_table.h"
#include "eagle3/status.h"
#include "eagle3/tensor_convert.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// Columns [col, col + cols) of each of the n heads of a [rows, n * d] buffer, head-major:
// [n, rows, cols] with strides [d, row stride, 1] (a BatchedGemm operand, one item per head).
TensorView HeadMajor(const TensorView& t, int64_t n, int64_t d, int64_t col, int64_t cols) {
  auto* data = static_cast<char*>(t.data()) + col * static_cast<int64_t>(DTypeSize(t.dtype()));
  return TensorView(data, t.dtype(), Shape{n, t.dim(0), cols}, Shape{d, t.stride(0), 1}, t.device());
}

// A [num_pages, page_size, W] cache as [num_pages * page_size, 1, W]: with the identity as its page
// table (MlaBatchedStep::slot_iota), one PagedWrite stores every sequence's rows at their slots.
TensorView FlatCache(const TensorView& cache) {
  return TensorView(cache.data(), cache.dtype(), Shape{cache.dim(0) * cache.dim(1), 1, cache.dim(2)}, cache.device());
}

bool HasSuffix(const std::string& name, std::string_view suffix) {
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

MlaRankDims MlaRankDims::Of(const MlaAttentionConfig& config, int tp_size) {
  MlaRankDims d;
  d.input_width = config.input_width;
  d.heads = config.num_heads / tp_size;
  d.q_lora = config.q_lora_rank.value_or(0);
  d.latent = config.kv_lora_rank;
  d.rope = config.qk_rope_head_dim;
  d.width = config.latent_cache_width();
  d.nope = config.qk_nope_head_dim;
  d.qk = config.qk_head_dim();
  d.vdim = config.v_head_dim;
  return d;
}

absl::StatusOr<MlaWorkspace> MlaWorkspace::Create(const MlaAttentionConfig& config, int tp_size, int64_t max_tokens,
                                                  int64_t max_context_len, Backend& backend, const std::string& who) {
  MlaWorkspace ws;
  ws.dims = MlaRankDims::Of(config, tp_size);
  ws.max_tokens = max_tokens;
  ws.max_context_len = max_context_len;
  const MlaRankDims& d = ws.dims;
  const int64_t t_max = max_tokens, s_max = max_context_len;
  auto alloc = [&](DType dtype, const Shape& shape) { return Tensor::Empty(dtype, shape, backend.allocator()); };
  if (d.q_lora > 0) {
    EAGLE3_ASSIGN_OR_RETURN(ws.q, alloc(DType::kF32, Shape{t_max, d.heads * d.qk}));
  }
  EAGLE3_ASSIGN_OR_RETURN(ws.attn_v, alloc(DType::kF32, Shape{t_max, d.heads * d.vdim}));
  EAGLE3_ASSIGN_OR_RETURN(ws.lat, alloc(DType::kF32, Shape{t_max, ws.Lead() + (d.heads + 1) * d.width}));
  EAGLE3_ASSIGN_OR_RETURN(ws.o_lat, alloc(DType::kF32, Shape{t_max, d.heads * d.latent}));
  EAGLE3_ASSIGN_OR_RETURN(ws.ctx_lat, alloc(DType::kF32, Shape{s_max, d.width}));
  EAGLE3_ASSIGN_OR_RETURN(ws.ctx_kv, alloc(DType::kF32, Shape{s_max, d.heads * (d.nope + d.vdim)}));
  EAGLE3_ASSIGN_OR_RETURN(ws.ctx_k, alloc(DType::kF32, Shape{s_max, d.heads * d.qk}));
  EAGLE3_ASSIGN_OR_RETURN(ws.mask, alloc(DType::kU8, Shape{t_max * s_max}));
  {
    EAGLE3_ASSIGN_OR_RETURN(Tensor host_iota, Tensor::Empty(DType::kI64, Shape{s_max}));
    for (int64_t i = 0; i < s_max; ++i) host_iota.data_as<int64_t>()[i] = i;
    EAGLE3_ASSIGN_OR_RETURN(ws.iota, alloc(DType::kI64, Shape{s_max}));
    EAGLE3_RETURN_IF_ERROR(backend.Copy(host_iota, ws.iota));
  }
  {
    EAGLE3_ASSIGN_OR_RETURN(Tensor host_table, Tensor::Empty(DType::kF32, Shape{s_max, d.rope}));
    EAGLE3_RETURN_IF_ERROR(FillRopeCosSin(config.rope, d.rope, host_table));
    EAGLE3_ASSIGN_OR_RETURN(ws.cos_sin, alloc(DType::kF32, host_table.shape()));
    EAGLE3_RETURN_IF_ERROR(backend.Copy(host_table, ws.cos_sin));
  }
  EAGLE3_RETURN_IF_ERROR(AssignHostVector(ws.host_mask, t_max * s_max, uint8_t{0},
                                          who + ": max_tokens_per_forward x max_context_len host mask"));
  return ws;
}

int64_t MlaWorkspace::Lead() const { return dims.q_lora > 0 ? dims.q_lora : dims.heads * dims.qk; }
TensorView MlaWorkspace::Qa() const { return Block(lat, 0, max_tokens, 0, Lead()); }
TensorView MlaWorkspace::QaCacheRow() const { return Block(lat, 0, max_tokens, 0, Lead() + dims.width); }
TensorView MlaWorkspace::CacheRow() const { return Block(lat, 0, max_tokens, Lead(), dims.width); }
TensorView MlaWorkspace::QLat() const {
  return Block(lat, 0, max_tokens, Lead() + dims.width, dims.heads * dims.width);
}
TensorView MlaWorkspace::Q() const { return dims.q_lora > 0 ? q.view() : Qa(); }

absl::StatusOr<MlaBlock> MlaBlock::Load(const MlaAttentionConfig& config, int tp_size, std::string_view prefix,
                                        DType weight_dtype, WeightLoader& loader,
                                        InputProjections input_projections) {
  EAGLE3_RETURN_IF_ERROR(config.ValidateForTp(tp_size, "MlaBlock '" + std::string(prefix) + "'"));
  MlaBlock b;
  b.backend_ = &loader.backend();
  b.config_ = config;
  b.dims_ = MlaRankDims::Of(config, tp_size);
  b.eps_ = static_cast<float>(config.rms_norm_eps);
  b.scale_ = static_cast<float>(config.SoftmaxScale());
  const std::vector<WeightSpec> specs = MlaAttentionWeights(config, prefix);
  size_t next = 0;
  // The next tensor of MlaAttentionWeights' order (checked by its suffix).
  auto next_spec = [&](std::string_view suffix) -> absl::StatusOr<WeightSpec> {
    const WeightSpec& spec = specs[next++];
    if (!HasSuffix(spec.name, suffix)) {
      return absl::InternalError("MlaAttentionWeights order: expected *" + std::string(suffix) + ", got " + spec.name);
    }
    return spec;
  };
  // A norm (f32) or kv_b (dense in weight_dtype).
  auto take = [&](std::string_view suffix, DType dtype) -> absl::StatusOr<Tensor> {
    EAGLE3_ASSIGN_OR_RETURN(const WeightSpec spec, next_spec(suffix));
    return loader.Load(spec, dtype);
  };
  // A projection.
  auto take_linear = [&](std::string_view suffix) -> absl::StatusOr<LinearWeight> {
    EAGLE3_ASSIGN_OR_RETURN(const WeightSpec spec, next_spec(suffix));
    return loader.LoadLinear(spec, weight_dtype);
  };
  // The product of x before the cache row: q_a (q-LoRA), else the plain q_proj (this rank's heads).
  const bool lora = config.q_lora_rank.has_value();
  EAGLE3_ASSIGN_OR_RETURN(const WeightSpec lead_spec, next_spec(lora ? "q_a_proj.weight" : "q_proj.weight"));
  if (lora) {
    EAGLE3_ASSIGN_OR_RETURN(b.q_a_ln_, take("q_a_layernorm.weight", DType::kF32));
    EAGLE3_ASSIGN_OR_RETURN(b.q_b_, take_linear("q_b_proj.weight"));
  }
  LinearWeight& lead = lora ? b.q_a_ : b.q_b_;
  EAGLE3_ASSIGN_OR_RETURN(const WeightSpec kv_a_spec, next_spec("kv_a_proj_with_mqa.weight"));
  // It and kv_a both read x: stacked [q_a; kv_a] or [q_proj; kv_a] (an FP8 part of whole 128-row
  // blocks, as every published checkpoint's q_a of 1536 rows is), one product streams both weights,
  // and the parts are freed.
  if (input_projections == InputProjections::kStackWherePossible) {
    const WeightSpec pair[] = {lead_spec, kv_a_spec};
    EAGLE3_ASSIGN_OR_RETURN(std::vector<LinearWeight> loaded, loader.LoadStackedLinear(pair, weight_dtype));
    if (loaded.size() == 1) {
      b.q_kv_a_ = std::move(loaded[0]);
    } else {
      lead = std::move(loaded[0]);
      b.kv_a_ = std::move(loaded[1]);
    }
  } else {
    EAGLE3_ASSIGN_OR_RETURN(lead, loader.LoadLinear(lead_spec, weight_dtype));
    EAGLE3_ASSIGN_OR_RETURN(b.kv_a_, loader.LoadLinear(kv_a_spec, weight_dtype));
  }
  EAGLE3_ASSIGN_OR_RETURN(b.kv_a_ln_, take("kv_a_layernorm.weight", DType::kF32));
  const WeightSpec& kv_b_spec = specs[next];
  EAGLE3_ASSIGN_OR_RETURN(b.kv_b_, take("kv_b_proj.weight", weight_dtype));
  EAGLE3_ASSIGN_OR_RETURN(b.o_proj_, take_linear("o_proj.weight"));
  // W_UK per head, transposed to [R, nope] so that q_nope · W_UK is one Gemm against it (from the
  // f32 values; rounding to bf16 afterwards gives the same values as kv_b's bf16 copy).
  const MlaRankDims& d = b.dims_;
  EAGLE3_ASSIGN_OR_RETURN(Tensor host_kv_b, loader.ReadHost(kv_b_spec, DType::kF32));
  EAGLE3_ASSIGN_OR_RETURN(Tensor host_t, Tensor::Empty(DType::kF32, Shape{d.heads, d.latent, d.nope}));
  const float* src = host_kv_b.data_as<float>();
  float* dst = host_t.data_as<float>();
  for (int64_t n = 0; n < d.heads; ++n) {
    for (int64_t i = 0; i < d.nope; ++i) {
      for (int64_t c = 0; c < d.latent; ++c) {
        dst[(n * d.latent + c) * d.nope + i] = src[(n * (d.nope + d.vdim) + i) * d.latent + c];
      }
    }
  }
  if (weight_dtype != DType::kF32) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor converted, Tensor::Empty(weight_dtype, host_t.shape()));
    EAGLE3_RETURN_IF_ERROR(ConvertTensor(host_t, converted));
    host_t = std::move(converted);
  }
  EAGLE3_ASSIGN_OR_RETURN(b.w_uk_t_, loader.ToDevice(std::move(host_t)));
  return b;
}

TensorView MlaBlock::WUv() const {
  const MlaRankDims& d = dims_;
  const int64_t elem = static_cast<int64_t>(DTypeSize(kv_b_.dtype()));
  return TensorView(static_cast<char*>(kv_b_.data()) + d.nope * d.latent * elem, kv_b_.dtype(),
                    Shape{d.heads, d.vdim, d.latent}, Shape{(d.nope + d.vdim) * d.latent, d.latent, 1},
                    kv_b_.device());
}

absl::Status MlaBlock::CheckShapes(const TensorView& x, const MlaWorkspace& ws) const {
  if (ws.dims != dims_) {
    return absl::InvalidArgumentError("MlaBlock: the workspace was sized for another attention (" +
                                      Str(ws.dims.heads) + " heads x qk " + Str(ws.dims.qk) + ", latent width " +
                                      Str(ws.dims.width) + ", input width " + Str(ws.dims.input_width) +
                                      "), the block has " + Str(dims_.heads) + " x " + Str(dims_.qk) + ", " +
                                      Str(dims_.width) + ", " + Str(dims_.input_width));
  }
  if (x.rank() != 2 || x.dim(1) != dims_.input_width || x.dim(0) > ws.max_tokens) {
    return absl::InvalidArgumentError("MlaBlock: x must be [T <= " + Str(ws.max_tokens) + ", input_width " +
                                      Str(dims_.input_width) + "], got " + x.ToString());
  }
  return absl::OkStatus();
}

absl::Status MlaBlock::Project(const TensorView& x, MlaWorkspace& ws, bool norm_latent) const {
  Backend& be = *backend_;
  const int64_t t = x.dim(0);
  const TensorView q_t = Rows(ws.Q(), 0, t);
  if (q_a_ln_.empty()) {
    // A plain q_proj: q is the lead of the cache row, written by the stacked product where there is one.
    if (!input_projections_stacked()) EAGLE3_RETURN_IF_ERROR(q_b_.Apply(be, x, q_t));
    return norm_latent ? ProjectLatent(x, ws) : InputProduct(x, ws);
  }
  const TensorView qa_t = Rows(ws.Qa(), 0, t);
  if (input_projections_stacked()) {
    // One product wrote qa and c: q_a_layernorm and kv_a_layernorm in one call (one launch on a
    // device), each with the bits of its own RmsNorm.
    EAGLE3_RETURN_IF_ERROR(InputProduct(x, ws));
    const TensorView c_t = Latent(ws, t);
    EAGLE3_RETURN_IF_ERROR(be.RmsNormPair(qa_t, q_a_ln_, qa_t, c_t, kv_a_ln_, c_t, eps_));
  } else {
    EAGLE3_RETURN_IF_ERROR(norm_latent ? ProjectLatent(x, ws) : InputProduct(x, ws));
    EAGLE3_RETURN_IF_ERROR(q_a_.Apply(be, x, qa_t));
    EAGLE3_RETURN_IF_ERROR(be.RmsNorm(qa_t, q_a_ln_, eps_, qa_t));
  }
  return q_b_.Apply(be, qa_t, q_t);
}

absl::Status MlaBlock::InputProduct(const TensorView& x, MlaWorkspace& ws) const {
  Backend& be = *backend_;
  const int64_t t = x.dim(0);
  // The latent cache row [c | k_pe] = kv_a x, written straight into the row before the heads'
  // queries, by the stacked product where there is one: [lead | c | k_pe] = [q_a; kv_a] x (or
  // [q_proj; kv_a] x), one pass over x and both weights. WriteCacheRows runs it too, so that its
  // rows are Forward*'s bit for bit (a backend may sum a product of other rows in another order).
  if (input_projections_stacked()) return q_kv_a_.Apply(be, x, Rows(ws.QaCacheRow(), 0, t));
  return kv_a_.Apply(be, x, Rows(ws.CacheRow(), 0, t));
}

absl::Status MlaBlock::ProjectLatent(const TensorView& x, MlaWorkspace& ws) const {
  EAGLE3_RETURN_IF_ERROR(InputProduct(x, ws));
  // kv_a_layernorm(c) in place; then (by the caller's path) the rotation of k_pe: what every later
  // query reads.
  const TensorView c_t = Latent(ws, x.dim(0));
  return backend_->RmsNorm(c_t, kv_a_ln_, eps_, c_t);
}

TensorView MlaBlock::Latent(const MlaWorkspace& ws, int64_t t) const {
  return Block(ws.CacheRow(), 0, t, 0, dims_.latent);
}

absl::Status MlaBlock::WriteCacheRows(const TensorView& x, const MlaBatchedStep& step, const TensorView& cache,
                                      MlaWorkspace& ws) const {
  EAGLE3_RETURN_IF_ERROR(CheckShapes(x, ws));
  EAGLE3_RETURN_IF_ERROR(InputProduct(x, ws));
  // The rows alone: the op gives each row the bits ForwardBatched's call gives it (its norm is
  // RmsNorm's, which RmsNormPair's half matches; RoPE rotates each row alone).
  const TensorView none;
  return backend_->LatentRowsAndQueries(Rows(ws.CacheRow(), 0, x.dim(0)), kv_a_ln_, eps_, none, none, step.positions,
                                        ws.cos_sin, RopeStyle::kAdjacentPairs, step.slots, step.slot_iota,
                                        FlatCache(cache));
}

void MlaBlock::AppendInputWeights(std::vector<TensorView>& out) const {
  for (const LinearWeight* w : {&q_kv_a_, &kv_a_, &q_a_, &q_b_}) w->AppendTensors(out);
  out.push_back(w_uk_t_.view());
}

void MlaBlock::AppendOutputWeights(std::vector<TensorView>& out) const {
  out.push_back(WUv());
  o_proj_.AppendTensors(out);
}

absl::Status MlaBlock::ForwardBatched(const TensorView& x, const MlaBatchedStep& step, const TensorView& cache,
                                      MlaWorkspace& ws, const TensorView& out) const {
  EAGLE3_RETURN_IF_ERROR(CheckShapes(x, ws));
  EAGLE3_RETURN_IF_ERROR(Project(x, ws, /*norm_latent=*/false));
  Backend& be = *backend_;
  const MlaRankDims& d = dims_;
  const int64_t t = x.dim(0);
  const int64_t heads = d.heads, width = d.width, latent = d.latent, rope = d.rope, nope = d.nope;
  const TensorView q_t = Rows(ws.Q(), 0, t);
  const TensorView q_lat_t = Rows(ws.QLat(), 0, t);
  const TensorView rows_t = Rows(ws.CacheRow(), 0, t);
  const TensorView q3 = Heads(q_t, heads, d.qk);
  // Every sequence at once, lengths and page tables from the device (graph-capturable).
  const TensorView q_lat3 = Heads(q_lat_t, heads, width);
  const TensorView o_lat3 = Heads(Rows(ws.o_lat, 0, t), heads, latent);
  EAGLE3_RETURN_IF_ERROR(be.BatchedGemm(HeadMajor(q_t, heads, d.qk, 0, nope), w_uk_t_,
                                        HeadMajor(q_lat_t, heads, width, 0, latent), kWeightsGemm));
  if (!step.prefetch.empty()) EAGLE3_RETURN_IF_ERROR(be.PrefetchWeights(step.prefetch));
  // c normed (unless q_a_layernorm's pair did it), k_pe and every head's q_pe rotated (q_pe into the
  // absorbed queries), the rows stored at their slots: one op (one launch on a device).
  EAGLE3_RETURN_IF_ERROR(be.LatentRowsAndQueries(rows_t, LatentNormedWithQa() ? TensorView() : kv_a_ln_.view(), eps_,
                                                 q3.Narrow(2, nope, rope), q_lat3.Narrow(2, latent, rope),
                                                 step.positions, ws.cos_sin, RopeStyle::kAdjacentPairs, step.slots,
                                                 step.slot_iota, FlatCache(cache)));
  if (!step.key_mask.empty()) {
    EAGLE3_RETURN_IF_ERROR(be.BatchedLatentAttentionKeyMask(q_lat3, cache, step.page_tables, step.q_start,
                                                            step.kv_len, step.max_kv_len, step.key_mask, scale_,
                                                            latent, o_lat3));
  } else {
    EAGLE3_RETURN_IF_ERROR(be.BatchedLatentAttention(q_lat3, cache, step.page_tables, step.q_start, step.kv_len,
                                                     step.max_kv_len, step.tree_mask, scale_, latent, o_lat3));
  }
  EAGLE3_RETURN_IF_ERROR(be.BatchedGemm(HeadMajor(Rows(ws.o_lat, 0, t), heads, latent, 0, latent), WUv(),
                                        HeadMajor(Rows(ws.attn_v, 0, t), heads, d.vdim, 0, d.vdim), kWeightsGemm));
  return o_proj_.Apply(be, Rows(ws.attn_v, 0, t), out);
}

absl::Status MlaBlock::ForwardPerSequence(const TensorView& x, const MlaSequenceStep& step, const TensorView& cache,
                                          MlaWorkspace& ws, const TensorView& out) const {
  EAGLE3_RETURN_IF_ERROR(CheckShapes(x, ws));
  EAGLE3_RETURN_IF_ERROR(Project(x, ws));
  Backend& be = *backend_;
  const MlaRankDims& d = dims_;
  const int64_t t = x.dim(0);
  const int64_t heads = d.heads, width = d.width, latent = d.latent, rope = d.rope, nope = d.nope;
  const int64_t qk = d.qk, vdim = d.vdim;
  const TensorView q_t = Rows(ws.Q(), 0, t);
  const TensorView rows_t = Rows(ws.CacheRow(), 0, t);
  const TensorView q3 = Heads(q_t, heads, qk);
  // q3 (every head's q_pe) and the cache rows' k_pe rotated apart, since the unabsorbed path
  // attends with q3 itself.
  EAGLE3_RETURN_IF_ERROR(
      be.ApplyRope(Heads(rows_t, 1, width), latent, rope, step.positions, ws.cos_sin, RopeStyle::kAdjacentPairs));
  EAGLE3_RETURN_IF_ERROR(be.ApplyRope(q3, nope, rope, step.positions, ws.cos_sin, RopeStyle::kAdjacentPairs));
  int64_t offset = 0;
  for (const SequenceInput& in : step.sequences) {
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    const int64_t s = in.cache_len + n;
    // Only the pages this step uses (a caller's table may be longer than the device buffer).
    const int64_t used_pages = (s + step.page_size - 1) / step.page_size;
    const TensorView pt = Rows(step.page_table, 0, used_pages);
    EAGLE3_RETURN_IF_ERROR(
        be.Copy(TensorView(const_cast<int32_t*>(in.page_table.data()), DType::kI32, Shape{used_pages}), pt));
    EAGLE3_RETURN_IF_ERROR(be.PagedWrite(Rows(rows_t, offset, n), Rows(step.slots, offset, n), pt, cache));
    // Mask [n, s]: the whole cached prefix, then causal or tree among the new tokens.
    for (int64_t i = 0; i < n; ++i) {
      uint8_t* row = &ws.host_mask[static_cast<size_t>(i * s)];
      std::fill(row, row + in.cache_len, uint8_t{1});
      for (int64_t j = 0; j < n; ++j) {
        row[in.cache_len + j] = in.tree_mask.empty() ? (j <= i ? 1 : 0) : in.tree_mask[static_cast<size_t>(i * n + j)];
      }
    }
    const TensorView mask_t = TensorView(ws.mask.data(), DType::kU8, Shape{n, s}, ws.mask.device());
    EAGLE3_RETURN_IF_ERROR(be.Copy(TensorView(ws.host_mask.data(), DType::kU8, Shape{n, s}), mask_t));

    const TensorView q_s = q3.Narrow(0, offset, n);
    const TensorView out_s = Heads(Rows(ws.attn_v, offset, n), heads, vdim);
    if (MlaAbsorbed(step.path, n)) {
      // Every sequence's absorbed queries go to rows [0, n); the cache rows beside them, of every
      // sequence, stay.
      const TensorView q_lat_n = Rows(ws.QLat(), 0, n);
      const TensorView q_lat_s = Heads(q_lat_n, heads, width);
      const TensorView o_lat_s = Heads(Rows(ws.o_lat, 0, n), heads, latent);
      EAGLE3_RETURN_IF_ERROR(be.BatchedGemm(HeadMajor(Rows(q_t, offset, n), heads, qk, 0, nope), w_uk_t_,
                                            HeadMajor(q_lat_n, heads, width, 0, latent), kWeightsGemm));
      EAGLE3_RETURN_IF_ERROR(be.Copy(q_s.Narrow(2, nope, rope), q_lat_s.Narrow(2, latent, rope)));
      EAGLE3_RETURN_IF_ERROR(be.LatentAttention(q_lat_s, cache, pt, s, mask_t, scale_, latent, o_lat_s));
      EAGLE3_RETURN_IF_ERROR(be.BatchedGemm(HeadMajor(Rows(ws.o_lat, 0, n), heads, latent, 0, latent), WUv(),
                                            HeadMajor(Rows(ws.attn_v, offset, n), heads, vdim, 0, vdim), kWeightsGemm));
    } else {
      const TensorView lat = Rows(ws.ctx_lat, 0, s);
      EAGLE3_RETURN_IF_ERROR(be.PagedRead(cache, pt, Rows(ws.iota, 0, s), lat));
      const TensorView kv = Rows(ws.ctx_kv, 0, s);
      EAGLE3_RETURN_IF_ERROR(be.Gemm(Block(lat, 0, s, 0, latent), kv_b_, kv, kWeightsGemm));
      const TensorView kv3 = Heads(kv, heads, nope + vdim);
      const TensorView k3 = Heads(Rows(ws.ctx_k, 0, s), heads, qk);
      EAGLE3_RETURN_IF_ERROR(be.Copy(kv3.Narrow(2, 0, nope), k3.Narrow(2, 0, nope)));
      // k_pe is shared by every head: broadcast it with a zero head stride.
      const TensorView k_pe = TensorView(lat.data_as<float>() + latent, DType::kF32, Shape{s, heads, rope},
                                         Shape{width, 0, 1}, lat.device());
      EAGLE3_RETURN_IF_ERROR(be.Copy(k_pe, k3.Narrow(2, nope, rope)));
      EAGLE3_RETURN_IF_ERROR(be.Attention(q_s, k3, kv3.Narrow(2, nope, vdim), mask_t, scale_, out_s));
    }
    offset += n;
  }
  return o_proj_.Apply(be, Rows(ws.attn_v, 0, t), out);
}

}  // namespace eagle3
