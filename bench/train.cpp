// bench_train: per-step time (median, p10, p90 after warm-up), peak memory and final loss of
// mlp (the seed config), sine (the ROCm blog's conv net), classify (this benchmark's own small
// CNN), resnet18 and resnet50 (torchvision's, fully trained) and resnet50-frozen (its classifier
// alone, the transfer tutorial's fine-tuning) — in FP32, AMP (f16, loss scaling) and AMP-bf16 (no
// loss scaling), for training steps and forward-only inference, on the CPU or a GPU.
// bench/pytorch/ holds the same models in PyTorch, timed the same way.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <sstream>
#include <utility>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "cli.h"
#include "io/atomic_file.h"
#include "kernels/backend.h"
#include "kernels/gemm_version.h"
#include "kernels/profile.h"
#include "nn/module.h"
#include "nn/resnet.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "sine_data.h"

using namespace minamp;
using json = nlohmann::json;

namespace {

// The threads of the CPU kernels: OpenMP's (OMP_NUM_THREADS), 1 without OpenMP.
int cpu_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

using Clock = std::chrono::steady_clock;

struct Config {
  Device device = Device::cpu;
  int64_t steps = 100;
  int64_t warmup = 10;
  int64_t infer_steps = 20;
  int64_t profile_steps = 0; // training steps with the op profiler on, after the timed ones
  bool cuda_graph = false;   // also time training replayed from a CUDA graph of one step
  bool unfused = false;      // also time training with the batch-norm fusions off
  int64_t size = 0;          // sine grid; 0: 512 on a GPU, 64 on the CPU, 16 on the emulator
  // The ResNets' images, batch and stem width; 0: 224, 64 and 64 on a GPU, smaller elsewhere
  // (64, 4, 64 on the CPU; 32, 2, 8 on the emulator).
  int64_t resnet_size = 0, resnet_batch = 0, resnet_width = 0;
  uint64_t seed = 0;
};

enum class LossKind { mse, cross_entropy };

// A precision of the benchmark: "fp32", "amp" (autocast to f16, GradScaler) or "amp-bf16"
// (autocast to bf16, no GradScaler, as PyTorch users train bf16).
struct Precision {
  std::string name;
  bool amp = false;
  DType dtype = DType::f16;
  bool loss_scaling = false;
};

Precision precision_named(const std::string& name) {
  if (name == "amp") return {name, true, DType::f16, true};
  if (name == "amp-bf16") return {name, true, DType::bf16, false};
  return {name, false, DType::f16, false};
}

// One benchmark model with its data, already on the device. Built afresh from the seed for each
// precision, so FP32 and AMP start from the same weights and see the same batches.
struct Workload {
  Workload(std::string name, std::string description, std::string optimizer)
      : name(std::move(name)), description(std::move(description)),
        optimizer(std::move(optimizer)) {}
  std::string name, description, optimizer;
  std::unique_ptr<nn::Module> model;
  std::vector<Tensor> inputs, targets; // batch i % size() at step i
  LossKind loss = LossKind::mse;
  std::function<std::unique_ptr<optim::Optimizer>(std::vector<Parameter*>)> make_optimizer;

  size_t data_bytes() const {
    size_t bytes = 0;
    for (size_t i = 0; i < inputs.size(); ++i) bytes += inputs[i].nbytes() + targets[i].nbytes();
    return bytes;
  }
};

std::vector<float> normal_values(Rng& rng, int64_t n) {
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = rng.normal();
  return values;
}

// mlp: Linear(8->16)-ReLU-Linear(16->16)-ReLU-Linear(16->1), MSE, SGD lr 1e-3, batch 512,
// 50 random batches (the seed tutorial's configuration, as examples/mlp.cpp).
Workload mlp(const Config& cfg) {
  const int64_t batch = 512, batches = 50;
  Workload w{"mlp", "Linear(8,16)-ReLU-Linear(16,16)-ReLU-Linear(16,1), MSE, batch 512",
             "SGD lr 1e-3"};
  Rng init(cfg.seed), data(cfg.seed + 1);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Linear>(8, 16, init).emplace<nn::ReLU>();
  model->emplace<nn::Linear>(16, 16, init).emplace<nn::ReLU>();
  model->emplace<nn::Linear>(16, 1, init);
  w.model = std::move(model);
  for (int64_t b = 0; b < batches; ++b) {
    w.inputs.push_back(
        Tensor::from_vector(normal_values(data, batch * 8), {batch, 8}, DType::f32, cfg.device));
    w.targets.push_back(
        Tensor::from_vector(normal_values(data, batch), {batch, 1}, DType::f32, cfg.device));
  }
  w.make_optimizer = [](std::vector<Parameter*> p) {
    return std::make_unique<optim::SGD>(std::move(p), 1e-3f);
  };
  return w;
}

// sine: 1x1 Conv(2->256)+BN+ReLU, 2 x [1x1 Conv(256->256)+BN+ReLU], 1x1 Conv(256->1) on the
// [1, S, S, 2] coordinate grid, MSE against the quantized sine, Adam lr 1e-3.
Workload sine(const Config& cfg) {
  const int64_t s = cfg.size, hidden = 256;
  Workload w{
      "sine",
      cat("1x1 Conv(2,256)+BN+ReLU, 2x[Conv(256,256)+BN+ReLU], Conv(256,1), MSE, grid ", s, "x", s),
      "Adam lr 1e-3"};
  Rng init(cfg.seed);
  auto model = std::make_unique<nn::Sequential>();
  int64_t in = 2;
  for (int layer = 0; layer < 3; ++layer) {
    model->emplace<nn::Conv2d>(in, hidden, 1, init)
        .emplace<nn::BatchNorm>(hidden)
        .emplace<nn::ReLU>();
    in = hidden;
  }
  model->emplace<nn::Conv2d>(hidden, 1, 1, init);
  w.model = std::move(model);
  const std::vector<float> grid = examples::coordinate_grid(s);
  w.inputs.push_back(Tensor::from_vector(grid, {1, s, s, 2}, DType::f32, cfg.device));
  w.targets.push_back(
      Tensor::from_vector(examples::quantized_sine(grid), {1, s, s, 1}, DType::f32, cfg.device));
  w.make_optimizer = [](std::vector<Parameter*> p) {
    return std::make_unique<optim::Adam>(std::move(p), 1e-3f);
  };
  return w;
}

// classify (this benchmark's definition, mirrored in bench/pytorch/models.py): on 28x28 grey
// images, Conv3x3(1->32)+BN+ReLU, Conv3x3(32->32, stride 2)+BN+ReLU, Conv3x3(32->64)+BN+ReLU,
// Conv3x3(64->64, stride 2)+BN+ReLU (convs without bias, padding 1), GlobalAvgPool,
// Linear(64->10), cross-entropy, SGD lr 0.01 momentum 0.9, batch 128, 4 random batches.
Workload classify(const Config& cfg) {
  const int64_t batch = 128, batches = 4, classes = 10;
  Workload w{"classify",
             "Conv3x3(1,32)+BN+ReLU, Conv3x3(32,32,s2)+BN+ReLU, Conv3x3(32,64)+BN+ReLU, "
             "Conv3x3(64,64,s2)+BN+ReLU, GAP, Linear(64,10), CE, batch 128, 28x28x1 (benchmark's "
             "own definition, random data)",
             "SGD lr 0.01 momentum 0.9"};
  Rng init(cfg.seed), data(cfg.seed + 1);
  auto model = std::make_unique<nn::Sequential>();
  const int64_t channels[5] = {1, 32, 32, 64, 64};
  for (int i = 0; i < 4; ++i) {
    const int stride = i % 2 == 1 ? 2 : 1;
    model->emplace<nn::Conv2d>(channels[i], channels[i + 1], 3, init, stride, 1, false)
        .emplace<nn::BatchNorm>(channels[i + 1])
        .emplace<nn::ReLU>();
  }
  model->emplace<nn::GlobalAvgPool>().emplace<nn::Linear>(64, classes, init);
  w.model = std::move(model);
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<float> labels(static_cast<size_t>(batch));
    for (float& label : labels) label = static_cast<float>(data.below(classes));
    w.inputs.push_back(Tensor::from_vector(normal_values(data, batch * 28 * 28), {batch, 28, 28, 1},
                                           DType::f32, cfg.device));
    w.targets.push_back(Tensor::from_vector(labels, {batch}, DType::i32, cfg.device));
  }
  w.loss = LossKind::cross_entropy;
  w.make_optimizer = [](std::vector<Parameter*> p) {
    return std::make_unique<optim::SGD>(std::move(p), 0.01f, 0.9f);
  };
  return w;
}

// resnet18 / resnet50 (torchvision's, mirrored in bench/pytorch/models.py): 256 classes
// (Caltech-256's), cross-entropy, Adam lr 1e-4, 2 random batches of cfg.resnet_batch images at
// cfg.resnet_size; with `frozen`, every parameter but fc's frozen (the transfer tutorial's
// fine-tuning: the backbone keeps no activations and gets no gradients).
Workload resnet(const Config& cfg, nn::ResNetArch arch, bool frozen) {
  const int64_t batch = cfg.resnet_batch, size = cfg.resnet_size, batches = 2, classes = 256;
  const std::string arch_name = nn::resnet_arch_name(arch);
  Workload w{frozen ? arch_name + "-frozen" : arch_name,
             cat("torchvision ", arch_name, " (width ", cfg.resnet_width, "), ", classes,
                 " classes, CE, ", frozen ? "backbone frozen (fc trains), " : "", "batch ", batch,
                 ", ", size, "x", size, "x3 (random data)"),
             "Adam lr 1e-4"};
  Rng init(cfg.seed), data(cfg.seed + 1);
  nn::ResNetOptions options;
  options.arch = arch;
  options.num_classes = classes;
  options.width = cfg.resnet_width;
  auto model = std::make_unique<nn::ResNet>(options, init);
  if (frozen) {
    model->requires_grad_(false);
    model->fc.requires_grad_(true);
  }
  w.model = std::move(model);
  for (int64_t b = 0; b < batches; ++b) {
    std::vector<float> labels(static_cast<size_t>(batch));
    for (float& label : labels) label = static_cast<float>(data.below(classes));
    w.inputs.push_back(Tensor::from_vector(normal_values(data, batch * size * size * 3),
                                           {batch, size, size, 3}, DType::f32, cfg.device));
    w.targets.push_back(Tensor::from_vector(labels, {batch}, DType::i32, cfg.device));
  }
  w.loss = LossKind::cross_entropy;
  w.make_optimizer = [](std::vector<Parameter*> p) {
    return std::make_unique<optim::Adam>(std::move(p), 1e-4f);
  };
  return w;
}

const std::vector<std::string> kModels = {"mlp",      "sine",     "classify",
                                          "resnet18", "resnet50", "resnet50-frozen"};

// The model called `name` (one of kModels: checked by examples::parse_list).
Workload build(const std::string& name, const Config& cfg) {
  if (name == "mlp") return mlp(cfg);
  if (name == "sine") return sine(cfg);
  if (name == "classify") return classify(cfg);
  if (name == "resnet18") return resnet(cfg, nn::ResNetArch::resnet18, false);
  return resnet(cfg, nn::ResNetArch::resnet50, name == "resnet50-frozen");
}

// Linear interpolation between order statistics, as numpy.percentile's default.
double percentile(const std::vector<double>& sorted, double q) {
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - double(lo)) * (sorted[hi] - sorted[lo]);
}

json summarize_ms(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double v : ms) sum += v;
  return {{"median", percentile(ms, 0.5)},
          {"p10", percentile(ms, 0.1)},
          {"p90", percentile(ms, 0.9)},
          {"min", ms.front()},
          {"max", ms.back()},
          {"mean", sum / double(ms.size())},
          {"n", ms.size()}};
}

// Times `body` once per iteration with the device drained before each clock read.
std::vector<double> time_each(int64_t iterations, const std::function<void(int64_t)>& body) {
  std::vector<double> ms;
  for (int64_t i = 0; i < iterations; ++i) {
    const auto start = Clock::now();
    body(i);
    backend::cuda_synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return ms;
}

Var loss_of(const Workload& w, const Var& output, const Tensor& target) {
  return w.loss == LossKind::mse ? ops::mse_loss(output, target)
                                 : ops::cross_entropy(output, target);
}

// The training loop of the README, one step per call; returns the loss tensor (not read).
std::function<Tensor(int64_t)> training_step(Workload& w, optim::Optimizer& opt,
                                             amp::GradScaler& scaler, const Precision& p) {
  return [&w, &opt, &scaler, p](int64_t step) {
    const size_t batch = static_cast<size_t>(step) % w.inputs.size();
    opt.zero_grad();
    Var loss;
    {
      amp::Autocast autocast(p.amp, p.dtype);
      loss = loss_of(w, (*w.model)(Var(w.inputs[batch])), w.targets[batch]);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    return loss.value();
  };
}

void progress(const std::string& label, const char* what) {
  std::printf("  %-22s %s\n", label.c_str(), what);
  std::fflush(stdout);
}

// The last 10 losses of a run, all its JSON reports. Keeping every step's loss would hold a new
// device block each step (a cudaMalloc once the cache runs dry), which neither the training loop
// of the examples nor PyTorch's peer (bench/pytorch/train.py keeps 10 too) pays.
class LossTail {
public:
  static constexpr int kSize = 10;
  void add(Tensor loss) {
    kept_.push_back(std::move(loss));
    if (kept_.size() > kSize) kept_.pop_front();
  }
  const std::deque<Tensor>& kept() const { return kept_; }

private:
  std::deque<Tensor> kept_;
};

// The JSON of a training run: its step times, the peak bytes it used beyond the resident data,
// and its losses (the last, and the mean of the last 10, or of all when fewer).
json training_result(const Workload& w, const Precision& p, const char* mode, const Config& cfg,
                     const std::vector<double>& ms, size_t used_peak_bytes, const LossTail& tail,
                     const amp::GradScaler& scaler, const json& profile) {
  const std::deque<Tensor>& losses = tail.kept();
  double last10 = 0;
  for (const Tensor& loss : losses) last10 += loss.item();
  return {{"model", w.name},
          {"precision", p.name},
          {"mode", mode},
          {"warmup", cfg.warmup},
          {"steps", cfg.steps},
          {"step_ms", summarize_ms(ms)},
          {"peak_bytes", used_peak_bytes},
          {"data_bytes", w.data_bytes()},
          {"final_loss", losses.back().item()},
          {"loss_last10_mean", last10 / double(losses.size())},
          {"final_scale", scaler.get_scale()},
          {"profile", profile}};
}

// `steps` more training steps (from `first`) with the op profiler on: prints and returns each
// op's calls and time per step, slowest first. On a GPU the times are the kernels' own (CUDA events
// around each op), so their sum leaves out the gaps between launches.
json profile_run(const std::function<Tensor(int64_t)>& step, int64_t first, int64_t steps) {
  backend::cuda_synchronize();
  profile::set_enabled(true);
  for (int64_t i = 0; i < steps; ++i) step(first + i);
  profile::set_enabled(false);
  const std::vector<profile::OpTime> times = profile::collect();
  std::printf("%s", profile::format_table(times, steps, "    ").c_str());
  double total_ms = 0.0;
  for (const profile::OpTime& t : times) total_ms += t.ms;
  json ops = json::array();
  for (const profile::OpTime& t : times)
    ops.push_back({{"op", t.op},
                   {"calls_per_step", double(t.calls) / double(steps)},
                   {"ms_per_step", t.ms / double(steps)},
                   {"share", total_ms > 0.0 ? t.ms / total_ms : 0.0}});
  return {{"steps", steps}, {"ms_per_step", total_ms / double(steps)}, {"ops", ops}};
}

// The default GradScaler, enabled for AMP-f16 runs only (disabled, it passes every call through).
amp::GradScaler scaler_for(const Precision& p, Device device) {
  amp::GradScalerOptions options;
  options.enabled = p.loss_scaling;
  return amp::GradScaler(options, device);
}

json train_run(Workload& w, const Precision& p, const Config& cfg, const std::string& label,
               const char* mode = "train") {
  std::unique_ptr<optim::Optimizer> opt = w.make_optimizer(w.model->parameters());
  amp::GradScaler scaler = scaler_for(p, cfg.device);
  const auto step = training_step(w, *opt, scaler, p);

  progress(label, cat(mode, ": ", cfg.warmup, " warm-up + ", cfg.steps, " timed steps").c_str());
  for (int64_t i = 0; i < cfg.warmup; ++i) step(i);
  backend::cuda_synchronize();
  Allocator& allocator = allocator_for(cfg.device);
  allocator.reset_peak();
  LossTail losses;
  const auto ms = time_each(cfg.steps, [&](int64_t i) { losses.add(step(cfg.warmup + i)); });
  const size_t peak = allocator.peak_bytes();
  const json profile = cfg.profile_steps > 0
                           ? profile_run(step, cfg.warmup + cfg.steps, cfg.profile_steps)
                           : json(nullptr);

  return training_result(w, p, mode, cfg, ms, peak - w.data_bytes(), losses, scaler, profile);
}

// Training with each timed step replayed from a CUDA graph: after the warm-up (eager: it creates
// the optimizer's state), one step is captured — with an input and a target buffer of its own —
// and every timed step copies its batch into those buffers (device to device, queued) and
// launches the graph. The peak memory includes the capture, which allocates what a step does,
// and leaves out the two buffers, as the eager run leaves out the resident batches.
json graph_train_run(Workload& w, const Precision& p, const Config& cfg, const std::string& label) {
  std::unique_ptr<optim::Optimizer> opt = w.make_optimizer(w.model->parameters());
  amp::GradScaler scaler = scaler_for(p, cfg.device);
  const auto eager_step = training_step(w, *opt, scaler, p);
  progress(
      label,
      cat("train, CUDA graph: ", cfg.warmup, " warm-up + ", cfg.steps, " timed replays").c_str());
  for (int64_t i = 0; i < cfg.warmup; ++i) eager_step(i);
  backend::cuda_synchronize();
  Allocator& allocator = allocator_for(cfg.device);
  allocator.reset_peak();

  const Tensor input = w.inputs[0].clone(), target = w.targets[0].clone();
  Tensor loss_value; // written by every replay
  const auto captured_step = [&] {
    opt->zero_grad();
    Var loss;
    {
      amp::Autocast autocast(p.amp, p.dtype);
      loss = loss_of(w, (*w.model)(Var(input)), target);
    }
    loss_value = loss.value();
    scaler.scale(loss).backward();
    scaler.step(*opt);
    scaler.update();
  };
  const std::unique_ptr<backend::CudaGraph, void (*)(backend::CudaGraph*)> graph(
      backend::cuda_graph_capture(captured_step), backend::cuda_graph_destroy);

  LossTail losses;
  const auto ms = time_each(cfg.steps, [&](int64_t i) {
    const size_t batch = static_cast<size_t>(cfg.warmup + i) % w.inputs.size();
    copy_bytes(input.raw(), cfg.device, w.inputs[batch].raw(), cfg.device, input.nbytes());
    copy_bytes(target.raw(), cfg.device, w.targets[batch].raw(), cfg.device, target.nbytes());
    backend::cuda_graph_launch(graph.get());
    losses.add(loss_value.clone());
  });
  const size_t peak = allocator.peak_bytes();

  const size_t buffers = input.nbytes() + target.nbytes();
  return training_result(w, p, "train-graph", cfg, ms, peak - w.data_bytes() - buffers, losses,
                         scaler, nullptr);
}

json inference_run(Workload& w, const Precision& p, const Config& cfg, const std::string& label) {
  progress(label, cat("inference: 3 warm-up + ", cfg.infer_steps, " timed passes").c_str());
  w.model->eval();
  const auto forward = [&](int64_t) {
    NoGrad no_grad;
    amp::Autocast autocast(p.amp, p.dtype);
    (*w.model)(Var(w.inputs[0]));
  };
  for (int64_t i = 0; i < 3; ++i) forward(i);
  backend::cuda_synchronize();
  Allocator& allocator = allocator_for(cfg.device);
  allocator.reset_peak();
  const auto ms = time_each(cfg.infer_steps, forward);
  const size_t peak = allocator.peak_bytes();
  w.model->train();
  return {{"model", w.name},
          {"precision", p.name},
          {"mode", "infer"},
          {"warmup", 3},
          {"steps", cfg.infer_steps},
          {"step_ms", summarize_ms(ms)},
          {"peak_bytes", peak - w.data_bytes()},
          {"data_bytes", w.data_bytes()}};
}

void print_run(const json& run) {
  const json& ms = run["step_ms"];
  std::printf("  %-8s %-8s %-5s median %9.3f ms  (p10 %.3f, p90 %.3f)  peak %8.2f MiB",
              run["model"].get<std::string>().c_str(), run["precision"].get<std::string>().c_str(),
              run["mode"].get<std::string>().c_str(), ms["median"].get<double>(),
              ms["p10"].get<double>(), ms["p90"].get<double>(),
              run["peak_bytes"].get<double>() / 1048576.0);
  if (run.contains("final_loss"))
    std::printf("  loss %.6g (last-%d mean %.6g)", run["final_loss"].get<double>(),
                std::min(run["steps"].get<int>(), LossTail::kSize),
                run["loss_last10_mean"].get<double>());
  std::printf("\n");
  std::fflush(stdout);
}

// Training as train_run, from the same init, with the batch-norm fusions off (nn::set_fusion,
// the path MINAMP_FUSION=0 selects): mode train-unfused, so that a run compares the two.
json unfused_train_run(const std::string& name, const Precision& p, const Config& cfg,
                       const std::string& label) {
  struct FusionOff {
    bool was = nn::fusion_enabled();
    FusionOff() { nn::set_fusion(false); }
    ~FusionOff() { nn::set_fusion(was); }
  } off;
  Workload w = build(name, cfg);
  w.model->to(cfg.device);
  return train_run(w, p, cfg, label, "train-unfused");
}

json model_info(const Workload& w) {
  return {{"description", w.description}, {"optimizer", w.optimizer}};
}

// Runs every model in every precision into result["runs"] (and result["models"]), calling
// `save` after each run, so that a run cut off by a time limit keeps what it measured.
void run_all(const std::vector<std::string>& models, const std::vector<std::string>& precisions,
             const Config& cfg, json& result, const std::function<void()>& save) {
  const auto add = [&](json run) {
    print_run(run);
    result["runs"].push_back(std::move(run));
    save();
  };
  for (const std::string& name : models) {
    for (const std::string& precision : precisions) {
      const Precision p = precision_named(precision);
      const std::string label = cat(name, " ", precision, " ", device_name(cfg.device));
      Workload w = build(name, cfg);
      w.model->to(cfg.device);
      result["models"][name] = model_info(w);
      add(train_run(w, p, cfg, label));
      add(inference_run(w, p, cfg, label));
      if (cfg.unfused) add(unfused_train_run(name, p, cfg, label));
      if (!cfg.cuda_graph) continue;
      Workload fresh = build(name, cfg); // the same init again
      fresh.model->to(cfg.device);
      try { // a failing capture is reported and keeps the eager results
        add(graph_train_run(fresh, p, cfg, label));
      } catch (const Error& e) {
        std::printf("  %-22s train, CUDA graph: failed: %s\n", label.c_str(), e.what());
        add({{"model", name},
             {"precision", precision},
             {"mode", "train-graph"},
             {"error", e.what()}});
      }
    }
  }
}

int run(int argc, char** argv) {
  CLI::App app{"minamp bench_train: step time, peak memory and final loss of mlp, sine, "
               "classify, resnet18, resnet50 and resnet50-frozen, FP32, AMP and AMP-bf16, "
               "training and inference"};
  Config cfg;
  std::string device = "auto", models = "mlp,sine,classify", precisions = "fp32,amp,amp-bf16";
  std::string json_path;
  app.add_option("--device", device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--models", models,
                 "comma-separated: mlp, sine, classify, resnet18, resnet50, resnet50-frozen")
      ->capture_default_str();
  app.add_option("--precisions", precisions,
                 "comma-separated: fp32, amp (f16, loss scaling), amp-bf16 (no loss scaling)")
      ->capture_default_str();
  const int64_t max_steps = 1'000'000'000;
  app.add_option("--steps", cfg.steps, "timed training steps (after warm-up)")
      ->transform(examples::integer_in(1, max_steps))
      ->capture_default_str();
  app.add_option("--warmup", cfg.warmup, "untimed training steps first")
      ->transform(examples::integer_in(0, max_steps))
      ->capture_default_str();
  app.add_option("--infer-steps", cfg.infer_steps, "timed forward-only passes")
      ->transform(examples::integer_in(1, max_steps))
      ->capture_default_str();
  app.add_option("--profile", cfg.profile_steps,
                 "after the timed steps, this many more with the op profiler on: time per op")
      ->transform(examples::integer_in(0, max_steps))
      ->capture_default_str();
  app.add_flag("--cuda-graph", cfg.cuda_graph,
               "also time training replayed from a CUDA graph of one step (mode train-graph)");
  app.add_flag("--unfused", cfg.unfused,
               "also time training with the batch-norm fusions off, as MINAMP_FUSION=0 runs it "
               "(mode train-unfused)");
  app.add_option("--size", cfg.size,
                 "sine grid size S (default 512 on a GPU, 64 on the CPU, 16 on the CUDA emulator)")
      ->transform(examples::integer_in(2, 8192));
  app.add_option("--resnet-size", cfg.resnet_size,
                 "ResNet image side (default 224 on a GPU, 64 on the CPU, 32 on the emulator)")
      ->transform(examples::integer_in(32, 1024));
  app.add_option("--resnet-batch", cfg.resnet_batch,
                 "ResNet images per batch (default 64 on a GPU, 4 on the CPU, 2 on the emulator)")
      ->transform(examples::integer_in(1, 65536));
  app.add_option("--resnet-width", cfg.resnet_width,
                 "ResNet stem width (default 64, torchvision's; 8 on the emulator)")
      ->transform(examples::integer_in(1, 1024));
  app.add_option("--seed", cfg.seed, "seed of the weights and data")
      ->transform(examples::any_uint64())
      ->capture_default_str();
  app.add_option("--json", json_path, "write the results to this JSON file")
      ->check(examples::kNonEmptyPath);
  examples::use_one_line_errors(app);
  CLI11_PARSE(app, argc, argv);
  if (!json_path.empty()) io::require_writable(json_path, "--json");

  const auto model_names = examples::parse_list(models, "--models", kModels);
  const auto precision_names =
      examples::parse_list(precisions, "--precisions", {"fp32", "amp", "amp-bf16"});
  if (device == "auto") device = cuda_available() ? "cuda" : "cpu";
  cfg.device = parse_device(device);
  require(cfg.device != Device::cuda || cuda_available(), "--device cuda",
          cuda_unavailable_reason());
  require(!cfg.cuda_graph || cfg.device == Device::cuda, "--cuda-graph",
          "needs --device cuda (CUDA graphs replay GPU work)");
  require(!cfg.unfused || cfg.device == Device::cuda, "--unfused",
          "needs --device cuda (the CPU backend never fuses)");
  if (cfg.size == 0) cfg.size = examples::default_sine_size(cfg.device);
  const bool gpu = cfg.device == Device::cuda && !cuda_emulated();
  const bool emulated = cfg.device == Device::cuda && cuda_emulated();
  if (cfg.resnet_size == 0) cfg.resnet_size = gpu ? 224 : emulated ? 32 : 64;
  if (cfg.resnet_batch == 0) cfg.resnet_batch = gpu ? 64 : emulated ? 2 : 4;
  if (cfg.resnet_width == 0) cfg.resnet_width = emulated ? 8 : 64;
  examples::require_valid_environment(); // before any model runs
  if (std::any_of(model_names.begin(), model_names.end(),
                  [](const std::string& name) { return name.rfind("resnet", 0) == 0; }))
    examples::require_resnet_batch_trains(cfg.resnet_batch, cfg.resnet_size, "--resnet-batch",
                                          "--resnet-size");
  const std::string gemm = cat(gemm_version_name(gemm_version()),
                               gemm_persistent_tiles() ? ", v5's large tiles persistent" : "");

  const bool sine = std::find(model_names.begin(), model_names.end(), "sine") != model_names.end();
  std::printf("bench_train on %s (%d threads): %lld warm-up + %lld timed steps%s; GEMM %s\n",
              device_description(cfg.device).c_str(), cpu_threads(),
              static_cast<long long>(cfg.warmup), static_cast<long long>(cfg.steps),
              sine ? cat(", sine ", cfg.size, "x", cfg.size).c_str() : "", gemm.c_str());
  json result = {
      {"framework", "minamp"},
      {"device", device_name(cfg.device)},
      {"device_name", device_description(cfg.device)},
      {"threads", cpu_threads()},
      {"sine_size", cfg.size},
      {"resnet",
       {{"size", cfg.resnet_size}, {"batch", cfg.resnet_batch}, {"width", cfg.resnet_width}}},
      {"seed", cfg.seed},
      {"gemm", gemm},
      {"timing", "wall clock per step, device synchronised before each clock read"},
      {"peak_memory", "allocator peak over the timed steps, minus the resident batches"},
      {"models", json::object()},
      {"runs", json::array()}};
  const auto save = [&] {
    if (!json_path.empty()) io::write_file_atomically(json_path, result.dump(2) + "\n");
  };
  run_all(model_names, precision_names, cfg, result, save);
  if (!json_path.empty()) std::printf("wrote %s\n", json_path.c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "bench_train: error: out of memory (std::bad_alloc): lower --size, "
                         "--resnet-size, --resnet-batch or --resnet-width\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: error: %s\n", e.what());
  }
  return 1;
}
