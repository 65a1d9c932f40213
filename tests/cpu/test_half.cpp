// Tests for minamp::half: exhaustive round trips of all 65,536 bit patterns, millions of
// float -> half conversions checked against an independent exact reference (and F16C hardware
// where the CPU has it), exact ties, and the subnormal / overflow boundaries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.h"
#include "core/rng.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MINAMP_TEST_HAS_X86 1
#else
#define MINAMP_TEST_HAS_X86 0
#endif

namespace minamp {
namespace {

float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

bool is_half_nan(uint16_t bits) { return (bits & 0x7c00) == 0x7c00 && (bits & 0x03ff) != 0; }

// The exact value of a non-negative, non-NaN binary16 bit pattern, computed in double from the
// format's definition. The infinity pattern 0x7c00 gets 65536 = 2^16, the value binary16 would
// have there with an unbounded exponent: the correct neighbour when rounding near the top.
double half_value_in_double(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return std::ldexp(static_cast<double>(mantissa), -24);
  return std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
}

// Values of the positive binary16 patterns 0x0000..0x7c00, ascending with the bit pattern.
const std::vector<double>& positive_half_values() {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (uint32_t bits = 0; bits <= 0x7c00; ++bits)
      v.push_back(half_value_in_double(static_cast<uint16_t>(bits)));
    return v;
  }();
  return values;
}

// Reference float -> binary16: find the two binary16 neighbours of |x| by their double values
// and keep the nearer one, ties to the even mantissa. Differences are exact in double.
uint16_t reference_half_bits(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return 0x7e00;
  const double magnitude = std::fabs(static_cast<double>(x));
  const std::vector<double>& values = positive_half_values();
  if (magnitude >= values.back()) return sign | 0x7c00;
  // The first value above `magnitude`, and the one before it (<= magnitude).
  const size_t above = std::upper_bound(values.begin(), values.end(), magnitude) - values.begin();
  const size_t below = above - 1;
  const double down = magnitude - values[below];
  const double up = values[above] - magnitude;
  size_t nearest = down < up ? below : above;
  if (down == up) nearest = (below % 2 == 0) ? below : above;
  return sign | static_cast<uint16_t>(nearest);
}

#if MINAMP_TEST_HAS_X86
__attribute__((target("f16c"))) uint16_t f16c_half_bits(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
bool cpu_has_f16c() { return __builtin_cpu_supports("f16c"); }
#else
uint16_t f16c_half_bits(float) { return 0; }
bool cpu_has_f16c() { return false; }
#endif

// Checks float_to_half_bits against the reference (and F16C when present) for every input;
// stops after a few failures so a broken conversion does not print a million lines.
void expect_conversions_match(const std::vector<float>& inputs) {
  const bool check_f16c = cpu_has_f16c();
  int failures = 0;
  for (float x : inputs) {
    const uint16_t got = float_to_half_bits(x);
    const uint16_t want = reference_half_bits(x);
    bool ok = std::isnan(x) ? is_half_nan(got) : got == want;
    if (check_f16c && ok) {
      const uint16_t hardware = f16c_half_bits(x);
      ok = std::isnan(x) ? is_half_nan(hardware) : got == hardware;
    }
    if (!ok) {
      ADD_FAILURE() << "float_to_half_bits(" << x << ") = 0x" << std::hex << got << ", reference 0x"
                    << want << ", f16c 0x" << (check_f16c ? f16c_half_bits(x) : 0);
      if (++failures == 10) return;
    }
  }
}

TEST(Half, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t pattern = 0; pattern <= 0xffff; ++pattern) {
    const uint16_t bits = static_cast<uint16_t>(pattern);
    const float value = half_bits_to_float(bits);
    const uint16_t back = float_to_half_bits(value);
    if (is_half_nan(bits)) {
      ASSERT_TRUE(std::isnan(value)) << std::hex << pattern;
      // Sign and payload survive, the NaN made quiet (as x86's F16C converts).
      ASSERT_EQ(back, bits | 0x0200) << std::hex << pattern;
    } else {
      ASSERT_EQ(back, bits) << std::hex << pattern;
      if ((bits & 0x7c00) == 0x7c00) continue; // infinities: checked below by value
      ASSERT_EQ(static_cast<double>(value),
                (bits & 0x8000 ? -1 : 1) * half_value_in_double(bits & 0x7fff))
          << std::hex << pattern;
    }
  }
}

TEST(Half, RandomBitPatternsMatchReference) {
  Rng rng(2024);
  std::vector<float> inputs(1'000'000);
  for (float& x : inputs) x = float_from_bits(rng.next_u32());
  expect_conversions_match(inputs);
}

TEST(Half, RandomValuesNearHalfRangeMatchReference) {
  Rng rng(7);
  std::vector<float> inputs(1'000'000);
  for (float& x : inputs) {
    // Exponents from 2^-27 (below the smallest subnormal) to 2^17 (past the largest finite).
    const uint32_t exponent = 127 - 27 + rng.below(45);
    const uint32_t sign = rng.below(2) << 31;
    x = float_from_bits(sign | (exponent << 23) | (rng.next_u32() & 0x7fffff));
  }
  expect_conversions_match(inputs);
}

TEST(Half, EveryExactTieAndItsNeighboursMatchReference) {
  std::vector<float> inputs;
  for (uint16_t bits = 0; bits < 0x7c00; ++bits) {
    // The midpoint of two adjacent binary16 values has 12 significant bits: exact in float.
    const float tie = static_cast<float>(
        (half_value_in_double(bits) + half_value_in_double(static_cast<uint16_t>(bits + 1))) / 2);
    for (float x : {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, INFINITY)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  expect_conversions_match(inputs);
  // Spot-check the rule itself: 1 + 2^-11 lies between 1 (even) and 1 + 2^-10 (odd).
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * 0x1p-11f), 0x3c02);
}

TEST(Half, SubnormalBoundaries) {
  EXPECT_EQ(float_to_half_bits(0x1p-24f), 0x0001);                       // smallest subnormal
  EXPECT_EQ(float_to_half_bits(0x1p-25f), 0x0000);                       // tie with 0 -> 0
  EXPECT_EQ(float_to_half_bits(-0x1p-25f), 0x8000);                      // keeps the sign
  EXPECT_EQ(float_to_half_bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001); // just above the tie
  EXPECT_EQ(float_to_half_bits(3 * 0x1p-26f), 0x0001);                   // 0.75 ulp -> 1
  EXPECT_EQ(float_to_half_bits(3 * 0x1p-25f), 0x0002);                   // tie 1|2 -> even 2
  EXPECT_EQ(float_to_half_bits(5 * 0x1p-25f), 0x0002);                   // tie 2|3 -> even 2
  EXPECT_EQ(float_to_half_bits(0x1p-14f), 0x0400);                       // smallest normal
  EXPECT_EQ(float_to_half_bits(0x1p-14f - 0x1p-24f), 0x03ff);            // largest subnormal
  EXPECT_EQ(float_to_half_bits(0x1p-14f + 0x1p-24f), 0x0401);            // next normal
  EXPECT_EQ(float_to_half_bits(std::nextafter(0x1p-14f, 0.0f)), 0x0400); // rounds up
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(half_bits_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_bits_to_float(0x03ff), 0x1p-14f - 0x1p-24f);
  EXPECT_EQ(half_bits_to_float(0x0400), kHalfMinNormal);
  EXPECT_EQ(half_bits_to_float(0x0001), kHalfMinSubnormal);
}

TEST(Half, OverflowBoundaryAndSpecialValues) {
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);
  EXPECT_EQ(half_bits_to_float(0x7c00), INFINITY);
  EXPECT_EQ(half_bits_to_float(0x7bff), kHalfMax);
  EXPECT_EQ(float_to_half_bits(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00); // tie between 65504 (odd) and 2^16 -> inf
  EXPECT_EQ(float_to_half_bits(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_half_bits(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half_bits(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_half_bits(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_half_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_TRUE(std::signbit(half_bits_to_float(0x8000)));
  EXPECT_TRUE(is_half_nan(float_to_half_bits(std::nanf(""))));
  EXPECT_TRUE(is_half_nan(float_to_half_bits(-std::nanf(""))));
  EXPECT_TRUE(std::isnan(half_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::isinf(half_bits_to_float(0xfc00)) && half_bits_to_float(0xfc00) < 0);
}

TEST(Half, StructAndRoundToHalfAgreeWithBitFunctions) {
  Rng rng(11);
  for (int i = 0; i < 1000; ++i) {
    const float x = rng.uniform(-70000.0f, 70000.0f);
    const half h(x);
    EXPECT_EQ(h.bits, float_to_half_bits(x));
    EXPECT_EQ(static_cast<float>(h), round_to_half(x));
  }
  EXPECT_EQ(half::from_bits(0x3c00).bits, 0x3c00);
  EXPECT_EQ(static_cast<float>(half::from_bits(0xc000)), -2.0f);
}

} // namespace
} // namespace minamp
