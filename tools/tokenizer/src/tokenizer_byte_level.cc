#include "tokenizer_byte_level.h"

#include "tokenizer_utf8.h"

namespace eagle3::tokenizer_internal {
namespace {

bool StandsForItself(uint32_t byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
}

struct Tables {
  std::array<char32_t, 256> char_of_byte{};
  // Indexed by code point; every alphabet code point is below 0x144.
  static constexpr char32_t kCodePointLimit = 0x144;
  std::array<int16_t, kCodePointLimit> byte_of_char{};

  Tables() {
    byte_of_char.fill(-1);
    char32_t next_shifted = 0x100;
    for (uint32_t byte = 0; byte < 256; ++byte) {
      const char32_t c = StandsForItself(byte) ? static_cast<char32_t>(byte) : next_shifted++;
      char_of_byte[byte] = c;
      byte_of_char[c] = static_cast<int16_t>(byte);
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

}  // namespace

char32_t ByteLevelChar(uint8_t byte) { return GetTables().char_of_byte[byte]; }

std::optional<uint8_t> ByteLevelByte(char32_t code_point) {
  if (code_point >= Tables::kCodePointLimit) return std::nullopt;
  const int16_t byte = GetTables().byte_of_char[code_point];
  if (byte < 0) return std::nullopt;
  return static_cast<uint8_t>(byte);
}

std::string ToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) AppendUtf8(ByteLevelChar(static_cast<uint8_t>(b)), &out);
  return out;
}

std::optional<std::string> FromByteLevel(std::string_view token) {
  std::string bytes;
  size_t pos = 0;
  while (pos < token.size()) {
    const std::optional<char32_t> c = NextCodePoint(token, &pos);
    if (!c.has_value()) return std::nullopt;
    const std::optional<uint8_t> byte = ByteLevelByte(*c);
    if (!byte.has_value()) return std::nullopt;
    bytes.push_back(static_cast<char>(*byte));
  }
  return bytes;
}

}  // namespace eagle3::tokenizer_internal
