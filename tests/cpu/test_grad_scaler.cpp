// GradScaler with PyTorch's semantics, branch by branch: scale and unscale, overflow (inf and
// NaN) skipping the step and backing off, growth exactly at the interval, the per-optimizer stage
// machine and its errors, unscale before clipping, several optimizers, state_dict with PyTorch's
// keys, enabled = false, and the options it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <iterator>

#include "amp/grad_scaler.h"
#include "amp_problem.h"
#include "optim/optimizer.h"

namespace minamp {
namespace {

using test::expect_error;
using test::Problem;

// torch.amp.GradScaler()'s defaults: init_scale 2^16, growth 2, backoff 0.5, interval 2000.
TEST(GradScaler, DefaultsArePyTorchs) {
  const amp::GradScalerState state = *amp::GradScaler().state_dict();
  EXPECT_EQ(state.scale, 65536.0f);
  EXPECT_EQ(state.growth_factor, 2.0f);
  EXPECT_EQ(state.backoff_factor, 0.5f);
  EXPECT_EQ(state.growth_interval, 2000);
  EXPECT_EQ(state.growth_tracker, 0);
}

TEST(GradScaler, ScaleMultipliesTheLossByTheInitialScale) {
  amp::GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0f);
  const Var loss(Tensor::full({1}, 0.25f));
  EXPECT_EQ(scaler.scale(loss).value().item(), 0.25f * 65536.0f);
}

// The FP32 backward of `plain`, and the backward of `scaled`'s loss (under autocast with `amp`)
// times the scale, whose gradients `opt` holds, followed by unscale_.
void plain_and_unscaled_backward(Problem& plain, Problem& scaled, optim::Optimizer& opt,
                                 amp::GradScaler& scaler, bool amp) {
  plain.model.zero_grad();
  scaled.model.zero_grad();
  plain.loss(false).backward();
  scaler.scale(scaled.loss(amp)).backward();
  scaler.unscale_(opt);
}

TEST(GradScaler, UnscaledGradientsEqualTheFp32Gradients) {
  Problem a, b;
  optim::SGD opt_b(b.model.parameters(), 0.1f);
  amp::GradScaler scaler;
  plain_and_unscaled_backward(a, b, opt_b, scaler, false);
  for (size_t i = 0; i < a.model.parameters().size(); ++i)
    EXPECT_LT(
        test::relative_error(b.model.parameters()[i]->grad(), a.model.parameters()[i]->grad()),
        1e-6);
}

// Under autocast the activations and weight copies are f16 (about 5e-4 relative rounding each),
// so unscaled AMP gradients match FP32 ones to about 1e-3 (checked against 1e-2); an f16 backward
// that dropped a term or a scale would be off by far more.
TEST(GradScaler, UnscaledAmpGradientsAreCloseToTheFp32Gradients) {
  Problem fp32, amp;
  optim::SGD opt(amp.model.parameters(), 0.1f);
  amp::GradScaler scaler;
  plain_and_unscaled_backward(fp32, amp, opt, scaler, true);
  for (size_t i = 0; i < fp32.model.parameters().size(); ++i) {
    const Tensor& g_amp = amp.model.parameters()[i]->grad();
    const Tensor& g_fp32 = fp32.model.parameters()[i]->grad();
    EXPECT_NE(g_amp.to_vector(), g_fp32.to_vector()) << "parameter " << i << ": not f16 math";
    EXPECT_LT(test::relative_error(g_amp, g_fp32), 1e-2) << "parameter " << i;
  }
}

TEST(GradScaler, OverflowSkipsTheStepAndBacksOff) {
  Problem p;
  optim::Adam adam(p.model.parameters(), 0.01f);
  amp::GradScaler scaler;
  p.model.zero_grad();
  scaler.scale(p.loss(true)).backward();
  kernels::fill(p.model.parameters()[0]->grad(), INFINITY); // an overflowed gradient
  std::vector<Tensor*> state;
  for (auto& [name, t] : adam.named_state()) state.push_back(t);
  std::vector<std::vector<float>> state_before;
  for (Tensor* t : state) state_before.push_back(t->to_vector());
  const std::vector<float> params_before = p.flat_parameters();
  std::vector<std::vector<float>> copies_before; // weights have f16 copies; biases stay fp32
  for (Parameter* param : p.model.parameters())
    if (param->half_copy().defined()) copies_before.push_back(param->half_copy().to_vector());
  ASSERT_EQ(copies_before.size(), 2u);

  scaler.step(adam);
  scaler.update();
  EXPECT_TRUE(scaler.step_was_skipped(adam));
  EXPECT_EQ(p.flat_parameters(), params_before);
  for (size_t i = 0; i < state.size(); ++i) EXPECT_EQ(state[i]->to_vector(), state_before[i]);
  EXPECT_EQ(p.model.parameters()[0]->half_copy().to_vector(), copies_before[0]);
  EXPECT_EQ(p.model.parameters()[2]->half_copy().to_vector(), copies_before[1]);
  EXPECT_EQ(adam.step_count(), 0);
  EXPECT_EQ(scaler.get_scale(), 32768.0f);
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 0);
}

TEST(GradScaler, NanAlsoCountsAsOverflow) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.1f);
  amp::GradScaler scaler;
  p.model.zero_grad();
  scaler.scale(p.loss(true)).backward();
  kernels::fill(p.model.parameters()[1]->grad(), NAN);
  scaler.step(sgd);
  scaler.update();
  EXPECT_TRUE(scaler.step_was_skipped(sgd));
  EXPECT_EQ(scaler.get_scale(), 32768.0f);
}

// PyTorch's defaults except the initial scale and the growth interval.
amp::GradScalerOptions options_with(float init_scale, int growth_interval) {
  amp::GradScalerOptions options;
  options.init_scale = init_scale;
  options.growth_interval = growth_interval;
  return options;
}

// Runs `n` clean steps of `p` with `scaler`.
void clean_steps(Problem& p, optim::Optimizer& opt, amp::GradScaler& scaler, int n) {
  for (int i = 0; i < n; ++i) {
    opt.zero_grad();
    scaler.scale(p.loss(true)).backward();
    scaler.step(opt);
    scaler.update();
    ASSERT_FALSE(scaler.step_was_skipped(opt));
  }
}

TEST(GradScaler, GrowsExactlyAfterGrowthIntervalCleanSteps) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.01f);
  amp::GradScaler scaler(options_with(1024.0f, 3));
  clean_steps(p, sgd, scaler, 2);
  EXPECT_EQ(scaler.get_scale(), 1024.0f);
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 2);
  clean_steps(p, sgd, scaler, 1);
  EXPECT_EQ(scaler.get_scale(), 2048.0f);
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 0);
  clean_steps(p, sgd, scaler, 3);
  EXPECT_EQ(scaler.get_scale(), 4096.0f);
}

TEST(GradScaler, OverflowResetsTheGrowthCount) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.01f);
  amp::GradScaler scaler(options_with(1024.0f, 3));
  clean_steps(p, sgd, scaler, 2);
  sgd.zero_grad();
  scaler.scale(p.loss(true)).backward();
  kernels::fill(p.model.parameters()[0]->grad(), -INFINITY);
  scaler.step(sgd);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0f);
  clean_steps(p, sgd, scaler, 2);
  EXPECT_EQ(scaler.get_scale(), 512.0f) << "two clean steps after a reset are not three";
  clean_steps(p, sgd, scaler, 1);
  EXPECT_EQ(scaler.get_scale(), 1024.0f);
}

TEST(GradScaler, GrowthIsRefusedWhenTheGrownScaleWouldBeInfinite) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.0f);
  amp::GradScaler scaler(options_with(3e38f, 1)); // 3e38 is finite; 6e38 is not
  // Gradients must stay finite at this scale: use a zero loss (exact zero gradients).
  sgd.zero_grad();
  scaler.scale(ops::mul_scalar(p.loss(false), Tensor::zeros({1}))).backward();
  scaler.step(sgd);
  scaler.update();
  EXPECT_FALSE(scaler.step_was_skipped(sgd));
  EXPECT_EQ(scaler.get_scale(), 3e38f);
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 0);
}

TEST(GradScaler, ExplicitNewScale) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.01f);
  amp::GradScaler scaler;
  clean_steps(p, sgd, scaler, 1);
  sgd.zero_grad();
  scaler.scale(p.loss(true)).backward();
  scaler.step(sgd);
  scaler.update(100.0f);
  EXPECT_EQ(scaler.get_scale(), 100.0f);
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 1) << "update(new_scale) keeps the tracker";
  clean_steps(p, sgd, scaler, 1); // update(new_scale) ends the iteration too: step() may follow
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 2);
}

TEST(GradScaler, StageErrorsMatchPyTorch) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.01f);
  amp::GradScaler scaler;
  expect_error([&] { scaler.update(); }, "no inf checks were recorded");
  scaler.scale(p.loss(true)).backward();
  scaler.unscale_(sgd);
  expect_error([&] { scaler.unscale_(sgd); }, "already been called");
  scaler.step(sgd);
  expect_error([&] { scaler.step(sgd); }, "step() has already been called");
  expect_error([&] { scaler.unscale_(sgd); }, "after step()");
  scaler.update();
  sgd.zero_grad();
  scaler.scale(p.loss(true)).backward();
  scaler.step(sgd); // a fresh iteration is allowed again
  scaler.update();
}

TEST(GradScaler, AnUnscaleThatFailedRecordsNoInfCheck) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.01f);
  amp::GradScaler scaler;
  scaler.scale(p.loss(true)).backward();
  p.model.parameters()[1]->grad() = Tensor(); // amp_unscale refuses an undefined gradient
  expect_error([&] { scaler.unscale_(sgd); },
               "gradients must be defined f32 tensors, got undefined");
  // As in PyTorch, where the optimizer's found_inf is only recorded once unscaling succeeded:
  // update() has nothing to decide on, rather than growing the scale on an unset flag.
  expect_error([&] { scaler.update(); }, "no inf checks were recorded");
  EXPECT_EQ(scaler.get_scale(), 65536.0f);
}

TEST(GradScaler, UnscaleThenClipUsesUnscaledNorms) {
  Problem a, b;
  optim::SGD opt_b(b.model.parameters(), 0.1f);
  amp::GradScaler scaler;
  plain_and_unscaled_backward(a, b, opt_b, scaler, false);
  const float max_norm = 0.01f;
  const float sq_a = optim::clip_grad_norm_(a.model.parameters(), max_norm).item();
  const float sq_b = optim::clip_grad_norm_(b.model.parameters(), max_norm).item();
  EXPECT_NEAR(sq_b, sq_a, 1e-5 * sq_a);
  // PyTorch's coefficient max_norm / (norm + 1e-6) leaves a norm a little under max_norm.
  const double norm = std::sqrt(double(sq_b));
  double clipped = 0;
  for (Parameter* param : b.model.parameters())
    for (float g : param->grad().to_vector()) clipped += double(g) * g;
  EXPECT_NEAR(std::sqrt(clipped), max_norm * norm / (norm + 1e-6), 1e-6 * max_norm);

  // step() does not unscale a second time: SGD moves by lr times the clipped gradients.
  const std::vector<float> before = b.flat_parameters();
  std::vector<float> grads;
  for (Parameter* param : b.model.parameters())
    for (float g : param->grad().to_vector()) grads.push_back(g);
  scaler.step(opt_b);
  scaler.update();
  const std::vector<float> after = b.flat_parameters();
  ASSERT_EQ(after.size(), grads.size());
  for (size_t i = 0; i < grads.size(); ++i)
    EXPECT_NEAR(after[i], before[i] - 0.1f * grads[i], 1e-7f + 1e-6f * std::abs(before[i])) << i;
}

TEST(GradScaler, EachOptimizerSkipsOnItsOwnOverflowAndUpdateCombinesThem) {
  Problem p;
  auto params = p.model.parameters();
  optim::SGD first({params[0], params[1]}, 0.1f), second({params[2], params[3]}, 0.1f);
  amp::GradScaler scaler;
  p.model.zero_grad();
  scaler.scale(p.loss(true)).backward();
  kernels::fill(params[0]->grad(), INFINITY);
  const std::vector<float> w0 = params[0]->master().to_vector();
  const std::vector<float> w2 = params[2]->master().to_vector();
  scaler.step(first);
  scaler.step(second);
  scaler.update();
  EXPECT_TRUE(scaler.step_was_skipped(first));
  EXPECT_FALSE(scaler.step_was_skipped(second));
  EXPECT_EQ(params[0]->master().to_vector(), w0);
  EXPECT_NE(params[2]->master().to_vector(), w2);
  EXPECT_EQ(scaler.get_scale(), 32768.0f);

  // Both overflow: the combined flag is 2, one back-off all the same (as PyTorch's sum).
  p.model.zero_grad();
  scaler.scale(p.loss(true)).backward();
  kernels::fill(params[0]->grad(), INFINITY);
  kernels::fill(params[2]->grad(), NAN);
  const std::vector<float> w2_now = params[2]->master().to_vector();
  scaler.step(first);
  scaler.step(second);
  scaler.update();
  EXPECT_TRUE(scaler.step_was_skipped(first));
  EXPECT_TRUE(scaler.step_was_skipped(second));
  EXPECT_EQ(params[2]->master().to_vector(), w2_now);
  EXPECT_EQ(scaler.get_scale(), 16384.0f);

  // Only the second overflows: with the first, whichever of the two the scaler holds first is
  // once the clean one, whose own flag update() must leave alone when it combines them.
  p.model.zero_grad();
  scaler.scale(p.loss(true)).backward();
  kernels::fill(params[2]->grad(), INFINITY);
  scaler.step(first);
  scaler.step(second);
  scaler.update();
  EXPECT_FALSE(scaler.step_was_skipped(first));
  EXPECT_TRUE(scaler.step_was_skipped(second));
  EXPECT_EQ(scaler.get_scale(), 8192.0f);
}

// PyTorch's update() counts every optimizer that was unscaled, stepped or not.
TEST(GradScaler, UpdateCountsAnOptimizerThatWasOnlyUnscaled) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.1f);
  amp::GradScaler scaler(options_with(1024.0f, 2));
  expect_error([&] { scaler.found_inf(sgd); }, "GradScaler::found_inf", "has not been unscaled");
  const std::vector<float> before = p.flat_parameters();
  for (float injected : {1.0f, INFINITY}) {
    sgd.zero_grad();
    scaler.scale(p.loss(true)).backward();
    kernels::fill(p.model.parameters()[3]->grad(), injected);
    scaler.unscale_(sgd);
    EXPECT_EQ(scaler.found_inf(sgd).item(), std::isinf(injected) ? 1.0f : 0.0f);
    scaler.update(); // no step
  }
  EXPECT_EQ(p.flat_parameters(), before);
  EXPECT_EQ(scaler.get_scale(), 512.0f) << "the overflow seen by unscale_ alone backs off";
  EXPECT_EQ(scaler.state_dict()->growth_tracker, 0);
  EXPECT_TRUE(scaler.step_was_skipped(sgd));
}

TEST(GradScaler, StepWasSkippedIsKnownBetweenStepAndUpdate) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.1f);
  amp::GradScaler scaler;
  EXPECT_FALSE(scaler.step_was_skipped(sgd)) << "no step yet";
  scaler.scale(p.loss(true)).backward();
  kernels::fill(p.model.parameters()[0]->grad(), NAN);
  scaler.step(sgd);
  EXPECT_TRUE(scaler.step_was_skipped(sgd));
  EXPECT_EQ(scaler.get_scale(), 65536.0f) << "the scale changes only in update()";
  scaler.update();
  EXPECT_TRUE(scaler.step_was_skipped(sgd));
  // Unscaled but not stepped yet: the last step is still the skipped one.
  p.model.zero_grad();
  scaler.scale(p.loss(true)).backward();
  scaler.unscale_(sgd);
  EXPECT_TRUE(scaler.step_was_skipped(sgd)) << "a clean unscale_ is not a step";
  scaler.step(sgd);
  EXPECT_FALSE(scaler.step_was_skipped(sgd));
  scaler.update();
  clean_steps(p, sgd, scaler, 1);
  EXPECT_FALSE(scaler.step_was_skipped(sgd));
}

TEST(GradScaler, StateDictRoundTripsWithPyTorchsFields) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.01f);
  amp::GradScalerOptions options;
  options.init_scale = 256.0f;
  options.growth_interval = 10;
  options.growth_factor = 4.0f;
  options.backoff_factor = 0.25f;
  amp::GradScaler scaler(options);
  clean_steps(p, sgd, scaler, 3);
  const amp::GradScalerState saved = *scaler.state_dict();
  EXPECT_EQ(saved.scale, 256.0f);
  EXPECT_EQ(saved.growth_tracker, 3);
  EXPECT_EQ(saved.growth_factor, 4.0f);
  EXPECT_EQ(saved.backoff_factor, 0.25f);
  EXPECT_EQ(saved.growth_interval, 10);

  amp::GradScaler restored;
  restored.load_state_dict(saved);
  const amp::GradScalerState again = *restored.state_dict();
  EXPECT_EQ(again.scale, saved.scale);
  EXPECT_EQ(again.growth_tracker, saved.growth_tracker);
  EXPECT_EQ(again.growth_interval, saved.growth_interval);
  EXPECT_EQ(again.growth_factor, saved.growth_factor);
  EXPECT_EQ(again.backoff_factor, saved.backoff_factor);

  amp::GradScalerOptions off;
  off.enabled = false;
  amp::GradScaler disabled(off);
  EXPECT_FALSE(disabled.state_dict().has_value());
  expect_error([&] { restored.load_state_dict(std::nullopt); }, "disabled GradScaler");
}

// A disabled scaler leaves everything to the optimizer: no unscaling, no scale to set or load.
TEST(GradScaler, DisabledPassesEveryCallThrough) {
  Problem p;
  optim::SGD sgd(p.model.parameters(), 0.1f);
  amp::GradScalerOptions off;
  off.enabled = false;
  amp::GradScaler scaler(off);
  p.model.zero_grad();
  scaler.scale(p.loss(false)).backward();
  std::vector<std::vector<float>> grads;
  for (Parameter* param : p.model.parameters()) grads.push_back(param->grad().to_vector());
  scaler.unscale_(sgd);
  scaler.unscale_(sgd); // no stage machine either
  for (size_t i = 0; i < grads.size(); ++i)
    EXPECT_EQ(p.model.parameters()[i]->grad().to_vector(), grads[i]) << "parameter " << i;
  scaler.update(100.0f);
  scaler.load_state_dict(amp::GradScalerState{});
  EXPECT_EQ(scaler.get_scale(), 1.0f);
  EXPECT_FALSE(scaler.step_was_skipped(sgd));
}

TEST(GradScaler, DisabledIsExactlyFp32Training) {
  Problem a, b;
  optim::Adam opt_a(a.model.parameters(), 0.01f), opt_b(b.model.parameters(), 0.01f);
  amp::GradScalerOptions off;
  off.enabled = false;
  amp::GradScaler scaler(off);
  for (int step = 0; step < 5; ++step) {
    opt_a.zero_grad();
    a.loss(false).backward();
    opt_a.step();

    opt_b.zero_grad();
    scaler.scale(b.loss(false)).backward();
    scaler.step(opt_b);
    scaler.update();
  }
  EXPECT_EQ(a.flat_parameters(), b.flat_parameters()) << "bit for bit";
  EXPECT_EQ(scaler.get_scale(), 1.0f);
}

TEST(GradScaler, RejectsInvalidOptions) {
  amp::GradScalerOptions bad;
  bad.growth_factor = 1.0f;
  expect_error([&] { amp::GradScaler s(bad); }, "growth_factor");
  bad = {};
  bad.backoff_factor = 1.5f;
  expect_error([&] { amp::GradScaler s(bad); }, "backoff_factor");
  bad = {};
  bad.backoff_factor = 0.0f;
  expect_error([&] { amp::GradScaler s(bad); }, "backoff_factor must be in (0, 1), got 0");
  bad = {};
  bad.backoff_factor = 1.0f; // would never back off
  expect_error([&] { amp::GradScaler s(bad); }, "backoff_factor must be in (0, 1), got 1");
  bad = {};
  bad.growth_factor = NAN;
  expect_error([&] { amp::GradScaler s(bad); }, "growth_factor must be > 1, got nan");
  bad = {};
  bad.growth_interval = 0;
  expect_error([&] { amp::GradScaler s(bad); }, "growth_interval");
  // A scale at or below 2^-128 has no finite reciprocal (PyTorch takes it, and then applies
  // non-finite gradients).
  for (float scale : {0.0f, -1.0f, NAN, INFINITY, 1e-40f, 0x1p-128f}) {
    bad = {};
    bad.init_scale = scale;
    expect_error([&] { amp::GradScaler s(bad); },
                 "GradScaler: init_scale must be finite and > 2^-128 (its reciprocal must be "
                 "finite)");
  }
  bad = {};
  bad.init_scale = std::nextafter(0x1p-128f, 1.0f); // the smallest scale taken
  EXPECT_TRUE(std::isfinite(1.0f / bad.init_scale));
  amp::GradScaler smallest(bad);
  expect_error([&] { smallest.update(0x1p-128f); },
               "GradScaler::update: new_scale must be finite and > 2^-128");
  bad = {};
  bad.enabled = false; // refused even when disabled (where PyTorch does not look)
  bad.growth_interval = -3;
  expect_error([&] { amp::GradScaler s(bad); }, "growth_interval must be positive, got -3");
}

TEST(GradScaler, LoadStateDictRefusesWhatTheConstructorRefuses) {
  amp::GradScaler scaler;
  using Edit = void (*)(amp::GradScalerState&);
  const std::pair<Edit, const char*> cases[] = {
      {[](amp::GradScalerState& s) { s.scale = 0.0f; },
       "GradScaler::load_state_dict: scale must be finite and > 2^-128 (its reciprocal must be "
       "finite), got 0"},
      {[](amp::GradScalerState& s) { s.scale = 1e-40f; },
       "GradScaler::load_state_dict: scale must be finite and > 2^-128"},
      {[](amp::GradScalerState& s) { s.growth_factor = 0.5f; },
       "growth_factor must be > 1, got 0.5"},
      {[](amp::GradScalerState& s) { s.backoff_factor = 2.0f; },
       "backoff_factor must be in (0, 1), got 2"},
      {[](amp::GradScalerState& s) { s.growth_interval = 0; },
       "growth_interval must be positive, got 0"},
      {[](amp::GradScalerState& s) { s.growth_tracker = -1; },
       "_growth_tracker must be >= 0, got -1"},
  };
  for (const auto& [edit, message] : cases) {
    amp::GradScalerState bad = *scaler.state_dict();
    edit(bad);
    expect_error([&] { scaler.load_state_dict(bad); }, message);
  }
  EXPECT_EQ(scaler.get_scale(), 65536.0f) << "a refused state changed the scaler";
}

} // namespace
} // namespace minamp
