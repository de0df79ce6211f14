// Backend::CompactAccepted's data-dependent checks (eagle3/backend.h), shared by the CPU reference
// and the CUDA kernel (cuda/compact_kernels.cu) so that both skip the same sequences and name the
// same first bad entry. No abseil and no std:: containers: this header is included from .cu files.
//
// Sequence b with n = num_accepted[b] entries (n < 0: skipped, nothing checked; n == 0: nothing to
// move, only n itself is checked). Its first problem, in this order of conditions:
//   kCount     n > max_nodes (entry 0)
//   kOffset    entry i < n: accepted[b][i] outside [0, max_nodes), or <= accepted[b][i - 1]
//   kPosition  entry i < n: cache_len[b] + i or cache_len[b] + accepted[b][i] outside
//              [0, P * page_size)
//   kPage      entry i < n: the page entry of either position outside [0, num_pages)
// and within a condition the lowest entry. Entry i's own first failing condition is
// CompactEntryCheck; a sequence's problem is the smallest (condition, entry) over its entries.
#pragma once

#include <cstdint>

#include "eagle3/detail/host_device.h"

namespace eagle3 {

enum CompactCondition : int {
  kCompactCount = 0,
  kCompactOffset = 1,
  kCompactPosition = 2,
  kCompactPage = 3,
  kCompactOk = 4,  // no problem
};

// What one sequence's rows look like to the checks.
struct CompactSequence {
  const int32_t* accepted;  // [max_nodes], this sequence's offsets
  int64_t max_nodes;
  int64_t cache_len;
  const int32_t* page_table;  // [pages], this sequence's page entries
  int64_t pages;              // P
  int64_t page_size;
  int64_t num_pages;
};

// The slot (page entry * page_size + position % page_size) of an in-range position, or -1 when its
// page entry is outside [0, num_pages).
EAGLE3_HOST_DEVICE inline int64_t CompactSlot(const CompactSequence& s, int64_t position) {
  const int64_t page = s.page_table[position / s.page_size];
  if (page < 0 || page >= s.num_pages) return -1;
  return page * s.page_size + position % s.page_size;
}

// The first condition entry i (i < n <= max_nodes) of sequence `s` violates, or kCompactOk.
EAGLE3_HOST_DEVICE inline int CompactEntryCheck(const CompactSequence& s, int64_t i) {
  const int64_t offset = s.accepted[i];
  if (offset < 0 || offset >= s.max_nodes || (i > 0 && offset <= s.accepted[i - 1])) {
    return kCompactOffset;
  }
  const int64_t capacity = s.pages * s.page_size;
  const int64_t dst = s.cache_len + i, src = s.cache_len + offset;
  if (dst < 0 || dst >= capacity || src < 0 || src >= capacity) return kCompactPosition;
  if (CompactSlot(s, dst) < 0 || CompactSlot(s, src) < 0) return kCompactPage;
  return kCompactOk;
}

// Entries of the device error code's index (see CompactErrorIndex).
inline constexpr int kCompactEntryBits = 10;

// The error flag index of (sequence, condition, entry): ((b * 4 + condition) << 10) | min(entry,
// 1023); it saturates (RecordDeviceError clamps) from sequence 4096 on. Lower = reported first.
EAGLE3_HOST_DEVICE inline int64_t CompactErrorIndex(int64_t b, int condition, int64_t entry) {
  const int64_t e = entry < (1 << kCompactEntryBits) ? entry : (1 << kCompactEntryBits) - 1;
  return ((b * 4 + condition) << kCompactEntryBits) | e;
}

// What each condition means, for messages ("CompactAccepted: sequence b, entry i: ...").
inline const char* CompactConditionText(int condition) {
  switch (condition) {
    case kCompactCount:
      return "num_accepted[b] exceeds max_nodes (accepted's dim 1)";
    case kCompactOffset:
      return "accepted[b][i] must be in [0, max_nodes) and greater than accepted[b][i - 1]";
    case kCompactPosition:
      return "cache_len[b] + i or cache_len[b] + accepted[b][i] is outside [0, P * page_size)";
    case kCompactPage:
      return "the page entry (page_tables[b][position / page_size]) of cache_len[b] + i or "
             "cache_len[b] + accepted[b][i] is outside [0, num_pages)";
    default:
      return "no problem";
  }
}

}  // namespace eagle3
