// Where a model's weight loading spent its time: for engines that report start-up time, and for
// finding what bounds it (the host reads, or the device allocations and copies).
#pragma once

#include <cstdint>

namespace eagle3 {

struct WeightLoadStats {
  int64_t tensors = 0;        // weights loaded (a quantized weight's codes and scales count once)
  int64_t host_bytes = 0;     // bytes of the host tensors read (codes, scales, dense weights)
  // Of `tensors`, the quantized weights whose codes were laid out in warp tiles (routed experts on a
  // backend that reads them so: Backend::tiles_expert_codes).
  int64_t tiled_tensors = 0;
  double check_seconds = 0;   // checking every checkpoint tensor before any is read
  double read_seconds = 0;    // reading the checkpoint into host tensors: conversion, dequantization
  // Device allocations, host -> device copies and the waits for them. With an upload ring
  // (Backend::CreateUploadRing) the copies are only enqueued here, and its waits for their transfers
  // to free memory count here although they happen inside reads.
  double device_seconds = 0;
  double total_seconds = 0;   // the whole load (the above, and the rest: stacking, cache zeroing)
};

}  // namespace eagle3
