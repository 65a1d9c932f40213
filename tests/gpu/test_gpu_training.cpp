// Whole training steps on the GPU against the CPU reference: the mlp, sine and a small
// classifier (3x3 convs, one strided, global average pooling, cross-entropy), trained a few
// steps from the same init and data on both devices, in FP32, AMP-f16 and AMP-bf16, with SGD and
// Adam, end with the same losses and parameter updates, within tolerances that allow for a
// different summation order and, in AMP, for 16-bit roundings that land on the other side of a
// tie; the
// scaler's skip path through a real model on the GPU; the same steps replayed from a CUDA graph
// (which no host read survives), bit for bit; and steady steps without a cudaMalloc call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "kernels/backend.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "sine_data.h"
#include "test_util.h"

#if MINAMP_WITH_CUDA
#include "device.cuh"
#endif

namespace minamp {
namespace {

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> initial, parameters; // per parameter, before and after
  float scale = 1;
};

using ModelFactory = std::function<std::unique_ptr<nn::Sequential>()>;

std::vector<std::vector<float>> values_of(nn::Module& model) {
  std::vector<std::vector<float>> values;
  for (Parameter* p : model.parameters()) values.push_back(p->master().to_vector());
  return values;
}

enum class Optimizer { adam, sgd };

// Adam (lr 1e-3), or SGD with momentum 0.9 (lr 1e-2), over `model`'s parameters.
std::unique_ptr<optim::Optimizer> make_optimizer(Optimizer kind, nn::Module& model) {
  if (kind == Optimizer::adam) return std::make_unique<optim::Adam>(model.parameters(), 1e-3f);
  return std::make_unique<optim::SGD>(model.parameters(), 1e-2f, 0.9f);
}

// How a run computes: FP32 (f32), or AMP with autocast to f16 (and loss scaling) or to bf16
// (without, as the examples default to).
const char* precision_name(DType precision) {
  return precision == DType::f32 ? "FP32" : precision == DType::f16 ? "AMP-f16" : "AMP-bf16";
}

// A fresh model trained on `device` on (x, y) in `precision`: cross-entropy when y holds i32
// class indices, MSE otherwise. step() is the examples' loop body: no host read, so it can be
// captured.
class TrainingRun {
public:
  TrainingRun(Device device, DType precision, const ModelFactory& make_model, const Tensor& x,
              const Tensor& y, Optimizer kind)
      : precision_(precision), model_(make_model()), x_(x.to(device)), y_(y.to(device)),
        scaler_(scaler_options(precision), device) {
    trained_.initial = values_of(*model_);
    model_->to(device);
    optimizer_ = make_optimizer(kind, *model_);
  }

  void step() {
    optimizer_->zero_grad();
    Var loss;
    {
      amp::Autocast autocast(precision_ != DType::f32,
                             precision_ == DType::f32 ? DType::f16 : precision_);
      const Var out = (*model_)(Var(x_));
      loss = y_.dtype() == DType::i32 ? ops::cross_entropy(out, y_) : ops::mse_loss(out, y_);
    }
    loss_ = loss.value();
    scaler_.scale(loss).backward();
    scaler_.step(*optimizer_);
    scaler_.update();
  }
  // Reads the last step's loss from the device and keeps it.
  void record_loss() { trained_.losses.push_back(loss_.item()); }
  // The run so far: the recorded losses, the initial and current parameters, the scale.
  const Trained& trained() {
    trained_.parameters = values_of(*model_);
    trained_.scale = scaler_.get_scale();
    return trained_;
  }

private:
  static amp::GradScalerOptions scaler_options(DType precision) {
    amp::GradScalerOptions options;
    options.enabled = precision == DType::f16;
    return options;
  }

  DType precision_;
  std::unique_ptr<nn::Sequential> model_;
  Tensor x_, y_, loss_;
  amp::GradScaler scaler_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  Trained trained_;
};

// Trains `steps` eager steps of a fresh model on `device` on (x, y).
Trained train_on(Device device, DType precision, const ModelFactory& make_model, const Tensor& x,
                 const Tensor& y, int steps, Optimizer kind = Optimizer::adam) {
  TrainingRun run(device, precision, make_model, x, y, kind);
  for (int step = 0; step < steps; ++step) {
    run.step();
    run.record_loss();
  }
  return run.trained();
}

// Each parameter's change during training.
std::vector<float> update_of(const Trained& t, size_t i) {
  std::vector<float> update = t.parameters[i];
  for (size_t j = 0; j < update.size(); ++j) update[j] -= t.initial[i][j];
  return update;
}

// What to compare: the parameters, or their updates (what training changed, which the
// parameters hide when the update is much smaller than the weight).
enum class Compare { parameters, updates };

// Tolerances of a parity check, relative: on each step's loss and on each parameter (or update);
// 0 asks for bit-for-bit equality.
struct Tolerances {
  double loss, parameters;
};

// The same losses and parameters (or updates) within `tolerance`.
void expect_same_training(const Trained& gpu, const Trained& cpu, Tolerances tolerance,
                          Compare what = Compare::parameters) {
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  ASSERT_EQ(gpu.parameters.size(), cpu.parameters.size());
  double worst_loss = 0;
  for (size_t i = 0; i < gpu.losses.size(); ++i) {
    const double error = std::abs(gpu.losses[i] - cpu.losses[i]) / std::abs(cpu.losses[i]);
    worst_loss = std::max(worst_loss, std::isnan(error) ? INFINITY : error);
    EXPECT_LE(error, tolerance.loss)
        << "loss at step " << i << ": " << gpu.losses[i] << " vs " << cpu.losses[i];
  }
  if (tolerance.loss > 0) test::ErrorLedger::record(worst_loss, tolerance.loss, "losses");
  for (size_t i = 0; i < gpu.parameters.size(); ++i) {
    const double error = what == Compare::updates
                             ? test::relative_error(update_of(gpu, i), update_of(cpu, i))
                             : test::relative_error(gpu.parameters[i], cpu.parameters[i]);
    const std::string name = cat(what == Compare::updates ? "update of " : "", "parameter ", i);
    if (tolerance.parameters > 0) test::ErrorLedger::record(error, tolerance.parameters, name);
    EXPECT_LE(error, tolerance.parameters) << name;
  }
  EXPECT_EQ(gpu.scale, cpu.scale);
}

std::unique_ptr<nn::Sequential> make_mlp() {
  Rng rng(3);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Linear>(8, 16, rng).emplace<nn::ReLU>();
  model->emplace<nn::Linear>(16, 16, rng).emplace<nn::ReLU>();
  model->emplace<nn::Linear>(16, 1, rng);
  return model;
}

// The sine model without the biases of the convolutions that feed a batch norm: BN subtracts
// the batch mean, so such a bias has a gradient of exactly zero in exact arithmetic, and what
// comes out is rounding noise (FP32: ~1e-10, AMP: larger), different on each device. Adam turns
// noise near or above eps into steps of up to lr with a random sign, so those biases would drift
// apart by up to lr per step and fail the parity tolerance while the loss is unaffected.
std::unique_ptr<nn::Sequential> make_sine_net() {
  Rng rng(4);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Conv2d>(2, 64, 1, rng, 1, 0, /*bias=*/false).emplace<nn::BatchNorm>(64);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Conv2d>(64, 64, 1, rng, 1, 0, /*bias=*/false).emplace<nn::BatchNorm>(64);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Conv2d>(64, 1, 1, rng);
  return model;
}

// A small classifier like examples/classify's: 3x3 convs (one strided) with batch norm, global
// average pooling, a linear head, cross-entropy over 10 classes.
std::unique_ptr<nn::Sequential> make_classifier() {
  Rng rng(7);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Conv2d>(1, 8, 3, rng, 1, 1, /*bias=*/false).emplace<nn::BatchNorm>(8);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Conv2d>(8, 16, 3, rng, 2, 1, /*bias=*/false).emplace<nn::BatchNorm>(16);
  model->emplace<nn::ReLU>();
  model->emplace<nn::GlobalAvgPool>().emplace<nn::Linear>(16, 10, rng);
  return model;
}

// Eight 12x12 images and their labels.
std::pair<Tensor, Tensor> classifier_batch() {
  Rng data(9);
  const Tensor x = test::random_tensor(data, {8, 12, 12, 1});
  std::vector<float> labels(8);
  for (float& label : labels) label = std::floor(data.uniform(0.0f, 10.0f));
  return {x, Tensor::from_vector(labels, {8}, DType::i32)};
}

// Tolerances, on the updates (what training changed: the parameters would hide an update much
// smaller than the weight, and a parameter left untouched on one device is then off by 1).
// FP32 steps differ only in summation order (~1e-6 per op, a little growth over steps); AMP
// steps round activations to f16, and a value near a rounding tie may land on either side
// (~5e-4 relative where it does). SGD's updates are linear in the gradients, so these
// differences stay small in them (the CPU emulator of the backend measures under 1e-3 in AMP).
// Adam's first step is sign-only (g / |g|): a gradient within rounding noise of zero can move an
// element by +lr on one device and -lr on the other, 0.1 of the update of a 16-element bias
// over five steps; the emulator measures under 1e-4 (no such flip), and the AMP bound leaves
// room for two flips while an update skipped or of the wrong sign is off by 1 or more.
// Losses: a mean over the batch, where single rounding flips average out, and a flipped Adam
// element moves where the gradient is near zero, so the loss barely: 2e-3 relative in AMP.
// bf16 has 3 significant bits fewer than f16: a rounding that lands on the other side of a tie
// moves a value 8 times as far, so its loss and SGD tolerances are 8 times f16's (Adam's bound
// is set by sign flips, which do not grow with the format's spacing).
constexpr Tolerances kFp32Tolerances{1e-4, 1e-4};
constexpr Tolerances kAmpSgdTolerances{2e-3, 1e-2};
constexpr Tolerances kAmpAdamTolerances{2e-3, 0.25};
constexpr Tolerances kBf16SgdTolerances{1.6e-2, 8e-2};
constexpr Tolerances kBf16AdamTolerances{1.6e-2, 0.25};
constexpr Tolerances kBitForBit{0.0, 0.0};

constexpr DType kPrecisions[] = {DType::f32, DType::f16, DType::bf16};

// Five steps on the GPU and on the CPU from the same init and data, in FP32, AMP-f16 and
// AMP-bf16, with SGD (momentum) and with Adam, comparing the losses and the updates.
void expect_parity_in_fp32_and_amp(const ModelFactory& make_model, const Tensor& x,
                                   const Tensor& y) {
  for (DType precision : kPrecisions) {
    SCOPED_TRACE(precision_name(precision));
    const bool bf16 = precision == DType::bf16;
    const Tolerances sgd = precision == DType::f32 ? kFp32Tolerances
                           : bf16                  ? kBf16SgdTolerances
                                                   : kAmpSgdTolerances;
    const Tolerances adam = precision == DType::f32 ? kFp32Tolerances
                            : bf16                  ? kBf16AdamTolerances
                                                    : kAmpAdamTolerances;
    expect_same_training(train_on(Device::cuda, precision, make_model, x, y, 5, Optimizer::sgd),
                         train_on(Device::cpu, precision, make_model, x, y, 5, Optimizer::sgd), sgd,
                         Compare::updates);
    expect_same_training(train_on(Device::cuda, precision, make_model, x, y, 5),
                         train_on(Device::cpu, precision, make_model, x, y, 5), adam,
                         Compare::updates);
  }
}

TEST(GpuTraining, MlpStepsMatchTheCpu) {
  MINAMP_REQUIRE_GPU();
  Rng data(5);
  const Tensor x = test::random_tensor(data, {512, 8}), y = test::random_tensor(data, {512, 1});
  expect_parity_in_fp32_and_amp(make_mlp, x, y);
}

TEST(GpuTraining, ClassifierStepsMatchTheCpu) {
  MINAMP_REQUIRE_GPU();
  const auto [x, y] = classifier_batch();
  expect_parity_in_fp32_and_amp(make_classifier, x, y);
}

TEST(GpuTraining, SineStepsMatchTheCpu) {
  MINAMP_REQUIRE_GPU();
  const int64_t size = 32;
  const std::vector<float> grid = examples::coordinate_grid(size);
  const Tensor x = Tensor::from_vector(grid, {1, size, size, 2});
  const Tensor y = Tensor::from_vector(examples::quantized_sine(grid), {1, size, size, 1});
  expect_parity_in_fp32_and_amp(make_sine_net, x, y);
}

using GraphHandle = std::unique_ptr<backend::CudaGraph, void (*)(backend::CudaGraph*)>;

// One step of `run` captured into a CUDA graph (which runs nothing); the capture refuses any
// host read or synchronisation inside the step.
GraphHandle capture_step(TrainingRun& run) {
  return GraphHandle(backend::cuda_graph_capture([&] { run.step(); }), backend::cuda_graph_destroy);
}

// Trains `steps` steps on the GPU like train_on(Device::cuda, ...): the first eagerly (it
// creates the optimizer's state), then one step captured into a CUDA graph and replayed
// steps - 1 times, reading each replay's loss from the tensor the capture made.
Trained train_with_graph(DType precision, const ModelFactory& make_model, const Tensor& x,
                         const Tensor& y, int steps, Optimizer kind = Optimizer::adam) {
  TrainingRun run(Device::cuda, precision, make_model, x, y, kind);
  run.step();
  run.record_loss();
  const GraphHandle graph = capture_step(run);
  for (int i = 1; i < steps; ++i) {
    backend::cuda_graph_launch(graph.get());
    run.record_loss();
  }
  return run.trained();
}

// The same kernels on the same data in the same order: replays match eager steps exactly.
TEST(GpuTraining, GraphReplaysMatchEagerSteps) {
  MINAMP_REQUIRE_GPU();
  Rng data(6);
  const Tensor x = test::random_tensor(data, {512, 8}), y = test::random_tensor(data, {512, 1});
  const std::vector<float> grid = examples::coordinate_grid(16);
  const Tensor grid_x = Tensor::from_vector(grid, {1, 16, 16, 2});
  const Tensor grid_y = Tensor::from_vector(examples::quantized_sine(grid), {1, 16, 16, 1});
  const auto [class_x, class_y] = classifier_batch();
  for (DType precision : kPrecisions) {
    SCOPED_TRACE(precision_name(precision));
    expect_same_training(train_with_graph(precision, make_mlp, x, y, 4),
                         train_on(Device::cuda, precision, make_mlp, x, y, 4), kBitForBit);
    expect_same_training(train_with_graph(precision, make_sine_net, grid_x, grid_y, 4),
                         train_on(Device::cuda, precision, make_sine_net, grid_x, grid_y, 4),
                         kBitForBit);
    expect_same_training(
        train_with_graph(precision, make_classifier, class_x, class_y, 4, Optimizer::sgd),
        train_on(Device::cuda, precision, make_classifier, class_x, class_y, 4, Optimizer::sgd),
        kBitForBit);
  }
}

#if MINAMP_WITH_CUDA
// After the first steps (which fill the allocator's cache and create the optimizer's state),
// a training step of each model, with each optimizer, in FP32 and AMP, calls cudaMalloc no more.
TEST(GpuTraining, SteadyStepsMakeNoCudaMallocCall) {
  MINAMP_REQUIRE_GPU();
  MINAMP_REQUIRE_CACHING();
  Rng data(10);
  const Tensor x = test::random_tensor(data, {512, 8}), y = test::random_tensor(data, {512, 1});
  const std::vector<float> grid = examples::coordinate_grid(16);
  const Tensor grid_x = Tensor::from_vector(grid, {1, 16, 16, 2});
  const Tensor grid_y = Tensor::from_vector(examples::quantized_sine(grid), {1, 16, 16, 1});
  const auto [class_x, class_y] = classifier_batch();
  const struct {
    const char* name;
    ModelFactory make_model;
    const Tensor &x, &y;
  } models[] = {{"mlp", make_mlp, x, y},
                {"sine", make_sine_net, grid_x, grid_y},
                {"classifier", make_classifier, class_x, class_y}};
  for (const auto& model : models)
    for (Optimizer kind : {Optimizer::sgd, Optimizer::adam})
      for (DType precision : kPrecisions) {
        TrainingRun run(Device::cuda, precision, model.make_model, model.x, model.y, kind);
        for (int step = 0; step < 2; ++step) run.step();
        const size_t calls = gpu::cuda_malloc_calls();
        for (int step = 0; step < 3; ++step) run.step();
        EXPECT_EQ(gpu::cuda_malloc_calls(), calls)
            << model.name << (kind == Optimizer::sgd ? " SGD " : " Adam ")
            << precision_name(precision);
      }
}
#endif // MINAMP_WITH_CUDA

TEST(GpuTraining, OverflowThroughARealModelSkipsTheStepOnTheDevice) {
  MINAMP_REQUIRE_GPU();
  std::unique_ptr<nn::Sequential> model = make_sine_net();
  model->to(Device::cuda);
  optim::Adam adam(model->parameters(), 1e-3f);
  amp::GradScalerOptions options;
  options.init_scale = 1e30f; // f16 activation gradients overflow at this scale
  amp::GradScaler scaler(options, Device::cuda);
  const std::vector<float> grid = examples::coordinate_grid(16);
  const Tensor x = Tensor::from_vector(grid, {1, 16, 16, 2}, DType::f32, Device::cuda);
  const Tensor y =
      Tensor::from_vector(examples::quantized_sine(grid), {1, 16, 16, 1}, DType::f32, Device::cuda);
  std::vector<std::vector<float>> before, moments_before;
  for (Parameter* p : model->parameters()) before.push_back(p->master().to_vector());
  for (auto& [name, t] : adam.named_state()) moments_before.push_back(t->to_vector());

  adam.zero_grad();
  {
    amp::Autocast autocast;
    Var loss = ops::mse_loss((*model)(Var(x)), y);
    scaler.scale(loss).backward();
  }
  scaler.step(adam);
  scaler.update();

  EXPECT_TRUE(scaler.step_was_skipped(adam));
  EXPECT_EQ(scaler.get_scale(), 5e29f);
  EXPECT_EQ(adam.step_count(), 0);
  const auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i]->master().to_vector(), before[i]);
  size_t k = 0;
  for (auto& [name, t] : adam.named_state()) EXPECT_EQ(t->to_vector(), moments_before[k++]) << name;
}

} // namespace
} // namespace minamp
