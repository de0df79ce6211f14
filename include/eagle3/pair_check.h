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

// The draft's kind follows its config.json's architectures (NamesMlaDraftArchitecture): a
// Llama-style head (Eagle3DraftConfig) or an MLA EAGLE-3 head (MlaDraftConfig, whose tensors are
// then checked in full by CheckMlaDraftWeights: layer prefix, every shape and dtype, the embedding
// the draft shares). Facts name each model's weight format.
// Reads both configs and the draft's fc / lm_head / d2t / t2d tensors (no model is built) and checks:
// the aux ids resolve to distinct boundaries under `convention`; fc input width = taps x target
// hidden; draft target_hidden_size = target hidden; vocab sizes; d2t maps every draft id into the
// target vocabulary, injectively; t2d (when present) is true exactly at the mapped ids; lm_head rows
// = draft_vocab_size; the variant keys eagle3 does not implement. Warns when the aux ids are not in
// layer order: eagle3 concatenates the taps in the listed order (HiddenStateTap), while SGLang and
// vLLM capture them in layer order, so a draft trained there would see its fc input blocks permuted.
EAGLE3_API PairReport CheckDraftPair(const std::string& target_dir, const std::string& draft_dir,
                                     LayerIdConvention convention = LayerIdConvention::kOutputOfLayer);

// Checks the target's own MTP modules as a drafter (eagle3-inspect check --mtp): the target config
// states num_nextn_predict_layers (MtpConfig::FromTarget) and its checkpoint holds every module's
// tensors in their stored forms (CheckMtpWeights: a checkpoint without its MTP layer is a problem
// naming the first missing tensor). Facts: each module's layer index and MLP kind, the weight format
// of the target and of the module, the shared embedding and head, and whether the checkpoint stores
// the module's copies of them (never read).
EAGLE3_API PairReport CheckMtpPair(const std::string& target_dir);

}  // namespace eagle3
