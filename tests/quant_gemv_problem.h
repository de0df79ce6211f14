// The quantized GEMV's planner input (cuda/quant_gemv_plan.h) for a shape, as the tests of the
// planner (tests/quant_gemv_plan_test.cc) and of the kernels (tests/gpu/quant_gemv_test.cc) build it.
#pragma once

#include <cstdint>

#include "quant_gemv_plan.h"

namespace eagle3::cuda {

// batch items of [n, k] fp8 codes or int4 words from global column col0, m f32 activation rows, and
// the default shared-memory limit.
inline QuantGemvProblem ProblemOf(bool int4, int64_t batch, int64_t m, int64_t n, int64_t k, int64_t col0) {
  QuantGemvProblem problem;
  problem.int4 = int4;
  problem.batch = batch;
  problem.m = m;
  problem.n = n;
  problem.k = k;
  problem.shift = int4 ? col0 % 32 : col0 % 128;
  problem.a_bytes = 4;
  problem.weight_bytes = static_cast<double>(batch) * n * (int4 ? k / 2 : k);
  return problem;
}

}  // namespace eagle3::cuda
