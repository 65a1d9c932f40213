// The two 16-bit float formats on the host, as bit patterns with conversions to and from float:
//   minamp::half      IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits (2^-24 .. 65504)
//   minamp::bfloat16  bfloat16: 1 sign, 8 exponent, 7 mantissa bits — float's top 16 bits, so
//                     float's range (2^-133 .. ~3.39e38) with 3 significant digits fewer than f16
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

// The bfloat16 bit pattern nearest to `value` (ties to even; a magnitude of 2^128 - 2^119,
// the largest finite bfloat16 plus half an ulp, or more rounds to inf). A NaN stays a NaN, made
// quiet, with its sign and top payload bits.
uint16_t float_to_bfloat16_bits(float value);
// The float equal to a bfloat16 bit pattern (its bits followed by 16 zero bits).
float bfloat16_bits_to_float(uint16_t bits);

struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float value) : bits(float_to_bfloat16_bits(value)) {}
  static bfloat16 from_bits(uint16_t bits) {
    bfloat16 b;
    b.bits = bits;
    return b;
  }
  explicit operator float() const { return bfloat16_bits_to_float(bits); }
};

// Rounds a float to the nearest bfloat16 value and back: what storing it in bf16 does.
inline float round_to_bfloat16(float value) {
  return bfloat16_bits_to_float(float_to_bfloat16_bits(value));
}

constexpr float kBfloat16Max = 3.38953138925153547590470800371487867e38f; // (2 - 2^-7) 2^127
constexpr float kBfloat16MinNormal = 1.17549435082228750797e-38f;         // 2^-126
constexpr float kBfloat16MinSubnormal = 9.18354961579912115600e-41f;      // 2^-133

} // namespace minamp

namespace minamp {

// Bulk conversions, the hot path of the CPU backend's f16 and bf16 emulation. They give exactly the
// results of the scalar functions above (NaN payloads aside), with the F16C instructions where
// the build targets them (x86-64 with -march=native) and on every OpenMP thread for large arrays.
void half_to_float(const half* src, float* dst, int64_t n);
void float_to_half(const float* src, half* dst, int64_t n);
// The same for bfloat16 (integer arithmetic the compiler vectorises; results equal the scalar
// functions').
void bfloat16_to_float(const bfloat16* src, float* dst, int64_t n);
void float_to_bfloat16(const float* src, bfloat16* dst, int64_t n);

} // namespace minamp
