// Casts, reshapes, ReLU, residual adds, pooling and scalar scaling as differentiable ops.
#include "amp/autocast.h"
#include "core/error.h"
#include "kernels/checks.h"
#include "ops/ops.h"

namespace minamp::ops {

Var cast(const Var& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  require(is_floating(dtype) && is_floating(x.dtype()), "cast", "cannot cast ", describe(x.value()),
          " to ", dtype);
  const DType from = x.dtype();
  return Var::from_op("cast", x.value().to(dtype), {x}, false,
                      [from](Node& self) { accumulate_grad(*self.inputs[0], self.grad.to(from)); });
}

Var reshape(const Var& x, const Shape& shape) {
  const Shape from = x.shape();
  return Var::from_op("reshape", x.value().reshape(shape), {x}, false, [from](Node& self) {
    accumulate_grad(*self.inputs[0], self.grad.reshape(from));
  });
}

Var relu(const Var& x) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::relu_forward(x.value(), y);
  return Var::from_op("relu", y, {x}, false, [y](Node& self) {
    Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
    kernels::relu_backward(y, self.grad, dx);
    accumulate_grad(*self.inputs[0], dx);
  });
}

Var add(const Var& a, const Var& b, bool relu) {
  require(a.shape() == b.shape() && a.device() == b.device(), "add",
          "expects two tensors of one shape on one device, got ", describe(a.value()), " and ",
          describe(b.value()));
  // Two tensors of one 16-bit format (f16 or bf16) add into it; anything else into f32.
  const DType dtype =
      is_half_precision(a.dtype()) && b.dtype() == a.dtype() ? a.dtype() : DType::f32;
  Tensor y = Tensor::empty(a.shape(), dtype, a.device());
  kernels::add_forward(a.value(), b.value(), y, relu);
  const Tensor saved_y = relu ? y : Tensor(); // the ReLU's mask
  return Var::from_op("add", y, {a, b}, false, [saved_y](Node& self) {
    Tensor dy = self.grad;
    if (saved_y.defined()) {
      dy = Tensor::empty(self.grad.shape(), self.grad.dtype(), self.grad.device());
      kernels::relu_backward(saved_y, self.grad, dy);
    }
    // Both inputs take the one gradient over: accumulate_grad copies a shared one before adding
    // into it, so a residual block's identity path costs no copy when nothing else adds to it.
    Node& left = *self.inputs[0];
    Node& right = *self.inputs[1];
    if (right.requires_grad) accumulate_grad(right, dy);
    if (left.requires_grad) accumulate_grad(left, dy);
  });
}

Var global_avgpool(const Var& x) {
  require(x.shape().rank() == 4, "global_avgpool", "expected x [N, H, W, C], got ",
          describe(x.value()));
  const Shape in_shape = x.shape();
  Tensor y = Tensor::empty({in_shape[0], in_shape[3]}, x.dtype(), x.device());
  kernels::avgpool_forward(x.value(), y);
  return Var::from_op("global_avgpool", y, {x}, false, [in_shape](Node& self) {
    Tensor dx = Tensor::empty(in_shape, self.dtype, self.device);
    kernels::avgpool_backward(self.grad, dx);
    accumulate_grad(*self.inputs[0], dx);
  });
}

Var max_pool2d(const Var& x, const MaxPoolParams& pool) {
  const Shape in_shape = x.shape();
  const MaxPoolDims d = maxpool2d_dims("max_pool2d", "x", x.value(), pool);
  const Shape out_shape{d.n, d.ho, d.wo, d.c};
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor argmax;
  if (grad_enabled() && x.requires_grad())
    argmax = Tensor::empty(out_shape, DType::i32, x.device());
  kernels::maxpool2d_forward(x.value(), y, argmax, pool);
  return Var::from_op("max_pool2d", y, {x}, false, [argmax, pool, in_shape](Node& self) {
    Tensor dx = Tensor::empty(in_shape, self.dtype, self.device);
    kernels::maxpool2d_backward(self.grad, argmax, dx, pool);
    accumulate_grad(*self.inputs[0], dx);
  });
}

Var mul_scalar(const Var& x, const Tensor& scale) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::mul_scalar(x.value(), scale, y);
  return Var::from_op("mul_scalar", y, {x}, false, [scale](Node& self) {
    Tensor dx = Tensor::empty(self.shape, self.dtype, self.device);
    kernels::mul_scalar(self.grad, scale, dx);
    accumulate_grad(*self.inputs[0], dx);
  });
}

} // namespace minamp::ops
