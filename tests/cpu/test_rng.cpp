// Tests for minamp::Rng: the published PCG32 sequence, reproducibility from a seed, independence
// of seeds and streams, the statistics of uniform(), normal(), below(n) and permutation(), and
// exact resumption from state().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <vector>

#include "core/rng.h"

namespace minamp {
namespace {

std::vector<uint32_t> draw_u32(Rng& rng, int count) {
  std::vector<uint32_t> values(count);
  for (uint32_t& v : values) v = rng.next_u32();
  return values;
}

int count_equal(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  int equal = 0;
  for (size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
  return equal;
}

struct Moments {
  double mean = 0, variance = 0;
};

template <class Draw> Moments moments_of(int count, Draw draw) {
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < count; ++i) {
    const double x = draw();
    sum += x;
    sum_sq += x * x;
  }
  Moments m;
  m.mean = sum / count;
  m.variance = sum_sq / count - m.mean * m.mean;
  return m;
}

// The first outputs of the reference pcg32 (O'Neill's pcg32-demo, seeded with initstate 42 and
// initseq 54): a generator that only looks random (an even increment, say, which turns stream 0
// into a plain multiplicative generator) passes the statistical tests below but not this one.
TEST(Rng, MatchesThePublishedPcg32Sequence) {
  Rng rng(42, 54);
  EXPECT_EQ(draw_u32(rng, 6), (std::vector<uint32_t>{0xa15c02b7u, 0x7b47f409u, 0xba1d3330u,
                                                     0x83d2f293u, 0xbfa4784bu, 0xcbed606eu}));
}

TEST(Rng, SameSeedGivesSameSequence) {
  Rng a(42), b(42);
  EXPECT_EQ(draw_u32(a, 1000), draw_u32(b, 1000));
  Rng c(42), d(42);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(c.normal(), d.normal());
}

TEST(Rng, DifferentSeedsAndStreamsDiffer) {
  Rng a(1), b(2), c(1, 3);
  const std::vector<uint32_t> from_a = draw_u32(a, 1000);
  // Two independent 32-bit sequences agree at a position with probability 2^-32.
  EXPECT_LE(count_equal(from_a, draw_u32(b, 1000)), 1);
  EXPECT_LE(count_equal(from_a, draw_u32(c, 1000)), 1);
}

TEST(Rng, UniformIsInUnitIntervalWithUniformMoments) {
  Rng rng(5);
  const int n = 100000;
  float lowest = 1, highest = 0;
  const Moments m = moments_of(n, [&] {
    const float x = rng.uniform();
    lowest = std::min(lowest, x);
    highest = std::max(highest, x);
    return x;
  });
  EXPECT_GE(lowest, 0.0f);
  EXPECT_LT(highest, 1.0f);
  // Standard error of the mean: sqrt(1/12 / n) ~ 0.0009; allow about 5 of them.
  EXPECT_NEAR(m.mean, 0.5, 0.005);
  EXPECT_NEAR(m.variance, 1.0 / 12.0, 0.002);
  EXPECT_LT(lowest, 0.001f);
  EXPECT_GT(highest, 0.999f);
}

TEST(Rng, UniformRangeStaysInRange) {
  Rng rng(6);
  for (int i = 0; i < 10000; ++i) {
    const float x = rng.uniform(-3.0f, 5.0f);
    ASSERT_GE(x, -3.0f);
    ASSERT_LT(x, 5.0f);
  }
}

TEST(Rng, NormalHasZeroMeanUnitVariance) {
  Rng rng(9);
  const int n = 100000;
  int within_one_sigma = 0;
  const Moments m = moments_of(n, [&] {
    const float x = rng.normal();
    EXPECT_TRUE(std::isfinite(x));
    within_one_sigma += std::fabs(x) < 1.0f;
    return x;
  });
  // Standard errors: mean ~0.003, variance ~sqrt(2 / n) ~ 0.0045.
  EXPECT_NEAR(m.mean, 0.0, 0.016);
  EXPECT_NEAR(m.variance, 1.0, 0.025);
  EXPECT_NEAR(within_one_sigma / double(n), 0.6827, 0.008);
}

TEST(Rng, BelowIsInRangeAndRoughlyUniform) {
  Rng rng(13);
  const uint32_t buckets = 7;
  const int n = 70000;
  std::vector<int> counts(buckets, 0);
  for (int i = 0; i < n; ++i) {
    const uint32_t k = rng.below(buckets);
    ASSERT_LT(k, buckets);
    ++counts[k];
  }
  // Each count is binomial(n, 1/7): mean 10000, standard deviation ~93.
  for (int count : counts) EXPECT_NEAR(count, n / double(buckets), 500);

  EXPECT_EQ(rng.below(1), 0u);
  const uint32_t large = 3'000'000'000u; // not a power of two: exercises the rejection step
  bool upper_half_seen = false;
  for (int i = 0; i < 1000; ++i) {
    const uint32_t k = rng.below(large);
    ASSERT_LT(k, large);
    upper_half_seen |= k >= large / 2;
  }
  EXPECT_TRUE(upper_half_seen);
}

// Each of the 6 orders of 3 elements comes up equally often (chi-square with 5 degrees of freedom
// below 20.5, which chance exceeds with probability 0.001), those that leave an element in place
// included; and a long order is a permutation.
TEST(Rng, PermutationIsUniform) {
  Rng rng(17);
  std::map<std::vector<int64_t>, int> counts;
  const int draws = 60000;
  std::vector<int64_t> order(3);
  for (int i = 0; i < draws; ++i) {
    rng.permutation(order);
    ++counts[order];
  }
  ASSERT_EQ(counts.size(), 6u);
  const double expected = draws / 6.0;
  double chi_square = 0;
  for (const auto& [permutation, count] : counts)
    chi_square += (count - expected) * (count - expected) / expected;
  EXPECT_LT(chi_square, 20.5);

  std::vector<int64_t> long_order(1000), sorted(1000);
  rng.permutation(long_order);
  std::iota(sorted.begin(), sorted.end(), 0);
  EXPECT_NE(long_order, sorted);
  std::sort(long_order.begin(), long_order.end());
  EXPECT_EQ(long_order, sorted);
}

TEST(Rng, SetStateResumesTheExactSequence) {
  Rng rng(77);
  draw_u32(rng, 123);
  const Rng::State saved = rng.state();
  const std::vector<uint32_t> expected = draw_u32(rng, 500);
  const float expected_normal = rng.normal();

  rng.set_state(saved);
  EXPECT_EQ(draw_u32(rng, 500), expected);
  EXPECT_EQ(rng.normal(), expected_normal);

  Rng other(1, 99); // a different seed and stream: set_state must replace both
  other.set_state(saved);
  EXPECT_EQ(draw_u32(other, 500), expected);
}

} // namespace
} // namespace minamp
