// A conv's parameter gradients read from the input gradient of the batch norm after it without
// that gradient being written (kernels::conv2d_backward_from_batchnorm, gemm.cuh's
// OperandKind::batchnorm_input_grad in the thin-C GEMM): against the batch norm's dx written by its
// own kernel and the same GEMM run on it — bit for bit for the weight gradient — and against the
// CPU composition (batchnorm_backward, then conv2d_backward and bias_backward); training and eval
// mode, with and without the ReLU, one thin column and several, channels that do not fill a pack,
// f16, bf16 and f32; and where a conv cannot read it.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "test_util.h"

namespace minamp {
namespace {

// A 1x1 conv from x [n, h, w, cin] to cout channels, followed by a batch norm (+ ReLU).
struct BatchNormGradConvCase {
  int64_t n, h, w, cin, cout;
  bool relu, training;
};

std::string describe_case(const BatchNormGradConvCase& c, DType dtype) {
  return cat("x [", c.n, ", ", c.h, ", ", c.w, ", ", c.cin, "] -> ", c.cout, " ", dtype,
             c.relu ? " relu" : "", c.training ? " training" : " eval");
}

// The batch norm's input gradient as its terms, on `device`: its input and output gradient
// (the conv's output shape, in `dtype`), vectors like a trained layer's (gamma of either sign, so
// that the ReLU cuts on both sides of the mean) and the gradient sums the CPU takes over them.
BatchNormInputGrad random_terms(Rng& rng, const BatchNormGradConvCase& c, DType dtype) {
  const Shape ys{c.n, c.h, c.w, c.cout};
  BatchNormInputGrad g;
  g.x = test::random_tensor(rng, ys, dtype, Device::cpu, -2.0f, 2.0f);
  g.dy = test::random_tensor(rng, ys, dtype);
  g.gamma = test::random_tensor(rng, {c.cout}, DType::f32, Device::cpu, -1.5f, 1.5f);
  g.beta = test::random_tensor(rng, {c.cout}, DType::f32, Device::cpu, -0.5f, 0.5f);
  g.mean = test::random_tensor(rng, {c.cout}, DType::f32, Device::cpu, -0.3f, 0.3f);
  g.invstd = test::random_tensor(rng, {c.cout}, DType::f32, Device::cpu, 0.5f, 2.0f);
  g.training = c.training, g.relu = c.relu;
  // The sums are what batchnorm_backward adds to dbeta (sum dy_hat) and dgamma (sum dy_hat xhat).
  Tensor sum_dy = Tensor::zeros({c.cout}), sum_dy_xhat = Tensor::zeros({c.cout}), no_dx;
  BatchNormParams bn;
  bn.training = c.training, bn.relu = c.relu;
  kernels::batchnorm_backward(g.x, g.gamma, g.beta, g.mean, g.invstd, g.dy, no_dx, sum_dy_xhat,
                              sum_dy, bn);
  std::vector<float> sums = sum_dy.to_vector();
  const std::vector<float> second = sum_dy_xhat.to_vector();
  sums.insert(sums.end(), second.begin(), second.end());
  g.grad_sums = Tensor::from_vector(sums, {2, c.cout});
  return g;
}

BatchNormInputGrad to_device(const BatchNormInputGrad& g, Device device) {
  return {g.x.to(device),         g.dy.to(device),   g.gamma.to(device),
          g.beta.to(device),      g.mean.to(device), g.invstd.to(device),
          g.grad_sums.to(device), g.training,        g.relu};
}

// dx as batchnorm_backward writes it from the terms (on their device).
Tensor written_dx(const BatchNormInputGrad& g) {
  BatchNormParams bn;
  bn.training = g.training, bn.relu = g.relu, bn.grad_sums = &g.grad_sums;
  Tensor dx = test::poisoned(g.x.shape(), g.x.dtype(), g.x.device()), no_dgamma, no_dbeta;
  kernels::batchnorm_backward(g.x, g.gamma, g.beta, g.mean, g.invstd, g.dy, dx, no_dgamma, no_dbeta,
                              bn);
  return dx;
}

void check_case(const BatchNormGradConvCase& c, DType dtype, uint64_t seed) {
  const std::string what = describe_case(c, dtype);
  Rng rng(seed);
  const Shape xs{c.n, c.h, c.w, c.cin}, ws{c.cout, 1, 1, c.cin};
  const Tensor x = test::random_tensor(rng, xs, dtype, Device::cpu, -2.0f, 2.0f);
  const Tensor w = test::random_tensor(rng, ws, dtype);
  const Tensor dw_start = test::random_tensor(rng, ws); // the gradients accumulate: +=
  const BatchNormInputGrad terms = random_terms(rng, c, dtype);
  const ConvParams conv;

  // The CPU composition: dx written, then the conv's weight gradient and the bias gradient.
  const Tensor dx_cpu = written_dx(terms);
  Tensor dw_ref = dw_start.clone(), db_ref = Tensor::zeros({c.cout}), no_dx;
  kernels::conv2d_backward(x, w, dx_cpu, no_dx, dw_ref, conv);
  kernels::bias_backward(dx_cpu, db_ref);

  const Tensor gx = x.to(Device::cuda), gw = w.to(Device::cuda);
  const BatchNormInputGrad gterms = to_device(terms, Device::cuda);
  ASSERT_TRUE(kernels::conv2d_reads_batchnorm_input_grad(gx, gw, gterms, conv)) << what;
  Tensor dw = dw_start.to(Device::cuda), db = Tensor::zeros({c.cout}, DType::f32, Device::cuda);
  kernels::conv2d_backward_from_batchnorm(gx, gw, gterms, dw, db, conv);

  // The same GEMM on dx written by the batch norm's kernel: the same values, in the same order.
  const Tensor dx_gpu = written_dx(gterms);
  Tensor dw_written = dw_start.to(Device::cuda);
  kernels::conv2d_backward(gx, gw, dx_gpu, no_dx, dw_written, conv);
  test::expect_identical(dw.to(Device::cpu), dw_written.to(Device::cpu),
                         what + ": weight gradient vs the GEMM on dx written");
  test::expect_close(dw.to(Device::cpu), dw_ref, test::tolerance_for(dtype, DType::f32),
                     what + ": weight gradient vs CPU");
  // The bias gradient: the sums of dx as stored (in training mode nearly zero: rounding against
  // the sum of |dx|, as any order of summing it gives).
  test::expect_column_sums(db.to(Device::cpu), dx_gpu.to(Device::cpu), 1e-5,
                           what + ": bias gradient");
  if (!c.training) // a real gradient: a relative comparison is meaningful
    test::expect_close(db.to(Device::cpu), db_ref, test::tolerance_for(dtype),
                       what + ": bias gradient vs CPU");

  // Each gradient alone, and accumulated into: the same sums added again.
  Tensor db_alone = Tensor::zeros({c.cout}, DType::f32, Device::cuda), no_dw, no_db;
  kernels::conv2d_backward_from_batchnorm(gx, gw, gterms, no_dw, db_alone, conv);
  test::expect_identical(db_alone.to(Device::cpu), db.to(Device::cpu),
                         what + ": bias gradient alone");
  Tensor dw_alone = dw_start.to(Device::cuda);
  kernels::conv2d_backward_from_batchnorm(gx, gw, gterms, dw_alone, no_db, conv);
  test::expect_identical(dw_alone.to(Device::cpu), dw.to(Device::cpu),
                         what + ": weight gradient alone");
  kernels::conv2d_backward_from_batchnorm(gx, gw, gterms, no_dw, db_alone, conv);
  const std::vector<float> once = db.to_vector(), twice = db_alone.to_vector();
  for (size_t j = 0; j < once.size(); ++j)
    EXPECT_EQ(twice[j], 2.0f * once[j]) << what << ": bias gradient accumulated, channel " << j;
}

// Sine's first conv (2 -> 256) at 64 x 64, then edges of the thin-C kernel: one input channel
// (its one-column variant), channels that do not fill a pack of 4, and rows that are not a whole
// number of a block's lanes.
const BatchNormGradConvCase kCases[] = {
    {1, 64, 64, 2, 256, true, true}, // sine's shape, 4096 pixels
    {2, 48, 50, 1, 12, true, false}, // one thin column, eval mode
    {1, 70, 61, 3, 6, false, true},  // 6 channels: packs of one; 4270 pixels
    {3, 40, 37, 4, 20, false, false},
};

TEST(GpuBatchNormGradConv, MatchesTheWrittenGradientAndTheCpu) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 1500;
  for (const BatchNormGradConvCase& c : kCases) check_case(c, DType::f16, ++seed);
}

TEST(GpuBatchNormGradConv, Bf16AndF32) {
  MINAMP_REQUIRE_GPU();
  check_case(kCases[0], DType::bf16, 1510);
  check_case(kCases[2], DType::bf16, 1511);
  check_case(kCases[0], DType::f32, 1512);
  check_case(kCases[1], DType::f32, 1513);
}

// NaN in the batch norm's output gradient reaches the weight and bias gradients of its channel
// only, as it would through dx written out.
TEST(GpuBatchNormGradConv, NaNNeverPasses) {
  MINAMP_REQUIRE_GPU();
  const BatchNormGradConvCase c{1, 64, 64, 2, 8, false, false};
  Rng rng(1520);
  BatchNormInputGrad terms = random_terms(rng, c, DType::f16);
  std::vector<float> dy = terms.dy.to_vector();
  dy[size_t(1000 * c.cout + 3)] = NAN; // channel 3
  terms.dy = Tensor::from_vector(dy, terms.dy.shape(), DType::f16);
  const Tensor x = test::random_tensor(rng, {c.n, c.h, c.w, c.cin}, DType::f16, Device::cuda);
  const Tensor w = test::random_tensor(rng, {c.cout, 1, 1, c.cin}, DType::f16, Device::cuda);
  Tensor dw = Tensor::zeros(w.shape(), DType::f32, Device::cuda);
  Tensor db = Tensor::zeros({c.cout}, DType::f32, Device::cuda);
  kernels::conv2d_backward_from_batchnorm(x, w, to_device(terms, Device::cuda), dw, db, {});
  const std::vector<float> dws = dw.to_vector(), dbs = db.to_vector();
  for (int64_t co = 0; co < c.cout; ++co) {
    EXPECT_EQ(std::isnan(dbs[size_t(co)]), co == 3) << "bias gradient of channel " << co;
    for (int64_t ci = 0; ci < c.cin; ++ci)
      EXPECT_EQ(std::isnan(dws[size_t(co * c.cin + ci)]), co == 3)
          << "weight gradient [" << co << ", " << ci << "]";
  }
}

// Only a pointwise conv whose weight gradient is a thin-C GEMM reads the terms, in one dtype; the
// CPU never does (its batch norm writes dx, the reference). Elsewhere the kernel refuses, naming
// the predicate.
TEST(GpuBatchNormGradConv, OnlyWhereTheThinCGemmReadsIt) {
  MINAMP_REQUIRE_GPU();
  Rng rng(1530);
  const BatchNormGradConvCase c{1, 64, 64, 2, 16, true, true};
  const BatchNormInputGrad terms = random_terms(rng, c, DType::f16);
  const BatchNormInputGrad gterms = to_device(terms, Device::cuda);
  const Tensor x = test::random_tensor(rng, {1, 64, 64, 2}, DType::f16);
  const Tensor w = test::random_tensor(rng, {16, 1, 1, 2}, DType::f16);
  const Tensor gx = x.to(Device::cuda), gw = w.to(Device::cuda);
  EXPECT_TRUE(kernels::conv2d_reads_batchnorm_input_grad(gx, gw, gterms, {}));
  EXPECT_FALSE(kernels::conv2d_reads_batchnorm_input_grad(x, w, terms, {})) << "on the CPU";
  EXPECT_FALSE(kernels::conv2d_reads_batchnorm_input_grad(gx.to(DType::bf16), gw.to(DType::bf16),
                                                          gterms, {}))
      << "a conv in another dtype than the batch norm";
  // 16 -> 16 channels: both sides of the weight gradient are wide (tensor-core tiles).
  const Tensor wide_x = test::random_tensor(rng, {1, 64, 64, 16}, DType::f16, Device::cuda);
  const Tensor wide_w = test::random_tensor(rng, {16, 1, 1, 16}, DType::f16, Device::cuda);
  EXPECT_FALSE(kernels::conv2d_reads_batchnorm_input_grad(wide_x, wide_w, gterms, {}));
  // 32 x 32 pixels: too few rows for the thin-C GEMM (tensor-core tiles split K).
  const BatchNormGradConvCase few{1, 32, 32, 2, 16, true, true};
  const BatchNormInputGrad few_terms = to_device(random_terms(rng, few, DType::f16), Device::cuda);
  const Tensor few_x = test::random_tensor(rng, {1, 32, 32, 2}, DType::f16, Device::cuda);
  EXPECT_FALSE(kernels::conv2d_reads_batchnorm_input_grad(few_x, gw, few_terms, {}));
  Tensor dw = Tensor::zeros({16, 1, 1, 2}, DType::f32, Device::cuda), no_db;
  test::expect_error(
      [&] { kernels::conv2d_backward_from_batchnorm(few_x, gw, few_terms, dw, no_db, {}); },
      "conv2d_backward_from_batchnorm", "cannot read the batch norm's input gradient unwritten",
      "conv2d_reads_batchnorm_input_grad");
  // A 3x3 conv (its output as the batch norm's input): not pointwise.
  const Tensor w3 = test::random_tensor(rng, {16, 3, 3, 2}, DType::f16, Device::cuda);
  EXPECT_FALSE(kernels::conv2d_reads_batchnorm_input_grad(gx, w3, gterms, ConvParams{1, 1}));
  // Shapes that do not match: named.
  BatchNormInputGrad bad = gterms;
  bad.grad_sums = Tensor::zeros({2, 8}, DType::f32, Device::cuda);
  test::expect_error([&] { kernels::conv2d_backward_from_batchnorm(gx, gw, bad, dw, no_db, {}); },
                     "conv2d_backward_from_batchnorm", "grad_sums must be f32 [2, 16]");
  Tensor neither, none;
  test::expect_error(
      [&] { kernels::conv2d_backward_from_batchnorm(gx, gw, gterms, neither, none, {}); },
      "conv2d_backward_from_batchnorm", "expects dw, db or both");
}

} // namespace
} // namespace minamp
