// Decode-time CUDA ops at real DeepSeek shapes, timed with CUDA events (bench_util.h: warm-up, one
// event pair per iteration, median over repetitions), each with its roofline floor from the ceilings
// measured in the same run.
//
//   BM_LatentAttentionDecode/heads/context/batch/qtokens : absorbed MLA decode over the paged latent
//       cache (576-wide rows: 512 latent + 64 rope; values = the first 512), `qtokens` query rows per
//       sequence (1 = plain decode, 8-64 = a verify tree), one LatentAttention call per sequence
//   BM_MoeDecode/model/tokens : routing from given router logits + routed experts (+ the shared
//       experts where the model has them, V2-Lite) at one rank; model 0 = V3 TP8 rank (256 experts,
//       I 2048/8 = 256, H 7168, top-8), 1 = Kimi-K2 TP8 rank (384 experts, I 256, H 7168, top-8),
//       2 = V2-Lite TP1 (64 experts, I 1408, H 2048, top-6, 2 shared experts), 3 = DeepSeek-V2 TP8
//       rank (160 experts, I 1536/8 = 192, H 5120, top-6, 2 shared experts of I 192); tokens up to
//       2048 (a verify step of 32 sequences x 64 tree tokens), where MoeExperts takes its grouped
//       path (each selected expert's weights read once per tile of its tokens)
//
// The models store f32 today, so the byte floors count 4 bytes per element.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "bench_util.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/tensor.h"

namespace eagle3::bench {
namespace {

constexpr int64_t kLatentWidth = 576;  // kv_lora_rank 512 + qk_rope_head_dim 64
constexpr int64_t kValueDim = 512;
constexpr int64_t kPageSize = 64;

// The one place that calls the library's absorbed attention: one sequence's queries against its
// pages of the latent cache.
absl::Status RunLatentAttention(cuda::CudaBackend& b, const TensorView& q, const TensorView& cache,
                                const TensorView& page_table, int64_t context_len, const TensorView& mask,
                                const TensorView& out) {
  return b.LatentAttention(q, cache, page_table, context_len, mask, /*scale=*/0.1f, kValueDim, out);
}

// One rotation set of the MLA benchmark: a latent cache holding every sequence's pages.
struct LatentSet {
  Tensor cache;  // [batch * pages_per_seq, page, 576], f32
};

void BM_LatentAttentionDecode(benchmark::State& state) {
  cuda::CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t heads = state.range(0), context = state.range(1), batch = state.range(2), qtok = state.range(3);
  const int64_t pages_per_seq = (context + kPageSize - 1) / kPageSize;
  const int64_t pages = pages_per_seq * batch;
  const double cache_bytes = static_cast<double>(pages) * kPageSize * kLatentWidth * 4.0;
  Rotation<LatentSet> sets(CopiesToDefeatL2(cache_bytes), [&](int i) {
    return LatentSet{RandomDevice(DType::kF32, Shape{pages, kPageSize, kLatentWidth}, 10 + i)};
  });
  Tensor q = RandomDevice(DType::kF32, Shape{qtok, heads, kLatentWidth}, 2);
  Tensor out = *Tensor::Empty(DType::kF32, Shape{qtok, heads, kValueDim}, b->allocator());
  Tensor host_table = *Tensor::Empty(DType::kI32, Shape{pages});
  for (int64_t p = 0; p < pages; ++p) host_table.data_as<int32_t>()[p] = static_cast<int32_t>(p);
  Tensor table = ToDevice(host_table);
  // Query row i sees the context before the tree plus the tree rows up to itself (a chain: the
  // densest tree mask), so the keys read are the whole context either way.
  Tensor host_mask = *Tensor::Zeros(DType::kU8, Shape{qtok, context});
  for (int64_t i = 0; i < qtok; ++i) {
    std::fill_n(host_mask.data_as<uint8_t>() + i * context, context - qtok + i + 1, uint8_t{1});
  }
  Tensor mask = ToDevice(host_mask);
  absl::Status status;
  auto step = [&] {
    const TensorView cache = sets.Next().cache.view();
    for (int64_t s = 0; s < batch && status.ok(); ++s) {
      status = RunLatentAttention(*b, q, cache, table.view().Narrow(0, s * pages_per_seq, pages_per_seq), context,
                                  mask, out);
    }
  };
  step();
  if (!Check(state, status, "LatentAttention") || !Check(state, b->Synchronize(), "Synchronize")) return;
  const double seconds = RunTimed(state, b->stream(), step);
  if (!Check(state, status, "LatentAttention")) return;
  // Each sequence's cache rows are read once; q and out are negligible beside them.
  const double bytes = static_cast<double>(batch) * context * kLatentWidth * 4.0;
  const double flops = static_cast<double>(batch) * qtok * heads * context * (2.0 * kLatentWidth + 2.0 * kValueDim);
  state.counters["rotated_sets"] = static_cast<double>(sets.size());
  ReportRoofline(state, seconds, bytes, flops);
}

void LatentArgs(benchmark::internal::Benchmark* bm) {
  if (Quick()) {
    bm->ArgsProduct({{16, 8}, {4096, 65536}, {1, 8}, {1}});
    bm->Args({16, 4096, 1, 16});
  } else {
    bm->ArgsProduct({{16, 8}, {1024, 4096, 16384, 65536}, {1, 8, 32}, {1}});
    bm->ArgsProduct({{16, 8}, {4096, 16384}, {1, 8}, {8, 32, 64}});
  }
}
BENCHMARK(BM_LatentAttentionDecode)
    ->ArgNames({"heads", "context", "batch", "qtokens"})
    ->Apply(LatentArgs)
    ->Apply(Timed);

// One rank's MoE layer shape and routing.
struct MoeModel {
  const char* name;
  int64_t experts, hidden, inter, top_k, shared_inter;  // shared_inter = n_shared * I (0: none)
  MoeRoutingParams routing;
};

MoeModel Model(int64_t id) {
  MoeRoutingParams v3;  // DeepSeek-V3: sigmoid, noaux_tc, 8 groups keep 4, normalize then x2.5
  v3.scoring_func = ScoringFunc::kSigmoid;
  v3.topk_method = TopkMethod::kNoauxTc;
  v3.top_k = 8;
  v3.n_group = 8;
  v3.topk_group = 4;
  v3.norm_topk_prob = true;
  v3.routed_scaling_factor = 2.5f;
  MoeRoutingParams k2 = v3;  // Kimi-K2: one group, x2.827
  k2.n_group = 1;
  k2.topk_group = 1;
  k2.routed_scaling_factor = 2.827f;
  MoeRoutingParams lite;  // V2-Lite: softmax, greedy top-6, no normalization, x1
  lite.top_k = 6;
  MoeRoutingParams v2 = lite;  // DeepSeek-V2: group-limited greedy, 8 groups keep 3, x16
  v2.topk_method = TopkMethod::kGroupLimitedGreedy;
  v2.n_group = 8;
  v2.topk_group = 3;
  v2.routed_scaling_factor = 16.0f;
  switch (id) {
    case 0: return {"V3-TP8", 256, 7168, 2048 / 8, 8, 0, v3};
    case 1: return {"K2-TP8", 384, 7168, 2048 / 8, 8, 0, k2};
    case 3: return {"V2-TP8", 160, 5120, 1536 / 8, 6, 2 * 1536 / 8, v2};
    default: return {"V2Lite-TP1", 64, 2048, 1408, 6, 2 * 1408, lite};
  }
}

// Expert weights are stored as the models store them on CUDA (bf16; Backend::preferred_weight_dtype),
// created on first use and kept for the process (the largest, K2's, is 4.2 GB). The runs up to
// 2026-12-01b used f32 experts (twice the bytes and the floor): weight_elem_bytes tells them apart.
constexpr DType kExpertDtype = DType::kBF16;

struct MoeWeights {
  std::vector<Tensor> gate_up, down;  // per expert: [2I, H], [H, I]
  // [2 * shared_inter, H], [H, shared_inter]. Where shared_inter is a multiple of I (every model
  // here), gate_up's rows are interleaved by I-wide slice as FeedForwardBlock keeps dense shared
  // experts ([gate_0; up_0; gate_1; ...]: shared_slices slices), and `joined` is `table` plus one
  // expert per slice (the form in which they join the routed experts' op).
  Tensor shared_gate_up, shared_down;
  int64_t shared_slices = 0;
  std::vector<ExpertWeights> table, joined;
};

const MoeWeights& Weights(int64_t id) {
  static std::vector<std::unique_ptr<MoeWeights>> cache(4);
  std::unique_ptr<MoeWeights>& w = cache[static_cast<size_t>(id)];
  if (w == nullptr) {
    const MoeModel m = Model(id);
    w = std::make_unique<MoeWeights>();
    const float std_gu = 1.0f / std::sqrt(static_cast<float>(m.hidden));
    const float std_down = 1.0f / std::sqrt(static_cast<float>(m.inter));
    for (int64_t e = 0; e < m.experts; ++e) {
      w->gate_up.push_back(RandomDevice(kExpertDtype, Shape{2 * m.inter, m.hidden}, 100 + e, std_gu));
      w->down.push_back(RandomDevice(kExpertDtype, Shape{m.hidden, m.inter}, 1000 + e, std_down));
      w->table.push_back({w->gate_up.back().view(), w->down.back().view()});
    }
    if (m.shared_inter > 0) {
      w->shared_gate_up = RandomDevice(kExpertDtype, Shape{2 * m.shared_inter, m.hidden}, 7, std_gu);
      w->shared_down = RandomDevice(kExpertDtype, Shape{m.hidden, m.shared_inter}, 8, std_down);
      if (m.shared_inter % m.inter == 0) w->shared_slices = m.shared_inter / m.inter;
    }
    w->joined = w->table;
    for (int64_t i = 0; i < w->shared_slices; ++i) {
      // Flagged as FeedForwardBlock flags bf16 shared slices (ExpertWeights::bf16_activations):
      // their x and activation rounded, and the grouped path not taken.
      w->joined.push_back({w->shared_gate_up.view().Narrow(0, 2 * i * m.inter, 2 * m.inter),
                           w->shared_down.view().Narrow(1, i * m.inter, m.inter),
                           /*bf16_activations=*/kExpertDtype == DType::kBF16});
    }
  }
  return *w;
}

void BM_MoeDecode(benchmark::State& state) {
  cuda::CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const MoeModel m = Model(state.range(0));
  const int64_t tokens = state.range(1);
  state.SetLabel(m.name);
  const MoeWeights& weights = Weights(state.range(0));
  const bool join = state.range(2) != 0;
  if (join && weights.shared_slices == 0) return state.SkipWithError("no shared experts to join");
  Tensor x = RandomDevice(DType::kF32, Shape{tokens, m.hidden}, 3);
  Tensor logits = RandomDevice(DType::kF32, Shape{tokens, m.experts}, 4);
  Tensor bias = RandomDevice(DType::kF32, Shape{m.experts}, 5, 0.1f);
  // Joined: every row's slots after its top_k name the shared slices (weight 1), written once, as
  // FeedForwardWorkspace does.
  const int64_t slots = m.top_k + (join ? weights.shared_slices : 0);
  Tensor ids = *Tensor::Empty(DType::kI32, Shape{tokens, slots}, b->allocator());
  Tensor w = *Tensor::Empty(DType::kF32, Shape{tokens, slots}, b->allocator());
  if (join) {
    Tensor host_ids = *Tensor::Zeros(DType::kI32, Shape{tokens, slots});
    Tensor host_w = *Tensor::Zeros(DType::kF32, Shape{tokens, slots});
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t i = 0; i < weights.shared_slices; ++i) {
        host_ids.data_as<int32_t>()[t * slots + m.top_k + i] = static_cast<int32_t>(m.experts + i);
        host_w.data_as<float>()[t * slots + m.top_k + i] = 1.0f;
      }
    }
    if (!Check(state, b->Copy(host_ids, ids), "ids") || !Check(state, b->Copy(host_w, w), "weights") ||
        !Check(state, b->Synchronize(), "Synchronize")) {
      return;
    }
  }
  const TensorView routed_ids = ids.view().Narrow(1, 0, m.top_k), routed_w = w.view().Narrow(1, 0, m.top_k);
  Tensor out = *Tensor::Empty(DType::kF32, Shape{tokens, m.hidden}, b->allocator());
  const int64_t si = std::max<int64_t>(m.shared_inter, 1);
  Tensor shared_gu = *Tensor::Empty(DType::kF32, Shape{tokens, 2 * si}, b->allocator());
  Tensor shared_act = *Tensor::Empty(DType::kF32, Shape{tokens, si}, b->allocator());
  const TensorView bias_view = bias.view();
  const TensorView* correction = m.routing.topk_method == TopkMethod::kNoauxTc ? &bias_view : nullptr;
  absl::Status status;
  // As FeedForwardBlock runs a MoE layer: route, routed experts, and the shared experts joined to
  // them (join) or their own MLP added to `out` (its activations slice by slice where gate_up is
  // interleaved).
  auto step = [&] {
    status = b->MoeRoute(logits, correction, m.routing, routed_ids, routed_w);
    const std::vector<ExpertWeights>& experts = join ? weights.joined : weights.table;
    if (status.ok()) status = b->MoeExperts(x, ids, w, experts, out, /*accumulate=*/false);
    if (status.ok() && m.shared_inter > 0 && !join) {
      status = b->Gemm(x, weights.shared_gate_up, shared_gu, {});
      const int64_t block = weights.shared_slices > 0 ? m.inter : m.shared_inter;
      for (int64_t c = 0; status.ok() && c < m.shared_inter; c += block) {
        status = b->SiluMul(shared_gu.view().Narrow(1, 2 * c, 2 * block), shared_act.view().Narrow(1, c, block));
      }
      GemmOptions accumulate;
      accumulate.beta = 1.0f;
      if (status.ok()) status = b->Gemm(shared_act, weights.shared_down, out, accumulate);
    }
  };
  step();
  if (!Check(state, status, "MoE step") || !Check(state, b->Synchronize(), "Synchronize")) return;
  // The floor reads each expert the routing selected once (plus the shared experts).
  Tensor host_ids = *Tensor::Empty(DType::kI32, Shape{tokens, m.top_k});
  (void)b->Copy(routed_ids, host_ids);
  (void)b->Synchronize();
  const std::set<int32_t> touched(host_ids.data_as<int32_t>(), host_ids.data_as<int32_t>() + host_ids.numel());
  // Timed inside a graph of 4 steps, as a decode step runs it.
  const double seconds = RunTimedInGraph(state, b->stream(), 4, step);
  if (!Check(state, status, "MoE step")) return;
  const double elem = static_cast<double>(DTypeSize(kExpertDtype));
  const double expert_bytes = 3.0 * m.inter * m.hidden * elem;
  const double shared_bytes = 3.0 * m.shared_inter * m.hidden * elem;
  const double bytes = static_cast<double>(touched.size()) * expert_bytes + shared_bytes;
  const double flops = static_cast<double>(tokens) * (m.top_k * m.inter + m.shared_inter) * 3.0 * 2.0 * m.hidden;
  state.counters["experts_touched"] = static_cast<double>(touched.size());
  state.counters["weight_elem_bytes"] = elem;
  ReportRoofline(state, seconds, bytes, flops);
}

// join 1: the shared experts joined to the routed ones, as FeedForwardBlock runs dense ones up to 8 rows;
// join 0: their own MLP, as past that (both forms at 1, 4, 8 and 16 rows, for the A/B).
void MoeArgs(benchmark::internal::Benchmark* bm) {
  if (Quick()) {
    bm->ArgsProduct({{0, 1, 2, 3}, {1, 16}, {0, 1}});
    bm->ArgsProduct({{0, 1, 2, 3}, {64}, {0}});
  } else {
    bm->ArgsProduct({{0, 1, 2, 3}, {1, 4, 8, 16}, {0, 1}});
    // Around the grouped path's switch (MoeExpertsUseGrouped: 40 tokens and 2 E pairs).
    bm->ArgsProduct({{0, 1, 2, 3}, {24, 32, 40, 48, 64, 256, 512, 2048}, {0}});
  }
}
BENCHMARK(BM_MoeDecode)
    ->ArgNames({"model", "tokens", "join"})
    ->Apply(MoeArgs)
    ->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
