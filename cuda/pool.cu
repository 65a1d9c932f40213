// CUDA pooling over NHWC activations: global average pooling (x [N, H, W, C] -> y [N, C]) and
// max pooling over windows (x [N, H, W, C] -> y [N, Ho, Wo, C], with the argmax its gradient
// needs). One thread per output element, consecutive threads on consecutive channels, so every
// load of a pixel's channels is coalesced. The max pooling's gradient is a gather (one thread per
// input element sums the dy of the few windows whose argmax it is): no atomics, and the same sum
// in the same order as the CPU reference.
#include <algorithm>
#include <cmath>

#include "common.cuh"
#include "device.cuh"
#include "kernels/kernels.h"

namespace minamp::gpu {

namespace {

constexpr int kThreads = 256;

// ---- Global average pooling over H, W of x [N, H, W, C].

// y[s, c] = mean over pixels p of x[s, p, c]: one thread per output, consecutive threads take
// consecutive channels so every pixel's load is coalesced.
template <class TIn, class TOut>
__global__ void __launch_bounds__(kThreads)
    avgpool_forward_kernel(const TIn* x, TOut* y, PoolDims d) {
  const int64_t outputs = d.n * d.channels;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < outputs;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t sample = i / d.channels, channel = i % d.channels;
    const TIn* column = x + sample * d.pixels * d.channels + channel;
    float sum = 0.0f;
    for (int64_t p = 0; p < d.pixels; ++p) sum += load_f(column, p * d.channels);
    store_f(y, i, sum / float(d.pixels));
  }
}

// dx[s, p, c] = dy[s, c] / pixels.
template <class TDy, class TDx>
__global__ void __launch_bounds__(kThreads)
    avgpool_backward_kernel(const TDy* dy, TDx* dx, PoolDims d) {
  const int64_t size = d.n * d.pixels * d.channels;
  const float share = 1.0f / float(d.pixels);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < size;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t sample = i / (d.pixels * d.channels), channel = i % d.channels;
    store_f(dx, i, load_f(dy, sample * d.channels + channel) * share);
  }
}

} // namespace

void avgpool_forward(const Tensor& x, Tensor& y) {
  const PoolDims d = require_avgpool_forward(x, y);
  if (y.numel() == 0) return;
  visit_floating(x, "avgpool_forward", [&](auto type) {
    using T = typename decltype(type)::type;
    avgpool_forward_kernel<<<grid_for(y.numel(), kThreads), kThreads, 0, stream()>>>(
        ptr<const T>(x), ptr<T>(y), d);
    CUDA_CHECK_LAUNCH("avgpool_forward");
  });
}

void avgpool_backward(const Tensor& dy, Tensor& dx) {
  const PoolDims d = require_avgpool_backward(dy, dx);
  if (dx.numel() == 0) return;
  visit_floating(dx, "avgpool_backward", [&](auto out) {
    visit_floating(dy, "avgpool_backward", [&](auto in) {
      using TDx = typename decltype(out)::type;
      using TDy = typename decltype(in)::type;
      avgpool_backward_kernel<<<grid_for(dx.numel(), kThreads), kThreads, 0, stream()>>>(
          ptr<const TDy>(dy), ptr<TDx>(dx), d);
      CUDA_CHECK_LAUNCH("avgpool_backward");
    });
  });
}

// ---- Max pooling over kernel x kernel windows of x [N, H, W, C].

namespace {

// The index arithmetic of both max pooling kernels is in Index: int32_t when every index of x and
// y stays below 2^30 (so that a grid-stride step cannot overflow it), else int64_t. The kernels
// divide each linear index into coordinates; a 64-bit division tests whether its operands fit in
// 32 bits and carries a slow path besides the 32-bit one (in SASS the int64 backward kernel is
// three times the size of the int32 one, with twice the reciprocal sequences).
template <class Index> struct MaxPoolIndexDims {
  Index n, h, w, c, ho, wo, kernel, stride, pad;
  explicit MaxPoolIndexDims(const MaxPoolDims& d)
      : n(Index(d.n)), h(Index(d.h)), w(Index(d.w)), c(Index(d.c)), ho(Index(d.ho)),
        wo(Index(d.wo)), kernel(Index(d.kernel)), stride(Index(d.stride)), pad(Index(d.pad)) {}
};

bool fits_int32_indexing(const MaxPoolDims& d) {
  constexpr int64_t kLimit = int64_t(1) << 30;
  return d.n * d.h * d.w * d.c < kLimit && d.n * d.ho * d.wo * d.c < kLimit;
}

// y[s, oh, ow, c] = the largest x in the window, argmax (when not null) its pixel ih * W + iw:
// the first largest in row-major window order, or the last NaN, as the CPU reference.
template <class T, class Index>
__global__ void __launch_bounds__(kThreads)
    maxpool2d_forward_kernel(const T* x, T* y, int32_t* argmax, MaxPoolIndexDims<Index> d) {
  const Index outputs = d.n * d.ho * d.wo * d.c;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < outputs;
       i += Index(gridDim.x) * blockDim.x) {
    const Index c = i % d.c, ow = (i / d.c) % d.wo, oh = (i / (d.c * d.wo)) % d.ho;
    const Index sample = i / (d.c * d.wo * d.ho);
    const Index h0 = std::max<Index>(oh * d.stride - d.pad, 0);
    const Index h1 = std::min<Index>(oh * d.stride - d.pad + d.kernel, d.h);
    const Index w0 = std::max<Index>(ow * d.stride - d.pad, 0);
    const Index w1 = std::min<Index>(ow * d.stride - d.pad + d.kernel, d.w);
    const T* image = x + sample * d.h * d.w * d.c + c;
    float best = -INFINITY;
    Index best_pixel = h0 * d.w + w0;
    for (Index ih = h0; ih < h1; ++ih)
      for (Index iw = w0; iw < w1; ++iw) {
        const float v = load_f(image, (ih * d.w + iw) * d.c);
        if (v > best || isnan(v)) {
          best = v;
          best_pixel = ih * d.w + iw;
        }
      }
    store_f(y, i, best);
    if (argmax) argmax[i] = int32_t(best_pixel);
  }
}

// dx[s, ih, iw, c] = the sum of dy over the outputs whose window holds (ih, iw) and whose argmax
// it is, in output order.
template <class TDy, class TDx, class Index>
__global__ void __launch_bounds__(kThreads)
    maxpool2d_backward_kernel(const TDy* dy, const int32_t* argmax, TDx* dx,
                              MaxPoolIndexDims<Index> d) {
  const Index inputs = d.n * d.h * d.w * d.c;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < inputs;
       i += Index(gridDim.x) * blockDim.x) {
    const Index c = i % d.c, pixel = (i / d.c) % (d.h * d.w), sample = i / (d.c * d.h * d.w);
    const Index ih = pixel / d.w, iw = pixel % d.w;
    const Index oh0 = std::max<Index>(0, (ih + d.pad - d.kernel + d.stride) / d.stride);
    const Index oh1 = std::min<Index>(d.ho, (ih + d.pad) / d.stride + 1);
    const Index ow0 = std::max<Index>(0, (iw + d.pad - d.kernel + d.stride) / d.stride);
    const Index ow1 = std::min<Index>(d.wo, (iw + d.pad) / d.stride + 1);
    float sum = 0.0f;
    for (Index oh = oh0; oh < oh1; ++oh)
      for (Index ow = ow0; ow < ow1; ++ow) {
        const Index o = ((sample * d.ho + oh) * d.wo + ow) * d.c + c;
        if (argmax[o] == pixel) sum += load_f(dy, o);
      }
    store_f(dx, i, sum);
  }
}

} // namespace

void maxpool2d_forward(const Tensor& x, Tensor& y, Tensor& argmax, const MaxPoolParams& pool) {
  const MaxPoolDims d = require_maxpool2d_forward(x, y, argmax, pool);
  if (y.numel() == 0) return;
  int32_t* taken = argmax.defined() ? ptr<int32_t>(argmax) : nullptr;
  visit_floating(x, "maxpool2d_forward", [&](auto type) {
    using T = typename decltype(type)::type;
    const int grid = grid_for(y.numel(), kThreads);
    if (fits_int32_indexing(d))
      maxpool2d_forward_kernel<<<grid, kThreads, 0, stream()>>>(ptr<const T>(x), ptr<T>(y), taken,
                                                                MaxPoolIndexDims<int32_t>(d));
    else
      maxpool2d_forward_kernel<<<grid, kThreads, 0, stream()>>>(ptr<const T>(x), ptr<T>(y), taken,
                                                                MaxPoolIndexDims<int64_t>(d));
    CUDA_CHECK_LAUNCH("maxpool2d_forward");
  });
}

void maxpool2d_backward(const Tensor& dy, const Tensor& argmax, Tensor& dx,
                        const MaxPoolParams& pool) {
  const MaxPoolDims d = require_maxpool2d_backward(dy, argmax, dx, pool);
  if (dx.numel() == 0) return;
  visit_floating(dx, "maxpool2d_backward", [&](auto out) {
    visit_floating(dy, "maxpool2d_backward", [&](auto in) {
      using TDx = typename decltype(out)::type;
      using TDy = typename decltype(in)::type;
      const int grid = grid_for(dx.numel(), kThreads);
      if (fits_int32_indexing(d))
        maxpool2d_backward_kernel<<<grid, kThreads, 0, stream()>>>(
            ptr<const TDy>(dy), ptr<const int32_t>(argmax), ptr<TDx>(dx),
            MaxPoolIndexDims<int32_t>(d));
      else
        maxpool2d_backward_kernel<<<grid, kThreads, 0, stream()>>>(
            ptr<const TDy>(dy), ptr<const int32_t>(argmax), ptr<TDx>(dx),
            MaxPoolIndexDims<int64_t>(d));
      CUDA_CHECK_LAUNCH("maxpool2d_backward");
    });
  });
}

} // namespace minamp::gpu
