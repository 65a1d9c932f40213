// CPU reference of global average pooling over H, W of a channels-last activation:
// x [N, H, W, C] -> y [N, C], and its gradient, which spreads dy evenly over the pixels.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

void avgpool_forward(const Tensor& x, Tensor& y) {
  const PoolDims d = require_avgpool_forward(x, y);
  const FloatInput in(x);
  FloatOutput out(y, false);
  std::vector<double> sums(static_cast<size_t>(d.channels));
  for (int64_t s = 0; s < d.n; ++s) {
    std::fill(sums.begin(), sums.end(), 0.0);
    for (int64_t p = 0; p < d.pixels; ++p)
      for (int64_t c = 0; c < d.channels; ++c) sums[c] += in[(s * d.pixels + p) * d.channels + c];
    for (int64_t c = 0; c < d.channels; ++c)
      out[s * d.channels + c] = static_cast<float>(sums[c] / static_cast<double>(d.pixels));
  }
  out.store();
}

void avgpool_backward(const Tensor& dy, Tensor& dx) {
  const PoolDims d = require_avgpool_backward(dy, dx);
  const FloatInput grad_out(dy);
  FloatOutput grad_in(dx, false);
  const float share = 1.0f / static_cast<float>(d.pixels);
  for (int64_t s = 0; s < d.n; ++s)
    for (int64_t p = 0; p < d.pixels; ++p)
      for (int64_t c = 0; c < d.channels; ++c)
        grad_in[(s * d.pixels + p) * d.channels + c] = grad_out[s * d.channels + c] * share;
  grad_in.store();
}

} // namespace minamp::cpu
