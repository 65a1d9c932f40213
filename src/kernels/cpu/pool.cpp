// CPU reference of pooling over channels-last activations: global average pooling over H, W
// (x [N, H, W, C] -> y [N, C]; its gradient spreads dy evenly over the pixels) and max pooling
// over windows (x [N, H, W, C] -> y [N, Ho, Wo, C]; its gradient goes to each window's argmax).
#include <algorithm>
#include <cmath>
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

namespace {
// The maximum of x over one window, per channel: best[c] (and, with Argmax, the window pixel it
// came from, taken[c]) over the pixels (ih, iw) of [h0, h1) x [w0, w1) of one image [H, W, C],
// visited in row order; a NaN wins, as in PyTorch. Channels are the inner, vectorised loop.
template <bool Argmax>
void window_max(const float* image, const MaxPoolDims& d, int64_t h0, int64_t h1, int64_t w0,
                int64_t w1, float* best, int32_t* taken) {
  for (int64_t c = 0; c < d.c; ++c) best[c] = -INFINITY;
  if (Argmax) std::fill_n(taken, d.c, static_cast<int32_t>(h0 * d.w + w0));
  for (int64_t ih = h0; ih < h1; ++ih)
    for (int64_t iw = w0; iw < w1; ++iw) {
      const float* v = image + (ih * d.w + iw) * d.c;
      const auto pixel = static_cast<int32_t>(ih * d.w + iw);
#pragma omp simd
      for (int64_t c = 0; c < d.c; ++c) {
        const bool take = v[c] > best[c] || v[c] != v[c];
        best[c] = take ? v[c] : best[c];
        if (Argmax) taken[c] = take ? pixel : taken[c];
      }
    }
}
} // namespace

void maxpool2d_forward(const Tensor& x, Tensor& y, Tensor& argmax, const MaxPoolParams& pool) {
  const MaxPoolDims d = require_maxpool2d_forward(x, y, argmax, pool);
  const FloatInput in(x);
  FloatOutput out(y, false);
  int32_t* taken = argmax.defined() ? argmax.data<int32_t>() : nullptr;
#pragma omp parallel for collapse(2) schedule(static) if (d.n * d.ho > 1)
  for (int64_t s = 0; s < d.n; ++s)
    for (int64_t oh = 0; oh < d.ho; ++oh) {
      const float* image = in.data() + s * d.h * d.w * d.c;
      const int64_t h0 = std::max<int64_t>(oh * d.stride - d.pad, 0);
      const int64_t h1 = std::min<int64_t>(oh * d.stride - d.pad + d.kernel, d.h);
      for (int64_t ow = 0; ow < d.wo; ++ow) {
        const int64_t w0 = std::max<int64_t>(ow * d.stride - d.pad, 0);
        const int64_t w1 = std::min<int64_t>(ow * d.stride - d.pad + d.kernel, d.w);
        const int64_t at = ((s * d.ho + oh) * d.wo + ow) * d.c;
        if (taken)
          window_max<true>(image, d, h0, h1, w0, w1, out.data() + at, taken + at);
        else
          window_max<false>(image, d, h0, h1, w0, w1, out.data() + at, nullptr);
      }
    }
  out.store();
}

void maxpool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx,
                        const MaxPoolParams& pool) {
  const MaxPoolDims d = require_maxpool2d_backward(dy, argmax, dx, pool);
  const FloatInput grad_out(dy);
  const int32_t* taken = argmax.data<int32_t>();
  FloatOutput grad_in(dx, false);
#pragma omp parallel for collapse(2) schedule(static) if (d.n * d.h > 1)
  for (int64_t s = 0; s < d.n; ++s)
    for (int64_t ih = 0; ih < d.h; ++ih) {
      // The outputs whose window holds row ih: oh * stride - pad <= ih < that + kernel.
      const int64_t oh0 = std::max<int64_t>(0, (ih + d.pad - d.kernel + d.stride) / d.stride);
      const int64_t oh1 = std::min<int64_t>(d.ho, (ih + d.pad) / d.stride + 1);
      for (int64_t iw = 0; iw < d.w; ++iw) {
        const int64_t ow0 = std::max<int64_t>(0, (iw + d.pad - d.kernel + d.stride) / d.stride);
        const int64_t ow1 = std::min<int64_t>(d.wo, (iw + d.pad) / d.stride + 1);
        const int64_t pixel = ih * d.w + iw;
        for (int64_t c = 0; c < d.c; ++c) {
          float sum = 0.0f;
          for (int64_t oh = oh0; oh < oh1; ++oh)
            for (int64_t ow = ow0; ow < ow1; ++ow) {
              const int64_t o = ((s * d.ho + oh) * d.wo + ow) * d.c + c;
              if (taken[o] == pixel) sum += grad_out[o];
            }
          grad_in[(s * d.h * d.w + pixel) * d.c + c] = sum;
        }
      }
    }
  grad_in.store();
}

} // namespace minamp::cpu
