// CPU reference of the dynamic loss scaler's kernels: unscale + overflow check, the scale update
// (PyTorch's _amp_update_scale_), and the f16 range statistics used to show why scaling matters.
#include <cmath>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

void amp_unscale(const std::vector<Tensor*>& grads, const Tensor& scale, Tensor& found_inf) {
  require_amp_unscale(grads, scale, found_inf);
  // As GradScaler.unscale_: the reciprocal in double, rounded to float.
  const float inv_scale = float(1.0 / double(scale.data<float>()[0]));
  bool overflow = false;
  for (Tensor* grad : grads) {
    float* g = grad->data<float>();
    for (int64_t i = 0; i < grad->numel();
         ++i) { // the unscaled g is checked (kernel_list.h says why)
      g[i] *= inv_scale;
      overflow = overflow || !std::isfinite(g[i]);
    }
  }
  if (overflow) found_inf.data<float>()[0] = 1.0f; // set, never reset
}

void amp_update_scale(Tensor& scale, Tensor& growth_tracker, const Tensor& found_inf,
                      const ScalerParams& scaler) {
  require_amp_update_scale(scale, growth_tracker, found_inf);
  float& current = scale.data<float>()[0];
  int32_t& tracker = growth_tracker.data<int32_t>()[0];
  if (found_inf.data<float>()[0] != 0.0f) { // overflow: back off, start counting again
    current *= scaler.backoff_factor;
    tracker = 0;
    return;
  }
  const int32_t successful = tracker + 1;
  if (successful == scaler.growth_interval) { // grow unless the grown scale is not finite
    const float grown = current * scaler.growth_factor;
    if (std::isfinite(grown)) current = grown;
    tracker = 0;
  } else {
    tracker = successful;
  }
}

void fp16_range_counts(const Tensor& x, float scale, Tensor& counts) {
  require_fp16_range_counts(x, counts);
  const FloatInput values(x);
  double flushed = 0, subnormal = 0, overflowed = 0, nonzero = 0, nonfinite = 0;
  for (int64_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    if (!std::isfinite(v)) {
      ++nonfinite;
      continue;
    }
    if (v == 0.0f) continue;
    ++nonzero;
    const float s = round_to_half(v * scale);
    if (s == 0.0f)
      ++flushed;
    else if (std::isinf(s))
      ++overflowed;
    else if (std::fabs(s) < kHalfMinNormal)
      ++subnormal;
  }
  float* out = counts.data<float>();
  out[0] += static_cast<float>(flushed);
  out[1] += static_cast<float>(subnormal);
  out[2] += static_cast<float>(overflowed);
  out[3] += static_cast<float>(nonzero);
  out[4] += static_cast<float>(nonfinite);
}

} // namespace minamp::cpu
