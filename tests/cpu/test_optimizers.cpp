// fp32 master weights and the optimizers: the f16 working copy rewritten in the update's pass,
// the f16 weight that stalls where the fp32 master learns, and SGD's and Adam's PyTorch
// semantics (hyperparameter checks, momentum buffers, every hyperparameter reaching the step).
#include <gtest/gtest.h>

#include <cmath>

#include "amp/grad_scaler.h"
#include "amp_problem.h"
#include "optim/optimizer.h"

namespace minamp {
namespace {

using test::expect_error;
using test::Problem;

TEST(MasterWeights, OptimizerRewritesTheF16CopyInTheSamePass) {
  Problem p;
  for (Parameter* param : p.model.parameters()) param->working_copy(DType::f16);
  optim::Adam adam(p.model.parameters(), 0.01f);
  p.model.zero_grad();
  p.loss(true).backward();
  adam.step();
  for (Parameter* param : p.model.parameters()) {
    const std::vector<float> master = param->master().to_vector();
    const std::vector<float> copy = param->half_copy().to_vector();
    for (size_t i = 0; i < master.size(); ++i) EXPECT_EQ(copy[i], round_to_half(master[i]));
  }
}

TEST(MasterWeights, F16WeightsStallWhereFp32MastersKeepLearning) {
  // |w| / |lr g| >= 4096: each update is at most half the f16 spacing just below w (here exactly
  // half, a tie that rounds to even), so an f16 weight rounds back to itself every step, while the
  // fp32 master accumulates the updates.
  const float lr = 1.0f, gradient = 1.0f / 4096.0f; // w = 1: ratio 4096
  Parameter with_master(Tensor::full({1}, 1.0f));
  Parameter f16_only(Tensor::full({1}, 1.0f));
  optim::SGD sgd_master({&with_master}, lr), sgd_f16({&f16_only}, lr);
  for (int step = 0; step < 64; ++step) {
    kernels::fill(with_master.grad(), gradient);
    kernels::fill(f16_only.grad(), gradient);
    sgd_master.step();
    sgd_f16.step();
    // Without a master copy, the weight lives in f16: store it back rounded.
    kernels::fill(f16_only.master(), round_to_half(f16_only.master().item()));
  }
  EXPECT_EQ(f16_only.master().item(), 1.0f) << "the f16 weight never moved";
  EXPECT_NEAR(with_master.master().item(), 1.0f - 64.0f / 4096.0f, 1e-6);
  EXPECT_LT(with_master.working_copy(DType::f16).item(), 1.0f) << "and the f16 copy follows it";
}

TEST(Optimizers, RejectHyperparametersPyTorchRefuses) {
  Problem p;
  const std::vector<Parameter*> params = p.model.parameters();
  expect_error([&] { optim::SGD s(params, -1.0f); }, "SGD: lr must be a finite number >= 0");
  expect_error([&] { optim::SGD s(params, NAN); }, "got nan");
  expect_error([&] { optim::SGD s(params, INFINITY); }, "SGD: lr");
  expect_error([&] { optim::SGD s(params, 0.1f, -0.5f); }, "SGD: momentum");
  optim::SGD heavy_ball(params, 0.1f, 1.5f); // momentum >= 1 is allowed, as in PyTorch
  expect_error([&] { optim::Adam a(params, 0.1f, 1.0f); }, "Adam: beta1 must be");
  expect_error([&] { optim::Adam a(params, 0.1f, 0.9f, -0.1f); }, "Adam: beta2");
  expect_error([&] { optim::Adam a(params, 0.1f, 0.9f, 0.999f, -1e-8f); }, "Adam: eps");
  expect_error([&] { optim::SGD s(params, 0.1f, 0.0f, -1e-4f); }, "SGD: weight_decay");
  expect_error([&] { optim::Adam a(params, 0.1f, 0.9f, 0.999f, 1e-8f, -1e-4f); },
               "Adam: weight_decay");
  expect_error([&] { optim::Adam a(params, 0.1f, -0.1f); }, "Adam: beta1 must be", "got -0.1");
  expect_error([&] { optim::Adam a(params, 0.1f, 0.9f, 1.0f); }, "Adam: beta2", "< 1, got 1");
  expect_error([&] { optim::SGD s({}, 0.1f); }, "Optimizer: got an empty parameter list");
  expect_error([&] { optim::clip_grad_norm_({}, 1.0f); }, "clip_grad_norm_: got an empty");
  for (float max_norm : {0.0f, -1.0f, NAN})
    expect_error([&] { optim::clip_grad_norm_(params, max_norm); },
                 "clip_grad_norm_: max_norm must be positive");
  optim::Adam adam(params, 0.0f); // lr 0 is allowed, as in PyTorch
  expect_error([&] { adam.set_lr(NAN); }, "lr");
  EXPECT_EQ(adam.lr(), 0.0f);
}

// The class hands its momentum and weight decay to the step and keeps the momentum buffers
// between steps, under the names PyTorch's state_dict gives them (the kernel's own test feeds
// the kernel directly): two steps with chosen gradients against torch.optim.SGD's formulas.
TEST(Optimizers, SgdKeepsItsMomentumBuffersAcrossSteps) {
  Rng rng(8);
  Parameter a(test::random_tensor(rng, {2, 3})), b(test::random_tensor(rng, {4}));
  const float lr = 0.1f, momentum = 0.9f, wd = 0.01f;
  optim::SGD sgd({&a, &b}, lr, momentum, wd);
  optim::SGD plain({&a, &b}, lr);
  EXPECT_TRUE(plain.named_state().empty()) << "SGD without momentum keeps no buffers";
  const std::vector<std::pair<std::string, Tensor*>> state = sgd.named_state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "momentum_buffer.0");
  EXPECT_EQ(state[1].first, "momentum_buffer.1");

  std::vector<float> w = a.master().to_vector(), buf(w.size(), 0.0f);
  for (int step = 0; step < 2; ++step) {
    a.grad() = test::random_tensor(rng, {2, 3});
    b.grad() = test::random_tensor(rng, {4});
    const std::vector<float> g = a.grad().to_vector();
    sgd.step();
    for (size_t i = 0; i < w.size(); ++i) { // buf = momentum buf + (g + wd w); w -= lr buf
      buf[i] = momentum * buf[i] + (g[i] + wd * w[i]);
      w[i] -= lr * buf[i];
    }
    const std::vector<float> got = a.master().to_vector(), got_buf = state[0].second->to_vector();
    for (size_t i = 0; i < w.size(); ++i) {
      EXPECT_NEAR(got[i], w[i], 1e-6f) << "step " << step << ", element " << i;
      EXPECT_NEAR(got_buf[i], buf[i], 1e-6f) << "step " << step << ", element " << i;
    }
  }
}

// Every hyperparameter the Adam class is given reaches the step (none is left at its default):
// two steps against torch.optim.Adam's formulas (L2 decay into the gradient), in double.
TEST(Optimizers, AdamHandsEveryHyperparameterToTheStep) {
  Rng rng(9);
  Parameter p(test::random_tensor(rng, {5}));
  const float lr = 0.05f, beta1 = 0.8f, beta2 = 0.95f, eps = 1e-2f, wd = 0.2f;
  optim::Adam adam({&p}, lr, beta1, beta2, eps, wd);
  std::vector<double> w, m(5, 0.0), v(5, 0.0);
  for (float x : p.master().to_vector()) w.push_back(x);
  for (int t = 1; t <= 2; ++t) {
    p.grad() = test::random_tensor(rng, {5});
    const std::vector<float> g = p.grad().to_vector();
    adam.step();
    for (size_t i = 0; i < w.size(); ++i) {
      const double d = g[i] + double(wd) * w[i];
      m[i] = beta1 * m[i] + (1.0 - beta1) * d;
      v[i] = beta2 * v[i] + (1.0 - beta2) * d * d;
      const double m_hat = m[i] / (1.0 - std::pow(double(beta1), t)),
                   v_hat = v[i] / (1.0 - std::pow(double(beta2), t));
      w[i] -= lr * m_hat / (std::sqrt(v_hat) + double(eps));
    }
    const std::vector<float> got = p.master().to_vector();
    for (size_t i = 0; i < w.size(); ++i)
      EXPECT_NEAR(got[i], w[i], 1e-6) << "step " << t << ", element " << i;
  }
  const std::vector<std::pair<std::string, Tensor*>> state = adam.named_state();
  ASSERT_EQ(state.size(), 3u);
  EXPECT_EQ(state[0].first, "step");
  EXPECT_EQ(state[0].second->item(), 2.0f);
  EXPECT_EQ(state[1].first, "exp_avg.0");
  EXPECT_EQ(state[2].first, "exp_avg_sq.0");
  const std::vector<float> exp_avg = state[1].second->to_vector(),
                           exp_avg_sq = state[2].second->to_vector();
  for (size_t i = 0; i < w.size(); ++i) { // the moments under their PyTorch names
    EXPECT_NEAR(exp_avg[i], m[i], 1e-6 * (1 + std::abs(m[i]))) << "element " << i;
    EXPECT_NEAR(exp_avg_sq[i], v[i], 1e-6 * (1 + v[i])) << "element " << i;
  }
}

} // namespace
} // namespace minamp
