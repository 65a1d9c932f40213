// The kernel interface (see kernel_list.h) and the parameter structs its kernels take.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace minamp {

struct GemmEpilogue {
  float alpha = 1.0f;
  float beta = 0.0f;
  const Tensor* bias = nullptr; // f32 [N], or nullptr
  bool relu = false;
  // f32 [2, N], or nullptr: when set, also written with the per-column mean (row 0) and biased
  // variance (row 1) of C as stored (after the epilogue, rounded to C's dtype): the training
  // statistics of a batch norm over C (BatchNormParams::batch_moments). Needs M >= 1.
  Tensor* column_moments = nullptr;
};

// A batch norm (and ReLU) that conv2d_forward/backward apply to their input x as they read it,
// instead of reading a normalised copy of it: the conv's input is relu?(gamma (x - mean) invstd
// + beta) per channel, as batchnorm_forward writes it (mean and invstd from it). All f32 [Cin].
struct InputNormalization {
  const Tensor* gamma = nullptr;
  const Tensor* beta = nullptr;
  const Tensor* mean = nullptr;
  const Tensor* invstd = nullptr;
  bool relu = false;
  // conv2d_backward only, f32 [2, Cin] or nullptr: also written, from dx (the gradient of the
  // normalised input, as stored) and x, with the sums the batch norm's backward needs:
  // sum(dx_hat) and sum(dx_hat * xhat) per channel, dx_hat being dx under the ReLU's mask
  // (BatchNormParams::grad_sums). Needs dx.
  Tensor* grad_sums = nullptr;
};

struct ConvParams {
  int stride = 1;
  int pad = 0;
};

// A max pooling window (PyTorch's MaxPool2d(kernel_size, stride, padding), ceil_mode False);
// the defaults are ResNet's stem.
struct MaxPoolParams {
  int kernel = 3;
  int stride = 2;
  int pad = 1;
};

struct BatchNormParams {
  bool training = true;
  float momentum = 0.1f;
  float eps = 1e-5f;
  bool relu = false;
  // Training only, f32 [2, C] or nullptr: x's per-channel mean and biased variance, already
  // computed by the GEMM that wrote x (GemmEpilogue::column_moments); the kernel then skips its
  // own statistics pass over x.
  const Tensor* batch_moments = nullptr;
  // Backward only, f32 [2, C] or nullptr: sum(dy_hat) and sum(dy_hat * xhat) per channel (dy_hat
  // = dy under the ReLU's mask), already computed by the GEMM that wrote dy
  // (InputNormalization::grad_sums); the kernel then skips its own reduction over x and dy.
  const Tensor* grad_sums = nullptr;
  // Backward only, f32 [C] or nullptr: also written with the sum over rows of dx as stored, per
  // channel. That is the bias gradient of the layer that wrote x, which so need not read dx
  // again (Node::grad_column_sums).
  Tensor* dx_sums = nullptr;
};

// The input gradient of a batch norm (+ ReLU), as batchnorm_backward would write it, described by
// what it is computed from instead of written: the batch norm's input x [rows, C], the gradient dy
// of its output (x's shape and dtype), gamma, beta and the saved mean and invstd (f32 [C]), the
// gradient sums (f32 [2, C], BatchNormParams::grad_sums) and the batch norm's mode and ReLU. The
// tensors are held, so that a node's gradient can wait in this form (Node::batchnorm_input_grad)
// for the op that reads it; dy's storage belongs to it (the gradient may be written over it).
struct BatchNormInputGrad {
  Tensor x, dy, gamma, beta, mean, invstd, grad_sums;
  bool training = true;
  bool relu = false;
};

// amp_update_scale's factors (amp::GradScalerOptions holds PyTorch's defaults).
struct ScalerParams {
  float growth_factor;
  float backoff_factor;
  int growth_interval;
};

// The tensors of one parameter that an optimizer step touches, the state named as torch.optim
// names it. `half` may be undefined (no f16 copy), and a step leaves the state it does not use
// null: sgd_step reads momentum_buffer (with momentum only), adam_step exp_avg and exp_avg_sq.
struct ParamSlot {
  Tensor* master = nullptr;          // f32, updated in place
  Tensor* grad = nullptr;            // f32
  Tensor* half = nullptr;            // f16 working copy, rewritten from the updated master
  Tensor* momentum_buffer = nullptr; // f32, SGD with momentum
  Tensor* exp_avg = nullptr;         // f32, Adam's first moment
  Tensor* exp_avg_sq = nullptr;      // f32, Adam's second moment
};

struct SgdParams {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

struct AdamParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

namespace kernels {
#include "kernels/kernel_list.h"
} // namespace kernels
namespace cpu {
#include "kernels/kernel_list.h"
} // namespace cpu
namespace gpu {
#include "kernels/kernel_list.h"
} // namespace gpu

} // namespace minamp
