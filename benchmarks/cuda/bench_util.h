// Shared harness of the GPU benchmarks (benchmarks/cuda/*_benchmark.cc): CUDA-event timing with
// warm-up, the two ceilings measured in the same run (device-to-device copy rate, cuBLASLt bf16 GEMM
// rate), an L2-rotation helper, fast device fills, and the roofline counters every benchmark reports.
//
// Timing model: every benchmark is registered with UseManualTime(); each Google Benchmark iteration
// is one CUDA-event measurement of the op sequence on the backend's stream (after `kWarmup`
// untimed runs), the per-repetition value is the mean of its iterations and the reported figure is
// the median over repetitions (ReportAggregatesOnly). The counters are computed from the median of
// every iteration's own time, so one slow iteration (a clock ramp, a page fault) does not move them.
// Small ops that a decode step runs from a CUDA graph (gemm_benchmark, BM_MoeDecode) are timed per
// call of a graph replay instead (RunTimedInGraph): one eager call's event pair also counts the
// host's launch path, which is several microseconds and larger than the op itself at one token.
//
// Counters (all benchmarks, so make_results.py can read them generically):
//   us             median device time of one run, microseconds
//   bytes, flops   what the run must move / compute at minimum (the benchmark's model, stated there)
//   GB/s, TFLOP/s  bytes / time, flops / time
//   floor_us       max(bytes / copy rate, flops / GEMM rate), from the ceilings measured in this run
//   frac_of_floor  floor_us / us (1.0 = at the floor)
//   copy_GB/s, gemm_TFLOP/s   the measured ceilings
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nvtx3/nvToolsExt.h>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/half.h"
#include "eagle3/tensor.h"

namespace eagle3::bench {

inline constexpr int kWarmup = 3;

// The NVLink floor of the collectives' figures (collectives_benchmark, tp_step_benchmark): 450 GB/s,
// the H100's and H200's NVLink 4 bandwidth per direction (18 links x 25 GB/s), which NVSwitch
// systems can reach from every GPU at once.
inline constexpr double kNvlinkBytesPerS = 450e9;

// Number of CUDA devices; 0 when the driver or the device is missing (never an error).
inline int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// The backend every benchmark of a binary shares (device 0), sized for the largest shapes used
// here. Null (and a message on stderr, once) when no device is usable.
inline cuda::CudaBackend* Backend() {
  static std::unique_ptr<cuda::CudaBackend> backend = [] {
    std::unique_ptr<cuda::CudaBackend> out;
    if (DeviceCount() == 0) return out;
    cuda::CudaBackendOptions options;
    options.max_rows = 4096;
    options.max_context_len = 65536;
    // EAGLE3_BENCH_MOE_GROUPED=0 / EAGLE3_BENCH_SMALL_M_GEMV=0 turn off MoeExperts' grouped path
    // and the GEMV path of Gemm / BatchedGemm (both on by default) to measure the paths they replace.
    const char* grouped = std::getenv("EAGLE3_BENCH_MOE_GROUPED");
    if (grouped != nullptr && grouped[0] != '\0') options.moe_grouped_experts = grouped[0] != '0';
    // EAGLE3_BENCH_MOE_GROUPED_MIN_TOKENS=N: the grouped path from N tokens (moe_grouped_min_tokens),
    // to time both paths on either side of the default switch.
    if (const char* min_tokens = std::getenv("EAGLE3_BENCH_MOE_GROUPED_MIN_TOKENS"); min_tokens != nullptr) {
      if (const long long n = std::atoll(min_tokens); n > 0) options.moe_grouped_min_tokens = n;
    }
    const char* gemv = std::getenv("EAGLE3_BENCH_SMALL_M_GEMV");
    if (gemv != nullptr && gemv[0] != '\0') options.small_m_gemv = gemv[0] != '0';
    // EAGLE3_BENCH_PAGED_REGISTERS=0: BatchedPagedAttention (the draft's attention) on its
    // shared-memory kernel instead of the register kernel (the default since 2026-12-01).
    const char* paged = std::getenv("EAGLE3_BENCH_PAGED_REGISTERS");
    if (paged != nullptr && paged[0] != '\0') options.paged_attention_registers = paged[0] != '0';
    // EAGLE3_BENCH_PDL=0: no programmatic dependent launch (CudaBackendOptions::
    // programmatic_launch), to measure what the overlap of consecutive kernels gains.
    const char* pdl = std::getenv("EAGLE3_BENCH_PDL");
    if (pdl != nullptr && pdl[0] != '\0') options.programmatic_launch = pdl[0] != '0';
    // EAGLE3_BENCH_QUANT_MOE_FOLD=0: QuantizedMoeExperts groups every call's pairs in a kernel of its
    // own (CudaBackendOptions::quant_moe_fold_grouping), to measure what folding the grouping of
    // small calls into the next kernel saves.
    const char* fold = std::getenv("EAGLE3_BENCH_QUANT_MOE_FOLD");
    if (fold != nullptr && fold[0] != '\0') options.quant_moe_fold_grouping = fold[0] != '0';
    // EAGLE3_BENCH_QUANT_MOE_FOLD_SILU=0 / EAGLE3_BENCH_QUANT_MOE_FOLD_COMBINE=0: SiLU-mul and the
    // experts' combine in kernels of their own (CudaBackendOptions::quant_moe_fold_silu / _combine).
    const char* fold_silu = std::getenv("EAGLE3_BENCH_QUANT_MOE_FOLD_SILU");
    if (fold_silu != nullptr && fold_silu[0] != '\0') options.quant_moe_fold_silu = fold_silu[0] != '0';
    // EAGLE3_BENCH_QUANT_MOE_DIRECT=0: one-token calls stage the experts' inputs in a kernel of
    // their own (CudaBackendOptions::quant_moe_direct_decode).
    const char* direct = std::getenv("EAGLE3_BENCH_QUANT_MOE_DIRECT");
    if (direct != nullptr && direct[0] != '\0') options.quant_moe_direct_decode = direct[0] != '0';
    // EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=N: calls of up to N tokens run direct, either format
    // (CudaBackendOptions::quant_moe_direct_max_tokens_int4 / _fp8; 1: one-token calls only).
    if (const char* direct_tokens = std::getenv("EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS"); direct_tokens != nullptr) {
      if (const long long n = std::atoll(direct_tokens); n > 0) {
        options.quant_moe_direct_max_tokens_int4 = n;
        options.quant_moe_direct_max_tokens_fp8 = n;
      }
    }
    // EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0: one-token calls combine through the down product's
    // counters (CudaBackendOptions::quant_moe_combine_in_block).
    const char* in_block = std::getenv("EAGLE3_BENCH_QUANT_MOE_IN_BLOCK");
    if (in_block != nullptr && in_block[0] != '\0') options.quant_moe_combine_in_block = in_block[0] != '0';
    // EAGLE3_BENCH_QUANT_MOE_CHAIN=0: one-token INT4 calls launch their gate-up and down products as
    // two kernels (CudaBackendOptions::quant_moe_chain_round).
    const char* chain = std::getenv("EAGLE3_BENCH_QUANT_MOE_CHAIN");
    if (chain != nullptr && chain[0] != '\0') options.quant_moe_chain_round = chain[0] != '0';
    const char* fold_combine = std::getenv("EAGLE3_BENCH_QUANT_MOE_FOLD_COMBINE");
    if (fold_combine != nullptr && fold_combine[0] != '\0') options.quant_moe_fold_combine = fold_combine[0] != '0';
    // EAGLE3_BENCH_QUANT_MOE_TILED_EXPERTS=0: models keep their routed experts' codes row-major
    // (CudaBackendOptions::quant_moe_tiled_experts).
    const char* tiled_experts = std::getenv("EAGLE3_BENCH_QUANT_MOE_TILED_EXPERTS");
    if (tiled_experts != nullptr && tiled_experts[0] != '\0') {
      options.quant_moe_tiled_experts = tiled_experts[0] != '0';
    }
    // EAGLE3_BENCH_QUANT_GEMM_TILED_WEIGHTS=0: the other quantized weights row-major too
    // (CudaBackendOptions::quant_gemm_tiled_weights).
    const char* tiled_gemm = std::getenv("EAGLE3_BENCH_QUANT_GEMM_TILED_WEIGHTS");
    if (tiled_gemm != nullptr && tiled_gemm[0] != '\0') options.quant_gemm_tiled_weights = tiled_gemm[0] != '0';
    // EAGLE3_BENCH_LATENT_FOLD_BYTES=N: CudaBackendOptions::latent_fold_combine_bytes (0: every split
    // latent attention call launches its combine kernel; a large N: every call whose kernel can merges
    // its splits itself).
    const char* latent_fold = std::getenv("EAGLE3_BENCH_LATENT_FOLD_BYTES");
    if (latent_fold != nullptr && latent_fold[0] != '\0') {
      options.latent_fold_combine_bytes = std::strtoll(latent_fold, nullptr, 10);
    }
    // EAGLE3_BENCH_UPLOAD_RING_MIB=N: the weight loads' pinned upload ring of N MiB
    // (CudaBackendOptions::upload_ring_bytes; 0: none, every upload through Copy's pageable path).
    const char* ring = std::getenv("EAGLE3_BENCH_UPLOAD_RING_MIB");
    if (ring != nullptr && ring[0] != '\0') {
      options.upload_ring_bytes = static_cast<size_t>(std::strtoull(ring, nullptr, 10)) << 20;
    }
    // EAGLE3_BENCH_WEIGHT_ARENA_MIB=N: weight tensors from device chunks of N MiB
    // (CudaBackendOptions::weight_arena_chunk_bytes; 0: no arena, a cudaMalloc per tensor).
    const char* arena = std::getenv("EAGLE3_BENCH_WEIGHT_ARENA_MIB");
    if (arena != nullptr && arena[0] != '\0') {
      options.weight_arena_chunk_bytes = static_cast<size_t>(std::strtoull(arena, nullptr, 10)) << 20;
    }
    auto b = cuda::CudaBackend::Create(options);
    if (b.ok()) {
      out = std::move(*b);
    } else {
      std::fprintf(stderr, "CudaBackend::Create failed: %s\n", std::string(b.status().message()).c_str());
    }
    return out;
  }();
  return backend.get();
}

// Device time of fn() (which enqueues work on `stream`) measured with CUDA events, in seconds.
// The host time fn() takes counts too where it stalls the stream (a synchronizing op). fn() runs in
// an NVTX range "eagle3_step", so a profiler can pick the timed work out of the setup and warm-up
// (`ncu --nvtx --nvtx-include "eagle3_step/" --launch-count N ...`); without a tool attached the
// range costs nothing.
template <typename Fn>
double TimeOnce(cudaStream_t stream, Fn&& fn) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  nvtxRangePushA("eagle3_step");
  fn();
  nvtxRangePop();
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1e-3;
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median of `reps` timings of fn() after `warmup` untimed runs, in seconds.
template <typename Fn>
double TimeMedian(cudaStream_t stream, int reps, int warmup, Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaStreamSynchronize(stream);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) times.push_back(TimeOnce(stream, fn));
  return Median(std::move(times));
}

// N(0, 1) draws shared by every FillRandom of the process: 1 Mi values from a fixed seed, drawn once
// (drawing a block per call took ~30 ms, and rotated input sets call it up to 64 times per row:
// seconds of setup per benchmark row).
inline const std::vector<float>& NormalBlock() {
  static const std::vector<float> block = [] {
    std::vector<float> b(size_t{1} << 20);
    std::mt19937 rng(0x5eed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& v : b) v = dist(rng);
    return b;
  }();
  return block;
}

// Fills a device tensor (f32 or bf16) with N(0, stddev²) values: the shared block read from an
// offset that `seed` picks, scaled, uploaded, then tiled on the device by doubling copies (seconds
// for gigabytes, where drawing every element on the host would take minutes). Only timing depends on
// these values: they just need to be finite and not all zero (zeros would flatter the GEMM's power
// draw); different seeds give differently ordered values.
inline void FillRandom(const TensorView& t, uint32_t seed, float stddev = 1.0f) {
  const size_t elem = DTypeSize(t.dtype());
  const size_t total = static_cast<size_t>(t.numel()) * elem;
  if (total == 0) return;
  const std::vector<float>& normal = NormalBlock();
  const size_t block_elems = std::min(normal.size(), static_cast<size_t>(t.numel()));
  const size_t offset = (static_cast<size_t>(seed) * 2654435761u) % normal.size();
  std::vector<uint8_t> host(block_elems * elem);
  for (size_t i = 0; i < block_elems; ++i) {
    const float v = stddev * normal[(offset + i) % normal.size()];
    if (t.dtype() == DType::kBF16) {
      reinterpret_cast<uint16_t*>(host.data())[i] = FloatToBf16(v);
    } else {
      reinterpret_cast<float*>(host.data())[i] = v;
    }
  }
  auto* dst = static_cast<uint8_t*>(t.data());
  cudaMemcpy(dst, host.data(), host.size(), cudaMemcpyHostToDevice);
  for (size_t done = host.size(); done < total;) {
    const size_t n = std::min(done, total - done);
    cudaMemcpy(dst + done, dst, n, cudaMemcpyDeviceToDevice);
    done += n;
  }
}

// A device tensor of `dtype` filled by FillRandom. Aborts with a message when the allocation fails
// (benchmarks size their inputs up front; an H200 has room for every shape here).
inline Tensor RandomDevice(DType dtype, const Shape& shape, uint32_t seed, float stddev = 1.0f) {
  auto t = Tensor::Empty(dtype, shape, Backend()->allocator());
  if (!t.ok()) {
    std::fprintf(stderr, "allocating %s %s: %s\n", std::string(DTypeName(dtype)).c_str(), shape.ToString().c_str(),
                 std::string(t.status().message()).c_str());
    std::abort();
  }
  FillRandom(t->view(), seed, stddev);
  return std::move(*t);
}

// Host data uploaded to a fresh device tensor of the same dtype and shape.
inline Tensor ToDevice(const Tensor& host) {
  Tensor d = *Tensor::Empty(host.dtype(), host.shape(), Backend()->allocator());
  (void)Backend()->Copy(host, d);
  return d;
}

// The device's L2 size (the H200's 50 MiB when the query fails).
inline int64_t L2Bytes() {
  int dev = 0, bytes = 0;
  cudaGetDevice(&dev);
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev) != cudaSuccess || bytes <= 0) {
    (void)cudaGetLastError();
    return int64_t{50} << 20;
  }
  return bytes;
}

// How many copies of an input set of `bytes` to rotate through so that the copies together exceed
// twice the L2: each run then finds its inputs evicted by the runs between (at least 1; at most
// `max_copies`, for sets so small that rotation would mean thousands of buffers).
inline int CopiesToDefeatL2(double bytes, int max_copies = 64) {
  if (bytes <= 0) return 1;
  const double needed = 2.0 * static_cast<double>(L2Bytes()) / bytes;
  return std::clamp(static_cast<int>(needed) + 1, 1, max_copies);
}

// Round-robin over `n` input sets built by make(i): Next() returns the set the next run uses.
template <typename T>
class Rotation {
 public:
  template <typename Make>
  Rotation(int n, Make&& make) {
    for (int i = 0; i < std::max(n, 1); ++i) sets_.push_back(make(i));
  }
  T& Next() {
    T& t = sets_[next_];
    next_ = (next_ + 1) % sets_.size();
    return t;
  }
  size_t size() const { return sets_.size(); }

 private:
  std::vector<T> sets_;
  size_t next_ = 0;
};

struct Ceilings {
  double copy_bytes_per_s = 0;  // read + write bytes of a 1 GiB device-to-device copy per second
  double gemm_flops_per_s = 0;  // 8192^3 bf16 x bf16 -> f32 GEMM through the backend (cuBLASLt)
};

// Measured once per process, before the first benchmark reports. Fails (aborts with a message)
// only if the device cannot hold the 2 GiB + 512 MiB the measurement needs.
inline const Ceilings& MeasuredCeilings() {
  static const Ceilings c = [] {
    Ceilings out;
    cuda::CudaBackend* b = Backend();
    const int64_t bytes = int64_t{1} << 30;
    Tensor src = RandomDevice(DType::kF32, Shape{bytes / 4}, 1);
    Tensor dst = *Tensor::Empty(DType::kF32, Shape{bytes / 4}, b->allocator());
    const double t_copy = TimeMedian(b->stream(), 9, 2, [&] {
      cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, b->stream());
    });
    out.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / t_copy;
    const int64_t n = 8192;
    Tensor a = RandomDevice(DType::kBF16, Shape{n, n}, 2);
    Tensor w = RandomDevice(DType::kBF16, Shape{n, n}, 3);
    Tensor o = *Tensor::Empty(DType::kF32, Shape{n, n}, b->allocator());
    const double t_gemm = TimeMedian(b->stream(), 7, 2, [&] { (void)b->Gemm(a, w, o, {}); });
    out.gemm_flops_per_s = 2.0 * static_cast<double>(n) * n * n / t_gemm;
    return out;
  }();
  return c;
}

// Page tables of `batch` sequences of `pages_per_seq` pages each, sequence b on pages b *
// pages_per_seq onward.
inline std::vector<std::vector<int32_t>> SequencePages(int64_t batch, int64_t pages_per_seq) {
  std::vector<std::vector<int32_t>> pages;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> p(static_cast<size_t>(pages_per_seq));
    for (int64_t i = 0; i < pages_per_seq; ++i) p[i] = static_cast<int32_t>(b * pages_per_seq + i);
    pages.push_back(std::move(p));
  }
  return pages;
}

// Collects each iteration's time; Report() uses their median.
class Timings {
 public:
  void Add(double seconds) { times_.push_back(seconds); }
  double Median() const { return bench::Median(times_); }

 private:
  std::vector<double> times_;
};

// Runs the benchmark loop: kWarmup untimed runs of fn(), then one CUDA-event timing per iteration.
// Returns the median iteration time in seconds (0 if an error was reported by fn via `failed`).
template <typename Fn>
double RunTimed(benchmark::State& state, cudaStream_t stream, Fn&& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  cudaStreamSynchronize(stream);
  Timings timings;
  for (auto _ : state) {
    const double t = TimeOnce(stream, fn);
    timings.Add(t);
    state.SetIterationTime(t);
  }
  return timings.Median();
}

// Device time per call of fn(), replayed from one CUDA graph of `calls` consecutive calls: how a
// decode step runs its ops (no host enqueue time in the figure; graph node gaps included), where
// RunTimed's single eager call also counts the host's launch path of a small op. fn() must be
// capturable (no allocation, no synchronization); when the capture fails, falls back to RunTimed.
// Sets the counter in_graph (1 graph, 0 fallback).
template <typename Fn>
double RunTimedInGraph(benchmark::State& state, cudaStream_t stream, int calls, Fn&& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  cudaStreamSynchronize(stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t error = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (error == cudaSuccess) {
    for (int i = 0; i < calls; ++i) fn();
    error = cudaStreamEndCapture(stream, &graph);
  }
  if (error == cudaSuccess) error = cudaGraphInstantiate(&exec, graph, 0);
  if (error == cudaSuccess) error = cudaGraphLaunch(exec, stream);
  if (error == cudaSuccess) error = cudaStreamSynchronize(stream);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    state.counters["in_graph"] = 0;
    return RunTimed(state, stream, fn);
  }
  Timings timings;
  for (auto _ : state) {
    const double t = TimeOnce(stream, [&] { cudaGraphLaunch(exec, stream); }) / calls;
    timings.Add(t);
    state.SetIterationTime(t);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  state.counters["in_graph"] = 1;
  return timings.Median();
}

// Sets the roofline counters (see the top of this file) for a run of `seconds` that must move
// `bytes` and compute `flops`; the flops at `gemm_flops_per_s` where the run computes at another
// rate than the bf16 GEMM's (FP8 tensor cores; the counter gemm_TFLOP/s then reports that rate).
inline void ReportRoofline(benchmark::State& state, double seconds, double bytes, double flops,
                           double gemm_flops_per_s = 0) {
  const Ceilings& c = MeasuredCeilings();
  const double rate = gemm_flops_per_s > 0 ? gemm_flops_per_s : c.gemm_flops_per_s;
  const double floor = std::max(bytes / c.copy_bytes_per_s, flops / rate);
  state.counters["us"] = seconds * 1e6;
  state.counters["bytes"] = bytes;
  state.counters["flops"] = flops;
  state.counters["GB/s"] = seconds > 0 ? bytes / seconds * 1e-9 : 0;
  state.counters["TFLOP/s"] = seconds > 0 ? flops / seconds * 1e-12 : 0;
  state.counters["floor_us"] = floor * 1e6;
  state.counters["frac_of_floor"] = seconds > 0 ? floor / seconds : 0;
  state.counters["copy_GB/s"] = c.copy_bytes_per_s * 1e-9;
  state.counters["gemm_TFLOP/s"] = rate * 1e-12;
}

// Skips the benchmark with `why` when `status` is not OK; returns whether it was OK.
inline bool Check(benchmark::State& state, const absl::Status& status, const char* what) {
  if (status.ok()) return true;
  state.SkipWithError((std::string(what) + ": " + std::string(status.message())).c_str());
  return false;
}

// main() of every GPU benchmark binary: refuses cleanly (exit 2, one line on stderr) without a
// CUDA device, measures the ceilings before the first benchmark so their cost is not charged to it,
// and prints them to stderr.
inline int Main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (DeviceCount() == 0) {
    std::fprintf(stderr, "%s: no CUDA device is present (cudaGetDeviceCount found none); nothing to measure\n",
                 argv[0]);
    return 2;
  }
  if (Backend() == nullptr) return 2;
  const Ceilings& c = MeasuredCeilings();
  std::fprintf(stderr, "ceilings: copy %.0f GB/s (read + write, 1 GiB), bf16 GEMM %.0f TFLOP/s (8192^3)\n",
               c.copy_bytes_per_s * 1e-9, c.gemm_flops_per_s * 1e-12);
  benchmark::AddCustomContext("copy_GB/s", std::to_string(c.copy_bytes_per_s * 1e-9));
  benchmark::AddCustomContext("gemm_TFLOP/s", std::to_string(c.gemm_flops_per_s * 1e-12));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Whether the shorter shape lists were asked for (EAGLE3_BENCH_QUICK=1, set by run_all.sh --quick):
// registration happens before main(), so the switch is an environment variable, not a flag.
inline bool Quick() {
  const char* q = std::getenv("EAGLE3_BENCH_QUICK");
  return q != nullptr && q[0] != '\0' && q[0] != '0';
}

// Repetitions per benchmark: 5, or 3 in quick mode.
inline int Repetitions() { return Quick() ? 3 : 5; }

// Timed iterations per repetition: a fixed count, not a minimum time. With manual time Google
// Benchmark sizes a run by the measured device time, so a 10-us op ran ~20000 iterations per
// repetition, each paying ~100 us of host time (events, synchronization): minutes per row, which
// is what kept full runs from finishing inside a device call.
inline int TimedIterations() { return Quick() ? 30 : 100; }

// The settings every harness benchmark shares: CUDA-event (manual) time, TimedIterations() per
// repetition, the repetitions of the mode, medians only, microseconds. Use as
// BENCHMARK(F)->Apply(Timed)->...
inline void Timed(benchmark::internal::Benchmark* b) {
  b->UseManualTime()
      ->Iterations(TimedIterations())
      ->Repetitions(Repetitions())
      ->ReportAggregatesOnly(true)
      ->Unit(benchmark::kMicrosecond);
}

// Timed for whole model steps (milliseconds to a second each): 10 iterations per repetition (5 in
// quick mode), 3 repetitions in both modes: a 0.4 s verify step at batch 32 ran 5 x 10 timed + as
// many host-timed steps, ~45 s per row, which kept the full decode_step list from one device call.
inline void StepTimed(benchmark::internal::Benchmark* b) {
  b->UseManualTime()
      ->Iterations(Quick() ? 5 : 10)
      ->Repetitions(3)
      ->ReportAggregatesOnly(true)
      ->Unit(benchmark::kMicrosecond);
}

}  // namespace eagle3::bench
