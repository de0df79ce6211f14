// The drafters that run DeepSeek layers on the CUDA backend (f32 weights, TP 1), against the golden
// fixtures the CPU reference matches (tests/mla_draft_golden_test.cc, tests/mtp_golden_test.cc): the
// MLA EAGLE-3 heads' and the MTP module's two steps (causal: BatchedLatentAttention over the draft's
// latent cache), the target's tap of its final normed hidden, BatchedLatentAttentionKeyMask (the tree
// passes' attention) against the CPU reference and its device-side row check, the drafted trees and
// speculative greedy == plain greedy.
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "drafter_golden_util.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/draft_model.h"
#include "eagle3/hidden_state_tap.h"
#include "eagle3/safetensors.h"
#include "eagle3/target_model.h"
#include "eagle3/tensor.h"
#include "gtest/gtest.h"
#include "speculative_greedy_check.h"

namespace eagle3 {
namespace {

using golden::GoldenDir;
using golden::ReadF32;
using golden::ReadI64;

constexpr double kTolerance = 1e-4;

golden::RunSetup Gpu() {
  golden::RunSetup setup;
  setup.backends = []() -> absl::StatusOr<std::unique_ptr<Backend>> {
    EAGLE3_ASSIGN_OR_RETURN(auto backend, cuda::CudaBackend::Create());
    return std::unique_ptr<Backend>(std::move(backend));
  };
  setup.weight_dtype = DType::kF32;  // the f32 path, compared at f32 tolerances
  return setup;
}

golden::DraftFactory MlaDraft(const std::string& name) {
  return [dir = GoldenDir(name)](const DraftModelOptions& o, Communicator* comm, Backend* backend) {
    return DraftModel::Create(dir, GoldenDir("k25_int4"), o, comm, backend);
  };
}

golden::DraftFactory Mtp() {
  return [](const DraftModelOptions& o, Communicator* comm, Backend* backend) {
    return DraftModel::CreateMtp(GoldenDir("v3_mtp"), o, comm, backend);
  };
}

// Whether `backend` runs latent attention with a mask over every key (the MLA drafts' tree passes).
bool RunsKeyMasks(Backend& backend) {
  // One sequence of one row over one cached key it may see: valid metadata, so the call's only
  // possible refusal is Unimplemented. Values are i32 (or u8 for the mask), zeros for the floats.
  auto upload = [&](DType dtype, const Shape& shape, std::vector<int32_t> values) {
    Tensor host = *Tensor::Zeros(dtype, shape);
    for (size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::kI32) host.data_as<int32_t>()[i] = values[i];
      if (dtype == DType::kU8) host.data_as<uint8_t>()[i] = static_cast<uint8_t>(values[i]);
    }
    Tensor device = *Tensor::Empty(dtype, shape, backend.allocator());
    EXPECT_TRUE(backend.Copy(host, device).ok());
    return device;
  };
  Tensor q = upload(DType::kF32, Shape{1, 1, 8}, {}), cache = upload(DType::kF32, Shape{1, 1, 8}, {});
  Tensor out = upload(DType::kF32, Shape{1, 1, 8}, {});
  Tensor tables = upload(DType::kI32, Shape{1, 1}, {0}), lens = upload(DType::kI32, Shape{1}, {1});
  Tensor starts = upload(DType::kI32, Shape{2}, {0, 1}), mask = upload(DType::kU8, Shape{1, 1}, {1});
  const absl::Status status =
      backend.BatchedLatentAttentionKeyMask(q, cache, tables, starts, lens, 1, mask, 1.0f, 8, out);
  EXPECT_TRUE(backend.Synchronize().ok());
  return status.code() != absl::StatusCode::kUnimplemented;
}

void ExpectTwoStepsMatch(const golden::DraftFactory& make, const std::string& dir, const std::string& file,
                         const std::string& input_name) {
  auto expected = SafetensorsFile::Open(dir + "/" + file);
  ASSERT_TRUE(expected.ok()) << expected.status();
  const SafetensorsFile& e = **expected;
  const golden::TwoSteps got =
      golden::RunTwoSteps(make, 1, ReadI64(e, "tokens"), ReadF32(e, input_name), ReadI64(e, "token_step1"), Gpu());
  EXPECT_LT(golden::RelError(got.logits0, ReadF32(e, "logits_step0")), kTolerance);
  EXPECT_LT(golden::RelError(got.hidden0, ReadF32(e, "hidden_step0")), kTolerance);
  EXPECT_LT(golden::RelError(got.logits1, ReadF32(e, "logits_step1")), kTolerance);
  EXPECT_LT(golden::RelError(got.hidden1, ReadF32(e, "hidden_step1")), kTolerance);
}

class DraftKindsGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// A host vector on the device (or the host tensor itself on a host backend).
template <typename T>
Tensor OnDevice(Backend& backend, std::vector<T>& host, DType dtype, const Shape& shape) {
  Tensor device = *Tensor::Empty(dtype, shape, backend.allocator());
  EXPECT_TRUE(backend.Copy(TensorView(host.data(), dtype, shape), device).ok());
  return device;
}

// BatchedLatentAttentionKeyMask on `backend` for a fixed random batch: three sequences (a decode
// row, a tree pass of 4 rows, 2 rows), random key masks (each row its own key and a random subset,
// garbage ones at and past kv_len, never read), pages shuffled. `blind_row` >= 0 clears that row's
// keys. Returns the status and [T, N, V] out.
absl::Status KeyMaskAttention(Backend& backend, int blind_row, std::vector<float>* out) {
  constexpr int64_t kHeads = 4, kWidth = 40, kValue = 32, kPageSize = 4, kMaxKv = 24;
  const std::vector<int64_t> n = {1, 4, 2}, len = {9, 17, 5};
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::bernoulli_distribution coin(0.5);
  const int64_t b = 3, t = 7, max_pages = kMaxKv / kPageSize, pages = b * max_pages;
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  for (int32_t i = 0; i < pages; ++i) perm[static_cast<size_t>(i)] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> starts = {0, 1, 5, 7}, lens = {9, 17, 5};
  std::vector<float> q(static_cast<size_t>(t * kHeads * kWidth));
  std::vector<float> cache(static_cast<size_t>(pages * kPageSize * kWidth));
  for (float& v : q) v = normal(rng);
  for (float& v : cache) v = normal(rng);
  std::vector<uint8_t> mask(static_cast<size_t>(t * kMaxKv), 1);
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t i = 0; i < n[s]; ++i) {
      uint8_t* row = &mask[static_cast<size_t>((starts[s] + i) * kMaxKv)];
      for (int64_t k = 0; k < len[s]; ++k) row[k] = coin(rng) ? 1 : 0;
      row[len[s] - n[s] + i] = 1;
    }
  }
  if (blind_row >= 0) {
    const int64_t s = blind_row < 1 ? 0 : blind_row < 5 ? 1 : 2;
    std::fill_n(&mask[static_cast<size_t>(blind_row * kMaxKv)], len[s], uint8_t{0});
  }
  Tensor dq = OnDevice(backend, q, DType::kF32, Shape{t, kHeads, kWidth});
  Tensor dcache = OnDevice(backend, cache, DType::kF32, Shape{pages, kPageSize, kWidth});
  Tensor dtables = OnDevice(backend, perm, DType::kI32, Shape{b, max_pages});
  Tensor dstarts = OnDevice(backend, starts, DType::kI32, Shape{b + 1});
  Tensor dlens = OnDevice(backend, lens, DType::kI32, Shape{b});
  Tensor dmask = OnDevice(backend, mask, DType::kU8, Shape{t, kMaxKv});
  Tensor dout = *Tensor::Empty(DType::kF32, Shape{t, kHeads, kValue}, backend.allocator());
  EAGLE3_RETURN_IF_ERROR(backend.BatchedLatentAttentionKeyMask(dq, dcache, dtables, dstarts, dlens, kMaxKv, dmask,
                                                               0.3f, kValue, dout));
  EAGLE3_RETURN_IF_ERROR(backend.Synchronize());
  out->assign(static_cast<size_t>(t * kHeads * kValue), 0.0f);
  EAGLE3_RETURN_IF_ERROR(backend.Copy(dout, TensorView(out->data(), DType::kF32, Shape{t, kHeads, kValue})));
  return backend.Synchronize();
}

TEST_F(DraftKindsGpuTest, KeyMaskAttentionMatchesTheCpuReference) {
  auto gpu = cuda::CudaBackend::Create();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  cpu::CpuBackend cpu;
  std::vector<float> got, want;
  ASSERT_TRUE(KeyMaskAttention(**gpu, -1, &got).ok());
  ASSERT_TRUE(KeyMaskAttention(cpu, -1, &want).ok());
  EXPECT_LT(golden::RelError(got, want), 1e-5);
  // A row allowing none of its sequence's keys: refused at Synchronize, naming the key mask.
  const absl::Status blind = KeyMaskAttention(**gpu, 3, &got);
  EXPECT_EQ(blind.code(), absl::StatusCode::kInvalidArgument) << blind;
  EXPECT_NE(std::string(blind.message()).find("key_mask"), std::string::npos) << blind;
}

TEST_F(DraftKindsGpuTest, MlaDraftStepsMatchTheGolden) {
  for (const char* name : {"mla_draft_k25", "mla_draft_k25_eagle31"}) {
    SCOPED_TRACE(name);
    ExpectTwoStepsMatch(MlaDraft(name), GoldenDir(name), "expected.safetensors", "aux");
  }
}

TEST_F(DraftKindsGpuTest, MtpStepsMatchTheGolden) {
  ExpectTwoStepsMatch(Mtp(), GoldenDir("v3_mtp"), "mtp_expected.safetensors", "hidden_in");
}

TEST_F(DraftKindsGpuTest, TargetTapsTheFinalNormedHidden) {
  auto backend = cuda::CudaBackend::Create();
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto expected = SafetensorsFile::Open(GoldenDir("v3_mtp") + "/expected.safetensors");
  auto mtp = SafetensorsFile::Open(GoldenDir("v3_mtp") + "/mtp_expected.safetensors");
  ASSERT_TRUE(expected.ok() && mtp.ok());
  const std::vector<int64_t> prompt = ReadI64(**expected, "tokens");
  const int64_t t = static_cast<int64_t>(prompt.size());
  TargetModelOptions o;
  o.weight_dtype = DType::kF32;
  o.max_tokens_per_forward = t;
  o.max_context_len = t;
  o.page_size = 4;
  o.num_kv_pages = (t + 3) / 4;
  auto target = TargetModel::Create(GoldenDir("v3_mtp"), o, nullptr, backend->get());
  ASSERT_TRUE(target.ok()) << target.status();
  const DeepseekV2Config& c = (*target)->config();
  auto tap = HiddenStateTap::FinalNormed(static_cast<int>(c.num_hidden_layers), c.hidden_size);
  ASSERT_TRUE(tap.ok());
  std::vector<int32_t> pages(static_cast<size_t>(o.num_kv_pages));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size)), aux(static_cast<size_t>(t * c.hidden_size));
  SequenceInput in;
  in.tokens = prompt;
  in.page_table = pages;
  ASSERT_TRUE((*target)
                  ->Forward(std::span<const SequenceInput>(&in, 1),
                            TensorView(logits.data(), DType::kF32, Shape{1, c.vocab_size}), &*tap,
                            TensorView(aux.data(), DType::kF32, Shape{t, c.hidden_size}))
                  .ok());
  EXPECT_LT(golden::RelError(aux, ReadF32(**mtp, "hidden_in")), kTolerance);
}

TEST_F(DraftKindsGpuTest, DraftedTreesMatchTheGolden) {
  {
    auto backend = cuda::CudaBackend::Create();
    ASSERT_TRUE(backend.ok()) << backend.status();
    if (!RunsKeyMasks(**backend)) GTEST_SKIP() << "the CUDA backend does not implement BatchedLatentAttentionKeyMask";
  }
  struct Case {
    golden::DraftFactory make;
    std::string trees, inputs, input_name;
  };
  for (const Case& c : {Case{MlaDraft("mla_draft_k25"), GoldenDir("mla_draft_k25") + "/tree.safetensors",
                             GoldenDir("mla_draft_k25") + "/expected.safetensors", "aux"},
                        Case{Mtp(), GoldenDir("v3_mtp") + "/mtp_tree.safetensors",
                             GoldenDir("v3_mtp") + "/mtp_expected.safetensors", "hidden_in"}}) {
    SCOPED_TRACE(c.trees);
    const golden::GoldenTrees g = golden::LoadGoldenTrees(c.trees);
    auto inputs = SafetensorsFile::Open(c.inputs);
    ASSERT_TRUE(inputs.ok());
    const auto built = golden::BuildGoldenTrees(c.make, 1, g, ReadF32(**inputs, c.input_name), Gpu());
    golden::ExpectTreesMatch(built, g, 1, kTolerance, 1e-4);
  }
}

TEST_F(DraftKindsGpuTest, SpeculativeGreedyEqualsPlain) {
  auto backend = cuda::CudaBackend::Create();
  ASSERT_TRUE(backend.ok()) << backend.status();
  if (!RunsKeyMasks(**backend)) GTEST_SKIP() << "the CUDA backend does not implement BatchedLatentAttentionKeyMask";
  TargetModelOptions topt;
  topt.weight_dtype = DType::kF32;
  topt.max_tokens_per_forward = 64;
  topt.max_context_len = 96;
  topt.num_kv_pages = 96;
  topt.page_size = 3;
  DraftModelOptions dopt;
  dopt.weight_dtype = DType::kF32;
  dopt.max_tokens_per_forward = 64;
  dopt.max_context_len = 96;
  dopt.num_kv_pages = 96;
  dopt.page_size = 5;
  for (const bool mtp : {false, true}) {
    SCOPED_TRACE(mtp ? "mtp" : "mla");
    const std::string target_dir = GoldenDir(mtp ? "v3_mtp" : "k25_int4");
    auto target = TargetModel::Create(target_dir, topt, nullptr, backend->get());
    ASSERT_TRUE(target.ok()) << target.status();
    auto draft = mtp ? DraftModel::CreateMtp(target_dir, dopt, nullptr, backend->get())
                     : DraftModel::Create(GoldenDir("mla_draft_k25"), target_dir, dopt, nullptr, backend->get());
    ASSERT_TRUE(draft.ok()) << draft.status();
    ExpectSpeculativeGreedyEqualsPlain(target->get(), draft->get(), backend->get());
  }
}

}  // namespace
}  // namespace eagle3
