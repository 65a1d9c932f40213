// Differentiable ops: each runs its forward kernel, records a backward closure on the tape, and
// consults the autocast policy (amp/autocast.h) for the dtype it computes in. Ops that use a
// Parameter write its gradient (fp32, +=) straight into Parameter::grad during backward; the
// Parameter must outlive the backward pass.
#pragma once

#include "autograd/var.h"
#include "kernels/kernels.h"
#include "nn/parameter.h"

namespace minamp::ops {

// x converted to `dtype` (into f16 or bf16 rounding to nearest even); the gradient is cast back.
Var cast(const Var& x, DType dtype);
// The same values viewed with another shape.
Var reshape(const Var& x, const Shape& shape);

// y[rows, out] = x[rows, in] @ weight[out, in]^T + bias[out], then ReLU when `relu`.
// Autocast: matmul class (16-bit operands and result, fp32 accumulation). With `moments`, also
// *moments = f32 [2, out]: y's per-column mean and biased variance, as stored (for a following
// batch norm: BatchNormParams::batch_moments; not differentiated).
Var linear(const Var& x, Parameter& weight, Parameter* bias, bool relu = false,
           Tensor* moments = nullptr);
// y[N, Ho, Wo, Cout] = conv2d(x[N, H, W, Cin], weight[Cout, kh, kw, Cin]) + bias, ReLU if `relu`;
// `moments` as for linear, f32 [2, Cout].
Var conv2d(const Var& x, Parameter& weight, Parameter* bias, const ConvParams& conv,
           bool relu = false, Tensor* moments = nullptr);
// Batch norm over the channels (last dimension) of x[rows, C] or x[N, H, W, C]; in training it
// updates running_mean/var (f32 [C]), from bn.batch_moments when given. ReLU fused when bn.relu.
Var batch_norm(const Var& x, Parameter& gamma, Parameter& beta, Tensor& running_mean,
               Tensor& running_var, const BatchNormParams& bn);
// A batch norm's parameters, running statistics and settings, as batch_norm takes them.
struct BatchNormArgs {
  Parameter& gamma;
  Parameter& beta;
  Tensor& running_mean;
  Tensor& running_var;
  BatchNormParams bn;
};
// conv2d(batch_norm(x)) as one op where the conv can normalise its input as it loads it
// (kernels::conv2d_normalizes_on_load: 1x1 convs on CUDA): the batch norm's statistics and
// running-statistics update as batch_norm's, but its output is never written, and the backward
// keeps x alone (not x and the normalised activation), reading it normalised again for the
// conv's weight gradient and recomputing the ReLU mask from it. Elsewhere, the two ops unfused;
// x is taken by value so that, with no graph to keep it (inference), it is freed before the conv
// allocates its output, as it is between two separate layers.
Var batch_norm_conv2d(Var x, const BatchNormArgs& norm, Parameter& weight, Parameter* bias,
                      const ConvParams& conv, bool relu = false, Tensor* moments = nullptr);
Var relu(const Var& x);
// y = a + b, then ReLU when `relu` (a residual connection); a and b have one shape. f16 + f16 is
// f16, any f32 makes it f32 (PyTorch's type promotion).
Var add(const Var& a, const Var& b, bool relu = false);
// y[N, C] = mean over H, W of x[N, H, W, C].
Var global_avgpool(const Var& x);
// y[N, Ho, Wo, C] = the largest value of x[N, H, W, C] in each window (PyTorch's max_pool2d,
// ceil_mode False); the gradient goes to each window's argmax, kept from the forward pass (i32, a
// quarter of x at stride 2) only when x requires grad.
Var max_pool2d(const Var& x, const MaxPoolParams& pool);

// y = x * scale[0], where scale is an f32 [1] tensor (the loss scale); not differentiated in scale.
Var mul_scalar(const Var& x, const Tensor& scale);

// Mean squared error, fp32: loss[1] = mean((pred - target)^2); target has pred's shape.
Var mse_loss(const Var& pred, const Tensor& target);
// Softmax cross-entropy on logits[N, K] with labels i32 [N], mean over N, fp32.
Var cross_entropy(const Var& logits, const Tensor& labels);

} // namespace minamp::ops
