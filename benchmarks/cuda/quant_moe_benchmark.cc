// The routed experts of one TP8 rank at decode, timed with CUDA events (bench_util.h): the
// quantized op (CudaBackend::QuantizedMoeExperts, weights kept FP8 / INT4) beside the dense bf16
// op (MoeExperts) on the same shapes, each against its weight-streaming floor.
//
//   BM_QuantMoe/model/tokens and BM_DenseMoe/model/tokens: `tokens` tokens (f32 x [tokens, 7168]),
//   top-8 random routing (fixed seeds; EAGLE3_BENCH_ROUTING_SHARE=p: consecutive tokens share
//   experts, see MakeRoutings), per call of a CUDA graph of 16 back-to-back calls, each with the
//   next of 16 routings (so successive calls touch different experts, as successive layers do).
//   model 0: Kimi-K2.5 INT4 (pack-quantized, group 32, bf16 scales), 384 experts;
//   model 1: DeepSeek-V3 FP8 (e4m3, 128 x 128 f32 block scales), 256 experts;
//   model 2 (quantized only): model 1 with its shared expert joined as expert 256, which every token
//   takes with weight 1 beside its top-8 (9 pairs a token), as a V3 / R1 / K2-Instruct decode
//   step's MoE call runs it (FeedForwardBlock);
//   both hidden 7168, moe_intermediate 2048 -> 256 per rank (rank 3's slices: gate / up rows and
//   down columns [768, 1024)).
//
//   BM_StreamCeiling/model/tokens: the same bytes for the same routings, read by a kernel that does
//   nothing else: the ceiling beside BM_QuantMoe at each row (see its comment below).
//
// The experts' codes are read as warp tiles (QuantCodesLayout::kWarpTiles) where the backend's
// weight loads would keep them so (CudaBackendOptions::quant_moe_tiled_experts;
// EAGLE3_BENCH_QUANT_MOE_TILED_EXPERTS=0: row-major).
//
// Model: bytes = the weight bytes of the DISTINCT experts the 16 routings touch, averaged per call
// (codes or packed words and the scales they use for the quantized op, bf16 weights for the dense
// one); the floor is bytes / the measured copy rate. Activations are not counted (under 1 % at 64
// tokens). A rank's experts (1.1 GB INT4, 1.4 GB FP8, 4.2 / 2.8 GB bf16) are far past the L2, so a
// routing rarely finds its experts there.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "bench_util.h"
#include "stream_kernels.h"
#include "eagle3/backend.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/detail/int4_packing.h"
#include "eagle3/quantized_weight_view.h"
#include "eagle3/tensor.h"

namespace eagle3::bench {
namespace {

constexpr int64_t kHidden = 7168;
constexpr int64_t kInter = 256;
constexpr int64_t kRankRow0 = 3 * kInter;
constexpr int64_t kTopK = 8;
constexpr int kRoutings = 16;

int64_t ExpertsOf(int64_t model) { return model == 0 ? 384 : model == 1 ? 256 : 257; }
// Model 2's joined shared expert: its last, every token's pair kTopK.
bool JoinsShared(int64_t model) { return model == 2; }
const char* LabelOf(int64_t model) { return model == 0 ? "k25_int4" : model == 1 ? "v3_fp8" : "v3_fp8_shared"; }

// Every expert's quantized slices of one rank: one device tensor per kind, views into it.
struct QuantRank {
  Tensor codes[3], scales[3];  // gate, up, down
  std::vector<QuantizedExpertWeights> views;
  double bytes_per_expert = 0;
};

std::unique_ptr<QuantRank> MakeQuantRank(int64_t model) {
  auto r = std::make_unique<QuantRank>();
  const bool int4 = model == 0;
  const int64_t experts = ExpertsOf(model);
  const int64_t br = int4 ? 1 : 128, bc = int4 ? 32 : 128;
  // Per expert: gate / up [I, H] with scale rows of the rank's blocks, down [H, I] with its columns'.
  const int64_t rows[3] = {kInter, kInter, kHidden}, cols[3] = {kHidden, kHidden, kInter};
  const int64_t scale_row0[3] = {kRankRow0 / br, kRankRow0 / br, 0};
  const int64_t scale_col0[3] = {0, 0, kRankRow0 / bc};
  int64_t scale_rows[3], scale_cols[3];
  for (int m = 0; m < 3; ++m) {
    const int64_t row0 = m < 2 ? kRankRow0 : 0, col0 = m < 2 ? 0 : kRankRow0;
    scale_rows[m] = (row0 + rows[m] - 1) / br + 1 - scale_row0[m];
    scale_cols[m] = (col0 + cols[m] - 1) / bc + 1 - scale_col0[m];
    const int64_t row_bytes = int4 ? cols[m] / 2 : cols[m];
    // Random bits (only the timing depends on them): e4m3 codes and int4 words as bf16 fills.
    r->codes[m] = RandomDevice(DType::kBF16, Shape{experts * rows[m] * row_bytes / 2}, 10 + m);
    r->scales[m] = int4 ? RandomDevice(DType::kBF16, Shape{experts * scale_rows[m], scale_cols[m]}, 20 + m, 0.01f)
                        : RandomDevice(DType::kF32, Shape{experts * scale_rows[m], scale_cols[m]}, 20 + m, 0.01f);
    r->bytes_per_expert += static_cast<double>(rows[m] * row_bytes) +
                           static_cast<double>(scale_rows[m] * scale_cols[m]) * (int4 ? 2 : 4);
  }
  for (int64_t e = 0; e < experts; ++e) {
    QuantizedWeightView w[3];
    for (int m = 0; m < 3; ++m) {
      const int64_t row_bytes = int4 ? cols[m] / 2 : cols[m];
      const int64_t ld = int4 ? row_bytes / 4 : row_bytes;
      char* base = static_cast<char*>(r->codes[m].data()) + e * rows[m] * row_bytes;
      w[m].format = int4 ? WeightFormat::kInt4Group : WeightFormat::kFp8Block;
      w[m].codes = TensorView(base, int4 ? DType::kI32 : DType::kF8E4M3, Shape{rows[m], ld},
                              r->codes[m].device());
      w[m].scales = r->scales[m].view().Narrow(0, e * scale_rows[m], scale_rows[m]);
      w[m].k = cols[m];
      w[m].row0 = m < 2 ? kRankRow0 : 0;
      w[m].col0 = m < 2 ? 0 : kRankRow0;
      w[m].scale_row0 = scale_row0[m];
      w[m].scale_col0 = scale_col0[m];
      w[m].block_rows = br;
      w[m].block_cols = bc;
      // The codes read as warp tiles where the backend's loads would keep them so (the bits are
      // random either way; these whole shapes tile into exactly their row-major bytes).
      const Shape tiled = WarpTiledCodesShape(w[m]);
      if (Backend()->tiles_expert_codes(w[m]) && tiled.numel() * (int4 ? 4 : 1) == rows[m] * row_bytes) {
        w[m] = WithWarpTiledCodes(w[m], TensorView(base, w[m].codes.dtype(), tiled, r->codes[m].device()));
      }
    }
    r->views.push_back({w[0], w[1], w[2]});
  }
  return r;
}

// Every expert's bf16 weights of one rank (gate_up [2I, H], down [H, I]).
struct DenseRank {
  Tensor gate_up, down;
  std::vector<ExpertWeights> experts;
};

std::unique_ptr<DenseRank> MakeDenseRank(int64_t model) {
  auto r = std::make_unique<DenseRank>();
  const int64_t experts = ExpertsOf(model);
  r->gate_up = RandomDevice(DType::kBF16, Shape{experts * 2 * kInter, kHidden}, 30, 0.02f);
  r->down = RandomDevice(DType::kBF16, Shape{experts * kHidden, kInter}, 31, 0.02f);
  for (int64_t e = 0; e < experts; ++e) {
    r->experts.push_back({r->gate_up.view().Narrow(0, e * 2 * kInter, 2 * kInter),
                          r->down.view().Narrow(0, e * kHidden, kHidden)});
  }
  return r;
}

// One rank's weights per model, made on first use and kept (gigabytes each).
template <typename Rank, typename Make>
Rank& Cached(int64_t model, Make&& make) {
  static std::unique_ptr<Rank> ranks[3];
  if (!ranks[model]) ranks[model] = make(model);
  return *ranks[model];
}

// kRoutings top-8 routings of `tokens` tokens (distinct experts per token) over the model's routed
// experts (and its joined shared expert, pair kTopK of every token), their device ids and weights,
// and the mean count of distinct experts per routing. Uniform by default; with
// EAGLE3_BENCH_ROUTING_SHARE=p (0 < p <= 1), each slot of a token after the first takes, with
// probability p, one of the previous token's experts it has not taken yet (consecutive tokens of a
// sequence, as a verify step's are, agree on some of their experts; the grouped path reads such an
// expert once a call, a direct round once a token).
double RoutingShare() {
  const char* v = std::getenv("EAGLE3_BENCH_ROUTING_SHARE");
  const double p = v != nullptr ? std::atof(v) : 0.0;
  return p > 0.0 && p <= 1.0 ? p : 0.0;
}
struct Routings {
  std::vector<Tensor> ids, weights;
  std::vector<std::vector<int32_t>> touched;  // per routing: its distinct experts, ascending
  double distinct = 0;
  int64_t top_k = kTopK;  // pairs a token
};

Routings MakeRoutings(int64_t tokens, int64_t model) {
  Routings r;
  const bool shared = JoinsShared(model);
  const int64_t routed = ExpertsOf(model) - (shared ? 1 : 0), k = kTopK + (shared ? 1 : 0);
  r.top_k = k;
  std::mt19937 rng(1234 + static_cast<uint32_t>(tokens));
  std::vector<int32_t> perm(static_cast<size_t>(routed));
  const double share = RoutingShare();
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  for (int i = 0; i < kRoutings; ++i) {
    Tensor ids = *Tensor::Empty(DType::kI32, Shape{tokens, k});
    Tensor weights = *Tensor::Empty(DType::kF32, Shape{tokens, k});
    std::set<int32_t> touched;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t e = 0; e < routed; ++e) perm[e] = static_cast<int32_t>(e);
      std::shuffle(perm.begin(), perm.end(), rng);
      int32_t* row = ids.data_as<int32_t>() + t * k;
      if (share > 0.0 && t > 0) {
        // The previous token's experts, in random order, taken while the coin says so; the rest
        // from perm, skipping any taken or still to be offered from the previous token.
        std::vector<int32_t> prev(row - k, row - k + kTopK);
        std::shuffle(prev.begin(), prev.end(), rng);
        size_t next_prev = 0, next_perm = 0;
        for (int64_t j = 0; j < kTopK; ++j) {
          if (next_prev < prev.size() && coin(rng) < share) {
            row[j] = prev[next_prev++];
            continue;
          }
          while (std::find(row, row + j, perm[next_perm]) != row + j ||
                 std::find(prev.begin(), prev.end(), perm[next_perm]) != prev.end()) {
            ++next_perm;
          }
          row[j] = perm[next_perm++];
        }
      } else {
        for (int64_t j = 0; j < kTopK; ++j) row[j] = perm[j];
      }
      for (int64_t j = 0; j < kTopK; ++j) {
        weights.data_as<float>()[t * k + j] = 0.125f;
        touched.insert(row[j]);
      }
      if (shared) {
        ids.data_as<int32_t>()[t * k + kTopK] = static_cast<int32_t>(routed);
        weights.data_as<float>()[t * k + kTopK] = 1.0f;
        touched.insert(static_cast<int32_t>(routed));
      }
    }
    r.distinct += static_cast<double>(touched.size()) / kRoutings;
    r.touched.emplace_back(touched.begin(), touched.end());
    r.ids.push_back(ToDevice(ids));
    r.weights.push_back(ToDevice(weights));
  }
  return r;
}

void RunMoe(benchmark::State& state, bool quantized) {
  cuda::CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t model = state.range(0), tokens = state.range(1);
  state.SetLabel(LabelOf(model));
  const Routings routings = MakeRoutings(tokens, model);
  Tensor x = RandomDevice(DType::kF32, Shape{tokens, kHidden}, 3);
  Tensor out = *Tensor::Empty(DType::kF32, Shape{tokens, kHidden}, b->allocator());
  double bytes_per_expert = 0;
  QuantRank* q = nullptr;
  DenseRank* d = nullptr;
  if (quantized) {
    q = &Cached<QuantRank>(model, MakeQuantRank);
    bytes_per_expert = q->bytes_per_expert;
  } else {
    d = &Cached<DenseRank>(model, MakeDenseRank);
    bytes_per_expert = 2.0 * 3 * kInter * kHidden;
  }
  int next = 0;
  absl::Status status;
  auto run = [&] {
    const int i = next;
    next = (next + 1) % kRoutings;
    status = quantized ? b->QuantizedMoeExperts(x, routings.ids[i], routings.weights[i], q->views, out, false)
                       : b->MoeExperts(x, routings.ids[i], routings.weights[i], d->experts, out, false);
  };
  run();
  if (!Check(state, status, quantized ? "QuantizedMoeExperts" : "MoeExperts")) return;
  if (!Check(state, b->Synchronize(), "Synchronize")) return;
  const double seconds = RunTimedInGraph(state, b->stream(), kRoutings, run);
  if (!Check(state, status, "timed call")) return;
  state.counters["distinct_experts"] = routings.distinct;
  if (RoutingShare() > 0.0) state.counters["routing_share"] = RoutingShare();
  ReportRoofline(state, seconds, routings.distinct * bytes_per_expert,
                 2.0 * 3 * kInter * kHidden * static_cast<double>(tokens * routings.top_k));
}

// BM_StreamCeiling/model/tokens: the bytes BM_QuantMoe's model counts for the same routings (each
// distinct expert's gate, up and down codes and scales, at their addresses), read by a kernel that
// does nothing else (stream_kernels.h): the most any kernel reading them can reach, the same
// graph of 16 calls, each call's ranges named in device memory read after its programmatic wait
// (a round reads its ids so). Its frac_of_floor is the ceiling beside BM_QuantMoe's.
void BM_StreamCeiling(benchmark::State& state) {
  cuda::CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t model = state.range(0), tokens = state.range(1);
  state.SetLabel(LabelOf(model));
  const Routings routings = MakeRoutings(tokens, model);
  QuantRank& q = Cached<QuantRank>(model, MakeQuantRank);
  std::vector<Tensor> tables;
  std::vector<int> counts;
  for (const std::vector<int32_t>& touched : routings.touched) {
    std::vector<StreamChunk> chunks;
    const auto add = [&](const void* data, size_t bytes) {
      const int64_t pieces = static_cast<int64_t>(bytes / 16);  // every range here is whole pieces
      for (int64_t at = 0; at < pieces; at += kStreamChunkPieces) {
        chunks.push_back({static_cast<const char*>(data) + 16 * at, std::min(kStreamChunkPieces, pieces - at)});
      }
    };
    for (const int32_t e : touched) {
      for (const QuantizedWeightView* w : {&q.views[e].gate, &q.views[e].up, &q.views[e].down}) {
        add(w->codes.data(), w->codes.nbytes());
        add(w->scales.data(), w->scales.nbytes());
      }
    }
    const int64_t words = static_cast<int64_t>(chunks.size() * sizeof(StreamChunk) / 4);
    Tensor host = *Tensor::Empty(DType::kI32, Shape{words});
    std::memcpy(host.data(), chunks.data(), chunks.size() * sizeof(StreamChunk));
    tables.push_back(ToDevice(host));
    counts.push_back(static_cast<int>(chunks.size()));
  }
  // EAGLE3_BENCH_STREAM=loads,blocks: the loads a thread keeps in flight and the blocks of 256 a
  // multiprocessor (8,4 unless set: 128 KiB in flight a multiprocessor).
  int loads = 8, per_sm = 4;
  const char* spec = std::getenv("EAGLE3_BENCH_STREAM");
  if (spec != nullptr && std::sscanf(spec, "%d,%d", &loads, &per_sm) != 2) {
    return state.SkipWithError("EAGLE3_BENCH_STREAM: expected loads,blocks (e.g. 8,4)");
  }
  const int blocks = StreamReadBlocks(loads, per_sm);
  if (blocks < 1) return state.SkipWithError("StreamReadBlocks: loads not 2, 4, 8 or 16, or the query failed");
  Tensor sink = *Tensor::Empty(DType::kI32, Shape{static_cast<int64_t>(blocks) * 256}, b->allocator());
  int next = 0;
  cudaError_t error = cudaSuccess;
  auto run = [&] {
    const int i = next;
    next = (next + 1) % kRoutings;
    const cudaError_t e = LaunchStreamRead(static_cast<const StreamChunk*>(tables[i].data()), counts[i], loads, blocks,
                                           static_cast<uint32_t*>(sink.data()), true, b->stream());
    if (error == cudaSuccess) error = e;
  };
  run();
  if (error == cudaSuccess) error = cudaStreamSynchronize(b->stream());
  if (error != cudaSuccess) {
    return state.SkipWithError((std::string("LaunchStreamRead: ") + cudaGetErrorString(error)).c_str());
  }
  const double seconds = RunTimedInGraph(state, b->stream(), kRoutings, run);
  if (error != cudaSuccess) {
    return state.SkipWithError((std::string("timed call: ") + cudaGetErrorString(error)).c_str());
  }
  state.counters["distinct_experts"] = routings.distinct;
  if (RoutingShare() > 0.0) state.counters["routing_share"] = RoutingShare();
  state.counters["blocks"] = blocks;
  state.counters["KiB_in_flight"] = static_cast<double>(blocks) * 256 * loads * 16 / 1024;
  ReportRoofline(state, seconds, routings.distinct * q.bytes_per_expert, 0.0);
}

void BM_QuantMoe(benchmark::State& state) { RunMoe(state, true); }
void BM_DenseMoe(benchmark::State& state) { RunMoe(state, false); }

void MoeArgs(benchmark::internal::Benchmark* bm) { bm->ArgsProduct({{0, 1}, {1, 4, 8, 16, 64}}); }
// The quantized rounds also at 2 tokens (the smallest direct round of several tokens) and at 10, 12
// and 14: gate-up grids of 160 to 224 items, between one wave of blocks and two, where the GEMV
// chooser's plan changes most from one size to the next.
void QuantMoeArgs(benchmark::internal::Benchmark* bm) {
  bm->ArgsProduct({{0, 1, 2}, {1, 2, 4, 8, 10, 12, 14, 16, 64}});
}
BENCHMARK(BM_QuantMoe)->ArgNames({"model", "tokens"})->Apply(QuantMoeArgs)->Apply(Timed);
BENCHMARK(BM_DenseMoe)->ArgNames({"model", "tokens"})->Apply(MoeArgs)->Apply(Timed);
BENCHMARK(BM_StreamCeiling)->ArgNames({"model", "tokens"})->Apply(QuantMoeArgs)->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
