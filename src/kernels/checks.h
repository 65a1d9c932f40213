// Argument checks shared by both backends' kernels; each throws Error naming the op and the
// tensor. (The dispatcher checks devices and GEMM shapes; kernels check what is theirs.)
#pragma once

#include "kernels/kernels.h"

namespace minamp {

// Unless `tensor` is defined with a floating dtype:
void require_floating(const char* op, const char* name, const Tensor& tensor);
// Unless `tensor` is defined, f32 and has `numel` elements:
void require_f32(const char* op, const char* name, const Tensor& tensor, int64_t numel);
// Unless both are defined and have the same number of elements:
void require_same_numel(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                        const Tensor& b);
// Unless the optimizer slot has master and grad f32 of one size, `states` state tensors (0, 1 or
// 2) f32 of that size, and an f16 copy of that size when it has one:
void require_param_slot(const char* op, const ParamSlot& slot, int states);

// The per-op checks (what kernel_list.h promises about each argument), shared by both backends.

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
                                         const Tensor& dbeta);

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

struct LogitDims {
  int64_t rows, classes; // logits [N, K]
};
// Checks logits [N, K] (floating) and labels i32 [N]; returns N and K.
LogitDims require_logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels);
// The same, and dloss f32 [1], dlogits floating and shaped like logits.
LogitDims require_cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                         const Tensor& dloss, const Tensor& dlogits);

// a, b and y floating with one size.
void require_add_forward(const Tensor& a, const Tensor& b, const Tensor& y);
// y, dy and dx floating with one size.
void require_relu_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);

// The conv gradients that are defined: dx floating and shaped like x, dw f32 and shaped like w.
void require_conv_gradients(const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw);

} // namespace minamp
