#include "eagle3/pair_check.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "eagle3/checkpoint.h"
#include "eagle3/deepseek_v2_config.h"
#include "eagle3/eagle3_draft_config.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

std::string JoinInts(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Str(v[i]);
  return s + "]";
}

}  // namespace

PairReport CheckDraftPair(const std::string& target_dir, const std::string& draft_dir,
                          LayerIdConvention convention) {
  PairReport report;
  auto target = DeepseekV2Config::FromFile(target_dir);
  if (!target.ok()) report.problems.push_back("target config: " + std::string(target.status().message()));
  auto draft = Eagle3DraftConfig::FromFile(draft_dir);
  if (!draft.ok()) report.problems.push_back("draft config: " + std::string(draft.status().message()));
  if (!target.ok() || !draft.ok()) return report;
  const DeepseekV2Config& t = *target;
  const Eagle3DraftConfig& d = *draft;
  report.facts.push_back("target: " + std::string(DeepseekModelTypeName(t.model_type)) + ", " +
                         Str(t.num_hidden_layers) + " layers, hidden " + Str(t.hidden_size) + ", vocab " +
                         Str(t.vocab_size));
  report.facts.push_back("draft: hidden " + Str(d.hidden_size) + ", target_hidden_size " + Str(d.target_hidden_size) +
                         ", " + Str(d.num_attention_heads) + " heads / " + Str(d.num_key_value_heads) +
                         " kv heads, draft vocab " + Str(d.draft_vocab_size) + " of " + Str(d.vocab_size));
  // Each model's weight format: a quantized target next to an unquantized draft is the published
  // form (the draft never takes the target's quantization_config; a draft config carrying one is
  // refused when it is read).
  report.facts.push_back("target weights: " + t.quantization.Describe());
  report.facts.push_back("draft weights: unquantized");

  // Taps: resolution and width.
  std::optional<std::span<const int>> ids;
  if (d.aux_layer_ids.has_value()) ids = std::span<const int>(*d.aux_layer_ids);
  auto tap = HiddenStateTap::Create(ids, convention, static_cast<int>(t.num_hidden_layers), t.hidden_size);
  if (tap.ok()) {
    report.facts.push_back("taps: " + tap->Describe());
    const std::vector<int>& listed = tap->boundaries();
    if (d.aux_layer_ids.has_value() && !std::is_sorted(listed.begin(), listed.end())) {
      std::vector<int> sorted = listed;
      std::sort(sorted.begin(), sorted.end());
      report.warnings.push_back(
          "eagle_aux_hidden_state_layer_ids " + JoinInts(*d.aux_layer_ids) +
          " are not in layer order: eagle3 concatenates the taps in the listed order, so the draft's fc "
          "receives boundaries " + JoinInts(listed) + " in that order, while SGLang and vLLM capture aux hidden "
          "states in layer order (boundaries " + JoinInts(sorted) + "); a draft trained there sees its fc input "
          "blocks permuted here. List the ids in increasing order unless the draft was trained on this order");
    }
  } else {
    report.problems.push_back("taps: " + std::string(tap.status().message()));
  }
  if (d.target_hidden_size != t.hidden_size) {
    report.problems.push_back("draft target_hidden_size " + Str(d.target_hidden_size) +
                              " != target hidden_size " + Str(t.hidden_size));
  }
  if (d.vocab_size != t.vocab_size) {
    report.problems.push_back("draft vocab_size " + Str(d.vocab_size) + " != target vocab_size " + Str(t.vocab_size));
  }
  for (const auto& [key, set] : {std::pair<const char*, bool>{"norm_before_fc", d.norm_before_fc},
                                 {"fc_norm", d.fc_norm},
                                 {"norm_output", d.norm_output}}) {
    if (set) report.facts.push_back("variant key " + std::string(key) + " = true");
  }
  report.facts.push_back(std::string("norm_before_residual = ") + (d.norm_before_residual ? "true" : "false"));

  auto ckpt = Checkpoint::Open(draft_dir);
  if (!ckpt.ok()) {
    report.problems.push_back("draft checkpoint: " + std::string(ckpt.status().message()));
    return report;
  }
  const Checkpoint& c = **ckpt;
  const int64_t taps = tap.ok() ? static_cast<int64_t>(tap->boundaries().size()) : d.num_aux_layers();
  if (auto fc = c.Info("fc.weight"); !fc.ok()) {
    report.problems.push_back("draft has no fc.weight");
  } else if (fc->shape.rank() != 2 || fc->shape[0] != d.hidden_size || fc->shape[1] != taps * t.hidden_size) {
    report.problems.push_back("fc.weight is " + fc->shape.ToString() + ", expected [" + Str(d.hidden_size) + ", " +
                              Str(taps) + " taps x " + Str(t.hidden_size) + " = " + Str(taps * t.hidden_size) + "]");
  } else {
    report.facts.push_back("fc input width " + Str(fc->shape[1]) + " = " + Str(taps) + " taps x target hidden " +
                           Str(t.hidden_size));
  }
  if (auto head = c.Info("lm_head.weight"); head.ok() && head->shape[0] != d.draft_vocab_size) {
    report.problems.push_back("lm_head.weight has " + Str(head->shape[0]) + " rows, draft_vocab_size is " +
                              Str(d.draft_vocab_size));
  }

  // d2t: offsets into the target vocabulary, one per draft id, no two draft ids on one target id.
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
  if (c.Has("t2d")) {
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
  return report;
}

}  // namespace eagle3
