// The seed tutorial's MLP, done right: Linear(8->16) -> ReLU -> Linear(16->16) -> ReLU ->
// Linear(16->1), MSE, SGD lr 1e-3, batch 512, 50 seeded random batches reused every epoch.
// PyTorch equivalent: nn.Sequential(nn.Linear(8,16), nn.ReLU(), nn.Linear(16,16), nn.ReLU(),
// nn.Linear(16,1)).
#include <algorithm>

#include "cli.h"
#include "common.h"

using namespace minamp;

namespace {

// The hidden widths of "16,16" (or "16, 16"): positive integers separated by commas, each with
// spaces around it or none; no empty item. Throws Error naming --widths and the item otherwise.
std::vector<int64_t> parse_widths(const std::string& text) {
  std::vector<int64_t> widths;
  for (size_t start = 0;;) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string item = text.substr(start, comma - start);
    item.erase(0, std::min(item.find_first_not_of(' '), item.size()));
    item.erase(item.find_last_not_of(' ') + 1);
    int64_t width = 0;
    require(examples::parses_as_integer(item, width) && width > 0, "--widths", "'", item,
            "' is not a positive integer (expected widths like 16,16, got '", text, "')");
    require(width <= examples::kMaxWidth, "--widths", item, " is wider than ", examples::kMaxWidth);
    widths.push_back(width);
    if (comma == text.size()) return widths;
    start = comma + 1;
  }
}

// Check of --widths: parse_widths's error as CLI11's, as every other option's is.
const CLI::Validator kWidths(
    [](const std::string& text) {
      try {
        parse_widths(text);
        return std::string();
      } catch (const Error& e) {
        const std::string message = e.what();
        return message.substr(message.find(": ") + 2);
      }
    },
    "W,W,...");

} // namespace

int main(int argc, char** argv) {
  return examples::guarded_main([&] {
    CLI::App app{"minamp mlp: the seed tutorial's MLP on random data (MSE, SGD)"};
    examples::Options options;
    examples::add_common_options(app, options, 1e-3f);
    std::string widths_text = "16,16";
    int64_t batch_size = 512, epochs = 10, batches = 50;
    app.add_option("--widths", widths_text, "hidden layer widths")
        ->check(kWidths)
        ->capture_default_str();
    app.add_option("--batch-size", batch_size, "rows per batch")
        ->transform(examples::integer_in(1, examples::kMaxBatch))
        ->capture_default_str();
    app.add_option("--epochs", epochs, "passes over the batches")
        ->transform(examples::integer_in(1, examples::kMaxSteps))
        ->capture_default_str();
    app.add_option("--batches", batches, "random batches per epoch")
        ->transform(examples::integer_in(1, examples::kMaxSteps))
        ->capture_default_str();
    examples::use_one_line_errors(app);
    CLI11_PARSE(app, argc, argv);
    const std::vector<int64_t> widths = parse_widths(widths_text);
    examples::set_memory_options(
        cat("--batch-size ", batch_size, ", --batches ", batches, " and --widths ", widths_text));
    require(epochs <= examples::kMaxSteps / batches, "--epochs x --batches", "at most ",
            examples::kMaxSteps, " steps, got ", epochs, " x ", batches);
    examples::require_host_memory(
        double(batches) * double(batch_size) * 9 * sizeof(float),
        cat("the data set of --batches ", batches, " x --batch-size ", batch_size));

    // The data set: `batches` pairs of standard-normal inputs [B, 8] and targets [B, 1].
    Rng data_rng(options.seed + 1);
    std::vector<std::vector<float>> inputs(batches), targets(batches);
    for (int64_t b = 0; b < batches; ++b) {
      for (int64_t i = 0; i < batch_size * 8; ++i) inputs[b].push_back(data_rng.normal());
      for (int64_t i = 0; i < batch_size; ++i) targets[b].push_back(data_rng.normal());
    }

    examples::TrainSpec spec;
    spec.example = "mlp";
    spec.steps = epochs * batches;
    std::string widths_config; // the parsed widths, so "16, 16" and "16,16" are one model
    for (int64_t w : widths)
      widths_config += (widths_config.empty() ? "" : ",") + std::to_string(w);
    spec.config = {{"widths", widths_config},
                   {"batch_size", std::to_string(batch_size)},
                   {"batches", std::to_string(batches)}};
    spec.loss = examples::LossKind::mse;
    spec.optimizer = examples::OptimizerKind::sgd;
    spec.build_model = [&](Rng& rng) {
      auto model = std::make_unique<nn::Sequential>();
      int64_t in = 8;
      for (int64_t w : widths) {
        model->emplace<nn::Linear>(in, w, rng).emplace<nn::ReLU>();
        in = w;
      }
      model->emplace<nn::Linear>(in, 1, rng);
      return model;
    };
    spec.batch = [&](int64_t step, Device device) {
      const int64_t b = step % batches;
      return examples::Batch{Tensor::from_vector(inputs[b], {batch_size, 8}, DType::f32, device),
                             Tensor::from_vector(targets[b], {batch_size, 1}, DType::f32, device)};
    };
    return examples::run_example(spec, options);
  });
}
