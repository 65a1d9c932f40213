// CPU reference of the elementwise kernels: fill, cast, add_inplace, mul_scalar, add and ReLU.
// Every tensor is a flat array here; f16 and bf16 values are widened to float and results rounded
// back.
#include <algorithm>
#include <cstring>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

void fill(Tensor& dst, float value) {
  require_fill(dst, value);
  const int64_t n = dst.numel();
  switch (dst.dtype()) {
  case DType::f32: std::fill_n(dst.data<float>(), n, value); break;
  case DType::f16: std::fill_n(dst.data<half>(), n, half(value)); break;
  case DType::bf16: std::fill_n(dst.data<bfloat16>(), n, bfloat16(value)); break;
  case DType::i32: std::fill_n(dst.data<int32_t>(), n, static_cast<int32_t>(value)); break;
  }
}

void cast(const Tensor& src, Tensor& dst) {
  require_cast(src, dst);
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
  FloatOutput out(dst, false); // into f16 or bf16: store() rounds to nearest even
  std::copy_n(in.data(), n, out.data());
  out.store();
}

void add_inplace(Tensor& dst, const Tensor& src, float alpha) {
  require_add_inplace(dst, src);
  const FloatInput in(src);
  FloatOutput out(dst, true);
  for (int64_t i = 0; i < out.size(); ++i) out[i] += alpha * in[i];
  out.store();
}

void mul_scalar(const Tensor& src, const Tensor& scale, Tensor& dst) {
  require_mul_scalar(src, scale, dst);
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
  require_relu_forward(x, y);
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
