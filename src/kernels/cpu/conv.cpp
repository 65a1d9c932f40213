// CPU reference of the 2-D convolution over channels-last activations, as GEMMs on im2col
// matrices: y = cols @ w^T (forward), dcols = dy @ w then col2im (input gradient), dw += dy^T @
// cols (weight gradient). Images go in groups of about kGroupRows output pixels, so that each GEMM
// is large enough for every thread while the cols buffer [G * Ho * Wo, kh * kw * Cin] stays a few
// MB; im2col / col2im run in parallel over the group's images. The groups depend on the shape only,
// so results never depend on the number of threads. A 1x1, stride-1, unpadded conv needs no
// im2col: its input already is the cols matrix.
#include <algorithm>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

// The input pixel an output pixel's kernel tap reads, or -1 when it falls in the padding.
int64_t input_offset(const ConvDims& d, int64_t oh, int64_t ow, int64_t i, int64_t j) {
  const int64_t ih = oh * d.stride - d.pad + i, iw = ow * d.stride - d.pad + j;
  if (ih < 0 || ih >= d.h || iw < 0 || iw >= d.w) return -1;
  return (ih * d.w + iw) * d.cin;
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
        for (int64_t i = 0; i < d.kh; ++i)
          for (int64_t j = 0; j < d.kw; ++j) {
            float* tap = row + (i * d.kw + j) * d.cin;
            const int64_t at = input_offset(d, oh, ow, i, j);
            // Loops, not fill_n/copy_n: those become memset/memmove calls, which cost more
            // than the copy itself for a few channels (Cin = 1 in the first layer).
            if (at < 0) {
#pragma omp simd
              for (int64_t c = 0; c < d.cin; ++c) tap[c] = 0.0f;
            } else {
#pragma omp simd
              for (int64_t c = 0; c < d.cin; ++c) tap[c] = image[at + c];
            }
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
        for (int64_t i = 0; i < d.kh; ++i)
          for (int64_t j = 0; j < d.kw; ++j) {
            const int64_t at = input_offset(d, oh, ow, i, j);
            if (at < 0) continue;
            const float* tap = row + (i * d.kw + j) * d.cin;
            for (int64_t c = 0; c < d.cin; ++c) image[at + c] += tap[c];
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

// dx[N, H, W, Cin] = col2im(dy @ w), group by group; dy [N*Ho*Wo, Cout], w [Cout, K].
void input_gradient(const FloatInput& dy, const FloatInput& w, const ConvDims& d, Tensor& dx) {
  const ConstMatrixMap weights = w.matrix(d.cout, d.patch());
  FloatOutput dx_values(dx, false);
  if (d.is_pointwise()) {
    const int64_t rows = d.n * d.h * d.w;
    dx_values.matrix(rows, d.cin).noalias() = dy.matrix(rows, d.cout) * weights;
  } else {
    std::fill_n(dx_values.data(), dx_values.size(), 0.0f);
    RowMatrix dcols(images_per_group(d) * d.out_pixels(), d.patch());
    for_each_group(d, [&](int64_t first, int64_t count, int64_t rows) {
      const ConstMatrixMap dy_group(dy.data() + first * d.out_pixels() * d.cout, rows,
                                    d.cout);              // [rows, Cout]
      dcols.topRows(rows).noalias() = dy_group * weights; // [rows, K]
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
    dw_matrix.noalias() += dy.matrix(rows, d.cout).transpose() * x.matrix(rows, d.cin);
    return;
  }
  RowMatrix cols(images_per_group(d) * d.out_pixels(), d.patch());
  for_each_group(d, [&](int64_t first, int64_t count, int64_t rows) {
    im2col(x.data(), d, first, count, cols);
    const ConstMatrixMap dy_group(dy.data() + first * d.out_pixels() * d.cout, rows,
                                  d.cout); // [rows, Cout]
    dw_matrix.noalias() += dy_group.transpose() * cols.topRows(rows);
  });
}

} // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, Tensor& y, const ConvParams& conv,
                    const GemmEpilogue& epilogue) {
  const ConvDims d = require_conv2d_forward(x, w, y, conv, epilogue);

  const FloatInput x_values(x), w_values(w);
  const ConstMatrixMap weights = w_values.matrix(d.cout, d.patch()); // [Cout, K]
  FloatOutput y_values(y, false);
  if (d.is_pointwise()) {
    const ConstMatrixMap pixels = x_values.matrix(d.n * d.h * d.w, d.cin); // [N*H*W, Cin]
    y_values.matrix(d.n * d.h * d.w, d.cout).noalias() = pixels * weights.transpose();
  } else {
    RowMatrix cols(images_per_group(d) * d.out_pixels(), d.patch());
    for_each_group(d, [&](int64_t first, int64_t count, int64_t rows) {
      im2col(x_values.data(), d, first, count, cols);
      MatrixMap y_group(y_values.data() + first * d.out_pixels() * d.cout, rows, d.cout);
      y_group.noalias() = cols.topRows(rows) * weights.transpose(); // [rows, Cout]
    });
  }
  apply_bias_relu(y_values.matrix(d.n * d.out_pixels(), d.cout), epilogue);
  y_values.store();
  store_column_moments(y, epilogue);
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor& dx, Tensor& dw,
                     const ConvParams& conv) {
  const ConvDims d = require_conv2d_backward(x, w, dy, dx, dw, conv);
  const FloatInput dy_values(dy);
  if (dx.defined()) input_gradient(dy_values, FloatInput(w), d, dx);
  if (dw.defined()) weight_gradient(FloatInput(x), dy_values, d, dw);
}

} // namespace minamp::cpu
