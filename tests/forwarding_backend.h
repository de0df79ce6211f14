// A Backend that hands every op to another backend: tests derive from it to watch or alter the
// calls a model makes (the CPU reference backend is final), overriding only the ops they look at.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "eagle3/backend.h"

namespace eagle3 {

class ForwardingBackend : public Backend {
 public:
  // `inner` runs every op; it must outlive this backend.
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}

  Device device() const override { return inner_.device(); }
  DType preferred_weight_dtype() const override { return inner_.preferred_weight_dtype(); }
  Allocator& allocator() override { return inner_.allocator(); }
  Allocator& weight_allocator() override { return inner_.weight_allocator(); }
  Allocator& staging_allocator() override { return inner_.staging_allocator(); }
  absl::StatusOr<std::unique_ptr<UploadRing>> CreateUploadRing() override { return inner_.CreateUploadRing(); }
  absl::Status Copy(const TensorView& src, const TensorView& dst) override { return inner_.Copy(src, dst); }
  absl::Status Gemm(const TensorView& a, const TensorView& b, const TensorView& c,
                    const GemmOptions& options) override {
    return inner_.Gemm(a, b, c, options);
  }
  bool keeps_quantized(WeightFormat format) const override { return inner_.keeps_quantized(format); }
  absl::Status QuantizedGemm(const TensorView& a, const QuantizedWeightView& w, const TensorView& c,
                             const GemmOptions& options) override {
    return inner_.QuantizedGemm(a, w, c, options);
  }
  absl::Status TileQuantizedCodes(const QuantizedWeightView& w, const TensorView& tiles) override {
    return inner_.TileQuantizedCodes(w, tiles);
  }
  bool tiles_expert_codes(const QuantizedWeightView& w) const override { return inner_.tiles_expert_codes(w); }
  bool tiles_gemm_codes(const QuantizedWeightView& w) const override { return inner_.tiles_gemm_codes(w); }
  absl::Status BatchedGemm(const TensorView& a, const TensorView& b, const TensorView& c,
                           const GemmOptions& options) override {
    return inner_.BatchedGemm(a, b, c, options);
  }
  absl::Status RmsNorm(const TensorView& x, const TensorView& weight, float eps, const TensorView& out) override {
    return inner_.RmsNorm(x, weight, eps, out);
  }
  absl::Status RmsNormPair(const TensorView& x0, const TensorView& weight0, const TensorView& out0,
                           const TensorView& x1, const TensorView& weight1, const TensorView& out1,
                           float eps) override {
    return inner_.RmsNormPair(x0, weight0, out0, x1, weight1, out1, eps);
  }
  absl::Status AddRmsNorm(const TensorView& x, const TensorView& residual, const TensorView& weight, float eps,
                          const TensorView& out) override {
    return inner_.AddRmsNorm(x, residual, weight, eps, out);
  }
  absl::Status SiluMul(const TensorView& gate_up, const TensorView& out) override {
    return inner_.SiluMul(gate_up, out);
  }
  absl::Status EmbeddingLookup(const TensorView& ids, const TensorView& table, int64_t vocab_start,
                               const TensorView& out) override {
    return inner_.EmbeddingLookup(ids, table, vocab_start, out);
  }
  absl::Status Softmax(const TensorView& logits, float temperature, const TensorView& out) override {
    return inner_.Softmax(logits, temperature, out);
  }
  absl::Status Argmax(const TensorView& logits, const TensorView& out) override { return inner_.Argmax(logits, out); }
  absl::Status TopK(const TensorView& values, int k, const TensorView& out_values,
                    const TensorView& out_indices) override {
    return inner_.TopK(values, k, out_values, out_indices);
  }
  absl::Status ApplyRope(const TensorView& x, int64_t offset, int64_t rope_dim, const TensorView& positions,
                         const TensorView& cos_sin, RopeStyle style) override {
    return inner_.ApplyRope(x, offset, rope_dim, positions, cos_sin, style);
  }
  absl::Status Attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& mask,
                         float scale, const TensorView& out) override {
    return inner_.Attention(q, k, v, mask, scale, out);
  }
  absl::Status LatentAttention(const TensorView& q, const TensorView& cache, const TensorView& page_table,
                               int64_t context_len, const TensorView& mask, float scale, int64_t value_dim,
                               const TensorView& out) override {
    return inner_.LatentAttention(q, cache, page_table, context_len, mask, scale, value_dim, out);
  }
  absl::Status BatchedLatentAttention(const TensorView& q, const TensorView& cache, const TensorView& page_tables,
                                      const TensorView& q_start, const TensorView& kv_len, int64_t max_kv_len,
                                      const TensorView& tree_mask, float scale, int64_t value_dim,
                                      const TensorView& out) override {
    return inner_.BatchedLatentAttention(q, cache, page_tables, q_start, kv_len, max_kv_len, tree_mask, scale,
                                         value_dim, out);
  }
  absl::Status BatchedLatentAttentionKeyMask(const TensorView& q, const TensorView& cache,
                                             const TensorView& page_tables, const TensorView& q_start,
                                             const TensorView& kv_len, int64_t max_kv_len, const TensorView& key_mask,
                                             float scale, int64_t value_dim, const TensorView& out) override {
    return inner_.BatchedLatentAttentionKeyMask(q, cache, page_tables, q_start, kv_len, max_kv_len, key_mask, scale,
                                                value_dim, out);
  }
  absl::Status BatchedPagedAttention(const TensorView& q, const TensorView& cache, const TensorView& page_tables,
                                     const TensorView& q_start, const TensorView& kv_len, int64_t max_kv_len,
                                     const TensorView& mask, float scale, const TensorView& out) override {
    return inner_.BatchedPagedAttention(q, cache, page_tables, q_start, kv_len, max_kv_len, mask, scale, out);
  }
  absl::Status PagedWrite(const TensorView& rows, const TensorView& positions, const TensorView& page_table,
                          const TensorView& cache) override {
    return inner_.PagedWrite(rows, positions, page_table, cache);
  }
  absl::Status PagedRead(const TensorView& cache, const TensorView& page_table, const TensorView& positions,
                         const TensorView& out) override {
    return inner_.PagedRead(cache, page_table, positions, out);
  }
  absl::Status LatentRowsAndQueries(const TensorView& rows, const TensorView& norm_weight, float eps,
                                    const TensorView& q_pe, const TensorView& q_rot, const TensorView& positions,
                                    const TensorView& cos_sin, RopeStyle style, const TensorView& slots,
                                    const TensorView& slot_table, const TensorView& cache) override {
    return inner_.LatentRowsAndQueries(rows, norm_weight, eps, q_pe, q_rot, positions, cos_sin, style, slots,
                                       slot_table, cache);
  }
  absl::Status CompactAccepted(const TensorView& cache, const TensorView& page_tables, const TensorView& cache_len,
                               const TensorView& accepted, const TensorView& num_accepted) override {
    return inner_.CompactAccepted(cache, page_tables, cache_len, accepted, num_accepted);
  }
  absl::Status MoeRoute(const TensorView& logits, const TensorView* correction_bias, const MoeRoutingParams& params,
                        const TensorView& ids, const TensorView& weights) override {
    return inner_.MoeRoute(logits, correction_bias, params, ids, weights);
  }
  absl::Status MoeExperts(const TensorView& x, const TensorView& ids, const TensorView& weights,
                          std::span<const ExpertWeights> experts, const TensorView& out, bool accumulate) override {
    return inner_.MoeExperts(x, ids, weights, experts, out, accumulate);
  }
  absl::Status QuantizedMoeExperts(const TensorView& x, const TensorView& ids, const TensorView& weights,
                                   std::span<const QuantizedExpertWeights> experts, const TensorView& out,
                                   bool accumulate) override {
    return inner_.QuantizedMoeExperts(x, ids, weights, experts, out, accumulate);
  }
  int64_t TreeBuildWorkspaceBytes(const TreeBuildShape& shape) const override {
    return inner_.TreeBuildWorkspaceBytes(shape);
  }
  absl::Status TreeBuildStep(const TreeBuildShape& shape, int step, const TensorView& logits, const TensorView& d2t,
                             const TensorView& workspace, const TensorView& errors, const TensorView& frontier_tokens,
                             const TensorView& frontier_parents) override {
    return inner_.TreeBuildStep(shape, step, logits, d2t, workspace, errors, frontier_tokens, frontier_parents);
  }
  absl::Status TreeBuildFinalize(const TreeBuildShape& shape, const TensorView& workspace, const TensorView& errors,
                                 const TensorView& root_tokens, const TensorView& root_positions,
                                 const TensorView& tokens, const TensorView& parents, const TensorView& positions,
                                 const TensorView& mask) override {
    return inner_.TreeBuildFinalize(shape, workspace, errors, root_tokens, root_positions, tokens, parents, positions,
                                    mask);
  }
  absl::Status TreeVerify(const TensorView& tokens, const TensorView& parents, const TensorView& logits,
                          const SamplingParams& sampling, const TensorView& seed_offset,
                          const TreeVerifyOutputs& out) override {
    return inner_.TreeVerify(tokens, parents, logits, sampling, seed_offset, out);
  }
  absl::Status GatherRows(const TensorView& src, const TensorView& index, const TensorView& out,
                          int64_t groups) override {
    return inner_.GatherRows(src, index, out, groups);
  }
  absl::Status ExtendMaskRows(const TensorView& src, const TensorView& parent, const TensorView& column,
                              const TensorView& out) override {
    return inner_.ExtendMaskRows(src, parent, column, out);
  }
  absl::Status Synchronize() override { return inner_.Synchronize(); }
  void BeginSharedChecks() override { inner_.BeginSharedChecks(); }
  void EndSharedChecks() override { inner_.EndSharedChecks(); }
  absl::Status PrefetchWeights(std::span<const TensorView> weights) override { return inner_.PrefetchWeights(weights); }

 protected:
  Backend& inner_;
};

}  // namespace eagle3

