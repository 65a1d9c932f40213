// Batch norm's statistics fused into the GEMM that writes its input: the GEMM's per-column
// moments (GemmEpilogue::column_moments: the epilogue hook of v3-v5, the unfused column pass
// elsewhere) against the moments of C as stored and against the CPU composition (gemm, then
// column mean and variance), on every version, edge tiles, split K, thin GEMMs (the thin-K
// kernel's own moments) and convolutions;
// NaN, determinism and values far from zero; then Sequential Conv2d/Linear -> BatchNorm -> ReLU
// fused against nn::set_fusion(false), forward and backward, in training and eval mode, and a
// chain of 1x1 convs, each applying the batch norm before it as it loads its input, against that
// and against the CPU, with the biases before those batch norms taking their gradients from the
// batch norm's backward, and the batch norm's input gradient written over its output's.
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "amp/autocast.h"
#include "kernels/gemm_version.h"
#include "kernels/kernels.h"
#include "kernels/profile.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "test_util.h"

namespace minamp {
namespace {

// Per-column mean and biased variance, in double, of c [rows, N] as stored.
struct ColumnMoments {
  std::vector<double> mean, var;
};
ColumnMoments moments_of(const Tensor& c) {
  const int64_t rows = c.shape().rows(), cols = c.shape().last();
  const std::vector<float> v = c.to_vector();
  ColumnMoments out{std::vector<double>(size_t(cols), 0.0), std::vector<double>(size_t(cols), 0.0)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out.mean[size_t(j)] += v[size_t(r * cols + j)];
  for (double& m : out.mean) m /= double(rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const double d = v[size_t(r * cols + j)] - out.mean[size_t(j)];
      out.var[size_t(j)] += d * d;
    }
  for (double& s : out.var) s /= double(rows);
  return out;
}

// The worst error of moments [2, N] against `ref` over all columns: the mean's in units of the
// column's standard deviation (or of |mean| when that is larger), the variance's relative to
// itself; infinity when a value is not finite (a NaN poison left in place never passes).
double moments_error(const Tensor& moments, const ColumnMoments& ref) {
  const std::vector<float> got = moments.to_vector();
  const size_t n = ref.mean.size();
  EXPECT_EQ(got.size(), 2 * n);
  double worst = 0.0;
  for (size_t j = 0; j < n && 2 * n == got.size(); ++j) {
    if (!std::isfinite(got[j]) || !std::isfinite(got[n + j])) return INFINITY;
    const double scale = std::max({std::sqrt(ref.var[j]), std::abs(ref.mean[j]), 1e-30});
    worst = std::max(worst, std::abs(got[j] - ref.mean[j]) / scale);
    worst = std::max(worst, std::abs(got[n + j] - ref.var[j]) / std::max(ref.var[j], 1e-30));
  }
  return worst;
}

struct MomentsCase {
  int64_t m, n, k;
  DType ab = DType::f16, c = DType::f16;
  bool trans_a = false, trans_b = true; // a Linear / 1x1 conv: x [M, K] @ w[N, K]^T
  bool bias = true, relu = true;
};

std::string describe_case(const MomentsCase& g) {
  return cat(gemm_version_name(gemm_version()), " M=", g.m, " N=", g.n, " K=", g.k, " ", g.ab, "->",
             g.c, " trans_a=", g.trans_a, " trans_b=", g.trans_b, " bias=", g.bias,
             " relu=", g.relu);
}

// The moments' own tolerance against C as stored: fp32 sums of at most a tile's 128 rows per
// block, then a merge (errors near 1e-6 on the emulator).
constexpr double kMomentsOfStoredTolerance = 2e-5;

// Runs the GEMM with column moments on the GPU (C and the moments NaN-poisoned) and on the CPU.
// Expects C to match the CPU's, the moments to be exactly those of the GPU's C as stored (up to
// fp32 summation), and to match the CPU composition within C's dtype tolerance (twice it for the
// variance, which is quadratic in C). Returns the GPU's moments.
Tensor expect_moments_match(const MomentsCase& g, uint64_t seed) {
  Rng rng(seed);
  const Tensor a = test::random_tensor(rng, g.trans_a ? Shape{g.k, g.m} : Shape{g.m, g.k}, g.ab);
  const Tensor b = test::random_tensor(rng, g.trans_b ? Shape{g.n, g.k} : Shape{g.k, g.n}, g.ab);
  const Tensor bias = test::random_tensor(rng, {g.n});
  const std::string what = describe_case(g);

  Tensor c_cpu = test::poisoned({g.m, g.n}, g.c), moments_cpu = test::poisoned({2, g.n});
  GemmEpilogue epilogue{1.0f, 0.0f, g.bias ? &bias : nullptr, g.relu, &moments_cpu};
  kernels::gemm(a, g.trans_a, b, g.trans_b, c_cpu, epilogue);

  const Tensor bias_gpu = bias.to(Device::cuda);
  Tensor c_gpu = test::poisoned({g.m, g.n}, g.c, Device::cuda);
  Tensor moments_gpu = test::poisoned({2, g.n}, DType::f32, Device::cuda);
  epilogue.bias = g.bias ? &bias_gpu : nullptr;
  epilogue.column_moments = &moments_gpu;
  kernels::gemm(a.to(Device::cuda), g.trans_a, b.to(Device::cuda), g.trans_b, c_gpu, epilogue);

  const double tolerance = test::tolerance_for(g.ab, g.c);
  test::expect_close(c_gpu, c_cpu, tolerance, what + ": C");
  const Tensor c_stored = c_gpu.to(Device::cpu);
  test::expect_within(moments_error(moments_gpu, moments_of(c_stored)), kMomentsOfStoredTolerance,
                      what + ": moments of C as stored");
  test::expect_within(moments_error(moments_gpu, moments_of(c_cpu)), 2 * tolerance,
                      what + ": moments against the CPU composition");
  EXPECT_LT(moments_error(moments_cpu, moments_of(c_cpu)), 1e-6) << what << ": CPU moments";
  return moments_gpu;
}

// Shapes of a Linear or 1x1 conv followed by batch norm: sine's 262144 x 256 x 256 scaled down
// (whole tiles), then edges — M and N not multiples of any tile, N not a multiple of the 16-byte
// pack (the element-by-element epilogue), one row, one column.
void check_shapes(DType ab, DType c, uint64_t seed) {
  for (const MomentsCase& shape :
       {MomentsCase{2048, 256, 64}, MomentsCase{1000, 130, 40}, MomentsCase{300, 72, 24},
        MomentsCase{129, 17, 33}, MomentsCase{1, 40, 16}, MomentsCase{77, 1, 48}}) {
    MomentsCase g = shape;
    g.ab = ab, g.c = c;
    expect_moments_match(g, ++seed);
  }
}

const GemmVersion kVersions[] = {GemmVersion::v1_naive, GemmVersion::v2_wmma,
                                 GemmVersion::v3_interior, GemmVersion::v4_mma,
                                 GemmVersion::v5_multistage};
// The versions whose packed epilogue has the statistics hook.
const GemmVersion kHookVersions[] = {GemmVersion::v3_interior, GemmVersion::v4_mma,
                                     GemmVersion::v5_multistage};
const GemmVersion kBf16Versions[] = {GemmVersion::v2_wmma, GemmVersion::v4_mma,
                                     GemmVersion::v5_multistage};

TEST(GpuColumnMoments, EveryVersionF16) {
  MINAMP_REQUIRE_GPU();
  for (GemmVersion version : kVersions) {
    ScopedGemmVersion scope(version);
    check_shapes(DType::f16, DType::f16, 100);
    check_shapes(DType::f16, DType::f32, 200);
  }
}

TEST(GpuColumnMoments, Bf16Versions) {
  MINAMP_REQUIRE_GPU();
  for (GemmVersion version : kBf16Versions) {
    ScopedGemmVersion scope(version);
    check_shapes(DType::bf16, DType::bf16, 300);
  }
}

// The version the library picks, for f16, bf16 and f32 (the SIMT kernel), every transpose, with
// and without bias and ReLU; and the thin GEMMs on CUDA cores.
TEST(GpuColumnMoments, AutomaticVersionAndThinGemms) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 400;
  for (DType dtype : {DType::f16, DType::bf16, DType::f32})
    for (bool trans_a : {false, true})
      for (bool trans_b : {false, true})
        expect_moments_match(
            MomentsCase{700, 96, 40, dtype, dtype, trans_a, trans_b, trans_a, trans_b}, ++seed);
  for (DType dtype : {DType::f16, DType::f32}) {
    expect_moments_match(MomentsCase{4100, 64, 2, dtype, dtype}, ++seed); // K = 2: thin
    expect_moments_match(MomentsCase{4100, 1, 40, dtype, dtype}, ++seed); // N = 1: thin
  }
}

// Few output tiles over a long K: split K, whose moments come from the unfused column pass.
TEST(GpuColumnMoments, SplitK) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 500;
  for (GemmVersion version : {GemmVersion::automatic, GemmVersion::v5_multistage}) {
    ScopedGemmVersion scope(version);
    expect_moments_match(MomentsCase{40, 72, 8013, DType::f16, DType::f16}, ++seed);
  }
}

// More row tiles than the merge's lanes take in one batch each (128 runs of tiles a column, loaded
// 8 at a time): 70001 rows on 64-row tiles are 1094 tiles, runs of 9 (a whole batch and one of 1);
// 9001 rows leave most runs empty.
TEST(GpuColumnMoments, ManyRowTiles) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 550;
  for (GemmVersion version : {GemmVersion::automatic, GemmVersion::v5_multistage})
    for (int64_t m : {70001, 9001}) {
      ScopedGemmVersion scope(version);
      expect_moments_match(MomentsCase{m, 24, 16, DType::f16, DType::f16}, ++seed);
    }
}

// v5's large tiles on a persistent grid (gemm_persistent_tiles), planned for 3 SMs: 3 blocks walk
// 16 row tiles (whole, then 6 of a ragged M over a ragged K), each tile's moments put at its row
// tile's place, not its block's.
TEST(GpuColumnMoments, PersistentLargeTiles) {
  MINAMP_REQUIRE_GPU();
  ScopedGemmVersion v5(GemmVersion::v5_multistage);
  ScopedGemmPlanningSms sms(3);
  ScopedGemmPersistentTiles persistent(true);
  uint64_t seed = 560;
  for (const MomentsCase& g : {MomentsCase{2048, 256, 64}, MomentsCase{700, 256, 72}})
    expect_moments_match(g, ++seed);
}

// A 3x3 convolution's implicit GEMM (gathered im2col operand) writes its moments too.
TEST(GpuColumnMoments, Convolution) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 600;
  for (GemmVersion version : {GemmVersion::automatic, GemmVersion::v2_wmma, GemmVersion::v4_mma,
                              GemmVersion::v5_multistage})
    for (DType dtype : {DType::f16, DType::bf16}) {
      ScopedGemmVersion scope(version);
      Rng rng(++seed);
      const Tensor x = test::random_tensor(rng, {3, 13, 11, 8}, dtype);
      const Tensor w = test::random_tensor(rng, {24, 3, 3, 8}, dtype, Device::cpu, -0.3f, 0.3f);
      const ConvParams conv{1, 1};
      Tensor y = test::poisoned({3, 13, 11, 24}, dtype, Device::cuda);
      Tensor moments = test::poisoned({2, 24}, DType::f32, Device::cuda);
      GemmEpilogue epilogue;
      epilogue.column_moments = &moments;
      kernels::conv2d_forward(x.to(Device::cuda), w.to(Device::cuda), y, conv, epilogue);
      Tensor y_cpu = test::poisoned({3, 13, 11, 24}, dtype);
      kernels::conv2d_forward(x, w, y_cpu, conv, {});
      const std::string what = cat(gemm_version_name(version), " ", dtype, " conv 3x3");
      test::expect_close(y, y_cpu, test::tolerance_for(dtype), what);
      test::expect_within(moments_error(moments, moments_of(y.to(Device::cpu))),
                          kMomentsOfStoredTolerance, what + ": moments of y as stored");
    }
}

// A NaN in one column of B makes that column of C NaN: its moments must be NaN, and only its.
TEST(GpuColumnMoments, NaNNeverPasses) {
  MINAMP_REQUIRE_GPU();
  const int64_t m = 300, n = 40, k = 24, bad = 13;
  Rng rng(700);
  const Tensor a = test::random_tensor(rng, {m, k}, DType::f16, Device::cuda);
  std::vector<float> b_values = test::random_tensor(rng, {k, n}).to_vector();
  b_values[size_t(5 * n + bad)] = std::nanf("");
  const Tensor b = Tensor::from_vector(b_values, {k, n}, DType::f16, Device::cuda);
  for (GemmVersion version : kVersions)
    for (bool relu : {false, true}) {
      ScopedGemmVersion scope(version);
      SCOPED_TRACE(cat(gemm_version_name(version), " relu=", relu));
      Tensor c = Tensor::empty({m, n}, DType::f16, Device::cuda);
      Tensor moments = Tensor::zeros({2, n}, DType::f32, Device::cuda);
      GemmEpilogue epilogue;
      epilogue.relu = relu;
      epilogue.column_moments = &moments;
      kernels::gemm(a, false, b, false, c, epilogue);
      const std::vector<float> got = moments.to_vector();
      for (int64_t j = 0; j < n; ++j) {
        EXPECT_EQ(std::isnan(got[size_t(j)]), j == bad) << "mean of column " << j;
        EXPECT_EQ(std::isnan(got[size_t(n + j)]), j == bad) << "variance of column " << j;
      }
    }
}

// The merge runs in a fixed order: two runs give the same bits, on every version with the hook.
TEST(GpuColumnMoments, BitIdenticalAcrossRuns) {
  MINAMP_REQUIRE_GPU();
  for (GemmVersion version : kHookVersions) {
    ScopedGemmVersion scope(version);
    const MomentsCase g{3000, 200, 64};
    const std::vector<float> first = expect_moments_match(g, 800).to_vector();
    const std::vector<float> second = expect_moments_match(g, 800).to_vector();
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0)
        << gemm_version_name(version);
  }
}

// Values whose mean is ~3000 standard deviations from zero (a bias of 1e4 on outputs of std ~3):
// per-block centred sums and Chan's merge keep the variance to fp32 precision, where fp32 sums of
// x and x^2 (E[x^2] - E[x]^2) lose every bit of it. 40000 rows are runs of several row tiles a
// column in the merge, combined by their means' deviations from each other.
TEST(GpuColumnMoments, MeanFarFromZeroKeepsTheVariance) {
  MINAMP_REQUIRE_GPU();
  const int64_t m = 40000, n = 64, k = 64;
  Rng rng(900);
  const Tensor a = test::random_tensor(rng, {m, k}, DType::f16, Device::cuda);
  const Tensor b = test::random_tensor(rng, {n, k}, DType::f16, Device::cuda);
  const Tensor bias = Tensor::full({n}, 1e4f, DType::f32, Device::cuda);
  for (GemmVersion version : kHookVersions) {
    ScopedGemmVersion scope(version);
    Tensor c = test::poisoned({m, n}, DType::f32, Device::cuda);
    Tensor moments = test::poisoned({2, n}, DType::f32, Device::cuda);
    GemmEpilogue epilogue;
    epilogue.bias = &bias;
    epilogue.column_moments = &moments;
    kernels::gemm(a, false, b, true, c, epilogue);
    const Tensor c_host = c.to(Device::cpu);
    const ColumnMoments ref = moments_of(c_host);
    test::expect_within(moments_error(moments, ref), 1e-4,
                        cat(gemm_version_name(version), ": moments at |mean| ~ 3000 std"));

    // The data set is one that needs it: fp32 sums of x and x^2 get the variance badly wrong.
    const std::vector<float> v = c_host.to_vector();
    double worst_naive = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0.0f, sum_sq = 0.0f;
      for (int64_t r = 0; r < m; ++r) {
        sum += v[size_t(r * n + j)];
        sum_sq += v[size_t(r * n + j)] * v[size_t(r * n + j)];
      }
      const double naive_var = double(sum_sq / m - (sum / m) * (sum / m));
      worst_naive =
          std::max(worst_naive, std::abs(naive_var - ref.var[size_t(j)]) / ref.var[size_t(j)]);
    }
    EXPECT_GT(worst_naive, 0.5) << "the data set does not discriminate";
  }
}

// The thin-K kernel (K <= 8 on CUDA cores) adds up the moments as it stores C when its threads
// keep their columns (N / 4 dividing 256): each thread's Welford moments over its rows, merged per
// block, then across blocks. Every K it compiles for (1, 2, and the run-time K up to 8, and a
// transposed A), N a multiple of 4 or not (packed or element-by-element stores), one row, a last
// block of a few rows, with and without a bias or the ReLU, bf16 and f32; and N = 12, whose
// threads change columns (the unfused pass).
TEST(GpuColumnMoments, ThinKKernel) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 950;
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    SCOPED_TRACE(cat(dtype));
    expect_moments_match(MomentsCase{4100, 256, 2, dtype, dtype}, ++seed);
    expect_moments_match(MomentsCase{1, 8, 2, dtype, dtype}, ++seed);
    expect_moments_match(MomentsCase{129, 6, 1, dtype, dtype, false, false, true, false}, ++seed);
    expect_moments_match(MomentsCase{1000, 3, 3, dtype, dtype}, ++seed);
    expect_moments_match(MomentsCase{777, 32, 5, dtype, dtype, true, true}, ++seed);
    expect_moments_match(MomentsCase{300, 12, 2, dtype, dtype}, ++seed);
    expect_moments_match(MomentsCase{2050, 64, 2, dtype, dtype, false, true, false, true}, ++seed);
  }
  expect_moments_match(MomentsCase{2000, 64, 2, DType::f16, DType::f32}, ++seed);
}

// The thin-K kernel's moments: a NaN in one column of B gives that column NaN moments, and only
// it; values ~1300 standard deviations from zero keep their variance (Welford's update centres
// each value at the running mean); two runs give the same bits.
TEST(GpuColumnMoments, ThinKKernelNaNFarMeanAndRepeats) {
  MINAMP_REQUIRE_GPU();
  const int64_t m = 5000, n = 64, k = 2, bad = 13;
  Rng rng(990);
  const Tensor a = test::random_tensor(rng, {m, k}, DType::f32, Device::cuda, -4.0f, 4.0f);
  std::vector<float> b_values =
      test::random_tensor(rng, {k, n}, DType::f32, Device::cpu, -4.0f, 4.0f).to_vector();
  const Tensor b = Tensor::from_vector(b_values, {k, n}, DType::f32, Device::cuda);
  b_values[size_t(n + bad)] = std::nanf("");
  const Tensor b_nan = Tensor::from_vector(b_values, {k, n}, DType::f32, Device::cuda);
  const Tensor bias = Tensor::full({n}, 1e4f, DType::f32, Device::cuda);
  const auto run = [&](const Tensor& weights, Tensor& c) {
    Tensor moments = test::poisoned({2, n}, DType::f32, Device::cuda);
    GemmEpilogue epilogue;
    epilogue.bias = &bias;
    epilogue.column_moments = &moments;
    kernels::gemm(a, false, weights, false, c, epilogue);
    return moments;
  };

  Tensor c_nan = test::poisoned({m, n}, DType::f32, Device::cuda);
  const std::vector<float> nan_moments = run(b_nan, c_nan).to_vector();
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(std::isnan(nan_moments[size_t(j)]), j == bad) << "mean of column " << j;
    EXPECT_EQ(std::isnan(nan_moments[size_t(n + j)]), j == bad) << "variance of column " << j;
  }

  Tensor c = test::poisoned({m, n}, DType::f32, Device::cuda);
  const Tensor first = run(b, c);
  test::expect_within(moments_error(first, moments_of(c.to(Device::cpu))), 1e-4,
                      "thin K: moments at |mean| ~ 1300 std");
  const std::vector<float> once = first.to_vector(), again = run(b, c).to_vector();
  EXPECT_EQ(std::memcmp(once.data(), again.data(), once.size() * sizeof(float)), 0);
}

// ---- Sequential: a BatchNorm takes its statistics from the Linear or Conv2d before it.

// Conv2d 3x3 -> BatchNorm -> ReLU -> Conv2d 1x1 -> BatchNorm -> ReLU on the device. No bias before
// a batch norm (as in PyTorch's ResNets): its gradient is zero but for rounding, which no relative
// tolerance can compare.
std::unique_ptr<nn::Sequential> make_conv_net() {
  Rng rng(1000);
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Conv2d>(6, 24, 3, rng, 1, 1, false);
  net->emplace<nn::BatchNorm>(24);
  net->emplace<nn::ReLU>();
  net->emplace<nn::Conv2d>(24, 16, 1, rng, 1, 0, false);
  net->emplace<nn::BatchNorm>(16);
  net->emplace<nn::ReLU>();
  net->to(Device::cuda);
  return net;
}

// Linear -> BatchNorm -> ReLU -> Linear -> BatchNorm on the device.
std::unique_ptr<nn::Sequential> make_linear_net() {
  Rng rng(1100);
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Linear>(20, 48, rng, false);
  net->emplace<nn::BatchNorm>(48);
  net->emplace<nn::ReLU>();
  net->emplace<nn::Linear>(48, 24, rng, false);
  net->emplace<nn::BatchNorm>(24);
  net->to(Device::cuda);
  return net;
}

// Sine's model at a small size (no bias before a batch norm, as above): Conv2d 1x1 (2 -> first)
// -> BatchNorm -> ReLU -> Conv2d 1x1 (first -> second) -> BatchNorm -> ReLU -> Conv2d 1x1
// (second -> 1), on the device; 32 and 40 wide by default. The second and third convs apply the
// batch norm before them as they load their input (the third one's N = 1 is a single edge tile).
std::unique_ptr<nn::Sequential> make_pointwise_net(int64_t first = 32, int64_t second = 40,
                                                   uint64_t seed = 1150) {
  Rng rng(seed);
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Conv2d>(2, first, 1, rng, 1, 0, false);
  net->emplace<nn::BatchNorm>(first).emplace<nn::ReLU>();
  net->emplace<nn::Conv2d>(first, second, 1, rng, 1, 0, false);
  net->emplace<nn::BatchNorm>(second).emplace<nn::ReLU>();
  net->emplace<nn::Conv2d>(second, 1, 1, rng);
  net->to(Device::cuda);
  return net;
}
std::unique_ptr<nn::Sequential> make_small_pointwise_net() { return make_pointwise_net(); }

// make_pointwise_net with a bias on every conv: the first two, before a batch norm, have a real
// gradient in eval mode only (in training mode it is zero but for rounding).
std::unique_ptr<nn::Sequential> make_biased_pointwise_net() {
  Rng rng(1160);
  auto net = std::make_unique<nn::Sequential>();
  net->emplace<nn::Conv2d>(2, 32, 1, rng);
  net->emplace<nn::BatchNorm>(32).emplace<nn::ReLU>();
  net->emplace<nn::Conv2d>(32, 40, 1, rng);
  net->emplace<nn::BatchNorm>(40).emplace<nn::ReLU>();
  net->emplace<nn::Conv2d>(40, 1, 1, rng);
  return net;
}

// What one training step and one eval forward leave: outputs, gradients, running statistics, and
// the op that made the training output.
struct StepResult {
  Tensor train_out, eval_out;
  std::vector<Tensor> grads, buffers;
  std::string last_op;
};

// One step of `net` moved to `device`.
StepResult run_step(nn::Sequential& net, const Shape& input_shape, DType amp_dtype,
                    Device device = Device::cuda) {
  net.to(device);
  Rng rng(1200);
  const Tensor x = test::random_tensor(rng, input_shape, DType::f32, device, -2.0f, 2.0f);
  StepResult out;
  {
    const bool amp = amp_dtype != DType::f32;
    amp::Autocast autocast(amp, amp ? amp_dtype : DType::f16);
    net.train();
    const Var y = net(Var(x));
    out.train_out = y.value().to(Device::cpu);
    out.last_op = y.node().op;
    const Tensor target = test::random_tensor(rng, y.shape(), DType::f32, device);
    ops::mse_loss(y, target).backward();
    net.eval();
    out.eval_out = net(Var(x)).value().to(Device::cpu);
  }
  for (Parameter* p : net.parameters()) out.grads.push_back(p->grad().to(Device::cpu));
  for (auto& [name, buffer] : net.named_buffers()) out.buffers.push_back(buffer->to(Device::cpu));
  return out;
}

void expect_fused_matches_unfused(std::unique_ptr<nn::Sequential> (*make)(),
                                  const Shape& input_shape, const char* name) {
  for (DType amp_dtype : {DType::f32, DType::f16, DType::bf16}) {
    StepResult fused, unfused;
    {
      test::ScopedFusion on(true);
      fused = run_step(*make(), input_shape, amp_dtype);
    }
    {
      test::ScopedFusion off(false);
      unfused = run_step(*make(), input_shape, amp_dtype);
    }
    const double tolerance = test::tolerance_for(amp_dtype);
    const std::string what = cat(name, " ", amp_dtype, " fused vs MINAMP_FUSION=0");
    test::expect_close(fused.train_out, unfused.train_out, tolerance, what + ": training forward");
    test::expect_close(fused.eval_out, unfused.eval_out, tolerance, what + ": eval forward");
    ASSERT_EQ(fused.grads.size(), unfused.grads.size());
    for (size_t i = 0; i < fused.grads.size(); ++i)
      test::expect_close(fused.grads[i], unfused.grads[i], tolerance,
                         cat(what, ": gradient of parameter ", i));
    for (size_t i = 0; i < fused.buffers.size(); ++i)
      test::expect_close(fused.buffers[i], unfused.buffers[i], tolerance,
                         cat(what, ": buffer ", i));
  }
}

TEST(GpuFusion, ConvBatchNormReluMatchesUnfused) {
  MINAMP_REQUIRE_GPU();
  expect_fused_matches_unfused(make_conv_net, {4, 12, 10, 6}, "conv net");
}

TEST(GpuFusion, LinearBatchNormReluMatchesUnfused) {
  MINAMP_REQUIRE_GPU();
  expect_fused_matches_unfused(make_linear_net, {300, 20}, "linear net");
}

// Both later convs of the pointwise net apply their batch norm as they load (batch_norm_conv2d)
// with fusion on, and agree with the unfused GPU path and with the CPU: forward, every gradient
// and the running statistics, in training and eval mode.
TEST(GpuFusion, PointwiseConvsApplyTheBatchNormBeforeThem) {
  MINAMP_REQUIRE_GPU();
  const Shape input{2, 9, 11, 2};
  expect_fused_matches_unfused(make_small_pointwise_net, input, "pointwise net");
  for (DType amp_dtype : {DType::f32, DType::f16}) {
    StepResult fused, cpu;
    {
      test::ScopedFusion on(true);
      fused = run_step(*make_pointwise_net(), input, amp_dtype);
      EXPECT_STREQ(fused.last_op.c_str(), "batch_norm_conv2d");
      test::ScopedFusion off(false);
      EXPECT_STREQ(run_step(*make_pointwise_net(), input, amp_dtype).last_op.c_str(), "conv2d");
    }
    cpu = run_step(*make_pointwise_net(), input, amp_dtype, Device::cpu);
    EXPECT_STREQ(cpu.last_op.c_str(), "conv2d") << "the CPU runs the unfused reference";
    const double tolerance = test::tolerance_for(amp_dtype);
    const std::string what = cat("pointwise net ", amp_dtype, " fused vs CPU");
    test::expect_close(fused.train_out, cpu.train_out, tolerance, what + ": training forward");
    test::expect_close(fused.eval_out, cpu.eval_out, tolerance, what + ": eval forward");
    for (size_t i = 0; i < fused.grads.size(); ++i)
      test::expect_close(fused.grads[i], cpu.grads[i], tolerance,
                         cat(what, ": gradient of parameter ", i));
    for (size_t i = 0; i < fused.buffers.size(); ++i)
      test::expect_close(fused.buffers[i], cpu.buffers[i], tolerance, cat(what, ": buffer ", i));
  }
}

// The gradients of one forward and backward of `net` on `device` (eval mode unless `training`),
// and how many times each kernel ran in that backward.
struct EvalBackward {
  std::vector<Tensor> grads;
  std::map<std::string, int64_t> calls;
};
EvalBackward eval_backward(nn::Sequential& net, DType amp_dtype, Device device,
                           const Shape& input = {2, 9, 11, 2}, bool training = false) {
  net.to(device);
  if (training)
    net.train();
  else
    net.eval();
  Rng rng(1210);
  const Tensor x = test::random_tensor(rng, input, DType::f32, device, -2.0f, 2.0f);
  EvalBackward out;
  {
    const bool amp = amp_dtype != DType::f32;
    amp::Autocast autocast(amp, amp ? amp_dtype : DType::f16);
    const Var y = net(Var(x));
    const Var loss = ops::mse_loss(y, test::random_tensor(rng, y.shape(), DType::f32, device));
    profile::collect(); // start from nothing
    profile::set_enabled(true);
    loss.backward();
    profile::set_enabled(false);
  }
  for (const profile::OpTime& t : profile::collect()) out.calls[t.op] += t.calls;
  for (Parameter* p : net.parameters()) out.grads.push_back(p->grad().to(Device::cpu));
  return out;
}

// With fusion on, the batch norm's backward inside batch_norm_conv2d sums its dx per channel as it
// writes it (C = 32 in its dx kernel, C = 40 by a reduction after it), and the conv before takes
// those sums as its bias gradient: only the last conv's bias runs bias_backward. Every gradient
// agrees with MINAMP_FUSION=0's and with the CPU's.
TEST(GpuFusion, BiasGradientsBeforeABatchNormComeFromItsBackward) {
  MINAMP_REQUIRE_GPU();
  for (DType amp_dtype : {DType::f32, DType::f16}) {
    SCOPED_TRACE(cat("autocast ", amp_dtype));
    EvalBackward fused, unfused;
    {
      test::ScopedFusion on(true);
      fused = eval_backward(*make_biased_pointwise_net(), amp_dtype, Device::cuda);
    }
    {
      test::ScopedFusion off(false);
      unfused = eval_backward(*make_biased_pointwise_net(), amp_dtype, Device::cuda);
    }
    const EvalBackward cpu = eval_backward(*make_biased_pointwise_net(), amp_dtype, Device::cpu);
    EXPECT_EQ(fused.calls["bias_backward"], 1);
    EXPECT_EQ(unfused.calls["bias_backward"], 3);
    EXPECT_EQ(fused.calls["conv2d_backward_from_batchnorm"], 0)
        << "198 pixels: too few for the first conv's thin-C weight gradient";
    const double tolerance = test::tolerance_for(amp_dtype);
    ASSERT_EQ(fused.grads.size(), cpu.grads.size());
    for (size_t i = 0; i < fused.grads.size(); ++i) {
      test::expect_close(fused.grads[i], unfused.grads[i], tolerance,
                         cat("fused vs MINAMP_FUSION=0: gradient of parameter ", i));
      test::expect_close(fused.grads[i], cpu.grads[i], tolerance,
                         cat("fused vs CPU: gradient of parameter ", i));
    }
  }
}

// With fusion on and 4096 pixels, the first batch norm's backward hands the first conv (2 -> 32,
// its input needing no gradient) its input gradient as terms, and the conv's weight and bias
// gradients read it unwritten (conv2d_backward_from_batchnorm, the thin-C GEMM): no batch norm
// writes a dx, and only the last conv's bias runs bias_backward. Every gradient agrees with
// MINAMP_FUSION=0's and with the CPU's, in eval mode (where the biases before a batch norm have a
// real gradient) and in training mode (the weights; those biases' gradients are rounding there).
TEST(GpuFusion, FirstConvReadsTheBatchNormInputGradientUnwritten) {
  MINAMP_REQUIRE_GPU();
  const Shape input{1, 64, 64, 2};
  for (bool training : {false, true})
    for (DType amp_dtype : {DType::f32, DType::f16}) {
      SCOPED_TRACE(cat(training ? "training" : "eval", ", autocast ", amp_dtype));
      EvalBackward fused, unfused;
      {
        test::ScopedFusion on(true);
        fused =
            eval_backward(*make_biased_pointwise_net(), amp_dtype, Device::cuda, input, training);
      }
      {
        test::ScopedFusion off(false);
        unfused =
            eval_backward(*make_biased_pointwise_net(), amp_dtype, Device::cuda, input, training);
      }
      const EvalBackward cpu =
          eval_backward(*make_biased_pointwise_net(), amp_dtype, Device::cpu, input, training);
      EXPECT_EQ(fused.calls["conv2d_backward_from_batchnorm"], 1);
      EXPECT_EQ(unfused.calls["conv2d_backward_from_batchnorm"], 0);
      EXPECT_EQ(fused.calls["bias_backward"], 1);
      EXPECT_EQ(fused.calls["batchnorm_backward"], 2) << "the first one's affine gradients only";
      const double tolerance = test::tolerance_for(amp_dtype);
      ASSERT_EQ(fused.grads.size(), cpu.grads.size());
      for (size_t i = 0; i < fused.grads.size(); ++i) {
        // Parameters: conv1 weight, bias (1), bn1 gamma, beta, conv2 weight, bias (5), ...
        if (training && (i == 1 || i == 5)) continue;
        test::expect_close(fused.grads[i], unfused.grads[i], tolerance,
                           cat("fused vs MINAMP_FUSION=0: gradient of parameter ", i));
        test::expect_close(fused.grads[i], cpu.grads[i], tolerance,
                           cat("fused vs CPU: gradient of parameter ", i));
      }
    }
}

// batch_norm_conv2d's backward writes the batch norm's input gradient over the gradient of its
// output, so the backward of the pointwise net 64 channels wide holds one [rows, 64] gradient
// beyond what the forward kept, and partial sums and a split-K workspace of half its size (1.5 of
// it in f32, 1.47 in f16), where a separate dx would make it two at least (each conv's node holds
// its output's gradient while it makes the batch norm's: 2.02 in f32, 2.47 in f16). The allocator's
// peak over the backward says which, in f32 and under f16 autocast; the gradients match
// MINAMP_FUSION=0's.
TEST(GpuFusion, BatchNormInputGradientOverwritesItsOutputGradient) {
  MINAMP_REQUIRE_GPU();
  for (DType amp_dtype : {DType::f32, DType::f16}) {
    SCOPED_TRACE(cat("autocast ", amp_dtype));
    const Shape input{1, 64, 64, 2};
    const double activation_bytes = 64.0 * 64 * 64 * dtype_size(amp_dtype); // [4096, 64]
    std::vector<Tensor> grads[2];
    for (bool fusion : {true, false}) {
      test::ScopedFusion scope(fusion);
      std::unique_ptr<nn::Sequential> net = make_pointwise_net(64, 64, 1170);
      Rng rng(1220);
      const Tensor x = test::random_tensor(rng, input, DType::f32, Device::cuda, -2.0f, 2.0f);
      const Tensor target = test::random_tensor(rng, {1, 64, 64, 1}, DType::f32, Device::cuda);
      {
        const bool amp = amp_dtype != DType::f32;
        amp::Autocast autocast(amp, amp ? amp_dtype : DType::f16);
        const Var y = (*net)(Var(x));
        EXPECT_STREQ(y.node().op, fusion ? "batch_norm_conv2d" : "conv2d");
        const Var loss = ops::mse_loss(y, target);
        const size_t peak = test::peak_bytes_during(Device::cuda, [&] { loss.backward(); });
        if (fusion) {
          EXPECT_LE(double(peak), 1.75 * activation_bytes)
              << "the backward held two activation-sized gradients beyond the forward's";
        }
      }
      for (Parameter* p : net->parameters()) grads[fusion].push_back(p->grad().to(Device::cpu));
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      test::expect_close(grads[1][i], grads[0][i], test::tolerance_for(amp_dtype),
                         cat("fused vs MINAMP_FUSION=0: gradient of parameter ", i));
  }
}

// The handoff itself: a Conv2d that a BatchNorm follows produces moments with its output in
// training mode on CUDA while fusion is on, and hands them over once, for that output only.
TEST(GpuFusion, ConvHandsItsMomentsToTheBatchNormOnly) {
  MINAMP_REQUIRE_GPU();
  nn::Sequential net;
  Rng rng(1300);
  net.emplace<nn::Conv2d>(4, 8, 1, rng);
  net.emplace<nn::BatchNorm>(8);
  net.to(Device::cuda);
  nn::Module& conv = net[0];
  const Tensor x = test::random_tensor(rng, {2, 5, 5, 4}, DType::f32, Device::cuda);

  const Tensor y = conv(Var(x)).value();
  const Tensor moments = conv.take_batch_moments(y);
  ASSERT_TRUE(moments.defined());
  EXPECT_EQ(moments.shape(), (Shape{2, 8}));
  EXPECT_LT(moments_error(moments, moments_of(y.to(Device::cpu))), kMomentsOfStoredTolerance);
  EXPECT_FALSE(conv.take_batch_moments(y).defined()) << "handed over twice";

  const Tensor other = conv(Var(x)).value();
  EXPECT_FALSE(conv.take_batch_moments(y).defined()) << "moments of another output";
  {
    test::ScopedFusion off(false);
    const Tensor unfused = conv(Var(x)).value();
    EXPECT_FALSE(conv.take_batch_moments(unfused).defined()) << "MINAMP_FUSION=0";
  }
  net.eval();
  const Tensor evaluated = conv(Var(x)).value();
  EXPECT_FALSE(conv.take_batch_moments(evaluated).defined()) << "eval mode";
}

} // namespace
} // namespace minamp
