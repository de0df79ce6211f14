// Checked sizing of buffers whose size comes from options or config keys (a model's workspaces, a
// tool's output buffers): every product is computed with overflow checks and the sum is compared with
// the memory this process can use before anything is allocated. A configuration that cannot fit is
// then a ResourceExhausted Status naming the options or keys behind the largest buffer, rather than
// std::bad_alloc escaping the API, an abort, or the kernel killing the process when memory it
// overcommitted is first touched.
//
// eagle3/detail/: installed because eagle3's own tools use it, but internal: no compatibility promise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "eagle3/export.h"

namespace eagle3 {

// Bytes of memory this process can expect to use: the machine's physical memory, lowered to the
// address-space / data-segment limits (RLIMIT_AS, RLIMIT_DATA) and the cgroup v2 memory.max when
// those are set. 0 when none of them is known (then only overflow is checked).
EAGLE3_API uint64_t HostMemoryLimit();

// Sets *bytes = prod(dims) * element_size; false (and *bytes untouched) when a dim is negative or
// the product overflows 64 bits.
EAGLE3_API bool CheckedBytes(std::initializer_list<int64_t> dims, uint64_t element_size, uint64_t* bytes);

class EAGLE3_API HostByteBudget {
 public:
  // `who` prefixes every message ("TargetModel", "eagle3-inspect target"); `limit` 0 = no limit.
  explicit HostByteBudget(std::string who, uint64_t limit = HostMemoryLimit());

  // A buffer of prod(dims) elements of `element_size` bytes. `what` names where its size comes
  // from, with the values: "max_tokens_per_forward 4096 x max_context_len 65536 (attention mask)".
  void Add(std::string what, std::initializer_list<int64_t> dims, uint64_t element_size);

  uint64_t total() const { return total_; }

  // OK, or ResourceExhausted: "<who>: <what> overflows 64-bit byte counts", or "<who>: buffers sized
  // from the options need N bytes, more than the M bytes of memory this process can use; the
  // largest is <what> = X bytes".
  absl::Status Check() const;

 private:
  std::string who_;
  uint64_t limit_ = 0;
  uint64_t total_ = 0;
  bool overflow_ = false;
  std::string overflow_what_;
  std::string largest_what_;
  uint64_t largest_ = 0;
};

// v.assign(count, value) that reports a failed allocation as ResourceExhausted naming `what`
// instead of throwing std::bad_alloc / std::length_error through the API.
template <typename T>
absl::Status AssignHostVector(std::vector<T>& v, int64_t count, const T& value, std::string_view what) {
  if (count < 0) {
    return absl::InvalidArgumentError(std::string(what) + ": negative element count " + std::to_string(count));
  }
  try {
    v.assign(static_cast<size_t>(count), value);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(std::string(what) + ": host allocation of " + std::to_string(count) +
                                        " elements of " + std::to_string(sizeof(T)) + " bytes failed");
  } catch (const std::length_error&) {
    return absl::ResourceExhaustedError(std::string(what) + ": " + std::to_string(count) + " elements of " +
                                        std::to_string(sizeof(T)) + " bytes exceed what a vector can hold");
  }
  return absl::OkStatus();
}

}  // namespace eagle3
