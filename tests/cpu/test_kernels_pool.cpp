// Tests of the CPU max pooling kernels: the forward pass and its argmax against a double
// reference (PyTorch's tie and NaN rules included), the backward pass by finite differences, f16
// storage, thread-count independence and the argument checks.
#include <cmath>
#include <numeric>

#include "kernels/kernels.h"
#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

// A max pooling case: x [n, h, w, c] pooled by `pool`.
struct MaxPoolCase {
  int64_t n, h, w, c;
  MaxPoolParams pool;
  int64_t ho() const { return (h + 2 * pool.pad - pool.kernel) / pool.stride + 1; }
  int64_t wo() const { return (w + 2 * pool.pad - pool.kernel) / pool.stride + 1; }
  Shape x_shape() const { return {n, h, w, c}; }
  Shape y_shape() const { return {n, ho(), wo(), c}; }
};

std::ostream& operator<<(std::ostream& out, const MaxPoolCase& m) {
  return out << m.x_shape() << " kernel " << m.pool.kernel << " stride " << m.pool.stride << " pad "
             << m.pool.pad;
}

// y and the argmax pixel (ih * w + iw) by the definition: the first largest value in row-major
// window order, a NaN taking over (the last one wins), padding never taken.
struct MaxPoolReference {
  Doubles y;
  std::vector<int32_t> argmax;
};

MaxPoolReference maxpool_reference(const Doubles& x, const MaxPoolCase& m) {
  MaxPoolReference out;
  for (int64_t s = 0; s < m.n; ++s)
    for (int64_t oh = 0; oh < m.ho(); ++oh)
      for (int64_t ow = 0; ow < m.wo(); ++ow)
        for (int64_t c = 0; c < m.c; ++c) {
          double best = -INFINITY;
          int32_t best_pixel = -1;
          for (int64_t i = 0; i < m.pool.kernel; ++i)
            for (int64_t j = 0; j < m.pool.kernel; ++j) {
              const int64_t ih = oh * m.pool.stride - m.pool.pad + i;
              const int64_t iw = ow * m.pool.stride - m.pool.pad + j;
              if (ih < 0 || ih >= m.h || iw < 0 || iw >= m.w) continue;
              const double v = x[((s * m.h + ih) * m.w + iw) * m.c + c];
              if (best_pixel < 0 || v > best || std::isnan(v)) {
                best = v;
                best_pixel = int32_t(ih * m.w + iw);
              }
            }
          out.y.push_back(best);
          out.argmax.push_back(best_pixel);
        }
  return out;
}

const std::vector<MaxPoolCase> kCases = {
    {2, 7, 7, 3, {3, 2, 1}}, // ResNet's stem, odd size
    {1, 8, 6, 5, {3, 2, 1}}, // even sizes
    {1, 6, 5, 2, {2, 2, 0}}, // windows that do not overlap, a column left over
    {2, 4, 4, 1, {3, 1, 1}}, // stride 1: each pixel in up to nine windows
    {1, 3, 3, 4, {1, 1, 0}}, // the identity
};

std::vector<int32_t> ints(const Tensor& t) {
  return {t.data<int32_t>(), t.data<int32_t>() + t.numel()};
}

TEST(CpuMaxPool, ForwardMatchesTheDefinition) {
  Rng rng(81);
  for (const MaxPoolCase& m : kCases) {
    const Tensor x = random_tensor(rng, m.x_shape());
    Tensor y = poisoned(m.y_shape());
    Tensor argmax = Tensor::full(m.y_shape(), -7.0f, DType::i32);
    cpu::maxpool2d_forward(x, y, argmax, m.pool);
    const MaxPoolReference ref = maxpool_reference(to_doubles(x), m);
    EXPECT_EQ(to_doubles(y), ref.y) << m; // a max is exact
    EXPECT_EQ(ints(argmax), ref.argmax) << m;
  }
}

TEST(CpuMaxPool, BackwardMatchesFiniteDifferences) {
  Rng rng(82);
  for (const MaxPoolCase& m : kCases) {
    const Tensor x = random_tensor(rng, m.x_shape());
    Tensor y = poisoned(m.y_shape());
    Tensor argmax = Tensor::empty(m.y_shape(), DType::i32);
    cpu::maxpool2d_forward(x, y, argmax, m.pool);
    const Tensor r = random_tensor(rng, m.y_shape());
    Tensor dx = poisoned(m.x_shape());
    cpu::maxpool2d_backward(r, argmax, dx, m.pool);
    const Doubles r0 = to_doubles(r);
    const Doubles numeric = numerical_gradient(
        [&](const Doubles& v) { return dot(r0, maxpool_reference(v, m).y); }, to_doubles(x));
    EXPECT_LT(relative_error_to(dx, numeric), 1e-6) << m;
  }
}

TEST(CpuMaxPool, TiesGoToTheFirstPixelAndNaNWins) {
  const MaxPoolCase m{1, 3, 3, 1, {3, 2, 1}}; // 2x2 outputs over a 3x3 image
  Tensor x = Tensor::zeros(m.x_shape());
  Tensor y = poisoned(m.y_shape()), argmax = Tensor::empty(m.y_shape(), DType::i32);
  cpu::maxpool2d_forward(x, y, argmax, m.pool);
  // Windows start at (0, 0), (0, 1), (1, 0), (1, 1) once the padding is clipped.
  EXPECT_EQ(ints(argmax), (std::vector<int32_t>{0, 1, 3, 4}));

  x.data<float>()[4] = std::nanf(""); // the centre is in every window
  x.data<float>()[8] = 5.0f;
  cpu::maxpool2d_forward(x, y, argmax, m.pool);
  for (float v : y.to_vector()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(ints(argmax), (std::vector<int32_t>{4, 4, 4, 4}));

  // The centre takes all four gradients, summed.
  Tensor dx = poisoned(m.x_shape());
  cpu::maxpool2d_backward(Tensor::from_vector({1, 2, 3, 4}, m.y_shape()), argmax, dx, m.pool);
  EXPECT_EQ(dx.to_vector(), (std::vector<float>{0, 0, 0, 0, 10, 0, 0, 0, 0}));
}

TEST(CpuMaxPool, F16TakesTheLargestStoredValue) {
  Rng rng(83);
  const MaxPoolCase m = kCases[0];
  const Tensor x = random_tensor(rng, m.x_shape(), DType::f16);
  Tensor y = poisoned(m.y_shape(), DType::f16), argmax = Tensor::empty(m.y_shape(), DType::i32);
  cpu::maxpool2d_forward(x, y, argmax, m.pool);
  const MaxPoolReference ref = maxpool_reference(to_doubles(x), m);
  EXPECT_EQ(to_doubles(y), ref.y);
  EXPECT_EQ(ints(argmax), ref.argmax);
  Tensor dx = poisoned(m.x_shape(), DType::f16);
  const Tensor dy = random_tensor(rng, m.y_shape(), DType::f16);
  cpu::maxpool2d_backward(dy, argmax, dx, m.pool);
  Tensor dx32 = poisoned(m.x_shape());
  cpu::maxpool2d_backward(dy.to(DType::f32), argmax, dx32, m.pool);
  EXPECT_EQ(dx.to_vector(), dx32.to(DType::f16).to_vector()); // fp32 sums, rounded once
}

TEST(CpuMaxPool, ResultsDoNotDependOnTheThreadCount) {
  Rng rng(84);
  const MaxPoolCase m{3, 9, 11, 6, {3, 2, 1}};
  const Tensor x = random_tensor(rng, m.x_shape()), dy = random_tensor(rng, m.y_shape());
  outputs_on_any_thread_count(
      [&] {
        Tensor y = poisoned(m.y_shape()), argmax = Tensor::empty(m.y_shape(), DType::i32);
        cpu::maxpool2d_forward(x, y, argmax, m.pool);
        Tensor dx = poisoned(m.x_shape());
        cpu::maxpool2d_backward(dy, argmax, dx, m.pool);
        return std::vector<Tensor>{y, argmax.to(DType::f32), dx};
      },
      "maxpool2d");
}

TEST(CpuMaxPool, WithoutAnArgmaxOnlyYIsWritten) {
  Rng rng(85);
  const MaxPoolCase m = kCases[1];
  const Tensor x = random_tensor(rng, m.x_shape());
  Tensor y = poisoned(m.y_shape()), no_argmax;
  cpu::maxpool2d_forward(x, y, no_argmax, m.pool);
  EXPECT_EQ(to_doubles(y), maxpool_reference(to_doubles(x), m).y);
}

TEST(CpuMaxPool, RefusesWindowsAndShapesPyTorchRefuses) {
  Tensor x = Tensor::zeros({1, 4, 4, 2}), y = poisoned({1, 2, 2, 2});
  Tensor argmax = Tensor::empty({1, 2, 2, 2}, DType::i32), none;
  expect_error(
      [&] {
        cpu::maxpool2d_forward(x, y, argmax, {3, 2, 2});
      },
      "maxpool2d_forward", "0 <= pad <= kernel / 2, got kernel 3, stride 2, pad 2");
  expect_error(
      [&] {
        cpu::maxpool2d_forward(x, y, argmax, {3, 0, 1});
      },
      "maxpool2d_forward", "stride >= 1");
  expect_error(
      [&] {
        cpu::maxpool2d_forward(Tensor::zeros({1, 2, 2, 2}), y, none, {5, 2, 1});
      },
      "maxpool2d_forward", "the 5x5 window does not fit the padded input f32[1, 2, 2, 2]");
  expect_error(
      [&] {
        cpu::maxpool2d_forward(x, y, argmax, {3, 1, 1});
      },
      "maxpool2d_forward",
      "expects y f32/f16/bf16 [1, 4, 4, 2] (kernel 3, stride 1, pad 1), got f32[1, 2, 2, 2]");
  Tensor wrong_argmax = Tensor::empty({1, 2, 2, 2});
  expect_error(
      [&] {
        cpu::maxpool2d_forward(x, y, wrong_argmax, {3, 2, 1});
      },
      "maxpool2d_forward", "expects argmax i32 [1, 2, 2, 2]");
  Tensor y16 = poisoned({1, 2, 2, 2}, DType::f16);
  expect_error(
      [&] {
        cpu::maxpool2d_forward(x, y16, argmax, {3, 2, 1});
      },
      "maxpool2d_forward", "expects y of x's dtype");
  Tensor dx = poisoned({1, 4, 4, 2});
  expect_error(
      [&] {
        cpu::maxpool2d_backward(y, none, dx, {3, 2, 1});
      },
      "maxpool2d_backward", "expects argmax i32 [1, 2, 2, 2]");
}

TEST(CpuAdd, AddsInFp32RoundsOnceAndFusesRelu) {
  Rng rng(86);
  const Tensor a = random_tensor(rng, {5, 7}, DType::f16), b = random_tensor(rng, {35});
  Tensor y = poisoned({35}, DType::f16), y_relu = poisoned({5, 7});
  cpu::add_forward(a, b, y, false);
  cpu::add_forward(a, b, y_relu, true);
  const std::vector<float> av = a.to_vector(), bv = b.to_vector();
  const std::vector<float> got = y.to_vector(), got_relu = y_relu.to_vector();
  for (size_t i = 0; i < av.size(); ++i) {
    ASSERT_EQ(got[i], round_to_half(av[i] + bv[i])) << i;
    ASSERT_EQ(got_relu[i], std::max(av[i] + bv[i], 0.0f)) << i;
  }
  Tensor nan = Tensor::full({1}, std::nanf("")), out = poisoned({1});
  cpu::add_forward(nan, Tensor::full({1}, -1.0f), out, true);
  EXPECT_TRUE(std::isnan(out.to_vector()[0])) << "a NaN is never hidden by the ReLU";
  expect_error([&] { cpu::add_forward(a, Tensor::zeros({34}), y, false); }, "add_forward",
               "same number of elements");
}

} // namespace
} // namespace minamp::test
