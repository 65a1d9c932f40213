// GradScaler: dynamic loss scaling with PyTorch's semantics and defaults (torch.amp.GradScaler).
//
//   scaler.scale(loss).backward();   // gradients come out multiplied by S
//   scaler.unscale_(opt);            // optional, e.g. before clip_grad_norm
//   scaler.step(opt);                // unscale if needed; skip the step if any grad is inf/NaN
//   scaler.update();                 // S *= backoff on overflow, S *= growth after
//                                    // growth_interval clean steps
//
// The scale, the growth tracker and every found_inf flag are tensors on the parameters' device:
// the skip and the update are decided there, so a CUDA step needs no host read. With
// enabled = false every call is a pass-through, so one loop serves FP32 and AMP.
#pragma once

#include <cmath>
#include <map>
#include <optional>

#include "autograd/var.h"
#include "kernels/kernels.h"
#include "optim/optimizer.h"

namespace minamp::amp {

// Scales at or below 2^-128 have no finite fp32 reciprocal: unscaling by 1/S = inf would turn
// every gradient into inf or NaN. GradScaler refuses them (PyTorch takes any positive scale: a
// deliberate difference, docs/mixed-precision.md).
constexpr float kScaleFloor = 0x1p-128f;
// Whether GradScaler takes `scale`: finite and above kScaleFloor.
inline bool is_valid_scale(float scale) { return std::isfinite(scale) && scale > kScaleFloor; }

// PyTorch's defaults; the one place minamp states them (the examples' --init-scale and
// --growth-interval default to these too).
struct GradScalerOptions {
  float init_scale = 65536.0f; // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 2000;
  bool enabled = true;
};

// The factors amp_update_scale takes from `options`.
ScalerParams update_params(const GradScalerOptions& options);

// PyTorch's GradScaler.state_dict(), key for key (state_dict() fills every field; a state left
// at zero is refused by load_state_dict()).
struct GradScalerState {
  float scale = 0.0f;
  float growth_factor = 0.0f;
  float backoff_factor = 0.0f;
  int growth_interval = 0;
  int growth_tracker = 0; // "_growth_tracker"
};

class GradScaler {
public:
  explicit GradScaler(GradScalerOptions options = {}, Device device = Device::cpu);

  // loss * S (a pass-through when disabled).
  Var scale(const Var& loss);
  // Divides the optimizer's gradients by S in place and records whether any is inf/NaN.
  // At most once per optimizer between update() calls; an error after step().
  void unscale_(optim::Optimizer& opt);
  // unscale_ (if not done yet), then opt.step(found_inf): the step is skipped on the device
  // when found_inf is set. At most once per optimizer between update() calls.
  void step(optim::Optimizer& opt);
  // Backoff/growth from the found_inf flags of this iteration's optimizers, then a new
  // iteration starts. An error if no optimizer was unscaled since the last update().
  void update();
  // Sets S explicitly (PyTorch's update(new_scale)); the growth tracker is kept. An error for a
  // scale is_valid_scale refuses.
  void update(float new_scale);

  // The current S (a host read; 1.0 when disabled).
  float get_scale() const;
  bool is_enabled() const { return options_.enabled; }
  // The device tensor holding S (f32 [1]) and this iteration's found_inf of an optimizer.
  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& found_inf(const optim::Optimizer& opt) const;
  // True when the last step() of `opt` was skipped (a host read, for logging).
  bool step_was_skipped(const optim::Optimizer& opt) const;

  // Empty when disabled, as PyTorch's {} (host reads of S and the tracker).
  std::optional<GradScalerState> state_dict() const;
  // An error when enabled and `state` is empty (saved from a disabled scaler) or holds values
  // the constructor refuses.
  void load_state_dict(const std::optional<GradScalerState>& state);

private:
  enum class Stage { ready, unscaled, stepped };
  struct PerOptimizer {
    Stage stage = Stage::ready;
    Tensor found_inf; // f32 [1]
  };
  // The optimizer's state in this iteration, created on first use with found_inf = 0 (a new
  // tensor each iteration: update() hands the last one to last_found_inf_).
  PerOptimizer& state_of(const optim::Optimizer& opt);

  GradScalerOptions options_;
  Tensor scale_;          // f32 [1]
  Tensor growth_tracker_; // i32 [1]
  std::map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
  // found_inf of the last finished iteration, kept for step_was_skipped() after update().
  std::map<const optim::Optimizer*, Tensor> last_found_inf_;
};

} // namespace minamp::amp
