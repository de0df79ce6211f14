// CudaBackend::TreeBuildStep / TreeBuildFinalize ≡ CpuBackend's (itself ≡ BuildDraftTree,
// tests/cpu_tree_build_op_test.cc) on the same inputs: every step's frontier (tokens, global parent
// rows), the error records and the trees (tokens, parents, positions, the [B * N, N] mask), element
// for element, on random batches (topk 1..8, 1..5 steps, V up to 70000, with and without d2t,
// padded logits rows), on logits full of ties and on mostly -inf rows; with NaN / +inf / all -inf
// rows in some sequences; and when the whole build is captured in one CUDA graph and replayed on
// new logits. Arguments beyond the kernels' limits are refused by name. Skipped where no CUDA device
// is visible.
//
// Ties: the device sums a row's exp(x - max) in another order than the CPU, so normalizers can
// differ in the last bits (eagle3/cuda/tree_ops.h), and scores that are equal only mathematically
// ((3 - L0) + (1 - L1) against (2 - L0) + (2 - L1)) may then rank differently on the two sides. The
// tie cases give a sequence's rows of a step one finite level, repeated bit for bit over the rows,
// so that every tie is one of equal doubles on both sides (a pass's candidates all tie, or are -inf).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "eagle3/backend.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/cuda/cuda_graph.h"
#include "eagle3/status.h"
#include "eagle3/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parity_util.h"

namespace eagle3 {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

enum class Logits { kNormal, kTies, kMasked };

struct Case {
  int batch, topk, steps, tokens;
  int64_t vocab;
  bool d2t = false;
  Logits logits = Logits::kNormal;
  int64_t pad = 0;  // row stride = vocab + pad

  TreeBuildShape BuildShape() const { return {batch, topk, steps, tokens, vocab}; }
  int64_t Rows(int step) const { return static_cast<int64_t>(batch) * (step == 0 ? 1 : topk); }
};

std::string Name(const Case& c) {
  return "B" + std::to_string(c.batch) + " k" + std::to_string(c.topk) + " S" + std::to_string(c.steps) +
         " N" + std::to_string(c.tokens) + " V" + std::to_string(c.vocab) + (c.d2t ? " d2t" : "") + " logits" +
         std::to_string(static_cast<int>(c.logits)) + " pad" + std::to_string(c.pad);
}

// A poisoned logit: sequence, step, row within the sequence, draft id (-1: the whole row -inf).
struct Poison {
  int sequence, step, row;
  int64_t draft_id;
  float value;
};

// Host inputs of one build.
struct Inputs {
  Case c;
  std::vector<Tensor> logits;  // [step]: [Rows(step) * (vocab + pad)] f32, rows padded
  Tensor d2t, roots, root_positions;
};

Tensor HostTensor(DType dtype, const Shape& shape) { return *Tensor::Zeros(dtype, shape); }

Inputs MakeInputs(const Case& c, uint32_t seed, const std::vector<Poison>& poisons = {}) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  Inputs in;
  in.c = c;
  const int64_t V = c.vocab, ld = V + c.pad;
  for (int s = 0; s < c.steps; ++s) {
    const int64_t per_sequence = s == 0 ? 1 : c.topk;
    Tensor l = HostTensor(DType::kF32, {c.Rows(s) * ld});
    float* x = l.data_as<float>();
    for (int b = 0; b < c.batch; ++b) {
      for (int64_t f = 0; f < per_sequence; ++f) {
        float* row = x + (b * per_sequence + f) * ld;
        if (c.logits == Logits::kTies && f > 0) {
          std::copy_n(x + b * per_sequence * ld, V, row);  // the sequence's first row, bit for bit
        } else if (c.logits == Logits::kTies) {
          // One finite level on 1..12 ids (maybe fewer than topk): a pass's candidates all tie.
          std::fill_n(row, V, -kInf);
          const float level = static_cast<float>(rng() % 4);
          const int finite = 1 + static_cast<int>(rng() % 12);
          for (int i = 0; i < finite; ++i) row[rng() % V] = level;
        } else if (c.logits == Logits::kMasked) {
          std::fill_n(row, V, -kInf);
          const int finite = 1 + static_cast<int>(rng() % 6);  // may be fewer than topk
          for (int i = 0; i < finite; ++i) row[rng() % V] = normal(rng);
        } else {
          for (int64_t i = 0; i < V; ++i) row[i] = normal(rng);
        }
      }
    }
    in.logits.push_back(std::move(l));
  }
  for (const Poison& p : poisons) {
    const int64_t per_sequence = p.step == 0 ? 1 : c.topk;
    float* row = in.logits[p.step].data_as<float>() + (p.sequence * per_sequence + p.row) * ld;
    if (p.draft_id < 0) {
      std::fill_n(row, V, -kInf);
    } else {
      row[p.draft_id] = p.value;
    }
  }
  in.d2t = HostTensor(DType::kI64, {V});
  for (int64_t i = 0; i < V; ++i) in.d2t.data_as<int64_t>()[i] = static_cast<int64_t>(rng() % 1000);
  in.roots = HostTensor(DType::kI64, {c.batch});
  in.root_positions = HostTensor(DType::kI64, {c.batch});
  for (int b = 0; b < c.batch; ++b) {
    in.roots.data_as<int64_t>()[b] = static_cast<int64_t>(rng() % 50000);
    in.root_positions.data_as<int64_t>()[b] = 100 + 7 * b;
  }
  return in;
}

// Everything a build writes, on the host.
struct Outputs {
  std::vector<std::vector<int64_t>> frontier_tokens;   // [step]
  std::vector<std::vector<int32_t>> frontier_parents;  // [step]
  std::vector<int64_t> errors, tokens, positions;
  std::vector<int32_t> parents;
  std::vector<uint8_t> mask;
};

template <typename T>
std::vector<T> Values(const Tensor& host) {
  return std::vector<T>(host.data_as<T>(), host.data_as<T>() + host.numel());
}

// One build's tensors on a backend's device (a frontier buffer per step, so that the whole build is
// enqueued without a host hop), filled with sentinels where the build writes.
class Build {
 public:
  Build(Backend& backend, const Inputs& in) : backend_(backend), c_(in.c) {
    const int64_t B = c_.batch, k = c_.topk, N = c_.tokens;
    for (const Tensor& l : in.logits) {
      logits_.push_back(Upload(l));
      frontier_tokens_.push_back(Filled(DType::kI64, {B * k}, 0xC7));
      frontier_parents_.push_back(Filled(DType::kI32, {B * k}, 0xC7));
    }
    d2t_ = Upload(in.d2t);
    roots_ = Upload(in.roots);
    root_positions_ = Upload(in.root_positions);
    workspace_ = Filled(DType::kU8, {backend.TreeBuildWorkspaceBytes(c_.BuildShape())}, 0);
    errors_ = Filled(DType::kI64, {B, kTreeBuildErrorWidth}, 0x63);  // step 0 resets them
    tokens_ = Filled(DType::kI64, {B, N}, 0xC7);
    parents_ = Filled(DType::kI32, {B, N}, 0xC7);
    positions_ = Filled(DType::kI64, {B, N}, 0xC7);
    mask_ = Filled(DType::kU8, {B * N, N}, 0xAB);
  }

  // Device logits of step s as the op sees them: [rows, vocab] with the padded row stride.
  TensorView LogitsView(int s) const {
    return TensorView(logits_[s].data(), DType::kF32, {c_.Rows(s), c_.vocab}, {c_.vocab + c_.pad, 1},
                      backend_.device());
  }
  // Overwrites every input in place (a captured build then replays on them).
  void Load(const Inputs& in) {
    for (int s = 0; s < c_.steps; ++s) EXPECT_TRUE(backend_.Copy(in.logits[s], logits_[s]).ok());
    EXPECT_TRUE(backend_.Copy(in.d2t, d2t_).ok());
    EXPECT_TRUE(backend_.Copy(in.roots, roots_).ok());
    EXPECT_TRUE(backend_.Copy(in.root_positions, root_positions_).ok());
  }

  // Every step, then finalize (nothing waits).
  absl::Status Enqueue() {
    const TreeBuildShape shape = c_.BuildShape();
    for (int s = 0; s < c_.steps; ++s) {
      EAGLE3_RETURN_IF_ERROR(backend_.TreeBuildStep(shape, s, LogitsView(s), c_.d2t ? d2t_.view() : TensorView(),
                                                    workspace_, errors_, frontier_tokens_[s],
                                                    frontier_parents_[s]));
    }
    return backend_.TreeBuildFinalize(shape, workspace_, errors_, roots_, root_positions_, tokens_, parents_,
                                      positions_, mask_);
  }

  Outputs Download() {
    Outputs o;
    for (int s = 0; s < c_.steps; ++s) {
      o.frontier_tokens.push_back(Values<int64_t>(ToHost(frontier_tokens_[s])));
      o.frontier_parents.push_back(Values<int32_t>(ToHost(frontier_parents_[s])));
    }
    o.errors = Values<int64_t>(ToHost(errors_));
    o.tokens = Values<int64_t>(ToHost(tokens_));
    o.parents = Values<int32_t>(ToHost(parents_));
    o.positions = Values<int64_t>(ToHost(positions_));
    o.mask = Values<uint8_t>(ToHost(mask_));
    return o;
  }

 private:
  Tensor Upload(const Tensor& host) {
    Tensor d = *Tensor::Empty(host.dtype(), host.shape(), backend_.allocator());
    EXPECT_TRUE(backend_.Copy(host, d).ok());
    return d;
  }
  Tensor Filled(DType dtype, const Shape& shape, uint8_t byte) {
    Tensor host = HostTensor(dtype, shape);
    std::fill_n(static_cast<uint8_t*>(host.data()), host.nbytes(), byte);
    return Upload(host);
  }
  Tensor ToHost(const Tensor& device) {
    Tensor host = HostTensor(device.dtype(), device.shape());
    EXPECT_TRUE(backend_.Copy(device, host).ok());
    EXPECT_TRUE(backend_.Synchronize().ok());
    return host;
  }

  Backend& backend_;
  Case c_;
  std::vector<Tensor> logits_, frontier_tokens_, frontier_parents_;
  Tensor d2t_, roots_, root_positions_, workspace_, errors_, tokens_, parents_, positions_, mask_;
};

void ExpectSame(const Outputs& got, const Outputs& want) {
  for (size_t s = 0; s < want.frontier_tokens.size(); ++s) {
    EXPECT_EQ(got.frontier_tokens[s], want.frontier_tokens[s]) << "frontier_tokens of step " << s;
    EXPECT_EQ(got.frontier_parents[s], want.frontier_parents[s]) << "frontier_parents of step " << s;
  }
  EXPECT_EQ(got.errors, want.errors);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.parents, want.parents);
  EXPECT_EQ(got.positions, want.positions);
  EXPECT_EQ(got.mask, want.mask);
}

class CudaTreeBuildOpTest : public parity::ParityTest {
 protected:
  // Returns the CPU op's outputs, having checked that the CUDA op's equal them.
  Outputs Check(const Inputs& in) {
    SCOPED_TRACE(Name(in.c));
    Build cpu(cpu_, in);
    EXPECT_TRUE(cpu.Enqueue().ok());
    const Outputs want = cpu.Download();
    Build gpu(*gpu_, in);
    const absl::Status st = gpu.Enqueue();
    EXPECT_TRUE(st.ok()) << st;
    ExpectSame(gpu.Download(), want);
    return want;
  }
};

TEST_F(CudaTreeBuildOpTest, MatchesCpuOpOnRandomBatches) {
  std::mt19937 rng(20261202);
  uint32_t seed = 1;
  for (const int k : {1, 2, 4, 8}) {
    for (int steps = 1; steps <= 5; ++steps) {
      for (const Logits logits : {Logits::kNormal, Logits::kTies, Logits::kMasked}) {
        const int64_t max_tokens = std::min<int64_t>(1 + k + static_cast<int64_t>(steps - 1) * k * k, 64);
        Case c;
        c.batch = 1 + static_cast<int>(rng() % 9);
        c.topk = k;
        c.steps = steps;
        c.tokens = 2 + static_cast<int>(rng() % (max_tokens - 1));
        c.vocab = std::vector<int64_t>{8, 300, 5000, 70000}[rng() % 4];
        c.d2t = (seed % 2) == 0;
        c.logits = logits;
        c.pad = (seed % 3) == 0 ? 5 : 0;
        Check(MakeInputs(c, seed++));
      }
    }
  }
}

TEST_F(CudaTreeBuildOpTest, BadRowsGiveTheCpuRecords) {
  const Case c{5, 3, 3, 10, 4000, true};
  const Outputs o = Check(MakeInputs(c, 7,
                                     {{1, 1, 2, 3, kNaN},
                                      {0, 0, 0, 11, kInf},
                                      {2, 2, 1, -1, 0.0f},
                                      {4, 1, 0, 3999, kInf},
                                      {4, 1, 0, 2000, kNaN}}));
  // The CPU op's records, as tests/cpu_tree_build_op_test.cc checks them against BuildDraftTree.
  const std::vector<int64_t> want = {2, 0, 0, 11, 1, 1, 2, 3, 3, 2, 1, -1, 0, 0, 0, 0, 1, 1, 0, 2000};
  EXPECT_EQ(o.errors, want);
}

TEST_F(CudaTreeBuildOpTest, CapturedBuildReplaysOnNewLogits) {
  const Case c{6, 4, 4, 24, 3000, true, Logits::kNormal, 3};
  Build gpu(*gpu_, MakeInputs(c, 11));
  auto graph = cuda::CudaGraph::Capture(gpu_->stream(), [&] { return gpu.Enqueue(); });
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    const Inputs next = MakeInputs(c, 100 + replay, replay == 1 ? std::vector<Poison>{{2, 1, 3, 7, kNaN}}
                                                                : std::vector<Poison>{});
    gpu.Load(next);  // logits, d2t and roots all change between replays
    ASSERT_TRUE((*graph)->Launch(gpu_->stream()).ok());
    Build cpu(cpu_, next);
    ASSERT_TRUE(cpu.Enqueue().ok());
    const Outputs want = cpu.Download();
    const Outputs got = gpu.Download();
    // Replays overwrite, so only what this replay writes can be compared: the trees of the
    // sequences not in error, and the records.
    EXPECT_EQ(got.errors, want.errors);
    const int64_t N = c.tokens;
    for (int b = 0; b < c.batch; ++b) {
      if (want.errors[b * kTreeBuildErrorWidth] != 0) continue;
      for (int64_t i = b * N; i < (b + 1) * N; ++i) {
        EXPECT_EQ(got.tokens[i], want.tokens[i]) << i;
        EXPECT_EQ(got.parents[i], want.parents[i]) << i;
        EXPECT_EQ(got.positions[i], want.positions[i]) << i;
      }
      EXPECT_TRUE(std::equal(got.mask.begin() + b * N * N, got.mask.begin() + (b + 1) * N * N,
                             want.mask.begin() + b * N * N))
          << "mask of sequence " << b;
    }
  }
}

TEST_F(CudaTreeBuildOpTest, ShapesBeyondTheKernelsAreRefused) {
  const Case c{2, 2, 2, 4, 100};
  const Inputs in = MakeInputs(c, 3);
  Build gpu(*gpu_, in);
  ASSERT_TRUE(gpu.Enqueue().ok());
  TreeBuildShape big = c.BuildShape();
  big.topk = 17;  // > kTreeMaxTopk
  EXPECT_EQ(gpu_->TreeBuildWorkspaceBytes(big), 0);
  const Tensor workspace = *Tensor::Empty(DType::kU8, {1 << 20}, gpu_->allocator());
  const Tensor errors = *Tensor::Empty(DType::kI64, {2, kTreeBuildErrorWidth}, gpu_->allocator());
  const Tensor frontier_tokens = *Tensor::Empty(DType::kI64, {34}, gpu_->allocator());
  const Tensor frontier_parents = *Tensor::Empty(DType::kI32, {34}, gpu_->allocator());
  absl::Status st = gpu_->TreeBuildStep(big, 0, gpu.LogitsView(0), TensorView(), workspace, errors, frontier_tokens,
                                        frontier_parents);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("TreeBuildStep: TreeBuildShape topk = 17 > 16")) << st;
  // Host logits on the device backend: refused by name.
  st = gpu_->TreeBuildStep(c.BuildShape(), 0, in.logits[0].view().Reshape({2, 100}), TensorView(), workspace,
                           errors, frontier_tokens.view().Narrow(0, 0, 4), frontier_parents.view().Narrow(0, 0, 4));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr("logits")) << st;
  EXPECT_TRUE(gpu_->Synchronize().ok());
}

}  // namespace
}  // namespace eagle3
