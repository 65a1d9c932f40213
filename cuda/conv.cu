// 2-D convolution over NHWC activations on the GEMM kernels (f16 and bf16 -> tensor cores, f32 ->
// SIMT).
//   forward:  y[N*Ho*Wo, Cout] = im2col(x)[N*Ho*Wo, kh*kw*Cin] @ w[Cout, kh*kw*Cin]^T, bias and
//             ReLU fused in the epilogue. Implicit GEMM: the A tiles are gathered from x on the
//             fly by the GEMM loader (padding reads as zero); im2col(x) is never materialised.
//   dw:       dw[Cout, K] += dy[N*Ho*Wo, Cout]^T @ im2col(x), also implicit (im2col(x) is the
//             B operand), accumulated in f32 through the epilogue's beta = 1.
//   dx:       dx[N*H*W, Cin] = col2im(dy)[N*H*W, kh*kw*Cout] @ w_t[kh*kw*Cout, Cin], implicit
//             too: row (n, ih, iw) of col2im(dy) holds, per tap, dy at the output pixel whose
//             tap reads (ih, iw), or zero where none does; w_t is w with its taps moved first
//             (per phase, below: a copy of that phase's taps). One fp32 sum and one rounding per
//             dx element, no atomics. With stride s, all but 1/s^2 of those entries would be
//             zeros between strided taps, so the GEMM runs per stride phase (gemm.cuh's
//             Col2imPhase): the input pixels (row0 + s*i, col0 + s*j) are read by the taps (tap_y0
//             + s*t, tap_x0 + s*u) only, and each of the s^2 phases is a GEMM over those, into a
//             buffer then placed in dx.
// A 1x1, stride-1, unpadded conv is a plain GEMM on x viewed as [N*H*W, Cin] in all three. Such a
// conv can also take its input batch-normalised (InputNormalization): the forward GEMM then reads
// x as a normalised operand (gemm.cuh's OperandKind::normalized), normalising each tile as it
// lands in shared memory, so the batch norm's output is never written. The backward normalises x
// again, into dx's storage (which the input gradient overwrites next) or a buffer of its own, for
// a plain dw GEMM: normalising the B tiles in the GEMM made sine's weight gradients twice as slow
// (each B element normalised by every row tile of dw, beside few MMAs a tile). A conv with few
// output channels is the exception: its dw GEMM runs on CUDA cores as one pass over x
// (gemm_thin_c.cu), which normalises each value as it loads it.
// Operands of mixed dtypes (allowed, as on the CPU) are converted to f32 first, and so are 16-bit
// operands whose 16-bit output is in the other format.
#include <initializer_list>

#include "device.cuh"
#include "gemm.cuh"
#include "kernels/gemm_version.h"
#include "kernels/kernels.h"

namespace minamp::gpu {

namespace {

// The GEMM loaders' geometry of a checked convolution, once its extents are within the CUDA
// kernels' 32-bit limit.
ConvGeometry conv_geometry(const char* op, const ConvDims& d, const Tensor& x, const Tensor& w) {
  const int64_t out_rows = d.n * d.out_pixels();
  require_size(x.numel() <= kMaxGemmExtent && w.numel() <= kMaxGemmExtent &&
                   out_rows * d.cout <= kMaxGemmExtent && out_rows * d.patch() <= kMaxGemmExtent,
               op, "sizes must fit in 32 bits (at most ", kMaxGemmExtent, " elements), got x ",
               describe(x), ", w ", describe(w));
  ConvGeometry g;
  g.batch = int(d.n), g.height = int(d.h), g.width = int(d.w), g.channels = int(d.cin);
  g.kernel_h = int(d.kh), g.kernel_w = int(d.kw), g.stride = d.stride, g.pad = d.pad;
  g.out_h = int(d.ho), g.out_w = int(d.wo), g.out_channels = int(d.cout);
  return g;
}

// The dtype the GEMM runs in: the 16-bit format (f16 or bf16) of every operand when they share
// one and the output (nullptr: none) is f32 or in it too (gemm's C is f32 or its operands'
// dtype), f32 otherwise.
DType common_dtype(std::initializer_list<const Tensor*> operands, const Tensor* output) {
  const DType first = (*operands.begin())->dtype();
  if (!is_half_precision(first)) return DType::f32;
  for (const Tensor* t : operands)
    if (t->dtype() != first) return DType::f32;
  if (output && output->dtype() != DType::f32 && output->dtype() != first) return DType::f32;
  return first;
}

// `t` itself when it already has `dtype`, else a converted copy on the device.
Tensor as_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor converted = Tensor::empty(t.shape(), dtype, Device::cuda);
  cast(t, converted);
  return converted;
}

// The device vectors of a batch norm that a conv applies to its input.
BatchNormChannels batchnorm_channels(const InputNormalization& norm) {
  return {ptr<const float>(*norm.gamma), ptr<const float>(*norm.beta), ptr<const float>(*norm.mean),
          ptr<const float>(*norm.invstd), norm.relu};
}

// The conv input as the GEMM operand [N*Ho*Wo, kh*kw*Cin]: x itself for a pointwise conv, read
// batch-normalised when `norm` is given (pointwise convs only, conv2d_normalizes_on_load).
GemmOperand input_operand(const Tensor& x, const ConvGeometry& g,
                          const InputNormalization* norm = nullptr) {
  if (norm) return normalized_operand(x, batchnorm_channels(*norm));
  return g.is_pointwise() ? matrix_operand(x, false) : im2col_operand(x, g);
}

// w [Cout, kh, kw, Cin] as the matrix [Cout, K].
GemmOperand weight_operand(const Tensor& w, bool transposed) {
  const Shape& s = w.shape();
  return {transposed ? OperandKind::transposed : OperandKind::matrix,
          w.raw(),
          s[0],
          s[1] * s[2] * s[3],
          {},
          {},
          {},
          {}};
}

// dy [N, Ho, Wo, Cout] as the matrix [N*Ho*Wo, Cout].
GemmOperand output_grad_operand(const Tensor& dy, bool transposed) {
  return matrix_operand(dy, transposed);
}

// w_phase[(t, u, co), ci] = w[co, tap_y0 + s*t, tap_x0 + s*u, ci]: the weight as the B operand of
// one stride phase of the input gradient (every tap, in (ky, kx) order, at stride 1). w [Cout, kh,
// kw, Cin], w_phase [taps_y, taps_x, Cout, Cin]. One thread per element of w_phase.
template <class T>
__global__ void phase_taps_first_kernel(const T* __restrict__ w, ConvGeometry g, Col2imPhase p,
                                        T* __restrict__ w_phase, int64_t total) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int ci = int(idx % g.channels);
    const int co = int((idx / g.channels) % g.out_channels);
    const int tap = int(idx / (int64_t(g.channels) * g.out_channels));
    const int ky = p.tap_y0 + g.stride * (tap / p.taps_x),
              kx = p.tap_x0 + g.stride * (tap % p.taps_x);
    w_phase[idx] = w[((int64_t(co) * g.kernel_h + ky) * g.kernel_w + kx) * g.channels + ci];
  }
}

// w [Cout, kh, kw, Cin] as phase p's matrix [taps * Cout, Cin] with rows (t, u, co).
Tensor phase_taps_first(const Tensor& w, const ConvGeometry& g, const Col2imPhase& p) {
  Tensor w_phase =
      Tensor::empty({p.taps() * int64_t(g.out_channels), g.channels}, w.dtype(), Device::cuda);
  constexpr int kThreads = 256;
  const int64_t total = w_phase.numel();
  if (total == 0) return w_phase;
  visit_floating(w, "conv2d_backward", [&](auto type) {
    using T = typename decltype(type)::type;
    phase_taps_first_kernel<<<grid_for(total, kThreads), kThreads, 0, stream()>>>(
        ptr<const T>(w), g, p, ptr<T>(w_phase), total);
  });
  CUDA_CHECK_LAUNCH("conv2d_backward: gathering a stride phase's taps of the weight");
  return w_phase;
}

// dx[n, row0 + s*i, col0 + s*j, :] = phase_dx[(n, i, j), :], or 0 without phase_dx (a phase that
// no tap reads). phase_dx [phase pixels, Cin], dx [N, H, W, Cin]; one thread per element of a
// phase pixel, in units of U (16 bytes when a pixel's channels allow it, else one element).
template <class U>
__global__ void scatter_phase_kernel(const U* __restrict__ phase_dx, ConvGeometry g, Col2imPhase p,
                                     int units_per_pixel, U* __restrict__ dx, int64_t total) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pixel = idx / units_per_pixel;
    const int unit = int(idx % units_per_pixel);
    const int j = int(pixel % p.cols), i = int((pixel / p.cols) % p.rows);
    const int64_t n = pixel / (int64_t(p.cols) * p.rows);
    const int64_t at =
        (n * g.height + p.row0 + int64_t(g.stride) * i) * g.width + p.col0 + int64_t(g.stride) * j;
    dx[at * units_per_pixel + unit] = phase_dx ? phase_dx[idx] : U{};
  }
}

// Writes phase p's rows of dx from phase_dx (its GEMM's output), or zeros when it is undefined.
void scatter_phase(const Tensor& phase_dx, const ConvGeometry& g, const Col2imPhase& p,
                   Tensor& dx) {
  const int64_t pixel_bytes = int64_t(g.channels) * dtype_size(dx.dtype());
  const bool packs = pixel_bytes % 16 == 0 && is_aligned16(dx.raw()) &&
                     (!phase_dx.defined() || is_aligned16(phase_dx.raw()));
  const auto launch = [&](auto unit) {
    using U = typename decltype(unit)::type;
    const int units = int(pixel_bytes / int64_t(sizeof(U)));
    const int64_t total = p.pixels(g.batch) * units;
    if (total == 0) return;
    constexpr int kThreads = 256;
    scatter_phase_kernel<<<grid_for(total, kThreads), kThreads, 0, stream()>>>(
        phase_dx.defined() ? static_cast<const U*>(phase_dx.raw()) : nullptr, g, p, units,
        static_cast<U*>(dx.raw()), total);
  };
  if (packs)
    launch(TypeTag<uint4>{});
  else if (dtype_size(dx.dtype()) == 4)
    launch(TypeTag<float>{});
  else
    launch(TypeTag<uint16_t>{});
  CUDA_CHECK_LAUNCH("conv2d_backward: placing a stride phase's input gradient");
}

// dx[N, H, W, Cin] from dy [N, Ho, Wo, Cout] and w [Cout, kh, kw, Cin], one stride phase at a
// time: stride s gives s^2 phases, each a GEMM over its own input pixels and taps, written to a
// buffer and placed into dx; stride 1 is one phase written in place. With `norm` (a pointwise
// conv that normalised x as it loaded it) and its grad_sums, the GEMM also sums the batch norm's
// gradient terms of dx and x into them.
void input_gradient(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvGeometry& g,
                    Tensor& dx, const InputNormalization* norm) {
  GemmArgs args;
  args.ab_dtype = dy.dtype();
  args.c_dtype = dx.dtype();
  args.n = g.channels;
  if (g.is_pointwise()) { // dx [N*H*W, Cin] = dy [N*H*W, Cout] @ w [Cout, Cin]
    args.a = output_grad_operand(dy, false);
    args.b = weight_operand(w, false);
    args.c = dx.raw();
    args.m = dx.shape().rows(), args.k = g.out_channels;
    if (norm && norm->grad_sums) {
      args.batchnorm_grad = {x.raw(), batchnorm_channels(*norm), ptr<float>(*norm->grad_sums)};
      if (args.m == 0) fill(*norm->grad_sums, 0.0f); // sums over no rows
    }
    run_gemm(args);
    return;
  }
  for (int row0 = 0; row0 < g.stride; ++row0)
    for (int col0 = 0; col0 < g.stride; ++col0) {
      const Col2imPhase p = col2im_phase(g, row0, col0);
      if (p.pixels(g.batch) == 0) continue;
      if (p.taps() == 0) { // no tap reads these pixels
        scatter_phase(Tensor(), g, p, dx);
        continue;
      }
      const Tensor w_phase = phase_taps_first(w, g, p);
      const bool whole = p.is_whole(g);
      Tensor phase_dx =
          whole ? dx : Tensor::empty({p.pixels(g.batch), g.channels}, dx.dtype(), Device::cuda);
      args.a = col2im_operand(dy, g, p);       // [phase pixels, taps * Cout]
      args.b = matrix_operand(w_phase, false); // [taps * Cout, Cin]
      args.c = phase_dx.raw();
      args.m = p.pixels(g.batch), args.k = int64_t(p.taps()) * g.out_channels;
      run_gemm(args);
      if (!whole) scatter_phase(phase_dx, g, p, dx);
    }
}

// The GEMM dw[Cout, K] += dy^T @ op(x), op(x) [N*Ho*Wo, K] being `input` (input_operand) in
// `dtype`, dy's too.
GemmArgs weight_gradient_args(const GemmOperand& input, const Tensor& dy, const ConvGeometry& g,
                              void* dw, DType dtype) {
  GemmArgs args;
  args.a = output_grad_operand(dy, true); // dy^T: [Cout, N*Ho*Wo]
  args.b = input;
  args.ab_dtype = dtype;
  args.c = dw;
  args.c_dtype = DType::f32;
  args.m = g.out_channels, args.n = g.patch(), args.k = g.out_pixels();
  args.epilogue.beta = 1.0f; // accumulate
  return args;
}

// dw[Cout, K] += dy^T @ im2col(x).
void weight_gradient(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw) {
  run_gemm(weight_gradient_args(input_operand(x, g), dy, g, dw.raw(), x.dtype()));
}

// The same with x batch-normalised per `norm` (a pointwise conv that normalised x as it loaded
// it), in `dtype`: by the thin-C GEMM as it loads x where that kernel runs the GEMM (few output
// channels over many pixels: runs_thin_c_gemm), else normalised again into dx's storage when it
// has x's dtype (the input gradient overwrites it next) or a buffer of its own, for a plain GEMM.
void normalized_weight_gradient(const Tensor& x, const Tensor& dy, const ConvGeometry& g,
                                const InputNormalization& norm, DType dtype, Tensor& dx,
                                Tensor& dw) {
  const GemmArgs args = weight_gradient_args(input_operand(x, g, &norm), dy, g, dw.raw(), dtype);
  if (x.dtype() == dtype && runs_thin_c_gemm(args)) return run_gemm(args);
  Tensor normalized = dx.defined() && dx.dtype() == x.dtype()
                          ? dx
                          : Tensor::empty(x.shape(), x.dtype(), Device::cuda);
  batchnorm_normalize(x.raw(), normalized.raw(), x.dtype(), x.shape().rows(), g.channels,
                      batchnorm_channels(norm), "conv2d_backward");
  weight_gradient(as_dtype(normalized, dtype), dy, g, dw);
}

// The GEMM dw[Cout, Cin] += dy^T @ x of a pointwise conv whose output gradient dy is the input
// gradient of the batch norm after it, read as `grad` describes it (an operand that computes each
// element as it loads it), with bias_grad (f32 [Cout], or nullptr) taking dy's column sums.
GemmArgs weight_gradient_from_batchnorm_args(const Tensor& x, const BatchNormInputGrad& grad,
                                             const ConvGeometry& g, void* dw, float* bias_grad) {
  const BatchNormChannels channels{ptr<const float>(grad.gamma), ptr<const float>(grad.beta),
                                   ptr<const float>(grad.mean), ptr<const float>(grad.invstd),
                                   grad.relu};
  GemmArgs args = weight_gradient_args(input_operand(x, g), grad.dy, g, dw, x.dtype());
  args.a = batchnorm_input_grad_operand(grad.dy, grad.x, channels, grad.grad_sums, grad.training);
  args.bias_grad = bias_grad;
  return args;
}

} // namespace

bool conv2d_reads_batchnorm_input_grad(const Tensor& x, const Tensor& w,
                                       const BatchNormInputGrad& grad, const ConvParams& conv) {
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  if (xs.rank() != 4 || ws.rank() != 4 || ws[1] != 1 || ws[2] != 1 || conv.stride != 1 ||
      conv.pad != 0 || xs[3] != ws[3] || grad.x.shape() != Shape{xs[0], xs[1], xs[2], ws[0]})
    return false;
  for (const Tensor* t : {&w, &grad.x, &grad.dy})
    if (t->dtype() != x.dtype()) return false;
  const ConvDims d{xs[0], xs[1], xs[2], xs[3], ws[0], 1, 1, xs[1], xs[2], 1, 0};
  if (x.numel() > kMaxGemmExtent || grad.x.numel() > kMaxGemmExtent) return false;
  const ConvGeometry g = conv_geometry("conv2d_backward_from_batchnorm", d, x, w);
  return runs_thin_c_gemm(weight_gradient_from_batchnorm_args(x, grad, g, nullptr, nullptr));
}

void conv2d_backward_from_batchnorm(const Tensor& x, const Tensor& w,
                                    const BatchNormInputGrad& grad, Tensor& dw, Tensor& db,
                                    const ConvParams& conv) {
  const ConvDims d = require_conv2d_backward_from_batchnorm(
      x, w, grad, dw, db, conv, conv2d_reads_batchnorm_input_grad(x, w, grad, conv));
  const ConvGeometry g = conv_geometry("conv2d_backward_from_batchnorm", d, x, w);
  // The GEMM writes a dw: with a frozen weight, one of its own, left unread.
  Tensor weight_grad = dw.defined() ? dw : Tensor::zeros(w.shape(), DType::f32, Device::cuda);
  run_gemm(weight_gradient_from_batchnorm_args(x, grad, g, weight_grad.raw(),
                                               db.defined() ? ptr<float>(db) : nullptr));
}

bool conv2d_normalizes_on_load(const Tensor& x, const Tensor& w, const ConvParams& conv) {
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  if (xs.rank() != 4 || ws.rank() != 4 || ws[1] != 1 || ws[2] != 1 || conv.stride != 1 ||
      conv.pad != 0 || x.dtype() != w.dtype() || xs[3] != ws[3])
    return false;
  // Thin GEMMs (a first or last layer's few channels) have their own kernels, which normalise
  // the A operand of a thin N only (a last layer's few output channels, thin_gemm_applies): a
  // conv with few input channels keeps its unfused input. (The weight gradient reads x
  // normalised again and written out, or, for few output channels, normalised as it loads.)
  if (xs[3] <= kThinK) return false;
  if (!is_half_precision(x.dtype())) return true; // the SIMT kernel
  const GemmVersion version = plan_version(gemm_version(), compute_capability());
  return version == GemmVersion::v2_wmma || version == GemmVersion::v4_mma ||
         version == GemmVersion::v5_multistage;
}

void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvParams& conv,
                    const GemmEpilogue& epilogue, const InputNormalization* input_norm) {
  const ConvDims d = require_conv2d_forward(x, w, y, conv, epilogue, input_norm,
                                            input_norm && conv2d_normalizes_on_load(x, w, conv));
  const ConvGeometry g = conv_geometry("conv2d_forward", d, x, w);
  const int64_t out_channels = d.cout;
  const Tensor* bias = epilogue.bias;

  const DType dtype = common_dtype({&x, &w}, &y);
  const Tensor x_in = as_dtype(x, dtype), w_in = as_dtype(w, dtype);
  GemmArgs args;
  args.a = input_operand(x_in, g, input_norm); // [N*Ho*Wo, K]
  args.b = weight_operand(w_in, true);         // w^T: [K, Cout]
  args.ab_dtype = dtype;
  args.c = y.raw();
  args.c_dtype = y.dtype();
  args.m = g.out_pixels(), args.n = out_channels, args.k = g.patch();
  args.epilogue.bias = bias ? ptr<float>(*bias) : nullptr; // alpha/beta are not used by conv
  args.epilogue.relu = epilogue.relu;
  args.column_moments = epilogue.column_moments ? ptr<float>(*epilogue.column_moments) : nullptr;
  run_gemm(args);
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                     const ConvParams& conv, const InputNormalization* input_norm) {
  const ConvDims d = require_conv2d_backward(x, w, dy, dx, dw, conv, input_norm,
                                             input_norm && conv2d_normalizes_on_load(x, w, conv));
  const ConvGeometry g = conv_geometry("conv2d_backward", d, x, w);
  const DType dtype = common_dtype({&x, &w, &dy}, dx.defined() ? &dx : nullptr);
  const Tensor dy_in = as_dtype(dy, dtype);
  if (dw.defined()) {
    if (input_norm)
      normalized_weight_gradient(x, dy_in, g, *input_norm, dtype, dx, dw);
    else
      weight_gradient(as_dtype(x, dtype), dy_in, g, dw);
  }
  if (dx.defined()) input_gradient(x, as_dtype(w, dtype), dy_in, g, dx, input_norm);
}

} // namespace minamp::gpu
