// Host-side staging shared by TargetModel and DraftModel for their batched, graph-capturable steps
// (internal to src/): the per-sequence metadata rows of a batched paged op, and the identity page
// table of a flat-cache view through which PagedWrite stores every new row at its slot.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "eagle3/backend.h"
#include "eagle3/status.h"
#include "eagle3/tensor.h"

namespace eagle3 {

// Sequence b of a staged batch: row b of `tables` [B_max, max_pages] holds its first max_pages page
// entries (the rest zero), starts[b] its first query row, lens[b] its kv length (all i32, host).
inline void StageSequence(std::span<const int32_t> page_table, int64_t b, int64_t first_row, int64_t kv_len,
                          int64_t max_pages, Tensor& tables, Tensor& starts, Tensor& lens) {
  int32_t* table = tables.data_as<int32_t>() + b * max_pages;
  const int64_t kept = std::min<int64_t>(static_cast<int64_t>(page_table.size()), max_pages);
  std::copy_n(page_table.data(), kept, table);
  std::fill(table + kept, table + max_pages, 0);
  starts.data_as<int32_t>()[b] = static_cast<int32_t>(first_row);
  lens.data_as<int32_t>()[b] = static_cast<int32_t>(kv_len);
}

// A device-side input or output of a staged step (TargetStepIO, DraftStepIO): empty, or exactly
// `dtype` [shape] contiguous on `device`. InvalidArgument naming `who`.`name` otherwise.
inline absl::Status CheckStepView(const std::string& who, const char* name, const TensorView& view, DType dtype,
                                  const Shape& shape, Device device) {
  if (view.empty()) return absl::OkStatus();
  if (view.dtype() != dtype || view.shape() != shape || !view.is_contiguous() || view.device() != device) {
    return absl::InvalidArgumentError(who + "." + name + " must be " + std::string(DTypeName(dtype)) +
                                      shape.ToString() + " contiguous on " + device.ToString() + ", got " +
                                      view.ToString());
  }
  return absl::OkStatus();
}

// The address of a view, for step signatures (a captured graph keeps the buffers it was captured
// with).
inline int64_t ViewAddress(const TensorView& view) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(view.data())); }

// [rows] i32 = 0, 1, ..., rows - 1 on the backend's device.
inline absl::StatusOr<Tensor> DeviceIota(int64_t rows, Backend& backend) {
  EAGLE3_ASSIGN_OR_RETURN(Tensor host, Tensor::Empty(DType::kI32, Shape{rows}));
  for (int64_t i = 0; i < rows; ++i) host.data_as<int32_t>()[i] = static_cast<int32_t>(i);
  if (backend.device().is_cpu()) return host;
  EAGLE3_ASSIGN_OR_RETURN(Tensor device, Tensor::Empty(DType::kI32, Shape{rows}, backend.allocator()));
  EAGLE3_RETURN_IF_ERROR(backend.Copy(host, device));
  return device;
}

}  // namespace eagle3
