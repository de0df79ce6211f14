// CpuBackend: DeepSeek MoE routing and routed experts.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/cpu_backend_internal.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/half.h"
#include "eagle3/status.h"

namespace eagle3::cpu {
namespace {

using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

constexpr float kExcluded = -std::numeric_limits<float>::infinity();

// Index of the largest of x[0, n), ties to the lowest index; kExcluded entries never win (the
// callers guarantee a finite candidate exists).
int64_t ArgmaxFinite(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != kExcluded && (best < 0 || x[i] > x[best])) best = i;
  }
  return best;
}

ConstMatrixMap MatrixOf(const TensorView& t) {
  return ConstMatrixMap(t.data_as<const float>(), t.dim(0), t.dim(1),
                        Eigen::OuterStride<>(std::max(t.stride(0), t.dim(1))));
}

}  // namespace

absl::Status CpuBackend::MoeRoute(const TensorView& logits, const TensorView* correction_bias,
                                  const MoeRoutingParams& params, const TensorView& ids,
                                  const TensorView& weights) {
  const char* op = "MoeRoute";
  EAGLE3_RETURN_IF_ERROR(CheckMoeRoute(logits, correction_bias, params, ids, weights));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "logits", logits));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "weights", weights));
  if (correction_bias != nullptr) {
    EAGLE3_RETURN_IF_ERROR(CheckF32(op, "correction_bias", *correction_bias));
  }
  const int64_t tokens = logits.dim(0);
  const int64_t experts = logits.dim(1);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = Row(logits, t);
    for (int64_t e = 0; e < experts; ++e) {
      if (!std::isfinite(x[e])) {
        return Invalid(op, "row ", t, " of logits ", logits.ToString(), " has ", x[e],
                       " at expert ", e);
      }
    }
  }
  const float* bias = correction_bias ? correction_bias->data_as<const float>() : nullptr;
  for (int64_t e = 0; bias != nullptr && e < experts; ++e) {
    if (!std::isfinite(bias[e])) {
      return Invalid(op, "correction_bias ", correction_bias->ToString(), " has ", bias[e],
                     " at expert ", e);
    }
  }

  const bool grouped = params.topk_method != TopkMethod::kGreedy;
  const bool noaux = params.topk_method == TopkMethod::kNoauxTc;
  const int64_t groups = grouped ? params.n_group : 1;
  const int64_t per_group = experts / groups;
  const int top_k = params.top_k;
  // scores: the routing weights' source; choice: what selection ranks (scores + bias for
  // noaux_tc), with excluded experts set to kExcluded; group: per-group selection score.
  float* scores = Scratch(2 * experts + groups);
  float* choice = scores + experts;
  float* group = choice + experts;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* x = Row(logits, t);
    if (params.scoring_func == ScoringFunc::kSoftmax) {
      const float max = *std::max_element(x, x + experts);
      float sum = 0.0f;
      for (int64_t e = 0; e < experts; ++e) sum += scores[e] = std::exp(x[e] - max);
      for (int64_t e = 0; e < experts; ++e) scores[e] /= sum;
    } else {
      for (int64_t e = 0; e < experts; ++e) scores[e] = 1.0f / (1.0f + std::exp(-x[e]));
    }
    for (int64_t e = 0; e < experts; ++e) choice[e] = scores[e] + (bias ? bias[e] : 0.0f);

    if (grouped) {
      for (int64_t g = 0; g < groups; ++g) {
        const float* c = choice + g * per_group;
        if (noaux) {  // sum of the two best (per_group >= 2 is validated)
          float first = kExcluded, second = kExcluded;
          for (int64_t i = 0; i < per_group; ++i) {
            if (c[i] > first) {
              second = first;
              first = c[i];
            } else if (c[i] > second) {
              second = c[i];
            }
          }
          group[g] = first + second;
        } else {
          group[g] = *std::max_element(c, c + per_group);
        }
      }
      // Keep the topk_group best groups (marked by excluding them from `group` as they are
      // taken), then exclude every expert of the groups left over.
      for (int kept = 0; kept < params.topk_group; ++kept) {
        group[ArgmaxFinite(group, groups)] = kExcluded;
      }
      for (int64_t g = 0; g < groups; ++g) {
        if (group[g] != kExcluded) std::fill_n(choice + g * per_group, per_group, kExcluded);
      }
    }

    int32_t* id = ids.data_as<int32_t>() + t * ids.stride(0);
    float* w = Row(weights, t);
    float sum = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int64_t e = ArgmaxFinite(choice, experts);
      choice[e] = kExcluded;
      id[j] = static_cast<int32_t>(e);
      w[j] = scores[e];
      sum += w[j];
    }
    // V2 (softmax): normalize XOR scale. V3/K2 (sigmoid): normalize if asked, then always scale.
    const bool normalize = params.norm_topk_prob && (noaux || top_k > 1);
    if (normalize) {
      const float denominator = sum + 1e-20f;
      for (int j = 0; j < top_k; ++j) w[j] /= denominator;
    }
    if (noaux || !normalize) {
      for (int j = 0; j < top_k; ++j) w[j] *= params.routed_scaling_factor;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::MoeExperts(const TensorView& x, const TensorView& ids,
                                    const TensorView& weights,
                                    std::span<const ExpertWeights> experts, const TensorView& out,
                                    bool accumulate) {
  const char* op = "MoeExperts";
  EAGLE3_RETURN_IF_ERROR(CheckMoeExperts(x, ids, weights, experts, out));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "x", x));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "weights", weights));
  EAGLE3_RETURN_IF_ERROR(CheckF32(op, "out", out));
  for (size_t e = 0; e < experts.size(); ++e) {
    EAGLE3_RETURN_IF_ERROR(
        CheckF32(op, absl::StrCat("experts[", e, "].gate_up").c_str(), experts[e].gate_up));
    EAGLE3_RETURN_IF_ERROR(
        CheckF32(op, absl::StrCat("experts[", e, "].down").c_str(), experts[e].down));
  }
  const int64_t tokens = x.dim(0);
  const int64_t k = ids.dim(1);
  EAGLE3_RETURN_IF_ERROR(CheckExpertIds(op, ids, static_cast<int64_t>(experts.size())));
  const int64_t hidden = x.dim(1);
  const int64_t inter = experts.empty() ? 0 : experts[0].down.dim(1);
  float* gate_up = Scratch(3 * inter + hidden);  // [gate | up], the activation, x rounded
  float* act = gate_up + 2 * inter;
  float* x_rounded = act + inter;
  const auto round = [](float v) { return Bf16ToFloat(FloatToBf16(v)); };
  const bool any_rounded =
      std::any_of(experts.begin(), experts.end(), [](const ExpertWeights& e) { return e.bf16_activations; });
  for (int64_t t = 0; t < tokens; ++t) {
    const ConstVectorMap xt(Row(x, t), hidden);
    if (any_rounded) {
      for (int64_t h = 0; h < hidden; ++h) x_rounded[h] = round(xt[h]);
    }
    VectorMap o(Row(out, t), hidden);
    if (!accumulate) o.setZero();  // out is write-only then: stale NaNs must not leak in
    const int32_t* id = ids.data_as<const int32_t>() + t * ids.stride(0);
    const float* w = Row(weights, t);
    for (int64_t j = 0; j < k; ++j) {
      const ExpertWeights& e = experts[id[j]];
      if (e.bf16_activations) {
        VectorMap(gate_up, 2 * inter).noalias() = MatrixOf(e.gate_up) * ConstVectorMap(x_rounded, hidden);
      } else {
        VectorMap(gate_up, 2 * inter).noalias() = MatrixOf(e.gate_up) * xt;
      }
      for (int64_t i = 0; i < inter; ++i) {
        const float g = gate_up[i];
        act[i] = g / (1.0f + std::exp(-g)) * gate_up[inter + i];
        if (e.bf16_activations) act[i] = round(act[i]);
      }
      o.noalias() += w[j] * (MatrixOf(e.down) * ConstVectorMap(act, inter));
    }
  }
  return absl::OkStatus();
}

}  // namespace eagle3::cpu
