// CPU reference of the elementwise kernels: fill, cast, add_inplace, mul_scalar, add and ReLU.
// Every tensor is a flat array here; f16 values are widened to float and results rounded back.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

void fill(Tensor& dst, float value) {
  const int64_t n = dst.numel();
  switch (dst.dtype()) {
  case DType::f32: std::fill_n(dst.data<float>(), n, value); break;
  case DType::f16: std::fill_n(dst.data<half>(), n, half(value)); break;
  case DType::i32:
    require(fits_int32(value), "fill", "an i32 tensor cannot hold ", value, ", got ",
            describe(dst));
    std::fill_n(dst.data<int32_t>(), n, static_cast<int32_t>(value));
    break;
  }
}

void cast(const Tensor& src, Tensor& dst) {
  require_same_numel("cast", "src", src, "dst", dst);
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    if (src.nbytes() > 0) std::memcpy(dst.raw(), src.raw(), src.nbytes()); // empty: null pointers
    return;
  }
  // Integers go through float: i32 -> float rounds past 2^24, float -> i32 truncates.
  if (src.dtype() == DType::i32) {
    FloatOutput out(dst, false);
    const int32_t* in = src.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
    out.store();
    return;
  }
  const FloatInput in(src);
  if (dst.dtype() == DType::i32) {
    int32_t* out = dst.data<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      require(fits_int32(in[i]), "cast", "value ", in[i], " at ", i, " of ", describe(src),
              " does not fit ", describe(dst));
      out[i] = static_cast<int32_t>(in[i]);
    }
    return;
  }
  FloatOutput out(dst, false); // f32 <-> f16: store() rounds to nearest even
  std::copy_n(in.data(), n, out.data());
  out.store();
}

void add_inplace(Tensor& dst, const Tensor& src, float alpha) {
  require_floating("add_inplace", "dst", dst);
  require_floating("add_inplace", "src", src);
  require_same_numel("add_inplace", "dst", dst, "src", src);
  const FloatInput in(src);
  FloatOutput out(dst, true);
  for (int64_t i = 0; i < out.size(); ++i) out[i] += alpha * in[i];
  out.store();
}

void mul_scalar(const Tensor& src, const Tensor& scale, Tensor& dst) {
  require_floating("mul_scalar", "src", src);
  require_floating("mul_scalar", "dst", dst);
  require_same_numel("mul_scalar", "src", src, "dst", dst);
  require_f32("mul_scalar", "scale", scale, 1);
  const float factor = scale.data<float>()[0];
  const FloatInput in(src); // widened or in place; dst may alias src, read before write per i
  FloatOutput out(dst, false);
  for (int64_t i = 0; i < out.size(); ++i) out[i] = in[i] * factor;
  out.store();
}

void add_forward(const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  require_add_forward(a, b, y);
  const FloatInput left(a), right(b); // widened or in place; y may alias a or b (read first)
  FloatOutput out(y, false);
  for (int64_t i = 0; i < out.size(); ++i) {
    const float sum = left[i] + right[i];
    out[i] = relu ? cpu::relu(sum) : sum;
  }
  out.store();
}

void relu_forward(const Tensor& x, Tensor& y) {
  require_floating("relu_forward", "x", x);
  require(y.defined() && y.dtype() == x.dtype() && y.numel() == x.numel(), "relu_forward",
          "y must match x ", describe(x), ", got ", describe(y));
  const FloatInput in(x);
  FloatOutput out(y, false);
  for (int64_t i = 0; i < out.size(); ++i) out[i] = relu(in[i]);
  out.store();
}

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  require_relu_backward(y, dy, dx);
  const FloatInput out_values(y);
  const FloatInput grad_out(dy);
  FloatOutput grad_in(dx, false);
  for (int64_t i = 0; i < grad_in.size(); ++i)
    grad_in[i] = out_values[i] <= 0.0f ? 0.0f : grad_out[i]; // NaN passes, as in PyTorch
  grad_in.store();
}

} // namespace minamp::cpu
