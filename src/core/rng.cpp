// PCG32 (XSH-RR variant) and the draws built on it.
#include "core/rng.h"

#include <cmath>
#include <numeric>
#include <utility>

#include "core/error.h"

namespace minamp {

Rng::Rng(uint64_t seed, uint64_t stream) : increment_((stream << 1u) | 1u) {
  next_u32();
  state_ += seed;
  next_u32();
}

uint32_t Rng::next_u32() {
  const uint64_t old = state_;
  state_ = old * 6364136223846793005ULL + increment_;
  const uint32_t xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
  const uint32_t rotation = static_cast<uint32_t>(old >> 59u);
  return (xorshifted >> rotation) | (xorshifted << ((-rotation) & 31));
}

float Rng::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

float Rng::normal() {
  // 1 - uniform() is in (0, 1], so the log is finite.
  const float u1 = 1.0f - uniform();
  const float u2 = uniform();
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530717958647692f * u2);
}

uint32_t Rng::below(uint32_t n) {
  // Rejection sampling removes the modulo bias.
  const uint32_t threshold = (-n) % n;
  for (;;) {
    const uint32_t r = next_u32();
    if (r >= threshold) return r % n;
  }
}

void Rng::permutation(std::vector<int64_t>& order) {
  require(order.size() <= UINT32_MAX, "Rng::permutation", "at most 2^32 - 1 elements, got ",
          order.size());
  std::iota(order.begin(), order.end(), 0);
  // Element i - 1 swaps with any of 0 .. i - 1, itself included (excluding it, a common slip,
  // draws only the permutations that are one cycle).
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[below(uint32_t(i))]);
}

} // namespace minamp
