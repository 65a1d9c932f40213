// What every example shares: the command-line options, device selection, the training loop
// (written to sit next to PyTorch's autocast + GradScaler loop), per-epoch evaluation, weights
// and training checkpoints with resume, metrics.csv / epochs.csv / summary.json and their plots,
// the FP32-vs-AMP comparison table (AMP in f16, bf16 or both), and the range diagnostics of both
// 16-bit formats.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>

#include "amp/grad_scaler.h"
#include "io/safetensors.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace minamp::examples {

// The largest counts and sizes the programs take (integer_in checks them: "--steps: expected an
// integer from 1 to 1000000000, got 0"). Past them a step count overflows or a model needs more
// memory than any machine has, and the run would die without a word instead of saying so.
constexpr int64_t kMaxSteps = 1'000'000'000;
constexpr int64_t kMaxWidth = 65'536;     // features or channels of one layer
constexpr int64_t kMaxBatch = 16'777'216; // rows of one batch
constexpr int64_t kMaxLayers = 1'000;

// Throws Error naming `what` when `bytes` of host memory are more than this machine has (a
// data set built in std::vectors would otherwise be killed by the kernel part-way).
void require_host_memory(double bytes, const std::string& what);

// Options common to every example.
struct Options {
  std::string device = "auto";
  uint64_t seed = 0;
  float lr = 1e-3f;
  std::string out;
  bool amp = false;
  std::string amp_dtype = "f16"; // autocast's dtype: f16 or bf16
  bool compare = false;
  bool compare_dtypes = false; // FP32, AMP-f16 and AMP-bf16
  bool diagnose = false;
  bool profile = false; // time every op of training; print it and write profile.txt
  float init_scale = amp::GradScalerOptions{}.init_scale;
  int growth_interval = amp::GradScalerOptions{}.growth_interval;
  bool no_loss_scaling = false; // f16 without the scaler (an ablation)
  bool loss_scaling = false;    // bf16 with the scaler (off by default, as PyTorch users run it)
  int64_t log_every = 0;        // steps between progress lines; 0: a tenth of the run or 10 s
  std::string save_weights;     // directory for init.safetensors and final.safetensors
  std::string load_weights;     // a weights file to start from
  int64_t checkpoint_every = 0; // steps between training checkpoints; 0: none
  std::string resume;           // a training checkpoint to continue from
};

// Registers the common options on `app`; `default_lr` is the example's default learning rate.
void add_common_options(CLI::App& app, Options& options, float default_lr);
// "auto" -> cuda when available, else cpu; "cuda" without a GPU is an Error saying why.
Device resolve_device(const std::string& name);

// How a run computes: FP32, or AMP with autocast to `dtype` (f16 or bf16).
struct Precision {
  bool amp = false;
  DType dtype = DType::f16;
  // "fp32", "amp" (f16) or "amp-bf16": the run's name in logs, output folders and summaries.
  std::string name() const { return !amp ? "fp32" : dtype == DType::f16 ? "amp" : "amp-bf16"; }
};

// Whether a run in `precision` scales its loss: AMP-f16 unless --no-loss-scaling, AMP-bf16 only
// with --loss-scaling (bf16 has float's range: PyTorch users train it without a scaler).
bool scales_loss(const Options& options, const Precision& precision);

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
  std::function<std::unique_ptr<nn::Module>(Rng& rng)> build_model;
  std::function<Batch(int64_t step, Device device)> batch;
  LossKind loss = LossKind::mse;
  OptimizerKind optimizer = OptimizerKind::sgd;
  int64_t steps = 0;
  // The options that define the model and the data (e.g. {"widths", "16,16"}): training
  // checkpoints record them with the seed, and --resume refuses a checkpoint whose differ.
  io::Metadata config;
  // Epochs (classifiers): steps_per_epoch > 0 makes the run spec.steps / steps_per_epoch epochs.
  // start_epoch is called before an epoch's first step with the data-order generator (seeded
  // from --seed and saved in training checkpoints), e.g. to reshuffle the training set; the
  // order must follow from the generator's state alone (a resumed run redraws it). After
  // each epoch the eval_batches held-out batches are evaluated (loss, and accuracy for
  // cross-entropy) when eval_batch is set.
  int64_t steps_per_epoch = 0;
  std::function<void(int64_t epoch, Rng& rng)> start_epoch;
  int64_t eval_batches = 0;
  std::function<Batch(int64_t index, Device device)> eval_batch;
  // Called after the last step with the trained model (e.g. to write images); `precision` is
  // the run's (autocast it for inference as the run trained).
  std::function<void(nn::Module& model, Device device, const Precision& precision,
                     const std::string& out_dir)>
      finish;
  std::vector<std::string> output_files; // the files `finish` writes into out_dir
  // The files the run reads (e.g. its data set): a run whose output would replace one is refused.
  std::vector<std::string> input_files;
  // The folders the run reads every file of (an image folder): an output inside one is refused.
  std::vector<std::string> input_dirs;
};

struct RunResult {
  std::string precision; // Precision::name()
  double wall_s = 0;
  double final_loss = 0;
  double loss_last10_mean = 0; // of the last 10 steps' losses (of all, when fewer): less noisy
  size_t peak_bytes = 0;
  int64_t skipped_steps = 0;
  double final_scale = 1;
  double inference_wall_s = 0;
  size_t inference_peak_bytes = 0;
  double test_loss = 0, test_accuracy = 0; // after the last epoch, when the spec evaluates
  int64_t steps_completed = 0;             // spec.steps, unless the run stopped early
  int stop_signal = 0; // SIGINT or SIGTERM when the run stopped early on one, else 0
};

// Trains spec.steps steps in `precision` (from --load-weights or --resume when given), writes
// out_dir/metrics.csv, summary.json, loss.png (and with loss scaling loss_scale.png; with
// evaluation epochs.csv and accuracy.png), weights and checkpoints as the options say, prints
// progress, and returns the figures. The model is built from `options.seed`, so two runs start from
// the same weights. The output folders must exist (run_example creates and locks them). A run
// whose loss scale collapses (a skipped step leaves it below the smallest normal float) stops
// with an Error when the scale is next read (at a log line, an epoch end, a checkpoint, or every
// 32 steps). Once a stop was requested (run_example: SIGINT or SIGTERM), the run stops before
// its next step, writes its checkpoint (with --checkpoint-every) and outputs, and returns with
// stop_signal set.
RunResult train(const TrainSpec& spec, const Options& options, Device device,
                const Precision& precision, const std::string& out_dir);

// Runs the example as its options say: one run, or --compare (FP32 then AMP, then the table), or
// --compare-dtypes (FP32, AMP-f16 and AMP-bf16, then the table).
// The output folders are created and locked first (a second run on one is refused) and cleared
// of an earlier run's outputs (but an earlier checkpoint, which the run's first replaces), and a
// folder it made is removed if it fails before writing into it. The first SIGINT or SIGTERM stops
// the run after its current step (train), the second ends the program at once; the program then
// returns 128 + the signal (130 for SIGINT, 143 for SIGTERM) with one line saying so.
int run_example(const TrainSpec& spec, const Options& options);

// For what a program writes without training (transfer --predict and --max-batch): checks the
// folder `dir` (named by --out) and its `files` as run_example checks its runs' (none may be one
// of `inputs`, the folder not inside one of `input_dirs`), makes and locks it, runs `write`, and
// removes it again if it is left empty.
void with_output_folder(const std::string& dir, const std::vector<std::string>& files,
                        const std::vector<std::string>& inputs,
                        const std::vector<std::string>& input_dirs,
                        const std::function<void()>& write);

// Prints `line` and a newline to stderr, after flushing what stdout holds: piped, stdout is
// block-buffered, and a log that merges the two would otherwise show a warning or an error before
// the lines that led to it.
void print_to_stderr(const std::string& line);

// Names the options that set how much memory the program needs, as given (e.g. "--size 8192,
// --hidden 256 and --layers 2"), for guarded_main's out-of-memory error.
void set_memory_options(const std::string& options);

// Catches minamp::Error and CLI11 errors at main: prints one line and returns non-zero. Running
// out of memory (OutOfMemory, std::bad_alloc) is an error naming the set_memory_options.
int guarded_main(const std::function<int()>& body);

} // namespace minamp::examples
