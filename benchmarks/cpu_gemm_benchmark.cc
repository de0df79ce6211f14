// CpuBackend::Gemm at decode-like shapes: c[M, N] = a[M, K] * b[N, K]^T with M tokens.
// Reports GFLOP/s and the weight-streaming rate in GB/s (decode GEMMs are bound by reading b);
// rates use wall time so that multi-threaded runs are not flattered by per-thread CPU time.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"

namespace eagle3::cpu {
namespace {

void BM_CpuGemm(benchmark::State& state) {
  const int64_t m = state.range(0);
  const int64_t n = state.range(1);
  const int64_t k = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(m * k), b(n * k), c(m * n);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  CpuBackend backend(CpuBackendOptions{.num_threads = threads});
  const TensorView av(a.data(), DType::kF32, Shape{m, k});
  const TensorView bv(b.data(), DType::kF32, Shape{n, k});
  const TensorView cv(c.data(), DType::kF32, Shape{m, n});
  for (auto _ : state) {
    const absl::Status status = backend.Gemm(av, bv, cv, GemmOptions{});
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["GFLOP"] =
      benchmark::Counter(2.0 * m * n * k * iterations / 1e9, benchmark::Counter::kIsRate);
  state.counters["weight_GB"] =
      benchmark::Counter(4.0 * n * k * iterations / 1e9, benchmark::Counter::kIsRate);
}

// {M, N = K, threads}; short MinTime keeps the whole run to a few seconds.
BENCHMARK(BM_CpuGemm)
    ->ArgNames({"M", "NK", "threads"})
    ->ArgsProduct({{1, 8, 64}, {1024, 2048}, {1}})
    ->Args({64, 2048, 2})
    ->MinTime(0.05)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace eagle3::cpu

BENCHMARK_MAIN();
