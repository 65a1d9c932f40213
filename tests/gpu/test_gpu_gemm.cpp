// GPU GEMM (the tensor-core versions for f16 and bf16, the SIMT kernel for f32) against the CPU
// reference: every transpose combination, edge shapes (M, N, K not multiples of any tile), 16-bit
// and f32 outputs, the fused alpha/beta/bias/ReLU epilogue, both tile configurations and split
// K — with the version the library picks, and then each version of the ladder (cuda/gemm_v*.cu)
// forced, bf16 on the versions that take it (v2, v4, v5).
// Outputs start as NaN poison; each C must match as a whole and row by row and column by column.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/gemm_version.h"
#include "kernels/kernels.h"
#include "test_util.h"

namespace minamp {
namespace {

struct GemmCase {
  int64_t m, n, k;
  bool trans_a = false, trans_b = false;
  DType ab = DType::f32; // dtype of A and B
  DType c = DType::f32;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false, relu = false;
};

std::string describe_case(const GemmCase& g) {
  return cat("M=", g.m, " N=", g.n, " K=", g.k, " trans_a=", g.trans_a, " trans_b=", g.trans_b, " ",
             g.ab, "->", g.c, " alpha=", g.alpha, " beta=", g.beta, " bias=", g.bias,
             " relu=", g.relu);
}

double tolerance(const GemmCase& g) { return test::tolerance_for(g.ab, g.c); }

// Runs the case on the GPU and on the CPU reference from the same random inputs and expects
// the same C. With beta == 0, C starts as NaN on both sides.
void expect_matches_cpu(const GemmCase& g, uint64_t seed) {
  Rng rng(seed);
  const Tensor a = test::random_tensor(rng, g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k}, g.ab);
  const Tensor b = test::random_tensor(rng, g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, g.ab);
  const Tensor c_start =
      g.beta != 0.0f ? test::random_tensor(rng, {g.m, g.n}, g.c) : test::poisoned({g.m, g.n}, g.c);
  const Tensor bias = test::random_tensor(rng, {g.n});

  GemmEpilogue epilogue{g.alpha, g.beta, g.bias ? &bias : nullptr, g.relu};
  Tensor c_cpu = c_start.clone();
  kernels::gemm(a, g.trans_a, b, g.trans_b, c_cpu, epilogue);

  const Tensor bias_gpu = bias.to(Device::cuda);
  epilogue.bias = g.bias ? &bias_gpu : nullptr;
  Tensor c_gpu = c_start.to(Device::cuda);
  kernels::gemm(a.to(Device::cuda), g.trans_a, b.to(Device::cuda), g.trans_b, c_gpu, epilogue);
  test::expect_close(c_gpu, c_cpu, tolerance(g), describe_case(g));
}

struct DTypePair {
  DType ab, c;
};
const std::vector<DTypePair> kDTypePairs = {{DType::f16, DType::f16},
                                            {DType::f16, DType::f32},
                                            {DType::bf16, DType::bf16},
                                            {DType::bf16, DType::f32},
                                            {DType::f32, DType::f32}};

TEST(GpuGemm, SquareShapes) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 100;
  // fp32 sums of up to 1000 products: the order differs from Eigen's, but the rounding error
  // stays near sqrt(K) * 2^-24 ~ 2e-6, well inside tolerance_for(f32).
  for (int64_t size : {64, 128, 256, 1000})
    for (const DTypePair& d : kDTypePairs) {
      GemmCase g{size, size, size};
      g.ab = d.ab, g.c = d.c;
      expect_matches_cpu(g, ++seed);
    }
}

// Every M x N x K of the edge sizes, with all four transpose combinations, for one dtype pair.
void check_edge_shapes(const DTypePair& d, uint64_t seed) {
  for (int64_t m : {1, 17, 1000})
    for (int64_t k : {1, 7, 40, 100})
      for (int64_t n : {1, 17, 130})
        for (bool trans_a : {false, true})
          for (bool trans_b : {false, true}) {
            GemmCase g{m, n, k, trans_a, trans_b, d.ab, d.c};
            expect_matches_cpu(g, ++seed);
          }
}

TEST(GpuGemm, EdgeShapesAllTransposesF16ToF16) {
  MINAMP_REQUIRE_GPU();
  check_edge_shapes({DType::f16, DType::f16}, 1000);
}

TEST(GpuGemm, EdgeShapesAllTransposesF16ToF32) {
  MINAMP_REQUIRE_GPU();
  check_edge_shapes({DType::f16, DType::f32}, 2000);
}

TEST(GpuGemm, EdgeShapesAllTransposesBf16ToBf16) {
  MINAMP_REQUIRE_GPU();
  check_edge_shapes({DType::bf16, DType::bf16}, 1500);
}

TEST(GpuGemm, EdgeShapesAllTransposesBf16ToF32) {
  MINAMP_REQUIRE_GPU();
  check_edge_shapes({DType::bf16, DType::f32}, 2500);
}

// f32 A and B may write any floating C (the SIMT kernel rounds its epilogue into f16 or bf16);
// 16-bit A and B write f32 or their own dtype, never the other 16-bit format.
TEST(GpuGemm, OutputDtypes) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 2800;
  for (DType c : {DType::f16, DType::bf16})
    expect_matches_cpu(GemmCase{33, 70, 45, false, true, DType::f32, c, 0.5f, -0.75f, true, true},
                       ++seed);
  Rng rng(2900);
  const Tensor a = test::random_tensor(rng, {4, 8}, DType::bf16, Device::cuda);
  Tensor c = Tensor::empty({4, 4}, DType::f16, Device::cuda);
  test::expect_error([&] { kernels::gemm(a, false, a, true, c, GemmEpilogue{}); }, "gemm",
                     "C must be f32 or the dtype of A and B (bf16), got f16[4, 4] on cuda");
}

TEST(GpuGemm, EdgeShapesAllTransposesF32ToF32) {
  MINAMP_REQUIRE_GPU();
  check_edge_shapes({DType::f32, DType::f32}, 3000);
}

TEST(GpuGemm, EpilogueAlphaBetaBiasRelu) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 4000;
  for (const DTypePair& d : kDTypePairs)
    for (bool trans : {false, true})
      for (float alpha : {1.0f, 0.5f})
        for (float beta : {0.0f, 1.0f, -0.75f})
          for (bool bias : {false, true})
            for (bool relu : {false, true}) {
              GemmCase g{33, 70, 45, trans, !trans, d.ab, d.c, alpha, beta, bias, relu};
              expect_matches_cpu(g, ++seed);
            }
}

// A NaN in A (row 3) and one in the bias (column 5) pass the fused ReLU, as torch.relu passes NaN:
// C's row 3 and column 5 are NaN on both devices, and every other element matches.
TEST(GpuGemm, FusedReluPassesNaN) {
  MINAMP_REQUIRE_GPU();
  const int64_t m = 33, n = 70, k = 45, nan_row = 3, nan_column = 5;
  Rng rng(4500);
  for (const DTypePair& d : kDTypePairs) {
    std::vector<float> a_values = test::random_tensor(rng, {m, k}).to_vector();
    std::vector<float> bias_values = test::random_tensor(rng, {n}).to_vector();
    a_values[nan_row * k + 7] = bias_values[nan_column] = std::nanf("");
    const Tensor a = Tensor::from_vector(a_values, {m, k}, d.ab);
    const Tensor b = test::random_tensor(rng, {k, n}, d.ab);
    const Tensor bias = Tensor::from_vector(bias_values, {n});
    Tensor c_cpu = test::poisoned({m, n}, d.c);
    kernels::gemm(a, false, b, false, c_cpu, GemmEpilogue{1.0f, 0.0f, &bias, true});
    const Tensor bias_gpu = bias.to(Device::cuda);
    Tensor c_gpu = test::poisoned({m, n}, d.c, Device::cuda);
    kernels::gemm(a.to(Device::cuda), false, b.to(Device::cuda), false, c_gpu,
                  GemmEpilogue{1.0f, 0.0f, &bias_gpu, true});

    std::vector<float> on_gpu = c_gpu.to_vector(), on_cpu = c_cpu.to_vector();
    const std::string what = cat("relu(A B + bias) with NaN, ", d.ab, "->", d.c);
    int64_t wrong = 0;
    std::string first_wrong;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const bool nan_expected = i == nan_row || j == nan_column;
        float& g = on_gpu[i * n + j];
        float& c = on_cpu[i * n + j];
        if (std::isnan(g) != nan_expected || std::isnan(c) != nan_expected) {
          if (wrong++ == 0) first_wrong = cat("C[", i, ", ", j, "] = ", g, " (CPU ", c, ")");
        }
        if (nan_expected) g = c = 0.0f; // the rest is compared below
      }
    EXPECT_EQ(wrong, 0) << what << ": NaN where none belongs or none where one does, first "
                        << first_wrong;
    test::expect_close(Tensor::from_vector(on_gpu, {m, n}), Tensor::from_vector(on_cpu, {m, n}),
                       test::tolerance_for(d.ab, d.c), what);
  }
}

// Shapes with enough 128x128 tiles to select the large configuration of the SIMT kernel and of
// the 128x128 tensor-core versions (>= one block per SM on an H100; the library's v5 takes its
// 64x64 tiles here, its 128x256 ones in GpuGemmVersions.LargeTilesAndSplitK), with ragged edges:
// with K = 72 every operand but a transposed A (rows of M = 4099) takes the 16-byte copy path,
// with K = 37 only an untransposed B (rows of N = 520) does.
TEST(GpuGemm, LargeTilesWithEdges) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 5000;
  for (const DTypePair& d : kDTypePairs)
    for (int64_t k : {72, 37})
      for (bool trans_a : {false, true})
        for (bool trans_b : {false, true}) {
          GemmCase g{4099, 520, k, trans_a, trans_b, d.ab, d.c, 1.0f, 0.5f, true, true};
          expect_matches_cpu(g, ++seed);
        }
}

// A tall, thin C, as sine's 1x1 convs with --hidden 32: many rows, few channels (64x64 tiles:
// 128-wide ones would be 3/4 padding).
TEST(GpuGemm, TallThin) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 6000;
  for (const DTypePair& d : kDTypePairs) {
    GemmCase g{65537, 32, 32, false, true, d.ab, d.c};
    g.bias = g.relu = true;
    expect_matches_cpu(g, ++seed);
  }
}

// Few tiles over C and a long K: the launcher splits K into slices of whole tiles whose fp32
// partial sums a second kernel adds before the epilogue (cuda/gemm_plan.h). M = 40, N = 72 is
// 2 tiles of 64 x 64, so on an H100 K = 8013 (the last tile partial) is cut into 28 slices of 9
// tiles for the WMMA kernel (BK 32) and 56 of 9 for the SIMT one (BK 16). Every transpose, both
// output dtypes, and beta != 0 (C is read once, by the sum); then beta == 0, where C (NaN
// poison) is not read at all.
TEST(GpuGemm, SplitKLongK) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 7000;
  for (const DTypePair& d : kDTypePairs)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true}) {
        GemmCase g{40, 72, 8013, trans_a, trans_b, d.ab, d.c, 0.5f, -1.0f, true, true};
        expect_matches_cpu(g, ++seed);
      }
  for (const DTypePair& d : kDTypePairs)
    expect_matches_cpu(GemmCase{40, 72, 8013, false, true, d.ab, d.c, 1.0f, 0.0f, false, false},
                       ++seed);
}

// GEMMs too thin for tensor-core tiles run on CUDA cores (cuda/gemm_thin.cu): a K of at most 8
// (one thread per 4 columns; packed stores where N is a multiple of 4), and an N of at most 4
// over >= 4096 rows (a warp per row with 4-element loads where K allows; a thread per row when A
// is transposed). Every transpose, both output dtypes, the whole epilogue.
TEST(GpuGemm, ThinShapesOnCudaCores) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 7500;
  for (const DTypePair& d : kDTypePairs)
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true}) {
        for (int64_t k : {1, 2, 8})
          for (int64_t n : {64, 130})
            expect_matches_cpu(GemmCase{100, n, k, trans_a, trans_b, d.ab, d.c, 0.5f,
                                        k == 2 ? -1.0f : 0.0f, true, k != 1},
                               ++seed);
        expect_matches_cpu(
            GemmCase{4100, 3, 40, trans_a, trans_b, d.ab, d.c, 1.0f, 0.5f, true, true}, ++seed);
      }
  // N = 1 and 4 with K = 37 (4-element loads impossible) and 40, f16 or bf16 in and out; and
  // K = 256 and 260, either side of the most a warp keeps in registers with 4-element loads
  // (B's values read once per warp, 4 rows loaded at a time: 4099 rows end in a partial group;
  // or B read per row).
  for (DType dtype : {DType::f16, DType::bf16})
    for (bool trans_a : {false, true}) {
      for (int64_t n : {1, 4})
        expect_matches_cpu(GemmCase{4100, n, n == 1 ? 37 : 40, trans_a, true, dtype, dtype, 1.0f,
                                    0.0f, true, false},
                           ++seed);
      for (int64_t k : {256, 260})
        expect_matches_cpu(
            GemmCase{4099, 2, k, trans_a, false, dtype, dtype, 1.0f, 0.0f, true, true}, ++seed);
    }
}

// GEMMs whose C is at most 4 rows or columns over K >= 4096, A transposed and B not, run on CUDA
// cores as a column reduction (cuda/gemm_thin_c.cu; the weight gradients of a conv with few output
// or input channels): one row of C (packed loads of B's 256 columns; 37 columns unpacked) or 2-4
// columns (A's 64 or 130 columns), both output dtypes, the whole epilogue with beta accumulating;
// a wide side of 1100 columns, more than one block's 256 packs; and K = 4095, one short of it, on
// the tensor cores.
TEST(GpuGemm, ThinCOnCudaCores) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 7700;
  for (const DTypePair& d : kDTypePairs) {
    for (int64_t n : {256, 37})
      expect_matches_cpu(GemmCase{1, n, 4100, true, false, d.ab, d.c, 0.5f, 1.0f, true, false},
                         ++seed);
    for (int64_t m : {64, 130})
      for (int64_t n : {2, 3, 4})
        expect_matches_cpu(
            GemmCase{m, n, 5003, true, false, d.ab, d.c, 1.0f, n == 3 ? 0.0f : -1.0f, true, true},
            ++seed);
  }
  for (DType dtype : {DType::f16, DType::bf16}) {
    expect_matches_cpu(
        GemmCase{1100, 1, 4096, true, false, dtype, DType::f32, 1.0f, 1.0f, false, false}, ++seed);
    expect_matches_cpu(
        GemmCase{3, 1100, 4096, true, false, dtype, DType::f32, 1.0f, 1.0f, false, false}, ++seed);
    expect_matches_cpu(
        GemmCase{2, 256, 4095, true, false, dtype, DType::f32, 1.0f, 1.0f, false, false}, ++seed);
  }
}

// Enough rows that the thin-K kernels' threads take several grid-stride steps (the grid stops at
// 32 blocks of 256 threads per SM): a thread's columns move from step to step when N / 4 does not
// divide 256 (N = 100, the walk wrapping past a row's end: its 25 groups do not divide the
// stride of 132 SMs, as N = 130's 33 would), and stay when it does (N = 4: a block covers 256
// rows, and its B values and bias are read once). 1.3 M rows of N = 4 take two steps on a device
// of up to 158 SMs (132 on an H100, H200 and the emulator).
TEST(GpuGemm, ThinKOverSeveralGridSteps) {
  MINAMP_REQUIRE_GPU();
  expect_matches_cpu(
      GemmCase{50000, 100, 2, false, true, DType::f16, DType::f16, 1.0f, 0.0f, true, false}, 7600);
  expect_matches_cpu(
      GemmCase{1'300'000, 4, 1, false, false, DType::f16, DType::f16, 1.0f, 0.0f, true, true},
      7601);
}

// ---- Each version of the ladder, forced (gemm_version.h), on the cases above that it takes.

const GemmVersion kVersions[] = {GemmVersion::v1_naive, GemmVersion::v2_wmma,
                                 GemmVersion::v3_interior, GemmVersion::v4_mma,
                                 GemmVersion::v5_multistage};

// The versions that take bf16 operands besides f16 (gemm_plan.h's gemm_refusal).
const GemmVersion kBf16Versions[] = {GemmVersion::v2_wmma, GemmVersion::v4_mma,
                                     GemmVersion::v5_multistage};

// Edge shapes, every transpose, both output dtypes, and the fused epilogue, for operands of `ab`.
void check_version_edges_and_epilogues(GemmVersion version, DType ab) {
  ScopedGemmVersion scope(version);
  SCOPED_TRACE(cat(gemm_version_name(version), " ", ab));
  uint64_t seed = 8000;
  for (DType c : {ab, DType::f32})
    for (int64_t m : {1, 17, 100})
      for (int64_t k : {7, 40})
        for (int64_t n : {17, 130})
          for (bool trans_a : {false, true})
            for (bool trans_b : {false, true})
              expect_matches_cpu(GemmCase{m, n, k, trans_a, trans_b, ab, c}, ++seed);
  for (DType c : {ab, DType::f32})
    for (float beta : {0.0f, -0.75f})
      expect_matches_cpu(GemmCase{33, 70, 45, false, true, ab, c, 0.5f, beta, true, true}, ++seed);
  // Each term alone and none, where C's rows take the packed store (N = 72, whole 16-byte packs),
  // which skips the terms when none applies.
  for (DType c : {ab, DType::f32}) {
    const GemmCase none{33, 72, 45, false, true, ab, c};
    GemmCase scaled = none, accumulated = none, biased = none, rectified = none;
    scaled.alpha = 0.5f;
    accumulated.beta = -0.75f;
    biased.bias = true;
    rectified.relu = true;
    for (const GemmCase& g : {none, scaled, accumulated, biased, rectified})
      expect_matches_cpu(g, ++seed);
  }
}

TEST(GpuGemmVersions, EdgeShapesAndEpilogues) {
  MINAMP_REQUIRE_GPU();
  for (GemmVersion version : kVersions) check_version_edges_and_epilogues(version, DType::f16);
}

TEST(GpuGemmVersions, Bf16EdgeShapesAndEpilogues) {
  MINAMP_REQUIRE_GPU();
  for (GemmVersion version : kBf16Versions) check_version_edges_and_epilogues(version, DType::bf16);
}

// Square shapes whose sizes are whole tiles: v1 loads every fragment straight from global memory,
// v3 and v4 every tile through the interior loader.
TEST(GpuGemmVersions, WholeTiles) {
  MINAMP_REQUIRE_GPU();
  for (GemmVersion version : kVersions) {
    ScopedGemmVersion scope(version);
    SCOPED_TRACE(gemm_version_name(version));
    uint64_t seed = 8500;
    for (int64_t size : {64, 256})
      for (bool trans : {false, true})
        expect_matches_cpu(GemmCase{size, size, size, trans, !trans, DType::f16, DType::f16},
                           ++seed);
  }
  for (GemmVersion version : kBf16Versions) {
    ScopedGemmVersion scope(version);
    SCOPED_TRACE(cat(gemm_version_name(version), " bf16"));
    expect_matches_cpu(GemmCase{256, 256, 256, false, true, DType::bf16, DType::bf16}, 8600);
  }
}

// v5's large tile is 128x256x64: 33 x 5 of them over C, ragged on both edges; K = 72 is one whole K
// tile and a short one, K = 37 (bf16) a single short one.
void check_v5_large_tiles(uint64_t seed) {
  for (bool trans : {false, true})
    expect_matches_cpu(
        GemmCase{4099, 1040, 72, trans, !trans, DType::f16, DType::f16, 1.0f, 0.5f, true, true},
        ++seed);
  expect_matches_cpu(
      GemmCase{4099, 1040, 37, false, true, DType::bf16, DType::f32, 1.0f, 0.0f, true, false},
      ++seed);
}

// The large tiles (>= one block per SM) with ragged edges, and split K, for the versions that
// have them: interior blocks on the fast loader, edge blocks and the last K tile on the plain one.
TEST(GpuGemmVersions, LargeTilesAndSplitK) {
  MINAMP_REQUIRE_GPU();
  for (GemmVersion version : {GemmVersion::v2_wmma, GemmVersion::v3_interior, GemmVersion::v4_mma,
                              GemmVersion::v5_multistage}) {
    ScopedGemmVersion scope(version);
    SCOPED_TRACE(gemm_version_name(version));
    uint64_t seed = 9000;
    for (bool trans : {false, true})
      expect_matches_cpu(
          GemmCase{4099, 520, 72, trans, trans, DType::f16, DType::f16, 1.0f, 0.5f, true, true},
          ++seed);
    for (bool trans : {false, true})
      expect_matches_cpu(
          GemmCase{40, 72, 8013, trans, !trans, DType::f16, DType::f32, 0.5f, -1.0f, true, true},
          ++seed);
  }
  for (GemmVersion version : kBf16Versions) {
    ScopedGemmVersion scope(version);
    SCOPED_TRACE(cat(gemm_version_name(version), " bf16"));
    uint64_t seed = 9050;
    expect_matches_cpu(
        GemmCase{4099, 520, 72, false, true, DType::bf16, DType::bf16, 1.0f, 0.5f, true, true},
        ++seed);
    expect_matches_cpu(
        GemmCase{40, 72, 8013, true, false, DType::bf16, DType::bf16, 0.5f, -1.0f, true, true},
        ++seed);
  }
  ScopedGemmVersion v5(GemmVersion::v5_multistage);
  check_v5_large_tiles(9100);
}

// v5 splits K on its large tiles where C has few of them and K is long (cuda/gemm_plan.h): sine's
// hidden weight gradients, 2 tiles of 128x256 in 66 slices on 132 SMs. Planned for 9 SMs, one
// ragged tile [100, 200] over K = 18469 takes that plan at a size the emulator runs: 9 slices of
// 33 K tiles of 64, the last 25 and a partial one. A transposed and B not, as a weight gradient;
// f32 C with beta and bias through the slices' sum, then f16 C from NaN poison.
TEST(GpuGemmVersions, MultistageSplitsKOnLargeTiles) {
  MINAMP_REQUIRE_GPU();
  ScopedGemmVersion v5(GemmVersion::v5_multistage);
  ScopedGemmPlanningSms sms(9);
  expect_matches_cpu(
      GemmCase{100, 200, 18469, true, false, DType::f16, DType::f32, 0.5f, -1.0f, true, false},
      9200);
  expect_matches_cpu(
      GemmCase{100, 200, 18469, true, false, DType::f16, DType::f16, 1.0f, 0.0f, false, true},
      9201);
}

// v5's large tiles on a persistent grid (gemm_persistent_tiles, off by default). Planned for 3 SMs,
// 3 blocks walk C's 5 x 2 large tiles, ragged on both edges, so that a block goes from interior
// tiles (the interior loaders) to edge ones (the plain loaders), putting each next tile's first K
// tile in flight with either; then a ragged K (every tile on the plain loaders); B transposed and
// not, the epilogue's beta and ReLU, C from NaN poison where beta is 0. Then the GPU's own SMs
// over 33 x 5 tiles (132 on the emulator: some blocks take two), and bf16 into f32.
TEST(GpuGemmVersions, PersistentLargeTiles) {
  MINAMP_REQUIRE_GPU();
  ScopedGemmVersion v5(GemmVersion::v5_multistage);
  ScopedGemmPersistentTiles persistent(true);
  uint64_t seed = 9300;
  {
    ScopedGemmPlanningSms sms(3);
    for (int64_t k : {128, 37})
      for (bool trans_b : {true, false})
        for (float beta : {0.0f, 0.5f})
          expect_matches_cpu(GemmCase{600, 500, k, false, trans_b, DType::f16, DType::f16, 1.0f,
                                      beta, true, beta != 0.0f},
                             ++seed);
  }
  check_v5_large_tiles(seed);
}

// v1 and v3 take f16 only: bf16 operands are refused, naming the version and those that take them.
TEST(GpuGemmVersions, F16OnlyVersionsRefuseBf16) {
  MINAMP_REQUIRE_GPU();
  Rng rng(9400);
  const Tensor a = test::random_tensor(rng, {16, 16}, DType::bf16, Device::cuda);
  Tensor c = Tensor::empty({16, 16}, DType::bf16, Device::cuda);
  for (GemmVersion version : {GemmVersion::v1_naive, GemmVersion::v3_interior}) {
    ScopedGemmVersion scope(version);
    test::expect_error([&] { kernels::gemm(a, false, a, false, c, GemmEpilogue{}); },
                       cat("gemm ", gemm_version_name(version)),
                       "takes f16 operands only, not bf16 (v2, v4, v5 and auto take bf16)");
  }
}

// v1 and v3 take plain matrices only: a conv's gathered operand is refused, naming the version.
TEST(GpuGemmVersions, PlainMatrixVersionsRefuseConvolutions) {
  MINAMP_REQUIRE_GPU();
  Rng rng(9500);
  const Tensor x = test::random_tensor(rng, {1, 6, 6, 8}, DType::f16).to(Device::cuda);
  const Tensor w = test::random_tensor(rng, {8, 3, 3, 8}, DType::f16).to(Device::cuda);
  Tensor y = Tensor::empty({1, 6, 6, 8}, DType::f16, Device::cuda);
  for (GemmVersion version : {GemmVersion::v1_naive, GemmVersion::v3_interior}) {
    ScopedGemmVersion scope(version);
    test::expect_error(
        [&] {
          kernels::conv2d_forward(x, w, y, ConvParams{1, 1}, GemmEpilogue{});
        },
        cat("gemm ", gemm_version_name(version)), "plain (or transposed) matrices only");
  }
}

} // namespace
} // namespace minamp
