#include "eagle3/testing/random_draft_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "eagle3/draft_model.h"
#include "eagle3/eagle3_draft_config.h"
#include "eagle3/mla_draft_config.h"
#include "eagle3/mla_draft_weights.h"
#include "eagle3/safetensors_writer.h"
#include "eagle3/status.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_convert.h"

namespace eagle3 {
namespace {

uint64_t NameHash(std::string_view s) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (char ch : s) {
    h ^= static_cast<uint8_t>(ch);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Linear weights N(0, 1/in_features), vectors (RMSNorm weights) N(1, 0.1²), embedding N(0, 1);
// tiled: the first kRandomDraftTileValues values repeated.
absl::StatusOr<Tensor> RandomWeight(const std::string& name, const Shape& shape, uint64_t seed, DType dtype,
                                    bool tiled, float scale) {
  EAGLE3_ASSIGN_OR_RETURN(Tensor values, Tensor::Empty(DType::kF32, shape));
  std::mt19937_64 rng(seed ^ NameHash(name));
  const bool vector = shape.rank() == 1;
  const bool table = name == "embed_tokens.weight";
  std::normal_distribution<float> dist(vector ? 1.0f : 0.0f,
                                       vector ? 0.1f : table ? 1.0f : 1.0f / std::sqrt(static_cast<float>(shape[1])));
  float* v = values.data_as<float>();
  const int64_t drawn = tiled ? std::min(values.numel(), kRandomDraftTileValues) : values.numel();
  for (int64_t i = 0; i < drawn; ++i) v[i] = dist(rng);
  for (int64_t i = drawn; i < values.numel(); i += drawn) {
    std::copy_n(v, std::min(drawn, values.numel() - i), v + i);
  }
  if (scale != 1.0f) {
    for (int64_t i = 0; i < values.numel(); ++i) v[i] *= scale;
  }
  if (dtype == DType::kF32) return values;
  EAGLE3_ASSIGN_OR_RETURN(Tensor converted, Tensor::Empty(dtype, shape));
  EAGLE3_RETURN_IF_ERROR(ConvertTensor(values, converted));
  return converted;
}

// The draft's rope in the hub form Llama configs use (rope_scaling names its type "rope_type").
nlohmann::json RopeScalingJson(const RopeScaling& s) {
  if (s.type == RopeScaling::Type::kNone) return nullptr;
  nlohmann::json j = {{"rope_type", std::string(RopeScalingTypeName(s.type))}, {"factor", s.factor}};
  if (s.type == RopeScaling::Type::kLinear) return j;
  j["original_max_position_embeddings"] = s.original_max_position_embeddings;
  if (s.type == RopeScaling::Type::kYarn) {
    j["beta_fast"] = s.beta_fast;
    j["beta_slow"] = s.beta_slow;
    // Llama YaRN configs state neither; both engines then use 0.1 ln(factor) + 1 as the cos/sin factor.
    if (s.mscale != 1.0) j["mscale"] = s.mscale;
    if (s.mscale_all_dim != 0.0) j["mscale_all_dim"] = s.mscale_all_dim;
    if (s.attention_factor.has_value()) j["attention_factor"] = *s.attention_factor;
  } else {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
  }
  return j;
}

}  // namespace

absl::Status WriteRandomEagle3DraftCheckpoint(const DeepseekV2Config& target, const std::string& dir,
                                              const RandomDraftCheckpointOptions& options) {
  const RandomDraftCheckpointOptions& o = options;
  if (o.dtype != DType::kF32 && o.dtype != DType::kF16 && o.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("random draft checkpoint dtype must be f32, f16 or bf16, got " +
                                      std::string(DTypeName(o.dtype)));
  }
  if (!(o.final_norm_scale > 0.0) || !std::isfinite(o.final_norm_scale)) {
    return absl::InvalidArgumentError("random draft checkpoint: final_norm_scale must be finite and > 0, got " +
                                      std::to_string(o.final_norm_scale));
  }
  const int64_t hidden = o.hidden_size > 0 ? o.hidden_size : target.hidden_size;
  const int64_t heads = o.num_attention_heads;
  if (heads < 1 || (!o.mla.has_value() && o.head_dim <= 0 && hidden % heads != 0)) {
    return absl::InvalidArgumentError("random draft checkpoint: num_attention_heads " + std::to_string(heads) +
                                      " does not divide hidden_size " + std::to_string(hidden) +
                                      " and no head_dim is given");
  }
  nlohmann::json j;
  if (o.mla.has_value()) {
    if (o.rope.scaling.type != RopeScaling::Type::kNone || o.norm_before_fc) {
      return absl::InvalidArgumentError(
          "random MLA draft checkpoint: rope scaling and norm_before_fc are not written for MLA drafts");
    }
    j["architectures"] = {"Eagle3DeepseekV2ForCausalLM"};
    j["model_type"] = "kimi_k2";
    j["q_lora_rank"] = o.mla->q_lora_rank.has_value() ? nlohmann::json(*o.mla->q_lora_rank) : nlohmann::json();
    j["kv_lora_rank"] = o.mla->kv_lora_rank;
    j["qk_nope_head_dim"] = o.mla->qk_nope_head_dim;
    j["qk_rope_head_dim"] = o.mla->qk_rope_head_dim;
    j["v_head_dim"] = o.mla->v_head_dim;
  } else {
    j["architectures"] = {"LlamaForCausalLMEagle3"};
    j["model_type"] = "llama";
    j["num_key_value_heads"] = o.num_key_value_heads;
    j["head_dim"] = o.head_dim > 0 ? o.head_dim : hidden / heads;
  }
  j["hidden_size"] = hidden;
  j["target_hidden_size"] = target.hidden_size;
  j["num_attention_heads"] = heads;
  j["intermediate_size"] = o.intermediate_size > 0 ? o.intermediate_size : 2 * hidden;
  j["vocab_size"] = target.vocab_size;
  j["draft_vocab_size"] = o.draft_vocab_size > 0 ? o.draft_vocab_size : (target.vocab_size + 1) / 2;
  j["rms_norm_eps"] = o.rms_norm_eps;
  j["max_position_embeddings"] = o.max_position_embeddings;
  j["num_hidden_layers"] = 1;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = false;
  j["rope_theta"] = o.rope.theta;
  j["rope_scaling"] = RopeScalingJson(o.rope.scaling);
  j["torch_dtype"] = o.dtype == DType::kF32 ? "float32" : o.dtype == DType::kF16 ? "float16" : "bfloat16";
  j["eagle_config"] = {{"use_aux_hidden_state", true}};
  if (!o.aux_layer_ids.empty()) j["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = o.aux_layer_ids;
  const std::pair<const char*, bool> variants[] = {{"norm_before_residual", o.norm_before_residual},
                                                   {"norm_before_fc", o.norm_before_fc},
                                                   {"fc_norm", o.fc_norm},
                                                   {"norm_output", o.norm_output}};
  for (const auto& [key, on] : variants) {
    if (on) j[key] = true;
  }
  const std::string text = j.dump(2) + "\n";
  // The parser validates the options and yields the config the schema is derived from.
  std::vector<WeightSpec> specs;
  int64_t vocab = 0, draft_vocab = 0;
  if (o.mla.has_value()) {
    EAGLE3_ASSIGN_OR_RETURN(MlaDraftConfig config, MlaDraftConfig::FromJson(text, "random draft config"));
    specs = MlaDraftWeights(config, o.layer_prefix);
    if (o.write_embed_tokens) specs.push_back(MlaDraftEmbeddingWeight(config));
    vocab = config.vocab_size;
    draft_vocab = config.draft_vocab_size;
  } else {
    EAGLE3_ASSIGN_OR_RETURN(Eagle3DraftConfig config, Eagle3DraftConfig::FromJson(text, "random draft config"));
    specs = Eagle3DraftWeights(config, o.layer_prefix);
    if (o.write_embed_tokens) specs.push_back(WeightSpec{"embed_tokens.weight", Shape{config.vocab_size, hidden}});
    vocab = config.vocab_size;
    draft_vocab = config.draft_vocab_size;
  }

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError("cannot create directory '" + dir + "': " + ec.message());
  const std::filesystem::path root(dir);
  {
    std::ofstream out(root / "config.json", std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return absl::InternalError("cannot write '" + (root / "config.json").string() + "'");
  }

  std::vector<Tensor> tensors;
  std::vector<NamedTensor> named;
  for (const WeightSpec& spec : specs) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor t, RandomWeight(spec.name, spec.shape, o.seed, o.dtype, o.tiled_values,
                                                         spec.name == "norm.weight"
                                                             ? static_cast<float>(o.final_norm_scale)
                                                             : 1.0f));
    tensors.push_back(std::move(t));
  }
  for (size_t i = 0; i < specs.size(); ++i) named.push_back({specs[i].name, tensors[i]});

  // A random subset of the target vocabulary, in increasing order (as SpecForge builds it from token
  // frequencies and sorts), stored as offsets.
  std::vector<int64_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  std::mt19937_64 rng(o.seed ^ NameHash("d2t"));
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<size_t>(draft_vocab));
  std::sort(ids.begin(), ids.end());
  EAGLE3_ASSIGN_OR_RETURN(Tensor d2t, Tensor::Empty(DType::kI64, Shape{draft_vocab}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor t2d, Tensor::Zeros(DType::kBool, Shape{vocab}));
  for (int64_t i = 0; i < draft_vocab; ++i) {
    d2t.data_as<int64_t>()[i] = ids[static_cast<size_t>(i)] - i;
    t2d.data_as<uint8_t>()[ids[static_cast<size_t>(i)]] = 1;
  }
  named.push_back({"d2t", d2t});
  if (o.write_t2d) named.push_back({"t2d", t2d});
  return WriteSafetensors((root / "model.safetensors").string(), named, {{"format", "pt"}});
}

}  // namespace eagle3
