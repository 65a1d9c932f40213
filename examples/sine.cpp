// The quantized 2-D sine of the AMD ROCm AMP blog: the input is a [1, S, S, 2] grid of (x, y)
// in [0, 1], the target cos(2 pi 4 x) + cos(2 pi 2 y) digitized into 4 levels and rescaled to
// [0, 1]. Model: 1x1 Conv(2->H)+BN+ReLU, L x [1x1 Conv(H->H)+BN+ReLU], 1x1 Conv(H->1); MSE; Adam.
// PyTorch equivalent (NCHW there): nn.Sequential(nn.Conv2d(2,H,1), nn.BatchNorm2d(H), nn.ReLU(),
// [nn.Conv2d(H,H,1), nn.BatchNorm2d(H), nn.ReLU()] * L, nn.Conv2d(H,1,1)).
#include <algorithm>

#include "amp/autocast.h"
#include "autograd/var.h"
#include "cli.h"
#include "common.h"
#include "io/image.h"
#include "sine_data.h"

using namespace minamp;

namespace {

// Writes [Z, 2Z + gap] grey with Z = S * zoom: the target on the left, the model's prediction on
// the right, each pixel repeated zoom x zoom times so that small grids stay visible
// (zoom = floor(256 / S), at least 1).
void write_side_by_side(const std::string& path, const std::vector<float>& target,
                        const std::vector<float>& prediction, int64_t size) {
  const int64_t zoom = std::max<int64_t>(1, 256 / size), side = size * zoom;
  const int64_t gap = std::max<int64_t>(2, side / 32), width = 2 * side + gap;
  std::vector<float> pixels(static_cast<size_t>(side * width), 1.0f);
  for (int64_t row = 0; row < side; ++row) {
    for (int64_t col = 0; col < side; ++col) {
      const int64_t source = (row / zoom) * size + col / zoom;
      pixels[row * width + col] = target[source];
      pixels[row * width + side + gap + col] = prediction[source];
    }
  }
  io::save_png(path, Tensor::from_vector(pixels, {side, width, 1}));
}

} // namespace

int main(int argc, char** argv) {
  return examples::guarded_main([&] {
    CLI::App app{"minamp sine: a conv net learns the quantized 2-D sine of the ROCm AMP blog"};
    examples::Options options;
    examples::add_common_options(app, options, 1e-3f);
    int64_t steps = 512, size = 0, hidden = 256, layers = 2;
    app.add_option("--steps", steps, "training steps on the one example")
        ->transform(examples::integer_in(1, examples::kMaxSteps))
        ->capture_default_str();
    app.add_option("--size", size,
                   "grid size S (default 512 on a GPU, 64 on the CPU, 16 on the CUDA emulator)")
        ->transform(examples::integer_in(2, 8192));
    app.add_option("--hidden", hidden, "channels of the hidden layers")
        ->transform(examples::integer_in(1, examples::kMaxWidth))
        ->capture_default_str();
    app.add_option("--layers", layers, "hidden Conv+BN+ReLU blocks after the first")
        ->transform(examples::integer_in(0, examples::kMaxLayers))
        ->capture_default_str();
    examples::use_one_line_errors(app);
    CLI11_PARSE(app, argc, argv);
    if (size == 0) size = examples::default_sine_size(examples::resolve_device(options.device));
    examples::set_memory_options(
        cat("--size ", size, ", --hidden ", hidden, " and --layers ", layers));

    const std::vector<float> grid = examples::coordinate_grid(size);
    const std::vector<float> target = examples::quantized_sine(grid);

    examples::TrainSpec spec;
    spec.example = "sine";
    spec.steps = steps;
    spec.config = {{"size", std::to_string(size)},
                   {"hidden", std::to_string(hidden)},
                   {"layers", std::to_string(layers)}};
    spec.loss = examples::LossKind::mse;
    spec.optimizer = examples::OptimizerKind::adam;
    spec.build_model = [&](Rng& rng) {
      auto model = std::make_unique<nn::Sequential>();
      int64_t in = 2;
      for (int64_t i = 0; i <= layers; ++i) {
        model->emplace<nn::Conv2d>(in, hidden, 1, rng)
            .emplace<nn::BatchNorm>(hidden)
            .emplace<nn::ReLU>();
        in = hidden;
      }
      model->emplace<nn::Conv2d>(hidden, 1, 1, rng);
      return model;
    };
    // The one batch is copied to the device once and stays there: a host-to-device copy per
    // step would wait for the GPU every step.
    examples::Batch resident;
    spec.batch = [&](int64_t, Device device) {
      if (!resident.input.defined() || resident.input.device() != device)
        resident = {Tensor::from_vector(grid, {1, size, size, 2}, DType::f32, device),
                    Tensor::from_vector(target, {1, size, size, 1}, DType::f32, device)};
      return resident;
    };
    spec.output_files = {"sine.png"};
    spec.finish = [&](nn::Module& model, Device device, const examples::Precision& precision,
                      const std::string& out_dir) {
      model.eval();
      NoGrad no_grad;
      amp::Autocast autocast(precision.amp, precision.dtype);
      const Var prediction =
          model(Var(Tensor::from_vector(grid, {1, size, size, 2}, DType::f32, device)));
      write_side_by_side(out_dir + "/sine.png", target, prediction.value().to_vector(), size);
      model.train();
    };
    return examples::run_example(spec, options);
  });
}
