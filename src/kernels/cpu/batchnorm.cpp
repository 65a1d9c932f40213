// CPU reference of batch normalisation (+ optional fused ReLU) over x[rows, C], an NHWC activation
// viewed as [N*H*W, C], with PyTorch's semantics: biased batch variance to normalise, unbiased
// variance in the running estimate, eps inside the square root. Per-channel sums accumulate in
// double; the saved mean / invstd and the affine math are fp32. Rows are processed in fixed blocks
// on every OpenMP thread; the block sums add in block order, so results never depend on the
// number of threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

constexpr int64_t kRowBlock = 256;           // rows per block of the per-channel sums
constexpr int64_t kParallelElements = 32768; // smaller tensors stay on one thread

// The per-channel sums of x [rows, C] as `width` doubles: block_sums(begin, end, sums) adds rows
// [begin, end) into sums[width]; blocks run in parallel and their sums add in block order.
template <class BlockSums>
std::vector<double> channel_sums(int64_t rows, int64_t width, const BlockSums& block_sums) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<double> partial(static_cast<size_t>(blocks * width), 0.0); // [blocks, width]
#pragma omp parallel for schedule(static) if (rows * width >= kParallelElements)
  for (int64_t b = 0; b < blocks; ++b)
    block_sums(b * kRowBlock, std::min(rows, (b + 1) * kRowBlock), partial.data() + b * width);
  std::vector<double> total(static_cast<size_t>(width), 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t k = 0; k < width; ++k) total[k] += partial[b * width + k];
  return total;
}

// dy with the fused ReLU's mask: zero where the forward's normalised value (before the ReLU) was
// <= 0 (a NaN passes, as in PyTorch's relu backward). Everything is computed unconditionally,
// so that the loops vectorise.
template <class T> inline T relu_masked(bool relu, T dy, float normalised) {
  return relu && normalised <= 0.0f ? T(0) : dy;
}

// Per-channel batch mean and biased variance of x [rows, C] (two passes, double).
void batch_moments(const FloatInput& x, const BatchNormDims& d, std::vector<double>& mean,
                   std::vector<double>& var) {
  const int64_t channels = d.channels;
  const double n = static_cast<double>(d.rows);
  mean = channel_sums(d.rows, channels, [&](int64_t begin, int64_t end, double* sums) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x.data() + r * channels;
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c) sums[c] += row[c];
    }
  });
  for (double& m : mean) m /= n;
  var = channel_sums(d.rows, channels, [&](int64_t begin, int64_t end, double* sums) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = x.data() + r * channels;
#pragma omp simd
      for (int64_t c = 0; c < channels; ++c) {
        const double centred = row[c] - mean[c];
        sums[c] += centred * centred;
      }
    }
  });
  for (double& v : var) v /= n;
}

// Training mode: mean/invstd from the batch (bn.batch_moments when given, else computed from x);
// running = (1 - momentum) running + momentum batch, with the unbiased variance var * n / (n - 1)
// in running_var.
void training_statistics(const FloatInput& x, const BatchNormDims& d, const BatchNormParams& bn,
                         float* mean, float* invstd, float* running_mean, float* running_var) {
  std::vector<double> batch_mean, batch_var;
  if (bn.batch_moments) {
    const float* given = bn.batch_moments->data<float>(); // [2, C]
    batch_mean.assign(given, given + d.channels);
    batch_var.assign(given + d.channels, given + 2 * d.channels);
  } else {
    batch_moments(x, d, batch_mean, batch_var);
  }
  const double n = static_cast<double>(d.rows);
  for (int64_t c = 0; c < d.channels; ++c) {
    mean[c] = static_cast<float>(batch_mean[c]);
    invstd[c] = static_cast<float>(1.0 / std::sqrt(batch_var[c] + bn.eps));
    running_mean[c] =
        (1.0f - bn.momentum) * running_mean[c] + bn.momentum * static_cast<float>(batch_mean[c]);
    running_var[c] = (1.0f - bn.momentum) * running_var[c] +
                     bn.momentum * static_cast<float>(batch_var[c] * n / (n - 1.0));
  }
}

// Eval mode: mean/invstd from the running statistics, which stay as they are.
void eval_statistics(const BatchNormDims& d, const BatchNormParams& bn, const float* running_mean,
                     const float* running_var, float* mean, float* invstd) {
  for (int64_t c = 0; c < d.channels; ++c) {
    mean[c] = running_mean[c];
    invstd[c] = 1.0f / std::sqrt(running_var[c] + bn.eps);
  }
}

} // namespace

void store_column_moments(const Tensor& c, const GemmEpilogue& epilogue) {
  if (!epilogue.column_moments) return;
  const BatchNormDims d{c.shape().rows(), c.shape().last()};
  std::vector<double> mean, var;
  batch_moments(FloatInput(c), d, mean, var);
  float* out = epilogue.column_moments->data<float>(); // [2, N]
  for (int64_t j = 0; j < d.channels; ++j) {
    out[j] = static_cast<float>(mean[j]);
    out[d.channels + j] = static_cast<float>(var[j]);
  }
}

void batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y,
                       Tensor& mean, Tensor& invstd, Tensor& running_mean, Tensor& running_var,
                       const BatchNormParams& bn) {
  const BatchNormDims d =
      require_batchnorm_forward(x, gamma, beta, y, mean, invstd, running_mean, running_var, bn);

  const FloatInput x_values(x);
  float* mu = mean.data<float>();
  float* inv = invstd.data<float>();
  if (bn.training)
    training_statistics(x_values, d, bn, mu, inv, running_mean.data<float>(),
                        running_var.data<float>());
  else
    eval_statistics(d, bn, running_mean.data<float>(), running_var.data<float>(), mu, inv);
  if (!y.defined()) return; // the statistics only

  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  const float* xs = x_values.data();
  FloatOutput out(y, false);
  float* ys = out.data();
  const int64_t channels = d.channels;
#pragma omp parallel for schedule(static) if (d.rows * channels >= kParallelElements)
  for (int64_t r = 0; r < d.rows; ++r) {
    const float* x_row = xs + r * channels;
    float* y_row = ys + r * channels;
#pragma omp simd
    for (int64_t c = 0; c < channels; ++c) {
      const float xhat = (x_row[c] - mu[c]) * inv[c];
      // One rounding (fma), as on the GPU, so that the ReLU mask, which the backward recomputes
      // exactly, agrees with the CUDA kernels whatever the compiler contracts.
      const float normalised = std::fma(g[c], xhat, b[c]);
      y_row[c] = bn.relu ? relu(normalised) : normalised;
    }
  }
  out.store();
}

namespace {

// sum_dy[c] = sum(dy_hat), sum_dy_xhat[c] = sum(dy_hat * xhat) over the rows of x and dy
// [rows, C] (in double, then rounded), dy_hat being dy under the ReLU's mask.
void grad_sums(const float* xs, const float* dys, const BatchNormDims& d, const float* g,
               const float* b, const float* mu, const float* inv, bool relu,
               std::vector<float>& sum_dy, std::vector<float>& sum_dy_xhat) {
  const int64_t channels = d.channels;
  // sums[0, C): sum(dy_hat); sums[C, 2C): sum(dy_hat * xhat).
  const std::vector<double> sums =
      channel_sums(d.rows, 2 * channels, [&](int64_t begin, int64_t end, double* block) {
        for (int64_t r = begin; r < end; ++r) {
          const float* x_row = xs + r * channels;
          const float* dy_row = dys + r * channels;
#pragma omp simd
          for (int64_t c = 0; c < channels; ++c) {
            const float xhat = (x_row[c] - mu[c]) * inv[c];
            // Widened before the mask: masking the float makes GCC branch instead of vectorise.
            const double dy_hat = relu_masked<double>(relu, dy_row[c], std::fma(g[c], xhat, b[c]));
            block[c] += dy_hat;
            block[channels + c] += dy_hat * xhat;
          }
        }
      });
  for (int64_t c = 0; c < channels; ++c) {
    sum_dy[c] = static_cast<float>(sums[c]);
    sum_dy_xhat[c] = static_cast<float>(sums[channels + c]);
  }
}

// sums[c] = the sum over the rows of dx [rows, C] (in double, then rounded).
void column_sums(const float* dx, const BatchNormDims& d, float* sums) {
  const int64_t channels = d.channels;
  const std::vector<double> total =
      channel_sums(d.rows, channels, [&](int64_t begin, int64_t end, double* block) {
        for (int64_t r = begin; r < end; ++r) {
          const float* row = dx + r * channels;
#pragma omp simd
          for (int64_t c = 0; c < channels; ++c) block[c] += row[c];
        }
      });
  for (int64_t c = 0; c < channels; ++c) sums[c] = static_cast<float>(total[c]);
}

} // namespace

void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                        const Tensor& mean, const Tensor& invstd, const Tensor& dy, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta, const BatchNormParams& bn) {
  const BatchNormDims d =
      require_batchnorm_backward(x, gamma, beta, mean, invstd, dy, dx, dgamma, dbeta, bn);

  const FloatInput x_values(x), dy_values(dy);
  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  const float* mu = mean.data<float>();
  const float* inv = invstd.data<float>();
  const int64_t channels = d.channels;
  const float* xs = x_values.data();
  const float* dys = dy_values.data();
  const bool relu = bn.relu;
  // sum(dy_hat) and sum(dy_hat * xhat) per channel: given (bn.grad_sums [2, C]) or summed here.
  std::vector<float> sum_dy(channels), sum_dy_xhat(channels);
  if (bn.grad_sums) {
    const float* given = bn.grad_sums->data<float>();
    std::copy(given, given + channels, sum_dy.begin());
    std::copy(given + channels, given + 2 * channels, sum_dy_xhat.begin());
  } else {
    grad_sums(xs, dys, d, g, b, mu, inv, relu, sum_dy, sum_dy_xhat);
  }

  if (dgamma.defined()) { // undefined: dx only
    float* dg = dgamma.data<float>();
    float* db = dbeta.data<float>();
    for (int64_t c = 0; c < d.channels; ++c) {
      dg[c] += sum_dy_xhat[c];
      db[c] += sum_dy[c];
    }
  }
  if (!dx.defined()) return; // the affine gradients only

  // Training: dx = gamma invstd / n (n dy_hat - sum(dy_hat) - xhat sum(dy_hat xhat));
  // eval: the statistics are constants and dx = gamma invstd dy_hat.
  const float n = static_cast<float>(d.rows);
  const float* sdy = sum_dy.data();
  const float* sdyx = sum_dy_xhat.data();
  FloatOutput grad_in(dx, false);
  float* dxs = grad_in.data();
#pragma omp parallel for schedule(static) if (d.rows * channels >= kParallelElements)
  for (int64_t r = 0; r < d.rows; ++r) {
    const float* x_row = xs + r * channels;
    const float* dy_row = dys + r * channels;
    float* dx_row = dxs + r * channels;
#pragma omp simd
    for (int64_t c = 0; c < channels; ++c) {
      const float xhat = (x_row[c] - mu[c]) * inv[c];
      const float dy_hat = relu_masked(bn.relu, dy_row[c], std::fma(g[c], xhat, b[c]));
      dx_row[c] = bn.training ? g[c] * inv[c] / n * (n * dy_hat - sdy[c] - xhat * sdyx[c])
                              : g[c] * inv[c] * dy_hat;
    }
  }
  grad_in.store();
  if (bn.dx_sums) column_sums(FloatInput(dx).data(), d, bn.dx_sums->data<float>());
}

} // namespace minamp::cpu
