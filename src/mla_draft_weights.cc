#include "eagle3/mla_draft_weights.h"

#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "drafter_weight_checks.h"
#include "eagle3/detail/quantized_weights.h"
#include "eagle3/mla_attention_weights.h"
#include "eagle3/status.h"

namespace eagle3 {
namespace {

constexpr char kEmbedding[] = "embed_tokens.weight";

std::string FileOf(const Checkpoint& checkpoint, const std::string& name) {
  const absl::StatusOr<std::string> file = checkpoint.FileOf(name);
  return file.ok() ? *file : std::string("?");
}

// Why a tensor no spec lists is refused: for the tensors a variant key would account for, which
// key.
std::string UnknownWhy(const std::string& name, const MlaDraftConfig& draft) {
  if (name.starts_with("fc_norm.")) {
    return absl::StrCat("a per-tap RMSNorm before fc that fc_norm: true enables (one per tap); ", draft.source,
                        " does not set it or names another number of taps");
  }
  if (name == "lm_head.weight" && draft.tie_word_embeddings) {
    return absl::StrCat("but ", draft.source, " says tie_word_embeddings: true");
  }
  if (name == "fc.bias") return absl::StrCat("a bias of fc, which ", draft.source, " (bias: false) does not have");
  return absl::StrCat("which ", draft.source, " does not account for");
}

absl::Status CheckVocabMapping(const Checkpoint& checkpoint, const MlaDraftConfig& draft,
                               MlaDraftCheckpointLayout& layout) {
  layout.has_d2t = checkpoint.Has("d2t");
  layout.has_t2d = checkpoint.Has("t2d");
  if (!layout.has_d2t && draft.draft_vocab_size != draft.vocab_size) {
    return absl::NotFoundError(absl::StrCat(
        "draft checkpoint '", checkpoint.dir(), "' has no tensor 'd2t', which maps its ", draft.draft_vocab_size,
        " draft ids to the target's ", draft.vocab_size,
        " (expected I64 [", draft.draft_vocab_size, "] offsets: target id = draft id + d2t[draft id])"));
  }
  if (layout.has_d2t) {
    EAGLE3_RETURN_IF_ERROR(CheckTensorDtype(checkpoint, "d2t", {DType::kI64, DType::kI32}, "I64",
                                            "offsets: target id = draft id + d2t[draft id]"));
    EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape("d2t", Shape{draft.draft_vocab_size}));
  }
  if (layout.has_t2d) {
    EAGLE3_RETURN_IF_ERROR(CheckTensorDtype(checkpoint, "t2d", {DType::kBool, DType::kU8}, "BOOL",
                                            "a mask over the target vocabulary"));
    EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape("t2d", Shape{draft.vocab_size}));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<WeightSpec> MlaDraftWeights(const MlaDraftConfig& d, std::string_view layer_prefix) {
  const int64_t h = d.hidden_size;
  const std::string p(layer_prefix);
  std::vector<WeightSpec> specs = {WeightSpec{"fc.weight", Shape{h, d.fc_input_width()}, TpSplit::kReplicated}};
  if (d.fc_norm) {
    for (int64_t i = 0; i < d.num_aux_layers(); ++i) {
      specs.push_back(
          WeightSpec{absl::StrCat("fc_norm.", i, ".weight"), Shape{d.target_hidden_size}, TpSplit::kReplicated});
    }
  }
  specs.push_back(WeightSpec{p + "input_layernorm.weight", Shape{h}, TpSplit::kReplicated});
  specs.push_back(WeightSpec{p + "hidden_norm.weight", Shape{h}, TpSplit::kReplicated});
  for (WeightSpec& spec : MlaAttentionWeights(d.attention(), p + "self_attn.")) specs.push_back(std::move(spec));
  specs.push_back(WeightSpec{p + "post_attention_layernorm.weight", Shape{h}, TpSplit::kReplicated});
  AppendSiluMlpWeights(p + "mlp.", h, d.intermediate_size, specs);
  specs.push_back(WeightSpec{"norm.weight", Shape{h}, TpSplit::kReplicated});
  if (!d.tie_word_embeddings) {
    specs.push_back(WeightSpec{"lm_head.weight", Shape{d.draft_vocab_size, h}, TpSplit::kRows,
                               /*vocab_padded=*/true});
  }
  return specs;
}

WeightSpec MlaDraftEmbeddingWeight(const MlaDraftConfig& d) {
  return WeightSpec{kEmbedding, Shape{d.vocab_size, d.hidden_size}, TpSplit::kRows, /*vocab_padded=*/true};
}

absl::StatusOr<MlaDraftCheckpointLayout> CheckMlaDraftWeights(const Checkpoint& checkpoint,
                                                              const MlaDraftConfig& draft,
                                                              const DeepseekV2Config& target) {
  MlaDraftCheckpointLayout layout;
  EAGLE3_ASSIGN_OR_RETURN(layout.layer_prefix, DraftLayerPrefix(checkpoint));
  const std::vector<WeightSpec> specs = MlaDraftWeights(draft, layout.layer_prefix);
  const QuantizationConfig unquantized;
  std::set<std::string, std::less<>> known = {kEmbedding, "d2t", "t2d"};
  for (const WeightSpec& spec : specs) {
    known.insert(spec.name);
    EAGLE3_RETURN_IF_ERROR(CheckDrafterWeight(checkpoint, spec, StoredForm::kPlain, unquantized));
  }
  layout.own_embedding = checkpoint.Has(kEmbedding);
  if (layout.own_embedding) {
    EAGLE3_RETURN_IF_ERROR(
        CheckDrafterWeight(checkpoint, MlaDraftEmbeddingWeight(draft), StoredForm::kPlain, unquantized));
  } else if (draft.hidden_size != target.hidden_size) {
    return absl::NotFoundError(absl::StrCat(
        "draft checkpoint '", checkpoint.dir(), "' has no tensor '", kEmbedding, "' (expected shape [",
        draft.vocab_size, ", ", draft.hidden_size, "]), and the target's embedding '", DeepseekEmbeddingName(target),
        "' is [", target.vocab_size, ", ", target.hidden_size, "]: ", draft.source, "'s hidden_size ",
        draft.hidden_size, " differs from the target's hidden_size ", target.hidden_size, " (", target.source,
        "), so the draft cannot share it"));
  }
  EAGLE3_RETURN_IF_ERROR(CheckVocabMapping(checkpoint, draft, layout));
  for (const std::string& name : checkpoint.TensorNames()) {
    if (known.count(name) != 0) continue;
    return absl::InvalidArgumentError(absl::StrCat("draft checkpoint '", checkpoint.dir(), "' has tensor '", name,
                                                   "' in '", FileOf(checkpoint, name), "', ",
                                                   UnknownWhy(name, draft), "; refusing to ignore it"));
  }
  return layout;
}

}  // namespace eagle3
