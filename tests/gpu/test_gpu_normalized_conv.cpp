// A batch norm applied by the 1x1 conv after it as the conv loads its input (InputNormalization,
// gemm.cuh's OperandKind::normalized): the conv's forward, and its weight gradient (from x
// normalised again, into dx's storage or a buffer of its own), against the same conv run on the
// normalised input written out — bit for bit, on each GEMM version that takes it — and against
// the CPU composition (normalise, then conv); the batch norm's gradient sums that come with the
// input gradient (InputNormalization::grad_sums) against double sums over what it wrote; edge
// tiles, a ragged K, channels that do not fill 16-byte chunks, split K; and where a conv cannot
// take it.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/gemm_version.h"
#include "kernels/kernels.h"
#include "test_util.h"

namespace minamp {
namespace {

// x [n, h, w, cin] into a 1x1 conv to cout channels.
struct NormalizedConvCase {
  int64_t n, h, w, cin, cout;
  bool relu;
};

std::string describe_case(const NormalizedConvCase& c, DType dtype) {
  return cat(gemm_version_name(gemm_version()), " x [", c.n, ", ", c.h, ", ", c.w, ", ", c.cin,
             "] -> ", c.cout, " ", dtype, c.relu ? " relu" : "");
}

// A batch norm's per-channel vectors, f32 [C] on `device`.
struct NormVectors {
  Tensor gamma, beta, mean, invstd;
  NormVectors to(Device device) const {
    return {gamma.to(device), beta.to(device), mean.to(device), invstd.to(device)};
  }
  InputNormalization input_norm(bool relu) const { return {&gamma, &beta, &mean, &invstd, relu}; }
};

// Values like a trained layer's: gamma of either sign, so the ReLU cuts on both sides of the mean.
NormVectors random_norm(Rng& rng, int64_t channels) {
  return {test::random_tensor(rng, {channels}, DType::f32, Device::cpu, -1.5f, 1.5f),
          test::random_tensor(rng, {channels}, DType::f32, Device::cpu, -0.5f, 0.5f),
          test::random_tensor(rng, {channels}, DType::f32, Device::cpu, -0.3f, 0.3f),
          test::random_tensor(rng, {channels}, DType::f32, Device::cpu, 0.5f, 2.0f)};
}

// x normalised as batchnorm_forward writes it (one fma, then the ReLU), rounded to x's dtype: the
// input the unfused composition gives the conv. x on the CPU.
Tensor normalized_on_host(const Tensor& x, const NormVectors& v, bool relu) {
  const int64_t channels = x.shape().last();
  const std::vector<float> g = v.gamma.to_vector(), b = v.beta.to_vector(), m = v.mean.to_vector(),
                           s = v.invstd.to_vector();
  std::vector<float> values = x.to_vector();
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t c = i % size_t(channels);
    const float normalised = std::fma(g[c], (values[i] - m[c]) * s[c], b[c]);
    values[i] = test::round_to(x.dtype(), relu && normalised < 0.0f ? 0.0f : normalised);
  }
  return Tensor::from_vector(values, x.shape(), x.dtype(), Device::cpu);
}

// The conv with its input normalised on load, forward (bias and ReLU in the epilogue) and
// backward, against the same kernels on the normalised input written out (identical: the same
// GEMM reads the same values) and against the CPU (normalise, then conv).
void check_normalized_conv(const NormalizedConvCase& c, DType dtype, uint64_t seed) {
  const std::string what = describe_case(c, dtype);
  Rng rng(seed);
  const Shape xs{c.n, c.h, c.w, c.cin}, ys{c.n, c.h, c.w, c.cout}, ws{c.cout, 1, 1, c.cin};
  const Tensor x = test::random_tensor(rng, xs, dtype, Device::cpu, -2.0f, 2.0f);
  const Tensor w = test::random_tensor(rng, ws, dtype);
  const Tensor bias = test::random_tensor(rng, {c.cout});
  const Tensor dy = test::random_tensor(rng, ys, dtype);
  const NormVectors norm = random_norm(rng, c.cin);
  const Tensor normalized = normalized_on_host(x, norm, c.relu);

  const auto gpu = [](const Tensor& t) { return t.to(Device::cuda); };
  const Tensor gx = gpu(x), gw = gpu(w), gbias = gpu(bias), gdy = gpu(dy);
  const NormVectors gnorm = norm.to(Device::cuda);
  const InputNormalization input_norm = gnorm.input_norm(c.relu);
  const ConvParams conv;
  ASSERT_TRUE(kernels::conv2d_normalizes_on_load(gx, gw, conv)) << what;
  GemmEpilogue epilogue;
  epilogue.relu = true;

  // Fused: x normalised as it loads. Reference: the normalised input written out.
  struct Outputs {
    Tensor y, dx, dw;
  };
  Tensor grad_sums = test::poisoned({2, c.cin}, DType::f32, Device::cuda);
  const auto run = [&](const Tensor& input, GemmEpilogue ep, const InputNormalization* n) {
    const Tensor device_bias = gbias;
    ep.bias = &device_bias;
    Outputs out{test::poisoned(ys, dtype, Device::cuda), test::poisoned(xs, dtype, Device::cuda),
                Tensor::zeros(ws, DType::f32, Device::cuda)};
    kernels::conv2d_forward(input, gw, out.y, conv, ep, n);
    InputNormalization with_sums; // the backward also sums the batch norm's gradient terms
    if (n) with_sums = *n, with_sums.grad_sums = &grad_sums;
    kernels::conv2d_backward(input, gw, gdy, out.dx, out.dw, conv, n ? &with_sums : nullptr);
    return Outputs{out.y.to(Device::cpu), out.dx.to(Device::cpu), out.dw.to(Device::cpu)};
  };
  const Outputs fused = run(gx, epilogue, &input_norm);
  const Outputs unfused = run(gpu(normalized), epilogue, nullptr);
  test::expect_identical(fused.y, unfused.y, what + ": forward");
  test::expect_identical(fused.dw, unfused.dw, what + ": weight gradient");
  test::expect_identical(fused.dx, unfused.dx, what + ": gradient of the normalised input");
  // The weight gradient alone (no dx to normalise x into): a buffer of its own, the same dw.
  Tensor dw_alone = Tensor::zeros(ws, DType::f32, Device::cuda), no_dx;
  kernels::conv2d_backward(gx, gw, gdy, no_dx, dw_alone, conv, &input_norm);
  test::expect_identical(dw_alone.to(Device::cpu), unfused.dw, what + ": weight gradient alone");
  // fp32 sums over at most a few thousand rows, in another order than the double ones.
  test::expect_grad_sums(grad_sums,
                         test::batchnorm_grad_sums_on_host(x, fused.dx, norm.gamma, norm.beta,
                                                           norm.mean, norm.invstd, c.relu),
                         1e-5, what + ": batch norm gradient sums");

  // The CPU composition.
  Tensor y_ref = Tensor::empty(ys, dtype), dx_ref = Tensor::empty(xs, dtype);
  Tensor dw_ref = Tensor::zeros(ws);
  epilogue.bias = &bias;
  kernels::conv2d_forward(normalized, w, y_ref, conv, epilogue);
  kernels::conv2d_backward(normalized, w, dy, dx_ref, dw_ref, conv);
  test::expect_close(fused.y, y_ref, test::tolerance_for(dtype), what + ": forward vs CPU");
  test::expect_close(fused.dw, dw_ref, test::tolerance_for(dtype, DType::f32),
                     what + ": weight gradient vs CPU");
}

const std::vector<NormalizedConvCase> kCases = {
    {2, 7, 9, 24, 40, true},     // 126 pixels: edge tiles in M, N and a ragged K
    {1, 13, 11, 40, 16, false},  // no ReLU
    {2, 5, 7, 20, 24, true},     // 20 channels: rows not in whole 16-byte chunks of f16
    {4, 32, 32, 16, 16, true},   // one tile of dw over K = 4096 pixels: split K
    {1, 16, 18, 128, 256, true}, // wide channels, the largest tiles
    {1, 64, 64, 32, 1, true},    // one output channel over 4096 pixels: the thin-N kernel,
                                 // its B values and parameters in registers (K <= 256)
    {1, 64, 64, 264, 1, true},   // K = 264: the thin-N kernel reading them per row
    {1, 64, 64, 22, 3, false},   // three, from rows of 22 values: its unpacked loads
    {1, 64, 64, 14, 2, true},    // two: the input gradient's thin K = 2 with its sums, unpacked
    {1, 2, 2, 16, 24, true},     // 4 pixels: the weight gradient a thin K
};

TEST(GpuNormalizedConv, MatchesTheNormalisedInputOnEveryVersion) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 700;
  for (GemmVersion version : {GemmVersion::automatic, GemmVersion::v4_mma, GemmVersion::v2_wmma}) {
    ScopedGemmVersion scope(version);
    for (const NormalizedConvCase& c : kCases) check_normalized_conv(c, DType::f16, ++seed);
  }
}

// v5's 128x256 tiles (blocks of 256 threads), planned as for one SM so that a small C takes them:
// their interior blocks normalise their tiles without a bound or a branch
// (normalize_interior_tile), each next K tile among the MMAs of the one before (multistage_loop, 4
// K tiles here); the last row of blocks an edge (the plain loaders); with the ReLU and without.
TEST(GpuNormalizedConv, LargeBlocksNormaliseInteriorTiles) {
  MINAMP_REQUIRE_GPU();
  ScopedGemmPlanningSms sms(1);
  uint64_t seed = 800;
  for (bool relu : {true, false})
    check_normalized_conv({1, 16, 18, 256, 256, relu}, DType::f16, ++seed);
}

// The same on a persistent grid (gemm_persistent_tiles): one block walks the 3 tiles, the next
// one's first K tile in flight during each epilogue and normalised in its main loop.
TEST(GpuNormalizedConv, PersistentLargeBlocks) {
  MINAMP_REQUIRE_GPU();
  ScopedGemmPlanningSms sms(1);
  ScopedGemmPersistentTiles persistent(true);
  uint64_t seed = 810;
  for (bool relu : {true, false})
    check_normalized_conv({1, 16, 18, 256, 256, relu}, DType::f16, ++seed);
}

TEST(GpuNormalizedConv, Bf16AndF32) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 720;
  for (const NormalizedConvCase& c : kCases) {
    check_normalized_conv(c, DType::bf16, ++seed);
    check_normalized_conv(c, DType::f32, ++seed); // the SIMT kernel
  }
}

// Where the conv keeps its unfused input: not 1x1 stride 1 unpadded, mixed dtypes, few input
// channels (the thin-K kernel), the versions without the normalised operand (v1, v3), the CPU;
// and the error when asked anyway. Few output channels (the thin-N kernel) do take it, and so do
// few pixels (a thin weight gradient, which reads x normalised again and written out).
TEST(GpuNormalizedConv, OnlyWhereTheGemmCanNormalise) {
  MINAMP_REQUIRE_GPU();
  Rng rng(740);
  const auto tensor = [&](const Shape& shape, DType dtype, Device device) {
    return test::random_tensor(rng, shape, dtype, device);
  };
  const Tensor x = tensor({2, 6, 6, 16}, DType::f16, Device::cuda);
  const Tensor w = tensor({24, 1, 1, 16}, DType::f16, Device::cuda);
  EXPECT_TRUE(kernels::conv2d_normalizes_on_load(x, w, ConvParams{}));
  EXPECT_FALSE(kernels::conv2d_normalizes_on_load(x, w, ConvParams{2, 0}));
  EXPECT_FALSE(kernels::conv2d_normalizes_on_load(x, w, ConvParams{1, 1}));
  EXPECT_FALSE(kernels::conv2d_normalizes_on_load(
      x, tensor({24, 3, 3, 16}, DType::f16, Device::cuda), ConvParams{}));
  EXPECT_FALSE(kernels::conv2d_normalizes_on_load(
      x, tensor({24, 1, 1, 16}, DType::f32, Device::cuda), ConvParams{}));
  EXPECT_FALSE(kernels::conv2d_normalizes_on_load(tensor({2, 6, 6, 4}, DType::f16, Device::cuda),
                                                  tensor({24, 1, 1, 4}, DType::f16, Device::cuda),
                                                  ConvParams{}))
      << "K = 4: a thin GEMM";
  EXPECT_TRUE(kernels::conv2d_normalizes_on_load(tensor({1, 64, 64, 16}, DType::f16, Device::cuda),
                                                 tensor({1, 1, 1, 16}, DType::f16, Device::cuda),
                                                 ConvParams{}))
      << "one output channel over 4096 pixels: the thin-N kernel normalises its A";
  EXPECT_TRUE(kernels::conv2d_normalizes_on_load(tensor({1, 2, 2, 16}, DType::f16, Device::cuda), w,
                                                 ConvParams{}))
      << "4 pixels: the weight gradient's K = 4, a thin GEMM on x normalised again";
  for (GemmVersion version : {GemmVersion::v1_naive, GemmVersion::v3_interior}) {
    ScopedGemmVersion scope(version);
    EXPECT_FALSE(kernels::conv2d_normalizes_on_load(x, w, ConvParams{}))
        << gemm_version_name(version);
  }
  EXPECT_FALSE(
      kernels::conv2d_normalizes_on_load(x.to(Device::cpu), w.to(Device::cpu), ConvParams{}));

  const NormVectors norm = random_norm(rng, 16).to(Device::cuda);
  const InputNormalization input_norm = norm.input_norm(true);
  const Tensor w3 = tensor({24, 3, 3, 16}, DType::f16, Device::cuda);
  Tensor y = Tensor::empty({2, 4, 4, 24}, DType::f16, Device::cuda);
  test::expect_error(
      [&] { kernels::conv2d_forward(x, w3, y, ConvParams{}, GemmEpilogue{}, &input_norm); },
      "conv2d_forward", "cannot batch-normalise x as it loads it", "[24, 3, 3, 16]");
}

// The batch norm gradient sums: f32 [2, Cin], written by conv2d_backward with a dx in x's dtype.
TEST(GpuNormalizedConv, GradientSumsNeedTheirShapeAndDx) {
  MINAMP_REQUIRE_GPU();
  Rng rng(750);
  const Tensor x = test::random_tensor(rng, {2, 6, 6, 16}, DType::f16, Device::cuda);
  const Tensor w = test::random_tensor(rng, {24, 1, 1, 16}, DType::f16, Device::cuda);
  const Tensor dy = test::random_tensor(rng, {2, 6, 6, 24}, DType::f16, Device::cuda);
  const NormVectors norm = random_norm(rng, 16).to(Device::cuda);
  InputNormalization input_norm = norm.input_norm(true);
  Tensor wrong = Tensor::zeros({16}, DType::f32, Device::cuda);
  Tensor right = Tensor::zeros({2, 16}, DType::f32, Device::cuda);
  Tensor dx = Tensor::empty(x.shape(), DType::f16, Device::cuda), no_dx, no_dw;
  Tensor dx_f32 = Tensor::empty(x.shape(), DType::f32, Device::cuda);
  Tensor y = Tensor::empty({2, 6, 6, 24}, DType::f16, Device::cuda);
  const auto backward = [&](Tensor& grad) {
    kernels::conv2d_backward(x, w, dy, grad, no_dw, ConvParams{}, &input_norm);
  };
  input_norm.grad_sums = &wrong;
  test::expect_error([&] { backward(dx); }, "conv2d_backward", "grad_sums must be f32 [2, 16]",
                     "got f32[16]");
  input_norm.grad_sums = &right;
  test::expect_error([&] { backward(no_dx); }, "conv2d_backward", "grad_sums are sums over dx");
  test::expect_error([&] { backward(dx_f32); }, "conv2d_backward", "grad_sums are sums over dx",
                     "f32");
  test::expect_error(
      [&] { kernels::conv2d_forward(x, w, y, ConvParams{}, GemmEpilogue{}, &input_norm); },
      "conv2d_forward", "grad_sums are written by conv2d_backward only");
}

} // namespace
} // namespace minamp
