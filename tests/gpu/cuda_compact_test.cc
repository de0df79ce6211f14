// CudaBackend::CompactAccepted ≡ CpuBackend::CompactAccepted bit for bit (f32 and bf16 caches, row
// sizes taking the 16-, 4- and 2-byte copy paths and several column segments, page sizes 1/16,
// accepted sets longer than one 32-row chunk, skipped sequences); bad entries reported by
// Synchronize with only their sequence left unwritten; a captured CompactAccepted replays on new
// device inputs; and DeviceTreeVerifier::Launch + TargetModel::CommitAcceptedOnDevice captured in
// one CUDA graph and replayed on new trees and logits ≡ the eager Verify + host CommitAccepted.
// Skipped where no CUDA device is visible.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/device_tree_verifier.h"
#include "eagle3/draft_tree.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/tree_verifier.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parity_util.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

// Host inputs of one CompactAccepted call: a cache of random bits over a shuffled page pool.
struct Case {
  DType dtype = DType::kF32;
  int64_t page_size = 4, width = 6, max_nodes = 8, pages = 0, num_pages = 0, pad = 0;
  bool i64_len = true;
  Tensor cache, tables, cache_len, accepted, num;  // host; tables / accepted padded by `pad`

  int64_t b() const { return num.dim(0); }
  int32_t* Accepted(int64_t s) const { return accepted.data_as<int32_t>() + s * (max_nodes + pad); }
  void SetLen(int64_t s, int64_t len) const {
    if (i64_len) cache_len.data_as<int64_t>()[s] = len;
    if (!i64_len) cache_len.data_as<int32_t>()[s] = static_cast<int32_t>(len);
  }
};

Case MakeCase(std::mt19937& rng, DType dtype, int64_t sequences, int64_t page_size, int64_t width,
              int64_t max_nodes, int64_t max_len, int64_t pad, bool i64_len) {
  Case c;
  c.dtype = dtype;
  c.page_size = page_size;
  c.width = width;
  c.max_nodes = max_nodes;
  c.pad = pad;
  c.i64_len = i64_len;
  c.pages = (max_len + max_nodes + page_size - 1) / page_size;
  c.num_pages = sequences * c.pages + 3;
  c.cache = *Tensor::Empty(dtype, Shape{c.num_pages, page_size, width});
  auto* bytes = static_cast<uint8_t*>(c.cache.data());
  for (size_t i = 0; i < c.cache.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  std::vector<int32_t> pool(static_cast<size_t>(c.num_pages));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  c.tables = *Tensor::Empty(DType::kI32, Shape{sequences, c.pages + pad});
  for (int64_t s = 0; s < sequences; ++s) {
    std::copy_n(pool.begin() + s * c.pages, c.pages, c.tables.data_as<int32_t>() + s * (c.pages + pad));
  }
  c.cache_len = *Tensor::Empty(i64_len ? DType::kI64 : DType::kI32, Shape{sequences});
  c.accepted = *Tensor::Zeros(DType::kI32, Shape{sequences, max_nodes + pad});
  c.num = *Tensor::Zeros(DType::kI32, Shape{sequences});
  for (int64_t s = 0; s < sequences; ++s) {
    c.SetLen(s, static_cast<int64_t>(rng() % (max_len + 1)));
    int32_t n = 0;
    const int keep = 1 + static_cast<int>(rng() % 4);  // keep probability keep / 4
    for (int32_t i = 0; i < max_nodes; ++i) {
      if (static_cast<int>(rng() % 4) < keep) c.Accepted(s)[n++] = i;
    }
    c.num.data_as<int32_t>()[s] = rng() % 8 == 0 ? -1 : n;
  }
  return c;
}

TensorView Unpad(const Tensor& t, int64_t cols) { return t.view().Narrow(1, 0, cols); }

class CudaCompactTest : public parity::ParityTest {
 protected:
  // Runs the op on both backends (the device one synchronized); returns the device status, and
  // the two caches afterwards.
  absl::Status RunBoth(const Case& c, Tensor* cpu_cache, Tensor* gpu_cache) {
    Tensor cache = *Tensor::Empty(c.dtype, c.cache.shape());
    std::memcpy(cache.data(), c.cache.data(), c.cache.nbytes());
    const absl::Status cpu_status = cpu_.CompactAccepted(cache, Unpad(c.tables, c.pages), c.cache_len,
                                                         Unpad(c.accepted, c.max_nodes), c.num);
    *cpu_cache = std::move(cache);
    Tensor d_cache = Upload(c.cache), d_tables = Upload(c.tables), d_len = Upload(c.cache_len);
    Tensor d_accepted = Upload(c.accepted), d_num = Upload(c.num);
    const absl::Status launch = gpu_->CompactAccepted(d_cache, Unpad(d_tables, c.pages), d_len,
                                                      Unpad(d_accepted, c.max_nodes), d_num);
    EXPECT_TRUE(launch.ok()) << launch;
    const absl::Status st = gpu_->Synchronize();
    *gpu_cache = Download(d_cache);
    EXPECT_EQ(st.ok(), cpu_status.ok()) << "cuda: " << st << "; cpu: " << cpu_status;
    return st;
  }
  static bool SameBytes(const Tensor& a, const Tensor& b) {
    return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
  }
};

TEST_F(CudaCompactTest, MatchesTheCpuReferenceBitForBit) {
  std::mt19937 rng(1);
  struct Shape_ {
    DType dtype;
    int64_t width;
  };
  // Rows of 24 B (4-byte units), 1152 B (16-byte units, 3 segments), 1150 B (2-byte units), 2304 B.
  const Shape_ shapes[] = {{DType::kF32, 6}, {DType::kBF16, 576}, {DType::kBF16, 575}, {DType::kF32, 576}};
  int trial = 0;
  for (const Shape_& shape : shapes) {
    for (int64_t page_size : {1, 16}) {
      for (int64_t max_nodes : {8, 70}) {  // 70: chunks of 32, 32 and 6 rows
        ++trial;
        const int64_t sequences = 1 + trial % 6;
        const Case c = MakeCase(rng, shape.dtype, sequences, page_size, shape.width, max_nodes, 40,
                                trial % 3, trial % 2 == 0);
        Tensor want, got;
        const absl::Status st = RunBoth(c, &want, &got);
        ASSERT_TRUE(st.ok()) << st;
        EXPECT_TRUE(SameBytes(got, want)) << "dtype " << DTypeName(shape.dtype) << " width " << shape.width
                                          << " page_size " << page_size << " max_nodes " << max_nodes;
      }
    }
  }
}

TEST_F(CudaCompactTest, LongChainsAcrossChunksMatch) {
  // Every sequence drops only its first row: 69 moves one slot down, across three chunks.
  std::mt19937 rng(2);
  Case c = MakeCase(rng, DType::kBF16, 3, 16, 576, 70, 30, 0, true);
  for (int64_t s = 0; s < c.b(); ++s) {
    std::iota(c.Accepted(s), c.Accepted(s) + 69, 1);
    c.num.data_as<int32_t>()[s] = 69;
  }
  Tensor want, got;
  ASSERT_TRUE(RunBoth(c, &want, &got).ok());
  EXPECT_TRUE(SameBytes(got, want));
}

TEST_F(CudaCompactTest, BadEntriesAreReportedBySynchronizeAndOnlyTheirSequenceIsSkipped) {
  std::mt19937 rng(3);
  struct Spoil {
    const char* words;
    std::function<void(Case&)> apply;
  };
  const std::vector<Spoil> spoils = {
      {"sequence 1, entry 0", [](Case& c) { c.num.data_as<int32_t>()[1] = static_cast<int32_t>(c.max_nodes + 1); }},
      {"sequence 1, entry 2", [](Case& c) { c.Accepted(1)[2] = c.Accepted(1)[1]; }},
      {"sequence 1, entry 1", [](Case& c) { c.Accepted(1)[1] = static_cast<int32_t>(c.max_nodes); }},
      {"sequence 1, entry 0", [](Case& c) { c.SetLen(1, -3); }},
      {"sequence 1, entry 0", [](Case& c) { c.tables.data_as<int32_t>()[c.pages + c.pad] = -1; }},
      // Two bad sequences: the lower is reported.
      {"sequence 1, entry 0",
       [](Case& c) {
         c.SetLen(1, -3);
         c.SetLen(2, -3);
       }},
  };
  for (const Spoil& spoil : spoils) {
    Case c = MakeCase(rng, DType::kF32, 3, 4, 6, 8, 10, 1, false);
    for (int64_t s = 0; s < 3; ++s) {
      const int32_t keep[] = {0, 2, 3, 6};
      std::copy(keep, keep + 4, c.Accepted(s));
      c.num.data_as<int32_t>()[s] = 4;
      c.SetLen(s, 1);  // entry 0 on page entry 0
    }
    spoil.apply(c);
    Tensor want, got;
    const absl::Status st = RunBoth(c, &want, &got);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr("CompactAccepted")) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(spoil.words)) << st;
    EXPECT_TRUE(SameBytes(got, want)) << spoil.words;
  }
  // The flag was cleared: a good call reports nothing.
  const Case good = MakeCase(rng, DType::kF32, 2, 4, 6, 8, 10, 0, true);
  Tensor want, got;
  EXPECT_TRUE(RunBoth(good, &want, &got).ok());
}

TEST_F(CudaCompactTest, CapturedCallReplaysOnNewDeviceInputs) {
  std::mt19937 rng(4);
  Case c = MakeCase(rng, DType::kBF16, 4, 16, 576, 16, 30, 0, true);
  Tensor d_cache = Upload(c.cache), d_tables = Upload(c.tables), d_len = Upload(c.cache_len);
  Tensor d_accepted = Upload(c.accepted), d_num = Upload(c.num);
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] {
    return gpu_->CompactAccepted(d_cache, d_tables, d_len, d_accepted, d_num);
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  Tensor host_cache = *Tensor::Empty(c.dtype, c.cache.shape());
  std::memcpy(host_cache.data(), c.cache.data(), c.cache.nbytes());
  for (int replay = 0; replay < 3; ++replay) {
    // New lengths and accepted sets, written into the captured buffers.
    const Case next = MakeCase(rng, DType::kBF16, 4, 16, 576, 16, 30, 0, true);
    ASSERT_TRUE(gpu_->Copy(next.cache_len, d_len).ok());
    ASSERT_TRUE(gpu_->Copy(next.accepted, d_accepted).ok());
    ASSERT_TRUE(gpu_->Copy(next.num, d_num).ok());
    ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
    ASSERT_TRUE(gpu_->Synchronize().ok());
    ASSERT_TRUE(cpu_.CompactAccepted(host_cache, c.tables, next.cache_len, next.accepted, next.num).ok());
    EXPECT_TRUE(SameBytes(Download(d_cache), host_cache)) << "replay " << replay;
  }
}

// CudaBackend::CompactAccepted copies rows in 2-, 4- or 16-byte units: a cache of 1-byte elements
// is refused by name before anything is launched (the CPU reference takes it).
TEST_F(CudaCompactTest, OneByteCacheIsRefused) {
  std::mt19937 rng(5);
  const Case c = MakeCase(rng, DType::kF32, 2, 4, 6, 8, 10, 0, true);
  Tensor d_cache = *Tensor::Empty(DType::kU8, Shape{c.num_pages, c.page_size, 24}, gpu_->allocator());
  Tensor d_tables = Upload(c.tables), d_len = Upload(c.cache_len), d_accepted = Upload(c.accepted);
  Tensor d_num = Upload(c.num);
  const absl::Status st = gpu_->CompactAccepted(d_cache, d_tables, d_len, d_accepted, d_num);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("cache is u8")) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("2, 4 or 8 bytes")) << st;
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

// Stage + Launch leave the results on the device: commit_offsets = {0, accepted nodes...} and
// commit_counts = num_accepted + 1, or -1 for a sequence whose logits hold NaN (Finish then reports
// it), which CompactAccepted skips.
TEST_F(CudaCompactTest, VerifierCommitBuffersFollowTheAcceptedPath) {
  cuda::DeviceTreeVerifierOptions vo;
  vo.max_batch = 2;
  vo.max_nodes = 6;
  vo.max_vocab = 64;
  vo.stream = gpu_->stream();
  auto verifier = cuda::DeviceTreeVerifier::Create(vo);
  ASSERT_TRUE(verifier.ok()) << verifier.status();
  cuda::DeviceTreeVerifier& v = **verifier;
  const std::vector<int64_t> tokens = {1, 10, 11, 12, 13};
  const std::vector<int32_t> parents = {-1, 0, 0, 2, 2};
  auto tree = DraftTree::FromParents(tokens, parents);
  ASSERT_TRUE(tree.ok()) << tree.status();
  const std::vector<DraftTree> trees = {*tree, *tree};
  Tensor logits = *Tensor::Zeros(DType::kF32, Shape{10, 64});
  float* l = logits.data_as<float>();
  l[0 * 64 + 11] = 5.0f;  // sequence 0: root -> node 2 (token 11) -> node 4 (token 13), bonus 7
  l[2 * 64 + 13] = 5.0f;
  l[4 * 64 + 7] = 5.0f;
  l[5 * 64 + 3] = std::numeric_limits<float>::quiet_NaN();  // sequence 1, its root row
  Tensor d_logits = Upload(logits);
  ASSERT_TRUE(v.Stage(trees, d_logits, SamplingParams{}, 0, 0).ok());
  ASSERT_TRUE(v.Launch().ok());
  auto results = v.Finish();
  EXPECT_EQ(results.status().code(), absl::StatusCode::kInvalidArgument) << results.status();
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("sequence 1"));
  const Tensor counts = Download(v.commit_counts()), offsets = Download(v.commit_offsets());
  const Tensor num = Download(v.num_accepted()), nodes = Download(v.accepted_nodes());
  ASSERT_EQ(counts.dim(0), 2);
  ASSERT_EQ(offsets.dim(1), 6);
  EXPECT_EQ(num.data_as<int32_t>()[0], 2);
  EXPECT_EQ(num.data_as<int32_t>()[1], -1);
  EXPECT_EQ(nodes.data_as<int32_t>()[0], 2);
  EXPECT_EQ(nodes.data_as<int32_t>()[1], 4);
  EXPECT_EQ(counts.data_as<int32_t>()[0], 3);
  EXPECT_EQ(counts.data_as<int32_t>()[1], -1);
  EXPECT_EQ(std::vector<int32_t>(offsets.data_as<int32_t>(), offsets.data_as<int32_t>() + 3),
            (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(Download(v.out_tokens()).data_as<int64_t>()[2], 7);
  // Launch and Finish need a staged batch.
  ASSERT_FALSE(v.Stage(trees, TensorView(), SamplingParams{}, 0, 0).ok());
  EXPECT_EQ(v.Launch().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(v.Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(v.commit_counts().dim(0), 0);
}

// The verify/commit step captured with the target's backend stream.
const std::string kModel = std::string(EAGLE3_TEST_DATA_DIR) + "/golden/v2_qlora_yarn";

struct Side {
  std::unique_ptr<cuda::CudaBackend> backend;
  std::unique_ptr<TargetModel> model;
  std::unique_ptr<cuda::DeviceTreeVerifier> verifier;
  Tensor logits, tables, lens;  // device: [10, V] f32, [2, 16] i32, [2] i32
};

// A CudaBackend with the golden target model on it (64 pages of 8 rows unless told).
void CreateModel(Side* side, int64_t num_kv_pages = 64, int64_t page_size = 8) {
  auto backend = cuda::CudaBackend::Create();
  ASSERT_TRUE(backend.ok()) << backend.status();
  side->backend = std::move(*backend);
  TargetModelOptions o;
  o.weight_dtype = DType::kF32;
  o.max_tokens_per_forward = 32;
  o.max_context_len = 128;
  o.num_kv_pages = num_kv_pages;
  o.page_size = page_size;
  auto model = TargetModel::Create(kModel, o, nullptr, side->backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  side->model = std::move(*model);
}

// The logits of one Forward of `batch` on the side's model.
std::vector<float> RunForward(Side& side, const std::vector<SequenceInput>& batch) {
  const int64_t vocab = side.model->config().vocab_size;
  const int64_t rows = TargetModel::LogitRows(batch);
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  const absl::Status st = side.model->Forward(batch, TensorView(logits.data(), DType::kF32, Shape{rows, vocab}));
  EXPECT_TRUE(st.ok()) << st;
  return logits;
}

TEST(CompactGraphTest, VerifyLaunchAndDeviceCommitReplaysEqualEagerVerifyAndHostCommit) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<std::vector<int32_t>> pages = {{3, 7, 1, 12, 5, 9, 20, 2, 14, 30, 6, 8, 10, 11, 13, 15},
                                                   {0, 4, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28, 29, 31}};
  Side eager, graphed;
  int64_t vocab = 0;
  for (Side* side : {&eager, &graphed}) {
    ASSERT_NO_FATAL_FAILURE(CreateModel(side));
    vocab = side->model->config().vocab_size;
    cuda::DeviceTreeVerifierOptions vo;
    vo.max_batch = 2;
    vo.max_nodes = 8;
    vo.max_vocab = vocab;
    vo.stream = side->backend->stream();
    auto verifier = cuda::DeviceTreeVerifier::Create(vo);
    ASSERT_TRUE(verifier.ok()) << verifier.status();
    side->verifier = std::move(*verifier);
    side->logits = *Tensor::Empty(DType::kF32, Shape{10, vocab}, side->backend->allocator());
    side->tables = *Tensor::Empty(DType::kI32, Shape{2, 16}, side->backend->allocator());
    side->lens = *Tensor::Empty(DType::kI32, Shape{2}, side->backend->allocator());
    std::vector<int32_t> flat = pages[0];
    flat.insert(flat.end(), pages[1].begin(), pages[1].end());
    ASSERT_TRUE(side->backend->Copy(TensorView(flat.data(), DType::kI32, Shape{2, 16}), side->tables).ok());
  }
  const std::vector<int64_t> p0 = {5, 9, 2, 7, 3, 8, 1}, p1 = {4, 4, 6, 10, 11};
  const std::vector<SequenceInput> prefill = {SequenceInput{p0, {}, pages[0], 0, {}, false},
                                              SequenceInput{p1, {}, pages[1], 0, {}, false}};
  ASSERT_EQ(RunForward(eager, prefill), RunForward(graphed, prefill));
  int64_t len[2] = {7, 5};

  // 5-node trees of changing shapes; designed argmaxes accept the first or the last child of each
  // node, and nothing at the root of sequence 1 on step 3. The commits: {0, 1, 4}, {0, 3},
  // {0, 2, 3, 4} (on replay 1: every source but the last is a destination), {0, 4}, identities
  // ({0, 1, 2, 3, 4}, {0, 1}, {0}), {0, 2}.
  const std::vector<std::vector<int32_t>> shapes = {
      {-1, 0, 0, 1, 1}, {-1, 0, 0, 2, 3}, {-1, 0, 1, 2, 3}, {-1, 0, 0, 0, 2}, {-1, 0, 1, 1, 0}};
  std::unique_ptr<cuda::CudaGraph> graph;
  std::mt19937 rng(7);
  int moved = 0;
  for (int step = 0; step < 6; ++step) {
    std::vector<DraftTree> trees;
    std::vector<std::vector<int64_t>> tokens(2), positions(2);
    std::vector<std::vector<uint8_t>> masks(2);
    for (int b = 0; b < 2; ++b) {
      for (int i = 0; i < 5; ++i) tokens[b].push_back((13 * i + 7 * step + 31 * b + 5) % vocab);
      auto tree = DraftTree::FromParents(tokens[b], shapes[(step + 3 * b) % shapes.size()]);
      ASSERT_TRUE(tree.ok()) << tree.status();
      positions[b] = tree->Positions(len[b]);
      masks[b] = tree->DenseMask();
      trees.push_back(*tree);
    }
    const std::vector<SequenceInput> batch = {SequenceInput{tokens[0], positions[0], pages[0], len[0], masks[0], true},
                                              SequenceInput{tokens[1], positions[1], pages[1], len[1], masks[1], true}};
    // The verify forward writes the trees' KV rows; equal logits also show equal caches so far.
    ASSERT_EQ(RunForward(eager, batch), RunForward(graphed, batch)) << "step " << step;
    // New logits every step (the graph reads them from the same buffer).
    std::vector<float> logits(static_cast<size_t>(10 * vocab));
    std::normal_distribution<float> noise(0.0f, 1.0f);
    for (float& v : logits) v = noise(rng);
    for (int b = 0; b < 2; ++b) {
      const DraftTree& t = trees[b];
      for (int i = 0; i < 5; ++i) {
        int last = -1;
        for (int c = t.first_child[i]; c >= 0; c = t.next_sibling[c]) last = c;
        const int pick = (i + step + b) % 3 == 0 ? t.first_child[i] : last;
        const bool reject = step == 3 && b == 1 && i == 0;
        float* row = logits.data() + (b * 5 + i) * vocab;
        if (reject) {
          for (int c = t.first_child[i]; c >= 0; c = t.next_sibling[c]) row[t.tokens[c]] = -20.0f;
        } else if (pick >= 0) {
          row[t.tokens[pick]] = 20.0f;
        }
      }
    }
    for (Side* side : {&eager, &graphed}) {
      ASSERT_TRUE(side->backend->Copy(TensorView(logits.data(), DType::kF32, Shape{10, vocab}), side->logits).ok());
    }
    const SamplingParams greedy;
    auto want = eager.verifier->Verify(trees, eager.logits, greedy, 1, 0);
    ASSERT_TRUE(want.ok()) << want.status();
    for (int b = 0; b < 2; ++b) {
      std::vector<int64_t> keep = {0};
      for (int32_t node : (*want)[b].accepted_nodes) keep.push_back(node);
      for (size_t j = 0; j < keep.size(); ++j) moved += keep[j] != static_cast<int64_t>(j);
      ASSERT_TRUE(eager.model->CommitAccepted(pages[b], len[b], keep).ok());
    }

    const std::vector<int32_t> lens = {static_cast<int32_t>(len[0]), static_cast<int32_t>(len[1])};
    ASSERT_TRUE(graphed.backend->Copy(TensorView(const_cast<int32_t*>(lens.data()), DType::kI32, Shape{2}),
                                      graphed.lens).ok());
    cuda::DeviceTreeVerifier& v = *graphed.verifier;
    ASSERT_TRUE(v.Stage(trees, graphed.logits, greedy, 1, 0).ok());
    auto enqueue = [&]() -> absl::Status {
      EAGLE3_RETURN_IF_ERROR(v.Launch());
      return graphed.model->CommitAcceptedOnDevice(graphed.tables, graphed.lens, v.commit_offsets(),
                                                   v.commit_counts());
    };
    if (step == 0) {
      ASSERT_TRUE(enqueue().ok());  // eager first
    } else {
      if (graph == nullptr) {
        auto captured = cuda::CudaGraph::Capture(graphed.backend->stream(), enqueue);
        ASSERT_TRUE(captured.ok()) << captured.status();
        graph = std::move(*captured);
      }
      ASSERT_TRUE(graph->Launch(graphed.backend->stream()).ok());
    }
    auto got = v.Finish();
    ASSERT_TRUE(got.ok()) << got.status();
    const absl::Status synced = graphed.backend->Synchronize();
    ASSERT_TRUE(synced.ok()) << synced;
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ((*got)[b].accepted_nodes, (*want)[b].accepted_nodes) << "step " << step << " sequence " << b;
      EXPECT_EQ((*got)[b].tokens, (*want)[b].tokens) << "step " << step << " sequence " << b;
      len[b] += (*want)[b].num_accepted() + 1;
    }
  }
  EXPECT_EQ(moved, 9) << "the designed trees move 9 rows";
  // The caches after the last commit, through one more token per sequence.
  const std::vector<int64_t> t0 = {17}, t1 = {23};
  const std::vector<SequenceInput> last = {SequenceInput{t0, {}, pages[0], len[0], {}, false},
                                           SequenceInput{t1, {}, pages[1], len[1], {}, false}};
  EXPECT_EQ(RunForward(eager, last), RunForward(graphed, last));
}

// TargetModel::CommitAccepted with a page table longer than the cache's page pool (80 entries,
// num_kv_pages 64) uploads only the entries its moves touch: the same commit as through the table's
// first 16 entries, seen through the next forward's logits. Moves cross a page boundary past page 0.
TEST(CompactGraphTest, CommitAcceptedTakesAPageTableLongerThanThePool) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<int32_t> pages = {3, 7, 1, 12, 5, 9, 20, 2, 14, 30, 6, 8, 10, 11, 13, 15};
  std::vector<int32_t> long_pages = pages;
  for (int32_t p = 0; p < 64; ++p) long_pages.push_back(p);
  Side with_long, with_short;
  for (Side* side : {&with_long, &with_short}) ASSERT_NO_FATAL_FAILURE(CreateModel(side));
  const int64_t vocab = with_long.model->config().vocab_size;
  std::vector<int64_t> prompt(13);
  for (int i = 0; i < 13; ++i) prompt[i] = (7 * i + 3) % vocab;
  // A 5-node chain at cache_len 13: slots 13..17 (pages 1 and 2 of the table).
  const std::vector<int64_t> tokens = {4 % vocab, 9 % vocab, 2 % vocab, 6 % vocab, 8 % vocab};
  auto tree = DraftTree::FromParents(tokens, std::vector<int32_t>{-1, 0, 1, 2, 3});
  ASSERT_TRUE(tree.ok()) << tree.status();
  const std::vector<int64_t> positions = tree->Positions(13);
  const std::vector<uint8_t> mask = tree->DenseMask();
  for (Side* side : {&with_long, &with_short}) {
    RunForward(*side, {SequenceInput{prompt, {}, pages, 0, {}, false}});
    RunForward(*side, {SequenceInput{tokens, positions, pages, 13, mask, true}});
  }
  const std::vector<int64_t> keep = {0, 2, 4};  // 15 -> 14 and 17 -> 15
  const absl::Status long_status = with_long.model->CommitAccepted(long_pages, 13, keep);
  ASSERT_TRUE(long_status.ok()) << long_status;
  ASSERT_TRUE(with_short.model->CommitAccepted(pages, 13, keep).ok());
  const std::vector<int64_t> next = {5};
  EXPECT_EQ(RunForward(with_long, {SequenceInput{next, {}, pages, 16, {}, false}}),
            RunForward(with_short, {SequenceInput{next, {}, pages, 16, {}, false}}));
}

// Moves whose positions span more page entries than the pool has pages must list a page twice:
// InvalidArgument from the host checks.
TEST(CompactGraphTest, CommitAcceptedRefusesMovesSpanningMorePagesThanThePool) {
  if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Side side;
  ASSERT_NO_FATAL_FAILURE(CreateModel(&side, /*num_kv_pages=*/2, /*page_size=*/1));
  const std::vector<int32_t> table = {0, 1, 0, 1, 0, 1, 0, 1};
  const absl::Status st = side.model->CommitAccepted(table, 0, std::vector<int64_t>{0, 5});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("span 6 entries of page_table")) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("num_kv_pages 2")) << st;
}

}  // namespace
}  // namespace eagle3
