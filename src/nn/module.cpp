// Module bookkeeping (names, train/eval, devices) and the layers' forward passes.
#include "nn/module.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "core/error.h"
#include "ops/ops.h"

namespace minamp::nn {

namespace {

bool fusion_from_environment() {
  const char* value = std::getenv("MINAMP_FUSION");
  if (!value || !*value || std::string(value) == "1") return true;
  if (std::string(value) == "0") return false;
  throw Error(cat("MINAMP_FUSION: expected 0 or 1, got '", value, "'"));
}

std::atomic<bool>& fusion_selected() {
  static std::atomic<bool> enabled{fusion_from_environment()};
  return enabled;
}

} // namespace

bool fusion_enabled() { return fusion_selected().load(std::memory_order_relaxed); }
void set_fusion(bool enabled) { fusion_selected().store(enabled, std::memory_order_relaxed); }

Tensor Module::take_batch_moments(const Tensor&) { return Tensor(); }

Tensor* BatchMomentsHandoff::target(bool training, Device device) {
  output_ = Tensor();
  moments_ = Tensor();
  return requested_ && training && device == Device::cuda && fusion_enabled() ? &moments_ : nullptr;
}

void BatchMomentsHandoff::produced(const Tensor& output) {
  if (moments_.defined()) output_ = output;
}

Tensor BatchMomentsHandoff::take(const Tensor& output) {
  const bool same = output_.defined() && output_.raw() == output.raw() &&
                    output_.dtype() == output.dtype() && output_.shape() == output.shape();
  Tensor moments = same ? moments_ : Tensor();
  output_ = Tensor();
  moments_ = Tensor();
  return moments;
}

template <class T>
void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, T*>> Module::*own,
                     std::vector<std::pair<std::string, T*>>& out) {
  for (auto& [name, item] : this->*own) out.emplace_back(prefix + name, item);
  for (auto& [name, child] : children_) child->collect(prefix + name + ".", own, out);
}

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters() {
  std::vector<std::pair<std::string, Parameter*>> out;
  collect("", &Module::params_, out);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_buffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect("", &Module::buffers_, out);
  return out;
}

std::vector<std::pair<std::string, int64_t*>> Module::named_counters() {
  std::vector<std::pair<std::string, int64_t*>> out;
  collect("", &Module::counters_, out);
  return out;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

void Module::train(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->train(training);
}

void Module::zero_grad() { minamp::zero_grads(parameters()); }

void Module::requires_grad_(bool requires_grad) {
  for (Parameter* p : parameters()) p->requires_grad_(requires_grad);
}

void Module::to(Device device) {
  for (Parameter* p : parameters()) p->to(device);
  for (auto& [name, t] : named_buffers()) *t = t->to(device);
}

namespace {
// U(-bound, bound) as a tensor, drawn from `rng` in row-major order.
Tensor uniform_tensor(const Shape& shape, float bound, Rng& rng) {
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  for (float& v : values) v = rng.uniform(-bound, bound);
  return Tensor::from_vector(values, shape);
}
} // namespace

Linear::Linear(int64_t in_features, int64_t out_features, Rng& rng, bool bias) : has_bias_(bias) {
  require(in_features > 0 && out_features > 0, "Linear", "features must be positive, got ",
          in_features, " -> ", out_features);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
  weight = Parameter(uniform_tensor({out_features, in_features}, bound, rng));
  register_parameter("weight", &weight);
  if (has_bias_) {
    this->bias = Parameter(uniform_tensor({out_features}, bound, rng));
    register_parameter("bias", &this->bias);
  }
}

Var Linear::forward(const Var& x) {
  Var y = ops::linear(x, weight, has_bias_ ? &bias : nullptr, relu_,
                      moments_.target(training(), x.device()));
  moments_.produced(y.value());
  return y;
}

std::string Linear::describe() const {
  const Shape& s = weight.master().shape();
  return cat("Linear(", s[1], ", ", s[0], relu_ ? ") + ReLU (fused)" : ")");
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int kernel_size, Rng& rng, int stride,
               int padding, bool bias)
    : conv_{stride, padding}, has_bias_(bias) {
  require(in_channels > 0 && out_channels > 0 && kernel_size > 0 && stride > 0 && padding >= 0,
          "Conv2d", "invalid configuration: ", in_channels, " -> ", out_channels, ", kernel ",
          kernel_size, ", stride ", stride, ", padding ", padding);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_channels * kernel_size * kernel_size));
  weight =
      Parameter(uniform_tensor({out_channels, kernel_size, kernel_size, in_channels}, bound, rng));
  register_parameter("weight", &weight);
  if (has_bias_) {
    this->bias = Parameter(uniform_tensor({out_channels}, bound, rng));
    register_parameter("bias", &this->bias);
  }
}

Var Conv2d::forward(const Var& x) {
  Var y = ops::conv2d(x, weight, has_bias_ ? &bias : nullptr, conv_, relu_,
                      moments_.target(training(), x.device()));
  moments_.produced(y.value());
  return y;
}

Var Conv2d::forward_normalized(Var x, BatchNorm& norm) {
  Tensor norm_moments;
  const BatchNormParams bn = norm.forward_params(x, norm_moments);
  Tensor* moments = moments_.target(training(), x.device()); // read x before it is moved away
  Var y = ops::batch_norm_conv2d(std::move(x),
                                 {norm.weight, norm.bias, norm.running_mean, norm.running_var, bn},
                                 weight, has_bias_ ? &bias : nullptr, conv_, relu_, moments);
  moments_.produced(y.value());
  return y;
}

std::string Conv2d::describe() const {
  const Shape& s = weight.master().shape();
  return cat("Conv2d(", s[3], ", ", s[0], ", kernel ", s[1], ", stride ", conv_.stride,
             ", padding ", conv_.pad, relu_ ? ") + ReLU (fused)" : ")");
}

BatchNorm::BatchNorm(int64_t channels, float eps, float momentum)
    : channels_(channels), eps_(eps), momentum_(momentum) {
  require(channels > 0, "BatchNorm", "channels must be positive, got ", channels);
  weight = Parameter(Tensor::full({channels}, 1.0f));
  bias = Parameter(Tensor::zeros({channels}));
  running_mean = Tensor::zeros({channels});
  running_var = Tensor::full({channels}, 1.0f);
  register_parameter("weight", &weight);
  register_parameter("bias", &bias);
  register_buffer("running_mean", &running_mean);
  register_buffer("running_var", &running_var);
  register_counter("num_batches_tracked", &num_batches_tracked);
}

BatchNormParams BatchNorm::forward_params(const Var& x, Tensor& moments) {
  BatchNormParams bn;
  bn.training = training();
  bn.momentum = momentum_;
  bn.eps = eps_;
  bn.relu = relu_;
  // Taken in either mode, so that the previous layer keeps no output; used in training only.
  moments = statistics_source_ ? statistics_source_->take_batch_moments(x.value()) : Tensor();
  if (bn.training && moments.defined()) bn.batch_moments = &moments;
  if (bn.training) ++num_batches_tracked;
  return bn;
}

Var BatchNorm::forward(const Var& x) {
  Tensor moments;
  const BatchNormParams bn = forward_params(x, moments);
  return ops::batch_norm(x, weight, bias, running_mean, running_var, bn);
}

bool BatchNorm::take_statistics_from(Module& previous) {
  if (!previous.produce_batch_moments()) return false;
  statistics_source_ = &previous;
  return true;
}

std::string BatchNorm::describe() const {
  return cat("BatchNorm(", channels_, relu_ ? ") + ReLU (fused)" : ")");
}

Var ReLU::forward(const Var& x) { return ops::relu(x); }

MaxPool2d::MaxPool2d(int kernel_size, int stride, int padding)
    : pool_{kernel_size, stride, padding} {
  require(kernel_size >= 1 && stride >= 1 && padding >= 0 && padding <= kernel_size / 2,
          "MaxPool2d",
          "expects kernel_size >= 1, stride >= 1 and 0 <= padding <= kernel_size / 2, got ",
          kernel_size, ", ", stride, ", ", padding);
}

Var MaxPool2d::forward(const Var& x) { return ops::max_pool2d(x, pool_); }

std::string MaxPool2d::describe() const {
  return cat("MaxPool2d(kernel ", pool_.kernel, ", stride ", pool_.stride, ", padding ", pool_.pad,
             ")");
}

Var GlobalAvgPool::forward(const Var& x) { return ops::global_avgpool(x); }

size_t Sequential::last_unfused() const {
  for (size_t i = layers_.size(); i-- > 0;)
    if (!fused_into_previous_[i]) return i;
  return layers_.size();
}

Sequential& Sequential::add(std::unique_ptr<Module> layer) {
  const bool is_relu = dynamic_cast<ReLU*>(layer.get()) != nullptr;
  const bool fused = is_relu && !layers_.empty() && layers_.back()->absorb_relu();
  if (auto* norm = dynamic_cast<BatchNorm*>(layer.get()); norm && !layers_.empty())
    norm->take_statistics_from(*layers_.back());
  if (const size_t i = last_unfused(); dynamic_cast<Conv2d*>(layer.get()) && i < layers_.size() &&
                                       dynamic_cast<BatchNorm*>(layers_[i].get()))
    applied_by_next_[i] = true;
  register_child(std::to_string(layers_.size()), layer.get());
  layers_.push_back(std::move(layer));
  fused_into_previous_.push_back(fused);
  applied_by_next_.push_back(false);
  return *this;
}

Var Sequential::forward(const Var& x) {
  const bool fold = fusion_enabled();
  BatchNorm* pending = nullptr; // a batch norm the next layer, a Conv2d, applies to its input
  Var h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (fused_into_previous_[i]) continue;
    if (fold && applied_by_next_[i]) {
      pending = static_cast<BatchNorm*>(layers_[i].get());
    } else if (pending) {
      h = static_cast<Conv2d&>(*layers_[i]).forward_normalized(std::move(h), *pending);
      pending = nullptr;
    } else {
      h = layers_[i]->forward(h);
    }
  }
  return h;
}

std::string Sequential::describe() const {
  std::string out = "Sequential(\n";
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (fused_into_previous_[i]) continue;
    out += cat("  (", i, ") ", layers_[i]->describe(), "\n");
  }
  return out + ")";
}

} // namespace minamp::nn
