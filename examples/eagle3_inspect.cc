// eagle3-inspect — answers an engine developer's questions about a model pair before serving.
//
//   eagle3-inspect target --model DIR --tokens 5,17,99 [--tp N] [--residual replicated|sharded]
//                         [--attention auto|absorbed|non-absorbed] --out FILE
//
// `target` runs the target on the tokens (one causal forward, CPU reference backend, N ranks on
// threads) and writes a safetensors file with `tokens` (i64 [T]), `logits` (f32 [T, V]) and
// `boundary.<b>` (f32 [T, H]) for every boundary b in 0..L (b = 0 the embedding output, b = L the
// last layer's output before the final norm) — what a user compares with a training-time dump.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/hidden_state_tap.h"
#include "eagle3/in_process_group.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"

namespace {

constexpr char kUsage[] =
    "usage: eagle3-inspect target --model DIR --tokens 5,17,99,... [--tp N]\n"
    "                             [--residual replicated|sharded]\n"
    "                             [--attention auto|absorbed|non-absorbed] --out FILE\n";

struct Flags {
  std::string model, out;
  std::vector<int64_t> tokens;
  int tp = 1;
  eagle3::ResidualMode residual = eagle3::ResidualMode::kReplicated;
  eagle3::AttentionPath attention = eagle3::AttentionPath::kAuto;
};

absl::StatusOr<std::vector<int64_t>> ParseTokens(const std::string& text) {
  std::vector<int64_t> tokens;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0') {
      return absl::InvalidArgumentError("--tokens: '" + item + "' is not an integer token id");
    }
    tokens.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return tokens;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) != "target") {
    return absl::InvalidArgumentError(argc < 2 ? "missing subcommand" : "unknown subcommand '" + std::string(argv[1]) + "'");
  }
  Flags flags;
  for (int i = 2; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError("flag " + std::string(flag) + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--model") {
      flags.model = value;
    } else if (flag == "--out") {
      flags.out = value;
    } else if (flag == "--tokens") {
      EAGLE3_ASSIGN_OR_RETURN(flags.tokens, ParseTokens(value));
    } else if (flag == "--tp") {
      flags.tp = std::atoi(value.c_str());
      if (flags.tp < 1 || flags.tp > 64) return absl::InvalidArgumentError("--tp must be in [1, 64], got " + value);
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
  if (flags.model.empty() || flags.out.empty() || flags.tokens.empty()) {
    return absl::InvalidArgumentError("--model, --tokens and --out are required");
  }
  return flags;
}

absl::Status InspectTarget(const Flags& flags) {
  EAGLE3_ASSIGN_OR_RETURN(auto config, eagle3::DeepseekV2Config::FromFile(flags.model));
  const int layers = static_cast<int>(config.num_hidden_layers);
  const int64_t t = static_cast<int64_t>(flags.tokens.size());
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
  std::vector<int32_t> pages(static_cast<size_t>(options.num_kv_pages));
  for (size_t p = 0; p < pages.size(); ++p) pages[p] = static_cast<int32_t>(p);

  std::vector<float> logits(static_cast<size_t>(t * config.vocab_size));
  std::vector<float> aux(static_cast<size_t>(t * tap.width()));
  std::shared_ptr<eagle3::InProcessGroup> group;
  if (flags.tp > 1) {
    EAGLE3_ASSIGN_OR_RETURN(group, eagle3::InProcessGroup::Create(flags.tp));
  }
  std::vector<absl::Status> statuses(static_cast<size_t>(flags.tp));
  const auto start = std::chrono::steady_clock::now();
  auto rank_main = [&](int rank) {
    absl::Status& status = statuses[static_cast<size_t>(rank)];
    std::unique_ptr<eagle3::Communicator> comm;
    if (group) {
      auto c = group->Rank(rank);
      if (!c.ok()) {
        status = c.status();
        return;
      }
      comm = std::move(*c);
    }
    eagle3::cpu::CpuBackend backend;
    eagle3::TargetModelOptions o = options;
    o.rank = rank;
    auto model = eagle3::TargetModel::Create(flags.model, o, comm.get(), &backend);
    if (!model.ok()) {
      status = model.status();
      if (group) group->Abort("rank " + std::to_string(rank) + " failed to load");
      return;
    }
    eagle3::SequenceInput in;
    in.tokens = flags.tokens;
    in.page_table = pages;
    in.all_logits = true;
    // Every rank produces identical outputs; rank 0 writes them.
    std::vector<float> rank_logits, rank_aux;
    float* logits_data = logits.data();
    float* aux_data = aux.data();
    if (rank > 0) {
      rank_logits.resize(logits.size());
      rank_aux.resize(aux.size());
      logits_data = rank_logits.data();
      aux_data = rank_aux.data();
    }
    status = (*model)->Forward(std::span<const eagle3::SequenceInput>(&in, 1),
                               eagle3::TensorView(logits_data, eagle3::DType::kF32, eagle3::Shape{t, config.vocab_size}),
                               &tap, eagle3::TensorView(aux_data, eagle3::DType::kF32, eagle3::Shape{t, tap.width()}));
    if (!status.ok() && group) group->Abort("rank " + std::to_string(rank) + " failed");
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < flags.tp; ++rank) threads.emplace_back(rank_main, rank);
  for (auto& th : threads) th.join();
  for (const absl::Status& st : statuses) EAGLE3_RETURN_IF_ERROR(st);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  // boundary.<b> as its own contiguous [T, H] tensor.
  const int64_t hd = config.hidden_size;
  std::vector<std::vector<float>> boundaries(static_cast<size_t>(layers + 1), std::vector<float>(static_cast<size_t>(t * hd)));
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
  EAGLE3_RETURN_IF_ERROR(eagle3::WriteSafetensors(flags.out, out, {{"model", flags.model}}));

  std::printf("target %s: %s, %d layers, hidden %lld, vocab %lld, softmax scale %.6f\n", flags.model.c_str(),
              std::string(eagle3::DeepseekModelTypeName(config.model_type)).c_str(), layers,
              static_cast<long long>(hd), static_cast<long long>(config.vocab_size), config.SoftmaxScale());
  std::printf("run: %lld tokens, tp %d, residual %s, %.1f ms on the CPU reference backend\n", static_cast<long long>(t),
              flags.tp, flags.residual == eagle3::ResidualMode::kReplicated ? "replicated" : "sharded", ms);
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
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "eagle3-inspect: %s\n%s", std::string(flags.status().message()).c_str(), kUsage);
    return 2;
  }
  const absl::Status status = InspectTarget(*flags);
  if (!status.ok()) {
    std::fprintf(stderr, "eagle3-inspect: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
