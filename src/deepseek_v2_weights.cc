#include "eagle3/deepseek_v2_weights.h"

#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/mla_attention_weights.h"

namespace eagle3 {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The layer index of a "model.layers.<k>.<rest>" name; -1 for any other name.
int64_t LayerIndex(std::string_view name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return -1;
  name.remove_prefix(kPrefix.size());
  int64_t layer = 0;
  size_t digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') {
    if (digits == 9) return -1;  // no model has a billion layers
    layer = layer * 10 + (name[digits] - '0');
    ++digits;
  }
  if (digits == 0 || digits == name.size() || name[digits] != '.') return -1;
  if (digits > 1 && name[0] == '0') return -1;  // "model.layers.01." is not layer 1
  return layer;
}

// A tensor of an MTP (multi-token prediction) layer: DeepSeek-V3 stores num_nextn_predict_layers
// of them after the main layers (model.layers.61.* for V3). The target forward does not use them;
// they are known, deliberately ignored here, and left for an MTP drafter.
bool IsMtpTensor(std::string_view name, const DeepseekV2Config& config) {
  if (config.num_nextn_predict_layers <= 0) return false;
  const int64_t layer = LayerIndex(TextModelTensorName(name, config));
  return layer >= config.num_hidden_layers &&
         layer < config.num_hidden_layers + config.num_nextn_predict_layers;
}

// A tensor of Kimi-K2.5's vision tower or of its projector into the language model, stored next to
// the language model in the multimodal checkpoint (the published tensor list: vision_tower.patch_embed
// / encoder.blocks.<k> / encoder.final_layernorm, mm_projector.pre_norm / proj.0 / proj.2; vLLM's
// kimi_k25.py loads them under the same names). eagle3 serves text only: known, deliberately
// ignored.
bool IsVisionTensor(std::string_view name, const DeepseekV2Config& config) {
  if (config.tensor_prefix != kKimiK25TensorPrefix) return false;
  return name.starts_with("vision_tower.") || name.starts_with("mm_projector.");
}

// Names that only quantized checkpoints carry (FP8 block scales, compressed-tensors packing).
bool LooksQuantized(std::string_view name) {
  return EndsWith(name, "weight_scale_inv") || EndsWith(name, "weight_scale") ||
         EndsWith(name, "weight_packed");
}

}  // namespace

ShardSpec WeightSpec::ForRank(int tp_size, int rank) const {
  ShardSpec spec;
  if (split == TpSplit::kReplicated) return spec;  // tp_size 1, rank 0: the whole tensor
  spec.dim = split == TpSplit::kRows ? 0 : 1;
  spec.tp_size = tp_size;
  spec.rank = rank;
  spec.pad_to_multiple = vocab_padded ? kVocabPadPerRank * tp_size : 1;
  return spec;
}

namespace {
constexpr std::string_view kEmbedding = "model.embed_tokens.weight";
}  // namespace

std::string DeepseekEmbeddingName(const DeepseekV2Config& config) {
  return config.tensor_prefix + std::string(kEmbedding);
}

absl::StatusOr<Shape> WeightSpec::RankShape(int tp_size) const {
  if (tp_size < 1 || tp_size > 64) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': tp_size ", tp_size,
                                                   " is out of range [1, 64]"));
  }
  if (split == TpSplit::kReplicated) return shape;
  const int dim = split == TpSplit::kRows ? 0 : 1;
  if (dim >= shape.rank()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' of shape ", shape.ToString(),
                                                   " has no dim ", dim, " to split"));
  }
  const int64_t padded = vocab_padded ? PaddedSize(shape[dim], kVocabPadPerRank * tp_size) : shape[dim];
  if (padded % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' of shape ", shape.ToString(),
                                                   ": dim ", dim, " = ", shape[dim],
                                                   " is not divisible by tp_size ", tp_size));
  }
  Shape out = shape;
  out[dim] = padded / tp_size;
  return out;
}

void AppendSiluMlpWeights(std::string_view prefix, int64_t hidden, int64_t intermediate,
                          std::vector<WeightSpec>& specs) {
  const std::string p(prefix);
  specs.push_back(WeightSpec{p + "gate_proj.weight", Shape{intermediate, hidden}, TpSplit::kRows});
  specs.push_back(WeightSpec{p + "up_proj.weight", Shape{intermediate, hidden}, TpSplit::kRows});
  specs.push_back(WeightSpec{p + "down_proj.weight", Shape{hidden, intermediate}, TpSplit::kColumns});
}

void AppendMoeWeights(std::string_view prefix, int64_t hidden, int64_t experts, int64_t moe_intermediate,
                      int64_t shared_experts, bool correction_bias, std::vector<WeightSpec>& specs) {
  const std::string m(prefix);
  specs.push_back(WeightSpec{m + "gate.weight", Shape{experts, hidden}, TpSplit::kReplicated});
  if (correction_bias) {
    specs.push_back(WeightSpec{m + "gate.e_score_correction_bias", Shape{experts}, TpSplit::kReplicated});
  }
  for (int64_t e = 0; e < experts; ++e) {
    AppendSiluMlpWeights(absl::StrCat(m, "experts.", e, "."), hidden, moe_intermediate, specs);
  }
  if (shared_experts > 0) {
    AppendSiluMlpWeights(m + "shared_experts.", hidden, moe_intermediate * shared_experts, specs);
  }
}

std::vector<WeightSpec> DeepseekDecoderLayerWeights(const DeepseekV2Config& c, int64_t layer) {
  const int64_t h = c.hidden_size;
  const std::string p = absl::StrCat(c.tensor_prefix, "model.layers.", layer, ".");
  std::vector<WeightSpec> specs = {
      WeightSpec{p + "input_layernorm.weight", Shape{h}, TpSplit::kReplicated},
      WeightSpec{p + "post_attention_layernorm.weight", Shape{h}, TpSplit::kReplicated},
  };
  for (WeightSpec& spec : MlaAttentionWeights(MlaAttentionConfig::ForTarget(c), p + "self_attn.")) {
    specs.push_back(std::move(spec));
  }
  const std::string m = p + "mlp.";
  if (!c.IsMoeLayer(layer)) {
    AppendSiluMlpWeights(m, h, c.intermediate_size, specs);
    return specs;
  }
  AppendMoeWeights(m, h, *c.n_routed_experts, c.moe_intermediate_size, c.n_shared_experts,
                   c.topk_method == TopkMethod::kNoauxTc, specs);
  return specs;
}

std::vector<WeightSpec> DeepseekV2Weights(const DeepseekV2Config& c) {
  const int64_t h = c.hidden_size;
  const std::string& prefix = c.tensor_prefix;
  std::vector<WeightSpec> specs = {WeightSpec{DeepseekEmbeddingName(c), Shape{c.vocab_size, h}, TpSplit::kRows,
                                              /*vocab_padded=*/true}};
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    for (WeightSpec& spec : DeepseekDecoderLayerWeights(c, layer)) specs.push_back(std::move(spec));
  }
  specs.push_back(WeightSpec{prefix + "model.norm.weight", Shape{h}, TpSplit::kReplicated});
  if (!c.tie_word_embeddings) {
    specs.push_back(WeightSpec{prefix + "lm_head.weight", Shape{c.vocab_size, h}, TpSplit::kRows,
                               /*vocab_padded=*/true});
  }
  return specs;
}

std::string_view TextModelTensorName(std::string_view name, const DeepseekV2Config& config) {
  if (!name.starts_with(config.tensor_prefix)) return {};
  return name.substr(config.tensor_prefix.size());
}

absl::Status CheckNoUnknownTensors(const Checkpoint& checkpoint, const DeepseekV2Config& config,
                                   const std::vector<WeightSpec>& specs) {
  // The stored tensors of each weight: its scales and packing under the quantization_config.
  std::unordered_set<std::string> known;
  known.reserve(specs.size());
  const std::vector<StoredForm> forms = StoredForms(config, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (std::string& name : StoredTensorNames(specs[i], forms[i])) known.insert(std::move(name));
  }
  // Everything else is refused, including HF-style non-persistent buffers such as
  // `rotary_emb.inv_freq`: DeepSeek-V2/V3 hub checkpoints do not carry them, and eagle3 computes
  // RoPE from config.json, so such a tensor means a checkpoint from some other pipeline.
  std::string first;
  std::string quantized;  // the first unknown tensor with a quantization name, if any
  int64_t unknown = 0;
  for (const std::string& name : checkpoint.TensorNames()) {
    if (known.count(name) != 0 || IsMtpTensor(name, config) || IsVisionTensor(name, config)) continue;
    if (unknown++ == 0) first = name;
    if (quantized.empty() && LooksQuantized(name)) quantized = name;
  }
  if (unknown == 0) return absl::OkStatus();
  const absl::StatusOr<std::string> file = checkpoint.FileOf(first);
  std::string message = absl::StrCat(
      "checkpoint '", checkpoint.dir(), "': tensor '", first, "' in '",
      file.ok() ? *file : std::string("?"), "' is not used by the model that ", config.source,
      " describes; refusing to ignore it");
  if (unknown > 1) {
    absl::StrAppend(&message, " (and ", unknown - 1, " more unknown tensor",
                    unknown > 2 ? "s" : "", ")");
  }
  if (!quantized.empty() && !config.quantization.quantized()) {
    absl::StrAppend(&message, ". Hint: the checkpoint looks quantized (tensor '", quantized,
                    "') but ", config.source,
                    " has no quantization_config, so it would run without its scales. Restore "
                    "the quantization_config it was published with, or use a bf16 conversion");
  } else if (!quantized.empty()) {
    absl::StrAppend(&message, ". Hint: tensor '", quantized, "' stores a quantized weight that ",
                    config.source, "'s quantization_config (",
                    config.quantization.Describe(), ") leaves unquantized");
  }
  return absl::InvalidArgumentError(message);
}

}  // namespace eagle3
