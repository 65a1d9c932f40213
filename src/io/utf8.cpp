// UTF-8 validation (RFC 3629) and the reversible escape of other bytes.
#include "io/utf8.h"

namespace minamp::io {

namespace {

// The length of the well-formed UTF-8 sequence at text[at], or 0 when none starts there.
size_t sequence_length(const std::string& text, size_t at) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xbf; // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;  // no overlong form
    if (lead == 0xed) high = 0x9f; // no surrogate
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;  // no overlong form
    if (lead == 0xf4) high = 0x8f; // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (at + length > text.size() || byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (size_t i = 2; i < length; ++i)
    if (byte(at + i) < 0x80 || byte(at + i) > 0xbf) return 0;
  return length;
}

} // namespace

bool is_valid_utf8(const std::string& text) {
  for (size_t at = 0; at < text.size();) {
    const size_t length = sequence_length(text, at);
    if (length == 0) return false;
    at += length;
  }
  return true;
}

std::string escape_to_utf8(const std::string& bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string text;
  for (size_t at = 0; at < bytes.size();) {
    const size_t length = sequence_length(bytes, at);
    if (bytes[at] == '\\') {
      text += "\\\\";
    } else if (length > 0) {
      text.append(bytes, at, length);
      at += length;
      continue;
    } else {
      const auto byte = static_cast<unsigned char>(bytes[at]);
      text += {'\\', 'x', kHex[byte >> 4], kHex[byte & 0xf]};
    }
    ++at;
  }
  return text;
}

} // namespace minamp::io
