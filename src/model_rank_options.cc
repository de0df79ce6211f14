#include "eagle3/model_rank_options.h"

#include <string>
#include <utility>

#include "eagle3/checkpoint.h"

namespace eagle3 {

absl::Status ModelRankOptions::Check(const std::string& who, const Communicator* communicator) const {
  auto str = [](int64_t v) { return std::to_string(v); };
  if (tp_size < 1 || rank < 0 || rank >= tp_size) {
    return absl::InvalidArgumentError(who + ": rank " + str(rank) + " of tp_size " + str(tp_size) +
                                      " is not a valid rank");
  }
  if (tp_size > 1 && (communicator == nullptr || communicator->size() != tp_size || communicator->rank() != rank)) {
    return absl::InvalidArgumentError(
        who + ": tp_size " + str(tp_size) + " rank " + str(rank) + " needs a communicator of that size and rank, got " +
        (communicator == nullptr ? std::string("none")
                                 : "size " + str(communicator->size()) + " rank " + str(communicator->rank())));
  }
  if (max_tokens_per_forward < 1 || max_context_len < 1 || num_kv_pages < 1 || page_size < 1) {
    return absl::InvalidArgumentError(who + ": capacities must be positive (max_tokens_per_forward " +
                                      str(max_tokens_per_forward) + ", max_context_len " + str(max_context_len) +
                                      ", num_kv_pages " + str(num_kv_pages) + ", page_size " + str(page_size) + ")");
  }
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"max_tokens_per_forward", max_tokens_per_forward},
                                    {"max_context_len", max_context_len},
                                    {"num_kv_pages", num_kv_pages},
                                    {"page_size", page_size}}) {
    if (value > kMaxCapacity) {
      return absl::InvalidArgumentError(who + ": " + name + " " + str(value) + " is out of range [1, " +
                                        str(kMaxCapacity) + "]");
    }
  }
  if (read_threads < 0 || read_threads > kMaxCheckpointReadThreads) {
    return absl::InvalidArgumentError(who + ": read_threads " + str(read_threads) + " is out of range [0, " +
                                      str(kMaxCheckpointReadThreads) + "] (0 = the default)");
  }
  return absl::OkStatus();
}

}  // namespace eagle3
