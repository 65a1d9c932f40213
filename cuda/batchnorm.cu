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
// one-element versions moved 1.5-1.7 TB/s of the ~3 TB/s HBM gives. Each thread stays on the same
// channels (channel_packs.cuh), so it reads their parameters once rather than per pack.
#include <initializer_list>
#include <type_traits>

#include "channel_packs.cuh"
#include "column_moments.cuh"
#include "common.cuh"
#include "device.cuh"
#include "kernels/kernels.h"

namespace minamp::gpu {

namespace {

constexpr int kThreads = kPackThreads;

// [rows, C] with C as the int the kernels index channels with.
struct ChannelDims {
  int64_t rows;
  int channels;
};
ChannelDims channel_dims(const BatchNormDims& d) { return {d.rows, int(d.channels)}; }

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

// y = gamma * (x - mean) * invstd + beta, then ReLU when asked, over [size / C, C] in packs of
// kPack channels, 2 packs of a thread loaded at a time (4 spill on sm_80); the launch is
// pinned_grid's.
template <int kPack, class T>
__global__ void __launch_bounds__(kThreads)
    normalize_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t size, int channels,
                     BatchNormChannels bn) {
  const PinnedPacks<kPack, 2> packs(size, channels);
  const ChannelValues<kPack> ch(bn, packs.channel);
  float v[2][kPack];
  packs.for_each([&](int b, int64_t i) { load_pack(x, i, v[b]); },
                 [&](int b, int64_t i) {
                   for (int j = 0; j < kPack; ++j) // the backward recomputes exactly this
                     v[b][j] = batchnorm_normalized(v[b][j], ch.gamma[j], ch.beta[j], ch.mean[j],
                                                    ch.invstd[j], bn.relu);
                   store_pack(y, i, v[b]);
                 });
}

// ---- Backward.

// dbeta += sums[0], dgamma += sums[1] (sums [2, C]: sum dy_hat, sum dy_hat xhat), for sums given
// by the GEMM that wrote dy (the reduction below adds its own as it finishes).
__global__ void accumulate_affine_grads_kernel(const float* sums, int channels, float* dgamma,
                                               float* dbeta) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < channels; c += gridDim.x * blockDim.x) {
    dbeta[c] += sums[c];
    dgamma[c] += sums[channels + c];
  }
}

// Training: dx = gamma invstd / n (n dy_hat - sum(dy_hat) - xhat sum(dy_hat xhat));
// eval: the statistics are constants and dx = gamma invstd dy_hat. Packs of kPack channels, 2 of a
// thread loaded at a time; the launch is pinned_grid's, so each thread stays on the same channels.
// With kDxSums (x, dy and dx of one dtype: mixed ones spill on sm_80, and autograd gives one), also
// sums dx as stored per channel into partials [gridDim.x, C] (C / kPack divides kThreads). dx may
// be dy (in place): each thread reads a pack of dy before it writes the same pack of dx, and no
// thread reads another's, so the two pointers may alias (not __restrict__).
template <int kPack, bool kDxSums, class TX, class TDy, class TDx>
__global__ void __launch_bounds__(kThreads)
    batchnorm_dx_kernel(const TX* __restrict__ x, const TDy* dy, TDx* dx,
                        const float* __restrict__ sums, int64_t rows, int channels,
                        BatchNormChannels bn, bool training, float* __restrict__ dx_partials) {
  const float n = float(rows);
  const PinnedPacks<kPack, 2> packs(rows * channels, channels);
  const DxChannels<kPack> ch(bn, sums, channels, packs.channel, n, training);
  float xs[2][kPack], dys[2][kPack], dx_sum[1][kPack] = {};
  packs.for_each(
      [&](int b, int64_t i) {
        load_pack(x, i, xs[b]);
        load_pack(dy, i, dys[b]);
      },
      [&](int b, int64_t i) {
        float grads[kPack];
        for (int j = 0; j < kPack; ++j)
          grads[j] = ch.dx(xs[b][j], dys[b][j], j, n, bn.relu, training);
        store_pack(dx, i, grads);
        if constexpr (kDxSums)
          for (int j = 0; j < kPack; ++j) dx_sum[0][j] += as_stored<TDx>(grads[j]);
      });
  if constexpr (kDxSums) store_pinned_partials<kPack, 1>(dx_sum, channels, dx_partials);
}

// y = x normalised per bn, x and y [size / channels, channels].
template <class T>
void normalize(const T* x, T* y, int64_t size, int channels, const BatchNormChannels& bn,
               const char* op) {
  const auto launch = [&](auto kernel, int pack) {
    kernel<<<pinned_grid(size, channels, pack), kThreads, 0, stream()>>>(x, y, size, channels, bn);
    CUDA_CHECK_LAUNCH(op);
  };
  if (pack_for(channels, bn, x, y) == 4)
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
    const BatchNormChannels channels{ptr<const float>(gamma), ptr<const float>(beta),
                                     ptr<const float>(mean), ptr<const float>(invstd), bn.relu};
    if (!y.defined() || x.numel() == 0) return; // undefined y: the statistics only
    normalize(ptr<const T>(x), ptr<T>(y), x.numel(), d.channels, channels, op);
  });
}

void batchnorm_normalize(const void* x, void* y, DType dtype, int64_t rows, int channels,
                         const BatchNormChannels& bn, const char* op) {
  if (rows == 0 || channels == 0) return;
  visit_floating(dtype, op, [&](auto type) {
    using T = typename decltype(type)::type;
    normalize(static_cast<const T*>(x), static_cast<T*>(y), rows * channels, channels, bn, op);
  });
}

void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                        const Tensor& mean, const Tensor& invstd, const Tensor& dy, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta, const BatchNormParams& bn) {
  const char* op = "batchnorm_backward";
  const ChannelDims d = channel_dims(
      require_batchnorm_backward(x, gamma, beta, mean, invstd, dy, dx, dgamma, dbeta, bn));
  if (d.channels == 0) return;

  const BatchNormChannels channels{ptr<const float>(gamma), ptr<const float>(beta),
                                   ptr<const float>(mean), ptr<const float>(invstd), bn.relu};
  // [sum dy_hat; sum dy_hat xhat]: one reduction over x and dy, unless the GEMM that wrote dy
  // produced them. An undefined dgamma (and dbeta) takes no sum.
  const bool affine = dgamma.defined();
  Tensor computed;
  if (!bn.grad_sums) {
    computed = Tensor::empty({2, d.channels}, DType::f32, Device::cuda);
    batchnorm_grad_sums(x.raw(), x.dtype(), dy.raw(), dy.dtype(), d.rows, d.channels, channels,
                        ptr<float>(computed), op, affine ? ptr<float>(dbeta) : nullptr,
                        affine ? ptr<float>(dgamma) : nullptr);
  } else if (affine) {
    accumulate_affine_grads_kernel<<<grid_for(d.channels, kThreads), kThreads, 0, stream()>>>(
        ptr<const float>(*bn.grad_sums), d.channels, ptr<float>(dgamma), ptr<float>(dbeta));
    CUDA_CHECK_LAUNCH(op);
  }
  const Tensor& sums = bn.grad_sums ? *bn.grad_sums : computed;
  if (!dx.defined()) return; // the affine gradients only
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
        const int pack = pack_for(d.channels, channels, ptr<const TX>(x), ptr<const TDy>(dy),
                                  ptr<const TDx>(dx), ptr<const float>(sums));
        const int blocks = pinned_grid(x.numel(), d.channels, pack);
        // dx_sums: from per-block partials the kernel writes (for x, dy and dx of one dtype, as
        // autograd gives them), or by a reduction over dx after it.
        constexpr bool kOneDtype = std::is_same_v<TX, TDy> && std::is_same_v<TDy, TDx>;
        const bool partial_sums =
            kOneDtype && bn.dx_sums && block_holds_whole_rows(d.channels, pack);
        Tensor partials;
        if (partial_sums) partials = Tensor::empty({blocks, d.channels}, DType::f32, Device::cuda);
        const auto launch = [&](auto pack_constant) {
          constexpr int kPack = decltype(pack_constant)::value;
          auto kernel = batchnorm_dx_kernel<kPack, false, TX, TDy, TDx>;
          if constexpr (kOneDtype)
            if (partial_sums) kernel = batchnorm_dx_kernel<kPack, true, TX, TDy, TDx>;
          kernel<<<blocks, kThreads, 0, stream()>>>(
              ptr<const TX>(x), ptr<const TDy>(dy), ptr<TDx>(dx), ptr<const float>(sums), d.rows,
              d.channels, channels, bn.training, partial_sums ? ptr<float>(partials) : nullptr);
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
