// The Split pre-tokenizer for kCodeSplitPattern (eagle3/tools/tokenizer.h), hand-written with the
// leftmost-first backtracking semantics Oniguruma gives the pattern:
//   '(?:s|t|re|ve|m|ll|d)        lower-case contractions after an apostrophe
//   | ?[A-Za-z_][A-Za-z0-9_]*    identifiers, with one leading space
//   | ?[0-9]+                    digit runs, with one leading space
//   | ?[^ \t\n\r\f\vA-Za-z0-9_]+ runs of everything else (all non-ASCII code points included),
//                                with one leading space
//   |[ \t\n\r\f\v]+(?![^ \t\n\r\f\v])  whitespace not followed by a non-space: a run before text
//                                gives back its last character (so "   x" is "  ", " x"); a run at
//                                the end of the text matches whole
//   |[ \t\n\r\f\v]+              a single whitespace character before text
// Every character is matched by some alternative, so the pieces cover the text with no gaps
// (Isolated behaviour then keeps each match as its own piece). The classes are ASCII, so the
// scanner works on bytes: a multi-byte character is a run of bytes >= 0x80, all in the "everything
// else" class.
#pragma once

#include <cstddef>
#include <string_view>

namespace eagle3::tokenizer_internal {

// Length in bytes of the piece that starts at `text[pos]` (pos < text.size()); at least 1.
// `text` is one segment between added tokens: matching never looks past its ends.
size_t CodeSplitPieceLength(std::string_view text, size_t pos);

}  // namespace eagle3::tokenizer_internal
