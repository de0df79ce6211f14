// The config.json keys every EAGLE-3 head shares, whatever its decoder layer (Llama-style GQA or
// MLA): the aux layer ids, the variant flags (at the top level or inside eagle_config, and equal
// when written in both), the eagle_config block, and the check of a head against its target.
// Eagle3DraftConfig and MlaDraftConfig both read them through this one piece of code, so the two
// drafts cannot drift apart on what an aux id or a variant flag means. Private to src/.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "eagle3/deepseek_v2_config.h"
#include "json_fields.h"

namespace eagle3::eagle3_head {

inline constexpr std::string_view kAuxIdsKey = "eagle_aux_hidden_state_layer_ids";

// Keys of eagle_config that SpecForge, SGLang and vLLM write and read.
inline constexpr std::string_view kEagleConfigKeys[] = {
    kAuxIdsKey, "use_aux_hidden_state", "norm_before_residual", "norm_before_fc",
    "fc_norm",  "norm_output",
};

// The one name `architectures` must hold: InvalidArgument naming the file when the key is missing
// or lists another count. Which names a head accepts is its parser's.
absl::StatusOr<std::string> SingleArchitecture(const json_fields::Object& root);

// A boolean that may be written at the top level or inside eagle_config; both must agree. False
// when absent from both.
absl::StatusOr<bool> VariantFlag(const json_fields::Object& root,
                                 const std::optional<json_fields::Object>& eagle,
                                 std::string_view key);

// eagle_aux_hidden_state_layer_ids from the top level or eagle_config (equal when in both);
// unset when in neither. Refuses an empty list (fc needs at least one tap). Ids are not
// range-checked here: that needs the target (CheckHeadAgainstTarget).
absl::StatusOr<std::optional<std::vector<int>>> ParseAuxLayerIds(
    const json_fields::Object& root, const std::optional<json_fields::Object>& eagle);

// Refuses eagle_config keys in none of the `known` lists, and use_aux_hidden_state = false (an
// EAGLE-1/2 head, which reads the target's last hidden state instead of taps).
absl::Status CheckEagleConfig(const std::optional<json_fields::Object>& eagle,
                              std::initializer_list<std::span<const std::string_view>> known);

// Checks a head against the target it will run with: its target_hidden_size equals the target's
// hidden_size, the vocabularies match, and every aux layer id lies in [0, L-1] under the
// output-of-layer convention (the message explains the convention and that no id names the
// embedding). `draft_source` names the draft's config in messages.
absl::Status CheckHeadAgainstTarget(std::string_view draft_source, int64_t target_hidden_size,
                                    int64_t vocab_size,
                                    const std::optional<std::vector<int>>& aux_layer_ids,
                                    const DeepseekV2Config& target);

}  // namespace eagle3::eagle3_head
