// NCCL collectives at decode message sizes on every visible GPU, through the library's
// cuda::NcclCommunicator (one communicator per GPU from CreateAllLocal, one host thread per rank).
//
//   BM_AllReduce/bytes/bf16 : AllReduceSum of a `bytes` message (f32 or bf16), in place
//   BM_AllGather/bytes/bf16 : AllGather into a `bytes` result (each rank sends bytes / n)
//
// Messages span 14 KB (one bf16 row of hidden 7168) to 4 MB. Each timed iteration is `kInner`
// back-to-back collectives between two CUDA events on rank 0's stream (which amortizes the skew of
// the ranks' host threads), reported per collective. Bandwidths as nccl-tests defines them:
// algbw = bytes / time; busbw = algbw * 2(n-1)/n for all-reduce, * (n-1)/n for all-gather. The floor
// is the bus bytes over kNvlinkBytesPerS (bench_util.h): 450 GB/s, the H200's NVLink 4 bandwidth per direction
// (18 links x 25 GB/s), which NVSwitch systems can reach from every GPU at once. Small messages are
// latency-bound: their fraction of that floor is expected to be tiny; `us` is the figure to read.
// With fewer than two GPUs every benchmark is skipped with a message saying so.
#include <atomic>
#include <barrier>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "eagle3/cuda/nccl_communicator.h"

namespace eagle3::bench {
namespace {

constexpr int kInner = 20;

struct Group {
  std::vector<std::unique_ptr<cuda::NcclCommunicator>> comms;
  absl::Status status;
};

Group& Comms() {
  static Group group = [] {
    Group g;
    const int n = DeviceCount();
    if (n < 2) {
      g.status = absl::FailedPreconditionError("needs at least 2 GPUs; " + std::to_string(n) + " visible");
      return g;
    }
    std::vector<int> devices;
    for (int d = 0; d < n; ++d) devices.push_back(d);
    auto comms = cuda::NcclCommunicator::CreateAllLocal(devices);
    if (comms.ok()) {
      g.comms = std::move(*comms);
    } else {
      g.status = comms.status();
    }
    return g;
  }();
  return group;
}

enum class Kind { kAllReduce, kAllGather };

// Runs the benchmark loop with one worker thread per rank; rank 0's events time each iteration.
void RunCollective(benchmark::State& state, Kind kind) {
  Group& g = Comms();
  if (!Check(state, g.status, "NCCL group")) return;
  const int n = static_cast<int>(g.comms.size());
  const int64_t bytes = state.range(0);
  const DType dtype = state.range(1) != 0 ? DType::kBF16 : DType::kF32;
  const int64_t elems = bytes / static_cast<int64_t>(DTypeSize(dtype)) / n * n;  // divisible by n
  // Per-rank buffers: all-reduce in place over `elems`; all-gather sends elems / n into `elems`.
  std::vector<void*> buffers(static_cast<size_t>(n), nullptr);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    cudaMalloc(&buffers[static_cast<size_t>(r)], static_cast<size_t>(elems) * DTypeSize(dtype));
    cudaMemset(buffers[static_cast<size_t>(r)], 0, static_cast<size_t>(elems) * DTypeSize(dtype));
  }
  auto collective = [&](int r) {
    cuda::NcclCommunicator& c = *g.comms[static_cast<size_t>(r)];
    void* buf = buffers[static_cast<size_t>(r)];
    const TensorView all(buf, dtype, Shape{elems}, Device::Cuda(r));
    if (kind == Kind::kAllReduce) return c.AllReduceSum(all, all);
    return c.AllGather(all.Narrow(0, r * (elems / n), elems / n), all);
  };

  std::barrier sync(n + 1);
  std::atomic<bool> stop{false};
  std::vector<absl::Status> errors(static_cast<size_t>(n));
  std::vector<double> rank0_times;
  std::vector<std::thread> workers;
  for (int r = 0; r < n; ++r) {
    workers.emplace_back([&, r] {
      cudaSetDevice(r);
      cuda::NcclCommunicator& c = *g.comms[static_cast<size_t>(r)];
      absl::Status& err = errors[static_cast<size_t>(r)];
      for (int i = 0; i < kWarmup && err.ok(); ++i) err = collective(r);
      if (err.ok()) err = c.Synchronize();
      cudaEvent_t start, end;
      cudaEventCreate(&start);
      cudaEventCreate(&end);
      while (true) {
        sync.arrive_and_wait();  // start of an iteration (or the stop signal)
        if (stop.load()) break;
        cudaEventRecord(start, c.stream());
        for (int i = 0; i < kInner && err.ok(); ++i) err = collective(r);
        cudaEventRecord(end, c.stream());
        if (err.ok()) err = c.Synchronize();
        if (r == 0) {
          float ms = 0;
          cudaEventElapsedTime(&ms, start, end);
          rank0_times.push_back(ms * 1e-3 / kInner);
        }
        sync.arrive_and_wait();  // end of the iteration
      }
      cudaEventDestroy(start);
      cudaEventDestroy(end);
    });
  }
  for (auto _ : state) {
    sync.arrive_and_wait();
    sync.arrive_and_wait();
    state.SetIterationTime(rank0_times.empty() ? 0.0 : rank0_times.back());
  }
  stop.store(true);
  sync.arrive_and_wait();
  for (std::thread& w : workers) w.join();
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    cudaFree(buffers[static_cast<size_t>(r)]);
  }
  cudaSetDevice(0);
  for (const absl::Status& err : errors) {
    if (!Check(state, err, "collective")) return;
  }
  const double seconds = Median(rank0_times);
  const double message = static_cast<double>(elems) * DTypeSize(dtype);
  const double factor = kind == Kind::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
  const double bus_bytes = message * factor;
  const double floor = bus_bytes / kNvlinkBytesPerS;
  state.counters["us"] = seconds * 1e6;
  state.counters["bytes"] = message;
  state.counters["ranks"] = n;
  state.counters["GB/s"] = seconds > 0 ? message / seconds * 1e-9 : 0;  // algbw
  state.counters["busbw_GB/s"] = seconds > 0 ? bus_bytes / seconds * 1e-9 : 0;
  state.counters["floor_us"] = floor * 1e6;
  state.counters["frac_of_floor"] = seconds > 0 ? floor / seconds : 0;
  state.counters["assumed_link_GB/s"] = kNvlinkBytesPerS * 1e-9;
}

void BM_AllReduce(benchmark::State& state) { RunCollective(state, Kind::kAllReduce); }
void BM_AllGather(benchmark::State& state) { RunCollective(state, Kind::kAllGather); }

void CollectiveArgs(benchmark::internal::Benchmark* bm) {
  // 14 KB = one bf16 row of hidden 7168; 28 KB one f32 row; then 4, 16, 64 rows; 4 MB.
  if (Quick()) {
    bm->ArgsProduct({{14336, 229376, 4194304}, {0, 1}});
  } else {
    bm->ArgsProduct({{14336, 28672, 114688, 458752, 1835008, 4194304}, {0, 1}});
  }
}
BENCHMARK(BM_AllReduce)
    ->ArgNames({"bytes", "bf16"})
    ->Apply(CollectiveArgs)
    ->Apply(Timed);
BENCHMARK(BM_AllGather)
    ->ArgNames({"bytes", "bf16"})
    ->Apply(CollectiveArgs)
    ->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
