// The shared example harness: options, the AMP training loop, logs, comparison and diagnostics.
#include "common.h"

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "amp/autocast.h"
#include "amp/diagnostics.h"
#include "io/atomic_file.h"
#include "kernels/backend.h"
#include "ops/ops.h"

namespace minamp::examples {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string mib(size_t bytes) { return cat(std::round(bytes / 1048576.0 * 100) / 100, " MiB"); }

Var loss_of(LossKind kind, const Var& output, const Tensor& target) {
  return kind == LossKind::mse ? ops::mse_loss(output, target)
                               : ops::cross_entropy(output, target);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainSpec& spec, nn::Module& model,
                                                 float lr) {
  if (spec.optimizer == OptimizerKind::adam)
    return std::make_unique<optim::Adam>(model.parameters(), lr);
  return std::make_unique<optim::SGD>(model.parameters(), lr);
}

// Progress: one line rewritten in place on a terminal, plain lines every `every` steps otherwise.
class Progress {
public:
  Progress(std::string label, int64_t total, int every)
      : label_(std::move(label)), total_(total), every_(every), tty_(isatty(STDOUT_FILENO)),
        start_(Clock::now()) {}
  void update(int64_t step, double loss, double scale) {
    const bool last = step + 1 == total_;
    if (!last && (step + 1) % every_ != 0) return;
    const double elapsed = seconds_since(start_);
    const double rate = (step + 1) / std::max(elapsed, 1e-9);
    std::printf("%s[%s] step %lld/%lld  loss %.5g  scale %g  %.1f steps/s  ETA %.0fs%s",
                tty_ ? "\r" : "", label_.c_str(), static_cast<long long>(step + 1),
                static_cast<long long>(total_), loss, scale, rate, (total_ - step - 1) / rate,
                tty_ && !last ? "" : "\n");
    std::fflush(stdout);
  }

private:
  std::string label_;
  int64_t total_;
  int every_;
  bool tty_;
  Clock::time_point start_;
};

// Forward-only passes (no graph) over the first batch: time and peak memory of inference.
void measure_inference(const TrainSpec& spec, nn::Sequential& model, Device device, bool amp,
                       RunResult& result) {
  const int64_t passes = std::min<int64_t>(spec.steps, 20);
  const Batch batch = spec.batch(0, device);
  model.eval();
  Allocator& allocator = allocator_for(device);
  allocator.reset_peak();
  const auto start = Clock::now();
  for (int64_t i = 0; i < passes; ++i) {
    NoGrad no_grad;
    amp::Autocast autocast(amp);
    Var out = model(Var(batch.input));
    (void)out.value().to_vector(); // waits for the device, as a user reading results would
  }
  backend::cuda_synchronize();
  result.inference_wall_s = seconds_since(start);
  result.inference_peak_bytes = allocator.peak_bytes();
  model.train();
}

void print_diagnostics(nn::Sequential& model, const amp::ActivationGradientProbe& probe,
                       float stored_scale, float target_scale) {
  const auto params = model.named_parameters();
  std::cout << amp::format_range_reports("fp16 range of activation gradients (last step):",
                                         probe.reports(), target_scale)
            << amp::format_range_reports("fp16 range of weight gradients (last step):",
                                         amp::weight_gradient_report(params, stored_scale,
                                                                     target_scale),
                                         target_scale);
}

} // namespace

void add_common_options(CLI::App& app, Options& options, float default_lr) {
  options.lr = default_lr;
  app.add_option("--device", options.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--seed", options.seed, "seed of the initial weights and the data")
      ->capture_default_str();
  app.add_option("--lr", options.lr, "learning rate")->capture_default_str();
  app.add_option("--out", options.out, "output directory (default out/<example>)");
  app.add_flag("--amp", options.amp, "train with mixed precision (autocast + GradScaler)");
  app.add_flag("--compare", options.compare,
               "train FP32, then AMP from the same init, and print the comparison table");
  app.add_flag("--diagnose", options.diagnose,
               "report fp16 underflow/overflow of activation and weight gradients");
  app.add_option("--init-scale", options.init_scale, "GradScaler initial loss scale")
      ->capture_default_str();
  app.add_option("--growth-interval", options.growth_interval,
                 "clean steps before the loss scale grows")
      ->capture_default_str();
  app.add_flag("--no-loss-scaling", options.no_loss_scaling,
               "AMP without loss scaling (ablation: small gradients flush to zero)");
  app.add_option("--log-every", options.log_every, "progress line every N steps (0: auto)");
}

Device resolve_device(const std::string& name) {
  if (name == "auto") return cuda_available() ? Device::cuda : Device::cpu;
  const Device device = parse_device(name);
  require(device != Device::cuda || cuda_available(), "--device cuda",
          cuda_unavailable_reason());
  return device;
}

RunResult train(const TrainSpec& spec, const Options& options, Device device, bool amp,
                const std::string& out_dir) {
  std::filesystem::create_directories(out_dir);
  RunResult result;
  result.precision = amp ? "amp" : "fp32";

  Rng init_rng(options.seed);
  std::unique_ptr<nn::Sequential> model = spec.build_model(init_rng);
  model->to(device);
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(spec, *model, options.lr);
  amp::GradScalerOptions scaler_options;
  scaler_options.init_scale = options.init_scale;
  scaler_options.growth_interval = options.growth_interval;
  scaler_options.enabled = amp && !options.no_loss_scaling;
  amp::GradScaler scaler(scaler_options, device);

  std::string csv = "step,loss,wall_s,scale,skipped\n";
  const int every = options.log_every > 0 ? options.log_every
                                          : static_cast<int>(std::max<int64_t>(1, spec.steps / 10));
  Progress progress(cat(spec.example, " ", result.precision, " ", device), spec.steps, every);
  Allocator& allocator = allocator_for(device);
  allocator.reset_peak();
  const auto start = Clock::now();
  for (int64_t step = 0; step < spec.steps; ++step) {
    const bool probe_this_step = options.diagnose && step + 1 == spec.steps;
    const float scale_now = scaler.get_scale();
    std::unique_ptr<amp::ActivationGradientProbe> probe;
    if (probe_this_step)
      probe = std::make_unique<amp::ActivationGradientProbe>(scale_now, options.init_scale);

    const Batch batch = spec.batch(step, device);
    opt->zero_grad();
    Var loss;
    {
      amp::Autocast autocast(amp);
      Var output = (*model)(Var(batch.input));
      loss = loss_of(spec.loss, output, batch.target);
    }
    scaler.scale(loss).backward();
    if (probe_this_step) print_diagnostics(*model, *probe, scale_now, options.init_scale);
    scaler.step(*opt);
    scaler.update();

    const bool skipped = scaler.step_was_skipped(*opt);
    if (skipped && options.diagnose) {
      std::cout << "step " << step << ": overflow, step skipped; first non-finite gradient: "
                << amp::first_nonfinite_parameter(model->named_parameters()) << "\n";
    }
    result.skipped_steps += skipped;
    result.final_loss = loss.value().item();
    const double scale = scaler.get_scale();
    csv += cat(step, ",", result.final_loss, ",", seconds_since(start), ",", scale, ",",
               skipped ? 1 : 0, "\n");
    progress.update(step, result.final_loss, scale);
  }
  backend::cuda_synchronize();
  result.wall_s = seconds_since(start);
  result.peak_bytes = allocator.peak_bytes();
  result.final_scale = scaler.get_scale();
  measure_inference(spec, *model, device, amp, result);
  if (spec.finish) spec.finish(*model, device, amp, out_dir);

  nlohmann::json summary = {{"example", spec.example},
                            {"device", device_name(device)},
                            {"precision", result.precision},
                            {"loss_scaling", scaler.is_enabled()},
                            {"steps", spec.steps},
                            {"seed", options.seed},
                            {"lr", options.lr},
                            {"final_loss", result.final_loss},
                            {"wall_s", result.wall_s},
                            {"peak_bytes", result.peak_bytes},
                            {"skipped_steps", result.skipped_steps},
                            {"final_scale", result.final_scale},
                            {"inference_wall_s", result.inference_wall_s},
                            {"inference_peak_bytes", result.inference_peak_bytes}};
  io::write_file_atomically(out_dir + "/metrics.csv", csv);
  io::write_file_atomically(out_dir + "/summary.json", summary.dump(2) + "\n");
  return result;
}

namespace {
void print_comparison(const std::string& what, double fp32_s, double amp_s, size_t fp32_bytes,
                      size_t amp_bytes, const RunResult* fp32, const RunResult* amp) {
  std::printf("\n%s\n", what.c_str());
  std::printf("  %-10s %12s %14s %14s\n", "", "time (s)", "peak memory", fp32 ? "final loss" : "");
  std::printf("  %-10s %12.4f %14s %14s\n", "FP32", fp32_s, mib(fp32_bytes).c_str(),
              fp32 ? cat(fp32->final_loss).c_str() : "");
  std::printf("  %-10s %12.4f %14s %14s\n", "AMP", amp_s, mib(amp_bytes).c_str(),
              amp ? cat(amp->final_loss).c_str() : "");
  std::printf("  time saved: %.1f%%   memory saved: %.1f%%\n", 100.0 * (1.0 - amp_s / fp32_s),
              100.0 * (1.0 - double(amp_bytes) / double(fp32_bytes)));
}
} // namespace

int run_example(const TrainSpec& spec, const Options& options) {
  const Device device = resolve_device(options.device);
  const std::string out = options.out.empty() ? "out/" + spec.example : options.out;
  if (!options.compare) {
    const RunResult r = train(spec, options, device, options.amp, out);
    std::printf("%s %s on %s: final loss %.6g in %.2f s, peak %s, skipped %lld, scale %g\n",
                spec.example.c_str(), r.precision.c_str(), device_name(device), r.final_loss,
                r.wall_s, mib(r.peak_bytes).c_str(), static_cast<long long>(r.skipped_steps),
                r.final_scale);
    std::printf("wrote %s/metrics.csv and %s/summary.json\n", out.c_str(), out.c_str());
    return 0;
  }
  const RunResult fp32 = train(spec, options, device, false, out + "/fp32");
  const RunResult amp = train(spec, options, device, true, out + "/amp");
  std::printf("\n%s on %s, %lld steps (same init and data)%s", spec.example.c_str(),
              device_name(device), static_cast<long long>(spec.steps),
              device == Device::cpu ? " — CPU f16 is an emulation for study: the speed claim "
                                      "belongs to the GPU\n"
                                    : "\n");
  print_comparison("Training", fp32.wall_s, amp.wall_s, fp32.peak_bytes, amp.peak_bytes, &fp32,
                   &amp);
  std::printf("  AMP: %lld skipped steps, final scale %g\n",
              static_cast<long long>(amp.skipped_steps), amp.final_scale);
  print_comparison("Inference (forward only)", fp32.inference_wall_s, amp.inference_wall_s,
                   fp32.inference_peak_bytes, amp.inference_peak_bytes, nullptr, nullptr);
  std::printf("\nwrote %s/fp32/ and %s/amp/ (metrics.csv, summary.json)\n", out.c_str(),
              out.c_str());
  return 0;
}

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}

} // namespace minamp::examples
