// Linear, Conv2d and BatchNorm as differentiable ops on fp32 masters / f16 working copies, and a
// batch norm folded into the 1x1 conv after it (batch_norm_conv2d), whose backward also sums
// the batch norm's dx per channel for the bias gradient of the layer before it, or hands that
// layer dx unwritten, as its terms, when it reads them itself (a conv whose input needs no
// gradient). A frozen parameter gets no gradient; an op whose parameters are all frozen and whose
// input needs no gradient records nothing (a frozen prefix of a network keeps no activations).
#include "amp/autocast.h"
#include "core/error.h"
#include "ops/ops.h"

namespace minamp::ops {

namespace {

// dy masked by the fused ReLU's output y (zero where y <= 0), or dy itself when no ReLU was
// fused.
Tensor unfused_relu_grad(const Tensor& y, const Tensor& dy, bool relu) {
  if (!relu) return dy;
  Tensor masked = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  kernels::relu_backward(y, dy, masked);
  return masked;
}

// db += the sum of dy per channel: the sums that came with the node's gradient
// (Node::grad_column_sums) when dy is that gradient as it came, else a reduction over dy.
void bias_backward(const Node& self, const Tensor& dy, Parameter& bias) {
  if (self.grad_column_sums.defined() && dy.raw() == self.grad.raw())
    kernels::add_inplace(bias.grad(), self.grad_column_sums, 1.0f);
  else
    kernels::bias_backward(dy, bias.grad());
}

// Asks for the per-channel sums of y's gradient with the gradient when y's backward reduces that
// gradient as it comes: a trainable bias and no fused ReLU between.
Var asking_for_grad_sums(Var y, bool bias_grad, bool relu) {
  if (bias_grad && !relu && y.requires_grad()) y.node().wants_grad_column_sums = true;
  return y;
}

// The parameter's gradient, or a zero f32 tensor of its shape when it is frozen (for kernels that
// write every gradient).
Tensor grad_or_scratch(Parameter& p) {
  if (p.requires_grad()) return p.grad();
  return Tensor::zeros(p.master().shape(), DType::f32, p.master().device());
}

// An epilogue with the bias and ReLU, and the output's column moments when `moments` is given
// (a fresh f32 [2, channels] tensor is put there).
GemmEpilogue forward_epilogue(Parameter* bias, bool relu, Tensor* moments, int64_t channels,
                              Device device) {
  GemmEpilogue epilogue;
  epilogue.bias = bias ? &bias->master() : nullptr;
  epilogue.relu = relu;
  if (moments) {
    *moments = Tensor::empty({2, channels}, DType::f32, device);
    epilogue.column_moments = moments;
  }
  return epilogue;
}

void require_parameter_device(const char* op, const Var& x, Parameter& p) {
  require(p.master().device() == x.device(), op, "input ", describe(x.value()), " and parameter ",
          describe(p.master()), " are on different devices");
}

// The checks batch_norm makes of its input; returns the channels.
int64_t require_batch_norm_input(const Var& x, Parameter& gamma, const BatchNormParams& bn) {
  const int64_t channels = gamma.master().numel();
  require(x.shape().rank() >= 2 && x.shape().last() == channels, "BatchNorm",
          "expected input [rows, ", channels, "] or [N, H, W, ", channels, "], got ",
          describe(x.value()));
  require(!bn.training || x.shape().rows() > 1, "BatchNorm",
          "training needs more than one value per channel, got ", describe(x.value()));
  require_parameter_device("BatchNorm", x, gamma);
  return channels;
}

} // namespace

Var linear(const Var& x, Parameter& weight, Parameter* bias, bool relu, Tensor* moments) {
  const Shape& ws = weight.master().shape();
  require(x.shape().rank() == 2 && x.shape()[1] == ws[1], "Linear", "expected input [rows, ", ws[1],
          "] for weight [", ws[0], ", ", ws[1], "], got ", describe(x.value()));
  require_parameter_device("Linear", x, weight);
  const DType dtype = amp::autocast_dtype(amp::OpClass::matmul, x.dtype());
  Var xc = cast(x, dtype);
  const Tensor w = weight.working_copy(dtype);                        // [out, in]
  Tensor y = Tensor::empty({x.shape()[0], ws[0]}, dtype, x.device()); // [rows, out]
  kernels::gemm(xc.value(), false, w, true, y,
                forward_epilogue(bias, relu, moments, ws[0], x.device()));

  const Tensor saved_x = xc.value(), saved_y = relu ? y : Tensor(); // saved_y: the ReLU's mask
  const bool weight_grad = weight.requires_grad(), bias_grad = bias && bias->requires_grad();
  return Var::from_op("linear", y, {xc}, weight_grad || bias_grad, [=, &weight](Node& self) {
    const Tensor dy = unfused_relu_grad(saved_y, self.grad, relu); // [rows, out]
    GemmEpilogue accumulate;
    accumulate.beta = 1.0f;
    if (weight_grad) // dW[out, in] += dy^T x
      kernels::gemm(dy, true, saved_x, false, weight.grad(), accumulate);
    if (bias_grad) kernels::bias_backward(dy, bias->grad()); // db[out] += sum_rows dy
    Node& input = *self.inputs[0];
    if (!input.requires_grad) return;
    Tensor dx = Tensor::empty(saved_x.shape(), dtype, saved_x.device()); // [rows, in] = dy W
    kernels::gemm(dy, false, w, false, dx, GemmEpilogue{});
    accumulate_grad(input, dx);
  });
}

Var conv2d(const Var& x, Parameter& weight, Parameter* bias, const ConvParams& conv, bool relu,
           Tensor* moments) {
  const Shape& ws = weight.master().shape(); // [Cout, kh, kw, Cin]
  const Shape& xs = x.shape();
  require(xs.rank() == 4 && xs[3] == ws[3], "Conv2d", "expected input [N, H, W, ", ws[3],
          "] (channels last) for weight ", ws, ", got ", describe(x.value()));
  require_parameter_device("Conv2d", x, weight);
  require(conv.stride >= 1 && conv.pad >= 0, "Conv2d",
          "expects stride >= 1 and pad >= 0, got stride ", conv.stride, ", pad ", conv.pad);
  // Checked before dividing: with stride > 1, C++ division would round a negative span up to 0.
  require(xs[1] + 2 * conv.pad >= ws[1] && xs[2] + 2 * conv.pad >= ws[2], "Conv2d", "input ",
          describe(x.value()), " is smaller than the ", ws[1], "x", ws[2], " kernel with padding ",
          conv.pad);
  const int64_t ho = (xs[1] + 2 * conv.pad - ws[1]) / conv.stride + 1;
  const int64_t wo = (xs[2] + 2 * conv.pad - ws[2]) / conv.stride + 1;
  const DType dtype = amp::autocast_dtype(amp::OpClass::matmul, x.dtype());
  Var xc = cast(x, dtype);
  const Tensor w = weight.working_copy(dtype);
  Tensor y = Tensor::empty({xs[0], ho, wo, ws[0]}, dtype, x.device()); // [N, Ho, Wo, Cout]
  kernels::conv2d_forward(xc.value(), w, y, conv,
                          forward_epilogue(bias, relu, moments, ws[0], x.device()));

  const Tensor saved_x = xc.value(), saved_y = relu ? y : Tensor(); // saved_y: the ReLU's mask
  const bool weight_grad = weight.requires_grad(), bias_grad = bias && bias->requires_grad();
  Var out = Var::from_op("conv2d", y, {xc}, weight_grad || bias_grad, [=, &weight](Node& self) {
    Tensor no_dw, no_db;
    if (self.batchnorm_input_grad) { // the batch norm after it gave its input gradient unwritten
      if (kernels::conv2d_reads_batchnorm_input_grad(saved_x, w, *self.batchnorm_input_grad,
                                                     conv)) {
        kernels::conv2d_backward_from_batchnorm(saved_x, w, *self.batchnorm_input_grad,
                                                weight_grad ? weight.grad() : no_dw,
                                                bias_grad ? bias->grad() : no_db, conv);
        return;
      }
      write_batchnorm_input_grad(self);
    }
    const Tensor dy = unfused_relu_grad(saved_y, self.grad, relu);
    if (bias_grad) bias_backward(self, dy, *bias);
    Node& input = *self.inputs[0];
    Tensor dx;
    if (input.requires_grad) dx = Tensor::empty(saved_x.shape(), dtype, saved_x.device());
    kernels::conv2d_backward(saved_x, w, dy, dx, weight_grad ? weight.grad() : no_dw, conv);
    if (dx.defined()) accumulate_grad(input, dx);
  });
  // Without an input gradient, its output's gradient may come as a batch norm's input gradient
  // unwritten (Node::takes_batchnorm_input_grad).
  if (!relu && !xc.requires_grad() && out.requires_grad())
    out.node().takes_batchnorm_input_grad = true;
  return asking_for_grad_sums(out, bias_grad, relu);
}

Var batch_norm(const Var& x, Parameter& gamma, Parameter& beta, Tensor& running_mean,
               Tensor& running_var, const BatchNormParams& bn) {
  const int64_t channels = require_batch_norm_input(x, gamma, bn);
  Var xc = cast(x, amp::autocast_dtype(amp::OpClass::normalize, x.dtype()));
  Tensor y = Tensor::empty(x.shape(), xc.dtype(), x.device());
  Tensor mean = Tensor::empty({channels}, DType::f32, x.device());
  Tensor invstd = Tensor::empty({channels}, DType::f32, x.device());
  // Given moments are those of x as stored; a cast to another dtype needs its own.
  BatchNormParams forward_bn = bn;
  if (xc.value().raw() != x.value().raw()) forward_bn.batch_moments = nullptr;
  kernels::batchnorm_forward(xc.value(), gamma.master(), beta.master(), y, mean, invstd,
                             running_mean, running_var, forward_bn);
  BatchNormParams backward_bn = bn;
  backward_bn.batch_moments = nullptr; // a forward-only input, not kept

  const Tensor saved_x = xc.value();
  const bool affine_grad = gamma.requires_grad() || beta.requires_grad();
  return Var::from_op("batch_norm", y, {xc}, affine_grad, [=, &gamma, &beta](Node& self) {
    Tensor dx = Tensor::empty(saved_x.shape(), saved_x.dtype(), saved_x.device());
    // The kernel writes both affine gradients: a frozen one goes to a scratch tensor.
    Tensor dgamma = grad_or_scratch(gamma), dbeta = grad_or_scratch(beta);
    kernels::batchnorm_backward(saved_x, gamma.master(), beta.master(), mean, invstd, self.grad, dx,
                                dgamma, dbeta, backward_bn);
    if (self.inputs[0]->requires_grad) accumulate_grad(*self.inputs[0], dx);
  });
}

Var batch_norm_conv2d(Var x, const BatchNormArgs& norm, Parameter& weight, Parameter* bias,
                      const ConvParams& conv, bool relu, Tensor* moments) {
  const int64_t channels = require_batch_norm_input(x, norm.gamma, norm.bn);
  require_parameter_device("Conv2d", x, weight);
  Var xc = cast(x, amp::autocast_dtype(amp::OpClass::normalize, x.dtype()));
  // The conv reads the batch norm's output in its own dtype: fused only when no cast lies between.
  const DType dtype = amp::autocast_dtype(amp::OpClass::matmul, xc.dtype());
  const Tensor w = weight.working_copy(dtype); // [Cout, 1, 1, Cin]
  if (dtype != xc.dtype() || !kernels::conv2d_normalizes_on_load(xc.value(), w, conv)) {
    const Var normalized =
        batch_norm(x, norm.gamma, norm.beta, norm.running_mean, norm.running_var, norm.bn);
    x = xc = Var(); // inference holds no other reference: the conv's output may take their memory
    return conv2d(normalized, weight, bias, conv, relu, moments);
  }

  Parameter &gamma = norm.gamma, &beta = norm.beta;
  const Device device = x.device();
  Tensor mean = Tensor::empty({channels}, DType::f32, device);
  Tensor invstd = Tensor::empty({channels}, DType::f32, device);
  BatchNormParams forward_bn = norm.bn; // given moments are those of x as stored
  if (xc.value().raw() != x.value().raw()) forward_bn.batch_moments = nullptr;
  Tensor no_output; // the statistics only: the conv normalises x as it loads it
  kernels::batchnorm_forward(xc.value(), gamma.master(), beta.master(), no_output, mean, invstd,
                             norm.running_mean, norm.running_var, forward_bn);
  const InputNormalization input_norm{&gamma.master(), &beta.master(), &mean, &invstd,
                                      norm.bn.relu};
  const Shape& xs = x.shape();
  Tensor y = Tensor::empty({xs[0], xs[1], xs[2], w.shape()[0]}, dtype, device); // [N, H, W, Cout]
  kernels::conv2d_forward(xc.value(), w, y, conv,
                          forward_epilogue(bias, relu, moments, w.shape()[0], device), &input_norm);

  BatchNormParams backward_bn = norm.bn;
  backward_bn.batch_moments = nullptr; // a forward-only input, not kept
  const Tensor saved_x = xc.value(), saved_y = relu ? y : Tensor(); // saved_y: the ReLU's mask
  const bool weight_grad = weight.requires_grad(), bias_grad = bias && bias->requires_grad();
  const bool affine_grad = gamma.requires_grad() || beta.requires_grad();
  Var out = Var::from_op(
      "batch_norm_conv2d", y, {xc}, weight_grad || bias_grad || affine_grad,
      [=, &weight, &gamma, &beta](Node& self) {
        const Tensor dy = unfused_relu_grad(saved_y, self.grad, relu);
        if (bias_grad) bias_backward(self, dy, *bias);
        Node& input = *self.inputs[0];
        const bool norm_grad = input.requires_grad || affine_grad;
        // The gradient of the batch norm's output, and the batch norm backward's sums over it,
        // which the input gradient's GEMM adds up as it writes it.
        Tensor d_normalized, grad_sums, no_dw;
        if (norm_grad) {
          d_normalized = Tensor::empty(saved_x.shape(), dtype, saved_x.device());
          grad_sums = Tensor::empty({2, channels}, DType::f32, saved_x.device());
        }
        const InputNormalization input_norm{
            &gamma.master(), &beta.master(),   &mean,
            &invstd,         backward_bn.relu, norm_grad ? &grad_sums : nullptr};
        kernels::conv2d_backward(saved_x, w, dy, d_normalized, weight_grad ? weight.grad() : no_dw,
                                 conv, &input_norm);
        if (!norm_grad) return;
        Tensor dgamma = grad_or_scratch(gamma), dbeta = grad_or_scratch(beta);
        BatchNormParams sums_bn = backward_bn;
        sums_bn.grad_sums = &grad_sums;
        if (input.requires_grad && input.takes_batchnorm_input_grad) {
          // The layer before reads dx as its terms (x, d_normalized, the statistics and sums):
          // the affine gradients only here, and no dx is written.
          Tensor no_dx;
          if (affine_grad)
            kernels::batchnorm_backward(saved_x, gamma.master(), beta.master(), mean, invstd,
                                        d_normalized, no_dx, dgamma, dbeta, sums_bn);
          accumulate_grad(input, BatchNormInputGrad{saved_x, d_normalized, gamma.master(),
                                                    beta.master(), mean, invstd, grad_sums,
                                                    backward_bn.training, backward_bn.relu});
          return;
        }
        // dx overwrites d_normalized (same dtype: fused only without a cast), which nothing else
        // holds: the backward keeps one activation-sized gradient less at its peak.
        Tensor dx = d_normalized;
        // The bias gradient of the layer before, summed as dx is written, when it asks for it.
        Tensor dx_sums;
        if (input.requires_grad && input.wants_grad_column_sums) {
          dx_sums = Tensor::empty({channels}, DType::f32, saved_x.device());
          sums_bn.dx_sums = &dx_sums;
        }
        kernels::batchnorm_backward(saved_x, gamma.master(), beta.master(), mean, invstd,
                                    d_normalized, dx, dgamma, dbeta, sums_bn);
        if (input.requires_grad) accumulate_grad(input, dx, dx_sums);
      });
  return asking_for_grad_sums(out, bias_grad, relu);
}

} // namespace minamp::ops
