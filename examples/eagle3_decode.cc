// eagle3-decode — the demo program.
//
// At this stage of the project (no model forward yet) it shows the checkpoint path an engine takes:
// generate a small random DeepSeek-V2-shaped checkpoint in the hub layout (or take --target DIR),
// parse its config, check every tensor against the expected schema, and load the slice one TP rank
// would hold. Later issues turn this into the plain-vs-speculative decode demo.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/random_checkpoint.h"
#include "eagle3/status.h"

namespace {

// The built-in demo model: every DeepSeek-V2 feature on at a size that writes in a blink — q-LoRA,
// YaRN, one dense layer then MoE with group-limited routing and shared experts, a vocab that needs
// padding at TP=8, and dims that shard 8 ways.
constexpr std::string_view kDemoConfig = R"json({
  "architectures": ["DeepseekV2ForCausalLM"],
  "model_type": "deepseek_v2",
  "vocab_size": 1000,
  "hidden_size": 256,
  "intermediate_size": 512,
  "moe_intermediate_size": 64,
  "num_hidden_layers": 4,
  "num_attention_heads": 8,
  "num_key_value_heads": 8,
  "n_routed_experts": 16,
  "n_shared_experts": 2,
  "num_experts_per_tok": 4,
  "routed_scaling_factor": 16.0,
  "scoring_func": "softmax",
  "topk_method": "group_limited_greedy",
  "n_group": 4,
  "topk_group": 2,
  "norm_topk_prob": false,
  "first_k_dense_replace": 1,
  "moe_layer_freq": 1,
  "q_lora_rank": 96,
  "kv_lora_rank": 64,
  "qk_nope_head_dim": 32,
  "qk_rope_head_dim": 16,
  "v_head_dim": 32,
  "hidden_act": "silu",
  "rms_norm_eps": 1e-6,
  "max_position_embeddings": 8192,
  "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048,
                   "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707},
  "tie_word_embeddings": false,
  "bos_token_id": 0,
  "eos_token_id": 1
})json";

struct Flags {
  std::string dir;     // where to write the random checkpoint (default: a temp dir, removed)
  std::string target;  // inspect this checkpoint instead of generating one
  uint64_t seed = 0;
  int tp = 8;
  int rank = 0;
  int shards = 2;
};

void Usage(const char* argv0) {
  std::printf(
      "usage: %s [--target DIR] [--dir DIR] [--seed N] [--shards N] [--tp N] [--rank R]\n"
      "  --target DIR  inspect an existing DeepSeek-V2/V3/Kimi-K2 checkpoint directory\n"
      "  --dir DIR     write the random demo checkpoint here and keep it (default: temp, removed)\n"
      "  --seed N      random weights seed (default 0)\n"
      "  --shards N    safetensors shards of the demo checkpoint (default 2)\n"
      "  --tp N        tensor-parallel size to load for (default 8)\n"
      "  --rank R      which rank's slice to load (default 0)\n",
      argv0);
}

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      Usage(argv[0]);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n", argv[i]);
      return false;
    }
    const std::string value = argv[++i];
    char* end = nullptr;
    const long long number = std::strtoll(value.c_str(), &end, 10);
    const bool numeric = end != value.c_str() && *end == '\0';
    if (arg == "--dir") {
      flags->dir = value;
    } else if (arg == "--target") {
      flags->target = value;
    } else if (arg == "--seed" && numeric && number >= 0) {
      flags->seed = static_cast<uint64_t>(number);
    } else if (arg == "--tp" && numeric && number >= 1 && number <= 64) {
      flags->tp = static_cast<int>(number);
    } else if (arg == "--rank" && numeric && number >= 0 && number < 64) {
      flags->rank = static_cast<int>(number);
    } else if (arg == "--shards" && numeric && number >= 1 && number <= 1000) {
      flags->shards = static_cast<int>(number);
    } else {
      std::fprintf(stderr, "bad flag or value: %s %s\n", std::string(arg).c_str(), value.c_str());
      return false;
    }
  }
  if (flags->rank >= flags->tp) {
    std::fprintf(stderr, "--rank %d must be < --tp %d\n", flags->rank, flags->tp);
    return false;
  }
  return true;
}

// Groups a tensor name into the kind shown in the summary table.
std::string KindOf(const std::string& name) {
  auto has = [&](std::string_view s) { return name.find(s) != std::string::npos; };
  if (has("embed_tokens")) return "embedding";
  if (has("lm_head")) return "lm_head";
  if (has("layernorm") || has("norm.weight")) return "norms";
  if (has("self_attn")) return "attention (MLA)";
  if (has("shared_experts")) return "shared experts";
  if (has("experts.")) return "routed experts";
  if (has("mlp.gate.")) return "router";
  return "dense MLP";
}

std::string Megabytes(double bytes) {
  char s[32];
  std::snprintf(s, sizeof(s), "%.2f MB", bytes / 1e6);
  return s;
}

absl::Status Run(const Flags& flags) {
  std::string dir = flags.target;
  bool remove_dir = false;
  if (dir.empty()) {
    EAGLE3_ASSIGN_OR_RETURN(auto demo, eagle3::DeepseekV2Config::FromJson(kDemoConfig, "built-in demo config"));
    dir = flags.dir;
    if (dir.empty()) {
      dir = (std::filesystem::temp_directory_path() /
             ("eagle3-demo-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count())))
                .string();
      remove_dir = true;
    }
    eagle3::RandomCheckpointOptions options;
    options.seed = flags.seed;
    options.num_shards = flags.shards;
    const auto start = std::chrono::steady_clock::now();
    EAGLE3_RETURN_IF_ERROR(eagle3::WriteRandomDeepseekV2Checkpoint(demo, dir, options));
    std::printf("wrote a random DeepSeek-V2-shaped checkpoint to %s (%d shard%s, bf16) in %.0f ms\n",
                dir.c_str(), flags.shards, flags.shards == 1 ? "" : "s",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      if (!dir.empty()) std::filesystem::remove_all(dir);
    }
  } cleanup{remove_dir ? dir : ""};

  EAGLE3_ASSIGN_OR_RETURN(auto config, eagle3::DeepseekV2Config::FromFile(dir));
  EAGLE3_RETURN_IF_ERROR(config.ValidateForTp(flags.tp));
  EAGLE3_ASSIGN_OR_RETURN(auto checkpoint, eagle3::Checkpoint::Open(dir));

  int moe_layers = 0;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) moe_layers += config.IsMoeLayer(l) ? 1 : 0;
  const auto& s = config.rope.scaling;
  std::printf("\nconfig (%s)\n", config.source.c_str());
  std::printf("  model_type %s: %lld layers (%lld dense, %d MoE), hidden %lld, %lld heads, vocab %lld\n",
              std::string(eagle3::DeepseekModelTypeName(config.model_type)).c_str(),
              static_cast<long long>(config.num_hidden_layers),
              static_cast<long long>(config.num_hidden_layers - moe_layers), moe_layers,
              static_cast<long long>(config.hidden_size), static_cast<long long>(config.num_attention_heads),
              static_cast<long long>(config.vocab_size));
  std::printf("  MLA: q_lora_rank %s, kv_lora_rank %lld, qk nope/rope %lld/%lld, v %lld, latent row %lld\n",
              config.q_lora_rank ? std::to_string(*config.q_lora_rank).c_str() : "null (q_proj)",
              static_cast<long long>(config.kv_lora_rank), static_cast<long long>(config.qk_nope_head_dim),
              static_cast<long long>(config.qk_rope_head_dim), static_cast<long long>(config.v_head_dim),
              static_cast<long long>(config.latent_cache_width()));
  std::printf("  RoPE: theta %g, scaling %s x%g, softmax scale %.6f\n", config.rope.theta,
              std::string(eagle3::RopeScalingTypeName(s.type)).c_str(), s.factor, config.SoftmaxScale());
  if (config.is_moe()) {
    std::printf("  MoE: %lld experts (+%lld shared), top-%lld, %s/%s, groups %lld keep %lld, "
                "norm_topk_prob %s, routed_scaling_factor %g\n",
                static_cast<long long>(*config.n_routed_experts), static_cast<long long>(config.n_shared_experts),
                static_cast<long long>(config.num_experts_per_tok),
                std::string(eagle3::ScoringFuncName(config.scoring_func)).c_str(),
                std::string(eagle3::TopkMethodName(config.topk_method)).c_str(),
                static_cast<long long>(config.n_group), static_cast<long long>(config.topk_group),
                config.norm_topk_prob ? "true" : "false", config.routed_scaling_factor);
  }

  // Every expected tensor present with its expected shape; anything else in the files is reported.
  const std::vector<eagle3::WeightSpec> specs = eagle3::DeepseekV2Weights(config);
  std::map<std::string, int> expected;
  int missing = 0, wrong_shape = 0;
  for (const auto& spec : specs) {
    expected[spec.name] = 1;
    if (!checkpoint->Has(spec.name)) {
      if (++missing <= 5) std::printf("  missing tensor: %s\n", spec.name.c_str());
      continue;
    }
    if (absl::Status st = checkpoint->ExpectShape(spec.name, spec.shape); !st.ok()) {
      if (++wrong_shape <= 5) std::printf("  %s\n", std::string(st.message()).c_str());
    }
  }
  int unexpected = 0;
  for (const std::string& name : checkpoint->TensorNames()) unexpected += expected.count(name) ? 0 : 1;
  std::printf("\ncheckpoint %s\n  tensors: %zu expected, %d missing, %d wrong shape, %d not used by the "
              "target forward\n",
              dir.c_str(), specs.size(), missing, wrong_shape, unexpected);
  if (missing > 0 || wrong_shape > 0) {
    return absl::FailedPreconditionError("checkpoint does not match its config (see above)");
  }

  // Load rank `flags.rank`'s slice of every tensor, as that rank's loader would.
  struct KindStats {
    int tensors = 0;
    double params = 0, full_bytes = 0, shard_bytes = 0;
  };
  std::map<std::string, KindStats> kinds;
  KindStats total;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& spec : specs) {
    EAGLE3_ASSIGN_OR_RETURN(eagle3::TensorInfo info, checkpoint->Info(spec.name));
    EAGLE3_ASSIGN_OR_RETURN(eagle3::Tensor shard,
                            checkpoint->ReadShard(spec.name, spec.ForRank(flags.tp, flags.rank), info.dtype));
    KindStats& k = kinds[KindOf(spec.name)];
    for (KindStats* t : {&k, &total}) {
      t->tensors += 1;
      t->params += static_cast<double>(spec.shape.numel());
      t->full_bytes += static_cast<double>(info.end - info.begin);
      t->shard_bytes += static_cast<double>(shard.nbytes());
    }
  }
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  std::printf("\n  %-18s %8s %14s %12s %16s\n", "kind", "tensors", "parameters", "full", "TP rank slice");
  for (const auto& [name, k] : kinds) {
    std::printf("  %-18s %8d %14.0f %12s %16s\n", name.c_str(), k.tensors, k.params,
                Megabytes(k.full_bytes).c_str(), Megabytes(k.shard_bytes).c_str());
  }
  std::printf("  %-18s %8d %14.0f %12s %16s\n", "total", total.tensors, total.params,
              Megabytes(total.full_bytes).c_str(), Megabytes(total.shard_bytes).c_str());
  std::printf("\nTP=%d rank %d loaded its slice of every tensor in %.1f ms; vocab %lld padded to %lld "
              "(%lld rows per rank)\n",
              flags.tp, flags.rank, load_ms, static_cast<long long>(config.vocab_size),
              static_cast<long long>(eagle3::PaddedSize(config.vocab_size, eagle3::kVocabPadPerRank * flags.tp)),
              static_cast<long long>(eagle3::PaddedSize(config.vocab_size, eagle3::kVocabPadPerRank * flags.tp) /
                                     flags.tp));
  std::printf("(decoding arrives with the target and draft models; this build loads and checks weights)\n");
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    Usage(argv[0]);
    return 2;
  }
  const absl::Status status = Run(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "eagle3-decode: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
