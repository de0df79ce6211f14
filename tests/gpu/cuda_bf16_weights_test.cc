// bf16 weight storage on the CUDA backend (docs/architecture.md): f32 x bf16 Gemm, bf16 routed experts, a bf16
// embedding table, and the target / draft models loaded in bf16, each against the CPU reference on
// the same values widened to f32.
//
// Tolerances (max |gpu - cpu| / max |cpu|):
//  - Gemm: the CPU runs on bf16(a) and the f32 value of b, so every product is exact in fp32 on both
//    sides (8-bit x 8-bit significands) and only the fp32 summation order differs: 2e-5.
//  - MoeExperts: bf16 weights widened exactly, x and act f32 on both sides: summation order, 1e-5.
//  - EmbeddingLookup: exact.
//  - TargetModel / DraftModel: the checkpoints are bf16, so the weights are the same values on both
//    sides; what differs is the GPU's rounding of every Gemm activation to bf16 (relative 2^-9 per
//    element), compounded over the layers: logits within 3e-2.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "eagle3/draft_model.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/half.h"
#include "eagle3/speculative_decoder.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "parity_util.h"
#include "scoped_temp_dir.h"
#include "speculative_greedy_check.h"

namespace eagle3::parity {
namespace {

const std::string kGolden = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/";

// Fast reproducible uniform values in [-scale, scale) (large weights: mt19937 normals are too slow).
void FillUniform(float* out, int64_t n, uint64_t seed, float scale) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    out[i] = scale * (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// A host tensor's bf16 bits, and (in place) `f` rounded to the values those bits hold.
Tensor RoundToBf16(Tensor& f) {
  Tensor bits = *Tensor::Empty(DType::kBF16, f.shape());
  for (int64_t i = 0; i < f.numel(); ++i) {
    bits.data_as<uint16_t>()[i] = FloatToBf16(f.data_as<float>()[i]);
    f.data_as<float>()[i] = Bf16ToFloat(bits.data_as<uint16_t>()[i]);
  }
  return bits;
}

TensorView Strided(const Tensor& t, int64_t rows, int64_t cols, int64_t offset) {
  return TensorView(static_cast<char*>(t.data()) + offset * DTypeSize(t.dtype()), t.dtype(), Shape{rows, cols},
                    Shape{t.dim(1), 1}, t.device());
}

class CudaBf16WeightsTest : public ParityTest {
 protected:
  // [rows, cols] uniform f32 on the host (cols may exceed the view a test takes).
  static Tensor Uniform(int64_t rows, int64_t cols, uint64_t seed, float scale = 1.0f) {
    Tensor t = *Tensor::Empty(DType::kF32, Shape{rows, cols});
    FillUniform(t.data_as<float>(), t.numel(), seed, scale);
    return t;
  }
  // c = Gemm(a, b) on both backends from the same start; returns the relative error. a: f32 (the
  // GPU gets it as is, the CPU its bf16-rounded copy), b: bf16 on the GPU, its f32 values on the CPU.
  double MixedGemm(const TensorView& a_gpu, const TensorView& a_cpu, const TensorView& b_gpu,
                   const TensorView& b_cpu, const Tensor& c_start) {
    Tensor c_gpu = Upload(c_start);
    Tensor c_cpu = *Tensor::Empty(DType::kF32, c_start.shape());
    std::copy_n(c_start.data_as<float>(), c_start.numel(), c_cpu.data_as<float>());
    const absl::Status gpu = gpu_->Gemm(a_gpu, b_gpu, c_gpu, {});
    EXPECT_TRUE(gpu.ok()) << gpu;
    const absl::Status cpu = cpu_.Gemm(a_cpu, b_cpu, c_cpu, {});
    EXPECT_TRUE(cpu.ok()) << cpu;
    return RelError(Download(c_gpu), c_cpu);
  }
  // The body of SpeculativeGreedyEqualsPlainGreedyInBf16 for one target cache dtype.
  void ExpectSpeculativeGreedyInBf16(DType kv_cache_dtype);
};

// The rounded copy of a host f32 activation that the CPU reference multiplies.
Tensor Bf16Rounded(const TensorView& a) {
  Tensor r = *Tensor::Empty(DType::kF32, a.shape());
  for (int64_t i = 0; i < a.dim(0); ++i) {
    for (int64_t j = 0; j < a.dim(1); ++j) {
      r.data_as<float>()[i * a.dim(1) + j] = Bf16ToFloat(FloatToBf16(a.data_as<float>()[i * a.stride(0) + j]));
    }
  }
  return r;
}

TEST_F(CudaBf16WeightsTest, BackendPrefersBf16Weights) {
  EXPECT_EQ(gpu_->preferred_weight_dtype(), DType::kBF16);
  EXPECT_EQ(cpu_.preferred_weight_dtype(), DType::kF32);
}

// Decode and prefill shapes of V3: M 1 / 16 / 64, N 7168, K 7168 (attention out) and 21504.
TEST_F(CudaBf16WeightsTest, MixedGemmMatchesCpuOnRoundedActivations) {
  const int64_t n = 7168;
  for (const int64_t k : {int64_t{7168}, int64_t{21504}}) {
    Tensor b = Uniform(n, k, 40 + k, 1.0f / std::sqrt(static_cast<float>(k)));
    Tensor b_bits = RoundToBf16(b);
    Tensor b_gpu = Upload(b_bits);
    for (const int64_t m : {int64_t{1}, int64_t{16}, int64_t{64}}) {
      SCOPED_TRACE(::testing::Message() << "M " << m << " N " << n << " K " << k);
      Tensor a = Uniform(m, k, 50 + m);
      Tensor a_gpu = Upload(a);
      Tensor a_cpu = Bf16Rounded(a);
      Tensor c = Uniform(m, n, 60);
      EXPECT_LE(MixedGemm(a_gpu, a_cpu, b_gpu, b, c), 2e-5);
    }
  }
}

// Row-strided a, b and c at odd offsets, a bias, alpha and beta != 0.
TEST_F(CudaBf16WeightsTest, MixedGemmRowStridedWithBiasAndBeta) {
  const int64_t m = 16, n = 96, k = 520;
  Tensor a_wide = Uniform(m, k + 5, 70);
  Tensor b_wide = Uniform(n, k + 3, 71, 0.05f);
  Tensor b_bits = RoundToBf16(b_wide);
  Tensor a_dev = Upload(a_wide), b_dev = Upload(b_bits);
  const TensorView a_gpu = Strided(a_dev, m, k, 3), a_host = Strided(a_wide, m, k, 3);
  const TensorView b_gpu = Strided(b_dev, n, k, 1), b_cpu = Strided(b_wide, n, k, 1);
  Tensor a_cpu = Bf16Rounded(a_host);
  Tensor bias = Uniform(1, n, 72);
  Tensor bias_1d = *Tensor::Empty(DType::kF32, Shape{n});
  std::copy_n(bias.data_as<float>(), n, bias_1d.data_as<float>());
  Tensor c_wide = Uniform(m, n + 3, 73);
  Tensor c_gpu = Upload(c_wide);
  const TensorView c_gpu_view = Strided(c_gpu, m, n, 2), c_cpu_view = Strided(c_wide, m, n, 2);
  Tensor bias_gpu = Upload(bias_1d);
  const TensorView bias_gpu_view = bias_gpu.view(), bias_cpu_view = bias_1d.view();
  ASSERT_TRUE(gpu_->Gemm(a_gpu, b_gpu, c_gpu_view, {0.75f, 0.5f, &bias_gpu_view}).ok());
  ASSERT_TRUE(cpu_.Gemm(a_cpu, b_cpu, c_cpu_view, {0.75f, 0.5f, &bias_cpu_view}).ok());
  Tensor got = Download(c_gpu);
  EXPECT_LE(RelError(got, c_wide), 2e-5);
  // The columns beyond the view are untouched.
  for (int64_t i = 0; i < m; ++i) {
    for (const int64_t j : {int64_t{0}, int64_t{1}, n + 2}) {
      EXPECT_EQ(got.data_as<float>()[i * (n + 3) + j], c_wide.data_as<float>()[i * (n + 3) + j]);
    }
  }
}

// The activation scratch grows eagerly but never during a capture (FailedPrecondition naming the
// size), and a graph captured on an outgrown buffer still replays correctly (it is never freed).
TEST_F(CudaBf16WeightsTest, ActivationScratchGrowthAndCapture) {
  auto created = cuda::CudaBackend::Create({.activation_scratch_bytes = 0});
  ASSERT_TRUE(created.ok()) << created.status();
  cuda::CudaBackend& gpu = **created;
  const int64_t n = 64, k = 256;
  Tensor b = Uniform(n, k, 80, 0.1f);
  Tensor b_bits = RoundToBf16(b);
  Tensor b_gpu = *Tensor::Empty(DType::kBF16, b.shape(), gpu.allocator());
  ASSERT_TRUE(gpu.Copy(b_bits, b_gpu).ok());
  const auto upload = [&](const Tensor& host) {
    Tensor d = *Tensor::Empty(host.dtype(), host.shape(), gpu.allocator());
    EXPECT_TRUE(gpu.Copy(host, d).ok());
    return d;
  };
  const auto download = [&](const Tensor& dev) {
    Tensor h = *Tensor::Empty(dev.dtype(), dev.shape());
    EXPECT_TRUE(gpu.Copy(dev, h).ok());
    EXPECT_TRUE(gpu.Synchronize().ok());
    return h;
  };
  const auto want = [&](const Tensor& a) {
    Tensor a_cpu = Bf16Rounded(a);
    Tensor c = *Tensor::Empty(DType::kF32, Shape{a.dim(0), n});
    EXPECT_TRUE(cpu_.Gemm(a_cpu, b, c, {}).ok());
    return c;
  };
  Tensor a_small = Uniform(2, k, 81), a_large = Uniform(32, k, 82);
  Tensor a_small_gpu = upload(a_small), a_large_gpu = upload(a_large);
  Tensor c_small = *Tensor::Empty(DType::kF32, Shape{2, n}, gpu.allocator());
  Tensor c_large = *Tensor::Empty(DType::kF32, Shape{32, n}, gpu.allocator());

  // First need (small), eagerly: allocates. Then capture the small Gemm on that buffer.
  ASSERT_TRUE(gpu.Gemm(a_small_gpu, b_gpu, c_small, {}).ok());
  ASSERT_TRUE(gpu.Synchronize().ok());
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(gpu.stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status captured_small = gpu.Gemm(a_small_gpu, b_gpu, c_small, {});
  // A larger activation inside the capture would need a larger buffer: refused, naming the size.
  const absl::Status captured_large = gpu.Gemm(a_large_gpu, b_gpu, c_large, {});
  ASSERT_EQ(cudaStreamEndCapture(gpu.stream(), &graph), cudaSuccess);
  EXPECT_TRUE(captured_small.ok()) << captured_small;
  EXPECT_EQ(captured_large.code(), absl::StatusCode::kFailedPrecondition) << captured_large;
  EXPECT_TRUE(absl::StrContains(captured_large.message(), std::to_string(32 * k * 2) + " bytes"))
      << captured_large;
  EXPECT_TRUE(absl::StrContains(captured_large.message(), "captured")) << captured_large;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  // Eagerly the large one grows the scratch (a new buffer); the graph still reads the old one.
  ASSERT_TRUE(gpu.Gemm(a_large_gpu, b_gpu, c_large, {}).ok());
  EXPECT_LE(RelError(download(c_large), want(a_large)), 2e-5);
  ASSERT_TRUE(gpu.Copy(*Tensor::Zeros(DType::kF32, Shape{2, n}), c_small).ok());
  ASSERT_EQ(cudaGraphLaunch(exec, gpu.stream()), cudaSuccess);
  EXPECT_LE(RelError(download(c_small), want(a_small)), 2e-5);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---- MoeExperts --------------------------------------------------------------------------------

struct Bf16Experts {
  Tensor gate_up_bits, down_bits;  // device, all experts stacked
  std::vector<ExpertWeights> device;
  std::vector<ExpertWeights> host;  // f32 values of the bf16 weights (unused experts: a dummy)
  std::vector<Tensor> host_storage;
};

class CudaBf16MoeTest : public CudaBf16WeightsTest {
 protected:
  // `num` experts of [2I, H] / [H, I] bf16 weights (row pad `pad` elements); host f32 copies only of
  // the experts `ids` names (the CPU reference reads no other).
  Bf16Experts Make(int64_t num, int64_t hidden, int64_t inter, int64_t pad, const Tensor& ids, uint64_t seed) {
    Bf16Experts x;
    Tensor gate_up = Uniform(num * 2 * inter, hidden + pad, seed, 1.0f / std::sqrt(static_cast<float>(hidden)));
    Tensor down = Uniform(num * hidden, inter + pad, seed + 1, 1.0f / std::sqrt(static_cast<float>(inter)));
    Tensor gate_up_bits = RoundToBf16(gate_up), down_bits = RoundToBf16(down);
    x.gate_up_bits = Upload(gate_up_bits);
    x.down_bits = Upload(down_bits);
    std::vector<bool> used(static_cast<size_t>(num), false);
    for (int64_t i = 0; i < ids.numel(); ++i) used[static_cast<size_t>(ids.data_as<int32_t>()[i])] = true;
    Tensor dummy_gate_up = *Tensor::Zeros(DType::kF32, Shape{2 * inter, hidden});
    Tensor dummy_down = *Tensor::Zeros(DType::kF32, Shape{hidden, inter});
    for (int64_t e = 0; e < num; ++e) {
      x.device.push_back({x.gate_up_bits.view().Narrow(0, e * 2 * inter, 2 * inter).Narrow(1, 0, hidden),
                          x.down_bits.view().Narrow(0, e * hidden, hidden).Narrow(1, 0, inter)});
      if (!used[static_cast<size_t>(e)]) {
        x.host.push_back({dummy_gate_up.view(), dummy_down.view()});
        continue;
      }
      x.host.push_back({gate_up.view().Narrow(0, e * 2 * inter, 2 * inter).Narrow(1, 0, hidden),
                        down.view().Narrow(0, e * hidden, hidden).Narrow(1, 0, inter)});
    }
    for (Tensor* t : {&gate_up, &down, &dummy_gate_up, &dummy_down}) x.host_storage.push_back(std::move(*t));
    return x;
  }

  static void Routing(int64_t tokens, int64_t k, int64_t num, uint32_t seed, Tensor* ids, Tensor* weights) {
    *ids = *Tensor::Empty(DType::kI32, Shape{tokens, k});
    *weights = *Tensor::Empty(DType::kF32, Shape{tokens, k});
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> w(0.05f, 1.0f);
    std::vector<int32_t> all(static_cast<size_t>(num));
    std::iota(all.begin(), all.end(), 0);
    for (int64_t t = 0; t < tokens; ++t) {
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < k; ++j) {
        ids->data_as<int32_t>()[t * k + j] = all[static_cast<size_t>(j % num)];
        weights->data_as<float>()[t * k + j] = w(rng);
      }
    }
  }

  // One expert set (made once: large at V3 shapes) for every token count.
  void RunCase(int64_t num, int64_t hidden, int64_t inter, int64_t top_k, int64_t pad,
               std::initializer_list<int64_t> token_counts) {
    std::vector<Tensor> ids, weights;
    int64_t total = 0;
    for (const int64_t tokens : token_counts) {
      ids.emplace_back();
      weights.emplace_back();
      Routing(tokens, top_k, num, static_cast<uint32_t>(hidden + tokens), &ids.back(), &weights.back());
      total += ids.back().numel();
    }
    Tensor all_ids = *Tensor::Empty(DType::kI32, Shape{total});
    int64_t at = 0;
    for (const Tensor& t : ids) {
      std::copy_n(t.data_as<int32_t>(), t.numel(), all_ids.data_as<int32_t>() + at);
      at += t.numel();
    }
    const Bf16Experts experts = Make(num, hidden, inter, pad, all_ids, static_cast<uint64_t>(hidden * 7 + inter));
    for (size_t c = 0; c < ids.size(); ++c) {
      const int64_t tokens = ids[c].dim(0);
      SCOPED_TRACE(::testing::Message() << "E " << num << " H " << hidden << " I " << inter << " k " << top_k
                                        << " pad " << pad << " T " << tokens);
      Tensor x = Uniform(tokens, hidden, 90);
      Tensor x_gpu = Upload(x), ids_gpu = Upload(ids[c]), weights_gpu = Upload(weights[c]);
      for (const bool accumulate : {false, true}) {
        Tensor out = Uniform(tokens, hidden, 91);
        Tensor out_gpu = Upload(out);
        ASSERT_TRUE(gpu_->MoeExperts(x_gpu, ids_gpu, weights_gpu, experts.device, out_gpu, accumulate).ok());
        ASSERT_TRUE(cpu_.MoeExperts(x, ids[c], weights[c], experts.host, out, accumulate).ok());
        EXPECT_LE(RelError(Download(out_gpu), out), 1e-5) << "accumulate " << accumulate;
      }
    }
    EXPECT_TRUE(gpu_->Synchronize().ok());
  }
};

// A DeepSeek-V3 TP8 rank: 256 experts, I 2048 / 8 = 256, H 7168, top 8 (16-byte loads).
TEST_F(CudaBf16MoeTest, V3Tp8RankShapeMatchesCpu) {
  RunCase(256, 7168, 256, 8, 0, {1, 4});
}

// Small shapes, incl. rows that are not 16-byte aligned (the scalar path) and H not a multiple of 8.
TEST_F(CudaBf16MoeTest, SmallAndUnalignedShapesMatchCpu) {
  RunCase(8, 64, 32, 2, 0, {5, 64});
  RunCase(8, 64, 32, 2, 3, {5});  // row stride 67 / 35: unaligned rows
  RunCase(6, 37, 11, 3, 0, {7});  // H and I not multiples of 8
}

TEST_F(CudaBf16MoeTest, MixedExpertDtypesAreRefusedNamingTheExpert) {
  Tensor ids = *Tensor::Zeros(DType::kI32, Shape{2, 1});
  const Bf16Experts experts = Make(3, 16, 8, 0, ids, 5);
  Tensor f32_down = Upload(*Tensor::Zeros(DType::kF32, Shape{16, 8}));
  std::vector<ExpertWeights> mixed = experts.device;
  mixed[1].down = f32_down.view();
  Tensor x = Upload(Uniform(2, 16, 6)), ids_gpu = Upload(ids), w = Upload(Uniform(2, 1, 7));
  Tensor out = *Tensor::Empty(DType::kF32, Shape{2, 16}, gpu_->allocator());
  const absl::Status status = gpu_->MoeExperts(x, ids_gpu, w, mixed, out, false);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "experts[1].down")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "one dtype")) << status;
  std::vector<ExpertWeights> f16 = experts.device;
  for (ExpertWeights& e : f16) {
    e.gate_up = TensorView(e.gate_up.data(), DType::kF16, e.gate_up.shape(), e.gate_up.strides(), e.gate_up.device());
  }
  const absl::Status half = gpu_->MoeExperts(x, ids_gpu, w, f16, out, false);
  EXPECT_EQ(half.code(), absl::StatusCode::kInvalidArgument) << half;
  EXPECT_TRUE(absl::StrContains(half.message(), "f32 or bf16")) << half;
}

// ---- EmbeddingLookup ---------------------------------------------------------------------------

TEST_F(CudaBf16WeightsTest, Bf16EmbeddingIsExact) {
  const int64_t shard_rows = 50, hidden = 7168, vocab_start = 100, tokens = 64;
  Tensor table = Uniform(shard_rows, hidden + 3, 500);
  Tensor table_bits = RoundToBf16(table);
  Tensor table_gpu = Upload(table_bits);
  for (const DType id_type : {DType::kI32, DType::kI64}) {
    SCOPED_TRACE(std::string(DTypeName(id_type)));
    Tensor ids = RandomInts(id_type, Shape{tokens}, 501, 0, 300);  // most out of the shard
    Tensor ids_gpu = Upload(ids);
    Tensor out = *Tensor::Empty(DType::kF32, Shape{tokens, hidden});
    Tensor out_gpu = *Tensor::Empty(DType::kF32, Shape{tokens, hidden}, gpu_->allocator());
    ASSERT_TRUE(gpu_->EmbeddingLookup(ids_gpu, Strided(table_gpu, shard_rows, hidden, 1), vocab_start, out_gpu).ok());
    ASSERT_TRUE(cpu_.EmbeddingLookup(ids, Strided(table, shard_rows, hidden, 1), vocab_start, out).ok());
    Tensor got = Download(out_gpu);
    EXPECT_EQ(std::memcmp(got.data(), out.data(), out.nbytes()), 0);
  }
  // An f16 table is refused, naming it.
  const TensorView f16(table_gpu.data(), DType::kF16, Shape{shard_rows, hidden + 3}, gpu_->device());
  Tensor ids_gpu = Upload(RandomInts(DType::kI32, Shape{tokens}, 502, 0, 300));
  Tensor out_gpu = *Tensor::Empty(DType::kF32, Shape{tokens, hidden + 3}, gpu_->allocator());
  const absl::Status status = gpu_->EmbeddingLookup(ids_gpu, f16, 0, out_gpu);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "table")) << status;
}

// ---- Models ------------------------------------------------------------------------------------

double RelDiff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return diff / scale;
}

// Prefill of 12 tokens (all logits), then 3 decode steps, on `backend`: every step's logits.
absl::StatusOr<std::vector<std::vector<float>>> RunTarget(const std::string& dir, Backend* backend, DType weights,
                                                          AttentionPath path,
                                                          std::optional<DType> kv_cache_dtype = std::nullopt) {
  TargetModelOptions o;
  o.weight_dtype = weights;
  o.kv_cache_dtype = kv_cache_dtype;
  o.attention_path = path;
  o.max_tokens_per_forward = 16;
  o.max_context_len = 64;
  o.num_kv_pages = 16;
  o.page_size = 4;
  EAGLE3_ASSIGN_OR_RETURN(auto model, TargetModel::Create(dir, o, nullptr, backend));
  const int64_t vocab = model->config().vocab_size;
  const std::vector<int32_t> pages = {5, 1, 9, 3, 12, 0, 7, 2, 11, 4, 6, 8, 10, 13, 14, 15};
  std::vector<int64_t> prompt(12);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int64_t>((37 * i + 11) % vocab);
  std::vector<std::vector<float>> out;
  int64_t cache_len = 0;
  for (int step = 0; step < 4; ++step) {
    const std::vector<int64_t> tokens =
        step == 0 ? prompt : std::vector<int64_t>{static_cast<int64_t>((101 * step + 7) % vocab)};
    SequenceInput in;
    in.tokens = tokens;
    in.page_table = pages;
    in.cache_len = cache_len;
    in.all_logits = true;
    const int64_t rows = static_cast<int64_t>(tokens.size());
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    EAGLE3_RETURN_IF_ERROR(model->Forward(std::span<const SequenceInput>(&in, 1),
                                          TensorView(logits.data(), DType::kF32, Shape{rows, vocab})));
    out.push_back(std::move(logits));
    cache_len += rows;
  }
  return out;
}

// Random bf16 checkpoints with the goldens' configs (V2 q-LoRA YaRN group-limited; V3 noaux_tc,
// tied embeddings): the GPU in bf16 against the CPU in f32 on the same values.
TEST_F(CudaBf16WeightsTest, TargetModelInBf16MatchesCpuF32) {
  for (const char* name : {"v2_qlora_yarn", "v3_noaux"}) {
    auto config = DeepseekV2Config::FromFile(kGolden + name);
    ASSERT_TRUE(config.ok()) << config.status();
    ScopedTempDir dir;
    RandomCheckpointOptions options;
    options.seed = 7;
    options.dtype = DType::kBF16;
    ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(*config, dir.path(), options).ok());
    for (const AttentionPath path : {AttentionPath::kAuto, AttentionPath::kNonAbsorbed}) {
      SCOPED_TRACE(::testing::Message() << name << (path == AttentionPath::kAuto ? " absorbed" : " non-absorbed"));
      auto want = RunTarget(dir.path(), &cpu_, DType::kF32, path);
      ASSERT_TRUE(want.ok()) << want.status();
      auto got = RunTarget(dir.path(), gpu_.get(), DType::kBF16, path);
      ASSERT_TRUE(got.ok()) << got.status();
      auto got_f32 = RunTarget(dir.path(), gpu_.get(), DType::kF32, path);
      ASSERT_TRUE(got_f32.ok()) << got_f32.status();
      for (size_t s = 0; s < want->size(); ++s) {
        const double bf16_error = RelDiff((*got)[s], (*want)[s]);
        const double f32_error = RelDiff((*got_f32)[s], (*want)[s]);
        std::printf("  %s step %zu: bf16 rel. error %.2e (f32 %.2e)\n", name, s, bf16_error, f32_error);
        EXPECT_LT(bf16_error, 3e-2) << "step " << s;
        EXPECT_LT(f32_error, 1e-4) << "step " << s;
        EXPECT_GT(bf16_error, 0.0) << "step " << s << ": bf16 rounding left no trace (not bf16 at all?)";
      }
    }
  }
}

// A bf16 latent cache (f32 weights, to see the cache's rounding alone): the GPU (bf16 tensor-core
// latent kernel, online softmax) against the CPU reference of the same semantics (eagle3/backend.h),
// and both apart from the f32 cache by about bf16's precision.
TEST_F(CudaBf16WeightsTest, Bf16KvCacheMatchesTheCpuReference) {
  auto config = DeepseekV2Config::FromFile(kGolden + "v2_qlora_yarn");
  ASSERT_TRUE(config.ok()) << config.status();
  ScopedTempDir dir;
  RandomCheckpointOptions options;
  options.seed = 11;
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(*config, dir.path(), options).ok());
  for (const AttentionPath path : {AttentionPath::kAuto, AttentionPath::kNonAbsorbed}) {
    SCOPED_TRACE(path == AttentionPath::kAuto ? "absorbed" : "non-absorbed");
    auto want = RunTarget(dir.path(), &cpu_, DType::kF32, path, DType::kBF16);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = RunTarget(dir.path(), gpu_.get(), DType::kF32, path, DType::kBF16);
    ASSERT_TRUE(got.ok()) << got.status();
    auto f32_cache = RunTarget(dir.path(), &cpu_, DType::kF32, path);
    ASSERT_TRUE(f32_cache.ok()) << f32_cache.status();
    for (size_t s = 0; s < want->size(); ++s) {
      const double error = RelDiff((*got)[s], (*want)[s]);
      const double cache_effect = RelDiff((*want)[s], (*f32_cache)[s]);
      const double gpu_vs_f32 = RelDiff((*got)[s], (*f32_cache)[s]);
      std::printf("  step %zu: GPU vs CPU (bf16 cache) rel. error %.2e; GPU (bf16) vs CPU (f32 cache) %.2e; "
                  "bf16 vs f32 cache (CPU) %.2e\n", s, error, gpu_vs_f32, cache_effect);
      // The CPU measured ~3e-3 for the cache's effect on these logits (2026-12-01); the GPU must sit
      // nearer the bf16 reference than the f32 one (it rounds where the reference does).
      EXPECT_LT(error, 1e-2) << "step " << s;
      EXPECT_LT(error, gpu_vs_f32) << "step " << s << ": the GPU is nearer the f32 cache than the bf16 one";
      EXPECT_GT(cache_effect, 0.0) << "step " << s << ": the bf16 cache changed nothing";
      EXPECT_LT(cache_effect, 3e-2) << "step " << s;
    }
  }
}

// Speculative greedy == plain greedy on the GPU with both models in bf16 (same weights on both
// paths; the golden pair, chain and tree), with the target's latent cache in f32 and in bf16.
TEST_F(CudaBf16WeightsTest, SpeculativeGreedyEqualsPlainGreedyInBf16) {
  for (const DType cache : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(cache == DType::kF32 ? "f32 cache" : "bf16 cache");
    ExpectSpeculativeGreedyInBf16(cache);
  }
}

void CudaBf16WeightsTest::ExpectSpeculativeGreedyInBf16(DType kv_cache_dtype) {
  const std::string target_dir = kGolden + "v2_qlora_yarn", draft_dir = kGolden + "draft_v2";
  TargetModelOptions topt;
  topt.weight_dtype = DType::kBF16;
  topt.kv_cache_dtype = kv_cache_dtype;
  topt.max_tokens_per_forward = 64;
  topt.max_context_len = 96;
  topt.num_kv_pages = 96;
  topt.page_size = 3;
  auto target = TargetModel::Create(target_dir, topt, nullptr, gpu_.get());
  ASSERT_TRUE(target.ok()) << target.status();
  DraftModelOptions dopt;
  dopt.weight_dtype = DType::kBF16;
  dopt.max_tokens_per_forward = 64;
  dopt.max_context_len = 96;
  dopt.num_kv_pages = 96;
  dopt.page_size = 5;
  auto draft = DraftModel::Create(draft_dir, target_dir, dopt, nullptr, gpu_.get());
  ASSERT_TRUE(draft.ok()) << draft.status();
  // With a bf16 cache a rounding difference between a verify and a decode forward can move a cache
  // element across a bf16 rounding boundary, a change of up to the cache's own effect on the logits
  // (~3e-3 of the largest, Bf16KvCacheMatchesTheCpuReference): a near-tie is that close. With an f32
  // cache the outputs must be equal.
  ExpectSpeculativeGreedyEqualsPlain(target->get(), draft->get(), gpu_.get(), nullptr,
                                     kv_cache_dtype == DType::kBF16 ? 3e-3 : 0.0);
}

// A random bf16 draft on the golden V2 target's config: the GPU in bf16 against the CPU in f32.
TEST_F(CudaBf16WeightsTest, DraftModelInBf16MatchesCpuF32) {
  auto config = DeepseekV2Config::FromFile(kGolden + "v2_qlora_yarn");
  ASSERT_TRUE(config.ok()) << config.status();
  ScopedTempDir target_dir, draft_dir;
  RandomCheckpointOptions target_options;
  target_options.seed = 9;
  ASSERT_TRUE(WriteRandomDeepseekV2Checkpoint(*config, target_dir.path(), target_options).ok());
  RandomDraftCheckpointOptions draft_options;
  draft_options.seed = 10;
  draft_options.aux_layer_ids = {0, 1, 2};
  ASSERT_TRUE(WriteRandomEagle3DraftCheckpoint(*config, draft_dir.path(), draft_options).ok());
  const auto run = [&](Backend* backend, DType weights) -> absl::StatusOr<std::vector<float>> {
    DraftModelOptions o;
    o.weight_dtype = weights;
    o.max_tokens_per_forward = 16;
    o.max_context_len = 64;
    o.num_kv_pages = 16;
    o.page_size = 4;
    EAGLE3_ASSIGN_OR_RETURN(auto model, DraftModel::Create(draft_dir.path(), target_dir.path(), o, nullptr, backend));
    const int64_t t = 6, width = model->tap().width(), hidden = model->config().hidden_size;
    std::vector<float> aux(static_cast<size_t>(t * width));
    FillUniform(aux.data(), t * width, 11, 1.0f);
    std::vector<int64_t> tokens(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) tokens[static_cast<size_t>(i)] = (53 * i + 3) % config->vocab_size;
    const std::vector<int32_t> pages = {3, 0, 2, 1};
    DraftSequenceInput in;
    in.tokens = tokens;
    in.page_table = pages;
    in.all_logits = true;
    std::vector<float> logits(static_cast<size_t>(t * model->draft_vocab())), hidden_out(static_cast<size_t>(t * hidden));
    EAGLE3_RETURN_IF_ERROR(model->Forward(std::span<const DraftSequenceInput>(&in, 1),
                                          TensorView(aux.data(), DType::kF32, Shape{t, width}), true,
                                          TensorView(logits.data(), DType::kF32, Shape{t, model->draft_vocab()}),
                                          TensorView(hidden_out.data(), DType::kF32, Shape{t, hidden})));
    logits.insert(logits.end(), hidden_out.begin(), hidden_out.end());
    return logits;
  };
  auto want = run(&cpu_, DType::kF32);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = run(gpu_.get(), DType::kBF16);
  ASSERT_TRUE(got.ok()) << got.status();
  const double error = RelDiff(*got, *want);
  std::printf("  draft bf16 rel. error %.2e\n", error);
  EXPECT_LT(error, 3e-2);
  EXPECT_GT(error, 0.0);
}

}  // namespace
}  // namespace eagle3::parity
