// minimal_amp: the mixed-precision training loop and nothing around it. PyTorch's AMP recipe
// (torch.autocast + torch.amp.GradScaler) line by line, on an MLP that learns
// y = sin(3 x0) cos(3 x1) from 256 points of [-1, 1]^2, in f16 (with loss scaling) or bf16
// (without: bf16 has float's range). README.md shows the lines between the two
// "the loop" markers, copied from here (tests/docs/check_docs.py keeps them identical).
#include <cmath>
#include <cstdio>

#include "amp/autocast.h"
#include "amp/grad_scaler.h"
#include "cli.h"
#include "core/allocator.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

using namespace minamp;

int main(int argc, char** argv) try {
  CLI::App app{"minamp minimal_amp: the AMP training loop on a small MLP"};
  std::string device_name = "cpu";
  int64_t steps = 300;
  std::string amp_dtype = "f16";
  app.add_option("--device", device_name, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--amp-dtype", amp_dtype, "autocast's low precision: f16 or bf16")
      ->check(CLI::IsMember({"f16", "bf16"}))
      ->capture_default_str();
  app.add_option("--steps", steps, "training steps")
      ->transform(examples::integer_in(1, 1'000'000))
      ->capture_default_str();
  examples::use_one_line_errors(app);
  CLI11_PARSE(app, argc, argv);
  examples::require_valid_environment();
  const Device device = device_name == "cuda" ? Device::cuda : Device::cpu;
  require(device == Device::cpu || cuda_available(), "--device cuda", cuda_unavailable_reason());
  const DType dtype = parse_half_precision(amp_dtype);

  Rng rng(0);
  std::vector<float> xs, ys;
  for (int i = 0; i < 256; ++i) {
    const float x0 = rng.uniform(-1.0f, 1.0f), x1 = rng.uniform(-1.0f, 1.0f);
    xs.insert(xs.end(), {x0, x1});
    ys.push_back(std::sin(3.0f * x0) * std::cos(3.0f * x1));
  }
  const Tensor input = Tensor::from_vector(xs, {256, 2}).to(device);  // [256, 2]
  const Tensor target = Tensor::from_vector(ys, {256, 1}).to(device); // [256, 1]
  nn::Sequential model;
  model.emplace<nn::Linear>(2, 64, rng).emplace<nn::ReLU>();
  model.emplace<nn::Linear>(64, 64, rng).emplace<nn::ReLU>().emplace<nn::Linear>(64, 1, rng);
  model.to(device);
  optim::Adam opt(model.parameters(), 1e-2f);
  amp::GradScalerOptions scaling;        // PyTorch's defaults: 2^16, x2 / x0.5, 2000 steps
  scaling.enabled = dtype == DType::f16; // bf16 needs no scaler (float's exponent range)

  // The comments line up with PyTorch's recipe, which clang-format would undo.
  // clang-format off
  // the loop
  amp::GradScaler scaler(scaling, device);             // scaler = torch.amp.GradScaler(enabled=...)
  for (int64_t step = 0; step < steps; ++step) {
    opt.zero_grad();                                   // opt.zero_grad()
    Var loss;
    {
      amp::Autocast autocast(true, dtype);             // with torch.autocast("cuda", dtype):
      loss = ops::mse_loss(model(Var(input)), target); //     loss = mse_loss(model(x), y)
    }
    scaler.scale(loss).backward();                     // scaler.scale(loss).backward()
    scaler.step(opt);                                  // scaler.step(opt)
    scaler.update();                                   // scaler.update()
    if (step % 50 == 0 || step + 1 == steps)
      std::printf("step %3lld  loss %.5f  scale %g\n", static_cast<long long>(step),
                  loss.value().item(), scaler.get_scale());
  }
  // the loop
  // clang-format on
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
