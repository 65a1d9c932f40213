// Layer semantics: PyTorch-style initialisation, names, fusion, train/eval, and error messages.
#include <gtest/gtest.h>

#include <cmath>

#include "amp/autocast.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "test_util.h"

namespace minamp {
namespace {

using test::expect_error;

// Every value of the layer's weight and bias lies within +-bound, and the largest comes near it
// (thousands of uniform draws reach the edge).
void expect_uniform_within(const Parameter& weight, const Parameter& bias, float bound) {
  float largest = 0;
  int outside = 0; // NaN counts as outside (std::max would drop it)
  for (const Parameter* p : {&weight, &bias})
    for (float v : p->master().to_vector()) {
      outside += !(std::abs(v) <= bound);
      largest = std::max(largest, std::abs(v));
    }
  EXPECT_EQ(outside, 0);
  EXPECT_GT(largest, 0.9f * bound);
}

TEST(Layers, LinearInitIsPyTorchsUniformBound) {
  Rng rng(1);
  nn::Linear layer(100, 30, rng); // 3030 draws
  expect_uniform_within(layer.weight, layer.bias, 1.0f / std::sqrt(100.0f));
}

TEST(Layers, Conv2dInitIsPyTorchsUniformBoundOverItsFanIn) {
  Rng rng(2);
  nn::Conv2d layer(6, 40, 3, rng); // 2200 draws; fan-in 6 * 3 * 3, as kaiming_uniform_(a = sqrt(5))
  expect_uniform_within(layer.weight, layer.bias, 1.0f / std::sqrt(54.0f));
}

TEST(Layers, InitIsDeterministicInTheSeed) {
  Rng a(5), b(5), c(6);
  nn::Conv2d x(3, 4, 3, a), y(3, 4, 3, b), z(3, 4, 3, c);
  EXPECT_EQ(x.weight.master().to_vector(), y.weight.master().to_vector());
  EXPECT_NE(x.weight.master().to_vector(), z.weight.master().to_vector());
}

TEST(Layers, SequentialNamesMatchPyTorch) {
  Rng rng(2);
  nn::Sequential net;
  net.emplace<nn::Conv2d>(2, 4, 1, rng).emplace<nn::BatchNorm>(4).emplace<nn::ReLU>();
  net.emplace<nn::Conv2d>(4, 1, 1, rng);
  std::vector<std::string> names;
  for (auto& [name, p] : net.named_parameters()) names.push_back(name);
  for (auto& [name, t] : net.named_buffers()) names.push_back(name);
  for (auto& [name, c] : net.named_counters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight",
                                             "3.bias", "1.running_mean", "1.running_var",
                                             "1.num_batches_tracked"}));
}

TEST(Layers, BatchNormTrainUpdatesRunningStatsEvalUsesThem) {
  nn::BatchNorm bn(2);
  Rng rng(3);
  const Tensor x = test::random_tensor(rng, {8, 2});
  bn(Var(x));
  EXPECT_EQ(bn.num_batches_tracked, 1);
  const std::vector<float> values = x.to_vector();
  for (int c = 0; c < 2; ++c) {
    double mean = 0, sq = 0;
    for (int r = 0; r < 8; ++r) mean += values[r * 2 + c] / 8.0;
    for (int r = 0; r < 8; ++r) sq += std::pow(values[r * 2 + c] - mean, 2);
    EXPECT_NEAR(bn.running_mean.to_vector()[c], 0.1 * mean, 1e-6);
    EXPECT_NEAR(bn.running_var.to_vector()[c], 0.9 + 0.1 * sq / 7.0, 1e-6); // unbiased
  }
  bn.eval();
  const std::vector<float> y = bn(Var(x)).value().to_vector();
  EXPECT_EQ(bn.num_batches_tracked, 1);
  const std::vector<float> rm = bn.running_mean.to_vector(), rv = bn.running_var.to_vector();
  for (int i = 0; i < 16; ++i)
    EXPECT_NEAR(y[i], (values[i] - rm[i % 2]) / std::sqrt(rv[i % 2] + 1e-5f), 1e-5);
}

// The layer's momentum reaches the kernel: with 0.3, one batch moves the running mean 30% of the
// way to the batch mean.
TEST(Layers, BatchNormUsesItsOwnMomentum) {
  nn::BatchNorm bn(2, 1e-5f, 0.3f);
  Rng rng(5);
  const Tensor x = test::random_tensor(rng, {8, 2});
  bn(Var(x));
  const std::vector<float> values = x.to_vector();
  for (int c = 0; c < 2; ++c) {
    double mean = 0;
    for (int r = 0; r < 8; ++r) mean += values[r * 2 + c] / 8.0;
    EXPECT_NEAR(bn.running_mean.to_vector()[c], 0.3 * mean, 1e-6);
  }
}

TEST(Layers, LinearShapeMismatchNamesTheExpectation) {
  Rng rng(4);
  nn::Linear layer(8, 16, rng);
  expect_error(
      [&] {
        layer(Var(Tensor::zeros({4, 7})));
      },
      "Linear", "expected input [rows, 8] for weight [16, 8], got f32[4, 7]");
}

TEST(Layers, AParameterHasOnlyF32F16AndBf16WorkingCopies) {
  Parameter p(Tensor::full({3}, 1.5f + 0x1p-9f)); // 1.5 + 2^-9: an f16 value, not a bf16 one
  EXPECT_EQ(p.working_copy(DType::f16).dtype(), DType::f16);
  EXPECT_EQ(p.working_copy(DType::f16).to_vector(), std::vector<float>(3, 1.5f + 0x1p-9f));
  // The other 16-bit format replaces the copy, rounded from the master (1.5 + 2^-9 -> 1.5).
  EXPECT_EQ(p.working_copy(DType::bf16).dtype(), DType::bf16);
  EXPECT_EQ(p.working_copy(DType::bf16).to_vector(), std::vector<float>(3, 1.5f));
  EXPECT_EQ(p.half_copy().dtype(), DType::bf16);
  EXPECT_EQ(&p.working_copy(DType::f32), &p.master());
  expect_error([&] { p.working_copy(DType::i32); }, "Parameter::working_copy",
               "expected f32, f16 or bf16, got i32");
}

TEST(Layers, Conv2dWrongRankNamesTheExpectation) {
  Rng rng(4);
  nn::Conv2d conv(3, 8, 3, rng);
  expect_error([&] { conv(Var(Tensor::zeros({4, 3}))); }, "Conv2d", "[N, H, W, 3]", "[4, 3]");
}

TEST(Layers, Conv2dOpRefusesAZeroStrideBeforeDividingByIt) {
  Rng rng(5);
  nn::Conv2d conv(3, 8, 3, rng);
  const Var x(Tensor::zeros({1, 5, 5, 3}));
  expect_error(
      [&] {
        ops::conv2d(x, conv.weight, nullptr, ConvParams{0, 1}, false);
      },
      "Conv2d", "expects stride >= 1 and pad >= 0, got stride 0, pad 1");
  expect_error(
      [&] {
        ops::conv2d(x, conv.weight, nullptr, ConvParams{1, -1}, false);
      },
      "Conv2d", "got stride 1, pad -1");
}

TEST(Layers, BatchNormChannelMismatch) {
  nn::BatchNorm bn(5);
  expect_error([&] { bn(Var(Tensor::zeros({4, 3}))); }, "BatchNorm", "5", "[4, 3]");
}

TEST(Layers, DescribeShowsFusion) {
  Rng rng(1);
  nn::Sequential net;
  net.emplace<nn::Linear>(2, 3, rng).emplace<nn::ReLU>().emplace<nn::Linear>(3, 1, rng);
  EXPECT_NE(net.describe().find("Linear(2, 3) + ReLU (fused)"), std::string::npos)
      << net.describe();
}

// Inference holds a layer's input and output, no more: where a batch norm is left to the conv
// after it (Sequential's fusion) but the conv cannot normalise as it loads (here: the CPU never
// does), the two run unfused and the conv's output takes the memory of the batch norm's input,
// as between two separate layers. The allocator's peak over the forward says so, in f32 and under
// f16 autocast, with fusion on and off; the outputs agree.
TEST(Layers, InferenceHoldsTwoActivationsWhereTheBatchNormIsLeftToTheConv) {
  for (DType amp_dtype : {DType::f32, DType::f16}) {
    SCOPED_TRACE(cat("autocast ", amp_dtype));
    const double activation_bytes = 64.0 * 64 * 64 * dtype_size(amp_dtype); // [4096, 64]
    std::vector<float> outputs[2];
    for (bool fusion : {true, false}) {
      SCOPED_TRACE(fusion ? "fusion on" : "fusion off");
      test::ScopedFusion scope(fusion);
      Rng rng(1240);
      nn::Sequential net;
      net.emplace<nn::Conv2d>(2, 64, 1, rng).emplace<nn::BatchNorm>(64).emplace<nn::ReLU>();
      net.emplace<nn::Conv2d>(64, 64, 1, rng).emplace<nn::BatchNorm>(64).emplace<nn::ReLU>();
      net.emplace<nn::Conv2d>(64, 1, 1, rng);
      net.eval();
      const Tensor x = test::random_tensor(rng, {1, 64, 64, 2}, DType::f32, Device::cpu);
      NoGrad no_grad;
      const bool amp = amp_dtype != DType::f32;
      amp::Autocast autocast(amp, amp ? amp_dtype : DType::f16);
      const size_t peak = test::peak_bytes_during(
          Device::cpu, [&] { outputs[fusion] = net(Var(x)).value().to(DType::f32).to_vector(); });
      EXPECT_LE(double(peak), 2.1 * activation_bytes) << "a third activation was alive";
    }
    EXPECT_EQ(outputs[true], outputs[false]);
  }
}

TEST(Layers, InputsTheLayerCannotTakeAreErrorsNamingIt) {
  Rng rng(1);
  nn::BatchNorm bn(4);
  const Var one_row(Tensor::full({1, 4}, 1.0f));
  expect_error([&] { bn(one_row); }, "BatchNorm: training needs more than one value per channel");
  const Var small(Tensor::full({1, 4, 6, 2}, 1.0f));
  for (int stride : {1, 2}) { // (4 - 5) / 2 + 1 would be one output pixel
    nn::Conv2d conv(2, 3, 5, rng, stride);
    expect_error(
        [&] { conv(small); },
        "Conv2d: input f32[1, 4, 6, 2] on cpu is smaller than the 5x5 kernel with padding 0");
  }
  nn::Conv2d padded(2, 3, 5, rng, 2, 1); // 4 + 2 >= 5: fits
  EXPECT_EQ(padded(small).shape(), (Shape{1, 1, 2, 3}));
}

TEST(Layers, DescribeNamesInputsBeforeOutputs) {
  Rng rng(1);
  nn::Sequential net;
  net.emplace<nn::Conv2d>(3, 8, 5, rng, 2, 1)
      .emplace<nn::BatchNorm>(8)
      .emplace<nn::Linear>(8, 2, rng);
  const std::string text = net.describe();
  EXPECT_NE(text.find("(0) Conv2d(3, 8, kernel 5, stride 2, padding 1)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("(1) BatchNorm(8)"), std::string::npos) << text;
  EXPECT_NE(text.find("(2) Linear(8, 2)"), std::string::npos) << text;
}

} // namespace
} // namespace minamp
