// UTF-8 well-formedness (Unicode 15, table 3-7) for the tokenizer: validation of input text and the
// lossy conversion that `tokenizers`' decode applies to the decoded bytes (Rust's
// String::from_utf8_lossy: each maximal ill-formed subpart becomes one U+FFFD).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace eagle3::tokenizer_internal {

// Byte offset of the first byte that starts no well-formed sequence; nullopt when `bytes` is valid.
std::optional<size_t> FirstInvalidUtf8(std::string_view bytes);

// `bytes` with each maximal subpart of an ill-formed sequence replaced by U+FFFD.
std::string LossyUtf8(std::string_view bytes);

// Appends the UTF-8 encoding of `code_point` (at most U+10FFFF, not a surrogate) to `out`.
void AppendUtf8(char32_t code_point, std::string* out);

// Decodes the well-formed sequence at `bytes[*pos]` and advances `*pos` past it; nullopt (and
// `*pos` unchanged) when none starts there.
std::optional<char32_t> NextCodePoint(std::string_view bytes, size_t* pos);

}  // namespace eagle3::tokenizer_internal
