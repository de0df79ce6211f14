#include "eagle3/speculative_step.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "speculative_step_testing.h"
#include "step_buffers.h"
#include "view_slices.h"
#include "zero_fill.h"
#include "eagle3/status.h"
#include "eagle3/tensor.h"

namespace eagle3 {
namespace {

std::string Str(int64_t v) { return std::to_string(v); }

// The message of a tree-build error record (Backend::TreeBuildStep's layout).
absl::Status TreeBuildRecordStatus(const int64_t* record, int64_t seq) {
  const std::string where = "SpeculativeStep: sequence " + Str(seq) + ": the draft's logits of tree pass " +
                            Str(record[1]) + ", frontier row " + Str(record[2]);
  switch (record[0]) {
    case 1: return absl::InvalidArgumentError(where + " hold NaN at draft id " + Str(record[3]));
    case 2: return absl::InvalidArgumentError(where + " hold +inf at draft id " + Str(record[3]));
    case 3: return absl::InvalidArgumentError(where + " have no finite logit (all -inf)");
    default: return absl::InternalError(where + ": unknown tree-build error kind " + Str(record[0]));
  }
}

// The message of a verify error record (Backend::TreeVerify's layout).
absl::Status VerifyRecordStatus(const int64_t* record, int64_t seq) {
  const std::string where = "SpeculativeStep: sequence " + Str(seq) + ": ";
  switch (record[0]) {
    case 1: return absl::InvalidArgumentError(where + "the draft tree is malformed at node " + Str(record[1]));
    case 2:
      return absl::InvalidArgumentError(where + "tree node " + Str(record[1]) + " holds token " + Str(record[2]) +
                                        ", outside the target vocabulary");
    case 3:
    case 4:
      return absl::InvalidArgumentError(where + "the target's logits after tree node " + Str(record[1]) + " hold " +
                                        (record[0] == 3 ? "NaN" : "+inf") + " at token id " + Str(record[2]));
    case 5:
      return absl::InvalidArgumentError(where + "the target's logits after tree node " + Str(record[1]) +
                                        " have no finite logit (all -inf)");
    default: return absl::InternalError(where + "unknown verify error kind " + Str(record[0]));
  }
}

}  // namespace

struct SpeculativeStep::Impl {
  TargetModel* target = nullptr;
  DraftModel* draft = nullptr;
  Backend* backend = nullptr;
  SpeculativeStepOptions options;
  StepCounters counters;
  uint64_t coin_counter = 0;  // Philox counter base of the next Prefill / Run
  // Tells this object's captured steps from those of any other (an address could be reused by a
  // later step whose buffers sit elsewhere).
  int64_t id = 0;

  // The shape of the step being staged (SelectTree); passes = draft forwards of its tree (S - 1).
  int64_t max_batch = 0, nodes = 1, k = 1, passes = 0;
  bool drafting = false;  // a tree is built this step (else the roots alone are verified)
  // The largest of each over options.trees (buffers are sized for them).
  int64_t max_nodes = 1, max_k = 1, max_passes = 0, max_draft_slots = 0, workspace_bytes = 0;
  int64_t vocab = 0, draft_vocab = 0, hidden = 0, tap_width = 0, mask_width = 0, table_width = 0;
  int64_t draft_table_width = 0;  // page entries of a draft page table: ceil(draft max_context_len / page_size)
  TreeBuildShape tree_shape;

  // Root state: the draft's logits and fed-back hidden after each sequence's newest token, by row.
  Tensor root_logits, root_hidden, root_logits_tmp, root_hidden_tmp;
  // The tapped target states behind each row's root (the draft's input for the root's own row), by
  // row: written by Prefill and by steps that draft nothing, read by a root refresh.
  Tensor root_taps;
  // After a step that drafted nothing, the root state is stale: such a step writes only the draft's
  // KV rows (DraftStepIO::kv_only), and the next drafting step first recomputes every root row
  // (the refresh) from root_taps.
  bool roots_stale = false;
  // Tree build. The trees of a step are contiguous [B, N] views from the start of buffers sized
  // for the largest tree.
  Tensor d2t, tree_workspace, frontier_tokens, frontier_parents;  // frontier_*: [max(S, 1), B k]
  Tensor pass_logits, hidden_in, hidden_out, masks[2];
  Tensor tree_tokens, tree_parents, tree_positions, tree_mask;
  // Verify forward, verification and commit. zero_offsets: zeros for commit_offsets when trees of
  // several sizes alternate (TreeVerify writes only each path's entries, and the catch-up's padding
  // rows gather through the rest, which must stay below the current tree's node count).
  Tensor verify_logits, aux, accepted, commit_offsets, commit_counts, zero_offsets;
  // The error records of the last tree build and verification ([B, 4] and [B, 3] i64).
  Tensor tree_errors, verify_errors;
  // Draft catch-up (also the prefill's draft pass).
  Tensor catch_in, catch_out;
  Mirrored upload, download;

  // Host-side per-call scratch (kept to avoid reallocation).
  std::vector<SequenceInput> target_batch;
  std::vector<DraftSequenceInput> draft_batch;
  std::vector<std::vector<int64_t>> placeholder_tokens, draft_positions;
  std::vector<DraftSequenceInput> refresh_batch;
  std::vector<std::vector<int64_t>> refresh_tokens;
  DraftRewriter draft_rewriter;  // SpeculativeStepTesting's hook; empty unless a benchmark sets it

  absl::StatusOr<Tensor> Alloc(DType dtype, const Shape& shape) {
    return Tensor::Empty(dtype, shape, backend->allocator());
  }
  absl::StatusOr<Tensor> AllocZeroed(DType dtype, const Shape& shape) {
    EAGLE3_ASSIGN_OR_RETURN(Tensor t, Alloc(dtype, shape));
    EAGLE3_RETURN_IF_ERROR(ZeroFill(*backend, t));
    return t;
  }
  absl::Status AllocateBuffers();
  TreeVerifyOutputs VerifyOutputs(int64_t b, int64_t n) const;
  absl::Status CheckSequences(std::span<const StepSequence> seqs) const;
  // Makes options.trees[tree] (or no drafted tokens: kNoDraftTokens) the current shape.
  void SelectTree(int tree) {
    drafting = draft != nullptr && tree != kNoDraftTokens;
    const DraftTreeParams& t = options.trees[static_cast<size_t>(drafting ? tree : 0)];
    nodes = drafting ? t.num_draft_tokens : 1;
    k = drafting ? t.topk : 1;
    passes = drafting ? t.num_steps - 1 : 0;
    tree_shape = TreeBuildShape{max_batch, t.topk, t.num_steps, t.num_draft_tokens, draft_vocab};
  }
  StepDims Dims(int64_t b) const {
    return StepDims{b, nodes, k, passes, table_width, draft_table_width, draft != nullptr ? mask_width : 0};
  }
  // Fills the upload staging for `seqs` (host only).
  void StageUpload(std::span<const StepSequence> seqs, const StepUploadLayout& up);
  // Stages every model step of a speculative step (host only: their checks run here) and, with
  // `launch`, enqueues the step's device work after each: the upload, the tree passes, the verify
  // forward, verification, the results' download, the commit and the catch-up. Without `launch`
  // nothing is enqueued (the stages a replayed capture needs).
  // results_copied: set once the results' download is enqueued.
  absl::Status Enqueue(std::span<const StepSequence> seqs, const StepUploadLayout& up, const ResultLayout& res,
                       bool launch, bool* results_copied = nullptr);
  absl::Status DraftTreePass(std::span<const StepSequence> seqs, int64_t pass, const StepUploadLayout& up,
                             bool launch);
  // Recomputes every sequence's root state (logits and fed-back hidden, in this step's order) from
  // root_taps and its root: the draft row at position cache_len - 1, which rewrites that row's KV
  // bit for bit.
  absl::Status RefreshRoots(std::span<const StepSequence> seqs, const StepUploadLayout& up, bool identity_rows,
                            bool launch);
  // The results of b sequences with n nodes each (after the step's synchronization); any error
  // found on the device becomes the Status of the first sequence holding one.
  absl::Status ReadResults(int64_t b, int64_t n, const ResultLayout& res, std::vector<StepOutput>* out);
  void SeedOffset(const TensorView& host) {
    host.data_as<int64_t>()[0] = static_cast<int64_t>(options.seed);
    host.data_as<int64_t>()[1] = static_cast<int64_t>(coin_counter++);
  }
};

absl::Status SpeculativeStep::Impl::AllocateBuffers() {
  const int64_t b = max_batch, n = max_nodes, k = max_k;
  const int64_t t_target = target->options().max_tokens_per_forward;
  const int64_t t_draft = draft != nullptr ? draft->options().max_tokens_per_forward : 0;
  EAGLE3_ASSIGN_OR_RETURN(verify_logits, Alloc(DType::kF32, Shape{b * n, vocab}));
  EAGLE3_ASSIGN_OR_RETURN(accepted, AllocZeroed(DType::kI32, Shape{b, n}));
  EAGLE3_ASSIGN_OR_RETURN(commit_offsets, AllocZeroed(DType::kI32, Shape{b, n}));
  EAGLE3_ASSIGN_OR_RETURN(commit_counts, AllocZeroed(DType::kI32, Shape{b}));
  if (options.trees.size() > 1) {
    EAGLE3_ASSIGN_OR_RETURN(zero_offsets, AllocZeroed(DType::kI32, Shape{b * n}));
  }
  int64_t up_bytes = StepUploadLayout(StepDims{b, n, k, max_passes, table_width, draft_table_width,
                                               draft != nullptr ? mask_width : 0})
                         .bytes;
  up_bytes = std::max(up_bytes, PrefillUploadLayout(std::max(t_target, t_draft)).bytes);
  EAGLE3_ASSIGN_OR_RETURN(upload.host, Tensor::Empty(DType::kU8, Shape{up_bytes}, backend->staging_allocator()));
  EAGLE3_ASSIGN_OR_RETURN(upload.device, AllocZeroed(DType::kU8, Shape{up_bytes}));
  std::memset(upload.host.data(), 0, static_cast<size_t>(up_bytes));
  const int64_t down_bytes = ResultLayout(b, n, draft != nullptr).bytes;
  EAGLE3_ASSIGN_OR_RETURN(tree_errors, AllocZeroed(DType::kI64, Shape{b, kTreeBuildErrorWidth}));
  EAGLE3_ASSIGN_OR_RETURN(verify_errors, AllocZeroed(DType::kI64, Shape{b, kVerifyErrorWidth}));
  EAGLE3_ASSIGN_OR_RETURN(download.host, Tensor::Empty(DType::kU8, Shape{down_bytes}, backend->staging_allocator()));
  // Zeroed: entries past a sequence's emitted count (read by the padded catch-up rows) stay valid ids.
  EAGLE3_ASSIGN_OR_RETURN(download.device, AllocZeroed(DType::kU8, Shape{down_bytes}));
  if (draft == nullptr) return absl::OkStatus();

  EAGLE3_ASSIGN_OR_RETURN(root_logits, AllocZeroed(DType::kF32, Shape{b, draft_vocab}));
  EAGLE3_ASSIGN_OR_RETURN(root_logits_tmp, Alloc(DType::kF32, Shape{b, draft_vocab}));
  EAGLE3_ASSIGN_OR_RETURN(root_hidden, AllocZeroed(DType::kF32, Shape{b, hidden}));
  EAGLE3_ASSIGN_OR_RETURN(root_hidden_tmp, Alloc(DType::kF32, Shape{b, hidden}));
  {
    const std::span<const int64_t> offsets = draft->d2t();
    EAGLE3_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(DType::kI64, Shape{draft_vocab}));
    std::copy(offsets.begin(), offsets.end(), host.data_as<int64_t>());
    EAGLE3_ASSIGN_OR_RETURN(d2t, Alloc(DType::kI64, Shape{draft_vocab}));
    EAGLE3_RETURN_IF_ERROR(backend->Copy(host, d2t));
  }
  EAGLE3_ASSIGN_OR_RETURN(tree_workspace, AllocZeroed(DType::kU8, Shape{workspace_bytes}));
  const int64_t steps = max_passes + 1;
  EAGLE3_ASSIGN_OR_RETURN(frontier_tokens, AllocZeroed(DType::kI64, Shape{steps, b * k}));
  EAGLE3_ASSIGN_OR_RETURN(frontier_parents, AllocZeroed(DType::kI32, Shape{steps, b * k}));
  EAGLE3_ASSIGN_OR_RETURN(pass_logits, Alloc(DType::kF32, Shape{b * k, draft_vocab}));
  EAGLE3_ASSIGN_OR_RETURN(hidden_in, Alloc(DType::kF32, Shape{b * k, hidden}));
  EAGLE3_ASSIGN_OR_RETURN(hidden_out, Alloc(DType::kF32, Shape{b * k, hidden}));
  for (Tensor& mask : masks) {
    EAGLE3_ASSIGN_OR_RETURN(mask, AllocZeroed(DType::kU8, Shape{b * k, mask_width}));
  }
  EAGLE3_ASSIGN_OR_RETURN(tree_tokens, AllocZeroed(DType::kI64, Shape{b, n}));
  EAGLE3_ASSIGN_OR_RETURN(tree_parents, AllocZeroed(DType::kI32, Shape{b, n}));
  EAGLE3_ASSIGN_OR_RETURN(tree_positions, AllocZeroed(DType::kI64, Shape{b, n}));
  EAGLE3_ASSIGN_OR_RETURN(tree_mask, AllocZeroed(DType::kU8, Shape{b * n, n}));
  EAGLE3_ASSIGN_OR_RETURN(aux, AllocZeroed(DType::kF32, Shape{std::max(b * n, t_target), tap_width}));
  EAGLE3_ASSIGN_OR_RETURN(catch_in, Alloc(DType::kF32, Shape{b * n, tap_width}));
  EAGLE3_ASSIGN_OR_RETURN(root_taps, AllocZeroed(DType::kF32, Shape{b, tap_width}));
  EAGLE3_ASSIGN_OR_RETURN(catch_out, Alloc(DType::kF32, Shape{std::max(b * n, t_draft), hidden}));
  return absl::OkStatus();
}

TreeVerifyOutputs SpeculativeStep::Impl::VerifyOutputs(int64_t b, int64_t n) const {
  const ResultLayout res(b, n, false);  // the counts and tokens sit alike with or without a tree
  TreeVerifyOutputs out;
  out.num_accepted = download.Device(res.num_accepted, DType::kI32, Shape{b});
  out.out_tokens = download.Device(res.out_tokens, DType::kI64, Shape{b, n});
  out.errors = Rows(verify_errors, 0, b);
  out.accepted = At(accepted, 0, DType::kI32, Shape{b, n});
  out.commit_offsets = At(commit_offsets, 0, DType::kI32, Shape{b, n});
  out.commit_counts = At(commit_counts, 0, DType::kI32, Shape{b});
  return out;
}

absl::Status SpeculativeStep::Impl::CheckSequences(std::span<const StepSequence> seqs) const {
  const int64_t b = static_cast<int64_t>(seqs.size());
  if (b < 1 || b > max_batch) {
    return absl::InvalidArgumentError("SpeculativeStep::Run: " + Str(b) + " sequences; expected 1 to max_batch " +
                                      Str(max_batch));
  }
  std::vector<uint8_t> seen(static_cast<size_t>(max_batch), 0);
  const int64_t draft_slots = draft != nullptr ? std::max(nodes, passes * k) : 0;  // this step's
  for (int64_t i = 0; i < b; ++i) {
    const StepSequence& s = seqs[static_cast<size_t>(i)];
    const std::string seq = "SpeculativeStep::Run: sequence " + Str(i);
    if (s.row < 0 || s.row >= max_batch || seen[static_cast<size_t>(s.row)]++ != 0) {
      return absl::InvalidArgumentError(seq + " has row " + Str(s.row) +
                                        ", which is outside [0, max_batch) or another sequence's");
    }
    if (s.root < 0 || s.root >= vocab) {
      return absl::InvalidArgumentError(seq + " root token " + Str(s.root) + " is outside the vocabulary [0, " +
                                        Str(vocab) + ")");
    }
    if (s.cache_len < 1) {
      return absl::InvalidArgumentError(seq + " cache_len " + Str(s.cache_len) +
                                        " < 1 (a sequence starts with Prefill)");
    }
    const TargetModelOptions& t = target->options();
    const int64_t target_need = s.cache_len + nodes;
    const int64_t target_have = static_cast<int64_t>(s.target_pages.size()) * t.page_size;
    if (target_need > target_have || target_need > t.max_context_len) {
      return absl::OutOfRangeError(seq + ": KV capacity exhausted: a step needs " + Str(target_need) +
                                   " target KV slots (cache_len " + Str(s.cache_len) + " + " + Str(nodes) +
                                   " tree nodes); its " + Str(static_cast<int64_t>(s.target_pages.size())) +
                                   " target pages hold " + Str(target_have) + " and the target's max_context_len is " +
                                   Str(t.max_context_len));
    }
    if (draft != nullptr) {
      const DraftModelOptions& o = draft->options();
      const int64_t need = s.cache_len + draft_slots;
      const int64_t have = static_cast<int64_t>(s.draft_pages.size()) * o.page_size;
      if (need > have || need > o.max_context_len) {
        return absl::OutOfRangeError(seq + ": a step needs " + Str(need) + " draft KV slots (cache_len " +
                                     Str(s.cache_len) + " + " + Str(draft_slots) + " tree rows); its " +
                                     Str(static_cast<int64_t>(s.draft_pages.size())) + " draft pages hold " +
                                     Str(have) + " and the draft's max_context_len is " + Str(o.max_context_len));
      }
    }
  }
  return absl::OkStatus();
}

// Draft pass `pass` (1 <= pass < S) of the tree: the k frontier rows of every sequence, each fed its
// parent's hidden and mask row (gathered on the device through the previous pass's frontier parents),
// written to draft slots cache_len + (pass - 1) k + f at RoPE position cache_len - 1 + pass.
absl::Status SpeculativeStep::Impl::DraftTreePass(std::span<const StepSequence> seqs, int64_t pass,
                                                  const StepUploadLayout& up, bool launch) {
  const int64_t b = static_cast<int64_t>(seqs.size());
  const int64_t rows = b * k;
  const TensorView parents = Rows(frontier_parents.view(), pass - 1, 1).Reshape(Shape{rows});
  const TensorView mask = Rows(masks[pass % 2], 0, rows);
  if (launch) {
    const TensorView prev_hidden = pass == 1 ? Rows(root_hidden, 0, b) : Rows(hidden_out, 0, rows);
    EAGLE3_RETURN_IF_ERROR(backend->GatherRows(prev_hidden, parents, Rows(hidden_in, 0, rows)));
    const TensorView prev_mask = pass == 1 ? upload.Device(up.root_mask, DType::kU8, Shape{b, mask_width})
                                           : Rows(masks[(pass - 1) % 2], 0, rows);
    const TensorView columns = upload.Device(up.own_columns, DType::kI32, Shape{passes, rows});
    EAGLE3_RETURN_IF_ERROR(
        backend->ExtendMaskRows(prev_mask, parents, Rows(columns, pass - 1, 1).Reshape(Shape{rows}), mask));
  }
  draft_batch.assign(seqs.size(), DraftSequenceInput());
  draft_positions.resize(seqs.size());
  placeholder_tokens.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const StepSequence& s = seqs[i];
    placeholder_tokens[i].assign(static_cast<size_t>(k), s.root);
    draft_positions[i].assign(static_cast<size_t>(k), s.cache_len - 1 + pass);
    DraftSequenceInput& in = draft_batch[i];
    in.tokens = placeholder_tokens[i];
    in.positions = draft_positions[i];
    in.page_table = s.draft_pages;
    in.cache_len = s.cache_len + (pass - 1) * k;
    in.all_logits = true;
  }
  DraftStepIO io;
  io.tokens = Rows(frontier_tokens.view(), pass - 1, 1).Reshape(Shape{rows});
  io.hidden = Rows(hidden_in, 0, rows);
  io.mask = mask;
  io.logits = Rows(pass_logits, 0, rows);
  io.hidden_out = Rows(hidden_out, 0, rows);
  io.positions = Rows(upload.Device(up.pass_positions, DType::kI64, Shape{passes, rows}), pass - 1, 1).Reshape(Shape{rows});
  io.slots = Rows(upload.Device(up.pass_slots, DType::kI64, Shape{passes, rows}), pass - 1, 1).Reshape(Shape{rows});
  io.page_tables = upload.Device(up.draft_tables, DType::kI32, Shape{b, draft_table_width});
  io.q_start = upload.Device(up.pass_starts, DType::kI32, Shape{b + 1});
  io.kv_len = Rows(upload.Device(up.pass_lens, DType::kI32, Shape{passes, b}), pass - 1, 1).Reshape(Shape{b});
  EAGLE3_RETURN_IF_ERROR(draft->Stage(draft_batch, TensorView(), /*from_target=*/false, io));
  return launch ? draft->Launch() : absl::OkStatus();
}

absl::Status SpeculativeStep::Impl::Enqueue(std::span<const StepSequence> seqs, const StepUploadLayout& up,
                                            const ResultLayout& res, bool launch, bool* results_copied) {
  const int64_t b = static_cast<int64_t>(seqs.size());
  const int64_t n = nodes;
  if (launch) EAGLE3_RETURN_IF_ERROR(backend->Copy(upload.HostBytes(up.bytes), upload.DeviceBytes(up.bytes)));
  const TensorView roots = upload.Device(up.roots, DType::kI64, Shape{b});
  const TensorView seed_offset = upload.Device(up.seed_offset, DType::kI64, Shape{2});
  const TensorView tree_records = Rows(tree_errors, 0, b);
  bool identity_rows = true;
  for (int64_t i = 0; i < b; ++i) identity_rows = identity_rows && seqs[static_cast<size_t>(i)].row == i;

  if (drafting) {
    if (roots_stale) {
      EAGLE3_RETURN_IF_ERROR(RefreshRoots(seqs, up, identity_rows, launch));
    } else if (launch && !identity_rows) {
      // The root state of the rows this step keeps, in this step's order.
      const TensorView rows = upload.Device(up.rows, DType::kI32, Shape{b});
      EAGLE3_RETURN_IF_ERROR(backend->GatherRows(root_logits, rows, Rows(root_logits_tmp, 0, b)));
      EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(root_logits_tmp, 0, b), Rows(root_logits, 0, b)));
      EAGLE3_RETURN_IF_ERROR(backend->GatherRows(root_hidden, rows, Rows(root_hidden_tmp, 0, b)));
      EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(root_hidden_tmp, 0, b), Rows(root_hidden, 0, b)));
    }
    TreeBuildShape shape = tree_shape;
    shape.batch = b;
    const int64_t rows = b * k;
    auto frontier = [&](int64_t pass) {
      return std::pair(Rows(frontier_tokens.view(), pass, 1).Reshape(Shape{rows}),
                       Rows(frontier_parents.view(), pass, 1).Reshape(Shape{rows}));
    };
    if (launch) {
      auto [tokens0, parents0] = frontier(0);
      EAGLE3_RETURN_IF_ERROR(backend->TreeBuildStep(shape, 0, Rows(root_logits, 0, b), d2t, tree_workspace,
                                                    tree_records, tokens0, parents0));
    }
    for (int64_t pass = 1; pass <= passes; ++pass) {
      EAGLE3_RETURN_IF_ERROR(DraftTreePass(seqs, pass, up, launch));
      if (!launch) continue;
      auto [tokens, parents] = frontier(pass);
      EAGLE3_RETURN_IF_ERROR(backend->TreeBuildStep(shape, static_cast<int>(pass), Rows(pass_logits, 0, rows), d2t,
                                                    tree_workspace, tree_records, tokens, parents));
    }
    if (launch) {
      EAGLE3_RETURN_IF_ERROR(backend->TreeBuildFinalize(
          shape, tree_workspace, tree_records, roots, upload.Device(up.root_positions, DType::kI64, Shape{b}),
          At(tree_tokens, 0, DType::kI64, Shape{b, n}), At(tree_parents, 0, DType::kI32, Shape{b, n}), At(tree_positions, 0, DType::kI64, Shape{b, n}), At(tree_mask, 0, DType::kU8, Shape{b * n, n})));
      if (draft_rewriter) {
        EAGLE3_RETURN_IF_ERROR(draft_rewriter(DraftedTrees{b, n, At(tree_tokens, 0, DType::kI64, Shape{b, n}),
                                                           At(tree_parents, 0, DType::kI32, Shape{b, n}),
                                                           At(tree_positions, 0, DType::kI64, Shape{b, n})}));
      }
    }
  }

  // The verify forward: every sequence's tree (or root) through the target, with the draft's taps.
  target_batch.assign(seqs.size(), SequenceInput());
  placeholder_tokens.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const StepSequence& s = seqs[i];
    placeholder_tokens[i].assign(static_cast<size_t>(n), s.root);
    SequenceInput& in = target_batch[i];
    in.tokens = placeholder_tokens[i];
    in.page_table = s.target_pages;
    in.cache_len = s.cache_len;
    in.all_logits = true;
  }
  TargetStepIO tio;
  tio.logits = Rows(verify_logits, 0, b * n);
  const HiddenStateTap* tap = draft != nullptr ? &draft->tap() : nullptr;
  if (draft != nullptr) tio.aux = Rows(aux, 0, b * n);
  if (drafting) {
    tio.tokens = At(tree_tokens, 0, DType::kI64, Shape{b, n}).Reshape(Shape{b * n});
    tio.positions = At(tree_positions, 0, DType::kI64, Shape{b, n}).Reshape(Shape{b * n});
    tio.tree_mask = At(tree_mask, 0, DType::kU8, Shape{b * n, n});
  }
  EAGLE3_RETURN_IF_ERROR(target->Stage(target_batch, tap, tio));
  const TreeVerifyOutputs vout = VerifyOutputs(b, n);
  if (launch) {
    EAGLE3_RETURN_IF_ERROR(target->Launch());
    if (drafting && !zero_offsets.empty()) {
      EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(zero_offsets, 0, b * n), vout.commit_offsets.Reshape(Shape{b * n})));
    }
    if (drafting) {
      EAGLE3_RETURN_IF_ERROR(backend->TreeVerify(At(tree_tokens, 0, DType::kI64, Shape{b, n}), At(tree_parents, 0, DType::kI32, Shape{b, n}), tio.logits,
                                                 options.sampling, seed_offset, vout));
    } else {
      EAGLE3_RETURN_IF_ERROR(backend->TreeVerify(roots.Reshape(Shape{b, 1}),
                                                 upload.Device(up.root_parents, DType::kI32, Shape{b, 1}), tio.logits,
                                                 options.sampling, seed_offset, vout));
    }
    if (drafting) {
      // Each sequence's tree-build error kind (column 0 of its record) joins the results.
      EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(tree_errors, 0, b).Narrow(1, 0, 1),
                                           download.Device(res.tree_kinds, DType::kI64, Shape{b, 1})));
    }
    // The step's one transfer to the host, in flight while the commit and the catch-up run.
    EAGLE3_RETURN_IF_ERROR(backend->Copy(download.DeviceBytes(res.bytes), download.HostBytes(res.bytes)));
    if (results_copied != nullptr) *results_copied = true;
  }
  if (draft == nullptr) return absl::OkStatus();

  if (launch && drafting) {
    // Commit the accepted paths' target KV rows (a root alone is already in place).
    EAGLE3_RETURN_IF_ERROR(target->CommitAcceptedOnDevice(
        upload.Device(up.tables, DType::kI32, Shape{b, table_width}), upload.Device(up.cache_len, DType::kI32, Shape{b}),
        vout.commit_offsets, vout.commit_counts));
  }
  // Catch-up: row j of sequence b pairs the tapped states of its j-th path node with the token after
  // it (out_tokens[b][j]), at position cache_len + j. Rows past the path (j > num_accepted) are
  // padding that keeps the shape fixed: they read valid stale entries and write draft KV only past
  // the new cache length; their outputs are never used. A step that drafted nothing writes only the
  // draft's KV row (its inputs kept in root_taps for the refresh the next drafting step runs).
  const TensorView catch_rows = drafting ? Rows(catch_in, 0, b * n) : Rows(root_taps, 0, b);
  if (launch) {
    EAGLE3_RETURN_IF_ERROR(
        backend->GatherRows(Rows(aux, 0, b * n), vout.commit_offsets.Reshape(Shape{b * n}), catch_rows, b));
  }
  draft_batch.assign(seqs.size(), DraftSequenceInput());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const StepSequence& s = seqs[i];
    DraftSequenceInput& in = draft_batch[i];
    in.tokens = placeholder_tokens[i];  // n entries; stand-ins for out_tokens
    in.page_table = s.draft_pages;
    in.cache_len = s.cache_len;
  }
  // Causal (no mask): row j sees the committed rows and the path rows before it.
  DraftStepIO dio;
  dio.tokens = vout.out_tokens.Reshape(Shape{b * n});
  dio.hidden = catch_rows;
  if (drafting) {
    dio.logit_rows = vout.num_accepted;
    dio.logits = Rows(root_logits, 0, b);
    dio.hidden_out = Rows(catch_out, 0, b * n);
  } else {
    dio.kv_only = true;
  }
  dio.positions = upload.Device(up.catch_positions, DType::kI64, Shape{b * n});
  dio.slots = upload.Device(up.catch_slots, DType::kI64, Shape{b * n});
  dio.page_tables = upload.Device(up.draft_tables, DType::kI32, Shape{b, draft_table_width});
  dio.q_start = upload.Device(up.catch_starts, DType::kI32, Shape{b + 1});
  dio.kv_len = upload.Device(up.catch_lens, DType::kI32, Shape{b});
  EAGLE3_RETURN_IF_ERROR(draft->Stage(draft_batch, TensorView(), /*from_target=*/true, dio));
  if (!launch) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(draft->Launch());
  if (!drafting) return absl::OkStatus();
  return backend->GatherRows(Rows(catch_out, 0, b * n), vout.num_accepted, Rows(root_hidden, 0, b), b);
}

absl::Status SpeculativeStep::Impl::RefreshRoots(std::span<const StepSequence> seqs, const StepUploadLayout& up,
                                                 bool identity_rows, bool launch) {
  const int64_t b = static_cast<int64_t>(seqs.size());
  // The rows' taps in this step's order (catch_in is free until the catch-up).
  TensorView taps = Rows(root_taps, 0, b);
  if (!identity_rows) {
    taps = Rows(catch_in, 0, b);
    if (launch) {
      EAGLE3_RETURN_IF_ERROR(backend->GatherRows(root_taps, upload.Device(up.rows, DType::kI32, Shape{b}), taps));
    }
  }
  refresh_batch.assign(seqs.size(), DraftSequenceInput());
  refresh_tokens.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const StepSequence& s = seqs[i];
    refresh_tokens[i].assign(1, s.root);
    DraftSequenceInput& in = refresh_batch[i];
    in.tokens = refresh_tokens[i];
    in.page_table = s.draft_pages;
    in.cache_len = s.cache_len - 1;
  }
  DraftStepIO io;
  io.tokens = upload.Device(up.roots, DType::kI64, Shape{b});
  io.hidden = taps;
  io.logits = Rows(root_logits, 0, b);
  io.hidden_out = Rows(catch_out, 0, b);
  io.positions = upload.Device(up.refresh_positions, DType::kI64, Shape{b});
  io.slots = upload.Device(up.refresh_slots, DType::kI64, Shape{b});
  io.page_tables = upload.Device(up.draft_tables, DType::kI32, Shape{b, draft_table_width});
  io.q_start = upload.Device(up.refresh_starts, DType::kI32, Shape{b + 1});
  io.kv_len = upload.Device(up.cache_len, DType::kI32, Shape{b});
  EAGLE3_RETURN_IF_ERROR(draft->Stage(refresh_batch, TensorView(), /*from_target=*/true, io));
  if (!launch) return absl::OkStatus();
  EAGLE3_RETURN_IF_ERROR(draft->Launch());
  return backend->Copy(Rows(catch_out, 0, b), Rows(root_hidden, 0, b));
}

absl::Status SpeculativeStep::Impl::ReadResults(int64_t b, int64_t n, const ResultLayout& res,
                                                std::vector<StepOutput>* out) {
  const char* base = static_cast<const char*>(download.host.data());
  const int32_t* num_accepted = reinterpret_cast<const int32_t*>(base + res.num_accepted);
  const int64_t* tokens = reinterpret_cast<const int64_t*>(base + res.out_tokens);
  bool failed = false;
  for (int64_t i = 0; i < b; ++i) {
    failed = failed || num_accepted[i] < 0 ||
             (res.tree_kinds >= 0 && reinterpret_cast<const int64_t*>(base + res.tree_kinds)[i] != 0);
  }
  if (failed) {
    // The error path: the records, in a second transfer (the tree's first: a failed build leaves a
    // stale tree, whose verification means nothing).
    EAGLE3_ASSIGN_OR_RETURN(Tensor tree_copy, Tensor::Empty(DType::kI64, Shape{b, kTreeBuildErrorWidth}));
    EAGLE3_ASSIGN_OR_RETURN(Tensor verify_copy, Tensor::Empty(DType::kI64, Shape{b, kVerifyErrorWidth}));
    EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(tree_errors, 0, b), tree_copy));
    EAGLE3_RETURN_IF_ERROR(backend->Copy(Rows(verify_errors, 0, b), verify_copy));
    EAGLE3_RETURN_IF_ERROR(backend->Synchronize());
    for (int64_t i = 0; i < b; ++i) {
      const int64_t* record = tree_copy.data_as<int64_t>() + i * kTreeBuildErrorWidth;
      if (res.tree_kinds >= 0 && record[0] != 0) return TreeBuildRecordStatus(record, i);
    }
    for (int64_t i = 0; i < b; ++i) {
      const int64_t* record = verify_copy.data_as<int64_t>() + i * kVerifyErrorWidth;
      if (record[0] != 0) return VerifyRecordStatus(record, i);
    }
    return absl::InternalError("SpeculativeStep: a result shows an error but no record holds one");
  }
  if (out == nullptr) return absl::OkStatus();
  out->resize(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) {
    const int32_t a = num_accepted[i];
    if (a < 0 || a >= n) {
      return absl::InternalError("SpeculativeStep: sequence " + Str(i) + " accepted " + Str(a) + " of " +
                                 Str(n - 1) + " drafted tokens");
    }
    StepOutput& o = (*out)[static_cast<size_t>(i)];
    o.num_accepted = a;
    o.tokens.assign(tokens + i * n, tokens + i * n + a + 1);
  }
  return absl::OkStatus();
}

SpeculativeStep::SpeculativeStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SpeculativeStep::~SpeculativeStep() = default;

const SpeculativeStepOptions& SpeculativeStep::options() const { return impl_->options; }
int SpeculativeStep::nodes_per_step() const { return static_cast<int>(impl_->max_nodes); }
int64_t SpeculativeStep::draft_slots_per_step() const { return impl_->max_draft_slots; }
const StepCounters& SpeculativeStep::counters() const { return impl_->counters; }

void SpeculativeStep::Reseed(uint64_t seed) {
  impl_->options.seed = seed;
  impl_->coin_counter = 0;
}

void SpeculativeStepTesting::SetDraftRewriter(SpeculativeStep& step, DraftRewriter rewriter) {
  step.impl_->draft_rewriter = std::move(rewriter);
}

absl::StatusOr<std::unique_ptr<SpeculativeStep>> SpeculativeStep::Create(TargetModel* target, DraftModel* draft,
                                                                         Backend* backend,
                                                                         const SpeculativeStepOptions& options) {
  if (target == nullptr || backend == nullptr) {
    return absl::InvalidArgumentError("SpeculativeStep: target and backend must not be null");
  }
  if (options.max_batch < 1) {
    return absl::InvalidArgumentError("SpeculativeStep: max_batch = " + Str(options.max_batch) + " must be >= 1");
  }
  EAGLE3_RETURN_IF_ERROR(options.sampling.Validate());
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  static std::atomic<int64_t> next_id{1};
  m.id = next_id.fetch_add(1);
  m.target = target;
  m.draft = draft;
  m.backend = backend;
  m.options = options;
  m.max_batch = options.max_batch;
  m.vocab = target->config().vocab_size;
  const TargetModelOptions& topt = target->options();
  m.table_width = (topt.max_context_len + topt.page_size - 1) / topt.page_size;
  if (draft != nullptr) {
    if (options.trees.empty()) return absl::InvalidArgumentError("SpeculativeStep: options.trees is empty");
    m.draft_vocab = draft->draft_vocab();
    m.hidden = draft->shape().hidden_size;
    m.tap_width = draft->tap().width();
    m.mask_width = draft->options().max_context_len;
    m.draft_table_width = (m.mask_width + draft->options().page_size - 1) / draft->options().page_size;
    m.max_draft_slots = 1;  // a step drafting nothing still writes the catch-up's one row
    for (size_t i = 0; i < options.trees.size(); ++i) {
      const DraftTreeParams& t = options.trees[i];
      const absl::Status valid = t.Validate(m.draft_vocab);
      if (!valid.ok()) {
        return absl::InvalidArgumentError("SpeculativeStep: trees[" + Str(static_cast<int64_t>(i)) +
                                          "]: " + std::string(valid.message()));
      }
      const TreeBuildShape shape{m.max_batch, t.topk, t.num_steps, t.num_draft_tokens, m.draft_vocab};
      const int64_t bytes = backend->TreeBuildWorkspaceBytes(shape);
      if (bytes <= 0) {
        return absl::InvalidArgumentError("SpeculativeStep: the backend cannot build trees of topk " +
                                          Str(t.topk) + ", " + Str(t.num_steps) + " steps, " +
                                          Str(t.num_draft_tokens) + " tokens for " + Str(m.max_batch) +
                                          " sequences over a draft vocabulary of " + Str(m.draft_vocab));
      }
      m.workspace_bytes = std::max(m.workspace_bytes, bytes);
      m.max_nodes = std::max<int64_t>(m.max_nodes, t.num_draft_tokens);
      m.max_k = std::max<int64_t>(m.max_k, t.topk);
      m.max_passes = std::max<int64_t>(m.max_passes, t.num_steps - 1);
      m.max_draft_slots = std::max<int64_t>(
          m.max_draft_slots, std::max<int64_t>(t.num_draft_tokens, static_cast<int64_t>(t.num_steps - 1) * t.topk));
    }
    const int64_t draft_rows = m.max_batch * std::max(m.max_nodes, m.max_k);
    if (draft_rows > draft->options().max_tokens_per_forward) {
      return absl::InvalidArgumentError("SpeculativeStep: max_batch " + Str(m.max_batch) + " x " +
                                        Str(std::max(m.max_nodes, m.max_k)) +
                                        " draft rows per sequence exceed the draft's max_tokens_per_forward " +
                                        Str(draft->options().max_tokens_per_forward));
    }
  }
  if (m.max_batch * m.max_nodes > topt.max_tokens_per_forward) {
    return absl::InvalidArgumentError("SpeculativeStep: max_batch " + Str(m.max_batch) + " x " + Str(m.max_nodes) +
                                      " tree nodes exceed the target's max_tokens_per_forward " +
                                      Str(topt.max_tokens_per_forward));
  }
  EAGLE3_RETURN_IF_ERROR(m.AllocateBuffers());
  return std::unique_ptr<SpeculativeStep>(new SpeculativeStep(std::move(impl)));
}

absl::StatusOr<int64_t> SpeculativeStep::Prefill(int row, std::span<const int64_t> prompt,
                                                 std::span<const int32_t> target_pages,
                                                 std::span<const int32_t> draft_pages) {
  Impl& m = *impl_;
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (row < 0 || row >= m.max_batch) {
    return absl::InvalidArgumentError("SpeculativeStep::Prefill: row " + Str(row) + " is outside [0, max_batch " +
                                      Str(m.max_batch) + ")");
  }
  if (n < 1) return absl::InvalidArgumentError("SpeculativeStep::Prefill: the prompt is empty");
  for (int64_t i = 0; i < n; ++i) {
    if (prompt[static_cast<size_t>(i)] < 0 || prompt[static_cast<size_t>(i)] >= m.vocab) {
      return absl::InvalidArgumentError("SpeculativeStep::Prefill: prompt token " + Str(i) + " = " +
                                        Str(prompt[static_cast<size_t>(i)]) + " is outside the vocabulary [0, " +
                                        Str(m.vocab) + ")");
    }
  }
  if (m.draft != nullptr && n > m.draft->options().max_tokens_per_forward) {
    return absl::OutOfRangeError("SpeculativeStep::Prefill: the prompt's " + Str(n) +
                                 " tokens exceed the draft's max_tokens_per_forward " +
                                 Str(m.draft->options().max_tokens_per_forward));
  }
  const PrefillUploadLayout up(n);
  const ResultLayout res(1, 1, false);
  m.upload.Host(up.root, DType::kI64, Shape{1}).data_as<int64_t>()[0] = prompt.back();
  m.SeedOffset(m.upload.Host(up.seed_offset, DType::kI64, Shape{2}));
  m.upload.Host(up.parents, DType::kI32, Shape{1}).data_as<int32_t>()[0] = -1;
  int64_t* next_tokens = m.upload.Host(up.tokens, DType::kI64, Shape{n}).data_as<int64_t>();
  std::copy(prompt.begin() + 1, prompt.end(), next_tokens);
  next_tokens[n - 1] = 0;  // the first generated token, filled in on the device

  bool results_copied = false;
  auto enqueue = [&]() -> absl::Status {
    EAGLE3_RETURN_IF_ERROR(m.backend->Copy(m.upload.HostBytes(up.bytes), m.upload.DeviceBytes(up.bytes)));
    SequenceInput in;
    in.tokens = prompt;
    in.page_table = target_pages;
    TargetStepIO tio;
    tio.logits = Rows(m.verify_logits, 0, 1);
    if (m.draft != nullptr) tio.aux = Rows(m.aux, 0, n);
    EAGLE3_RETURN_IF_ERROR(
        m.target->Stage(std::span<const SequenceInput>(&in, 1), m.draft != nullptr ? &m.draft->tap() : nullptr, tio));
    EAGLE3_RETURN_IF_ERROR(m.target->Launch());
    // The first token: a root-only tree verified against the last row's logits.
    const TreeVerifyOutputs one = m.VerifyOutputs(1, 1);
    EAGLE3_RETURN_IF_ERROR(m.backend->TreeVerify(m.upload.Device(up.root, DType::kI64, Shape{1, 1}),
                                                 m.upload.Device(up.parents, DType::kI32, Shape{1, 1}), tio.logits,
                                                 m.options.sampling,
                                                 m.upload.Device(up.seed_offset, DType::kI64, Shape{2}), one));
    EAGLE3_RETURN_IF_ERROR(m.backend->Copy(m.download.DeviceBytes(res.bytes), m.download.HostBytes(res.bytes)));
    results_copied = true;
    if (m.draft == nullptr) return absl::OkStatus();
    // The draft over the prompt: row p pairs the target's taps at p with the token at p + 1 (the
    // last one: the token just sampled), leaving the root state at `row`.
    const TensorView device_tokens = m.upload.Device(up.tokens, DType::kI64, Shape{n});
    EAGLE3_RETURN_IF_ERROR(m.backend->Copy(one.out_tokens.Reshape(Shape{1}), Rows(device_tokens, n - 1, 1)));
    DraftSequenceInput din;
    din.tokens = prompt;  // stand-ins for device_tokens
    din.page_table = draft_pages;
    DraftStepIO dio;
    dio.tokens = device_tokens;
    dio.hidden = Rows(m.aux, 0, n);
    dio.logits = Rows(m.root_logits, row, 1);
    dio.hidden_out = Rows(m.catch_out, 0, n);
    EAGLE3_RETURN_IF_ERROR(
        m.draft->Stage(std::span<const DraftSequenceInput>(&din, 1), TensorView(), /*from_target=*/true, dio));
    EAGLE3_RETURN_IF_ERROR(m.draft->Launch());
    EAGLE3_RETURN_IF_ERROR(m.backend->Copy(Rows(m.aux, n - 1, 1), Rows(m.root_taps, row, 1)));
    return m.backend->Copy(Rows(m.catch_out, n - 1, 1), Rows(m.root_hidden, row, 1));
  };
  const absl::Status enqueued = enqueue();
  const absl::Status synced = m.backend->Synchronize();
  if (results_copied && synced.ok()) {
    std::vector<StepOutput> out;
    EAGLE3_RETURN_IF_ERROR(m.ReadResults(1, 1, res, &out));
    EAGLE3_RETURN_IF_ERROR(enqueued);
    return out[0].tokens[0];
  }
  EAGLE3_RETURN_IF_ERROR(enqueued);
  EAGLE3_RETURN_IF_ERROR(synced);
  return absl::InternalError("SpeculativeStep::Prefill: no results");
}

void SpeculativeStep::Impl::StageUpload(std::span<const StepSequence> seqs, const StepUploadLayout& up) {
  const int64_t b = static_cast<int64_t>(seqs.size());
  auto host = [&](int64_t offset, DType dtype, const Shape& shape) { return upload.Host(offset, dtype, shape); };
  int64_t* roots = host(up.roots, DType::kI64, Shape{b}).data_as<int64_t>();
  int64_t* root_positions = host(up.root_positions, DType::kI64, Shape{b}).data_as<int64_t>();
  int32_t* cache_len = host(up.cache_len, DType::kI32, Shape{b}).data_as<int32_t>();
  int32_t* rows = host(up.rows, DType::kI32, Shape{b}).data_as<int32_t>();
  int32_t* root_parents = host(up.root_parents, DType::kI32, Shape{b}).data_as<int32_t>();
  int32_t* tables = host(up.tables, DType::kI32, Shape{b, table_width}).data_as<int32_t>();
  SeedOffset(host(up.seed_offset, DType::kI64, Shape{2}));
  // A page table's first `width` entries (a caller's may be longer than any step reaches).
  auto stage_table = [](std::span<const int32_t> pages, int32_t* table, int64_t width) {
    const int64_t kept = std::min<int64_t>(static_cast<int64_t>(pages.size()), width);
    std::copy_n(pages.data(), kept, table);
    std::fill(table + kept, table + width, 0);
  };
  for (int64_t i = 0; i < b; ++i) {
    const StepSequence& s = seqs[static_cast<size_t>(i)];
    roots[i] = s.root;
    root_positions[i] = s.cache_len;
    cache_len[i] = static_cast<int32_t>(s.cache_len);
    rows[i] = s.row;
    root_parents[i] = -1;
    stage_table(s.target_pages, tables + i * table_width, table_width);
  }
  if (draft == nullptr) return;
  const int64_t rows_per_pass = b * k, pass_slots = std::max<int64_t>(passes, 1);
  const int64_t page_size = draft->options().page_size;
  int32_t* columns = host(up.own_columns, DType::kI32, Shape{pass_slots, rows_per_pass}).data_as<int32_t>();
  uint8_t* mask = host(up.root_mask, DType::kU8, Shape{b, mask_width}).data_as<uint8_t>();
  int32_t* draft_tables = host(up.draft_tables, DType::kI32, Shape{b, draft_table_width}).data_as<int32_t>();
  int64_t* pass_positions = host(up.pass_positions, DType::kI64, Shape{pass_slots, rows_per_pass}).data_as<int64_t>();
  int64_t* pass_slots_rows = host(up.pass_slots, DType::kI64, Shape{pass_slots, rows_per_pass}).data_as<int64_t>();
  int32_t* pass_starts = host(up.pass_starts, DType::kI32, Shape{b + 1}).data_as<int32_t>();
  int32_t* pass_lens = host(up.pass_lens, DType::kI32, Shape{pass_slots, b}).data_as<int32_t>();
  int64_t* catch_positions = host(up.catch_positions, DType::kI64, Shape{b * nodes}).data_as<int64_t>();
  int64_t* catch_slots = host(up.catch_slots, DType::kI64, Shape{b * nodes}).data_as<int64_t>();
  int32_t* catch_starts = host(up.catch_starts, DType::kI32, Shape{b + 1}).data_as<int32_t>();
  int32_t* catch_lens = host(up.catch_lens, DType::kI32, Shape{b}).data_as<int32_t>();
  int64_t* refresh_positions = host(up.refresh_positions, DType::kI64, Shape{b}).data_as<int64_t>();
  int64_t* refresh_slots = host(up.refresh_slots, DType::kI64, Shape{b}).data_as<int64_t>();
  int32_t* refresh_starts = host(up.refresh_starts, DType::kI32, Shape{b + 1}).data_as<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    const StepSequence& s = seqs[static_cast<size_t>(i)];
    const int64_t c = s.cache_len;
    auto slot = [&](int64_t p) {
      return static_cast<int64_t>(s.draft_pages[static_cast<size_t>(p / page_size)]) * page_size + p % page_size;
    };
    stage_table(s.draft_pages, draft_tables + i * draft_table_width, draft_table_width);
    // A depth-1 node sees every committed draft row (the root's own row is the last of them).
    uint8_t* row = mask + i * mask_width;
    std::fill(row, row + c, uint8_t{1});
    std::fill(row + c, row + mask_width, uint8_t{0});
    for (int64_t pass = 1; pass <= passes; ++pass) {
      const int64_t first = (pass - 1) * rows_per_pass + i * k;
      for (int64_t f = 0; f < k; ++f) {
        const int64_t p = c + (pass - 1) * k + f;
        columns[first + f] = static_cast<int32_t>(p);
        pass_positions[first + f] = c - 1 + pass;
        pass_slots_rows[first + f] = slot(p);
      }
      pass_lens[(pass - 1) * b + i] = static_cast<int32_t>(c + pass * k);
    }
    pass_starts[i] = static_cast<int32_t>(i * k);
    for (int64_t j = 0; j < nodes; ++j) {
      catch_positions[i * nodes + j] = c + j;
      catch_slots[i * nodes + j] = slot(c + j);
    }
    catch_starts[i] = static_cast<int32_t>(i * nodes);
    catch_lens[i] = static_cast<int32_t>(c + nodes);
    refresh_positions[i] = c - 1;
    refresh_slots[i] = slot(c - 1);
    refresh_starts[i] = static_cast<int32_t>(i);
  }
  refresh_starts[b] = static_cast<int32_t>(b);
  pass_starts[b] = static_cast<int32_t>(b * k);
  catch_starts[b] = static_cast<int32_t>(b * nodes);
}

absl::Status SpeculativeStep::Run(std::span<const StepSequence> seqs, std::vector<StepOutput>* out, int tree) {
  Impl& m = *impl_;
  if (tree != kNoDraftTokens && (tree < 0 || tree >= static_cast<int>(m.options.trees.size()))) {
    return absl::InvalidArgumentError("SpeculativeStep::Run: tree " + Str(tree) + " is not an index of options.trees [0, " +
                                      Str(static_cast<int64_t>(m.options.trees.size())) + ") nor kNoDraftTokens");
  }
  m.SelectTree(tree);
  EAGLE3_RETURN_IF_ERROR(m.CheckSequences(seqs));
  const int64_t b = static_cast<int64_t>(seqs.size());
  const StepUploadLayout up(m.Dims(b));
  const ResultLayout res(b, m.nodes, m.drafting);
  // Every model step is staged (and checked) before anything is enqueued.
  EAGLE3_RETURN_IF_ERROR(m.Enqueue(seqs, up, res, /*launch=*/false));
  m.StageUpload(seqs, up);

  // The device work depends on the batch size, whether rows move, and the models' staged shapes
  // (their signatures hold the buffers this object hands them).
  bool identity_rows = true;
  for (int64_t i = 0; i < b; ++i) identity_rows = identity_rows && seqs[static_cast<size_t>(i)].row == i;
  const bool refresh = m.drafting && m.roots_stale;
  std::vector<int64_t> signature = {m.id, b, identity_rows, tree, refresh};
  for (const std::vector<int64_t>& part :
       {m.target->StepSignature(), m.draft != nullptr ? m.draft->StepSignature() : std::vector<int64_t>()}) {
    signature.push_back(static_cast<int64_t>(part.size()));
    signature.insert(signature.end(), part.begin(), part.end());
  }
  bool results_copied = false;
  auto enqueue = [&] { return m.Enqueue(seqs, up, res, /*launch=*/true, &results_copied); };
  const bool capturable = m.target->StepIsCapturable();
  const absl::Status enqueued = m.options.launcher != nullptr && capturable
                                    ? m.options.launcher->LaunchWork(signature, enqueue)
                                    : enqueue();
  const absl::Status synced = m.backend->Synchronize();
  m.counters.host_syncs += 1;
  results_copied = results_copied || enqueued.ok();  // a replayed capture holds the download too
  if (results_copied) m.counters.device_to_host_bytes += res.bytes;
  // A data error found on the device explains whatever failed after it: report it first.
  if (synced.ok() && results_copied) {
    EAGLE3_RETURN_IF_ERROR(m.ReadResults(b, m.nodes, res, enqueued.ok() ? out : nullptr));
  }
  EAGLE3_RETURN_IF_ERROR(enqueued);
  EAGLE3_RETURN_IF_ERROR(synced);
  m.roots_stale = m.draft != nullptr && !m.drafting;
  m.counters.steps += 1;
  return absl::OkStatus();
}

}  // namespace eagle3
