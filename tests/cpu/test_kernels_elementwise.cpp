// Tests of the CPU elementwise and pooling kernels: fill, cast (round to nearest even),
// add_inplace and mul_scalar with mixed dtypes, ReLU and global average pooling (forward against
// double references, backward by finite differences), sum_squares / clip_coefficient and
// range_counts in f16 and bf16.
#include "kernels/kernels.h"
#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

constexpr double kF32Tolerance = 1e-6;
constexpr double kGradientTolerance = 1e-4;

TEST(CpuElementwise, FillWritesEveryDtype) {
  Tensor f32 = poisoned({3, 5}), f16 = poisoned({7}, DType::f16);
  Tensor i32 = Tensor::empty({4}, DType::i32);
  cpu::fill(f32, 0.1f);
  cpu::fill(f16, 0.1f);
  cpu::fill(i32, -3.0f);
  EXPECT_EQ(f32.to_vector(), std::vector<float>(15, 0.1f));
  EXPECT_EQ(f16.to_vector(), std::vector<float>(7, round_to_half(0.1f)));
  EXPECT_EQ(i32.to_vector(), std::vector<float>(4, -3.0f));
  expect_error([&] { cpu::fill(i32, std::nanf("")); }, "fill", "i32");
}

TEST(CpuElementwise, CastRoundsToNearestEvenAndWidensExactly) {
  // 1 + 2^-11 is halfway between two f16 values: ties go to the even one (1.0);
  // 1 + 3 * 2^-11 goes up to 1 + 2^-9; 70000 overflows to inf; 2^-24 is the smallest subnormal.
  const std::vector<float> values = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 70000.0f, 0x1p-24f,
                                     -2.5f};
  const Tensor src = Tensor::from_vector(values, {5});
  Tensor f16 = poisoned({5}, DType::f16);
  cpu::cast(src, f16);
  const std::vector<float> expected = {1.0f, 1.0f + 0x1p-9f, INFINITY, 0x1p-24f, -2.5f};
  EXPECT_EQ(f16.to_vector(), expected);
  Tensor back = poisoned({5});
  cpu::cast(f16, back);
  EXPECT_EQ(back.to_vector(), expected);
  Tensor ints = Tensor::empty({2}, DType::i32);
  cpu::cast(Tensor::from_vector({2.75f, -1.5f}, {2}), ints);
  EXPECT_EQ(ints.to_vector(), (std::vector<float>{2.0f, -1.0f})); // truncation, like from_vector
  expect_error(
      [&] {
        cpu::cast(Tensor::from_vector({1.0f, 3e9f}, {2}), ints);
      },
      "cast", "does not fit i32[2]");
  // i32 to f16 and f32: the integers as floats, rounded to f16's nearest (2049 is a tie: 2048).
  const Tensor labels = Tensor::from_vector({3.0f, -7.0f, 2049.0f}, {3}, DType::i32);
  Tensor labels16 = poisoned({3}, DType::f16), labels32 = poisoned({3});
  cpu::cast(labels, labels16);
  cpu::cast(labels, labels32);
  EXPECT_EQ(labels16.to_vector(), (std::vector<float>{3.0f, -7.0f, 2048.0f}));
  EXPECT_EQ(labels32.to_vector(), (std::vector<float>{3.0f, -7.0f, 2049.0f}));
}

TEST(CpuElementwise, AddInplaceMixesDtypesInFp32) {
  Rng rng(41);
  const Tensor src16 = random_tensor(rng, {6, 7}, DType::f16);
  const Tensor dst_start = random_tensor(rng, {42});
  Tensor dst = dst_start.clone();
  cpu::add_inplace(dst, src16, -0.5f);
  Doubles ref = to_doubles(dst_start);
  const Doubles src = to_doubles(src16);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += -0.5 * src[i];
  EXPECT_LT(relative_error_to(dst, ref), kF32Tolerance);

  Tensor dst16 = random_tensor(rng, {42}, DType::f16);
  const Tensor dst16_start = dst16.clone(), src32 = random_tensor(rng, {42});
  cpu::add_inplace(dst16, src32, 3.0f);
  const std::vector<float> a = dst16_start.to_vector(), b = src32.to_vector();
  const std::vector<float> got = dst16.to_vector();
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], round_to_half(a[i] + 3.0f * b[i]));
  expect_error([&] { cpu::add_inplace(dst, Tensor::zeros({41}), 1.0f); }, "add_inplace",
               "same number of elements");
}

TEST(CpuElementwise, MulScalarReadsScaleTensorAndMayWorkInPlace) {
  Rng rng(42);
  const Tensor scale = Tensor::from_vector({0.375f}, {1});
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor src = random_tensor(rng, {5, 9}, dtype);
    Tensor in_place = src.clone();
    cpu::mul_scalar(in_place, scale, in_place);
    const std::vector<float> before = src.to_vector(), after = in_place.to_vector();
    for (size_t i = 0; i < after.size(); ++i) {
      const float product = before[i] * 0.375f;
      ASSERT_EQ(after[i], round_to(dtype, product)) << dtype;
    }
  }
  Tensor dst = poisoned({3});
  expect_error([&] { cpu::mul_scalar(Tensor::zeros({3}), Tensor::zeros({2}), dst); }, "mul_scalar",
               "scale");
}

TEST(CpuRelu, ForwardClampsAndBackwardMatchesFiniteDifferences) {
  Rng rng(43);
  const Tensor x = random_tensor(rng, {3, 4, 5});
  Tensor y = poisoned({3, 4, 5});
  cpu::relu_forward(x, y);
  Doubles ref = to_doubles(x);
  for (double& v : ref) v = std::max(v, 0.0);
  EXPECT_EQ(relative_error_to(y, ref), 0.0);

  const Tensor r = random_tensor(rng, {3, 4, 5});
  Tensor dx = poisoned({3, 4, 5});
  cpu::relu_backward(y, r, dx);
  const Doubles r0 = to_doubles(r);
  const Doubles num_dx = numerical_gradient(
      [&](const Doubles& v) {
        double sum = 0.0;
        for (size_t i = 0; i < v.size(); ++i) sum += r0[i] * std::max(v[i], 0.0);
        return sum;
      },
      to_doubles(x));
  EXPECT_LT(relative_error_to(dx, num_dx), kGradientTolerance);

  const Tensor x16 = random_tensor(rng, {33}, DType::f16);
  Tensor y16 = poisoned({33}, DType::f16);
  cpu::relu_forward(x16, y16);
  const std::vector<float> in = x16.to_vector(), out = y16.to_vector();
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], std::max(in[i], 0.0f));
  Tensor y_wrong = poisoned({33});
  expect_error([&] { cpu::relu_forward(x16, y_wrong); }, "relu_forward", "y must match x");
  Tensor y_short = poisoned({32}, DType::f16);
  expect_error([&] { cpu::relu_forward(x16, y_short); }, "relu_forward",
               "y must match x f16[33] on cpu, got f16[32]");
}

TEST(CpuRelu, ForwardPropagatesNaN) {
  const Tensor x = Tensor::from_vector({std::nanf(""), -1.0f}, {2});
  Tensor y = poisoned({2});
  cpu::relu_forward(x, y);
  EXPECT_TRUE(std::isnan(y.to_vector()[0]));
  EXPECT_EQ(y.to_vector()[1], 0.0f);
}

// As PyTorch's threshold_backward: the gradient is zeroed where y <= 0 and passes elsewhere,
// a NaN output included (an overflow is not hidden from the loss scaler's check).
TEST(CpuRelu, BackwardPassesTheGradientWhereTheOutputIsNaN) {
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor y = Tensor::from_vector({std::nanf(""), 0.0f, 2.0f}, {3}).to(dtype);
    const Tensor dy = Tensor::from_vector({3.0f, 4.0f, 5.0f}, {3}).to(dtype);
    Tensor dx = poisoned({3}, dtype);
    cpu::relu_backward(y, dy, dx);
    EXPECT_EQ(dx.to_vector(), (std::vector<float>{3.0f, 0.0f, 5.0f})) << dtype;
  }
}

Doubles avgpool_reference(const Doubles& x, const Shape& shape) {
  const int64_t n = shape[0], pixels = shape[1] * shape[2], channels = shape[3];
  Doubles y(static_cast<size_t>(n * channels), 0.0);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t p = 0; p < pixels; ++p)
      for (int64_t c = 0; c < channels; ++c)
        y[s * channels + c] += x[(s * pixels + p) * channels + c] / pixels;
  return y;
}

TEST(CpuAvgPool, ForwardMatchesReferenceAndBackwardMatchesFiniteDifferences) {
  Rng rng(44);
  for (const Shape& shape : {Shape{2, 3, 5, 7}, Shape{1, 1, 1, 4}, Shape{3, 4, 4, 1}}) {
    const int64_t n = shape[0], channels = shape[3];
    const Tensor x = random_tensor(rng, shape);
    Tensor y = poisoned({n, channels});
    cpu::avgpool_forward(x, y);
    EXPECT_LT(relative_error_to(y, avgpool_reference(to_doubles(x), shape)), kF32Tolerance)
        << shape;

    const Tensor r = random_tensor(rng, {n, channels});
    Tensor dx = poisoned(shape);
    cpu::avgpool_backward(r, dx);
    const Doubles r0 = to_doubles(r);
    const Doubles num_dx = numerical_gradient(
        [&](const Doubles& v) { return dot(r0, avgpool_reference(v, shape)); }, to_doubles(x));
    EXPECT_LT(relative_error_to(dx, num_dx), kGradientTolerance) << shape;
  }
  Tensor y = poisoned({2, 3});
  expect_error(
      [&] {
        cpu::avgpool_forward(Tensor::zeros({2, 3}), y);
      },
      "avgpool_forward", "expects x [N, H, W, C], got f32[2, 3]");
  expect_error(
      [&] {
        cpu::avgpool_forward(Tensor::zeros({2, 2, 2, 4}), y);
      },
      "avgpool_forward", "expects y [2, 4]");
}

TEST(CpuGradientNorm, SumSquaresAccumulatesAndClipCoefficientClamps) {
  Rng rng(45);
  const Tensor a = random_tensor(rng, {10, 3}), b = random_tensor(rng, {7}, DType::f16);
  Tensor sum_sq = Tensor::from_vector({0.25f}, {1});
  cpu::sum_squares(a, sum_sq);
  cpu::sum_squares(b, sum_sq);
  double expected = 0.25;
  for (double v : to_doubles(a)) expected += v * v;
  for (double v : to_doubles(b)) expected += v * v;
  EXPECT_LT(relative_error_to(sum_sq, {expected}), kF32Tolerance);

  Tensor coef = poisoned({1});
  const float norm = std::sqrt(sum_sq.item());
  cpu::clip_coefficient(sum_sq, norm / 4.0f, coef); // the norm is 4x too large
  EXPECT_NEAR(coef.item(), 0.25f, 1e-6f);
  cpu::clip_coefficient(sum_sq, norm * 4.0f, coef); // already small enough: no scaling
  EXPECT_EQ(coef.item(), 1.0f);
  // PyTorch's 1e-6 in max_norm / (norm + 1e-6): at norm 1e-6 it halves the coefficient.
  cpu::clip_coefficient(Tensor::from_vector({1e-12f}, {1}), 1e-7f, coef);
  EXPECT_NEAR(coef.item(), 0.05f, 1e-6f);
}

// Each value is built to land in one class once multiplied by the scale 1024.
TEST(CpuRangeCounts, ClassifiesScaledValuesInF16) {
  const float scale = 1024.0f;
  const std::vector<float> values = {
      0.0f,          // zero: counted nowhere
      1e-12f,        // 1e-9 after scaling: flushes to zero
      -3e-10f,       // 3e-7 after scaling: subnormal
      1e-9f,         // 1e-6: subnormal
      0.5f,          // 512: normal
      -100.0f,       // -102400: overflows
      INFINITY,      // not finite
      std::nanf(""), // not finite
      1e30f,         // 1e33, finite in float: overflows f16
      1e36f,         // the product itself overflows float: overflows
  };
  Tensor counts = Tensor::from_vector({1, 2, 3, 4, 5}, {5}); // accumulates onto these
  cpu::range_counts(Tensor::from_vector(values, {10}), scale, DType::f16, counts);
  EXPECT_EQ(counts.to_vector(), (std::vector<float>{1 + 1, 2 + 2, 3 + 3, 4 + 7, 5 + 2}));

  // On the edges: flushed, subnormal, overflow, nonzero, nonfinite.
  Tensor edges = Tensor::zeros({5});
  cpu::range_counts(Tensor::from_vector(kFp16RangeEdgesAt1024, {6}), scale, DType::f16, edges);
  EXPECT_EQ(edges.to_vector(), (std::vector<float>{1, 2, 1, 6, 0}));
}

// bf16 has float's range: what flushes or overflows in f16 (1e-9, 1e30) is normal in bf16, and
// only values near float's own ends flush, turn subnormal or overflow.
TEST(CpuRangeCounts, ClassifiesValuesInBf16) {
  const std::vector<float> values = {
      0.0f,          // zero: counted nowhere
      1e-45f,        // float's smallest subnormal, 2^-149: flushes to zero in bf16
      1e-39f,        // below 2^-126: subnormal
      1e-9f,         // flushes in f16 (subnormal at scale 1024), normal in bf16
      1e30f,         // overflows f16, normal in bf16
      3.4e38f,       // past the tie between bf16's largest finite value and 2^128: overflows
      INFINITY,      // not finite
      std::nanf(""), // not finite
  };
  Tensor counts = Tensor::zeros({5});
  cpu::range_counts(Tensor::from_vector(values, {8}), 1.0f, DType::bf16, counts);
  EXPECT_EQ(counts.to_vector(), (std::vector<float>{1, 1, 1, 5, 2}));

  Tensor edges = Tensor::zeros({5});
  cpu::range_counts(Tensor::from_vector(kBf16RangeEdgesAt1024, {6}), 1024.0f, DType::bf16, edges);
  EXPECT_EQ(edges.to_vector(), (std::vector<float>{1, 2, 1, 6, 0}));
  test::expect_error([&] { cpu::range_counts(Tensor::zeros({1}), 1.0f, DType::f32, counts); },
                     "range_counts", "the format must be f16 or bf16, got f32");
}

} // namespace
} // namespace minamp::test
