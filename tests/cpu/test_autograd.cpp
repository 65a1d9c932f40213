// Gradient checks of the differentiable ops and layers (autograd + CPU kernels together), by
// central finite differences with the objective accumulated in double precision.
//
// Error budget: the library computes in fp32, so each forward value carries a relative error of
// ~1e-7; the objective L = sum(r * y) is summed in double, and a central difference with step
// h = 1e-3 turns that into ~1e-7 |L| / h ~ 1e-4 relative error, plus O(h^2) truncation. A
// norm-wise tolerance of 5e-3 therefore separates a correct backward from a wrong one (a wrong
// term shows up as an O(1) error).
#include <gtest/gtest.h>

#include <functional>

#include "nn/module.h"
#include "nn/resnet.h"
#include "ops/ops.h"
#include "test_util.h"

namespace minamp {
namespace {

using test::expect_error;

using Forward = std::function<Var(const Var& x)>;

// sum(r * y) in double.
double weighted_sum(const Tensor& y, const std::vector<float>& r) {
  const std::vector<float> values = y.to_vector();
  double sum = 0.0;
  for (size_t i = 0; i < values.size(); ++i) sum += double(r[i]) * values[i];
  return sum;
}

// d sum(r * f(x)) / d t[i] by central differences, t being x's values or a parameter's master.
std::vector<double> numeric_gradient(const Forward& f, const Var& x, Tensor& t,
                                     const std::vector<float>& r, Parameter* param) {
  const double h = 1e-3;
  std::vector<double> grad(static_cast<size_t>(t.numel()));
  float* values = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float saved = values[i];
    values[i] = static_cast<float>(saved + h);
    if (param) param->sync_half_copy();
    const double plus = weighted_sum(f(x).value(), r);
    values[i] = static_cast<float>(saved - h);
    if (param) param->sync_half_copy();
    const double minus = weighted_sum(f(x).value(), r);
    values[i] = saved;
    if (param) param->sync_half_copy();
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

double relative_error(const Tensor& analytic, const std::vector<double>& numeric) {
  const std::vector<float> a = analytic.to_vector();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff += (a[i] - numeric[i]) * (a[i] - numeric[i]);
    norm += numeric[i] * numeric[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// Checks the gradient of sum(r * f(x)) with respect to x = x_values and to every parameter in
// `params`, r drawn from `rng`.
void check_gradients_at(const Forward& f, Tensor x_values, std::vector<Parameter*> params, Rng& rng,
                        double tolerance = 5e-3) {
  Var x(x_values, true);
  for (Parameter* p : params) p->zero_grad();
  Var y;
  {
    // Forward passes that update state (BatchNorm running statistics) do not change the
    // training-mode output, so repeated evaluations below see the same function.
    y = f(x);
  }
  const Tensor r_tensor = test::random_tensor(rng, y.shape());
  const std::vector<float> r = r_tensor.to_vector();
  y.backward(r_tensor);

  NoGrad no_grad;
  EXPECT_LT(relative_error(x.grad(), numeric_gradient(f, x, x_values, r, nullptr)), tolerance)
      << "input gradient";
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_LT(relative_error(params[k]->grad(),
                             numeric_gradient(f, x, params[k]->master(), r, params[k])),
              tolerance)
        << "gradient of parameter " << k;
  }
}

// The same at a random x of shape `x_shape`.
void check_gradients(const Forward& f, const Shape& x_shape, std::vector<Parameter*> params,
                     uint64_t seed = 1, double tolerance = 5e-3) {
  Rng rng(seed);
  check_gradients_at(f, test::random_tensor(rng, x_shape), std::move(params), rng, tolerance);
}

TEST(Autograd, LinearWithBias) {
  Rng rng(7);
  nn::Linear layer(5, 3, rng);
  check_gradients([&](const Var& x) { return layer(x); }, {4, 5}, {&layer.weight, &layer.bias});
}

TEST(Autograd, LinearWithFusedReluMatchesSeparateRelu) {
  Rng rng(8);
  nn::Sequential fused;
  fused.emplace<nn::Linear>(6, 7, rng).emplace<nn::ReLU>();
  auto& linear = static_cast<nn::Linear&>(fused[0]);
  check_gradients([&](const Var& x) { return fused(x); }, {5, 6}, {&linear.weight, &linear.bias});

  Rng same(8);
  nn::Linear plain(6, 7, same);
  Rng data(3);
  Var x(test::random_tensor(data, {5, 6}));
  EXPECT_EQ(fused(x).value().to_vector(), ops::relu(plain(x)).value().to_vector());
}

TEST(Autograd, LinearWithoutBias) {
  Rng rng(17);
  nn::Linear layer(5, 3, rng, /*bias=*/false);
  check_gradients([&](const Var& x) { return layer(x); }, {4, 5}, {&layer.weight});
}

TEST(Autograd, StandaloneRelu) {
  check_gradients([](const Var& x) { return ops::relu(x); }, {6, 5}, {});
}

TEST(Autograd, Conv2dWithFusedReluMatchesSeparateRelu) {
  Rng rng(18);
  nn::Sequential fused;
  fused.emplace<nn::Conv2d>(3, 4, 3, rng, /*stride=*/2, /*padding=*/1).emplace<nn::ReLU>();
  auto& conv = static_cast<nn::Conv2d&>(fused[0]);
  check_gradients([&](const Var& x) { return fused(x); }, {2, 5, 6, 3}, {&conv.weight, &conv.bias});

  Rng same(18);
  nn::Conv2d plain(3, 4, 3, same, 2, 1);
  Rng data(4);
  Var x(test::random_tensor(data, {2, 5, 6, 3}));
  EXPECT_EQ(fused(x).value().to_vector(), ops::relu(plain(x)).value().to_vector());
}

TEST(Autograd, Conv2dStridedPadded) {
  Rng rng(9);
  nn::Conv2d conv(3, 4, 3, rng, /*stride=*/2, /*padding=*/1);
  check_gradients([&](const Var& x) { return conv(x); }, {2, 5, 6, 3}, {&conv.weight, &conv.bias});
}

TEST(Autograd, Conv2dOneByOne) {
  Rng rng(10);
  nn::Conv2d conv(2, 5, 1, rng);
  check_gradients([&](const Var& x) { return conv(x); }, {1, 3, 4, 2}, {&conv.weight, &conv.bias});
}

TEST(Autograd, BatchNormTrainingRows) {
  nn::BatchNorm bn(4);
  Rng rng(11);
  bn.weight.master() = test::random_tensor(rng, {4}, DType::f32, Device::cpu, 0.5f, 1.5f);
  bn.bias.master() = test::random_tensor(rng, {4});
  check_gradients([&](const Var& x) { return bn(x); }, {6, 4}, {&bn.weight, &bn.bias});
}

TEST(Autograd, BatchNormTrainingNhwcWithFusedRelu) {
  nn::Sequential net;
  net.emplace<nn::BatchNorm>(3).emplace<nn::ReLU>();
  auto& bn = static_cast<nn::BatchNorm&>(net[0]);
  Rng rng(12);
  bn.bias.master() = test::random_tensor(rng, {3}, DType::f32, Device::cpu, -0.3f, 0.3f);
  check_gradients([&](const Var& x) { return net(x); }, {2, 3, 3, 3}, {&bn.weight, &bn.bias});
}

TEST(Autograd, BatchNormEval) {
  nn::BatchNorm bn(3);
  Rng rng(13);
  bn.running_mean = test::random_tensor(rng, {3});
  bn.running_var = test::random_tensor(rng, {3}, DType::f32, Device::cpu, 0.5f, 2.0f);
  bn.eval();
  check_gradients([&](const Var& x) { return bn(x); }, {5, 3}, {&bn.weight, &bn.bias});
}

TEST(Autograd, GlobalAvgPoolAndReshape) {
  check_gradients([](const Var& x) { return ops::reshape(ops::global_avgpool(x), {6}); },
                  {2, 3, 2, 3}, {});
}

// A shuffled ramp: values 0.01 apart, so that no finite-difference step changes which value of a
// pooling window is the largest.
Tensor distinct_values(const Shape& shape, Rng& rng) {
  std::vector<int64_t> order(size_t(shape.numel()));
  rng.permutation(order);
  std::vector<float> values;
  for (int64_t k : order) values.push_back(0.01f * float(k) - 0.005f * float(order.size()));
  return Tensor::from_vector(values, shape);
}

TEST(Autograd, MaxPool2dStemWindow) {
  nn::MaxPool2d pool(3, 2, 1);
  Rng rng(31);
  check_gradients_at([&](const Var& x) { return pool(x); }, distinct_values({2, 5, 6, 3}, rng), {},
                     rng);
}

TEST(Autograd, MaxPool2dOverlappingStrideOne) {
  nn::MaxPool2d pool(3, 1, 1);
  Rng rng(32);
  check_gradients_at([&](const Var& x) { return pool(x); }, distinct_values({1, 4, 4, 2}, rng), {},
                     rng);
}

TEST(Autograd, MaxPool2dKeepsNoArgmaxWithoutGrad) {
  nn::MaxPool2d pool(3, 2, 1);
  Rng rng(33);
  const Var y = pool(Var(test::random_tensor(rng, {1, 4, 4, 2})));
  EXPECT_FALSE(y.requires_grad()) << "nothing to differentiate: no graph, no saved argmax";
}

TEST(Autograd, ResidualAddWithFusedRelu) {
  Rng rng(34);
  nn::Conv2d conv(3, 3, 3, rng, 1, 1);
  check_gradients([&](const Var& x) { return ops::add(conv(x), x, /*relu=*/true); }, {2, 3, 3, 3},
                  {&conv.weight, &conv.bias}, 35);
}

// ResNet's layers: the stem's 7x7 stride-2 conv and its BatchNorm + 3x3 max pooling (on distinct
// values, without the ReLU between them: ties in a window are kinks for finite differences), the
// 1x1 stride-2 conv of a downsample shortcut, and whole blocks.
TEST(Autograd, Conv2dStem7x7Stride2) {
  Rng rng(37);
  nn::Conv2d conv(3, 4, 7, rng, 2, 3, false);
  check_gradients([&](const Var& x) { return conv(x); }, {2, 9, 9, 3}, {&conv.weight});
}

TEST(Autograd, Conv2dDownsample1x1Stride2) {
  Rng rng(38);
  nn::Conv2d conv(3, 4, 1, rng, 2, 0, false);
  check_gradients([&](const Var& x) { return conv(x); }, {2, 5, 5, 3}, {&conv.weight});
}

TEST(Autograd, BatchNormMaxPoolStem) {
  nn::Sequential net;
  net.emplace<nn::BatchNorm>(3).emplace<nn::MaxPool2d>(3, 2, 1);
  auto& bn = static_cast<nn::BatchNorm&>(net[0]);
  Rng rng(39);
  check_gradients_at([&](const Var& x) { return net(x); }, distinct_values({2, 6, 6, 3}, rng),
                     {&bn.weight, &bn.bias}, rng);
}

TEST(Autograd, BasicBlockWithDownsample) {
  Rng rng(40);
  nn::BasicBlock block(3, 4, 2, rng);
  check_gradients([&](const Var& x) { return block(x); }, {2, 6, 6, 3}, block.parameters());
}

// A Bottleneck has 800 values through its last ReLU here: a finite-difference step carries a few
// of them across zero, which costs the numeric gradient up to ~3% (a wrong term costs O(1)).
TEST(Autograd, BottleneckWithDownsample) {
  Rng rng(51);
  nn::Bottleneck block(3, 4, 1, rng);
  check_gradients([&](const Var& x) { return block(x); }, {2, 5, 5, 3}, block.parameters(), 1,
                  5e-2);
}

TEST(Autograd, AddOfAVarToItselfDoublesItsGradient) {
  check_gradients([](const Var& x) { return ops::add(x, x); }, {5}, {}, 36);
}

TEST(Autograd, AddPromotesF16AndF32ToF32) {
  const Var a(Tensor::full({2}, 1.5f, DType::f16), true), b(Tensor::full({2}, 0.25f), true);
  const Var y = ops::add(a, b);
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(ops::add(a, a).dtype(), DType::f16);
  y.backward(Tensor::full({2}, 2.0f));
  EXPECT_EQ(a.grad().dtype(), DType::f16);
  EXPECT_EQ(a.grad().to_vector(), std::vector<float>(2, 2.0f));
  EXPECT_EQ(b.grad().to_vector(), std::vector<float>(2, 2.0f));
  expect_error([&] { ops::add(a, Var(Tensor::zeros({3}))); }, "add",
               "two tensors of one shape on one device, got f16[2] on cpu and f32[3] on cpu");
}

TEST(Autograd, MseLoss) {
  Rng rng(14);
  const Tensor target = test::random_tensor(rng, {4, 3});
  check_gradients([&](const Var& x) { return ops::mse_loss(x, target); }, {4, 3}, {});
}

TEST(Autograd, CrossEntropy) {
  const Tensor labels = Tensor::from_vector({2, 0, 4}, {3}, DType::i32);
  check_gradients([&](const Var& x) { return ops::cross_entropy(x, labels); }, {3, 5}, {});
}

TEST(Autograd, MulScalar) {
  const Tensor scale = Tensor::full({1}, 3.5f);
  check_gradients([&](const Var& x) { return ops::mul_scalar(x, scale); }, {7}, {});
}

TEST(Autograd, WholeConvNetThroughLoss) {
  Rng rng(15);
  nn::Sequential net;
  // No bias before BatchNorm: its true gradient is exactly zero (BN subtracts the mean), which
  // makes a relative error meaningless.
  net.emplace<nn::Conv2d>(2, 4, 1, rng, 1, 0, /*bias=*/false).emplace<nn::BatchNorm>(4);
  net.emplace<nn::ReLU>().emplace<nn::Conv2d>(4, 3, 3, rng, 1, 1).emplace<nn::GlobalAvgPool>();
  const Tensor labels = Tensor::from_vector({1, 2}, {2}, DType::i32);
  check_gradients([&](const Var& x) { return ops::cross_entropy(net(x), labels); }, {2, 4, 4, 2},
                  net.parameters());
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Rng rng(16);
  nn::Linear layer(3, 2, rng);
  Rng data(2);
  const Tensor x = test::random_tensor(data, {4, 3});
  layer.zero_grad();
  ops::mse_loss(layer(Var(x)), Tensor::zeros({4, 2})).backward();
  const std::vector<float> once = layer.weight.grad().to_vector();
  ops::mse_loss(layer(Var(x)), Tensor::zeros({4, 2})).backward();
  const std::vector<float> twice = layer.weight.grad().to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
}

TEST(Autograd, CastPassesTheGradientThroughInTheInputsDtype) {
  // Rounding is a step function, so finite differences do not apply: the cast's gradient is
  // the identity, converted back to the input's dtype.
  Rng rng(17);
  Var x(test::random_tensor(rng, {9}), true);
  Var y = ops::cast(x, DType::f16);
  EXPECT_EQ(y.dtype(), DType::f16);
  const Tensor seed = test::random_tensor(rng, {9}, DType::f16);
  y.backward(seed);
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().to_vector(), seed.to_vector());
}

TEST(Autograd, CastAndMseRefuseWhatTheyCannotDifferentiate) {
  const Var labels(Tensor::from_vector({0, 1, 2}, {3}, DType::i32));
  expect_error([&] { ops::cast(labels, DType::f16); }, "cast", "cannot cast i32[3] on cpu to f16");
  const Var column(Tensor::zeros({4, 1}), true);
  expect_error([&] { ops::mse_loss(column, Tensor::zeros({4})); }, "mse_loss",
               "prediction f32[4, 1] on cpu and target f32[4] on cpu differ in shape");
}

// backward() copies its seed: gradients gathered later (here a leaf's own, twice) never write
// into the caller's tensor.
// The walk frees each op's output once the ops that read it have run: when it reaches the first
// op of a chain, the outputs of the later ones (1 MiB each) are gone, not held to the end.
TEST(Autograd, TheWalkFreesActivationsAsItGoes) {
  const Allocator& allocator = allocator_for(Device::cpu);
  Var x(Tensor::full({262144}, 1.0f), true);
  Var h = x;
  constexpr int kOps = 8;
  for (int i = 0; i < kOps; ++i) h = ops::relu(h);
  const Var loss = ops::mse_loss(h, Tensor::zeros(h.shape()));
  h = Var(); // the chain's last output is held by the loss's op alone
  const size_t before = allocator.live_bytes();
  size_t at_first_relu = 0;
  int relus = 0;
  set_grad_observer([&](const Node& node) {
    if (std::string(node.op) == "relu" && ++relus == kOps) at_first_relu = allocator.live_bytes();
  });
  loss.backward();
  set_grad_observer(nullptr);
  ASSERT_EQ(relus, kOps);
  // By then the outputs of relus 2-8 (7 MiB) are freed; x, relu 1's output, its gradient and
  // the one being passed remain.
  EXPECT_LT(at_first_relu + (5u << 20), before) << "live at the start of backward: " << before
                                                << " bytes, at the first relu: " << at_first_relu;
  EXPECT_EQ(x.grad().numel(), 262144);
}

// An op's output that no backward saved is freed when its last Var goes, as PyTorch frees a
// tensor nobody refers to: mul_scalar's backward needs only the scale, relu's its own output.
// The gradient still flows through the node.
TEST(Autograd, AnOutputNoBackwardSavedIsFreedWithItsLastVar) {
  const Allocator& allocator = allocator_for(Device::cpu);
  Var x(Tensor::full({262144}, -1.0f), true);
  Var loss;
  size_t with_scaled = 0, without = 0;
  {
    Var scaled = ops::mul_scalar(x, Tensor::full({1}, -2.0f)); // 1 MiB, read by relu only
    const Var activated = ops::relu(scaled);
    loss = ops::mse_loss(activated, Tensor::zeros(activated.shape()));
    with_scaled = allocator.live_bytes();
    scaled = Var();
    without = allocator.live_bytes();
    EXPECT_EQ(with_scaled - without, size_t(1) << 20) << "mul_scalar's output was kept";
    EXPECT_TRUE(activated.value().defined()) << "a Var still refers to relu's output";
  }
  loss.backward();
  // d/dx of mean((relu(-2x))^2) at x = -1: 2 * 2 * (-2) / n.
  EXPECT_FLOAT_EQ(x.grad().to_vector()[0], -8.0f / 262144.0f);
}

// An add hands its one gradient to both inputs; a later gradient into either must not write
// through to the other: t = (p + q) + p, with p = 2x and q = 3x, is 7x.
TEST(Autograd, AGradientTwoNodesShareIsNeverAddedIntoInPlace) {
  Var x(Tensor::full({3}, 1.0f), true);
  const Var p = ops::mul_scalar(x, Tensor::full({1}, 2.0f));
  const Var q = ops::mul_scalar(x, Tensor::full({1}, 3.0f));
  const Var t = ops::add(ops::add(p, q), p);
  t.backward(Tensor::full({3}, 1.0f));
  EXPECT_EQ(x.grad().to_vector(), std::vector<float>(3, 7.0f));
}

TEST(Autograd, BackwardLeavesTheSeedUntouched) {
  Var x(Tensor::full({2}, 1.0f), true);
  const Tensor seed = Tensor::full({2}, 2.0f);
  x.backward(seed);
  x.backward(seed);
  EXPECT_EQ(x.grad().to_vector(), std::vector<float>(2, 4.0f));
  EXPECT_EQ(seed.to_vector(), std::vector<float>(2, 2.0f));
}

TEST(Autograd, ASeedOfTheOtherDtypeIsTakenInTheValuesDtype) {
  Rng rng(3);
  nn::Linear layer(3, 2, rng);
  Rng data(9);
  const Tensor x = test::random_tensor(data, {4, 3});
  auto weight_grad_for = [&](const Tensor& seed) {
    layer.zero_grad();
    ops::mse_loss(layer(Var(x)), Tensor::zeros({4, 2})).backward(seed);
    return layer.weight.grad().to_vector();
  };
  const std::vector<float> from_f32 = weight_grad_for(Tensor::full({1}, 3.0f));
  EXPECT_EQ(weight_grad_for(Tensor::full({1}, 3.0f, DType::f16)), from_f32);

  Var leaf(Tensor::full({2}, 1.0f), true);
  leaf.backward(Tensor::full({2}, 2.0f, DType::f16));
  EXPECT_EQ(leaf.grad().dtype(), DType::f32);
  EXPECT_EQ(leaf.grad().to_vector(), std::vector<float>(2, 2.0f));
}

TEST(Autograd, InputsThatNeedNoGradientGetNone) {
  Rng rng(5);
  Rng data(6);
  nn::Linear linear(3, 2, rng);
  nn::Conv2d conv(3, 2, 3, rng, 1, 1);
  nn::BatchNorm bn(3);
  struct Case {
    const char* name;
    nn::Module* layer;
    Shape input;
  };
  for (const Case& c : {Case{"Linear", &linear, {8, 3}}, Case{"Conv2d", &conv, {2, 2, 2, 3}},
                        Case{"BatchNorm", &bn, {2, 2, 2, 3}}}) {
    const Var x(test::random_tensor(data, c.input)); // data: requires no gradient
    const Var y = (*c.layer)(x);
    ops::mse_loss(y, Tensor::zeros(y.shape())).backward();
    EXPECT_FALSE(x.grad().defined()) << c.name << " gave its input a gradient nobody asked for";
  }
  float gamma_grad = 0;
  for (float g : bn.weight.grad().to_vector()) gamma_grad += std::abs(g);
  EXPECT_GT(gamma_grad, 0.0f) << "backward ran";
}

TEST(Autograd, CastToTheSameDtypeIsTheSameVar) {
  const Var x(Tensor::full({2}, 1.0f), true);
  EXPECT_EQ(&ops::cast(x, DType::f32).node(), &x.node()) << "no copy, no graph node";
}

TEST(Autograd, NoGradScopesNest) {
  ASSERT_TRUE(grad_enabled());
  const Var x(Tensor::full({2}, 1.0f), true);
  {
    NoGrad outer;
    {
      NoGrad inner;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled()) << "the inner scope's end turned gradients back on";
    EXPECT_FALSE(ops::mul_scalar(x, Tensor::full({1}, 2.0f)).requires_grad());
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(ops::mul_scalar(x, Tensor::full({1}, 2.0f)).requires_grad());
}

TEST(Autograd, BackwardWithoutGradIsAnError) {
  Var x(Tensor::full({1}, 2.0f));
  expect_error([&] { ops::mul_scalar(x, Tensor::full({1}, 2.0f)).backward(); },
               "backward: this Var does not require grad");
}

TEST(Autograd, BackwardThroughAFreedGraphIsAnError) {
  Rng rng(18);
  nn::Linear layer(3, 2, rng);
  Rng data(4);
  const Var hidden = layer(Var(test::random_tensor(data, {4, 3})));
  const Var mse = ops::mse_loss(hidden, Tensor::zeros({4, 2}));
  const Var cross_entropy =
      ops::cross_entropy(hidden, Tensor::from_vector({0, 1, 1, 0}, {4}, DType::i32));
  mse.backward();
  const std::vector<float> weight_grad = layer.weight.grad().to_vector();
  expect_error([&] { cross_entropy.backward(); },
               "backward: the graph through linear was already freed");
  expect_error([&] { mse.backward(); }, "backward: the graph through mse_loss was already freed");
  EXPECT_EQ(layer.weight.grad().to_vector(), weight_grad) << "a refused backward() added to it";
}

TEST(Autograd, ABackwardThatThrowsFreesItsGraph) {
  Var x(Tensor::full({2}, 1.0f), true);
  bool fail = true;
  const Var y = Var::from_op("flaky", Tensor::full({2}, 3.0f), {x}, false, [&](Node& self) {
    require(!fail, "flaky", "out of memory");
    accumulate_grad(*self.inputs[0], self.grad);
  });
  expect_error([&] { y.backward(Tensor::full({2}, 1.0f)); }, "flaky: out of memory");
  fail = false;
  // The failed walk had already seeded y; retried, it added the seed a second time (x.grad 2).
  expect_error([&] { y.backward(Tensor::full({2}, 1.0f)); },
               "backward: the graph through flaky was already freed");
  EXPECT_FALSE(x.grad().defined()) << "a refused backward() reached the leaf";
}

// Column sums that come with a gradient describe it only while it is the node's first and is
// kept as it came: a second gradient or a dtype conversion drops them; a wrong shape is an error.
TEST(Autograd, GradientColumnSumsDescribeTheFirstGradientOnly) {
  const Tensor grad = Tensor::full({2, 3}, 1.0f), sums = Tensor::full({3}, 2.0f);
  Node node;
  node.shape = {2, 3};
  accumulate_grad(node, grad, sums);
  EXPECT_EQ(node.grad_column_sums.raw(), sums.raw());
  accumulate_grad(node, grad);
  EXPECT_FALSE(node.grad_column_sums.defined()) << "two gradients added";
  EXPECT_EQ(node.grad.to_vector(), std::vector<float>(6, 2.0f));

  Node half;
  half.shape = {2, 3};
  half.dtype = DType::f16;
  accumulate_grad(half, grad, sums);
  EXPECT_FALSE(half.grad_column_sums.defined()) << "the gradient was converted to f16";

  Node other;
  other.shape = {2, 3};
  expect_error([&] { accumulate_grad(other, grad, Tensor::full({2}, 0.0f)); }, "accumulate_grad",
               "column sums f32[2] on cpu do not match the gradient f32[2, 3]");
}

// A conv with a trainable bias and no fused ReLU asks for its output gradient's column sums, and
// its bias gradient is the sums that came (here not the gradient's own, so that their use shows),
// unless a second gradient was added in.
TEST(Autograd, ConvBiasGradientTakesTheSumsItsGradientCameWith) {
  Rng rng(19);
  const Shape out_shape{2, 3, 3, 4};
  const Var x(test::random_tensor(rng, {2, 3, 3, 3}));
  const Tensor grad = test::random_tensor(rng, out_shape);
  const Tensor sums = Tensor::from_vector({1, 2, 3, 4}, {4});
  const auto consume = [&](const Var& y, int gradients) {
    return Var::from_op("consumer", Tensor::zeros({1}), {y}, false, [&, gradients](Node& self) {
      accumulate_grad(*self.inputs[0], grad, sums);
      if (gradients == 2) accumulate_grad(*self.inputs[0], grad, sums);
    });
  };
  nn::Conv2d conv(3, 4, 1, rng);
  const Var y = conv(x);
  EXPECT_TRUE(y.node().wants_grad_column_sums);
  consume(y, 1).backward();
  EXPECT_EQ(conv.bias.grad().to_vector(), sums.to_vector());

  nn::Conv2d twice(3, 4, 1, rng);
  consume(twice(x), 2).backward();
  const std::vector<float> g = grad.to_vector(), db = twice.bias.grad().to_vector();
  for (size_t c = 0; c < 4; ++c) {
    double total = 0.0;
    for (size_t i = c; i < g.size(); i += 4) total += 2.0 * g[i];
    EXPECT_NEAR(db[c], total, 1e-5) << "channel " << c << ": reduced over the summed gradient";
  }

  nn::Conv2d with_relu(3, 4, 1, rng), frozen_bias(3, 4, 1, rng);
  with_relu.absorb_relu();
  frozen_bias.bias.requires_grad_(false);
  EXPECT_FALSE(with_relu(x).node().wants_grad_column_sums) << "the ReLU's mask lies between";
  EXPECT_FALSE(frozen_bias(x).node().wants_grad_column_sums) << "no bias gradient to sum";
}

// A batch norm's input gradient given as its terms (BatchNormInputGrad) to a conv whose input
// needs no gradient waits unwritten until the conv's backward runs; the CPU's conv, which cannot
// read it so (conv2d_reads_batchnorm_input_grad), writes it first: its gradients equal those from
// dx written by batchnorm_backward, its bias taking the written dx's sums. A second gradient,
// before or after, has the terms written and added; a node that does not take terms gets them
// written at once; the gradient observer sees the gradient written.
TEST(Autograd, ABatchNormInputGradientWaitsAsItsTermsForTheOpThatReadsIt) {
  Rng rng(23);
  const Shape out{2, 3, 3, 4};
  const Var x(test::random_tensor(rng, {2, 3, 3, 3})); // needs no gradient
  const BatchNormInputGrad terms{test::random_tensor(rng, out),
                                 test::random_tensor(rng, out),
                                 test::random_tensor(rng, {4}, DType::f32, Device::cpu, 0.5f, 1.5f),
                                 test::random_tensor(rng, {4}),
                                 test::random_tensor(rng, {4}),
                                 test::random_tensor(rng, {4}, DType::f32, Device::cpu, 0.5f, 2.0f),
                                 test::random_tensor(rng, {2, 4}),
                                 true,
                                 true};
  // Each use gets its own dy: the terms' gradient is written over it.
  const auto fresh = [&] {
    BatchNormInputGrad t = terms;
    t.dy = terms.dy.clone();
    return t;
  };
  BatchNormParams bn;
  bn.training = true, bn.relu = true, bn.grad_sums = &terms.grad_sums;
  Tensor dx = Tensor::empty(out), no_dgamma, no_dbeta;
  kernels::batchnorm_backward(terms.x, terms.gamma, terms.beta, terms.mean, terms.invstd, terms.dy,
                              dx, no_dgamma, no_dbeta, bn);
  const Tensor other = test::random_tensor(rng, out);

  // The consumer gives y's node `dx` as a tensor, or as the terms, then `second` when defined.
  const auto consume = [&](const Var& y, bool as_terms, const Tensor& second, bool second_first) {
    return Var::from_op("consumer", Tensor::zeros({1}), {y}, false, [=](Node& self) {
      Node& input = *self.inputs[0];
      if (second_first && second.defined()) accumulate_grad(input, second);
      if (as_terms) {
        accumulate_grad(input, fresh());
        const bool came_second = second_first && second.defined();
        EXPECT_EQ(input.batchnorm_input_grad.has_value(), !came_second)
            << "the terms wait only as the node's first gradient";
        EXPECT_EQ(input.grad.defined(), came_second);
      } else {
        accumulate_grad(input, dx.clone());
      }
      if (!second_first && second.defined()) accumulate_grad(input, second);
    });
  };
  struct Grads {
    std::vector<float> weight, bias;
  };
  const auto run = [&](bool as_terms, const Tensor& second = Tensor(), bool second_first = false) {
    Rng init(29);
    nn::Conv2d conv(3, 4, 1, init);
    const Var y = conv(x);
    EXPECT_TRUE(y.node().takes_batchnorm_input_grad) << "its input needs no gradient";
    consume(y, as_terms, second, second_first).backward();
    return Grads{conv.weight.grad().to_vector(), conv.bias.grad().to_vector()};
  };
  const Grads written = run(false), waited = run(true);
  EXPECT_EQ(waited.weight, written.weight);
  EXPECT_EQ(waited.bias, written.bias);
  const Grads summed = run(false, other);
  EXPECT_EQ(run(true, other).weight, summed.weight) << "the terms, then a tensor";
  EXPECT_EQ(run(true, other, true).weight, summed.weight) << "a tensor, then the terms";

  // A node that does not take terms: written at once, with their column sums when it wants them.
  Node plain;
  plain.shape = out;
  plain.wants_grad_column_sums = true;
  accumulate_grad(plain, fresh());
  EXPECT_FALSE(plain.batchnorm_input_grad.has_value());
  EXPECT_EQ(plain.grad.to_vector(), dx.to_vector());
  Tensor dx_sums = Tensor::zeros({4});
  kernels::bias_backward(dx, dx_sums);
  EXPECT_EQ(plain.grad_column_sums.to_vector(), dx_sums.to_vector());

  // The observer reads node.grad: a node holding terms has them written before it is shown.
  int observed = 0;
  set_grad_observer([&](const Node& node) {
    EXPECT_TRUE(node.grad.defined() && !node.batchnorm_input_grad) << node.op;
    ++observed;
  });
  const Grads observed_grads = run(true);
  set_grad_observer(nullptr);
  EXPECT_EQ(observed, 2); // the consumer and the conv
  EXPECT_EQ(observed_grads.weight, written.weight);

  Node wrong;
  wrong.shape = {2, 3, 3, 5};
  expect_error([&] { accumulate_grad(wrong, fresh()); }, "accumulate_grad",
               "batch norm input gradient of x f32[2, 3, 3, 4] on cpu does not match");
}

TEST(Autograd, LeafVarsKeepGatheringGradientsAcrossGraphs) {
  Var x(Tensor::full({2}, 1.0f), true);
  const Tensor three = Tensor::full({1}, 3.0f);
  for (int step = 0; step < 2; ++step)
    ops::mse_loss(ops::mul_scalar(x, three), Tensor::zeros({2})).backward();
  // d/dx mean((3x)^2) = 9x, twice.
  EXPECT_EQ(x.grad().to_vector(), std::vector<float>(2, 18.0f));
}

TEST(Autograd, DroppingAVeryDeepGraphDoesNotOverflowTheStack) {
  Var chain(Tensor::zeros({1}), true);
  for (int i = 0; i < 1'000'000; ++i) chain = ops::reshape(chain, {1});
  // Frees a million nodes, each the only owner of the next: a recursive teardown overflowed the
  // stack here (SIGSEGV).
  chain = Var();
}

TEST(Autograd, UsingAnUndefinedVarIsAnError) {
  const Var undefined;
  expect_error([&] { ops::relu(undefined); }, "Var: used before it was given a value");
  expect_error([&] { undefined.shape(); }, "Var: used before it was given a value");
  expect_error([&] { Var::from_op("custom", Tensor::zeros({1}), {undefined}, true, [](Node&) {}); },
               "custom: an input Var was used before it was given a value");
}

} // namespace
} // namespace minamp
