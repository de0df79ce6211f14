// DraftLayer: the part of a DraftModel that differs between its kinds (internal to src/): the draft's
// own layer math, its KV cache and workspaces, and the loading and checking of its weights. The rest
// of a draft step — validation, staging, the step's metadata on the device, the embedding lookup, the
// vocab-parallel head and d2t — is the kind-neutral scaffolding of src/draft_model.cc. One file per
// kind: src/draft_layer_llama.cc, src/draft_layer_mla.cc, src/draft_layer_mtp.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rank_collectives.h"
#include "eagle3/backend.h"
#include "eagle3/checkpoint.h"
#include "eagle3/communicator.h"
#include "eagle3/detail/host_budget.h"
#include "eagle3/draft_model.h"
#include "eagle3/dtype.h"
#include "eagle3/eagle3_draft_config.h"
#include "eagle3/hidden_state_tap.h"
#include "eagle3/mla_draft_config.h"
#include "eagle3/mtp_config.h"
#include "eagle3/tensor.h"
#include "eagle3/tensor_view.h"

namespace eagle3 {

// The rank a layer runs on and what it runs with.
struct DraftRank {
  DraftModelOptions options;
  Communicator* comm = nullptr;  // null at tp 1
  Backend* backend = nullptr;
  DType weight_dtype = DType::kF32;  // the resolved options.weight_dtype

  RankCollectives Ranks() const { return RankCollectives{options.tp_size, comm, backend}; }
  absl::StatusOr<Tensor> Alloc(DType dtype, const Shape& shape) const {
    return Tensor::Empty(dtype, shape, backend->allocator());
  }
};

// The embedding and output head a draft's scaffolding runs: this rank's vocab-parallel shards (rows
// padded to kVocabPadPerRank * tp, on the backend's device, in weight_dtype).
struct DraftHeadWeights {
  Tensor embed;    // [vocab_shard, H]: the draft's own embedding, or the target's it shares
  Tensor lm_head;  // [draft_vocab_shard, H]; empty when the head is `embed` (tied)
};

// One staged step as the scaffolding hands it to the layer. Every view is on the backend's device;
// T = the step's rows, H = DraftShape::hidden_size.
struct DraftLayerStep {
  int64_t rows = 0;  // T
  bool from_target = false;
  bool kv_only = false;        // only the rows' KV cache entries (DraftStepIO::kv_only)
  TensorView input;            // [T, input_width] (from_target) or [T, H]: the step's hidden rows
  TensorView embedded;         // [T, H] f32: embed(token) of every row, whole on every rank
  TensorView positions;        // [T] i64: RoPE positions
  TensorView slots;            // [T] i64: each row's row of the flat cache (page * page_size + offset)
  TensorView slot_iota;        // [num_kv_pages * page_size] i32: 0, 1, ...: the flat cache's page table
  TensorView page_tables;      // [B, P] i32
  TensorView q_start;          // [B + 1] i32
  TensorView kv_len;           // [B] i32
  int64_t max_kv_len = 0;      // max_context_len: bounds every kv_len
  TensorView mask;             // [T, max_kv_len] u8 over every key of a row's sequence; empty: causal
  // Outputs (unset with kv_only): the normed hidden the head reads, and the hidden fed back.
  TensorView head_in;          // [T, H] f32
  TensorView hidden_out;       // [T, H] f32
};

class DraftLayer {
 public:
  virtual ~DraftLayer() = default;

  // The host bytes of what Load allocates when the backend's memory is the host's (the KV cache and
  // the workspaces), added to the model's budget, which is checked before anything is allocated.
  // `tokens` and `context` name the options in the entries' text.
  virtual void AddBuffers(const std::string& tokens, const std::string& context, HostByteBudget& budget) const = 0;
  // Loads this rank's weights (the embedding and head into `head`), allocates and zeroes the KV cache
  // and the workspaces. Once.
  virtual absl::Status Load(DraftHeadWeights& head) = 0;
  // Enqueues the step's layer: the rows' KV entries, then (unless kv_only) attention, MLP,
  // step.head_in and step.hidden_out.
  virtual absl::Status Forward(const DraftLayerStep& step) = 0;
};

// What opening a draft yields: every config, tensor and size checked, nothing loaded yet.
struct OpenedDraft {
  DraftKind kind = DraftKind::kLlama;
  DraftShape shape;
  std::optional<HiddenStateTap> tap;
  std::vector<int64_t> d2t;  // [draft_vocab] offsets (zeros: the identity)
  // The kind's own config (one of the three), for DraftModel's accessors.
  Eagle3DraftConfig llama_config;
  std::optional<MlaDraftConfig> mla_config;
  std::optional<MtpConfig> mtp_config;
  std::unique_ptr<DraftLayer> layer;
};

// The kinds (one file each). `rank` must outlive the layer; `target` is the target's config.
absl::StatusOr<OpenedDraft> OpenLlamaDraft(const std::string& draft_dir, const std::string& target_dir,
                                           const DeepseekV2Config& target, const DraftRank& rank);
absl::StatusOr<OpenedDraft> OpenMlaDraft(const std::string& draft_dir, const std::string& target_dir,
                                         const DeepseekV2Config& target, const DraftRank& rank);
absl::StatusOr<OpenedDraft> OpenMtpDraft(const std::string& target_dir, const DeepseekV2Config& target,
                                         const DraftRank& rank);

// The EAGLE-3 heads' shared pieces (src/draft_model.cc).

// The tap of an EAGLE-3 head's fc: `config_ids` (the draft config's aux layer ids, or none: the
// defaults) or options.aux_layer_ids_override, under options.convention, for `target`; k taps must
// fill `fc_input_width`. `source` names the draft config in messages.
absl::StatusOr<HiddenStateTap> Eagle3HeadTap(const std::optional<std::vector<int>>& config_ids,
                                             const std::string& source, const DeepseekV2Config& target,
                                             const DraftModelOptions& options, int64_t fc_input_width);

// d2t of a draft checkpoint, checked: i64 / i32 [draft_vocab] offsets mapping every draft id into
// [0, vocab) with no target id twice, and t2d (bool [vocab], when present) true exactly at the mapped
// ids. Without d2t: the identity when draft_vocab == vocab, NotFound otherwise. Messages name the
// tensor and the checkpoint.
absl::StatusOr<std::vector<int64_t>> ReadDraftVocabMapping(const Checkpoint& checkpoint, int64_t vocab,
                                                           int64_t draft_vocab);

}  // namespace eagle3
