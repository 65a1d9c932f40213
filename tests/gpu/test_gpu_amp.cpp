// GPU tests of the loss scaler and the optimizers: the multi-tensor unscale, the scale update,
// SGD and Adam against the CPU reference, and the skip path (an inf gradient leaves every master,
// moment, f16 copy and step counter untouched and halves the scale), all without host reads
// between the kernels.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "amp/grad_scaler.h"
#include "kernels/kernels.h"
#include "test_util.h"

namespace minamp {
namespace {

using test::expect_close;
using test::random_tensor;
using test::tolerance_for;

Tensor gpu(const Tensor& t) { return t.to(Device::cuda); }

void expect_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  ASSERT_EQ(x.size(), y.size()) << what;
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_TRUE(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))
        << what << ": element " << i << " is " << x[i] << " vs " << y[i];
}

// Sizes that cross the 32768-element chunks of the multi-tensor kernels.
const std::vector<int64_t> kParamSizes = {1, 17, 1000, 32768, 32769, 100000};

// ---- Unscale.

// Unscales `grads` (cpu tensors) by `scale` on both devices and expects every gradient to come
// out the same, bit for bit. Returns found_inf as the GPU and the CPU set it.
std::pair<float, float> unscale_on_both(std::vector<Tensor> grads, float scale) {
  std::vector<Tensor> on_gpu;
  std::vector<Tensor*> cpu_list, gpu_list;
  for (const Tensor& g : grads) on_gpu.push_back(gpu(g));
  for (size_t i = 0; i < grads.size(); ++i) {
    cpu_list.push_back(&grads[i]);
    gpu_list.push_back(&on_gpu[i]);
  }
  const Tensor scale_tensor = Tensor::full({1}, scale);
  Tensor found_inf = Tensor::zeros({1}, DType::f32, Device::cuda);
  Tensor found_inf_ref = Tensor::zeros({1});
  kernels::amp_unscale(gpu_list, gpu(scale_tensor), found_inf);
  kernels::amp_unscale(cpu_list, scale_tensor, found_inf_ref);
  for (size_t i = 0; i < grads.size(); ++i)
    expect_equal(on_gpu[i], grads[i], cat("gradient ", describe(grads[i])));
  return {found_inf.item(), found_inf_ref.item()};
}

TEST(GpuAmp, UnscaleMatchesTheReferenceExactly) {
  MINAMP_REQUIRE_GPU();
  Rng rng(61);
  const float scale = rng.uniform(100.0f, 70000.0f);
  std::vector<Tensor> grads;
  for (int64_t n : kParamSizes)
    grads.push_back(random_tensor(rng, {n}, DType::f32, Device::cpu, -1000.0f, 1000.0f));
  EXPECT_EQ(unscale_on_both(grads, scale), std::pair(0.0f, 0.0f));
}

TEST(GpuAmp, UnscaleFlagsAnyNonFiniteAcrossManyLaunches) {
  MINAMP_REQUIRE_GPU();
  Rng rng(62);
  // 300 gradients of 17 values: more chunks than one launch carries.
  std::vector<Tensor> grads;
  for (int i = 0; i < 300; ++i) grads.push_back(random_tensor(rng, {17}, DType::f32, Device::cuda));
  std::vector<float> last = random_tensor(rng, {17}).to_vector();
  last[16] = INFINITY; // in the last chunk of the last launch
  grads.back() = Tensor::from_vector(last, {17}, DType::f32, Device::cuda);
  std::vector<Tensor*> list;
  for (Tensor& g : grads) list.push_back(&g);
  Tensor found_inf = Tensor::zeros({1}, DType::f32, Device::cuda);
  kernels::amp_unscale(list, gpu(Tensor::full({1}, 2.0f)), found_inf);
  EXPECT_EQ(found_inf.item(), 1.0f);

  // found_inf is never reset, even when a later unscale sees only finite values.
  std::vector<Tensor*> finite_only(list.begin(), list.end() - 1);
  kernels::amp_unscale(finite_only, gpu(Tensor::full({1}, 2.0f)), found_inf);
  EXPECT_EQ(found_inf.item(), 1.0f);
}

// NaN counts as well as inf, here at the very end of one gradient that needs two launches by
// itself (241 chunks), so the second launch must continue at the right offset.
TEST(GpuAmp, UnscaleFlagsNaNAtTheEndOfAGradientSpanningLaunches) {
  MINAMP_REQUIRE_GPU();
  Rng rng(63);
  const int64_t n = 240 * 32768 + 5;
  std::vector<float> values = random_tensor(rng, {n}).to_vector();
  values.back() = NAN;
  EXPECT_EQ(unscale_on_both({Tensor::from_vector(values, {n})}, 1024.0f), std::pair(1.0f, 1.0f));
}

// An inf or NaN early in a gradient does not stop the unscaling of the values after it (the
// CPU reference and PyTorch unscale every element).
TEST(GpuAmp, UnscaleGoesOnPastANonFiniteValue) {
  MINAMP_REQUIRE_GPU();
  Rng rng(64);
  std::vector<Tensor> grads;
  for (int64_t n : kParamSizes) {
    std::vector<float> values = random_tensor(rng, {n}).to_vector();
    values[0] = n % 2 == 0 ? INFINITY : NAN;
    grads.push_back(Tensor::from_vector(values, {n}));
  }
  EXPECT_EQ(unscale_on_both(grads, 1024.0f), std::pair(1.0f, 1.0f));
}

TEST(GpuAmp, UnscaleWithNoGradientsOrEmptyGradients) {
  MINAMP_REQUIRE_GPU();
  Tensor empty = Tensor::empty({0}, DType::f32, Device::cuda);
  Tensor found_inf = Tensor::zeros({1}, DType::f32, Device::cuda);
  kernels::amp_unscale({}, gpu(Tensor::full({1}, 2.0f)), found_inf);
  kernels::amp_unscale({&empty}, gpu(Tensor::full({1}, 2.0f)), found_inf);
  EXPECT_EQ(found_inf.item(), 0.0f);
}

// ---- zero_grad: many gradients, one of them longer than a chunk and some launches' worth of
// chunks in all, each set to exactly zero; the empty one is skipped.
TEST(GpuOptim, ZeroGradsClearsEveryGradient) {
  MINAMP_REQUIRE_GPU();
  Rng rng(12);
  std::vector<Tensor> grads;
  for (int64_t size : {1, 33, 32768, 100000, 0})
    grads.push_back(test::random_tensor(rng, {size}, DType::f32, Device::cuda));
  for (int i = 0; i < 300; ++i) // 300 more chunks: more than one launch's list
    grads.push_back(test::random_tensor(rng, {1000}, DType::f32, Device::cuda));
  std::vector<Tensor*> pointers;
  for (Tensor& g : grads) pointers.push_back(&g);
  kernels::zero_grads(pointers);
  for (const Tensor& g : grads)
    EXPECT_EQ(g.to_vector(), std::vector<float>(size_t(g.numel()), 0.0f)) << describe(g);
}

// ---- Scale update.

TEST(GpuAmp, UnscaleChecksTheUnscaledGradient) {
  MINAMP_REQUIRE_GPU();
  // Finite before unscaling, inf after (a scale below 1): an overflow, as on the CPU (PyTorch
  // checks the scaled value and would apply the inf).
  Tensor grad = gpu(Tensor::from_vector({1.0f, 3e38f, -2.0f}, {3}));
  std::vector<Tensor*> grads{&grad};
  Tensor found_inf = Tensor::zeros({1}, DType::f32, Device::cuda);
  kernels::amp_unscale(grads, gpu(Tensor::full({1}, 0.5f)), found_inf);
  EXPECT_EQ(found_inf.item(), 1.0f);
  EXPECT_EQ(grad.to_vector(), (std::vector<float>{2.0f, INFINITY, -4.0f}));
  // At a scale whose reciprocal is inf (2^-128) even a zero gradient is one (0 * inf is NaN).
  Tensor zero = Tensor::zeros({3}, DType::f32, Device::cuda);
  std::vector<Tensor*> zeros{&zero};
  found_inf = Tensor::zeros({1}, DType::f32, Device::cuda);
  kernels::amp_unscale(zeros, gpu(Tensor::full({1}, 0x1p-128f)), found_inf);
  EXPECT_EQ(found_inf.item(), 1.0f);
}

TEST(GpuAmp, UpdateScaleFollowsPyTorchStepByStep) {
  MINAMP_REQUIRE_GPU();
  // The default factors, then others (so a kernel that ignores them fails).
  for (const ScalerParams& scaler : {ScalerParams{2.0f, 0.5f, 3}, ScalerParams{4.0f, 0.25f, 3}}) {
    Tensor scale = gpu(Tensor::full({1}, 1024.0f));
    Tensor tracker = gpu(Tensor::zeros({1}, DType::i32));
    Tensor scale_ref = Tensor::full({1}, 1024.0f);
    Tensor tracker_ref = Tensor::zeros({1}, DType::i32);
    float expected = 1024.0f; // PyTorch's rule, step by step
    int clean = 0;
    // good, good, good (grow), inf (back off), good, inf in two optimizers (their flags summed:
    // back off), good x3 (grow)
    for (float inf : {0.f, 0.f, 0.f, 1.f, 0.f, 2.f, 0.f, 0.f, 0.f}) {
      const Tensor found_inf = Tensor::full({1}, inf);
      kernels::amp_update_scale(scale, tracker, gpu(found_inf), scaler);
      kernels::amp_update_scale(scale_ref, tracker_ref, found_inf, scaler);
      clean = inf != 0.f ? 0 : (clean + 1) % scaler.growth_interval;
      expected *= inf != 0.f ? scaler.backoff_factor : clean == 0 ? scaler.growth_factor : 1.0f;
      EXPECT_EQ(scale.item(), expected);
      EXPECT_EQ(scale_ref.item(), expected);
      EXPECT_EQ(tracker.item(), float(clean));
      EXPECT_EQ(tracker_ref.item(), float(clean));
    }
  }
}

TEST(GpuAmp, UpdateScaleNeverGrowsToInfinity) {
  MINAMP_REQUIRE_GPU();
  // The refused growth still ends the interval: the tracker restarts at 0, as PyTorch's.
  const ScalerParams scaler{2.0f, 0.5f, 3};
  Tensor scale = gpu(Tensor::full({1}, FLT_MAX));
  Tensor tracker = gpu(Tensor::full({1}, 2.0f, DType::i32));
  kernels::amp_update_scale(scale, tracker, gpu(Tensor::zeros({1})), scaler);
  EXPECT_EQ(scale.item(), FLT_MAX);
  EXPECT_EQ(tracker.item(), 0.0f);
}

// Nor is there a floor: backing off goes below 1, as PyTorch's does.
TEST(GpuAmp, UpdateScaleBacksOffBelowOne) {
  MINAMP_REQUIRE_GPU();
  Tensor scale = gpu(Tensor::full({1}, 1.0f));
  Tensor tracker = gpu(Tensor::zeros({1}, DType::i32));
  for (float expected : {0.5f, 0.25f}) {
    kernels::amp_update_scale(scale, tracker, gpu(Tensor::full({1}, 1.0f)), amp::update_params({}));
    EXPECT_EQ(scale.item(), expected);
  }
}

// ---- Optimizers.

// One parameter on both devices: master, gradient, optional f16 copy, the optimizers' states.
struct ParamPair {
  Tensor master, grad, half, momentum_buffer, exp_avg, exp_avg_sq;             // cpu
  Tensor g_master, g_grad, g_half, g_momentum_buffer, g_exp_avg, g_exp_avg_sq; // cuda

  ParamPair(Rng& rng, int64_t n, bool with_half) {
    master = random_tensor(rng, {n});
    grad = random_tensor(rng, {n});
    momentum_buffer = Tensor::zeros({n});
    exp_avg = Tensor::zeros({n});
    exp_avg_sq = Tensor::zeros({n});
    if (with_half) half = master.to(DType::f16);
    g_master = gpu(master);
    g_grad = gpu(grad);
    g_momentum_buffer = gpu(momentum_buffer);
    g_exp_avg = gpu(exp_avg);
    g_exp_avg_sq = gpu(exp_avg_sq);
    if (with_half) g_half = test::poisoned({n}, DType::f16, Device::cuda);
  }
  ParamSlot cpu_slot() { return {&master, &grad, &half, &momentum_buffer, &exp_avg, &exp_avg_sq}; }
  ParamSlot gpu_slot() {
    return {&g_master, &g_grad, &g_half, &g_momentum_buffer, &g_exp_avg, &g_exp_avg_sq};
  }
  // New gradients for the next step, the same on both devices.
  void regrad(Rng& rng) {
    grad = random_tensor(rng, grad.shape());
    g_grad = gpu(grad);
  }
};

// kParamSizes, then 90 small parameters of a chunk each: 100 chunks in all, more than one launch's
// list of 80 (cuda/optim.cu), so a list carried badly into the next launch shows.
std::vector<ParamPair> make_params(Rng& rng) {
  std::vector<ParamPair> params;
  for (size_t i = 0; i < kParamSizes.size(); ++i)
    params.emplace_back(rng, kParamSizes[i], /*with_half=*/i % 2 == 0);
  for (int i = 0; i < 90; ++i) params.emplace_back(rng, 5 + i % 3, /*with_half=*/i % 2 == 0);
  return params;
}

void expect_params_match(std::vector<ParamPair>& params, bool with_states,
                         const std::string& what) {
  const double tol = tolerance_for(DType::f32);
  for (ParamPair& p : params) {
    const std::string name = cat(what, " ", describe(p.master));
    expect_close(p.g_master, p.master, tol, name + " master");
    if (with_states) {
      expect_close(p.g_momentum_buffer, p.momentum_buffer, tol, name + " momentum_buffer");
      expect_close(p.g_exp_avg, p.exp_avg, tol, name + " exp_avg");
      expect_close(p.g_exp_avg_sq, p.exp_avg_sq, tol, name + " exp_avg_sq");
    }
    // The f16 copy is the GPU's own master rounded to nearest even, bit for bit.
    if (p.half.defined())
      expect_equal(p.g_half, p.g_master.to(Device::cpu).to(DType::f16), name + " half");
  }
}

TEST(GpuOptim, SgdMatchesTheReference) {
  MINAMP_REQUIRE_GPU();
  for (float momentum : {0.0f, 0.9f}) {
    Rng rng(71);
    std::vector<ParamPair> params = make_params(rng);
    const SgdParams sgd{0.05f, momentum, 1e-3f};
    const Tensor found_inf = Tensor::zeros({1});
    for (int step = 0; step < 3; ++step) {
      std::vector<ParamSlot> cpu_slots, gpu_slots;
      for (ParamPair& p : params) {
        cpu_slots.push_back(p.cpu_slot());
        gpu_slots.push_back(p.gpu_slot());
      }
      kernels::sgd_step(gpu_slots, sgd, gpu(found_inf));
      kernels::sgd_step(cpu_slots, sgd, found_inf);
      expect_params_match(params, momentum != 0.0f, cat("sgd momentum ", momentum, " step ", step));
      for (ParamPair& p : params) p.regrad(rng);
    }
  }
}

// The f16 copy of a master past f16's range is inf (65520 and up round away), and of a NaN
// master NaN, as the CPU reference rounds them: nothing saturates to 65504.
TEST(GpuOptim, TheF16CopyOfAMasterOutOfRangeIsInfOrNaN) {
  MINAMP_REQUIRE_GPU();
  const std::vector<float> values = {70000.0f, -70000.0f, 65519.0f, 65520.0f, NAN, 1.0f};
  const Shape shape{int64_t(values.size())};
  Tensor master = Tensor::from_vector(values, shape), grad = Tensor::zeros(shape);
  Tensor half = Tensor::empty(shape, DType::f16);
  Tensor g_master = gpu(master), g_grad = gpu(grad);
  Tensor g_half = test::poisoned(shape, DType::f16, Device::cuda);
  const SgdParams sgd{0.1f, 0.0f, 0.0f};
  kernels::sgd_step({{&g_master, &g_grad, &g_half}}, sgd, Tensor());
  kernels::sgd_step({{&master, &grad, &half}}, sgd, Tensor());
  expect_equal(g_half, half, "f16 copies");
  EXPECT_EQ(half.to_vector()[0], INFINITY);
  EXPECT_EQ(half.to_vector()[2], 65504.0f);
  EXPECT_TRUE(std::isnan(half.to_vector()[4]));
}

TEST(GpuOptim, SgdWithUndefinedFoundInfAlwaysSteps) {
  MINAMP_REQUIRE_GPU();
  Rng rng(72);
  std::vector<ParamPair> params = make_params(rng);
  std::vector<ParamSlot> cpu_slots, gpu_slots;
  for (ParamPair& p : params) {
    cpu_slots.push_back(p.cpu_slot());
    gpu_slots.push_back(p.gpu_slot());
  }
  const SgdParams sgd{0.1f, 0.0f, 0.0f};
  kernels::sgd_step(gpu_slots, sgd, Tensor());
  kernels::sgd_step(cpu_slots, sgd, Tensor());
  expect_params_match(params, false, "sgd without found_inf");
  // A found_inf of another dtype or size is refused, not read as one float.
  for (const Tensor& bad : {gpu(Tensor::zeros({2})), gpu(Tensor::zeros({1}, DType::i32))})
    test::expect_error([&] { kernels::sgd_step(gpu_slots, sgd, bad); }, "sgd_step",
                       "found_inf must be f32 with 1 elements");
}

TEST(GpuOptim, AdamMatchesTheReference) {
  MINAMP_REQUIRE_GPU();
  Rng rng(73);
  std::vector<ParamPair> params = make_params(rng);
  const AdamParams adam{1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f};
  Tensor step = gpu(Tensor::zeros({1}));
  Tensor step_ref = Tensor::zeros({1});
  const Tensor found_inf = Tensor::zeros({1});
  for (int i = 0; i < 3; ++i) {
    std::vector<ParamSlot> cpu_slots, gpu_slots;
    for (ParamPair& p : params) {
      cpu_slots.push_back(p.cpu_slot());
      gpu_slots.push_back(p.gpu_slot());
    }
    kernels::adam_step(gpu_slots, adam, step, gpu(found_inf));
    kernels::adam_step(cpu_slots, adam, step_ref, found_inf);
    expect_params_match(params, true, cat("adam step ", i));
    EXPECT_EQ(step.item(), step_ref.item());
    for (ParamPair& p : params) p.regrad(rng);
  }
  EXPECT_EQ(step.item(), 3.0f);
}

// The scaler's skip path end to end on the device: unscale finds an inf gradient, both
// optimizers leave every tensor untouched, and the scale update halves the scale.
TEST(GpuOptim, OverflowSkipsTheStepAndBacksOffTheScale) {
  MINAMP_REQUIRE_GPU();
  Rng rng(74);
  std::vector<ParamPair> params = make_params(rng);
  for (ParamPair& p : params) {
    p.g_momentum_buffer = gpu(random_tensor(rng, p.master.shape()));
    p.g_exp_avg = gpu(random_tensor(rng, p.master.shape()));
    p.g_exp_avg_sq = gpu(random_tensor(rng, p.master.shape(), DType::f32, Device::cpu, 0.0f, 1.0f));
    if (p.half.defined()) p.g_half = gpu(p.half);
  }
  std::vector<float> bad = params[2].grad.to_vector();
  bad[bad.size() / 2] = INFINITY;
  params[2].g_grad = Tensor::from_vector(bad, params[2].grad.shape(), DType::f32, Device::cuda);

  // Snapshots to compare against after the skipped steps.
  struct Snapshot {
    Tensor master, half, momentum_buffer, exp_avg, exp_avg_sq;
  };
  std::vector<Snapshot> before;
  for (ParamPair& p : params)
    before.push_back({p.g_master.clone(), p.g_half.defined() ? p.g_half.clone() : Tensor(),
                      p.g_momentum_buffer.clone(), p.g_exp_avg.clone(), p.g_exp_avg_sq.clone()});

  std::vector<Tensor*> grads;
  std::vector<ParamSlot> slots;
  for (ParamPair& p : params) {
    grads.push_back(&p.g_grad);
    slots.push_back(p.gpu_slot());
  }
  Tensor scale = gpu(Tensor::full({1}, 65536.0f));
  Tensor tracker = gpu(Tensor::full({1}, 5.0f, DType::i32));
  Tensor found_inf = Tensor::zeros({1}, DType::f32, Device::cuda);
  Tensor step = gpu(Tensor::full({1}, 7.0f));

  kernels::amp_unscale(grads, scale, found_inf);
  kernels::sgd_step(slots, SgdParams{0.1f, 0.9f, 1e-3f}, found_inf);
  kernels::adam_step(slots, AdamParams{}, step, found_inf);
  kernels::amp_update_scale(scale, tracker, found_inf, amp::update_params({}));

  EXPECT_EQ(found_inf.item(), 1.0f);
  EXPECT_EQ(step.item(), 7.0f);
  EXPECT_EQ(scale.item(), 32768.0f);
  EXPECT_EQ(tracker.item(), 0.0f);
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string name = cat(describe(params[i].master));
    expect_equal(params[i].g_master, before[i].master, name + " master");
    expect_equal(params[i].g_momentum_buffer, before[i].momentum_buffer, name + " momentum");
    expect_equal(params[i].g_exp_avg, before[i].exp_avg, name + " exp_avg");
    expect_equal(params[i].g_exp_avg_sq, before[i].exp_avg_sq, name + " exp_avg_sq");
    if (before[i].half.defined()) expect_equal(params[i].g_half, before[i].half, name + " half");
  }
}

} // namespace
} // namespace minamp
