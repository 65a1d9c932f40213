// Optimizers: SGD and Adam with PyTorch's semantics. They update the fp32 masters in one fused
// pass over all parameters, rewrite each f16 working copy in the same pass, and take an optional
// device-side `found_inf` flag (from GradScaler) that skips the whole step without a host read.
#pragma once

#include <vector>

#include "kernels/kernels.h"
#include "nn/parameter.h"

namespace minamp::optim {

class Optimizer {
public:
  // Takes the parameters of `params` that require grad (frozen ones get no state and are never
  // updated, as PyTorch skips parameters without a gradient); an Error when none does.
  explicit Optimizer(const std::vector<Parameter*>& params);
  virtual ~Optimizer() = default;
  // Updates every parameter, unless found_inf (f32 [1], may be undefined) is nonzero.
  virtual void step(const Tensor& found_inf) = 0;
  void step() { step(Tensor()); }
  void zero_grad();
  // The parameters it updates: those that required grad when it was made.
  const std::vector<Parameter*>& params() const { return params_; }
  float lr() const { return lr_; }
  // Throws Error for a learning rate PyTorch refuses (negative, NaN) or that is infinite.
  void set_lr(float lr);
  // The optimizer's state tensors with their names (for checkpoints), on the parameters' device;
  // "<i>" in a name counts params().
  virtual std::vector<std::pair<std::string, Tensor*>> named_state() = 0;

protected:
  // Master, gradient and f16 copy of every parameter, for the step kernels; an Error if one was
  // frozen since (it has no gradient).
  std::vector<ParamSlot> slots();
  std::vector<Parameter*> params_;
  float lr_ = 1e-3f;
};

// SGD with momentum (dampening 0) and L2 weight decay, as torch.optim.SGD.
class SGD : public Optimizer {
public:
  SGD(const std::vector<Parameter*>& params, float lr, float momentum = 0.0f,
      float weight_decay = 0.0f);
  void step(const Tensor& found_inf) override;
  using Optimizer::step;
  std::vector<std::pair<std::string, Tensor*>> named_state() override;

private:
  float momentum_, weight_decay_;
  std::vector<Tensor> momentum_buffers_; // one per parameter, with momentum only
};

// Adam with bias correction and L2 weight decay, as torch.optim.Adam (defaults betas 0.9/0.999,
// eps 1e-8). The step count is a device tensor so a skipped step leaves it untouched.
class Adam : public Optimizer {
public:
  Adam(const std::vector<Parameter*>& params, float lr = 1e-3f, float beta1 = 0.9f,
       float beta2 = 0.999f, float eps = 1e-8f, float weight_decay = 0.0f);
  void step(const Tensor& found_inf) override;
  using Optimizer::step;
  std::vector<std::pair<std::string, Tensor*>> named_state() override;
  // Steps taken so far (a host read).
  int64_t step_count() const { return static_cast<int64_t>(step_.item()); }

private:
  AdamParams params_cfg_;
  Tensor step_;                                // f32 [1]
  std::vector<Tensor> exp_avgs_, exp_avg_sqs_; // one per parameter
};

// Scales all gradients (of the parameters that require grad) so that their global L2 norm is at
// most max_norm, as torch.nn.utils.clip_grad_norm_; returns the SQUARED norm before clipping as an
// f32 [1] device tensor (no host read; take the square root when logging it). With a GradScaler,
// call scaler.unscale_(opt) first so the norm is in unscaled units.
Tensor clip_grad_norm_(const std::vector<Parameter*>& params, float max_norm);

} // namespace minamp::optim
