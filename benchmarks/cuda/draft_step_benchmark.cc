// The EAGLE-3 draft step at the DeepSeek-V3 EAGLE-3 head of SpecForge (hidden 7168, 56 heads / 8 kv
// heads, head_dim 128, intermediate 40960, draft vocab 32000, target vocab 129280, three aux layers),
// timed with CUDA events (bench_util.h), with its roofline floor.
//
//   BM_DraftStep/tp/tokens/from_target/graph : one draft step on a CudaBackend, one sequence of
//       `tokens` rows after a 1024-row cached context, logits of the last row. graph 0 = one
//       eagle3::DraftModel::Forward as the simple API runs it (host aux/hidden in, host logits and
//       hidden out, eager launches, a host synchronization); graph 1 = the step staged once and its
//       Launch captured in a CUDA graph and replayed (what a graphed decode loop runs per step: the
//       staging copies and every kernel, no host work, no synchronization). tp 1 = the whole head; tp 8 =
//       the model built as rank 0 of 8 (kv heads, MLP and lm_head sharded as DraftModel shards them;
//       fc replicated), driven by a single-rank stand-in communicator that only moves this rank's
//       own data, so the time is one rank's compute: the collectives are measured separately by
//       collectives_benchmark. from_target 1 = the first step after a target pass (fc over the aux
//       states), 0 = a later step (the fed-back hidden).
//   BM_MlaDraftStep/tokens/from_target/graph : the same step (tp 8 only) of a Kimi-K2.5-shaped MLA
//       EAGLE-3 draft (DraftKind::kMla; random, over a K2 target directory holding its embedding).
//   BM_MtpDraftStep/tokens/fp8/graph : the same step (tp 8 only) of DeepSeek-V3's MTP module
//       (DraftModel::CreateMtp) from a sparse V3 target directory holding only the module, the
//       embedding and lm_head; fp8 1 = the published FP8 form kept quantized. Run the two alone with
//       --benchmark_filter='BM_(Mla|Mtp)DraftStep'.
//   BM_FcProjection/tokens/shards/bf16 : the fc GEMM [T, 3*7168] x [7168/shards, 3*7168]^T alone;
//       shards 1 = replicated (what DraftModel runs), 8 = one rank's column shard (the modeled
//       alternative: + an all-gather of [T, 7168], see make_results.py); bf16 0 = f32 weights and
//       activations (the library today), 1 = bf16 (the target precision).
//
// Weights come from WriteRandomEagle3DraftCheckpoint (bf16 on disk) and a target directory holding
// the DeepSeek-V3 config.json and a random model.embed_tokens.weight (the draft shares the target's
// embedding), written once under $EAGLE3_BENCH_CKPT_DIR (default /tmp/eagle3-bench-ckpt) and reused
// by later runs; setup_s reports what writing and loading took. The byte floors count the element
// size of the weights the model stores (DraftModelOptions::weight_dtype unset: the backend's
// preference, bf16 on CUDA; counter weight_elem_bytes). Runs up to 2026-12-01b stored f32.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "sparse_checkpoint.h"
#include "eagle3/communicator.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/draft_model.h"
#include "eagle3/mtp_config.h"
#include "eagle3/mtp_weights.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/tensor.h"
#include "eagle3/testing/random_draft_checkpoint.h"

namespace eagle3::bench {
namespace {

// DeepSeek-V3's hub config.json (quantization_config and auto_map left out).
constexpr const char* kV3Config = R"({"architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
 "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
 "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
 "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
 "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
 "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
 "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
 "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
 "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 10000, "routed_scaling_factor": 2.5,
 "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
 "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280})";

// The SpecForge DeepSeek-V3 EAGLE-3 head.
constexpr int64_t kHidden = 7168, kHeads = 56, kKvHeads = 8, kHeadDim = 128, kInter = 40960;
constexpr int64_t kDraftVocab = 32000, kVocab = 129280, kAuxLayers = 3;
constexpr int64_t kContext = 1024;  // draft KV rows cached before the timed step
constexpr int64_t kPageSize = 64;
constexpr int64_t kMaxTokens = 1024;

// The target directory: config.json and a bf16 model.embed_tokens.weight [129280, 7168] (a random
// 1 Mi-value block tiled: the values only need to be finite).
absl::Status WriteTarget(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << kV3Config;
  const size_t n = static_cast<size_t>(kVocab * kHidden);
  std::vector<uint16_t> block(size_t{1} << 20);
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (uint16_t& v : block) v = FloatToBf16(dist(rng));
  std::vector<uint16_t> embed(n);
  for (size_t i = 0; i < n; i += block.size()) {
    std::copy_n(block.begin(), std::min(block.size(), n - i), embed.begin() + static_cast<std::ptrdiff_t>(i));
  }
  const NamedTensor t{"model.embed_tokens.weight",
                      TensorView(embed.data(), DType::kBF16, Shape{kVocab, kHidden})};
  return WriteSafetensors(dir + "/model.safetensors", std::span<const NamedTensor>(&t, 1));
}

// Writes (once; a `complete` marker makes later runs reuse it) the draft and target directories.
absl::Status EnsureCheckpoints(const std::string& root) {
  if (std::filesystem::exists(root + "/complete")) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  EAGLE3_ASSIGN_OR_RETURN(DeepseekV2Config target, DeepseekV2Config::FromJson(kV3Config, "DeepSeek-V3 config"));
  EAGLE3_RETURN_IF_ERROR(WriteTarget(root + "/target"));
  RandomDraftCheckpointOptions o;
  o.seed = 1;
  o.dtype = DType::kBF16;
  o.hidden_size = kHidden;
  o.num_attention_heads = kHeads;
  o.num_key_value_heads = kKvHeads;
  o.head_dim = kHeadDim;
  o.intermediate_size = kInter;
  o.draft_vocab_size = kDraftVocab;
  o.max_position_embeddings = 4096;
  o.tiled_values = true;  // 2.9 GB: seconds instead of a minute of drawing (63 s on the H200 host)
  EAGLE3_RETURN_IF_ERROR(WriteRandomEagle3DraftCheckpoint(target, root + "/draft", o));
  std::ofstream(root + "/complete") << "ok\n";
  std::fprintf(stderr, "draft_step_benchmark: wrote the V3 draft + target checkpoints to %s in %.1f s\n",
               root.c_str(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

// Stands in for the other TP ranks when one rank is timed alone: the collectives move only this
// rank's own data (AllReduceSum copies send to recv, AllGather writes this rank's block), on the
// backend's stream. The results are therefore not the model's; only the time is of interest, and
// the real collectives are timed by collectives_benchmark.
class SoloRankCommunicator final : public Communicator {
 public:
  SoloRankCommunicator(int size, int rank, eagle3::Backend* backend) : size_(size), rank_(rank), backend_(backend) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return backend_->device(); }
  absl::Status AllReduceSum(const TensorView& send, const TensorView& recv) override {
    return send.data() == recv.data() ? absl::OkStatus() : backend_->Copy(send, recv);
  }
  absl::Status AllGather(const TensorView& send, const TensorView& recv) override {
    const TensorView own = recv.Narrow(0, rank_ * send.dim(0), send.dim(0));
    return send.data() == own.data() ? absl::OkStatus() : backend_->Copy(send, own);
  }
  absl::Status ReduceScatterSum(const TensorView& send, const TensorView& recv) override {
    const TensorView own = send.Narrow(0, rank_ * recv.dim(0), recv.dim(0));
    return own.data() == recv.data() ? absl::OkStatus() : backend_->Copy(own, recv);
  }
  absl::Status Broadcast(const TensorView&, int) override { return absl::OkStatus(); }

 private:
  int size_, rank_;
  eagle3::Backend* backend_;
};

struct LoadedDraft {
  std::unique_ptr<SoloRankCommunicator> comm;
  std::unique_ptr<DraftModel> model;
  double setup_seconds = 0;
  absl::Status status;
};

// The options every row builds its draft with: rank 0 of `tp`, room for the context and the step.
DraftModelOptions RankOptions(int tp) {
  DraftModelOptions options;
  options.tp_size = tp;
  options.rank = 0;
  options.max_tokens_per_forward = kMaxTokens;
  options.max_context_len = 2048;
  options.page_size = kPageSize;
  options.num_kv_pages = options.max_context_len / kPageSize;
  return options;
}

// Loads (once per process and `key`) a draft with `create`, after `ensure` wrote its checkpoints;
// setup_seconds counts both.
template <typename EnsureFn, typename CreateFn>
LoadedDraft& CachedDraft(const std::string& key, int tp, EnsureFn&& ensure, CreateFn&& create) {
  static std::map<std::string, std::unique_ptr<LoadedDraft>> cache;
  std::unique_ptr<LoadedDraft>& d = cache[key];
  if (d != nullptr) return *d;
  d = std::make_unique<LoadedDraft>();
  const auto start = std::chrono::steady_clock::now();
  d->status = ensure();
  if (!d->status.ok()) return *d;
  if (tp > 1) d->comm = std::make_unique<SoloRankCommunicator>(tp, 0, Backend());
  absl::StatusOr<std::unique_ptr<DraftModel>> model = create(d->comm.get());
  if (!model.ok()) {
    d->status = model.status();
    return *d;
  }
  d->model = std::move(*model);
  d->setup_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return *d;
}

// rank 0 of `tp`, loaded once per process.
LoadedDraft& Draft(int tp) {
  const std::string root = BenchCheckpointRoot();
  return CachedDraft(
      "llama-v3/" + std::to_string(tp), tp, [&] { return EnsureCheckpoints(root); },
      [&](Communicator* comm) {
        return DraftModel::Create(root + "/draft", root + "/target", RankOptions(tp), comm, Backend());
      });
}

// One timed draft step of `model` (the rows' protocol, at the top of the file): a kContext-row
// prefill from the target fills the draft cache, then one sequence of `tokens` rows is timed eagerly
// (Forward) or as a replayed graph of its Launch. Returns the seconds per step, or a negative value
// after skipping the benchmark.
double TimeDraftStep(benchmark::State& state, DraftModel& model, int64_t tokens, bool from_target, bool graph) {
  const DraftShape& shape = model.shape();
  const int64_t width = from_target ? shape.input_width : shape.hidden_size;
  std::vector<int32_t> pages(static_cast<size_t>((kContext + kMaxTokens) / kPageSize));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> token(0, shape.vocab_size - 1);
  auto random_tokens = [&](int64_t n) {
    std::vector<int64_t> out(static_cast<size_t>(n));
    for (int64_t& t : out) t = token(rng);
    return out;
  };
  auto random_host = [&](int64_t rows, int64_t cols) {
    Tensor t = *Tensor::Empty(DType::kF32, Shape{rows, cols});
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
    return t;
  };
  // Fill the context rows of the draft cache (a prefill from the target), so the step attends real
  // values.
  {
    const std::vector<int64_t> prefill = random_tokens(kContext);
    DraftSequenceInput in;
    in.tokens = prefill;
    in.page_table = pages;
    Tensor aux = random_host(kContext, shape.input_width);
    Tensor logits = *Tensor::Empty(DType::kF32, Shape{1, shape.draft_vocab});
    Tensor hidden = *Tensor::Empty(DType::kF32, Shape{kContext, shape.hidden_size});
    if (!Check(state, model.Forward({&in, 1}, aux, true, logits, hidden), "prefill Forward")) return -1;
  }
  const std::vector<int64_t> step_tokens = random_tokens(tokens);
  DraftSequenceInput in;
  in.tokens = step_tokens;
  in.page_table = pages;
  in.cache_len = kContext;
  Tensor hidden = random_host(tokens, width);
  Tensor logits = *Tensor::Empty(DType::kF32, Shape{1, shape.draft_vocab});
  Tensor hidden_out = *Tensor::Empty(DType::kF32, Shape{tokens, shape.hidden_size});
  absl::Status status;
  double seconds = 0;
  if (graph) {
    if (!Check(state, model.Stage({&in, 1}, hidden, from_target), "Stage")) return -1;
    seconds = RunTimedInGraph(state, Backend()->stream(), 1, [&] {
      if (status.ok()) status = model.Launch();
    });
    if (status.ok()) status = model.Finish(logits, hidden_out);
    if (!Check(state, status, "Launch / Finish")) return -1;
  } else {
    seconds = RunTimed(state, Backend()->stream(), [&] {
      if (status.ok()) status = model.Forward({&in, 1}, hidden, from_target, logits, hidden_out);
    });
    if (!Check(state, status, "Forward")) return -1;
  }
  return seconds;
}

// The bytes of the host-visible inputs and outputs of a step (f32), which the floors count once.
double StepIoBytes(const DraftModel& model, int64_t tokens, bool from_target) {
  const DraftShape& shape = model.shape();
  const int64_t width = from_target ? shape.input_width : shape.hidden_size;
  return static_cast<double>(tokens) * (width + 2 * shape.hidden_size) * 4.0 + shape.draft_vocab * 4.0;
}

void BM_DraftStep(benchmark::State& state) {
  if (Backend() == nullptr) return state.SkipWithError("no CUDA device");
  const int tp = static_cast<int>(state.range(0));
  const int64_t tokens = state.range(1);
  const bool from_target = state.range(2) != 0;
  const bool graph = state.range(3) != 0;
  LoadedDraft& d = Draft(tp);
  if (!Check(state, d.status, "loading the draft")) return;
  DraftModel& model = *d.model;
  const double seconds = TimeDraftStep(state, model, tokens, from_target, graph);
  if (seconds < 0) return;

  // Floor: every weight of this rank's step read once (in its stored dtype), the cached K/V rows
  // read once, the embedding rows and the host-visible inputs/outputs once; flops of the GEMMs and
  // attention.
  const int64_t heads = kHeads / tp, kv_heads = kKvHeads / tp, inter = kInter / tp;
  const int64_t vocab_shard = kDraftVocab / tp;
  const double fc = from_target ? static_cast<double>(kHidden) * kAuxLayers * kHidden : 0.0;
  const double qkv = static_cast<double>((heads + 2 * kv_heads) * kHeadDim) * 2 * kHidden;
  const double o = static_cast<double>(kHidden) * heads * kHeadDim;
  const double mlp = 3.0 * inter * kHidden;
  const double lm = static_cast<double>(vocab_shard) * kHidden;
  const double weight_elems = fc + qkv + o + mlp + lm;
  const double kv_bytes = static_cast<double>(kContext + tokens) * 2 * kv_heads * kHeadDim * 4.0;
  const double act_bytes = StepIoBytes(model, tokens, from_target);
  const double weight_elem_bytes = static_cast<double>(
      DTypeSize(model.options().weight_dtype.value_or(Backend()->preferred_weight_dtype())));
  const double bytes = weight_elems * weight_elem_bytes + kv_bytes + act_bytes;
  const double flops = 2.0 * tokens * (weight_elems - lm) + 2.0 * lm +
                       4.0 * tokens * heads * kHeadDim * static_cast<double>(kContext + tokens);
  state.counters["setup_s"] = d.setup_seconds;
  state.counters["weight_bytes"] = weight_elems * weight_elem_bytes;
  state.counters["weight_elem_bytes"] = weight_elem_bytes;
  state.counters["paged_registers"] = Backend()->options().paged_attention_registers ? 1 : 0;
  ReportRoofline(state, seconds, bytes, flops);
}

void DraftArgs(benchmark::internal::Benchmark* bm) {
  if (Quick()) {
    bm->ArgsProduct({{1, 8}, {1, 16, 64}, {1}, {1}});
  } else {
    bm->ArgsProduct({{1, 8}, {1, 4, 16, 64}, {1, 0}, {1, 0}});
  }
}
BENCHMARK(BM_DraftStep)
    ->ArgNames({"tp", "tokens", "from_target", "graph"})
    ->Apply(DraftArgs)
    ->Apply(Timed);

// ---- The MLA EAGLE-3 draft at the Kimi-K2.5 shape (BM_MlaDraftStep) ---------------------------------

// Kimi-K2-Thinking's hub config.json (the language model K2.5 wraps; quantization_config left out:
// the draft reads only the target's bf16 embedding, which K2.5's INT4 form does not quantize).
constexpr const char* kK2Config = R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
 "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
 "kv_lora_rank": 512, "max_position_embeddings": 262144, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
 "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": true,
 "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64,
 "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
 "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
 "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 50000.0,
 "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_group": 1,
 "topk_method": "noaux_tc", "v_head_dim": 128, "vocab_size": 163840})";

// The K2.5 MLA draft (docs/mla_drafts.md: the dense MLP of the public drafts is 18432 wide; a
// 32000-token draft vocabulary with d2t as the 32K variants).
constexpr int64_t kMlaHeads = 64, kMlaQLora = 1536, kMlaKvLora = 512, kMlaNope = 128, kMlaRope = 64, kMlaV = 128;
constexpr int64_t kMlaInter = 18432, kK2Vocab = 163840;

// The MLA draft (WriteRandomEagle3DraftCheckpoint, tiled bf16, `layers.0.` names as the published
// drafts) and a K2 target directory holding its config and a random embedding (sparse, tiled), once.
absl::Status EnsureMlaCheckpoints(const std::string& root) {
  if (std::filesystem::exists(root + "/draft/complete")) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  EAGLE3_ASSIGN_OR_RETURN(DeepseekV2Config target, DeepseekV2Config::FromJson(kK2Config, "Kimi-K2 config"));
  const std::vector<SparseTensor> embed = SparseTensorsOf(
      target, {WeightSpec{DeepseekEmbeddingName(target), Shape{kK2Vocab, kHidden}}},
      [](const std::string&) { return true; });
  EAGLE3_RETURN_IF_ERROR(WriteSparseCheckpoint(root + "/target", kK2Config, embed, /*tiled=*/true));
  RandomDraftCheckpointOptions o;
  o.seed = 2;
  o.dtype = DType::kBF16;
  o.hidden_size = kHidden;
  o.num_attention_heads = kMlaHeads;
  o.intermediate_size = kMlaInter;
  o.draft_vocab_size = kDraftVocab;
  o.max_position_embeddings = 4096;
  o.mla = RandomDraftCheckpointOptions::MlaShape{kMlaQLora, kMlaKvLora, kMlaNope, kMlaRope, kMlaV};
  o.layer_prefix = "layers.0.";
  o.tiled_values = true;
  EAGLE3_RETURN_IF_ERROR(WriteRandomEagle3DraftCheckpoint(target, root + "/draft", o));
  std::ofstream(root + "/draft/complete") << "ok\n";
  std::fprintf(stderr, "draft_step_benchmark: wrote the K2.5 MLA draft + target to %s in %.1f s\n", root.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

void BM_MlaDraftStep(benchmark::State& state) {
  if (Backend() == nullptr) return state.SkipWithError("no CUDA device");
  constexpr int kTp = 8;
  const int64_t tokens = state.range(0);
  const bool from_target = state.range(1) != 0;
  const bool graph = state.range(2) != 0;
  const std::string root = BenchCheckpointRoot() + "/mla-k25";
  LoadedDraft& d = CachedDraft(
      "mla-k25", kTp, [&] { return EnsureMlaCheckpoints(root); },
      [&](Communicator* comm) {
        return DraftModel::Create(root + "/draft", root + "/target", RankOptions(kTp), comm, Backend());
      });
  if (!Check(state, d.status, "loading the MLA draft")) return;
  DraftModel& model = *d.model;
  const double seconds = TimeDraftStep(state, model, tokens, from_target, graph);
  if (seconds < 0) return;

  // Floor: rank 0's weights read once in their stored dtype (fc, q_a and kv_a replicated over the
  // 2H-wide input; q_b and kv_b by heads, o_proj by columns; the MLP's slice; the lm_head shard), the
  // replicated f32 latent cache rows, the inputs/outputs. Flops: the GEMMs, and the absorbed
  // attention (scores over kv_lora + rope, values over kv_lora) per local head.
  const int64_t heads = kMlaHeads / kTp, latent = kMlaKvLora + kMlaRope;
  const double fc = from_target ? static_cast<double>(kHidden) * kAuxLayers * kHidden : 0.0;
  const double attn = static_cast<double>(kMlaQLora + latent) * 2 * kHidden +
                      static_cast<double>(heads) * (kMlaNope + kMlaRope) * kMlaQLora +
                      static_cast<double>(heads) * (kMlaNope + kMlaV) * kMlaKvLora +
                      static_cast<double>(kHidden) * heads * kMlaV;
  const double mlp = 3.0 * (kMlaInter / kTp) * kHidden;
  const double lm = static_cast<double>(kDraftVocab / kTp) * kHidden;
  const double weight_elems = fc + attn + mlp + lm;
  const double weight_elem_bytes = static_cast<double>(
      DTypeSize(model.options().weight_dtype.value_or(Backend()->preferred_weight_dtype())));
  const double cache_bytes = static_cast<double>(kContext + tokens) * latent * 4.0;
  const double bytes = weight_elems * weight_elem_bytes + cache_bytes + StepIoBytes(model, tokens, from_target);
  const double flops = 2.0 * tokens * (weight_elems - lm) + 2.0 * lm +
                       2.0 * tokens * heads * static_cast<double>(kContext + tokens) * (latent + kMlaKvLora);
  state.counters["setup_s"] = d.setup_seconds;
  state.counters["weight_bytes"] = weight_elems * weight_elem_bytes;
  state.counters["weight_elem_bytes"] = weight_elem_bytes;
  ReportRoofline(state, seconds, bytes, flops);
}

void MlaDraftArgs(benchmark::internal::Benchmark* bm) {
  bm->ArgsProduct({{1, 4, 16}, {1, 0}, {1, 0}});
}
BENCHMARK(BM_MlaDraftStep)
    ->ArgNames({"tokens", "from_target", "graph"})
    ->Apply(MlaDraftArgs)
    ->Apply(Timed);

// ---- DeepSeek-V3's MTP module as a drafter (BM_MtpDraftStep) ------------------------------------------

// kV3Config with the published FP8 quantization_config (e4m3, 128 x 128 blocks).
std::string V3Fp8Config() {
  std::string json = kV3Config;
  json.insert(json.rfind('}'), R"(, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
 "quant_method": "fp8", "weight_block_size": [128, 128]})");
  return json;
}

// A V3 target directory holding only what CreateMtp reads (CheckMtpWeights checks the module alone):
// MTP module 0 (model.layers.61.*) in the config's stored forms, the embedding and lm_head. Random:
// the embedding, eh_proj and the router (so the residual stream differs per token and every token
// routes to its own experts); lm_head and the other matrices are holes. Written once.
absl::Status EnsureMtpCheckpoint(const std::string& dir, const std::string& config_json) {
  if (std::filesystem::exists(dir + "/complete")) return absl::OkStatus();
  EAGLE3_ASSIGN_OR_RETURN(DeepseekV2Config target, DeepseekV2Config::FromJson(config_json, dir + "/config.json"));
  EAGLE3_ASSIGN_OR_RETURN(MtpConfig mtp, MtpConfig::FromTarget(target));
  std::vector<WeightSpec> specs = MtpModuleWeights(target, mtp, 0);
  for (const WeightSpec& spec : DeepseekV2Weights(target)) {
    if (spec.name == DeepseekEmbeddingName(target) || spec.name == target.tensor_prefix + "lm_head.weight") {
      specs.push_back(spec);
    }
  }
  const std::vector<SparseTensor> tensors = SparseTensorsOf(target, specs, [](const std::string& name) {
    return Ends(name, "embed_tokens.weight") || Ends(name, "eh_proj.weight") || Ends(name, "mlp.gate.weight");
  });
  return WriteSparseCheckpoint(dir, config_json, tensors, /*tiled=*/true);
}

// V3's MoE layer at the rank: experts split by their intermediate dim over the ranks.
constexpr int64_t kV3Experts = 256, kV3TopK = 8, kV3ExpertInter = 2048, kV3DenseHeads = 128;

void BM_MtpDraftStep(benchmark::State& state) {
  if (Backend() == nullptr) return state.SkipWithError("no CUDA device");
  constexpr int kTp = 8;
  const int64_t tokens = state.range(0);
  const bool fp8 = state.range(1) != 0;
  const bool graph = state.range(2) != 0;
  const std::string name = fp8 ? "mtp-v3-fp8" : "mtp-v3-bf16";
  const std::string dir = BenchCheckpointRoot() + "/" + name;
  LoadedDraft& d = CachedDraft(
      name, kTp, [&] { return EnsureMtpCheckpoint(dir, fp8 ? V3Fp8Config() : std::string(kV3Config)); },
      [&](Communicator* comm) {
        DraftModelOptions options = RankOptions(kTp);
        // The published form streamed as stored (FP8 codes + block scales); bf16 has nothing to keep.
        options.keep_quantized = fp8;
        return DraftModel::CreateMtp(dir, options, comm, Backend());
      });
  if (!Check(state, d.status, "loading the MTP drafter")) return;
  DraftModel& model = *d.model;
  // The first step after a target pass and a later one run the same work (the input is H wide).
  const double seconds = TimeDraftStep(state, model, tokens, /*from_target=*/true, graph);
  if (seconds < 0) return;

  // Floor: rank 0's share read once: eh_proj's 2H / tp columns (always bf16), the attention (q_a and
  // kv_a replicated, q_b / kv_b by heads, o_proj by columns) and the shared expert's slice in the
  // stored form (bf16, or 1-byte FP8 codes + f32 block scales), the router (bf16: the checkpoint's,
  // kept so with bf16 weights, FeedForwardBlock::RouterDtype; f32 before 2026-12-04), the slices of the
  // experts the step touches, the lm_head shard (bf16 in both forms), the f32 latent cache rows and
  // the inputs/outputs. The routing ids are not visible from a DraftModel, so the touched experts
  // are estimated as E (1 - (1 - k/E)^tokens), the expected count under uniform routing (the random
  // router spreads the tokens about uniformly).
  const int64_t heads = kV3DenseHeads / kTp, latent = kMlaKvLora + kMlaRope;
  const double elem = fp8 ? 1.0 + 4.0 / (128.0 * 128.0) : 2.0;
  const double attn = static_cast<double>(kMlaQLora + latent) * kHidden +
                      static_cast<double>(heads) * (kMlaNope + kMlaRope) * kMlaQLora +
                      static_cast<double>(heads) * (kMlaNope + kMlaV) * kMlaKvLora +
                      static_cast<double>(kHidden) * heads * kMlaV;
  const double expert = 3.0 * (kV3ExpertInter / kTp) * kHidden;
  const double touched = static_cast<double>(kV3Experts) *
                         (1.0 - std::pow(1.0 - static_cast<double>(kV3TopK) / kV3Experts, static_cast<double>(tokens)));
  const double eh_proj = static_cast<double>(kHidden) * (2 * kHidden / kTp);
  const double router = static_cast<double>(kV3Experts) * kHidden;
  const double lm = static_cast<double>((kVocab + kTp - 1) / kTp) * kHidden;
  const double weight_bytes = (attn + (1.0 + touched) * expert) * elem + router * 2.0 + (eh_proj + lm) * 2.0;
  const double cache_bytes = static_cast<double>(kContext + tokens) * latent * 4.0;
  const double bytes = weight_bytes + cache_bytes + StepIoBytes(model, tokens, true);
  const double flops = 2.0 * tokens * (attn + (1.0 + kV3TopK) * expert + eh_proj + router) + 2.0 * lm +
                       2.0 * tokens * heads * static_cast<double>(kContext + tokens) * (latent + kMlaKvLora);
  state.counters["setup_s"] = d.setup_seconds;
  state.counters["weight_bytes"] = weight_bytes;
  state.counters["experts_touched_est"] = touched;
  ReportRoofline(state, seconds, bytes, flops);
}

void MtpDraftArgs(benchmark::internal::Benchmark* bm) {
  bm->ArgsProduct({{1, 4, 16}, {0, 1}, {1, 0}});
}
BENCHMARK(BM_MtpDraftStep)
    ->ArgNames({"tokens", "fp8", "graph"})
    ->Apply(MtpDraftArgs)
    ->Apply(Timed);

struct FcSet {
  Tensor weight;  // [7168 / shards, 3 * 7168]
};

void BM_FcProjection(benchmark::State& state) {
  cuda::CudaBackend* b = Backend();
  if (b == nullptr) return state.SkipWithError("no CUDA device");
  const int64_t tokens = state.range(0), shards = state.range(1);
  const DType dtype = state.range(2) != 0 ? DType::kBF16 : DType::kF32;
  const int64_t in = kAuxLayers * kHidden, out_cols = kHidden / shards;
  const double weight_bytes = static_cast<double>(out_cols) * in * DTypeSize(dtype);
  Rotation<FcSet> sets(CopiesToDefeatL2(weight_bytes), [&](int i) {
    return FcSet{RandomDevice(dtype, Shape{out_cols, in}, 20 + i, 1.0f / std::sqrt(static_cast<float>(in)))};
  });
  Tensor aux = RandomDevice(dtype, Shape{tokens, in}, 4);
  Tensor g = *Tensor::Empty(DType::kF32, Shape{tokens, out_cols}, b->allocator());
  absl::Status status;
  auto step = [&] {
    if (status.ok()) status = b->Gemm(aux, sets.Next().weight, g, {});
  };
  step();
  if (!Check(state, status, "Gemm") || !Check(state, b->Synchronize(), "Synchronize")) return;
  const double seconds = RunTimed(state, b->stream(), step);
  if (!Check(state, status, "Gemm")) return;
  const double bytes = weight_bytes + static_cast<double>(tokens) * in * DTypeSize(dtype) + tokens * out_cols * 4.0;
  const double flops = 2.0 * tokens * in * out_cols;
  // What the all-gather that completes a sharded fc must move per rank (f32 g), for the model.
  state.counters["allgather_bytes"] = shards > 1 ? static_cast<double>(tokens) * kHidden * 4.0 : 0.0;
  ReportRoofline(state, seconds, bytes, flops);
}

void FcArgs(benchmark::internal::Benchmark* bm) {
  if (Quick()) {
    bm->ArgsProduct({{1, 16, 64}, {1, 8}, {0, 1}});
  } else {
    bm->ArgsProduct({{1, 4, 16, 64}, {1, 8}, {0, 1}});
  }
}
BENCHMARK(BM_FcProjection)
    ->ArgNames({"tokens", "shards", "bf16"})
    ->Apply(FcArgs)
    ->Apply(Timed);

}  // namespace
}  // namespace eagle3::bench

int main(int argc, char** argv) { return eagle3::bench::Main(argc, argv); }
