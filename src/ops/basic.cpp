// Casts, reshapes, ReLU, pooling and scalar scaling as differentiable ops.
#include "amp/autocast.h"
#include "core/error.h"
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
  return Var::from_op("relu", y, {x}, false, [](Node& self) {
    Tensor dx = Tensor::empty(self.value.shape(), self.value.dtype(), self.value.device());
    kernels::relu_backward(self.value, self.grad, dx);
    accumulate_grad(*self.inputs[0], dx);
  });
}

Var global_avgpool(const Var& x) {
  require(x.shape().rank() == 4, "global_avgpool", "expected x [N, H, W, C], got ",
          describe(x.value()));
  const Shape in_shape = x.shape();
  Tensor y = Tensor::empty({in_shape[0], in_shape[3]}, x.dtype(), x.device());
  kernels::avgpool_forward(x.value(), y);
  return Var::from_op("global_avgpool", y, {x}, false, [in_shape](Node& self) {
    Tensor dx = Tensor::empty(in_shape, self.value.dtype(), self.value.device());
    kernels::avgpool_backward(self.grad, dx);
    accumulate_grad(*self.inputs[0], dx);
  });
}

Var mul_scalar(const Var& x, const Tensor& scale) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  kernels::mul_scalar(x.value(), scale, y);
  return Var::from_op("mul_scalar", y, {x}, false, [scale](Node& self) {
    Tensor dx = Tensor::empty(self.value.shape(), self.value.dtype(), self.value.device());
    kernels::mul_scalar(self.grad, scale, dx);
    accumulate_grad(*self.inputs[0], dx);
  });
}

} // namespace minamp::ops
