// Parameter: master, gradient and 16-bit working copy.
#include "nn/parameter.h"

#include "core/error.h"
#include "kernels/kernels.h"

namespace minamp {

Parameter::Parameter(Tensor master) : master_(std::move(master)) {
  require(master_.dtype() == DType::f32, "Parameter", "the master copy must be f32, got ",
          describe(master_));
  grad_ = Tensor::zeros(master_.shape(), DType::f32, master_.device());
}

const Tensor& Parameter::working_copy(DType dtype) {
  if (dtype == DType::f32) return master_;
  require(is_half_precision(dtype), "Parameter::working_copy", "expected f32, f16 or bf16, got ",
          dtype);
  if (!half_.defined() || half_.dtype() != dtype) {
    half_ = Tensor::empty(master_.shape(), dtype, master_.device());
    sync_half_copy();
  }
  return half_;
}

void Parameter::sync_half_copy() {
  if (!half_.defined()) half_ = Tensor::empty(master_.shape(), DType::f16, master_.device());
  kernels::cast(master_, half_);
}

void Parameter::requires_grad_(bool requires_grad) {
  if (requires_grad == trainable_) return;
  trainable_ = requires_grad;
  grad_ = requires_grad ? Tensor::zeros(master_.shape(), DType::f32, master_.device()) : Tensor();
}

void Parameter::zero_grad() {
  if (trainable_) kernels::fill(grad_, 0.0f);
}

void zero_grads(const std::vector<Parameter*>& params) {
  std::vector<Tensor*> grads;
  grads.reserve(params.size());
  for (Parameter* p : params)
    if (p->requires_grad()) grads.push_back(&p->grad());
  kernels::zero_grads(grads);
}

void Parameter::to(Device device) {
  if (master_.device() == device) return;
  master_ = master_.to(device);
  if (grad_.defined()) grad_ = grad_.to(device);
  if (half_.defined()) half_ = half_.to(device);
}

} // namespace minamp
