#include "tokenizer_bpe.h"

#include <functional>
#include <queue>
#include <utility>

namespace eagle3::tokenizer_internal {

BpeModel::BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges,
                   std::unordered_map<std::string, int32_t> whole_words)
    : byte_ids_(byte_ids), whole_words_(std::move(whole_words)) {
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    merges_.emplace(PairKey(m.left, m.right), RankedMerge{static_cast<int32_t>(rank), m.merged});
  }
}

const BpeModel::RankedMerge* BpeModel::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int64_t>* ids) const {
  if (!whole_words_.empty()) {
    const auto it = whole_words_.find(std::string(word));
    if (it != whole_words_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  const int32_t n = static_cast<int32_t>(word.size());
  if (n == 1) {
    ids->push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  // Symbols form a linked list over the byte positions; a merged-away symbol gets id -1.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  std::vector<Symbol> symbols(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  // (rank, position of the pair's left symbol): smallest rank first, then leftmost.
  using Candidate = std::pair<int32_t, int32_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push_pair = [&](int32_t left) {
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const RankedMerge* m = FindMerge(symbols[left].id, symbols[right].id)) {
      queue.emplace(m->rank, left);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!queue.empty()) {
    const auto [rank, left] = queue.top();
    queue.pop();
    Symbol& l = symbols[left];
    if (l.id < 0 || l.next < 0) continue;
    // Stale when either side has merged since: the pair now there has another rank (a rank names
    // one pair).
    const RankedMerge* m = FindMerge(l.id, symbols[l.next].id);
    if (m == nullptr || m->rank != rank) continue;
    Symbol& r = symbols[l.next];
    l.id = m->merged;
    r.id = -1;
    l.next = r.next;
    if (l.next >= 0) symbols[l.next].prev = left;
    if (l.prev >= 0) push_pair(l.prev);
    push_pair(left);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace eagle3::tokenizer_internal
