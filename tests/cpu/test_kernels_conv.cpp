// Tests of the CPU convolution kernels (minamp::cpu::conv2d_forward / conv2d_backward): forward
// against the definition in double (1x1 shortcut, stride 2 with padding, odd channel counts,
// batch 1, bias + ReLU epilogue), dx and dw by finite differences, dw accumulation, batches of
// several image groups (the threaded path) against double references and across thread counts,
// the f16 emulation, the Winograd path of 3x3 stride-1 convolutions, and the error messages.
#include "kernels/cpu/conv_winograd.h"
#include "kernels/kernels.h"
#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

constexpr double kF32Tolerance = 1e-6;
constexpr double kGradientTolerance = 1e-4;

std::string name(const ConvCase& c) {
  return cat("x ", c.x_shape(), " w ", c.w_shape(), " stride ", c.stride, " pad ", c.pad);
}

ConvParams params(const ConvCase& c) {
  ConvParams p;
  p.stride = c.stride;
  p.pad = c.pad;
  return p;
}

const ConvCase kCases[] = {
    {2, 5, 6, 3, 4, 3, 3, 1, 1},  // 3x3 same padding
    {1, 7, 7, 17, 5, 3, 3, 2, 1}, // batch 1, stride 2 with padding, Cin 17
    {3, 4, 5, 8, 6, 1, 1, 1, 0},  // 1x1: the plain-GEMM shortcut
    {2, 6, 5, 2, 3, 1, 1, 2, 0},  // 1x1 with stride: not the shortcut
    {2, 5, 4, 3, 2, 2, 3, 2, 2},  // non-square kernel, pad larger than needed
    {1, 1, 1, 5, 7, 1, 1, 1, 0},  // a single pixel
    {2, 3, 4, 3, 2, 1, 1, 1, 1},  // 1x1 with padding: not the shortcut either
    {1, 3, 4, 2, 3, 3, 4, 1, 0},  // the kernel covers the whole input: one output pixel
};

TEST(CpuConv, ForwardMatchesDefinition) {
  Rng rng(21);
  for (const ConvCase& c : kCases) {
    const Tensor x = random_tensor(rng, c.x_shape());
    const Tensor w = random_tensor(rng, c.w_shape());
    Tensor y = poisoned(c.y_shape());
    cpu::conv2d_forward(x, w, y, params(c), {});
    EXPECT_LT(relative_error_to(y, conv_reference(to_doubles(x), to_doubles(w), c)), kF32Tolerance)
        << name(c);
  }
}

// conv(x, w) + bias, then ReLU, through the epilogue, against the definition; returns how many
// outputs the ReLU clamped.
int check_bias_relu_forward(const ConvCase& c, const Tensor& x, const Tensor& w,
                            const Tensor& bias) {
  GemmEpilogue epilogue;
  epilogue.bias = &bias;
  epilogue.relu = true;
  Tensor y = poisoned(c.y_shape());
  cpu::conv2d_forward(x, w, y, params(c), epilogue);
  Doubles ref = conv_reference(to_doubles(x), to_doubles(w), c);
  const Doubles b = to_doubles(bias);
  int clamped = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ref[i] += b[i % c.cout];
    if (ref[i] < 0) ref[i] = 0, ++clamped;
  }
  EXPECT_LT(relative_error_to(y, ref), kF32Tolerance) << name(c) << " with bias and ReLU";
  return clamped;
}

TEST(CpuConv, ForwardAppliesBiasAndRelu) {
  Rng rng(22);
  for (const ConvCase& c : {kCases[1], kCases[2]}) {
    const Tensor x = random_tensor(rng, c.x_shape());
    const Tensor w = random_tensor(rng, c.w_shape());
    const Tensor bias = random_tensor(rng, {c.cout});
    EXPECT_GT(check_bias_relu_forward(c, x, w, bias), 0) << name(c);
  }
}

// dx and dw of L = sum(r .* conv(x, w)) by central differences; dw accumulates onto its start.
TEST(CpuConv, BackwardMatchesFiniteDifferences) {
  Rng rng(23);
  for (const ConvCase& c : kCases) {
    const Tensor x = random_tensor(rng, c.x_shape());
    const Tensor w = random_tensor(rng, c.w_shape());
    const Tensor r = random_tensor(rng, c.y_shape());
    const Tensor dw_start = random_tensor(rng, c.w_shape());
    Tensor dx = poisoned(c.x_shape());
    Tensor dw = dw_start.clone();
    cpu::conv2d_backward(x, w, r, dx, dw, params(c));

    const Doubles x0 = to_doubles(x), w0 = to_doubles(w), r0 = to_doubles(r);
    const Doubles num_dx =
        numerical_gradient([&](const Doubles& v) { return dot(r0, conv_reference(v, w0, c)); }, x0);
    Doubles num_dw =
        numerical_gradient([&](const Doubles& v) { return dot(r0, conv_reference(x0, v, c)); }, w0);
    const Doubles dw_old = to_doubles(dw_start);
    for (size_t i = 0; i < num_dw.size(); ++i) num_dw[i] += dw_old[i];
    EXPECT_LT(relative_error_to(dx, num_dx), kGradientTolerance) << name(c);
    EXPECT_LT(relative_error_to(dw, num_dw), kGradientTolerance) << name(c);
  }
}

// dx and dw of L = sum(dy .* conv(x, w)) from the definition, in double: every tap that reads
// input pixel (s, ih, iw) sends dy * w to dx there and dy * x to dw.
struct ConvGradients {
  Doubles dx, dw;
};
ConvGradients conv_backward_reference(const Doubles& x, const Doubles& w, const Doubles& dy,
                                      const ConvCase& c) {
  ConvGradients g{Doubles(x.size(), 0.0), Doubles(w.size(), 0.0)};
  for (int64_t s = 0; s < c.n; ++s)
    for (int64_t oh = 0; oh < c.ho(); ++oh)
      for (int64_t ow = 0; ow < c.wo(); ++ow)
        for (int64_t o = 0; o < c.cout; ++o) {
          const double grad = dy[((s * c.ho() + oh) * c.wo() + ow) * c.cout + o];
          for (int64_t i = 0; i < c.kh; ++i)
            for (int64_t j = 0; j < c.kw; ++j) {
              const int64_t ih = oh * c.stride - c.pad + i, iw = ow * c.stride - c.pad + j;
              if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
              for (int64_t q = 0; q < c.cin; ++q) {
                const int64_t xi = ((s * c.h + ih) * c.w + iw) * c.cin + q;
                const int64_t wi = ((o * c.kh + i) * c.kw + j) * c.cin + q;
                g.dx[xi] += grad * w[wi];
                g.dw[wi] += grad * x[xi];
              }
            }
        }
  return g;
}

// Batches whose im2col runs in several groups of images (about 2048 output pixels each, the last
// one partial): forward, dx and dw match double references, bit for bit on 1 and on 4 threads.
TEST(CpuConv, ImageGroupsMatchReferencesOnAnyThreadCount) {
  Rng rng(25);
  for (const ConvCase& c : {ConvCase{5, 24, 24, 3, 4, 3, 3, 1, 1},    // groups of 3 images: 3 + 2
                            ConvCase{4, 50, 50, 2, 3, 3, 3, 2, 1}}) { // stride 2: 3 + 1
    const Tensor x = random_tensor(rng, c.x_shape());
    const Tensor w = random_tensor(rng, c.w_shape());
    const Tensor dy = random_tensor(rng, c.y_shape());
    auto run = [&] {
      Tensor y = poisoned(c.y_shape()), dx = poisoned(c.x_shape());
      Tensor dw = Tensor::zeros(c.w_shape());
      cpu::conv2d_forward(x, w, y, params(c), {});
      cpu::conv2d_backward(x, w, dy, dx, dw, params(c));
      return std::vector<Tensor>{y, dx, dw};
    };
    const std::vector<Tensor> outputs = outputs_on_any_thread_count(run, name(c));
    const Doubles x0 = to_doubles(x), w0 = to_doubles(w);
    const ConvGradients ref = conv_backward_reference(x0, w0, to_doubles(dy), c);
    EXPECT_LT(relative_error_to(outputs[0], conv_reference(x0, w0, c)), kF32Tolerance) << name(c);
    EXPECT_LT(relative_error_to(outputs[1], ref.dx), kF32Tolerance) << name(c);
    EXPECT_LT(relative_error_to(outputs[2], ref.dw), kF32Tolerance) << name(c);
  }
}

ConvDims dims(const ConvCase& c) {
  return {c.n, c.h, c.w, c.cin, c.cout, c.kh, c.kw, c.ho(), c.wo(), c.stride, c.pad};
}

// 3x3 stride-1 convolutions that take the Winograd F(2x2, 3x3) path: odd output sizes (partial
// tiles), no padding and padding 2, odd channel counts, wide channels, and a batch whose tiles
// come in several groups (1024 tiles each: 2 images + 1). Forward and input gradient (a 3x3
// conv of dy, through Winograd too where it has enough tiles) against the definition, bit for bit
// on 1 and on 4 threads; the bias + ReLU epilogue still applies.
TEST(CpuConv, WinogradPathMatchesDefinition) {
  Rng rng(27);
  for (const ConvCase& c : {ConvCase{2, 17, 15, 5, 7, 3, 3, 1, 1},    // Ho, Wo odd
                            ConvCase{1, 21, 20, 3, 4, 3, 3, 1, 0},    // no padding
                            ConvCase{2, 6, 6, 4, 3, 3, 3, 1, 2},      // padding 2: the dx shape
                            ConvCase{1, 16, 16, 96, 80, 3, 3, 1, 1},  // wide channels
                            ConvCase{3, 40, 40, 2, 3, 3, 3, 1, 1}}) { // groups: 2 + 1 images
    ASSERT_TRUE(cpu::winograd_applies(dims(c))) << name(c);
    const Tensor x = random_tensor(rng, c.x_shape());
    const Tensor w = random_tensor(rng, c.w_shape());
    const Tensor bias = random_tensor(rng, {c.cout});
    const Tensor dy = random_tensor(rng, c.y_shape());
    const std::vector<Tensor> outputs = outputs_on_any_thread_count(
        [&] {
          Tensor y = poisoned(c.y_shape()), dx = poisoned(c.x_shape()), no_dw;
          cpu::conv2d_forward(x, w, y, params(c), {});
          cpu::conv2d_backward(x, w, dy, dx, no_dw, params(c));
          return std::vector<Tensor>{y, dx};
        },
        name(c));
    const Doubles x0 = to_doubles(x), w0 = to_doubles(w);
    EXPECT_LT(relative_error_to(outputs[0], conv_reference(x0, w0, c)), kF32Tolerance) << name(c);
    EXPECT_LT(relative_error_to(outputs[1], conv_backward_reference(x0, w0, to_doubles(dy), c).dx),
              kF32Tolerance)
        << name(c) << " input gradient";
    check_bias_relu_forward(c, x, w, bias);
  }
}

// Only 3x3 kernels at stride 1 go through Winograd, and only with enough output tiles per filter
// to pay for transforming the filters: ResNet's 56x56 stage does, its 7x7 stage at batch 1 does
// not.
TEST(CpuConv, WinogradAppliesTo3x3Stride1WithEnoughTiles) {
  EXPECT_TRUE(cpu::winograd_applies(dims({1, 56, 56, 64, 64, 3, 3, 1, 1})));
  EXPECT_FALSE(cpu::winograd_applies(dims({1, 7, 7, 512, 512, 3, 3, 1, 1})));
  EXPECT_FALSE(cpu::winograd_applies(dims({1, 56, 56, 64, 64, 3, 3, 2, 1}))); // stride 2
  EXPECT_FALSE(cpu::winograd_applies(dims({1, 56, 56, 64, 64, 1, 1, 1, 0}))); // 1x1
  EXPECT_FALSE(cpu::winograd_applies(dims({1, 56, 56, 3, 64, 5, 5, 1, 2})));  // 5x5
  EXPECT_FALSE(cpu::winograd_applies(dims({0, 56, 56, 64, 64, 3, 3, 1, 1}))); // empty batch
}

TEST(CpuConv, BackwardComputesOnlyTheDefinedGradients) {
  Rng rng(24);
  const ConvCase c = kCases[0];
  const Tensor x = random_tensor(rng, c.x_shape());
  const Tensor w = random_tensor(rng, c.w_shape());
  const Tensor dy = random_tensor(rng, c.y_shape());
  Tensor both_dx = poisoned(c.x_shape()), both_dw = Tensor::zeros(c.w_shape());
  cpu::conv2d_backward(x, w, dy, both_dx, both_dw, params(c));

  Tensor dx = poisoned(c.x_shape()), no_dw;
  cpu::conv2d_backward(x, w, dy, dx, no_dw, params(c));
  EXPECT_EQ(dx.to_vector(), both_dx.to_vector());
  Tensor no_dx, dw = Tensor::zeros(c.w_shape());
  cpu::conv2d_backward(x, w, dy, no_dx, dw, params(c));
  EXPECT_EQ(dw.to_vector(), both_dw.to_vector());
}

// f16 or bf16 x and w: the result equals the fp32 conv of the widened values, rounded to the
// 16-bit format (y) or kept in f32 (dw); dx in 16 bits is the rounded fp32 input gradient.
TEST(CpuConv, HalfPrecisionEqualsFp32OfRoundedInputs) {
  Rng rng(25);
  for (DType dtype : {DType::f16, DType::bf16})
    for (const ConvCase& c : {kCases[1], kCases[2]}) {
      const Tensor x16 = random_tensor(rng, c.x_shape(), dtype);
      const Tensor w16 = random_tensor(rng, c.w_shape(), dtype);
      const Tensor dy16 = random_tensor(rng, c.y_shape(), dtype);
      const Tensor x32 = x16.to(DType::f32), w32 = w16.to(DType::f32), dy32 = dy16.to(DType::f32);

      Tensor y32 = poisoned(c.y_shape()), y16 = poisoned(c.y_shape(), dtype);
      cpu::conv2d_forward(x32, w32, y32, params(c), {});
      cpu::conv2d_forward(x16, w16, y16, params(c), {});
      Tensor dx32 = poisoned(c.x_shape()), dx16 = poisoned(c.x_shape(), dtype);
      Tensor dw32 = Tensor::zeros(c.w_shape()), dw_from16 = Tensor::zeros(c.w_shape());
      cpu::conv2d_backward(x32, w32, dy32, dx32, dw32, params(c));
      cpu::conv2d_backward(x16, w16, dy16, dx16, dw_from16, params(c));

      EXPECT_EQ(y16.to_vector(), y32.to(dtype).to_vector()) << dtype << " " << name(c);
      EXPECT_EQ(dx16.to_vector(), dx32.to(dtype).to_vector()) << dtype << " " << name(c);
      EXPECT_EQ(dw_from16.to_vector(), dw32.to_vector()) << dtype << " " << name(c);
    }
}

// An empty batch gives an empty output and leaves dw as it was.
TEST(CpuConv, EmptyBatchGivesEmptyResults) {
  Rng rng(27);
  const ConvCase c = {0, 5, 5, 3, 2, 3, 3, 1, 1};
  const Tensor x = random_tensor(rng, c.x_shape()), w = random_tensor(rng, c.w_shape());
  Tensor y = poisoned(c.y_shape());
  cpu::conv2d_forward(x, w, y, params(c), {});
  EXPECT_EQ(y.shape(), (Shape{0, 5, 5, 2}));
  Tensor dx = poisoned(c.x_shape());
  const Tensor dw_start = random_tensor(rng, c.w_shape());
  Tensor dw = dw_start.clone();
  cpu::conv2d_backward(x, w, y, dx, dw, params(c));
  EXPECT_EQ(dw.to_vector(), dw_start.to_vector());
}

TEST(CpuConv, RejectsWrongRanksAndShapes) {
  Rng rng(26);
  const Tensor x2d = random_tensor(rng, {4, 3});
  const Tensor x = random_tensor(rng, {1, 5, 5, 3});
  const Tensor w = random_tensor(rng, {2, 3, 3, 3});
  Tensor y = poisoned({1, 5, 5, 2});
  ConvParams same;
  same.pad = 1;
  expect_error([&] { cpu::conv2d_forward(x2d, w, y, same, {}); }, "conv2d_forward",
               "expects x f32/f16/bf16 [N, H, W, Cin], got f32[4, 3]");
  const Tensor w_bad_cin = random_tensor(rng, {2, 3, 3, 4});
  expect_error([&] { cpu::conv2d_forward(x, w_bad_cin, y, same, {}); }, "conv2d_forward",
               "[Cout, kh, kw, Cin]");
  Tensor y_wrong = poisoned({1, 3, 3, 2}); // the unpadded size, but pad is 1
  expect_error([&] { cpu::conv2d_forward(x, w, y_wrong, same, {}); }, "conv2d_forward",
               "expects y f32/f16/bf16 [1, 5, 5, 2]");
  ConvParams bad_stride;
  bad_stride.stride = 0;
  expect_error([&] { cpu::conv2d_forward(x, w, y, bad_stride, {}); }, "conv2d_forward", "stride");
  Tensor dx = poisoned({1, 5, 5, 3});
  Tensor dw_f16 = poisoned({2, 3, 3, 3}, DType::f16);
  expect_error([&] { cpu::conv2d_backward(x, w, y, dx, dw_f16, same); }, "conv2d_backward",
               "dw f32");
  Tensor dx_wrong = poisoned({1, 5, 5, 2});
  Tensor dw = poisoned({2, 3, 3, 3});
  expect_error([&] { cpu::conv2d_backward(x, w, y, dx_wrong, dw, same); }, "conv2d_backward",
               "expects dx shaped like x f32[1, 5, 5, 3] on cpu, got f32[1, 5, 5, 2]");
  // A kernel wider than the padded input, though no taller.
  const Tensor narrow = random_tensor(rng, {1, 5, 2, 3});
  const Tensor wide_w = random_tensor(rng, {2, 1, 3, 3});
  Tensor y_any = poisoned({1, 5, 1, 2});
  expect_error([&] { cpu::conv2d_forward(narrow, wide_w, y_any, {}, {}); }, "conv2d_forward",
               "does not fit the padded input f32[1, 5, 2, 3] on cpu (pad 0)");
}

} // namespace
} // namespace minamp::test
