// 2-D convolution over NHWC activations on the GEMM kernels (f16 -> WMMA, f32 -> SIMT).
//   forward:  y[N*Ho*Wo, Cout] = im2col(x)[N*Ho*Wo, kh*kw*Cin] @ w[Cout, kh*kw*Cin]^T, bias and
//             ReLU fused in the epilogue. Implicit GEMM: the A tiles are gathered from x on the
//             fly by the GEMM loader (padding reads as zero); im2col(x) is never materialised.
//   dw:       dw[Cout, K] += dy[N*Ho*Wo, Cout]^T @ im2col(x), also implicit (im2col(x) is the
//             B operand), accumulated in f32 through the epilogue's beta = 1.
//   dx:       explicit for now: dcols[N*Ho*Wo, K] = dy @ w in an f32 scratch buffer (from the
//             caching allocator), then col2im gathers, for every input element, the taps that
//             read it (fp32 sum, one rounding to dx's dtype; no atomics, deterministic).
// A 1x1, stride-1, unpadded conv is a plain GEMM on x viewed as [N*H*W, Cin] in all three.
// Operands of mixed dtypes (allowed, as on the CPU) are converted to f32 first.
#include <initializer_list>

#include "device.cuh"
#include "gemm.cuh"
#include "kernels/kernels.h"

namespace minamp::gpu {

namespace {

// Checks x [N, H, W, Cin], w [Cout, kh, kw, Cin] and the conv parameters; returns the geometry.
ConvGeometry conv_geometry(const char* op, const Tensor& x, const Tensor& w,
                           const ConvParams& conv) {
  require(x.defined() && x.shape().rank() == 4 && is_floating(x.dtype()), op,
          "expects x f32/f16 [N, H, W, Cin], got ", describe(x));
  require(w.defined() && w.shape().rank() == 4 && w.shape()[3] == x.shape()[3] &&
              is_floating(w.dtype()),
          op, "expects w f32/f16 [Cout, kh, kw, Cin] with the Cin of x ", describe(x), ", got ",
          describe(w));
  require(conv.stride >= 1 && conv.pad >= 0, op, "expects stride >= 1 and pad >= 0, got stride ",
          conv.stride, ", pad ", conv.pad);
  ConvGeometry g;
  g.batch = int(x.shape()[0]), g.height = int(x.shape()[1]), g.width = int(x.shape()[2]);
  g.channels = int(x.shape()[3]);
  g.kernel_h = int(w.shape()[1]), g.kernel_w = int(w.shape()[2]);
  g.stride = conv.stride, g.pad = conv.pad;
  require(g.height + 2 * g.pad >= g.kernel_h && g.width + 2 * g.pad >= g.kernel_w, op,
          "the kernel of ", describe(w), " does not fit the padded input ", describe(x), " (pad ",
          g.pad, ")");
  g.out_h = (g.height + 2 * g.pad - g.kernel_h) / g.stride + 1;
  g.out_w = (g.width + 2 * g.pad - g.kernel_w) / g.stride + 1;
  require(x.numel() <= kMaxGemmExtent && g.out_pixels() * w.shape()[0] <= kMaxGemmExtent &&
              g.out_pixels() * g.patch() <= kMaxGemmExtent,
          op, "sizes must fit in 32 bits (at most ", kMaxGemmExtent, " elements), got x ",
          describe(x), ", w ", describe(w));
  return g;
}

// The dtype the GEMM runs in: f16 when every operand is f16, f32 otherwise.
DType common_dtype(std::initializer_list<const Tensor*> operands) {
  for (const Tensor* t : operands)
    if (t->dtype() != DType::f16) return DType::f32;
  return DType::f16;
}

// `t` itself when it already has `dtype`, else a converted copy on the device.
Tensor as_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor converted = Tensor::empty(t.shape(), dtype, Device::cuda);
  cast(t, converted);
  return converted;
}

// Throws Error unless `y` is a floating [N, Ho, Wo, Cout] tensor for this geometry.
void require_output_shape(const char* op, const char* name, const Tensor& y, const ConvGeometry& g,
                          int64_t out_channels) {
  require(y.defined() && is_floating(y.dtype()) &&
              y.shape() == Shape{g.batch, g.out_h, g.out_w, out_channels},
          op, "expects ", name, " f32/f16 [", g.batch, ", ", g.out_h, ", ", g.out_w, ", ",
          out_channels, "] (stride ", g.stride, ", pad ", g.pad, "), got ", describe(y));
}

// The conv input as the GEMM operand [N*Ho*Wo, kh*kw*Cin]: x itself for a pointwise conv.
GemmOperand input_operand(const Tensor& x, const ConvGeometry& g) {
  return g.is_pointwise() ? matrix_operand(x, false) : im2col_operand(x, g);
}

// w [Cout, kh, kw, Cin] as the matrix [Cout, K].
GemmOperand weight_operand(const Tensor& w, bool transposed) {
  return {transposed ? OperandKind::transposed : OperandKind::matrix,
          w.raw(),
          w.shape()[0],
          w.numel() / w.shape()[0],
          {}};
}

// dy [N, Ho, Wo, Cout] as the matrix [N*Ho*Wo, Cout].
GemmOperand output_grad_operand(const Tensor& dy, bool transposed) {
  return matrix_operand(dy, transposed);
}

// dx[n, ih, iw, ci] = sum of dcols[(n, oh, ow), (ky, kx, ci)] over the taps with
// oh * stride - pad + ky == ih and ow * stride - pad + kx == iw. One thread per dx element.
// dcols [N*Ho*Wo, kh*kw*Cin] f32, dx [N, H, W, Cin].
template <class T>
__global__ void col2im_kernel(const float* __restrict__ dcols, ConvGeometry g, T* __restrict__ dx,
                              int64_t total) {
  const int64_t patch = g.patch();
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int ci = int(idx % g.channels);
    const int iw = int((idx / g.channels) % g.width);
    const int ih = int((idx / (int64_t(g.channels) * g.width)) % g.height);
    const int n = int(idx / (int64_t(g.channels) * g.width * g.height));
    float sum = 0.0f;
    for (int ky = 0; ky < g.kernel_h; ++ky) {
      const int th = ih + g.pad - ky; // = oh * stride
      if (th < 0 || th % g.stride != 0 || th / g.stride >= g.out_h) continue;
      const int oh = th / g.stride;
      for (int kx = 0; kx < g.kernel_w; ++kx) {
        const int tw = iw + g.pad - kx; // = ow * stride
        if (tw < 0 || tw % g.stride != 0 || tw / g.stride >= g.out_w) continue;
        const int ow = tw / g.stride;
        const int64_t pixel = (int64_t(n) * g.out_h + oh) * g.out_w + ow;
        sum += dcols[pixel * patch + (ky * g.kernel_w + kx) * g.channels + ci];
      }
    }
    store_f(dx, idx, sum);
  }
}

void col2im(const Tensor& dcols, const ConvGeometry& g, Tensor& dx) {
  constexpr int kThreads = 256;
  const int64_t total = dx.numel();
  const int blocks = grid_for(total, kThreads);
  if (dx.dtype() == DType::f16)
    col2im_kernel<<<blocks, kThreads, 0, stream()>>>(ptr<float>(dcols), g, half_ptr(dx), total);
  else
    col2im_kernel<<<blocks, kThreads, 0, stream()>>>(ptr<float>(dcols), g, ptr<float>(dx), total);
  CUDA_CHECK_LAUNCH("conv2d_backward: col2im");
}

// dx[N, H, W, Cin] from dy [N, Ho, Wo, Cout] and w [Cout, kh, kw, Cin].
void input_gradient(const Tensor& w, const Tensor& dy, const ConvGeometry& g, Tensor& dx) {
  GemmArgs args;
  args.a = output_grad_operand(dy, false); // [N*Ho*Wo, Cout]
  args.b = weight_operand(w, false);       // [Cout, K]
  args.m = g.out_pixels(), args.n = g.patch(), args.k = w.shape()[0];
  if (g.is_pointwise()) { // dx [N*H*W, Cin] = dy @ w directly
    args.c = dx.raw();
    args.c_dtype = dx.dtype();
    run_gemm(args, dy.dtype());
    return;
  }
  Tensor dcols = Tensor::empty({g.out_pixels(), g.patch()}, DType::f32, Device::cuda);
  args.c = dcols.raw();
  args.c_dtype = DType::f32;
  run_gemm(args, dy.dtype());
  col2im(dcols, g, dx);
}

// dw[Cout, K] += dy^T @ im2col(x).
void weight_gradient(const Tensor& x, const Tensor& dy, const ConvGeometry& g, Tensor& dw) {
  GemmArgs args;
  args.a = output_grad_operand(dy, true); // dy^T: [Cout, N*Ho*Wo]
  args.b = input_operand(x, g);           // [N*Ho*Wo, K]
  args.c = dw.raw();
  args.c_dtype = DType::f32;
  args.m = dw.shape()[0], args.n = g.patch(), args.k = g.out_pixels();
  args.epilogue.beta = 1.0f; // accumulate
  run_gemm(args, x.dtype());
}

} // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvParams& conv,
                    const GemmEpilogue& epilogue) {
  const ConvGeometry g = conv_geometry("conv2d_forward", x, w, conv);
  const int64_t out_channels = w.shape()[0];
  require_output_shape("conv2d_forward", "y", y, g, out_channels);
  const Tensor* bias = epilogue.bias;
  require(!bias || (bias->dtype() == DType::f32 && bias->numel() == out_channels), "conv2d_forward",
          "bias must be f32 [", out_channels, "], got ", describe(bias));

  const DType dtype = common_dtype({&x, &w});
  const Tensor x_in = as_dtype(x, dtype), w_in = as_dtype(w, dtype);
  GemmArgs args;
  args.a = input_operand(x_in, g);     // [N*Ho*Wo, K]
  args.b = weight_operand(w_in, true); // w^T: [K, Cout]
  args.c = y.raw();
  args.c_dtype = y.dtype();
  args.m = g.out_pixels(), args.n = out_channels, args.k = g.patch();
  args.epilogue.bias = bias ? ptr<float>(*bias) : nullptr; // alpha/beta are not used by conv
  args.epilogue.relu = epilogue.relu;
  run_gemm(args, dtype);
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                     const ConvParams& conv) {
  const ConvGeometry g = conv_geometry("conv2d_backward", x, w, conv);
  require_output_shape("conv2d_backward", "dy", dy, g, w.shape()[0]);
  require_conv_gradients(x, w, dx, dw);
  const DType dtype = common_dtype({&x, &w, &dy});
  const Tensor dy_in = as_dtype(dy, dtype);
  if (dx.defined()) input_gradient(as_dtype(w, dtype), dy_in, g, dx);
  if (dw.defined()) weight_gradient(as_dtype(x, dtype), dy_in, g, dw);
}

} // namespace minamp::gpu
