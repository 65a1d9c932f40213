// The GEMM machinery shared by the tensor-core kernel (gemm_wmma.cuh), the fp32 SIMT kernel
// (gemm_fp32.cu) and the implicit-GEMM convolution (conv.cu):
//   - host side: how a GEMM operand is described (a plain matrix, a transposed one, one of the
//     two gathered matrices of a conv that are never materialised: the im2col matrix of its
//     input, and the col2im matrix of its output gradient, or an activation batch-normalised as
//     it loads) and the launcher, which picks the tile configuration and, for few tiles over a
//     long K, splits K (gemm_plan.h);
//   - device side: cp.async helpers, the shared-memory tile shapes, the loaders that copy one
//     operand tile from global to shared memory (zero-filling everything out of bounds; a
//     normalised operand's tile is then normalised in place before the warps read it) and
//     the fused epilogue C = relu(alpha * acc + beta * C + bias) with its optional per-column
//     statistics of C (for a following batch norm), and the kernel that adds split-K partial
//     sums and applies it.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "column_moments.cuh"
#include "common.cuh"
#include "device.cuh"
#include "gemm_plan.h"
#include "reduce.cuh"

namespace minamp::gpu {

// ---------------------------------------------------------------------------------------------
// Host-side description of one GEMM: C[M, N] = epilogue(op(A)[M, K] @ op(B)[K, N]).

// The geometry of a 2-D convolution over NHWC activations: x [batch, height, width, channels],
// w [out_channels, kernel_h, kernel_w, channels], y [batch, out_h, out_w, out_channels].
struct ConvGeometry {
  int batch = 0, height = 0, width = 0, channels = 0;
  int kernel_h = 0, kernel_w = 0, stride = 1, pad = 0;
  int out_h = 0, out_w = 0, out_channels = 0;

  // Rows of the im2col matrix: one per output pixel.
  __host__ __device__ int64_t out_pixels() const { return int64_t(batch) * out_h * out_w; }
  // Columns of the im2col matrix: one per kernel tap and input channel.
  __host__ __device__ int64_t patch() const { return int64_t(kernel_h) * kernel_w * channels; }
  __host__ __device__ bool is_pointwise() const {
    return kernel_h == 1 && kernel_w == 1 && stride == 1 && pad == 0;
  }
};

// One stride phase of a conv's input gradient. With stride s, the input pixels (ih, iw) =
// (row0 + s*i, col0 + s*j), for a fixed (row0, col0) in [0, s)^2, are read only by the kernel taps
// (ky, kx) = (tap_y0 + s*t, tap_x0 + s*u), each through output pixel (oh, ow) =
// (i + shift_y - t, j + shift_x - u): dx at those pixels is one GEMM over those taps alone, with no
// zero entries between strided taps. Stride 1 has one phase: every pixel and every tap.
struct Col2imPhase {
  int row0 = 0, col0 = 0;       // the phase's first input pixel (ih, iw) of each image
  int rows = 0, cols = 0;       // its input pixels of each image along H and W
  int tap_y0 = 0, tap_x0 = 0;   // its first kernel tap (ky, kx)
  int taps_y = 0, taps_x = 0;   // its taps along kh and kw (0 when stride > kernel misses it)
  int shift_y = 0, shift_x = 0; // (oh, ow) = (i + shift_y - t, j + shift_x - u)

  __host__ __device__ int64_t pixels(int batch) const { return int64_t(batch) * rows * cols; }
  __host__ __device__ int taps() const { return taps_y * taps_x; }
  // Whether the phase is every input pixel (stride 1): its GEMM writes dx in place.
  __host__ __device__ bool is_whole(const ConvGeometry& g) const {
    return rows == g.height && cols == g.width;
  }
};

// The phase of conv g's input gradient whose first input pixel is (row0, col0), both < stride.
inline Col2imPhase col2im_phase(const ConvGeometry& g, int row0, int col0) {
  const auto axis = [&](int first, int extent, int kernel, int& count, int& tap0, int& taps,
                        int& shift) {
    count = first < extent ? (extent - first + g.stride - 1) / g.stride : 0;
    tap0 = (first + g.pad) % g.stride; // ky = first + pad - s * oh: the taps of this residue
    taps = tap0 < kernel ? (kernel - tap0 + g.stride - 1) / g.stride : 0;
    shift = (first + g.pad) / g.stride;
  };
  Col2imPhase p;
  p.row0 = row0, p.col0 = col0;
  axis(row0, g.height, g.kernel_h, p.rows, p.tap_y0, p.taps_y, p.shift_y);
  axis(col0, g.width, g.kernel_w, p.cols, p.tap_x0, p.taps_x, p.shift_x);
  return p;
}

// How an operand's values are stored.
enum class OperandKind {
  matrix,     // row-major [rows, cols] used as is
  transposed, // row-major [rows, cols] used as its transpose
  im2col,     // the im2col matrix [out_pixels, kh*kw*Cin] of a conv input x, gathered on the fly
  col2im,     // the col2im matrix [phase pixels, phase taps * Cout] of a conv output gradient dy,
              // gathered on the fly: dx = col2im(dy) @ w_phase [phase taps * Cout, Cin] (conv
              // input gradient, one stride phase at a time)
  normalized, // row-major [rows, cols] used as is, each column batch-normalised as its tiles
              // land in shared memory (GemmOperand::normalization): A, or the wide B of a thin-C
              // GEMM (runs_thin_c_gemm)
  batchnorm_input_grad, // row-major [rows, cols], the gradient dy of a batch norm's output, used
                        // as its transpose, each element replaced by the batch norm's input
                        // gradient as it is read (GemmOperand::input_grad): the wide A of a
                        // thin-C GEMM only (runs_thin_c_gemm)
};

// Which operand pairs a dispatch instantiates kernels for (dispatch_operands): the
// matrix/transposed pairs, a convolution's views (an im2col, col2im or normalised operand), or
// both.
enum class OperandPairs { matrices, conv_views, all };

// The largest M, N, K (and im2col extent) a GEMM takes: the kernels index in int, and their tile
// arithmetic runs up to one block tile (at most 256) past a size.
constexpr int64_t kMaxGemmExtent = INT32_MAX - 256;

// One operand as stored: `rows` x `cols` are the stored (untransposed) sizes.
struct GemmOperand {
  OperandKind kind = OperandKind::matrix;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  ConvGeometry conv; // only for OperandKind::im2col and col2im
  Col2imPhase phase; // only for OperandKind::col2im
  // Only for OperandKind::normalized: the batch norm (and ReLU) the GEMM applies to the operand
  // as it loads it, so that it reads a normalised activation nobody has written. The stored value
  // v in column c (a channel of an NHWC activation viewed as [pixels, C]) becomes
  // batchnorm_normalized(v, gamma[c], beta[c], mean[c], invstd[c], relu) rounded to the operand's
  // dtype — the batch norm kernel's output, bit for bit. The vectors are f32 [cols], 16-byte
  // aligned.
  BatchNormChannels normalization;
  // Only for OperandKind::batchnorm_input_grad (whose batch norm `normalization` also gives): the
  // stored dy in column c becomes the batch norm's dx from it and x (DxChannels::dx in
  // channel_packs.cuh, over `rows` values a channel) rounded to the operand's dtype, what the
  // batch norm's dx kernel would store, bit for bit.
  BatchNormInputGradView input_grad;
};

// A tensor viewed as the row-major matrix [rows, last].
inline GemmOperand matrix_operand(const Tensor& t, bool transposed) {
  const OperandKind kind = transposed ? OperandKind::transposed : OperandKind::matrix;
  return {kind, t.raw(), t.shape().rows(), t.shape().last(), {}, {}, {}, {}};
}

// The activation x viewed as the row-major matrix [rows, channels], batch-normalised as it loads.
inline GemmOperand normalized_operand(const Tensor& x, const BatchNormChannels& normalization) {
  for (const float* p :
       {normalization.gamma, normalization.beta, normalization.mean, normalization.invstd})
    require(p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0, "gemm",
            "a normalised operand needs 16-byte aligned per-channel f32 vectors (internal error)");
  return {OperandKind::normalized, x.raw(), x.shape().rows(), x.shape().last(), {}, {},
          normalization,           {}};
}

// The input gradient of a batch norm over [rows, C], read from its output gradient dy (the
// operand's data) and input x, never materialised: dy viewed as [rows, C] and used transposed.
inline GemmOperand batchnorm_input_grad_operand(const Tensor& dy, const Tensor& x,
                                                const BatchNormChannels& channels,
                                                const Tensor& grad_sums, bool training) {
  GemmOperand op = normalized_operand(dy, channels);
  op.kind = OperandKind::batchnorm_input_grad;
  op.input_grad = {x.raw(), static_cast<const float*>(grad_sums.raw()), training};
  return op;
}

// The im2col matrix of the conv input x, never materialised.
inline GemmOperand im2col_operand(const Tensor& x, const ConvGeometry& conv) {
  return {OperandKind::im2col, x.raw(), conv.out_pixels(), conv.patch(), conv, {}, {}, {}};
}

// One stride phase's col2im matrix of the conv output gradient dy, never materialised.
inline GemmOperand col2im_operand(const Tensor& dy, const ConvGeometry& conv,
                                  const Col2imPhase& phase) {
  return {OperandKind::col2im,
          dy.raw(),
          phase.pixels(conv.batch),
          int64_t(phase.taps()) * conv.out_channels,
          conv,
          phase,
          {},
          {}};
}

// A GEMM whose C is the gradient dy of a batch norm's output (a pointwise conv's input
// gradient, that conv having applied the batch norm as it loaded its input) also sums, per
// column, the terms of the batch norm's backward from dy as stored and the batch norm's input x:
// dy_hat and dy_hat * xhat (batchnorm_grad_terms in common.cuh).
struct BatchNormGradient {
  const void* x = nullptr; // [M, N] in C's dtype: the batch norm's input
  BatchNormChannels channels;
  // f32 on the device, or nullptr (no sums): in GemmArgs [2, N], sum dy_hat (row 0) and
  // sum dy_hat * xhat (row 1); in EpilogueArgs the same per block, [row tiles, 2, N].
  float* sums = nullptr;
};

// The fused epilogue, applied per element in fp32: v = alpha * acc (+ beta * C_old when beta
// != 0; C_old is never read otherwise) (+ bias[col]), then ReLU; stored rounded to C's dtype.
// The packed epilogue (store_tile_packed) also writes for each tile, with column_partials set, the
// (mean, M2) of each column over the block's rows of the values as stored in C. batchnorm_grad is
// the thin-K kernel's (gemm_thin.cu), which adds up those sums as it stores C.
struct EpilogueArgs {
  float alpha = 1.0f;
  float beta = 0.0f;
  const float* bias = nullptr; // f32 [N] on the device, or nullptr
  bool relu = false;
  float* column_partials = nullptr; // f32 [row tiles, 2, N] on the device, or nullptr
  BatchNormGradient batchnorm_grad;
};

struct GemmArgs {
  GemmOperand a, b;            // A and B share ab_dtype
  DType ab_dtype = DType::f32; // f16 or bf16 for the tensor cores, f32 for the SIMT kernel
  void* c = nullptr;
  DType c_dtype = DType::f32; // f32, or A's 16-bit dtype (f32 A and B may give f16 or bf16 C)
  int64_t m = 0, n = 0, k = 0;
  EpilogueArgs epilogue;
  // f32 [2, N] on the device, or nullptr: when set, also written with the per-column mean (row 0)
  // and biased variance (row 1) of C as stored, the statistics a following batch norm needs.
  // The launcher fills epilogue.column_partials itself; it must be left unset here.
  float* column_moments = nullptr;
  // With sums set, also written with the gradient sums of the batch norm whose output gradient C
  // is (BatchNormGradient, sums [2, N]); needs C in A's dtype and no column_moments. The launcher
  // fills epilogue.batchnorm_grad itself; it must be left unset here.
  BatchNormGradient batchnorm_grad;
  // f32 [M] on the device, or nullptr: a thin-C GEMM whose wide operand A (stored [K, M]) is a
  // batch norm's input gradient also adds to it the sum over K of each of A's columns as read (a
  // conv's bias gradient, beside the weight gradient of the same output gradient).
  float* bias_grad = nullptr;
};

// Launch one GEMM on stream(): A and B f16 or bf16 (tensor cores) / f32 (SIMT). Supported operand
// pairs: any of matrix/transposed for both, (im2col, transposed) for the conv forward,
// (transposed, im2col) for the conv weight gradient and (col2im, matrix) for its input gradient;
// and for a pointwise conv whose input is batch-normalised as it loads, (normalized, transposed)
// for the forward (not in v1 and v3), and (transposed, normalized) for a weight gradient that
// runs_thin_c_gemm takes.
// tensor_core_gemm runs the version gemm_version() names, or the one the planner picks for
// `automatic` (gemm_plan.h); a version that cannot run the GEMM (v1 and v3 take plain f16
// matrices only; v4, v5 and bf16 need sm_80) is an error naming it.
void tensor_core_gemm(const GemmArgs& args);
void simt_gemm(const GemmArgs& args);

// The tensor-core GEMM versions (cuda/gemm_v*.cu), each on its own; v1 and v3 take the
// matrix/transposed pairs of f16 only, v2, v4 and v5 f16 and bf16; v4, v5 and bf16 need sm_80.
void gemm_v1_naive(const GemmArgs& args);
void gemm_v2_wmma(const GemmArgs& args);
void gemm_v3_interior(const GemmArgs& args);
void gemm_v4_mma(const GemmArgs& args);
void gemm_v5_multistage(const GemmArgs& args);
// v5's kernels in four parts that compile in parallel, a file each: the matrix/transposed pairs of
// f16 (in gemm_v5_multistage.cu) and of bf16 (gemm_v5_multistage_bf16.cu), and a convolution's
// views of f16 (gemm_v5_conv_views.cu) and of bf16 (gemm_v5_conv_views_bf16.cu).
void gemm_v5_multistage_bf16(const GemmArgs& args);
void gemm_v5_conv_views(const GemmArgs& args);
void gemm_v5_conv_views_bf16(const GemmArgs& args);

// Another tile configuration of a version than the library's, for bench_gemm's sweep: `run`
// launches it alone over the whole C (no split K) for A untransposed and f16 C.
struct GemmCandidate {
  std::string name;
  int smem_bytes = 0;
  void (*run)(const GemmArgs& args) = nullptr;
};
std::vector<GemmCandidate> gemm_v4_sweep();
std::vector<GemmCandidate> gemm_v5_sweep();

// What bench_gemm --kernels reports of each version, to read its machine code with
// bench/gemm_sass.py: the kernel that runs a large GEMM of plain f16 matrices into f16 C (the
// 4096^3 of bench_gemm), its name as c++filt spells it, its threads and its dynamic shared
// memory per block.
struct GemmKernelInfo {
  std::string version, kernel;
  int threads = 0, smem_bytes = 0;
};
GemmKernelInfo gemm_v1_kernel_info();
GemmKernelInfo gemm_v2_kernel_info();
GemmKernelInfo gemm_v3_kernel_info();
GemmKernelInfo gemm_v4_kernel_info();
GemmKernelInfo gemm_v5_kernel_info();

// GEMMs too thin for tensor-core tiles (gemm_thin.cu, is_thin_gemm in gemm_plan.h), of plain
// or transposed matrices; A may also be normalised when N, not K, is what is thin (a last
// layer's few output channels).
inline bool thin_gemm_applies(const GemmArgs& args) {
  const auto plain = [](const GemmOperand& op) {
    return op.kind == OperandKind::matrix || op.kind == OperandKind::transposed;
  };
  const bool a_ok = plain(args.a) || (args.a.kind == OperandKind::normalized && args.k > kThinK);
  return a_ok && plain(args.b) && is_thin_gemm(args.m, args.n, args.k);
}
void thin_gemm(const GemmArgs& args);

// GEMMs whose C is a few rows or columns over a long K (gemm_thin_c.cu, is_thin_c_gemm in
// gemm_plan.h), run when gemm_version() is automatic: A transposed, B untransposed; B may also be
// normalised when it is the wide one (M thin: the weight gradient of a conv with few output
// channels, whose input the conv batch-normalised as it loaded it), and A a batch norm's input
// gradient when it is the wide one (N thin: the weight gradient of a conv with few input channels
// before a batch norm, whose dx it reads unwritten), which bias_grad may also sum.
inline bool runs_thin_c_gemm(const GemmArgs& args) {
  const bool a_wide = args.m > kThinN;
  const bool a_ok = args.a.kind == OperandKind::transposed ||
                    (args.a.kind == OperandKind::batchnorm_input_grad && a_wide);
  const bool b_ok =
      args.b.kind == OperandKind::matrix || (args.b.kind == OperandKind::normalized && !a_wide);
  // bias_grad is the extra partial row only a batch norm's input gradient as A gets
  const bool bias_grad_ok = !args.bias_grad || args.a.kind == OperandKind::batchnorm_input_grad;
  return gemm_version() == GemmVersion::automatic && a_ok && b_ok && bias_grad_ok &&
         is_thin_c_gemm(args.m, args.n, args.k);
}
void thin_c_gemm(const GemmArgs& args);

// Picks the kernel: a thin GEMM on CUDA cores (unless a tensor-core version is forced), else by
// the operands' dtype.
inline void run_gemm(const GemmArgs& args) {
  require(!args.batchnorm_grad.sums || (args.batchnorm_grad.x && !args.column_moments), "gemm",
          "batch norm gradient sums need the batch norm's input x, and no column moments beside "
          "them (internal error)");
  const bool thin_c = runs_thin_c_gemm(args);
  require(thin_c || (!args.bias_grad && args.a.kind != OperandKind::batchnorm_input_grad), "gemm",
          "a batch norm's input gradient as A, and its column sums, are read by the thin-C GEMM "
          "only (internal error)");
  if (thin_c)
    thin_c_gemm(args);
  else if (gemm_version() == GemmVersion::automatic && thin_gemm_applies(args))
    thin_gemm(args);
  else if (is_half_precision(args.ab_dtype))
    tensor_core_gemm(args);
  else
    simt_gemm(args);
}

#if defined(__CUDACC__) || defined(MINAMP_CUDA_EMULATOR)

// ---------------------------------------------------------------------------------------------
// Device-side views of the operands, passed to the kernels by value.

// Division of n in [0, 2^31) by a divisor fixed at launch, as a multiply-high and a shift
// (Granlund and Montgomery's method, as in Hacker's Delight 10-9): with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1, n / d = (mulhi(n, m) + n) >> s. A runtime integer division
// is a ~20-instruction sequence; the gathered operands divide each pixel and tap index twice.
struct FastDivisor {
  int divisor = 1;
  uint32_t multiplier = 1, shift = 0;
};
inline FastDivisor fast_divisor(int divisor) {
  FastDivisor f;
  f.divisor = divisor > 0 ? divisor : 1; // an empty extent: nothing is divided by it
  const uint64_t d = uint64_t(f.divisor);
  while ((uint64_t(1) << f.shift) < d) ++f.shift;
  f.multiplier = uint32_t(((uint64_t(1) << 32) * ((uint64_t(1) << f.shift) - d)) / d + 1);
  return f;
}
__host__ __device__ __forceinline__ int quotient(const FastDivisor& f, int n) {
  const uint32_t high = uint32_t((uint64_t(uint32_t(n)) * f.multiplier) >> 32);
  return int((high + uint32_t(n)) >> f.shift);
}

// The divisors that split a gathered operand's row into its pixel (n, y, x) and its column into
// its tap (ty, tx) and channel: row = (n * rows + y) * cols + x, col = (ty * taps_x + tx) *
// channels + c.
struct GatherDivisors {
  FastDivisor cols, rows, channels, taps_x;
};

// A row-major [rows, cols] matrix in global memory (leading dimension = cols).
template <class T> struct MatrixView {
  const T* data;
  int rows, cols;
  bool vectorizable; // 16-byte chunks of a row are aligned: cols and the base pointer allow it
};

// The im2col matrix of x: row p = output pixel (n, oh, ow), col q = tap (ky, kx, ci); the value
// is x[n, oh*stride - pad + ky, ow*stride - pad + kx, ci], or 0 in the padding.
template <class T> struct Im2colView {
  const T* data; // x [batch, height, width, channels]
  int rows, cols;
  ConvGeometry conv;
  bool vectorizable;       // channels and the base pointer allow 16-byte chunks of one tap
  GatherDivisors divisors; // out_w, out_h, channels, kernel_w
};

// One stride phase of the col2im matrix of dy: row p = input pixel (n, i, j) of the phase, col q =
// its tap (t, u, co); the value is dy[n, oh, ow, co] for the output pixel whose tap reads the
// input pixel, oh = i + shift_y - t and ow = j + shift_x - u (Col2imPhase), or 0 past the
// output's edge. Row p of col2im(dy) @ w_phase[(t, u, co), ci] is therefore the input gradient
// dx[n, row0 + s*i, col0 + s*j, ci].
template <class T> struct Col2imView {
  const T* data; // dy [batch, out_h, out_w, out_channels]
  int rows, cols;
  ConvGeometry conv;
  Col2imPhase phase;
  bool vectorizable;       // out_channels and the base pointer allow 16-byte chunks of one tap
  GatherDivisors divisors; // phase.cols, phase.rows, out_channels, phase.taps_x
};

// A row-major matrix whose columns are batch-normalised as its tiles land in shared memory.
template <class T> struct NormalizedView : MatrixView<T> { BatchNormChannels normalization; };

// Elements of T in one 16-byte cp.async chunk.
template <class T> constexpr int kChunkElems = 16 / int(sizeof(T));

__host__ __device__ inline bool is_aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}
__host__ __device__ inline bool is_aligned32(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 32 == 0;
}

template <class T> MatrixView<T> matrix_view(const GemmOperand& op) {
  const T* data = static_cast<const T*>(op.data);
  return {data, int(op.rows), int(op.cols), op.cols % kChunkElems<T> == 0 && is_aligned16(data)};
}

template <class T> Im2colView<T> im2col_view(const GemmOperand& op) {
  const T* data = static_cast<const T*>(op.data);
  const ConvGeometry& g = op.conv;
  return {data,
          int(op.rows),
          int(op.cols),
          g,
          g.channels % kChunkElems<T> == 0 && is_aligned16(data),
          {fast_divisor(g.out_w), fast_divisor(g.out_h), fast_divisor(g.channels),
           fast_divisor(g.kernel_w)}};
}

template <class T> NormalizedView<T> normalized_view(const GemmOperand& op) {
  return {matrix_view<T>(op), op.normalization};
}

template <class T> Col2imView<T> col2im_view(const GemmOperand& op) {
  const T* data = static_cast<const T*>(op.data);
  const ConvGeometry& g = op.conv;
  const Col2imPhase& p = op.phase;
  return {data,
          int(op.rows),
          int(op.cols),
          g,
          p,
          g.out_channels % kChunkElems<T> == 0 && is_aligned16(data),
          {fast_divisor(p.cols), fast_divisor(p.rows), fast_divisor(g.out_channels),
           fast_divisor(p.taps_x)}};
}

// Maps OperandKind to the view type a kernel is instantiated with, and whether it is used
// transposed. The gathered views (im2col, col2im) and the normalised one are never transposed.
// Elem is the element type.
template <class T, OperandKind kKind> struct OperandTraits {
  using Elem = T;
  using View = MatrixView<T>;
  static constexpr bool kTransposed = kKind == OperandKind::transposed;
  static View view(const GemmOperand& op) { return matrix_view<T>(op); }
};
template <class T> struct OperandTraits<T, OperandKind::im2col> {
  using Elem = T;
  using View = Im2colView<T>;
  static constexpr bool kTransposed = false;
  static View view(const GemmOperand& op) { return im2col_view<T>(op); }
};
template <class T> struct OperandTraits<T, OperandKind::normalized> {
  using Elem = T;
  using View = NormalizedView<T>;
  static constexpr bool kTransposed = false;
  static View view(const GemmOperand& op) { return normalized_view<T>(op); }
};
template <class T> struct OperandTraits<T, OperandKind::col2im> {
  using Elem = T;
  using View = Col2imView<T>;
  static constexpr bool kTransposed = false;
  static View view(const GemmOperand& op) { return col2im_view<T>(op); }
};

// Whether A or B of `args` is one of a convolution's views (im2col, col2im, normalised).
inline bool uses_conv_view(const GemmArgs& args) {
  const auto plain = [](OperandKind kind) {
    return kind == OperandKind::matrix || kind == OperandKind::transposed;
  };
  return !plain(args.a.kind) || !plain(args.b.kind);
}

// Calls Launch<OperandTraits<T, kind of A>, OperandTraits<T, kind of B>>::run(args) for the
// supported operand pairs among kPairs; throws Error naming `kernel` otherwise.
template <class T, template <class, class> class Launch, OperandPairs kPairs = OperandPairs::all>
void dispatch_operands(const GemmArgs& args, const char* kernel) {
  using K = OperandKind;
  const K a = args.a.kind, b = args.b.kind;
  if constexpr (kPairs != OperandPairs::conv_views) {
    if (a == K::matrix && b == K::matrix)
      return Launch<OperandTraits<T, K::matrix>, OperandTraits<T, K::matrix>>::run(args);
    if (a == K::matrix && b == K::transposed)
      return Launch<OperandTraits<T, K::matrix>, OperandTraits<T, K::transposed>>::run(args);
    if (a == K::transposed && b == K::matrix)
      return Launch<OperandTraits<T, K::transposed>, OperandTraits<T, K::matrix>>::run(args);
    if (a == K::transposed && b == K::transposed)
      return Launch<OperandTraits<T, K::transposed>, OperandTraits<T, K::transposed>>::run(args);
  }
  if constexpr (kPairs != OperandPairs::matrices) {
    if (a == K::im2col && b == K::transposed)
      return Launch<OperandTraits<T, K::im2col>, OperandTraits<T, K::transposed>>::run(args);
    if (a == K::transposed && b == K::im2col)
      return Launch<OperandTraits<T, K::transposed>, OperandTraits<T, K::im2col>>::run(args);
    if (a == K::col2im && b == K::matrix)
      return Launch<OperandTraits<T, K::col2im>, OperandTraits<T, K::matrix>>::run(args);
    if (a == K::normalized && b == K::transposed)
      return Launch<OperandTraits<T, K::normalized>, OperandTraits<T, K::transposed>>::run(args);
    throw Error(cat(kernel, ": unsupported pair of operand kinds (internal error)"));
  } else {
    throw Error(cat(kernel, ": takes plain (or transposed) matrices only, not a convolution's "
                            "gathered im2col/col2im operand or a normalised one"));
  }
}

// dispatch_operands for a tensor-core version that takes f16 and bf16 operands (args.ab_dtype).
template <template <class, class> class Launch>
void dispatch_half_operands(const GemmArgs& args, const char* kernel) {
  visit_half_precision(args.ab_dtype, kernel, [&](auto type) {
    dispatch_operands<typename decltype(type)::type, Launch>(args, kernel);
  });
}

// The most dynamic shared memory one block may opt in to on the current device (read once).
inline int max_dynamic_smem() {
  static const int bytes = [] {
    int device = 0, value = 0;
    CUDA_CHECK(cudaGetDevice(&device), "gemm: cudaGetDevice");
    CUDA_CHECK(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
               "gemm: reading the shared-memory limit");
    return value;
  }();
  return bytes;
}

// The most dynamic shared memory a block can opt in to on any GPU that runs the machine code being
// compiled: 64 KB at sm_75; 163 KB at sm_80 (the A100; the sm_86 and sm_89 GPUs that also run sm_80
// code have 99 KB); 227 KB from sm_90 on (arch_can_launch). The host pass and the emulator have no
// limit.
__host__ __device__ constexpr int arch_max_dynamic_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  return 64 * 1024;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return 163 * 1024;
#elif defined(__CUDA_ARCH__)
  return 227 * 1024;
#else
  return std::numeric_limits<int>::max();
#endif
}

// Whether a GPU that runs the machine code being compiled can launch a GEMM kernel whose block
// needs `smem_bytes` of dynamic shared memory (and, with `mma_sync`, the mma.sync instructions of
// kMmaSyncCapability). Where it cannot, the kernel compiles to a trap: the launcher never runs it
// on such a GPU (max_dynamic_smem(), plan_version), and the build skips code that could not run.
__host__ __device__ constexpr bool arch_can_launch(int smem_bytes, bool mma_sync) {
#if defined(__CUDA_ARCH__)
  return smem_bytes <= arch_max_dynamic_smem() &&
         (!mma_sync || __CUDA_ARCH__ >= kMmaSyncCapability * 10);
#else
  (void)smem_bytes, (void)mma_sync;
  return true;
#endif
}

// The grid of BM x BN tiles over C times the K slices: x walks M, y walks N (y is limited to
// 65535), z walks the slices of a split K.
inline dim3 tile_grid(const GemmArgs& args, int bm, int bn, int splits) {
  const int64_t tiles_n = (args.n + bn - 1) / bn;
  require(tiles_n <= 65535, "gemm", "N = ", args.n, " needs more than 65535 column tiles of ", bn);
  return dim3(unsigned((args.m + bm - 1) / bm), unsigned(tiles_n), unsigned(splits));
}

// Raises a kernel's dynamic shared-memory limit when it needs more than the default 48 KB.
template <class Kernel> void allow_dynamic_smem(Kernel kernel, int bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
               "gemm: raising the dynamic shared-memory limit");
}

// ---------------------------------------------------------------------------------------------
// cp.async (sm_80+): 16-byte asynchronous global -> shared copies, grouped and awaited. Before
// sm_80 the copy is a plain 16-byte load and store, and the group calls do nothing. The CPU
// emulator keeps the copies asynchronous (emulator.h), so the pipeline's waits are checked there.

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
#elif defined(MINAMP_CUDA_EMULATOR)
  ::minamp::emu::cp_async(smem, gmem, 16);
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(MINAMP_CUDA_EMULATOR)
  ::minamp::emu::cp_async_commit();
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#elif defined(MINAMP_CUDA_EMULATOR)
  ::minamp::emu::cp_async_wait(kPending);
#endif
}

template <class T> __device__ __forceinline__ T zero_value();
template <> __device__ __forceinline__ float zero_value<float>() { return 0.0f; }
template <> __device__ __forceinline__ __half zero_value<__half>() { return __float2half_rn(0.0f); }
template <> __device__ __forceinline__ __nv_bfloat16 zero_value<__nv_bfloat16>() {
  return __float2bfloat16_rn(0.0f);
}

// ---------------------------------------------------------------------------------------------
// 16 bytes of C or of an operand tile: 8 halves (f16 or bf16) or 4 floats, widened to / rounded
// from fp32 (p 16-byte aligned).
template <class CT> constexpr int kPackElems = 16 / int(sizeof(CT));
__device__ __forceinline__ void load_pack16(const float* p, float (&v)[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
// (A half2 travels through __half2_raw and 32-bit words, not a pointer cast: the cast would
// break aliasing rules that the emulator's host compiler enforces.)
__device__ __forceinline__ void load_pack16(const __half* p, float (&v)[8]) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2_raw raw;
    raw.x = static_cast<unsigned short>(words[i] & 0xffffu);
    raw.y = static_cast<unsigned short>(words[i] >> 16);
    const float2 f = __half22float2(__half2(raw));
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load_pack16(const __nv_bfloat16* p, float (&v)[8]) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __nv_bfloat162_raw raw;
    raw.x = static_cast<unsigned short>(words[i] & 0xffffu);
    raw.y = static_cast<unsigned short>(words[i] >> 16);
    const float2 f = __bfloat1622float2(__nv_bfloat162(raw));
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
// A pack of C's dtype rounded from its fp32 values (round4: round to nearest even), as the Stored4
// quarters of the 16 bytes one access moves: round_pack rounds, store_rounded_pack writes,
// widen_pack gives the values as stored, store_pack16 rounds and writes. A kernel that also uses
// the values as stored rounds each once.
template <class T> struct RoundedPack { Stored4<T> quarter[kPackElems<T> / 4]; };
template <class T>
__device__ __forceinline__ RoundedPack<T> round_pack(const float (&v)[kPackElems<T>]) {
  RoundedPack<T> pack;
#pragma unroll
  for (int q = 0; q < kPackElems<T> / 4; ++q)
    pack.quarter[q] = round4<T>(Float4{{v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]}});
  return pack;
}
template <class T>
__device__ __forceinline__ void widen_pack(const RoundedPack<T>& pack, float (&v)[kPackElems<T>]) {
#pragma unroll
  for (int q = 0; q < kPackElems<T> / 4; ++q) {
    const Float4 values = widen4<T>(pack.quarter[q]);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[4 * q + e] = values.v[e];
  }
}
__device__ __forceinline__ void store_rounded_pack(float* p, const RoundedPack<float>& pack) {
  store4_stored(p, 0, pack.quarter[0]);
}
template <class T>
__device__ __forceinline__ void store_rounded_pack(T* p, const RoundedPack<T>& pack) {
  const uint2 low = pack.quarter[0], high = pack.quarter[1];
  *reinterpret_cast<uint4*>(p) = make_uint4(low.x, low.y, high.x, high.y);
}
template <class T>
__device__ __forceinline__ void store_pack16(T* p, const float (&v)[kPackElems<T>]) {
  store_rounded_pack(p, round_pack<T>(v));
}

// Shared-memory tiles. A tile keeps the orientation the operand has in global memory, so every
// copy reads contiguous 16-byte chunks; the MMA side adapts (row/col-major fragments, or which
// of a thread's rows are contiguous). For the A operand (kOuter = BM) and B (kOuter = BN):
//   k contiguous (A untransposed or im2col, B transposed): [kOuter][BK + kPad]
//   outer contiguous (A transposed, B untransposed or im2col): [BK][kOuter + kPad]
// kPad (16 bytes) shifts consecutive rows across banks.
template <class T, bool kKContiguous_, int kOuter_, int kBK_> struct TileShape {
  static constexpr bool kKContiguous = kKContiguous_;
  static constexpr int kOuter = kOuter_, kBK = kBK_;
  static constexpr int kPad = kChunkElems<T>;
  static constexpr int kRows = kKContiguous ? kOuter : kBK;
  static constexpr int kCols = kKContiguous ? kBK : kOuter;
  static constexpr int kLd = kCols + kPad;
  static constexpr int kElems = kRows * kLd;
  // Offset of element (outer index, k index) in the tile.
  __device__ static int offset(int outer, int k) {
    return kKContiguous ? outer * kLd + k : k * kLd + outer;
  }
};

// The shared memory of a tensor-core GEMM configuration Cfg (BM, BN, BK, STAGES, kStagingLd) for
// one pair of operands OpA, OpB (OperandTraits: their element type T, f16 or bf16, and
// orientations): STAGES stages of [A tile, B tile] of T for the main loop, reused afterwards as
// the epilogue's fp32 staging tile [BM][kStagingLd].
template <class Cfg, class OpA, class OpB> struct GemmSmem {
  using T = typename OpA::Elem;
  using TileA = TileShape<T, !OpA::kTransposed, Cfg::BM, Cfg::BK>;
  using TileB = TileShape<T, OpB::kTransposed, Cfg::BN, Cfg::BK>;
  static constexpr int kStageElems = TileA::kElems + TileB::kElems;
  static constexpr int kPipelineBytes = Cfg::STAGES * kStageElems * int(sizeof(T));
  static constexpr int kStagingBytes = Cfg::BM * Cfg::kStagingLd * int(sizeof(float));
  static constexpr int kBytes = kPipelineBytes > kStagingBytes ? kPipelineBytes : kStagingBytes;
};

// Offset in the matrix's data of an element inside it.
template <class T>
__device__ __forceinline__ int64_t element_offset(const MatrixView<T>& v, int row, int col) {
  return int64_t(row) * v.cols + col;
}

// Where a gathered operand's element (row, col) is read from, as what its row and its column each
// contribute: the row's pixel starts at (y, x) of the source image [batch, height, width,
// channels] (x for im2col, dy for col2im), the column's tap moves that by (dy, dx) and picks a
// channel; the element is the source's value at (y + dy, x + dx) and that channel, at offset
// pixel.offset + tap.offset, or zero outside the image. Offsets are taken modulo 2^32: either part
// alone may lie outside the source (a pixel in the padding, a tap's move back), their sum for an
// element inside it is its offset (the source holds at most kMaxGemmExtent elements).
struct GatherPixel {
  int y, x;
  uint32_t offset;
};
struct GatherTap {
  int dy, dx;
  uint32_t offset;
};
// A coordinate no pixel or tap move brings into an image: given to a row or column past the matrix.
constexpr int kOutsideImage = -(1 << 30);

__device__ __forceinline__ uint32_t pixel_offset(int n, int y, int x, int height, int width,
                                                 int channels) {
  return ((uint32_t(n) * uint32_t(height) + uint32_t(y)) * uint32_t(width) + uint32_t(x)) *
         uint32_t(channels);
}

// im2col: row = output pixel (n, oh, ow), which reads x from (oh*stride - pad, ow*stride - pad);
// col = tap (ky, kx) and input channel ci.
template <class T>
__device__ __forceinline__ GatherPixel gather_pixel(const Im2colView<T>& v, int row) {
  const ConvGeometry& g = v.conv;
  const int q = quotient(v.divisors.cols, row), ow = row - q * g.out_w;
  const int n = quotient(v.divisors.rows, q), oh = q - n * g.out_h;
  const int y = oh * g.stride - g.pad, x = ow * g.stride - g.pad;
  return {y, x, pixel_offset(n, y, x, g.height, g.width, g.channels)};
}
template <class T>
__device__ __forceinline__ GatherTap gather_tap(const Im2colView<T>& v, int col) {
  const ConvGeometry& g = v.conv;
  const int tap = quotient(v.divisors.channels, col), ci = col - tap * g.channels;
  const int ky = quotient(v.divisors.taps_x, tap), kx = tap - ky * g.kernel_w;
  return {ky, kx, (uint32_t(ky) * uint32_t(g.width) + uint32_t(kx)) * uint32_t(g.channels) + ci};
}
template <class T> __device__ __forceinline__ int source_height(const Im2colView<T>& v) {
  return v.conv.height;
}
template <class T> __device__ __forceinline__ int source_width(const Im2colView<T>& v) {
  return v.conv.width;
}

// col2im: row = input pixel (n, i, j) of the phase, which reads dy from (i + shift_y, j + shift_x)
// backwards; col = tap (t, u), which moves that by (-t, -u), and output channel co.
template <class T>
__device__ __forceinline__ GatherPixel gather_pixel(const Col2imView<T>& v, int row) {
  const ConvGeometry& g = v.conv;
  const Col2imPhase& p = v.phase;
  const int q = quotient(v.divisors.cols, row), j = row - q * p.cols;
  const int n = quotient(v.divisors.rows, q), i = q - n * p.rows;
  const int y = i + p.shift_y, x = j + p.shift_x;
  return {y, x, pixel_offset(n, y, x, g.out_h, g.out_w, g.out_channels)};
}
template <class T>
__device__ __forceinline__ GatherTap gather_tap(const Col2imView<T>& v, int col) {
  const ConvGeometry& g = v.conv;
  const int tap = quotient(v.divisors.channels, col), co = col - tap * g.out_channels;
  const int t = quotient(v.divisors.taps_x, tap), u = tap - t * v.phase.taps_x;
  return {-t, -u,
          (0u - uint32_t(t) * uint32_t(g.out_w) - uint32_t(u)) * uint32_t(g.out_channels) + co};
}
template <class T> __device__ __forceinline__ int source_height(const Col2imView<T>& v) {
  return v.conv.out_h;
}
template <class T> __device__ __forceinline__ int source_width(const Col2imView<T>& v) {
  return v.conv.out_w;
}

// Whether the tap's move keeps the pixel inside the source image.
__device__ __forceinline__ bool gathers_inside(const GatherPixel& pixel, const GatherTap& tap,
                                               int height, int width) {
  return uint32_t(pixel.y + tap.dy) < uint32_t(height) &&
         uint32_t(pixel.x + tap.dx) < uint32_t(width);
}

// Offset in the source of gathered element (row, col), or -1 when it reads zero.
template <class View>
__device__ __forceinline__ int64_t gathered_offset(const View& v, int row, int col) {
  const GatherPixel pixel = gather_pixel(v, row);
  const GatherTap tap = gather_tap(v, col);
  if (!gathers_inside(pixel, tap, source_height(v), source_width(v))) return -1;
  return int64_t(pixel.offset + tap.offset);
}
template <class T>
__device__ __forceinline__ int64_t element_offset(const Im2colView<T>& v, int row, int col) {
  return gathered_offset(v, row, col);
}
template <class T>
__device__ __forceinline__ int64_t element_offset(const Col2imView<T>& v, int row, int col) {
  return gathered_offset(v, row, col);
}

// Copies the [ROWS, COLS] block at (row0, col0) of a row-major matrix, or of a conv's im2col or
// col2im matrix gathered on the fly, into `tile` (row stride tile_ld), with zeros outside the
// matrix and in the padding. Whole in-bounds chunks of a view whose rows are 16-byte aligned go
// by cp.async (a gathered chunk then lies inside one tap: 16 contiguous bytes of x or dy, or all
// zeros); a chunk that straddles the edge, or any chunk of a view that is not aligned, goes
// element by element (plain loads, visible after the next __syncthreads like the cp.async data).
template <int ROWS, int COLS, int THREADS, class T, class View>
__device__ __forceinline__ void load_tile(T* tile, int tile_ld, const View& src, int row0,
                                          int col0) {
  constexpr int V = kChunkElems<T>;
  constexpr int kChunksPerRow = COLS / V;
  static_assert(COLS % V == 0, "tile width must be whole 16-byte chunks");
  for (int chunk = threadIdx.x; chunk < ROWS * kChunksPerRow; chunk += THREADS) {
    const int r = chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * V;
    const int row = row0 + r, col = col0 + c;
    T* dst = tile + r * tile_ld + c;
    const bool row_in = row < src.rows;
    if (row_in && src.vectorizable && col + V <= src.cols) {
      const int64_t at = element_offset(src, row, col);
      if (at >= 0)
        cp_async16(dst, src.data + at);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    } else {
      for (int e = 0; e < V; ++e) {
        const int64_t at = row_in && col + e < src.cols ? element_offset(src, row, col + e) : -1;
        dst[e] = at >= 0 ? src.data[at] : zero_value<T>();
      }
    }
  }
}

// Loads the tile of one operand for the k-step starting at k0; `outer0` is the tile's first row
// of C (A operand) or column of C (B operand).
template <class Tile, int THREADS, class View, class T>
__device__ __forceinline__ void load_operand_tile(T* tile, const View& view, int outer0, int k0) {
  if constexpr (Tile::kKContiguous)
    load_tile<Tile::kRows, Tile::kCols, THREADS>(tile, Tile::kLd, view, outer0, k0);
  else
    load_tile<Tile::kRows, Tile::kCols, THREADS>(tile, Tile::kLd, view, k0, outer0);
}

// Batch-normalises, in place, the chunks of the [ROWS, COLS] block at (row0, col0) that this thread
// copied into `tile` (load_tile: the same chunks, the same bounds), once they have landed; the
// zeros outside the matrix stay zeros. A whole chunk is 16 bytes of one row, so its channels (the
// matrix's columns) are consecutive and their parameters are read as 16-byte packs. Where a row's
// chunks divide the threads, every chunk of a thread covers the same channels
// (normalize_tile_columns): their parameters are read once, not once per chunk.
template <int ROWS, int COLS, int THREADS, class T>
__device__ __forceinline__ bool
normalize_tile_columns(T* tile, int tile_ld, const NormalizedView<T>& src, int row0, int col0) {
  constexpr int V = kChunkElems<T>;
  constexpr int kChunksPerRow = COLS / V;
  constexpr int kRowStep = THREADS / kChunksPerRow; // rows between a thread's chunks
  const int c = int(threadIdx.x) % kChunksPerRow * V, col = col0 + c;
  if (!src.vectorizable || col + V > src.cols) return false;
  const BatchNormChannels& nz = src.normalization;
  const int rows = min(ROWS, src.rows - row0);
  // 4 channels at a time: their 16 parameters stay in registers over the rows (all V of them
  // would be 32 more registers, past what the WMMA kernels have beside their accumulators); the
  // rows' loop is unrolled only in blocks of 256 threads (unrolled, ptxas spills v2's 64x64
  // tiles). The emulator's host compiler ignores the pragma, hence maybe_unused.
  [[maybe_unused]] constexpr int kUnrollRows = THREADS >= 256 ? 8 : 1;
#pragma unroll
  for (int q = 0; q < V; q += 4) {
    const Float4 gamma = load4(nz.gamma, col + q), beta = load4(nz.beta, col + q),
                 mean = load4(nz.mean, col + q), invstd = load4(nz.invstd, col + q);
#pragma unroll kUnrollRows
    for (int r = int(threadIdx.x) / kChunksPerRow; r < rows; r += kRowStep) {
      T* values = tile + r * tile_ld + c + q;
      Float4 v = load4(values, 0);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        v.v[e] =
            batchnorm_normalized(v.v[e], gamma.v[e], beta.v[e], mean.v[e], invstd.v[e], nz.relu);
      store4(values, 0, v);
    }
  }
  return true;
}
template <int ROWS, int COLS, int THREADS, class T>
__device__ __forceinline__ void normalize_tile(T* tile, int tile_ld, const NormalizedView<T>& src,
                                               int row0, int col0) {
  constexpr int V = kChunkElems<T>;
  constexpr int kChunksPerRow = COLS / V;
  if constexpr (THREADS % kChunksPerRow == 0)
    if (normalize_tile_columns<ROWS, COLS, THREADS>(tile, tile_ld, src, row0, col0)) return;
  const BatchNormChannels& nz = src.normalization;
  for (int chunk = threadIdx.x; chunk < ROWS * kChunksPerRow; chunk += THREADS) {
    const int r = chunk / kChunksPerRow, c = (chunk % kChunksPerRow) * V;
    const int row = row0 + r, col = col0 + c;
    if (row >= src.rows) continue;
    T* values = tile + r * tile_ld + c;
    if (src.vectorizable && col + V <= src.cols) {
      float v[V], gamma[4], beta[4], mean[4], invstd[4];
      load_pack16(values, v);
#pragma unroll
      for (int q = 0; q < V; q += 4) {
        load_pack16(nz.gamma + col + q, gamma);
        load_pack16(nz.beta + col + q, beta);
        load_pack16(nz.mean + col + q, mean);
        load_pack16(nz.invstd + col + q, invstd);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          v[q + e] = batchnorm_normalized(v[q + e], gamma[e], beta[e], mean[e], invstd[e], nz.relu);
      }
      store_pack16(values, v);
    } else {
      for (int e = 0; e < V && col + e < src.cols; ++e) {
        const int ch = col + e;
        store_f(values, e,
                batchnorm_normalized(load_f(values, e), nz.gamma[ch], nz.beta[ch], nz.mean[ch],
                                     nz.invstd[ch], nz.relu));
      }
    }
  }
}

// normalize_tile for a [ROWS, COLS] tile wholly inside a vectorizable matrix (InteriorTileLoader's,
// in blocks of at least 256 threads): every row is there and a thread's chunks share their
// channels, so the loop needs no bound and no branch. Unrolled whole it is one basic block, which
// multistage_loop places among a k-step's MMAs rather than before the barrier where every warp
// waits. A thread's chunk of V channels goes in kParts parts of V / kParts (a multiple of 4): this
// call normalises part `part` of it (4 rows of 4 channels on v5's 128x64 f16 A tiles, in 2 parts;
// `part` a constant once the caller's loop is unrolled).
template <int ROWS, int COLS, int THREADS, int kParts, class T>
__device__ __forceinline__ void
normalize_interior_tile(T* tile, int tile_ld, const BatchNormChannels& nz, int col0, int part) {
  constexpr int V = kChunkElems<T>;
  constexpr int kChunksPerRow = COLS / V;
  constexpr int kRowStep = THREADS / kChunksPerRow; // rows between a thread's chunks
  static_assert(THREADS % kChunksPerRow == 0 && ROWS % kRowStep == 0,
                "every thread normalises whole chunks of the same channels in every row");
  static_assert(V % (4 * kParts) == 0, "parts of whole 4-channel groups");
  const int c = int(threadIdx.x) % kChunksPerRow * V, col = col0 + c;
  T* first = tile + int(threadIdx.x) / kChunksPerRow * tile_ld + c;
  const float floor = relu_floor(nz.relu);
#pragma unroll
  for (int q = part * V / kParts; q < (part + 1) * V / kParts; q += 4) {
    const Float4 gamma = load4(nz.gamma, col + q), beta = load4(nz.beta, col + q),
                 mean = load4(nz.mean, col + q), invstd = load4(nz.invstd, col + q);
#pragma unroll
    for (int r = 0; r < ROWS; r += kRowStep) {
      Float4 v = load4(first + r * tile_ld, q);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        v.v[e] = batchnorm_normalized(v.v[e], gamma.v[e], beta.v[e], mean.v[e], invstd.v[e], floor);
      store4(first + r * tile_ld, q, v);
    }
  }
}

// What a loader does to the tile of one operand for the k-step at k0 once this thread's copies of
// it have landed, before the barrier that lets the warps read it: a normalised operand is
// normalised in place (normalize_tile); the other views are used as copied.
template <class Tile, int THREADS, class View, class T>
__device__ __forceinline__ void finish_operand_tile(T*, const View&, int, int) {}
template <class Tile, int THREADS, class T>
__device__ __forceinline__ void finish_operand_tile(T* tile, const NormalizedView<T>& view,
                                                    int outer0, int k0) {
  static_assert(Tile::kKContiguous, "a normalised operand is A, row-major: its tiles are [M][K]");
  normalize_tile<Tile::kRows, Tile::kCols, THREADS>(tile, Tile::kLd, view, outer0, k0);
}

// This block's share of a GEMM: the first row m0 and column n0 of its BM x BN tile of C (grid.x
// walks M, grid.y walks N) and its slice [k_begin, k_end) of K (split K, gemm_plan.h: grid.z
// walks the slices, and block_share moves c to the slice's own [M, N] partial C).
struct BlockShare {
  int m0, n0, k_begin, k_end;
};
template <class Cfg, class CT>
__device__ __forceinline__ BlockShare block_share(int m, int n, int k, int k_per_split, CT*& c) {
  c += blockIdx.z * int64_t(m) * n;
  const int k_begin = blockIdx.z * k_per_split;
  const int k_end = int(min(int64_t(k), int64_t(k_begin) + k_per_split)); // no int overflow
  return {int(blockIdx.x) * Cfg::BM, int(blockIdx.y) * Cfg::BN, k_begin, k_end};
}

// The multi-stage cp.async main loop shared by the GEMM kernels: STAGES rotating shared buffers
// of [A tile, B tile] (Smem::kStageElems each) over `k_tiles` K tiles. Tiles 0 .. STAGES-2 are put
// in flight first, one commit group each; each iteration waits for tile kt, finishes it
// (load.finish), fills tile kt + STAGES - 1 into the buffer tile kt-1 used (load_a(tile, kt) and
// load_b(tile, kt) issue the copies of one operand's tile), and calls consume(tile_a, tile_b) on
// tile kt. Ends with every group drained: the caller may reuse the buffers after a __syncthreads.
template <class Cfg, class Smem, class T, class LoadA, class LoadB, class Consume>
__device__ __forceinline__ void gemm_pipeline_with(T* smem, int k_tiles, LoadA&& load_a,
                                                   LoadB&& load_b, Consume&& consume) {
  using TileA = typename Smem::TileA;
  auto stage_a = [&](int s) { return smem + s * Smem::kStageElems; };
  auto stage_b = [&](int s) { return smem + s * Smem::kStageElems + TileA::kElems; };
  auto load_stage = [&](int s, int k_tile) {
    load_a(stage_a(s), k_tile);
    load_b(stage_b(s), k_tile);
  };
#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < k_tiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<Cfg::STAGES - 2>(); // this thread's copies of tile kt have landed
    load_a.finish(stage_a(kt % Cfg::STAGES), kt);
    load_b.finish(stage_b(kt % Cfg::STAGES), kt);
    __syncthreads(); // everyone's have, and tile kt-1 is no longer read
    const int next = kt + Cfg::STAGES - 1;
    if (next < k_tiles) load_stage(next % Cfg::STAGES, next);
    cp_async_commit();
    const int s = kt % Cfg::STAGES;
    consume(static_cast<const T*>(stage_a(s)), static_cast<const T*>(stage_b(s)));
  }
  cp_async_wait<0>(); // only empty groups can remain
}

// The number of BK tiles of a block's share of K.
template <class Cfg> __device__ __forceinline__ int share_k_tiles(const BlockShare& share) {
  return (share.k_end - share.k_begin + Cfg::BK - 1) / Cfg::BK;
}

// The plain loader of one operand's tiles: load_operand_tile, every chunk's address and bounds
// worked out on each k-step. Called as load(tile, k_tile) for the k_tile-th BK tile of a block's
// share of K (from k_begin), and as load.finish(tile, k_tile) once this thread's copies of that
// tile have landed (finish_operand_tile); `outer0` is the block's first row of C (A) or column
// (B).
template <class Tile, int kThreads, class View> struct PlainTileLoader {
  const View& view;
  int outer0, k_begin;
  template <class T> __device__ __forceinline__ void operator()(T* tile, int k_tile) const {
    load_operand_tile<Tile, kThreads>(tile, view, outer0, k_begin + k_tile * Tile::kBK);
  }
  static constexpr bool kFinishesInStep = false;
  template <class T> __device__ __forceinline__ void finish(T* tile, int k_tile) const {
    finish_operand_tile<Tile, kThreads>(tile, view, outer0, k_begin + k_tile * Tile::kBK);
  }
};

// gemm_pipeline_with the plain loaders over this block's share of K (from k_begin, a multiple of
// BK, to k_end) for its C tile at (m0, n0). A k_end inside the matrix must be a multiple of BK
// (split-K slices are whole tiles); past K the loaders read zeros.
template <class Cfg, class Smem, class ViewA, class ViewB, class T, class Consume>
__device__ __forceinline__ void gemm_pipeline(T* smem, const ViewA& a, const ViewB& b,
                                              const BlockShare& share, Consume&& consume) {
  const PlainTileLoader<typename Smem::TileA, Cfg::kThreads, ViewA> load_a{a, share.m0,
                                                                           share.k_begin};
  const PlainTileLoader<typename Smem::TileB, Cfg::kThreads, ViewB> load_b{b, share.n0,
                                                                           share.k_begin};
  gemm_pipeline_with<Cfg, Smem>(smem, share_k_tiles<Cfg>(share), load_a, load_b, consume);
}

// The loader of v3 and later for the tiles of one plain-matrix operand (View MatrixView<T>) or
// normalised one (NormalizedView<T>), in a block whose tiles all lie wholly inside the matrix (see
// whole_tiles_inside): each thread owns the same chunks of every tile, so their addresses are
// worked out once per block and a k-step moves them by BK elements (k contiguous) or BK rows
// (outer contiguous) — one multiply-add per tile, no bounds. finish(tile, k_tile) normalises a
// normalised operand's tile once this thread's copies have landed (finish_operand_tile).
template <class Tile, int kThreads, class T, class View = MatrixView<T>> struct InteriorTileLoader {
  static constexpr int kChunksPerRow = Tile::kCols / kChunkElems<T>;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow; // rows one pass of threads copies
  static constexpr int kPasses = Tile::kRows / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && Tile::kRows % kRowsPerPass == 0,
                "every thread copies whole chunks of the same rows of each tile");

  const View& view;
  int outer0, k_begin;
  const T* first;      // this thread's first chunk in the tile at k = k_begin
  int64_t pass_stride; // elements between the chunks of consecutive passes
  int64_t tile_stride; // elements one k-step moves the chunks by
  int tile_first;      // the offset of its first chunk in the tile

  __device__ __forceinline__ InteriorTileLoader(const View& v, int outer0_, int k_begin_)
      : view(v), outer0(outer0_), k_begin(k_begin_) {
    const int r = int(threadIdx.x) / kChunksPerRow;
    const int c = int(threadIdx.x) % kChunksPerRow * kChunkElems<T>;
    const int row = Tile::kKContiguous ? outer0 + r : k_begin + r;
    const int col = Tile::kKContiguous ? k_begin + c : outer0 + c;
    first = v.data + int64_t(row) * v.cols + col;
    pass_stride = int64_t(kRowsPerPass) * v.cols;
    tile_stride = Tile::kKContiguous ? Tile::kBK : int64_t(Tile::kBK) * v.cols;
    tile_first = r * Tile::kLd + c;
  }

  __device__ __forceinline__ void operator()(T* tile, int k_tile) const {
    const T* src = first + k_tile * tile_stride;
#pragma unroll
    for (int p = 0; p < kPasses; ++p)
      cp_async16(tile + tile_first + p * kRowsPerPass * Tile::kLd, src + p * pass_stride);
  }
  // Whether finish is normalize_interior_tile, branch-free, in kFinishParts parts that
  // multistage_loop runs among the MMAs of successive k-steps (finish_part): a normalised operand
  // in a block of at least 256 threads (v5's 128x256 tiles; the blocks of 128 threads, v4's and
  // v5's smaller tiles, keep normalize_tile before the barrier).
  static constexpr bool kFinishesInStep =
      std::is_same_v<View, NormalizedView<T>> && kThreads >= 256;
  static constexpr int kFinishParts = kChunkElems<T> / 4; // 4 channels a part
  __device__ __forceinline__ void finish_part(T* tile, int k_tile, int part) const {
    static_assert(kFinishesInStep && Tile::kKContiguous, "a normalised operand is A, [M][K]");
    normalize_interior_tile<Tile::kRows, Tile::kCols, kThreads, kFinishParts>(
        tile, Tile::kLd, view.normalization, k_begin + k_tile * Tile::kBK, part);
  }
  __device__ __forceinline__ void finish(T* tile, int k_tile) const {
    if constexpr (kFinishesInStep) {
#pragma unroll
      for (int part = 0; part < kFinishParts; ++part) finish_part(tile, k_tile, part);
    } else
      finish_operand_tile<Tile, kThreads>(tile, view, outer0, k_begin + k_tile * Tile::kBK);
  }
};

// The interior loader of a gathered operand (Im2colView, Col2imView), in a block whose share of K
// is whole tiles and whose view copies 16-byte chunks: each thread owns the same chunks of every
// tile, as InteriorTileLoader's threads do, and splits their gathered rows and columns into
// pixels and taps (gather_pixel, gather_tap) where they stay fixed rather than for every chunk:
//   k contiguous (im2col or col2im as A: rows are pixels, columns taps): a thread's chunks share
//     one column, so each k-step takes one tap; its rows' pixels are found once per block;
//   outer contiguous (im2col as B of a weight gradient: rows are pixels along K, columns taps):
//     a thread's chunks share one column, whose tap is found once per block; each k-step finds
//     the pixels of its rows.
// A chunk then costs a bounds test and an add. The outer edge needs no other path: a row or
// column past the matrix gets a pixel or tap no move brings into the image (kOutsideImage), and
// every chunk outside the image is written as zeros.
template <class Tile, int kThreads, class T, class View> struct GatheredTileLoader {
  static constexpr int kChunksPerRow = Tile::kCols / kChunkElems<T>;
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow; // rows one pass of threads copies
  static constexpr int kPasses = Tile::kRows / kRowsPerPass;
  static_assert(kThreads % kChunksPerRow == 0 && Tile::kRows % kRowsPerPass == 0,
                "every thread copies whole chunks of the same rows of each tile");
  // Pixels kept per thread: one per pass (k contiguous), none otherwise.
  static constexpr int kPixels = Tile::kKContiguous ? kPasses : 1;

  const View& view;
  int first_k;    // this thread's first column (k contiguous) or row (outer contiguous) at k_begin
  int tile_first; // the offset of its first chunk in the tile
  GatherPixel pixels[kPixels]; // k contiguous: its rows' pixels
  GatherTap tap;               // outer contiguous: its column's tap

  __device__ __forceinline__ GatheredTileLoader(const View& v, int outer0, int k_begin) : view(v) {
    const int r = int(threadIdx.x) / kChunksPerRow;
    const int c = int(threadIdx.x) % kChunksPerRow * kChunkElems<T>;
    tile_first = r * Tile::kLd + c;
    first_k = k_begin + (Tile::kKContiguous ? c : r);
    if constexpr (Tile::kKContiguous) {
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int row = outer0 + r + p * kRowsPerPass;
        pixels[p] = row < v.rows ? gather_pixel(v, row) : GatherPixel{kOutsideImage, 0, 0};
      }
    } else {
      const int col = outer0 + c;
      tap = col < v.cols ? gather_tap(v, col) : GatherTap{kOutsideImage, 0, 0};
    }
  }

  __device__ __forceinline__ void copy_chunk(T* dst, const GatherPixel& pixel,
                                             const GatherTap& t) const {
    if (gathers_inside(pixel, t, source_height(view), source_width(view)))
      cp_async16(dst, view.data + (pixel.offset + t.offset));
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }

  __device__ __forceinline__ void operator()(T* tile, int k_tile) const {
    T* dst = tile + tile_first;
    if constexpr (Tile::kKContiguous) {
      const GatherTap t = gather_tap(view, first_k + k_tile * Tile::kBK);
#pragma unroll
      for (int p = 0; p < kPasses; ++p)
        copy_chunk(dst + p * kRowsPerPass * Tile::kLd, pixels[p], t);
    } else {
      const int row = first_k + k_tile * Tile::kBK;
#pragma unroll
      for (int p = 0; p < kPasses; ++p)
        copy_chunk(dst + p * kRowsPerPass * Tile::kLd, gather_pixel(view, row + p * kRowsPerPass),
                   tap);
    }
  }
  static constexpr bool kFinishesInStep = false;
  __device__ __forceinline__ void finish(T*, int) const {}
};

// True when every tile of this operand for a block's share lies inside the matrix and copies in
// 16-byte chunks: the block's outer extent inside, the rows aligned, and the share of K whole
// tiles (only a ragged K leaves a partial last tile). A gathered (conv) view's loader handles the
// outer edge itself: it needs the chunks and whole tiles of K only.
template <class Tile, class View>
__device__ __forceinline__ bool whole_tiles_inside(const View& v, int, const BlockShare& share) {
  return v.vectorizable && (share.k_end - share.k_begin) % Tile::kBK == 0;
}
template <class Tile, class T>
__device__ __forceinline__ bool whole_tiles_inside(const MatrixView<T>& v, int outer0,
                                                   const BlockShare& share) {
  const int outer_extent = Tile::kKContiguous ? v.rows : v.cols;
  return v.vectorizable && outer0 + Tile::kOuter <= outer_extent &&
         (share.k_end - share.k_begin) % Tile::kBK == 0;
}
template <class Tile, class T>
__device__ __forceinline__ bool whole_tiles_inside(const NormalizedView<T>& v, int outer0,
                                                   const BlockShare& share) {
  return whole_tiles_inside<Tile>(static_cast<const MatrixView<T>&>(v), outer0, share);
}

// The interior loader of a view: InteriorTileLoader for the plain and the normalised matrices,
// GatheredTileLoader for the gathered ones.
template <class View, class T>
constexpr bool kIsGathered =
    std::is_same_v<View, Im2colView<T>> || std::is_same_v<View, Col2imView<T>>;
template <class Tile, int kThreads, class T, class View>
using InteriorLoaderOf =
    std::conditional_t<kIsGathered<View, T>, GatheredTileLoader<Tile, kThreads, T, View>,
                       InteriorTileLoader<Tile, kThreads, T, View>>;

// The loaders of v3 and later for this block: run(load_a, load_b) gets the interior loaders when
// every tile of both operands lies inside the matrices (or, for a gathered operand, when its
// loader can take them), so that its main loop has no bounds check but the gathered operand's
// image edges; every other block (the edges of C on a plain operand, a ragged K, a view not
// aligned for 16-byte chunks) gets the plain loaders (load_operand_tile). A loader is called as
// load(tile, k_tile) for the k_tile-th BK tile of the block's share of K, once for each in order.
template <class Cfg, class Smem, class ViewA, class ViewB, class Run>
__device__ __forceinline__ void with_tile_loaders(const ViewA& a, const ViewB& b,
                                                  const BlockShare& share, Run&& run) {
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  using T = typename Smem::T;
  if (whole_tiles_inside<TileA>(a, share.m0, share) &&
      whole_tiles_inside<TileB>(b, share.n0, share)) {
    const InteriorLoaderOf<TileA, Cfg::kThreads, T, ViewA> load_a(a, share.m0, share.k_begin);
    const InteriorLoaderOf<TileB, Cfg::kThreads, T, ViewB> load_b(b, share.n0, share.k_begin);
    run(load_a, load_b);
    return;
  }
  run(PlainTileLoader<TileA, Cfg::kThreads, ViewA>{a, share.m0, share.k_begin},
      PlainTileLoader<TileB, Cfg::kThreads, ViewB>{b, share.n0, share.k_begin});
}

// The main loop of v3 and v4: gemm_pipeline_with the loaders with_tile_loaders picks.
template <class Cfg, class Smem, class ViewA, class ViewB, class T, class Consume>
__device__ __forceinline__ void gemm_pipeline_interior(T* smem, const ViewA& a, const ViewB& b,
                                                       const BlockShare& share, Consume&& consume) {
  with_tile_loaders<Cfg, Smem>(a, b, share, [&](const auto& load_a, const auto& load_b) {
    gemm_pipeline_with<Cfg, Smem>(smem, share_k_tiles<Cfg>(share), load_a, load_b, consume);
  });
}

// Writes C[row, col] = relu(alpha * acc + beta * C[row, col] + bias[col]) (per `ep`); returns
// the value as stored (rounded to C's dtype), widened to fp32.
template <class CT>
__device__ __forceinline__ float store_output(CT* c, int n, int row, int col, float acc,
                                              const EpilogueArgs& ep) {
  const int64_t at = int64_t(row) * n + col;
  float v = ep.alpha * acc;
  if (ep.beta != 0.0f) v += ep.beta * load_f(c, at);
  if (ep.bias) v += ep.bias[col];
  if (ep.relu) v = v < 0.0f ? 0.0f : v; // NaN propagates, as in torch.relu
  store_f(c, at, v);
  return as_stored<CT>(v);
}

// Which columns and rows of a BM x BN tile each thread of the packed epilogue (store_tile_packed)
// stores: packs of P elements, thread t taking pack idx = t, t + kThreads, ... of the tile's
// BM * kPacksPerRow. As kPacksPerRow divides kThreads, a thread keeps the same P columns
// (first_column) in every row it stores, the rows g, g + kGroups, g + 2 kGroups, ... of its group
// g; so it can add up figures of its columns in registers as it stores, and a column's kGroups
// threads then combine theirs in group order (deterministic; store_tile_packed).
template <int BM, int BN, int kThreads, class CT> struct EpilogueColumns {
  static constexpr int P = kPackElems<CT>;
  static constexpr int kPacksPerRow = BN / P;
  static constexpr int kGroups = kThreads / kPacksPerRow;
  static_assert(BN % P == 0, "whole packs per tile row");
  static_assert(kThreads % kPacksPerRow == 0, "each thread stores the same columns of its rows");
  static_assert(2 * kGroups <= BM, "two figures per group and column fit in the staging tile");

  __device__ __forceinline__ static int group() { return int(threadIdx.x) / kPacksPerRow; }
  __device__ __forceinline__ static int first_column() {
    return int(threadIdx.x) % kPacksPerRow * P;
  }
  // How many of the tile's first `rows` rows group g stores.
  __device__ __forceinline__ static int group_rows(int g, int rows) {
    return rows > g ? (rows - g + kGroups - 1) / kGroups : 0;
  }
};

// What the packed epilogue adds up per column as it stores C: nothing or the column statistics
// (EpilogueArgs::column_partials).
enum class EpilogueSums { none, moments };

// The P fp32 values of a pack of the staging tile at `at`, and back. For P = 8 (a 16-bit C) a pack
// is two 16-byte halves, and a quarter warp's 8 lanes on consecutive packs of a row would start
// two by two on the same banks (lane i at bank 8 i mod 32): lanes 4-7 of each quarter take their
// upper half first, so that each of the two accesses is one conflict-free wavefront.
// load_staged_unordered leaves the halves in that order; swap_staged_halves turns values in
// column order into it and back (it is its own inverse), 8 selects.
template <int P> __device__ __forceinline__ bool upper_half_first() {
  return P == 8 && threadIdx.x / 4 % 2 == 1;
}
template <int P> __device__ __forceinline__ void swap_staged_halves(float (&v)[P]) {
  if constexpr (P == 8) {
    const bool swap = upper_half_first<P>();
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float low = v[e], high = v[4 + e];
      v[e] = swap ? high : low;
      v[4 + e] = swap ? low : high;
    }
  }
}
template <int P>
__device__ __forceinline__ void load_staged_unordered(const float* at, float (&v)[P]) {
  const int first = upper_half_first<P>() ? 4 : 0;
  float half[4];
#pragma unroll
  for (int q = 0; q < P; q += 4) {
    load_pack16(at + (q ^ first), half);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[q + e] = half[e];
  }
}
template <int P> __device__ __forceinline__ void load_staged(const float* at, float (&v)[P]) {
  load_staged_unordered(at, v);
  swap_staged_halves(v);
}
template <int P> __device__ __forceinline__ void store_staged(float* at, const float (&v)[P]) {
  float w[P];
#pragma unroll
  for (int e = 0; e < P; ++e) w[e] = v[e];
  swap_staged_halves(w);
  const int first = upper_half_first<P>() ? 4 : 0;
#pragma unroll
  for (int q = 0; q < P; q += 4)
    store_pack16(at + (q ^ first), {w[q], w[q + 1], w[q + 2], w[q + 3]});
}

// The staged packs a thread of the packed epilogue loads before it stores the first: one at a
// time, each row's arithmetic waited for its shared loads, and one block per SM (the large v5
// tile, 256 threads) had no other warps to cover that. Blocks of fewer threads run several per
// SM and take one at a time (4 spill v3's 64x64 WMMA tiles, as normalize_tile_columns' unrolled
// rows spill v2's).
template <int kThreads> constexpr int kEpiloguePacksInFlight = kThreads >= 256 ? 4 : 1;

// The terms of the fused epilogue (store_output's) on a pack v of P accumulators whose C is at
// `out`, 16-byte aligned: v = relu(alpha * v + beta * out + bias), the bias of the pack's columns
// given (bias, as loaded once per thread).
template <int P, class CT>
__device__ __forceinline__ void
apply_epilogue_terms(float (&v)[P], const CT* out, const float (&bias)[P], const EpilogueArgs& ep) {
  if (ep.alpha != 1.0f) // layers leave it at 1: one test, not P FMUL
#pragma unroll
    for (int e = 0; e < P; ++e) v[e] *= ep.alpha;
  if (ep.beta != 0.0f) {
    float old[P];
    load_pack16(out, old);
#pragma unroll
    for (int e = 0; e < P; ++e) v[e] += ep.beta * old[e];
  }
  if (ep.bias)
#pragma unroll
    for (int e = 0; e < P; ++e) v[e] += bias[e];
  if (ep.relu)
#pragma unroll
    for (int e = 0; e < P; ++e) v[e] = v[e] < 0.0f ? 0.0f : v[e]; // NaN propagates
}

// The packed store loop: writes the block's BM x BN tile of C at (m0, n0) from the fp32
// accumulators staged in shared memory (staging [BM][staging_ld], staging_ld a multiple of 4),
// 16 bytes of C per thread and row: alpha/beta/bias/ReLU in fp32 on the pack, C read (beta != 0)
// and written as one 16-byte access each. Where C's rows are not 16-byte aligned (N not a multiple
// of the pack) or the bias is not, and in a pack that crosses N, element by element. Each thread
// also adds up, for its P columns (EpilogueColumns) over the rows it stores, from the values as
// stored (rounded to C's dtype): for kSums moments, the values into `sums` (each also put back
// into its staging slot, for store_tile_with_moments' deviations).
template <EpilogueSums kSums, int BM, int BN, int kThreads, class CT>
__device__ __forceinline__ void store_tile_summing(float* staging, int staging_ld, CT* c, int m,
                                                   int n, int m0, int n0, const EpilogueArgs& ep,
                                                   float (&sums)[kPackElems<CT>]) {
  using Columns = EpilogueColumns<BM, BN, kThreads, CT>;
  constexpr int P = Columns::P;
  const bool packable =
      n % P == 0 && is_aligned16(c) && (ep.bias == nullptr || is_aligned16(ep.bias));
  // The bias of the thread's P columns, the same in every row it stores: loaded once, not once a
  // row (each row's load was a global memory latency that one block per SM could not hide).
  float bias[P] = {};
  const int own_column = n0 + Columns::first_column();
  if (packable && ep.bias && own_column < n) {
    float part[4];
#pragma unroll
    for (int q = 0; q < P; q += 4) {
      load_pack16(ep.bias + own_column + q, part);
#pragma unroll
      for (int e = 0; e < 4; ++e) bias[q + e] = part[e];
    }
  }
  // Whether the packed path stores the accumulators as they are (alpha 1, no beta, bias or ReLU,
  // as in an input gradient's GEMM): one test a pack rather than one a term.
  const bool identity = ep.alpha == 1.0f && ep.beta == 0.0f && !ep.bias && !ep.relu;
  const auto slot = [&](int tile_row) {
    return staging + tile_row * staging_ld + Columns::first_column();
  };
  constexpr int kInFlight = kEpiloguePacksInFlight<kThreads>;
  float staged[kInFlight][P]; // constant indices only (a runtime one: local memory)
  // The thread's rows of the tile, group(), group() + kGroups, ...: 32-bit indices, as the slot
  // addresses are.
  for_each_batched<kInFlight, int>(
      Columns::group(), Columns::kGroups, BM,
      [&](int b, int tile_row) { load_staged(slot(tile_row), staged[b]); },
      [&](int b, int tile_row) {
        if (m0 + tile_row >= m || own_column >= n) return;
        float(&v)[P] = staged[b]; // becomes the pack as stored
        if (!packable) {
#pragma unroll
          for (int e = 0; e < P; ++e)
            if (own_column + e < n) {
              v[e] = store_output(c, n, m0 + tile_row, own_column + e, v[e], ep);
              if constexpr (kSums == EpilogueSums::moments) sums[e] += v[e];
            }
        } else {
          // The thread's columns are the same in every row (own_column): its pack's offset is one
          // 32 x 32-bit product a row.
          CT* out = c + (int64_t(m0 + tile_row) * n + own_column);
          if (!identity) apply_epilogue_terms(v, out, bias, ep);
          const RoundedPack<CT> stored = round_pack<CT>(v);
          store_rounded_pack(out, stored);
          if constexpr (kSums == EpilogueSums::moments) {
            widen_pack(stored, v); // the values as stored, rounded once
#pragma unroll
            for (int e = 0; e < P; ++e) sums[e] += v[e];
          }
        }
        if constexpr (kSums == EpilogueSums::moments) {
          store_staged(slot(tile_row), v); // past N: never read out
        }
      });
}

// Puts each thread's two figures of its P columns into the staging tile, laid out as
// [2][kGroups][BN], once every thread is done with the tile; returns that layout's start, readable
// by the whole block. Each figure's P values go as store_staged writes a pack (16-byte stores
// without bank conflicts; one at a time, a warp's 32 threads on consecutive packs put 8 values
// on each bank).
template <int BM, int BN, int kThreads, class CT>
__device__ __forceinline__ const float*
share_column_figures(float* staging, const float (&first)[kPackElems<CT>],
                     const float (&second)[kPackElems<CT>]) {
  using Columns = EpilogueColumns<BM, BN, kThreads, CT>;
  const int g = Columns::group(), col0 = Columns::first_column();
  __syncthreads(); // every thread is done with the staging tile
  store_staged(staging + g * BN + col0, first);
  store_staged(staging + (Columns::kGroups + g) * BN + col0, second);
  __syncthreads();
  return staging;
}

// The statistics hook of the packed epilogue: partials[m0 / BM, 0, col] and [.., 1, col] =
// the mean and M2 (sum of squared deviations from that mean) of column col over the block's rows
// of C as stored. Each thread adds up its own values of its columns as it stores them, then, from
// their staging slots, their squared deviations from its own mean; the kGroups (count, mean, M2)
// of a column are combined with Chan's formula for several sets (combine_moments, reduce.cuh).
//
// Why (count, mean, M2) and Chan's parallel merge (here and across blocks in
// merge_column_partials), not (sum, sum of squares): E[x^2] - E[x]^2 subtracts two numbers of
// size mean^2 to get var, so in fp32 it loses about log2(mean^2 / var) of float's 24 bits, and all
// of them once |mean| is ~4000 std (a conv output with a large bias, or a ReLU'd one far from
// zero). Centred sums never form mean^2: each thread centres its own values at its own mean, and
// a merge adds n_i (mean_i - mean)^2 for the differences of the sets' means — every term
// non-negative, no cancellation — so the variance keeps fp32 precision whatever the mean (tested
// with |mean| = 1e4 std). The count of a block is implied by its rows and is not stored.
template <int BM, int BN, int kThreads, class CT>
__device__ __forceinline__ void store_tile_with_moments(float* staging, int staging_ld, CT* c,
                                                        int m, int n, int m0, int n0,
                                                        const EpilogueArgs& ep) {
  using Columns = EpilogueColumns<BM, BN, kThreads, CT>;
  constexpr int P = Columns::P;
  float mean[P] = {}, m2[P] = {};
  store_tile_summing<EpilogueSums::moments, BM, BN, kThreads>(staging, staging_ld, c, m, n, m0, n0,
                                                              ep, mean);
  const int rows = min(BM, m - m0), g = Columns::group(), col0 = Columns::first_column();
  const int count = Columns::group_rows(g, rows);
#pragma unroll
  for (int e = 0; e < P; ++e) mean[e] = count > 0 ? divide_by_count(mean[e], float(count)) : 0.0f;
  // The deviations in the order the loads return each row's halves (load_staged_unordered): the
  // mean put in that order once and M2 put back once, rather than each row's values.
  swap_staged_halves(mean);
#pragma unroll 4
  for (int r = g; r < rows; r += Columns::kGroups) {
    // This thread's own slots (no barrier); unrolled, so that 4 rows' loads are in flight together.
    float v[P];
    load_staged_unordered(staging + r * staging_ld + col0, v);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float centred = v[e] - mean[e];
      m2[e] = fmaf(centred, centred, m2[e]); // past N: slots never read out
    }
  }
  swap_staged_halves(mean);
  swap_staged_halves(m2);
  const float* figures = share_column_figures<BM, BN, kThreads, CT>(staging, mean, m2);
  float* means = ep.column_partials + int64_t(m0 / BM) * 2 * n; // [2, N] of this row tile
  float* m2s = means + n;
  for (int col = threadIdx.x; col < BN && n0 + col < n; col += kThreads) {
    int group_count[Columns::kGroups];
    float group_mean[Columns::kGroups], group_m2[Columns::kGroups];
#pragma unroll
    for (int group = 0; group < Columns::kGroups; ++group) {
      group_count[group] = Columns::group_rows(group, rows);
      group_mean[group] = figures[group * BN + col];
      group_m2[group] = figures[(Columns::kGroups + group) * BN + col];
    }
    const Moments merged = combine_moments(group_count, group_mean, group_m2);
    means[n0 + col] = merged.mean;
    m2s[n0 + col] = merged.m2;
  }
}

// The epilogue of v3 and later: store_tile_summing, with ep.column_partials the tile's column
// statistics (store_tile_with_moments). Every thread of the block must call it.
template <int BM, int BN, int kThreads, class CT>
__device__ __forceinline__ void store_tile_packed(float* staging, int staging_ld, CT* c, int m,
                                                  int n, int m0, int n0, const EpilogueArgs& ep) {
  if (ep.column_partials) {
    store_tile_with_moments<BM, BN, kThreads>(staging, staging_ld, c, m, n, m0, n0, ep);
  } else {
    float none[kPackElems<CT>] = {};
    store_tile_summing<EpilogueSums::none, BM, BN, kThreads>(staging, staging_ld, c, m, n, m0, n0,
                                                             ep, none);
  }
}

// ---------------------------------------------------------------------------------------------
// Split-K: the sum of the fp32 partial C slices and the epilogue.

// Slices whose partials a split_k_reduce_kernel thread loads before it adds the first: a thread
// adds up to kMaxKSplits of them, and its loads taken a few at a time would wait an L2 latency
// per few slices.
constexpr int kSplitReduceBatch = 16;

// C[row, col] = epilogue(partial[0, row, col] + ... + partial[splits - 1, row, col]), added in
// slice order. partial [splits, M, N] f32, C [M, N].
template <class CT>
__global__ void split_k_reduce_kernel(const float* __restrict__ partial, int splits, CT* c, int m,
                                      int n, EpilogueArgs ep) {
  const int64_t total = int64_t(m) * n;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    float acc = 0.0f, values[kSplitReduceBatch];
    for_each_batched<kSplitReduceBatch>(
        0, 1, splits, [&](int b, int64_t s) { values[b] = partial[s * total + idx]; },
        [&](int b, int64_t) { acc += values[b]; }); // in slice order
    store_output(c, n, int(idx / n), int(idx % n), acc, ep);
  }
}

// Calls f(TypeTag<CT>) for the storage type CT of C: float, or for a 16-bit C the tensor-core
// operands' type T (C is never the other 16-bit format: see GemmArgs::c_dtype), or for the SIMT
// kernel's f32 operands whichever 16-bit format C is in.
template <class T, class F> void visit_output(const GemmArgs& args, F&& f) {
  if (args.c_dtype == DType::f32) return f(TypeTag<float>{});
  if constexpr (std::is_same_v<T, float>)
    visit_half_precision(args.c_dtype, "gemm", f);
  else
    f(TypeTag<T>{});
}

template <class T> void reduce_split_k(const float* partial, int splits, const GemmArgs& args) {
  constexpr int kThreads = 256;
  const int blocks = grid_for(args.m * args.n, kThreads);
  visit_output<T>(args, [&](auto type) {
    using CT = typename decltype(type)::type;
    split_k_reduce_kernel<<<blocks, kThreads, 0, stream()>>>(
        partial, splits, static_cast<CT*>(args.c), int(args.m), int(args.n), args.epilogue);
  });
  CUDA_CHECK_LAUNCH("gemm: split-K reduction");
}

// ---------------------------------------------------------------------------------------------
// The launcher.

// Whether a kernel family has a third, medium tile configuration (Family::Medium).
template <class Family, class = void> struct HasMediumTiles : std::false_type {};
template <class Family>
struct HasMediumTiles<Family, std::void_t<typename Family::Medium>> : std::true_type {};

// Whether a kernel family can run its large tiles on a persistent grid (v5: Family::
// kPersistentTiles and Family::run_persistent_tiles).
template <class Family, class = void> struct HasPersistentTiles : std::false_type {};
template <class Family>
struct HasPersistentTiles<Family, std::void_t<decltype(Family::kPersistentTiles)>>
    : std::bool_constant<Family::kPersistentTiles> {};

// args.column_moments and args.batchnorm_grad.sums from C after the GEMM: the unfused passes over
// C, for the launches without the epilogue hook (v1, v2, the SIMT kernel, split K, whose
// reduction kernel runs the epilogue element by element and has no tile to reduce, and the thin
// kernels), and for every launch's gradient sums but the thin-K kernel's (gemm_thin.cu).
inline void column_statistics_of_output(const GemmArgs& args) {
  if (args.column_moments)
    column_moments(args.c, args.c_dtype, args.m, int(args.n), args.column_moments, "gemm");
  const BatchNormGradient& grad = args.batchnorm_grad;
  if (grad.sums)
    batchnorm_grad_sums(grad.x, args.c_dtype, args.c, args.c_dtype, args.m, int(args.n),
                        grad.channels, grad.sums, "gemm");
}

// The SM count the tile plans are made for: the GPU's, or the one set_gemm_planning_sms gives.
inline int planning_sm_count() {
  const int planned = gemm_planning_sms();
  return planned > 0 ? planned : sm_count();
}

// The launch of one GEMM kernel family (WMMA or SIMT) for the operand pair OpA, OpB:
// GemmLaunch<Family>::On<OpA, OpB>::run(args) launches the Large, Medium (if the family has one)
// or Small configuration with K split or not as plan_gemm says, and picks C's storage type
// (visit_output). A Family
// provides
//   using Large, Small;                                     the tile configurations
//   using Medium;                                           (optional) one between them
//   static constexpr const char* kName;                     for launch errors
//   static constexpr bool kColumnStatistics;                whether its epilogue has the column
//                                                           statistics hooks (store_tile_packed)
//   template <class Cfg, class OpA, class OpB> static constexpr int smem_bytes();
//   template <class Cfg, class OpA, class OpB, class CT> static auto kernel();
//   static constexpr bool kPersistentTiles;                 (optional) with
//   template <class Cfg, class OpA, class OpB, class CT>
//   static bool run_persistent_tiles(args, c, epilogue);    the large tiles' whole-K launch where
//                                                           gemm_persistent_tiles() asks for it
//                                                           (false: it did not launch)
// where every kernel takes (A view, B view, CT* c, m, n, k, k_per_split, epilogue): block z of
// the grid sums K from z * k_per_split on into the z-th [M, N] slice of c (z = 0 and
// k_per_split = K without a split).
template <class Family> struct GemmLaunch {
  template <class OpA, class OpB> struct On {
    template <class Cfg, class CT>
    static void launch(const GemmArgs& args, void* c, const EpilogueArgs& epilogue,
                       const KSplit& split) {
      if constexpr (HasPersistentTiles<Family>::value &&
                    std::is_same_v<Cfg, typename Family::Large>)
        if (split.splits == 1 && gemm_persistent_tiles() &&
            Family::template run_persistent_tiles<Cfg, OpA, OpB, CT>(args, c, epilogue))
          return;
      constexpr int kSmemBytes = Family::template smem_bytes<Cfg, OpA, OpB>();
      const auto kernel = Family::template kernel<Cfg, OpA, OpB, CT>();
      static const bool smem_ready = (allow_dynamic_smem(kernel, kSmemBytes), true);
      (void)smem_ready;
      const dim3 grid = tile_grid(args, Cfg::BM, Cfg::BN, split.splits);
      kernel<<<grid, Cfg::kThreads, kSmemBytes, stream()>>>(
          OpA::view(args.a), OpB::view(args.b), static_cast<CT*>(c), int(args.m), int(args.n),
          int(args.k), int(split.k_per_split), epilogue);
      CUDA_CHECK_LAUNCH(Family::kName);
    }
    // One pass: each block sums all of K for its tile and applies the epilogue. Column moments
    // come from the epilogue hook where the family has it: per-tile partials [row tiles, 2, N]
    // (from the caching allocator), then their merge. Batch norm gradient sums come from a
    // reduction over C and x after the GEMM: summed in the epilogue, reading x there made the
    // GEMM of sine's input gradients twice as slow, against a reduction kernel's pass.
    template <class Cfg> static void whole_k(const GemmArgs& args) {
      const bool hook = Family::kColumnStatistics && args.column_moments;
      Tensor partials;
      EpilogueArgs epilogue = args.epilogue;
      if (hook) {
        const int64_t row_tiles = (args.m + Cfg::BM - 1) / Cfg::BM;
        partials = Tensor::empty({row_tiles, 2, args.n}, DType::f32, Device::cuda);
        epilogue.column_partials = ptr<float>(partials);
      }
      visit_output<typename OpA::Elem>(args, [&](auto type) {
        launch<Cfg, typename decltype(type)::type>(args, args.c, epilogue, KSplit{1, args.k});
      });
      if (!hook) return column_statistics_of_output(args);
      merge_column_partials(ptr<float>(partials), args.m, Cfg::BM, int(args.n),
                            args.column_moments);
    }
    // Two passes: fp32 partial sums [splits, M, N] (no epilogue), then their sum in slice
    // order with the epilogue. The partials come from the caching allocator.
    template <class Cfg> static void split_k(const GemmArgs& args, const KSplit& split) {
      const Tensor partial =
          Tensor::empty({split.splits, args.m, args.n}, DType::f32, Device::cuda);
      launch<Cfg, float>(args, partial.raw(), EpilogueArgs{}, split);
      reduce_split_k<typename OpA::Elem>(ptr<float>(partial), split.splits, args);
      column_statistics_of_output(args);
    }
    template <class Cfg> static BlockTile tile() { return {Cfg::BM, Cfg::BN, Cfg::BK}; }
    template <class Cfg> static bool fits() {
      return Family::template smem_bytes<Cfg, OpA, OpB>() <= max_dynamic_smem();
    }
    static void run(const GemmArgs& args) {
      using Large = typename Family::Large;
      using Small = typename Family::Small;
      GemmPlan plan;
      if constexpr (HasMediumTiles<Family>::value) {
        using Medium = typename Family::Medium;
        plan = plan_gemm(args.m, args.n, args.k, tile<Large>(), tile<Medium>(), tile<Small>(),
                         fits<Large>(), fits<Medium>(), planning_sm_count());
        if (plan.tiles == GemmTiles::medium) return whole_k<Medium>(args);
      } else {
        plan = plan_gemm(args.m, args.n, args.k, tile<Large>(), tile<Small>(), fits<Large>(),
                         planning_sm_count());
      }
      if (plan.tiles == GemmTiles::large && plan.split.splits > 1)
        split_k<Large>(args, plan.split);
      else if (plan.tiles == GemmTiles::large)
        whole_k<Large>(args);
      else if (plan.split.splits > 1)
        split_k<Small>(args, plan.split);
      else
        whole_k<Small>(args);
    }
  };
};

// A sweep configuration's name: `label`, then Cfg's block tile, warps and stages.
template <class Cfg> std::string sweep_name(const char* label) {
  return cat(label, " ", Cfg::BM, "x", Cfg::BN, "x", Cfg::BK, ", ", Cfg::WARPS_M * Cfg::WARPS_N,
             " warps of ", Cfg::kWarpM, "x", Cfg::kWarpN, ", ", Cfg::STAGES, " stages");
}

// What every sweep configuration takes: f16 A untransposed, f16 B either way round, f16 C.
inline void require_sweep_operands(const GemmArgs& args, const char* kernel) {
  require(args.a.kind == OperandKind::matrix &&
              (args.b.kind == OperandKind::matrix || args.b.kind == OperandKind::transposed) &&
              args.ab_dtype == DType::f16 && args.c_dtype == DType::f16,
          kernel, "a sweep configuration takes f16 A untransposed and f16 C");
}

// A configuration Cfg of a family for the sweep (GemmCandidate), named after `version`.
template <class Family, class Cfg> GemmCandidate sweep_candidate(const char* version) {
  using OpA = OperandTraits<__half, OperandKind::matrix>;
  using OpB = OperandTraits<__half, OperandKind::transposed>;
  using OpBPlain = OperandTraits<__half, OperandKind::matrix>;
  GemmCandidate out;
  out.name = sweep_name<Cfg>(version);
  out.smem_bytes = Family::template smem_bytes<Cfg, OpA, OpB>();
  out.run = [](const GemmArgs& args) {
    require_sweep_operands(args, Family::kName);
    const KSplit whole{1, args.k};
    if (args.b.kind == OperandKind::transposed)
      GemmLaunch<Family>::template On<OpA, OpB>::template launch<Cfg, __half>(args, args.c,
                                                                              args.epilogue, whole);
    else
      GemmLaunch<Family>::template On<OpA, OpBPlain>::template launch<Cfg, __half>(
          args, args.c, args.epilogue, whole);
  };
  return out;
}

// The GemmKernelInfo of a family's large configuration: `kernel` is the kernel template's name,
// `config` the name of its configuration template.
template <class Family>
GemmKernelInfo large_kernel_info(const char* version, const char* kernel, const char* config) {
  using Cfg = typename Family::Large;
  using Plain = OperandTraits<__half, OperandKind::matrix>;
  const std::string plain = "minamp::gpu::OperandTraits<__half, (minamp::gpu::OperandKind)0>";
  return {version,
          cat(kernel, "<minamp::gpu::", config, "<", Cfg::BM, ", ", Cfg::BN, ", ", Cfg::BK, ", ",
              Cfg::WARPS_M, ", ", Cfg::WARPS_N, ", ", Cfg::STAGES, ">, ", plain, ", ", plain,
              ", __half>"),
          Cfg::kThreads, Family::template smem_bytes<Cfg, Plain, Plain>()};
}

#endif // __CUDACC__ || MINAMP_CUDA_EMULATOR

} // namespace minamp::gpu
