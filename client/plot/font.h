#pragma once

#include <array>
#include <cstdint>

namespace loom::plot {

// A 5 x 7 bitmap glyph: one byte per row, top first, the low 5 bits the columns (bit 4 leftmost).
using Glyph = std::array<uint8_t, 7>;

// The glyph of an ASCII character: digits, letters and the punctuation of metric names, job ids
// and numbers; a box for anything else.
const Glyph& glyphOf(char c);

}  // namespace loom::plot
