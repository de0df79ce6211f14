// CudaBackend::CompactAccepted: the commit after tree verification (LaunchCompactAccepted, one
// kernel). Bad entries are found on the device: Synchronize reports the lowest bad sequence
// (CompactAcceptedDeviceError below); such a sequence is left unwritten, the others are compacted.
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda_backend_checks.h"
#include "cuda_backend_state.h"
#include "cuda_status.h"
#include "compact_accepted_check.h"
#include "compact_ops.h"
#include "eagle3/cuda/cuda_backend.h"
#include "eagle3/status.h"

namespace eagle3::cuda {
absl::Status CompactAcceptedDeviceError(int64_t index, const char* found) {
  const char* op = "CompactAccepted";
  if (index >= kDeviceErrorMaxIndex) {
    return Invalid(op, "a sequence >= 4095 has a bad entry (the error index saturated)", found);
  }
  const int64_t entry = index & ((int64_t{1} << kCompactEntryBits) - 1);
  const int64_t key = index >> kCompactEntryBits;
  const int condition = static_cast<int>(key % 4);
  const std::string where = entry == (int64_t{1} << kCompactEntryBits) - 1 ? absl::StrCat(">= ", entry)
                                                                            : absl::StrCat(entry);
  return Invalid(op, "sequence ", key / 4, ", entry ", where, ": ", CompactConditionText(condition), found);
}

absl::Status CudaBackend::CompactAccepted(const TensorView& cache, const TensorView& page_tables,
                                          const TensorView& cache_len, const TensorView& accepted,
                                          const TensorView& num_accepted) {
  const char* op = "CompactAccepted";
  EAGLE3_RETURN_IF_ERROR(CheckCompactAccepted(cache, page_tables, cache_len, accepted, num_accepted));
  const size_t elem = DTypeSize(cache.dtype());
  if (elem != 2 && elem != 4 && elem != 8) {
    return Invalid(op, "cache is ", cache.ToString(), " but CudaBackend::", op,
                   " moves elements of 2, 4 or 8 bytes (got ", std::string(DTypeName(cache.dtype())), ")");
  }
  if (page_tables.dim(0) == 0) return absl::OkStatus();
  State& s = *state_;
  EAGLE3_RETURN_IF_ERROR(CudaStatus(UseBackendDevice(s), "CompactAccepted: cudaSetDevice"));
  CompactLaunchParams p;
  p.cache = cache.data();
  p.num_pages = cache.dim(0);
  p.page_size = cache.dim(1);
  p.row_bytes = cache.dim(2) * static_cast<int64_t>(elem);
  p.batch = page_tables.dim(0);
  p.page_tables = page_tables.data_as<const int32_t>();
  p.page_table_stride = page_tables.stride(0);
  p.pages_per_seq = page_tables.dim(1);
  p.cache_len = cache_len.data();
  p.cache_len_i64 = cache_len.dtype() == DType::kI64;
  p.accepted = accepted.data_as<const int32_t>();
  p.accepted_stride = accepted.stride(0);
  p.max_nodes = accepted.dim(1);
  p.num_accepted = num_accepted.data_as<const int32_t>();
  const int code = DeviceErrorCode(DeviceCheck::kCompactAccepted);
  return CudaStatus(LaunchCompactAccepted(p, s.error_flag, code, s.options.programmatic_launch, s.stream),
                    "CompactAccepted: kernel launch");
}

}  // namespace eagle3::cuda
