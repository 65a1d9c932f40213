// The data of the quantized 2-D sine problem (AMD ROCm AMP blog), shared by the sine example
// and the tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/allocator.h"

namespace minamp::examples {

// The grid size S when --size is not given: the blog's 512 on a GPU, 64 on the CPU, and 16 on
// the CUDA emulator (every GPU thread runs as a fiber on the CPU: a 64x64 step takes seconds).
inline int64_t default_sine_size(Device device) {
  if (device == Device::cpu) return 64;
  return cuda_emulated() ? 16 : 512;
}

// [1, S, S, 2]: channel 0 is x (along columns), channel 1 is y (along rows), as the blog's
// np.meshgrid(x, y) stacked into channels.
inline std::vector<float> coordinate_grid(int64_t size) {
  std::vector<float> grid;
  grid.reserve(static_cast<size_t>(size * size * 2));
  const double step = size > 1 ? 1.0 / double(size - 1) : 0.0;
  for (int64_t row = 0; row < size; ++row) {
    for (int64_t col = 0; col < size; ++col) {
      grid.push_back(static_cast<float>(col * step));
      grid.push_back(static_cast<float>(row * step));
    }
  }
  return grid;
}

// [1, S, S, 1]: cos(2 pi 4 x) + cos(2 pi 2 y), digitized into 4 equal-width bins between its
// minimum and maximum (np.digitize), then rescaled to {0, 1/3, 2/3, 1}.
inline std::vector<float> quantized_sine(const std::vector<float>& grid) {
  const double two_pi = 6.283185307179586;
  std::vector<double> wave(grid.size() / 2);
  for (size_t i = 0; i < wave.size(); ++i)
    wave[i] = std::cos(grid[2 * i] * 4 * two_pi) + std::cos(grid[2 * i + 1] * 2 * two_pi);
  const auto [lo, hi] = std::minmax_element(wave.begin(), wave.end());
  const double width = (*hi - *lo) / 4.0;
  std::vector<float> target(wave.size());
  for (size_t i = 0; i < wave.size(); ++i) {
    // The bin index 0..3 of wave[i]: the number of bin edges lo + k width (k = 1..3) below it.
    int bin = 0;
    for (int k = 1; k <= 3; ++k) bin += wave[i] >= *lo + k * width;
    target[i] = static_cast<float>(bin / 3.0);
  }
  return target;
}

} // namespace minamp::examples
