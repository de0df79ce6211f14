// eagle3-inspect — answers an engine developer's questions about a model pair before serving.
//
//   eagle3-inspect target --model DIR --tokens 5,17,99 [--tp N] [--device cpu|cuda]
//                         [--residual replicated|sharded]
//                         [--attention auto|absorbed|non-absorbed] --out FILE [--json FILE]
//   eagle3-inspect draft --target DIR --draft DIR|--mtp --tokens ... [--topk K] [--steps S]
//                        [--draft-tokens N] [--convention output|input] --out FILE [--json FILE]
//   eagle3-inspect check --target DIR --draft DIR [--convention output|input] [--json FILE]
//   eagle3-inspect check --target DIR --mtp [--json FILE]
//   eagle3-inspect accuracy --target DIR --draft DIR|--mtp --text-file F|--tokens ... [--tokens-max N] [--depth K]
//                           [--device cpu|cuda] [--aux-layers a,b,c] [--convention output|input]
//                           [--json FILE] [--out FILE]
//
// Every subcommand's --json FILE writes the run report (run_report.h: tool, command, version,
// settings, device, seed, seconds per phase) and what the subcommand found or wrote.
//
// `target` runs the target on the tokens (one causal forward, CPU reference backend, N ranks on
// threads) and writes a safetensors file with `tokens` (i64 [T]), `logits` (f32 [T, V]) and
// `boundary.<b>` (f32 [T, H]) for every boundary b in 0..L (b = 0 the embedding output, b = L the
// last layer's output before the final norm) — what a user compares with a training-time dump.
//
// `draft` runs the target on the tokens, then the draft on the aux states of every position (row p:
// target hidden at p, token p + 1; the last row's token is the target's argmax after the last
// token, the tree root), and writes `draft_logits` (f32 [T, draft_vocab], the first draft step of
// every position) and the EAGLE-2 tree drafted after the last position: `tree_tokens` (target ids,
// root first), `tree_parents`, `tree_positions`, `tree_mask` (u8 [N, N]). The draft is a
// Llama-style or an MLA EAGLE-3 head (by its architectures), or with --mtp the target's own MTP
// module, fed the target's final hidden after model.norm (its logits then cover the full
// vocabulary).
//
// `check` validates a pair before serving and exits non-zero listing every problem: the target and
// an EAGLE-3 draft (Llama-style or MLA, told apart by the draft's architectures), or with --mtp the
// target and its own MTP module(s).
//
// `accuracy` is the standalone wiring check (docs/semantics.md): the draft's top-1 agreement with the
// target's greedy token from the target's own hidden states, with no tree and no verifier. The text
// x_0 .. x_{T-1} (the file tokenized with the target's tokenizer.json, at most --tokens-max tokens)
// runs through the target once (causal prefill, logits of every position, aux states of the draft's
// taps); y_t = argmax of the target's logits at t (its greedy token for position t + 1). Then for
// every start p the draft is teacher-forced on the TRUE tokens, as when decoding a chain whose
// tokens keep being accepted:
//   depth 1: draft row (aux_p, x_{p+1}) at RoPE position p over the cache of rows 0..p (every row
//            from the target's aux states) -> top-1 draft id, mapped through d2t, vs y_{p+1};
//   depth d: row (hidden fed back by depth d-1 of start p, x_{p+d}) at position p+d-1, attending
//            rows 0..p and the chain's own depth 1..d-1 rows -> top-1 vs y_{p+d}.
// Depth d is counted over p = 0 .. T-1-d. --aux-layers replaces the draft config's aux layer ids
// (in --convention) to measure what a mis-wired tap costs. The drafter is a Llama-style or an MLA
// EAGLE-3 head (by the draft's architectures), or with --mtp the target's own MTP module, whose
// "aux state" is the target's final hidden after model.norm (its top-1 covers the full vocabulary).
// --tokens gives the ids directly instead of --text-file (a target without a tokenizer.json).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eagle3/detail/host_budget.h"
#include "eagle3/draft_model.h"
#include "eagle3/draft_tree.h"
#include "eagle3/eagle3_drafter.h"
#include "eagle3/hidden_state_tap.h"
#include "eagle3/pair_check.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/testing/rank_threads.h"
#include "eagle3/tools/tokenizer.h"
#include "flag_parse.h"
#include "parse_ids.h"
#include "rank_context.h"
#include "run_report.h"

namespace {

// Per subcommand: its usage line and every flag with its default ("--help" prints it).
constexpr char kTargetUsage[] =
    "usage: eagle3-inspect target --model DIR --tokens 5,17,99,... --out FILE [flags]\n"
    "  --model DIR           the target checkpoint directory (required)\n"
    "  --tokens a,b,...      token ids to run (required)\n"
    "  --out FILE            the safetensors dump to write (required)\n"
    "  --json FILE           also write the run report and each tensor's name and shape as JSON\n"
    "                        (default: none)\n"
    "  --tp N                tensor-parallel ranks on threads (default 1)\n"
    "  --device cpu|cuda     backend (default cpu)\n"
    "  --residual replicated|sharded   residual stream layout (default replicated)\n"
    "  --attention auto|absorbed|non-absorbed   MLA path (default auto)\n"
    "  --weights bf16|f32    weight storage (default: the device's preference, bf16 on cuda, f32 on cpu)\n"
    "  --allow-long-context  run more tokens than max_position_embeddings (default: refused)\n";
constexpr char kDraftUsage[] =
    "usage: eagle3-inspect draft --target DIR --draft DIR|--mtp --tokens 5,17,99,... --out FILE [flags]\n"
    "  --target DIR          the target checkpoint directory (required)\n"
    "  --draft DIR           the EAGLE-3 draft checkpoint directory (Llama-style or MLA head)\n"
    "  --mtp                 instead of --draft: the target's own MTP module as the drafter\n"
    "  --tokens a,b,...      token ids to run (required)\n"
    "  --out FILE            the safetensors dump to write (required)\n"
    "  --json FILE           also write the run report and each tensor's name and shape as JSON\n"
    "                        (default: none)\n"
    "  --topk K              tree children per node (default 4)\n"
    "  --steps S             draft passes = tree depth (default 3)\n"
    "  --draft-tokens N      tree nodes including the root (default 8)\n"
    "  --convention output|input   aux layer id convention (default output)\n"
    "  --device cpu|cuda     backend both models run on (default cpu)\n"
    "  --weights bf16|f32    weight storage (default: the device's preference, bf16 on cuda, f32 on cpu)\n"
    "  --allow-long-context  run more tokens than max_position_embeddings (default: refused)\n";
constexpr char kCheckUsage[] =
    "usage: eagle3-inspect check --target DIR --draft DIR|--mtp [flags]\n"
    "  --target DIR          the target checkpoint directory (required)\n"
    "  --draft DIR           the EAGLE-3 draft checkpoint directory (Llama-style or MLA head)\n"
    "  --mtp                 instead of --draft: the target's own MTP module(s) as the drafter\n"
    "  --convention output|input   aux layer id convention (default output)\n"
    "  --json FILE           also write the run report and the pair report as JSON\n"
    "                        (default: none)\n";
constexpr char kAccuracyUsage[] =
    "usage: eagle3-inspect accuracy --target DIR --draft DIR|--mtp --text-file F|--tokens ... [flags]\n"
    "  --target DIR          the target checkpoint directory (required)\n"
    "  --draft DIR           the EAGLE-3 draft checkpoint directory (Llama-style or MLA head)\n"
    "  --mtp                 instead of --draft: the target's own MTP module as the drafter\n"
    "  --text-file F         text tokenized with the target's tokenizer.json\n"
    "  --tokens 5,17,99,...  instead of --text-file: the token ids themselves (no tokenizer needed)\n"
    "  --tokens-max N        the most tokens of the text used; more are cut (default 512)\n"
    "  --depth K             teacher-forced depths measured (default 5)\n"
    "  --device cpu|cuda     backend (default cpu)\n"
    "  --aux-layers a,b,c    replace the draft config's aux layer ids (default: the config's)\n"
    "  --convention output|input   aux layer id convention (default output)\n"
    "  --weights bf16|f32    weight storage (default: the device's preference, bf16 on cuda, f32 on cpu)\n"
    "  --max-input-bytes N   the most read from --text-file (default 1048576)\n"
    "  --allow-long-context  run more tokens than max_position_embeddings (default: refused)\n"
    "  --json FILE           also write the run report and the accuracy by depth as JSON\n"
    "                        (default: none)\n"
    "  --out FILE            the same JSON as --json, to this file (default: none)\n";

constexpr char kUsage[] =
    "usage: eagle3-inspect target|draft|check|accuracy [flags]   (eagle3-inspect SUBCOMMAND --help lists its flags)\n"
    "       eagle3-inspect target --model DIR --tokens 5,17,99,... [--tp N] [--device cpu|cuda]\n"
    "                             [--residual replicated|sharded]\n"
    "                             [--attention auto|absorbed|non-absorbed] --out FILE\n"
    "                             [--json FILE]\n"
    "       eagle3-inspect draft --target DIR --draft DIR|--mtp --tokens ... [--topk K] [--steps S]\n"
    "                            [--draft-tokens N] [--convention output|input] [--device cpu|cuda]\n"
    "                            --out FILE [--json FILE]\n"
    "       eagle3-inspect check --target DIR --draft DIR [--convention output|input] [--json FILE]\n"
    "       eagle3-inspect check --target DIR --mtp [--json FILE]\n"
    "       eagle3-inspect accuracy --target DIR --draft DIR|--mtp --text-file F|--tokens ... [--tokens-max N]\n"
    "                               [--depth K] [--device cpu|cuda] [--aux-layers a,b,c]\n"
    "                               [--convention output|input] [--json FILE] [--out FILE]\n"
    "  target, draft, accuracy: [--weights bf16|f32] (default: the device's preference, bf16 on\n"
    "    cuda, f32 on cpu; every model runs on --device)\n"
    "  target, draft, accuracy: [--allow-long-context] runs more tokens than the target's\n"
    "    max_position_embeddings (refused by default)\n"
    "  accuracy: [--max-input-bytes N] the most read from --text-file (default 1048576); a larger\n"
    "    file, or a pipe or device yielding more, is refused\n"
    "  --json FILE (every subcommand; default: none): the run report (tool, command, version,\n"
    "    settings, device, seed, seconds per phase) and the subcommand's result as JSON; target\n"
    "    and draft write their tensors to --out, accuracy the same JSON to --out FILE too\n"
    "  --out FILE, --json FILE: refused before any work when FILE is not a regular file, is\n"
    "    read-only, is one of the inputs, or both name the same file\n"
    "  integers are whole decimal numbers (\"2x\", \"1e3\" are refused)\n"
    "  accuracy: the draft's top-1 (through d2t) against the target's greedy token, teacher-forced\n"
    "    from the target's own hidden states on the text's true tokens. With the text x and the\n"
    "    target's greedy y_t = argmax logits(x_0..x_t): depth 1 at start p feeds (aux_p, x_{p+1})\n"
    "    and compares with y_{p+1}; depth d feeds depth d-1's hidden with x_{p+d} and compares with\n"
    "    y_{p+d} (p = 0..T-1-d). --aux-layers replaces the draft config's aux layer ids (in\n"
    "    --convention; output: id k = boundary k+1, input: id k = boundary k, 0 = embedding).\n";

struct Flags {
  std::string command;
  std::string model, out, draft;
  std::string json;  // --json FILE: the run report (run_report.h)
  eagle3::LayerIdConvention convention = eagle3::LayerIdConvention::kOutputOfLayer;
  eagle3::DraftTreeParams tree;
  std::string device = "cpu";
  std::vector<int64_t> tokens;
  std::string text_file;
  int tokens_max = 512;
  int depth = 5;
  std::optional<std::vector<int>> aux_layers;
  int tp = 1;
  eagle3::ResidualMode residual = eagle3::ResidualMode::kReplicated;
  eagle3::AttentionPath attention = eagle3::AttentionPath::kAuto;
  std::optional<eagle3::DType> weights;  // --weights; unset: the backend's preference
  int64_t max_input_bytes = eagle3::examples::kDefaultMaxInputBytes;  // --max-input-bytes (--text-file)
  // --allow-long-context: run more tokens than the target's max_position_embeddings.
  bool allow_long_context = false;
  bool mtp = false;  // --mtp (check, draft, accuracy): the target's own MTP module(s) instead of --draft

  // The files --out must never replace (directories stand for the files in them).
  std::vector<std::string> Inputs() const {
    std::vector<std::string> inputs = {model};
    if (!draft.empty()) inputs.push_back(draft);
    if (!text_file.empty()) inputs.push_back(text_file);
    return inputs;
  }
  // What --json must never replace: the inputs and the --out file (written first).
  std::vector<std::string> JsonInputs() const {
    std::vector<std::string> inputs = Inputs();
    if (!out.empty()) inputs.push_back(out);
    return inputs;
  }
};

using eagle3::examples::Clock;
using eagle3::examples::JsonInts;
using eagle3::examples::JsonObject;
using eagle3::examples::ParseInt;
using eagle3::examples::PhaseSeconds;
using eagle3::examples::RunReport;
using eagle3::examples::SecondsSince;
using eagle3::examples::WeightsName;
using eagle3::examples::WriteJsonFile;

const char* SubcommandUsage(std::string_view command) {
  return command == "target"     ? kTargetUsage
         : command == "draft"    ? kDraftUsage
         : command == "check"    ? kCheckUsage
         : command == "accuracy" ? kAccuracyUsage
                                 : kUsage;
}

// --help / -h anywhere answers before any other check: the subcommand's usage, or the program's.
void HelpIfAsked(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", SubcommandUsage(i > 1 ? std::string_view(argv[1]) : std::string_view()));
      std::exit(0);
    }
  }
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  HelpIfAsked(argc, argv);
  const std::string_view command = argc < 2 ? "" : argv[1];
  if (command != "target" && command != "draft" && command != "check" && command != "accuracy") {
    return absl::InvalidArgumentError(argc < 2 ? "missing subcommand" : "unknown subcommand '" + std::string(command) + "'");
  }
  Flags flags;
  flags.command = std::string(command);
  for (int i = 2; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--allow-long-context") {
      flags.allow_long_context = true;
      continue;
    }
    if (flag == "--mtp") {
      flags.mtp = true;
      continue;
    }
    if (i + 1 >= argc) return absl::InvalidArgumentError("flag " + std::string(flag) + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--device") {
      flags.device = value;
    } else if (flag == "--weights") {
      EAGLE3_ASSIGN_OR_RETURN(flags.weights, eagle3::examples::ParseStorageDType(flag, value));
    } else if (flag == "--model" || flag == "--target") {
      flags.model = value;
    } else if (flag == "--draft") {
      flags.draft = value;
    } else if (flag == "--topk") {
      EAGLE3_ASSIGN_OR_RETURN(flags.tree.topk, ParseInt(flag, value, 1, 1 << 16));
    } else if (flag == "--steps") {
      EAGLE3_ASSIGN_OR_RETURN(flags.tree.num_steps, ParseInt(flag, value, 1, 64));
    } else if (flag == "--draft-tokens") {
      EAGLE3_ASSIGN_OR_RETURN(flags.tree.num_draft_tokens, ParseInt(flag, value, 2, 1 << 16));
    } else if (flag == "--convention") {
      if (value == "output") {
        flags.convention = eagle3::LayerIdConvention::kOutputOfLayer;
      } else if (value == "input") {
        flags.convention = eagle3::LayerIdConvention::kInputOfLayer;
      } else {
        return absl::InvalidArgumentError("--convention must be output (SGLang/SpecForge) or input (vLLM), got " + value);
      }
    } else if (flag == "--text-file") {
      flags.text_file = value;
    } else if (flag == "--tokens-max") {
      EAGLE3_ASSIGN_OR_RETURN(flags.tokens_max, ParseInt(flag, value, 2, 1 << 20));
    } else if (flag == "--depth") {
      EAGLE3_ASSIGN_OR_RETURN(flags.depth, ParseInt(flag, value, 1, 64));
    } else if (flag == "--aux-layers") {
      EAGLE3_ASSIGN_OR_RETURN(flags.aux_layers, eagle3::examples::ParseLayerIds(flag, value));
    } else if (flag == "--max-input-bytes") {
      EAGLE3_ASSIGN_OR_RETURN(flags.max_input_bytes,
                              eagle3::examples::ParseInt64(flag, value, 1, eagle3::examples::kMaxInputBytesLimit));
    } else if (flag == "--out") {
      flags.out = value;
    } else if (flag == "--json") {
      flags.json = value;
    } else if (flag == "--tokens") {
      EAGLE3_ASSIGN_OR_RETURN(flags.tokens, eagle3::examples::ParseTokenIds(flag, value));
    } else if (flag == "--tp") {
      EAGLE3_ASSIGN_OR_RETURN(flags.tp, ParseInt(flag, value, 1, 64));
    } else if (flag == "--residual") {
      if (value == "replicated") {
        flags.residual = eagle3::ResidualMode::kReplicated;
      } else if (value == "sharded") {
        flags.residual = eagle3::ResidualMode::kTokenSharded;
      } else {
        return absl::InvalidArgumentError("--residual must be replicated or sharded, got " + value);
      }
    } else if (flag == "--attention") {
      if (value == "auto") {
        flags.attention = eagle3::AttentionPath::kAuto;
      } else if (value == "absorbed") {
        flags.attention = eagle3::AttentionPath::kAbsorbed;
      } else if (value == "non-absorbed") {
        flags.attention = eagle3::AttentionPath::kNonAbsorbed;
      } else {
        return absl::InvalidArgumentError("--attention must be auto, absorbed or non-absorbed, got " + value);
      }
    } else {
      return absl::InvalidArgumentError("unknown flag " + std::string(flag));
    }
  }
  EAGLE3_RETURN_IF_ERROR(eagle3::examples::CheckWeightsOnDevice(flags.weights, flags.device));
  if (flags.aux_layers.has_value() && flags.command != "accuracy") {
    return absl::InvalidArgumentError("--aux-layers applies to the accuracy subcommand only");
  }
  if (flags.mtp && flags.command == "target") {
    return absl::InvalidArgumentError("--mtp applies to the check, draft and accuracy subcommands only");
  }
  if (flags.mtp && flags.aux_layers.has_value()) {
    return absl::InvalidArgumentError(
        "--aux-layers and --mtp: the MTP module reads the target's final hidden after model.norm, not layer taps");
  }
  if (flags.mtp && !flags.draft.empty()) {
    return absl::InvalidArgumentError("--draft and --mtp name two drafters; give one");
  }
  if (flags.command == "check") {
    if (flags.mtp && !flags.draft.empty()) {
      return absl::InvalidArgumentError("--draft and --mtp name two drafters; give one");
    }
    if (flags.model.empty() || (flags.draft.empty() && !flags.mtp)) {
      return absl::InvalidArgumentError("--target and --draft (or --mtp) are required");
    }
  } else if (flags.command == "accuracy") {
    if (flags.model.empty() || (flags.draft.empty() && !flags.mtp) ||
        flags.text_file.empty() == flags.tokens.empty()) {
      return absl::InvalidArgumentError(
          "--target, --draft (or --mtp) and one of --text-file and --tokens are required");
    }
  } else if (flags.model.empty() || flags.out.empty() || flags.tokens.empty() ||
             (flags.command == "draft" && flags.draft.empty() && !flags.mtp)) {
    return absl::InvalidArgumentError(flags.command == "target"
                                          ? "--model, --tokens and --out are required"
                                          : "--target, --draft (or --mtp), --tokens and --out are required");
  }
  return flags;
}

// `status` with `flag` in front of its message (OK unchanged).
absl::Status WithFlag(std::string_view flag, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), std::string(flag) + ": " + std::string(status.message()));
}

// Positions beyond max_position_embeddings are outside what the target was trained for (vLLM refuses
// them): refused unless --allow-long-context, naming where the tokens came from.
absl::Status CheckPositions(const Flags& flags, const eagle3::DeepseekV2Config& config, int64_t t,
                            const std::string& source) {
  if (t <= config.max_position_embeddings || flags.allow_long_context) return absl::OkStatus();
  return absl::InvalidArgumentError(source + " gives " + std::to_string(t) + " tokens, more than max_position_embeddings " +
                                    std::to_string(config.max_position_embeddings) + " of " + flags.model +
                                    "/config.json (pass --allow-long-context to run them anyway)");
}

std::string_view ConventionName(eagle3::LayerIdConvention convention) {
  return convention == eagle3::LayerIdConvention::kOutputOfLayer ? "output" : "input";
}

// The run report's settings: every flag `flags.command` takes, as parsed (defaults included),
// under its name without the dashes; `weights` is the storage the models ran with (the default
// is the device's).
JsonObject Settings(const Flags& flags, std::string_view weights) {
  const std::string& command = flags.command;
  JsonObject s;
  if (command == "target") {
    const bool replicated = flags.residual == eagle3::ResidualMode::kReplicated;
    const eagle3::AttentionPath path = flags.attention;
    s.String("model", flags.model)
        .Raw("tokens", JsonInts(flags.tokens))
        .Int("tp", flags.tp)
        .String("residual", replicated ? "replicated" : "sharded")
        .String("attention", path == eagle3::AttentionPath::kAuto       ? "auto"
                             : path == eagle3::AttentionPath::kAbsorbed ? "absorbed"
                                                                        : "non-absorbed");
  } else {
    s.String("target", flags.model);
    // --mtp has no draft directory; the key appears only with the flag.
    if (flags.mtp) {
      s.Bool("mtp", true);
    } else {
      s.String("draft", flags.draft);
    }
  }
  if (command == "draft") {
    s.Raw("tokens", JsonInts(flags.tokens))
        .Int("topk", flags.tree.topk)
        .Int("steps", flags.tree.num_steps)
        .Int("draft_tokens", flags.tree.num_draft_tokens);
  }
  if (command == "accuracy") {
    s.String("text_file", flags.text_file);
    if (!flags.tokens.empty()) s.Raw("tokens", JsonInts(flags.tokens));
    s.Int("tokens_max", flags.tokens_max)
        .Int("depth", flags.depth)
        .Raw("aux_layers", flags.aux_layers.has_value() ? JsonInts(*flags.aux_layers) : "null")
        .Int("max_input_bytes", flags.max_input_bytes);
  }
  if (command != "target" && !flags.mtp) s.String("convention", ConventionName(flags.convention));
  if (command != "check") {
    s.String("device", flags.device)
        .String("weights", weights)
        .Bool("allow_long_context", flags.allow_long_context)
        .PathOrNull("out", flags.out);
  }
  return s.PathOrNull("json", flags.json);
}

// The run report of `flags.command`, its seconds and device still to fill in.
RunReport Report(const Flags& flags, std::string_view weights) {
  RunReport report;
  report.tool = "eagle3-inspect";
  report.command = flags.command;
  report.settings = Settings(flags, weights);
  return report;  // no subcommand draws random numbers: seed stays null
}

// target / draft --json: the run report, the --out file and each tensor written there.
absl::Status WriteDumpJson(const Flags& flags, const RunReport& report,
                           std::span<const eagle3::NamedTensor> tensors) {
  std::string list = "[";
  for (const eagle3::NamedTensor& t : tensors) {
    list += (list.size() > 1 ? ", " : "") +
            JsonObject()
                .String("name", t.name)
                .String("dtype", eagle3::DTypeName(t.tensor.dtype()))
                .Raw("shape", JsonInts(t.tensor.shape().dims()))
                .str();
  }
  JsonObject more;
  more.String("out", flags.out).Raw("tensors", list + "]");
  return WriteJsonFile("--json", flags.json, report.Json(more), flags.JsonInputs());
}

// --json before any work: as --out is checked, and never the --out file itself (the JSON would
// replace what it describes).
absl::Status CheckJsonPath(const Flags& flags) {
  if (!flags.out.empty()) {
    std::error_code out_error, json_error;
    const std::filesystem::path out = std::filesystem::weakly_canonical(flags.out, out_error);
    const std::filesystem::path json = std::filesystem::weakly_canonical(flags.json, json_error);
    if (flags.out == flags.json || (!out_error && !json_error && out == json)) {
      return absl::InvalidArgumentError("--json " + flags.json + ": names the --out file");
    }
  }
  return WithFlag("--json", eagle3::CheckOutputPath(flags.json, flags.JsonInputs()));
}

absl::Status InspectTarget(const Flags& flags) {
  EAGLE3_ASSIGN_OR_RETURN(auto config, eagle3::DeepseekV2Config::FromFile(flags.model));
  const int layers = static_cast<int>(config.num_hidden_layers);
  const int64_t t = static_cast<int64_t>(flags.tokens.size());
  const int64_t hd = config.hidden_size;
  EAGLE3_RETURN_IF_ERROR(CheckPositions(flags, config, t, "--tokens"));
  {
    // The config may legally name a vocabulary or widths whose dumps no host can hold: checked
    // before anything is allocated. Every rank fills its own logits and taps.
    const std::string tokens = "--tokens (" + std::to_string(t) + " tokens)";
    eagle3::HostByteBudget budget("eagle3-inspect target");
    budget.Add(tokens + " x vocab_size " + std::to_string(config.vocab_size) + " x --tp " + std::to_string(flags.tp) +
                   " (logits)",
               {t, config.vocab_size, flags.tp}, sizeof(float));
    budget.Add(tokens + " x (num_hidden_layers " + std::to_string(layers) + " + 1) x hidden_size " +
                   std::to_string(hd) + " x (--tp " + std::to_string(flags.tp) + " + 1) (boundaries)",
               {t, layers + int64_t{1}, hd, flags.tp + int64_t{1}}, sizeof(float));
    EAGLE3_RETURN_IF_ERROR(budget.Check());
  }
  std::vector<int> every_boundary(static_cast<size_t>(layers + 1));
  for (int b = 0; b <= layers; ++b) every_boundary[static_cast<size_t>(b)] = b;
  EAGLE3_ASSIGN_OR_RETURN(eagle3::HiddenStateTap tap,
                          eagle3::HiddenStateTap::Create(std::span<const int>(every_boundary),
                                                         eagle3::LayerIdConvention::kInputOfLayer, layers,
                                                         config.hidden_size));
  eagle3::TargetModelOptions options;
  options.tp_size = flags.tp;
  options.residual_mode = flags.residual;
  options.attention_path = flags.attention;
  options.max_tokens_per_forward = t;
  options.max_context_len = t;
  options.page_size = 64;
  options.num_kv_pages = (t + options.page_size - 1) / options.page_size;
  options.weight_dtype = flags.weights;
  options.allow_long_context = flags.allow_long_context;
  std::string weights;  // rank 0's, for the summary
  std::vector<int32_t> pages(static_cast<size_t>(options.num_kv_pages));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);

  std::vector<float> logits, aux;  // rank 0's, written out
  PhaseSeconds seconds;                  // rank 0's
  std::optional<eagle3::Device> device;  // rank 0's
  EAGLE3_RETURN_IF_ERROR(eagle3::RunRankThreads(flags.tp, [&](int rank, eagle3::Communicator* host_comm) -> absl::Status {
    const auto load_start = Clock::now();
    EAGLE3_ASSIGN_OR_RETURN(eagle3::examples::RankContext ctx,
                            eagle3::examples::MakeRankContext(flags.device, rank, host_comm));
    eagle3::TargetModelOptions o = options;
    o.rank = rank;
    EAGLE3_ASSIGN_OR_RETURN(auto model, eagle3::TargetModel::Create(flags.model, o, ctx.comm, ctx.backend.get()));
    if (rank == 0) {
      weights = WeightsName(flags.weights, *ctx.backend);
      device = ctx.backend->device();
      seconds.Add("load", SecondsSince(load_start));
    }
    eagle3::SequenceInput in;
    in.tokens = flags.tokens;
    in.page_table = pages;
    in.all_logits = true;
    // Every rank produces identical outputs; rank 0 writes them. Allocated once the model loaded,
    // so that a checkpoint that cannot load costs no output buffers.
    std::vector<float> rank_logits, rank_aux;
    std::vector<float>& my_logits = rank == 0 ? logits : rank_logits;
    std::vector<float>& my_aux = rank == 0 ? aux : rank_aux;
    EAGLE3_RETURN_IF_ERROR(
        eagle3::AssignHostVector(my_logits, t * config.vocab_size, 0.0f, "--tokens x vocab_size logits"));
    EAGLE3_RETURN_IF_ERROR(eagle3::AssignHostVector(my_aux, t * tap.width(), 0.0f, "--tokens x boundaries taps"));
    const eagle3::DType f32 = eagle3::DType::kF32;
    const eagle3::TensorView logits_view(my_logits.data(), f32, {t, config.vocab_size});
    const eagle3::TensorView aux_view(my_aux.data(), f32, {t, tap.width()});
    const auto forward_start = Clock::now();
    const std::span<const eagle3::SequenceInput> batch(&in, 1);
    EAGLE3_RETURN_IF_ERROR(model->Forward(batch, logits_view, &tap, aux_view));
    if (rank == 0) seconds.Add("forward", SecondsSince(forward_start));
    return absl::OkStatus();
  }));

  // boundary.<b> as its own contiguous [T, H] tensor.
  std::vector<std::vector<float>> boundaries(static_cast<size_t>(layers + 1));
  for (std::vector<float>& boundary : boundaries) {
    EAGLE3_RETURN_IF_ERROR(eagle3::AssignHostVector(boundary, t * hd, 0.0f, "--tokens x hidden_size boundary"));
  }
  for (int b = 0; b <= layers; ++b) {
    for (int64_t i = 0; i < t; ++i) {
      std::copy_n(aux.begin() + i * tap.width() + b * hd, hd, boundaries[static_cast<size_t>(b)].begin() + i * hd);
    }
  }
  std::vector<int64_t> tokens = flags.tokens;
  std::vector<eagle3::NamedTensor> out;
  out.push_back({"tokens", eagle3::TensorView(tokens.data(), eagle3::DType::kI64, eagle3::Shape{t})});
  out.push_back({"logits", eagle3::TensorView(logits.data(), eagle3::DType::kF32, eagle3::Shape{t, config.vocab_size})});
  for (int b = 0; b <= layers; ++b) {
    out.push_back({"boundary." + std::to_string(b),
                   eagle3::TensorView(boundaries[static_cast<size_t>(b)].data(), eagle3::DType::kF32, eagle3::Shape{t, hd})});
  }
  EAGLE3_RETURN_IF_ERROR(seconds.Time("write", [&] {
    const absl::Status written =
        eagle3::WriteSafetensors(flags.out, out, {{"model", flags.model}}, flags.Inputs());
    return WithFlag("--out", written);
  }));

  std::printf("target %s: %s, %d layers, hidden %lld, vocab %lld, softmax scale %.6f\n", flags.model.c_str(),
              std::string(eagle3::DeepseekModelTypeName(config.model_type)).c_str(), layers,
              static_cast<long long>(hd), static_cast<long long>(config.vocab_size), config.SoftmaxScale());
  std::printf("run: %lld tokens, tp %d, residual %s, load %.1f ms, forward %.1f ms on %s, %s "
              "weights\n",
              static_cast<long long>(t), flags.tp,
              flags.residual == eagle3::ResidualMode::kReplicated ? "replicated" : "sharded",
              seconds.Get("load") * 1e3, seconds.Get("forward") * 1e3, flags.device.c_str(),
              weights.c_str());
  std::printf("wrote %s: tokens [%lld], logits [%lld, %lld], boundary.0..%d [%lld, %lld] "
              "(0 = embedding output, %d = before the final norm)\n",
              flags.out.c_str(), static_cast<long long>(t), static_cast<long long>(t),
              static_cast<long long>(config.vocab_size), layers, static_cast<long long>(t), static_cast<long long>(hd),
              layers);
  std::printf("%6s %8s %8s %12s\n", "pos", "token", "argmax", "max logit");
  for (int64_t i = 0; i < t; ++i) {
    const float* row = logits.data() + i * config.vocab_size;
    int64_t best = 0;
    for (int64_t v = 1; v < config.vocab_size; ++v) best = row[v] > row[best] ? v : best;
    std::printf("%6lld %8lld %8lld %12.4f\n", static_cast<long long>(i), static_cast<long long>(flags.tokens[i]),
                static_cast<long long>(best), row[best]);
  }
  if (flags.json.empty()) return absl::OkStatus();
  RunReport report = Report(flags, weights);
  report.device = device;
  report.seconds = seconds.Json();
  return WriteDumpJson(flags, report, out);
}

absl::Status InspectDraft(const Flags& flags) {
  // The models run on --device (the tree is built on the host from their outputs, as the reference
  // loop builds it).
  PhaseSeconds seconds;
  const auto load_start = Clock::now();
  EAGLE3_ASSIGN_OR_RETURN(eagle3::examples::RankContext ctx, eagle3::examples::MakeRankContext(flags.device, 0, nullptr));
  eagle3::Backend* backend = ctx.backend.get();
  const int64_t t = static_cast<int64_t>(flags.tokens.size());
  {
    EAGLE3_ASSIGN_OR_RETURN(const eagle3::DeepseekV2Config config, eagle3::DeepseekV2Config::FromFile(flags.model));
    EAGLE3_RETURN_IF_ERROR(CheckPositions(flags, config, t, "--tokens"));
  }
  const int64_t context = t + flags.tree.num_draft_tokens + 1;
  const int64_t page_size = 16;
  const int64_t pages = (context + page_size - 1) / page_size;
  std::vector<int32_t> page_table(static_cast<size_t>(pages));
  for (size_t p = 0; p < page_table.size(); ++p) page_table[p] = static_cast<int32_t>(p);

  eagle3::DraftModelOptions dopt;
  dopt.convention = flags.convention;
  dopt.max_tokens_per_forward = std::max<int64_t>(t, flags.tree.num_draft_tokens);
  dopt.max_context_len = context;
  dopt.page_size = page_size;
  dopt.num_kv_pages = pages;
  dopt.weight_dtype = flags.weights;
  EAGLE3_ASSIGN_OR_RETURN(auto draft, flags.mtp
                                           ? eagle3::DraftModel::CreateMtp(flags.model, dopt, nullptr, backend)
                                           : eagle3::DraftModel::Create(flags.draft, flags.model, dopt, nullptr, backend));
  eagle3::TargetModelOptions topt;
  topt.weight_dtype = flags.weights;
  topt.max_tokens_per_forward = t;
  topt.max_context_len = context;
  topt.page_size = page_size;
  topt.num_kv_pages = pages;
  // The target only runs the --tokens positions (checked above); the context beyond is slack.
  topt.allow_long_context = true;
  EAGLE3_ASSIGN_OR_RETURN(auto target, eagle3::TargetModel::Create(flags.model, topt, nullptr, backend));
  seconds.Add("load", SecondsSince(load_start));
  const eagle3::HiddenStateTap& tap = draft->tap();
  const int64_t vocab = target->config().vocab_size, dv = draft->draft_vocab();
  const int64_t draft_hidden = draft->shape().hidden_size;
  {
    const std::string tokens = "--tokens (" + std::to_string(t) + " tokens)";
    eagle3::HostByteBudget budget("eagle3-inspect draft");
    budget.Add(tokens + " x tap width " + std::to_string(tap.width()) + " (taps)", {t, tap.width()}, sizeof(float));
    budget.Add(tokens + " x draft_vocab_size " + std::to_string(dv) + " (draft logits)", {t, dv}, sizeof(float));
    budget.Add(tokens + " x draft hidden_size " + std::to_string(draft_hidden) + " (hidden)", {t, draft_hidden},
               sizeof(float));
    EAGLE3_RETURN_IF_ERROR(budget.Check());
  }

  // Target pass: aux states of every position and the root (argmax after the last token).
  std::vector<float> last(static_cast<size_t>(vocab)), aux, draft_logits, hidden;
  EAGLE3_RETURN_IF_ERROR(eagle3::AssignHostVector(aux, t * tap.width(), 0.0f, "--tokens x tap width"));
  EAGLE3_RETURN_IF_ERROR(eagle3::AssignHostVector(draft_logits, t * dv, 0.0f, "--tokens x draft_vocab_size"));
  EAGLE3_RETURN_IF_ERROR(eagle3::AssignHostVector(hidden, t * draft_hidden, 0.0f, "--tokens x draft hidden_size"));
  eagle3::SequenceInput in;
  in.tokens = flags.tokens;
  in.page_table = page_table;
  EAGLE3_RETURN_IF_ERROR(seconds.Time("target", [&] {
    return target->Forward(std::span<const eagle3::SequenceInput>(&in, 1),
                           eagle3::TensorView(last.data(), eagle3::DType::kF32, {1, vocab}), &tap,
                           eagle3::TensorView(aux.data(), eagle3::DType::kF32, {t, tap.width()}));
  }));
  int64_t root = 0;
  for (int64_t v = 1; v < vocab; ++v) root = last[static_cast<size_t>(v)] > last[static_cast<size_t>(root)] ? v : root;
  std::vector<int64_t> shifted(flags.tokens.begin() + 1, flags.tokens.end());
  shifted.push_back(root);

  // First draft step at every position, then the tree: the draft phase.
  const auto draft_start = Clock::now();
  eagle3::DraftSequenceInput din;
  din.tokens = shifted;
  din.page_table = page_table;
  din.all_logits = true;
  EAGLE3_RETURN_IF_ERROR(draft->Forward(std::span<const eagle3::DraftSequenceInput>(&din, 1),
                                        eagle3::TensorView(aux.data(), eagle3::DType::kF32, eagle3::Shape{t, tap.width()}),
                                        /*from_target=*/true,
                                        eagle3::TensorView(draft_logits.data(), eagle3::DType::kF32, eagle3::Shape{t, dv}),
                                        eagle3::TensorView(hidden.data(), eagle3::DType::kF32,
                                                           eagle3::Shape{t, draft_hidden})));

  // The tree after the last position, built as the decode loop builds it.
  eagle3::Eagle3Drafter drafter(draft.get(), 1);
  std::vector<float> root_logits(static_cast<size_t>(dv));
  EAGLE3_RETURN_IF_ERROR(drafter.Reset(0));
  EAGLE3_RETURN_IF_ERROR(drafter.Extend(0, 0, shifted,
                                        eagle3::TensorView(aux.data(), eagle3::DType::kF32, eagle3::Shape{t, tap.width()}),
                                        eagle3::TensorView(root_logits.data(), eagle3::DType::kF32, eagle3::Shape{dv})));
  eagle3::DraftExpandFn expand = [&](std::span<const eagle3::DraftCandidate> candidates, std::span<const int32_t> frontier,
                                     const eagle3::TensorView& out) -> absl::Status {
    if (frontier.size() == 1 && frontier[0] == 0) {
      std::copy(root_logits.begin(), root_logits.end(), out.data_as<float>());
      return absl::OkStatus();
    }
    return drafter.Expand(0, candidates, frontier, out);
  };
  EAGLE3_ASSIGN_OR_RETURN(eagle3::DraftTree tree,
                          eagle3::BuildDraftTree(root, flags.tree, dv, draft->d2t(), expand));
  seconds.Add("draft", SecondsSince(draft_start));
  const int64_t n = tree.size();
  std::vector<int64_t> positions = tree.Positions(t);
  std::vector<uint8_t> mask = tree.DenseMask();
  std::vector<int64_t> tokens = flags.tokens;
  std::vector<int32_t> parents = tree.parents;
  std::vector<int64_t> tree_tokens = tree.tokens;
  const std::vector<eagle3::NamedTensor> out = {
      {"tokens", eagle3::TensorView(tokens.data(), eagle3::DType::kI64, eagle3::Shape{t})},
      {"draft_logits", eagle3::TensorView(draft_logits.data(), eagle3::DType::kF32, eagle3::Shape{t, dv})},
      {"tree_tokens", eagle3::TensorView(tree_tokens.data(), eagle3::DType::kI64, eagle3::Shape{n})},
      {"tree_parents", eagle3::TensorView(parents.data(), eagle3::DType::kI32, eagle3::Shape{n})},
      {"tree_positions", eagle3::TensorView(positions.data(), eagle3::DType::kI64, eagle3::Shape{n})},
      {"tree_mask", eagle3::TensorView(mask.data(), eagle3::DType::kU8, eagle3::Shape{n, n})}};
  EAGLE3_RETURN_IF_ERROR(seconds.Time("write", [&] {
    const std::map<std::string, std::string> metadata = {{"target", flags.model},
                                                          {"draft", flags.mtp ? "mtp" : flags.draft}};
    return WithFlag("--out", eagle3::WriteSafetensors(flags.out, out, metadata, flags.Inputs()));
  }));

  std::printf("%s\n", tap.Describe().c_str());
  std::printf("wrote %s: draft_logits [%lld, %lld], tree of %lld nodes (topk %d, steps %d)\n", flags.out.c_str(),
              static_cast<long long>(t), static_cast<long long>(dv), static_cast<long long>(n), flags.tree.topk,
              flags.tree.num_steps);
  // Draft top-1 (as a target id) at each position next to the target's next token.
  const auto d2t = draft->d2t();
  int agree = 0;
  // Row p (hidden p, token p + 1) predicts the token at p + 2.
  for (int64_t p = 0; p + 2 < t; ++p) {
    const float* row = draft_logits.data() + p * dv;
    int64_t best = 0;
    for (int64_t v = 1; v < dv; ++v) best = row[v] > row[best] ? v : best;
    const int64_t as_target = best + (d2t.empty() ? 0 : d2t[static_cast<size_t>(best)]);
    agree += as_target == flags.tokens[static_cast<size_t>(p + 2)] ? 1 : 0;
  }
  std::printf("tree root %lld at position %lld; nodes (token, parent, position):", static_cast<long long>(root),
              static_cast<long long>(t));
  for (int64_t i = 0; i < n; ++i) {
    std::printf(" (%lld, %d, %lld)", static_cast<long long>(tree.tokens[static_cast<size_t>(i)]),
                tree.parents[static_cast<size_t>(i)], static_cast<long long>(positions[static_cast<size_t>(i)]));
  }
  std::printf("\ndraft top-1 equals the prompt's token two ahead at %d of %lld positions\n", agree,
              static_cast<long long>(std::max<int64_t>(t - 2, 0)));
  if (flags.json.empty()) return absl::OkStatus();
  RunReport report = Report(flags, WeightsName(flags.weights, *backend));
  report.device = backend->device();
  report.seconds = seconds.Json();
  return WriteDumpJson(flags, report, out);
}

// check --json FILE: the run report, then the pair report and the result (the settings' target,
// draft and convention, or mtp: true, repeated at the top level, where this file always had them).
absl::Status WriteCheckJson(const Flags& flags, const eagle3::PairReport& pair,
                            double check_seconds) {
  using eagle3::examples::JsonString;
  auto list = [](const std::vector<std::string>& items) {
    std::string s = "[";
    for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + JsonString(items[i]);
    return s + "]";
  };
  RunReport report = Report(flags, "");
  report.seconds.Number("check", check_seconds);  // reads configs and headers: no device, no seed
  JsonObject more;
  more.String("target", flags.model);
  if (flags.mtp) {
    more.Bool("mtp", true);
  } else {
    more.String("draft", flags.draft).String("convention", ConventionName(flags.convention));
  }
  more.Raw("facts", list(pair.facts))
      .Raw("warnings", list(pair.warnings))
      .Raw("problems", list(pair.problems))
      .Bool("ok", pair.ok());
  return WriteJsonFile("--json", flags.json, report.Json(more), flags.JsonInputs());
}

absl::Status Check(const Flags& flags) {
  const auto start = Clock::now();
  const eagle3::PairReport report = flags.mtp ? eagle3::CheckMtpPair(flags.model)
                                              : eagle3::CheckDraftPair(flags.model, flags.draft, flags.convention);
  const double check_seconds = SecondsSince(start);
  for (const std::string& fact : report.facts) std::printf("  %s\n", fact.c_str());
  for (const std::string& warning : report.warnings) std::printf("  WARNING: %s\n", warning.c_str());
  for (const std::string& problem : report.problems) std::printf("  PROBLEM: %s\n", problem.c_str());
  if (report.ok()) {
    const char* drafter = flags.mtp ? "the MTP module" : "the draft";
    if (report.warnings.empty()) {
      std::printf("pair OK: %s matches the target\n", drafter);
    } else {
      std::printf("pair OK with %zu warning(s): %s matches the target's shapes; read the warnings\n",
                  report.warnings.size(), drafter);
    }
  }
  if (!flags.json.empty()) EAGLE3_RETURN_IF_ERROR(WriteCheckJson(flags, report, check_seconds));
  if (report.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(std::to_string(report.problems.size()) + " problem(s) with this pair");
}

int64_t ArgMax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t v = 1; v < n; ++v) best = row[v] > row[best] ? v : best;
  return best;
}

// The teacher-forced draft accuracy by depth (see the file comment for the exact definition).
absl::Status Accuracy(const Flags& flags) {
  PhaseSeconds seconds;
  const auto tokenize_start = Clock::now();
  // The text's ids: --tokens as given, or --text-file through the target's tokenizer.
  const std::string source = flags.tokens.empty() ? "--text-file " + flags.text_file : std::string("--tokens");
  std::vector<int64_t> x = flags.tokens;
  if (flags.tokens.empty()) {
    EAGLE3_ASSIGN_OR_RETURN(eagle3::Tokenizer tokenizer, eagle3::Tokenizer::FromFile(flags.model));
    EAGLE3_ASSIGN_OR_RETURN(const std::string whole,
                            eagle3::examples::ReadInputFile("--text-file", flags.text_file, flags.max_input_bytes));
    auto encoded = tokenizer.Encode(whole);
    if (!encoded.ok()) {
      return absl::Status(encoded.status().code(), source + ": " + std::string(encoded.status().message()));
    }
    x = *std::move(encoded);
  }
  seconds.Add("tokenize", SecondsSince(tokenize_start));
  const int64_t text_tokens = static_cast<int64_t>(x.size());
  if (text_tokens > flags.tokens_max) {
    x.resize(static_cast<size_t>(flags.tokens_max));
    std::printf("read %d of %lld tokens of %s (--tokens-max %d; a larger value reads more)\n", flags.tokens_max,
                static_cast<long long>(text_tokens), source.c_str(), flags.tokens_max);
  }
  const int64_t t = static_cast<int64_t>(x.size());
  const int depth = flags.depth;
  if (t < depth + 1) {
    return absl::InvalidArgumentError(source + " has " + std::to_string(t) +
                                      " tokens; depth " + std::to_string(depth) + " needs at least " +
                                      std::to_string(depth + 1));
  }
  {
    EAGLE3_ASSIGN_OR_RETURN(const eagle3::DeepseekV2Config config, eagle3::DeepseekV2Config::FromFile(flags.model));
    EAGLE3_RETURN_IF_ERROR(CheckPositions(flags, config, t,
                                          source + " (at most --tokens-max " +
                                              std::to_string(flags.tokens_max) + " tokens)"));
  }
  // Capacities come from --tokens-max and --depth: a refusal names them.
  auto with_flags = [&](const absl::Status& status) {
    if (status.code() != absl::StatusCode::kResourceExhausted) return status;
    return WithFlag("with " + std::to_string(t) + " tokens (--tokens-max " + std::to_string(flags.tokens_max) +
                        ") and --depth " + std::to_string(depth),
                    status);
  };

  // Draft cache: the T rows of depth 1, then the rows of depth 2, 3, ... (T - d rows at depth d).
  int64_t cache_rows = 0;
  for (int d = 1; d <= depth; ++d) cache_rows += t - (d == 1 ? 0 : d);
  const int64_t page_size = 64;
  const int64_t pages = (std::max(cache_rows, t) + page_size - 1) / page_size;
  std::vector<int32_t> page_table(static_cast<size_t>(pages));
  for (size_t i = 0; i < page_table.size(); ++i) page_table[i] = static_cast<int32_t>(i);

  const auto load_start = Clock::now();
  EAGLE3_ASSIGN_OR_RETURN(eagle3::examples::RankContext ctx, eagle3::examples::MakeRankContext(flags.device, 0, nullptr));
  eagle3::DraftModelOptions dopt;
  dopt.convention = flags.convention;
  dopt.aux_layer_ids_override = flags.aux_layers;
  dopt.max_tokens_per_forward = t;
  dopt.max_context_len = std::max(cache_rows, t);
  dopt.page_size = page_size;
  dopt.num_kv_pages = pages;
  dopt.weight_dtype = flags.weights;
  auto created = flags.mtp ? eagle3::DraftModel::CreateMtp(flags.model, dopt, nullptr, ctx.backend.get())
                           : eagle3::DraftModel::Create(flags.draft, flags.model, dopt, nullptr, ctx.backend.get());
  if (!created.ok() && flags.aux_layers.has_value()) {
    return with_flags(
        absl::Status(created.status().code(), "with --aux-layers: " + std::string(created.status().message())));
  }
  if (!created.ok()) return with_flags(created.status());
  std::unique_ptr<eagle3::DraftModel> draft = *std::move(created);
  eagle3::TargetModelOptions topt;
  topt.max_tokens_per_forward = t;
  topt.max_context_len = t;
  topt.page_size = page_size;
  topt.num_kv_pages = (t + page_size - 1) / page_size;
  topt.weight_dtype = flags.weights;
  topt.allow_long_context = flags.allow_long_context;
  auto created_target = eagle3::TargetModel::Create(flags.model, topt, nullptr, ctx.backend.get());
  if (!created_target.ok()) return with_flags(created_target.status());
  std::unique_ptr<eagle3::TargetModel> target = *std::move(created_target);
  seconds.Add("load", SecondsSince(load_start));
  const eagle3::HiddenStateTap& tap = draft->tap();
  const int64_t vocab = target->config().vocab_size, dv = draft->draft_vocab(), hd = draft->shape().hidden_size;
  const auto d2t = draft->d2t();
  if (!std::is_sorted(tap.boundaries().begin(), tap.boundaries().end())) {
    std::fprintf(stderr,
                 "eagle3-inspect: warning: the aux layer ids are not in layer order; the draft receives the taps in "
                 "the listed order, while SGLang and vLLM capture them in layer order\n");
  }
  {
    const std::string tokens = std::to_string(t) + " tokens (--tokens-max " + std::to_string(flags.tokens_max) + ")";
    eagle3::HostByteBudget budget("eagle3-inspect accuracy");
    budget.Add(tokens + " x vocab_size " + std::to_string(vocab) + " (target logits)", {t, vocab}, sizeof(float));
    budget.Add(tokens + " x 2 x tap width " + std::to_string(tap.width()) + " (taps)", {t, 2, tap.width()},
               sizeof(float));
    budget.Add(tokens + " x (draft_vocab_size " + std::to_string(dv) + " + hidden_size " + std::to_string(hd) +
                   ") (draft outputs)",
               {t, dv + hd}, sizeof(float));
    EAGLE3_RETURN_IF_ERROR(budget.Check());
  }

  const auto target_start = Clock::now();
  // Target: y_t for every position and the aux states of the draft's taps.
  std::vector<int64_t> y(static_cast<size_t>(t));
  std::vector<float> aux;
  EAGLE3_RETURN_IF_ERROR(eagle3::AssignHostVector(aux, t * tap.width(), 0.0f, "text tokens x tap width"));
  {
    std::vector<float> logits;
    EAGLE3_RETURN_IF_ERROR(eagle3::AssignHostVector(logits, t * vocab, 0.0f, "text tokens x vocab_size"));
    eagle3::SequenceInput in;
    in.tokens = x;
    in.page_table = std::span<const int32_t>(page_table).first(static_cast<size_t>(topt.num_kv_pages));
    in.all_logits = true;
    EAGLE3_RETURN_IF_ERROR(target->Forward(std::span<const eagle3::SequenceInput>(&in, 1),
                                           eagle3::TensorView(logits.data(), eagle3::DType::kF32, eagle3::Shape{t, vocab}),
                                           &tap, eagle3::TensorView(aux.data(), eagle3::DType::kF32, eagle3::Shape{t, tap.width()})));
    for (int64_t i = 0; i < t; ++i) y[static_cast<size_t>(i)] = ArgMax(logits.data() + i * vocab, vocab);
  }
  seconds.Add("target", SecondsSince(target_start));
  int64_t target_agree = 0;  // the target's own greedy accuracy on the text, for scale
  for (int64_t i = 0; i + 1 < t; ++i) target_agree += y[static_cast<size_t>(i)] == x[static_cast<size_t>(i + 1)] ? 1 : 0;

  const auto draft_start = Clock::now();
  std::vector<int64_t> agree(static_cast<size_t>(depth), 0), count(static_cast<size_t>(depth), 0);
  // Depth d's rows (one per start p = 0 .. n_d - 1) and where they sit in the cache.
  std::vector<float> hidden(aux), hidden_out(static_cast<size_t>(t * hd)), logits(static_cast<size_t>(t * dv));
  std::vector<int64_t> row_slot_base(static_cast<size_t>(depth + 1), 0);  // first cache slot of depth d's rows
  int64_t cache_len = 0;
  for (int d = 1; d <= depth; ++d) {
    // Depth 1 runs a row for every position (rows p > T-2 only serve as context); depth d >= 2 one
    // per start p = 0 .. T-1-d.
    const int64_t n = d == 1 ? t : t - d;
    std::vector<int64_t> tokens(static_cast<size_t>(n)), positions(static_cast<size_t>(n));
    for (int64_t p = 0; p < n; ++p) {
      // Row p's token is x_{p+d}; the last depth-1 row has none (the text ends): x_{T-1} stands in,
      // and that row is never scored.
      tokens[static_cast<size_t>(p)] = x[static_cast<size_t>(std::min(p + d, t - 1))];
      positions[static_cast<size_t>(p)] = p + d - 1;
    }
    std::vector<uint8_t> mask;
    if (d > 1) {
      // Row p attends the depth-1 rows 0..p and its own chain's rows at depths 2..d (itself last).
      const int64_t width = cache_len + n;
      mask.assign(static_cast<size_t>(n * width), 0);
      for (int64_t p = 0; p < n; ++p) {
        uint8_t* row = mask.data() + p * width;
        for (int64_t j = 0; j <= p; ++j) row[j] = 1;
        for (int e = 2; e < d; ++e) row[row_slot_base[static_cast<size_t>(e)] + p] = 1;
        row[cache_len + p] = 1;
      }
    }
    row_slot_base[static_cast<size_t>(d)] = cache_len;
    eagle3::DraftSequenceInput in;
    in.tokens = tokens;
    in.positions = positions;
    in.page_table = page_table;
    in.cache_len = cache_len;
    in.mask = mask;
    in.all_logits = true;
    const int64_t width = d == 1 ? tap.width() : hd;
    EAGLE3_RETURN_IF_ERROR(draft->Forward(
        std::span<const eagle3::DraftSequenceInput>(&in, 1),
        eagle3::TensorView(hidden.data(), eagle3::DType::kF32, eagle3::Shape{n, width}), /*from_target=*/d == 1,
        eagle3::TensorView(logits.data(), eagle3::DType::kF32, eagle3::Shape{n, dv}),
        eagle3::TensorView(hidden_out.data(), eagle3::DType::kF32, eagle3::Shape{n, hd})));
    for (int64_t p = 0; p + d < t; ++p) {
      const int64_t best = ArgMax(logits.data() + p * dv, dv);
      const int64_t as_target = best + (d2t.empty() ? 0 : d2t[static_cast<size_t>(best)]);
      agree[static_cast<size_t>(d - 1)] += as_target == y[static_cast<size_t>(p + d)] ? 1 : 0;
      ++count[static_cast<size_t>(d - 1)];
    }
    cache_len += n;
    hidden.assign(hidden_out.begin(), hidden_out.begin() + n * hd);  // row p of depth d+1 continues row p
  }
  seconds.Add("draft", SecondsSince(draft_start));

  std::printf("%s\n", tap.Describe().c_str());
  std::printf("text %s: %lld tokens; target greedy = next text token at %.4f of positions; %.2f s on %s, %s weights\n",
              flags.tokens.empty() ? flags.text_file.c_str() : "--tokens", static_cast<long long>(t),
              static_cast<double>(target_agree) / static_cast<double>(t - 1),
              seconds.Get("target") + seconds.Get("draft"), flags.device.c_str(),
              WeightsName(flags.weights, *ctx.backend).c_str());
  std::printf("%6s %10s %8s %8s   (draft top-1 vs the target's greedy token, teacher-forced)\n", "depth",
              "agreement", "agree", "count");
  for (int d = 1; d <= depth; ++d) {
    const auto i = static_cast<size_t>(d - 1);
    std::printf("%6d %10.4f %8lld %8lld\n", d, static_cast<double>(agree[i]) / static_cast<double>(count[i]),
                static_cast<long long>(agree[i]), static_cast<long long>(count[i]));
  }
  if (flags.out.empty() && flags.json.empty()) return absl::OkStatus();
  auto ratio = [](int64_t part, int64_t whole) {
    return static_cast<double>(part) / static_cast<double>(whole);
  };
  std::string depths = "[";
  for (int d = 1; d <= depth; ++d) {
    const auto i = static_cast<size_t>(d - 1);
    depths += (d > 1 ? ", " : "") + JsonObject()
                                        .Int("depth", d)
                                        .Number("agreement", ratio(agree[i], count[i]))
                                        .Int("agree", agree[i])
                                        .Int("count", count[i])
                                        .str();
  }
  JsonObject result;
  result.String("target", flags.model);
  // --mtp has no draft directory; the key appears only with the flag (as in the settings).
  if (flags.mtp) {
    result.Bool("mtp", true);
  } else {
    result.String("draft", flags.draft);
  }
  result.String("text_file", flags.text_file)
      .Int("tokens", t)
      .Int("text_tokens", text_tokens)
      .Int("tokens_max", flags.tokens_max)
      .Bool("truncated", text_tokens > t)
      .Raw("boundaries", JsonInts(tap.boundaries()))
      .String("tap", tap.Describe())
      .Number("target_next_token_accuracy", ratio(target_agree, t - 1))
      .Raw("depths", depths + "]");
  RunReport report = Report(flags, WeightsName(flags.weights, *ctx.backend));
  report.device = ctx.backend->device();
  report.seconds = seconds.Json();
  const std::string text = report.Json(result);
  // --out first: --json's check keeps it from naming the --out file.
  if (!flags.out.empty()) {
    EAGLE3_RETURN_IF_ERROR(WriteJsonFile("--out", flags.out, text, flags.Inputs()));
  }
  if (!flags.json.empty()) {
    EAGLE3_RETURN_IF_ERROR(WriteJsonFile("--json", flags.json, text, flags.JsonInputs()));
  }
  return absl::OkStatus();
}
}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "eagle3-inspect: %s\n%s", std::string(flags.status().message()).c_str(),
                 SubcommandUsage(argc > 1 ? std::string_view(argv[1]) : std::string_view()));
    return 2;
  }
  absl::Status status;
  try {
    // A bad model directory, then a bad --out / --json, fail before any work.
    status = eagle3::examples::CheckModelDir(flags->command == "target" ? "--model" : "--target", flags->model);
    if (status.ok() && !flags->draft.empty()) status = eagle3::examples::CheckModelDir("--draft", flags->draft);
    if (status.ok() && !flags->out.empty()) {
      status = WithFlag("--out", eagle3::CheckOutputPath(flags->out, flags->Inputs()));
    }
    if (status.ok() && !flags->json.empty()) status = CheckJsonPath(*flags);
    if (status.ok()) {
      status = flags->command == "target"     ? InspectTarget(*flags)
               : flags->command == "draft"    ? InspectDraft(*flags)
               : flags->command == "accuracy" ? Accuracy(*flags)
                                              : Check(*flags);
    }
  } catch (const std::bad_alloc&) {
    // Sizes are checked before allocating; this is memory taken by others meanwhile.
    status = absl::ResourceExhaustedError("out of host memory");
  }
  if (!status.ok()) {
    std::fprintf(stderr, "eagle3-inspect: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
