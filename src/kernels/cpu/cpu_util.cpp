// Float views of f32 / f16 / bf16 tensors and the shared GEMM epilogue of the CPU reference kernels
// (see cpu_util.h).
#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {
// The values of an f16 or bf16 tensor, widened (exactly) into `dst`.
void widen(const Tensor& tensor, float* dst) {
  if (tensor.dtype() == DType::f16)
    half_to_float(tensor.data<half>(), dst, tensor.numel());
  else
    bfloat16_to_float(tensor.data<bfloat16>(), dst, tensor.numel());
}
} // namespace

FloatInput::FloatInput(const Tensor& tensor) : size_(tensor.numel()) {
  if (tensor.dtype() == DType::f32) {
    data_ = tensor.data<float>();
    return;
  }
  widened_.reset(new float[static_cast<size_t>(size_)]);
  widen(tensor, widened_.get());
  data_ = widened_.get();
}

FloatOutput::FloatOutput(Tensor& tensor, bool keep_old) : tensor_(tensor), size_(tensor.numel()) {
  if (tensor.dtype() == DType::f32) {
    data_ = tensor.data<float>();
    return;
  }
  buffer_.reset(new float[static_cast<size_t>(size_)]);
  if (keep_old) widen(tensor, buffer_.get());
  data_ = buffer_.get();
}

void FloatOutput::store() {
  if (tensor_.dtype() != DType::f32) narrow(buffer_.get(), tensor_);
}

void narrow(const float* src, Tensor& dst) {
  if (dst.dtype() == DType::f16)
    float_to_half(src, dst.data<half>(), dst.numel());
  else
    float_to_bfloat16(src, dst.data<bfloat16>(), dst.numel());
}

void apply_bias_relu(MatrixMap c, const GemmEpilogue& epilogue) {
  if (epilogue.bias) {
    const ConstMatrixMap bias(epilogue.bias->data<float>(), 1, c.cols()); // [1, N]
    c.rowwise() += bias.row(0);
  }
  if (epilogue.relu) c = c.unaryExpr(&relu);
}

} // namespace minamp::cpu
