// Tests of the CPU batch-norm kernels (minamp::cpu::batchnorm_forward / batchnorm_backward):
// forward against a double reference in training and eval mode, with and without the fused
// ReLU; PyTorch's running-statistics update (unbiased variance); dx, dgamma, dbeta by finite
// differences; a batch of many row blocks (the threaded path) against double references and
// across thread counts; the f16 emulation; the sums a GEMM or the dx pass may take over
// (given gradient sums, dx_sums); dx in place over dy; and the error messages.
#include "kernels/kernels.h"
#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

constexpr double kF32Tolerance = 1e-6;
constexpr double kGradientTolerance = 1e-4;
constexpr double kEps = 1e-5;

// The statistics a batch-norm forward normalises with, and its output, in double.
struct BatchNormReference {
  Doubles mean, var, y;
};

// x [rows, C]; training uses the batch mean and biased variance, eval the running ones.
BatchNormReference batchnorm_reference(const Doubles& x, int64_t channels, const Doubles& gamma,
                                       const Doubles& beta, const Doubles& running_mean,
                                       const Doubles& running_var, bool training, bool relu) {
  const int64_t rows = static_cast<int64_t>(x.size()) / channels;
  BatchNormReference ref{running_mean, running_var, Doubles(x.size())};
  if (training) {
    ref.mean.assign(channels, 0.0);
    ref.var.assign(channels, 0.0);
    for (int64_t i = 0; i < rows * channels; ++i) ref.mean[i % channels] += x[i] / rows;
    for (int64_t i = 0; i < rows * channels; ++i) {
      const double centred = x[i] - ref.mean[i % channels];
      ref.var[i % channels] += centred * centred / rows;
    }
  }
  for (int64_t i = 0; i < rows * channels; ++i) {
    const int64_t c = i % channels;
    const double y = gamma[c] * (x[i] - ref.mean[c]) / std::sqrt(ref.var[c] + kEps) + beta[c];
    ref.y[i] = relu && y < 0 ? 0.0 : y;
  }
  return ref;
}

// The tensors of one batch-norm layer over x of `shape` (channels last), randomly filled.
struct BatchNormLayer {
  Tensor x, gamma, beta, running_mean, running_var;
  BatchNormLayer(Rng& rng, const Shape& shape, DType dtype = DType::f32) {
    const int64_t channels = shape.last();
    x = random_tensor(rng, shape, dtype, Device::cpu, -2.0f, 3.0f);
    gamma = random_tensor(rng, {channels}, DType::f32, Device::cpu, 0.5f, 1.5f);
    beta = random_tensor(rng, {channels});
    running_mean = random_tensor(rng, {channels});
    running_var = random_tensor(rng, {channels}, DType::f32, Device::cpu, 0.5f, 2.0f);
  }
  int64_t channels() const { return x.shape().last(); }
  BatchNormReference reference(bool training, bool relu) const {
    return batchnorm_reference(to_doubles(x), channels(), to_doubles(gamma), to_doubles(beta),
                               to_doubles(running_mean), to_doubles(running_var), training, relu);
  }
};

BatchNormParams params(bool training, bool relu) {
  BatchNormParams bn;
  bn.training = training;
  bn.relu = relu;
  bn.eps = static_cast<float>(kEps);
  return bn;
}

Doubles invstd_of(const Doubles& var) {
  Doubles invstd(var.size());
  for (size_t c = 0; c < var.size(); ++c) invstd[c] = 1.0 / std::sqrt(var[c] + kEps);
  return invstd;
}

const Shape kShapes[] = {{2, 3, 5, 7}, {4, 3}, {1, 1, 9, 17}};

TEST(CpuBatchNorm, ForwardMatchesReferenceInBothModes) {
  Rng rng(31);
  for (const Shape& shape : kShapes)
    for (bool training : {true, false})
      for (bool relu : {false, true}) {
        BatchNormLayer layer(rng, shape);
        const BatchNormReference ref = layer.reference(training, relu);
        Tensor y = poisoned(shape);
        Tensor mean = poisoned({layer.channels()}), invstd = poisoned({layer.channels()});
        cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd,
                               layer.running_mean, layer.running_var, params(training, relu));
        const std::string what = cat(shape, " training=", training, " relu=", relu);
        EXPECT_LT(relative_error_to(y, ref.y), kF32Tolerance) << what;
        EXPECT_LT(relative_error_to(mean, ref.mean), kF32Tolerance) << what;
        EXPECT_LT(relative_error_to(invstd, invstd_of(ref.var)), kF32Tolerance) << what;
      }
}

// One training step: running = 0.9 running + 0.1 batch, the variance unbiased (n / (n - 1));
// eval leaves the running statistics bit-for-bit alone.
TEST(CpuBatchNorm, RunningStatisticsFollowPyTorch) {
  Rng rng(32);
  BatchNormLayer layer(rng, {2, 2, 3, 5}); // n = 12 values per channel
  const Doubles mean0 = to_doubles(layer.running_mean), var0 = to_doubles(layer.running_var);
  const BatchNormReference batch = layer.reference(true, false);
  Tensor y = poisoned(layer.x.shape());
  Tensor mean = poisoned({5}), invstd = poisoned({5});
  cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                         layer.running_var, params(true, false));
  Doubles expected_mean(5), expected_var(5);
  for (int c = 0; c < 5; ++c) {
    expected_mean[c] = 0.9 * mean0[c] + 0.1 * batch.mean[c];
    expected_var[c] = 0.9 * var0[c] + 0.1 * batch.var[c] * 12.0 / 11.0;
  }
  EXPECT_LT(relative_error_to(layer.running_mean, expected_mean), kF32Tolerance);
  EXPECT_LT(relative_error_to(layer.running_var, expected_var), kF32Tolerance);

  const std::vector<float> mean1 = layer.running_mean.to_vector();
  const std::vector<float> var1 = layer.running_var.to_vector();
  cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                         layer.running_var, params(false, false));
  EXPECT_EQ(layer.running_mean.to_vector(), mean1);
  EXPECT_EQ(layer.running_var.to_vector(), var1);
}

// Another momentum and eps than PyTorch's defaults are the ones used (neither is hard-wired).
TEST(CpuBatchNorm, MomentumAndEpsAreTheCallers) {
  Rng rng(33);
  BatchNormLayer layer(rng, {12, 5});
  const Doubles mean0 = to_doubles(layer.running_mean), var0 = to_doubles(layer.running_var);
  const BatchNormReference batch = layer.reference(true, false);
  BatchNormParams bn = params(true, false);
  bn.momentum = 0.3f;
  bn.eps = 1e-1f; // large enough to move invstd far beyond the tolerance
  Tensor y = poisoned(layer.x.shape());
  Tensor mean = poisoned({5}), invstd = poisoned({5});
  cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                         layer.running_var, bn);
  Doubles expected_mean(5), expected_var(5), expected_invstd(5);
  for (int c = 0; c < 5; ++c) {
    expected_mean[c] = 0.7 * mean0[c] + 0.3 * batch.mean[c];
    expected_var[c] = 0.7 * var0[c] + 0.3 * batch.var[c] * 12.0 / 11.0;
    expected_invstd[c] = 1.0 / std::sqrt(batch.var[c] + double(bn.eps));
  }
  EXPECT_LT(relative_error_to(layer.running_mean, expected_mean), kF32Tolerance);
  EXPECT_LT(relative_error_to(layer.running_var, expected_var), kF32Tolerance);
  EXPECT_LT(relative_error_to(invstd, expected_invstd), kF32Tolerance);

  // Eval normalises with the running variance and the same eps.
  bn.training = false;
  invstd = poisoned({5});
  cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                         layer.running_var, bn);
  for (int c = 0; c < 5; ++c)
    expected_invstd[c] = 1.0 / std::sqrt(expected_var[c] + double(bn.eps));
  EXPECT_LT(relative_error_to(invstd, expected_invstd), kF32Tolerance) << "eval";
}

// dx, dgamma, dbeta of L = sum(r .* batchnorm(x)) by central differences, dgamma / dbeta
// accumulating onto their starting values.
TEST(CpuBatchNorm, BackwardMatchesFiniteDifferences) {
  Rng rng(33);
  for (const Shape& shape : {Shape{2, 3, 2, 5}, Shape{6, 4}})
    for (bool training : {true, false})
      for (bool relu : {false, true}) {
        const BatchNormLayer layer(rng, shape);
        const int64_t channels = layer.channels();
        const Tensor r = random_tensor(rng, shape);
        Tensor y = poisoned(shape);
        Tensor mean = poisoned({channels}), invstd = poisoned({channels});
        Tensor running_mean = layer.running_mean.clone(), running_var = layer.running_var.clone();
        cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, running_mean,
                               running_var, params(training, relu));
        const Tensor dgamma_start = random_tensor(rng, {channels});
        const Tensor dbeta_start = random_tensor(rng, {channels});
        Tensor dx = poisoned(shape), dgamma = dgamma_start.clone(), dbeta = dbeta_start.clone();
        cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, r, dx, dgamma,
                                dbeta, params(training, relu));

        const Doubles x0 = to_doubles(layer.x), g0 = to_doubles(layer.gamma),
                      b0 = to_doubles(layer.beta), r0 = to_doubles(r),
                      rm = to_doubles(layer.running_mean), rv = to_doubles(layer.running_var);
        auto objective = [&](const Doubles& x, const Doubles& g, const Doubles& b) {
          return dot(r0, batchnorm_reference(x, channels, g, b, rm, rv, training, relu).y);
        };
        const Doubles num_dx =
            numerical_gradient([&](const Doubles& v) { return objective(v, g0, b0); }, x0);
        Doubles num_dgamma =
            numerical_gradient([&](const Doubles& v) { return objective(x0, v, b0); }, g0);
        Doubles num_dbeta =
            numerical_gradient([&](const Doubles& v) { return objective(x0, g0, v); }, b0);
        const Doubles dg_old = to_doubles(dgamma_start), db_old = to_doubles(dbeta_start);
        for (int64_t c = 0; c < channels; ++c) {
          num_dgamma[c] += dg_old[c];
          num_dbeta[c] += db_old[c];
        }
        const std::string what = cat(shape, " training=", training, " relu=", relu);
        EXPECT_LT(relative_error_to(dx, num_dx), kGradientTolerance) << what;
        EXPECT_LT(relative_error_to(dgamma, num_dgamma), kGradientTolerance) << what;
        EXPECT_LT(relative_error_to(dbeta, num_dbeta), kGradientTolerance) << what;
      }
}

// The gradients of L = sum(dy .* batchnorm(x)) in training mode, in double from the analytic
// formulas: dgamma = sum(dy_hat xhat), dbeta = sum(dy_hat) and
// dx = gamma invstd / n (n dy_hat - sum(dy_hat) - xhat sum(dy_hat xhat)), dy_hat = dy zeroed where
// y <= 0.
struct BatchNormGradients {
  Doubles dx, dgamma, dbeta;
};
BatchNormGradients batchnorm_backward_reference(const Doubles& x, const Doubles& dy,
                                                int64_t channels, const Doubles& gamma,
                                                const BatchNormReference& forward, bool relu) {
  const int64_t size = static_cast<int64_t>(x.size()), rows = size / channels;
  const Doubles invstd = invstd_of(forward.var);
  Doubles xhat(x.size()), dy_hat(x.size()), sum_dy(channels, 0.0), sum_dy_xhat(channels, 0.0);
  for (int64_t i = 0; i < size; ++i) {
    const int64_t c = i % channels;
    xhat[i] = (x[i] - forward.mean[c]) * invstd[c];
    dy_hat[i] = relu && forward.y[i] <= 0.0 ? 0.0 : dy[i];
    sum_dy[c] += dy_hat[i];
    sum_dy_xhat[c] += dy_hat[i] * xhat[i];
  }
  Doubles dx(x.size());
  for (int64_t i = 0; i < size; ++i) {
    const int64_t c = i % channels;
    dx[i] = gamma[c] * invstd[c] / rows * (rows * dy_hat[i] - sum_dy[c] - xhat[i] * sum_dy_xhat[c]);
  }
  return {dx, sum_dy_xhat, sum_dy};
}

// 4800 rows x 24 channels: many row blocks, summed on several threads where OpenMP is on. The
// outputs match double references, and are bit-for-bit the same on one thread and on four.
TEST(CpuBatchNorm, ManyRowBlocksMatchReferencesOnAnyThreadCount) {
  Rng rng(36);
  const Shape shape{3, 40, 40, 24};
  const BatchNormLayer layer(rng, shape);
  const Tensor dy = random_tensor(rng, shape);
  auto run = [&] {
    Tensor y = poisoned(shape), dx = poisoned(shape);
    Tensor mean = poisoned({24}), invstd = poisoned({24});
    Tensor rm = layer.running_mean.clone(), rv = layer.running_var.clone();
    Tensor dgamma = Tensor::zeros({24}), dbeta = Tensor::zeros({24});
    cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, rm, rv,
                           params(true, true));
    cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, dy, dx, dgamma, dbeta,
                            params(true, true));
    return std::vector<Tensor>{y, mean, invstd, dx, dgamma, dbeta};
  };
  const std::vector<Tensor> outputs = outputs_on_any_thread_count(run, "batch norm");
  const BatchNormReference ref = layer.reference(true, true);
  EXPECT_LT(relative_error_to(outputs[0], ref.y), kF32Tolerance);
  EXPECT_LT(relative_error_to(outputs[1], ref.mean), kF32Tolerance);
  EXPECT_LT(relative_error_to(outputs[2], invstd_of(ref.var)), kF32Tolerance);
  const BatchNormGradients grads = batchnorm_backward_reference(
      to_doubles(layer.x), to_doubles(dy), 24, to_doubles(layer.gamma), ref, true);
  EXPECT_LT(relative_error_to(outputs[3], grads.dx), 1e-5); // fp32 dx: three terms cancel
  EXPECT_LT(relative_error_to(outputs[4], grads.dgamma), kF32Tolerance);
  EXPECT_LT(relative_error_to(outputs[5], grads.dbeta), kF32Tolerance);
}

// f16 or bf16 x: y and dx are the fp32 results on the widened values rounded to the 16-bit
// format; the statistics and parameter gradients stay fp32 and equal the fp32 path.
TEST(CpuBatchNorm, HalfPrecisionActivationsUseFp32Statistics) {
  Rng rng(34);
  for (DType dtype : {DType::f16, DType::bf16}) {
    BatchNormLayer layer(rng, {2, 4, 4, 6}, dtype);
    const Tensor x32 = layer.x.to(DType::f32);
    const Tensor dy16 = random_tensor(rng, layer.x.shape(), dtype);
    const Tensor dy32 = dy16.to(DType::f32);
    auto run = [&](const Tensor& x, const Tensor& dy, DType dtype) {
      Tensor y = poisoned(x.shape(), dtype), dx = poisoned(x.shape(), dtype);
      Tensor mean = poisoned({6}), invstd = poisoned({6});
      Tensor rm = layer.running_mean.clone(), rv = layer.running_var.clone();
      Tensor dgamma = Tensor::zeros({6}), dbeta = Tensor::zeros({6});
      cpu::batchnorm_forward(x, layer.gamma, layer.beta, y, mean, invstd, rm, rv,
                             params(true, true));
      cpu::batchnorm_backward(x, layer.gamma, layer.beta, mean, invstd, dy, dx, dgamma, dbeta,
                              params(true, true));
      return std::vector<Tensor>{y, dx, mean, invstd, rm, rv, dgamma, dbeta};
    };
    const std::vector<Tensor> half_run = run(layer.x, dy16, dtype);
    const std::vector<Tensor> float_run = run(x32, dy32, DType::f32);
    EXPECT_EQ(half_run[0].dtype(), dtype);
    EXPECT_EQ(half_run[0].to_vector(), float_run[0].to(dtype).to_vector()) << dtype; // y
    EXPECT_EQ(half_run[1].to_vector(), float_run[1].to(dtype).to_vector()) << dtype; // dx
    for (size_t i = 2; i < half_run.size(); ++i)
      EXPECT_EQ(half_run[i].to_vector(), float_run[i].to_vector()) << dtype << " output " << i;
  }
}

// Eval mode with the fused ReLU and one NaN in x: as BatchNorm then ReLU in PyTorch, y is NaN
// there, the ReLU passes that element's gradient (dx = gamma invstd dy), and only its channel's
// dgamma becomes NaN.
TEST(CpuBatchNorm, FusedReluPassesTheGradientOfANaN) {
  Rng rng(35);
  BatchNormLayer layer(rng, {4, 3});
  std::vector<float> x = layer.x.to_vector();
  x[0] = std::nanf("");
  layer.x = Tensor::from_vector(x, {4, 3});
  const BatchNormParams bn = params(false, true);
  Tensor y = poisoned({4, 3}), mean = poisoned({3}), invstd = poisoned({3});
  cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                         layer.running_var, bn);
  EXPECT_TRUE(std::isnan(y.to_vector()[0]));
  const Tensor dy = random_tensor(rng, {4, 3});
  Tensor dx = poisoned({4, 3}), dgamma = Tensor::zeros({3}), dbeta = Tensor::zeros({3});
  cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, dy, dx, dgamma, dbeta,
                          bn);
  const float expected_dx0 = layer.gamma.to_vector()[0] * invstd.to_vector()[0] * dy.to_vector()[0];
  EXPECT_FLOAT_EQ(dx.to_vector()[0], expected_dx0);
  EXPECT_TRUE(std::isnan(dgamma.to_vector()[0]));
  EXPECT_TRUE(std::isfinite(dgamma.to_vector()[1]) && std::isfinite(dgamma.to_vector()[2]));
  EXPECT_TRUE(std::isfinite(dbeta.to_vector()[0])) << "dbeta sums dy, not x";
}

TEST(CpuBatchNorm, RejectsMismatchedShapes) {
  Rng rng(35);
  BatchNormLayer layer(rng, {2, 3, 3, 4});
  Tensor y = poisoned({2, 3, 3, 4});
  Tensor mean = poisoned({4}), invstd = poisoned({4});
  const Tensor gamma_wrong = random_tensor(rng, {5});
  expect_error(
      [&] {
        cpu::batchnorm_forward(layer.x, gamma_wrong, layer.beta, y, mean, invstd,
                               layer.running_mean, layer.running_var, params(true, false));
      },
      "batchnorm_forward", "gamma must be f32 with 4 elements, got f32[5]");
  Tensor y_f16 = poisoned({2, 3, 3, 4}, DType::f16);
  expect_error(
      [&] {
        cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y_f16, mean, invstd,
                               layer.running_mean, layer.running_var, params(true, false));
      },
      "batchnorm_forward", "expects y shaped and typed like x");
  Tensor y_flat = poisoned({18, 4}); // x's size, not its shape
  expect_error(
      [&] {
        cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y_flat, mean, invstd,
                               layer.running_mean, layer.running_var, params(true, false));
      },
      "batchnorm_forward",
      "expects y shaped and typed like x f32[2, 3, 3, 4] on cpu, got f32[18, 4]");
  Tensor running_var_wrong = Tensor::full({5}, 1.0f);
  expect_error(
      [&] {
        cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd,
                               layer.running_mean, running_var_wrong, params(true, false));
      },
      "batchnorm_forward", "running_var must be f32 with 4 elements, got f32[5]");
  const Tensor one_row = random_tensor(rng, {1, 4});
  Tensor y_row = poisoned({1, 4});
  expect_error(
      [&] {
        cpu::batchnorm_forward(one_row, layer.gamma, layer.beta, y_row, mean, invstd,
                               layer.running_mean, layer.running_var, params(true, false));
      },
      "batchnorm_forward", "more than one value per channel");
  const Tensor dy_wrong = random_tensor(rng, {2, 3, 4, 4});
  Tensor dx = poisoned({2, 3, 3, 4}), dgamma = Tensor::zeros({4}), dbeta = Tensor::zeros({4});
  expect_error(
      [&] {
        cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, dy_wrong, dx,
                                dgamma, dbeta, params(true, false));
      },
      "batchnorm_backward", "expects dy and dx shaped like x");
}

// Given batch_moments replace the statistics pass: the batch's own moments give the unfused
// result, and other moments are used as given (mean, invstd and the running statistics).
TEST(CpuBatchNorm, GivenBatchMomentsReplaceTheStatisticsPass) {
  Rng rng(37);
  for (bool relu : {false, true}) {
    BatchNormLayer layer(rng, {2, 3, 5, 7});
    BatchNormLayer unfused = layer;
    unfused.running_mean = layer.running_mean.clone();
    unfused.running_var = layer.running_var.clone();
    const BatchNormReference ref = layer.reference(true, relu);
    std::vector<float> given(ref.mean.begin(), ref.mean.end());
    given.insert(given.end(), ref.var.begin(), ref.var.end());
    const Tensor moments = Tensor::from_vector(given, {2, 7});
    BatchNormParams bn = params(true, relu);
    bn.batch_moments = &moments;
    Tensor y = poisoned({2, 3, 5, 7}), y_unfused = poisoned({2, 3, 5, 7});
    Tensor mean = poisoned({7}), invstd = poisoned({7});
    Tensor mean_unfused = poisoned({7}), invstd_unfused = poisoned({7});
    cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                           layer.running_var, bn);
    cpu::batchnorm_forward(unfused.x, unfused.gamma, unfused.beta, y_unfused, mean_unfused,
                           invstd_unfused, unfused.running_mean, unfused.running_var,
                           params(true, relu));
    EXPECT_LT(relative_error(y, y_unfused), kF32Tolerance);
    EXPECT_LT(relative_error(invstd, invstd_unfused), kF32Tolerance);
    EXPECT_LT(relative_error(layer.running_var, unfused.running_var), kF32Tolerance);

    // Moments other than the batch's are used as they are.
    const std::vector<float> shifted_values(14, 2.0f); // mean 2, variance 2 in every channel
    const Tensor shifted = Tensor::from_vector(shifted_values, {2, 7});
    bn.batch_moments = &shifted;
    cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                           layer.running_var, bn);
    EXPECT_EQ(mean.to_vector(), std::vector<float>(7, 2.0f));
    EXPECT_NEAR(invstd.to_vector()[0], 1.0 / std::sqrt(2.0 + kEps), 1e-6);
  }
}

// Without y, the statistics alone (for a conv that applies the normalisation as it loads): the
// same mean, invstd and running statistics as with it, in both modes.
TEST(CpuBatchNorm, WithoutAnOutputOnlyTheStatistics) {
  Rng rng(38);
  for (bool training : {true, false}) {
    BatchNormLayer layer(rng, {3, 4, 5, 6});
    Tensor with_rm = layer.running_mean.clone(), with_rv = layer.running_var.clone();
    Tensor y = poisoned({3, 4, 5, 6}), mean = poisoned({6}), invstd = poisoned({6});
    cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, with_rm, with_rv,
                           params(training, true));
    Tensor no_y, only_mean = poisoned({6}), only_invstd = poisoned({6});
    cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, no_y, only_mean, only_invstd,
                           layer.running_mean, layer.running_var, params(training, true));
    EXPECT_FALSE(no_y.defined());
    EXPECT_EQ(only_mean.to_vector(), mean.to_vector()) << "training " << training;
    EXPECT_EQ(only_invstd.to_vector(), invstd.to_vector()) << "training " << training;
    EXPECT_EQ(layer.running_mean.to_vector(), with_rm.to_vector()) << "training " << training;
    EXPECT_EQ(layer.running_var.to_vector(), with_rv.to_vector()) << "training " << training;
  }
}

// Given gradient sums (from the GEMM that wrote dy) replace the kernel's own reduction: the
// batch's own sums give its dx, dgamma and dbeta; other sums are used as they are.
TEST(CpuBatchNorm, GivenGradientSumsReplaceTheReduction) {
  Rng rng(39);
  for (bool training : {true, false})
    for (bool relu : {false, true}) {
      SCOPED_TRACE(cat(training ? "training" : "eval", relu ? " relu" : ""));
      BatchNormLayer layer(rng, {2, 3, 5, 7});
      const Tensor dy = random_tensor(rng, {2, 3, 5, 7});
      Tensor y = poisoned({2, 3, 5, 7}), mean = poisoned({7}), invstd = poisoned({7});
      cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                             layer.running_var, params(training, relu));
      const auto backward = [&](const Tensor* grad_sums, Tensor& dx, Tensor& dgamma,
                                Tensor& dbeta) {
        BatchNormParams bn = params(training, relu);
        bn.grad_sums = grad_sums;
        cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, dy, dx, dgamma,
                                dbeta, bn);
      };
      Tensor dx = poisoned({2, 3, 5, 7}), dgamma = Tensor::zeros({7}), dbeta = Tensor::zeros({7});
      backward(nullptr, dx, dgamma, dbeta);

      const BatchNormGradSums host =
          batchnorm_grad_sums_on_host(layer.x, dy, layer.gamma, layer.beta, mean, invstd, relu);
      const Tensor own =
          Tensor::from_vector(std::vector<float>(host.sums.begin(), host.sums.end()), {2, 7});
      Tensor given_dx = poisoned({2, 3, 5, 7}), given_dgamma = Tensor::zeros({7}),
             given_dbeta = Tensor::zeros({7});
      backward(&own, given_dx, given_dgamma, given_dbeta);
      EXPECT_LT(relative_error(given_dx, dx), kF32Tolerance);
      EXPECT_LT(relative_error(given_dgamma, dgamma), kF32Tolerance);
      EXPECT_LT(relative_error(given_dbeta, dbeta), kF32Tolerance);

      const std::vector<float> other_values = {1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, -5, -6, -7};
      const Tensor other = Tensor::from_vector(other_values, {2, 7});
      Tensor other_dx = poisoned({2, 3, 5, 7}), other_dgamma = Tensor::zeros({7}),
             other_dbeta = Tensor::zeros({7});
      backward(&other, other_dx, other_dgamma, other_dbeta);
      EXPECT_EQ(other_dbeta.to_vector(),
                std::vector<float>(other_values.begin(), other_values.begin() + 7));
      EXPECT_EQ(other_dgamma.to_vector(),
                std::vector<float>(other_values.begin() + 7, other_values.end()));
      if (training)
        EXPECT_GT(relative_error(other_dx, dx), 1e-3) << "dx uses the given sums";
      else
        EXPECT_EQ(other_dx.to_vector(), dx.to_vector()) << "eval: dx does not use them";
    }
}

// The gradient sums are f32 [2, C] and dx_sums f32 [C], both for the backward only.
TEST(CpuBatchNorm, GradientSumsAndDxSumsAreShapedByChannels) {
  Rng rng(40);
  BatchNormLayer layer(rng, {2, 3, 3, 4});
  const Tensor dy = random_tensor(rng, {2, 3, 3, 4});
  Tensor y = poisoned({2, 3, 3, 4}), mean = Tensor::zeros({4}), invstd = Tensor::full({4}, 1.0f);
  Tensor dx = poisoned({2, 3, 3, 4}), dgamma = Tensor::zeros({4}), dbeta = Tensor::zeros({4});
  BatchNormParams bn = params(true, false);
  const auto backward = [&] {
    cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, dy, dx, dgamma, dbeta,
                            bn);
  };
  const Tensor wrong = Tensor::zeros({2, 3});
  bn.grad_sums = &wrong;
  expect_error(backward, "batchnorm_backward", "grad_sums must be f32 [2, 4]", "got f32[2, 3]");
  bn.grad_sums = nullptr;
  Tensor wrong_dx_sums = Tensor::zeros({2, 4}), dx_sums = Tensor::zeros({4});
  bn.dx_sums = &wrong_dx_sums;
  expect_error(backward, "batchnorm_backward", "dx_sums", "must be f32 with 4 elements",
               "got f32[2, 4]");
  bn.dx_sums = &dx_sums;
  expect_error(
      [&] {
        cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd,
                               layer.running_mean, layer.running_var, bn);
      },
      "batchnorm_forward", "for batchnorm_backward only");
}

// dx_sums are the sums of dx as stored per channel, in both modes, with and without the ReLU, for
// f32 and f16 gradients (the f16 dx rounded before it is summed), over many row blocks too; dx is
// the same with or without them.
TEST(CpuBatchNorm, DxSumsAreTheSumsOfDxPerChannel) {
  Rng rng(41);
  for (const Shape& shape : {Shape{2, 3, 5, 7}, Shape{1000, 12}})
    for (DType grad_dtype : {DType::f32, DType::f16})
      for (bool training : {true, false})
        for (bool relu : {false, true}) {
          SCOPED_TRACE(
              cat(shape, " ", grad_dtype, training ? " training" : " eval", relu ? " relu" : ""));
          const int64_t channels = shape.last();
          BatchNormLayer layer(rng, shape);
          const Tensor dy = random_tensor(rng, shape, grad_dtype);
          Tensor y = poisoned(shape), mean = poisoned({channels}), invstd = poisoned({channels});
          cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd,
                                 layer.running_mean, layer.running_var, params(training, relu));
          const auto backward = [&](Tensor* dx_sums) {
            Tensor dx = poisoned(shape, grad_dtype), dgamma = Tensor::zeros({channels}),
                   dbeta = Tensor::zeros({channels});
            BatchNormParams bn = params(training, relu);
            bn.dx_sums = dx_sums;
            cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, dy, dx, dgamma,
                                    dbeta, bn);
            return dx;
          };
          Tensor sums = poisoned({channels});
          const Tensor dx = backward(&sums);
          expect_column_sums(sums, dx, 1e-6, "dx_sums");
          EXPECT_EQ(dx.to_vector(), backward(nullptr).to_vector());
        }
}

TEST(CpuBatchNorm, BatchMomentsAreForTrainingOnlyAndShapedTwoByChannels) {
  Rng rng(38);
  BatchNormLayer layer(rng, {2, 3, 3, 4});
  Tensor y = poisoned({2, 3, 3, 4});
  Tensor mean = poisoned({4}), invstd = poisoned({4});
  const Tensor wrong = Tensor::zeros({4}), right = Tensor::full({2, 4}, 1.0f);
  BatchNormParams bn = params(true, false);
  const auto forward = [&] {
    cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                           layer.running_var, bn);
  };
  bn.batch_moments = &wrong;
  expect_error(forward, "batchnorm_forward", "batch_moments must be f32 [2, 4]", "got f32[4]");
  bn = params(false, false);
  bn.batch_moments = &right;
  expect_error(forward, "batchnorm_forward", "batch_moments", "training mode only");
}

// In place is refused by name where the kernels cannot take it: y over x in the forward (the CUDA
// kernel reads x through a non-aliasing pointer) and dx over x in the backward.
TEST(CpuBatchNorm, RejectsInPlaceOutputsOverX) {
  Rng rng(36);
  BatchNormLayer layer(rng, {2, 3, 3, 4});
  Tensor mean = poisoned({4}), invstd = poisoned({4});
  Tensor x = layer.x.clone();
  expect_error(
      [&] {
        cpu::batchnorm_forward(x, layer.gamma, layer.beta, x, mean, invstd, layer.running_mean,
                               layer.running_var, params(true, false));
      },
      "batchnorm_forward", "y must be a tensor of its own");
  Tensor y = poisoned({2, 3, 3, 4});
  cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                         layer.running_var, params(true, false));
  Tensor dy = random_tensor(rng, {2, 3, 3, 4}), dgamma = Tensor::zeros({4}),
         dbeta = Tensor::zeros({4});
  expect_error(
      [&] {
        cpu::batchnorm_backward(x, layer.gamma, layer.beta, mean, invstd, dy, x, dgamma, dbeta,
                                params(true, false));
      },
      "batchnorm_backward", "dx must be dy itself (in place) or a tensor of its own");
}

// dx written over dy (in place) is bit for bit the dx of a separate tensor, with the same dgamma,
// dbeta and dx_sums: in both modes, with and without the ReLU, for f32 and f16 gradients, with
// the sums over dy taken here or given.
TEST(CpuBatchNorm, BackwardInPlaceOverDyEqualsASeparateDx) {
  Rng rng(42);
  for (const Shape& shape : {Shape{2, 3, 5, 7}, Shape{1000, 12}})
    for (DType grad_dtype : {DType::f32, DType::f16})
      for (bool training : {true, false})
        for (bool relu : {false, true})
          for (bool given_sums : {false, true}) {
            SCOPED_TRACE(cat(shape, " ", grad_dtype, training ? " training" : " eval",
                             relu ? " relu" : "", given_sums ? " given sums" : ""));
            const int64_t channels = shape.last();
            BatchNormLayer layer(rng, shape);
            const Tensor dy = random_tensor(rng, shape, grad_dtype);
            const Tensor sums = random_tensor(rng, {2, channels});
            Tensor y = poisoned(shape), mean = poisoned({channels}), invstd = poisoned({channels});
            cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd,
                                   layer.running_mean, layer.running_var, params(training, relu));
            struct Result {
              Tensor dx, dgamma, dbeta, dx_sums;
            };
            const auto backward = [&](bool in_place) {
              Result r{in_place ? dy.clone() : poisoned(shape, grad_dtype),
                       Tensor::zeros({channels}), Tensor::zeros({channels}), poisoned({channels})};
              const Tensor gradient = in_place ? r.dx : dy;
              BatchNormParams bn = params(training, relu);
              bn.dx_sums = &r.dx_sums;
              if (given_sums) bn.grad_sums = &sums;
              cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, gradient,
                                      r.dx, r.dgamma, r.dbeta, bn);
              return r;
            };
            const Result separate = backward(false), in_place = backward(true);
            EXPECT_NE(in_place.dx.to_vector(), dy.to_vector()) << "dx was not written";
            EXPECT_EQ(in_place.dx.to_vector(), separate.dx.to_vector());
            EXPECT_EQ(in_place.dgamma.to_vector(), separate.dgamma.to_vector());
            EXPECT_EQ(in_place.dbeta.to_vector(), separate.dbeta.to_vector());
            EXPECT_EQ(in_place.dx_sums.to_vector(), separate.dx_sums.to_vector());
          }
}

// dx alone (dgamma and dbeta undefined) and the affine gradients alone (dx undefined) are bit for
// bit those of the whole backward, with the sums over dy taken here or given; neither part, or
// dx_sums without dx, is an error naming what was given.
TEST(CpuBatchNorm, BackwardComputesDxOrTheAffineGradientsAlone) {
  Rng rng(43);
  const Shape shape{3, 4, 5, 8};
  for (bool training : {true, false})
    for (bool given_sums : {false, true}) {
      SCOPED_TRACE(cat(training ? "training" : "eval", given_sums ? " given sums" : ""));
      BatchNormLayer layer(rng, shape);
      const Tensor dy = random_tensor(rng, shape, DType::f16);
      const Tensor sums = random_tensor(rng, {2, 8});
      Tensor y = poisoned(shape), mean = poisoned({8}), invstd = poisoned({8});
      cpu::batchnorm_forward(layer.x, layer.gamma, layer.beta, y, mean, invstd, layer.running_mean,
                             layer.running_var, params(training, true));
      BatchNormParams bn = params(training, true);
      if (given_sums) bn.grad_sums = &sums;
      const auto backward = [&](Tensor dx, Tensor dgamma, Tensor dbeta) {
        cpu::batchnorm_backward(layer.x, layer.gamma, layer.beta, mean, invstd, dy, dx, dgamma,
                                dbeta, bn);
      };
      Tensor dx = poisoned(shape, DType::f16), dgamma = Tensor::zeros({8}),
             dbeta = Tensor::zeros({8});
      backward(dx, dgamma, dbeta);
      Tensor dx_alone = poisoned(shape, DType::f16), no_dx;
      backward(dx_alone, Tensor(), Tensor());
      EXPECT_EQ(dx_alone.to_vector(), dx.to_vector());
      Tensor dgamma_alone = Tensor::zeros({8}), dbeta_alone = Tensor::zeros({8});
      backward(no_dx, dgamma_alone, dbeta_alone);
      EXPECT_EQ(dgamma_alone.to_vector(), dgamma.to_vector());
      EXPECT_EQ(dbeta_alone.to_vector(), dbeta.to_vector());

      expect_error([&] { backward(no_dx, Tensor(), Tensor()); }, "batchnorm_backward",
                   "expects dx, or dgamma and dbeta, or all three");
      expect_error([&] { backward(dx, dgamma, Tensor()); }, "batchnorm_backward",
                   "expects dx, or dgamma and dbeta");
      Tensor dx_sums = poisoned({8});
      bn.dx_sums = &dx_sums;
      expect_error([&] { backward(no_dx, dgamma, dbeta); }, "batchnorm_backward",
                   "dx_sums (the sum of dx per channel) needs dx");
    }
}

} // namespace
} // namespace minamp::test
