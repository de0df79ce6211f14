// Tensor parallelism over NCCL on real GPUs: the target at TP = 2, 4 and 8 (each where that many
// GPUs are visible; skipped otherwise), one rank per GPU with NcclCommunicator, equals TP = 1 on one
// GPU over a prefill and decode steps, its ranks' logits equal bit for bit; and the same steps
// replayed from CUDA graphs (collectives captured) equal the eager run bit for bit.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/graph_step_launcher.h"
#include "eagle3/cuda/nccl_communicator.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

const std::string kModel = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2_qlora_yarn";

TargetModelOptions Options(int tp, int rank) {
  TargetModelOptions o;
  o.weight_dtype = DType::kF32;  // the f32 path, compared at f32 tolerances
  o.tp_size = tp;
  o.rank = rank;
  o.max_tokens_per_forward = 16;
  o.max_context_len = 64;
  o.num_kv_pages = 16;
  o.page_size = 4;
  return o;
}

// Prefill of 7 tokens (all logits), then 5 single-token decode steps: every step's logits.
std::vector<std::vector<float>> Steps(TargetModel& model, StepLauncher* launcher, int64_t vocab) {
  const std::vector<int32_t> pages = {5, 1, 9, 3, 12, 0, 7, 2, 11, 4, 6, 8, 10, 13, 14, 15};
  const std::vector<int64_t> prompt = {5, 9, 2, 7, 3, 8, 1};
  std::vector<std::vector<float>> out;
  auto run = [&](const SequenceInput& in) {
    std::vector<float> logits(static_cast<size_t>(TargetModel::LogitRows({&in, 1}) * vocab));
    const TensorView view(logits.data(), DType::kF32, Shape{TargetModel::LogitRows({&in, 1}), vocab});
    absl::Status st = model.Stage({&in, 1});
    if (st.ok()) st = launcher != nullptr ? launcher->Launch(model) : model.Launch();
    if (st.ok()) st = model.Finish(view);
    EXPECT_TRUE(st.ok()) << st;
    out.push_back(std::move(logits));
  };
  run(SequenceInput{prompt, {}, pages, 0, {}, true});
  for (int step = 0; step < 5; ++step) {
    const std::vector<int64_t> token = {(13 * step + 4) % vocab};
    run(SequenceInput{token, {}, pages, 7 + step, {}, false});
  }
  return out;
}

double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return a.size() == b.size() ? diff / scale : 1e30;
}

class ModelNcclTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Tp, ModelNcclTest, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "Tp" + std::to_string(info.param); });

// The test model (8 heads, 16 experts of 16, vocabulary 1000) divides over 2, 4 and 8 ranks.
TEST_P(ModelNcclTest, OverNcclEqualsTp1AndGraphReplaysEqualEager) {
  const int tp = GetParam();
  if (cuda::CudaDeviceCount() < tp) {
    GTEST_SKIP() << "needs " << tp << " GPUs, " << cuda::CudaDeviceCount() << " visible";
  }
  // TP = 1 reference on GPU 0.
  std::vector<std::vector<float>> reference;
  int64_t vocab = 0;
  {
    auto backend = cuda::CudaBackend::Create();
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto model = TargetModel::Create(kModel, Options(1, 0), nullptr, backend->get());
    ASSERT_TRUE(model.ok()) << model.status();
    vocab = (*model)->config().vocab_size;
    reference = Steps(**model, nullptr, vocab);
  }
  std::vector<std::vector<float>> eager;  // rank 0's logits of the eager run
  for (bool graphs : {false, true}) {
    std::vector<std::unique_ptr<cuda::CudaBackend>> backends;
    std::vector<cudaStream_t> streams;
    for (int d = 0; d < tp; ++d) {
      cuda::CudaBackendOptions options;
      options.device = d;
      auto b = cuda::CudaBackend::Create(options);
      ASSERT_TRUE(b.ok()) << b.status();
      streams.push_back((*b)->stream());
      backends.push_back(std::move(*b));
    }
    std::vector<int> devices(static_cast<size_t>(tp));
    for (int d = 0; d < tp; ++d) devices[d] = d;
    auto comms = cuda::NcclCommunicator::CreateAllLocal(devices, streams);
    ASSERT_TRUE(comms.ok()) << comms.status();
    std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(tp));
    std::vector<cuda::GraphStepLauncher::Counts> counts(static_cast<size_t>(tp));
    std::vector<std::thread> threads;
    for (int r = 0; r < tp; ++r) {
      threads.emplace_back([&, r] {
        auto model = TargetModel::Create(kModel, Options(tp, r), (*comms)[r].get(), backends[r].get());
        ASSERT_TRUE(model.ok()) << model.status();
        cuda::GraphStepLauncher launcher(streams[r]);
        got[r] = Steps(**model, graphs ? &launcher : nullptr, vocab);
        counts[r] = launcher.counts();
      });
    }
    for (auto& t : threads) t.join();
    ASSERT_EQ(got[0].size(), reference.size());
    for (size_t s = 0; s < reference.size(); ++s) {
      for (int r = 1; r < tp; ++r) {
        EXPECT_EQ(got[r][s], got[0][s]) << "rank " << r << " differs from rank 0 at step " << s << " graphs " << graphs;
      }
      EXPECT_LT(RelDiff(got[0][s], reference[s]), 1e-5) << "step " << s << " graphs " << graphs;
      if (graphs) EXPECT_EQ(got[0][s], eager[s]) << "graph replay differs from eager at step " << s;
    }
    if (!graphs) eager = got[0];
    if (graphs) {
      for (int r = 0; r < tp; ++r) {
        EXPECT_EQ(counts[r].failed_captures, 0) << "rank " << r;
        EXPECT_GE(counts[r].replays, 3) << "rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace eagle3
