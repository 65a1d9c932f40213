// Autocast on the CPU: the policy table's output dtypes (f16 and bf16 scopes), fp32 ops on
// unrounded inputs, nested scopes, the 16-bit product of the 16-bit weight copy with fp32
// accumulation, 16-bit saved activations; and why reductions accumulate in fp32 and why weights
// keep an fp32 master.
#include <gtest/gtest.h>

#include <cmath>

#include "amp/autocast.h"
#include "kernels/kernels.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "test_util.h"

namespace minamp {
namespace {

TEST(Autocast, OutputDtypesFollowThePolicyTable) {
  Rng rng(1);
  nn::Linear linear(4, 3, rng);
  nn::Conv2d conv(2, 3, 3, rng, 1, 1);
  nn::BatchNorm bn(3);
  Rng data(2);
  const Var x(test::random_tensor(data, {5, 4}));
  const Var image(test::random_tensor(data, {1, 4, 4, 2}));
  {
    amp::Autocast autocast;
    EXPECT_EQ(linear(x).dtype(), DType::f16);
    EXPECT_EQ(conv(image).dtype(), DType::f16);
    EXPECT_EQ(bn(conv(image)).dtype(), DType::f16);
    EXPECT_EQ(bn(Var(test::random_tensor(data, {6, 3}))).dtype(), DType::f16); // f32 in -> f16
    EXPECT_EQ(ops::relu(linear(x)).dtype(), DType::f16);
    EXPECT_EQ(ops::relu(x).dtype(), DType::f32); // keeps its input dtype
    EXPECT_EQ(ops::mse_loss(linear(x), Tensor::zeros({5, 3})).dtype(), DType::f32);
    EXPECT_EQ(ops::cross_entropy(linear(x), Tensor::from_vector({0, 1, 2, 0, 1}, {5}, DType::i32))
                  .dtype(),
              DType::f32);
  }
  EXPECT_EQ(linear(x).dtype(), DType::f32);
  EXPECT_EQ(linear(ops::cast(x, DType::f16)).dtype(), DType::f32); // outside autocast: fp32
  const Var rows_f16 = ops::cast(Var(test::random_tensor(data, {6, 3})), DType::f16);
  EXPECT_EQ(bn(rows_f16).dtype(), DType::f16); // batch norm keeps its input's dtype
  EXPECT_FALSE(amp::autocast_enabled());
}

// The losses (fp32 class) take f32 inputs as they are under autocast: values that f16 cannot hold
// (1 + 2^-13 rounds to 1, 70000 overflows) give the same loss as outside autocast.
TEST(Autocast, Fp32OpsComputeOnTheirF32InputsUnrounded) {
  const Tensor values = Tensor::from_vector({1.0f + 0x1p-13f, 70000.0f, -3.0f, 0.5f}, {2, 2});
  const Tensor target = Tensor::zeros({2, 2});
  const Tensor labels = Tensor::from_vector({0, 1}, {2}, DType::i32);
  const float mse = ops::mse_loss(Var(values), target).value().item();
  const float cross_entropy = ops::cross_entropy(Var(values), labels).value().item();
  ASSERT_TRUE(std::isfinite(mse) && std::isfinite(cross_entropy));
  amp::Autocast autocast;
  EXPECT_EQ(amp::autocast_dtype(amp::OpClass::fp32, DType::f16), DType::f32);
  EXPECT_EQ(ops::mse_loss(Var(values), target).value().item(), mse);
  EXPECT_EQ(ops::cross_entropy(Var(values), labels).value().item(), cross_entropy);
}

TEST(Autocast, ScopesNestAndRestore) {
  amp::Autocast outer(true);
  {
    amp::Autocast inner(false);
    EXPECT_FALSE(amp::autocast_enabled());
  }
  EXPECT_TRUE(amp::autocast_enabled());
}

// torch.autocast(dtype=torch.bfloat16): the same table, bf16 where f16 was; an inner scope's
// dtype ends with it.
TEST(Autocast, Bf16ScopeComputesInBf16) {
  Rng rng(7);
  nn::Linear linear(4, 3, rng);
  nn::Conv2d conv(2, 3, 3, rng, 1, 1);
  nn::BatchNorm bn(3);
  Rng data(8);
  const Var x(test::random_tensor(data, {5, 4}));
  const Var image(test::random_tensor(data, {1, 4, 4, 2}));
  amp::Autocast autocast(true, DType::bf16);
  EXPECT_EQ(linear(x).dtype(), DType::bf16);
  EXPECT_EQ(bn(conv(image)).dtype(), DType::bf16);
  EXPECT_EQ(ops::relu(linear(x)).dtype(), DType::bf16);
  EXPECT_EQ(ops::add(linear(x), linear(x)).dtype(), DType::bf16); // a residual sum stays bf16
  EXPECT_EQ(ops::mse_loss(linear(x), Tensor::zeros({5, 3})).dtype(), DType::f32);
  EXPECT_EQ(linear.weight.half_copy().dtype(), DType::bf16);
  {
    amp::Autocast inner(true, DType::f16);
    EXPECT_EQ(linear(x).dtype(), DType::f16);
    EXPECT_EQ(linear.weight.half_copy().dtype(), DType::f16); // the copy follows the scope
  }
  EXPECT_EQ(linear(x).dtype(), DType::bf16);
  test::expect_error([] { amp::Autocast bad(true, DType::f32); }, "Autocast",
                     "dtype must be f16 or bf16, got f32");
}

// Under autocast a Linear multiplies the 16-bit copies of x and W (rounded to nearest even) with
// fp32 accumulation and rounds the result once: y = round(sum round(x) round(w)).
void expect_16bit_product_of_16bit_copies(DType dtype, float (*round)(float), double relative) {
  Rng rng(3);
  nn::Linear layer(40, 5, rng, /*bias=*/false);
  Rng data(4);
  const Tensor x = test::random_tensor(data, {3, 40});
  amp::Autocast autocast(true, dtype);
  const std::vector<float> y = layer(Var(x)).value().to_vector();
  const std::vector<float> w = layer.weight.master().to_vector(), xv = x.to_vector();
  for (int r = 0; r < 3; ++r) {
    for (int o = 0; o < 5; ++o) {
      double sum = 0;
      for (int k = 0; k < 40; ++k) sum += double(round(xv[r * 40 + k])) * round(w[o * 40 + k]);
      // fp32 accumulation may differ from the double sum in the last float bits before rounding.
      EXPECT_NEAR(y[r * 5 + o], round(float(sum)), std::abs(sum) * relative + 1e-6);
      EXPECT_EQ(y[r * 5 + o], round(y[r * 5 + o])) << "a value of " << dtype;
    }
  }
  // The copy, not the master, is multiplied: a copy of twice the master doubles the output.
  Tensor& copy = layer.weight.half_copy();
  ASSERT_EQ(copy.dtype(), dtype);
  kernels::mul_scalar(copy, Tensor::full({1}, 2.0f), copy); // exact in f16 and bf16
  const std::vector<float> doubled = layer(Var(x)).value().to_vector();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(doubled[i], 2.0f * y[i]) << i;
}

TEST(Autocast, LinearIsTheF16ProductOfTheF16CopyWithFp32Accumulation) {
  expect_16bit_product_of_16bit_copies(DType::f16, round_to_half, 1e-3);
}

TEST(Autocast, LinearIsTheBf16ProductOfTheBf16CopyWithFp32Accumulation) {
  expect_16bit_product_of_16bit_copies(DType::bf16, round_to_bfloat16, 8e-3);
}

TEST(Autocast, SavedActivationsAreHalfTheMemory) {
  Rng rng(5);
  nn::Sequential net;
  for (int i = 0; i < 8; ++i) net.emplace<nn::Linear>(256, 256, rng).emplace<nn::ReLU>();
  Rng data(6);
  const Tensor x = test::random_tensor(data, {512, 256});
  auto activation_bytes = [&](bool amp) {
    for (Parameter* p : net.parameters()) p->working_copy(amp ? DType::f16 : DType::f32);
    Allocator& cpu = allocator_for(Device::cpu);
    const size_t before = cpu.live_bytes();
    amp::Autocast autocast(amp);
    Var y = net(Var(x, true)); // the graph holds every saved activation
    return cpu.live_bytes() - before;
  };
  // 8 f16 outputs plus the f16 copy of the input, against 8 f32 outputs: 9 / 16.
  const double ratio = double(activation_bytes(true)) / double(activation_bytes(false));
  EXPECT_LT(ratio, 0.6) << "AMP activations / FP32 activations";
  EXPECT_GT(ratio, 0.4);
}

// Why reductions accumulate in fp32: an f16 running sum of ones stops at 2048, where the spacing
// of f16 values becomes 2 and 2048 + 1 rounds back to 2048 (ties to even).
TEST(WhyFp32, F16RunningSumStallsAt2048WhileFp32AccumulationIsExact) {
  float f16_sum = 0, f32_sum = 0;
  for (int i = 0; i < 4096; ++i) {
    f16_sum = round_to_half(f16_sum + 1.0f);
    f32_sum += 1.0f;
  }
  EXPECT_EQ(f16_sum, 2048.0f);
  EXPECT_EQ(f32_sum, 4096.0f);
  // The GEMM kernels accumulate in fp32 even for f16 operands: a 1 x 4096 x 1 product of ones.
  const Tensor ones = Tensor::full({1, 4096}, 1.0f, DType::f16);
  Tensor out = Tensor::empty({1, 1}, DType::f32);
  kernels::gemm(ones, false, ones, true, out, GemmEpilogue{});
  EXPECT_EQ(out.item(), 4096.0f);
}

// Why weights keep an fp32 master, and more so in bf16: an update smaller than half the spacing
// of 16-bit values at the weight rounds away. Just below w = 1, bf16's spacing is 2^-8 (f16's
// 2^-11): a thousand steps of -2^-10 leave a bf16 weight at 1, while the fp32 master (what
// minamp's optimizers update) takes every one of them.
TEST(WhyFp32, Bf16WeightUpdatesBelowHalfAnUlpVanishWithoutAnFp32Master) {
  float bf16_weight = 1.0f, f16_weight = 1.0f, master = 1.0f;
  for (int i = 0; i < 1000; ++i) {
    bf16_weight = round_to_bfloat16(bf16_weight - 0x1p-10f);
    f16_weight = round_to_half(f16_weight - 0x1p-10f);
    master -= 0x1p-10f;
  }
  EXPECT_EQ(bf16_weight, 1.0f);  // 2^-10 < 2^-8, half of bf16's spacing below 1: every step lost
  EXPECT_EQ(master, 0.0234375f); // 1 - 1000 * 2^-10, exact in fp32
  EXPECT_EQ(f16_weight, master); // f16's spacing below 1 is 2^-11: here every step lands
}

} // namespace
} // namespace minamp
