// eagle3-decode — plain vs speculative (EAGLE-3) decoding of a target + draft pair.
//
//   eagle3-decode [--models-dir DIR | --target DIR --draft DIR | --target DIR --mtp | --random-pair]
//                 [--prompt TEXT | --prompt-file F | --tokens 5,17,...] [--batch N]
//                 [--prompt-tokens T] [--max-new-tokens N] [--topk K] [--steps S]
//                 [--draft-tokens N] [--temperature T] [--top-p P] [--seed S]
//                 [--tp N] [--device cpu|cuda] [--comm auto|nccl|staged] [--graphs on|off]
//                 [--loop device|host] [--aux-layers a,b,c]
//                 [--convention output|input] [--json FILE]
//
// Without --target/--draft it runs the built-in trained pair: models/tiny-v2-code (a small
// DeepSeek-V2 code model) and models/tiny-v2-code-eagle3 (its EAGLE-3 draft), from the models
// directory ($EAGLE3_MODELS_DIR, else an installed <prefix>/share/eagle3/models, else the source tree;
// --models-dir overrides it; missing directories are refused first). The prompt is text, tokenized with
// the target directory's tokenizer.json (--prompt, or --prompt-file read whole; by default a few
// lines of Python), or raw ids (--tokens). --random-pair writes a tiny random DeepSeek-V2 target and
// draft to a temporary directory instead (random weights: the draft's proposals are rarely
// accepted, so that shows the machinery, not a speedup). Runs on the CPU reference backend, or the
// GPU with --device cuda; --tp N runs N tensor-parallel ranks on threads (on CUDA over NCCL, one GPU
// per rank, or staged through the host when ranks share a GPU: --comm). --aux-layers overrides
// the draft config's aux layer ids (in --convention, default output-of-layer as in the config) to
// measure what a mis-wired tap costs. --draft takes a Llama-style or an MLA EAGLE-3 head (told apart
// by its config's architectures); --mtp drafts with the target's own MTP module instead (DeepSeek-V3:
// fed the target's final hidden after model.norm). --batch N decodes N prompts together in one Generate call: a
// given prompt (or, without a tokenizer, the default ids) N times, or else the first N entries of
// DIR/heldout_prompts.jsonl cut to --prompt-tokens T tokens each, so that the batch's lengths are
// comparable. Prints the prompt, both continuations (as text when the target has a tokenizer;
// prompt 0's with a batch, plus a line per prompt), whether greedy outputs agree, mean accepted
// length, acceptance per depth, tokens/s of both runs over all sequences and the speedup
// (speculative tokens/s over plain), and each run's prefill and decode seconds; --json writes them
// after the run report of run_report.h.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/draft_model.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/speculative_decoder.h"
#include "eagle3/status.h"
#include "eagle3/testing/random_checkpoint.h"
#include "eagle3/testing/random_draft_checkpoint.h"
#include "eagle3/testing/rank_threads.h"
#include "eagle3/tools/tokenizer.h"
#include "flag_parse.h"
#include "parse_ids.h"
#include "rank_context.h"
#include "run_report.h"

namespace {

// The built-in demo target: every DeepSeek-V2 feature at a size that runs in a blink — q-LoRA,
// YaRN, one dense layer then MoE with group-limited routing and shared experts, a vocab that needs
// padding at TP 8, dims that shard 8 ways, and 8 layers so the default taps {2, 4, 5} apply.
constexpr std::string_view kDemoTarget = R"json({
  "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
  "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8,
  "n_routed_experts": 16, "n_shared_experts": 2, "num_experts_per_tok": 4,
  "routed_scaling_factor": 16.0, "scoring_func": "softmax", "topk_method": "group_limited_greedy",
  "n_group": 4, "topk_group": 2, "norm_topk_prob": false, "first_k_dense_replace": 1,
  "moe_layer_freq": 1, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
  "qk_rope_head_dim": 16, "v_head_dim": 32, "hidden_act": "silu", "rms_norm_eps": 1e-6,
  "max_position_embeddings": 8192, "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
  "tie_word_embeddings": false, "bos_token_id": 0, "eos_token_id": 1
})json";

#ifndef EAGLE3_MODELS_DIR
#define EAGLE3_MODELS_DIR "models"
#endif

// The pair the demo runs by default, under the models directory.
constexpr char kDefaultTarget[] = "tiny-v2-code";
constexpr char kDefaultDraft[] = "tiny-v2-code-eagle3";

// The default prompt: the start of a small Python function, so the bare command shows the code
// model continuing it. It stops mid-line: the tokenizer joins a newline with the next line's
// indentation, so a prompt ending in a bare newline ends on a token the model rarely saw.
constexpr char kDefaultPrompt[] =
    "import os\n"
    "\n"
    "\n"
    "def read_lines(path):\n"
    "    \"\"\"Return the lines of the text file at path.\"\"\"\n"
    "    with open(path";

// Ids used when the target has no tokenizer and no prompt is given (the random pair).
const std::vector<int64_t> kDefaultIds = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};

// Under the models directory: the trained pair's held-out prompts (JSON lines with a "text" field),
// which --batch N without a prompt decodes.
constexpr char kHeldoutPrompts[] = "heldout_prompts.jsonl";

// The device loop drafts at every batch size by default: a step that drafts nothing still runs the
// draft's catch-up to keep it in sync, so switching speculation off does not yet beat speculating
// (benchmarks/NOTES.md, issue 16).
constexpr int kDefaultSpeculateUpTo = -1;

// Upper bound of --temperature: far above any useful value (sampling is already uniform in effect),
// low enough that logits / temperature stays a normal float.
constexpr double kMaxTemperature = 1000;

// The default --models-dir: $EAGLE3_MODELS_DIR when set; else <prefix>/share/eagle3/models next to an
// installed binary (../share/eagle3/models from the directory of /proc/self/exe) when it exists; else
// the source tree's models directory baked in at build time.
std::string DefaultModelsDir() {
  if (const char* env = std::getenv("EAGLE3_MODELS_DIR"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path installed = exe.parent_path() / ".." / "share" / "eagle3" / "models";
    if (std::filesystem::is_directory(installed, ec)) return installed.lexically_normal().string();
  }
  return EAGLE3_MODELS_DIR;
}

struct Flags {
  std::string target, draft, json;
  std::string models_dir = DefaultModelsDir();
  bool random_pair = false;
  bool mtp = false;  // --mtp: the target's own MTP module is the drafter (no --draft)
  std::optional<std::string> prompt;       // --prompt, or the contents of --prompt-file
  std::string prompt_file;                 // named in messages
  std::optional<std::vector<int64_t>> tokens;
  int batch = 1;            // sequences decoded together
  int prompt_tokens = 96;   // held-out prompts are cut to this many tokens
  int max_new_tokens = 48;
  eagle3::DraftTreeParams tree;
  eagle3::SamplingParams sampling;
  uint64_t seed = 0;
  int tp = 1;
  std::string device = "cpu";
  bool graphs = true;  // CUDA graphs for target steps (--device cuda; tp 1 or NCCL)
  bool host_loop = false;  // --loop host: the reference loop (trees and verification on the host)
  // --speculate-up-to: the device step drafts while at most this many sequences are active (-1: at
  // every batch size); above, its steps draft nothing and keep the draft in sync.
  int speculate_up_to = kDefaultSpeculateUpTo;
  // --min-accept-len: pause drafting while the measured mean accepted length is below it (0: never).
  double min_accept_len = 0;
  std::string comm = "auto";  // --comm: tp > 1 collectives on CUDA
  std::optional<eagle3::DType> weights;  // --weights; unset: the backend's preference
  std::optional<eagle3::DType> kv_cache;  // --kv-cache: the target's latent cache; unset: f32
  std::optional<std::vector<int>> aux_layers;
  eagle3::LayerIdConvention convention = eagle3::LayerIdConvention::kOutputOfLayer;
  int64_t max_input_bytes = eagle3::examples::kDefaultMaxInputBytes;  // --max-input-bytes
  // --allow-long-context: run prompt + new tokens beyond the target's max_position_embeddings.
  bool allow_long_context = false;
};

constexpr char kUsageText[] =
    "usage: eagle3-decode [--models-dir DIR | --target DIR --draft DIR | --target DIR --mtp |\n"
    "                      --random-pair]\n"
    "                     [--prompt TEXT | --prompt-file F | --tokens 5,17,...] [--batch N]\n"
    "                     [--prompt-tokens T] [--max-new-tokens N]\n"
    "                     [--topk K] [--steps S] [--draft-tokens N] [--temperature T] [--top-p P]\n"
    "                     [--seed S] [--tp N] [--device cpu|cuda] [--comm auto|nccl|staged]\n"
    "                     [--graphs on|off] [--loop device|host]\n"
    "                     [--weights bf16|f32] [--kv-cache bf16|f32]\n"
    "                     [--aux-layers a,b,c] [--convention output|input] [--json FILE]\n"
    "                     [--max-input-bytes N] [--allow-long-context]\n"
    "  integers are whole decimal numbers (\"2x\", \"1e3\" are refused); --seed any uint64;\n"
    "    --temperature in [0, 1000] (0 = greedy); --top-p in (0, 1]\n"
    "  --max-input-bytes N: the most read from --prompt-file or the held-out prompts file (default\n"
    "    1048576); a larger file, or a pipe or device yielding more, is refused\n"
    "  --allow-long-context: run prompts + --max-new-tokens beyond the target's\n"
    "    max_position_embeddings (refused by default)\n"
    "  --json FILE: write the run report (tool, command, version, settings: every flag as parsed,\n"
    "    device, seed, seconds: load, generate = prefill + decode of each run) and both runs'\n"
    "    results as JSON (default: none); refused before any work when FILE is not a regular\n"
    "    file, is read-only or is one of the inputs\n"
    "  default pair: DIR/tiny-v2-code + DIR/tiny-v2-code-eagle3 with DIR = --models-dir (default:\n"
    "    $EAGLE3_MODELS_DIR, else <prefix>/share/eagle3/models of an installed binary, else the source\n"
    "    tree's models; here: %s)\n"
    "  --prompt/--prompt-file: text tokenized with the target's tokenizer.json (default: a few lines\n"
    "    of Python); --tokens: raw target ids\n"
    "  --batch N: decode N prompts together (default 1): the given prompt N times, or without one the\n"
    "    first N entries of DIR/heldout_prompts.jsonl (without a tokenizer: the default ids N times)\n"
    "  --prompt-tokens T: cut each held-out prompt of a batch to its first T tokens (default 96)\n"
    "  --draft DIR: an EAGLE-3 draft, Llama-style or MLA (Eagle3DeepseekV2ForCausalLM), by its config's\n"
    "    architectures\n"
    "  --mtp: with --target, draft with the target's own MTP module (DeepSeek-V3), fed its final hidden\n"
    "    after model.norm (no --draft or --aux-layers)\n"
    "  --random-pair: a built-in tiny random DeepSeek-V2 target + EAGLE-3 draft (no speedup)\n"
    "  --loop: device (default) runs each decode step as one SpeculativeStep on the device; host runs\n"
    "    the reference loop (trees built and verified on the host, logits and taps copied every step)\n"
    "  --speculate-up-to B|all: the device loop drafts while at most B sequences are active; larger\n"
    "    batches decode plainly through the same step, the draft kept in sync (default all)\n"
    "  --min-accept-len L: the device loop pauses drafting for 32 steps whenever the mean accepted\n"
    "    length (bonus token included) of its last 8 drafting steps is below L (default 0: never)\n"
    "  --comm: collectives of --tp N on cuda: nccl (one GPU per rank), staged (through the host; ranks\n"
    "    may share a GPU), auto (nccl when there are N GPUs)\n"
    "  --weights: storage of both models' weights (default: the device's preference, bf16 on cuda,\n"
    "    f32 on cpu, which takes nothing else)\n"
    "  --kv-cache: storage of the target's latent KV cache (default f32; bf16 halves what attention\n"
    "    reads, rounding as eagle3/backend.h describes, on either device)\n"
    "  --aux-layers: replaces the draft config's aux layer ids (read in --convention: output = id k\n"
    "    is the output of layer k, boundary k+1, as draft configs mean; input = id k is boundary k,\n"
    "    0 the embedding output) to measure what a wrong tap costs\n";

// The usage with the resolved default --models-dir and the other defaults filled in.
std::string Usage() {
  std::string text(kUsageText);
  const std::string defaults =
      "  defaults: --max-new-tokens 48 --batch 1 --topk 4 --steps 3 --draft-tokens 8 --temperature 0\n"
      "    --top-p 1 --seed 0 --tp 1 --device cpu --comm auto --graphs on --loop device\n"
      "    --convention output --max-input-bytes 1048576; --json: none\n";
  const size_t at = text.find("%s");
  text.replace(at, 2, DefaultModelsDir());
  return text + defaults;
}

using eagle3::examples::ParseFloat;
using eagle3::examples::ParseInt;

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  // --help / -h anywhere answers before any other check.
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", Usage().c_str());
      std::exit(0);
    }
  }
  Flags f;
  bool models_dir_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--random-pair") {
      f.random_pair = true;
      continue;
    }
    if (flag == "--allow-long-context") {
      f.allow_long_context = true;
      continue;
    }
    if (flag == "--mtp") {
      f.mtp = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError("flag " + std::string(flag) + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--target") {
      f.target = value;
    } else if (flag == "--draft") {
      f.draft = value;
    } else if (flag == "--models-dir") {
      f.models_dir = value;
      models_dir_given = true;
    } else if (flag == "--json") {
      f.json = value;
    } else if (flag == "--device") {
      f.device = value;
    } else if (flag == "--weights") {
      EAGLE3_ASSIGN_OR_RETURN(f.weights, eagle3::examples::ParseStorageDType(flag, value));
    } else if (flag == "--kv-cache") {
      EAGLE3_ASSIGN_OR_RETURN(f.kv_cache, eagle3::examples::ParseStorageDType(flag, value));
    } else if (flag == "--comm" && (value == "auto" || value == "nccl" || value == "staged")) {
      f.comm = value;
    } else if (flag == "--graphs" && (value == "on" || value == "off")) {
      f.graphs = value == "on";
    } else if (flag == "--loop" && (value == "device" || value == "host")) {
      f.host_loop = value == "host";
    } else if (flag == "--min-accept-len") {
      EAGLE3_ASSIGN_OR_RETURN(const float min_len, ParseFloat(flag, value, 0, false, 1e6, false, "[0, 1e+06]"));
      f.min_accept_len = min_len;
    } else if (flag == "--speculate-up-to") {
      if (value == "all") {
        f.speculate_up_to = -1;
      } else {
        EAGLE3_ASSIGN_OR_RETURN(f.speculate_up_to, ParseInt(flag, value, 0, 1 << 20));
      }
    } else if (flag == "--prompt") {
      if (f.prompt.has_value() || !f.prompt_file.empty()) {
        return absl::InvalidArgumentError("give one of --prompt and --prompt-file");
      }
      f.prompt = value;
    } else if (flag == "--prompt-file") {
      if (f.prompt.has_value() || !f.prompt_file.empty()) {
        return absl::InvalidArgumentError("give one of --prompt and --prompt-file");
      }
      f.prompt_file = value;  // read once every flag is known (--max-input-bytes may follow)
    } else if (flag == "--max-input-bytes") {
      EAGLE3_ASSIGN_OR_RETURN(f.max_input_bytes,
                              eagle3::examples::ParseInt64(flag, value, 1, eagle3::examples::kMaxInputBytesLimit));
    } else if (flag == "--tokens") {
      EAGLE3_ASSIGN_OR_RETURN(f.tokens, eagle3::examples::ParseTokenIds(flag, value));
    } else if (flag == "--aux-layers") {
      EAGLE3_ASSIGN_OR_RETURN(f.aux_layers, eagle3::examples::ParseLayerIds(flag, value));
    } else if (flag == "--convention" && (value == "output" || value == "input")) {
      f.convention = value == "output" ? eagle3::LayerIdConvention::kOutputOfLayer
                                       : eagle3::LayerIdConvention::kInputOfLayer;
    } else if (flag == "--batch") {
      EAGLE3_ASSIGN_OR_RETURN(f.batch, ParseInt(flag, value, 1, 1024));
    } else if (flag == "--prompt-tokens") {
      EAGLE3_ASSIGN_OR_RETURN(f.prompt_tokens, ParseInt(flag, value, 1, 1 << 20));
    } else if (flag == "--max-new-tokens") {
      EAGLE3_ASSIGN_OR_RETURN(f.max_new_tokens, ParseInt(flag, value, 1, 1 << 20));
    } else if (flag == "--topk") {
      EAGLE3_ASSIGN_OR_RETURN(f.tree.topk, ParseInt(flag, value, 1, 1 << 16));
    } else if (flag == "--steps") {
      EAGLE3_ASSIGN_OR_RETURN(f.tree.num_steps, ParseInt(flag, value, 1, 64));
    } else if (flag == "--draft-tokens") {
      EAGLE3_ASSIGN_OR_RETURN(f.tree.num_draft_tokens, ParseInt(flag, value, 2, 1 << 16));
    } else if (flag == "--tp") {
      EAGLE3_ASSIGN_OR_RETURN(f.tp, ParseInt(flag, value, 1, 64));
    } else if (flag == "--seed") {
      EAGLE3_ASSIGN_OR_RETURN(f.seed, eagle3::examples::ParseUint64(flag, value));
    } else if (flag == "--temperature") {
      EAGLE3_ASSIGN_OR_RETURN(f.sampling.temperature,
                              ParseFloat(flag, value, 0, /*lo_open=*/false, kMaxTemperature, /*hi_open=*/false,
                                         "[0, " + std::to_string(static_cast<int>(kMaxTemperature)) + "]"));
    } else if (flag == "--top-p") {
      EAGLE3_ASSIGN_OR_RETURN(f.sampling.top_p,
                              ParseFloat(flag, value, 0, /*lo_open=*/true, 1, /*hi_open=*/false, "(0, 1]"));
    } else {
      return absl::InvalidArgumentError("bad flag or value: " + std::string(flag) + " " + value);
    }
  }
  EAGLE3_RETURN_IF_ERROR(eagle3::examples::CheckWeightsOnDevice(f.weights, f.device));
  if (!f.prompt_file.empty()) {
    EAGLE3_ASSIGN_OR_RETURN(f.prompt, eagle3::examples::ReadInputFile("--prompt-file", f.prompt_file,
                                                                      f.max_input_bytes));
  }
  if (f.mtp) {
    if (f.target.empty() || !f.draft.empty()) {
      return absl::InvalidArgumentError("--mtp drafts with the target's own MTP module: give --target and no --draft");
    }
    if (f.aux_layers.has_value()) {
      return absl::InvalidArgumentError("--aux-layers rewires an EAGLE-3 draft's taps; the MTP module (--mtp) has none");
    }
  } else if (f.target.empty() != f.draft.empty()) {
    return absl::InvalidArgumentError("give both --target and --draft, or neither");
  }
  if (f.random_pair && (!f.target.empty() || models_dir_given)) {
    return absl::InvalidArgumentError("--random-pair excludes --target/--draft and --models-dir");
  }
  if (!f.target.empty() && models_dir_given) return absl::InvalidArgumentError("give --models-dir or --target/--draft, not both");
  if (f.tokens.has_value() && f.prompt.has_value()) {
    return absl::InvalidArgumentError("give a text prompt (--prompt/--prompt-file) or --tokens, not both");
  }
  if (f.random_pair && f.prompt.has_value()) {
    return absl::InvalidArgumentError("the random pair has no tokenizer: give --tokens, not a text prompt");
  }
  return f;
}

struct RunResult {
  std::vector<std::vector<int64_t>> tokens;  // per prompt
  eagle3::DecodeStats stats;
  std::string launcher;  // the graph launcher's counts, when graphs ran
  std::string weights;   // the weight dtype the models ran with
  std::string comm;      // the collectives of tp > 1
  double load_seconds = 0;  // rank 0's model creation (weights loaded)
  eagle3::WeightLoadStats target_weights;  // where rank 0's target load spent its time
  eagle3::Device device;    // rank 0's
};

// Runs plain or speculative decoding of `prompts` (one batch) on `tp` ranks (threads); returns rank 0's
// result.
absl::StatusOr<RunResult> Decode(const Flags& flags, const std::vector<std::vector<int64_t>>& prompts,
                                 bool speculative) {
  const int64_t batch = static_cast<int64_t>(prompts.size());
  int64_t longest = 0;
  for (const std::vector<int64_t>& p : prompts) longest = std::max(longest, static_cast<int64_t>(p.size()));
  const eagle3::DraftTreeParams& tree = flags.tree;
  // Per sequence: the target holds the prompt, the output and one tree's nodes; the draft holds
  // SpeculativeStep::draft_slots_per_step() tree rows instead, max(N, (S - 1) k).
  const int64_t target_context = longest + flags.max_new_tokens + tree.num_draft_tokens;
  const int64_t draft_context =
      longest + flags.max_new_tokens + std::max<int64_t>(tree.num_draft_tokens, (tree.num_steps - 1) * tree.topk);
  constexpr int64_t kPageSize = 16;
  // The decoder splits each page pool evenly between the sequences.
  auto pages = [&](int64_t context) { return batch * ((context + kPageSize - 1) / kPageSize); };
  // A prompt is prefilled alone; a step runs B * N target rows and B * max(N, k) draft rows.
  const int64_t max_tokens_per_forward =
      std::max(longest, batch * std::max<int64_t>(tree.num_draft_tokens, tree.topk));
  RunResult result;
  EAGLE3_RETURN_IF_ERROR(eagle3::RunRankThreads(flags.tp, [&](int rank, eagle3::Communicator* host_comm) -> absl::Status {
    EAGLE3_ASSIGN_OR_RETURN(eagle3::examples::RankContext ctx, eagle3::examples::MakeRankContext(flags.device, rank, host_comm, flags.graphs, flags.comm));
    eagle3::Backend* backend = ctx.backend.get();
    eagle3::Communicator* comm = ctx.comm;
    eagle3::TargetModelOptions topt;
    topt.tp_size = flags.tp;
    topt.rank = rank;
    topt.max_tokens_per_forward = max_tokens_per_forward;
    topt.max_context_len = target_context;
    topt.page_size = kPageSize;
    topt.num_kv_pages = pages(target_context);
    topt.weight_dtype = flags.weights;
    topt.kv_cache_dtype = flags.kv_cache;
    // Run checked that prompt + new tokens fit max_position_embeddings (or --allow-long-context);
    // the context beyond holds one tree's slots, whose positions follow tree depth, not slots.
    topt.allow_long_context = true;
    // Capacities come from the flags: a refusal names them, not only the options they became.
    auto with_flags = [&](const absl::Status& status) {
      return absl::Status(status.code(), "with a batch of " + std::to_string(batch) + " prompts of up to " +
                                             std::to_string(longest) + " tokens, --max-new-tokens " +
                                             std::to_string(flags.max_new_tokens) + ", --draft-tokens " +
                                             std::to_string(tree.num_draft_tokens) + ": " +
                                             std::string(status.message()));
    };
    const auto load_start = std::chrono::steady_clock::now();
    auto created_target = eagle3::TargetModel::Create(flags.target, topt, comm, backend);
    if (created_target.status().code() == absl::StatusCode::kResourceExhausted) {
      return with_flags(created_target.status());
    }
    EAGLE3_ASSIGN_OR_RETURN(auto target, std::move(created_target));
    eagle3::DecodeOptions options;
    options.max_new_tokens = flags.max_new_tokens;
    options.eos_token_ids = target->config().eos_token_ids;
    options.tree = flags.tree;
    if (flags.speculate_up_to >= 0) options.schedule = eagle3::SpeculateUpToBatch(flags.tree, flags.speculate_up_to);
    if (flags.min_accept_len > 0) {
      if (options.schedule.empty()) options.schedule = {eagle3::SpeculationScheduleEntry{1 << 30, true, flags.tree}};
      for (eagle3::SpeculationScheduleEntry& row : options.schedule) row.min_accept_len = flags.min_accept_len;
    }
    options.sampling = flags.sampling;
    options.seed = flags.seed;
    options.target_launcher = ctx.launcher.get();
    if (rank == 0 && flags.max_new_tokens >= 64) {
      // Long runs show progress on stderr.
      options.progress = [name = speculative ? "speculative" : "plain"](int64_t done, int64_t limit) {
        std::fprintf(stderr, "\r%-12s %lld / %lld tokens", name, static_cast<long long>(done),
                     static_cast<long long>(limit));
        if (done >= limit) std::fprintf(stderr, "\n");
      };
    }
    std::unique_ptr<eagle3::DraftModel> draft;
    if (speculative) {
      eagle3::DraftModelOptions dopt;
      dopt.tp_size = flags.tp;
      dopt.rank = rank;
      dopt.max_tokens_per_forward = max_tokens_per_forward;
      dopt.max_context_len = draft_context;
      dopt.page_size = kPageSize;
      dopt.num_kv_pages = pages(draft_context);
      dopt.convention = flags.convention;
      dopt.aux_layer_ids_override = flags.aux_layers;
      dopt.weight_dtype = flags.weights;
      auto created = flags.mtp ? eagle3::DraftModel::CreateMtp(flags.target, dopt, comm, backend)
                               : eagle3::DraftModel::Create(flags.draft, flags.target, dopt, comm, backend);
      if (created.status().code() == absl::StatusCode::kResourceExhausted) return with_flags(created.status());
      if (!created.ok() && flags.aux_layers.has_value()) {
        return absl::Status(created.status().code(),
                            "with --aux-layers: " + std::string(created.status().message()));
      }
      EAGLE3_ASSIGN_OR_RETURN(draft, std::move(created));
      if (rank == 0) {
        std::printf("draft tap: %s\n", draft->tap().Describe().c_str());
        const std::vector<int>& b = draft->tap().boundaries();
        if (!std::is_sorted(b.begin(), b.end())) {
          std::fprintf(stderr,
                       "eagle3-decode: warning: the aux layer ids are not in layer order; the draft receives the "
                       "taps in the listed order, while SGLang and vLLM capture them in layer order\n");
        }
      }
    }
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    // The device step (the product), or the host reference loop over an Eagle3Drafter.
    std::unique_ptr<eagle3::Eagle3Drafter> drafter;
    if (flags.host_loop && draft != nullptr) {
      drafter = std::make_unique<eagle3::Eagle3Drafter>(draft.get(), static_cast<int>(batch));
    }
    auto make_decoder = [&](const eagle3::DecodeOptions& o) {
      return flags.host_loop ? eagle3::SpeculativeDecoder(target.get(), drafter.get(), o)
                             : eagle3::SpeculativeDecoder(target.get(), draft.get(), backend, o);
    };
    eagle3::DecodeStats stats;
    // A first run warms up (first-call scratch sizing, graph captures, caches); the second is timed,
    // so that neither plain nor speculative decoding is charged a one-time cost.
    eagle3::DecodeOptions warmup_options = options;
    warmup_options.progress = nullptr;
    EAGLE3_RETURN_IF_ERROR(make_decoder(warmup_options).Generate(prompts, &stats).status());
    eagle3::SpeculativeDecoder decoder = make_decoder(options);
    EAGLE3_ASSIGN_OR_RETURN(auto out, decoder.Generate(prompts, &stats));
    if (rank == 0) {
      result = RunResult{std::move(out),         stats,        ctx.LauncherSummary(),
                         eagle3::examples::WeightsName(flags.weights, *backend), ctx.comm_name, load_seconds,
                         target->load_stats(),   backend->device()};
    }
    return absl::OkStatus();
  }));
  return result;
}

using eagle3::examples::JsonInts;
using eagle3::examples::JsonObject;

std::string JoinDoubles(const std::vector<double>& v) {
  std::string s = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof(buf), "%s%.4f", i ? ", " : "", v[i]);
    s += buf;
  }
  return s + "]";
}

// Writes a temporary random pair (removed by the destructor) and points `flags` at it.
struct RandomPair {
  std::string dir;
  ~RandomPair() {
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  absl::Status Write(Flags& flags) {
    dir = (std::filesystem::temp_directory_path() /
           ("eagle3-demo-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count())))
              .string();
    EAGLE3_ASSIGN_OR_RETURN(auto config, eagle3::DeepseekV2Config::FromJson(kDemoTarget, "built-in demo target"));
    eagle3::RandomCheckpointOptions topt;
    topt.seed = flags.seed;
    flags.target = dir + "/target";
    flags.draft = dir + "/draft";
    EAGLE3_RETURN_IF_ERROR(eagle3::WriteRandomDeepseekV2Checkpoint(config, flags.target, topt));
    eagle3::RandomDraftCheckpointOptions dopt;
    dopt.seed = flags.seed + 1;
    dopt.num_key_value_heads = 8;
    EAGLE3_RETURN_IF_ERROR(eagle3::WriteRandomEagle3DraftCheckpoint(config, flags.draft, dopt));
    std::printf("built-in random pair (random weights: drafts are rarely accepted) in %s\n", dir.c_str());
    return absl::OkStatus();
  }
};

// The first `count` prompts of a JSON-lines file (a "text" field per line), tokenized and each cut to
// its first `max_tokens` tokens; a file of fewer prompts is cycled through (a large batch then holds
// repeats, which decode alike but still cost their share of every step).
absl::StatusOr<std::vector<std::vector<int64_t>>> ReadHeldoutPrompts(const std::string& path, int count,
                                                                     int max_tokens, int64_t max_bytes,
                                                                     const eagle3::Tokenizer& tokenizer) {
  EAGLE3_ASSIGN_OR_RETURN(
      const std::string contents,
      eagle3::examples::ReadInputFile("--batch " + std::to_string(count) + " without a prompt reads", path, max_bytes));
  std::istringstream in(contents);
  std::vector<std::vector<int64_t>> prompts;
  std::string line;
  for (int line_number = 1; static_cast<int>(prompts.size()) < count && std::getline(in, line); ++line_number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + " line " + std::to_string(line_number);
    const nlohmann::json entry = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (entry.is_discarded() || !entry.is_object() || !entry.contains("text") || !entry["text"].is_string()) {
      return absl::InvalidArgumentError(where + ": not a JSON object with a \"text\" string");
    }
    auto ids = tokenizer.Encode(entry["text"].get<std::string>());
    if (!ids.ok()) return absl::Status(ids.status().code(), where + ": " + std::string(ids.status().message()));
    if (ids->empty()) return absl::InvalidArgumentError(where + ": the text has no tokens to continue");
    if (static_cast<int64_t>(ids->size()) > max_tokens) ids->resize(static_cast<size_t>(max_tokens));
    prompts.push_back(*std::move(ids));
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(path + " holds no prompt; --batch " + std::to_string(count) +
                                      " needs at least one (or give a prompt to repeat: --prompt, --prompt-file "
                                      "or --tokens)");
  }
  const size_t distinct = prompts.size();
  while (static_cast<int>(prompts.size()) < count) {
    std::vector<int64_t> repeat = prompts[prompts.size() % distinct];
    prompts.push_back(std::move(repeat));
  }
  return prompts;
}

// The run report's settings: every flag, as parsed (defaults included), under its name without
// the dashes; target and draft as resolved from --models-dir or --random-pair, weights and
// kv_cache as the models ran (the defaults depend on the device).
JsonObject Settings(const Flags& flags, std::string_view weights, std::string_view kv_cache) {
  const bool prompt_flag = flags.prompt.has_value() && flags.prompt_file.empty();
  JsonObject s;
  s.String("models_dir", flags.models_dir)
      .String("target", flags.target)
      .String("draft", flags.draft)
      .Bool("mtp", flags.mtp)
      .Bool("random_pair", flags.random_pair)
      .Raw("prompt", prompt_flag ? eagle3::examples::JsonString(*flags.prompt) : "null")
      .PathOrNull("prompt_file", flags.prompt_file)
      .Raw("tokens", flags.tokens.has_value() ? JsonInts(*flags.tokens) : "null")
      .Int("batch", flags.batch)
      .Int("prompt_tokens", flags.prompt_tokens)
      .Int("max_new_tokens", flags.max_new_tokens)
      .Int("topk", flags.tree.topk)
      .Int("steps", flags.tree.num_steps)
      .Int("draft_tokens", flags.tree.num_draft_tokens)
      .Number("temperature", flags.sampling.temperature)
      .Number("top_p", flags.sampling.top_p)
      .Uint("seed", flags.seed)
      .Int("tp", flags.tp)
      .String("device", flags.device)
      .String("comm", flags.comm)
      .String("graphs", flags.graphs ? "on" : "off")
      .String("loop", flags.host_loop ? "host" : "device");
  if (flags.speculate_up_to < 0) {
    s.String("speculate_up_to", "all");
  } else {
    s.Int("speculate_up_to", flags.speculate_up_to);
  }
  const bool output = flags.convention == eagle3::LayerIdConvention::kOutputOfLayer;
  return s.Number("min_accept_len", flags.min_accept_len)
      .String("weights", weights)
      .String("kv_cache", kv_cache)
      .Raw("aux_layers", flags.aux_layers.has_value() ? JsonInts(*flags.aux_layers) : "null")
      .String("convention", output ? "output" : "input")
      .Int("max_input_bytes", flags.max_input_bytes)
      .Bool("allow_long_context", flags.allow_long_context)
      .String("json", flags.json);
}

absl::Status Run(Flags flags) {
  RandomPair random_pair;
  if (flags.random_pair) {
    EAGLE3_RETURN_IF_ERROR(random_pair.Write(flags));
  } else if (flags.target.empty()) {
    // A wrong models directory is reported first, in the flag's terms.
    EAGLE3_RETURN_IF_ERROR(eagle3::examples::CheckDir("--models-dir", flags.models_dir));
    flags.target = (std::filesystem::path(flags.models_dir) / kDefaultTarget).string();
    flags.draft = (std::filesystem::path(flags.models_dir) / kDefaultDraft).string();
    EAGLE3_RETURN_IF_ERROR(eagle3::examples::CheckModelDir("--models-dir " + flags.models_dir + ": the default target", flags.target));
    EAGLE3_RETURN_IF_ERROR(eagle3::examples::CheckModelDir("--models-dir " + flags.models_dir + ": the default draft", flags.draft));
  } else {
    EAGLE3_RETURN_IF_ERROR(eagle3::examples::CheckModelDir("--target", flags.target));
    if (!flags.mtp) EAGLE3_RETURN_IF_ERROR(eagle3::examples::CheckModelDir("--draft", flags.draft));
  }
  // What --json must never replace; checked before any work, so that a bad --json fails fast.
  std::vector<std::string> inputs = {flags.target, flags.models_dir};
  if (!flags.draft.empty()) inputs.push_back(flags.draft);
  if (!flags.prompt_file.empty()) inputs.push_back(flags.prompt_file);
  if (!flags.json.empty()) {
    const absl::Status writable = eagle3::CheckOutputPath(flags.json, inputs);
    if (!writable.ok()) return absl::Status(writable.code(), "--json: " + std::string(writable.message()));
  }
  EAGLE3_ASSIGN_OR_RETURN(const eagle3::DeepseekV2Config target_config,
                          eagle3::DeepseekV2Config::FromFile(flags.target));

  // The tokenizer: required for a text prompt; otherwise used when the target has one (to show text).
  const std::filesystem::path tokenizer_file = std::filesystem::path(flags.target) / "tokenizer.json";
  std::optional<eagle3::Tokenizer> tokenizer;
  std::error_code ec;
  if (flags.prompt.has_value() || std::filesystem::exists(tokenizer_file, ec)) {
    auto loaded = eagle3::Tokenizer::FromFile(tokenizer_file);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          std::string(flags.prompt.has_value() ? "the text prompt needs the target's tokenizer: "
                                                               : "cannot load the target's tokenizer: ") +
                              std::string(loaded.status().message()));
    }
    tokenizer.emplace(*std::move(loaded));
    // A tokenizer may hold fewer ids than the model's vocab_size: the vocab is padded (DeepSeek's
    // tokenizers have 100015 ids for a vocab_size of 102400), so refusing the pair would refuse real
    // models. Say so here; a sequence holding an id beyond the tokenizer is then shown as ids
    // (text_of), never failing after the decode ran.
    if (tokenizer->vocab_size() < target_config.vocab_size) {
      std::fprintf(stderr,
                   "eagle3-decode: note: %s has %lld ids, fewer than vocab_size %lld of %s/config.json; a "
                   "sequence holding an id in [%lld, %lld) is shown as ids\n",
                   tokenizer_file.c_str(), static_cast<long long>(tokenizer->vocab_size()),
                   static_cast<long long>(target_config.vocab_size), flags.target.c_str(),
                   static_cast<long long>(tokenizer->vocab_size()), static_cast<long long>(target_config.vocab_size));
    }
  }
  // The batch: held-out prompts when a batch has no prompt to repeat and the target can read text.
  std::vector<std::vector<int64_t>> prompts;
  std::optional<std::string> prompt_text;  // prompt 0's, when given as text
  std::string batch_source;
  if (flags.batch > 1 && !flags.tokens.has_value() && !flags.prompt.has_value() && tokenizer.has_value()) {
    const std::string heldout = (std::filesystem::path(flags.models_dir) / kHeldoutPrompts).string();
    EAGLE3_ASSIGN_OR_RETURN(prompts, ReadHeldoutPrompts(heldout, flags.batch, flags.prompt_tokens, flags.max_input_bytes,
                                                        *tokenizer));
    batch_source = "the first " + std::to_string(flags.batch) + " prompts (cycled) of " + heldout + ", at most " +
                   std::to_string(flags.prompt_tokens) + " tokens each";
  } else {
    std::vector<int64_t> prompt;
    if (flags.tokens.has_value()) {
      prompt = *flags.tokens;
    } else if (tokenizer.has_value()) {
      prompt_text = flags.prompt.value_or(kDefaultPrompt);
      auto encoded = tokenizer->Encode(*prompt_text);
      if (!encoded.ok()) {
        return absl::Status(encoded.status().code(),
                            (flags.prompt_file.empty() ? std::string("--prompt") : "--prompt-file " + flags.prompt_file) +
                                ": " + std::string(encoded.status().message()));
      }
      prompt = *std::move(encoded);
    } else {
      prompt = kDefaultIds;
    }
    if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty: it has no tokens to continue");
    prompts.assign(static_cast<size_t>(flags.batch), prompt);
    batch_source = "the same prompt " + std::to_string(flags.batch) + " times";
  }
  const std::vector<int64_t>& prompt = prompts[0];
  // Positions beyond max_position_embeddings are outside what the target was trained for (vLLM
  // refuses them): refused unless asked for, naming where the prompt came from.
  {
    size_t longest = 0;
    for (size_t i = 1; i < prompts.size(); ++i) longest = prompts[i].size() > prompts[longest].size() ? i : longest;
    const int64_t length = static_cast<int64_t>(prompts[longest].size());
    if (length + flags.max_new_tokens > target_config.max_position_embeddings && !flags.allow_long_context) {
      const std::string source = flags.tokens.has_value()     ? "--tokens"
                                 : !flags.prompt_file.empty() ? "--prompt-file " + flags.prompt_file
                                 : flags.prompt.has_value()   ? "--prompt"
                                 : prompt_text.has_value()    ? "the default prompt"
                                 : tokenizer.has_value()      ? batch_source
                                                              : "the default ids";
      return absl::InvalidArgumentError(
          "prompt " + std::to_string(longest) + " (" + source + ") has " + std::to_string(length) +
          " tokens; with --max-new-tokens " + std::to_string(flags.max_new_tokens) + " that is " +
          std::to_string(length + flags.max_new_tokens) + " positions, more than max_position_embeddings " +
          std::to_string(target_config.max_position_embeddings) + " of " + flags.target +
          "/config.json (shorten the prompt, lower --max-new-tokens, or pass --allow-long-context)");
    }
  }
  // Text of ids, when the target has a tokenizer; ids it lacks (a padded vocab) are shown as ids.
  auto text_of = [&](const std::vector<int64_t>& ids, const char* what) -> absl::StatusOr<std::optional<std::string>> {
    if (!tokenizer.has_value()) return std::optional<std::string>();
    for (const int64_t id : ids) {
      if (id >= tokenizer->vocab_size()) {
        std::fprintf(stderr, "eagle3-decode: %s holds id %lld, which %s (%lld ids) cannot decode; showing ids\n",
                     what, static_cast<long long>(id), tokenizer_file.c_str(),
                     static_cast<long long>(tokenizer->vocab_size()));
        return std::optional<std::string>();
      }
    }
    EAGLE3_ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(ids));
    return std::optional<std::string>(std::move(text));
  };

  std::printf("device %s, target %s, draft %s, tp %d, %s, tree topk %d steps %d draft tokens %d\n", flags.device.c_str(), flags.target.c_str(),
              flags.mtp ? "(the target's MTP module)" : flags.draft.c_str(), flags.tp,
              flags.sampling.temperature == 0 ? "greedy" : ("temperature " + std::to_string(flags.sampling.temperature)).c_str(),
              flags.tree.topk, flags.tree.num_steps, flags.tree.num_draft_tokens);
  if (!prompt_text.has_value()) {
    EAGLE3_ASSIGN_OR_RETURN(prompt_text, text_of(prompt, "the prompt"));
  }
  const bool batched = flags.batch > 1;
  if (batched) std::printf("batch of %d sequences: %s\n", flags.batch, batch_source.c_str());
  std::printf("%s (%zu tokens)%s\n", batched ? "prompt 0" : "prompt", prompt.size(),
              prompt_text.has_value() ? (":\n" + *prompt_text).c_str()
                                      : (" " + JsonInts(prompt)).c_str());
  EAGLE3_ASSIGN_OR_RETURN(RunResult plain, Decode(flags, prompts, /*speculative=*/false));
  EAGLE3_ASSIGN_OR_RETURN(RunResult spec, Decode(flags, prompts, /*speculative=*/true));
  // With a batch, only prompt 0's continuations are shown in full.
  EAGLE3_ASSIGN_OR_RETURN(const std::optional<std::string> plain_text, text_of(plain.tokens[0], "the plain continuation"));
  EAGLE3_ASSIGN_OR_RETURN(const std::optional<std::string> spec_text, text_of(spec.tokens[0], "the speculative continuation"));
  for (const auto& [name, run, text] :
       {std::tuple<const char*, const RunResult*, const std::optional<std::string>*>{"plain", &plain, &plain_text},
        {"speculative", &spec, &spec_text}}) {
    if (text->has_value()) {
      std::printf("\n--- %s continuation%s ---\n%s\n--- end ---\n", name, batched ? " of prompt 0" : "",
                  (*text)->c_str());
    } else {
      std::printf("%-12s %s\n", name, JsonInts(run->tokens[0]).c_str());
    }
  }
  const bool greedy = flags.sampling.temperature == 0;
  int differing = 0;
  for (int i = 0; i < flags.batch; ++i) {
    const bool agree = plain.tokens[i] == spec.tokens[i];
    differing += agree ? 0 : 1;
    if (batched) {
      std::printf("prompt %d: %zu prompt tokens, %zu plain / %zu speculative tokens generated%s\n", i,
                  prompts[i].size(), plain.tokens[i].size(), spec.tokens[i].size(),
                  greedy ? (agree ? ", greedy outputs identical" : ", greedy outputs DIFFER") : "");
    }
  }
  if (greedy && !batched) std::printf("greedy outputs %s\n", differing == 0 ? "identical" : "DIFFER");
  if (greedy && batched) {
    if (differing == 0) {
      std::printf("greedy outputs identical for all %d prompts\n", flags.batch);
    } else {
      std::printf("greedy outputs DIFFER for %d of %d prompts\n", differing, flags.batch);
    }
  }
  const eagle3::DecodeStats& s = spec.stats;
  std::printf("\n%s loop, timed run after one warm-up run%s\n", flags.host_loop ? "host reference" : "device step",
              batched ? (", tokens and tokens/s over all " + std::to_string(flags.batch) + " sequences").c_str() : "");
  std::printf("%-12s %8s %10s %12s %10s %12s %12s\n", "run", "tokens", "tokens/s", "target pass", "total s",
              "syncs/step", "D2H B/step");
  auto per_step = [](int64_t total, int64_t steps) { return steps > 0 ? static_cast<double>(total) / steps : 0.0; };
  for (const auto& [name, st] : {std::pair<const char*, const eagle3::DecodeStats*>{"plain", &plain.stats},
                                 {"speculative", &spec.stats}}) {
    std::printf("%-12s %8lld %10.1f %12lld %10.3f %12.1f %12.1f\n", name, static_cast<long long>(st->generated_tokens),
                st->tokens_per_second(), static_cast<long long>(st->target_passes), st->total_seconds,
                per_step(st->host_syncs, st->device_steps), per_step(st->device_to_host_bytes, st->device_steps));
  }
  // A line of its own: tools/train_tiny/measure.py reads the table above by its columns.
  std::printf("seconds of prefill / decode: plain %.3f / %.3f, speculative %.3f / %.3f\n",
              plain.stats.prefill_seconds, plain.stats.total_seconds - plain.stats.prefill_seconds,
              s.prefill_seconds, s.total_seconds - s.prefill_seconds);
  const double speedup =
      plain.stats.tokens_per_second() > 0 ? s.tokens_per_second() / plain.stats.tokens_per_second() : 0;
  std::printf("mean accepted length %.3f tokens per target pass; acceptance by depth %s\n", s.mean_accepted_length,
              JoinDoubles(s.acceptance_by_depth).c_str());
  std::printf("accepted drafted tokens per pass (histogram): %s\n",
              JsonInts(s.accepted_histogram).c_str());
  const std::string kv_cache(eagle3::DTypeName(flags.kv_cache.value_or(eagle3::DType::kF32)));
  std::printf("speedup %.2fx (speculative %.1f tokens/s over plain %.1f tokens/s on %s, %s weights, %s KV cache)\n",
              speedup, s.tokens_per_second(), plain.stats.tokens_per_second(), flags.device.c_str(),
              spec.weights.c_str(), kv_cache.c_str());
  if (flags.tp > 1) std::printf("collectives of tp %d: %s\n", flags.tp, spec.comm.c_str());
  for (const auto& [name, run] : {std::pair<const char*, const RunResult*>{"plain", &plain}, {"speculative", &spec}}) {
    if (!run->launcher.empty()) std::printf("%s: %s\n", name, run->launcher.c_str());
  }

  if (flags.json.empty()) return absl::OkStatus();
  auto with_text = [](JsonObject object, const std::optional<std::string>& text) {
    return text.has_value() ? object.String("text", *text) : object;
  };
  auto run_json = [&](const RunResult& run, const std::optional<std::string>& text) {
    const eagle3::DecodeStats& st = run.stats;
    return with_text(JsonObject().Raw("tokens", JsonInts(run.tokens[0])), text)
        .Number("tokens_per_s", st.tokens_per_second())
        .Number("host_syncs_per_step", per_step(st.host_syncs, st.device_steps))
        .Number("device_to_host_bytes_per_step",
                per_step(st.device_to_host_bytes, st.device_steps));
  };
  // Load: model creation, and within it the target's weights (TargetModel::load_stats: the whole,
  // its checks, host reads and device copies); generate: the timed Generate, prefill + decode;
  // with --loop host, also target, draft and verify within it (the device step runs them as one
  // unit, untimed apart).
  auto run_seconds = [](const RunResult& run) {
    const eagle3::DecodeStats& st = run.stats;
    const eagle3::WeightLoadStats& w = run.target_weights;
    return JsonObject()
        .Number("load", run.load_seconds)
        .Number("target_weights", w.total_seconds)
        .Number("target_weights_check", w.check_seconds)
        .Number("target_weights_read", w.read_seconds)
        .Number("target_weights_device", w.device_seconds)
        .Number("generate", st.total_seconds)
        .Number("prefill", st.prefill_seconds)
        .Number("decode", st.total_seconds - st.prefill_seconds);
  };
  eagle3::examples::RunReport report;
  report.tool = "eagle3-decode";
  report.settings = Settings(flags, spec.weights, kv_cache);
  report.device = spec.device;
  report.seed = flags.seed;
  JsonObject spec_seconds = run_seconds(spec);
  if (flags.host_loop) {
    spec_seconds.Number("target", s.target_seconds)
        .Number("draft", s.draft_seconds)
        .Number("verify", s.verify_seconds);
  }
  report.seconds.Raw("plain", run_seconds(plain).str()).Raw("speculative", spec_seconds.str());
  JsonObject more;
  more.String("target", flags.target)
      .String("draft", flags.draft)
      .Bool("mtp", flags.mtp)
      .String("weights", spec.weights)
      .String("kv_cache", kv_cache)
      .Int("tp", flags.tp)
      .String("comm", spec.comm)
      .Int("batch", flags.batch)
      .Raw("prompt", with_text(JsonObject().Raw("tokens", JsonInts(prompt)), prompt_text).str())
      .Raw("plain", run_json(plain, plain_text).str())
      .Raw("speculative", run_json(spec, spec_text)
                              .Number("mean_accepted_length", s.mean_accepted_length)
                              .Raw("acceptance_by_depth", JoinDoubles(s.acceptance_by_depth))
                              .Raw("accepted_histogram", JsonInts(s.accepted_histogram))
                              .Int("undrafted_steps", s.undrafted_steps)
                              .Int("acceptance_pauses", s.acceptance_pauses)
                              .Int("device_steps", s.device_steps)
                              .str())
      .String("loop", flags.host_loop ? "host" : "device")
      .Number("speedup", speedup);
  if (greedy) more.Bool("greedy_outputs_agree", differing == 0);
  if (batched) {
    std::string list = "[";
    for (int i = 0; i < flags.batch; ++i) {
      list += (i ? ", " : "") + JsonObject()
                                    .Int("prompt_tokens", static_cast<int64_t>(prompts[i].size()))
                                    .Raw("plain", JsonInts(plain.tokens[i]))
                                    .Raw("speculative", JsonInts(spec.tokens[i]))
                                    .str();
    }
    more.Raw("prompts", list + "]");
  }
  return eagle3::examples::WriteJsonFile("--json", flags.json, report.Json(more), inputs);
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "eagle3-decode: %s\n%s", std::string(flags.status().message()).c_str(), Usage().c_str());
    return 2;
  }
  absl::Status status;
  try {
    status = Run(*flags);
  } catch (const std::bad_alloc&) {
    // Sizes are checked before allocating; this is memory taken by others meanwhile.
    status = absl::ResourceExhaustedError("out of host memory");
  }
  if (!status.ok()) {
    std::fprintf(stderr, "eagle3-decode: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
