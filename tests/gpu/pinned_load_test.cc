// Weight loads through CudaBackend's UploadRing (pinned memory the checkpoint is read into, uploads
// enqueued from it): bitwise the same device tensors and logits as loads without a ring
// (CudaBackendOptions::upload_ring_bytes = 0); a ring small enough that most tensors wrap it many
// times and the larger ones fall back; uploads behind a stalled stream (the ring must wait for its
// transfers before reusing memory); a load failing midway with transfers in flight.
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "eagle3/checkpoint.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/upload_ring.h"
#include "gtest/gtest.h"
#include "linear_weight.h"
#include "weight_loader.h"

namespace eagle3 {
namespace {

const std::string kGolden = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/";

// The rings compared: none (the pageable path), one so small that the fixtures' larger tensors
// fall back and the small ones wrap it many times, and the default.
struct RingCase {
  size_t bytes;
  const char* name;
};
constexpr RingCase kRings[] = {{0, "no ring"}, {16 << 10, "16 KiB ring"}, {cuda::CudaBackendOptions{}.upload_ring_bytes, "default ring"}};

class PinnedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

std::vector<uint8_t> Bytes(cuda::CudaBackend& backend, const TensorView& device) {
  std::vector<uint8_t> out(device.nbytes());
  if (out.empty()) return out;
  Tensor host = *Tensor::Empty(device.dtype(), device.shape());
  EXPECT_TRUE(backend.Copy(device, host).ok());
  EXPECT_TRUE(backend.Synchronize().ok());
  std::memcpy(out.data(), host.data(), out.size());
  return out;
}

TEST_F(PinnedLoadTest, RingSizeComesFromTheOptions) {
  auto off = cuda::CudaBackend::Create({.upload_ring_bytes = 0});
  ASSERT_TRUE(off.ok()) << off.status();
  auto none = (*off)->CreateUploadRing();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  auto on = cuda::CudaBackend::Create();
  ASSERT_TRUE(on.ok()) << on.status();
  auto ring = (*on)->CreateUploadRing();
  ASSERT_TRUE(ring.ok()) << ring.status();
  ASSERT_NE(*ring, nullptr);
  EXPECT_EQ((*ring)->capacity(), cuda::CudaBackendOptions{}.upload_ring_bytes);
  cudaPointerAttributes attributes{};
  Tensor t = *Tensor::Empty(DType::kU8, Shape{100}, **ring);
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, t.data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // pinned: Copy enqueues a DMA
}

// A ring the host cannot pin is refused naming the option that sizes it and the way around it.
TEST_F(PinnedLoadTest, RingTooLargeToPinNamesItsOption) {
  auto backend = cuda::CudaBackend::Create({.upload_ring_bytes = size_t{1} << 50});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto ring = (*backend)->CreateUploadRing();
  ASSERT_FALSE(ring.ok());
  EXPECT_NE(ring.status().message().find("upload_ring_bytes"), std::string_view::npos) << ring.status();
  EXPECT_NE(ring.status().message().find("0 loads without the ring"), std::string_view::npos) << ring.status();
}

// Host tensors from a 1 MiB ring, each filled, uploaded and freed at once, some larger than the
// ring, behind a host function that stalls the stream: the first transfers cannot run until it
// ends, so the ring fills and must wait for them before it hands their memory out again. Every
// device copy holds the bytes its host tensor had.
TEST_F(PinnedLoadTest, UploadsWrapTheRingBehindAStalledStream) {
  auto backend = cuda::CudaBackend::Create({.upload_ring_bytes = 1 << 20});
  ASSERT_TRUE(backend.ok()) << backend.status();
  cuda::CudaBackend& gpu = **backend;
  auto made = gpu.CreateUploadRing();
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<UploadRing> ring = std::move(*made);
  ASSERT_NE(ring, nullptr);
  ASSERT_EQ(cudaLaunchHostFunc(
                gpu.stream(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }, nullptr),
            cudaSuccess);
  std::mt19937 rng(11);
  std::uniform_int_distribution<int64_t> size(1, 200 << 10);
  std::vector<std::pair<std::vector<uint8_t>, Tensor>> sent;
  int oversize = 0;
  for (int i = 0; i < 400; ++i) {
    const int64_t n = i % 100 == 50 ? (int64_t{3} << 20) : size(rng);
    oversize += n > (1 << 20);
    std::vector<uint8_t> bytes(static_cast<size_t>(n));
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    Tensor device = *Tensor::Empty(DType::kU8, Shape{n}, gpu.allocator());
    {
      absl::StatusOr<Tensor> host = Tensor::Empty(DType::kU8, Shape{n}, *ring);
      ASSERT_TRUE(host.ok()) << host.status();
      std::memcpy(host->data(), bytes.data(), bytes.size());
      ASSERT_TRUE(gpu.Copy(*host, device).ok()) << i;
    }  // freed at once, the transfer maybe not yet run
    sent.emplace_back(std::move(bytes), std::move(device));
  }
  EXPECT_GT(ring->wait_seconds(), 0.05);  // it waited for the stalled transfers
  EXPECT_EQ(ring->fallbacks(), oversize);
  ring.reset();
  ASSERT_TRUE(gpu.Synchronize().ok());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(Bytes(gpu, sent[i].second.view()), sent[i].first) << "upload " << i;
  }
}

// Every device tensor of one rank's load, in schema order (a LinearWeight's dense tensor, or codes
// and scales), as bytes; `extra` is appended to the schema (a tensor the checkpoint lacks makes the
// load fail there, after every other has been enqueued). Returns the load's status.
absl::Status LoadRank(const std::string& dir, size_t ring_bytes, int tp, int rank, std::optional<bool> keep_quantized,
                      const std::optional<WeightSpec>& extra, std::vector<std::vector<uint8_t>>* out) {
  EAGLE3_ASSIGN_OR_RETURN(auto backend, cuda::CudaBackend::Create({.upload_ring_bytes = ring_bytes}));
  EAGLE3_ASSIGN_OR_RETURN(const DeepseekV2Config config, DeepseekV2Config::FromFile(dir));
  EAGLE3_ASSIGN_OR_RETURN(auto checkpoint, Checkpoint::Open(dir));
  std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  std::vector<StoredForm> forms = StoredForms(config, specs);
  if (extra.has_value()) {
    specs.push_back(*extra);
    forms.push_back(StoredForm::kPlain);
  }
  std::vector<LinearWeight> linear;
  std::vector<Tensor> plain;
  absl::Status status;
  {
    WeightLoader loader(*checkpoint, config.quantization, specs, forms, tp, rank, *backend);
    loader.set_keep_quantized(keep_quantized);
    for (const WeightSpec& spec : specs) {
      if (spec.shape.rank() == 2) {
        absl::StatusOr<LinearWeight> w = loader.LoadLinear(spec, DType::kBF16);
        status = w.status();
        if (!status.ok()) break;
        linear.push_back(std::move(*w));
      } else {
        absl::StatusOr<Tensor> t = loader.Load(spec, DType::kF32);
        status = t.status();
        if (!status.ok()) break;
        plain.push_back(std::move(*t));
      }
    }
  }  // the loader's ring waits for its transfers before its memory is freed
  EAGLE3_RETURN_IF_ERROR(backend->Synchronize());
  for (const LinearWeight& w : linear) {
    for (const Tensor* t : {&w.dense_tensor(), &w.codes_tensor(), &w.scales_tensor()}) {
      if (!t->empty()) out->push_back(Bytes(*backend, t->view()));
    }
  }
  for (const Tensor& t : plain) out->push_back(Bytes(*backend, t.view()));
  return status;
}

// Per fixture (FP8 block-scaled, INT4 group, bf16), rank 1 of 2 (row and column slices), kept
// quantized and dequantized at load: the same bytes with every ring.
TEST_F(PinnedLoadTest, LoadedTensorsAreBitwiseTheSameWithEveryRing) {
  for (const char* fixture : {"v3_fp8", "k25_int4", "v2lite_greedy"}) {
    for (const std::optional<bool> keep : {std::optional<bool>(), std::optional<bool>(false)}) {
      std::vector<std::vector<uint8_t>> want;
      for (const RingCase& ring : kRings) {
        SCOPED_TRACE(std::string(fixture) + ", " + ring.name + (keep.has_value() ? ", dequantized" : ", kept"));
        std::vector<std::vector<uint8_t>> got;
        const absl::Status st = LoadRank(kGolden + fixture, ring.bytes, 2, 1, keep, std::nullopt, &got);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_FALSE(got.empty());
        if (want.empty()) {
          want = std::move(got);
          continue;
        }
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "tensor " << i;
      }
    }
  }
}

// A load that fails at its last tensor (one the checkpoint lacks), with the transfers of the others
// still in flight from the ring: NotFound naming the tensor, no fault, and the tensors enqueued
// before it arrive intact.
TEST_F(PinnedLoadTest, LoadFailingMidwayLeavesEarlierTransfersIntact) {
  const std::string dir = kGolden + "v3_fp8";
  std::vector<std::vector<uint8_t>> want;
  ASSERT_TRUE(LoadRank(dir, 0, 1, 0, std::nullopt, std::nullopt, &want).ok());
  const WeightSpec missing{.name = "model.layers.0.mlp.not_in_the_checkpoint.weight", .shape = Shape{8}};
  for (const RingCase& ring : kRings) {
    SCOPED_TRACE(ring.name);
    std::vector<std::vector<uint8_t>> got;
    const absl::Status st = LoadRank(dir, ring.bytes, 1, 0, std::nullopt, missing, &got);
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
    EXPECT_NE(st.message().find(missing.name), std::string::npos) << st;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "tensor " << i;
  }
}

// The whole target through TargetModel::Create (MlaBlock's host-converted W_UK, stacked inputs,
// the MoE experts and shared expert, kept quantized): the same logits, bit for bit, with every ring.
TEST_F(PinnedLoadTest, TargetLogitsAreBitwiseTheSameWithEveryRing) {
  for (const char* fixture : {"v3_fp8", "k25_int4"}) {
    const std::string dir = kGolden + fixture;
    auto config = DeepseekV2Config::FromFile(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    const int64_t t = 9;
    std::vector<int64_t> tokens(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) tokens[static_cast<size_t>(i)] = (7 * i + 3) % config->vocab_size;
    std::vector<float> want;
    for (const RingCase& ring : kRings) {
      SCOPED_TRACE(std::string(fixture) + ", " + ring.name);
      auto backend = cuda::CudaBackend::Create({.upload_ring_bytes = ring.bytes});
      ASSERT_TRUE(backend.ok()) << backend.status();
      TargetModelOptions o;
      o.max_tokens_per_forward = t;
      o.max_context_len = t;
      o.page_size = 4;
      o.num_kv_pages = (t + 3) / 4;
      auto model = TargetModel::Create(dir, o, nullptr, backend->get());
      ASSERT_TRUE(model.ok()) << model.status();
      EXPECT_GT((*model)->load_stats().tensors, 0);
      std::vector<int32_t> pages(static_cast<size_t>(o.num_kv_pages));
      for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);
      SequenceInput in;
      in.tokens = tokens;
      in.page_table = pages;
      in.all_logits = true;
      std::vector<float> logits(static_cast<size_t>(t * config->vocab_size));
      ASSERT_TRUE((*model)
                      ->Forward(std::span<const SequenceInput>(&in, 1),
                                TensorView(logits.data(), DType::kF32, Shape{t, config->vocab_size}))
                      .ok());
      if (want.empty()) {
        want = std::move(logits);
        continue;
      }
      ASSERT_EQ(logits.size(), want.size());
      EXPECT_EQ(std::memcmp(logits.data(), want.data(), logits.size() * sizeof(float)), 0);
    }
  }
}

}  // namespace
}  // namespace eagle3
