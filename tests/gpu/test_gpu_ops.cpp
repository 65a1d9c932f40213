// GPU tests of the non-GEMM kernels: every kernel runs on cuda and on the CPU reference with the
// same fresh random inputs; GPU outputs start as NaN and must match within the dtype's
// tolerance. Covers elementwise ops, pooling, reductions, losses and batch norm at awkward sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/kernels.h"
#include "test_util.h"

namespace minamp {
namespace {

using test::poisoned;
using test::random_tensor;
using test::tolerance_for;

const std::vector<int64_t> kSizes = {1, 17, 1000, 65539};
const std::vector<DType> kFloating = {DType::f32, DType::f16, DType::bf16};

Tensor gpu(const Tensor& t) { return t.to(Device::cuda); }

// The tolerance for an output of dtype `output` computed from inputs of dtypes `inputs`.
double tolerance(std::initializer_list<DType> inputs, DType output) {
  const bool half_input = std::any_of(inputs.begin(), inputs.end(), is_half_precision);
  return tolerance_for(half_input ? DType::f16 : DType::f32, output);
}

// Expects the GPU output to match the CPU reference within `tol` (NaN never passes).
void expect_close(const Tensor& on_gpu, const Tensor& on_cpu, double tol, const std::string& what) {
  test::expect_close(on_gpu, on_cpu, tol,
                     cat(what, " (gpu ", describe(on_gpu), ", cpu ", describe(on_cpu), ")"));
}

// Expects identical values (both rounded the same way, or exact math).
void expect_equal(const Tensor& on_gpu, const Tensor& on_cpu, const std::string& what) {
  const std::vector<float> g = on_gpu.to_vector(), c = on_cpu.to_vector();
  ASSERT_EQ(g.size(), c.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    const bool same = g[i] == c[i] || (std::isnan(g[i]) && std::isnan(c[i]));
    ASSERT_TRUE(same) << what << ": element " << i << " is " << g[i] << " on gpu, " << c[i]
                      << " on cpu";
  }
}

// The spacing of f16 or bf16 values at |v| (2^-24 or 2^-133 among the subnormals).
double spacing(DType dtype, double v) {
  const bool f16 = dtype == DType::f16;
  const double magnitude = std::max(std::abs(v), std::ldexp(1.0, f16 ? -14 : -126));
  return std::ldexp(1.0, std::ilogb(magnitude) - (f16 ? 10 : 7));
}

// For f16 or bf16 outputs of the same fp32 math on both devices: each GPU value is the CPU's or
// one of its neighbours, and neighbours are rare (an fp32 result a few bits from a rounding tie,
// e.g. through a fused multiply-add on one side). A GPU rounding other than to nearest even
// would differ in about half of the elements.
void expect_rounded_alike(const Tensor& on_gpu, const Tensor& on_cpu, const std::string& what) {
  ASSERT_TRUE(is_half_precision(on_gpu.dtype())) << what;
  const std::vector<float> g = on_gpu.to_vector(), c = on_cpu.to_vector();
  ASSERT_EQ(g.size(), c.size()) << what;
  size_t neighbours = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] == c[i]) continue;
    ASSERT_LE(std::abs(double(g[i]) - c[i]),
              spacing(on_gpu.dtype(), std::max(std::abs(g[i]), std::abs(c[i]))))
        << what << ": element " << i << " is " << g[i] << " on gpu, " << c[i] << " on cpu";
    ++neighbours;
  }
  EXPECT_LE(neighbours, g.size() / 64)
      << what << ": " << neighbours << " of " << g.size() << " elements rounded to a neighbour";
}

std::string label(const char* op, int64_t n, DType a, DType b) {
  return cat(op, " n=", n, " ", a, "->", b);
}

// ---- Elementwise.

TEST(GpuElementwise, FillEveryDtype) {
  MINAMP_REQUIRE_GPU();
  for (int64_t n : kSizes)
    for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::i32}) {
      Tensor out = dtype == DType::i32 ? Tensor::full({n}, 7.0f, dtype, Device::cuda)
                                       : poisoned({n}, dtype, Device::cuda);
      kernels::fill(out, -3.75f);
      Tensor ref = Tensor::empty({n}, dtype);
      kernels::fill(ref, -3.75f);
      expect_equal(out, ref, label("fill", n, dtype, dtype));
    }
}

// An i32 holds [-2^31, 2^31): 2^31 itself is refused, as on the CPU, not saturated.
TEST(GpuElementwise, FillRefusesAValueAnI32CannotHold) {
  MINAMP_REQUIRE_GPU();
  Tensor ints = Tensor::zeros({3}, DType::i32, Device::cuda);
  kernels::fill(ints, -2147483648.0f);
  EXPECT_EQ(ints.to_vector(), std::vector<float>(3, -2147483648.0f));
  test::expect_error([&] { kernels::fill(ints, 2147483648.0f); }, "fill",
                     "an i32 tensor cannot hold 2.14748e+09");
}

TEST(GpuElementwise, FillEmptyTensorIsANoOp) {
  MINAMP_REQUIRE_GPU();
  Tensor out = Tensor::empty({0, 7}, DType::f16, Device::cuda);
  kernels::fill(out, 1.0f);
  EXPECT_EQ(out.to_vector().size(), 0u);
}

TEST(GpuElementwise, CastRoundsLikeTheReference) {
  MINAMP_REQUIRE_GPU();
  Rng rng(11);
  for (int64_t n : kSizes)
    for (DType from : kFloating)
      for (DType to : {DType::f32, DType::f16, DType::bf16, DType::i32}) {
        // Past 65504 an f16 rounds to inf; i32 targets get finite values only.
        const float range = to == DType::i32 ? 1000.0f : 70000.0f;
        const Tensor src = random_tensor(rng, {n}, from, Device::cpu, -range, range);
        Tensor out = Tensor::full({n}, 12345.0f, to, Device::cuda);
        kernels::cast(gpu(src), out);
        Tensor ref = Tensor::empty({n}, to);
        kernels::cast(src, ref);
        expect_equal(out, ref, label("cast", n, from, to));
      }
  // i32 to i32 is a copy: integers a float cannot hold (past 2^24) stay exact.
  const std::vector<int32_t> exact = {16777217, -2147483647, 123456789};
  Tensor ints = Tensor::empty({3}, DType::i32);
  std::copy(exact.begin(), exact.end(), ints.data<int32_t>());
  Tensor copied = Tensor::full({3}, 5.0f, DType::i32, Device::cuda);
  kernels::cast(gpu(ints), copied);
  const Tensor back = copied.to(Device::cpu);
  EXPECT_EQ(std::vector<int32_t>(back.data<int32_t>(), back.data<int32_t>() + 3), exact);
}

TEST(GpuElementwise, AddInplaceMixedDtypes) {
  MINAMP_REQUIRE_GPU();
  Rng rng(12);
  for (int64_t n : kSizes)
    for (DType dst_type : kFloating)
      for (DType src_type : kFloating) {
        const Tensor dst = random_tensor(rng, {n}, dst_type);
        const Tensor src = random_tensor(rng, {n}, src_type);
        Tensor out = gpu(dst);
        kernels::add_inplace(out, gpu(src), -0.7f);
        Tensor ref = dst.clone();
        kernels::add_inplace(ref, src, -0.7f);
        expect_close(out, ref, tolerance({dst_type, src_type}, dst_type),
                     label("add_inplace", n, src_type, dst_type));
        if (is_half_precision(dst_type))
          expect_rounded_alike(out, ref, label("add_inplace", n, src_type, dst_type));
      }
}

TEST(GpuElementwise, MulScalarReadsTheScaleOnTheDeviceAndMayAlias) {
  MINAMP_REQUIRE_GPU();
  Rng rng(13);
  const Tensor scale = Tensor::from_vector({rng.uniform(0.5f, 4.0f)}, {1});
  for (int64_t n : kSizes)
    for (DType src_type : kFloating)
      for (DType dst_type : kFloating) {
        const Tensor src = random_tensor(rng, {n}, src_type);
        Tensor out = poisoned({n}, dst_type, Device::cuda);
        kernels::mul_scalar(gpu(src), gpu(scale), out);
        Tensor ref = Tensor::empty({n}, dst_type);
        kernels::mul_scalar(src, scale, ref);
        expect_close(out, ref, tolerance({src_type}, dst_type),
                     label("mul_scalar", n, src_type, dst_type));
        if (is_half_precision(dst_type))
          expect_rounded_alike(out, ref, label("mul_scalar", n, src_type, dst_type));
      }
  const Tensor src = random_tensor(rng, {1000}, DType::f32);
  Tensor in_place = gpu(src);
  kernels::mul_scalar(in_place, gpu(scale), in_place);
  Tensor ref = Tensor::empty({1000});
  kernels::mul_scalar(src, scale, ref);
  expect_equal(in_place, ref, "mul_scalar in place");
}

// x holds a NaN (first element): forward propagates it and backward passes its gradient.
TEST(GpuElementwise, AddWithAndWithoutReluMixedDtypes) {
  MINAMP_REQUIRE_GPU();
  Rng rng(17);
  for (int64_t n : kSizes)
    for (DType a_type : kFloating)
      for (DType b_type : kFloating)
        for (bool relu : {false, true}) {
          const Tensor a = random_tensor(rng, {n}, a_type), b = random_tensor(rng, {n}, b_type);
          const DType out = a_type == DType::f16 && b_type == DType::f16 ? DType::f16 : DType::f32;
          Tensor y = poisoned({n}, out, Device::cuda);
          kernels::add_forward(gpu(a), gpu(b), y, relu);
          Tensor y_ref = Tensor::empty({n}, out);
          kernels::add_forward(a, b, y_ref, relu);
          expect_equal(
              y, y_ref,
              cat(label("add_forward", n, a_type, out), " + ", b_type, relu ? " relu" : ""));
        }
}

TEST(GpuElementwise, ReluForwardAndBackward) {
  MINAMP_REQUIRE_GPU();
  Rng rng(14);
  for (int64_t n : kSizes)
    for (DType dtype : kFloating) {
      std::vector<float> values = random_tensor(rng, {n}).to_vector();
      values[0] = std::nanf("");
      const Tensor x = Tensor::from_vector(values, {n}).to(dtype);
      Tensor y = poisoned({n}, dtype, Device::cuda);
      kernels::relu_forward(gpu(x), y);
      Tensor y_ref = Tensor::empty({n}, dtype);
      kernels::relu_forward(x, y_ref);
      expect_equal(y, y_ref, label("relu_forward", n, dtype, dtype));

      const Tensor dy = random_tensor(rng, {n}, dtype);
      Tensor dx = poisoned({n}, dtype, Device::cuda);
      kernels::relu_backward(y, gpu(dy), dx);
      Tensor dx_ref = Tensor::empty({n}, dtype);
      kernels::relu_backward(y_ref, dy, dx_ref);
      expect_equal(dx, dx_ref, label("relu_backward", n, dtype, dtype));
      EXPECT_EQ(dx.to_vector()[0], dy.to_vector()[0]) << "y[0] is NaN: its gradient passes";
    }
}

// More packs of four than one pass of the capped grid covers (32 blocks of 256 threads per SM:
// 1,081,344 threads, 4,325,376 elements on 132 SMs), and a scalar tail.
TEST(GpuElementwise, MapsPastOnePassOfTheGrid) {
  MINAMP_REQUIRE_GPU();
  Rng rng(14);
  const int64_t n = 4500003;
  const Tensor x = random_tensor(rng, {n});
  Tensor y = poisoned({n}, DType::f32, Device::cuda);
  kernels::relu_forward(gpu(x), y);
  Tensor y_ref = Tensor::empty({n});
  kernels::relu_forward(x, y_ref);
  expect_equal(y, y_ref, "relu_forward of 4500003 elements");
}

TEST(GpuElementwise, SizesNotAMultipleOfFourUseTheScalarTail) {
  MINAMP_REQUIRE_GPU();
  Rng rng(15);
  for (int64_t n : {2, 3, 5, 6, 7, 9})
    for (DType dtype : {DType::f16, DType::bf16}) {
      const Tensor x = random_tensor(rng, {n}, dtype);
      Tensor y = poisoned({n}, DType::f32, Device::cuda);
      kernels::cast(gpu(x), y);
      expect_equal(y, x.to(DType::f32), label("cast", n, dtype, DType::f32));
    }
}

// The device's conversions are the host's, bit for bit: every f16 and bf16 bit pattern widens to
// the same float (NaN to a NaN), and floats round to the same pattern — the ties between
// neighbours of both formats, the overflow and subnormal edges, signed zeros, infinities, NaN.
TEST(GpuElementwise, ConversionsMatchTheHostOnEveryBitPatternAndTie) {
  MINAMP_REQUIRE_GPU();
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor patterns = Tensor::empty({65536}, dtype);
    uint16_t* bits = static_cast<uint16_t*>(patterns.raw());
    for (uint32_t b = 0; b < 65536; ++b) bits[b] = uint16_t(b);
    Tensor wide = poisoned({65536}, DType::f32, Device::cuda);
    kernels::cast(gpu(patterns), wide);
    expect_equal(wide, patterns.to(DType::f32), cat("cast of every ", dtype, " pattern to f32"));

    // Each pattern's value, the midpoints to its upper neighbour, and the floats next to those.
    const std::vector<float> values = wide.to_vector();
    std::vector<float> inputs;
    for (uint32_t b = 0; b + 1 < 65536; ++b) {
      const float lo = values[b], hi = values[b + 1];
      if (!std::isfinite(lo) || !std::isfinite(hi) || std::signbit(lo) != std::signbit(hi))
        continue;
      const float tie = float((double(lo) + double(hi)) / 2); // exact in float for both formats
      for (float x : {lo, tie, std::nextafter(tie, 0.0f), std::nextafter(tie, INFINITY)})
        inputs.push_back(x);
    }
    const float edges[] = {0.0f,     -0.0f,   INFINITY, -INFINITY, std::nanf(""), 65504.0f,
                           65520.0f, 3.4e38f, -3.4e38f, 1e-45f,    1e-40f};
    inputs.insert(inputs.end(), std::begin(edges), std::end(edges));
    const Tensor floats = Tensor::from_vector(inputs, {int64_t(inputs.size())});
    Tensor narrow = poisoned({int64_t(inputs.size())}, dtype, Device::cuda);
    kernels::cast(gpu(floats), narrow);
    const Tensor narrow_host = narrow.to(Device::cpu), narrow_ref = floats.to(dtype);
    const uint16_t* got = static_cast<const uint16_t*>(narrow_host.raw());
    const uint16_t* want = static_cast<const uint16_t*>(narrow_ref.raw());
    int64_t wrong = 0;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (got[i] != want[i] && !std::isnan(inputs[i]) && wrong++ < 5)
        ADD_FAILURE() << dtype << ": " << inputs[i] << " rounds to 0x" << std::hex << got[i]
                      << " on the GPU, 0x" << want[i] << " on the host" << std::dec;
    EXPECT_EQ(wrong, 0) << dtype;
  }
}

// ---- Pooling.

TEST(GpuPool, AvgpoolForwardAndBackward) {
  MINAMP_REQUIRE_GPU();
  Rng rng(21);
  const std::vector<Shape> shapes = {{1, 1, 1, 1}, {2, 3, 5, 17}, {8, 7, 7, 64}};
  for (const Shape& shape : shapes)
    for (DType dtype : kFloating) {
      const Tensor x = random_tensor(rng, shape, dtype);
      Tensor y = poisoned({shape[0], shape[3]}, dtype, Device::cuda);
      kernels::avgpool_forward(gpu(x), y);
      Tensor y_ref = Tensor::empty({shape[0], shape[3]}, dtype);
      kernels::avgpool_forward(x, y_ref);
      expect_close(y, y_ref, tolerance_for(dtype), cat("avgpool_forward ", shape, " ", dtype));

      for (DType grad_type : kFloating) { // dx may have another dtype than dy
        const Tensor dy = random_tensor(rng, {shape[0], shape[3]}, dtype);
        Tensor dx = poisoned(shape, grad_type, Device::cuda);
        kernels::avgpool_backward(gpu(dy), dx);
        Tensor dx_ref = Tensor::empty(shape, grad_type);
        kernels::avgpool_backward(dy, dx_ref);
        expect_close(dx, dx_ref, tolerance({dtype}, grad_type),
                     cat("avgpool_backward ", shape, " dy ", dtype, " dx ", grad_type));
      }
    }
}

TEST(GpuPool, MaxpoolForwardAndBackwardEqualTheReference) {
  MINAMP_REQUIRE_GPU();
  Rng rng(22);
  // ResNet's stem window at odd and even sizes, a window without overlap, stride 1; channels
  // in packs of 4 (64, 12) and not (3, 7, 2).
  const std::vector<std::pair<Shape, MaxPoolParams>> cases = {{{2, 17, 17, 64}, {3, 2, 1}},
                                                              {{1, 8, 10, 3}, {3, 2, 1}},
                                                              {{3, 6, 5, 7}, {2, 2, 0}},
                                                              {{1, 5, 5, 2}, {3, 1, 1}},
                                                              {{2, 6, 6, 12}, {3, 1, 1}}};
  for (const auto& [shape, pool] : cases)
    for (DType dtype : kFloating) {
      const std::string what =
          cat(shape, " kernel ", pool.kernel, " stride ", pool.stride, " ", dtype);
      const Tensor x = random_tensor(rng, shape, dtype);
      const Shape out{shape[0], (shape[1] + 2 * pool.pad - pool.kernel) / pool.stride + 1,
                      (shape[2] + 2 * pool.pad - pool.kernel) / pool.stride + 1, shape[3]};
      Tensor y = poisoned(out, dtype, Device::cuda);
      Tensor argmax = Tensor::full(out, -1.0f, DType::i32, Device::cuda);
      kernels::maxpool2d_forward(gpu(x), y, argmax, pool);
      Tensor y_ref = Tensor::empty(out, dtype), argmax_ref = Tensor::empty(out, DType::i32);
      kernels::maxpool2d_forward(x, y_ref, argmax_ref, pool);
      expect_equal(y, y_ref, "maxpool2d_forward y " + what); // a max is exact
      expect_equal(argmax, argmax_ref, "maxpool2d_forward argmax " + what);

      for (DType grad_type : kFloating) { // fp32 sums in the same order: equal, rounded alike
        const Tensor dy = random_tensor(rng, out, dtype);
        Tensor dx = poisoned(shape, grad_type, Device::cuda);
        kernels::maxpool2d_backward(gpu(dy), argmax, dx, pool);
        Tensor dx_ref = Tensor::empty(shape, grad_type);
        kernels::maxpool2d_backward(dy, argmax_ref, dx_ref, pool);
        expect_equal(dx, dx_ref, cat("maxpool2d_backward ", what, " dx ", grad_type));
      }
    }
}

// 2 channels (one at a time) and 4 (a pack).
TEST(GpuPool, MaxpoolTakesNaNAndTheFirstOfEqualValues) {
  MINAMP_REQUIRE_GPU();
  for (int64_t channels : {2, 4}) {
    Tensor x = Tensor::zeros({1, 5, 5, channels});
    x.data<float>()[channels * 12] = std::nanf(""); // channel 0 of the centre pixel
    const Shape out{1, 3, 3, channels};
    Tensor y = poisoned(out, DType::f32, Device::cuda);
    Tensor argmax = Tensor::empty(out, DType::i32, Device::cuda);
    kernels::maxpool2d_forward(gpu(x), y, argmax, MaxPoolParams{});
    Tensor y_ref = Tensor::empty(out), argmax_ref = Tensor::empty(out, DType::i32);
    kernels::maxpool2d_forward(x, y_ref, argmax_ref, MaxPoolParams{});
    const std::string what = cat(channels, " channels");
    expect_equal(y, y_ref, "maxpool2d_forward of zeros and a NaN, " + what);
    expect_equal(argmax, argmax_ref, "maxpool2d_forward argmax of zeros and a NaN, " + what);
  }
}

// ---- Reductions.

TEST(GpuReduce, BiasBackwardAccumulatesColumnSums) {
  MINAMP_REQUIRE_GPU();
  Rng rng(31);
  // [2, 40000]: more column tiles than 8 per SM (33,792 columns on 132 SMs), each still needs a
  // block of rows.
  const std::vector<std::pair<int64_t, int64_t>> dims = {
      {1, 1}, {17, 3}, {1000, 33}, {3, 1000}, {65536, 64}, {0, 5}, {2, 40000}};
  for (const auto& [rows, cols] : dims)
    for (DType dtype : kFloating) {
      const Tensor dy = random_tensor(rng, {rows, cols}, dtype);
      const Tensor db_start = random_tensor(rng, {cols});
      Tensor db = gpu(db_start);
      kernels::bias_backward(gpu(dy), db);
      Tensor db_ref = db_start.clone();
      kernels::bias_backward(dy, db_ref);
      expect_close(db, db_ref, tolerance_for(DType::f32),
                   cat("bias_backward [", rows, ", ", cols, "] ", dtype));
    }
}

TEST(GpuReduce, SumSquaresAndClipCoefficient) {
  MINAMP_REQUIRE_GPU();
  Rng rng(32);
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(17), int64_t(1000), int64_t(1) << 20})
    for (DType dtype : kFloating) {
      const Tensor x = random_tensor(rng, {n}, dtype);
      const Tensor start = Tensor::from_vector({rng.uniform(0.0f, 2.0f)}, {1});
      Tensor sum_sq = gpu(start);
      kernels::sum_squares(gpu(x), sum_sq);
      Tensor sum_sq_ref = start.clone();
      kernels::sum_squares(x, sum_sq_ref);
      expect_close(sum_sq, sum_sq_ref, tolerance_for(DType::f32),
                   label("sum_squares", n, dtype, dtype));

      for (float max_norm : {0.5f, 1e6f}) {
        Tensor coef = poisoned({1}, DType::f32, Device::cuda);
        kernels::clip_coefficient(sum_sq, max_norm, coef);
        Tensor coef_ref = Tensor::empty({1});
        kernels::clip_coefficient(sum_sq_ref, max_norm, coef_ref);
        expect_close(coef, coef_ref, tolerance_for(DType::f32), cat("clip_coefficient ", max_norm));
      }
    }
  // A NaN norm gives a NaN coefficient, not 1 (PyTorch's clamp(max=1) keeps the NaN too).
  const Tensor nan_sum = Tensor::full({1}, std::nanf(""));
  Tensor coef = Tensor::zeros({1}, DType::f32, Device::cuda), coef_ref = Tensor::zeros({1});
  kernels::clip_coefficient(gpu(nan_sum), 1.0f, coef);
  kernels::clip_coefficient(nan_sum, 1.0f, coef_ref);
  EXPECT_TRUE(std::isnan(coef.item()));
  EXPECT_TRUE(std::isnan(coef_ref.item()));
}

// Values spread over 2^-40 .. 2^20 with both signs, plus zeros, infinities and NaN.
Tensor wide_range_values(Rng& rng, int64_t n, DType dtype) {
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) {
    const uint32_t kind = rng.below(20);
    if (kind == 0)
      v = 0.0f;
    else if (kind == 1)
      v = INFINITY;
    else if (kind == 2)
      v = std::nanf("");
    else
      v = (rng.below(2) ? 1.0f : -1.0f) * std::exp2(rng.uniform(-40.0f, 20.0f));
  }
  return Tensor::from_vector(values, {n}, dtype);
}

TEST(GpuReduce, RangeCountsMatchExactly) {
  MINAMP_REQUIRE_GPU();
  Rng rng(33);
  for (DType format : {DType::f16, DType::bf16})
    for (int64_t n : {int64_t(1), int64_t(17), int64_t(1000), int64_t(300000)})
      for (DType dtype : kFloating)
        for (float scale : {1.0f, 1024.0f, 65536.0f}) {
          const Tensor x = wide_range_values(rng, n, dtype);
          const Tensor start = Tensor::from_vector({1, 2, 3, 4, 5}, {5});
          Tensor counts = gpu(start);
          kernels::range_counts(gpu(x), scale, format, counts);
          Tensor counts_ref = start.clone();
          kernels::range_counts(x, scale, format, counts_ref);
          expect_equal(counts, counts_ref,
                       cat("range_counts in ", format, " n=", n, " ", dtype, " scale ", scale));
        }
  // Exactly on the range edges (the CPU tests pin what each counts as).
  for (DType format : {DType::f16, DType::bf16}) {
    const std::vector<float>& values =
        format == DType::f16 ? test::kFp16RangeEdgesAt1024 : test::kBf16RangeEdgesAt1024;
    const Tensor edges = Tensor::from_vector(values, {6});
    Tensor counts = gpu(Tensor::zeros({5}));
    kernels::range_counts(gpu(edges), 1024.0f, format, counts);
    Tensor counts_ref = Tensor::zeros({5});
    kernels::range_counts(edges, 1024.0f, format, counts_ref);
    expect_equal(counts, counts_ref, cat("range_counts on the ", format, " range edges"));
  }
}

// ---- Losses.

// pred [1, n] against target [n] (as sine's [1, S, S, 1] output): the mean is over elements.
TEST(GpuLoss, MseForwardAndBackward) {
  MINAMP_REQUIRE_GPU();
  Rng rng(41);
  const Tensor dloss = Tensor::from_vector({rng.uniform(0.5f, 2.0f)}, {1});
  for (int64_t n : kSizes)
    for (DType pred_type : kFloating)
      for (DType target_type : kFloating) {
        const Tensor pred = random_tensor(rng, {1, n}, pred_type);
        const Tensor target = random_tensor(rng, {n}, target_type);
        Tensor loss = poisoned({1}, DType::f32, Device::cuda);
        kernels::mse_forward(gpu(pred), gpu(target), loss);
        Tensor loss_ref = Tensor::empty({1});
        kernels::mse_forward(pred, target, loss_ref);
        expect_close(loss, loss_ref, tolerance_for(DType::f32),
                     label("mse_forward", n, pred_type, target_type));

        for (DType grad_type : kFloating) { // dpred may have another dtype than pred
          Tensor dpred = poisoned({1, n}, grad_type, Device::cuda);
          kernels::mse_backward(gpu(pred), gpu(target), gpu(dloss), dpred);
          Tensor dpred_ref = Tensor::empty({1, n}, grad_type);
          kernels::mse_backward(pred, target, dloss, dpred_ref);
          expect_close(
              dpred, dpred_ref, tolerance({pred_type, target_type}, grad_type),
              cat(label("mse_backward", n, pred_type, target_type), ", dpred ", grad_type));
        }
      }
}

Tensor random_labels(Rng& rng, int64_t rows, int64_t classes) {
  std::vector<float> labels(static_cast<size_t>(rows));
  for (float& l : labels) l = static_cast<float>(rng.below(static_cast<uint32_t>(classes)));
  return Tensor::from_vector(labels, {rows}, DType::i32);
}

TEST(GpuLoss, CrossEntropyForwardAndBackward) {
  MINAMP_REQUIRE_GPU();
  Rng rng(42);
  const Tensor dloss = Tensor::from_vector({rng.uniform(0.5f, 2.0f)}, {1});
  const std::vector<std::pair<int64_t, int64_t>> dims = {{1, 1}, {17, 10}, {1000, 37}, {3, 1000}};
  for (const auto& [rows, classes] : dims)
    for (DType dtype : kFloating) {
      const Tensor logits = random_tensor(rng, {rows, classes}, dtype, Device::cpu, -8.0f, 8.0f);
      const Tensor labels = random_labels(rng, rows, classes);
      const std::string what = cat("cross_entropy [", rows, ", ", classes, "] ", dtype);
      Tensor loss = poisoned({1}, DType::f32, Device::cuda);
      kernels::cross_entropy_forward(gpu(logits), gpu(labels), loss);
      Tensor loss_ref = Tensor::empty({1});
      kernels::cross_entropy_forward(logits, labels, loss_ref);
      expect_close(loss, loss_ref, tolerance_for(DType::f32), what);

      for (DType grad_type : kFloating) { // dlogits may have another dtype than the logits
        Tensor dlogits = poisoned({rows, classes}, grad_type, Device::cuda);
        kernels::cross_entropy_backward(gpu(logits), gpu(labels), gpu(dloss), dlogits);
        Tensor dlogits_ref = Tensor::empty({rows, classes}, grad_type);
        kernels::cross_entropy_backward(logits, labels, dloss, dlogits_ref);
        expect_close(dlogits, dlogits_ref, tolerance({dtype}, grad_type),
                     cat(what, ", dlogits ", grad_type));
      }
    }
}

// The mean of no values is NaN on both devices, not 0.
TEST(GpuLoss, EmptyInputsGiveTheCpusLoss) {
  MINAMP_REQUIRE_GPU();
  // The outputs start at 5 (NaN poison would pass for a loss never written).
  Tensor loss = Tensor::full({1}, 5.0f, DType::f32, Device::cuda), loss_ref = Tensor::empty({1});
  kernels::mse_forward(gpu(Tensor::empty({0, 1})), gpu(Tensor::empty({0, 1})), loss);
  kernels::mse_forward(Tensor::empty({0, 1}), Tensor::empty({0, 1}), loss_ref);
  expect_equal(loss, loss_ref, "mse of nothing");
  const Tensor logits = Tensor::empty({0, 3}), labels = Tensor::empty({0}, DType::i32);
  loss = Tensor::full({1}, 5.0f, DType::f32, Device::cuda);
  kernels::cross_entropy_forward(gpu(logits), gpu(labels), loss);
  kernels::cross_entropy_forward(logits, labels, loss_ref);
  expect_equal(loss, loss_ref, "cross-entropy of nothing");
}

// More rows and elements than one pass of the capped grids covers (32 blocks of 256 threads per
// SM: 33,792 warps, one row each, and 1,081,344 threads on 132 SMs; 37,888 and 1,212,416 on 148):
// the grid-stride loops must reach the rest.
TEST(GpuLoss, InputsLargerThanOnePassOfTheGrid) {
  MINAMP_REQUIRE_GPU();
  Rng rng(45);
  const Tensor dloss = Tensor::from_vector({rng.uniform(0.5f, 2.0f)}, {1});
  const int64_t rows = 50000, n = 1500000;
  const Tensor logits = random_tensor(rng, {rows, 3}, DType::f32, Device::cpu, -4.0f, 4.0f);
  const Tensor labels = random_labels(rng, rows, 3);
  Tensor loss = poisoned({1}, DType::f32, Device::cuda), loss_ref = Tensor::empty({1});
  kernels::cross_entropy_forward(gpu(logits), gpu(labels), loss);
  kernels::cross_entropy_forward(logits, labels, loss_ref);
  expect_close(loss, loss_ref, tolerance_for(DType::f32), "cross_entropy_forward, 50000 rows");
  Tensor dlogits = poisoned({rows, 3}, DType::f32, Device::cuda);
  Tensor dlogits_ref = Tensor::empty({rows, 3});
  kernels::cross_entropy_backward(gpu(logits), gpu(labels), gpu(dloss), dlogits);
  kernels::cross_entropy_backward(logits, labels, dloss, dlogits_ref);
  expect_close(dlogits, dlogits_ref, tolerance_for(DType::f32), "cross_entropy_backward");

  const Tensor pred = random_tensor(rng, {n}), target = random_tensor(rng, {n});
  kernels::mse_forward(gpu(pred), gpu(target), loss);
  kernels::mse_forward(pred, target, loss_ref);
  expect_close(loss, loss_ref, tolerance_for(DType::f32), "mse_forward, 1500000 elements");
  Tensor dpred = poisoned({n}, DType::f32, Device::cuda), dpred_ref = Tensor::empty({n});
  kernels::mse_backward(gpu(pred), gpu(target), gpu(dloss), dpred);
  kernels::mse_backward(pred, target, dloss, dpred_ref);
  expect_close(dpred, dpred_ref, tolerance_for(DType::f32), "mse_backward, 1500000 elements");
}

// Logits around +100, where exp overflows even in fp32, and around -1000, where it underflows to
// 0 for every class, unless the kernels subtract each row's maximum first, as the reference does
// (f32 and f16 logits; the math is fp32 for both).
TEST(GpuLoss, CrossEntropyIsStableFarFromZero) {
  MINAMP_REQUIRE_GPU();
  Rng rng(44);
  const Tensor dloss = Tensor::full({1}, 1.0f);
  for (DType dtype : kFloating)
    for (float centre : {100.0f, -1000.0f}) {
      const Tensor logits =
          random_tensor(rng, {17, 10}, dtype, Device::cpu, centre - 8.0f, centre + 8.0f);
      const Tensor labels = random_labels(rng, 17, 10);
      const std::string what = cat("cross_entropy around ", centre, " ", dtype);
      Tensor loss = poisoned({1}, DType::f32, Device::cuda);
      kernels::cross_entropy_forward(gpu(logits), gpu(labels), loss);
      Tensor loss_ref = Tensor::empty({1});
      kernels::cross_entropy_forward(logits, labels, loss_ref);
      ASSERT_TRUE(std::isfinite(loss_ref.item())) << what;
      expect_close(loss, loss_ref, tolerance_for(DType::f32), what);
      Tensor dlogits = poisoned({17, 10}, dtype, Device::cuda);
      kernels::cross_entropy_backward(gpu(logits), gpu(labels), gpu(dloss), dlogits);
      Tensor dlogits_ref = Tensor::empty({17, 10}, dtype);
      kernels::cross_entropy_backward(logits, labels, dloss, dlogits_ref);
      expect_close(dlogits, dlogits_ref, tolerance_for(dtype), what);
    }
}

TEST(GpuLoss, CrossEntropyOutOfRangeLabelGivesNaNNotACrash) {
  MINAMP_REQUIRE_GPU();
  Rng rng(43);
  const Tensor logits = gpu(random_tensor(rng, {4, 5}));
  const Tensor labels = gpu(Tensor::from_vector({0, -1, 5, 4}, {4}, DType::i32));
  Tensor loss = Tensor::zeros({1}, DType::f32, Device::cuda);
  kernels::cross_entropy_forward(logits, labels, loss);
  EXPECT_TRUE(std::isnan(loss.item()));
  Tensor dlogits = poisoned({4, 5}, DType::f32, Device::cuda);
  kernels::cross_entropy_backward(logits, labels, gpu(Tensor::full({1}, 1.0f)), dlogits);
  const std::vector<float> grad = dlogits.to_vector();
  // Rows 0 and 3 have valid labels: their gradients are those of the same rows alone (the mean
  // over 4 rows: dloss / 4 each).
  const std::vector<float> logit_values = logits.to_vector();
  for (int row : {0, 3}) {
    const Tensor one_row = Tensor::from_vector(
        std::vector<float>(logit_values.begin() + row * 5, logit_values.begin() + row * 5 + 5),
        {1, 5});
    Tensor expected = Tensor::empty({1, 5});
    kernels::cross_entropy_backward(one_row,
                                    Tensor::from_vector({row == 0 ? 0.0f : 4.0f}, {1}, DType::i32),
                                    Tensor::full({1}, 0.25f), expected);
    const std::vector<float> want = expected.to_vector();
    for (int k = 0; k < 5; ++k)
      EXPECT_NEAR(grad[row * 5 + k], want[k], 1e-6) << "row " << row << " has a valid label";
  }
  for (int k = 0; k < 5; ++k) {
    EXPECT_TRUE(std::isnan(grad[5 + k])) << "row 1 has label -1";
    EXPECT_TRUE(std::isnan(grad[10 + k])) << "row 2 has label 5 with K = 5";
  }
  // Label K the only bad one (it must not read the next row's first logit).
  kernels::cross_entropy_forward(logits, gpu(Tensor::from_vector({0, 5, 4, 1}, {4}, DType::i32)),
                                 loss);
  EXPECT_TRUE(std::isnan(loss.item())) << "row 1 has label 5 with K = 5";
}

// ---- Batch norm.

struct BatchNormCase {
  int64_t rows, channels;
  DType dtype;
  bool training, relu;
  float momentum = 0.1f, eps = 1e-5f;
  DType grad_dtype = dtype; // of dy and dx
  float eighths_centre = 0; // x uniform in [-1, 3) when 0, else eighths_around this centre
};

std::string describe_case(const BatchNormCase& c) {
  return cat("batchnorm [", c.rows, ", ", c.channels, "] ", c.dtype,
             c.training ? " training" : " eval", c.relu ? " relu" : "", " momentum ", c.momentum,
             " eps ", c.eps, " gradients ", c.grad_dtype, " eighths around ", c.eighths_centre);
}

// Values centre + k / 8 for whole k in [-16, 16): near 1000, all exact in f32, and so are sums
// of up to 2048 of them (multiples of 1/8 below 2^21), and their mean when the count is a power
// of two.
Tensor eighths_around(Rng& rng, const Shape& shape, float centre) {
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  for (float& v : values) v = centre + (float(rng.below(32)) - 16.0f) / 8.0f;
  return Tensor::from_vector(values, shape);
}

// Runs forward and backward on both devices and compares every output.
void check_batchnorm(const BatchNormCase& c, Rng& rng) {
  SCOPED_TRACE(describe_case(c));
  const BatchNormParams bn{c.training, c.momentum, c.eps, c.relu};
  const Shape x_shape{c.rows, c.channels}, channel_shape{c.channels};
  const Tensor x = c.eighths_centre == 0
                       ? random_tensor(rng, x_shape, c.dtype, Device::cpu, -1.0f, 3.0f)
                       : eighths_around(rng, x_shape, c.eighths_centre).to(c.dtype);
  const Tensor gamma = random_tensor(rng, channel_shape, DType::f32, Device::cpu, 0.5f, 1.5f);
  const Tensor beta = random_tensor(rng, channel_shape);
  const Tensor running_mean0 = random_tensor(rng, channel_shape);
  const Tensor running_var0 =
      random_tensor(rng, channel_shape, DType::f32, Device::cpu, 0.5f, 2.0f);

  Tensor y = poisoned(x_shape, c.dtype, Device::cuda);
  Tensor mean = poisoned(channel_shape, DType::f32, Device::cuda);
  Tensor invstd = poisoned(channel_shape, DType::f32, Device::cuda);
  Tensor running_mean = gpu(running_mean0), running_var = gpu(running_var0);
  kernels::batchnorm_forward(gpu(x), gpu(gamma), gpu(beta), y, mean, invstd, running_mean,
                             running_var, bn);
  Tensor y_ref = Tensor::empty(x_shape, c.dtype);
  Tensor mean_ref = Tensor::empty(channel_shape), invstd_ref = Tensor::empty(channel_shape);
  Tensor running_mean_ref = running_mean0.clone(), running_var_ref = running_var0.clone();
  kernels::batchnorm_forward(x, gamma, beta, y_ref, mean_ref, invstd_ref, running_mean_ref,
                             running_var_ref, bn);
  const double f32_tol = tolerance_for(DType::f32);
  expect_close(y, y_ref, tolerance_for(c.dtype), "y");
  expect_close(mean, mean_ref, f32_tol, "mean");
  expect_close(invstd, invstd_ref, f32_tol, "invstd");
  expect_close(running_mean, running_mean_ref, f32_tol, "running_mean");
  expect_close(running_var, running_var_ref, f32_tol, "running_var");

  const Tensor dy = random_tensor(rng, x_shape, c.grad_dtype);
  const Tensor dgamma0 = random_tensor(rng, channel_shape),
               dbeta0 = random_tensor(rng, channel_shape);
  Tensor dx = poisoned(x_shape, c.grad_dtype, Device::cuda);
  Tensor dgamma = gpu(dgamma0), dbeta = gpu(dbeta0);
  Tensor dx_sums = poisoned(channel_shape, DType::f32, Device::cuda);
  BatchNormParams sums_bn = bn;
  sums_bn.dx_sums = &dx_sums;
  kernels::batchnorm_backward(gpu(x), gpu(gamma), gpu(beta), mean, invstd, gpu(dy), dx, dgamma,
                              dbeta, sums_bn);
  test::expect_column_sums(dx_sums, dx, 1e-5, "dx_sums against the sums of dx as stored");
  // The reference backward reads the GPU's saved statistics (compared above): the ReLU mask is
  // recomputed from them, and fp32 vs double statistics (~1e-7 apart) would flip it for the few
  // elements that close to zero (f16 x repeats each value ~60 times per channel at 262144 rows),
  // each flip moving dgamma / dbeta by ~|dy|, far past the f32 tolerance.
  const Tensor mean_used = mean.to(Device::cpu), invstd_used = invstd.to(Device::cpu);
  Tensor dx_ref = Tensor::empty(x_shape, c.grad_dtype);
  Tensor dgamma_ref = dgamma0.clone(), dbeta_ref = dbeta0.clone();
  kernels::batchnorm_backward(x, gamma, beta, mean_used, invstd_used, dy, dx_ref, dgamma_ref,
                              dbeta_ref, bn);
  expect_close(dx, dx_ref, tolerance({c.dtype, c.grad_dtype}, c.grad_dtype), "dx");
  expect_close(dgamma, dgamma_ref, f32_tol, "dgamma");
  expect_close(dbeta, dbeta_ref, f32_tol, "dbeta");

  // The same backward in place, dx written over dy: bit for bit the dx, dx_sums and affine
  // gradients of the separate dx above.
  Tensor in_place = gpu(dy), in_place_dgamma = gpu(dgamma0), in_place_dbeta = gpu(dbeta0);
  Tensor in_place_sums = poisoned(channel_shape, DType::f32, Device::cuda);
  BatchNormParams in_place_bn = bn;
  in_place_bn.dx_sums = &in_place_sums;
  kernels::batchnorm_backward(gpu(x), gpu(gamma), gpu(beta), mean, invstd, in_place, in_place,
                              in_place_dgamma, in_place_dbeta, in_place_bn);
  EXPECT_EQ(in_place.to_vector(), dx.to_vector()) << "dx in place over dy";
  EXPECT_EQ(in_place_sums.to_vector(), dx_sums.to_vector()) << "dx_sums in place";
  EXPECT_EQ(in_place_dgamma.to_vector(), dgamma.to_vector()) << "dgamma in place";
  EXPECT_EQ(in_place_dbeta.to_vector(), dbeta.to_vector()) << "dbeta in place";

  // The same backward with the sums given (as a GEMM that wrote dy would give them): its own
  // reduction is skipped, and the results agree with the reference's.
  const test::BatchNormGradSums host =
      test::batchnorm_grad_sums_on_host(x, dy, gamma, beta, mean_used, invstd_used, c.relu);
  const Tensor sums = Tensor::from_vector(std::vector<float>(host.sums.begin(), host.sums.end()),
                                          {2, c.channels}, DType::f32, Device::cuda);
  BatchNormParams given_bn = bn;
  given_bn.grad_sums = &sums;
  Tensor given_dx = poisoned(x_shape, c.grad_dtype, Device::cuda);
  Tensor given_dgamma = gpu(dgamma0), given_dbeta = gpu(dbeta0);
  kernels::batchnorm_backward(gpu(x), gpu(gamma), gpu(beta), mean, invstd, gpu(dy), given_dx,
                              given_dgamma, given_dbeta, given_bn);
  expect_close(given_dx, dx_ref, tolerance({c.dtype, c.grad_dtype}, c.grad_dtype),
               "dx from given sums");
  expect_close(given_dgamma, dgamma_ref, f32_tol, "dgamma from given sums");
  expect_close(given_dbeta, dbeta_ref, f32_tol, "dbeta from given sums");
}

// The backward's dx_sums come from the dx kernel where each of its threads keeps its channels
// (C = 1, 2, 8 and 32; 2000 x 8 over several blocks) and from a reduction over dx elsewhere.
TEST(GpuBatchNorm, SmallShapesEveryMode) {
  MINAMP_REQUIRE_GPU();
  Rng rng(51);
  for (const auto& [rows, channels] : std::vector<std::pair<int64_t, int64_t>>{
           {3, 5}, {2, 1}, {17, 33}, {1000, 7}, {9, 12}, {64, 32}, {40, 2}, {2000, 8}})
    for (DType dtype : kFloating)
      for (bool training : {true, false})
        for (bool relu : {false, true})
          check_batchnorm({rows, channels, dtype, training, relu}, rng);
  // One row (batch-1 inference) in eval mode, where training would have no variance.
  for (DType dtype : kFloating)
    for (bool relu : {false, true}) check_batchnorm({1, 6, dtype, false, relu}, rng);
  // Another momentum and eps than PyTorch's defaults, so that neither can be hard-wired.
  for (bool training : {true, false})
    check_batchnorm({17, 33, DType::f32, training, true, 0.3f, 1e-3f}, rng);
  // dy and dx of the other dtype than x (allowed, as on the CPU), one element at a time (C = 33)
  // and in packs of four channels (C = 12).
  for (int64_t channels : {33, 12})
    for (DType dtype : kFloating)
      check_batchnorm({17, channels, dtype, true, true, 0.1f, 1e-5f,
                       dtype == DType::f16 ? DType::f32 : DType::f16},
                      rng);
}

// x around 1000 with a spread of 4: the variance must be the mean of squared deviations from the
// mean; E[x^2] - mean^2 in fp32 loses it to cancellation (x^2 near 1e6, its f32 sums off by tens).
// The values, their sums and (1024 rows) their mean are exact in fp32, so the GPU's statistics
// agree with the CPU's double ones to fp32 rounding.
TEST(GpuBatchNorm, StatisticsOfValuesFarFromZero) {
  MINAMP_REQUIRE_GPU();
  Rng rng(54);
  check_batchnorm({1024, 7, DType::f32, true, false, 0.1f, 1e-5f, DType::f32, 1000.0f}, rng);
}

// Eval mode with the fused ReLU and a NaN in x: y, dx, dgamma and dbeta as on the CPU (which
// test_kernels_batchnorm pins to PyTorch: the NaN's gradient passes the ReLU).
TEST(GpuBatchNorm, FusedReluPassesTheGradientOfANaN) {
  MINAMP_REQUIRE_GPU();
  Rng rng(53);
  const BatchNormParams bn{false, 0.1f, 1e-5f, true};
  std::vector<float> values = random_tensor(rng, {5, 3}).to_vector();
  values[0] = std::nanf("");
  const Tensor x = Tensor::from_vector(values, {5, 3});
  const Tensor gamma = random_tensor(rng, {3}, DType::f32, Device::cpu, 0.5f, 1.5f);
  const Tensor beta = random_tensor(rng, {3}), dy = random_tensor(rng, {5, 3});
  const Tensor running_mean = random_tensor(rng, {3});
  const Tensor running_var = random_tensor(rng, {3}, DType::f32, Device::cpu, 0.5f, 2.0f);
  struct Outputs {
    Tensor y, dx, dgamma, dbeta;
  };
  auto run = [&](Device device) {
    Outputs out{poisoned({5, 3}, DType::f32, device), poisoned({5, 3}, DType::f32, device),
                Tensor::zeros({3}, DType::f32, device), Tensor::zeros({3}, DType::f32, device)};
    Tensor mean = poisoned({3}, DType::f32, device), invstd = poisoned({3}, DType::f32, device);
    Tensor rm = running_mean.to(device), rv = running_var.to(device);
    kernels::batchnorm_forward(x.to(device), gamma.to(device), beta.to(device), out.y, mean, invstd,
                               rm, rv, bn);
    kernels::batchnorm_backward(x.to(device), gamma.to(device), beta.to(device), mean, invstd,
                                dy.to(device), out.dx, out.dgamma, out.dbeta, bn);
    return out;
  };
  const Outputs on_gpu = run(Device::cuda), on_cpu = run(Device::cpu);
  EXPECT_TRUE(std::isnan(on_gpu.y.to_vector()[0]));
  const float dx0 = on_gpu.dx.to_vector()[0];
  EXPECT_TRUE(std::isfinite(dx0) && dx0 != 0.0f) << "the NaN's gradient passes the ReLU: " << dx0;
  EXPECT_TRUE(std::isnan(on_gpu.dgamma.to_vector()[0]));
  for (auto [gpu_out, cpu_out, name] :
       {std::tuple{&on_gpu.y, &on_cpu.y, "y"}, std::tuple{&on_gpu.dx, &on_cpu.dx, "dx"},
        std::tuple{&on_gpu.dgamma, &on_cpu.dgamma, "dgamma"},
        std::tuple{&on_gpu.dbeta, &on_cpu.dbeta, "dbeta"}}) {
    const std::vector<float> g = gpu_out->to_vector(), c = cpu_out->to_vector();
    for (size_t i = 0; i < g.size(); ++i) {
      const bool both_nan = std::isnan(g[i]) && std::isnan(c[i]);
      EXPECT_TRUE(both_nan || std::abs(g[i] - c[i]) <= 1e-5f * (1.0f + std::abs(c[i])))
          << name << "[" << i << "]: " << g[i] << " on gpu, " << c[i] << " on cpu";
    }
  }
}

// The fused ReLU's mask in the backward, as on the CPU (PyTorch's): a pre-activation of exactly
// 0 is masked (channel 0: x equal to its running mean, beta 0), and a masked dy is dropped, not
// multiplied by 0 (channel 1: inf where the pre-activation is negative). x and dy are f32, dx f16
// (a dtype of its own).
TEST(GpuBatchNorm, FusedReluMaskDropsDyWherePreActivationIsAtMostZero) {
  MINAMP_REQUIRE_GPU();
  const BatchNormParams bn{false, 0.1f, 1e-5f, true};
  const Tensor x = Tensor::from_vector({0.5f, -2.0f, 0.5f, 1.0f, 0.5f, -1.5f, 0.5f, 2.0f}, {4, 2});
  const Tensor gamma = Tensor::from_vector({1.5f, 1.0f}, {2});
  const Tensor beta = Tensor::from_vector({0.0f, 0.25f}, {2});
  const Tensor running_mean = Tensor::from_vector({0.5f, 0.0f}, {2});
  const Tensor running_var = Tensor::from_vector({2.0f, 1.0f}, {2});
  const Tensor dy =
      Tensor::from_vector({0.5f, INFINITY, -1.0f, 0.75f, 2.0f, -INFINITY, 1.0f, -0.5f}, {4, 2});
  struct Outputs {
    Tensor dx, dgamma, dbeta;
  };
  auto run = [&](Device device) {
    Tensor mean = poisoned({2}, DType::f32, device), invstd = poisoned({2}, DType::f32, device);
    Tensor y = poisoned({4, 2}, DType::f32, device);
    Tensor rm = running_mean.to(device), rv = running_var.to(device);
    kernels::batchnorm_forward(x.to(device), gamma.to(device), beta.to(device), y, mean, invstd, rm,
                               rv, bn);
    Outputs out{poisoned({4, 2}, DType::f16, device), Tensor::zeros({2}, DType::f32, device),
                Tensor::zeros({2}, DType::f32, device)};
    kernels::batchnorm_backward(x.to(device), gamma.to(device), beta.to(device), mean, invstd,
                                dy.to(device), out.dx, out.dgamma, out.dbeta, bn);
    return out;
  };
  const Outputs on_gpu = run(Device::cuda), on_cpu = run(Device::cpu);
  EXPECT_EQ(on_cpu.dbeta.to_vector(), (std::vector<float>{0.0f, 0.75f - 0.5f}));
  expect_close(on_gpu.dx, on_cpu.dx, tolerance_for(DType::f16), "dx");
  expect_close(on_gpu.dgamma, on_cpu.dgamma, tolerance_for(DType::f32), "dgamma");
  expect_close(on_gpu.dbeta, on_cpu.dbeta, tolerance_for(DType::f32), "dbeta");
}

TEST(GpuBatchNorm, LargeActivation262144x256) {
  MINAMP_REQUIRE_GPU();
  Rng rng(52);
  check_batchnorm({262144, 256, DType::f16, true, true}, rng);
  check_batchnorm({262144, 256, DType::f32, true, false}, rng);
}

// More elements than one pass of the grid-stride loops covers (the grid is capped near 32 blocks
// of 256 threads per SM), with channel counts that do not divide a block's threads: the passes
// round their grid up to a whole number of rows of threads (C = 7: a multiple of 7 blocks; C = 20,
// packs of four channels, 5 a row: of 5 blocks) so that each thread keeps its channels from one
// pass to the next, and the reductions whose blocks cannot hold whole rows take their other path.
TEST(GpuBatchNorm, ChannelsStayPinnedAcrossGridStridePasses) {
  MINAMP_REQUIRE_GPU();
  Rng rng(53);
  check_batchnorm({524288, 7, DType::f16, true, true}, rng);
  check_batchnorm({524288, 7, DType::f32, false, false}, rng);
  check_batchnorm({262144, 20, DType::f16, true, true}, rng);
  check_batchnorm({262144, 20, DType::f32, false, false}, rng);
}

TEST(GpuBatchNorm, FourDimensionalActivationIsRowsTimesChannels) {
  MINAMP_REQUIRE_GPU();
  Rng rng(53);
  const Tensor x = random_tensor(rng, {2, 3, 4, 6}, DType::f16);
  const Tensor gamma = random_tensor(rng, {6}), beta = random_tensor(rng, {6});
  const BatchNormParams bn;
  Tensor y = poisoned({2, 3, 4, 6}, DType::f16, Device::cuda);
  Tensor mean = poisoned({6}, DType::f32, Device::cuda),
         invstd = poisoned({6}, DType::f32, Device::cuda);
  Tensor rm = Tensor::zeros({6}, DType::f32, Device::cuda),
         rv = Tensor::full({6}, 1.0f, DType::f32, Device::cuda);
  kernels::batchnorm_forward(gpu(x), gpu(gamma), gpu(beta), y, mean, invstd, rm, rv, bn);
  Tensor y_ref = Tensor::empty({2, 3, 4, 6}, DType::f16);
  Tensor mean_ref = Tensor::empty({6}), invstd_ref = Tensor::empty({6});
  Tensor rm_ref = Tensor::zeros({6}), rv_ref = Tensor::full({6}, 1.0f);
  kernels::batchnorm_forward(x, gamma, beta, y_ref, mean_ref, invstd_ref, rm_ref, rv_ref, bn);
  expect_close(y, y_ref, tolerance_for(DType::f16), "y");
}

} // namespace
} // namespace minamp
