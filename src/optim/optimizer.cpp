// SGD and Adam: state allocation and the fused step kernels' arguments.
#include "optim/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace minamp::optim {

namespace {
// The hyperparameter checks of torch.optim ("Invalid learning rate: -1"), which also refuse
// infinity: `value` must be finite and in [lo, hi) (hi = infinity: no upper bound).
void require_hyperparameter(const char* op, const char* name, float value, float lo,
                            float hi = INFINITY) {
  require(std::isfinite(value) && value >= lo && value < hi, op, name, " must be a finite number",
          " >= ", lo, (std::isinf(hi) ? "" : cat(" and < ", hi)), ", got ", value);
}
} // namespace

Optimizer::Optimizer(const std::vector<Parameter*>& params) {
  require(!params.empty(), "Optimizer", "got an empty parameter list");
  for (Parameter* p : params)
    if (p->requires_grad()) params_.push_back(p);
  require(!params_.empty(), "Optimizer", "every one of the ", params.size(),
          " parameters is frozen (requires_grad false): nothing to optimize");
}

void Optimizer::zero_grad() { zero_grads(params_); }

void Optimizer::set_lr(float lr) {
  require_hyperparameter("Optimizer", "lr", lr, 0.0f);
  lr_ = lr;
}

std::vector<ParamSlot> Optimizer::slots() {
  std::vector<ParamSlot> out(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    require(params_[i]->requires_grad(), "Optimizer", "parameter ", i,
            " was frozen after the optimizer was made (it has no gradient); "
            "make the optimizer after freezing");
    out[i].master = &params_[i]->master();
    out[i].grad = &params_[i]->grad();
    out[i].half = &params_[i]->half_copy();
  }
  return out;
}

namespace {
std::vector<Tensor> zeros_like_masters(const std::vector<Parameter*>& params) {
  std::vector<Tensor> out;
  for (Parameter* p : params)
    out.push_back(Tensor::zeros(p->master().shape(), DType::f32, p->master().device()));
  return out;
}
} // namespace

SGD::SGD(const std::vector<Parameter*>& params, float lr, float momentum, float weight_decay)
    : Optimizer(params), momentum_(momentum), weight_decay_(weight_decay) {
  require_hyperparameter("SGD", "lr", lr, 0.0f);
  require_hyperparameter("SGD", "momentum", momentum, 0.0f);
  require_hyperparameter("SGD", "weight_decay", weight_decay, 0.0f);
  lr_ = lr;
  if (momentum_ != 0.0f) momentum_buffers_ = zeros_like_masters(params_);
}

void SGD::step(const Tensor& found_inf) {
  SgdParams sgd;
  sgd.lr = lr_;
  sgd.momentum = momentum_;
  sgd.weight_decay = weight_decay_;
  std::vector<ParamSlot> params = slots();
  for (size_t i = 0; i < momentum_buffers_.size(); ++i)
    params[i].momentum_buffer = &momentum_buffers_[i];
  kernels::sgd_step(params, sgd, found_inf);
}

std::vector<std::pair<std::string, Tensor*>> SGD::named_state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (size_t i = 0; i < momentum_buffers_.size(); ++i)
    out.emplace_back(cat("momentum_buffer.", i), &momentum_buffers_[i]);
  return out;
}

Adam::Adam(const std::vector<Parameter*>& params, float lr, float beta1, float beta2, float eps,
           float weight_decay)
    : Optimizer(params) {
  require_hyperparameter("Adam", "lr", lr, 0.0f);
  require_hyperparameter("Adam", "beta1", beta1, 0.0f, 1.0f);
  require_hyperparameter("Adam", "beta2", beta2, 0.0f, 1.0f);
  require_hyperparameter("Adam", "eps", eps, 0.0f);
  require_hyperparameter("Adam", "weight_decay", weight_decay, 0.0f);
  lr_ = lr;
  params_cfg_.beta1 = beta1;
  params_cfg_.beta2 = beta2;
  params_cfg_.eps = eps;
  params_cfg_.weight_decay = weight_decay;
  exp_avgs_ = zeros_like_masters(params_);
  exp_avg_sqs_ = zeros_like_masters(params_);
  step_ = Tensor::zeros({1}, DType::f32, params_[0]->master().device());
}

void Adam::step(const Tensor& found_inf) {
  AdamParams adam = params_cfg_;
  adam.lr = lr_;
  std::vector<ParamSlot> params = slots();
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].exp_avg = &exp_avgs_[i];
    params[i].exp_avg_sq = &exp_avg_sqs_[i];
  }
  kernels::adam_step(params, adam, step_, found_inf);
}

std::vector<std::pair<std::string, Tensor*>> Adam::named_state() {
  std::vector<std::pair<std::string, Tensor*>> out{{"step", &step_}};
  for (size_t i = 0; i < exp_avgs_.size(); ++i) {
    out.emplace_back(cat("exp_avg.", i), &exp_avgs_[i]);
    out.emplace_back(cat("exp_avg_sq.", i), &exp_avg_sqs_[i]);
  }
  return out;
}

Tensor clip_grad_norm_(const std::vector<Parameter*>& all_params, float max_norm) {
  require(!all_params.empty(), "clip_grad_norm_", "got an empty parameter list");
  std::vector<Parameter*> params; // the frozen have no gradient (PyTorch skips grad None)
  for (Parameter* p : all_params)
    if (p->requires_grad()) params.push_back(p);
  require(!params.empty(), "clip_grad_norm_", "every one of the ", all_params.size(),
          " parameters is frozen (requires_grad false)");
  require(max_norm > 0.0f, "clip_grad_norm_", "max_norm must be positive, got ", max_norm);
  const Device device = params[0]->grad().device();
  Tensor sum_sq = Tensor::zeros({1}, DType::f32, device);
  for (Parameter* p : params) kernels::sum_squares(p->grad(), sum_sq);
  Tensor coef = Tensor::empty({1}, DType::f32, device);
  kernels::clip_coefficient(sum_sq, max_norm, coef);
  for (Parameter* p : params) kernels::mul_scalar(p->grad(), coef, p->grad());
  return sum_sq;
}

} // namespace minamp::optim
