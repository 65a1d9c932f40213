// Tests of the CPU optimizer and loss-scaler kernels: SGD with momentum and weight decay over
// three steps and Adam's first bias-corrected steps (both worked out by hand in double), the
// overflow skip that leaves every tensor untouched, the f16 copies, amp_unscale's inf / NaN
// detection, every branch of amp_update_scale, and zero_grads.
#include "amp/grad_scaler.h"
#include "kernels/kernels.h"
#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

constexpr double kF32Tolerance = 1e-6;

// The tensors of one parameter for an optimizer test, random except the zero optimizer state.
struct Param {
  Tensor master, grad, half, momentum_buffer, exp_avg, exp_avg_sq;
  Param(Rng& rng, const Shape& shape)
      : master(random_tensor(rng, shape)), grad(random_tensor(rng, shape)),
        half(poisoned(shape, DType::f16)), momentum_buffer(Tensor::zeros(shape)),
        exp_avg(Tensor::zeros(shape)), exp_avg_sq(Tensor::zeros(shape)) {}
  ParamSlot slot() { return {&master, &grad, &half, &momentum_buffer, &exp_avg, &exp_avg_sq}; }
  std::vector<std::vector<float>> values() const {
    return {master.to_vector(),          grad.to_vector(),    half.to_vector(),
            momentum_buffer.to_vector(), exp_avg.to_vector(), exp_avg_sq.to_vector()};
  }
};

// The f16 copy must be the master rounded to nearest even.
void expect_half_copy(const Param& p) {
  const std::vector<float> master = p.master.to_vector(), copy = p.half.to_vector();
  for (size_t i = 0; i < master.size(); ++i) ASSERT_EQ(copy[i], round_to_half(master[i]));
}

Tensor flag(float value) { return Tensor::from_vector({value}, {1}); }

TEST(CpuSgd, MomentumAndWeightDecayOverThreeSteps) {
  Rng rng(61);
  Param a(rng, {4, 5}), b(rng, {7});
  SgdParams sgd;
  sgd.lr = 0.1f;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 0.01f;
  const double lr = sgd.lr, momentum = sgd.momentum, wd = sgd.weight_decay; // as floats
  std::vector<Doubles> w = {to_doubles(a.master), to_doubles(b.master)};
  std::vector<Doubles> buf = {Doubles(20, 0.0), Doubles(7, 0.0)};
  for (int step = 0; step < 3; ++step) {
    a.grad = random_tensor(rng, {4, 5});
    b.grad = random_tensor(rng, {7});
    const std::vector<Doubles> g = {to_doubles(a.grad), to_doubles(b.grad)};
    for (size_t p = 0; p < 2; ++p)
      for (size_t i = 0; i < w[p].size(); ++i) {
        buf[p][i] = momentum * buf[p][i] + g[p][i] + wd * w[p][i]; // buf starts at 0
        w[p][i] -= lr * buf[p][i];
      }
    const Tensor no_overflow = step == 1 ? flag(0.0f) : Tensor(); // defined but clear
    cpu::sgd_step({a.slot(), b.slot()}, sgd, no_overflow);
  }
  EXPECT_LT(relative_error_to(a.master, w[0]), kF32Tolerance);
  EXPECT_LT(relative_error_to(b.master, w[1]), kF32Tolerance);
  EXPECT_LT(relative_error_to(a.momentum_buffer, buf[0]), kF32Tolerance);
  EXPECT_LT(relative_error_to(b.momentum_buffer, buf[1]), kF32Tolerance);
  expect_half_copy(a);
  expect_half_copy(b);
}

TEST(CpuSgd, PlainStepNeedsNoStateOrHalfCopy) {
  Rng rng(62);
  Tensor master = random_tensor(rng, {9}), grad = random_tensor(rng, {9});
  const Doubles w0 = to_doubles(master), g0 = to_doubles(grad);
  SgdParams sgd;
  sgd.lr = 0.5f;
  cpu::sgd_step({ParamSlot{&master, &grad}}, sgd, Tensor());
  Doubles expected(9);
  for (int i = 0; i < 9; ++i) expected[i] = w0[i] - 0.5 * g0[i];
  EXPECT_LT(relative_error_to(master, expected), kF32Tolerance);

  sgd.weight_decay = 0.25f; // without momentum too, the decay joins the gradient
  cpu::sgd_step({ParamSlot{&master, &grad}}, sgd, Tensor());
  for (int i = 0; i < 9; ++i) expected[i] -= 0.5 * (g0[i] + 0.25 * expected[i]);
  EXPECT_LT(relative_error_to(master, expected), kF32Tolerance);

  sgd.momentum = 0.9f;
  expect_error(
      [&] {
        cpu::sgd_step({ParamSlot{&master, &grad}}, sgd, Tensor());
      },
      "sgd_step", "no momentum_buffer");
}

// Three steps against a double reference, with PyTorch's eps and with a large one, where an eps
// added inside the square root instead of after it would show.
TEST(CpuAdam, FirstStepsAreBiasCorrectedWithL2Decay) {
  Rng rng(63);
  for (float eps : {1e-8f, 1e-3f}) {
    Param p(rng, {3, 7});
    AdamParams adam;
    adam.lr = 0.01f;
    adam.weight_decay = 0.1f;
    adam.eps = eps;
    Tensor step = Tensor::zeros({1});
    // The reference uses the float hyper-parameters the kernel sees (0.999f is not 0.999).
    const double lr = adam.lr, b1 = adam.beta1, b2 = adam.beta2, wd = adam.weight_decay;
    Doubles w = to_doubles(p.master), m(21, 0.0), v(21, 0.0);
    for (int t = 1; t <= 3; ++t) {
      p.grad = random_tensor(rng, {3, 7});
      const Doubles g = to_doubles(p.grad);
      const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
      for (int i = 0; i < 21; ++i) {
        const double d = g[i] + wd * w[i];
        m[i] = b1 * m[i] + (1.0 - b1) * d;
        v[i] = b2 * v[i] + (1.0 - b2) * d * d;
        w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + double(eps));
      }
      cpu::adam_step({p.slot()}, adam, step, Tensor());
      EXPECT_EQ(step.item(), static_cast<float>(t));
      EXPECT_LT(relative_error_to(p.master, w), kF32Tolerance) << "eps " << eps << " step " << t;
    }
    EXPECT_LT(relative_error_to(p.exp_avg, m), kF32Tolerance) << "eps " << eps;
    EXPECT_LT(relative_error_to(p.exp_avg_sq, v), kF32Tolerance) << "eps " << eps;
    expect_half_copy(p);
  }
}

// found_inf = 1: nothing changes, not the weights, the state, the f16 copy nor Adam's step.
TEST(CpuOptimizers, SkipEverythingWhenFoundInf) {
  Rng rng(64);
  Param p(rng, {5, 3});
  p.momentum_buffer = random_tensor(rng, {5, 3});
  p.exp_avg = random_tensor(rng, {5, 3});
  p.exp_avg_sq = random_tensor(rng, {5, 3}, DType::f32, Device::cpu, 0.1f, 1.0f);
  p.half = p.master.to(DType::f16); // no NaN poison: the comparison below must be able to pass
  const auto before = p.values();
  SgdParams sgd;
  sgd.momentum = 0.9f;
  sgd.weight_decay = 0.1f;
  cpu::sgd_step({p.slot()}, sgd, flag(1.0f));
  EXPECT_EQ(p.values(), before);

  Tensor step = Tensor::full({1}, 4.0f);
  cpu::adam_step({p.slot()}, AdamParams{}, step, flag(1.0f));
  EXPECT_EQ(p.values(), before);
  EXPECT_EQ(step.item(), 4.0f);

  cpu::adam_step({p.slot()}, AdamParams{}, step, flag(0.0f)); // and a clear flag does step
  EXPECT_EQ(step.item(), 5.0f);
  EXPECT_NE(p.master.to_vector(), before[0]);
}

TEST(CpuOptimizers, RejectMismatchedState) {
  Rng rng(65);
  Param p(rng, {4});
  p.exp_avg_sq = Tensor::zeros({5});
  Tensor step = Tensor::zeros({1});
  expect_error([&] { cpu::adam_step({p.slot()}, AdamParams{}, step, Tensor()); }, "adam_step",
               "exp_avg_sq must be f32 with 4 elements, got f32[5]");
  EXPECT_EQ(step.item(), 0.0f);
  // An f16 copy of another size would be written past its end.
  Param q(rng, {4});
  q.half = Tensor::zeros({3}, DType::f16);
  const std::vector<float> master = q.master.to_vector();
  expect_error([&] { cpu::sgd_step({q.slot()}, SgdParams{}, Tensor()); }, "sgd_step",
               "the f16 copy of f32[4] on cpu must be f16 of the same size, got f16[3] on cpu");
  EXPECT_EQ(q.master.to_vector(), master);
}

TEST(CpuAmpUnscale, MultipliesByInverseScaleAndFlagsInfAndNaN) {
  Rng rng(66);
  const Tensor scale = flag(3.0f); // 1/3 is inexact: the kernel multiplies by 1.0f / 3.0f
  Tensor a = random_tensor(rng, {4, 4}), b = random_tensor(rng, {9});
  const std::vector<float> a0 = a.to_vector(), b0 = b.to_vector();
  Tensor found_inf = flag(0.0f);
  cpu::amp_unscale({&a, &b}, scale, found_inf);
  const float inv = 1.0f / 3.0f;
  for (size_t i = 0; i < a0.size(); ++i) ASSERT_EQ(a.to_vector()[i], a0[i] * inv);
  for (size_t i = 0; i < b0.size(); ++i) ASSERT_EQ(b.to_vector()[i], b0[i] * inv);
  EXPECT_EQ(found_inf.item(), 0.0f);

  // Every value is unscaled all the same, those after the non-finite one too (as PyTorch).
  for (float bad : {INFINITY, -INFINITY, std::nanf("")}) {
    Tensor grad = random_tensor(rng, {6});
    grad.data<float>()[4] = bad;
    const std::vector<float> g0 = grad.to_vector();
    Tensor clean = random_tensor(rng, {3});
    found_inf = flag(0.0f);
    cpu::amp_unscale({&clean, &grad}, scale, found_inf);
    EXPECT_EQ(found_inf.item(), 1.0f) << bad;
    EXPECT_EQ(grad.to_vector()[5], g0[5] * inv) << bad;
  }

  // The unscaled gradient is checked: one that overflows only once unscaled (a scale below 1) is
  // an overflow, where PyTorch, checking the scaled value, would apply the inf.
  Tensor huge = Tensor::from_vector({3e38f}, {1});
  found_inf = flag(0.0f);
  cpu::amp_unscale({&huge}, flag(0.5f), found_inf);
  EXPECT_EQ(found_inf.item(), 1.0f);
  EXPECT_EQ(huge.item(), INFINITY);
  // So is every gradient at a scale whose reciprocal is inf (2^-128): 0 * inf is NaN, a tiny
  // gradient becomes inf. PyTorch would apply them all.
  for (float g : {0.0f, 1e-30f}) {
    Tensor tiny = Tensor::from_vector({g}, {1});
    found_inf = flag(0.0f);
    cpu::amp_unscale({&tiny}, flag(0x1p-128f), found_inf);
    EXPECT_EQ(found_inf.item(), 1.0f) << g;
  }

  Tensor fine = random_tensor(rng, {3});
  found_inf = flag(1.0f); // never reset by the kernel
  cpu::amp_unscale({&fine}, scale, found_inf);
  EXPECT_EQ(found_inf.item(), 1.0f);
}

// The kernel names the problem instead of reading an undefined gradient.
TEST(CpuAmpUnscale, UndefinedGradientIsAnError) {
  Tensor undefined;
  Tensor found_inf = flag(0.0f);
  expect_error([&] { kernels::amp_unscale({&undefined}, flag(2.0f), found_inf); }, "amp_unscale",
               "gradients must be defined f32 tensors, got undefined");
}

TEST(CpuZeroGrads, ZeroesEveryGradientAndRejectsOthers) {
  Rng rng(11);
  Tensor a = random_tensor(rng, {7, 3}), b = random_tensor(rng, {100}), empty = Tensor::zeros({0});
  kernels::zero_grads({&a, &empty, &b});
  EXPECT_EQ(a.to_vector(), std::vector<float>(21, 0.0f));
  EXPECT_EQ(b.to_vector(), std::vector<float>(100, 0.0f));
  Tensor undefined, half_grad = Tensor::zeros({4}, DType::f16);
  expect_error(
      [&] {
        kernels::zero_grads({&a, &undefined});
      },
      "zero_grads", "gradients must be defined f32 tensors, got undefined");
  expect_error([&] { kernels::zero_grads({&half_grad}); }, "zero_grads", "f32");
}

// One amp_update_scale call from (scale, tracker) with the flag; returns the new pair.
std::pair<float, int> update(float scale, int tracker, float found_inf,
                             const ScalerParams& params) {
  Tensor s = flag(scale), t = Tensor::from_vector({static_cast<float>(tracker)}, {1}, DType::i32);
  cpu::amp_update_scale(s, t, flag(found_inf), params);
  return {s.item(), static_cast<int>(t.item())};
}

TEST(CpuAmpUpdateScale, FollowsPyTorchInEveryBranch) {
  ScalerParams params;
  params.growth_factor = 4.0f;
  params.backoff_factor = 0.25f;
  params.growth_interval = 3;
  using Result = std::pair<float, int>;
  // Overflow: back off and restart the count, whatever the count was.
  EXPECT_EQ(update(65536.0f, 2, 1.0f, params), Result(16384.0f, 0));
  // Any non-zero flag is an overflow: update() sums the optimizers' flags, so two give 2.
  EXPECT_EQ(update(65536.0f, 1, 2.0f, params), Result(16384.0f, 0));
  // Clean steps count up to the interval ...
  EXPECT_EQ(update(1024.0f, 0, 0.0f, params), Result(1024.0f, 1));
  EXPECT_EQ(update(1024.0f, 1, 0.0f, params), Result(1024.0f, 2));
  // ... where the scale grows and the count restarts.
  EXPECT_EQ(update(1024.0f, 2, 0.0f, params), Result(4096.0f, 0));
  // Growth to a non-finite scale is refused, but the count restarts all the same.
  EXPECT_EQ(update(3e38f, 2, 0.0f, params), Result(3e38f, 0));
  // PyTorch's defaults: interval 2000, factor 2.
  const ScalerParams defaults = amp::update_params({});
  EXPECT_EQ(update(65536.0f, 1998, 0.0f, defaults), Result(65536.0f, 1999));
  EXPECT_EQ(update(65536.0f, 1999, 0.0f, defaults), Result(131072.0f, 0));
  EXPECT_EQ(update(65536.0f, 1999, 1.0f, defaults), Result(32768.0f, 0));
  // Backoff is its own factor, not the inverse of growth.
  ScalerParams uneven = defaults;
  uneven.backoff_factor = 0.125f;
  EXPECT_EQ(update(65536.0f, 0, 1.0f, uneven), Result(8192.0f, 0));

  Tensor s = flag(1.0f), wrong_tracker = flag(0.0f); // f32, not i32
  expect_error([&] { cpu::amp_update_scale(s, wrong_tracker, flag(0.0f), params); },
               "amp_update_scale", "growth_tracker must be i32");
}

} // namespace
} // namespace minamp::test
