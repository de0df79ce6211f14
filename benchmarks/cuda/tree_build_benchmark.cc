// EAGLE-2 draft-tree construction on the device (eagle3/cuda/tree_ops.h), timed with CUDA events
// (bench_util.h), with its roofline floor.
//
//   BM_TreeBuild/batch/topk/steps/tokens/vocab : one whole build of `batch` trees: every step's
//       LaunchTreeBuildStep (step 0 over [batch, V] logits, each later step over [batch * topk, V])
//       and LaunchTreeBuildFinalize (tokens, parents, depths, positions, scores, dense mask of
//       `tokens` nodes). The draft model is not timed: the logits are given (N(0, 2) values, a d2t
//       of offsets applied), one set per build, rotated so that L2 does not flatter the small cases.
//
// bytes = the logits, read once: batch · (1 + (steps - 1) · topk) · V · 4; floor_us = bytes / the
// measured copy rate (read + write bytes of a 1 GiB copy per second); flops = 0 (the double-precision
// exp per logit is the compute, counted nowhere: it is what keeps small-V cases above the floor).
// benchmarks/peers/tree_build_peer.py times the same build written with torch ops (SGLang's way).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench_util.h"
#include "eagle3/cuda/tree_ops.h"

namespace eagle3::bench {
namespace {

struct DeviceMemory {
  void* ptr = nullptr;
  explicit DeviceMemory(size_t bytes) {
    if (cudaMalloc(&ptr, bytes == 0 ? 1 : bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceMemory() { cudaFree(ptr); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

void BM_TreeBuild(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0)), topk = static_cast<int32_t>(state.range(1));
  const int32_t steps = static_cast<int32_t>(state.range(2)), tokens = static_cast<int32_t>(state.range(3));
  const int64_t vocab = state.range(4);
  const int64_t rows = static_cast<int64_t>(batch) * (1 + static_cast<int64_t>(steps - 1) * topk);
  const double bytes = static_cast<double>(rows * vocab) * sizeof(float);
  cudaStream_t stream = Backend()->stream();

  Rotation<Tensor> sets(CopiesToDefeatL2(bytes),
                        [&](int i) { return RandomDevice(DType::kF32, Shape{rows, vocab}, 11 + i, 2.0f); });
  std::vector<int64_t> d2t(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) d2t[static_cast<size_t>(i)] = (i * 7) % 1000;
  const size_t ws_bytes = cuda::TreeBuildWorkspaceBytes(batch, topk, steps);
  const size_t fk = static_cast<size_t>(batch) * topk, bn = static_cast<size_t>(batch) * tokens;
  DeviceMemory d_d2t(d2t.size() * 8), ws(ws_bytes), errors(batch * sizeof(cuda::TreeBuildError)),
      roots(batch * 8), positions(batch * 8), f_cand(fk * 4), f_tok(fk * 8), f_rows(fk * 4), o_tok(bn * 8),
      o_par(bn * 4), o_depth(bn * 4), o_pos(bn * 8), o_score(bn * 4), o_mask(bn * tokens);
  cudaMemcpy(d_d2t.ptr, d2t.data(), d2t.size() * 8, cudaMemcpyHostToDevice);
  cudaMemset(ws.ptr, 0, ws_bytes);
  cudaMemset(roots.ptr, 0, batch * 8);
  cudaMemset(positions.ptr, 0, batch * 8);

  cuda::TreeBuildParams p;
  p.batch = batch;
  p.topk = topk;
  p.num_steps = steps;
  p.num_draft_tokens = tokens;
  p.vocab = vocab;
  p.workspace = ws.ptr;
  p.workspace_bytes = ws_bytes;
  p.errors = static_cast<cuda::TreeBuildError*>(errors.ptr);
  // What an engine needs for its next draft pass: candidates, target tokens, parent rows.
  cuda::TreeFrontier frontier;
  frontier.candidates = static_cast<int32_t*>(f_cand.ptr);
  frontier.tokens = static_cast<int64_t*>(f_tok.ptr);
  frontier.parent_rows = static_cast<int32_t*>(f_rows.ptr);
  cuda::TreeBuildOutputs out{static_cast<int64_t*>(roots.ptr),   static_cast<int64_t*>(positions.ptr),
                             static_cast<int64_t*>(o_tok.ptr),   static_cast<int32_t*>(o_par.ptr),
                             static_cast<int32_t*>(o_depth.ptr), static_cast<int64_t*>(o_pos.ptr),
                             static_cast<float*>(o_score.ptr),   static_cast<uint8_t*>(o_mask.ptr)};
  cudaError_t launch = cudaSuccess;
  auto build = [&] {
    const float* logits = static_cast<const float*>(sets.Next().data());
    int64_t row = 0;
    for (int32_t s = 0; s < steps && launch == cudaSuccess; ++s) {
      launch = cuda::LaunchTreeBuildStep(p, s, logits + row * vocab, vocab, static_cast<int64_t*>(d_d2t.ptr),
                                         frontier, /*programmatic=*/true, stream);
      row += static_cast<int64_t>(batch) * (s == 0 ? 1 : topk);
    }
    if (launch == cudaSuccess) launch = cuda::LaunchTreeBuildFinalize(p, out, /*programmatic=*/true, stream);
  };
  build();
  if (launch != cudaSuccess || cudaStreamSynchronize(stream) != cudaSuccess) {
    return state.SkipWithError(cudaGetErrorString(launch != cudaSuccess ? launch : cudaGetLastError()));
  }
  const double seconds = RunTimed(state, stream, build);
  if (launch != cudaSuccess) return state.SkipWithError(cudaGetErrorString(launch));
  ReportRoofline(state, seconds, bytes, 0.0);
}

// topk 4/8, steps 3-7, draft tokens 8-64 (where 1 + topk + (steps - 1) · topk² allows), batch 1/8/32.
void TreeArgs(benchmark::internal::Benchmark* bm) {
  const std::vector<int64_t> batches = Quick() ? std::vector<int64_t>{1, 32} : std::vector<int64_t>{1, 8, 32};
  const std::vector<int64_t> steps = Quick() ? std::vector<int64_t>{3, 5} : std::vector<int64_t>{3, 4, 5, 6, 7};
  const std::vector<int64_t> tokens = Quick() ? std::vector<int64_t>{8, 64} : std::vector<int64_t>{8, 16, 32, 64};
  for (int64_t b : batches) {
    for (int64_t k : {4, 8}) {
      for (int64_t s : steps) {
        for (int64_t n : tokens) {
          if (n <= 1 + k + (s - 1) * k * k) bm->Args({b, k, s, n, 32000});
        }
      }
    }
  }
}
BENCHMARK(BM_TreeBuild)->ArgNames({"batch", "topk", "steps", "tokens", "vocab"})->Apply(TreeArgs)->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
