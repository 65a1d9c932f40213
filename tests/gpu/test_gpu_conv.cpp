// GPU conv2d (implicit GEMMs: forward, input gradient and weight gradient) against the CPU
// reference: 1x1, 3x3 stride 1 and 2, 5x5, batch 1, Cin 1 and 3, odd spatial sizes, input pixels
// no tap reads, gathers on the large tiles, weight gradients long enough to split K, f16, bf16 and
// f32.
// y and dx start as NaN poison; dw starts random because it accumulates.
#include <string>
#include <vector>

#include "kernels/gemm_version.h"
#include "kernels/kernels.h"
#include "test_util.h"

namespace minamp {
namespace {

struct ConvCase {
  int64_t n, h, w, cin, cout, kh, kw;
  int stride, pad;

  int64_t out_h() const { return (h + 2 * pad - kh) / stride + 1; }
  int64_t out_w() const { return (w + 2 * pad - kw) / stride + 1; }
  Shape x_shape() const { return {n, h, w, cin}; }
  Shape w_shape() const { return {cout, kh, kw, cin}; }
  Shape y_shape() const { return {n, out_h(), out_w(), cout}; }
  ConvParams params() const { return {stride, pad}; }
};

std::string describe_case(const ConvCase& c, DType dtype) {
  return cat("x ", c.x_shape(), " w ", c.w_shape(), " stride ", c.stride, " pad ", c.pad, " ",
             dtype);
}

const std::vector<ConvCase> kCases = {
    // n, h, w, cin, cout, kh, kw, stride, pad
    {2, 6, 5, 8, 16, 1, 1, 1, 0},    // pointwise: a plain GEMM
    {1, 7, 9, 3, 5, 1, 1, 2, 0},     // 1x1 with stride: gathered
    {2, 9, 11, 3, 8, 3, 3, 1, 1},    // 3x3 same padding, Cin 3 (element-wise gathers)
    {1, 13, 9, 16, 12, 3, 3, 2, 1},  // 3x3 stride 2, Cin 16 (16-byte gathers)
    {1, 11, 7, 1, 5, 5, 5, 1, 2},    // 5x5, Cin 1
    {2, 15, 13, 8, 24, 5, 5, 2, 0},  // 5x5 stride 2, no padding
    {1, 5, 5, 4, 7, 3, 3, 1, 0},     // Cin 4: 16-byte gathers for f32 only
    {3, 8, 8, 32, 40, 3, 3, 1, 1},   // several K steps
    {2, 96, 97, 8, 32, 3, 3, 1, 1},  // 291 row tiles; dw splits K (18624 pixels, 2 tiles)
    {4, 64, 64, 16, 24, 1, 1, 1, 0}, // pointwise over many pixels: dw splits K (sine's shape)
    {2, 10, 8, 8, 16, 3, 3, 2, 0},   // stride 2, last input row and column never read: dx 0 there
    {1, 11, 10, 4, 6, 2, 2, 3, 0},   // stride 3 > kernel 2: rows and columns between taps get dx 0
    {2, 9, 10, 8, 6, 3, 1, 1, 1},    // non-square 3x1 kernel: output 9x12
    {1, 7, 12, 3, 5, 2, 5, 2, 2},    // non-square 2x5 kernel, stride 2: output 5x6
    {2, 6, 7, 4, 6, 1, 3, 1, 0},     // 1x3, stride 1, no padding: gathered, not a 1x1 GEMM
    {2, 6, 5, 4, 6, 3, 1, 1, 0},     // 3x1, likewise
    {2, 3, 4, 5, 6, 3, 4, 1, 0},     // the kernel covers the whole input: one output pixel
    // 128 channels over >= 132 tiles of 128 rows: both gathers (im2col in y, col2im in dx) on
    // the large WMMA / SIMT tiles.
    {1, 128, 132, 128, 128, 1, 1, 1, 1}, // (a padded 1x1 conv is gathered, not a plain GEMM)
};

void check_forward(const ConvCase& c, DType dtype, DType y_dtype, bool bias_relu, uint64_t seed) {
  Rng rng(seed);
  const Tensor x = test::random_tensor(rng, c.x_shape(), dtype);
  const Tensor w = test::random_tensor(rng, c.w_shape(), dtype);
  const Tensor bias = test::random_tensor(rng, {c.cout});
  GemmEpilogue epilogue;
  epilogue.bias = bias_relu ? &bias : nullptr;
  epilogue.relu = bias_relu;

  Tensor y_cpu = test::poisoned(c.y_shape(), y_dtype);
  kernels::conv2d_forward(x, w, y_cpu, c.params(), epilogue);

  const Tensor bias_gpu = bias.to(Device::cuda);
  epilogue.bias = bias_relu ? &bias_gpu : nullptr;
  Tensor y_gpu = test::poisoned(c.y_shape(), y_dtype, Device::cuda);
  kernels::conv2d_forward(x.to(Device::cuda), w.to(Device::cuda), y_gpu, c.params(), epilogue);

  test::expect_close(y_gpu, y_cpu, test::tolerance_for(dtype, y_dtype),
                     cat(describe_case(c, dtype), " -> y ", y_dtype, " bias+relu ", bias_relu));
}

// Runs the backward pass on both devices; `want_dx` / `want_dw` choose which gradients are
// defined.
void check_backward(const ConvCase& c, DType dtype, bool want_dx, bool want_dw, uint64_t seed) {
  Rng rng(seed);
  const Tensor x = test::random_tensor(rng, c.x_shape(), dtype);
  const Tensor w = test::random_tensor(rng, c.w_shape(), dtype);
  const Tensor dy = test::random_tensor(rng, c.y_shape(), dtype);
  const Tensor dw_start = test::random_tensor(rng, c.w_shape());

  Tensor dx_cpu = want_dx ? test::poisoned(c.x_shape(), dtype) : Tensor();
  Tensor dw_cpu = want_dw ? dw_start.clone() : Tensor();
  kernels::conv2d_backward(x, w, dy, dx_cpu, dw_cpu, c.params());

  Tensor dx_gpu = want_dx ? test::poisoned(c.x_shape(), dtype, Device::cuda) : Tensor();
  Tensor dw_gpu = want_dw ? dw_start.to(Device::cuda) : Tensor();
  kernels::conv2d_backward(x.to(Device::cuda), w.to(Device::cuda), dy.to(Device::cuda), dx_gpu,
                           dw_gpu, c.params());

  if (want_dx) {
    test::expect_close(dx_gpu, dx_cpu, test::tolerance_for(dtype, dtype),
                       "dx of " + describe_case(c, dtype));
  }
  if (want_dw) {
    test::expect_close(dw_gpu, dw_cpu, test::tolerance_for(dtype, DType::f32), // dw is f32
                       "dw of " + describe_case(c, dtype));
  }
}

TEST(GpuConv, Forward) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const ConvCase& c : kCases)
    for (DType dtype : {DType::f16, DType::f32})
      for (bool bias_relu : {false, true}) check_forward(c, dtype, dtype, bias_relu, ++seed);
}

TEST(GpuConv, ForwardF16InF32Out) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const ConvCase& c : kCases) check_forward(c, DType::f16, DType::f32, true, ++seed);
}

TEST(GpuConv, Backward) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 300;
  for (const ConvCase& c : kCases)
    for (DType dtype : {DType::f16, DType::f32}) check_backward(c, dtype, true, true, ++seed);
}

// bf16 convs on the tensor cores (v5, and v2 below): every case but the last, the widest.
TEST(GpuConv, Bf16ForwardAndBackward) {
  MINAMP_REQUIRE_GPU();
  uint64_t seed = 320;
  for (GemmVersion version : {GemmVersion::automatic, GemmVersion::v2_wmma}) {
    ScopedGemmVersion scope(version);
    for (size_t i = 0; i + 1 < kCases.size(); ++i) {
      check_forward(kCases[i], DType::bf16, DType::bf16, true, ++seed);
      check_backward(kCases[i], DType::bf16, true, true, ++seed);
    }
  }
  // bf16 x and w into an f32 y, and into an f16 y (through f32: gemm writes no other 16-bit
  // format than its operands').
  check_forward(kCases[2], DType::bf16, DType::f32, true, ++seed);
  check_forward(kCases[2], DType::bf16, DType::f16, true, ++seed);
}

// The f16 convs run on the tensor-core GEMM the library picks (v4 on sm_80+); v2 is the one it
// picks below sm_80, so its gathers are checked here too, on every case.
TEST(GpuConv, ForwardAndBackwardOnGemmV2) {
  MINAMP_REQUIRE_GPU();
  ScopedGemmVersion v2(GemmVersion::v2_wmma);
  uint64_t seed = 350;
  for (const ConvCase& c : kCases) {
    check_forward(c, DType::f16, DType::f16, true, ++seed);
    check_backward(c, DType::f16, true, true, ++seed);
  }
}

// 256 output channels over 133 row tiles: the forward's im2col gather on v5's 128x256 tiles
// (the cases above are narrower, and take the 64x64 or 128x128 ones).
TEST(GpuConv, ForwardGathersOnTheWidestTiles) {
  MINAMP_REQUIRE_GPU();
  check_forward({1, 130, 130, 8, 256, 3, 3, 1, 1}, DType::f16, DType::f16, true, 360);
}

// ResNet's strided convolutions, a 3x3 stride-2 conv and a 1x1 stride-2 downsample, with input
// gradients wide enough for the large tile configurations: each stride phase of dx is its own
// GEMM (a quarter of the pixels, the taps that reach them), placed into dx in 16-byte packs; the
// downsample's three phases that no tap reads get zeros.
TEST(GpuConv, StridedInputGradientOnWideTiles) {
  MINAMP_REQUIRE_GPU();
  check_backward({1, 66, 64, 128, 64, 3, 3, 2, 1}, DType::f16, true, false, 365);
  check_backward({1, 66, 64, 128, 256, 1, 1, 2, 0}, DType::f16, true, false, 366);
}

// Convolutions whose gathered operands take the interior loader (gemm.cuh's GatheredTileLoader:
// 16-byte chunks and whole K tiles), ResNet-like: 64 channels, 3x3 stride 1 and 2, a 1x1 stride-2
// downsample; output rows past the last tile's end, padding, stride phases with and without taps,
// an im2col weight-gradient operand (B) whose last column tile runs past its 72 columns, split K.
// On the library's version and on v4, whose main loop takes the same loaders, in f16; the library's
// in bf16 too. Then a padded 1x1 conv over 137 row tiles of 128, on v5's 128x256 tiles.
TEST(GpuConv, GatheredOperandsOnWholeKTiles) {
  MINAMP_REQUIRE_GPU();
  const ConvCase cases[] = {
      // n, h, w, cin, cout, kh, kw, stride, pad
      {2, 16, 16, 64, 64, 3, 3, 1, 1},  // every GEMM interior; K split in dw and y
      {2, 15, 13, 64, 64, 3, 3, 2, 1},  // 112 output rows; dx in four phases
      {3, 14, 14, 64, 128, 1, 1, 2, 0}, // downsample: 147 rows, three phases no tap reads
      {4, 8, 8, 8, 64, 3, 3, 1, 1},     // dw's im2col columns end inside a tile
  };
  uint64_t seed = 370;
  for (GemmVersion version : {GemmVersion::automatic, GemmVersion::v4_mma}) {
    ScopedGemmVersion scope(version);
    for (const ConvCase& c : cases) {
      check_forward(c, DType::f16, DType::f16, true, ++seed);
      check_backward(c, DType::f16, true, true, ++seed);
    }
  }
  for (const ConvCase& c : cases) {
    check_forward(c, DType::bf16, DType::bf16, true, ++seed);
    check_backward(c, DType::bf16, true, true, ++seed);
  }
  check_forward({1, 130, 130, 64, 256, 1, 1, 1, 1}, DType::f16, DType::f16, true, ++seed);
}

TEST(GpuConv, BackwardOnlyOneGradient) {
  MINAMP_REQUIRE_GPU();
  const ConvCase c{1, 9, 7, 3, 6, 3, 3, 2, 1};
  for (DType dtype : {DType::f16, DType::f32}) {
    check_backward(c, dtype, true, false, 400);
    check_backward(c, dtype, false, true, 401);
  }
}

// x, w and dy of different dtypes are allowed (as on the CPU): the forward (y of `y_type`) and
// the backward (dx and dw f32) of f16 x [2, 7, 6, 3] on both devices, the backward within
// `tolerance`.
void check_mixed_dtypes(DType w_type, DType dy_type, DType y_type, double tolerance,
                        uint64_t seed) {
  const DType x_type = DType::f16;
  const ConvCase c{2, 7, 6, 3, 5, 3, 3, 1, 1};
  const std::string what =
      cat(describe_case(c, x_type), ", w ", w_type, ", dy ", dy_type, ", y ", y_type);
  Rng rng(seed);
  const Tensor x = test::random_tensor(rng, c.x_shape(), x_type);
  const Tensor w = test::random_tensor(rng, c.w_shape(), w_type);
  const Tensor dy = test::random_tensor(rng, c.y_shape(), dy_type);
  const Tensor dw_start = test::random_tensor(rng, c.w_shape());

  Tensor y_cpu = test::poisoned(c.y_shape(), y_type);
  Tensor dx_cpu = test::poisoned(c.x_shape(), DType::f32), dw_cpu = dw_start.clone();
  kernels::conv2d_forward(x, w, y_cpu, c.params(), {});
  kernels::conv2d_backward(x, w, dy, dx_cpu, dw_cpu, c.params());

  Tensor y_gpu = test::poisoned(c.y_shape(), y_type, Device::cuda);
  Tensor dx_gpu = test::poisoned(c.x_shape(), DType::f32, Device::cuda);
  Tensor dw_gpu = dw_start.to(Device::cuda);
  const Tensor x_gpu = x.to(Device::cuda), w_gpu = w.to(Device::cuda);
  kernels::conv2d_forward(x_gpu, w_gpu, y_gpu, c.params(), {});
  kernels::conv2d_backward(x_gpu, w_gpu, dy.to(Device::cuda), dx_gpu, dw_gpu, c.params());

  test::expect_close(y_gpu, y_cpu, test::tolerance_for(DType::f16, y_type), "y of " + what);
  test::expect_close(dx_gpu, dx_cpu, tolerance, "dx of " + what);
  test::expect_close(dw_gpu, dw_cpu, tolerance, "dw of " + what);
}

// The GPU computes mixed dtypes in f32 (an f32 y shows that w was not rounded to f16).
TEST(GpuConv, MixedDtypes) {
  MINAMP_REQUIRE_GPU();
  for (DType y_type : {DType::f16, DType::f32})
    check_mixed_dtypes(DType::f32, DType::f16, y_type, test::tolerance_for(DType::f16, DType::f32),
                       450);
}

// x and w f16 with an f32 dy: the backward is f32 math (dy is not rounded to f16), as on the CPU.
TEST(GpuConv, AnF32GradientOfF16InputsIsNotRounded) {
  MINAMP_REQUIRE_GPU();
  check_mixed_dtypes(DType::f16, DType::f32, DType::f16, test::tolerance_for(DType::f32), 460);
}

TEST(GpuConv, RejectsBadArguments) {
  MINAMP_REQUIRE_GPU();
  Rng rng(500);
  const ConvCase c{1, 5, 5, 3, 4, 3, 3, 1, 1};
  const Tensor x = test::random_tensor(rng, c.x_shape(), DType::f16, Device::cuda);
  const Tensor w = test::random_tensor(rng, c.w_shape(), DType::f16, Device::cuda);
  Tensor y = test::poisoned(c.y_shape(), DType::f16, Device::cuda);

  const Tensor w_wrong_cin = test::random_tensor(rng, {4, 3, 3, 5}, DType::f16, Device::cuda);
  test::expect_error([&] { kernels::conv2d_forward(x, w_wrong_cin, y, c.params(), {}); },
                     "conv2d_forward", "[Cout, kh, kw, Cin] with the Cin of x", "f16[4, 3, 3, 5]");
  Tensor y_wrong = test::poisoned({1, 4, 5, 4}, DType::f16, Device::cuda);
  test::expect_error([&] { kernels::conv2d_forward(x, w, y_wrong, c.params(), {}); },
                     "conv2d_forward", "expects y f32/f16/bf16 [1, 5, 5, 4]", "f16[1, 4, 5, 4]");
  const Tensor x_rank3 = test::random_tensor(rng, {5, 5, 3}, DType::f16, Device::cuda);
  test::expect_error([&] { kernels::conv2d_forward(x_rank3, w, y, c.params(), {}); },
                     "conv2d_forward", "expects x f32/f16/bf16 [N, H, W, Cin]", "f16[5, 5, 3]");
  test::expect_error(
      [&] {
        kernels::conv2d_forward(x, w, y, ConvParams{0, 1}, {});
      },
      "conv2d_forward", "expects stride >= 1 and pad >= 0, got stride 0");
  test::expect_error(
      [&] {
        kernels::conv2d_forward(x, w, y, ConvParams{1, -1}, {});
      },
      "conv2d_forward", "expects stride >= 1 and pad >= 0, got stride 1, pad -1");

  const Tensor wide_w = test::random_tensor(rng, {4, 1, 8, 3}, DType::f16, Device::cuda);
  test::expect_error(
      [&] {
        kernels::conv2d_forward(x, wide_w, y, ConvParams{1, 1}, {});
      },
      "conv2d_forward", "the kernel of f16[4, 1, 8, 3] on cuda does not fit", "(pad 1)");
  // A patch matrix of 1024 * 1024 rows by 47 * 47 * 2 columns: 4.6e9 elements, past the kernels'
  // 32-bit extents, from tensors of a few MiB. A SizeLimit, so that a caller can try smaller.
  const Tensor big_x = test::random_tensor(rng, {1, 1024, 1024, 2}, DType::f16, Device::cuda);
  const Tensor big_w = test::random_tensor(rng, {1, 47, 47, 2}, DType::f16, Device::cuda);
  Tensor big_y = test::poisoned({1, 1024, 1024, 1}, DType::f16, Device::cuda);
  EXPECT_THROW(kernels::conv2d_forward(big_x, big_w, big_y, ConvParams{1, 23}, {}), SizeLimit);
  test::expect_error(
      [&] {
        kernels::conv2d_forward(big_x, big_w, big_y, ConvParams{1, 23}, {});
      },
      "conv2d_forward", "sizes must fit in 32 bits");
  const Tensor bias_wrong = test::random_tensor(rng, {5}, DType::f32, Device::cuda);
  GemmEpilogue with_bias;
  with_bias.bias = &bias_wrong;
  test::expect_error([&] { kernels::conv2d_forward(x, w, y, c.params(), with_bias); },
                     "conv2d_forward", "bias must be f32 with 4 elements, got f32[5]");

  Tensor dx;
  Tensor dw_f16 = test::poisoned(c.w_shape(), DType::f16, Device::cuda);
  test::expect_error([&] { kernels::conv2d_backward(x, w, y, dx, dw_f16, c.params()); },
                     "conv2d_backward", "expects dw f32 shaped like w");
  Tensor dw = test::poisoned(c.w_shape(), DType::f32, Device::cuda);
  test::expect_error([&] { kernels::conv2d_backward(x, w, y_wrong, dx, dw, c.params()); },
                     "conv2d_backward", "expects dy f32/f16/bf16 [1, 5, 5, 4]", "f16[1, 4, 5, 4]");
}

// Degenerate sizes the CPU reference accepts, gathered and pointwise, f32 and f16: an empty batch
// (empty y and dx, dw unchanged) and no output channels (empty y and dw, dx all zero).
TEST(GpuConv, EmptyBatchAndNoOutputChannelsMatchTheCpu) {
  MINAMP_REQUIRE_GPU();
  const ConvCase cases[] = {{0, 5, 5, 3, 2, 3, 3, 1, 1},
                            {0, 4, 4, 8, 8, 1, 1, 1, 0},
                            {2, 5, 5, 3, 0, 3, 3, 2, 1},
                            {2, 4, 4, 8, 0, 1, 1, 1, 0}};
  for (const ConvCase& c : cases)
    for (DType dtype : {DType::f32, DType::f16}) {
      Rng rng(510);
      const Tensor x = test::random_tensor(rng, c.x_shape(), dtype);
      const Tensor w = test::random_tensor(rng, c.w_shape(), dtype);
      const Tensor dy = test::random_tensor(rng, c.y_shape(), dtype);
      const Tensor dw_start = test::random_tensor(rng, c.w_shape());
      Tensor y_cpu = test::poisoned(c.y_shape(), dtype),
             dx_cpu = test::poisoned(c.x_shape(), dtype);
      Tensor dw_cpu = dw_start.clone();
      kernels::conv2d_forward(x, w, y_cpu, c.params(), {});
      kernels::conv2d_backward(x, w, dy, dx_cpu, dw_cpu, c.params());

      Tensor y_gpu = test::poisoned(c.y_shape(), dtype, Device::cuda);
      Tensor dx_gpu = test::poisoned(c.x_shape(), dtype, Device::cuda);
      Tensor dw_gpu = dw_start.to(Device::cuda);
      const Tensor x_gpu = x.to(Device::cuda), w_gpu = w.to(Device::cuda);
      kernels::conv2d_forward(x_gpu, w_gpu, y_gpu, c.params(), {});
      kernels::conv2d_backward(x_gpu, w_gpu, dy.to(Device::cuda), dx_gpu, dw_gpu, c.params());

      const std::string what = describe_case(c, dtype);
      EXPECT_EQ(y_gpu.numel(), 0) << what;
      EXPECT_EQ(dx_gpu.to_vector(), std::vector<float>(size_t(dx_cpu.numel()), 0.0f)) << what;
      EXPECT_EQ(dx_cpu.to_vector(), dx_gpu.to_vector()) << what;
      EXPECT_EQ(dw_gpu.to_vector(), dw_cpu.to_vector()) << what;
      EXPECT_EQ(dw_gpu.to_vector(), dw_start.to_vector()) << what;
    }
}

} // namespace
} // namespace minamp
