// Checks a draft checkpoint against its target before serving: every problem is reported, not just
// the first (docs/semantics.md).
#pragma once

#include <string>
#include <vector>

#include "eagle3/export.h"
#include "eagle3/hidden_state_tap.h"

namespace eagle3 {

struct PairReport {
  std::vector<std::string> facts;     // what was resolved: taps and their meaning, widths, vocab mapping
  std::vector<std::string> problems;  // each a complete sentence naming the key / tensor and values
  // Legal but probably unintended: the pair runs, possibly not as the draft was trained. Each a
  // complete sentence saying what eagle3 will do.
  std::vector<std::string> warnings;
  bool ok() const { return problems.empty(); }
};

// Reads both configs and the draft's fc / lm_head / d2t / t2d tensors (no model is built) and checks:
// the aux ids resolve to distinct boundaries under `convention`; fc input width = taps x target
// hidden; draft target_hidden_size = target hidden; vocab sizes; d2t maps every draft id into the
// target vocabulary, injectively; t2d (when present) is true exactly at the mapped ids; lm_head rows
// = draft_vocab_size; the variant keys eagle3 does not implement. Warns when the aux ids are not in
// layer order: eagle3 concatenates the taps in the listed order (HiddenStateTap), while SGLang and
// vLLM capture them in layer order, so a draft trained there would see its fc input blocks permuted.
EAGLE3_API PairReport CheckDraftPair(const std::string& target_dir, const std::string& draft_dir,
                                     LayerIdConvention convention = LayerIdConvention::kOutputOfLayer);

}  // namespace eagle3
