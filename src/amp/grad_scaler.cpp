// GradScaler: the per-optimizer stage machine of PyTorch's scaler, on device tensors.
#include "amp/grad_scaler.h"

#include "core/error.h"
#include "ops/ops.h"

namespace minamp::amp {

namespace {
// Throws unless `scale` is one GradScaler takes (is_valid_scale).
void require_valid_scale(const char* op, const char* scale_name, float scale) {
  require(is_valid_scale(scale), op, scale_name, " must be finite and > 2^-128 (its reciprocal ",
          "must be finite), got ", scale);
}

// Throws unless the scaler's settings make sense: a valid scale (initial or loaded), a growth
// factor > 1, a backoff factor in (0, 1), a growth interval > 0.
void require_valid(const char* op, const char* scale_name, float scale, float growth_factor,
                   float backoff_factor, int growth_interval) {
  require_valid_scale(op, scale_name, scale);
  require(growth_factor > 1.0f, op, "growth_factor must be > 1, got ", growth_factor);
  require(backoff_factor < 1.0f && backoff_factor > 0.0f, op,
          "backoff_factor must be in (0, 1), got ", backoff_factor);
  require(growth_interval > 0, op, "growth_interval must be positive, got ", growth_interval);
}
} // namespace

ScalerParams update_params(const GradScalerOptions& options) {
  return {options.growth_factor, options.backoff_factor, options.growth_interval};
}

GradScaler::GradScaler(GradScalerOptions options, Device device) : options_(options) {
  require_valid("GradScaler", "init_scale", options_.init_scale, options_.growth_factor,
                options_.backoff_factor, options_.growth_interval);
  if (!options_.enabled) return;
  scale_ = Tensor::full({1}, options_.init_scale, DType::f32, device);
  growth_tracker_ = Tensor::zeros({1}, DType::i32, device);
}

Var GradScaler::scale(const Var& loss) {
  if (!options_.enabled) return loss;
  return ops::mul_scalar(loss, scale_);
}

GradScaler::PerOptimizer& GradScaler::state_of(const optim::Optimizer& opt) {
  PerOptimizer& state = per_optimizer_[&opt];
  if (!state.found_inf.defined()) state.found_inf = Tensor::zeros({1}, DType::f32, scale_.device());
  return state;
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!options_.enabled) return;
  PerOptimizer& state = state_of(opt);
  require(state.stage != Stage::unscaled, "GradScaler::unscale_",
          "unscale_() has already been called on this optimizer since the last update()");
  require(state.stage != Stage::stepped, "GradScaler::unscale_",
          "unscale_() is being called after step()");
  std::vector<Tensor*> grads;
  for (Parameter* p : opt.params()) grads.push_back(&p->grad());
  kernels::amp_unscale(grads, scale_, state.found_inf); // still 0: created by this iteration
  state.stage = Stage::unscaled;
}

void GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    return;
  }
  PerOptimizer& state = state_of(opt);
  require(state.stage != Stage::stepped, "GradScaler::step",
          "step() has already been called since the last update()");
  if (state.stage == Stage::ready) unscale_(opt);
  opt.step(state.found_inf);
  state.stage = Stage::stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  std::vector<const Tensor*> found_infs;
  for (auto& [opt, state] : per_optimizer_)
    if (state.stage != Stage::ready) found_infs.push_back(&state.found_inf);
  require(!found_infs.empty(), "GradScaler::update",
          "no inf checks were recorded prior to update() (call step() or unscale_() first)");
  Tensor combined = *found_infs[0];
  if (found_infs.size() > 1) {
    combined = combined.clone();
    for (size_t i = 1; i < found_infs.size(); ++i)
      kernels::add_inplace(combined, *found_infs[i], 1);
  }
  kernels::amp_update_scale(scale_, growth_tracker_, combined, update_params(options_));
  last_found_inf_.clear();
  for (auto& [opt, state] : per_optimizer_) last_found_inf_[opt] = state.found_inf;
  per_optimizer_.clear();
}

void GradScaler::update(float new_scale) {
  if (!options_.enabled) return;
  require_valid_scale("GradScaler::update", "new_scale", new_scale);
  kernels::fill(scale_, new_scale);
  last_found_inf_.clear();
  for (auto& [opt, state] : per_optimizer_) last_found_inf_[opt] = state.found_inf;
  per_optimizer_.clear();
}

float GradScaler::get_scale() const { return options_.enabled ? scale_.item() : 1.0f; }

const Tensor& GradScaler::found_inf(const optim::Optimizer& opt) const {
  auto it = per_optimizer_.find(&opt);
  require(it != per_optimizer_.end(), "GradScaler::found_inf",
          "this optimizer has not been unscaled in the current iteration");
  return it->second.found_inf;
}

bool GradScaler::step_was_skipped(const optim::Optimizer& opt) const {
  if (!options_.enabled) return false;
  auto current = per_optimizer_.find(&opt);
  if (current != per_optimizer_.end() && current->second.stage == Stage::stepped)
    return current->second.found_inf.item() != 0.0f;
  auto last = last_found_inf_.find(&opt);
  return last != last_found_inf_.end() && last->second.item() != 0.0f;
}

std::optional<GradScalerState> GradScaler::state_dict() const {
  if (!options_.enabled) return std::nullopt;
  GradScalerState state;
  state.scale = scale_.item();
  state.growth_factor = options_.growth_factor;
  state.backoff_factor = options_.backoff_factor;
  state.growth_interval = options_.growth_interval;
  state.growth_tracker = static_cast<int>(growth_tracker_.item());
  return state;
}

void GradScaler::load_state_dict(const std::optional<GradScalerState>& state) {
  if (!options_.enabled) return;
  require(state.has_value(), "GradScaler::load_state_dict",
          "the source state is empty, possibly because it was saved from a disabled GradScaler");
  require_valid("GradScaler::load_state_dict", "scale", state->scale, state->growth_factor,
                state->backoff_factor, state->growth_interval);
  require(state->growth_tracker >= 0, "GradScaler::load_state_dict",
          "_growth_tracker must be >= 0, got ", state->growth_tracker);
  options_.growth_factor = state->growth_factor;
  options_.backoff_factor = state->backoff_factor;
  options_.growth_interval = state->growth_interval;
  kernels::fill(scale_, state->scale);
  kernels::fill(growth_tracker_, static_cast<float>(state->growth_tracker));
}

} // namespace minamp::amp
