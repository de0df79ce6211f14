// Tree verification on the device (LaunchTreeVerify, cuda/verify_ops.h) at real vocabulary
// sizes, timed with CUDA events (Google Benchmark manual time, medians of repetitions), each with its
// floor from the device-to-device copy rate measured in the same run.
//
//   verify_<mode>_<dtype>/batch:B/tokens:N/vocab:V
//     mode: greedy | stochastic (temperature 1, no top-k / top-p) | stochastic_top_p (top-p 0.9)
//     dtype: f32 | bf16 logits; B sequences of N tree nodes each (a 4-ary tree), V logits per node
// benchmarks/peers/verify_peer.py prints the same names and parameters for the PyTorch peer.
//
// bytes = the logits, read once (B · N · V · element size); floor_us = bytes / measured copy rate
// (read + write bytes of a 1 GiB cudaMemcpy per second); frac_of_floor = floor / measured time.
// Several logits buffers (>= 256 MiB in all, 5x the H200's L2) are rotated so that L2 does not
// flatter the small cases. The drafted tokens are random, so sampling mostly rejects at the root:
// one visited row plus the correction's pass over it.
//
// The timing and ceiling helpers duplicate the minimal ones of decode_ops_benchmark.cc (a shared
// benchmarks/cuda/bench_util.h is proposed to the lead).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "eagle3/half.h"
#include "verify_ops.h"

namespace eagle3::cuda {
namespace {

cudaStream_t Stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    return s;
  }();
  return stream;
}

// Median of `reps` CUDA-event timings of fn() on Stream(), in seconds.
template <typename Fn>
double TimeMedian(int reps, Fn&& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start, Stream());
    fn();
    cudaEventRecord(stop, Stream());
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Read + write bytes per second of a 1 GiB device-to-device copy.
double CopyBytesPerSecond() {
  static double rate = [] {
    const size_t bytes = size_t{1} << 30;
    void *src = nullptr, *dst = nullptr;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) return 0.0;
    const double t = TimeMedian(9, [&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, Stream()); });
    cudaFree(src);
    cudaFree(dst);
    return 2.0 * static_cast<double>(bytes) / t;
  }();
  return rate;
}

struct DeviceMemory {
  void* ptr = nullptr;
  explicit DeviceMemory(size_t bytes) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceMemory() { cudaFree(ptr); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

// Fills `bytes` of device memory with N(0, 2) logits of the element type by tiling a 16 MiB host
// block.
void FillRandom(void* dst, size_t bytes, bool bf16) {
  const size_t block = std::min(bytes, size_t{16} << 20);
  std::vector<uint8_t> host(block);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  if (bf16) {
    auto* p = reinterpret_cast<uint16_t*>(host.data());
    for (size_t i = 0; i < block / 2; ++i) p[i] = FloatToBf16(normal(rng));
  } else {
    auto* p = reinterpret_cast<float*>(host.data());
    for (size_t i = 0; i < block / 4; ++i) p[i] = normal(rng);
  }
  for (size_t at = 0; at < bytes; at += block) {
    cudaMemcpy(static_cast<char*>(dst) + at, host.data(), std::min(block, bytes - at), cudaMemcpyHostToDevice);
  }
}

struct Mode {
  const char* name;
  float temperature;
  float top_p;
};

void BM_Verify(benchmark::State& state, Mode mode, bool bf16) {
  const int64_t batch = state.range(0), tokens = state.range(1), vocab = state.range(2);
  const int64_t rows = batch * tokens;
  const size_t elem = bf16 ? 2 : 4;
  const size_t bytes = static_cast<size_t>(rows * vocab) * elem;
  const size_t slot = (bytes + 255) / 256 * 256;
  const size_t slots = std::max<size_t>(2, ((size_t{256} << 20) + slot - 1) / slot);
  DeviceMemory pool(slot * slots);
  if (pool.ptr == nullptr) return state.SkipWithError("no CUDA device or out of memory");
  FillRandom(pool.ptr, slot * slots, bf16);

  // Trees: 4-ary, nodes in breadth-first order; random drafted tokens.
  std::vector<int32_t> offsets(batch + 1);
  std::vector<int64_t> node_tokens(rows);
  std::vector<int32_t> first_child(rows, -1), next_sibling(rows, -1);
  std::mt19937_64 rng(2);
  for (int64_t b = 0; b <= batch; ++b) offsets[b] = static_cast<int32_t>(b * tokens);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < tokens; ++i) {
      node_tokens[b * tokens + i] = static_cast<int64_t>(rng() % vocab);
      if (i == 0) continue;
      const int64_t parent = (i - 1) / 4;
      if (first_child[b * tokens + parent] == -1) first_child[b * tokens + parent] = static_cast<int32_t>(i);
      if ((i - 1) % 4 != 3 && i + 1 < tokens) next_sibling[b * tokens + i] = static_cast<int32_t>(i + 1);
    }
  }
  DeviceMemory d_offsets(offsets.size() * 4), d_tokens(node_tokens.size() * 8), d_fc(rows * 4), d_ns(rows * 4);
  const size_t ws_bytes = TreeVerifyWorkspaceBytes(rows, vocab);
  DeviceMemory ws(ws_bytes), num(batch * 4), nodes(rows * 4), out(rows * 8), errors(batch * sizeof(VerifyError));
  cudaMemcpy(d_offsets.ptr, offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_tokens.ptr, node_tokens.data(), node_tokens.size() * 8, cudaMemcpyHostToDevice);
  cudaMemcpy(d_fc.ptr, first_child.data(), rows * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_ns.ptr, next_sibling.data(), rows * 4, cudaMemcpyHostToDevice);

  TreeVerifyLaunchParams p;
  p.batch = static_cast<int32_t>(batch);
  p.row_offsets = static_cast<int32_t*>(d_offsets.ptr);
  p.total_rows = rows;
  p.max_nodes = static_cast<int32_t>(tokens);
  p.tokens = static_cast<int64_t*>(d_tokens.ptr);
  p.first_child = static_cast<int32_t*>(d_fc.ptr);
  p.next_sibling = static_cast<int32_t*>(d_ns.ptr);
  p.logits_type = bf16 ? VerifyLogitsType::kBf16 : VerifyLogitsType::kF32;
  p.ld = vocab;
  p.vocab = vocab;
  p.temperature = mode.temperature;
  p.top_p = mode.top_p;
  p.seed = 3;
  p.workspace = ws.ptr;
  p.workspace_bytes = ws_bytes;
  p.num_accepted = static_cast<int32_t*>(num.ptr);
  p.accepted_nodes = static_cast<int32_t*>(nodes.ptr);
  p.out_tokens = static_cast<int64_t*>(out.ptr);
  p.errors = static_cast<VerifyError*>(errors.ptr);

  size_t next = 0;
  cudaError_t launch = cudaSuccess;
  auto step = [&] {
    p.logits = static_cast<char*>(pool.ptr) + slot * (next++ % slots);
    p.offset = next;
    launch = LaunchTreeVerify(p, /*programmatic=*/true, Stream());
  };
  step();
  if (launch != cudaSuccess || cudaStreamSynchronize(Stream()) != cudaSuccess) {
    return state.SkipWithError(cudaGetErrorString(launch != cudaSuccess ? launch : cudaGetLastError()));
  }
  double seconds = 0;
  for (auto _ : state) {
    seconds = TimeMedian(5, step);
    state.SetIterationTime(seconds);
  }
  const double copy_rate = CopyBytesPerSecond();
  const double floor = static_cast<double>(bytes) / copy_rate;
  state.counters["us"] = seconds * 1e6;
  state.counters["bytes"] = static_cast<double>(bytes);
  state.counters["GB/s"] = static_cast<double>(bytes) / seconds * 1e-9;
  state.counters["floor_us"] = floor * 1e6;
  state.counters["frac_of_floor"] = floor / seconds;
  state.counters["copy_GB/s"] = copy_rate * 1e-9;
}

void Register() {
  const Mode greedy{"greedy", 0.0f, 1.0f}, stochastic{"stochastic", 1.0f, 1.0f},
      top_p{"stochastic_top_p", 1.0f, 0.9f};
  for (bool bf16 : {true, false}) {
    const std::string dtype = bf16 ? "bf16" : "f32";
    for (const Mode& mode : {greedy, stochastic}) {
      benchmark::RegisterBenchmark(("verify_" + std::string(mode.name) + "_" + dtype).c_str(),
                                   [mode, bf16](benchmark::State& s) { BM_Verify(s, mode, bf16); })
          ->ArgNames({"batch", "tokens", "vocab"})
          ->ArgsProduct({{1, 8, 32}, {8, 32, 64}, {102400, 129280, 163840}})
          ->UseManualTime()
          ->Repetitions(3)
          ->Iterations(20)  // each iteration is already the median of 5 calls
          ->ReportAggregatesOnly(true)
          ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("verify_" + std::string(top_p.name) + "_" + dtype).c_str(),
                                 [top_p, bf16](benchmark::State& s) { BM_Verify(s, top_p, bf16); })
        ->ArgNames({"batch", "tokens", "vocab"})
        ->Args({32, 64, 163840})
        ->UseManualTime()
        ->Repetitions(3)
        ->Iterations(20)
        ->ReportAggregatesOnly(true)
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace eagle3::cuda

int main(int argc, char** argv) {
  eagle3::cuda::Register();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
