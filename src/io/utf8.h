// Text that goes into JSON (safetensors headers, summary.json) must be UTF-8; byte strings such
// as paths need not be. These check text, and turn any bytes into UTF-8 without losing any.
#pragma once

#include <string>

namespace minamp::io {

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF).
bool is_valid_utf8(const std::string& text);

// `bytes` as valid UTF-8, reversibly: each backslash becomes "\\" and each byte that is not part
// of a well-formed UTF-8 sequence "\xNN" (two hex digits); all else is kept. Text that is valid
// UTF-8 and has no backslash comes back unchanged.
std::string escape_to_utf8(const std::string& bytes);

} // namespace minamp::io
