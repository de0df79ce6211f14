#include "tokenizer_code_split.h"

namespace eagle3::tokenizer_internal {
namespace {

bool IsSpaceClass(char c) {  // [ \t\n\r\f\v]
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsIdentifierStart(char c) {  // [A-Za-z_]
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}
bool IsIdentifierPart(char c) { return IsIdentifierStart(c) || IsDigit(c); }
bool IsOther(char c) {  // [^ \t\n\r\f\vA-Za-z0-9_], bytes >= 0x80 included
  return !IsSpaceClass(c) && !IsIdentifierPart(c);
}

// Length of the contraction at `text[pos]` (an apostrophe), 0 if none.
size_t ContractionLength(std::string_view text, size_t pos) {
  const std::string_view rest = text.substr(pos + 1);
  if (rest.empty()) return 0;
  const char c = rest[0];
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
  if (rest.size() >= 2 &&
      (rest.substr(0, 2) == "re" || rest.substr(0, 2) == "ve" || rest.substr(0, 2) == "ll")) {
    return 3;
  }
  return 0;
}

// End of the run of bytes satisfying `in_class` that starts at `pos`.
template <typename Pred>
size_t RunEnd(std::string_view text, size_t pos, Pred in_class) {
  while (pos < text.size() && in_class(text[pos])) ++pos;
  return pos;
}

}  // namespace

size_t CodeSplitPieceLength(std::string_view text, size_t pos) {
  const char c = text[pos];
  if (c == '\'') {
    const size_t length = ContractionLength(text, pos);
    if (length > 0) return length;
  }
  // Alternatives 2-4 take one optional leading space; ` ?` is greedy, so a space followed by a
  // non-space character always goes with it.
  size_t start = pos;
  if (c == ' ' && pos + 1 < text.size() && !IsSpaceClass(text[pos + 1])) start = pos + 1;
  const char first = text[start];
  if (!IsSpaceClass(first)) {
    size_t end;
    if (IsIdentifierStart(first)) {
      end = RunEnd(text, start + 1, IsIdentifierPart);
    } else if (IsDigit(first)) {
      end = RunEnd(text, start + 1, IsDigit);
    } else {
      end = RunEnd(text, start + 1, IsOther);
    }
    return end - pos;
  }
  // Whitespace run: alternative 5 matches all of it at the end of the text, and otherwise
  // backtracks one character so that the lookahead sees whitespace; a lone character before text
  // falls to alternative 6.
  const size_t end = RunEnd(text, pos, IsSpaceClass);
  const size_t run = end - pos;
  if (end == text.size() || run == 1) return run;
  return run - 1;
}

}  // namespace eagle3::tokenizer_internal
