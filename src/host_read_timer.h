// HostReadTimer: where the time of a weight's host read goes in WeightLoadStats when the read
// allocates from an UploadRing. The ring's waits for earlier transfers to free its memory happen
// inside the read's allocations but are device time, so that the load line keeps host reads and
// the device part apart.
#pragma once

#include <chrono>

#include "eagle3/upload_ring.h"
#include "eagle3/weight_load_stats.h"

namespace eagle3 {

class HostReadTimer {
 public:
  // Starts the clock. `ring` may be null (no waits); it must outlive the timer.
  explicit HostReadTimer(const UploadRing* ring)
      : ring_(ring), start_(std::chrono::steady_clock::now()), waited_(ring != nullptr ? ring->wait_seconds() : 0) {}

  // Adds the time since construction to stats.read_seconds, the ring's waits in it to
  // stats.device_seconds instead.
  void AddTo(WeightLoadStats& stats) const {
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double waits = ring_ != nullptr ? ring_->wait_seconds() - waited_ : 0;
    stats.read_seconds += total - waits;
    stats.device_seconds += waits;
  }

 private:
  const UploadRing* ring_;
  std::chrono::steady_clock::time_point start_;
  double waited_;  // the ring's wait_seconds() at the start
};

}  // namespace eagle3
