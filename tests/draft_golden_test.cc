// The EAGLE-3 draft step against golden outputs (tools/make_golden.py: an independent PyTorch
// implementation of the draft, cross-checked with transformers' Llama modules) at TP 1 and TP 8: a
// causal pass over every row from the target's aux states, then one row decoded from the last row's
// fed-back hidden with the cache of the first pass. Weights are bf16 and read exactly; both sides
// compute in fp32, so the tolerance is 1e-4 of the tensor's largest magnitude.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_model.h"
#include "eagle3/safetensors.h"
#include "eagle3/status.h"
#include "eagle3/testing/rank_threads.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

constexpr double kTolerance = 1e-4;

struct Outputs {
  std::vector<float> logits0, hidden0, logits1, hidden1;
};

struct Golden {
  std::string dir, target_dir;
  std::unique_ptr<SafetensorsFile> expected;
  std::vector<int64_t> tokens, token1;
  std::vector<float> aux;
  int64_t hidden = 0, draft_vocab = 0, aux_width = 0;
};

std::vector<float> ViewF32(const SafetensorsFile& file, const std::string& name) {
  auto v = file.View(name);
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) return {};
  return std::vector<float>(v->data_as<float>(), v->data_as<float>() + v->numel());
}

std::vector<int64_t> ViewI64(const SafetensorsFile& file, const std::string& name) {
  auto v = file.View(name);
  EXPECT_TRUE(v.ok()) << v.status();
  if (!v.ok()) return {};
  return std::vector<int64_t>(v->data_as<int64_t>(), v->data_as<int64_t>() + v->numel());
}

Golden LoadGolden(const std::string& name, const std::string& target) {
  Golden g;
  g.dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + name;
  g.target_dir = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/" + target;
  auto config = Eagle3DraftConfig::FromFile(g.dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return g;
  g.hidden = config->hidden_size;
  g.draft_vocab = config->draft_vocab_size;
  g.aux_width = config->fc_input_width();
  auto expected = SafetensorsFile::Open(g.dir + "/expected.safetensors");
  EXPECT_TRUE(expected.ok()) << expected.status();
  if (!expected.ok()) return g;
  g.expected = std::move(*expected);
  g.tokens = ViewI64(*g.expected, "tokens");
  g.token1 = ViewI64(*g.expected, "token_step1");
  g.aux = ViewF32(*g.expected, "aux");
  return g;
}

Outputs RunDraft(const Golden& g, int tp) {
  const int64_t t = static_cast<int64_t>(g.tokens.size());
  DraftModelOptions options;
  options.tp_size = tp;
  options.max_tokens_per_forward = t;
  options.max_context_len = t + 1;
  options.page_size = 4;
  options.num_kv_pages = (t + 1 + 3) / 4;
  std::vector<int32_t> pages(static_cast<size_t>(options.num_kv_pages));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(pages.size() - 1 - p);
  std::vector<Outputs> out(static_cast<size_t>(tp));
  const absl::Status status = RunRankThreads(tp, [&](int rank, Communicator* comm) -> absl::Status {
    cpu::CpuBackend backend;
    DraftModelOptions o = options;
    o.rank = rank;
    EAGLE3_ASSIGN_OR_RETURN(auto model, DraftModel::Create(g.dir, g.target_dir, o, comm, &backend));
    Outputs& r = out[static_cast<size_t>(rank)];
    r.logits0.resize(static_cast<size_t>(t * g.draft_vocab));
    r.hidden0.resize(static_cast<size_t>(t * g.hidden));
    DraftSequenceInput in;
    in.tokens = g.tokens;
    in.page_table = pages;
    in.all_logits = true;
    EAGLE3_RETURN_IF_ERROR(model->Forward(std::span<const DraftSequenceInput>(&in, 1),
                                          TensorView(const_cast<float*>(g.aux.data()), DType::kF32, Shape{t, g.aux_width}),
                                          /*from_target=*/true,
                                          TensorView(r.logits0.data(), DType::kF32, Shape{t, g.draft_vocab}),
                                          TensorView(r.hidden0.data(), DType::kF32, Shape{t, g.hidden})));
    std::vector<float> fed(r.hidden0.end() - g.hidden, r.hidden0.end());
    r.logits1.resize(static_cast<size_t>(g.draft_vocab));
    r.hidden1.resize(static_cast<size_t>(g.hidden));
    DraftSequenceInput next;
    next.tokens = g.token1;
    next.page_table = pages;
    next.cache_len = t;
    return model->Forward(std::span<const DraftSequenceInput>(&next, 1),
                          TensorView(fed.data(), DType::kF32, Shape{1, g.hidden}), /*from_target=*/false,
                          TensorView(r.logits1.data(), DType::kF32, Shape{1, g.draft_vocab}),
                          TensorView(r.hidden1.data(), DType::kF32, Shape{1, g.hidden}));
  });
  EXPECT_TRUE(status.ok()) << status;
  for (int rank = 1; rank < tp; ++rank) {
    EXPECT_EQ(out[static_cast<size_t>(rank)].logits1, out[0].logits1) << "rank " << rank;
    EXPECT_EQ(out[static_cast<size_t>(rank)].hidden1, out[0].hidden1) << "rank " << rank;
  }
  return out[0];
}

// Max |got - want| over the largest |want|.
double RelError(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return diff / scale;
}

class DraftGoldenTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DraftGoldenTest, BothStepsMatchTheReference) {
  const Golden g = LoadGolden(GetParam(), "v2_qlora_yarn");
  ASSERT_NE(g.expected, nullptr);
  ASSERT_FALSE(g.tokens.empty());
  ASSERT_EQ(g.token1.size(), 1u);
  const std::vector<float> want[] = {ViewF32(*g.expected, "logits_step0"), ViewF32(*g.expected, "hidden_step0"),
                                     ViewF32(*g.expected, "logits_step1"), ViewF32(*g.expected, "hidden_step1")};
  const char* names[] = {"logits_step0", "hidden_step0", "logits_step1", "hidden_step1"};
  for (int tp : {1, 8}) {
    const Outputs got = RunDraft(g, tp);
    const std::vector<float>* outputs[] = {&got.logits0, &got.hidden0, &got.logits1, &got.hidden1};
    std::printf("  %-18s tp %d:", GetParam(), tp);
    for (int i = 0; i < 4; ++i) {
      const double error = RelError(*outputs[i], want[i]);
      EXPECT_LT(error, kTolerance) << GetParam() << " tp " << tp << " " << names[i];
      std::printf(" %s %.2e", names[i], error);
    }
    std::printf("\n");
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DraftGoldenTest, ::testing::Values("draft_v2", "draft_v2_eagle31"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace eagle3
