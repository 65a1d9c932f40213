// CPU reference of global average pooling over H, W of a channels-last activation:
// x [N, H, W, C] -> y [N, C], and its gradient, which spreads dy evenly over the pixels.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

struct PoolDims {
  int64_t n, pixels, channels; // pixels = H * W
};

PoolDims pool_dims(const char* op, const Tensor& x) {
  require(x.shape().rank() == 4, op, "expects x [N, H, W, C], got ", describe(x));
  return {x.shape()[0], x.shape()[1] * x.shape()[2], x.shape()[3]};
}

// Throws Error unless `pooled` holds [N, C] values.
void require_pooled(const char* op, const char* name, const Tensor& pooled, const PoolDims& d) {
  require_floating(op, name, pooled);
  require(pooled.numel() == d.n * d.channels && pooled.shape().last() == d.channels, op, "expects ",
          name, " [", d.n, ", ", d.channels, "], got ", describe(pooled));
}

} // namespace

void avgpool_forward(const Tensor& x, Tensor& y) {
  require_floating("avgpool_forward", "x", x);
  const PoolDims d = pool_dims("avgpool_forward", x);
  require_pooled("avgpool_forward", "y", y, d);
  require(y.dtype() == x.dtype(), "avgpool_forward", "expects y of x's dtype, got x ", describe(x),
          ", y ", describe(y));
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
  require_floating("avgpool_backward", "dx", dx);
  const PoolDims d = pool_dims("avgpool_backward", dx);
  require_pooled("avgpool_backward", "dy", dy, d);
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
