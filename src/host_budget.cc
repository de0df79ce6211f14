#include "eagle3/detail/host_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>

namespace eagle3 {
namespace {

// The cgroup v2 limit of this process's group ("max" or unreadable: none).
uint64_t CgroupMemoryMax() {
  std::ifstream in("/sys/fs/cgroup/memory.max");
  std::string text;
  if (!(in >> text) || text.empty() || text == "max") return 0;
  uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9' || value > (UINT64_MAX - 9) / 10) return 0;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

uint64_t Lower(uint64_t limit, uint64_t candidate) {
  if (candidate == 0) return limit;
  return limit == 0 ? candidate : std::min(limit, candidate);
}

}  // namespace

uint64_t HostMemoryLimit() {
  uint64_t limit = 0;
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_size > 0) {
    uint64_t physical = 0;
    if (!__builtin_mul_overflow(static_cast<uint64_t>(pages), static_cast<uint64_t>(page_size), &physical)) {
      limit = physical;
    }
  }
  for (const int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit rl{};
    if (::getrlimit(resource, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
      limit = Lower(limit, static_cast<uint64_t>(rl.rlim_cur));
    }
  }
  return Lower(limit, CgroupMemoryMax());
}

bool CheckedBytes(std::initializer_list<int64_t> dims, uint64_t element_size, uint64_t* bytes) {
  uint64_t n = element_size;
  for (const int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *bytes = n;
  return true;
}

HostByteBudget::HostByteBudget(std::string who, uint64_t limit) : who_(std::move(who)), limit_(limit) {}

void HostByteBudget::Add(std::string what, std::initializer_list<int64_t> dims, uint64_t element_size) {
  if (overflow_) return;
  uint64_t bytes = 0;
  if (!CheckedBytes(dims, element_size, &bytes) || __builtin_add_overflow(total_, bytes, &total_)) {
    overflow_ = true;
    overflow_what_ = std::move(what);
    return;
  }
  if (bytes > largest_) {
    largest_ = bytes;
    largest_what_ = std::move(what);
  }
}

absl::Status HostByteBudget::Check() const {
  if (overflow_) {
    return absl::ResourceExhaustedError(who_ + ": " + overflow_what_ +
                                        " overflows 64-bit byte counts; no host could hold it");
  }
  if (limit_ != 0 && total_ > limit_) {
    return absl::ResourceExhaustedError(who_ + ": buffers sized from the options need " + std::to_string(total_) +
                                        " bytes, more than the " + std::to_string(limit_) +
                                        " bytes of memory this process can use; the largest is " + largest_what_ +
                                        " = " + std::to_string(largest_) + " bytes");
  }
  return absl::OkStatus();
}

}  // namespace eagle3
