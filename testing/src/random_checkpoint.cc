#include "eagle3/testing/random_checkpoint.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/testing/deepseek_v2_config_writer.h"
#include "eagle3/testing/random_quantized_weights.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/mtp_config.h"
#include "eagle3/mtp_weights.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_convert.h"

namespace eagle3 {
namespace {

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : s) {
    h ^= static_cast<uint8_t>(ch);
    h *= 0x100000001b3ull;
  }
  return h;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// `seed`: the checkpoint's seed mixed with the tensor's name.
absl::StatusOr<Tensor> RandomTensor(const WeightSpec& spec, uint64_t seed, DType dtype) {
  EAGLE3_ASSIGN_OR_RETURN(Tensor values, Tensor::Empty(DType::kF32, spec.shape));
  std::mt19937_64 rng(seed);
  float* v = values.data_as<float>();
  const int64_t n = values.numel();
  if (EndsWith(spec.name, "e_score_correction_bias")) {
    std::uniform_real_distribution<float> dist(0.0f, 0.1f);
    for (int64_t i = 0; i < n; ++i) v[i] = dist(rng);
  } else if (spec.shape.rank() == 1) {  // RMSNorm weights
    std::normal_distribution<float> dist(1.0f, 0.1f);
    for (int64_t i = 0; i < n; ++i) v[i] = dist(rng);
  } else {
    const bool table = EndsWith(spec.name, "embed_tokens.weight");
    const float std_dev = table ? 1.0f : 1.0f / std::sqrt(static_cast<float>(spec.shape[1]));
    std::normal_distribution<float> dist(0.0f, std_dev);
    for (int64_t i = 0; i < n; ++i) v[i] = dist(rng);
  }
  if (dtype == DType::kF32) return values;
  EAGLE3_ASSIGN_OR_RETURN(Tensor converted, Tensor::Empty(dtype, spec.shape));
  EAGLE3_RETURN_IF_ERROR(ConvertTensor(values, converted));
  return converted;
}

// A few tensors of Kimi-K2.5's vision tower and projector, named as the published checkpoint names
// them (tiny shapes): the loader must skip them deliberately.
absl::Status AddVisionTensors(uint64_t seed, DType dtype, std::vector<std::pair<std::string, Tensor>>& tensors) {
  const WeightSpec vision[] = {
      {"vision_tower.patch_embed.proj.weight", Shape{8, 3, 2, 2}},
      {"vision_tower.encoder.blocks.0.wqkv.weight", Shape{24, 8}},
      {"mm_projector.pre_norm.weight", Shape{8}},
      {"mm_projector.proj.0.weight", Shape{32, 32}},
  };
  for (const WeightSpec& spec : vision) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor t, RandomTensor(spec, seed ^ Fnv1a(spec.name), dtype));
    tensors.emplace_back(spec.name, std::move(t));
  }
  return absl::OkStatus();
}

// Appends the MTP modules' tensors to `specs` and, to `values_of`, the spec each takes its values
// from: the module's own tensors their own, its copies of the embedding and head the target's (the
// embedding for a tied head), so that they are copies as in DeepSeek-V3's checkpoint.
absl::Status AppendMtpModules(const DeepseekV2Config& config, std::vector<WeightSpec>& specs,
                              std::vector<WeightSpec>& values_of) {
  EAGLE3_ASSIGN_OR_RETURN(MtpConfig mtp, MtpConfig::FromTarget(config));
  const WeightSpec embedding = specs.front();
  const WeightSpec head = config.tie_word_embeddings ? embedding : specs.back();
  for (int64_t k = 0; k < mtp.num_modules; ++k) {
    for (const WeightSpec& spec : MtpModuleWeights(config, mtp, k)) {
      specs.push_back(spec);
      values_of.push_back(spec);
    }
    const std::vector<WeightSpec> copies = MtpSharedCopyWeights(config, mtp, k);
    specs.push_back(copies[0]);
    values_of.push_back(embedding);
    specs.push_back(copies[1]);
    values_of.push_back(head);
  }
  return absl::OkStatus();
}

std::string ShardFileName(int index, int count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", index + 1, count);
  return name;
}

absl::Status WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError("cannot write '" + path.string() + "'");
  return absl::OkStatus();
}

// Safetensors files of one checkpoint directory, and the index that maps their tensors.
class ShardedWriter {
 public:
  explicit ShardedWriter(std::filesystem::path root) : root_(std::move(root)) {}

  absl::Status Write(const std::string& file, const std::vector<std::pair<std::string, Tensor>>& tensors) {
    std::vector<NamedTensor> named;
    for (const auto& [name, t] : tensors) {
      named.push_back({name, t});
      weight_map_[name] = file;
      total_bytes_ += t.nbytes();
    }
    return WriteSafetensors((root_ / file).string(), named, {{"format", "pt"}});
  }

  absl::Status WriteIndex() const {
    const nlohmann::json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", weight_map_}};
    return WriteText(root_ / "model.safetensors.index.json", index.dump(2) + "\n");
  }

 private:
  std::filesystem::path root_;
  nlohmann::json weight_map_ = nlohmann::json::object();
  uint64_t total_bytes_ = 0;
};

}  // namespace

absl::Status WriteRandomDeepseekV2Checkpoint(const DeepseekV2Config& config, const std::string& dir,
                                             const RandomCheckpointOptions& options) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kF16 && options.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("random checkpoint dtype must be f32, f16 or bf16, got " +
                                      std::string(DTypeName(options.dtype)));
  }
  if (options.num_shards < 1) {
    return absl::InvalidArgumentError("random checkpoint num_shards must be >= 1, got " +
                                      std::to_string(options.num_shards));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError("cannot create directory '" + dir + "': " + ec.message());
  const std::filesystem::path root(dir);
  EAGLE3_RETURN_IF_ERROR(WriteText(root / "config.json", DeepseekV2ConfigToHubJson(config)));

  const bool twin = !options.dequantized_dir.empty();
  if (twin) {
    std::filesystem::create_directories(options.dequantized_dir, ec);
    if (ec) {
      return absl::InternalError("cannot create directory '" + options.dequantized_dir + "': " + ec.message());
    }
    DeepseekV2Config unquantized = config;
    unquantized.quantization = QuantizationConfig{};
    EAGLE3_RETURN_IF_ERROR(WriteText(std::filesystem::path(options.dequantized_dir) / "config.json",
                                     DeepseekV2ConfigToHubJson(unquantized)));
  }

  std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  // values_of[i]: the spec whose values spec i holds (itself, or for an MTP module's copy of the
  // embedding or head, the target's tensor it copies).
  std::vector<WeightSpec> values_of = specs;
  if (options.write_mtp) EAGLE3_RETURN_IF_ERROR(AppendMtpModules(config, specs, values_of));
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  uint64_t total_bytes = 0;
  for (const WeightSpec& s : specs) {
    total_bytes += static_cast<uint64_t>(s.shape.numel()) * DTypeSize(options.dtype);
  }
  const int shards = options.num_shards;
  const uint64_t bytes_per_shard = (total_bytes + shards - 1) / shards;

  ShardedWriter main_writer(root), twin_writer(options.dequantized_dir);
  size_t next = 0;
  for (int shard = 0; shard < shards; ++shard) {
    // Tensors for this shard are generated and written together, then freed: memory stays at about
    // one shard's size however large the model.
    std::vector<std::pair<std::string, Tensor>> tensors, twin_tensors;
    uint64_t bytes = 0;
    while (next < specs.size() && (shard == shards - 1 || bytes < bytes_per_shard)) {
      const size_t i = next++;
      const WeightSpec& spec = specs[i];
      // Seeded by the text model's name: a Kimi-K2.5-form checkpoint holds the same values as the
      // plain form of its text config.
      const uint64_t seed = options.seed ^ Fnv1a(TextModelTensorName(values_of[i].name, config));
      if (forms[i] == StoredForm::kPlain) {
        EAGLE3_ASSIGN_OR_RETURN(Tensor t, RandomTensor(values_of[i], seed, options.dtype));
        bytes += t.nbytes();
        if (twin) {
          EAGLE3_ASSIGN_OR_RETURN(Tensor copy, Tensor::Empty(t.dtype(), t.shape()));
          EAGLE3_RETURN_IF_ERROR(ConvertTensor(t, copy));
          twin_tensors.emplace_back(spec.name, std::move(copy));
        }
        tensors.emplace_back(spec.name, std::move(t));
        continue;
      }
      EAGLE3_ASSIGN_OR_RETURN(RandomQuantizedWeight q,
                              RandomQuantizedWeightOf(spec, forms[i], config.quantization, seed));
      for (auto& [name, t] : q.stored) {
        bytes += t.nbytes();
        tensors.emplace_back(std::move(name), std::move(t));
      }
      if (twin) twin_tensors.emplace_back(spec.name, std::move(q.dequantized));
    }
    if (shard == shards - 1 && config.tensor_prefix == kKimiK25TensorPrefix) {
      EAGLE3_RETURN_IF_ERROR(AddVisionTensors(options.seed, options.dtype, tensors));
      if (twin) EAGLE3_RETURN_IF_ERROR(AddVisionTensors(options.seed, options.dtype, twin_tensors));
    }
    const std::string file = shards == 1 ? "model.safetensors" : ShardFileName(shard, shards);
    EAGLE3_RETURN_IF_ERROR(main_writer.Write(file, tensors));
    if (twin) EAGLE3_RETURN_IF_ERROR(twin_writer.Write(file, twin_tensors));
  }
  if (shards == 1) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(main_writer.WriteIndex());
  return twin ? twin_writer.WriteIndex() : absl::OkStatus();
}

}  // namespace eagle3
