// The bulk f16 conversions (used by the CPU backend) agree with the scalar reference
// conversions on every binary16 pattern and on many random floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "core/rng.h"

namespace minamp {
namespace {

TEST(HalfBulk, WideningMatchesTheScalarConversionOnAllPatterns) {
  std::vector<half> all(65536);
  for (uint32_t bits = 0; bits < 65536; ++bits) all[bits] = half::from_bits(uint16_t(bits));
  std::vector<float> wide(all.size());
  half_to_float(all.data(), wide.data(), int64_t(all.size()));
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const float expected = half_bits_to_float(uint16_t(bits));
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(wide[bits])) << bits;
    } else {
      EXPECT_EQ(std::memcmp(&wide[bits], &expected, sizeof expected), 0) << bits;
    }
  }
}

TEST(HalfBulk, NarrowingMatchesTheScalarConversionOnRandomFloats) {
  Rng rng(99);
  std::vector<float> values;
  for (int i = 0; i < 1 << 20; ++i) {
    uint32_t bits = rng.next_u32();
    // Half of the draws land near binary16's range (exponents 2^-26 .. 2^17) where rounding,
    // subnormals and overflow happen; the rest anywhere.
    if (i % 2) bits = (bits & 0x807fffff) | ((101 + rng.below(44)) << 23);
    float v;
    std::memcpy(&v, &bits, sizeof v);
    values.push_back(v);
  }
  std::vector<half> narrow(values.size());
  float_to_half(values.data(), narrow.data(), int64_t(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t expected = float_to_half_bits(values[i]);
    if (std::isnan(values[i])) {
      EXPECT_EQ(narrow[i].bits & 0x7e00, 0x7e00) << "a NaN stays a NaN";
    } else {
      ASSERT_EQ(narrow[i].bits, expected) << "value " << values[i];
    }
  }
}

} // namespace
} // namespace minamp
