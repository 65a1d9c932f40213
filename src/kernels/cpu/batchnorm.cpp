// CPU reference of batch normalisation (+ optional fused ReLU) over x[rows, C], an NHWC activation
// viewed as [N*H*W, C], with PyTorch's semantics: biased batch variance to normalise, unbiased
// variance in the running estimate, eps inside the square root. Per-channel sums accumulate in
// double; the saved mean / invstd and the affine math are fp32.
#include <cmath>
#include <initializer_list>
#include <vector>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

// Per-channel batch mean and biased variance of x [rows, C], accumulated in double.
void batch_moments(const FloatInput& x, const BatchNormDims& d, std::vector<double>& mean,
                   std::vector<double>& var) {
  mean.assign(static_cast<size_t>(d.channels), 0.0);
  var.assign(static_cast<size_t>(d.channels), 0.0);
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t c = 0; c < d.channels; ++c) mean[c] += x[r * d.channels + c];
  for (double& m : mean) m /= static_cast<double>(d.rows);
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t c = 0; c < d.channels; ++c) {
      const double centred = x[r * d.channels + c] - mean[c];
      var[c] += centred * centred;
    }
  for (double& v : var) v /= static_cast<double>(d.rows);
}

// Training mode: mean/invstd from the batch; running = (1 - momentum) running + momentum batch,
// with the unbiased variance var * n / (n - 1) in running_var.
void training_statistics(const FloatInput& x, const BatchNormDims& d, const BatchNormParams& bn,
                         float* mean, float* invstd, float* running_mean, float* running_var) {
  std::vector<double> batch_mean, batch_var;
  batch_moments(x, d, batch_mean, batch_var);
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

  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  FloatOutput out(y, false);
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t c = 0; c < d.channels; ++c) {
      const int64_t i = r * d.channels + c;
      const float xhat = (x_values[i] - mu[c]) * inv[c];
      const float normalised = g[c] * xhat + b[c]; // the backward recomputes exactly this
      out[i] = bn.relu ? relu(normalised) : normalised;
    }
  out.store();
}

void batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                        const Tensor& mean, const Tensor& invstd, const Tensor& dy, Tensor& dx,
                        Tensor& dgamma, Tensor& dbeta, const BatchNormParams& bn) {
  const BatchNormDims d =
      require_batchnorm_backward(x, gamma, beta, mean, invstd, dy, dx, dgamma, dbeta);

  const FloatInput x_values(x), dy_values(dy);
  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  const float* mu = mean.data<float>();
  const float* inv = invstd.data<float>();
  // xhat[rows, C] and dy_hat[rows, C]: dy with the ReLU mask (y > 0) recomputed from x.
  const int64_t size = d.rows * d.channels;
  std::vector<float> xhat(static_cast<size_t>(size)), dy_hat(static_cast<size_t>(size));
  std::vector<double> sum_dy(d.channels, 0.0), sum_dy_xhat(d.channels, 0.0);
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t c = 0; c < d.channels; ++c) {
      const int64_t i = r * d.channels + c;
      xhat[i] = (x_values[i] - mu[c]) * inv[c];
      const bool masked = bn.relu && !(g[c] * xhat[i] + b[c] > 0.0f);
      dy_hat[i] = masked ? 0.0f : dy_values[i];
      sum_dy[c] += dy_hat[i];
      sum_dy_xhat[c] += static_cast<double>(dy_hat[i]) * xhat[i];
    }

  // Training: dx = gamma invstd / n (n dy_hat - sum(dy_hat) - xhat sum(dy_hat xhat));
  // eval: the statistics are constants and dx = gamma invstd dy_hat.
  const float n = static_cast<float>(d.rows);
  FloatOutput grad_in(dx, false);
  for (int64_t r = 0; r < d.rows; ++r)
    for (int64_t c = 0; c < d.channels; ++c) {
      const int64_t i = r * d.channels + c;
      grad_in[i] = bn.training ? g[c] * inv[c] / n *
                                     (n * dy_hat[i] - static_cast<float>(sum_dy[c]) -
                                      xhat[i] * static_cast<float>(sum_dy_xhat[c]))
                               : g[c] * inv[c] * dy_hat[i];
    }
  grad_in.store();

  float* dg = dgamma.data<float>();
  float* db = dbeta.data<float>();
  for (int64_t c = 0; c < d.channels; ++c) {
    dg[c] += static_cast<float>(sum_dy_xhat[c]);
    db[c] += static_cast<float>(sum_dy[c]);
  }
}

} // namespace minamp::cpu
