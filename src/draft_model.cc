#include "eagle3/draft_model.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batch_staging.h"
#include "draft_layer.h"
#include "rank_collectives.h"
#include "view_slices.h"
#include "vocab_parallel_head.h"
#include "eagle3/checkpoint.h"
#include "eagle3/detail/host_budget.h"
#include "eagle3/status.h"
#include "eagle3/target_model.h"
#include "eagle3/tensor.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

std::string JoinInts(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Str(v[i]);
  return s + "]";
}

bool IsHostContiguousF32(const TensorView& t, int64_t rows, int64_t cols) {
  return t.rank() == 2 && t.dim(0) == rows && t.dim(1) == cols && t.dtype() == DType::kF32 &&
         t.device().is_cpu() && t.is_contiguous();
}

}  // namespace

// The kind-neutral scaffolding of a draft step: validation, staging, the step's device metadata, the
// embedding lookup, the vocab-parallel head and d2t; the kind's layer (DraftLayer) does the rest.
struct DraftModel::Impl {
  DraftRank rank;  // options, communicator, backend, resolved weight dtype
  DraftKind kind = DraftKind::kLlama;
  DraftShape shape;
  std::optional<HiddenStateTap> tap;
  std::vector<int64_t> d2t;
  Eagle3DraftConfig llama_config;
  std::optional<MlaDraftConfig> mla_config;
  std::optional<MtpConfig> mtp_config;
  std::unique_ptr<DraftLayer> layer;
  DraftHeadWeights head;
  int64_t vocab_shard = 0, draft_vocab_shard = 0;  // padded vocabularies / tp

  // Workspaces (backend device), sized at creation.
  Tensor e, h, lm_in, logits_shard, logits_all;  // embedded tokens, the head's input rows
  Tensor tokens, positions, slots;
  // Device metadata of the batched attention, and the identity page table of the flat-cache view
  // that PagedWrite stores every new row through (slots are cache rows).
  Tensor d_tables, d_starts, d_lens, d_mask, slot_iota;
  int64_t max_pages = 0;  // page entries kept per sequence: ceil(max_context_len / page_size)

  // The staged step (Stage -> Launch -> Finish): Launch's work depends only on what Signature()
  // lists; every value it reads comes from the staging buffers below.
  struct Step {
    bool staged = false;
    bool from_target = false;
    int64_t t = 0, out_rows = 0;
    std::vector<int64_t> n;           // rows per sequence
    std::vector<uint8_t> all_logits;  // per sequence
    DraftStepIO io;                   // device-side inputs / outputs (empty views: host path)
    bool causal = false;              // no sequence brings a mask: attention is causal by position
  } step;
  // Host staging (backend->staging_allocator(): pinned on CUDA). Inputs are written by Stage and
  // read by the copies Launch enqueues; outputs are written by Launch's copies and read by Finish.
  Tensor st_tokens, st_positions, st_slots, st_tables, st_starts, st_lens, st_mask, st_hidden;
  Tensor st_logits, st_hidden_out;

  absl::StatusOr<Tensor> AllocStaging(DType dtype, const Shape& shape) {
    return Tensor::Empty(dtype, shape, rank.backend->staging_allocator());
  }

  // Takes a kind's opened draft, then checks the buffers, loads and allocates.
  absl::Status Build(OpenedDraft opened);
  absl::Status CheckBuffersFit() const;
  absl::Status AllocateWorkspaces();

  // device_hidden: the input rows come from DraftStepIO::hidden (`hidden` is not checked).
  absl::Status Validate(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target,
                        bool device_hidden) const;
  absl::Status ValidateOutputs(const TensorView& logits, const TensorView& hidden_out) const;
  absl::Status Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target,
                     const DraftStepIO& io);
  absl::Status CheckIO(const DraftStepIO& io) const;
  absl::Status Launch();
  absl::Status Finish(const TensorView& logits, const TensorView& hidden_out);
  std::vector<int64_t> Signature() const;
};

absl::StatusOr<HiddenStateTap> Eagle3HeadTap(const std::optional<std::vector<int>>& config_ids,
                                             const std::string& source, const DeepseekV2Config& target,
                                             const DraftModelOptions& options, int64_t fc_input_width) {
  std::optional<std::span<const int>> ids;
  if (options.aux_layer_ids_override.has_value()) {
    ids = std::span<const int>(*options.aux_layer_ids_override);
  } else if (config_ids.has_value()) {
    ids = std::span<const int>(*config_ids);
  }
  const int layers = static_cast<int>(target.num_hidden_layers);
  absl::StatusOr<HiddenStateTap> tap =
      HiddenStateTap::Create(ids, options.convention, layers, target.hidden_size, fc_input_width);
  if (!tap.ok() && options.aux_layer_ids_override.has_value()) {
    return absl::Status(tap.status().code(), "DraftModelOptions::aux_layer_ids_override " +
                                                 JoinInts(*options.aux_layer_ids_override) + " (replacing " + source +
                                                 "'s aux layer ids): " + std::string(tap.status().message()));
  }
  return tap;
}

absl::StatusOr<std::vector<int64_t>> ReadDraftVocabMapping(const Checkpoint& checkpoint, int64_t vocab,
                                                           int64_t draft_vocab) {
  const std::string where = "draft checkpoint '" + checkpoint.dir() + "'";
  if (!checkpoint.Has("d2t")) {
    if (draft_vocab == vocab) {  // no reduced vocabulary: the identity, as SGLang and vLLM read it
      return std::vector<int64_t>(static_cast<size_t>(draft_vocab), 0);
    }
    return absl::NotFoundError(where + " has no tensor 'd2t', which maps its " + Str(draft_vocab) +
                               " draft ids to the target's " + Str(vocab) +
                               " (i64 [draft_vocab_size] offsets: target id = draft id + d2t[draft id])");
  }
  EAGLE3_ASSIGN_OR_RETURN(TensorInfo info, checkpoint.Info("d2t"));
  if (info.dtype != DType::kI64 && info.dtype != DType::kI32) {
    return absl::InvalidArgumentError("tensor 'd2t' of the " + where + " is " + std::string(DTypeName(info.dtype)) +
                                      "; expected integer offsets (i64)");
  }
  EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape("d2t", Shape{draft_vocab}));
  EAGLE3_ASSIGN_OR_RETURN(Tensor values, checkpoint.Read("d2t", DType::kI64));
  const int64_t* offsets = values.data_as<int64_t>();
  std::vector<int64_t> draft_of(static_cast<size_t>(vocab), -1);
  for (int64_t i = 0; i < draft_vocab; ++i) {
    const int64_t target_id = i + offsets[i];
    if (target_id < 0 || target_id >= vocab) {
      return absl::InvalidArgumentError(
          "tensor 'd2t' of the " + where + ": d2t[" + Str(i) + "] = " + Str(offsets[i]) + " maps draft id " + Str(i) +
          " to target id " + Str(target_id) + ", outside the target vocabulary [0, " + Str(vocab) +
          "); d2t holds offsets (target id = draft id + d2t[draft id]), not target ids");
    }
    int64_t& other = draft_of[static_cast<size_t>(target_id)];
    if (other >= 0) {
      return absl::InvalidArgumentError("tensor 'd2t' of the " + where + " maps draft ids " + Str(other) + " and " +
                                        Str(i) + " both to target id " + Str(target_id));
    }
    other = i;
  }
  if (checkpoint.Has("t2d")) {
    EAGLE3_ASSIGN_OR_RETURN(TensorInfo t2d_info, checkpoint.Info("t2d"));
    if (t2d_info.dtype != DType::kBool && t2d_info.dtype != DType::kU8) {
      return absl::InvalidArgumentError("tensor 't2d' of the " + where + " is " +
                                        std::string(DTypeName(t2d_info.dtype)) + "; expected bool");
    }
    EAGLE3_RETURN_IF_ERROR(checkpoint.ExpectShape("t2d", Shape{vocab}));
    EAGLE3_ASSIGN_OR_RETURN(TensorView t2d, checkpoint.View("t2d"));
    const uint8_t* mapped = t2d.data_as<const uint8_t>();
    for (int64_t x = 0; x < vocab; ++x) {
      const int64_t from = draft_of[static_cast<size_t>(x)];
      if ((mapped[x] != 0) == (from >= 0)) continue;
      return absl::InvalidArgumentError(
          "tensors 't2d' and 'd2t' of the " + where + " disagree: " +
          (from >= 0
               ? "d2t maps draft id " + Str(from) + " to target id " + Str(x) + " but t2d[" + Str(x) + "] is false"
               : "t2d[" + Str(x) + "] is true but no draft id maps to target id " + Str(x) + " through d2t"));
    }
  }
  return std::vector<int64_t>(offsets, offsets + draft_vocab);
}

absl::Status DraftModel::Impl::Validate(std::span<const DraftSequenceInput> batch, const TensorView& hidden,
                                        bool from_target, bool device_hidden) const {
  if (batch.empty()) return absl::InvalidArgumentError("DraftModel::Forward: empty batch");
  int64_t total = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const DraftSequenceInput& in = batch[s];
    const std::string seq = "DraftModel::Forward: sequence " + Str(static_cast<int64_t>(s));
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(seq + " has no rows");
    total += n;
    for (int64_t i = 0; i < n; ++i) {
      if (in.tokens[i] < 0 || in.tokens[i] >= shape.vocab_size) {
        return absl::InvalidArgumentError(seq + " token " + Str(i) + " = " + Str(in.tokens[i]) +
                                          " is outside the target vocabulary [0, " + Str(shape.vocab_size) +
                                          ") (draft rows take target ids: map draft ids through d2t first)");
      }
    }
    if (!in.positions.empty() && static_cast<int64_t>(in.positions.size()) != n) {
      return absl::InvalidArgumentError(seq + " has " + Str(static_cast<int64_t>(in.positions.size())) +
                                        " positions for " + Str(n) + " tokens");
    }
    if (in.cache_len < 0) return absl::InvalidArgumentError(seq + " cache_len " + Str(in.cache_len) + " < 0");
    const int64_t end = in.cache_len + n;
    const int64_t capacity = static_cast<int64_t>(in.page_table.size()) * rank.options.page_size;
    if (end > rank.options.max_context_len || end > capacity) {
      return absl::OutOfRangeError(seq + ": draft KV capacity exhausted: " + Str(in.cache_len) + " cached + " +
                                   Str(n) + " new rows need " + Str(end) + " slots; its " +
                                   Str(static_cast<int64_t>(in.page_table.size())) + " pages of " +
                                   Str(rank.options.page_size) + " hold " + Str(capacity) + " and max_context_len is " +
                                   Str(rank.options.max_context_len));
    }
    for (size_t p = 0; p < in.page_table.size(); ++p) {
      if (in.page_table[p] < 0 || in.page_table[p] >= rank.options.num_kv_pages) {
        return absl::InvalidArgumentError(seq + " page_table[" + Str(static_cast<int64_t>(p)) + "] = " +
                                          Str(in.page_table[p]) + " is not a page of the draft cache [0, " +
                                          Str(rank.options.num_kv_pages) + ")");
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = in.positions.empty() ? in.cache_len + i : in.positions[i];
      if (pos < 0 || pos >= rank.options.max_context_len) {
        return absl::InvalidArgumentError(seq + " position " + Str(i) + " = " + Str(pos) +
                                          " is outside the RoPE table [0, max_context_len " +
                                          Str(rank.options.max_context_len) + ")");
      }
    }
    if (!in.mask.empty()) {
      if (static_cast<int64_t>(in.mask.size()) != n * end) {
        return absl::InvalidArgumentError(seq + " mask has " + Str(static_cast<int64_t>(in.mask.size())) +
                                          " entries, expected [n, cache_len + n] = " + Str(n) + " x " + Str(end));
      }
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* row = &in.mask[static_cast<size_t>(i * end)];
        if (row[in.cache_len + i] == 0) {
          return absl::InvalidArgumentError(seq + " mask row " + Str(i) + " does not attend its own slot " +
                                            Str(in.cache_len + i));
        }
        for (int64_t j = in.cache_len + i + 1; j < end; ++j) {
          if (row[j] != 0) {
            return absl::InvalidArgumentError(seq + " mask row " + Str(i) + " attends slot " + Str(j) +
                                              ", a later new row (rows may attend the cache, earlier rows and "
                                              "themselves)");
          }
        }
      }
    }
  }
  if (total > rank.options.max_tokens_per_forward) {
    return absl::OutOfRangeError("DraftModel::Forward: " + Str(total) + " rows exceed max_tokens_per_forward " +
                                 Str(rank.options.max_tokens_per_forward));
  }
  const int64_t width = from_target ? shape.input_width : shape.hidden_size;
  if (!device_hidden && !IsHostContiguousF32(hidden, total, width)) {
    return absl::InvalidArgumentError(
        "DraftModel::Forward: hidden must be f32[" + Str(total) + ", " + Str(width) + "] contiguous on the host (" +
        (from_target ? "the aux states of the tap, " + tap->Describe() : std::string("the fed-back hidden_out rows")) +
        "), got " + hidden.ToString());
  }
  return absl::OkStatus();
}

// The outputs Finish fills, against the staged step.
absl::Status DraftModel::Impl::ValidateOutputs(const TensorView& logits, const TensorView& hidden_out) const {
  const int64_t rows = step.out_rows, total = step.t;
  if ((!step.io.logits.empty() && !logits.empty()) || (!step.io.hidden_out.empty() && !hidden_out.empty())) {
    return absl::InvalidArgumentError(
        "DraftModel::Finish: the staged step leaves its logits / hidden_out on the device (DraftStepIO); pass "
        "empty views for them");
  }
  if (step.io.logits.empty() && !IsHostContiguousF32(logits, rows, shape.draft_vocab)) {
    return absl::InvalidArgumentError("DraftModel::Forward: logits must be f32[" + Str(rows) + ", " +
                                      Str(shape.draft_vocab) + "] contiguous on the host, got " +
                                      logits.ToString());
  }
  if (step.io.hidden_out.empty() && !IsHostContiguousF32(hidden_out, total, shape.hidden_size)) {
    return absl::InvalidArgumentError("DraftModel::Forward: hidden_out must be f32[" + Str(total) + ", " +
                                      Str(shape.hidden_size) + "] contiguous on the host, got " +
                                      hidden_out.ToString());
  }
  return absl::OkStatus();
}

absl::Status DraftModel::Impl::CheckIO(const DraftStepIO& io) const {
  const std::string who = "DraftStepIO";
  const Device dev = rank.backend->device();
  const int64_t t = step.t;
  const int64_t b = static_cast<int64_t>(step.n.size());
  const int64_t width = step.from_target ? shape.input_width : shape.hidden_size;
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "tokens", io.tokens, DType::kI64, Shape{t}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "hidden", io.hidden, DType::kF32, Shape{t, width}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "mask", io.mask, DType::kU8, Shape{t, rank.options.max_context_len}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "positions", io.positions, DType::kI64, Shape{t}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "slots", io.slots, DType::kI64, Shape{t}, dev));
  if (!io.page_tables.empty()) {
    const int64_t p = io.page_tables.rank() == 2 ? std::clamp<int64_t>(io.page_tables.dim(1), 1, max_pages) : max_pages;
    EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "page_tables", io.page_tables, DType::kI32, Shape{b, p}, dev));
  }
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "q_start", io.q_start, DType::kI32, Shape{b + 1}, dev));
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "kv_len", io.kv_len, DType::kI32, Shape{b}, dev));
  if (io.kv_only && (!io.logits.empty() || !io.hidden_out.empty() || !io.logit_rows.empty())) {
    return absl::InvalidArgumentError(
        "DraftStepIO.kv_only: logits, hidden_out and logit_rows must be empty (a kv_only step computes none of them)");
  }
  int64_t rows = step.out_rows;
  if (!io.logit_rows.empty()) {
    if (std::any_of(step.n.begin(), step.n.end(), [&](int64_t n) { return n != step.n.front(); })) {
      return absl::InvalidArgumentError("DraftStepIO.logit_rows needs every sequence to bring the same number of rows");
    }
    EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "logit_rows", io.logit_rows, DType::kI32, Shape{b}, dev));
    rows = b;
  }
  EAGLE3_RETURN_IF_ERROR(CheckStepView(who, "logits", io.logits, DType::kF32, Shape{rows, shape.draft_vocab}, dev));
  return CheckStepView(who, "hidden_out", io.hidden_out, DType::kF32, Shape{t, shape.hidden_size}, dev);
}

absl::Status DraftModel::Impl::Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden,
                                     bool from_target, const DraftStepIO& io) {
  step.staged = false;
  EAGLE3_RETURN_IF_ERROR(Validate(batch, hidden, from_target, !io.hidden.empty()));
  step.from_target = from_target;
  step.causal = std::all_of(batch.begin(), batch.end(), [](const DraftSequenceInput& in) { return in.mask.empty(); });
  step.n.clear();
  step.all_logits.clear();
  step.out_rows = LogitRows(batch);
  int64_t* tok = st_tokens.data_as<int64_t>();
  int64_t* pos = st_positions.data_as<int64_t>();
  int64_t* slot = st_slots.data_as<int64_t>();
  const int64_t s_max = rank.options.max_context_len, page_size = rank.options.page_size;
  int64_t t = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const DraftSequenceInput& in = batch[b];
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    const int64_t end = in.cache_len + n;
    step.n.push_back(n);
    step.all_logits.push_back(in.all_logits ? 1 : 0);
    StageSequence(in.page_table, static_cast<int64_t>(b), t, end, max_pages, st_tables, st_starts, st_lens);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = in.cache_len + i;
      tok[t + i] = in.tokens[static_cast<size_t>(i)];
      pos[t + i] = in.positions.empty() ? p : in.positions[static_cast<size_t>(i)];
      slot[t + i] = in.page_table[static_cast<size_t>(p / page_size)] * page_size + p % page_size;
      if (!io.mask.empty() || step.causal) continue;
      // Mask row over the sequence's end = cache_len + n slots: the caller's, or causal.
      uint8_t* row = st_mask.data_as<uint8_t>() + (t + i) * s_max;
      for (int64_t j = 0; j < end; ++j) {
        row[j] = in.mask.empty() ? (j <= p ? 1 : 0) : (in.mask[static_cast<size_t>(i * end + j)] != 0 ? 1 : 0);
      }
    }
    t += n;
  }
  st_starts.data_as<int32_t>()[batch.size()] = static_cast<int32_t>(t);
  step.t = t;
  step.io = DraftStepIO();
  EAGLE3_RETURN_IF_ERROR(CheckIO(io));
  step.io = io;
  if (!io.logit_rows.empty()) step.out_rows = static_cast<int64_t>(batch.size());
  // The input rows, [t, width] contiguous at the start of st_hidden.
  if (io.hidden.empty()) std::copy_n(hidden.data_as<const float>(), hidden.numel(), st_hidden.data_as<float>());
  step.staged = true;
  return absl::OkStatus();
}

std::vector<int64_t> DraftModel::Impl::Signature() const {
  if (!step.staged) return {};
  std::vector<int64_t> sig = {step.from_target, step.causal, step.io.kv_only, static_cast<int64_t>(step.n.size())};
  sig.insert(sig.end(), step.n.begin(), step.n.end());
  sig.insert(sig.end(), step.all_logits.begin(), step.all_logits.end());
  for (const TensorView* v : {&step.io.tokens, &step.io.hidden, &step.io.mask, &step.io.logit_rows, &step.io.logits,
                              &step.io.hidden_out, &step.io.positions, &step.io.slots, &step.io.page_tables,
                              &step.io.q_start, &step.io.kv_len}) {
    sig.push_back(ViewAddress(*v));
  }
  return sig;
}

absl::Status DraftModel::Impl::Launch() {
  if (!step.staged) return absl::FailedPreconditionError("DraftModel::Launch: no batch is staged (call Stage first)");
  Backend* backend = rank.backend;
  const int64_t t = step.t;
  const int64_t b = static_cast<int64_t>(step.n.size());
  const DraftStepIO& io = step.io;
  // Inputs the caller keeps on the device are read in place; the others are copied from staging.
  const TensorView tokens_t = io.tokens.empty() ? Rows(tokens, 0, t) : io.tokens;
  const TensorView pos_t = io.positions.empty() ? Rows(positions, 0, t) : io.positions;
  if (io.tokens.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_tokens, 0, t), tokens_t));
  if (io.positions.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_positions, 0, t), pos_t));
  if (io.slots.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_slots, 0, t), Rows(slots, 0, t)));
  if (io.page_tables.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_tables, 0, b), Rows(d_tables, 0, b)));
  if (io.q_start.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_starts, 0, b + 1), Rows(d_starts, 0, b + 1)));
  if (io.kv_len.empty()) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_lens, 0, b), Rows(d_lens, 0, b)));
  if (io.mask.empty() && !step.causal) EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(st_mask, 0, t), Rows(d_mask, 0, t)));
  const int64_t width = step.from_target ? shape.input_width : shape.hidden_size;

  DraftLayerStep s;
  s.rows = t;
  s.from_target = step.from_target;
  s.kv_only = io.kv_only;
  s.input = io.hidden.empty() ? TensorView(st_hidden.data(), DType::kF32, Shape{t, width}, st_hidden.device())
                              : io.hidden;
  s.embedded = Rows(e, 0, t);
  s.positions = pos_t;
  s.slots = io.slots.empty() ? Rows(slots, 0, t) : io.slots;
  s.slot_iota = slot_iota;
  s.page_tables = io.page_tables.empty() ? Rows(d_tables, 0, b) : io.page_tables;
  s.q_start = io.q_start.empty() ? Rows(d_starts, 0, b + 1) : io.q_start;
  s.kv_len = io.kv_len.empty() ? Rows(d_lens, 0, b) : io.kv_len;
  s.max_kv_len = rank.options.max_context_len;
  s.mask = !io.mask.empty() ? io.mask : step.causal ? TensorView() : Rows(d_mask, 0, t);  // empty: causal
  const TensorView h_t = Rows(h, 0, t);
  if (!io.kv_only) {
    s.head_in = h_t;
    s.hidden_out = io.hidden_out.empty() ? Rows(st_hidden_out, 0, t) : io.hidden_out;
  }

  // Every kind's row starts from the embedding of its token: vocab-parallel, summed over the ranks.
  EAGLE3_RETURN_IF_ERROR(backend->EmbeddingLookup(tokens_t, head.embed, rank.options.rank * vocab_shard, s.embedded));
  EAGLE3_RETURN_IF_ERROR(rank.Ranks().AllReduce(s.embedded));
  EAGLE3_RETURN_IF_ERROR(layer->Forward(s));
  if (io.kv_only) return absl::OkStatus();

  // lm_head over the requested rows, vocab-parallel, all-gathered into draft-vocabulary logits.
  int64_t out_rows = b;
  if (!io.logit_rows.empty()) {
    // One row per sequence, chosen on the device (indices local to each sequence's n rows).
    EAGLE3_RETURN_IF_ERROR(backend->GatherRows(h_t, io.logit_rows, Rows(lm_in, 0, b), b));
  } else {
    EAGLE3_ASSIGN_OR_RETURN(out_rows, CopyLogitRows(*backend, h_t, step.n, step.all_logits, lm_in));
  }
  return VocabParallelLogits(rank.Ranks(), Rows(lm_in, 0, out_rows), head.lm_head.empty() ? head.embed : head.lm_head,
                             logits_shard, logits_all, shape.draft_vocab,
                             io.logits.empty() ? Rows(st_logits, 0, out_rows) : io.logits);
}

absl::Status DraftModel::Impl::Finish(const TensorView& logits, const TensorView& hidden_out) {
  if (!step.staged) return absl::FailedPreconditionError("DraftModel::Finish: no batch is staged (call Stage first)");
  if (step.io.kv_only) {
    return absl::FailedPreconditionError("DraftModel::Finish: the staged step is kv_only (it has no outputs)");
  }
  EAGLE3_RETURN_IF_ERROR(ValidateOutputs(logits, hidden_out));
  EAGLE3_RETURN_IF_ERROR(rank.backend->Synchronize());
  if (step.io.logits.empty()) {
    std::copy_n(st_logits.data_as<const float>(), step.out_rows * shape.draft_vocab, logits.data_as<float>());
  }
  if (step.io.hidden_out.empty()) {
    std::copy_n(st_hidden_out.data_as<const float>(), step.t * shape.hidden_size, hidden_out.data_as<float>());
  }
  return absl::OkStatus();
}

DraftModel::DraftModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DraftModel::~DraftModel() = default;

DraftKind DraftModel::kind() const { return impl_->kind; }
const DraftShape& DraftModel::shape() const { return impl_->shape; }
const Eagle3DraftConfig& DraftModel::config() const { return impl_->llama_config; }
const MlaDraftConfig* DraftModel::mla_config() const {
  return impl_->mla_config.has_value() ? &*impl_->mla_config : nullptr;
}
const MtpConfig* DraftModel::mtp_config() const {
  return impl_->mtp_config.has_value() ? &*impl_->mtp_config : nullptr;
}
const DraftModelOptions& DraftModel::options() const { return impl_->rank.options; }
const HiddenStateTap& DraftModel::tap() const { return *impl_->tap; }
int64_t DraftModel::draft_vocab() const { return impl_->shape.draft_vocab; }
std::span<const int64_t> DraftModel::d2t() const { return impl_->d2t; }

int64_t DraftModel::LogitRows(std::span<const DraftSequenceInput> batch) {
  int64_t rows = 0;
  for (const DraftSequenceInput& in : batch) rows += in.all_logits ? static_cast<int64_t>(in.tokens.size()) : 1;
  return rows;
}

absl::Status DraftModel::Forward(std::span<const DraftSequenceInput> batch, const TensorView& hidden,
                                 bool from_target, const TensorView& logits, const TensorView& hidden_out) {
  Impl& m = *impl_;
  EAGLE3_RETURN_IF_ERROR(m.Stage(batch, hidden, from_target, DraftStepIO()));
  EAGLE3_RETURN_IF_ERROR(m.ValidateOutputs(logits, hidden_out));
  EAGLE3_RETURN_IF_ERROR(m.Launch());
  return m.Finish(logits, hidden_out);
}

absl::Status DraftModel::Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden,
                               bool from_target) {
  return impl_->Stage(batch, hidden, from_target, DraftStepIO());
}

absl::Status DraftModel::Stage(std::span<const DraftSequenceInput> batch, const TensorView& hidden, bool from_target,
                               const DraftStepIO& io) {
  return impl_->Stage(batch, hidden, from_target, io);
}

absl::Status DraftModel::Launch() { return impl_->Launch(); }

absl::Status DraftModel::Finish(const TensorView& logits, const TensorView& hidden_out) {
  return impl_->Finish(logits, hidden_out);
}

std::vector<int64_t> DraftModel::StepSignature() const { return impl_->Signature(); }

bool DraftModel::StepIsCapturable() const { return impl_->step.staged; }

// The buffers AllocateWorkspaces sizes from the options and the shape, summed with the layer's before
// anything is allocated: host staging always, the workspaces when they live in host memory (a host
// backend; a device allocator reports its own exhaustion).
absl::Status DraftModel::Impl::CheckBuffersFit() const {
  const DraftModelOptions& o = rank.options;
  const int64_t t = o.max_tokens_per_forward, s = o.max_context_len;
  const int64_t page_size = o.page_size, pages = o.num_kv_pages;
  const int64_t pages_per_seq = s / page_size + (s % page_size != 0 ? 1 : 0);
  const int64_t hidden = shape.hidden_size;
  const std::string tokens = "max_tokens_per_forward " + Str(t);
  const std::string context = "max_context_len " + Str(s);
  HostByteBudget budget("DraftModel");
  budget.Add(tokens + " x " + context + " (mask staging)", {t, s}, 1);
  budget.Add(tokens + " x " + context + " / page_size " + Str(page_size) + " (page table staging)",
             {t, pages_per_seq}, 4);
  budget.Add(tokens + " x draft_vocab_size " + Str(shape.draft_vocab) + " (logits staging)", {t, shape.draft_vocab},
             4);
  budget.Add(tokens + " x input width / hidden_size " + Str(hidden) + " (hidden staging)",
             {t, std::max(shape.input_width, hidden) + hidden}, 4);
  if (rank.backend->allocator().device().is_cpu()) {
    budget.Add(tokens + " x " + context + " (mask)", {t, s}, 1);
    budget.Add("(tp_size + 1) x " + tokens + " x draft vocab shard " + Str(draft_vocab_shard) + " (logits)",
               {o.tp_size + 1, t, draft_vocab_shard}, 4);
    budget.Add(tokens + " x 3 x hidden_size " + Str(hidden) + " (embedding and head rows)", {t, 3, hidden}, 4);
    budget.Add("num_kv_pages " + Str(pages) + " x page_size " + Str(page_size) + " (slot ids)", {pages, page_size},
               8);
  }
  layer->AddBuffers(tokens, context, budget);
  return budget.Check();
}

absl::Status DraftModel::Impl::AllocateWorkspaces() {
  const DraftModelOptions& o = rank.options;
  const int64_t t_max = o.max_tokens_per_forward;
  const int64_t s_max = o.max_context_len;
  for (Tensor* t : {&e, &h, &lm_in}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, rank.Alloc(DType::kF32, Shape{t_max, shape.hidden_size}));
  }
  EAGLE3_ASSIGN_OR_RETURN(logits_shard, rank.Alloc(DType::kF32, Shape{t_max, draft_vocab_shard}));
  EAGLE3_ASSIGN_OR_RETURN(logits_all, rank.Alloc(DType::kF32, Shape{o.tp_size * t_max, draft_vocab_shard}));
  for (Tensor* t : {&tokens, &positions, &slots}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, rank.Alloc(DType::kI64, Shape{t_max}));
  }
  // Staging and the attention metadata. Every sequence brings a row, so t_max bounds the sequences.
  max_pages = (s_max + o.page_size - 1) / o.page_size;
  for (Tensor* t : {&st_tokens, &st_positions, &st_slots}) {
    EAGLE3_ASSIGN_OR_RETURN(*t, AllocStaging(DType::kI64, Shape{t_max}));
  }
  EAGLE3_ASSIGN_OR_RETURN(st_tables, AllocStaging(DType::kI32, Shape{t_max, max_pages}));
  EAGLE3_ASSIGN_OR_RETURN(st_starts, AllocStaging(DType::kI32, Shape{t_max + 1}));
  EAGLE3_ASSIGN_OR_RETURN(st_lens, AllocStaging(DType::kI32, Shape{t_max}));
  EAGLE3_ASSIGN_OR_RETURN(st_mask, AllocStaging(DType::kU8, Shape{t_max, s_max}));
  EAGLE3_ASSIGN_OR_RETURN(st_hidden,
                          AllocStaging(DType::kF32, Shape{t_max * std::max(shape.input_width, shape.hidden_size)}));
  EAGLE3_ASSIGN_OR_RETURN(st_logits, AllocStaging(DType::kF32, Shape{t_max, shape.draft_vocab}));
  EAGLE3_ASSIGN_OR_RETURN(st_hidden_out, AllocStaging(DType::kF32, Shape{t_max, shape.hidden_size}));
  std::fill_n(st_mask.data_as<uint8_t>(), t_max * s_max, uint8_t{0});  // columns past a kv_len are never read
  EAGLE3_ASSIGN_OR_RETURN(d_tables, rank.Alloc(DType::kI32, st_tables.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_starts, rank.Alloc(DType::kI32, st_starts.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_lens, rank.Alloc(DType::kI32, st_lens.shape()));
  EAGLE3_ASSIGN_OR_RETURN(d_mask, rank.Alloc(DType::kU8, st_mask.shape()));
  EAGLE3_ASSIGN_OR_RETURN(slot_iota, DeviceIota(o.num_kv_pages * o.page_size, *rank.backend));
  return absl::OkStatus();
}

absl::Status DraftModel::Impl::Build(OpenedDraft opened) {
  kind = opened.kind;
  shape = opened.shape;
  tap = std::move(opened.tap);
  d2t = std::move(opened.d2t);
  llama_config = std::move(opened.llama_config);
  mla_config = std::move(opened.mla_config);
  mtp_config = std::move(opened.mtp_config);
  layer = std::move(opened.layer);
  const int tp = rank.options.tp_size;
  vocab_shard = PaddedSize(shape.vocab_size, kVocabPadPerRank * tp) / tp;
  draft_vocab_shard = PaddedSize(shape.draft_vocab, kVocabPadPerRank * tp) / tp;
  EAGLE3_ASSIGN_OR_RETURN(rank.weight_dtype,
                          ResolveWeightDtype(rank.options.weight_dtype, *rank.backend, "DraftModel"));
  EAGLE3_RETURN_IF_ERROR(CheckBuffersFit());
  EAGLE3_RETURN_IF_ERROR(layer->Load(head));
  return AllocateWorkspaces();
}

absl::StatusOr<std::unique_ptr<DraftModel>> DraftModel::Create(const std::string& draft_dir,
                                                               const std::string& target_dir,
                                                               const DraftModelOptions& options,
                                                               Communicator* communicator, Backend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("DraftModel: backend is null");
  EAGLE3_RETURN_IF_ERROR(options.Check("DraftModel", communicator));
  auto impl = std::make_unique<Impl>();
  impl->rank = DraftRank{options, communicator, backend};
  EAGLE3_ASSIGN_OR_RETURN(const DeepseekV2Config target, DeepseekV2Config::FromFile(target_dir));
  // The head's kind from its architectures, as CheckDraftPair decides it.
  EAGLE3_ASSIGN_OR_RETURN(const bool mla, NamesMlaDraftArchitecture(draft_dir));
  EAGLE3_ASSIGN_OR_RETURN(OpenedDraft opened, mla ? OpenMlaDraft(draft_dir, target_dir, target, impl->rank)
                                                  : OpenLlamaDraft(draft_dir, target_dir, target, impl->rank));
  EAGLE3_RETURN_IF_ERROR(impl->Build(std::move(opened)));
  return std::unique_ptr<DraftModel>(new DraftModel(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<DraftModel>> DraftModel::CreateMtp(const std::string& target_dir,
                                                                  const DraftModelOptions& options,
                                                                  Communicator* communicator, Backend* backend) {
  if (backend == nullptr) return absl::InvalidArgumentError("DraftModel: backend is null");
  EAGLE3_RETURN_IF_ERROR(options.Check("DraftModel", communicator));
  auto impl = std::make_unique<Impl>();
  impl->rank = DraftRank{options, communicator, backend};
  EAGLE3_ASSIGN_OR_RETURN(const DeepseekV2Config target, DeepseekV2Config::FromFile(target_dir));
  EAGLE3_ASSIGN_OR_RETURN(OpenedDraft opened, OpenMtpDraft(target_dir, target, impl->rank));
  EAGLE3_RETURN_IF_ERROR(impl->Build(std::move(opened)));
  return std::unique_ptr<DraftModel>(new DraftModel(std::move(impl)));
}

}  // namespace eagle3
