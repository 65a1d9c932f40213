// What every example shares: the command-line options, device selection, the training loop
// (written to sit next to PyTorch's autocast + GradScaler loop), metrics.csv / summary.json, the
// FP32-vs-AMP comparison table, and the fp16 range diagnostics.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "amp/grad_scaler.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace minamp::examples {

// Options common to every example.
struct Options {
  std::string device = "auto";
  uint64_t seed = 0;
  float lr = 1e-3f;
  std::string out;
  bool amp = false;
  bool compare = false;
  bool diagnose = false;
  float init_scale = 65536.0f;
  int growth_interval = 2000;
  bool no_loss_scaling = false;
  int log_every = 0; // progress lines; 0 picks a default from the step count
};

// Registers the common options on `app`; `default_lr` is the example's default learning rate.
void add_common_options(CLI::App& app, Options& options, float default_lr);
// "auto" -> cuda when available, else cpu; "cuda" without a GPU is an Error saying why.
Device resolve_device(const std::string& name);

// One training batch: the input and a target (f32 values for MSE, i32 labels for CE).
struct Batch {
  Tensor input;
  Tensor target;
};

enum class LossKind { mse, cross_entropy };
enum class OptimizerKind { sgd, adam };

// Everything an example defines: how to build its model, its batches and its loss.
struct TrainSpec {
  std::string example;
  std::function<std::unique_ptr<nn::Sequential>(Rng& rng)> build_model;
  std::function<Batch(int64_t step, Device device)> batch;
  LossKind loss = LossKind::mse;
  OptimizerKind optimizer = OptimizerKind::sgd;
  int64_t steps = 0;
  // Called after the last step with the trained model (e.g. to write images); `amp` says
  // whether this run trained with mixed precision.
  std::function<void(nn::Sequential& model, Device device, bool amp, const std::string& out_dir)>
      finish;
};

struct RunResult {
  std::string precision; // "fp32" or "amp"
  double wall_s = 0;
  double final_loss = 0;
  size_t peak_bytes = 0;
  int64_t skipped_steps = 0;
  double final_scale = 1;
  double inference_wall_s = 0;
  size_t inference_peak_bytes = 0;
};

// Trains spec.steps steps in FP32 or AMP, writes out_dir/metrics.csv and summary.json, prints
// progress, and returns the figures. The model is built from `options.seed`, so two runs
// start from the same weights.
RunResult train(const TrainSpec& spec, const Options& options, Device device, bool amp,
                const std::string& out_dir);

// Runs the example as its options say: one run, or --compare (FP32 then AMP, then the table).
int run_example(const TrainSpec& spec, const Options& options);

// Catches minamp::Error and CLI11 errors at main: prints one line and returns non-zero.
int guarded_main(const std::function<int()>& body);

} // namespace minamp::examples
