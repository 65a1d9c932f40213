// Tests for minamp::bfloat16: exhaustive round trips of all 65,536 bit patterns, millions of
// float -> bfloat16 conversions checked against an independent reference that rounds by value
// in double, every exact tie, the subnormal and overflow boundaries, and the bulk conversions
// against the scalar ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.h"
#include "core/rng.h"

namespace minamp {
namespace {

float float_from_bits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

bool is_bfloat16_nan(uint16_t bits) { return (bits & 0x7f80) == 0x7f80 && (bits & 0x007f) != 0; }

// The exact value of a non-negative, non-NaN bfloat16 bit pattern, from the format's definition
// (1 sign, 8 exponent bits biased by 127, 7 mantissa bits). The infinity pattern 0x7f80 gets
// 2^128, the value it would have with an unbounded exponent: the correct upper neighbour of the
// largest finite value when rounding.
double bfloat16_value_in_double(uint16_t bits) {
  const int exponent = (bits >> 7) & 0xff;
  const int mantissa = bits & 0x7f;
  if (exponent == 0) return std::ldexp(static_cast<double>(mantissa), -133);
  return std::ldexp(static_cast<double>(128 + mantissa), exponent - 134);
}

// Reference float -> bfloat16 by value: the two bfloat16 neighbours of |x| (the patterns just
// below and above it), the nearer kept, ties to the even pattern. Differences are exact in double.
uint16_t reference_bfloat16_bits(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double magnitude = std::fabs(static_cast<double>(x));
  if (std::isinf(x)) return sign | 0x7f80;
  // The largest pattern whose value is <= magnitude: a float's top 16 bits truncate toward 0.
  const uint16_t below = static_cast<uint16_t>((bits_of(x) & 0x7fffffff) >> 16);
  const uint16_t above = static_cast<uint16_t>(below + 1);
  const double down = magnitude - bfloat16_value_in_double(below);
  const double up = bfloat16_value_in_double(above) - magnitude;
  if (down < up || (down == up && below % 2 == 0)) return sign | below;
  return sign | above;
}

// Checks float_to_bfloat16_bits against the reference for every input (a NaN must give a quiet
// NaN of the same sign); stops after a few failures.
void expect_conversions_match(const std::vector<float>& inputs) {
  int failures = 0;
  for (float x : inputs) {
    const uint16_t got = float_to_bfloat16_bits(x);
    const bool ok = std::isnan(x) ? is_bfloat16_nan(got) && (got & 0x0040) &&
                                        (got & 0x8000) == (bits_of(x) >> 16 & 0x8000)
                                  : got == reference_bfloat16_bits(x);
    if (!ok) {
      ADD_FAILURE() << "float_to_bfloat16_bits(" << x << ") = 0x" << std::hex << got
                    << ", reference 0x" << reference_bfloat16_bits(x);
      if (++failures == 10) return;
    }
  }
}

TEST(Bfloat16, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t pattern = 0; pattern <= 0xffff; ++pattern) {
    const uint16_t bits = static_cast<uint16_t>(pattern);
    const float value = bfloat16_bits_to_float(bits);
    const uint16_t back = float_to_bfloat16_bits(value);
    if (is_bfloat16_nan(bits)) {
      ASSERT_TRUE(std::isnan(value)) << std::hex << pattern;
      ASSERT_EQ(back, bits | 0x0040) << std::hex << pattern; // sign and payload kept, made quiet
      continue;
    }
    ASSERT_EQ(back, bits) << std::hex << pattern;
    if ((bits & 0x7f80) == 0x7f80) {
      ASSERT_TRUE(std::isinf(value) && std::signbit(value) == bool(bits & 0x8000));
      continue;
    }
    ASSERT_EQ(static_cast<double>(value),
              (bits & 0x8000 ? -1 : 1) * bfloat16_value_in_double(bits & 0x7fff))
        << std::hex << pattern;
    ASSERT_EQ(std::signbit(value), bool(bits & 0x8000)) << std::hex << pattern; // -0 too
  }
}

TEST(Bfloat16, RandomBitPatternsMatchReference) {
  Rng rng(2025);
  std::vector<float> inputs(1'000'000);
  for (float& x : inputs) x = float_from_bits(rng.next_u32());
  expect_conversions_match(inputs);
}

TEST(Bfloat16, EveryExactTieAndItsNeighboursMatchReference) {
  std::vector<float> inputs;
  for (uint16_t bits = 0; bits < 0x7f80; ++bits) {
    // The midpoint of two adjacent bfloat16 values has 9 significant bits: exact in float.
    const float tie = static_cast<float>(
        (bfloat16_value_in_double(bits) + bfloat16_value_in_double(uint16_t(bits + 1))) / 2);
    for (float x : {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, INFINITY)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  expect_conversions_match(inputs);
  // The rule itself: 1 + 2^-8 lies between 1 (even) and 1 + 2^-7 (odd); 1 + 3 * 2^-8 between
  // 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16_bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(float_to_bfloat16_bits(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
}

TEST(Bfloat16, SubnormalBoundaries) {
  EXPECT_EQ(float_to_bfloat16_bits(0x1p-133f), 0x0001); // smallest subnormal
  EXPECT_EQ(float_to_bfloat16_bits(0x1p-134f), 0x0000); // tie with 0 -> 0
  EXPECT_EQ(float_to_bfloat16_bits(-0x1p-134f), 0x8000);
  EXPECT_EQ(float_to_bfloat16_bits(std::nextafter(0x1p-134f, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_bfloat16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bfloat16_bits(0x1p-126f), 0x0080);             // smallest normal
  EXPECT_EQ(float_to_bfloat16_bits(0x1p-126f - 0x1p-133f), 0x007f); // largest subnormal
  // Just below the smallest normal, past the tie with the largest subnormal: rounds up into it.
  EXPECT_EQ(float_to_bfloat16_bits(std::nextafter(0x1p-126f, 0.0f)), 0x0080);
  EXPECT_EQ(bfloat16_bits_to_float(0x0001), kBfloat16MinSubnormal);
  EXPECT_EQ(bfloat16_bits_to_float(0x0080), kBfloat16MinNormal);
  EXPECT_EQ(kBfloat16MinSubnormal, 0x1p-133f);
  EXPECT_EQ(kBfloat16MinNormal, 0x1p-126f);
}

TEST(Bfloat16, OverflowBoundaryAndSpecialValues) {
  EXPECT_EQ(bfloat16_bits_to_float(0x7f7f), kBfloat16Max);
  EXPECT_EQ(kBfloat16Max, (2.0f - 0x1p-7f) * 0x1p127f);
  EXPECT_EQ(float_to_bfloat16_bits(kBfloat16Max), 0x7f7f);
  // The tie between the largest finite value (odd) and 2^128 rounds to even: inf.
  const float tie = float_from_bits(0x7f7f8000);
  EXPECT_EQ(float_to_bfloat16_bits(tie), 0x7f80);
  EXPECT_EQ(float_to_bfloat16_bits(-tie), 0xff80);
  EXPECT_EQ(float_to_bfloat16_bits(std::nextafter(tie, 0.0f)), 0x7f7f);
  EXPECT_EQ(float_to_bfloat16_bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bfloat16_bits(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bfloat16_bits(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bfloat16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bfloat16_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bfloat16_bits(65504.0f), 0x4780); // f16's largest finite value: 65536
  EXPECT_EQ(float_to_bfloat16_bits(1e38f), 0x7e96);    // far past f16's range, finite
  // A NaN whose payload lies only in the bits that are dropped stays a NaN (made quiet).
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0x7f800001)), 0x7fc0);
  EXPECT_EQ(float_to_bfloat16_bits(float_from_bits(0xff800001)), 0xffc0);
  EXPECT_TRUE(std::isnan(bfloat16_bits_to_float(0x7fc0)));
}

TEST(Bfloat16, StructAndRoundToBfloat16AgreeWithBitFunctions) {
  Rng rng(12);
  for (int i = 0; i < 1000; ++i) {
    const float x = rng.uniform(-1e30f, 1e30f);
    const bfloat16 b(x);
    EXPECT_EQ(b.bits, float_to_bfloat16_bits(x));
    EXPECT_EQ(static_cast<float>(b), round_to_bfloat16(x));
  }
  EXPECT_EQ(static_cast<float>(bfloat16::from_bits(0xc000)), -2.0f);
}

TEST(Bfloat16Bulk, WideningMatchesTheScalarConversionOnAllPatterns) {
  std::vector<bfloat16> all(65536);
  for (uint32_t bits = 0; bits < 65536; ++bits) all[bits] = bfloat16::from_bits(uint16_t(bits));
  std::vector<float> wide(all.size());
  bfloat16_to_float(all.data(), wide.data(), int64_t(all.size()));
  for (uint32_t bits = 0; bits < 65536; ++bits)
    ASSERT_EQ(bits_of(wide[bits]), bits_of(bfloat16_bits_to_float(uint16_t(bits)))) << bits;
}

TEST(Bfloat16Bulk, NarrowingMatchesTheScalarConversionOnRandomFloats) {
  Rng rng(98);
  std::vector<float> values;
  for (int i = 0; i < 1 << 20; ++i) values.push_back(float_from_bits(rng.next_u32()));
  std::vector<bfloat16> narrow(values.size());
  float_to_bfloat16(values.data(), narrow.data(), int64_t(values.size()));
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(narrow[i].bits, float_to_bfloat16_bits(values[i])) << "value " << values[i];
}

} // namespace
} // namespace minamp
