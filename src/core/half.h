// minamp::half — IEEE 754 binary16 on the host: 1 sign, 5 exponent, 10 mantissa bits.
// Conversions from float round to nearest, ties to even; subnormals, ±inf and NaN are kept.
#pragma once

#include <cstdint>

namespace minamp {

// The binary16 bit pattern nearest to `value` (ties to even; a magnitude of 65520, 65504 plus
// half an ulp, or more rounds to inf).
uint16_t float_to_half_bits(float value);
// The float equal to a binary16 bit pattern (every binary16 value is exact in float).
float half_bits_to_float(uint16_t bits);

struct half {
  uint16_t bits = 0;

  half() = default;
  explicit half(float value) : bits(float_to_half_bits(value)) {}
  static half from_bits(uint16_t bits) {
    half h;
    h.bits = bits;
    return h;
  }
  explicit operator float() const { return half_bits_to_float(bits); }
};

// Rounds a float to the nearest binary16 value and back: what storing it in f16 does.
inline float round_to_half(float value) { return half_bits_to_float(float_to_half_bits(value)); }

constexpr float kHalfMax = 65504.0f;                         // largest finite binary16
constexpr float kHalfMinNormal = 6.103515625e-05f;           // 2^-14
constexpr float kHalfMinSubnormal = 5.9604644775390625e-08f; // 2^-24

} // namespace minamp

namespace minamp {

// Bulk conversions, the hot path of the CPU backend's f16 emulation. They give exactly the
// results of the scalar functions above (NaN payloads aside), with the F16C instructions where
// the build targets them (x86-64 with -march=native) and on every OpenMP thread for large arrays.
void half_to_float(const half* src, float* dst, int64_t n);
void float_to_half(const float* src, half* dst, int64_t n);

} // namespace minamp
