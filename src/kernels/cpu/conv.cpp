// CPU reference of the 2-D convolution over channels-last activations, as GEMMs on im2col
// matrices: y = cols @ w^T (forward), dcols = dy @ w then col2im (input gradient), dw += dy^T @
// cols (weight gradient). Images go in groups of about kGroupRows output pixels, so that each GEMM
// is large enough for every thread while the cols buffer [G * Ho * Wo, kh * kw * Cin] stays a few
// MB; im2col / col2im run in parallel over the group's images. The groups depend on the shape only,
// so results never depend on the number of threads. A 1x1, stride-1, unpadded conv needs no
// im2col: its input already is the cols matrix, and a 3x3 stride-1 conv with enough output
// pixels goes through Winograd's F(2x2, 3x3) instead (conv_winograd.h), forward and input
// gradient.
#include <algorithm>
#include <vector>

#include "kernels/cpu/conv_winograd.h"
#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

// The taps of kernel row i at output pixel (oh, ow) that fall inside the image: taps [j0, j1) read
// (j1 - j0) * Cin consecutive floats of the image [H, W, Cin] from offset `at` (consecutive taps
// are consecutive input pixels); the others read the zero padding. j0 == j1 when the whole
// kernel row is padding.
struct TapSpan {
  int64_t j0 = 0, j1 = 0, at = 0;
};
TapSpan tap_span(const ConvDims& d, int64_t oh, int64_t ow, int64_t i) {
  const int64_t ih = oh * d.stride - d.pad + i, iw = ow * d.stride - d.pad;
  if (ih < 0 || ih >= d.h) return {};
  const int64_t j0 = std::clamp<int64_t>(-iw, 0, d.kw),
                j1 = std::clamp<int64_t>(d.w - iw, j0, d.kw);
  return {j0, j1, (ih * d.w + iw + j0) * d.cin};
}

constexpr int64_t kGroupRows = 2048; // output pixels per GEMM, rounded to whole images

// The images per group: whole images with about kGroupRows output pixels in all (1 when the
// batch is empty).
int64_t images_per_group(const ConvDims& d) {
  return std::clamp<int64_t>(kGroupRows / std::max<int64_t>(d.out_pixels(), 1), 1,
                             std::max<int64_t>(d.n, 1));
}

// cols[count * Ho * Wo, kh * kw * Cin]: row (s, oh, ow) holds the input patch under the kernel at
// that output pixel of image first + s, taps in (i, j, c) order like w's rows; padding reads as
// zero. x: all samples [N, H, W, Cin].
void im2col(const float* x, const ConvDims& d, int64_t first, int64_t count, RowMatrix& cols) {
  const int64_t image_size = d.h * d.w * d.cin;
#pragma omp parallel for collapse(2) schedule(static) if (count * d.ho > 1)
  for (int64_t s = 0; s < count; ++s)
    for (int64_t oh = 0; oh < d.ho; ++oh) {
      const float* image = x + (first + s) * image_size;
      for (int64_t ow = 0; ow < d.wo; ++ow) {
        float* row = cols.data() + ((s * d.ho + oh) * d.wo + ow) * d.patch();
        for (int64_t i = 0; i < d.kh; ++i) {
          float* taps = row + i * d.kw * d.cin; // kernel row i: [kw, Cin]
          const TapSpan span = tap_span(d, oh, ow, i);
          const int64_t begin = span.j0 * d.cin, end = span.j1 * d.cin;
          // Loops, not fill_n/copy_n: those become memset/memmove calls, which cost more than
          // the copy itself for a few channels (Cin = 3 in ResNet's stem).
          for (int64_t k = 0; k < begin; ++k) taps[k] = 0.0f;
#pragma omp simd
          for (int64_t k = begin; k < end; ++k) taps[k] = image[span.at + k - begin];
          for (int64_t k = end; k < d.kw * d.cin; ++k) taps[k] = 0.0f;
        }
      }
    }
}

// The adjoint of im2col: dx[first + s] += every tap of cols that reads that pixel, in parallel
// over the images (each owns its part of dx [N, H, W, Cin]).
void col2im(const RowMatrix& cols, const ConvDims& d, int64_t first, int64_t count, float* dx) {
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t s = 0; s < count; ++s) {
    float* image = dx + (first + s) * d.h * d.w * d.cin;
    for (int64_t oh = 0; oh < d.ho; ++oh)
      for (int64_t ow = 0; ow < d.wo; ++ow) {
        const float* row = cols.data() + ((s * d.ho + oh) * d.wo + ow) * d.patch();
        for (int64_t i = 0; i < d.kh; ++i) {
          const TapSpan span = tap_span(d, oh, ow, i);
          const float* taps = row + (i * d.kw + span.j0) * d.cin;
#pragma omp simd
          for (int64_t k = 0; k < (span.j1 - span.j0) * d.cin; ++k) image[span.at + k] += taps[k];
        }
      }
  }
}

// Calls fn(first, count, rows) for each group of images in order: images [first, first + count),
// rows = count * Ho * Wo output pixels.
template <class GroupFn> void for_each_group(const ConvDims& d, const GroupFn& fn) {
  const int64_t group = images_per_group(d);
  for (int64_t first = 0; first < d.n; first += group) {
    const int64_t count = std::min(group, d.n - first);
    fn(first, count, count * d.out_pixels());
  }
}

// The input gradient of a 3x3 stride-1 conv with padding p <= 2 is itself one: dx = conv(dy,
// w', padding 2 - p), w' [Cin, 3, 3, Cout] the kernel turned by 180 degrees with its channels
// swapped, w'[ci, i, j, co] = w[co, 2 - i, 2 - j, ci]. The dims of that convolution.
ConvDims input_gradient_as_conv(const ConvDims& d) {
  return {d.n, d.ho, d.wo, d.cout, d.cin, 3, 3, d.h, d.w, 1, 2 - d.pad};
}
bool input_gradient_is_conv3x3(const ConvDims& d) {
  return d.kh == 3 && d.kw == 3 && d.stride == 1 && d.pad <= 2;
}
std::vector<float> turned_kernel(const float* w, const ConvDims& d) { // w' of w [Cout, 3, 3, Cin]
  std::vector<float> turned(static_cast<size_t>(d.cin * 9 * d.cout));
  for (int64_t co = 0; co < d.cout; ++co)
    for (int64_t tap = 0; tap < 9; ++tap)
      for (int64_t ci = 0; ci < d.cin; ++ci)
        turned[(ci * 9 + 8 - tap) * d.cout + co] = w[(co * 9 + tap) * d.cin + ci];
  return turned;
}

// dx[N, H, W, Cin] = col2im(dy @ w), group by group; dy [N*Ho*Wo, Cout], w [Cout, K]. Through
// Winograd when the gradient is a 3x3 conv that takes that path.
void input_gradient(const FloatInput& dy, const FloatInput& w, const ConvDims& d, Tensor& dx) {
  const ConstMatrixMap weights = w.matrix(d.cout, d.patch());
  FloatOutput dx_values(dx, false);
  if (input_gradient_is_conv3x3(d) && winograd_applies(input_gradient_as_conv(d))) {
    const std::vector<float> turned = turned_kernel(w.data(), d);
    winograd_conv2d_forward(dy.data(), turned.data(), dx_values.data(), input_gradient_as_conv(d));
  } else if (d.is_pointwise()) {
    const int64_t rows = d.n * d.h * d.w;
    matmul(dy.matrix(rows, d.cout), false, weights, false, dx_values.matrix(rows, d.cin), 1.0f,
           false);
  } else {
    std::fill_n(dx_values.data(), dx_values.size(), 0.0f);
    RowMatrix dcols(images_per_group(d) * d.out_pixels(), d.patch());
    for_each_group(d, [&](int64_t first, int64_t count, int64_t rows) {
      const ConstMatrixMap dy_group(dy.data() + first * d.out_pixels() * d.cout, rows,
                                    d.cout); // [rows, Cout]
      matmul(dy_group, false, weights, false, MatrixMap(dcols.data(), rows, d.patch()), 1.0f,
             false); // [rows, K]
      col2im(dcols, d, first, count, dx_values.data());
    });
  }
  dx_values.store();
}

// dw[Cout, K] += dy^T @ im2col(x), group by group; x [N, H, W, Cin], dy [N*Ho*Wo, Cout].
void weight_gradient(const FloatInput& x, const FloatInput& dy, const ConvDims& d, Tensor& dw) {
  MatrixMap dw_matrix(dw.data<float>(), d.cout, d.patch());
  if (d.is_pointwise()) {
    const int64_t rows = d.n * d.h * d.w;
    matmul(dy.matrix(rows, d.cout), true, x.matrix(rows, d.cin), false, dw_matrix, 1.0f, true);
    return;
  }
  RowMatrix cols(images_per_group(d) * d.out_pixels(), d.patch());
  for_each_group(d, [&](int64_t first, int64_t count, int64_t rows) {
    im2col(x.data(), d, first, count, cols);
    const ConstMatrixMap dy_group(dy.data() + first * d.out_pixels() * d.cout, rows,
                                  d.cout); // [rows, Cout]
    matmul(dy_group, true, ConstMatrixMap(cols.data(), rows, d.patch()), false, dw_matrix, 1.0f,
           true);
  });
}

} // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvParams& conv,
                    const GemmEpilogue& epilogue, const InputNormalization* input_norm) {
  const ConvDims d = require_conv2d_forward(x, w, y, conv, epilogue, input_norm, false);

  const FloatInput x_values(x), w_values(w);
  const ConstMatrixMap weights = w_values.matrix(d.cout, d.patch()); // [Cout, K]
  FloatOutput y_values(y, false);
  if (d.is_pointwise()) {
    const ConstMatrixMap pixels = x_values.matrix(d.n * d.h * d.w, d.cin); // [N*H*W, Cin]
    matmul(pixels, false, weights, true, y_values.matrix(d.n * d.h * d.w, d.cout), 1.0f, false);
  } else if (winograd_applies(d)) {
    winograd_conv2d_forward(x_values.data(), w_values.data(), y_values.data(), d);
  } else {
    RowMatrix cols(images_per_group(d) * d.out_pixels(), d.patch());
    for_each_group(d, [&](int64_t first, int64_t count, int64_t rows) {
      im2col(x_values.data(), d, first, count, cols);
      MatrixMap y_group(y_values.data() + first * d.out_pixels() * d.cout, rows, d.cout);
      matmul(ConstMatrixMap(cols.data(), rows, d.patch()), false, weights, true, y_group, 1.0f,
             false); // [rows, Cout]
    });
  }
  apply_bias_relu(y_values.matrix(d.n * d.out_pixels(), d.cout), epilogue);
  y_values.store();
  store_column_moments(y, epilogue);
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                     const ConvParams& conv, const InputNormalization* input_norm) {
  const ConvDims d = require_conv2d_backward(x, w, dy, dx, dw, conv, input_norm, false);
  const FloatInput dy_values(dy);
  if (dx.defined()) input_gradient(dy_values, FloatInput(w), d, dx);
  if (dw.defined()) weight_gradient(FloatInput(x), dy_values, d, dw);
}

// The CPU runs the batch norm before the conv, unfused: the reference of the fused GPU path.
bool conv2d_normalizes_on_load(const Tensor&, const Tensor&, const ConvParams&) { return false; }

// The CPU's batch norm writes its input gradient, which the conv then reads: the reference of the
// GPU path that reads it unwritten.
bool conv2d_reads_batchnorm_input_grad(const Tensor&, const Tensor&, const BatchNormInputGrad&,
                                       const ConvParams&) {
  return false;
}
void conv2d_backward_from_batchnorm(const Tensor& x, const Tensor& w,
                                    const BatchNormInputGrad& grad, Tensor& dw, Tensor& db,
                                    const ConvParams& conv) {
  require_conv2d_backward_from_batchnorm(x, w, grad, dw, db, conv, false);
}

} // namespace minamp::cpu
