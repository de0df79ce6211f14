#include "tokenizer_utf8.h"

#include <cstdint>

namespace eagle3::tokenizer_internal {
namespace {

// Length of the well-formed sequence at `bytes[pos]` or, when none starts there, the negated
// length of its maximal subpart (the longest prefix that some well-formed sequence starts with,
// at least one byte).
ptrdiff_t SequenceLength(std::string_view bytes, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return 1;
  int length = 0;
  // Range of the second byte (table 3-7); later bytes are always 80..BF.
  uint8_t low = 0x80;
  uint8_t high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // no overlong forms
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;  // 80..C1 and F5..FF start nothing
  }
  for (int i = 1; i < length; ++i) {
    if (pos + i >= bytes.size()) return -i;
    const uint8_t b = byte(pos + i);
    const bool ok = i == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -i;
  }
  return length;
}

}  // namespace

std::optional<size_t> FirstInvalidUtf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const ptrdiff_t length = SequenceLength(bytes, pos);
    if (length < 0) return pos;
    pos += static_cast<size_t>(length);
  }
  return std::nullopt;
}

std::string LossyUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const ptrdiff_t length = SequenceLength(bytes, pos);
    if (length > 0) {
      out.append(bytes.substr(pos, static_cast<size_t>(length)));
      pos += static_cast<size_t>(length);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      pos += static_cast<size_t>(-length);
    }
  }
  return out;
}

void AppendUtf8(char32_t code_point, std::string* out) {
  const auto put = [out](uint32_t b) { out->push_back(static_cast<char>(b)); };
  const uint32_t c = code_point;
  if (c < 0x80) {
    put(c);
  } else if (c < 0x800) {
    put(0xC0 | (c >> 6));
    put(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    put(0xE0 | (c >> 12));
    put(0x80 | ((c >> 6) & 0x3F));
    put(0x80 | (c & 0x3F));
  } else {
    put(0xF0 | (c >> 18));
    put(0x80 | ((c >> 12) & 0x3F));
    put(0x80 | ((c >> 6) & 0x3F));
    put(0x80 | (c & 0x3F));
  }
}

std::optional<char32_t> NextCodePoint(std::string_view bytes, size_t* pos) {
  if (*pos >= bytes.size()) return std::nullopt;
  const ptrdiff_t length = SequenceLength(bytes, *pos);
  if (length < 0) return std::nullopt;
  const auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])); };
  uint32_t c = byte(*pos);
  if (length > 1) c &= 0xFFu >> (length + 1);  // payload bits of the lead byte
  for (ptrdiff_t i = 1; i < length; ++i) c = (c << 6) | (byte(*pos + i) & 0x3F);
  *pos += static_cast<size_t>(length);
  return static_cast<char32_t>(c);
}

}  // namespace eagle3::tokenizer_internal
