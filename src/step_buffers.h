// The packed buffers of a SpeculativeStep (internal to src/): the step's small host-known inputs
// go to the device in one copy and its results come back in one, so each is a set of typed views at
// aligned offsets of one byte buffer, laid out per call for the batch at hand.
#pragma once

#include <algorithm>
#include <cstdint>

#include "eagle3/backend.h"
#include "eagle3/tensor.h"

namespace eagle3 {

// Typed views at aligned offsets of one byte buffer, so that one Copy moves a whole set of small
// arrays between the host and the device (the step's upload, and its one download). The layout is
// made per call for the batch at hand (so the bytes moved follow the batch, not the capacity).
class PackedLayout {
 public:
  explicit PackedLayout(int64_t alignment) : alignment_(alignment) {}
  // Reserves [shape] of dtype; returns its byte offset.
  int64_t Add(DType dtype, const Shape& shape) {
    const int64_t offset = (bytes_ + alignment_ - 1) / alignment_ * alignment_;
    bytes_ = offset + shape.numel() * static_cast<int64_t>(DTypeSize(dtype));
    return offset;
  }
  int64_t bytes() const { return bytes_; }

 private:
  int64_t alignment_;
  int64_t bytes_ = 0;
};

inline TensorView At(const Tensor& buffer, int64_t offset, DType dtype, const Shape& shape) {
  return TensorView(static_cast<char*>(buffer.data()) + offset, dtype, shape, buffer.device());
}

// A host staging buffer and its device mirror with the same layout.
struct Mirrored {
  Tensor host, device;
  TensorView Host(int64_t offset, DType dtype, const Shape& shape) const { return At(host, offset, dtype, shape); }
  TensorView Device(int64_t offset, DType dtype, const Shape& shape) const {
    return At(device, offset, dtype, shape);
  }
  TensorView HostBytes(int64_t bytes) const { return At(host, 0, DType::kU8, Shape{bytes}); }
  TensorView DeviceBytes(int64_t bytes) const { return At(device, 0, DType::kU8, Shape{bytes}); }
};

// Where the results of a step (or prefill) of B sequences with N nodes sit in the download buffer:
// the only bytes a step brings to the host: the accepted counts (-1 for a sequence the verifier
// failed), the emitted tokens and, when a tree was built, each sequence's tree-build error kind.
// The full error records stay on the device; they are read only when a count or kind shows one.
struct ResultLayout {
  int64_t num_accepted = 0, out_tokens = 0, tree_kinds = -1, bytes = 0;
  ResultLayout(int64_t b, int64_t n, bool tree) {
    PackedLayout l(8);
    num_accepted = l.Add(DType::kI32, Shape{b});
    out_tokens = l.Add(DType::kI64, Shape{b, n});
    if (tree) tree_kinds = l.Add(DType::kI64, Shape{b});
    bytes = l.bytes();
  }
};

// The dims a step's upload depends on.
struct StepDims {
  int64_t batch = 0, nodes = 1, k = 1, passes = 0;
  int64_t target_pages = 0, draft_pages = 0, mask_width = 0;
};

// Where a step's staged inputs sit in the upload buffer: the roots, the target's commit inputs, and
// every draft pass's metadata (the root refresh, the tree passes, then the catch-up), so that one
// copy brings a whole step's inputs and the draft's passes read no staging of their own.
struct StepUploadLayout {
  int64_t roots = 0, root_positions = 0, cache_len = 0, tables = 0, seed_offset = 0, rows = 0, root_parents = 0;
  int64_t own_columns = 0, root_mask = 0, draft_tables = 0;
  int64_t pass_positions = 0, pass_slots = 0, pass_starts = 0, pass_lens = 0;
  int64_t catch_positions = 0, catch_slots = 0, catch_starts = 0, catch_lens = 0;
  int64_t refresh_positions = 0, refresh_slots = 0, refresh_starts = 0;
  int64_t bytes = 0;
  explicit StepUploadLayout(const StepDims& d) {
    const int64_t b = d.batch, rows_per_pass = d.batch * d.k, passes = std::max<int64_t>(d.passes, 1);
    PackedLayout l(16);
    roots = l.Add(DType::kI64, Shape{b});
    root_positions = l.Add(DType::kI64, Shape{b});
    seed_offset = l.Add(DType::kI64, Shape{2});
    cache_len = l.Add(DType::kI32, Shape{b});
    rows = l.Add(DType::kI32, Shape{b});
    root_parents = l.Add(DType::kI32, Shape{b});
    tables = l.Add(DType::kI32, Shape{b, d.target_pages});
    if (d.mask_width > 0) {
      own_columns = l.Add(DType::kI32, Shape{passes, rows_per_pass});
      root_mask = l.Add(DType::kU8, Shape{b, d.mask_width});
      draft_tables = l.Add(DType::kI32, Shape{b, d.draft_pages});
      pass_positions = l.Add(DType::kI64, Shape{passes, rows_per_pass});
      pass_slots = l.Add(DType::kI64, Shape{passes, rows_per_pass});
      pass_starts = l.Add(DType::kI32, Shape{b + 1});
      pass_lens = l.Add(DType::kI32, Shape{passes, b});
      catch_positions = l.Add(DType::kI64, Shape{b * d.nodes});
      catch_slots = l.Add(DType::kI64, Shape{b * d.nodes});
      catch_starts = l.Add(DType::kI32, Shape{b + 1});
      catch_lens = l.Add(DType::kI32, Shape{b});
      refresh_positions = l.Add(DType::kI64, Shape{b});
      refresh_slots = l.Add(DType::kI64, Shape{b});
      refresh_starts = l.Add(DType::kI32, Shape{b + 1});
    }
    bytes = l.bytes();
  }
};

// Where a prefill's staged inputs sit in the upload buffer.
struct PrefillUploadLayout {
  int64_t root = 0, seed_offset = 0, parents = 0, tokens = 0, bytes = 0;
  explicit PrefillUploadLayout(int64_t n) {
    PackedLayout l(16);
    root = l.Add(DType::kI64, Shape{1});
    seed_offset = l.Add(DType::kI64, Shape{2});
    parents = l.Add(DType::kI32, Shape{1});
    tokens = l.Add(DType::kI64, Shape{n});
    bytes = l.bytes();
  }
};

}  // namespace eagle3
