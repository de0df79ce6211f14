#include "eagle3/testing/random_checkpoint.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/testing/deepseek_v2_config_writer.h"
#include "eagle3/deepseek_v2_weights.h"
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

absl::StatusOr<Tensor> RandomTensor(const WeightSpec& spec, uint64_t seed, DType dtype) {
  EAGLE3_ASSIGN_OR_RETURN(Tensor values, Tensor::Empty(DType::kF32, spec.shape));
  std::mt19937_64 rng(seed ^ Fnv1a(spec.name));
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

  const std::vector<WeightSpec> specs = DeepseekV2Weights(config);
  uint64_t total_bytes = 0;
  for (const WeightSpec& s : specs) {
    total_bytes += static_cast<uint64_t>(s.shape.numel()) * DTypeSize(options.dtype);
  }
  const int shards = options.num_shards;
  const uint64_t bytes_per_shard = (total_bytes + shards - 1) / shards;

  nlohmann::json weight_map = nlohmann::json::object();
  size_t next = 0;
  for (int shard = 0; shard < shards; ++shard) {
    // Tensors for this shard are generated and written together, then freed: memory stays at about
    // one shard's size however large the model.
    std::vector<Tensor> tensors;
    std::vector<NamedTensor> named;
    uint64_t bytes = 0;
    while (next < specs.size() && (shard == shards - 1 || bytes < bytes_per_shard)) {
      const WeightSpec& spec = specs[next++];
      EAGLE3_ASSIGN_OR_RETURN(Tensor t, RandomTensor(spec, options.seed, options.dtype));
      bytes += t.nbytes();
      tensors.push_back(std::move(t));
    }
    const size_t first = next - tensors.size();
    for (size_t i = 0; i < tensors.size(); ++i) named.push_back({specs[first + i].name, tensors[i]});
    const std::string file = shards == 1 ? "model.safetensors" : ShardFileName(shard, shards);
    EAGLE3_RETURN_IF_ERROR(WriteSafetensors((root / file).string(), named, {{"format", "pt"}}));
    for (const NamedTensor& t : named) weight_map[t.name] = file;
  }
  if (shards == 1) return absl::OkStatus();
  const nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}},
                                {"weight_map", weight_map}};
  return WriteText(root / "model.safetensors.index.json", index.dump(2) + "\n");
}

}  // namespace eagle3
