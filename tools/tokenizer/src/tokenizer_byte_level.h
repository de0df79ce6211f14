// The ByteLevel alphabet of `tokenizers` (GPT-2's): every byte is written as one printable code
// point. Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves (as U+0021.., U+00A1..);
// the 68 others (controls, space, 0x7F..0xA0, 0xAD) take U+0100, U+0101, ... in byte order, so
// the space is U+0120 'Ġ' and '\n' is U+010A 'Ċ'.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace eagle3::tokenizer_internal {

// Code point that stands for `byte`.
char32_t ByteLevelChar(uint8_t byte);

// Byte that `code_point` stands for; nullopt when it is not in the alphabet.
std::optional<uint8_t> ByteLevelByte(char32_t code_point);

// `bytes` written in the alphabet (UTF-8).
std::string ToByteLevel(std::string_view bytes);

// Bytes of a token written in the alphabet; nullopt when `token` (valid UTF-8) holds a code point
// outside it.
std::optional<std::string> FromByteLevel(std::string_view token);

}  // namespace eagle3::tokenizer_internal
