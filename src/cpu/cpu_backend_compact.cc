// CpuBackend::CompactAccepted: the reference for the commit after tree verification.
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "compact_accepted_check.h"
#include "cpu/cpu_backend_internal.h"
#include "eagle3/cpu/cpu_backend.h"
#include "eagle3/status.h"

namespace eagle3::cpu {

absl::Status CpuBackend::CompactAccepted(const TensorView& cache, const TensorView& page_tables,
                                         const TensorView& cache_len, const TensorView& accepted,
                                         const TensorView& num_accepted) {
  const char* op = "CompactAccepted";
  EAGLE3_RETURN_IF_ERROR(CheckCompactAccepted(cache, page_tables, cache_len, accepted, num_accepted));
  const int64_t batch = page_tables.dim(0);
  const int64_t row_bytes = cache.dim(2) * static_cast<int64_t>(DTypeSize(cache.dtype()));
  auto* base = static_cast<char*>(cache.data());
  absl::Status first_error;  // of the lowest bad sequence
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = num_accepted.data_as<const int32_t>()[b];
    if (n < 0) continue;  // a sequence the verifier failed
    CompactSequence s;
    s.accepted = accepted.data_as<const int32_t>() + b * accepted.stride(0);
    s.max_nodes = accepted.dim(1);
    s.cache_len = LoadIndex(cache_len, b);
    s.page_table = page_tables.data_as<const int32_t>() + b * page_tables.stride(0);
    s.pages = page_tables.dim(1);
    s.page_size = cache.dim(1);
    s.num_pages = cache.dim(0);
    // The smallest (condition, entry), as the device finds it.
    int condition = n > s.max_nodes ? kCompactCount : kCompactOk;
    int64_t entry = 0;
    for (int64_t i = 0; condition != kCompactCount && i < n; ++i) {
      const int c = CompactEntryCheck(s, i);
      if (c < condition) {
        condition = c;
        entry = i;
      }
    }
    if (condition != kCompactOk) {
      if (first_error.ok()) {
        first_error =
            condition == kCompactCount
                ? Invalid(op, "sequence ", b, ", entry 0: ", CompactConditionText(condition), " (num_accepted[",
                          b, "] = ", n, ", max_nodes = ", s.max_nodes, ")")
                : Invalid(op, "sequence ", b, ", entry ", entry, ": ", CompactConditionText(condition),
                          " (accepted[", b, "][", entry, "] = ", s.accepted[entry], ", cache_len[", b,
                          "] = ", s.cache_len, ", num_accepted[", b, "] = ", n, ")");
      }
      continue;
    }
    // In increasing i a move never overwrites a row a later move reads: the destination
    // cache_len + i is below every later source cache_len + accepted[j] (j > i, accepted[j] > i).
    for (int64_t i = 0; i < n; ++i) {
      if (s.accepted[i] == i) continue;
      const int64_t src = CompactSlot(s, s.cache_len + s.accepted[i]);
      const int64_t dst = CompactSlot(s, s.cache_len + i);
      std::memcpy(base + dst * row_bytes, base + src * row_bytes, static_cast<size_t>(row_bytes));
    }
  }
  return first_error;
}

}  // namespace eagle3::cpu
