// Bit-exact float <-> binary16 conversions with round-to-nearest-even, in integer arithmetic.
#include "core/half.h"

#include <cstring>

namespace minamp {

namespace {
uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}
float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
// Shifts `mantissa` right by `shift` bits, rounding to nearest with ties to even.
uint32_t shift_round_even(uint32_t mantissa, int shift) {
  uint32_t kept = mantissa >> shift;
  uint32_t rest = mantissa & ((1u << shift) - 1);
  uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (kept & 1))) ++kept;
  return kept;
}
} // namespace

uint16_t float_to_half_bits(float value) {
  const uint32_t bits = float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;

  if (magnitude > 0x7f800000) // NaN: keep it quiet, keep the top payload bits
    return sign | 0x7e00 | ((magnitude >> 13) & 0x1ff);
  if (magnitude >= 0x477ff000) // >= 65520 = 65504 + half an ulp: rounds to inf (and inf itself)
    return sign | 0x7c00;
  if (magnitude >= 0x38800000) { // >= 2^-14: normal binary16, re-bias the exponent by 127 - 15
    return sign | static_cast<uint16_t>(shift_round_even(magnitude - 0x38000000, 13));
  }
  if (magnitude < 0x33000000) // < 2^-25 (and 2^-25 itself, a tie with 0): rounds to ±0
    return sign;
  // Subnormal binary16: value = m * 2^-24. With the float's implicit bit restored,
  // value = mantissa * 2^(exponent - 150), so m = mantissa >> (126 - exponent), rounded.
  const int exponent = static_cast<int>(magnitude >> 23);
  const uint32_t mantissa = (magnitude & 0x7fffff) | 0x800000;
  return sign | static_cast<uint16_t>(shift_round_even(mantissa, 126 - exponent));
}

float half_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0x1f) return bits_float(sign | 0x7f800000 | (mantissa << 13));
  if (exponent != 0) return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * kHalfMinSubnormal;
  return sign ? -magnitude : magnitude;
}

} // namespace minamp

namespace minamp {

#if defined(__FLT16_MAX__)
// _Float16 is IEEE binary16 with round-to-nearest-even conversions; half has the same layout.
static_assert(sizeof(_Float16) == sizeof(half));

void half_to_float(const half* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    _Float16 h;
    std::memcpy(&h, &src[i].bits, sizeof h);
    dst[i] = static_cast<float>(h);
  }
}

void float_to_half(const float* src, half* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const _Float16 h = static_cast<_Float16>(src[i]);
    std::memcpy(&dst[i].bits, &h, sizeof h);
  }
}
#else
void half_to_float(const half* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = half_bits_to_float(src[i].bits);
}

void float_to_half(const float* src, half* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = float_to_half_bits(src[i]);
}
#endif

} // namespace minamp
