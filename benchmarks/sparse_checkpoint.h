// Sparse DeepSeek-V2-family checkpoints for the benchmarks (decode_step_benchmark,
// e2e_benchmark, checkpoint_load_benchmark; draft_step_benchmark's MTP module and MLA-draft targets,
// which list only the tensors they read: SparseTensorsOf), unquantized or in a quantization_config's stored form: the embedding and each MoE
// router are N(0, 0.02²) bf16, norms are 1, every other matrix is a file hole (zeros; the file takes
// well under a gigabyte on disk whatever its size).
// Timing does not depend on the values of a GEMM's or an attention's operands; the random embedding
// and routers make the routing realistic (the residual stream is the embedding, every token routes
// to its own experts).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/half.h"

namespace eagle3::bench {

// DeepSeek-V2-Lite-Chat's hub config.json (auto_map and training-only keys left out).
inline constexpr const char* kV2LiteConfig = R"({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
 "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
 "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
 "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
 "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6,
 "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128,
 "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1,
 "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
 "type": "yarn"}, "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
 "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
 "vocab_size": 102400})";

// Where the benchmarks keep the checkpoints they write: $EAGLE3_BENCH_CKPT_DIR, default
// /tmp/eagle3-bench-ckpt.
inline std::string BenchCheckpointRoot() {
  const char* dir = std::getenv("EAGLE3_BENCH_CKPT_DIR");
  return dir != nullptr && dir[0] != '\0' ? dir : "/tmp/eagle3-bench-ckpt";
}

inline bool Ends(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// One tensor of a sparse checkpoint: what its bytes hold.
struct SparseTensor {
  enum class Fill { kHole, kOnes, kRandom, kValues };
  std::string name;
  const char* dtype = "BF16";  // safetensors dtype
  int64_t elem_bytes = 2;
  std::vector<int64_t> shape;
  Fill fill = Fill::kHole;
  std::vector<int32_t> values;  // kValues (an INT4 weight's weight_shape)
};

// The stored tensors of `specs` (weights of `config`: DeepseekV2Weights, MtpModuleWeights, or any
// list of them) as its quantization_config stores them (eagle3/detail/quantized_weights.h): plain
// weights in bf16; FP8 codes and their f32 scales; INT4 packed words, bf16 scales and the [out, in]
// weight_shape. Codes and scales are holes (zero weights: timing does not depend on them); plain
// norms are ones, and the plain weights `random(name)` selects N(0, 0.02²), the rest holes.
template <typename RandomFn>
std::vector<SparseTensor> SparseTensorsOf(const DeepseekV2Config& config, const std::vector<WeightSpec>& specs,
                                          RandomFn&& random) {
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  const QuantizationConfig& q = config.quantization;
  std::vector<SparseTensor> tensors;
  for (size_t i = 0; i < specs.size(); ++i) {
    const WeightSpec& s = specs[i];
    std::vector<int64_t> shape;
    for (int d = 0; d < s.shape.rank(); ++d) shape.push_back(s.shape[d]);
    const int64_t out = shape.front(), in = shape.back();
    if (forms[i] == StoredForm::kFp8Block) {
      tensors.push_back({s.name, "F8_E4M3", 1, shape});
      tensors.push_back({Fp8ScaleName(s.name), "F32", 4,
                         {(out + q.block_out - 1) / q.block_out, (in + q.block_in - 1) / q.block_in}});
      continue;
    }
    if (forms[i] == StoredForm::kInt4Packed) {
      tensors.push_back({Int4PackedName(s.name), "I32", 4, {out, (in + 7) / 8}});
      tensors.push_back({Int4ScaleName(s.name), "BF16", 2, {out, in / q.group_size}});
      tensors.push_back({Int4ShapeName(s.name), "I32", 4, {2}, SparseTensor::Fill::kValues,
                         {static_cast<int32_t>(out), static_cast<int32_t>(in)}});
      continue;
    }
    SparseTensor t{s.name, "BF16", 2, shape};
    if (Ends(s.name, "norm.weight")) {
      t.fill = SparseTensor::Fill::kOnes;
    } else if (random(s.name)) {
      t.fill = SparseTensor::Fill::kRandom;
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

// The whole target's tensors (DeepseekV2Weights): the embedding and each MoE router random (see the
// top of the file); random_lm_head: lm_head.weight too.
inline std::vector<SparseTensor> SparseTensors(const DeepseekV2Config& config, bool random_lm_head) {
  return SparseTensorsOf(config, DeepseekV2Weights(config), [&](const std::string& name) {
    return Ends(name, "embed_tokens.weight") || Ends(name, "mlp.gate.weight") ||
           (random_lm_head && Ends(name, "lm_head.weight"));
  });
}

// Values drawn per random tensor when tiled: a period that no row width of these models divides, so
// that the embedding rows of different tokens differ (each is a shifted window of the block).
inline constexpr int64_t kSparseTileValues = (int64_t{1} << 20) + 7;

// Writes bytes at offset, in as many pwrite calls as it takes (Linux moves at most 0x7ffff000 bytes
// per call, less than one tensor of K2's embedding). False on an error or a call that writes nothing.
inline bool PwriteAll(int fd, const void* data, size_t bytes, int64_t offset) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, p, bytes, offset);
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += n;
  }
  return true;
}

// Writes config.json and a single model.safetensors holding `tensors` in order (as the reader
// requires them contiguous in schema order), holes left unwritten, once: a `complete` marker makes
// later runs reuse the directory. tiled: each random tensor repeats its first kSparseTileValues
// draws (a gigabyte embedding written in a second or two instead of drawing every value).
inline absl::Status WriteSparseCheckpoint(const std::string& dir, const std::string& config_json,
                                          const std::vector<SparseTensor>& tensors, bool tiled = false) {
  if (std::filesystem::exists(dir + "/complete")) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config_json;
  std::string header = R"({"__metadata__":{"format":"pt"})";
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (const SparseTensor& t : tensors) {
    std::string shape;
    int64_t numel = 1;
    for (size_t d = 0; d < t.shape.size(); ++d) {
      shape += (d ? "," : "") + std::to_string(t.shape[d]);
      numel *= t.shape[d];
    }
    const int64_t bytes = t.elem_bytes * numel;
    header += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offsets.push_back(offset);
    offset += bytes;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';
  const std::string path = dir + "/model.safetensors";
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return absl::InternalError("cannot create " + path + ": " + std::strerror(errno));
  const uint64_t header_len = header.size();
  const int64_t data_start = 8 + static_cast<int64_t>(header_len);
  errno = 0;
  bool ok = PwriteAll(fd, &header_len, 8, 0) && PwriteAll(fd, header.data(), header.size(), 8);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<uint16_t> data;
  for (size_t i = 0; ok && i < tensors.size(); ++i) {
    const SparseTensor& t = tensors[i];
    if (t.fill == SparseTensor::Fill::kHole) continue;  // zeros
    if (t.fill == SparseTensor::Fill::kValues) {
      const size_t bytes = t.values.size() * sizeof(int32_t);
      ok = PwriteAll(fd, t.values.data(), bytes, data_start + offsets[i]);
      continue;
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    data.resize(static_cast<size_t>(numel));
    const size_t drawn = tiled ? static_cast<size_t>(std::min(numel, kSparseTileValues)) : data.size();
    for (size_t j = 0; j < drawn; ++j) {
      data[j] = t.fill == SparseTensor::Fill::kOnes ? FloatToBf16(1.0f) : FloatToBf16(dist(rng));
    }
    for (size_t j = drawn; j < data.size(); j += drawn) {
      std::copy_n(data.begin(), std::min(drawn, data.size() - j), data.begin() + static_cast<std::ptrdiff_t>(j));
    }
    const size_t bytes = data.size() * 2;
    ok = PwriteAll(fd, data.data(), bytes, data_start + offsets[i]);
  }
  ok = ok && ::ftruncate(fd, data_start + offset) == 0;
  ::close(fd);
  if (!ok) {
    return absl::InternalError("writing " + path + " failed: " +
                               (errno != 0 ? std::strerror(errno) : "a write stopped short"));
  }
  std::ofstream(dir + "/complete") << "ok\n";
  std::fprintf(stderr, "wrote %s (%.1f GB, sparse) in %.1f s\n", path.c_str(),
               static_cast<double>(data_start + offset) * 1e-9,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

// The whole target of `config` (SparseTensors), written once by WriteSparseCheckpoint.
// random_lm_head: lm_head.weight N(0, 0.02²) too, so that the greedy next token varies with the
// token (with every other matrix zero, the final hidden state is the token's embedding), instead of
// always being id 0.
inline absl::Status EnsureSparseCheckpoint(const std::string& dir, const std::string& config_json,
                                           const DeepseekV2Config& config, bool random_lm_head = false) {
  return WriteSparseCheckpoint(dir, config_json, SparseTensors(config, random_lm_head));
}

}  // namespace eagle3::bench
