// DraftModel steps captured in a CUDA graph and replayed ≡ the same steps run eagerly, bit for bit:
// fed-back decode steps of two sequences with growing cache lengths, tree steps whose masks, tokens
// and hidden rows change every replay, and replays of the tree graph at another cache length with
// a new page every replay (golden draft_v2 on v2_qlora_yarn, f32 weights).
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/draft_model.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

const std::string kGolden = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/";

struct Side {
  std::unique_ptr<cuda::CudaBackend> backend;
  std::unique_ptr<DraftModel> model;
};

// One draft call, owning what its spans point at.
struct Call {
  std::vector<std::vector<int64_t>> tokens;
  std::vector<std::vector<uint8_t>> masks;
  std::vector<int64_t> cache_len;
  std::vector<float> hidden;
  bool from_target = false;
};

class DraftGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    for (Side* side : {&eager_, &graphed_}) {
      auto backend = cuda::CudaBackend::Create();
      ASSERT_TRUE(backend.ok()) << backend.status();
      side->backend = std::move(*backend);
      DraftModelOptions o;
      o.weight_dtype = DType::kF32;
      o.max_tokens_per_forward = 32;
      o.max_context_len = 128;
      o.num_kv_pages = 48;
      o.page_size = 8;
      auto model = DraftModel::Create(kGolden + "draft_v2", kGolden + "v2_qlora_yarn", o, nullptr, side->backend.get());
      ASSERT_TRUE(model.ok()) << model.status();
      side->model = std::move(*model);
    }
    hidden_ = eager_.model->config().hidden_size;
    aux_ = eager_.model->tap().width();
    vocab_ = eager_.model->config().vocab_size;
    draft_vocab_ = eager_.model->draft_vocab();
  }

  std::vector<DraftSequenceInput> Batch(const Call& c) const {
    std::vector<DraftSequenceInput> batch;
    for (size_t s = 0; s < c.tokens.size(); ++s) {
      DraftSequenceInput in;
      in.tokens = c.tokens[s];
      in.page_table = pages_[s];
      in.cache_len = c.cache_len[s];
      in.mask = c.masks[s];
      in.all_logits = true;
      batch.push_back(in);
    }
    return batch;
  }
  Call Make(const std::vector<int64_t>& n, const std::vector<int64_t>& cache_len, bool from_target, bool tree) {
    Call c;
    c.from_target = from_target;
    c.cache_len = cache_len;
    int64_t rows = 0;
    for (size_t s = 0; s < n.size(); ++s) {
      std::vector<int64_t> tokens(static_cast<size_t>(n[s]));
      for (int64_t& v : tokens) v = std::uniform_int_distribution<int64_t>(0, vocab_ - 1)(rng_);
      c.tokens.push_back(tokens);
      std::vector<uint8_t> mask;
      if (tree) {  // every row: the cache, a random subset of the earlier rows, itself
        const int64_t end = cache_len[s] + n[s];
        mask.assign(static_cast<size_t>(n[s] * end), 0);
        for (int64_t i = 0; i < n[s]; ++i) {
          for (int64_t j = 0; j < end; ++j) {
            const bool earlier = j >= cache_len[s] && j < cache_len[s] + i;
            mask[static_cast<size_t>(i * end + j)] = j < cache_len[s] || j == cache_len[s] + i ||
                                                     (earlier && std::bernoulli_distribution(0.5)(rng_));
          }
        }
      }
      c.masks.push_back(mask);
      rows += n[s];
    }
    std::normal_distribution<float> normal(0.0f, 1.0f);
    c.hidden.resize(static_cast<size_t>(rows * (from_target ? aux_ : hidden_)));
    for (float& v : c.hidden) v = normal(rng_);
    return c;
  }

  struct Out {
    std::vector<float> logits, hidden;
  };
  Out Alloc(const Call& c) const {
    Out o;
    const std::vector<DraftSequenceInput> batch = Batch(c);
    o.logits.assign(static_cast<size_t>(DraftModel::LogitRows(batch) * draft_vocab_), 0.0f);
    o.hidden.assign(static_cast<size_t>(Rows(c) * hidden_), 0.0f);
    return o;
  }
  static int64_t Rows(const Call& c) {
    int64_t t = 0;
    for (const auto& v : c.tokens) t += static_cast<int64_t>(v.size());
    return t;
  }
  TensorView H(const Call& c) const {
    return TensorView(const_cast<float*>(c.hidden.data()), DType::kF32,
                      Shape{Rows(c), c.from_target ? aux_ : hidden_});
  }
  TensorView L(Out& o) const {
    return TensorView(o.logits.data(), DType::kF32, Shape{static_cast<int64_t>(o.logits.size()) / draft_vocab_,
                                                          draft_vocab_});
  }
  TensorView HO(Out& o) const {
    return TensorView(o.hidden.data(), DType::kF32, Shape{static_cast<int64_t>(o.hidden.size()) / hidden_, hidden_});
  }
  Out Eager(Side& side, const Call& c) {
    Out o = Alloc(c);
    const absl::Status st = side.model->Forward(Batch(c), H(c), c.from_target, L(o), HO(o));
    EXPECT_TRUE(st.ok()) << st;
    return o;
  }
  // Stage, capture Launch when no graph exists yet (capturing runs nothing), replay, finish.
  Out Replay(std::unique_ptr<cuda::CudaGraph>* graph, std::vector<int64_t>* signature, const Call& c) {
    Out o = Alloc(c);
    DraftModel& m = *graphed_.model;
    absl::Status st = m.Stage(Batch(c), H(c), c.from_target);
    EXPECT_TRUE(st.ok()) << st;
    EXPECT_TRUE(m.StepIsCapturable());
    if (*graph == nullptr) {
      auto captured = cuda::CudaGraph::Capture(graphed_.backend->stream(), [&] { return m.Launch(); });
      EXPECT_TRUE(captured.ok()) << captured.status();
      if (!captured.ok()) return o;
      *graph = std::move(*captured);
      *signature = m.StepSignature();
    }
    EXPECT_EQ(m.StepSignature(), *signature) << "the staged batch does not fit the captured graph";
    st = (*graph)->Launch(graphed_.backend->stream());
    EXPECT_TRUE(st.ok()) << st;
    st = m.Finish(L(o), HO(o));
    EXPECT_TRUE(st.ok()) << st;
    return o;
  }
  void ExpectSame(const Out& got, const Out& want, const std::string& what) {
    EXPECT_EQ(got.logits, want.logits) << what;
    EXPECT_EQ(got.hidden, want.hidden) << what;
  }

  Side eager_, graphed_;
  int64_t hidden_ = 0, aux_ = 0, vocab_ = 0, draft_vocab_ = 0;
  std::mt19937 rng_{29};
  std::vector<std::vector<int32_t>> pages_ = {{3, 7, 1, 12, 5, 9, 20, 2, 14, 30, 6, 8, 10, 11, 13, 15},
                                              {0, 4, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 31}};
};

TEST_F(DraftGraphTest, DecodeAndTreeStepsReplayEqualEagerSteps) {
  // The context from the target, eagerly on both sides (it also sizes the backends' scratch).
  const Call context = Make({9, 5}, {0, 0}, /*from_target=*/true, false);
  ExpectSame(Eager(graphed_, context), Eager(eager_, context), "context");
  // Fed-back decode steps: one row per sequence, growing cache lengths.
  std::unique_ptr<cuda::CudaGraph> decode;
  std::vector<int64_t> decode_sig;
  for (int step = 0; step < 4; ++step) {
    const Call c = Make({1, 1}, {9 + step, 5 + step}, false, false);
    const Out want = Eager(eager_, c);
    const Out got = step == 0 ? Eager(graphed_, c) : Replay(&decode, &decode_sig, c);
    ExpectSame(got, want, "decode step " + std::to_string(step));
  }
  // Tree steps over the same cached prefix: new tokens, masks and hidden rows every replay.
  std::unique_ptr<cuda::CudaGraph> tree;
  std::vector<int64_t> tree_sig;
  for (int step = 0; step < 4; ++step) {
    const Call c = Make({4, 3}, {13, 9}, false, true);
    const Out want = Eager(eager_, c);
    const Out got = step == 0 ? Eager(graphed_, c) : Replay(&tree, &tree_sig, c);
    ExpectSame(got, want, "tree step " + std::to_string(step));
  }
  // The tree graph replayed for steps it was not captured with: sequence 0's rows start a page
  // (cache_len 16), which is a page never used before and a different one every replay, so the
  // replay must take its page table, slots and kv_len from the step staged for it.
  for (int step = 0; step < 4; ++step) {
    pages_[0][2] = 32 + step;
    const Call c = Make({4, 3}, {16, 9}, false, true);
    const Out want = Eager(eager_, c);
    ExpectSame(Replay(&tree, &tree_sig, c), want, "tree step on a new page " + std::to_string(step));
  }
}

}  // namespace
}  // namespace eagle3
