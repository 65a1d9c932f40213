// Each kernel's argument checks, one function per op of kernel_list.h: both backends call it
// first, so a contract is checked in one place and fails with one message on either device.
// Each throws Error naming the op and the tensor. (The dispatcher, kernels::, checks that an op's
// tensors share one device; a backend adds only its own limits, e.g. the CUDA kernels' 32-bit
// extents.)
#pragma once

#include "kernels/kernels.h"

namespace minamp {

// The building blocks. Unless `tensor` is defined with a floating dtype:
void require_floating(const char* op, const char* name, const Tensor& tensor);
// Unless `tensor` is defined, f32 and has `numel` elements:
void require_f32(const char* op, const char* name, const Tensor& tensor, int64_t numel);
// Unless `tensor` is defined, f32 and [2, channels] (per-channel mean and variance):
void require_moments(const char* op, const char* name, const Tensor& tensor, int64_t channels);
// Unless epilogue.column_moments is unset, or f32 [2, N] for an output C [M, N] with M >= 1:
void require_column_moments(const char* op, const GemmEpilogue& epilogue, int64_t m, int64_t n);
// Unless both are defined and have the same number of elements:
void require_same_numel(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                        const Tensor& b);

// The per-op checks (what kernel_list.h promises about each argument).

void require_fill(const Tensor& dst, float value);
void require_cast(const Tensor& src, const Tensor& dst);
void require_add_inplace(const Tensor& dst, const Tensor& src);
void require_mul_scalar(const Tensor& src, const Tensor& scale, const Tensor& dst);

struct GemmDims {
  int64_t m, n, k; // C [M, N] = op(A) [M, K] @ op(B) [K, N]
};
GemmDims require_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                      const GemmEpilogue& epilogue);
void require_bias_backward(const Tensor& dy, const Tensor& db);

void require_relu_forward(const Tensor& x, const Tensor& y);
void require_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);

// The sizes of one convolution: x [N, H, W, Cin], w [Cout, kh, kw, Cin], y [N, Ho, Wo, Cout].
struct ConvDims {
  int64_t n, h, w, cin, cout, kh, kw, ho, wo;
  int stride, pad;

  int64_t patch() const { return kh * kw * cin; } // K of the forward GEMM: one im2col row
  int64_t out_pixels() const { return ho * wo; }  // of one image
  bool is_pointwise() const { return kh == 1 && kw == 1 && stride == 1 && pad == 0; }
};
// With input_norm, also its vectors, and that the backend takes it here (normalizes_on_load,
// conv2d_normalizes_on_load's answer); its grad_sums, for conv2d_backward only, with dx.
ConvDims require_conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& y,
                                const ConvParams& conv, const GemmEpilogue& epilogue,
                                const InputNormalization* input_norm = nullptr,
                                bool normalizes_on_load = false);
ConvDims require_conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy,
                                 const Tensor& dx, const Tensor& dw, const ConvParams& conv,
                                 const InputNormalization* input_norm = nullptr,
                                 bool normalizes_on_load = false);
// With the backend's word that it takes these tensors (reads_batchnorm_grad,
// conv2d_reads_batchnorm_input_grad's answer).
ConvDims require_conv2d_backward_from_batchnorm(const Tensor& x, const Tensor& w,
                                                const BatchNormInputGrad& grad, const Tensor& dw,
                                                const Tensor& db, const ConvParams& conv,
                                                bool reads_batchnorm_grad);

struct BatchNormDims {
  int64_t rows, channels; // x viewed as [rows, C]
};
BatchNormDims require_batchnorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                        const Tensor& y, const Tensor& mean, const Tensor& invstd,
                                        const Tensor& running_mean, const Tensor& running_var,
                                        const BatchNormParams& bn);
BatchNormDims require_batchnorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                         const Tensor& mean, const Tensor& invstd, const Tensor& dy,
                                         const Tensor& dx, const Tensor& dgamma,
                                         const Tensor& dbeta, const BatchNormParams& bn);

struct PoolDims {
  int64_t n, pixels, channels; // [N, H, W, C] with pixels = H * W
};
PoolDims require_avgpool_forward(const Tensor& x, const Tensor& y);
PoolDims require_avgpool_backward(const Tensor& dy, const Tensor& dx);

// The sizes of a max pooling: x [N, H, W, C] -> y [N, Ho, Wo, C].
struct MaxPoolDims {
  int64_t n, h, w, c, ho, wo;
  int kernel, stride, pad;
};
// The pooling of `name` = x floating [N, H, W, C] by `pool`, checked: the window's parameters
// (kernel, stride >= 1, 0 <= pad <= kernel / 2, as PyTorch) and that it fits the padded input.
MaxPoolDims maxpool2d_dims(const char* op, const char* name, const Tensor& x,
                           const MaxPoolParams& pool);
// x as maxpool2d_dims takes it, y of x's dtype and argmax (when defined) i32, both [N, Ho, Wo, C].
MaxPoolDims require_maxpool2d_forward(const Tensor& x, const Tensor& y, const Tensor& argmax,
                                      const MaxPoolParams& pool);
// dx as maxpool2d_dims takes it, dy floating and argmax i32 [N, Ho, Wo, C].
MaxPoolDims require_maxpool2d_backward(const Tensor& dy, const Tensor& argmax, const Tensor& dx,
                                       const MaxPoolParams& pool);

void require_mse_forward(const Tensor& pred, const Tensor& target, const Tensor& loss);
void require_mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss,
                          const Tensor& dpred);

struct LogitDims {
  int64_t rows, classes; // logits [N, K]
};
LogitDims require_cross_entropy_forward(const Tensor& logits, const Tensor& labels,
                                        const Tensor& loss);
LogitDims require_cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                         const Tensor& dloss, const Tensor& dlogits);

// a, b and y floating with one size.
void require_add_forward(const Tensor& a, const Tensor& b, const Tensor& y);
void require_sum_squares(const Tensor& x, const Tensor& sum_sq);
void require_clip_coefficient(const Tensor& sum_sq, const Tensor& coef);

void require_amp_unscale(const std::vector<Tensor*>& grads, const Tensor& scale,
                         const Tensor& found_inf);
void require_amp_update_scale(const Tensor& scale, const Tensor& growth_tracker,
                              const Tensor& found_inf);
void require_range_counts(const Tensor& x, DType format, const Tensor& counts);

void require_zero_grads(const std::vector<Tensor*>& grads);
void require_sgd_step(const std::vector<ParamSlot>& params, const SgdParams& sgd,
                      const Tensor& found_inf);
void require_adam_step(const std::vector<ParamSlot>& params, const Tensor& step,
                       const Tensor& found_inf);

} // namespace minamp
