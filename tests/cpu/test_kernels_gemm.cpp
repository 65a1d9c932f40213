// Tests of the CPU GEMM kernels (minamp::cpu::gemm, bias_backward): every transpose combination
// against a double reference, the epilogue (alpha, beta, bias, ReLU), the f16 emulation, the
// gradients a Linear layer takes through it (finite differences), the output tiles that spread a
// product over the threads, and the error messages.
#include "kernels/cpu/cpu_util.h"
#include "kernels/kernels.h"
#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

constexpr double kF32Tolerance = 1e-6;
constexpr double kGradientTolerance = 1e-4;

struct GemmCase {
  int64_t m, k, n;
  bool trans_a, trans_b;
  Shape a_shape() const { return trans_a ? Shape{k, m} : Shape{m, k}; }
  Shape b_shape() const { return trans_b ? Shape{n, k} : Shape{k, n}; }
};

std::string name(const GemmCase& g) {
  return cat("M=", g.m, " K=", g.k, " N=", g.n, " trans_a=", g.trans_a, " trans_b=", g.trans_b);
}

std::vector<GemmCase> all_cases() {
  const int64_t sizes[][3] = {{1, 1, 1},  {17, 33, 5}, {64, 48, 32},
                              {5, 1, 17}, {1, 100, 3}, {31, 17, 64}};
  std::vector<GemmCase> cases;
  for (const auto& s : sizes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) cases.push_back({s[0], s[1], s[2], ta, tb});
  return cases;
}

TEST(CpuGemm, MatchesDoubleReferenceForEveryTransposeAndAwkwardShape) {
  Rng rng(11);
  for (const GemmCase& g : all_cases()) {
    const Tensor a = random_tensor(rng, g.a_shape());
    const Tensor b = random_tensor(rng, g.b_shape());
    Tensor c = poisoned({g.m, g.n}); // beta == 0 must not read the NaN
    cpu::gemm(a, g.trans_a, b, g.trans_b, c, {});
    const Doubles ref =
        gemm_reference(to_doubles(a), g.trans_a, to_doubles(b), g.trans_b, g.m, g.k, g.n);
    EXPECT_LT(relative_error_to(c, ref), kF32Tolerance) << name(g);
  }
}

// Every shape: the tiles cover C exactly, their count stays below twice the target of 16 (the
// last halving may double it), and split widths are whole 24-column register blocks.
TEST(CpuGemm, OutputTilesCoverTheProductInWholeRegisterBlocks) {
  for (int64_t rows : {0, 1, 31, 64, 200, 3136, 12544})
    for (int64_t cols : {0, 1, 47, 64, 150, 512}) {
      const cpu::OutputTiles t = cpu::output_tiles(rows, cols);
      const std::string what = cat(rows, " x ", cols);
      EXPECT_EQ(t.rows, rows) << what;
      EXPECT_EQ(t.cols, cols) << what;
      if (rows == 0 || cols == 0) {
        EXPECT_EQ(t.count(), 0) << what;
        continue;
      }
      EXPECT_GE(t.count(), 1) << what;
      EXPECT_LT(t.count(), 32) << what;
      EXPECT_LT((t.row_tiles() - 1) * t.tile_rows, rows) << what; // no empty tile
      EXPECT_GE(t.row_tiles() * t.tile_rows, rows) << what;
      EXPECT_LT((t.col_tiles() - 1) * t.tile_cols, cols) << what;
      EXPECT_GE(t.col_tiles() * t.tile_cols, cols) << what;
      if (t.col_tiles() > 1) {
        EXPECT_EQ(t.tile_cols % 24, 0) << what;
      }
    }
  EXPECT_EQ(cpu::output_tiles(12544, 64).count(), 16);  // ResNet's stem at batch 1: rows split
  EXPECT_GT(cpu::output_tiles(49, 512).col_tiles(), 1); // its last convolutions: columns split
}

// Products cut into several row and column tiles: every transpose matches the double reference,
// with beta = 0 (poisoned C) and beta = 1, bit for bit on 1 and on 4 threads.
TEST(CpuGemm, TiledProductsMatchTheReferenceOnAnyThreadCount) {
  Rng rng(13);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const GemmCase g{200, 70, 150, ta, tb};
      const cpu::OutputTiles tiles = cpu::output_tiles(g.m, g.n);
      ASSERT_GT(tiles.row_tiles(), 1);
      ASSERT_GT(tiles.col_tiles(), 1);
      const Tensor a = random_tensor(rng, g.a_shape());
      const Tensor b = random_tensor(rng, g.b_shape());
      const Tensor c_old = random_tensor(rng, {g.m, g.n});
      auto run = [&] {
        Tensor assigned = poisoned({g.m, g.n}), accumulated = c_old.clone();
        cpu::gemm(a, ta, b, tb, assigned, {});
        GemmEpilogue accumulate;
        accumulate.beta = 1.0f;
        cpu::gemm(a, ta, b, tb, accumulated, accumulate);
        return std::vector<Tensor>{assigned, accumulated};
      };
      const std::vector<Tensor> outputs = outputs_on_any_thread_count(run, name(g));
      const Doubles product = gemm_reference(to_doubles(a), ta, to_doubles(b), tb, g.m, g.k, g.n);
      Doubles plus_old = to_doubles(c_old);
      for (size_t i = 0; i < plus_old.size(); ++i) plus_old[i] += product[i];
      EXPECT_LT(relative_error_to(outputs[0], product), kF32Tolerance) << name(g);
      EXPECT_LT(relative_error_to(outputs[1], plus_old), kF32Tolerance) << name(g);
    }
}

TEST(CpuGemm, EpilogueAppliesAlphaBetaBiasAndReluInFp32) {
  Rng rng(12);
  for (const GemmCase& g : {GemmCase{13, 24, 9, false, true}, GemmCase{8, 5, 33, true, false},
                            GemmCase{6, 11, 7, false, false}, GemmCase{9, 7, 12, true, true}}) {
    const Tensor a = random_tensor(rng, g.a_shape());
    const Tensor b = random_tensor(rng, g.b_shape());
    const Tensor bias = random_tensor(rng, {g.n});
    const Tensor c_old = random_tensor(rng, {g.m, g.n});
    for (bool relu : {false, true}) {
      Tensor c = c_old.clone();
      GemmEpilogue epilogue;
      epilogue.alpha = 0.75f;
      epilogue.beta = -1.5f;
      epilogue.bias = &bias;
      epilogue.relu = relu;
      cpu::gemm(a, g.trans_a, b, g.trans_b, c, epilogue);

      Doubles ref =
          gemm_reference(to_doubles(a), g.trans_a, to_doubles(b), g.trans_b, g.m, g.k, g.n);
      const Doubles old = to_doubles(c_old), bias_values = to_doubles(bias);
      int clamped = 0;
      for (int64_t i = 0; i < g.m * g.n; ++i) {
        ref[i] = 0.75 * ref[i] - 1.5 * old[i] + bias_values[i % g.n];
        if (relu && ref[i] < 0) ref[i] = 0, ++clamped;
      }
      EXPECT_TRUE(!relu || clamped > 0) << "the ReLU case should clamp something";
      EXPECT_LT(relative_error_to(c, ref), kF32Tolerance) << name(g) << " relu=" << relu;
    }
  }
}

TEST(CpuGemm, ViewsHigherRankTensorsAsRowsByLastDimension) {
  Rng rng(13);
  const Tensor a = random_tensor(rng, {2, 3, 4, 7}); // [24, 7]
  const Tensor b = random_tensor(rng, {5, 7});       // used transposed: [7, 5]
  Tensor c = poisoned({2, 3, 4, 5});
  cpu::gemm(a, false, b, true, c, {});
  EXPECT_LT(
      relative_error_to(c, gemm_reference(to_doubles(a), false, to_doubles(b), true, 24, 7, 5)),
      kF32Tolerance);
}

// f16 and bf16 emulation: the 16-bit GEMM must equal the fp32 GEMM of the (exactly widened)
// 16-bit inputs, rounded once to nearest even when C is 16-bit, and unrounded when C is f32.
TEST(CpuGemm, HalfPrecisionInputsEqualFp32ProductOfRoundedInputs) {
  Rng rng(14);
  for (DType dtype : {DType::f16, DType::bf16})
    for (const GemmCase& g : {GemmCase{19, 40, 23, false, false}, GemmCase{16, 17, 8, true, true},
                              GemmCase{7, 64, 33, false, true}}) {
      const Tensor a16 = random_tensor(rng, g.a_shape(), dtype, Device::cpu, -4.0f, 4.0f);
      const Tensor b16 = random_tensor(rng, g.b_shape(), dtype, Device::cpu, -4.0f, 4.0f);
      const Tensor bias = random_tensor(rng, {g.n});
      GemmEpilogue epilogue;
      epilogue.bias = &bias;
      Tensor c32 = poisoned({g.m, g.n});
      cpu::gemm(a16.to(DType::f32), g.trans_a, b16.to(DType::f32), g.trans_b, c32, epilogue);

      Tensor c16 = poisoned({g.m, g.n}, dtype);
      cpu::gemm(a16, g.trans_a, b16, g.trans_b, c16, epilogue);
      ASSERT_EQ(c16.dtype(), dtype);
      const std::vector<float> exact = c32.to_vector(), rounded = c16.to_vector();
      int changed_by_rounding = 0;
      for (size_t i = 0; i < exact.size(); ++i) {
        ASSERT_EQ(rounded[i], round_to(dtype, exact[i])) << dtype << " " << name(g) << " at " << i;
        changed_by_rounding += rounded[i] != exact[i];
      }
      EXPECT_GT(changed_by_rounding, 0) << "the fp32 results were all " << dtype << " values";

      Tensor mixed = poisoned({g.m, g.n}); // f16 inputs, f32 C: no rounding of the output
      cpu::gemm(a16, g.trans_a, b16, g.trans_b, mixed, epilogue);
      EXPECT_EQ(mixed.to_vector(), exact) << name(g);

      // beta reads the old f16 C, widened exactly, then the sum is rounded once.
      epilogue.beta = -0.5f;
      const Tensor old16 = random_tensor(rng, {g.m, g.n}, dtype);
      Tensor with_old32 = old16.to(DType::f32), with_old16 = old16.clone();
      cpu::gemm(a16.to(DType::f32), g.trans_a, b16.to(DType::f32), g.trans_b, with_old32, epilogue);
      cpu::gemm(a16, g.trans_a, b16, g.trans_b, with_old16, epilogue);
      const std::vector<float> sum = with_old32.to_vector(), sum16 = with_old16.to_vector();
      for (size_t i = 0; i < sum.size(); ++i)
        ASSERT_EQ(sum16[i], round_to(dtype, sum[i]))
            << dtype << " " << name(g) << " beta -0.5 at " << i;
    }
}

// A Linear layer y = x W^T + b and its backward, as the layer drives the kernels:
// dx = dy W, dW += dy^T x (beta = 1), db += sum_rows(dy); checked by finite differences of
// L = sum(r .* y).
TEST(CpuGemm, LinearGradientsMatchFiniteDifferences) {
  Rng rng(15);
  const int64_t batch = 7, in = 17, out = 5;
  const Tensor x = random_tensor(rng, {batch, in});
  const Tensor w = random_tensor(rng, {out, in});
  const Tensor b = random_tensor(rng, {out});
  const Tensor r = random_tensor(rng, {batch, out}); // dL/dy
  const Doubles x0 = to_doubles(x), w0 = to_doubles(w), b0 = to_doubles(b), r0 = to_doubles(r);
  auto objective = [&](const Doubles& xs, const Doubles& ws, const Doubles& bs) {
    Doubles y = gemm_reference(xs, false, ws, true, batch, in, out);
    for (int64_t i = 0; i < batch * out; ++i) y[i] += bs[i % out];
    return dot(r0, y);
  };

  Tensor dx = poisoned({batch, in});
  cpu::gemm(r, false, w, false, dx, {});
  const Tensor dw_start = random_tensor(rng, {out, in}); // dW accumulates onto this
  Tensor dw = dw_start.clone();
  GemmEpilogue accumulate;
  accumulate.beta = 1.0f;
  cpu::gemm(r, true, x, false, dw, accumulate);
  const Tensor db_start = random_tensor(rng, {out});
  Tensor db = db_start.clone();
  cpu::bias_backward(r, db);

  const Doubles num_dx =
      numerical_gradient([&](const Doubles& v) { return objective(v, w0, b0); }, x0);
  Doubles num_dw = numerical_gradient([&](const Doubles& v) { return objective(x0, v, b0); }, w0);
  Doubles num_db = numerical_gradient([&](const Doubles& v) { return objective(x0, w0, v); }, b0);
  const Doubles dw_old = to_doubles(dw_start), db_old = to_doubles(db_start);
  for (size_t i = 0; i < num_dw.size(); ++i) num_dw[i] += dw_old[i];
  for (size_t i = 0; i < num_db.size(); ++i) num_db[i] += db_old[i];
  EXPECT_LT(relative_error_to(dx, num_dx), kGradientTolerance);
  EXPECT_LT(relative_error_to(dw, num_dw), kGradientTolerance);
  EXPECT_LT(relative_error_to(db, num_db), kGradientTolerance);
}

TEST(CpuBiasBackward, AccumulatesColumnSumsOfF16Gradients) {
  Rng rng(16);
  const Tensor dy = random_tensor(rng, {2, 9, 3, 17}, DType::f16); // [54, 17]
  const Tensor db_start = random_tensor(rng, {17});
  Tensor db = db_start.clone();
  cpu::bias_backward(dy, db);
  Doubles ref = to_doubles(db_start);
  const Doubles grad = to_doubles(dy);
  for (size_t i = 0; i < grad.size(); ++i) ref[i % 17] += grad[i];
  EXPECT_LT(relative_error_to(db, ref), kF32Tolerance);
}

TEST(CpuGemm, RejectsShapesThatDoNotChain) {
  Rng rng(17);
  const Tensor a = random_tensor(rng, {4, 6});
  const Tensor b = random_tensor(rng, {5, 3});
  Tensor c = poisoned({4, 3});
  expect_error([&] { cpu::gemm(a, false, b, false, c, {}); }, "gemm", "f32[5, 3]");
  const Tensor b_ok = random_tensor(rng, {6, 3});
  Tensor c_wrong = poisoned({3, 4});
  expect_error([&] { cpu::gemm(a, false, b_ok, false, c_wrong, {}); }, "gemm", "C f32[3, 4]");
  const Tensor bias = random_tensor(rng, {4});
  GemmEpilogue epilogue;
  epilogue.bias = &bias;
  expect_error([&] { cpu::gemm(a, false, b_ok, false, c, epilogue); }, "gemm", "bias");
  Tensor db = poisoned({4});
  expect_error([&] { cpu::bias_backward(c, db); }, "bias_backward", "db");
  const Tensor b_f16 = random_tensor(rng, {6, 3}, DType::f16);
  expect_error([&] { kernels::gemm(a, false, b_f16, false, c, {}); }, "gemm",
               "A and B must share a floating dtype, got f32 and f16");
}

// column_moments: the per-column mean and biased variance of C as stored (after the epilogue,
// rounded to C's dtype), a conv's output included.
TEST(CpuGemm, ColumnMomentsAreThoseOfTheStoredOutput) {
  Rng rng(18);
  for (DType dtype : {DType::f32, DType::f16}) {
    const Tensor a = random_tensor(rng, {37, 9}, dtype), b = random_tensor(rng, {9, 6}, dtype);
    const Tensor bias = random_tensor(rng, {6});
    Tensor c = poisoned({37, 6}, dtype), moments = poisoned({2, 6});
    GemmEpilogue epilogue{1.0f, 0.0f, &bias, true, &moments};
    cpu::gemm(a, false, b, false, c, epilogue);
    const Doubles stored = to_doubles(c);
    Doubles mean(6, 0.0), var(6, 0.0);
    for (size_t i = 0; i < stored.size(); ++i) mean[i % 6] += stored[i] / 37;
    for (size_t i = 0; i < stored.size(); ++i)
      var[i % 6] += (stored[i] - mean[i % 6]) * (stored[i] - mean[i % 6]) / 37;
    const std::vector<float> got = moments.to_vector();
    EXPECT_LT(relative_error_to(Tensor::from_vector({got.begin(), got.begin() + 6}, {6}), mean),
              kF32Tolerance);
    EXPECT_LT(relative_error_to(Tensor::from_vector({got.begin() + 6, got.end()}, {6}), var),
              kF32Tolerance);
  }
  const Tensor x = random_tensor(rng, {2, 5, 5, 3}), w = random_tensor(rng, {4, 3, 3, 3});
  Tensor y = poisoned({2, 5, 5, 4}), y_moments = poisoned({2, 4});
  GemmEpilogue epilogue;
  epilogue.column_moments = &y_moments;
  cpu::conv2d_forward(x, w, y, ConvParams{1, 1}, epilogue);
  const std::vector<float> got = y_moments.to_vector();
  double mean0 = 0.0;
  for (int64_t i = 0; i < y.numel(); i += 4) mean0 += y.data<float>()[i] / 50.0;
  EXPECT_NEAR(got[0], mean0, 1e-6);
}

TEST(CpuGemm, RejectsColumnMomentsOfTheWrongShapeOrOfNoRows) {
  Rng rng(19);
  const Tensor a = random_tensor(rng, {4, 6}), b = random_tensor(rng, {6, 3});
  Tensor c = poisoned({4, 3}), moments = poisoned({3});
  GemmEpilogue epilogue;
  epilogue.column_moments = &moments;
  expect_error([&] { cpu::gemm(a, false, b, false, c, epilogue); }, "gemm",
               "column_moments must be f32 [2, 3]", "got f32[3]");
  const Tensor no_rows = random_tensor(rng, {0, 6});
  Tensor c_empty = poisoned({0, 3}), moments_ok = poisoned({2, 3});
  epilogue.column_moments = &moments_ok;
  expect_error([&] { cpu::gemm(no_rows, false, b, false, c_empty, epilogue); }, "gemm",
               "column_moments needs at least one row");
}

TEST(Gemm, RefusesAnOutputThatSharesMemoryWithAnInput) {
  Rng rng(18);
  Tensor square = random_tensor(rng, {4, 4});
  const Tensor other = random_tensor(rng, {4, 4});
  expect_error([&] { kernels::gemm(square, false, other, false, square, {}); }, "gemm",
               "C f32[4, 4] on cpu shares memory with A or B");
  expect_error([&] { kernels::gemm(other, true, square, false, square, {}); }, "gemm",
               "shares memory");
  // B is C's memory seen as [2, 4] (transposed): the message names C as C.
  Tensor thin = random_tensor(rng, {4, 2});
  expect_error(
      [&] {
        kernels::gemm(other, false, thin.reshape({2, 4}), true, thin, {});
      },
      "gemm", "C f32[4, 2] on cpu shares memory");
  Tensor c = poisoned({4, 4}), c_ref = poisoned({4, 4});
  kernels::gemm(square, false, other, false, c, {}); // distinct buffers are fine
  cpu::gemm(square, false, other, false, c_ref, {});
  EXPECT_EQ(c.to_vector(), c_ref.to_vector());
}

} // namespace
} // namespace minamp::test
