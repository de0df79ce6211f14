#include "eagle3/pair_check.h"

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/deepseek_v2_weights.h"
#include "eagle3/eagle3_draft_config.h"
#include "eagle3/mla_draft_config.h"
#include "eagle3/mla_draft_weights.h"
#include "eagle3/mtp_config.h"
#include "eagle3/mtp_weights.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

std::string JoinInts(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Str(v[i]);
  return s + "]";
}

std::string TargetFact(const DeepseekV2Config& t) {
  return "target: " + std::string(DeepseekModelTypeName(t.model_type)) + ", " + Str(t.num_hidden_layers) +
         " layers, hidden " + Str(t.hidden_size) + ", vocab " + Str(t.vocab_size);
}

// What both EAGLE-3 head kinds share: the taps and fc's input width against the target, the target
// vocabulary, and the vocabulary mapping's values.
struct HeadView {
  int64_t hidden_size = 0;
  int64_t target_hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t draft_vocab_size = 0;
  int64_t num_aux_layers = 0;
  const std::optional<std::vector<int>>* aux_layer_ids = nullptr;
};

// The taps: resolution under `convention`, and their order. Returns how many there are.
int64_t CheckTaps(const HeadView& d, const DeepseekV2Config& t, LayerIdConvention convention, PairReport& report) {
  std::optional<std::span<const int>> ids;
  if (d.aux_layer_ids->has_value()) ids = std::span<const int>(**d.aux_layer_ids);
  auto tap = HiddenStateTap::Create(ids, convention, static_cast<int>(t.num_hidden_layers), t.hidden_size);
  if (!tap.ok()) {
    report.problems.push_back("taps: " + std::string(tap.status().message()));
    return d.num_aux_layers;
  }
  report.facts.push_back("taps: " + tap->Describe());
  const std::vector<int>& listed = tap->boundaries();
  if (d.aux_layer_ids->has_value() && !std::is_sorted(listed.begin(), listed.end())) {
    std::vector<int> sorted = listed;
    std::sort(sorted.begin(), sorted.end());
    report.warnings.push_back(
        "eagle_aux_hidden_state_layer_ids " + JoinInts(**d.aux_layer_ids) +
        " are not in layer order: eagle3 concatenates the taps in the listed order, so the draft's fc "
        "receives boundaries " + JoinInts(listed) + " in that order, while SGLang and vLLM capture aux hidden "
        "states in layer order (boundaries " + JoinInts(sorted) + "); a draft trained there sees its fc input "
        "blocks permuted here. List the ids in increasing order unless the draft was trained on this order");
  }
  return static_cast<int64_t>(listed.size());
}

// fc reads `taps` target hidden states: its input width is where a draft for another target (or other
// taps) shows, named by the tensor.
void CheckFc(const Checkpoint& c, const HeadView& d, const DeepseekV2Config& t, int64_t taps, PairReport& report) {
  if (auto fc = c.Info("fc.weight"); !fc.ok()) {
    report.problems.push_back("draft has no fc.weight");
  } else if (fc->shape.rank() != 2 || fc->shape[0] != d.hidden_size || fc->shape[1] != taps * t.hidden_size) {
    report.problems.push_back("fc.weight is " + fc->shape.ToString() + ", expected [" + Str(d.hidden_size) + ", " +
                              Str(taps) + " taps x " + Str(t.hidden_size) + " = " + Str(taps * t.hidden_size) +
                              "] (the target's hidden_size is " + Str(t.hidden_size) + ")");
  } else {
    report.facts.push_back("fc input width " + Str(fc->shape[1]) + " = " + Str(taps) + " taps x target hidden " +
                           Str(t.hidden_size));
  }
}

// d2t: offsets into the target vocabulary, one per draft id, no two draft ids on one target id; t2d
// (when present) true exactly at the mapped ids.
void CheckVocabMapping(const Checkpoint& c, const HeadView& d, const DeepseekV2Config& t, PairReport& report) {
  std::set<int64_t> mapped;
  if (!c.Has("d2t")) {
    if (d.draft_vocab_size != t.vocab_size) {
      report.problems.push_back("draft has no d2t but its vocabulary (" + Str(d.draft_vocab_size) +
                                ") differs from the target's (" + Str(t.vocab_size) + ")");
    }
  } else if (auto d2t = c.Read("d2t", DType::kI64); !d2t.ok()) {
    report.problems.push_back("d2t: " + std::string(d2t.status().message()));
  } else if (d2t->numel() != d.draft_vocab_size) {
    report.problems.push_back("d2t has " + Str(d2t->numel()) + " entries, draft_vocab_size is " +
                              Str(d.draft_vocab_size));
  } else {
    int bad = 0;
    for (int64_t i = 0; i < d2t->numel(); ++i) {
      const int64_t target_id = i + d2t->data_as<int64_t>()[i];
      if (target_id < 0 || target_id >= t.vocab_size) {
        if (++bad <= 3) {
          report.problems.push_back("d2t[" + Str(i) + "] = " + Str(d2t->data_as<int64_t>()[i]) + " maps draft id " +
                                    Str(i) + " to " + Str(target_id) + ", outside the target vocabulary [0, " +
                                    Str(t.vocab_size) + ") (d2t holds offsets: target = draft + d2t[draft])");
        }
      } else if (!mapped.insert(target_id).second) {
        if (++bad <= 3) report.problems.push_back("d2t maps two draft ids to target id " + Str(target_id));
      }
    }
    if (bad > 3) report.problems.push_back("d2t: " + Str(bad - 3) + " more bad entries");
    if (bad == 0) {
      report.facts.push_back("d2t maps " + Str(d2t->numel()) + " draft ids into the target vocabulary, injectively");
    }
  }
  if (!c.Has("t2d")) return;
  // t2d is a bool mask over the target vocabulary (one byte per entry).
  auto t2d = c.View("t2d");
  if (!t2d.ok()) {
    report.problems.push_back("t2d: " + std::string(t2d.status().message()));
  } else if (t2d->dtype() != DType::kBool && t2d->dtype() != DType::kU8) {
    report.problems.push_back("t2d is " + t2d->ToString() + ", expected bool[" + Str(t.vocab_size) + "]");
  } else if (t2d->numel() != t.vocab_size) {
    report.problems.push_back("t2d has " + Str(t2d->numel()) + " entries, the target vocabulary " + Str(t.vocab_size));
  } else if (!mapped.empty()) {
    const uint8_t* flags = static_cast<const uint8_t*>(t2d->data());
    int64_t disagree = 0;
    for (int64_t v = 0; v < t2d->numel(); ++v) disagree += (flags[v] != 0) != (mapped.count(v) != 0) ? 1 : 0;
    if (disagree > 0) {
      report.problems.push_back("t2d disagrees with d2t on " + Str(disagree) + " target ids");
    } else {
      report.facts.push_back("t2d is consistent with d2t");
    }
  }
}

// The head's variant keys that are set, and norm_before_residual either way, as facts.
void ReportVariantKeys(std::initializer_list<std::pair<const char*, bool>> flags, bool norm_before_residual,
                       PairReport& report) {
  for (const auto& [key, set] : flags) {
    if (set) report.facts.push_back("variant key " + std::string(key) + " = true");
  }
  report.facts.push_back(std::string("norm_before_residual = ") + (norm_before_residual ? "true" : "false"));
}

void CheckLlamaHead(const std::string& draft_dir, const DeepseekV2Config& t, LayerIdConvention convention,
                    PairReport& report) {
  auto draft = Eagle3DraftConfig::FromFile(draft_dir);
  if (!draft.ok()) {
    report.problems.push_back("draft config: " + std::string(draft.status().message()));
    return;
  }
  const Eagle3DraftConfig& d = *draft;
  report.facts.push_back("draft: Llama-style EAGLE-3 head, hidden " + Str(d.hidden_size) + ", target_hidden_size " +
                         Str(d.target_hidden_size) + ", " + Str(d.num_attention_heads) + " heads / " +
                         Str(d.num_key_value_heads) + " kv heads, draft vocab " + Str(d.draft_vocab_size) + " of " +
                         Str(d.vocab_size));
  // Each model's weight format: a quantized target next to an unquantized draft is the published
  // form (the draft never takes the target's quantization_config; a draft config carrying one is
  // refused when it is read).
  report.facts.push_back("target weights: " + t.quantization.Describe());
  report.facts.push_back("draft weights: unquantized");
  const HeadView view{d.hidden_size,      d.target_hidden_size, d.vocab_size, d.draft_vocab_size,
                      d.num_aux_layers(), &d.aux_layer_ids};
  const int64_t taps = CheckTaps(view, t, convention, report);
  if (d.target_hidden_size != t.hidden_size) {
    report.problems.push_back("draft target_hidden_size " + Str(d.target_hidden_size) +
                              " != target hidden_size " + Str(t.hidden_size));
  }
  if (d.vocab_size != t.vocab_size) {
    report.problems.push_back("draft vocab_size " + Str(d.vocab_size) + " != target vocab_size " + Str(t.vocab_size));
  }
  ReportVariantKeys({{"norm_before_fc", d.norm_before_fc}, {"fc_norm", d.fc_norm}, {"norm_output", d.norm_output}},
                    d.norm_before_residual, report);

  auto ckpt = Checkpoint::Open(draft_dir);
  if (!ckpt.ok()) {
    report.problems.push_back("draft checkpoint: " + std::string(ckpt.status().message()));
    return;
  }
  const Checkpoint& c = **ckpt;
  CheckFc(c, view, t, taps, report);
  if (auto head = c.Info("lm_head.weight"); head.ok() && head->shape[0] != d.draft_vocab_size) {
    report.problems.push_back("lm_head.weight has " + Str(head->shape[0]) + " rows, draft_vocab_size is " +
                              Str(d.draft_vocab_size));
  }
  CheckVocabMapping(c, view, t, report);
}

void CheckMlaHead(const std::string& draft_dir, const DeepseekV2Config& t, LayerIdConvention convention,
                  PairReport& report) {
  auto draft = MlaDraftConfig::FromFile(draft_dir);
  if (!draft.ok()) {
    report.problems.push_back("draft config: " + std::string(draft.status().message()));
    return;
  }
  const MlaDraftConfig& d = *draft;
  report.facts.push_back(
      "draft: MLA EAGLE-3 head (" + d.architecture + ", " + std::string(DeepseekModelTypeName(d.model_type)) +
      "), hidden " + Str(d.hidden_size) + ", target_hidden_size " + Str(d.target_hidden_size) + ", " +
      Str(d.num_attention_heads) + " heads, q_lora_rank " + (d.q_lora_rank ? Str(*d.q_lora_rank) : "null (q_proj)") +
      ", kv_lora_rank " + Str(d.kv_lora_rank) + ", latent cache row " + Str(d.latent_cache_width()) +
      ", dense MLP " + Str(d.intermediate_size) + ", draft vocab " + Str(d.draft_vocab_size) + " of " +
      Str(d.vocab_size));
  report.facts.push_back("target weights: " + t.quantization.Describe());
  report.facts.push_back("draft weights: unquantized");
  if (!d.draft_vocab_size_stated) {
    report.warnings.push_back(d.source +
                              " does not state draft_vocab_size: eagle3 runs the draft's own lm_head.weight over "
                              "vocab_size rows, as vLLM does, while SGLang runs the target's lm_head instead");
  }
  const HeadView view{d.hidden_size,      d.target_hidden_size, d.vocab_size, d.draft_vocab_size,
                      d.num_aux_layers(), &d.aux_layer_ids};
  const int64_t taps = CheckTaps(view, t, convention, report);
  if (absl::Status s = CheckDraftAgainstTarget(d, t); !s.ok()) report.problems.push_back(std::string(s.message()));
  ReportVariantKeys({{"fc_norm", d.fc_norm}, {"norm_output", d.norm_output}}, d.norm_before_residual, report);

  auto ckpt = Checkpoint::Open(draft_dir);
  if (!ckpt.ok()) {
    report.problems.push_back("draft checkpoint: " + std::string(ckpt.status().message()));
    return;
  }
  const Checkpoint& c = **ckpt;
  CheckFc(c, view, t, taps, report);
  absl::StatusOr<MlaDraftCheckpointLayout> layout = CheckMlaDraftWeights(c, d, t);
  if (!layout.ok()) {
    report.problems.push_back("draft checkpoint: " + std::string(layout.status().message()));
  } else {
    report.facts.push_back("draft layer under '" + layout->layer_prefix + "'; embedding: " +
                           (layout->own_embedding ? "the draft's own embed_tokens.weight"
                                                  : "the target's " + DeepseekEmbeddingName(t)));
  }
  CheckVocabMapping(c, view, t, report);
}

}  // namespace

PairReport CheckDraftPair(const std::string& target_dir, const std::string& draft_dir,
                          LayerIdConvention convention) {
  PairReport report;
  auto target = DeepseekV2Config::FromFile(target_dir);
  if (!target.ok()) report.problems.push_back("target config: " + std::string(target.status().message()));
  absl::StatusOr<bool> mla = NamesMlaDraftArchitecture(draft_dir);
  if (!mla.ok()) report.problems.push_back("draft config: " + std::string(mla.status().message()));
  if (!target.ok() && mla.ok()) {
    // Both configs' problems are reported, each by its own parser.
    const absl::Status draft = *mla ? MlaDraftConfig::FromFile(draft_dir).status()
                                    : Eagle3DraftConfig::FromFile(draft_dir).status();
    if (!draft.ok()) report.problems.push_back("draft config: " + std::string(draft.message()));
  }
  if (!target.ok() || !mla.ok()) return report;
  report.facts.push_back(TargetFact(*target));
  if (*mla) {
    CheckMlaHead(draft_dir, *target, convention, report);
  } else {
    CheckLlamaHead(draft_dir, *target, convention, report);
  }
  return report;
}

PairReport CheckMtpPair(const std::string& target_dir) {
  PairReport report;
  auto target = DeepseekV2Config::FromFile(target_dir);
  if (!target.ok()) {
    report.problems.push_back("target config: " + std::string(target.status().message()));
    return report;
  }
  const DeepseekV2Config& t = *target;
  report.facts.push_back(TargetFact(t));
  auto mtp = MtpConfig::FromTarget(t);
  if (!mtp.ok()) {
    report.problems.push_back("MTP: " + std::string(mtp.status().message()));
    return report;
  }
  for (int64_t k = 0; k < mtp->num_modules; ++k) {
    report.facts.push_back("MTP module " + Str(k) + ": layer " + Str(mtp->LayerIndex(k)) + " ('" +
                           mtp->LayerPrefix(k) + "*'), " +
                           (mtp->module_is_moe[static_cast<size_t>(k)] ? "MoE" : "dense") + " MLP, " +
                           Str(static_cast<int64_t>(MtpModuleWeights(t, *mtp, k).size())) + " tensors");
  }
  report.facts.push_back("target weights: " + t.quantization.Describe());
  report.facts.push_back("MTP weights: the decoder layer as the target's (" + t.quantization.Describe() +
                         "); eh_proj, enorm, hnorm and shared_head.norm unquantized");
  const std::string head = t.tie_word_embeddings ? DeepseekEmbeddingName(t) + " (tied)" : t.tensor_prefix + "lm_head.weight";
  report.facts.push_back("embedding and output head: the target's " + DeepseekEmbeddingName(t) + " and " + head);
  auto ckpt = Checkpoint::Open(target_dir);
  if (!ckpt.ok()) {
    report.problems.push_back("target checkpoint: " + std::string(ckpt.status().message()));
    return report;
  }
  if (absl::Status s = CheckMtpWeights(**ckpt, t, *mtp); !s.ok()) {
    report.problems.push_back("target checkpoint: " + std::string(s.message()));
    return report;
  }
  for (int64_t k = 0; k < mtp->num_modules; ++k) {
    int copies = 0;
    for (const WeightSpec& copy : MtpSharedCopyWeights(t, *mtp, k)) copies += (*ckpt)->Has(copy.name) ? 1 : 0;
    if (copies > 0) {
      report.facts.push_back("MTP module " + Str(k) + " stores " + Str(copies) +
                             " copy(ies) of the shared embedding / head, not read (the target's are)");
    }
  }
  return report;
}

}  // namespace eagle3
