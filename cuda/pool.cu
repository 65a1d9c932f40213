// CUDA pooling over NHWC activations: global average pooling (x [N, H, W, C] -> y [N, C]) and
// max pooling over windows (x [N, H, W, C] -> y [N, Ho, Wo, C], with the argmax its gradient
// needs). One thread per output element (max pooling: per 4 channels of one pixel, packed, where
// they allow), consecutive threads on consecutive channels, so every load of a pixel's channels
// is coalesced. The max pooling's gradient is a gather (a thread sums, for its input elements,
// the dy of the few windows whose argmax they are): no atomics, and the same sum in the same
// order as the CPU reference.
#include <algorithm>
#include <cmath>
#include <type_traits>

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

// Both max pooling kernels take kPack consecutive channels of one pixel per thread (4 when the
// channels and pointers allow packed loads and stores, else 1), so the index arithmetic — a few
// divisions — is done once per kPack values instead of once per value.

// kPack argmax entries at p + i.
template <int kPack>
__device__ __forceinline__ void load_taken(const int32_t* p, int64_t i, int32_t (&v)[kPack]) {
  if constexpr (kPack == 4) {
    const int4 q = *reinterpret_cast<const int4*>(p + i);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    v[0] = p[i];
  }
}
template <int kPack>
__device__ __forceinline__ void store_taken(int32_t* p, int64_t i, const int32_t (&v)[kPack]) {
  if constexpr (kPack == 4)
    *reinterpret_cast<int4*>(p + i) = make_int4(v[0], v[1], v[2], v[3]);
  else
    p[i] = v[0];
}

// y[s, oh, ow, c] = the largest x in the window, argmax (when not null) its pixel ih * W + iw:
// the first largest in row-major window order, or the last NaN, as the CPU reference.
template <int kPack, class T, class Index>
__global__ void __launch_bounds__(kThreads)
    maxpool2d_forward_kernel(const T* x, T* y, int32_t* argmax, MaxPoolIndexDims<Index> d) {
  const Index packs = d.c / kPack, total = d.n * d.ho * d.wo * packs;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total;
       i += Index(gridDim.x) * blockDim.x) {
    const Index c = i % packs * kPack, out_pixel = i / packs; // (sample, oh, ow)
    const Index ow = out_pixel % d.wo, oh = out_pixel / d.wo % d.ho;
    const Index sample = out_pixel / (d.wo * d.ho);
    const Index h0 = std::max<Index>(oh * d.stride - d.pad, 0);
    const Index h1 = std::min<Index>(oh * d.stride - d.pad + d.kernel, d.h);
    const Index w0 = std::max<Index>(ow * d.stride - d.pad, 0);
    const Index w1 = std::min<Index>(ow * d.stride - d.pad + d.kernel, d.w);
    const T* image = x + sample * d.h * d.w * d.c + c;
    float best[kPack];
    int32_t best_pixel[kPack];
#pragma unroll
    for (int e = 0; e < kPack; ++e) best[e] = -INFINITY, best_pixel[e] = int32_t(h0 * d.w + w0);
    for (Index ih = h0; ih < h1; ++ih)
      for (Index iw = w0; iw < w1; ++iw) {
        float v[kPack];
        load_pack<kPack>(image, (ih * d.w + iw) * d.c, v);
#pragma unroll
        for (int e = 0; e < kPack; ++e)
          if (v[e] > best[e] || isnan(v[e])) {
            best[e] = v[e];
            best_pixel[e] = int32_t(ih * d.w + iw);
          }
      }
    const Index o = out_pixel * d.c + c;
    store_pack<kPack>(y, o, best);
    if (argmax) store_taken<kPack>(argmax, o, best_pixel);
  }
}

// dx[s, ih, iw, c] = the sum of dy over the outputs whose window holds (ih, iw) and whose argmax
// it is, in output order.
template <int kPack, class TDy, class TDx, class Index>
__global__ void __launch_bounds__(kThreads)
    maxpool2d_backward_kernel(const TDy* dy, const int32_t* argmax, TDx* dx,
                              MaxPoolIndexDims<Index> d) {
  const Index packs = d.c / kPack, total = d.n * d.h * d.w * packs;
  for (Index i = blockIdx.x * Index(blockDim.x) + threadIdx.x; i < total;
       i += Index(gridDim.x) * blockDim.x) {
    const Index c = i % packs * kPack, in_pixel = i / packs; // (sample, ih, iw)
    const Index pixel = in_pixel % (d.h * d.w), sample = in_pixel / (d.h * d.w);
    const Index ih = pixel / d.w, iw = pixel % d.w;
    const Index oh0 = std::max<Index>(0, (ih + d.pad - d.kernel + d.stride) / d.stride);
    const Index oh1 = std::min<Index>(d.ho, (ih + d.pad) / d.stride + 1);
    const Index ow0 = std::max<Index>(0, (iw + d.pad - d.kernel + d.stride) / d.stride);
    const Index ow1 = std::min<Index>(d.wo, (iw + d.pad) / d.stride + 1);
    float sum[kPack] = {};
    for (Index oh = oh0; oh < oh1; ++oh)
#pragma unroll 1 // (1 or 2 windows along W; unrolled, sm_80's ptxas spilled registers here)
      for (Index ow = ow0; ow < ow1; ++ow) {
        const Index o = ((sample * d.ho + oh) * d.wo + ow) * d.c + c;
        int32_t taken[kPack];
        load_taken<kPack>(argmax, o, taken);
        float grad[kPack];
        load_pack<kPack>(dy, o, grad);
#pragma unroll
        for (int e = 0; e < kPack; ++e)
          if (taken[e] == pixel) sum[e] += grad[e];
      }
    store_pack<kPack>(dx, in_pixel * d.c + c, sum);
  }
}

// Calls launch(std::integral_constant<int, kPack>) with the channels' pack_width: 4 when every
// tensor allows packs of 4 channels, else 1.
template <class Launch>
void with_channel_pack(int64_t channels, bool aligned, const Launch& launch) {
  if (pack_width(channels, aligned) == 4)
    launch(std::integral_constant<int, 4>{});
  else
    launch(std::integral_constant<int, 1>{});
}

} // namespace

void maxpool2d_forward(const Tensor& x, Tensor& y, Tensor& argmax, const MaxPoolParams& pool) {
  const MaxPoolDims d = require_maxpool2d_forward(x, y, argmax, pool);
  if (y.numel() == 0) return;
  int32_t* taken = argmax.defined() ? ptr<int32_t>(argmax) : nullptr;
  visit_floating(x, "maxpool2d_forward", [&](auto type) {
    using T = typename decltype(type)::type;
    const bool aligned = aligned_for_pack(ptr<const T>(x)) && aligned_for_pack(ptr<T>(y)) &&
                         (!taken || aligned_for_pack(taken));
    with_channel_pack(d.c, aligned, [&](auto pack) {
      constexpr int kPack = decltype(pack)::value;
      const int grid = grid_for(y.numel() / kPack, kThreads);
      if (fits_int32_indexing(d))
        maxpool2d_forward_kernel<kPack><<<grid, kThreads, 0, stream()>>>(
            ptr<const T>(x), ptr<T>(y), taken, MaxPoolIndexDims<int32_t>(d));
      else
        maxpool2d_forward_kernel<kPack><<<grid, kThreads, 0, stream()>>>(
            ptr<const T>(x), ptr<T>(y), taken, MaxPoolIndexDims<int64_t>(d));
    });
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
      const bool aligned = aligned_for_pack(ptr<const TDy>(dy)) &&
                           aligned_for_pack(ptr<const int32_t>(argmax)) &&
                           aligned_for_pack(ptr<TDx>(dx));
      with_channel_pack(d.c, aligned, [&](auto pack) {
        constexpr int kPack = decltype(pack)::value;
        const int grid = grid_for(dx.numel() / kPack, kThreads);
        if (fits_int32_indexing(d))
          maxpool2d_backward_kernel<kPack>
              <<<grid, kThreads, 0, stream()>>>(ptr<const TDy>(dy), ptr<const int32_t>(argmax),
                                                ptr<TDx>(dx), MaxPoolIndexDims<int32_t>(d));
        else
          maxpool2d_backward_kernel<kPack>
              <<<grid, kThreads, 0, stream()>>>(ptr<const TDy>(dy), ptr<const int32_t>(argmax),
                                                ptr<TDx>(dx), MaxPoolIndexDims<int64_t>(d));
      });
      CUDA_CHECK_LAUNCH("maxpool2d_backward");
    });
  });
}

} // namespace minamp::gpu
