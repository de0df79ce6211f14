// Weight loads through CudaBackend's UploadRing (pinned memory the checkpoint is read into, uploads
// enqueued from it): bitwise the same device tensors and logits as loads without a ring
// (CudaBackendOptions::upload_ring_bytes = 0); a ring small enough that most tensors wrap it many
// times and the larger ones fall back; uploads behind a stalled stream (the ring must wait for its
// transfers before reusing memory); a load failing midway with transfers in flight. And the same
// for the weight arena the tensors are allocated from (CudaBackendOptions::weight_arena_chunk_bytes:
// off, the default, and chunks so small that the fixtures span many and their largest tensors
// bypass them), and the arena's options. And the target's logits with the quantized weights' codes
// in warp tiles (the default) against row-major ones (CudaBackendOptions::quant_moe_tiled_experts,
// quant_gemm_tiled_weights).
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
#include "eagle3/chunk_arena.h"
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

// The weight arenas compared: none (a cudaMalloc per tensor), the default, and 16 KiB chunks: the
// fixtures' weights (under 1 MB a rank, so the default arena takes them in one chunk) then fill
// many chunks, and their embedding and lm_head shards (25-44 KB, over half a chunk) bypass them.
struct ArenaCase {
  size_t chunk_bytes;
  const char* name;
};
constexpr ArenaCase kArenas[] = {{0, "no arena"},
                                 {cuda::CudaBackendOptions{}.weight_arena_chunk_bytes, "default arena"},
                                 {16 << 10, "16 KiB arena"}};

// The backend's weight arena; nullptr when it has none (weight_allocator() is allocator()).
const ChunkArena* WeightArena(cuda::CudaBackend& backend) {
  return dynamic_cast<const ChunkArena*>(&backend.weight_allocator());
}

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

// The first load's tensors become `want`; every later load's must be the same bytes.
void ExpectSameAsFirst(std::vector<std::vector<uint8_t>>* want, std::vector<std::vector<uint8_t>> got) {
  if (want->empty()) {
    *want = std::move(got);
    return;
  }
  ASSERT_EQ(got.size(), want->size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], (*want)[i]) << "tensor " << i;
}

// The first run's logits become `want`; every later run's must be the same bits.
void ExpectSameLogitsAsFirst(std::vector<float>* want, std::vector<float> got) {
  if (want->empty()) {
    *want = std::move(got);
    return;
  }
  ASSERT_EQ(got.size(), want->size());
  EXPECT_EQ(std::memcmp(got.data(), want->data(), got.size() * sizeof(float)), 0);
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
// load fail there, after every other has been enqueued). Returns the load's status. `arena`, when
// not null, receives the backend's weight arena's stats with every tensor loaded (before they are
// freed) and `arena_after` after they are freed (both zero without an arena).
absl::Status LoadRank(const std::string& dir, const cuda::CudaBackendOptions& options, int tp, int rank,
                      std::optional<bool> keep_quantized, const std::optional<WeightSpec>& extra,
                      std::vector<std::vector<uint8_t>>* out, ChunkArenaStats* arena = nullptr,
                      ChunkArenaStats* arena_after = nullptr) {
  EAGLE3_ASSIGN_OR_RETURN(auto backend, cuda::CudaBackend::Create(options));
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
  const ChunkArena* weight_arena = WeightArena(*backend);
  if (arena != nullptr && weight_arena != nullptr) *arena = weight_arena->stats();
  linear.clear();
  plain.clear();
  if (arena_after != nullptr && weight_arena != nullptr) *arena_after = weight_arena->stats();
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
        const absl::Status st =
            LoadRank(kGolden + fixture, {.upload_ring_bytes = ring.bytes}, 2, 1, keep, std::nullopt, &got);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_FALSE(got.empty());
        ExpectSameAsFirst(&want, std::move(got));
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
  ASSERT_TRUE(LoadRank(dir, {.upload_ring_bytes = 0}, 1, 0, std::nullopt, std::nullopt, &want).ok());
  const WeightSpec missing{.name = "model.layers.0.mlp.not_in_the_checkpoint.weight", .shape = Shape{8}};
  for (const RingCase& ring : kRings) {
    SCOPED_TRACE(ring.name);
    std::vector<std::vector<uint8_t>> got;
    const absl::Status st = LoadRank(dir, {.upload_ring_bytes = ring.bytes}, 1, 0, std::nullopt, missing, &got);
    EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
    EXPECT_NE(st.message().find(missing.name), std::string::npos) << st;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "tensor " << i;
  }
}

// Logits of `t` tokens through the whole target loaded by TargetModel::Create (MlaBlock's
// host-converted W_UK, stacked inputs, the MoE experts and shared expert, kept quantized) on a
// backend made with `options`.
void TargetLogits(const std::string& dir, const cuda::CudaBackendOptions& options, std::vector<float>* logits,
                  int64_t* tiled_tensors = nullptr) {
  auto config = DeepseekV2Config::FromFile(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t t = 9;
  std::vector<int64_t> tokens(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) tokens[static_cast<size_t>(i)] = (7 * i + 3) % config->vocab_size;
  auto backend = cuda::CudaBackend::Create(options);
  ASSERT_TRUE(backend.ok()) << backend.status();
  TargetModelOptions o;
  o.max_tokens_per_forward = t;
  o.max_context_len = t;
  o.page_size = 4;
  o.num_kv_pages = (t + 3) / 4;
  auto model = TargetModel::Create(dir, o, nullptr, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_GT((*model)->load_stats().tensors, 0);
  if (tiled_tensors != nullptr) *tiled_tensors = (*model)->load_stats().tiled_tensors;
  std::vector<int32_t> pages(static_cast<size_t>(o.num_kv_pages));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);
  SequenceInput in;
  in.tokens = tokens;
  in.page_table = pages;
  in.all_logits = true;
  logits->assign(static_cast<size_t>(t * config->vocab_size), 0.0f);
  ASSERT_TRUE((*model)
                  ->Forward(std::span<const SequenceInput>(&in, 1),
                            TensorView(logits->data(), DType::kF32, Shape{t, config->vocab_size}))
                  .ok());
  if (const ChunkArena* arena = WeightArena(**backend); arena != nullptr) {
    EXPECT_GT(arena->stats().pieces, 0);  // the model's weights are in it
  }
}

// The same logits, bit for bit, with every ring.
TEST_F(PinnedLoadTest, TargetLogitsAreBitwiseTheSameWithEveryRing) {
  for (const char* fixture : {"v3_fp8", "k25_int4"}) {
    std::vector<float> want;
    for (const RingCase& ring : kRings) {
      SCOPED_TRACE(std::string(fixture) + ", " + ring.name);
      std::vector<float> logits;
      ASSERT_NO_FATAL_FAILURE(TargetLogits(kGolden + fixture, {.upload_ring_bytes = ring.bytes}, &logits));
      ExpectSameLogitsAsFirst(&want, std::move(logits));
    }
  }
}

TEST_F(PinnedLoadTest, WeightArenaComesFromTheOptions) {
  auto off = cuda::CudaBackend::Create({.weight_arena_chunk_bytes = 0});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(&(*off)->weight_allocator(), &(*off)->allocator());
  auto on = cuda::CudaBackend::Create();
  ASSERT_TRUE(on.ok()) << on.status();
  const ChunkArena* arena = WeightArena(**on);
  ASSERT_NE(arena, nullptr);
  EXPECT_EQ(arena->options().chunk_bytes, cuda::CudaBackendOptions{}.weight_arena_chunk_bytes);
  EXPECT_EQ((*on)->weight_allocator().device(), (*on)->device());
  {
    Tensor t = *Tensor::Empty(DType::kU8, Shape{100}, (*on)->weight_allocator());
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, t.data()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attributes.device, 0);
    EXPECT_EQ(arena->stats().chunks, 1);
  }
  EXPECT_EQ(arena->stats().chunks, 0);  // the chunk went back with its last tensor
  auto bad = cuda::CudaBackend::Create({.weight_arena_chunk_bytes = 100});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("weight_arena_chunk_bytes (100"), std::string_view::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("at least max_alignment (256)"), std::string_view::npos) << bad.status();
}

// Per fixture, rank 1 of 2, kept quantized and dequantized at load: the same bytes with every
// arena; the small one spans many chunks and sends the largest tensors around them, and every chunk
// goes back once the tensors are freed.
TEST_F(PinnedLoadTest, LoadedTensorsAreBitwiseTheSameWithEveryArena) {
  for (const char* fixture : {"v3_fp8", "k25_int4", "v2lite_greedy"}) {
    for (const std::optional<bool> keep : {std::optional<bool>(), std::optional<bool>(false)}) {
      std::vector<std::vector<uint8_t>> want;
      for (const ArenaCase& arena : kArenas) {
        SCOPED_TRACE(std::string(fixture) + ", " + arena.name + (keep.has_value() ? ", dequantized" : ", kept"));
        std::vector<std::vector<uint8_t>> got;
        ChunkArenaStats loaded, freed;
        const absl::Status st = LoadRank(kGolden + fixture, {.weight_arena_chunk_bytes = arena.chunk_bytes}, 2, 1,
                                         keep, std::nullopt, &got, &loaded, &freed);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_FALSE(got.empty());
        if (arena.chunk_bytes == (16 << 10)) {
          EXPECT_GT(loaded.chunk_allocations, 3);
          EXPECT_GT(loaded.direct, 0);
        } else if (arena.chunk_bytes > 0) {
          EXPECT_EQ(loaded.chunk_allocations, 1);
          EXPECT_EQ(loaded.direct, 0);
        }
        EXPECT_EQ(freed.chunks, 0);
        EXPECT_EQ(freed.direct, 0);
        ExpectSameAsFirst(&want, std::move(got));
      }
    }
  }
}

// Parts loaded only to be stacked (WeightLoader::LoadStackedLinear) come from allocator() and are
// freed after the stack: the arena holds the stacked weight alone. The fixture's FP8 q_a (48 rows,
// not whole 128-row blocks) does not stack kept quantized: its parts then stay outside the arena,
// where a weight loaded alone goes in.
TEST_F(PinnedLoadTest, StackedPartsStayOutsideTheArena) {
  const std::string dir = kGolden + "v3_fp8";
  auto backend = cuda::CudaBackend::Create();
  ASSERT_TRUE(backend.ok()) << backend.status();
  const ChunkArena* arena = WeightArena(**backend);
  ASSERT_NE(arena, nullptr);
  auto config = DeepseekV2Config::FromFile(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const std::vector<WeightSpec> specs = DeepseekV2Weights(*config);
  WeightLoader loader(**checkpoint, config->quantization, specs, StoredForms(*config, specs), 1, 0, **backend);
  auto q_a = loader.Spec("model.layers.0.self_attn.q_a_proj.weight");
  auto kv_a = loader.Spec("model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  ASSERT_TRUE(q_a.ok() && kv_a.ok()) << q_a.status() << kv_a.status();
  const WeightSpec pair[] = {*q_a, *kv_a};
  {
    loader.set_keep_quantized(false);
    auto stacked = loader.LoadStackedLinear(pair, DType::kBF16);
    ASSERT_TRUE(stacked.ok()) << stacked.status();
    ASSERT_EQ(stacked->size(), 1u);
    EXPECT_EQ(arena->stats().pieces, 1);
  }
  EXPECT_EQ(arena->stats().chunks, 0);
  {
    loader.set_keep_quantized(std::nullopt);
    auto parts = loader.LoadStackedLinear(pair, DType::kBF16);
    ASSERT_TRUE(parts.ok()) << parts.status();
    ASSERT_EQ(parts->size(), 2u);
    EXPECT_TRUE((*parts)[0].quantized());
    EXPECT_EQ(arena->stats().pieces, 0);
    auto alone = loader.LoadLinear(*q_a, DType::kBF16);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(arena->stats().pieces, 2);  // its codes and scales
  }
  ASSERT_TRUE((*backend)->Synchronize().ok());
}

// The whole target: the same logits, bit for bit, with every arena.
TEST_F(PinnedLoadTest, TargetLogitsAreBitwiseTheSameWithEveryArena) {
  for (const char* fixture : {"v3_fp8", "k25_int4", "v2lite_greedy"}) {
    std::vector<float> want;
    for (const ArenaCase& arena : kArenas) {
      SCOPED_TRACE(std::string(fixture) + ", " + arena.name);
      std::vector<float> logits;
      ASSERT_NO_FATAL_FAILURE(TargetLogits(kGolden + fixture, {.weight_arena_chunk_bytes = arena.chunk_bytes}, &logits));
      ExpectSameLogitsAsFirst(&want, std::move(logits));
    }
  }
}

// Quantized weights kept in warp tiles (the default: routed experts and QuantizedGemm's weights)
// against row-major (quant_moe_tiled_experts and quant_gemm_tiled_weights off) and against tiled
// experts only: the same logits, bit for bit, and the loads say how many tensors they tiled (the
// fixtures' weights are on the GEMV's layout at TP 1, so both kinds are tiled; the INT4 fixture, as
// Kimi's checkpoints, quantizes its routed experts alone).
TEST_F(PinnedLoadTest, TargetLogitsAreBitwiseTheSameWithTiledWeights) {
  struct TileCase {
    bool experts, gemm;
    const char* name;
  };
  for (const char* fixture : {"v3_fp8", "k25_int4"}) {
    std::vector<float> want;
    int64_t experts_only = 0;
    for (const TileCase& tiles : {TileCase{false, false, "row-major"}, TileCase{true, false, "tiled experts"},
                                  TileCase{true, true, "tiled experts and gemm weights"}}) {
      SCOPED_TRACE(std::string(fixture) + ", " + tiles.name);
      std::vector<float> logits;
      int64_t tiled_tensors = -1;
      ASSERT_NO_FATAL_FAILURE(TargetLogits(
          kGolden + fixture, {.quant_moe_tiled_experts = tiles.experts, .quant_gemm_tiled_weights = tiles.gemm},
          &logits, &tiled_tensors));
      if (!tiles.experts) {
        EXPECT_EQ(tiled_tensors, 0);
      } else if (!tiles.gemm) {
        EXPECT_GT(tiled_tensors, 0);
        EXPECT_EQ(tiled_tensors % 3, 0);  // gate, up and down of each routed expert
        experts_only = tiled_tensors;
      } else if (std::string(fixture) == "v3_fp8") {
        EXPECT_GT(tiled_tensors, experts_only);
      } else {
        EXPECT_EQ(tiled_tensors, experts_only);
      }
      ExpectSameLogitsAsFirst(&want, std::move(logits));
    }
  }
}

}  // namespace
}  // namespace eagle3
