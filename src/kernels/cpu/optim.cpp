// CPU reference of the optimizer kernels, in fp32 on the master weights: SGD (with momentum and
// L2 weight decay) and Adam (bias-corrected, L2 weight decay), both skipped entirely on
// overflow; zeroing every gradient; and the two kernels of gradient-norm clipping.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

// Parameters with fewer values are updated on one thread; larger ones are split over the OpenMP
// threads and vectorised (each value's update is independent of the others, so the result does not
// depend on the number of threads).
constexpr int64_t kParallelValues = 1 << 15;

// True when found_inf is defined and set: the step must change nothing.
bool step_overflowed(const Tensor& found_inf) {
  return found_inf.defined() && found_inf.data<float>()[0] != 0.0f;
}

// The mixed-precision step's last move: the f16 or bf16 working copy that the next forward reads
// under autocast is rewritten from the updated fp32 master (when the parameter has one), rounded
// to nearest even.
void refresh_half_copy(const ParamSlot& slot) {
  if (slot.half && slot.half->defined()) narrow(slot.master->data<float>(), *slot.half);
}

} // namespace

void zero_grads(const std::vector<Tensor*>& grads) {
  require_zero_grads(grads);
  for (Tensor* grad : grads) {
    std::fill_n(grad->data<float>(), grad->numel(), 0.0f);
  }
}

void sgd_step(const std::vector<ParamSlot>& params, const SgdParams& sgd, const Tensor& found_inf) {
  require_sgd_step(params, sgd, found_inf);
  if (step_overflowed(found_inf)) return;
  const bool momentum = sgd.momentum != 0.0f;
  for (const ParamSlot& slot : params) {
    float* w = slot.master->data<float>();
    const float* g = slot.grad->data<float>();
    float* buf = momentum ? slot.momentum_buffer->data<float>() : nullptr;
    const int64_t n = slot.master->numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelValues)
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + sgd.weight_decay * w[i];
      if (momentum) {
        buf[i] = sgd.momentum * buf[i] + d; // dampening 0; buf starts at 0
        w[i] -= sgd.lr * buf[i];
      } else {
        w[i] -= sgd.lr * d;
      }
    }
    refresh_half_copy(slot);
  }
}

void adam_step(const std::vector<ParamSlot>& params, const AdamParams& adam, Tensor& step,
               const Tensor& found_inf) {
  require_adam_step(params, step, found_inf);
  if (step_overflowed(found_inf)) return;
  const float t = step.data<float>()[0] += 1.0f;
  // In double, as PyTorch's Adam (Python floats): 1 - beta^t cancels digits at small t, and the
  // GPU's powf is not correctly rounded; this way both backends get the same two floats.
  const float bias_correction1 = float(1.0 - std::pow(double(adam.beta1), double(t)));
  const float bias_correction2 = float(1.0 - std::pow(double(adam.beta2), double(t)));
  for (const ParamSlot& slot : params) {
    float* w = slot.master->data<float>();
    const float* g = slot.grad->data<float>();
    float* m = slot.exp_avg->data<float>();
    float* v = slot.exp_avg_sq->data<float>();
    const int64_t n = slot.master->numel();
#pragma omp parallel for simd schedule(static) if (n >= kParallelValues)
    for (int64_t i = 0; i < n; ++i) {
      const float d = g[i] + adam.weight_decay * w[i]; // L2 decay (Adam, not AdamW)
      m[i] = adam.beta1 * m[i] + (1.0f - adam.beta1) * d;
      v[i] = adam.beta2 * v[i] + (1.0f - adam.beta2) * d * d;
      w[i] -= adam.lr * (m[i] / bias_correction1) / (std::sqrt(v[i] / bias_correction2) + adam.eps);
    }
    refresh_half_copy(slot);
  }
}

void sum_squares(const Tensor& x, Tensor& sum_sq) {
  require_sum_squares(x, sum_sq);
  const FloatInput values(x);
  double sum = 0.0;
  for (int64_t i = 0; i < values.size(); ++i) sum += static_cast<double>(values[i]) * values[i];
  sum_sq.data<float>()[0] += static_cast<float>(sum);
}

void clip_coefficient(const Tensor& sum_sq, float max_norm, Tensor& coef) {
  require_clip_coefficient(sum_sq, coef);
  const float norm = std::sqrt(sum_sq.data<float>()[0]);
  const float ratio = max_norm / (norm + 1e-6f);
  coef.data<float>()[0] = ratio > 1.0f ? 1.0f : ratio; // clamp(max=1), NaN passes through
}

} // namespace minamp::cpu
