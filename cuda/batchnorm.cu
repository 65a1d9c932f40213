// CUDA batch normalisation (+ optional fused ReLU) over x[rows, C], an NHWC activation viewed as
// [N*H*W, C], with PyTorch's semantics (biased batch variance to normalise, unbiased variance in
// the running estimate, eps inside the square root). x, y, dy, dx are f32, f16 or bf16; statistics,
// gamma, beta and their gradients are f32 [C].
//
// rows reach 262144 while C is at most a few hundred, so the per-channel sums are two-stage column
// reductions that spread the rows over the whole device (column_moments.cuh), not one thread per
// channel. The variance is two-pass: the mean first, then the mean of squared deviations from
// it, which avoids the cancellation of E[x^2] - E[x]^2 at the price of reading x once more. When
// the GEMM that wrote x already produced these moments in its epilogue (bn.batch_moments), that
// pass is skipped; likewise the backward's gradient sums, when the GEMM that wrote dy produced
// them (bn.grad_sums). The backward also sums dx per channel when asked (bn.dx_sums, the bias
// gradient of the layer before), as it writes dx where each thread can keep its channels.
//
// The elementwise passes (normalise, dx) take four channels of a row at a time (8- or 16-byte
// accesses) when C is a multiple of 4 and the tensors are aligned for it: on an H100 the
// one-element versions moved 1.5-1.7 TB/s of the ~3 TB/s HBM gives.
#include <initializer_list>
#include <type_traits>

#include "column_moments.cuh"
#include "common.cuh"
#include "device.cuh"
#include "kernels/kernels.h"

namespace minamp::gpu {

namespace {

constexpr int kThreads = 256;

// [rows, C] with C as the int the kernels index channels with.
struct ChannelDims {
  int64_t rows;
  int channels;
};
ChannelDims channel_dims(const BatchNormDims& d) { return {d.rows, int(d.channels)}; }

// The per-channel parameters and statistics every kernel below reads, all f32 [C].
struct ChannelParams {
  const float* gamma;
  const float* beta;
  const float* mean;
  const float* invstd;
};

// The flat index i and channel i % C of a grid-stride loop over [rows, C]: the channel moves by
// stride % C per step with one wrap, so the loop divides once per thread, not once per element.
struct ChannelCursor {
  int64_t i, stride;
  int c, c_step, channels;
  __device__ explicit ChannelCursor(int channels_)
      : i(blockIdx.x * int64_t(blockDim.x) + threadIdx.x), stride(int64_t(gridDim.x) * blockDim.x),
        c(int(i % channels_)), c_step(int(stride % channels_)), channels(channels_) {}
  __device__ void next() {
    i += stride;
    c += c_step;
    if (c >= channels) c -= channels;
  }
};

// ---- Forward statistics.

// Training: mean and invstd = 1 / sqrt(var + eps) from the batch's moments [2, C] (mean, biased
// variance); the running statistics move toward the batch mean and the unbiased variance
// var * n / (n - 1).
__global__ void training_statistics_kernel(const float* moments, int channels, float rows,
                                           float momentum, float eps, float* mean, float* invstd,
                                           float* running_mean, float* running_var) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < channels; c += gridDim.x * blockDim.x) {
    const float batch_mean = moments[c], var = moments[channels + c];
    mean[c] = batch_mean;
    invstd[c] = 1.0f / sqrtf(var + eps);
    running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * batch_mean;
    running_var[c] = (1.0f - momentum) * running_var[c] + momentum * (var * rows / (rows - 1.0f));
  }
}

// Eval mode: mean/invstd from the running statistics, which stay as they are.
__global__ void eval_statistics_kernel(const float* running_mean, const float* running_var,
                                       int channels, float eps, float* mean, float* invstd) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < channels; c += gridDim.x * blockDim.x) {
    mean[c] = running_mean[c];
    invstd[c] = 1.0f / sqrtf(running_var[c] + eps);
  }
}

// Where a grid-stride loop over [rows, C] in packs of kPack consecutive channels of one row
// stands: the flat index of the pack's first element and its first channel.
template <int kPack> struct PackCursor {
  ChannelCursor packs; // over [rows, C / kPack]
  __device__ explicit PackCursor(int channels) : packs(channels / kPack) {}
  __device__ int64_t first() const { return packs.i * kPack; }
  __device__ int channel() const { return packs.c * kPack; }
  __device__ bool before(int64_t size) const { return packs.i < size / kPack; }
  __device__ void next() { packs.next(); }
};

// The parameters and statistics of kPack consecutive channels from c on, read as one 16-byte
// load each for a pack (four scalar loads per element would outnumber the activation's).
template <int kPack> struct ChannelValues {
  float gamma[kPack], beta[kPack], mean[kPack], invstd[kPack];
  __device__ ChannelValues(const ChannelParams& p, int c) {
    load_pack(p.gamma, c, gamma);
    load_pack(p.beta, c, beta);
    load_pack(p.mean, c, mean);
    load_pack(p.invstd, c, invstd);
  }
};

// Elements a thread takes at a time: 4 when C allows packs and every tensor (activations and
// per-channel vectors alike) is aligned for them.
template <class... T> int pack_for(int channels, const ChannelParams& p, const T*... data) {
  const bool aligned = (aligned_for_pack(data) && ...) && aligned_for_pack(p.gamma) &&
                       aligned_for_pack(p.beta) && aligned_for_pack(p.mean) &&
                       aligned_for_pack(p.invstd);
  return channels % 4 == 0 && aligned ? 4 : 1;
}

// y = gamma * (x - mean) * invstd + beta, then ReLU when asked. Flat over rows * C, kPack
// elements at a time. Unrolled (x and y not aliased), so each thread has several loads in flight.
template <int kPack, class T>
__global__ void __launch_bounds__(kThreads)
    normalize_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t size, int channels,
                     ChannelParams p, bool relu) {
#pragma unroll(kPack == 1 ? 4 : 2)
  for (PackCursor<kPack> at(channels); at.before(size); at.next()) {
    float v[kPack];
    load_pack(x, at.first(), v);
    const ChannelValues<kPack> ch(p, at.channel());
    for (int j = 0; j < kPack; ++j) // the backward recomputes exactly this (ReLU mask)
      v[j] = batchnorm_normalized(v[j], ch.gamma[j], ch.beta[j], ch.mean[j], ch.invstd[j], relu);
    store_pack(y, at.first(), v);
  }
}

// ---- Backward.

// xhat and dy_hat of one element of the pack's channel j, given its x and dy: dy_hat is dy with
// the ReLU mask (zero where y <= 0; a NaN passes, as in PyTorch) recomputed from x.
template <int kPack>
__device__ __forceinline__ void normalised_and_grad(float x, float dy,
                                                    const ChannelValues<kPack>& ch, int j,
                                                    bool relu, float& xhat, float& dy_hat) {
  batchnorm_grad_terms(x, dy, ch.gamma[j], ch.beta[j], ch.mean[j], ch.invstd[j], relu, xhat,
                       dy_hat);
}

// dbeta += sums[0], dgamma += sums[1] (sums [2, C]: sum dy_hat, sum dy_hat xhat), for sums given
// by the GEMM that wrote dy (the reduction below adds its own as it finishes).
__global__ void accumulate_affine_grads_kernel(const float* sums, int channels, float* dgamma,
                                               float* dbeta) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < channels; c += gridDim.x * blockDim.x) {
    dbeta[c] += sums[c];
    dgamma[c] += sums[channels + c];
  }
}

// The block's share of the sums of dx per channel: thread t holds the sums of its kPack
// channels (the same ones in every step of its loop, see batchnorm_dx_kernel); the threads of each
// pack column are added in thread order into partials[blockIdx.x, C].
template <int kPack>
__device__ __forceinline__ void store_dx_partials(const float (&sum)[kPack], int channels,
                                                  float* partials) {
  __shared__ float staged[kPack][kThreads];
  for (int j = 0; j < kPack; ++j) staged[j][threadIdx.x] = sum[j];
  __syncthreads();
  const int packs = channels / kPack; // divides kThreads
  if (int(threadIdx.x) >= packs) return;
  for (int j = 0; j < kPack; ++j) {
    float total = 0.0f;
    for (int t = threadIdx.x; t < kThreads; t += packs) total += staged[j][t];
    partials[int64_t(blockIdx.x) * channels + threadIdx.x * kPack + j] = total;
  }
}

// Training: dx = gamma invstd / n (n dy_hat - sum(dy_hat) - xhat sum(dy_hat xhat));
// eval: the statistics are constants and dx = gamma invstd dy_hat. kPack elements at a time,
// unrolled by 2 for single elements (two loads each already; by 4, ptxas spills). With kDxSums (x,
// dy and dx of one dtype: mixed ones spill on sm_80, and autograd gives one), also sums dx as
// stored per channel into partials [gridDim.x, C]: the launch makes the grid stride a multiple of
// the packs in a row (C / kPack divides kThreads), so each thread stays on the same channels. dx
// may be dy (in place): each thread reads a pack of dy before it writes the same pack of dx, and no
// thread reads another's, so the two pointers may alias (not __restrict__).
template <int kPack, bool kDxSums, class TX, class TDy, class TDx>
__global__ void __launch_bounds__(kThreads)
    batchnorm_dx_kernel(const TX* __restrict__ x, const TDy* dy, TDx* dx,
                        const float* __restrict__ sums, int64_t rows, int channels, ChannelParams p,
                        bool relu, bool training, float* __restrict__ dx_partials) {
  const int64_t size = rows * channels;
  const float n = float(rows);
  float dx_sum[kPack] = {};
  PackCursor<kPack> at(channels);
#pragma unroll(kPack == 1 ? 2 : 1)
  for (; at.before(size); at.next()) {
    float xs[kPack], dys[kPack], grads[kPack], sum_dy[kPack], sum_dy_xhat[kPack];
    load_pack(x, at.first(), xs);
    load_pack(dy, at.first(), dys);
    const ChannelValues<kPack> ch(p, at.channel());
    load_pack(sums, at.channel(), sum_dy);
    load_pack(sums + channels, at.channel(), sum_dy_xhat);
    for (int j = 0; j < kPack; ++j) {
      float xhat, dy_hat;
      normalised_and_grad(xs[j], dys[j], ch, j, relu, xhat, dy_hat);
      const float scale = ch.gamma[j] * ch.invstd[j];
      grads[j] =
          training ? scale / n * (n * dy_hat - sum_dy[j] - xhat * sum_dy_xhat[j]) : scale * dy_hat;
    }
    store_pack(dx, at.first(), grads);
    if constexpr (kDxSums)
      for (int j = 0; j < kPack; ++j) dx_sum[j] += as_stored<TDx>(grads[j]);
  }
  if constexpr (kDxSums) store_dx_partials<kPack>(dx_sum, channels, dx_partials);
}

// Whether the dx kernel can sum dx per channel as it goes: each thread keeps one pack column.
bool dx_sums_in_kernel(int channels, int pack) { return kThreads % (channels / pack) == 0; }

// y = x normalised per p (and ReLU'd when relu), x and y [size / channels, channels].
template <class T>
void normalize(const T* x, T* y, int64_t size, int channels, const ChannelParams& p, bool relu,
               const char* op) {
  const auto launch = [&](auto kernel, int pack) {
    kernel<<<grid_for(size / pack, kThreads), kThreads, 0, stream()>>>(x, y, size, channels, p,
                                                                       relu);
    CUDA_CHECK_LAUNCH(op);
  };
  if (pack_for(channels, p, x, y) == 4)
    launch(normalize_kernel<4, T>, 4);
  else
    launch(normalize_kernel<1, T>, 1);
}

} // namespace

void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                       Tensor& mean, Tensor& invstd, Tensor& running_mean, Tensor& running_var,
                       const BatchNormParams& bn) {
  const char* op = "batchnorm_forward";
  const ChannelDims d = channel_dims(
      require_batchnorm_forward(x, gamma, beta, y, mean, invstd, running_mean, running_var, bn));
  if (d.channels == 0) return;

  visit_floating(x, op, [&](auto type) {
    using T = typename decltype(type)::type;
    if (bn.training) {
      // The statistics pass (two reads of x), unless the GEMM that wrote x produced the moments.
      Tensor computed;
      if (!bn.batch_moments) {
        computed = Tensor::empty({2, d.channels}, DType::f32, Device::cuda);
        column_moments(x.raw(), x.dtype(), d.rows, d.channels, ptr<float>(computed), op);
      }
      const Tensor& moments = bn.batch_moments ? *bn.batch_moments : computed;
      training_statistics_kernel<<<grid_for(d.channels, kThreads), kThreads, 0, stream()>>>(
          ptr<const float>(moments), d.channels, float(d.rows), bn.momentum, bn.eps,
          ptr<float>(mean), ptr<float>(invstd), ptr<float>(running_mean), ptr<float>(running_var));
      CUDA_CHECK_LAUNCH(op);
    } else {
      eval_statistics_kernel<<<grid_for(d.channels, kThreads), kThreads, 0, stream()>>>(
          ptr<const float>(running_mean), ptr<const float>(running_var), d.channels, bn.eps,
          ptr<float>(mean), ptr<float>(invstd));
      CUDA_CHECK_LAUNCH(op);
    }
    const ChannelParams p{ptr<const float>(gamma), ptr<const float>(beta), ptr<const float>(mean),
                          ptr<const float>(invstd)};
    if (!y.defined() || x.numel() == 0) return; // undefined y: the statistics only
    normalize(ptr<const T>(x), ptr<T>(y), x.numel(), d.channels, p, bn.relu, op);
  });
}

void batchnorm_normalize(const void* x, void* y, DType dtype, int64_t rows, int channels,
                         const BatchNormChannels& bn, const char* op) {
  if (rows == 0 || channels == 0) return;
  visit_floating(dtype, op, [&](auto type) {
    using T = typename decltype(type)::type;
    normalize(static_cast<const T*>(x), static_cast<T*>(y), rows * channels, channels,
              {bn.gamma, bn.beta, bn.mean, bn.invstd}, bn.relu, op);
  });
}

void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                        const Tensor& mean, const Tensor& invstd, const Tensor& dy, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta, const BatchNormParams& bn) {
  const char* op = "batchnorm_backward";
  const ChannelDims d = channel_dims(
      require_batchnorm_backward(x, gamma, beta, mean, invstd, dy, dx, dgamma, dbeta, bn));
  if (d.channels == 0) return;

  const ChannelParams p{ptr<const float>(gamma), ptr<const float>(beta), ptr<const float>(mean),
                        ptr<const float>(invstd)};
  // [sum dy_hat; sum dy_hat xhat]: one reduction over x and dy, unless the GEMM that wrote dy
  // produced them.
  Tensor computed;
  if (bn.grad_sums) {
    accumulate_affine_grads_kernel<<<grid_for(d.channels, kThreads), kThreads, 0, stream()>>>(
        ptr<const float>(*bn.grad_sums), d.channels, ptr<float>(dgamma), ptr<float>(dbeta));
    CUDA_CHECK_LAUNCH(op);
  } else {
    computed = Tensor::empty({2, d.channels}, DType::f32, Device::cuda);
    batchnorm_grad_sums(x.raw(), x.dtype(), dy.raw(), dy.dtype(), d.rows, d.channels,
                        {p.gamma, p.beta, p.mean, p.invstd, bn.relu}, ptr<float>(computed), op,
                        ptr<float>(dbeta), ptr<float>(dgamma));
  }
  const Tensor& sums = bn.grad_sums ? *bn.grad_sums : computed;
  if (x.numel() == 0) {
    if (bn.dx_sums) fill(*bn.dx_sums, 0.0f);
    return;
  }
  visit_floating(x, op, [&](auto x_type) {
    visit_floating(dy, op, [&](auto dy_type) {
      using TX = typename decltype(x_type)::type;
      using TDy = typename decltype(dy_type)::type;
      visit_floating(dx, op, [&](auto dx_type) {
        using TDx = typename decltype(dx_type)::type;
        const int pack = pack_for(d.channels, p, ptr<const TX>(x), ptr<const TDy>(dy),
                                  ptr<const TDx>(dx), ptr<const float>(sums));
        const int blocks = grid_for(x.numel() / pack, kThreads);
        // dx_sums: from per-block partials the kernel writes (for x, dy and dx of one dtype, as
        // autograd gives them), or by a reduction over dx after it.
        constexpr bool kOneDtype = std::is_same_v<TX, TDy> && std::is_same_v<TDy, TDx>;
        const bool partial_sums = kOneDtype && bn.dx_sums && dx_sums_in_kernel(d.channels, pack);
        Tensor partials;
        if (partial_sums) partials = Tensor::empty({blocks, d.channels}, DType::f32, Device::cuda);
        const auto launch = [&](auto pack_constant) {
          constexpr int kPack = decltype(pack_constant)::value;
          auto kernel = batchnorm_dx_kernel<kPack, false, TX, TDy, TDx>;
          if constexpr (kOneDtype)
            if (partial_sums) kernel = batchnorm_dx_kernel<kPack, true, TX, TDy, TDx>;
          kernel<<<blocks, kThreads, 0, stream()>>>(
              ptr<const TX>(x), ptr<const TDy>(dy), ptr<TDx>(dx), ptr<const float>(sums), d.rows,
              d.channels, p, bn.relu, bn.training, partial_sums ? ptr<float>(partials) : nullptr);
          CUDA_CHECK_LAUNCH(op);
        };
        if (pack == 4)
          launch(std::integral_constant<int, 4>{});
        else
          launch(std::integral_constant<int, 1>{});
        if (partial_sums)
          column_sums(partials.raw(), DType::f32, blocks, d.channels, ptr<float>(*bn.dx_sums), op);
        else if (bn.dx_sums)
          column_sums(dx.raw(), dx.dtype(), d.rows, d.channels, ptr<float>(*bn.dx_sums), op);
      });
    });
  });
}

} // namespace minamp::gpu
