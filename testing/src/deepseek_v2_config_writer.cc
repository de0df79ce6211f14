#include "eagle3/testing/deepseek_v2_config_writer.h"

#include <string>

#include <nlohmann/json.hpp>

namespace eagle3 {
namespace {

nlohmann::json RopeScalingJson(const RopeScaling& s) {
  if (s.type == RopeScaling::Type::kNone) return nullptr;
  nlohmann::json j = {{"type", std::string(RopeScalingTypeName(s.type))}, {"factor", s.factor}};
  if (s.original_max_position_embeddings > 0) {
    j["original_max_position_embeddings"] = s.original_max_position_embeddings;
  }
  if (s.type == RopeScaling::Type::kYarn) {
    j["beta_fast"] = s.beta_fast;
    j["beta_slow"] = s.beta_slow;
    j["mscale"] = s.mscale;
    j["mscale_all_dim"] = s.mscale_all_dim;
    if (s.attention_factor.has_value()) j["attention_factor"] = *s.attention_factor;
  }
  if (s.type == RopeScaling::Type::kLlama3) {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
  }
  return j;
}

// The two hub forms (see eagle3/quantization_config.h): DeepSeek-V3's FP8 object, and the
// compressed-tensors object of Kimi-K2-Thinking with its every key.
nlohmann::json QuantizationJson(const QuantizationConfig& q) {
  if (q.format == WeightFormat::kFp8Block) {
    nlohmann::json j = {{"activation_scheme", q.activation_scheme},
                        {"fmt", "e4m3"},
                        {"quant_method", "fp8"},
                        {"weight_block_size", {q.block_out, q.block_in}}};
    if (q.scale_fmt.has_value()) j["scale_fmt"] = *q.scale_fmt;
    return j;
  }
  const nlohmann::json weights = {{"actorder", nullptr},     {"block_structure", nullptr},
                                  {"dynamic", false},        {"group_size", q.group_size},
                                  {"num_bits", 4},           {"observer", "minmax"},
                                  {"observer_kwargs", nlohmann::json::object()},
                                  {"strategy", "group"},     {"symmetric", true},
                                  {"type", "int"}};
  return {{"config_groups",
           {{"group_0",
             {{"input_activations", nullptr},
              {"output_activations", nullptr},
              {"targets", {"Linear"}},
              {"weights", weights}}}}},
          {"format", "pack-quantized"},
          {"ignore", q.ignore},
          {"kv_cache_scheme", nullptr},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"}};
}

// Kimi-K2.5's multimodal form around the text model's config `text` (tests/data/configs/
// moonshotai_Kimi-K2.5.json): quantization_config inside text_config as published, a vision_config
// with the published vision tower's keys (sized for the tiny vision tensors the random writer adds).
nlohmann::json KimiK25Json(const DeepseekV2Config& c, nlohmann::json text) {
  nlohmann::json j = {{"architectures", {"KimiK25ForConditionalGeneration"}},
                      {"model_type", std::string(kKimiK25ModelType)},
                      {"ignore_index", -100},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"use_unified_vision_chunk", true},
                      {"video_placeholder", "<|kimi_k25_video_placeholder|>"},
                      {"dtype", "bfloat16"}};
  if (text.contains("bos_token_id")) j["bos_token_id"] = text["bos_token_id"];
  if (text.contains("eos_token_id")) j["eos_token_id"] = text["eos_token_id"];
  j["vision_config"] = {{"patch_size", 2},           {"vt_hidden_size", 8},
                        {"vt_num_hidden_layers", 1}, {"vt_num_attention_heads", 2},
                        {"vt_intermediate_size", 16}, {"merge_kernel_size", {2, 2}},
                        {"mm_projector_type", "patchmerger"}, {"mm_hidden_size", 8},
                        {"text_hidden_size", c.hidden_size}};
  j["text_config"] = std::move(text);
  return j;
}

}  // namespace

std::string DeepseekV2ConfigToHubJson(const DeepseekV2Config& c) {
  nlohmann::json j;
  j["architectures"] = {c.model_type == DeepseekModelType::kDeepseekV2 ? "DeepseekV2ForCausalLM"
                                                                       : "DeepseekV3ForCausalLM"};
  j["model_type"] = std::string(DeepseekModelTypeName(c.model_type));
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (c.n_routed_experts.has_value()) {
    j["n_routed_experts"] = *c.n_routed_experts;
    j["n_shared_experts"] = c.n_shared_experts;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["routed_scaling_factor"] = c.routed_scaling_factor;
    j["scoring_func"] = std::string(ScoringFuncName(c.scoring_func));
    j["topk_method"] = std::string(TopkMethodName(c.topk_method));
    j["n_group"] = c.n_group;
    j["topk_group"] = c.topk_group;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["first_k_dense_replace"] = c.first_k_dense_replace;
    j["moe_layer_freq"] = c.moe_layer_freq;
  } else {
    j["n_routed_experts"] = nullptr;
  }
  j["q_lora_rank"] = c.q_lora_rank.has_value() ? nlohmann::json(*c.q_lora_rank) : nlohmann::json();
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rope_theta"] = c.rope.theta;
  j["rope_scaling"] = RopeScalingJson(c.rope.scaling);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.bos_token_id.has_value()) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  if (c.num_nextn_predict_layers > 0) j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  if (c.quantization.quantized()) j["quantization_config"] = QuantizationJson(c.quantization);
  j["torch_dtype"] = "bfloat16";
  if (c.tensor_prefix == kKimiK25TensorPrefix) j = KimiK25Json(c, std::move(j));
  return j.dump(2) + "\n";
}

}  // namespace eagle3
