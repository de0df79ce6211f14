// The generic PretrainedConfig attributes transformers 4.x serialises next to a model's own keys
// when it saves a config it holds as an object: into a nested config such as Kimi-K2.5's
// text_config, and into the config.json that NVIDIA ModelOpt exports for an MLA EAGLE-3 draft
// (its Kimi-K2 template copies them from the target). The first group all appear in K2.5's
// published text_config; the generation defaults are the ones transformers 4's PretrainedConfig
// also serialises (accepted for files saved that way). No DeepSeek or EAGLE-3 model code reads
// them: a parser that meets them in these places accepts them unread. Private to src/.
#pragma once

#include <string_view>

namespace eagle3 {

inline constexpr std::string_view kGenericPretrainedConfigKeys[] = {
    "add_cross_attention", "chunk_size_feed_forward", "cross_attention_hidden_size",
    "decoder_start_token_id", "finetuning_task", "id2label", "label2id", "is_decoder",
    "is_encoder_decoder", "output_attentions", "output_hidden_states", "prefix", "problem_type",
    "pruned_heads", "return_dict", "sep_token_id", "task_specific_params", "tf_legacy_loss",
    "tie_encoder_decoder", "tokenizer_class", "torchscript", "use_bfloat16",
    // generation defaults
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
    "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
    "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
    "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens",
};

}  // namespace eagle3
