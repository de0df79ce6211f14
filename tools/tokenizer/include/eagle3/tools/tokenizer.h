// A byte-level BPE tokenizer that reproduces HF `tokenizers` (0.2x) exactly for one pipeline: the
// code tokenizer of the built-in model pair (tools/train_tiny):
//   normalizer none; added tokens (special tokens such as "<|endoftext|>") split out first;
//   pre-tokenizer Sequence[Split(Regex(kCodeSplitPattern), Isolated), ByteLevel(no prefix space,
//   no regex)]; model BPE (no dropout, no unk, no byte fallback, no prefixes/suffixes);
//   post-processor none; decoder ByteLevel.
// FromJson refuses every tokenizer.json that asks for anything else, naming the key and the value
// found, so a tokenizer that would encode differently is never used silently. Accepted whatever
// their value, because they change no id: ByteLevel's `trim_offsets` (offsets only), the ByteLevel
// decoder's three flags (ignored by its decode) and BPE's `fuse_unk` (there is no unknown token).
// BPE's `ignore_merges` is honoured (a piece that is itself a vocab token is emitted whole). Beyond
// `tokenizers`, the vocab must hold all 256 byte tokens (`tokenizers` silently drops the bytes it
// has no token for) and ids must be unique; added tokens must be vocab entries with the same id.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace eagle3 {

// The Split pattern the tokenizer implements (as written in tokenizer.json, Oniguruma syntax).
inline constexpr std::string_view kCodeSplitPattern =
    R"('(?:s|t|re|ve|m|ll|d)| ?[A-Za-z_][A-Za-z0-9_]*| ?[0-9]+| ?[^ \t\n\r\f\vA-Za-z0-9_]+|)"
    R"([ \t\n\r\f\v]+(?![^ \t\n\r\f\v])|[ \t\n\r\f\v]+)";

class Tokenizer {
 public:
  // What Decode does with added tokens marked `special` (HF's `skip_special_tokens`).
  enum class SpecialTokens { kKeep, kSkip };

  // `tokenizer_json`: a tokenizer.json file, or a directory holding one.
  static absl::StatusOr<Tokenizer> FromFile(const std::filesystem::path& tokenizer_json);
  // `source_name` names the document in error messages.
  static absl::StatusOr<Tokenizer> FromJson(std::string_view json, std::string_view source_name);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of `utf8_text`, as `tokenizers`' `encode(text).ids` (no special tokens are added).
  // InvalidArgument naming the byte offset when the text is not valid UTF-8. Thread-safe.
  absl::StatusOr<std::vector<int64_t>> Encode(std::string_view utf8_text) const;

  // Text of `ids`, as `tokenizers`' `decode(ids, skip_special_tokens)`: the tokens' bytes joined,
  // then converted to UTF-8 with every ill-formed subsequence replaced by U+FFFD (Rust's
  // from_utf8_lossy). The default keeps special tokens, so Decode(Encode(text)) == text.
  // InvalidArgument naming the position and the id when an id is outside [0, vocab_size()).
  absl::StatusOr<std::string> Decode(std::span<const int64_t> ids,
                                     SpecialTokens special = SpecialTokens::kKeep) const;

  // Number of ids (the model vocabulary; every added token is one of its entries).
  int64_t vocab_size() const;
  // Id of a token as written in tokenizer.json's vocab ("Ġdef", "<|endoftext|>"); nullopt if none.
  std::optional<int64_t> TokenId(std::string_view token) const;
  // The token of `id` as written in the vocab; nullopt when out of range.
  std::optional<std::string> Token(int64_t id) const;
  // Whether `id` is an added token marked special.
  bool IsSpecial(int64_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<const Impl> impl);

  std::unique_ptr<const Impl> impl_;
};

}  // namespace eagle3
