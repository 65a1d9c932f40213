// Bit-exact float <-> binary16 and float <-> bfloat16 conversions with round-to-nearest-even: one
// value at a time in integer arithmetic (the reference), and whole arrays with the CPU's
// conversion instructions where it has them (x86 F16C), in parallel for large arrays.
#include "core/half.h"

#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

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
  // < 2^-25: rounds to ±0 (2^-25 itself, a tie, rounds to even 0 on the subnormal path below).
  if (magnitude < 0x33000000) return sign;
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

// bfloat16 is float's upper half: rounding to nearest even adds just under half of the dropped
// 16 bits' range (0x7fff), plus one when the kept part is odd, and truncates. The carry walks
// into the exponent where it must: the largest finite bfloat16 plus half an ulp becomes inf, and
// the largest subnormal plus half an ulp the smallest normal.
uint16_t float_to_bfloat16_bits(float value) {
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffff) > 0x7f800000) // NaN: keep sign and top payload bits, make it quiet
    return static_cast<uint16_t>((bits >> 16) | 0x0040);
  return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}

float bfloat16_bits_to_float(uint16_t bits) { return bits_float(uint32_t(bits) << 16); }

} // namespace minamp

namespace minamp {

namespace {

// Arrays shorter than this convert on one thread.
constexpr int64_t kParallelConversion = 1 << 16;

#if defined(__F16C__)
// x86 F16C: 8 values per instruction; vcvtps2ph with _MM_FROUND_TO_NEAREST_INT rounds to nearest
// even, exactly as float_to_half_bits (tests/cpu/test_half_bulk.cpp checks both directions).
constexpr int64_t kVector = 8;
void widen_vector(const half* src, float* dst) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
  _mm256_storeu_ps(dst, _mm256_cvtph_ps(bits));
}
void narrow_vector(const float* src, half* dst) {
  const __m128i bits =
      _mm256_cvtps_ph(_mm256_loadu_ps(src), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), bits);
}
#else
constexpr int64_t kVector = 1;
void widen_vector(const half* src, float* dst) { *dst = half_bits_to_float(src->bits); }
void narrow_vector(const float* src, half* dst) { dst->bits = float_to_half_bits(*src); }
#endif

} // namespace

// Whole vectors in parallel over the array (each element is converted on its own, so the thread
// count cannot change a result), then the tail with the scalar conversion.
void half_to_float(const half* src, float* dst, int64_t n) {
  const int64_t vectors = n / kVector;
#pragma omp parallel for schedule(static) if (n >= kParallelConversion)
  for (int64_t v = 0; v < vectors; ++v) widen_vector(src + v * kVector, dst + v * kVector);
  for (int64_t i = vectors * kVector; i < n; ++i) dst[i] = half_bits_to_float(src[i].bits);
}

void float_to_half(const float* src, half* dst, int64_t n) {
  const int64_t vectors = n / kVector;
#pragma omp parallel for schedule(static) if (n >= kParallelConversion)
  for (int64_t v = 0; v < vectors; ++v) narrow_vector(src + v * kVector, dst + v * kVector);
  for (int64_t i = vectors * kVector; i < n; ++i) dst[i].bits = float_to_half_bits(src[i]);
}

// One element per iteration: the scalar conversions are branch-free integer arithmetic, which
// the compiler turns into vector instructions.
void bfloat16_to_float(const bfloat16* src, float* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelConversion)
  for (int64_t i = 0; i < n; ++i) dst[i] = bfloat16_bits_to_float(src[i].bits);
}

void float_to_bfloat16(const float* src, bfloat16* dst, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kParallelConversion)
  for (int64_t i = 0; i < n; ++i) dst[i].bits = float_to_bfloat16_bits(src[i]);
}

} // namespace minamp
