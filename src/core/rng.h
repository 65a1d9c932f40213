// Rng: a small, seeded, portable generator (PCG32, O'Neill 2014). Unlike std:: distributions
// its draws are the same on every platform, so CPU runs are bit-for-bit reproducible.
#pragma once

#include <cstdint>
#include <vector>

namespace minamp {

class Rng {
public:
  explicit Rng(uint64_t seed = 0, uint64_t stream = 0x5851f42d4c957f2dULL);

  uint32_t next_u32();
  // Uniform in [0, 1) with 24 random bits.
  float uniform();
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller).
  float normal();
  // Uniform integer in [0, n).
  uint32_t below(uint32_t n);
  // Fills `order` with a uniformly random permutation of 0 .. order.size() - 1 (Fisher-Yates).
  void permutation(std::vector<int64_t>& order);

  // The whole state, for checkpoints.
  struct State {
    uint64_t state = 0, increment = 0;
  };
  State state() const { return {state_, increment_}; }
  void set_state(State s) {
    state_ = s.state;
    increment_ = s.increment;
  }

private:
  uint64_t state_ = 0;
  uint64_t increment_ = 0;
};

} // namespace minamp
