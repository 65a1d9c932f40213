// Float views of f32 / f16 tensors and the shared GEMM epilogue of the CPU reference kernels (see
// cpu_util.h).
#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

FloatInput::FloatInput(const Tensor& tensor) : size_(tensor.numel()) {
  if (tensor.dtype() == DType::f32) {
    data_ = tensor.data<float>();
    return;
  }
  widened_.reset(new float[static_cast<size_t>(size_)]);
  half_to_float(tensor.data<half>(), widened_.get(), size_);
  data_ = widened_.get();
}

FloatOutput::FloatOutput(Tensor& tensor, bool keep_old) : tensor_(tensor), size_(tensor.numel()) {
  if (tensor.dtype() == DType::f32) {
    data_ = tensor.data<float>();
    return;
  }
  buffer_.reset(new float[static_cast<size_t>(size_)]);
  if (keep_old) half_to_float(tensor.data<half>(), buffer_.get(), size_);
  data_ = buffer_.get();
}

void FloatOutput::store() {
  if (tensor_.dtype() != DType::f16) return;
  float_to_half(buffer_.get(), tensor_.data<half>(), size_);
}

void apply_bias_relu(MatrixMap c, const GemmEpilogue& epilogue) {
  if (epilogue.bias) {
    const ConstMatrixMap bias(epilogue.bias->data<float>(), 1, c.cols()); // [1, N]
    c.rowwise() += bias.row(0);
  }
  if (epilogue.relu) c = c.unaryExpr(&relu);
}

} // namespace minamp::cpu
