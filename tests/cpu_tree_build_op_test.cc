// CpuBackend::TreeBuildStep / TreeBuildFinalize ≡ BuildDraftTree per sequence: on random batches
// (topk 1/2/4, 1..4 steps, various N and V, with and without d2t, padded logits rows, logits full
// of ties) the trees (tokens, parents, positions, the [B * N, N] mask) are BuildDraftTree's and each
// step's frontier is the one BuildDraftTree hands its callback next. NaN / +inf / all -inf rows give
// the sequence an error record while the other sequences build; bad arguments are InvalidArgument
// naming the op and the tensor.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/draft_tree.h"
#include "eagle3/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace eagle3 {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kUnwritten = -7;

struct Case {
  int batch, topk, steps, tokens;
  int64_t vocab;
  bool d2t = false;
  bool ties = false;
  int64_t pad = 0;  // row stride = vocab + pad

  TreeBuildShape BuildShape() const { return {batch, topk, steps, tokens, vocab}; }
  int64_t Rows(int step) const { return static_cast<int64_t>(batch) * (step == 0 ? 1 : topk); }
};

std::string Name(const Case& c) {
  return "B" + std::to_string(c.batch) + " k" + std::to_string(c.topk) + " S" + std::to_string(c.steps) +
         " N" + std::to_string(c.tokens) + " V" + std::to_string(c.vocab) + (c.d2t ? " d2t" : "") +
         (c.ties ? " ties" : "") + " pad" + std::to_string(c.pad);
}

Tensor Make(DType dtype, const Shape& shape) { return *Tensor::Zeros(dtype, shape); }

// Every step's logits, [steps][Rows(step) * vocab] row-major: normal values, or small integers (ties
// within and across rows).
std::vector<std::vector<float>> MakeLogits(const Case& c, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<std::vector<float>> out(c.steps);
  for (int s = 0; s < c.steps; ++s) {
    out[s].resize(static_cast<size_t>(c.Rows(s) * c.vocab));
    for (float& x : out[s]) x = c.ties ? static_cast<float>(rng() % 4) : normal(rng);
  }
  return out;
}

// What BuildDraftTree does for sequence b: its tree, and each step's frontier and candidates.
struct Reference {
  absl::StatusOr<DraftTree> tree;
  std::vector<std::vector<int32_t>> frontier;  // [step]: the callback's frontier
  std::vector<DraftCandidate> candidates;      // at the last call
};

Reference BuildReference(const Case& c, const std::vector<std::vector<float>>& logits, int b, int64_t root,
                         std::span<const int64_t> d2t) {
  Reference ref;
  int step = 0;
  auto expand = [&](std::span<const DraftCandidate> candidates, std::span<const int32_t> frontier,
                    const TensorView& out) -> absl::Status {
    const int64_t rows = static_cast<int64_t>(frontier.size());
    std::memcpy(out.data(), logits[step].data() + b * rows * c.vocab,
                static_cast<size_t>(rows * c.vocab) * sizeof(float));
    ref.frontier.emplace_back(frontier.begin(), frontier.end());
    ref.candidates.assign(candidates.begin(), candidates.end());
    ++step;
    return absl::OkStatus();
  };
  ref.tree = BuildDraftTree(root, DraftTreeParams{c.topk, c.steps, c.tokens}, c.vocab, d2t, expand);
  return ref;
}

// The op's results: the frontier after each step but the last, the error records, the trees.
struct OpResult {
  std::vector<std::vector<int64_t>> frontier_tokens;   // [step][B * k]
  std::vector<std::vector<int32_t>> frontier_parents;  // [step][B * k]
  Tensor errors, tokens, parents, positions, mask;
};

// Runs the op over every step on `workspace` (sized by the caller) and finalizes.
OpResult RunOp(cpu::CpuBackend& backend, const Case& c, const std::vector<std::vector<float>>& logits,
               const std::vector<int64_t>& roots, const std::vector<int64_t>& root_positions,
               const std::vector<int64_t>& d2t, const TensorView& workspace, const TensorView& errors) {
  const TreeBuildShape shape = c.BuildShape();
  const int64_t B = c.batch, k = c.topk, N = c.tokens, V = c.vocab;
  OpResult r;
  Tensor d2t_tensor = Make(DType::kI64, {V});
  std::copy(d2t.begin(), d2t.end(), d2t_tensor.data_as<int64_t>());
  const TensorView d2t_view = c.d2t ? d2t_tensor.view() : TensorView();
  Tensor frontier_tokens = Make(DType::kI64, {B * k});
  Tensor frontier_parents = Make(DType::kI32, {B * k});
  for (int s = 0; s < c.steps; ++s) {
    const int64_t rows = c.Rows(s);
    Tensor padded = Make(DType::kF32, {rows * (V + c.pad)});
    for (int64_t i = 0; i < rows; ++i) {
      std::copy_n(logits[s].begin() + i * V, V, padded.data_as<float>() + i * (V + c.pad));
    }
    const TensorView view(padded.data(), DType::kF32, {rows, V}, {V + c.pad, 1}, Device::Cpu());
    std::fill_n(frontier_tokens.data_as<int64_t>(), B * k, kUnwritten);
    std::fill_n(frontier_parents.data_as<int32_t>(), B * k, static_cast<int32_t>(kUnwritten));
    const absl::Status st =
        backend.TreeBuildStep(shape, s, view, d2t_view, workspace, errors, frontier_tokens, frontier_parents);
    EXPECT_TRUE(st.ok()) << st;
    r.frontier_tokens.emplace_back(frontier_tokens.data_as<int64_t>(), frontier_tokens.data_as<int64_t>() + B * k);
    r.frontier_parents.emplace_back(frontier_parents.data_as<int32_t>(),
                                    frontier_parents.data_as<int32_t>() + B * k);
  }
  Tensor root_tokens = Make(DType::kI64, {B}), positions_in = Make(DType::kI64, {B});
  std::copy(roots.begin(), roots.end(), root_tokens.data_as<int64_t>());
  std::copy(root_positions.begin(), root_positions.end(), positions_in.data_as<int64_t>());
  r.tokens = Make(DType::kI64, {B, N});
  r.parents = Make(DType::kI32, {B, N});
  r.positions = Make(DType::kI64, {B, N});
  r.mask = Make(DType::kU8, {B * N, N});
  std::fill_n(r.tokens.data_as<int64_t>(), B * N, kUnwritten);
  std::fill_n(r.parents.data_as<int32_t>(), B * N, static_cast<int32_t>(kUnwritten));
  std::fill_n(r.positions.data_as<int64_t>(), B * N, kUnwritten);
  std::fill_n(r.mask.data_as<uint8_t>(), B * N * N, uint8_t{0xAB});
  const absl::Status st = backend.TreeBuildFinalize(shape, workspace, errors, root_tokens, positions_in, r.tokens,
                                                    r.parents, r.positions, r.mask);
  EXPECT_TRUE(st.ok()) << st;
  r.errors = Make(DType::kI64, {B, kTreeBuildErrorWidth});
  std::memcpy(r.errors.data(), errors.data(), errors.nbytes());
  return r;
}

// A sequence whose logits are poisoned, and the record it must get.
struct Poison {
  int sequence, step, row;
  int64_t draft_id;  // -1: the whole row -inf
  float value;
  int64_t kind;
};

class CpuTreeBuildOpTest : public ::testing::Test {
 protected:
  // Builds every sequence with the op and with BuildDraftTree and compares them; `poisons` are
  // applied to the logits first.
  // An empty `workspace` gives the case one of its own size.
  void Check(const Case& c, uint32_t seed, const std::vector<Poison>& poisons = {},
             const TensorView& workspace = TensorView()) {
    SCOPED_TRACE(Name(c));
    std::mt19937_64 rng(seed);
    const int B = c.batch, k = c.topk, N = c.tokens;
    std::vector<std::vector<float>> logits = MakeLogits(c, seed);
    for (const Poison& p : poisons) {
      const int64_t rows_per_sequence = p.step == 0 ? 1 : k;
      float* row = logits[p.step].data() + (p.sequence * rows_per_sequence + p.row) * c.vocab;
      if (p.draft_id < 0) {
        std::fill_n(row, c.vocab, -kInf);
      } else {
        row[p.draft_id] = p.value;
      }
    }
    std::vector<int64_t> d2t(static_cast<size_t>(c.vocab), 0);
    if (c.d2t) {
      for (int64_t& o : d2t) o = static_cast<int64_t>(rng() % 1000);
    }
    std::vector<int64_t> roots(B), root_positions(B);
    for (int b = 0; b < B; ++b) {
      roots[b] = static_cast<int64_t>(rng() % 50000);
      root_positions[b] = 100 + 7 * b;
    }
    const int64_t bytes = backend_.TreeBuildWorkspaceBytes(c.BuildShape());
    ASSERT_GT(bytes, 0);
    const Tensor own_workspace = workspace.empty() ? Make(DType::kU8, {bytes}) : Tensor();
    const Tensor errors = Make(DType::kI64, {B, kTreeBuildErrorWidth});
    std::fill_n(errors.data_as<int64_t>(), B * kTreeBuildErrorWidth, int64_t{99});  // step 0 resets them
    const OpResult op = RunOp(backend_, c, logits, roots, root_positions, d2t,
                               workspace.empty() ? own_workspace.view() : workspace, errors);

    for (int b = 0; b < B; ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      const Reference ref =
          BuildReference(c, logits, b, roots[b], c.d2t ? std::span<const int64_t>(d2t) : std::span<const int64_t>());
      const int64_t* record = op.errors.data_as<int64_t>() + b * kTreeBuildErrorWidth;
      const std::vector<int64_t> got_record(record, record + kTreeBuildErrorWidth);
      const auto poison = std::find_if(poisons.begin(), poisons.end(),
                                       [b](const Poison& p) { return p.sequence == b; });
      if (poison != poisons.end()) {
        ASSERT_FALSE(ref.tree.ok());
        EXPECT_THAT(std::string(ref.tree.status().message()),
                    HasSubstr("step " + std::to_string(poison->step) + " row " + std::to_string(poison->row)));
        EXPECT_THAT(got_record, ElementsAreArray({poison->kind, int64_t{poison->step}, int64_t{poison->row},
                                                  poison->draft_id}));
        // Nothing of an erroneous sequence is written from its failing step on.
        for (int s = poison->step; s + 1 < c.steps; ++s) {
          for (int f = 0; f < k; ++f) EXPECT_EQ(op.frontier_tokens[s][b * k + f], kUnwritten);
        }
        for (int i = 0; i < N; ++i) {
          EXPECT_EQ(op.tokens.data_as<int64_t>()[b * N + i], kUnwritten);
          EXPECT_EQ(op.parents.data_as<int32_t>()[b * N + i], kUnwritten);
          EXPECT_EQ(op.positions.data_as<int64_t>()[b * N + i], kUnwritten);
          for (int j = 0; j < N; ++j) EXPECT_EQ(op.mask.data_as<uint8_t>()[(b * N + i) * N + j], 0xAB);
        }
        continue;
      }
      ASSERT_TRUE(ref.tree.ok()) << ref.tree.status();
      EXPECT_THAT(got_record, ElementsAreArray({0, 0, 0, 0}));
      const DraftTree& tree = *ref.tree;
      const std::span<const int64_t> tokens(op.tokens.data_as<int64_t>() + b * N, N);
      const std::span<const int32_t> parents(op.parents.data_as<int32_t>() + b * N, N);
      const std::span<const int64_t> positions(op.positions.data_as<int64_t>() + b * N, N);
      const std::span<const uint8_t> mask(op.mask.data_as<uint8_t>() + b * N * N, N * N);
      EXPECT_THAT(tokens, ElementsAreArray(tree.tokens));
      EXPECT_THAT(parents, ElementsAreArray(tree.parents));
      EXPECT_THAT(positions, ElementsAreArray(tree.Positions(root_positions[b])));
      EXPECT_THAT(mask, ElementsAreArray(tree.DenseMask()));
      // Step s's frontier is what the reference expands at step s + 1; a parent's global row is
      // b F + its row among step s's frontier.
      for (int s = 0; s + 1 < c.steps; ++s) {
        const int64_t F = s == 0 ? 1 : k;
        for (int f = 0; f < k; ++f) {
          const DraftCandidate& cand = ref.candidates[ref.frontier[s + 1][f]];
          const auto at = std::find(ref.frontier[s].begin(), ref.frontier[s].end(), cand.parent);
          ASSERT_NE(at, ref.frontier[s].end());
          EXPECT_EQ(op.frontier_tokens[s][b * k + f], cand.token) << "step " << s << " row " << f;
          EXPECT_EQ(op.frontier_parents[s][b * k + f], b * F + (at - ref.frontier[s].begin()))
              << "step " << s << " row " << f;
        }
      }
    }
  }

  cpu::CpuBackend backend_;
};

TEST_F(CpuTreeBuildOpTest, MatchesBuildDraftTreeOnRandomBatches) {
  std::mt19937 rng(20260101);
  uint32_t seed = 1;
  for (const int k : {1, 2, 4}) {
    for (int steps = 1; steps <= 4; ++steps) {
      for (const bool ties : {false, true}) {
        const int64_t max_tokens = 1 + k + static_cast<int64_t>(steps - 1) * k * k;
        Case c;
        c.batch = 1 + static_cast<int>(rng() % 5);
        c.topk = k;
        c.steps = steps;
        c.tokens = 2 + static_cast<int>(rng() % (max_tokens - 1));
        c.vocab = std::vector<int64_t>{5, 37, 300}[rng() % 3];
        c.d2t = (seed % 2) == 0;
        c.ties = ties;
        c.pad = (seed % 3) == 0 ? 3 : 0;
        Check(c, seed++);
        c.tokens = static_cast<int>(max_tokens);  // every candidate kept
        Check(c, seed++);
      }
    }
  }
}

TEST_F(CpuTreeBuildOpTest, BadRowsGiveRecordsWhileOthersBuild) {
  const Case c{4, 3, 3, 10, 40, true};
  Check(c, 7, {{1, 1, 2, 3, kNaN, 1}});
  Check(c, 8, {{0, 0, 0, 11, kInf, 2}, {2, 2, 1, -1, 0.0f, 3}});
  Check(c, 9, {{3, 2, 0, 39, kNaN, 1}});
  // NaN and +inf in one row: the lowest id names the record.
  Check(c, 10, {{1, 1, 0, 5, kInf, 2}, {1, 1, 0, 9, kNaN, 1}});
}

TEST_F(CpuTreeBuildOpTest, WorkspaceIsReusedAcrossBuilds) {
  // One workspace sized for the largest shape serves builds of other shapes; step 0 restarts each
  // sequence, whatever an earlier build (or its failure) left there.
  const Case big{3, 4, 3, 20, 50};
  const Case small{2, 2, 2, 5, 30, false, true};
  const int64_t bytes = backend_.TreeBuildWorkspaceBytes(big.BuildShape());
  ASSERT_GE(bytes, backend_.TreeBuildWorkspaceBytes(small.BuildShape()));
  const Tensor workspace = Make(DType::kU8, {bytes});
  Check(big, 3, {{0, 1, 2, 4, kNaN, 1}}, workspace);
  Check(small, 4, {}, workspace);
  Check(big, 5, {}, workspace);
}

void ExpectInvalid(const absl::Status& st, const std::string& op, const std::string& what) {
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(op)) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(what)) << st;
}

TEST_F(CpuTreeBuildOpTest, BadArgumentsNameTheTensor) {
  const Case c{2, 2, 3, 6, 10};
  const TreeBuildShape shape = c.BuildShape();
  const int64_t bytes = backend_.TreeBuildWorkspaceBytes(shape);
  ASSERT_GT(bytes, 0);
  const Tensor workspace = Make(DType::kU8, {bytes + 16});
  const Tensor errors = Make(DType::kI64, {2, kTreeBuildErrorWidth});
  const Tensor logits = Make(DType::kF32, {2, 10});
  const Tensor d2t = Make(DType::kI64, {10});
  const Tensor frontier_tokens = Make(DType::kI64, {4});
  const Tensor frontier_parents = Make(DType::kI32, {4});
  const auto step0 = [&](const TreeBuildShape& sh, int step, const TensorView& l, const TensorView& d,
                         const TensorView& w, const TensorView& e, const TensorView& ft, const TensorView& fp) {
    return backend_.TreeBuildStep(sh, step, l, d, w, e, ft, fp);
  };
  const char* op = "TreeBuildStep";
  ASSERT_TRUE(step0(shape, 0, logits, d2t, workspace, errors, frontier_tokens, frontier_parents).ok());

  const Tensor logits3 = Make(DType::kF32, {3, 10});
  ExpectInvalid(step0(shape, 0, logits3, d2t, workspace, errors, frontier_tokens, frontier_parents), op,
                "logits");
  const Tensor logits_bf16 = Make(DType::kBF16, {2, 10});
  ExpectInvalid(step0(shape, 0, logits_bf16, d2t, workspace, errors, frontier_tokens, frontier_parents), op,
                "f32");
  const Tensor d2t9 = Make(DType::kI64, {9});
  ExpectInvalid(step0(shape, 0, logits, d2t9, workspace, errors, frontier_tokens, frontier_parents), op, "d2t");
  const Tensor d2t_i32 = Make(DType::kI32, {10});
  ExpectInvalid(step0(shape, 0, logits, d2t_i32, workspace, errors, frontier_tokens, frontier_parents), op,
                "d2t");
  ExpectInvalid(step0(shape, 0, logits, d2t, workspace.view().Narrow(0, 0, bytes - 1), errors, frontier_tokens,
                      frontier_parents),
                op, "workspace");
  ExpectInvalid(step0(shape, 0, logits, d2t, workspace.view().Narrow(0, 8, bytes), errors, frontier_tokens,
                      frontier_parents),
                op, "16-byte aligned");
  const Tensor errors3 = Make(DType::kI64, {2, 3});
  ExpectInvalid(step0(shape, 0, logits, d2t, workspace, errors3, frontier_tokens, frontier_parents), op,
                "errors");
  const Tensor errors_i32 = Make(DType::kI32, {2, kTreeBuildErrorWidth});
  ExpectInvalid(step0(shape, 0, logits, d2t, workspace, errors_i32, frontier_tokens, frontier_parents), op,
                "errors");
  ExpectInvalid(step0(shape, 0, logits, d2t, workspace, errors, frontier_parents, frontier_parents), op,
                "frontier_tokens");
  const Tensor parents3 = Make(DType::kI32, {3});
  ExpectInvalid(step0(shape, 0, logits, d2t, workspace, errors, frontier_tokens, parents3), op,
                "frontier_parents");
  ExpectInvalid(step0(shape, 3, logits, d2t, workspace, errors, frontier_tokens, frontier_parents), op, "step");
  ExpectInvalid(step0(shape, -1, logits, d2t, workspace, errors, frontier_tokens, frontier_parents), op, "step");
  // The frontier written over the logits.
  const TensorView aliased(logits.data(), DType::kI64, {4});
  ExpectInvalid(step0(shape, 0, logits, d2t, workspace, errors, aliased, frontier_parents), op, "overlaps");

  TreeBuildShape bad = shape;
  bad.topk = 0;
  EXPECT_EQ(backend_.TreeBuildWorkspaceBytes(bad), 0);
  ExpectInvalid(step0(bad, 0, logits, d2t, workspace, errors, frontier_tokens, frontier_parents), op, "topk");
  bad = shape;
  bad.num_draft_tokens = 12;  // > 1 + 2 + 2 * 4 = 11
  EXPECT_EQ(backend_.TreeBuildWorkspaceBytes(bad), 0);
  ExpectInvalid(step0(bad, 0, logits, d2t, workspace, errors, frontier_tokens, frontier_parents), op,
                "num_draft_tokens");
  bad = shape;
  bad.batch = -1;
  ExpectInvalid(step0(bad, 0, logits, d2t, workspace, errors, frontier_tokens, frontier_parents), op, "batch");

  // Passes out of order: step 2 right after step 0, or finalize before the last step.
  const Tensor logits4 = Make(DType::kF32, {4, 10});
  ExpectInvalid(step0(shape, 2, logits4, d2t, workspace, errors, frontier_tokens, frontier_parents), op,
                "workspace: sequence 0 holds 3 candidates, this call expects 7");

  const char* fin = "TreeBuildFinalize";
  const Tensor roots = Make(DType::kI64, {2}), root_positions = Make(DType::kI64, {2});
  const Tensor tokens = Make(DType::kI64, {2, 6}), parents = Make(DType::kI32, {2, 6});
  const Tensor positions = Make(DType::kI64, {2, 6}), mask = Make(DType::kU8, {12, 6});
  const auto finalize = [&](const TensorView& r, const TensorView& rp, const TensorView& t, const TensorView& p,
                            const TensorView& pos, const TensorView& m) {
    return backend_.TreeBuildFinalize(shape, workspace, errors, r, rp, t, p, pos, m);
  };
  ExpectInvalid(finalize(roots, root_positions, tokens, parents, positions, mask), fin, "workspace");
  ASSERT_TRUE(step0(shape, 1, logits4, d2t, workspace, errors, frontier_tokens, frontier_parents).ok());
  ASSERT_TRUE(step0(shape, 2, logits4, d2t, workspace, errors, frontier_tokens, frontier_parents).ok());
  ASSERT_TRUE(finalize(roots, root_positions, tokens, parents, positions, mask).ok());

  const Tensor roots3 = Make(DType::kI64, {3});
  ExpectInvalid(finalize(roots3, root_positions, tokens, parents, positions, mask), fin, "root_tokens");
  const Tensor root_positions_i32 = Make(DType::kI32, {2});
  ExpectInvalid(finalize(roots, root_positions_i32, tokens, parents, positions, mask), fin, "root_positions");
  const Tensor tokens5 = Make(DType::kI64, {2, 5});
  ExpectInvalid(finalize(roots, root_positions, tokens5, parents, positions, mask), fin, "tokens");
  const Tensor parents_i64 = Make(DType::kI64, {2, 6});
  ExpectInvalid(finalize(roots, root_positions, tokens, parents_i64, positions, mask), fin, "parents");
  const TensorView positions_strided(positions.data(), DType::kI64, {2, 3}, {6, 2}, Device::Cpu());
  ExpectInvalid(finalize(roots, root_positions, tokens, parents, positions_strided, mask), fin, "positions");
  const Tensor mask3 = Make(DType::kU8, {2, 6, 6});
  ExpectInvalid(finalize(roots, root_positions, tokens, parents, positions, mask3), fin, "mask");
  const Tensor mask_bool = Make(DType::kBool, {12, 6});
  ExpectInvalid(finalize(roots, root_positions, tokens, parents, positions, mask_bool), fin, "mask");
  const TensorView mask_over_tokens(tokens.data(), DType::kU8, {12, 6});
  ExpectInvalid(finalize(roots, root_positions, tokens, parents, positions, mask_over_tokens), fin, "overlaps");
}

}  // namespace
}  // namespace eagle3
