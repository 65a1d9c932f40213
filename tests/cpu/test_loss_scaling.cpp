// Why loss scaling: tiny gradients that flush to zero without it and survive with it (and in
// bf16 without it), scaled weight gradients past f16's range that stay finite in fp32, an absurd
// initial scale backing off to a sane one, AMP training (f16 with scaling, bf16 without) ending
// where FP32 does, and the f16/bf16 range diagnostics that show which regime a model is in.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "amp/diagnostics.h"
#include "amp/grad_scaler.h"
#include "amp_problem.h"
#include "kernels/kernels.h"
#include "optim/optimizer.h"
#include "sine_data.h"

namespace minamp {
namespace {

using test::Problem;

// One SGD step under autocast to `dtype`, with or without loss scaling, towards targets 1e-7 below
// the predictions: dL/dy = 2 (y - t) / 16 ~ 1.25e-8, below half the smallest f16 subnormal
// (2^-25 ~ 3e-8), so the f16 activation gradient is exactly zero unless the loss is scaled
// first, while bf16 (float's range) holds it as it is. The last bias's gradient is then
// sum 2 (y - t) / 16, known exactly (*expected_bias_grad). Returns the gradients' norm.
double tiny_gradient_step(DType dtype, bool loss_scaling, Problem& p, double* expected_bias_grad) {
  std::vector<float> y;
  {
    amp::Autocast autocast(true, dtype);
    NoGrad no_grad;
    y = p.model(Var(p.x)).value().to_vector();
  }
  std::vector<float> t(y.size());
  *expected_bias_grad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    t[i] = y[i] - 1e-7f;
    *expected_bias_grad += 2.0 * (double(y[i]) - t[i]) / y.size();
  }
  optim::SGD sgd(p.model.parameters(), 1.0f);
  amp::GradScalerOptions options;
  options.enabled = loss_scaling;
  amp::GradScaler scaler(options);
  sgd.zero_grad();
  {
    amp::Autocast autocast(true, dtype);
    scaler.scale(ops::mse_loss(p.model(Var(p.x)), Tensor::from_vector(t, {16, 1}))).backward();
  }
  scaler.step(sgd);
  scaler.update();
  double norm = 0;
  for (Parameter* param : p.model.parameters())
    for (float g : param->grad().to_vector()) norm += double(g) * g;
  EXPECT_TRUE(std::isfinite(norm));
  return std::sqrt(norm);
}

TEST(LossScaling, TinyGradientsFlushToZeroWithoutScalingAndSurviveWithIt) {
  Problem unscaled, scaled;
  const std::vector<float> before = unscaled.flat_parameters();
  double expected = 0;
  EXPECT_EQ(tiny_gradient_step(DType::f16, false, unscaled, &expected), 0.0)
      << "every gradient flushed to zero in f16";
  EXPECT_EQ(unscaled.flat_parameters(), before) << "so the update was lost";
  EXPECT_GT(tiny_gradient_step(DType::f16, true, scaled, &expected), 0.0);
  const float last_bias_grad = scaled.model.parameters()[3]->grad().item();
  EXPECT_NEAR(last_bias_grad, expected, 0.05 * expected) << "the scaled gradient is right";
  EXPECT_NE(scaled.flat_parameters(), before) << "and updates the weights";
}

// The same gradients in bf16 need no scaling: 1.25e-8 is a normal bf16 number (its smallest
// normal is 2^-126), so the unscaled step keeps them and updates the weights.
TEST(LossScaling, Bf16KeepsTinyGradientsWithoutScaling) {
  Problem unscaled;
  const std::vector<float> before = unscaled.flat_parameters();
  double expected = 0;
  EXPECT_GT(tiny_gradient_step(DType::bf16, false, unscaled, &expected), 0.0);
  const float last_bias_grad = unscaled.model.parameters()[3]->grad().item();
  EXPECT_NEAR(last_bias_grad, expected, 0.05 * expected) << "the unscaled bf16 gradient is right";
  EXPECT_NE(unscaled.flat_parameters(), before) << "and updates the weights";
}

// Weight gradients are written in fp32 from the GEMM's accumulators, where PyTorch's autocast
// first materialises them in fp16 (docs/tour.md): a scaled weight gradient past f16's range is a
// finite number here, not an inf that would skip the step.
TEST(LossScaling, ScaledWeightGradientsPastTheF16RangeStayFinite) {
  Rng rng(8);
  nn::Linear layer(1, 1, rng, /*bias=*/false);
  kernels::fill(layer.weight.master(), 0.5f);
  const Tensor x = Tensor::full({1, 1}, 4.0f);
  const Tensor target = Tensor::full({1, 1}, 1.75f); // y = 2: dloss/dy = 2 (2 - 1.75) = 0.5
  optim::SGD sgd(layer.parameters(), 0.0f);
  amp::GradScaler scaler; // S = 65536: the activation gradient 32768 fits in f16
  Var loss;
  {
    amp::Autocast autocast;
    loss = ops::mse_loss(layer(Var(x)), target);
  }
  scaler.scale(loss).backward();
  const float grad = layer.weight.grad().item(); // dy x S = 0.5 * 4 * 65536
  EXPECT_EQ(grad, 131072.0f);
  EXPECT_TRUE(std::isinf(round_to_half(grad))) << "held in f16, it would be inf";
  scaler.step(sgd);
  scaler.update();
  EXPECT_FALSE(scaler.step_was_skipped(sgd));
  EXPECT_EQ(scaler.get_scale(), 65536.0f);
}

TEST(LossScaling, AbsurdInitialScaleBacksOffSkipsAndConverges) {
  Problem p;
  optim::Adam adam(p.model.parameters(), 0.01f);
  amp::GradScalerOptions options;
  options.init_scale = 1e30f;
  amp::GradScaler scaler(options);
  float first_loss = 0, last_loss = 0;
  int skipped = 0;
  for (int step = 0; step < 150; ++step) {
    adam.zero_grad();
    Var loss = p.loss(true);
    if (step == 0) first_loss = loss.value().item();
    last_loss = loss.value().item();
    scaler.scale(loss).backward();
    scaler.step(adam);
    scaler.update();
    skipped += scaler.step_was_skipped(adam);
  }
  // Every skipped step halved the scale and nothing else changed it (growth needs 2000 steps);
  // from 1e30, tens of halvings are needed before scaled gradients fit in f16.
  EXPECT_GE(skipped, 60);
  EXPECT_EQ(scaler.get_scale(), static_cast<float>(std::ldexp(1e30, -skipped)));
  EXPECT_LT(last_loss, 0.9f * first_loss) << "training converges once the scale is sane";
}

// The sine problem at a small size, trained FP32 (`precision` f32) or AMP in f16 with loss
// scaling or in bf16 without, from the init of `seed`: the final loss, as the mean of the last 10
// steps (as in the benchmark's parity target: at this learning rate single steps' losses wander by
// several percent).
double train_sine(DType precision, uint64_t seed) {
  const bool amp = precision != DType::f32;
  const int64_t size = 16;
  const std::vector<float> grid = examples::coordinate_grid(size);
  const Tensor x = Tensor::from_vector(grid, {1, size, size, 2});
  const Tensor y = Tensor::from_vector(examples::quantized_sine(grid), {1, size, size, 1});
  Rng rng(seed);
  nn::Sequential net;
  net.emplace<nn::Conv2d>(2, 32, 1, rng).emplace<nn::BatchNorm>(32).emplace<nn::ReLU>();
  net.emplace<nn::Conv2d>(32, 32, 1, rng).emplace<nn::BatchNorm>(32).emplace<nn::ReLU>();
  net.emplace<nn::Conv2d>(32, 1, 1, rng);
  optim::Adam adam(net.parameters(), 1e-2f);
  amp::GradScalerOptions options;
  options.enabled = precision == DType::f16;
  amp::GradScaler scaler(options);
  const int steps = 200, last = 10;
  double last_losses = 0;
  for (int step = 0; step < steps; ++step) {
    adam.zero_grad();
    Var loss;
    {
      amp::Autocast autocast(amp, amp ? precision : DType::f16);
      loss = ops::mse_loss(net(Var(x)), y);
    }
    if (step >= steps - last) last_losses += loss.value().item();
    scaler.scale(loss).backward();
    scaler.step(adam);
    scaler.update();
  }
  return last_losses / last;
}

// FP32 and AMP from the same four inits end within 10% of each other, summed over the inits:
// one init alone ends anywhere from 0.90x to 1.07x of FP32 in AMP (12 inits measured), and a
// difference in the last bits of one op (e.g. Adam's bias correction) moves it in that range.
TEST(AmpTraining, SineAmpEndsWithinTenPercentOfFp32) {
  double fp32 = 0, amp = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    fp32 += train_sine(DType::f32, seed);
    amp += train_sine(DType::f16, seed);
  }
  EXPECT_LT(fp32 / 4, 0.05) << "the small sine problem trains";
  EXPECT_NEAR(amp, fp32, 0.1 * fp32);
}

// The same in bf16 without a loss scaler, as PyTorch users train it: bf16's 8 significant bits
// round more coarsely than f16's 11, yet the fp32 masters and fp32 accumulation keep the run
// within 10% of FP32 over the same four inits.
TEST(AmpTraining, SineBf16WithoutLossScalingEndsWithinTenPercentOfFp32) {
  double fp32 = 0, bf16 = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    fp32 += train_sine(DType::f32, seed);
    bf16 += train_sine(DType::bf16, seed);
  }
  EXPECT_NEAR(bf16, fp32, 0.1 * fp32);
}

TEST(Diagnostics, ProbeCountsWhatFp16WouldFlushAtScaleOneButNotAtS) {
  // Activation gradients of 1.25e-8 (targets 1e-7 off, MSE over 16): every one flushes to zero in
  // fp16 at scale 1, none at S = 65536, where they are ordinary normal numbers (~8.2e-4).
  Problem p;
  std::vector<float> y;
  {
    NoGrad no_grad;
    y = p.model(Var(p.x)).value().to_vector();
  }
  for (float& v : y) v -= 1e-7f;
  amp::ActivationGradientProbe probe(1.0f, 65536.0f);
  p.model.zero_grad();
  ops::mse_loss(p.model(Var(p.x)), Tensor::from_vector(y, {16, 1})).backward();
  const std::vector<amp::RangeReport> reports = probe.reports();
  ASSERT_EQ(reports.size(), 2u) << "two Linear layers (the ReLU is fused), loss left out";
  EXPECT_EQ(reports[0].name, "linear#0");
  const amp::RangeReport& last = reports[1]; // the output layer's gradient [16, 1]
  EXPECT_EQ(last.f16_at_one.nonzero, 16);
  EXPECT_EQ(last.f16_at_one.flushed, 16);
  EXPECT_EQ(last.f16_at_scale.flushed, 0);
  EXPECT_EQ(last.f16_at_scale.subnormal, 0);
  // bf16 holds them at scale 1, as normal numbers: its range is float's.
  EXPECT_EQ(last.bf16_at_one.nonzero, 16);
  EXPECT_EQ(last.bf16_at_one.flushed + last.bf16_at_one.subnormal, 0);
  // Their histogram: all 16 in the bins of 2^-27 and 2^-26 (about 1.25e-8 = 1.68 x 2^-27, the
  // targets' rounding in f32 moving each a little).
  const auto in_bins = [](const amp::Log2Histogram& h) {
    const auto bin = [&](int e) { return h.counts[size_t(e - amp::Log2Histogram::kMinExponent)]; };
    return bin(-27) + bin(-26);
  };
  EXPECT_EQ(last.histogram.nonzero(), 16);
  EXPECT_EQ(in_bins(last.histogram), 16);

  // The same gradients stored at a scale of 2^22 (a scaled loss, as under AMP) are counted as
  // themselves: unscaled for scale 1 and at S = 2^22 (~0.052), not at 2^44 (which would overflow).
  {
    const float stored = 4194304.0f;
    amp::ActivationGradientProbe scaled_probe(stored, stored);
    p.model.zero_grad();
    const Var loss = ops::mse_loss(p.model(Var(p.x)), Tensor::from_vector(y, {16, 1}));
    ops::mul_scalar(loss, Tensor::full({1}, stored)).backward();
    ASSERT_EQ(scaled_probe.reports().size(), 2u) << "the loss scaling is left out too";
    const amp::RangeReport scaled = scaled_probe.reports()[1];
    EXPECT_EQ(scaled.f16_at_one.flushed, 16);
    EXPECT_EQ(scaled.f16_at_scale.overflow, 0);
    EXPECT_EQ(scaled.f16_at_scale.flushed, 0);
    EXPECT_EQ(in_bins(scaled.histogram), 16)
        << "the histogram is of the true gradients, whatever the scale they are stored at";
  }

  // Under autocast the casts it adds are not layers: still the two Linear layers' reports.
  {
    amp::ActivationGradientProbe amp_probe(1.0f, 65536.0f);
    p.model.zero_grad();
    p.loss(true).backward();
    const std::vector<amp::RangeReport> amp_reports = amp_probe.reports();
    ASSERT_EQ(amp_reports.size(), 2u);
    EXPECT_EQ(amp_reports[0].name, "linear#0");
    EXPECT_EQ(amp_reports[1].name, "linear#1");
  }

  const auto weights = amp::weight_gradient_report(p.model.named_parameters(), 1.0f, 65536.0f);
  ASSERT_EQ(weights.size(), 4u);
  EXPECT_EQ(weights[3].name, "2.bias");
  // Weight gradients of 1e-8 stored at 2^22 (~0.042): flushed at scale 1, not at 2^22.
  {
    const float stored = 4194304.0f;
    Tensor& grad = p.model.parameters()[0]->grad(); // 0.weight [3, 4]
    kernels::fill(grad, 1e-8f * stored);
    const amp::RangeReport report =
        amp::weight_gradient_report(p.model.named_parameters(), stored, stored)[0];
    EXPECT_EQ(report.f16_at_one.flushed, 12);
    EXPECT_EQ(report.f16_at_scale.flushed, 0);
    EXPECT_EQ(report.f16_at_scale.nonzero, 12);
  }
  EXPECT_EQ(amp::first_nonfinite_parameter(p.model.named_parameters()), "");
  kernels::fill(p.model.parameters()[1]->grad(), NAN);
  EXPECT_EQ(amp::first_nonfinite_parameter(p.model.named_parameters()), "0.bias");
  kernels::fill(p.model.parameters()[2]->grad(), NAN);
  EXPECT_EQ(amp::first_nonfinite_parameter(p.model.named_parameters()), "2.weight")
      << "the parameter backward reaches first";
}

// The whitespace-separated fields of the table line that starts with `name`.
std::vector<std::string> table_row(const std::string& table, const std::string& name) {
  std::istringstream lines(table);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::vector<std::string> row{std::istream_iterator<std::string>(fields), {}};
    if (!row.empty() && row[0] == name) return row;
  }
  return {};
}

TEST(Diagnostics, TheTableGivesEachShareOfTheNonzeroValuesInBothFormats) {
  // RangeCounts: flushed, subnormal, overflow, nonzero, nonfinite; f16 at 1, at S, bf16 at 1.
  const amp::RangeReport finite{
      "linear#0", {50, 20, 0, 200, 0}, {2, 4, 6, 200, 0}, {0, 1, 0, 200, 0}, {}};
  const amp::RangeReport broken{"2.weight", {0, 0, 0, 8, 1}, {0, 0, 8, 8, 1}, {}, {}};
  const amp::RangeReport empty{"relu#0", {}, {}, {}, {}};
  const std::string table =
      amp::format_range_reports("weight gradients", {finite, broken, empty}, 65536.0f);
  EXPECT_EQ(table.rfind("weight gradients\n", 0), 0u) << table;
  EXPECT_NE(table.find("f16 at S = 65536"), std::string::npos) << table;
  EXPECT_NE(table.find("bf16 at scale 1"), std::string::npos) << table;
  using Row = std::vector<std::string>;
  EXPECT_EQ(table_row(table, "linear#0"),
            (Row{"linear#0", "200", "|", "25.000", "10.000", "0.000", "|", "1.000", "2.000",
                 "3.000", "|", "0.000", "0.500", "0.000"}))
      << table;
  EXPECT_EQ(table_row(table, "2.weight"),
            (Row{"2.weight", "8", "|", "0.000", "0.000", "0.000", "|", "0.000", "0.000", "100.000",
                 "|", "0.000", "0.000", "0.000", "NON-FINITE"}))
      << table;
  EXPECT_EQ(table_row(table, "relu#0"),
            (Row{"relu#0", "0", "|", "0.000", "0.000", "0.000", "|", "0.000", "0.000", "0.000", "|",
                 "0.000", "0.000", "0.000"}))
      << "no nonzero values: shares of 0, not NaN\n"
      << table;
}

// The histogram bins values by their binary exponent, after dividing by the scale they are
// stored at; zeros and non-finite values are counted apart; far-out exponents land in the end
// bins rather than outside.
TEST(Diagnostics, Log2HistogramBinsByBinaryExponent) {
  amp::Log2Histogram h;
  h.add(Tensor::from_vector({1.0f, 1.99f, -3.0f, 0.25f, 0.0f, INFINITY, NAN, 0x1p-149f}, {8}), 1.0);
  const auto bin = [&](int e) { return h.counts[size_t(e - amp::Log2Histogram::kMinExponent)]; };
  EXPECT_EQ(bin(0), 2);    // 1 and 1.99
  EXPECT_EQ(bin(1), 1);    // -3
  EXPECT_EQ(bin(-2), 1);   // 0.25
  EXPECT_EQ(bin(-149), 1); // float's smallest subnormal
  EXPECT_EQ(h.zeros, 1);
  EXPECT_EQ(h.nonfinite, 2);
  EXPECT_EQ(h.nonzero(), 5);
  h.add(Tensor::from_vector({65536.0f}, {1}), 65536.0); // stored at S = 2^16: the value 1
  EXPECT_EQ(bin(0), 3);
  h.add(Tensor::from_vector({0x1p-149f}, {1}), 0x1p100); // 2^-249: below every bin
  EXPECT_EQ(bin(amp::Log2Histogram::kMinExponent), 1);
}

// The master-weights argument, measured: an Adam step of lr 1e-3 moves weights near 1 by about
// 1e-3, under half of bf16's spacing there (2^-8 = 3.9e-3) but over f16's (2^-11 = 4.9e-4): kept
// in bf16 every update would be lost (error 100%), in f16 none; the fp32 masters took them all.
TEST(Diagnostics, WeightUpdatesBelowHalfAnUlpAreLostInBf16ButNotInF16) {
  Rng rng(3);
  nn::Linear layer(64, 32, rng, /*bias=*/false);
  kernels::fill(layer.weight.master(), 1.0f);
  std::vector<std::pair<std::string, Parameter*>> params = {{"weight", &layer.weight}};
  optim::Adam adam(layer.parameters(), 1e-3f);
  kernels::fill(layer.weight.grad(), 0.5f); // Adam's first step: lr * sign(g)
  const auto before = amp::snapshot_masters(params);
  adam.step();
  const std::vector<amp::UpdateReport> reports = amp::weight_update_report(params, before);
  ASSERT_EQ(reports.size(), 1u);
  const amp::UpdateReport& r = reports[0];
  EXPECT_EQ(r.nonzero, 64 * 32);
  EXPECT_EQ(r.bf16.lost, 64 * 32);
  EXPECT_NEAR(r.bf16.error, 1.0, 1e-6) << "a lost update is all error";
  EXPECT_EQ(r.f16.lost, 0);
  // 1 - 1e-3 rounds to 1 - 2^-10 in f16 (spacing 2^-11 below 1): an error of 2.3%.
  EXPECT_NEAR(r.f16.error, (1e-3 - 0x1p-10) / 1e-3, 1e-4);
  const std::string table = amp::format_update_reports("updates", reports);
  using Row = std::vector<std::string>;
  const Row row = table_row(table, "weight");
  ASSERT_EQ(row.size(), 8u) << table;
  EXPECT_EQ((Row{row[0], row[1], row[3], row[6], row[7]}),
            (Row{"weight", "2048", "0.000", "100.000", "100.000"}))
      << table;
  EXPECT_NEAR(std::stod(row[4]), 100.0 * r.f16.error, 1e-3) << table;
}

} // namespace
} // namespace minamp
