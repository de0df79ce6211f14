// The BPE model of `tokenizers` on byte strings: a word (one pre-tokenized piece) starts as one
// symbol per byte; the adjacent pair with the lowest merge rank is merged, the leftmost first among
// equal ranks, until no adjacent pair has a merge. A priority queue of (rank, position) with lazy
// invalidation keeps this O(n log n) per word.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace eagle3::tokenizer_internal {

class BpeModel {
 public:
  struct Merge {
    int32_t left;    // token id
    int32_t right;   // token id
    int32_t merged;  // id of the concatenation
  };

  // `byte_ids[b]`: id of the one-byte token of byte b. `merges` in rank order (rank = index); no
  // pair may appear twice. `whole_words`: byte string -> id of every vocab token, when
  // `ignore_merges` is set (a word that is itself a token is emitted as is); empty otherwise.
  BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<Merge>& merges,
           std::unordered_map<std::string, int32_t> whole_words);

  // Appends the ids of `word` (non-empty) to `ids`.
  void EncodeWord(std::string_view word, std::vector<int64_t>* ids) const;

 private:
  struct RankedMerge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const RankedMerge* FindMerge(int32_t left, int32_t right) const;

  std::array<int32_t, 256> byte_ids_;
  std::unordered_map<uint64_t, RankedMerge> merges_;
  std::unordered_map<std::string, int32_t> whole_words_;
};

}  // namespace eagle3::tokenizer_internal
