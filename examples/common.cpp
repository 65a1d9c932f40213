// The shared example harness: options, the AMP training loop, per-epoch evaluation, the run's log
// (metrics.csv, epochs.csv, plots), weights and training checkpoints, comparison, diagnostics.
#include "common.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <set>

#include "amp/autocast.h"
#include "amp/diagnostics.h"
#include "cli.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/folder_lock.h"
#include "io/plot.h"
#include "io/utf8.h"
#include "kernels/backend.h"
#include "kernels/gemm_version.h"
#include "kernels/profile.h"
#include "ops/ops.h"

namespace minamp::examples {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string mib(size_t bytes) { return cat(std::round(bytes / 1048576.0 * 100) / 100, " MiB"); }

// A loss as the log keeps it: a NaN without its sign bit, which printf and streams show as
// "-nan". Sums and copies keep a NaN's sign, so the figures derived from the log read "nan" too.
float unsigned_nan(float value) { return std::isnan(value) ? std::fabs(value) : value; }

// ---- stopping on SIGINT or SIGTERM ----

// The signal that asked the runs to stop (0: none yet); set by on_stop_signal.
volatile std::sig_atomic_t g_stop_signal = 0;

// The first SIGINT or SIGTERM is noted for the training loop to see between steps; from then on
// both have their default action again, so a second one ends the program at once.
void on_stop_signal(int signal) {
  g_stop_signal = signal;
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  ::sigaction(SIGINT, &default_action, nullptr);
  ::sigaction(SIGTERM, &default_action, nullptr);
}

int stop_signal() { return g_stop_signal; }

const char* signal_name(int signal) { return signal == SIGINT ? "SIGINT" : "SIGTERM"; }

// While alive, SIGINT and SIGTERM ask the runs to stop (on_stop_signal) instead of ending the
// program; a signal the program was started ignoring (nohup, `&` in a script) stays ignored.
class StopOnSignal {
public:
  StopOnSignal() {
    for (size_t i = 0; i < kSignals.size(); ++i) {
      ::sigaction(kSignals[i], nullptr, &previous_[i]);
      if (previous_[i].sa_handler == SIG_IGN) continue;
      struct sigaction action {};
      action.sa_handler = on_stop_signal;
      action.sa_flags = SA_RESTART; // a read or write under way goes on
      ::sigaction(kSignals[i], &action, nullptr);
    }
  }
  ~StopOnSignal() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

private:
  static constexpr std::array<int, 2> kSignals{SIGINT, SIGTERM};
  std::array<struct sigaction, 2> previous_{};
};

// A directory a run writes into: the option that names it, the files it will write there, and
// those that the program writes there in other configurations only (an earlier run's are removed:
// a folder holds one run's outputs).
struct OutputDir {
  std::string dir;
  const char* option;
  std::vector<std::string> files;
  std::vector<std::string> others;
};

// The training checkpoint in a run's --out folder: an earlier run's is kept until this run writes
// its own, so that a run started again without --resume loses nothing.
constexpr const char* kCheckpointFile = "checkpoint.safetensors";

// Whether `path` lies inside the folder `dir` (or is it), after resolving links and "..".
bool is_inside(const std::string& path, const std::string& dir) {
  std::error_code ignored;
  const std::filesystem::path inner = std::filesystem::weakly_canonical(path, ignored);
  std::filesystem::path outer = std::filesystem::weakly_canonical(dir, ignored);
  if (!outer.has_filename()) outer = outer.parent_path(); // "root/" as "root"
  const std::filesystem::path relative = inner.lexically_relative(outer);
  return !relative.empty() && *relative.begin() != "..";
}

// The directories that creating `dir` would make, deepest first (none when `dir` exists), and
// in `existing` the nearest ancestor that exists.
std::vector<std::filesystem::path> missing_dirs(const std::string& dir,
                                                std::filesystem::path& existing) {
  std::vector<std::filesystem::path> missing;
  std::error_code error; // a path that cannot be examined counts as missing; creating it reports
  existing = std::filesystem::absolute(dir, error);
  while (!std::filesystem::exists(existing, error) && existing.has_parent_path() &&
         existing != existing.parent_path()) {
    missing.push_back(existing);
    existing = existing.parent_path();
  }
  return missing;
}

// Throws Error naming the option unless each directory is one or could be made one (the
// nearest existing ancestor is a directory this process may write to) outside every one of
// `input_dirs` (folders the run reads all files of, such as an image folder: a plot written there
// would join the data), each of its files is absent or a regular file (a directory found only
// when the run writes it would throw the run away; a device, FIFO or link is not replaced), and
// none is one of the run's `inputs`.
void require_outputs_usable(const std::vector<OutputDir>& outputs,
                            const std::vector<std::string>& inputs,
                            const std::vector<std::string>& input_dirs) {
  std::error_code ignored;
  for (const OutputDir& out : outputs) {
    for (const std::string& data : input_dirs)
      require(!is_inside(out.dir, data), out.option, out.dir, " lies inside ", data,
              ", which the run reads every file of: its outputs would join the data");
    std::filesystem::path existing;
    missing_dirs(out.dir, existing);
    const bool is_dir = std::filesystem::is_directory(existing, ignored);
    require(is_dir && ::access(existing.c_str(), W_OK) == 0, out.option,
            "cannot create the directory ", out.dir, " (", existing.string(),
            is_dir ? " is not writable)" : " is not a directory)");
    for (const std::string& file : out.files) {
      const std::string path = out.dir + "/" + file;
      require(!std::filesystem::is_directory(path, ignored), out.option, path,
              " is a directory, where the run would write a file");
      io::require_replaceable(path, out.option);
      for (const std::string& input : inputs)
        require(!std::filesystem::equivalent(input, path, ignored), out.option, path, " is ", input,
                ", which this run reads: the run would replace it");
    }
  }
}

// The directories a run of `spec` in `precision` writes into, with the files it writes there and
// those that runs in other configurations write there.
std::vector<OutputDir> output_dirs(const TrainSpec& spec, const Options& options,
                                   const Precision& precision, const std::string& out_dir) {
  OutputDir out{out_dir, "--out", {"metrics.csv", "summary.json", "loss.png"}, {}};
  out.files.insert(out.files.end(), spec.output_files.begin(), spec.output_files.end());
  const bool evaluates = spec.steps_per_epoch > 0 && bool(spec.eval_batch);
  for (const char* file : {"epochs.csv", "accuracy.png"})
    (evaluates ? out.files : out.others).push_back(file);
  const std::pair<bool, const char*> optional[] = {
      {scales_loss(options, precision), "loss_scale.png"},
      {options.profile, "profile.txt"},
      {options.diagnose, "gradients.png"},
      {options.checkpoint_every > 0, kCheckpointFile}};
  for (const auto& [written, file] : optional) (written ? out.files : out.others).push_back(file);
  if (options.save_weights.empty()) return {out};
  return {out,
          {options.save_weights, "--save-weights", {"init.safetensors", "final.safetensors"}, {}}};
}

// The output directories of a program's runs, held while they train: created where missing,
// each locked against other minamp runs (io::FolderLock: a second run on the same folder is
// refused), and cleared of the temp files that a killed run's atomic writes of these files left
// and of an earlier run's outputs (OutputDir's files and others; require_outputs_usable made sure
// none is an input), but for the checkpoint `resumed` (the run reads it first) and an earlier
// checkpoint (kCheckpointFile), which the run's own replaces;
// the earlier outputs that this run will not write again are named in a note. On destruction,
// however the runs ended, the locks are released and every directory this made that is still
// empty is removed, deepest first: a failed run leaves no empty folder behind and never touches
// anything else.
class OutputFolders {
public:
  OutputFolders(const std::vector<OutputDir>& outputs, const std::string& resumed)
      : resumed_(resumed) {
    try {
      for (const OutputDir& out : outputs) hold(out);
    } catch (...) {
      release();
      throw;
    }
  }
  ~OutputFolders() { release(); }
  OutputFolders(const OutputFolders&) = delete;
  OutputFolders& operator=(const OutputFolders&) = delete;

private:
  void hold(const OutputDir& out) {
    std::filesystem::path existing;
    const std::vector<std::filesystem::path> missing = missing_dirs(out.dir, existing);
    std::error_code error;
    std::filesystem::create_directories(out.dir, error);
    made_.insert(made_.begin(), missing.begin(), missing.end()); // deepest first
    if (error)
      throw Error(
          cat(out.option, ": cannot create the directory ", out.dir, " (", error.message(), ")"));
    // One lock per folder (--save-weights may name the --out folder).
    if (locked_.insert(std::filesystem::weakly_canonical(out.dir, error).string()).second)
      locks_.push_back(std::make_unique<io::FolderLock>(out.dir, out.option));
    for (const std::string& file : out.files) io::remove_stale_temp_files(out.dir, file);
    remove_earlier_outputs(out);
  }
  void remove_earlier_outputs(const OutputDir& out) const {
    std::string removed; // of the files this run does not write
    for (const std::vector<std::string>* names : {&out.files, &out.others})
      for (const std::string& name : *names) {
        const std::string path = out.dir + "/" + name;
        std::error_code error;
        if (name == kCheckpointFile || !std::filesystem::is_regular_file(path, error) ||
            std::filesystem::equivalent(resumed_, path, error))
          continue;
        require(std::filesystem::remove(path, error), out.option, "cannot remove ", path,
                ", an earlier run's output (", error.message(), ")");
        if (names == &out.others) removed += (removed.empty() ? "" : ", ") + name;
      }
    if (!removed.empty())
      print_to_stderr(cat("note: ", out.option, " ", out.dir, ": removed an earlier run's ",
                          removed, ", which this run does not write"));
  }
  void release() {
    locks_.clear();
    locked_.clear();
    std::error_code ignored;
    for (const std::filesystem::path& dir : made_)
      if (std::filesystem::is_empty(dir, ignored)) std::filesystem::remove(dir, ignored);
    made_.clear();
  }
  std::string resumed_;
  std::vector<std::filesystem::path> made_;
  std::set<std::string> locked_;
  std::vector<std::unique_ptr<io::FolderLock>> locks_;
};

// The data-order generator's stream: apart from the weights' (Rng's default stream), same seed.
constexpr uint64_t kDataStream = 1;

Var loss_of(LossKind kind, const Var& output, const Tensor& target) {
  return kind == LossKind::mse ? ops::mse_loss(output, target) : ops::cross_entropy(output, target);
}

// How many rows of logits[N, K] have their largest value at labels[N] (a host read).
int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const std::vector<float> values = logits.to_vector();
  const std::vector<float> truth = labels.to_vector();
  const int64_t n = logits.shape()[0], k = logits.shape()[1];
  int64_t correct = 0;
  for (int64_t row = 0; row < n; ++row) {
    const float* v = values.data() + row * k;
    correct += std::max_element(v, v + k) - v == int64_t(truth[row]);
  }
  return correct;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainSpec& spec, nn::Module& model,
                                                 float lr) {
  if (spec.optimizer == OptimizerKind::adam)
    return std::make_unique<optim::Adam>(model.parameters(), lr);
  return std::make_unique<optim::SGD>(model.parameters(), lr);
}

amp::GradScalerOptions scaler_options(const Options& options, const Precision& precision) {
  amp::GradScalerOptions scaler;
  scaler.init_scale = options.init_scale;
  scaler.growth_interval = options.growth_interval;
  scaler.enabled = scales_loss(options, precision);
  return scaler;
}

// Progress: one line rewritten in place on a terminal, plain lines otherwise; every `every`
// steps, or with every = 0 every tenth of the run or kQuietSeconds after the last line, whichever
// comes first (a long run shows it is alive).
class Progress {
public:
  Progress(std::string label, int64_t first, int64_t total, int64_t every, int64_t steps_per_epoch)
      : label_(std::move(label)), first_(first), total_(total),
        every_(every > 0 ? every : std::max<int64_t>(1, total / 10)), timed_(every == 0),
        steps_per_epoch_(steps_per_epoch), tty_(isatty(STDOUT_FILENO)), start_(Clock::now()),
        last_line_(start_) {}
  // True when update(step, ...) prints a line (and always at the last step).
  bool due(int64_t step) const {
    return step + 1 == total_ || (step + 1) % every_ == 0 ||
           (timed_ && seconds_since(last_line_) >= kQuietSeconds);
  }
  void update(int64_t step, double loss, double scale) {
    if (!due(step)) return;
    last_line_ = Clock::now();
    const bool last = step + 1 == total_;
    const double elapsed = seconds_since(start_);
    const double rate = (step + 1 - first_) / std::max(elapsed, 1e-9);
    const std::string epoch = steps_per_epoch_ > 0 ? cat("epoch ", step / steps_per_epoch_ + 1, "/",
                                                         total_ / steps_per_epoch_, "  ")
                                                   : "";
    std::printf("%s[%s] %sstep %lld/%lld  loss %.5g  scale %g  %.1f steps/s  ETA %.0fs%s",
                tty_ ? "\r" : "", label_.c_str(), epoch.c_str(), static_cast<long long>(step + 1),
                static_cast<long long>(total_), loss, scale, rate, (total_ - step - 1) / rate,
                tty_ && !last ? "" : "\n");
    std::fflush(stdout);
  }
  // A line of its own (on a terminal it replaces the progress line, which the next update redraws).
  void note(const std::string& line) {
    std::printf("%s%s\n", tty_ ? "\r\033[K" : "", line.c_str());
    std::fflush(stdout);
  }

private:
  static constexpr double kQuietSeconds = 10;
  std::string label_;
  int64_t first_, total_;
  int64_t every_;
  bool timed_;
  int64_t steps_per_epoch_;
  bool tty_;
  Clock::time_point start_, last_line_;
};

// ---- the run's log: what metrics.csv, epochs.csv and the plots show ----

// Per step; `correct` counts right predictions in the batch (classifiers), `rows` the batch.
struct StepRecord {
  float loss = 0, wall_s = 0, scale = 1, skipped = 0, correct = 0, rows = 0;
};

// Steps at the end of a run whose mean loss is reported beside the last one (RunResult's
// loss_last10_mean): one step's loss is noisy.
constexpr size_t kLossTailSteps = 10;

// The mean loss of the last kLossTailSteps steps (of all, when fewer; 0 when there are none).
double last_losses_mean(const std::vector<StepRecord>& steps) {
  const size_t used = std::min(kLossTailSteps, steps.size());
  double sum = 0;
  for (size_t i = steps.size() - used; i < steps.size(); ++i) sum += steps[i].loss;
  return used == 0 ? 0.0 : sum / double(used);
}

// At most this many steps wait to be read on the host (Run::read_pending): a host read waits
// for the GPU, and the training loop promises no per-step host synchronisation.
constexpr int64_t kMaxPendingSteps = 32;

// A step whose figures are still on the device: its loss, scale and found_inf sit in its row of
// Run::pending_figures_; classifiers keep the batch's logits and labels for the correct count.
struct PendingStep {
  Tensor logits, labels;
  float wall_s = 0; // when the step was queued (on a GPU it may still be running)
};

// Per epoch; images_per_s and peak_mib are of its training steps (evaluation aside).
struct EpochRecord {
  float train_loss = 0, train_accuracy = 0, test_loss = 0, test_accuracy = 0, wall_s = 0;
  float images_per_s = 0, peak_mib = 0;
};

// The whole run so far. Training checkpoints carry it (as f32 [steps, 6] and [epochs, 7]
// tensors, one record a row), so a resumed run's logs and plots start at step 0.
struct TrainLog {
  std::vector<StepRecord> steps;
  std::vector<EpochRecord> epochs;
};

constexpr int64_t kStepColumns = 6, kEpochColumns = 7;

template <class Record, size_t Columns>
Tensor records_to_tensor(const std::vector<Record>& records) {
  static_assert(sizeof(Record) == Columns * sizeof(float), "a record is a row of floats");
  Tensor t = Tensor::empty({int64_t(records.size()), int64_t(Columns)});
  if (!records.empty()) std::memcpy(t.raw(), records.data(), t.nbytes());
  return t;
}

template <class Record, size_t Columns>
std::vector<Record> records_from_tensor(const std::string& path, const io::TrainingState& state,
                                        const std::string& name, int64_t rows) {
  for (const io::NamedTensor& t : state.logs) {
    if (t.name != name) continue;
    require(t.tensor.dtype() == DType::f32 && t.tensor.shape() == Shape{rows, int64_t(Columns)},
            "--resume", path, ": 'log.", name, "' is ", describe(t.tensor), ", expected f32[", rows,
            ", ", Columns, "]");
    std::vector<Record> records(static_cast<size_t>(rows));
    if (rows > 0) std::memcpy(records.data(), t.tensor.raw(), t.tensor.nbytes());
    return records;
  }
  throw Error(cat("--resume: ", path, ": missing entry 'log.", name, "'"));
}

// Why a step record is not one a run writes ("wall_s is nan"), or "": every figure finite, the loss
// too unless the step was skipped (a non-finite loss is why a step is skipped; in a step taken it
// means training diverged), skipped 0, or 1 with a loss scaler, scale > 0 (1 without a scaler),
// wall_s >= 0, 0 <= correct <= rows.
std::string invalid_record(const StepRecord& r, bool scaled) {
  for (const auto& [name, value] : {std::pair{"wall_s", r.wall_s},
                                    {"scale", r.scale},
                                    {"skipped", r.skipped},
                                    {"correct", r.correct},
                                    {"rows", r.rows}})
    if (!std::isfinite(value)) return cat(name, " is ", value);
  if (!(r.skipped == 0.0f || (scaled && r.skipped == 1.0f)))
    return cat("skipped is ", r.skipped, ", expected 0", scaled ? " or 1" : "");
  if (!std::isfinite(r.loss) && r.skipped == 0.0f)
    return cat("the loss of a step taken is ", r.loss, " (training diverged)");
  if (!(scaled ? r.scale > 0.0f : r.scale == 1.0f))
    return cat("scale is ", r.scale, scaled ? ", expected > 0" : ", expected 1");
  if (r.wall_s < 0.0f) return cat("wall_s is ", r.wall_s, ", expected a time >= 0");
  if (r.correct < 0.0f || r.correct > r.rows)
    return cat("correct is ", r.correct, ", expected 0 to rows (", r.rows, ")");
  return "";
}

// The same for an epoch record: losses finite (non-finite ones need skipped steps, so a loss
// scaler), accuracies in [0, 1], wall_s, images_per_s and peak_mib finite and >= 0.
std::string invalid_record(const EpochRecord& r, bool scaled) {
  for (const auto& [name, value] :
       {std::pair{"train_loss", r.train_loss}, {"test_loss", r.test_loss}})
    if (!scaled && !std::isfinite(value)) return cat(name, " is ", value, " (training diverged)");
  for (const auto& [name, value] :
       {std::pair{"train_accuracy", r.train_accuracy}, {"test_accuracy", r.test_accuracy}})
    if (!(value >= 0.0f && value <= 1.0f)) return cat(name, " is ", value, ", expected 0 to 1");
  for (const auto& [name, value] :
       {std::pair{"wall_s", r.wall_s}, {"images_per_s", r.images_per_s}, {"peak_mib", r.peak_mib}})
    if (!(std::isfinite(value) && value >= 0.0f))
      return cat(name, " is ", value, ", expected a finite value >= 0");
  return "";
}

// The first record of `records` that invalid_record refuses, as "row 3: wall_s is nan", or "".
template <class Record>
std::string first_invalid_record(const std::vector<Record>& records, bool scaled) {
  for (size_t i = 0; i < records.size(); ++i) {
    const std::string invalid = invalid_record(records[i], scaled);
    if (!invalid.empty()) return cat("row ", i, ": ", invalid);
  }
  return "";
}

std::vector<io::NamedTensor> log_tensors(const TrainLog& log) {
  return {{"steps", records_to_tensor<StepRecord, kStepColumns>(log.steps)},
          {"epochs", records_to_tensor<EpochRecord, kEpochColumns>(log.epochs)}};
}

// Train loss and accuracy of epoch `epoch` from its step records.
EpochRecord train_figures(const TrainLog& log, int64_t epoch, int64_t steps_per_epoch) {
  double loss = 0, correct = 0, rows = 0;
  for (int64_t s = epoch * steps_per_epoch; s < (epoch + 1) * steps_per_epoch; ++s) {
    loss += log.steps[s].loss;
    correct += log.steps[s].correct;
    rows += log.steps[s].rows;
  }
  EpochRecord record;
  record.train_loss = float(loss / double(steps_per_epoch));
  record.train_accuracy = float(correct / std::max(rows, 1.0));
  return record;
}

std::string metrics_csv(const TrainLog& log) {
  std::string csv = "step,loss,wall_s,scale,skipped\n";
  for (size_t i = 0; i < log.steps.size(); ++i) {
    const StepRecord& r = log.steps[i];
    csv += cat(i, ",", r.loss, ",", r.wall_s, ",", r.scale, ",", r.skipped, "\n");
  }
  return csv;
}

std::string epochs_csv(const TrainLog& log) {
  std::string csv =
      "epoch,train_loss,train_accuracy,test_loss,test_accuracy,wall_s,images_per_s,peak_mib\n";
  for (size_t i = 0; i < log.epochs.size(); ++i) {
    const EpochRecord& r = log.epochs[i];
    csv += cat(i + 1, ",", r.train_loss, ",", r.train_accuracy, ",", r.test_loss, ",",
               r.test_accuracy, ",", r.wall_s, ",", r.images_per_s, ",", r.peak_mib, "\n");
  }
  return csv;
}

// loss.png (per step; with epochs also the epoch means and the test loss, x in epochs),
// accuracy.png (with epochs) and loss_scale.png (when the scaler is on), next to metrics.csv.
void write_plots(const std::string& dir, const std::string& title, const TrainLog& log,
                 int64_t steps_per_epoch, bool scaler_enabled) {
  const bool epochs = !log.epochs.empty();
  io::PlotSeries step_loss{"train (per step)", {}, {}}, scale{"loss scale S", {}, {}};
  for (size_t i = 0; i < log.steps.size(); ++i) {
    const double x = epochs ? double(i + 1) / double(steps_per_epoch) : double(i + 1);
    step_loss.x.push_back(x);
    step_loss.y.push_back(log.steps[i].loss);
    scale.x.push_back(double(i + 1));
    scale.y.push_back(log.steps[i].scale);
  }
  io::PlotSeries train_loss{"train (epoch mean)", {}, {}}, test_loss{"test", {}, {}};
  io::PlotSeries train_acc{"train", {}, {}}, test_acc{"test", {}, {}};
  for (size_t e = 0; e < log.epochs.size(); ++e) {
    for (io::PlotSeries* s : {&train_loss, &test_loss, &train_acc, &test_acc})
      s->x.push_back(double(e + 1));
    train_loss.y.push_back(log.epochs[e].train_loss);
    test_loss.y.push_back(log.epochs[e].test_loss);
    train_acc.y.push_back(100.0 * log.epochs[e].train_accuracy);
    test_acc.y.push_back(100.0 * log.epochs[e].test_accuracy);
  }
  const std::string x_label = epochs ? "epoch" : "step";
  if (epochs) {
    io::save_line_plot(dir + "/loss.png", {step_loss, train_loss, test_loss},
                       {title + ": loss", x_label, "loss", true});
    io::save_line_plot(dir + "/accuracy.png", {train_acc, test_acc},
                       {title + ": accuracy", x_label, "accuracy (%)"});
  } else {
    io::save_line_plot(dir + "/loss.png", {step_loss}, {title + ": loss", x_label, "loss", true});
  }
  if (scaler_enabled)
    io::save_line_plot(dir + "/loss_scale.png", {scale},
                       {title + ": loss scale", "step", "S (log scale)", true});
}

// ---- the data order ----

// The generator spec.start_epoch shuffles with. A checkpoint stores the state this epoch's order
// was drawn from (at an epoch boundary: the state the next one will be drawn from), so a resumed
// run redraws the same order and continues it bit for bit.
class DataOrder {
public:
  DataOrder(const TrainSpec& spec, uint64_t seed) : spec_(spec), rng_(seed, kDataStream) {}

  // Before step `step`: draws a new epoch's order when one starts here.
  void before_step(int64_t step) {
    if (in_epoch(step) == 0) draw(step / spec_.steps_per_epoch);
  }
  Rng::State checkpoint_state(int64_t steps_done) const {
    return in_epoch(steps_done) > 0 ? epoch_start_ : rng_.state();
  }
  void restore(Rng::State state, int64_t steps_done) {
    rng_.set_state(state);
    if (in_epoch(steps_done) > 0) draw(steps_done / spec_.steps_per_epoch);
  }

private:
  // Steps into the epoch; -1 without epochs.
  int64_t in_epoch(int64_t step) const {
    return spec_.steps_per_epoch > 0 ? step % spec_.steps_per_epoch : -1;
  }
  void draw(int64_t epoch) {
    epoch_start_ = rng_.state();
    if (spec_.start_epoch) spec_.start_epoch(epoch, rng_);
  }
  const TrainSpec& spec_;
  Rng rng_;
  Rng::State epoch_start_;
};

// ---- evaluation, inference, diagnostics ----

struct Evaluation {
  double loss = 0, accuracy = 0;
};

// Loss (and accuracy for cross-entropy) over the held-out batches, in eval mode, no graph.
Evaluation evaluate(const TrainSpec& spec, nn::Module& model, Device device,
                    const Precision& precision) {
  model.eval();
  double loss_sum = 0;
  int64_t correct = 0, rows = 0;
  for (int64_t i = 0; i < spec.eval_batches; ++i) {
    const Batch batch = spec.eval_batch(i, device);
    NoGrad no_grad;
    amp::Autocast autocast(precision.amp, precision.dtype);
    const Var output = model(Var(batch.input));
    const int64_t n = batch.input.shape()[0];
    loss_sum += double(loss_of(spec.loss, output, batch.target).value().item()) * double(n);
    if (spec.loss == LossKind::cross_entropy)
      correct += count_correct(output.value(), batch.target);
    rows += n;
  }
  model.train();
  return {loss_sum / double(std::max<int64_t>(rows, 1)),
          double(correct) / std::max<int64_t>(rows, 1)};
}

// Forward-only passes (no graph) over the first batch: time and peak memory of inference.
void measure_inference(const TrainSpec& spec, nn::Module& model, Device device,
                       const Precision& precision, RunResult& result) {
  const int64_t passes = std::min<int64_t>(spec.steps, 20);
  const Batch batch = spec.batch(0, device);
  model.eval();
  Allocator& allocator = allocator_for(device);
  allocator.reset_peak();
  const auto start = Clock::now();
  for (int64_t i = 0; i < passes; ++i) {
    NoGrad no_grad;
    amp::Autocast autocast(precision.amp, precision.dtype);
    Var out = model(Var(batch.input));
    (void)out.value().to_vector(); // waits for the device, as a user reading results would
  }
  backend::cuda_synchronize();
  result.inference_wall_s = seconds_since(start);
  result.inference_peak_bytes = allocator.peak_bytes();
  model.train();
}

// --diagnose on the last step, after backward: what f16 and bf16 would do with the activation
// and weight gradients (printed, and the histogram written to out_dir/gradients.png).
void print_diagnostics(nn::Module& model, const amp::ActivationGradientProbe& probe,
                       float stored_scale, float target_scale, const std::string& title,
                       const std::string& out_dir) {
  const auto params = model.named_parameters();
  const std::vector<amp::RangeReport> activations = probe.reports();
  std::cout << amp::format_range_reports("range of activation gradients in f16 and bf16 (last "
                                         "step):",
                                         activations, target_scale)
            << amp::format_range_reports(
                   "range of weight gradients in f16 and bf16 (last step):",
                   amp::weight_gradient_report(params, stored_scale, target_scale), target_scale);
  amp::save_gradient_histogram(out_dir + "/gradients.png", activations, target_scale,
                               title + ": activation gradients, last step");
}

// ---- one run ----

// A training run: the model, optimizer, scaler, data order and log, i.e. everything a training
// checkpoint saves, and the loop over steps.
class Run {
public:
  Run(const TrainSpec& spec, const Options& options, Device device, const Precision& precision)
      : spec_(spec), options_(options), device_(device), precision_(precision),
        name_(precision.name()), order_(spec, options.seed),
        pending_figures_(Tensor::zeros({kMaxPendingSteps, kPendingColumns}, DType::f32, device)) {
    Rng init_rng(options.seed);
    model_ = spec.build_model(init_rng);
    model_->to(device);
    if (!options.load_weights.empty()) io::load_weights(options.load_weights, *model_);
    opt_ = make_optimizer(spec, *model_, options.lr);
    scaler_ = std::make_unique<amp::GradScaler>(scaler_options(options, precision), device);
    if (!options.resume.empty()) resume(options.resume);
  }

  // Trains from the current step to spec.steps, writing into out_dir as it goes.
  RunResult train(const std::string& out_dir);

private:
  // What a checkpoint must share with this run to resume it (saved as its metadata): the
  // example, its precision (and AMP's dtype), optimizer and learning rate, the loss scaler's
  // options, the seed and the options that define the model and the data.
  io::Metadata identity() const {
    // Loss scaling is named where it differs from the dtype's default (f16 on, bf16 off).
    const bool scaled = scaler_->is_enabled();
    const bool scaled_by_default = precision_.amp && precision_.dtype == DType::f16;
    const std::string scaling = scaled == scaled_by_default ? ""
                                : scaled                    ? " with loss scaling"
                                                            : " without loss scaling";
    io::Metadata identity = spec_.config;
    if (precision_.amp) identity.insert({"amp_dtype", dtype_name(precision_.dtype)});
    identity.insert({{"example", spec_.example},
                     {"precision", name_ + scaling},
                     {"optimizer", spec_.optimizer == OptimizerKind::adam ? "adam" : "sgd"},
                     {"lr", cat(options_.lr)},
                     {"steps_per_epoch", std::to_string(spec_.steps_per_epoch)},
                     {"seed", std::to_string(options_.seed)}});
    if (scaled)
      identity.insert({{"init_scale", cat(options_.init_scale)},
                       {"growth_interval", std::to_string(options_.growth_interval)}});
    return identity;
  }
  // identity() in the order a mismatch is best reported: the example, AMP's dtype and the
  // precision, then the options, and last the steps per epoch, which follow from the data and
  // batch options.
  io::RequiredMetadata identity_to_resume() const {
    io::Metadata rest = identity();
    io::RequiredMetadata ordered;
    for (const char* key : {"example", "amp_dtype", "precision"}) {
      if (rest.count(key) == 0) continue; // amp_dtype: AMP runs only
      ordered.push_back({key, rest.at(key)});
      rest.erase(key);
    }
    const std::string steps_per_epoch = rest.at("steps_per_epoch");
    rest.erase("steps_per_epoch");
    ordered.insert(ordered.end(), rest.begin(), rest.end());
    ordered.push_back({"steps_per_epoch", steps_per_epoch});
    return ordered;
  }
  int64_t epochs_done(int64_t steps) const {
    return spec_.steps_per_epoch > 0 ? steps / spec_.steps_per_epoch : 0;
  }
  bool evaluates() const { return spec_.steps_per_epoch > 0 && spec_.eval_batch != nullptr; }

  void resume(const std::string& path);
  // Writes the checkpoint, unless the state holds what loading refuses (training diverged):
  // then the previous checkpoint is kept, and a warning says so.
  void save_checkpoint(const std::string& path);
  // Writes final.safetensors into --save-weights, unless the weights are not finite.
  void save_final_weights();
  // The warning that `file` is not written because training diverged (once per file).
  void warn_not_written(const std::string& file, const std::string& reason);
  // "; checkpoint.safetensors keeps step 10" when this run wrote a checkpoint, else "".
  std::string checkpoint_note() const;
  // One optimizer step on batch `step`; its loss, scale and found_inf are copied on the device
  // into row `slot` of pending_figures_. Returns what else the log needs (wall_s left for the
  // caller). With --diagnose, the last step also prints the range and update reports and writes
  // out_dir/gradients.png.
  PendingStep step(int64_t step, int64_t slot, const std::string& out_dir);
  // Copies `tensor` (f32 [1], on the device) into pending_figures_[slot, column] on the device.
  void keep_figure(const Tensor& tensor, int64_t slot, int64_t column);
  // Reads the pending steps' figures on the host (one wait for the device) into the log.
  void read_pending();
  // Ends epoch `epoch` at wall_s: its train figures from the log, its training speed from the
  // steps first_step..last_step (those this process ran) in train_s, its peak memory, then the
  // evaluation.
  void finish_epoch(int64_t epoch, double wall_s, int64_t first_step, int64_t last_step,
                    double train_s, size_t peak_bytes, Progress& progress);
  void write_logs(const std::string& out_dir) const; // metrics.csv (and epochs.csv)
  void write_outputs(const std::string& out_dir, const RunResult& result) const;
  void write_profile(const std::string& out_dir, int64_t steps) const;

  const TrainSpec& spec_;
  const Options& options_;
  Device device_;
  Precision precision_;
  std::string name_; // precision_.name()
  std::unique_ptr<nn::Module> model_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<amp::GradScaler> scaler_;
  DataOrder order_;
  TrainLog log_;
  std::vector<PendingStep> pending_;
  // Columns of pending_figures_ [kMaxPendingSteps, 3]: loss, scale after update(), found_inf.
  static constexpr int64_t kPendingColumns = 3;
  Tensor pending_figures_;
  int64_t first_step_ = 0;
  double wall_before_ = 0.0; // training seconds before this process: a resumed run's checkpoint's
  int64_t checkpoint_step_ = -1;      // the step of the last checkpoint this run wrote
  int64_t skipped_in_a_row_ = 0;      // steps skipped since the last one taken
  std::set<std::string> not_written_; // files warn_not_written has warned about
};

void Run::resume(const std::string& path) {
  const io::TrainingState state =
      io::load_training_checkpoint(path, *model_, *opt_, *scaler_, identity_to_resume());
  require(state.step < spec_.steps, "--resume", path, ": the checkpoint is at step ", state.step,
          ", ", state.step == spec_.steps ? "the end" : "past the end", " of this run's ",
          spec_.steps, " steps: nothing is left to train (ask for more steps or epochs)");
  require(state.epoch == epochs_done(state.step), "--resume", path, ": epoch ", state.epoch,
          " does not match step ", state.step,
          spec_.steps_per_epoch > 0 ? cat(" at ", spec_.steps_per_epoch, " steps per epoch")
                                    : std::string(" (this example counts no epochs: expected 0)"));
  for (const io::NamedTensor& t : state.logs)
    require(t.name == "steps" || t.name == "epochs", "--resume", path, ": unexpected entry 'log.",
            t.name, "' (the examples log only 'log.steps' and 'log.epochs')");
  log_.steps = records_from_tensor<StepRecord, kStepColumns>(path, state, "steps", state.step);
  log_.epochs = records_from_tensor<EpochRecord, kEpochColumns>(path, state, "epochs",
                                                                evaluates() ? state.epoch : 0);
  const bool scaled = scaler_->is_enabled();
  const std::string invalid_step = first_invalid_record(log_.steps, scaled);
  require(invalid_step.empty(), "--resume", path, ": 'log.steps' ", invalid_step);
  const std::string invalid_epoch = first_invalid_record(log_.epochs, scaled);
  require(invalid_epoch.empty(), "--resume", path, ": 'log.epochs' ", invalid_epoch);
  // Adam counts the steps taken: those of the log that were not skipped.
  if (const auto* adam = dynamic_cast<const optim::Adam*>(opt_.get())) {
    const int64_t taken = std::count_if(log_.steps.begin(), log_.steps.end(),
                                        [](const StepRecord& r) { return r.skipped == 0.0f; });
    require(adam->step_count() == taken, "--resume", path, ": 'optimizer.step' is ",
            adam->step_count(), ", but 'log.steps' records ", taken, " steps taken");
  }
  for (auto r = log_.steps.rbegin(); r != log_.steps.rend() && r->skipped != 0.0f; ++r)
    ++skipped_in_a_row_;
  order_.restore(state.data_rng, state.step);
  first_step_ = state.step;
}

void Run::save_checkpoint(const std::string& path) {
  io::TrainingState state;
  state.step = int64_t(log_.steps.size());
  state.epoch = epochs_done(state.step);
  state.data_rng = order_.checkpoint_state(state.step);
  state.logs = log_tensors(log_);
  state.metadata = identity();
  // What Run::resume refuses in a log is not written either.
  const bool scaled = scaler_->is_enabled();
  const std::string invalid_step = first_invalid_record(log_.steps, scaled);
  const std::string invalid_epoch = first_invalid_record(log_.epochs, scaled);
  if (!invalid_step.empty() || !invalid_epoch.empty()) {
    warn_not_written(path,
                     cat(path, ": 'log.", invalid_step.empty() ? "epochs' " : "steps' ",
                         invalid_step.empty() ? invalid_epoch : invalid_step, ": not written"));
    return;
  }
  try {
    io::save_training_checkpoint(path, *model_, *opt_, *scaler_, state);
    checkpoint_step_ = state.step;
  } catch (const io::InvalidState& e) {
    warn_not_written(path, e.what());
  }
}

void Run::save_final_weights() {
  const std::string path = options_.save_weights + "/final.safetensors";
  try {
    io::save_weights(path, *model_);
  } catch (const io::InvalidState& e) {
    warn_not_written(path, e.what());
  }
}

void Run::warn_not_written(const std::string& file, const std::string& reason) {
  if (!not_written_.insert(file).second) return; // said once per file
  print_to_stderr(cat("warning: ", name_, ": training diverged by step ", log_.steps.size(),
                      " (a lower --lr may help): ", reason, checkpoint_note()));
}

std::string Run::checkpoint_note() const {
  if (checkpoint_step_ < 0) return "";
  return cat("; checkpoint.safetensors keeps step ", checkpoint_step_);
}

PendingStep Run::step(int64_t step, int64_t slot, const std::string& out_dir) {
  const bool probe_this_step = options_.diagnose && step + 1 == spec_.steps;
  const float scale_now = probe_this_step ? scaler_->get_scale() : 1.0f; // a host read
  std::unique_ptr<amp::ActivationGradientProbe> probe;
  if (probe_this_step)
    probe = std::make_unique<amp::ActivationGradientProbe>(scale_now, options_.init_scale);

  order_.before_step(step);
  const Batch batch = spec_.batch(step, device_);
  opt_->zero_grad();
  Var output, loss;
  {
    amp::Autocast autocast(precision_.amp, precision_.dtype);
    output = (*model_)(Var(batch.input));
    loss = loss_of(spec_.loss, output, batch.target);
  }
  scaler_->scale(loss).backward();
  std::vector<std::vector<float>> masters_before;
  if (probe_this_step) {
    print_diagnostics(*model_, *probe, scale_now, options_.init_scale,
                      cat(spec_.example, " ", name_), out_dir);
    masters_before = amp::snapshot_masters(model_->named_parameters());
  }
  scaler_->step(*opt_);
  if (probe_this_step)
    std::cout << amp::format_update_reports(
        "weight updates of the last step that weights kept in 16 bits would lose (the fp32 "
        "masters keep every one):",
        amp::weight_update_report(model_->named_parameters(), masters_before));

  keep_figure(loss.value(), slot, 0);
  if (scaler_->is_enabled()) keep_figure(scaler_->found_inf(*opt_), slot, 2);
  scaler_->update();
  if (scaler_->is_enabled()) keep_figure(scaler_->scale_tensor(), slot, 1); // updated in place
  if (options_.diagnose && scaler_->step_was_skipped(*opt_)) { // a host read: diagnostics only
    std::cout << "step " << step << ": overflow, step skipped; first non-finite gradient: "
              << amp::first_nonfinite_parameter(model_->named_parameters()) << "\n";
  }
  PendingStep pending;
  if (spec_.loss == LossKind::cross_entropy) {
    pending.logits = output.value();
    pending.labels = batch.target;
  }
  return pending;
}

void Run::keep_figure(const Tensor& tensor, int64_t slot, int64_t column) {
  require(tensor.dtype() == DType::f32 && tensor.numel() == 1, "keep_figure",
          "expects a one-element f32 tensor, got ", describe(tensor));
  // Device addresses when device_ is cuda: copied there, never read on the host.
  float* row = static_cast<float*>(pending_figures_.raw()) + slot * kPendingColumns;
  copy_bytes(row + column, device_, tensor.raw(), tensor.device(), sizeof(float));
}

void Run::read_pending() {
  const std::vector<float> figures = pending_figures_.to_vector(); // [kMaxPendingSteps, 3]
  for (size_t i = 0; i < pending_.size(); ++i) {
    const PendingStep& p = pending_[i];
    const float* row = figures.data() + i * kPendingColumns;
    StepRecord record;
    record.loss = unsigned_nan(row[0]);
    record.wall_s = p.wall_s;
    if (scaler_->is_enabled()) {
      record.scale = row[1];
      record.skipped = row[2] != 0.0f ? 1.0f : 0.0f;
      skipped_in_a_row_ = record.skipped != 0.0f ? skipped_in_a_row_ + 1 : 0;
      // A scale that backed off below the smallest normal float cannot recover: 1/S overflows
      // soon, and no step at it would be taken. Stopping here, the run writes no checkpoint
      // holding it (the loss scaler's deliberate difference, docs/mixed-precision.md).
      require(record.skipped == 0.0f || record.scale >= FLT_MIN, name_.c_str(),
              "loss scaling collapsed after ", log_.steps.size() + 1, " steps: the last ",
              skipped_in_a_row_, " overflowed (inf or NaN gradients) and the scale backed off to ",
              record.scale, ", below the smallest normal float (", FLT_MIN,
              "): training diverged (a lower --lr may help)", checkpoint_note());
    }
    if (p.logits.defined()) {
      record.correct = float(count_correct(p.logits, p.labels));
      record.rows = float(p.logits.shape()[0]);
    }
    log_.steps.push_back(record);
  }
  pending_.clear();
}

void Run::finish_epoch(int64_t epoch, double wall_s, int64_t first_step, int64_t last_step,
                       double train_s, size_t peak_bytes, Progress& progress) {
  EpochRecord record = train_figures(log_, epoch, spec_.steps_per_epoch);
  double images = 0;
  for (int64_t s = first_step; s <= last_step; ++s) images += log_.steps[size_t(s)].rows;
  record.images_per_s = float(images / std::max(train_s, 1e-9));
  record.peak_mib = float(double(peak_bytes) / 1048576.0);
  const Evaluation test = evaluate(spec_, *model_, device_, precision_);
  record.test_loss = unsigned_nan(float(test.loss));
  record.test_accuracy = float(test.accuracy);
  record.wall_s = float(wall_s);
  log_.epochs.push_back(record);
  char line[224];
  std::snprintf(line, sizeof line,
                "epoch %lld/%lld  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  (%.1f s, "
                "%.1f images/s, peak %.1f MiB)",
                static_cast<long long>(epoch + 1),
                static_cast<long long>(spec_.steps / spec_.steps_per_epoch), record.train_loss,
                100.0 * record.train_accuracy, record.test_loss, 100.0 * record.test_accuracy,
                wall_s, record.images_per_s, record.peak_mib);
  progress.note(line);
}

RunResult Run::train(const std::string& out_dir) {
  const bool save_weights = !options_.save_weights.empty();
  if (save_weights && first_step_ == 0)
    io::save_weights(options_.save_weights + "/init.safetensors", *model_);

  RunResult result;
  result.precision = name_;
  Progress progress(cat(spec_.example, " ", name_, " ", device_), first_step_, spec_.steps,
                    options_.log_every, spec_.steps_per_epoch);
  // The checkpoint's clock: its last step's, or its last epoch's when that ended later (after its
  // evaluation), so that a resumed run's times never fall.
  wall_before_ = log_.steps.empty() ? 0.0 : log_.steps.back().wall_s;
  if (!log_.epochs.empty())
    wall_before_ = std::max(wall_before_, double(log_.epochs.back().wall_s));
  Allocator& allocator = allocator_for(device_);
  allocator.reset_peak();
  profile::set_enabled(options_.profile);
  const auto start = Clock::now();
  // The epoch under way: its first step in this process, when it started, and the peak memory
  // of the run before it (each epoch measures its own).
  int64_t epoch_first_step = first_step_;
  Clock::time_point epoch_start = start;
  size_t peak_before_epoch = 0;
  for (int64_t s = first_step_; s < spec_.steps; ++s) {
    result.stop_signal = stop_signal();
    if (result.stop_signal != 0) break;
    if (evaluates() && s % spec_.steps_per_epoch == 0) {
      epoch_first_step = s;
      epoch_start = Clock::now();
      peak_before_epoch = std::max(peak_before_epoch, allocator.peak_bytes());
      allocator.reset_peak();
    }
    pending_.push_back(step(s, int64_t(pending_.size()), out_dir));
    pending_.back().wall_s = float(wall_before_ + seconds_since(start));
    const bool epoch_ends = evaluates() && (s + 1) % spec_.steps_per_epoch == 0;
    const bool checkpoint =
        options_.checkpoint_every > 0 && (s + 1) % options_.checkpoint_every == 0;
    // The host reads the figures only here (progress.due includes the last step).
    if (progress.due(s) || epoch_ends || checkpoint ||
        int64_t(pending_.size()) == kMaxPendingSteps) {
      read_pending();
      progress.update(s, log_.steps.back().loss, log_.steps.back().scale);
    }
    if (epoch_ends)
      finish_epoch(s / spec_.steps_per_epoch, wall_before_ + seconds_since(start), epoch_first_step,
                   s, seconds_since(epoch_start), allocator.peak_bytes(), progress);
    if (checkpoint) save_checkpoint(out_dir + "/checkpoint.safetensors");
  }
  const bool stopped = result.stop_signal != 0;
  if (stopped && !pending_.empty()) read_pending();
  const int64_t steps_done = int64_t(log_.steps.size());
  if (stopped && options_.checkpoint_every > 0 && checkpoint_step_ != steps_done)
    save_checkpoint(out_dir + "/checkpoint.safetensors");
  backend::cuda_synchronize();
  result.wall_s = seconds_since(start);
  result.peak_bytes = std::max(peak_before_epoch, allocator.peak_bytes());
  write_logs(out_dir); // first: should a later write fail, the run's record is kept
  if (options_.profile) write_profile(out_dir, steps_done - first_step_);
  if (save_weights && !stopped) save_final_weights();

  for (const StepRecord& r : log_.steps) result.skipped_steps += r.skipped != 0;
  result.steps_completed = steps_done;
  if (!log_.steps.empty()) result.final_loss = log_.steps.back().loss;
  result.loss_last10_mean = last_losses_mean(log_.steps);
  if (!log_.epochs.empty()) {
    result.test_loss = log_.epochs.back().test_loss;
    result.test_accuracy = log_.epochs.back().test_accuracy;
  }
  result.final_scale = scaler_->get_scale();
  if (!stopped) {
    measure_inference(spec_, *model_, device_, precision_, result);
    if (spec_.finish) spec_.finish(*model_, device_, precision_, out_dir);
  }
  write_outputs(out_dir, result);
  return result;
}

// The op profile of the training loop (epoch-end evaluations included): printed, and written to
// out_dir/profile.txt.
void Run::write_profile(const std::string& out_dir, int64_t steps) const {
  profile::set_enabled(false);
  const std::string table = profile::format_table(profile::collect(), steps, "  ");
  std::printf("%s %s on %s:\n%s", spec_.example.c_str(), name_.c_str(), device_name(device_),
              table.c_str());
  io::write_file_atomically(out_dir + "/profile.txt", table);
}

void Run::write_outputs(const std::string& out_dir, const RunResult& result) const {
  nlohmann::json summary = {{"example", spec_.example},
                            {"device", device_name(device_)},
                            {"device_name", device_description(device_)},
                            {"precision", result.precision},
                            {"amp_dtype", precision_.amp
                                              ? nlohmann::json(dtype_name(precision_.dtype))
                                              : nlohmann::json()},
                            {"loss_scaling", scaler_->is_enabled()},
                            {"steps", spec_.steps},
                            {"steps_completed", result.steps_completed},
                            {"seed", options_.seed},
                            {"lr", options_.lr},
                            {"final_loss", result.final_loss},
                            {"loss_last10_mean", result.loss_last10_mean},
                            // The whole run's training time, as metrics.csv's wall_s.
                            {"wall_s", wall_before_ + result.wall_s},
                            {"peak_bytes", result.peak_bytes},
                            {"skipped_steps", result.skipped_steps},
                            {"final_scale", result.final_scale},
                            {"inference_wall_s", result.inference_wall_s},
                            {"inference_peak_bytes", result.inference_peak_bytes},
                            {"config", spec_.config}, // the model and data options
                            {"interrupted", result.stop_signal != 0}};
  if (first_step_ > 0) summary["resumed_at_step"] = first_step_;
  if (evaluates()) {
    summary["epochs"] = log_.epochs.size();
    summary["test_loss"] = result.test_loss;
    summary["test_accuracy"] = result.test_accuracy;
  }
  write_plots(out_dir, cat(spec_.example, " ", name_), log_, spec_.steps_per_epoch,
              scaler_->is_enabled());
  // Last: a folder with a summary.json holds every output of its run.
  io::write_file_atomically(out_dir + "/summary.json", summary.dump(2) + "\n");
}

void Run::write_logs(const std::string& out_dir) const {
  if (evaluates()) io::write_file_atomically(out_dir + "/epochs.csv", epochs_csv(log_));
  io::write_file_atomically(out_dir + "/metrics.csv", metrics_csv(log_));
}

} // namespace

void add_common_options(CLI::App& app, Options& options, float default_lr) {
  options.lr = default_lr;
  app.add_option("--device", options.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--seed", options.seed, "seed of the initial weights and the data")
      ->transform(any_uint64())
      ->capture_default_str();
  app.add_option("--lr", options.lr, "learning rate")
      ->check(finite_number( // stored as a float: no value that the float rounds to 0, no -0
          [](double v) { return !std::signbit(v) && v <= FLT_MAX && (v == 0 || float(v) != 0); },
          "a finite number >= 0 (at most 3.4e38; above 0, at least 1.4e-45)"))
      ->capture_default_str();
  app.add_option("--out", options.out, "output directory (default out/<example>)")
      ->check(kNonEmptyPath);
  app.add_flag("--amp", options.amp,
               "train with mixed precision (autocast; with f16 also GradScaler)");
  app.add_option("--amp-dtype", options.amp_dtype,
                 "autocast's low precision: f16 (with loss scaling) or bf16 (float's range, "
                 "without loss scaling unless --loss-scaling)")
      ->check(CLI::IsMember({"f16", "bf16"}))
      ->capture_default_str();
  app.add_flag("--compare", options.compare,
               "train FP32, then AMP from the same init, and print the comparison table");
  app.add_flag("--compare-dtypes", options.compare_dtypes,
               "train FP32, AMP-f16 and AMP-bf16 from the same init, and print them side by side");
  app.add_flag("--diagnose", options.diagnose,
               "report, per layer, the gradients f16 and bf16 would flush to zero, make subnormal "
               "or overflow, and the weight updates each would round away; plot gradients.png");
  app.add_flag("--profile", options.profile,
               "time every op of training (CUDA events on a GPU; adds a little overhead), then "
               "print the time per op and write it to profile.txt");
  app.add_option("--init-scale", options.init_scale, "GradScaler initial loss scale")
      ->check(finite_number([](double v) { return amp::is_valid_scale(float(v)); }, // its range
                            "a finite number > 2.9e-39 (1/scale must be finite) and at most "
                            "3.4e38"))
      ->capture_default_str();
  app.add_option("--growth-interval", options.growth_interval,
                 "clean steps before the loss scale grows")
      ->transform(integer_in(1, INT32_MAX))
      ->capture_default_str();
  app.add_flag("--no-loss-scaling", options.no_loss_scaling,
               "AMP-f16 without loss scaling (ablation: small gradients flush to zero)");
  app.add_flag("--loss-scaling", options.loss_scaling,
               "AMP-bf16 with loss scaling (GradScaler; bf16 runs without it by default)");
  app.add_option("--log-every", options.log_every,
                 "progress line every N steps (0: every tenth of the run or 10 s)")
      ->transform(integer_in(0, kMaxSteps));
  app.add_option("--save-weights", options.save_weights,
                 "write DIR/init.safetensors before the first step and DIR/final.safetensors "
                 "after the last (PyTorch state_dict names and layouts; with --compare, "
                 "DIR/fp32 and DIR/amp, or DIR/amp-bf16; --compare-dtypes: all three)")
      ->check(kNonEmptyPath);
  app.add_option("--load-weights", options.load_weights,
                 "start from the weights in this safetensors file")
      ->check(kNonEmptyPath);
  app.add_option("--checkpoint-every", options.checkpoint_every,
                 "every N steps, write a training checkpoint to OUT/checkpoint.safetensors "
                 "(with --compare or --compare-dtypes, in each run's folder)")
      ->transform(integer_in(0, kMaxSteps));
  app.add_option("--resume", options.resume,
                 "continue the run saved in this training checkpoint (same options)")
      ->check(kNonEmptyPath);
  // Options that no run would use are refused rather than ignored (as GradScaler(enabled=False)
  // ignores its arguments): most likely --amp, --loss-scaling or a dtype was forgotten.
  app.parse_complete_callback([&app, &options] {
    if (options.amp && options.compare)
      throw CLI::ValidationError("--amp",
                                 "--compare trains both FP32 and AMP; give one of the two");
    if (options.compare_dtypes && (options.amp || options.compare))
      throw CLI::ValidationError("--compare-dtypes",
                                 "trains FP32, AMP-f16 and AMP-bf16; it takes neither --amp nor "
                                 "--compare");
    if (options.compare_dtypes && app.count("--amp-dtype") > 0)
      throw CLI::ValidationError("--amp-dtype", "--compare-dtypes trains both f16 and bf16");
    if (options.loss_scaling && options.no_loss_scaling)
      throw CLI::ValidationError("--loss-scaling", "contradicts --no-loss-scaling");
    const bool f16 = options.compare_dtypes || options.amp_dtype == "f16";
    const bool bf16 = options.compare_dtypes || options.amp_dtype == "bf16";
    const char* amp_options = "--amp, --compare or --compare-dtypes";
    if (!options.amp && !options.compare && !options.compare_dtypes) {
      for (const char* name : {"--amp-dtype", "--loss-scaling", "--no-loss-scaling"})
        if (app.count(name) > 0)
          throw CLI::ValidationError(name, cat("applies only with ", amp_options));
    }
    if (options.no_loss_scaling && !f16)
      throw CLI::ValidationError("--no-loss-scaling",
                                 "bf16 runs without loss scaling already (--loss-scaling turns "
                                 "it on)");
    if (options.loss_scaling && !bf16)
      throw CLI::ValidationError("--loss-scaling",
                                 "f16 runs with loss scaling already (--no-loss-scaling turns "
                                 "it off)");
    // The scaler runs for f16 (unless --no-loss-scaling) and for bf16 with --loss-scaling.
    const bool scaled = (options.amp || options.compare || options.compare_dtypes) &&
                        ((f16 && !options.no_loss_scaling) || (bf16 && options.loss_scaling));
    for (const char* name : {"--init-scale", "--growth-interval"})
      if (app.count(name) > 0 && !scaled)
        throw CLI::ValidationError(name,
                                   cat("sets the loss scaler, which runs only with ", amp_options,
                                       " in f16, or in bf16 with "
                                       "--loss-scaling"));
  });
}

void require_host_memory(double bytes, const std::string& what) {
  const double available = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
  require(bytes <= available, what.c_str(), "needs ", std::round(bytes / 1048576.0),
          " MiB of host memory, more than this machine's ", std::round(available / 1048576.0),
          " MiB");
}

Device resolve_device(const std::string& name) {
  if (name == "auto") return cuda_available() ? Device::cuda : Device::cpu;
  const Device device = parse_device(name);
  require(device != Device::cuda || cuda_available(), "--device cuda", cuda_unavailable_reason());
  return device;
}

RunResult train(const TrainSpec& spec, const Options& options, Device device,
                const Precision& precision, const std::string& out_dir) {
  Run run(spec, options, device, precision);
  return run.train(out_dir);
}

namespace {
// What RunResult::loss_last10_mean is the mean of, in a run of `steps` steps: "last-10 mean".
std::string last_losses_label(int64_t steps) {
  return cat("last-", std::min(steps, int64_t(kLossTailSteps)), " mean");
}

// One run of run_example: its options, precision and output folder.
struct PlannedRun {
  Options options;
  Precision precision;
  std::string out_dir;
};

// A run's row label: FP32, AMP, AMP-bf16 (AMP-f16 beside an AMP-bf16 run).
std::string row_label(const PlannedRun& run, bool both_dtypes) {
  if (!run.precision.amp) return "FP32";
  if (run.precision.dtype == DType::bf16) return "AMP-bf16";
  return both_dtypes ? "AMP-f16" : "AMP";
}

// The comparison table of training (with the losses and skipped steps) or of inference: one row
// per run, FP32 first, then each AMP run's savings against it.
void print_comparison(const std::string& what, const std::vector<std::string>& labels,
                      const std::vector<RunResult>& results, bool training,
                      const std::string& tail_label) {
  std::printf("\n%s\n", what.c_str());
  std::printf("  %-10s %12s %14s", "", "time (s)", "peak memory");
  if (training) std::printf(" %14s %14s %8s", "final loss", tail_label.c_str(), "skipped");
  std::printf("\n");
  const auto seconds = [&](const RunResult& r) { return training ? r.wall_s : r.inference_wall_s; };
  const auto bytes = [&](const RunResult& r) {
    return training ? r.peak_bytes : r.inference_peak_bytes;
  };
  for (size_t i = 0; i < results.size(); ++i) {
    const RunResult& r = results[i];
    std::printf("  %-10s %12.4f %14s", labels[i].c_str(), seconds(r), mib(bytes(r)).c_str());
    if (training)
      std::printf(" %14s %14s %8s", cat(r.final_loss).c_str(), cat(r.loss_last10_mean).c_str(),
                  cat(r.skipped_steps).c_str());
    std::printf("\n");
  }
  const RunResult& fp32 = results[0];
  for (size_t i = 1; i < results.size(); ++i) {
    const std::string prefix = results.size() > 2 ? labels[i] + ": " : "";
    std::printf("  %stime saved: %.1f%%   memory saved: %.1f%%\n", prefix.c_str(),
                100.0 * (1.0 - seconds(results[i]) / seconds(fp32)),
                100.0 * (1.0 - double(bytes(results[i])) / double(bytes(fp32))));
  }
}

// "cpu", or "cuda (NVIDIA H100 80GB HBM3)".
std::string device_label(Device device) {
  return device == Device::cpu ? "cpu" : cat("cuda (", device_description(device), ")");
}

// A non-finite final loss is reported (the run still writes its outputs, which show where the
// loss went): in FP32 nothing skips such steps, and in AMP every step was skipped at the end.
void warn_if_diverged(const RunResult& r) {
  if (std::isfinite(r.final_loss)) return;
  print_to_stderr(cat("warning: ", r.precision, ": the final loss is ", r.final_loss,
                      ": training diverged (a lower --lr may help)"));
}

// The run in `precision` of a comparison: into out/<name>, its weights into their own
// subdirectory.
PlannedRun compared_run(const Options& options, const Precision& precision,
                        const std::string& out) {
  Options run = options;
  if (!run.save_weights.empty()) run.save_weights += "/" + precision.name();
  return {run, precision, out + "/" + precision.name()};
}

// One run; FP32 then AMP under --compare; FP32, AMP-f16 and AMP-bf16 under --compare-dtypes. Each
// run of a comparison writes into its own folder.
std::vector<PlannedRun> planned_runs(const Options& options, const std::string& out) {
  const Precision amp{true, parse_half_precision(options.amp_dtype)};
  if (options.compare_dtypes)
    return {compared_run(options, Precision{}, out),
            compared_run(options, Precision{true, DType::f16}, out),
            compared_run(options, Precision{true, DType::bf16}, out)};
  if (options.compare)
    return {compared_run(options, Precision{}, out), compared_run(options, amp, out)};
  return {{options, options.amp ? amp : Precision{}, out}};
}

// The line for a program that stopped on `signal`, after the runs in `results`.
std::string stop_line(const TrainSpec& spec, const Options& options,
                      const std::vector<PlannedRun>& runs, const std::vector<RunResult>& results,
                      int signal) {
  const std::string stopped = cat("interrupted (", signal_name(signal), "): ");
  if (results.empty() || results.back().stop_signal == 0) // between runs, or after the last
    return stopped + (results.size() < runs.size()
                          ? cat("the ", row_label(runs[results.size()], runs.size() > 2),
                                " run was not started")
                          : std::string("every run had finished"));
  const RunResult& r = results.back();
  const std::string& dir = runs[results.size() - 1].out_dir;
  return cat(stopped, spec.example, " ", r.precision, " stopped after ", r.steps_completed, " of ",
             spec.steps, " steps; wrote ", dir, "/ (summary.json says \"interrupted\": true)",
             options.checkpoint_every > 0
                 ? cat(" and ", dir, "/checkpoint.safetensors (--resume it to continue)")
                 : std::string());
}
} // namespace

int run_example(const TrainSpec& spec, const Options& options) {
  const Device device = resolve_device(options.device);
  require_valid_environment();
  require(options.resume.empty() || options.load_weights.empty(), "--resume",
          "continues from the checkpoint's weights; it cannot be combined with --load-weights");
  require(options.resume.empty() || (!options.compare && !options.compare_dtypes), "--resume",
          "resumes one run; it cannot be combined with --compare or --compare-dtypes");
  require(options.checkpoint_every <= spec.steps, "--checkpoint-every", "the run has ", spec.steps,
          " steps, so every ", options.checkpoint_every, " steps would write no checkpoint");
  for (const auto& [key, value] : spec.config) // summary.json and checkpoints are UTF-8 JSON
    require(io::is_valid_utf8(value), "run_example", "config '", key,
            "' is not valid UTF-8 (io::escape_to_utf8 makes it so)");
  const std::string out = options.out.empty() ? "out/" + spec.example : options.out;
  const std::vector<PlannedRun> runs = planned_runs(options, out);
  // Every run's outputs are checked, made and locked before the first trains.
  std::vector<OutputDir> outputs;
  for (const PlannedRun& run : runs)
    for (OutputDir& dir : output_dirs(spec, run.options, run.precision, run.out_dir))
      outputs.push_back(std::move(dir));
  std::vector<std::string> inputs = spec.input_files;
  if (!options.load_weights.empty()) inputs.push_back(options.load_weights);
  require_outputs_usable(outputs, inputs, spec.input_dirs);
  const OutputFolders folders(outputs, options.resume);
  const StopOnSignal stop_on_signal;

  std::vector<RunResult> results;
  for (const PlannedRun& run : runs) {
    if (stop_signal() != 0) break;
    results.push_back(train(spec, run.options, device, run.precision, run.out_dir));
  }
  if (stop_signal() != 0) {
    print_to_stderr(stop_line(spec, options, runs, results, stop_signal()));
    return 128 + stop_signal();
  }
  for (const RunResult& r : results) warn_if_diverged(r);
  if (runs.size() == 1) {
    const RunResult& r = results[0];
    std::printf("%s %s on %s: final loss %.6g (%s %.6g) in %.2f s, peak %s, skipped %lld, "
                "scale %g\n",
                spec.example.c_str(), r.precision.c_str(), device_label(device).c_str(),
                r.final_loss, last_losses_label(spec.steps).c_str(), r.loss_last10_mean, r.wall_s,
                mib(r.peak_bytes).c_str(), static_cast<long long>(r.skipped_steps), r.final_scale);
    std::printf("wrote %s/ (metrics.csv, summary.json, plots)\n", out.c_str());
    return 0;
  }
  std::printf("\n%s on %s, %lld steps (same init and data)%s", spec.example.c_str(),
              device_label(device).c_str(), static_cast<long long>(spec.steps),
              device == Device::cpu ? " — CPU f16 and bf16 are emulations for study: the speed "
                                      "claim belongs to the GPU\n"
                                    : "\n");
  std::vector<std::string> labels, written;
  for (const PlannedRun& run : runs) {
    labels.push_back(row_label(run, runs.size() > 2));
    written.push_back(run.out_dir + "/");
  }
  print_comparison("Training", labels, results, true, last_losses_label(spec.steps));
  for (size_t i = 1; i < results.size(); ++i)
    std::printf("  %s: %lld skipped steps, final scale %g%s\n", labels[i].c_str(),
                static_cast<long long>(results[i].skipped_steps), results[i].final_scale,
                scales_loss(runs[i].options, runs[i].precision) ? "" : " (no loss scaling)");
  print_comparison("Inference (forward only)", labels, results, false, "");
  std::printf("\nwrote %s (metrics.csv, summary.json, plots)\n",
              written.size() == 2 ? cat(written[0], " and ", written[1]).c_str()
                                  : cat(written[0], ", ", written[1], " and ", written[2]).c_str());
  return 0;
}

void with_output_folder(const std::string& dir, const std::vector<std::string>& files,
                        const std::vector<std::string>& inputs,
                        const std::vector<std::string>& input_dirs,
                        const std::function<void()>& write) {
  const std::vector<OutputDir> outputs{{dir, "--out", files, {}}};
  require_outputs_usable(outputs, inputs, input_dirs);
  const OutputFolders folders(outputs, "");
  write();
}

namespace {
std::string g_memory_options; // set_memory_options

// The error line's text for running out of memory (`what`: the allocator's words).
std::string out_of_memory(const std::string& what) {
  const bool named = !g_memory_options.empty();
  return cat("out of memory (", what,
             "): ", named ? g_memory_options + " ask for" : std::string("the sizes asked for need"),
             " more memory than is available", named ? "; lower them" : "");
}
} // namespace

void set_memory_options(const std::string& options) { g_memory_options = options; }

void print_to_stderr(const std::string& line) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", line.c_str());
}

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const OutOfMemory& e) {
    print_to_stderr("error: " + out_of_memory(e.what()));
  } catch (const Error& e) {
    print_to_stderr(std::string("error: ") + e.what());
  } catch (const std::bad_alloc&) {
    print_to_stderr("error: " + out_of_memory("std::bad_alloc"));
  } catch (const std::exception& e) {
    print_to_stderr(std::string("error: ") + e.what());
  }
  return 1;
}

bool scales_loss(const Options& options, const Precision& precision) {
  if (!precision.amp) return false;
  return precision.dtype == DType::f16 ? !options.no_loss_scaling : options.loss_scaling;
}

} // namespace minamp::examples
