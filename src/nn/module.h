// Module: a layer or a container of layers, with PyTorch-style names for its parameters and
// buffers ("0.weight", "1.running_mean") so checkpoints map one-to-one onto a PyTorch
// nn.Sequential. Layers: Linear, Conv2d, BatchNorm, ReLU, MaxPool2d, GlobalAvgPool; Sequential.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/var.h"
#include "core/rng.h"
#include "kernels/kernels.h"
#include "nn/parameter.h"

namespace minamp::nn {

// Whether a BatchNorm in training mode on CUDA takes its batch statistics from the epilogue of the
// Linear or Conv2d GEMM before it (Sequential) instead of its own pass over the activation, and
// whether a 1x1 Conv2d after a BatchNorm (+ ReLU) applies that batch norm as it loads its input
// (Conv2d::forward_normalized). On by default; MINAMP_FUSION=0 turns it off (read once, 1 or
// unset: on); set_fusion overrides it. The CPU backend always runs the unfused reference, and a
// fused ReLU is not affected.
bool fusion_enabled();
void set_fusion(bool enabled);

class Module {
public:
  virtual ~Module() = default;
  virtual Var forward(const Var& x) = 0;
  Var operator()(const Var& x) { return forward(x); }
  // A one-line description, e.g. "Linear(8, 16)".
  virtual std::string describe() const = 0;

  // Parameters and buffers with dotted names, in registration order.
  std::vector<std::pair<std::string, Parameter*>> named_parameters();
  std::vector<std::pair<std::string, Tensor*>> named_buffers();
  std::vector<Parameter*> parameters();

  void train(bool training = true);
  void eval() { train(false); }
  bool training() const { return training_; }
  void zero_grad();
  // Freezes (false) or unfreezes (true) every parameter, as PyTorch's Module.requires_grad_.
  void requires_grad_(bool requires_grad);
  // Moves every parameter and buffer to `device`.
  void to(Device device);

  // Integer buffers (BatchNorm's num_batches_tracked), kept on the host.
  std::vector<std::pair<std::string, int64_t*>> named_counters();

  // Asks the layer to apply a following ReLU in its own epilogue; false when it cannot.
  // Sequential uses this to fuse Linear/Conv2d/BatchNorm + ReLU into one kernel.
  virtual bool absorb_relu() { return false; }
  // Asks the layer to also compute its output's per-channel mean and biased variance while writing
  // it, for a following BatchNorm in training mode (BatchNorm::take_statistics_from); false when
  // it cannot.
  virtual bool produce_batch_moments() { return false; }
  // The moments f32 [2, C] that the last forward produced with `output`, handed over once; an
  // undefined tensor when it produced none for that tensor.
  virtual Tensor take_batch_moments(const Tensor& output);

protected:
  void register_parameter(std::string name, Parameter* p) { params_.emplace_back(name, p); }
  void register_buffer(std::string name, Tensor* t) { buffers_.emplace_back(name, t); }
  void register_counter(std::string name, int64_t* c) { counters_.emplace_back(name, c); }
  void register_child(std::string name, Module* m) { children_.emplace_back(name, m); }

private:
  template <class T>
  void collect(const std::string& prefix, std::vector<std::pair<std::string, T*>> Module::*own,
               std::vector<std::pair<std::string, T*>>& out);
  std::vector<std::pair<std::string, Parameter*>> params_;
  std::vector<std::pair<std::string, Tensor*>> buffers_;
  std::vector<std::pair<std::string, int64_t*>> counters_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

// The batch moments a Linear or Conv2d hands to the BatchNorm after it: once requested, a
// forward computes them (in its GEMM's epilogue) in training mode on CUDA while fusion_enabled(),
// and they are kept with the output they describe until taken.
class BatchMomentsHandoff {
public:
  bool request() { return requested_ = true; }
  // Where the forward about to run puts its output's moments, or nullptr: none wanted.
  Tensor* target(bool training, Device device);
  // Records the output of that forward.
  void produced(const Tensor& output);
  // The moments of `output`, if they are the ones produced; clears the handoff either way.
  Tensor take(const Tensor& output);

private:
  bool requested_ = false;
  Tensor output_, moments_;
};

// y[rows, out] = x[rows, in] W^T + b. Init as PyTorch: W, b ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
public:
  Linear(int64_t in_features, int64_t out_features, Rng& rng, bool bias = true);
  Var forward(const Var& x) override;
  std::string describe() const override;
  bool absorb_relu() override { return relu_ = true; }
  bool produce_batch_moments() override { return moments_.request(); }
  Tensor take_batch_moments(const Tensor& output) override { return moments_.take(output); }
  Parameter weight; // [out, in]
  Parameter bias;   // [out] (undefined master when bias = false)

private:
  bool has_bias_;
  bool relu_ = false;
  BatchMomentsHandoff moments_;
};

class BatchNorm;

// y[N, Ho, Wo, Cout] = conv(x[N, H, W, Cin]) with weight [Cout, k, k, Cin]. Init as PyTorch:
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = Cin k k.
class Conv2d : public Module {
public:
  Conv2d(int64_t in_channels, int64_t out_channels, int kernel_size, Rng& rng, int stride = 1,
         int padding = 0, bool bias = true);
  Var forward(const Var& x) override;
  // forward(norm.forward(x)), with the batch norm applied as this conv loads x where the kernels
  // can (ops::batch_norm_conv2d): its output is never written. Move x in where nothing else
  // needs it, so that inference frees it as early as two separate layers would.
  Var forward_normalized(Var x, BatchNorm& norm);
  std::string describe() const override;
  bool absorb_relu() override { return relu_ = true; }
  bool produce_batch_moments() override { return moments_.request(); }
  Tensor take_batch_moments(const Tensor& output) override { return moments_.take(output); }
  Parameter weight; // [Cout, k, k, Cin]
  Parameter bias;   // [Cout]

private:
  ConvParams conv_;
  bool has_bias_;
  bool relu_ = false;
  BatchMomentsHandoff moments_;
};

// Batch normalisation over the last (channel) dimension, PyTorch defaults: eps 1e-5, momentum
// 0.1, gamma 1, beta 0, running mean 0 and variance 1.
class BatchNorm : public Module {
public:
  explicit BatchNorm(int64_t channels, float eps = 1e-5f, float momentum = 0.1f);
  Var forward(const Var& x) override;
  std::string describe() const override;
  bool absorb_relu() override { return relu_ = true; }
  // Takes the batch statistics of training mode from `previous`, the layer before it, when that
  // layer can produce them with its output (previous.produce_batch_moments()); false otherwise.
  bool take_statistics_from(Module& previous);
  // The settings of this forward on x, its batch moments (taken from the layer before, put in
  // `moments`) and the batch counted: what forward and Conv2d::forward_normalized start with.
  BatchNormParams forward_params(const Var& x, Tensor& moments);
  Parameter weight;                 // gamma [C]
  Parameter bias;                   // beta [C]
  Tensor running_mean, running_var; // f32 [C]
  // Training forwards so far (PyTorch's int64 buffer). Host-side: the replays of a CUDA graph
  // (backend::cuda_graph_capture) do not advance it; momentum is fixed, so only checkpoints see it.
  int64_t num_batches_tracked = 0;

private:
  int64_t channels_;
  float eps_, momentum_;
  bool relu_ = false;
  Module* statistics_source_ = nullptr;
};

class ReLU : public Module {
public:
  Var forward(const Var& x) override;
  std::string describe() const override { return "ReLU()"; }
};

// Max pooling over [N, H, W, C], PyTorch's MaxPool2d(kernel_size, stride, padding).
class MaxPool2d : public Module {
public:
  MaxPool2d(int kernel_size, int stride, int padding = 0);
  Var forward(const Var& x) override;
  std::string describe() const override;

private:
  MaxPoolParams pool_;
};

// [N, H, W, C] -> [N, C] (PyTorch: AdaptiveAvgPool2d(1) followed by Flatten()).
class GlobalAvgPool : public Module {
public:
  Var forward(const Var& x) override;
  std::string describe() const override { return "GlobalAvgPool()"; }
};

// Runs its layers in order. Fuses a ReLU into the layer before it when that layer can apply it
// in its epilogue (Linear, Conv2d, BatchNorm), has a BatchNorm take its training statistics
// from the Linear or Conv2d before it (BatchNorm::take_statistics_from), and, while
// fusion_enabled(), has a Conv2d right after a BatchNorm (+ ReLU) apply it as it loads its input
// (Conv2d::forward_normalized); the layers keep their indices, so names still match PyTorch's
// nn.Sequential.
class Sequential : public Module {
public:
  Sequential() = default;
  Sequential& add(std::unique_ptr<Module> layer);
  template <class Layer, class... Args> Sequential& emplace(Args&&... args) {
    return add(std::make_unique<Layer>(std::forward<Args>(args)...));
  }
  Var forward(const Var& x) override;
  std::string describe() const override;
  size_t size() const { return layers_.size(); }
  Module& operator[](size_t i) { return *layers_[i]; }

private:
  std::vector<std::unique_ptr<Module>> layers_;
  std::vector<bool> fused_into_previous_;
  std::vector<bool> applied_by_next_; // a BatchNorm the Conv2d after it may apply
  // The index of the last layer that is not fused into the one before it (size() when none).
  size_t last_unfused() const;
};

} // namespace minamp::nn
