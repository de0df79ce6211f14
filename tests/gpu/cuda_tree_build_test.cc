// LaunchTreeBuildStep / LaunchTreeBuildFinalize (eagle3/cuda/tree_ops.h) ≡ BuildDraftTree (the CPU
// reference) fed the same logits: the trees (tokens, parents, depths, positions, dense mask) are
// identical and the scores agree to 1e-6 relative, on random logits (batch 1..32, topk 1/4/8/16,
// steps 1..7, up to 64 nodes, V 20..160000, with and without d2t, padded rows), on integer logits
// full of ties, and on rows that are mostly -inf; each step's frontier outputs are the frontier the
// reference hands its callback next. Bad logits give a per-sequence error naming the step, the row
// and the draft id (the others still build); bad parameters are cudaErrorInvalidValue. One workspace
// serves every case (its counters must come back to zero). Skipped where no CUDA device is visible.
//
// Ties and precision: the device sums each row's exp(x - max) in another order than the reference,
// so its normalizer can differ in the last bits. The random cases cannot produce scores that close
// across rows; the tie cases repeat one row bit for bit across a step (identical normalizers on each
// side), so every tie is exact on both sides and must break to the lower candidate index.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "eagle3/cuda/device_allocator.h"
#include "eagle3/cuda/tree_ops.h"
#include "eagle3/draft_tree.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "device_buffer.h"

namespace eagle3::cuda {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

template <typename T>
std::vector<T> Download(const DeviceBuffer& d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d.ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

enum class Logits { kNormal, kTies, kMasked };

struct Case {
  int batch, topk, steps, tokens;
  int64_t vocab;
  bool d2t;
  Logits logits = Logits::kNormal;
  int64_t pad = 0;  // ld = vocab + pad
};

std::string Name(const Case& c) {
  return "B" + std::to_string(c.batch) + " k" + std::to_string(c.topk) + " S" + std::to_string(c.steps) + " N" +
         std::to_string(c.tokens) + " V" + std::to_string(c.vocab) + (c.d2t ? " d2t" : "") +
         " logits" + std::to_string(static_cast<int>(c.logits)) + " pad" + std::to_string(c.pad);
}

// The logits of every step: [steps][batch * F * vocab] (F = 1 at step 0, else topk), row-major.
std::vector<std::vector<float>> MakeLogits(const Case& c, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<float>> out(c.steps);
  for (int s = 0; s < c.steps; ++s) {
    const int64_t rows = static_cast<int64_t>(c.batch) * (s == 0 ? 1 : c.topk);
    std::vector<float>& l = out[s];
    l.resize(static_cast<size_t>(rows * c.vocab));
    if (c.logits == Logits::kNormal) {
      std::normal_distribution<float> normal(0.0f, 2.0f);
      for (float& x : l) x = normal(rng);
    } else if (c.logits == Logits::kTies) {
      // One row of small integers, repeated bit for bit over the step.
      std::vector<float> row(c.vocab);
      for (float& x : row) x = static_cast<float>(rng() % 4);
      for (int64_t r = 0; r < rows; ++r) std::copy(row.begin(), row.end(), l.begin() + r * c.vocab);
    } else {
      // Mostly -inf: 1..6 finite values per row (a row may have fewer than topk).
      std::fill(l.begin(), l.end(), -kInf);
      for (int64_t r = 0; r < rows; ++r) {
        const int finite = 1 + static_cast<int>(rng() % 6);
        for (int i = 0; i < finite; ++i) l[r * c.vocab + static_cast<int64_t>(rng() % c.vocab)] = static_cast<float>(rng() % 3);
      }
    }
  }
  return out;
}

// What the reference saw at each step: the frontier and the candidates so far.
struct Seen {
  std::vector<std::vector<int32_t>> frontier;  // [step]
  std::vector<DraftCandidate> candidates;      // at the last call
};

absl::StatusOr<DraftTree> HostBuild(const Case& c, const std::vector<std::vector<float>>& logits, int b,
                                    int64_t root, std::span<const int64_t> d2t, Seen* seen) {
  DraftTreeParams params{c.topk, c.steps, c.tokens};
  int step = 0;
  auto expand = [&](std::span<const DraftCandidate> candidates, std::span<const int32_t> frontier,
                    const TensorView& out) -> absl::Status {
    const int64_t rows = static_cast<int64_t>(frontier.size());
    const float* src = logits[step].data() + static_cast<int64_t>(b) * rows * c.vocab;
    std::memcpy(out.data(), src, static_cast<size_t>(rows * c.vocab) * sizeof(float));
    seen->frontier.emplace_back(frontier.begin(), frontier.end());
    seen->candidates.assign(candidates.begin(), candidates.end());
    ++step;
    return absl::OkStatus();
  };
  return BuildDraftTree(root, params, c.vocab, d2t, expand);
}

// A sequence that must fail, and where.
struct Failure {
  int sequence;
  int64_t step, row, draft_id;
};

void ExpectScore(float got, float want, const std::string& what) {
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << what;
  } else {
    EXPECT_NEAR(got, want, 1e-6 * std::max(1.0f, std::fabs(want))) << what;
  }
}

class CudaTreeBuildTest : public ::testing::Test {
 protected:
  // Sized for the largest case: batch 32, topk 16, 7 steps.
  static constexpr int kMaxBatch = 32, kMaxK = 16, kMaxSteps = 7;

  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    workspace_bytes_ = TreeBuildWorkspaceBytes(kMaxBatch, kMaxK, kMaxSteps);
    ASSERT_GT(workspace_bytes_, 0u);
    workspace_ = std::make_unique<DeviceBuffer>(workspace_bytes_);
    ASSERT_EQ(cudaMemset(workspace_->ptr, 0, workspace_bytes_), cudaSuccess);
    errors_ = std::make_unique<DeviceBuffer>(kMaxBatch * sizeof(TreeBuildError));
  }

  TreeBuildParams Params(const Case& c) const {
    TreeBuildParams p;
    p.batch = c.batch;
    p.topk = c.topk;
    p.num_steps = c.steps;
    p.num_draft_tokens = c.tokens;
    p.vocab = c.vocab;
    p.workspace = workspace_->ptr;
    p.workspace_bytes = workspace_bytes_;
    p.errors = errors_->as<TreeBuildError>();
    return p;
  }

  // Builds every sequence on the device and checks it against the reference; sequences listed in
  // `failing` must fail on both sides with the same step, row and draft id.
  void Check(const Case& c, const std::vector<std::vector<float>>& logits, uint32_t seed,
             const std::vector<Failure>& failing = {}) {
    SCOPED_TRACE(Name(c));
    std::mt19937_64 rng(seed);
    const int B = c.batch, k = c.topk, N = c.tokens;
    const int64_t V = c.vocab, ld = V + c.pad;
    std::vector<int64_t> d2t;
    if (c.d2t) {
      d2t.resize(V);
      for (int64_t& o : d2t) o = static_cast<int64_t>(rng() % 1000);
    }
    std::vector<int64_t> roots(B), positions(B);
    for (int b = 0; b < B; ++b) {
      roots[b] = static_cast<int64_t>(rng() % 50000);
      positions[b] = 100 + 7 * b;
    }
    const TreeBuildParams params = Params(c);
    DeviceBuffer d_d2t(V * sizeof(int64_t)), d_roots(B * sizeof(int64_t)), d_positions(B * sizeof(int64_t));
    ASSERT_EQ(cudaMemcpy(d_roots.ptr, roots.data(), B * sizeof(int64_t), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_positions.ptr, positions.data(), B * sizeof(int64_t), cudaMemcpyHostToDevice), cudaSuccess);
    if (c.d2t) {
      ASSERT_EQ(cudaMemcpy(d_d2t.ptr, d2t.data(), V * sizeof(int64_t), cudaMemcpyHostToDevice), cudaSuccess);
    }
    const size_t fk = static_cast<size_t>(B) * k;
    DeviceBuffer f_cand(fk * 4), f_draft(fk * 8), f_tok(fk * 8), f_par(fk * 4), f_rows(fk * 4), f_depth(fk * 4),
        f_score(fk * 4);
    TreeFrontier frontier{f_cand.as<int32_t>(), f_draft.as<int64_t>(), f_tok.as<int64_t>(), f_par.as<int32_t>(),
                          f_rows.as<int32_t>(),  f_depth.as<int32_t>(), f_score.as<float>()};
    std::vector<std::vector<int32_t>> dev_frontier(c.steps);  // [step][b * k + r], after step s
    std::vector<std::vector<int64_t>> dev_draft(c.steps), dev_tok(c.steps);
    std::vector<std::vector<int32_t>> dev_par(c.steps), dev_rows(c.steps), dev_depth(c.steps);
    std::vector<std::vector<float>> dev_score(c.steps);
    for (int s = 0; s < c.steps; ++s) {
      const int64_t rows = static_cast<int64_t>(B) * (s == 0 ? 1 : k);
      DeviceBuffer d_logits(static_cast<size_t>(rows * ld) * sizeof(float));
      ASSERT_EQ(cudaMemcpy2D(d_logits.ptr, ld * sizeof(float), logits[s].data(), V * sizeof(float), V * sizeof(float),
                             rows, cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(LaunchTreeBuildStep(params, s, d_logits.as<float>(), ld, c.d2t ? d_d2t.as<int64_t>() : nullptr, frontier,
                                    /*programmatic=*/true, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (s + 1 < c.steps) {
        dev_frontier[s] = Download<int32_t>(f_cand, fk);
        dev_draft[s] = Download<int64_t>(f_draft, fk);
        dev_tok[s] = Download<int64_t>(f_tok, fk);
        dev_par[s] = Download<int32_t>(f_par, fk);
        dev_rows[s] = Download<int32_t>(f_rows, fk);
        dev_depth[s] = Download<int32_t>(f_depth, fk);
        dev_score[s] = Download<float>(f_score, fk);
      }
    }
    const size_t bn = static_cast<size_t>(B) * N;
    DeviceBuffer o_tok(bn * 8), o_par(bn * 4), o_depth(bn * 4), o_pos(bn * 8), o_score(bn * 4), o_mask(bn * N);
    // Untouched outputs (sequences in error) keep this pattern.
    for (DeviceBuffer* d : {&o_tok, &o_pos}) ASSERT_EQ(cudaMemset(d->ptr, 0x5A, bn * 8), cudaSuccess);
    for (DeviceBuffer* d : {&o_par, &o_depth, &o_score}) ASSERT_EQ(cudaMemset(d->ptr, 0x5A, bn * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(o_mask.ptr, 0x5A, bn * N), cudaSuccess);
    TreeBuildOutputs outputs{d_roots.as<int64_t>(), d_positions.as<int64_t>(), o_tok.as<int64_t>(),
                             o_par.as<int32_t>(),   o_depth.as<int32_t>(),     o_pos.as<int64_t>(),
                             o_score.as<float>(),   o_mask.as<uint8_t>()};
    ASSERT_EQ(LaunchTreeBuildFinalize(params, outputs, /*programmatic=*/true, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto tokens = Download<int64_t>(o_tok, bn);
    const auto parents = Download<int32_t>(o_par, bn);
    const auto depths = Download<int32_t>(o_depth, bn);
    const auto pos = Download<int64_t>(o_pos, bn);
    const auto scores = Download<float>(o_score, bn);
    const auto mask = Download<uint8_t>(o_mask, bn * N);
    const auto errors = Download<TreeBuildError>(*errors_, B);

    for (int b = 0; b < B; ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      Seen seen;
      const absl::StatusOr<DraftTree> want = HostBuild(c, logits, b, roots[b], d2t, &seen);
      const Failure* fail = nullptr;
      for (const Failure& f : failing) {
        if (f.sequence == b) fail = &f;
      }
      if (fail != nullptr) {
        ASSERT_FALSE(want.ok());
        EXPECT_THAT(std::string(want.status().message()),
                    HasSubstr("step " + std::to_string(fail->step) + " row " + std::to_string(fail->row)));
        if (fail->draft_id >= 0) {
          EXPECT_THAT(std::string(want.status().message()), HasSubstr("draft id " + std::to_string(fail->draft_id)));
        }
        EXPECT_NE(errors[b].kind, static_cast<int64_t>(TreeBuildErrorKind::kNone));
        EXPECT_EQ(errors[b].step, fail->step);
        EXPECT_EQ(errors[b].row, fail->row);
        EXPECT_EQ(errors[b].draft_id, fail->draft_id);
        for (int i = 0; i < N; ++i) {
          EXPECT_EQ(parents[b * N + i], 0x5A5A5A5A) << "a sequence in error wrote node " << i;
          EXPECT_EQ(mask[(static_cast<size_t>(b) * N + i) * N], 0x5A);
        }
        continue;
      }
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(errors[b].kind, static_cast<int64_t>(TreeBuildErrorKind::kNone));
      // The frontiers the reference expanded at steps 1.. are the ones the device wrote.
      for (int s = 0; s + 1 < c.steps; ++s) {
        const std::vector<int32_t>& hf = seen.frontier[s + 1];
        const std::vector<int32_t>& prev = seen.frontier[s];
        ASSERT_EQ(static_cast<int>(hf.size()), k);
        for (int r = 0; r < k; ++r) {
          const size_t o = static_cast<size_t>(b) * k + r;
          const DraftCandidate& cand = seen.candidates[hf[r]];
          EXPECT_EQ(dev_frontier[s][o], hf[r]) << "step " << s << " frontier row " << r;
          EXPECT_EQ(dev_draft[s][o], cand.draft_id);
          EXPECT_EQ(dev_tok[s][o], cand.token);
          EXPECT_EQ(dev_par[s][o], cand.parent);
          EXPECT_EQ(dev_depth[s][o], cand.depth);
          EXPECT_EQ(prev[dev_rows[s][o]], cand.parent) << "parent row";
          ExpectScore(dev_score[s][o], cand.score, "frontier score");
        }
      }
      const DraftTree& t = *want;
      ASSERT_EQ(t.size(), N);
      const std::vector<int64_t> want_pos = t.Positions(positions[b]);
      const std::vector<uint8_t> want_mask = t.DenseMask();
      for (int i = 0; i < N; ++i) {
        const size_t o = static_cast<size_t>(b) * N + i;
        EXPECT_EQ(tokens[o], t.tokens[i]) << "node " << i;
        EXPECT_EQ(parents[o], t.parents[i]) << "node " << i;
        EXPECT_EQ(depths[o], t.depths[i]) << "node " << i;
        EXPECT_EQ(pos[o], want_pos[i]) << "node " << i;
        ExpectScore(scores[o], t.scores[i], "node " + std::to_string(i));
      }
      const std::vector<uint8_t> got_mask(mask.begin() + static_cast<ptrdiff_t>(b) * N * N,
                                          mask.begin() + static_cast<ptrdiff_t>(b + 1) * N * N);
      EXPECT_EQ(got_mask, want_mask);
    }
  }

  size_t workspace_bytes_ = 0;
  std::unique_ptr<DeviceBuffer> workspace_, errors_;
};

TEST_F(CudaTreeBuildTest, RandomLogitsBuildTheReferenceTrees) {
  const std::vector<Case> cases = {
      {1, 1, 1, 2, 32000, false},       {4, 4, 3, 16, 32000, true},      {32, 8, 5, 64, 32000, true},
      {8, 8, 7, 64, 32000, false},      {32, 4, 7, 64, 100, true, Logits::kNormal, 1},
      {3, 1, 7, 8, 100, false},         {16, 16, 3, 64, 32000, true},    {2, 8, 2, 73, 100, false},
      {5, 4, 4, 10, 160000, true},      {7, 16, 2, 200, 20, false},      {1, 8, 6, 48, 32000, true, Logits::kNormal, 3},
      {32, 1, 4, 5, 32000, false},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    Check(c, MakeLogits(c, seed), seed);
    ++seed;
  }
}

TEST_F(CudaTreeBuildTest, TiesBreakAsTheReference) {
  const std::vector<Case> cases = {
      {4, 4, 4, 20, 1000, false, Logits::kTies},
      {8, 8, 5, 64, 32000, true, Logits::kTies},
      {3, 16, 3, 100, 64, false, Logits::kTies},
      {2, 1, 5, 6, 7, false, Logits::kTies},
  };
  uint32_t seed = 100;
  for (const Case& c : cases) {
    Check(c, MakeLogits(c, seed), seed);
    ++seed;
  }
}

TEST_F(CudaTreeBuildTest, MaskedRowsRankMinusInfinityLast) {
  const std::vector<Case> cases = {
      {8, 4, 4, 16, 40, false, Logits::kMasked},
      {4, 8, 3, 40, 40, true, Logits::kMasked},
  };
  uint32_t seed = 200;
  for (const Case& c : cases) {
    Check(c, MakeLogits(c, seed), seed);
    ++seed;
  }
}

TEST_F(CudaTreeBuildTest, BadLogitsAreReportedPerSequence) {
  const Case c{5, 4, 4, 12, 32000, false};
  std::vector<std::vector<float>> logits = MakeLogits(c, 300);
  const int64_t V = c.vocab, k = c.topk;
  // Sequence 1: NaN at step 1, row 2, ids 7 and 900, +inf at id 50: the lowest bad id is reported.
  logits[1][(1 * k + 2) * V + 7] = kNaN;
  logits[1][(1 * k + 2) * V + 900] = kNaN;
  logits[1][(1 * k + 2) * V + 50] = kInf;
  // A bad value in a later row of the same step does not win over row 2.
  logits[1][(1 * k + 3) * V + 1] = kInf;
  // Sequence 2: +inf at step 0, id 31999.
  logits[0][2 * V + 31999] = kInf;
  // Sequence 3: step 3, row 1 all -inf.
  std::fill(logits[3].begin() + (3 * k + 1) * V, logits[3].begin() + (3 * k + 2) * V, -kInf);
  Check(c, logits, 300, {{1, 1, 2, 7}, {2, 0, 0, 31999}, {3, 3, 1, -1}});

  // The kinds themselves.
  const auto errors = Download<TreeBuildError>(*errors_, c.batch);
  EXPECT_EQ(errors[0].kind, static_cast<int64_t>(TreeBuildErrorKind::kNone));
  EXPECT_EQ(errors[1].kind, static_cast<int64_t>(TreeBuildErrorKind::kNaN));
  EXPECT_EQ(errors[2].kind, static_cast<int64_t>(TreeBuildErrorKind::kPosInf));
  EXPECT_EQ(errors[3].kind, static_cast<int64_t>(TreeBuildErrorKind::kNoFiniteLogit));
  EXPECT_EQ(errors[4].kind, static_cast<int64_t>(TreeBuildErrorKind::kNone));

  // The same workspace builds a clean batch afterwards (the counters came back to zero).
  const Case clean{32, 8, 5, 64, 32000, true};
  Check(clean, MakeLogits(clean, 301), 301);
}

TEST_F(CudaTreeBuildTest, BadParametersAreInvalid) {
  const Case c{2, 4, 3, 8, 1000, false};
  DeviceBuffer logits(static_cast<size_t>(2 * 4 * 1000) * sizeof(float));
  ASSERT_EQ(cudaMemset(logits.ptr, 0, 2 * 4 * 1000 * sizeof(float)), cudaSuccess);
  const float* l = logits.as<float>();
  const TreeFrontier none;
  auto step = [&](const TreeBuildParams& p, int s = 0, int64_t ld = 1000, const float* x = nullptr) {
    return LaunchTreeBuildStep(p, s, x == nullptr ? l : x, ld, nullptr, none, true, nullptr);
  };
  const TreeBuildParams good = Params(c);
  EXPECT_EQ(step(good), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto with = [&](auto edit) {
    TreeBuildParams p = good;
    edit(p);
    return p;
  };
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.batch = -1; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.batch = kTreeMaxBatch + 1; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.topk = 0; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.topk = kTreeMaxTopk + 1; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.vocab = 3; })), cudaErrorInvalidValue);  // topk > vocab
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.vocab = 0; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.vocab = kTreeMaxVocab + 1; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.num_steps = 0; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.num_steps = kTreeMaxSteps + 1; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.num_draft_tokens = 1; })), cudaErrorInvalidValue);
  // 1 + 4 + 2 * 16 = 37 nodes at most.
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.num_draft_tokens = 38; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) {
              p.topk = 16;
              p.num_draft_tokens = kTreeMaxNodes + 1;
            })),
            cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.workspace = nullptr; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.workspace = static_cast<char*>(p.workspace) + 8; })),
            cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.workspace_bytes = TreeBuildWorkspaceBytes(2, 4, 3) - 1; })),
            cudaErrorInvalidValue);
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.errors = nullptr; })), cudaErrorInvalidValue);
  EXPECT_EQ(step(good, -1), cudaErrorInvalidValue);
  EXPECT_EQ(step(good, 3), cudaErrorInvalidValue);
  EXPECT_EQ(step(good, 0, 999), cudaErrorInvalidValue);  // ld < vocab
  EXPECT_EQ(LaunchTreeBuildStep(good, 0, nullptr, 1000, nullptr, none, true, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(TreeBuildWorkspaceBytes(2, 0, 3), 0u);
  EXPECT_EQ(TreeBuildWorkspaceBytes(2, 4, kTreeMaxSteps + 1), 0u);
  EXPECT_EQ(TreeBuildWorkspaceBytes(-1, 4, 3), 0u);
  EXPECT_EQ(TreeBuildWorkspaceBytes(kTreeMaxBatch + 1, 4, 3), 0u);
  EXPECT_GE(TreeBuildWorkspaceBytes(3, 4, 3), TreeBuildWorkspaceBytes(2, 4, 3));

  const TreeBuildOutputs no_outputs;
  EXPECT_EQ(LaunchTreeBuildFinalize(good, no_outputs, true, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchTreeBuildFinalize(with([](TreeBuildParams& p) { p.num_draft_tokens = 38; }), no_outputs, true, nullptr),
            cudaErrorInvalidValue);
  // An empty batch launches nothing and succeeds.
  EXPECT_EQ(step(with([](TreeBuildParams& p) { p.batch = 0; })), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace eagle3::cuda
