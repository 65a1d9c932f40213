// ResNet-18/34/50 against torchvision: the state_dict names and shapes, strict loading of a file in
// torchvision's layout, and the eval-mode logits on the same weights and input (fp32 within a max
// relative error of 1e-4, autocast within f16's). The weights and the input come from the formula
// of tests/parity/resnet_parity.py, which wrote torchvision's outputs to resnet_expected.json.
// Also: backward reaches every parameter, and where nothing needs them for a backward, the blocks
// and the network free each activation once the next layer has read it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <memory>
#include <optional>
#include <set>

#include "amp/autocast.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "nn/resnet.h"
#include "ops/ops.h"
#include "test_io_util.h"
#include "test_util.h"

namespace minamp {
namespace {

const nlohmann::json& expected() {
  static const nlohmann::json fixture = [] {
    std::ifstream in(std::string(MINAMP_SOURCE_DIR) + "/tests/parity/resnet_expected.json");
    return nlohmann::json::parse(in);
  }();
  return fixture;
}

Shape shape_of(const std::vector<int64_t>& d) {
  switch (d.size()) {
  case 0: return {};
  case 1: return {d[0]};
  case 2: return {d[0], d[1]};
  case 3: return {d[0], d[1], d[2]};
  default: return {d[0], d[1], d[2], d[3]};
  }
}

// resnet_parity.py's formula: lowbias32 of the value's index and the entry's index t.
uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  return x ^ (x >> 16);
}

// The values of entry t (`name`, PyTorch `shape`), one float32 rounding each.
std::vector<float> generated(uint32_t t, const std::string& name,
                             const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const bool conv = shape.size() == 4, linear = shape.size() == 2;
  const auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  float scale = 0.1f;
  if (conv) scale = std::sqrt(6.0f / float(shape[1] * shape[2] * shape[3]));
  if (linear) scale = std::sqrt(1.0f / float(shape[1]));
  const bool shifted = !conv && !linear && (ends_with("running_var") || ends_with("weight"));
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t x = lowbias32(uint32_t(i) * 2654435761U + (t + 1) * 40503U);
    const float u = float(x >> 8) * 0x1p-24f;
    const float v = 2.0f * u - 1.0f; // exact
    values[size_t(i)] = shifted ? u + 0.5f : v * scale;
  }
  return values;
}

// The model of `arch` in the fixture's configuration, its weights generated into a safetensors file
// in torchvision's layout and loaded strictly; the checksum of the generated values in `checksum`.
std::unique_ptr<nn::ResNet> fixture_model(const std::string& arch, const std::string& path,
                                          double& checksum) {
  Rng rng(1);
  nn::ResNetOptions options;
  options.arch = nn::parse_resnet_arch(arch);
  options.num_classes = expected().at("num_classes").get<int64_t>();
  auto model = std::make_unique<nn::ResNet>(options, rng);
  std::vector<io::NamedTensor> tensors;
  std::vector<io::NamedInt64s> counters;
  checksum = 0;
  const auto& entries = expected().at("models").at(arch).at("state_dict");
  for (size_t t = 0; t < entries.size(); ++t) {
    const std::string name = entries[t].at(0).get<std::string>();
    const std::vector<int64_t> shape = entries[t].at(1).get<std::vector<int64_t>>();
    if (name.size() > 19 && name.substr(name.size() - 19) == "num_batches_tracked") {
      counters.push_back({name, {}, {0}});
      continue;
    }
    const std::vector<float> values = generated(uint32_t(t), name, shape);
    for (float v : values) checksum += v;
    tensors.push_back({name, Tensor::from_vector(values, shape_of(shape))});
  }
  io::save_safetensors(path, tensors, {}, counters);
  io::load_weights(path, *model); // strict: every name, shape and dtype as torchvision's
  return model;
}

// The fixture's input [N, 3, H, W] (entry index: one past the state_dict) as NHWC.
Tensor fixture_image(const std::string& arch) {
  const std::vector<int64_t> nchw = expected().at("image").get<std::vector<int64_t>>();
  const size_t t = expected().at("models").at(arch).at("state_dict").size();
  const std::vector<float> values = generated(uint32_t(t), "input", nchw);
  const int64_t n = nchw[0], c = nchw[1], h = nchw[2], w = nchw[3];
  std::vector<float> nhwc(values.size());
  for (int64_t s = 0; s < n; ++s)
    for (int64_t k = 0; k < c; ++k)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          nhwc[size_t(((s * h + y) * w + x) * c + k)] =
              values[size_t(((s * c + k) * h + y) * w + x)];
  return Tensor::from_vector(nhwc, {n, h, w, c});
}

// max |out - ref| / max |ref|.
double max_relative_error(const std::vector<float>& out, const std::vector<double>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff = std::max(diff, std::abs(double(out[i]) - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return diff / scale;
}

class ResNetParity : public ::testing::TestWithParam<std::string> {};

TEST_P(ResNetParity, EvalLogitsEqualTorchvisionsOnTheSameWeights) {
  const std::string arch = GetParam();
  test::TempDir dir;
  double checksum = 0;
  auto model = fixture_model(arch, dir.path("w.safetensors"), checksum);
  const auto& fixture = expected().at("models").at(arch);
  EXPECT_NEAR(checksum, fixture.at("checksum").get<double>(), 1e-9 * std::abs(checksum))
      << "the generated weights differ from resnet_parity.py's";
  const std::vector<double> ref = fixture.at("logits").get<std::vector<double>>();
  model->eval();
  NoGrad no_grad;
  const Var logits = (*model)(Var(fixture_image(arch)));
  ASSERT_EQ(logits.value().numel(), int64_t(ref.size()));
  EXPECT_LE(max_relative_error(logits.value().to_vector(), ref), 1e-4) << arch << " fp32";
  amp::Autocast autocast(true);
  const Var half = (*model)(Var(fixture_image(arch)));
  EXPECT_EQ(half.dtype(), DType::f16);
  EXPECT_LE(max_relative_error(half.value().to_vector(), ref), 2e-2) << arch << " autocast";
}

TEST_P(ResNetParity, SavedWeightsHaveTorchvisionsNamesShapesAndDtypes) {
  const std::string arch = GetParam();
  Rng rng(2);
  nn::ResNetOptions options;
  options.arch = nn::parse_resnet_arch(arch);
  options.num_classes = expected().at("num_classes").get<int64_t>();
  nn::ResNet model(options, rng);
  test::TempDir dir;
  io::save_weights(dir.path("w.safetensors"), model);
  const io::SafetensorsFile file = io::load_safetensors(dir.path("w.safetensors"));
  std::set<std::string> expected_names, saved_names;
  for (const auto& entry : expected().at("models").at(arch).at("state_dict")) {
    const std::string name = entry.at(0).get<std::string>();
    const std::vector<int64_t> shape = entry.at(1).get<std::vector<int64_t>>();
    expected_names.insert(name);
    if (file.has_int64s(name)) {
      EXPECT_TRUE(file.int64s_named(name).shape.empty()) << name << ": a 0-d int64";
    } else if (file.has_tensor(name)) {
      EXPECT_EQ(file.tensor(name).shape(), shape_of(shape)) << name;
      EXPECT_EQ(file.tensor(name).dtype(), DType::f32) << name;
    }
  }
  for (const auto& t : file.tensors) saved_names.insert(t.name);
  for (const auto& c : file.int64s) saved_names.insert(c.name);
  EXPECT_EQ(saved_names, expected_names);
}

INSTANTIATE_TEST_SUITE_P(Archs, ResNetParity,
                         ::testing::Values("resnet18", "resnet34", "resnet50"));

TEST(ResNet, ArchitecturesByNameAndTheirErrors) {
  EXPECT_EQ(nn::parse_resnet_arch("resnet34"), nn::ResNetArch::resnet34);
  test::expect_error([] { nn::parse_resnet_arch("resnet101"); }, "ResNet",
                     "expected resnet18, resnet34 or resnet50, got 'resnet101'");
  Rng rng(3);
  nn::ResNetOptions options;
  options.arch = nn::ResNetArch::resnet18;
  options.width = 4;
  nn::ResNet model(options, rng);
  EXPECT_EQ(model.num_features(), 32);
  test::expect_error(
      [&] {
        model(Var(Tensor::zeros({1, 16, 16, 1})));
      },
      "Conv2d", "expected input [N, H, W, 3]");
}

// Backward reaches every parameter of a narrow ResNet-50 (every kind of block, downsample
// included). (The layers' gradients are checked by finite differences in test_autograd.cpp, the
// whole network's against the GPU backend in GpuResNet.)
TEST(ResNet, BackwardGivesEveryParameterAGradient) {
  Rng rng(4);
  nn::ResNetOptions options;
  options.arch = nn::ResNetArch::resnet50;
  options.width = 2;
  options.num_classes = 3;
  nn::ResNet model(options, rng);
  const Tensor images = test::random_tensor(rng, {4, 64, 64, 3});
  const Tensor labels = Tensor::from_vector({0, 1, 2, 1}, {4}, DType::i32);
  ops::cross_entropy(model(Var(images)), labels).backward();
  EXPECT_EQ(model.named_parameters().size(), 161u); // torchvision's 320 entries less buffers
  for (auto& [name, p] : model.named_parameters()) {
    double sum = 0;
    for (float g : p->grad().to_vector()) sum += std::abs(g);
    EXPECT_GT(sum, 0.0) << name;
  }
}

// The bytes `module` allocates on the CPU over a forward of x beyond those live before it (x's
// among them), after a first forward has made whatever it keeps (f16 weight copies).
double forward_peak_bytes(nn::Module& module, const Tensor& x) {
  module(Var(x));
  return double(test::peak_bytes_during(Device::cpu, [&] { const Var y = module(Var(x)); }));
}

// Where no backward needs them (inference, or a frozen backbone, whose batch norms still run in
// training mode), a block frees each layer's output once the next layer has read it, as
// torchvision's does: beside its input it holds at most two activations of its output's size
// (a batch norm's input and output, then the last one's output and the sum), three with a
// downsample shortcut (its conv's and batch norm's outputs beside the main branch's); nested calls
// would keep their temporaries to the end of the block, up to five. In f32 and under f16
// autocast (x in the dtype the block computes in, as a layer before it would give it), with
// fusion on and off, frozen in training mode and in eval mode under NoGrad.
TEST(ResNet, BlocksFreeEachActivationOnceTheNextLayerHasReadIt) {
  struct BlockCase {
    bool bottleneck;
    int64_t in_channels, planes;
    int stride;
    double bound; // output-sized activations
  };
  const BlockCase cases[] = {
      {false, 8, 8, 1, 2}, {false, 4, 8, 2, 3}, {true, 16, 4, 1, 2}, {true, 8, 4, 2, 3}};
  for (const BlockCase& c : cases) {
    for (DType dtype : {DType::f32, DType::f16}) {
      for (bool fusion : {true, false}) {
        for (bool training : {true, false}) {
          SCOPED_TRACE(cat(c.bottleneck ? "Bottleneck(" : "BasicBlock(", c.in_channels, ", ",
                           c.planes, ", stride ", c.stride, ") ", dtype,
                           fusion ? ", fusion on, " : ", fusion off, ",
                           training ? "frozen, training mode" : "eval, NoGrad"));
          test::ScopedFusion scope(fusion);
          Rng rng(1300);
          std::unique_ptr<nn::ResidualBlock> block;
          int64_t out_channels = c.planes;
          if (c.bottleneck) {
            block = std::make_unique<nn::Bottleneck>(c.in_channels, c.planes, c.stride, rng);
            out_channels *= nn::Bottleneck::kExpansion;
          } else {
            block = std::make_unique<nn::BasicBlock>(c.in_channels, c.planes, c.stride, rng);
          }
          block->requires_grad_(false);
          block->train(training);
          const Tensor x = test::random_tensor(rng, {2, 16, 16, c.in_channels}).to(dtype);
          const double out_bytes =
              2.0 * (16 / c.stride) * (16 / c.stride) * out_channels * dtype_size(dtype);
          amp::Autocast autocast(dtype == DType::f16);
          std::optional<NoGrad> no_grad;
          if (!training) no_grad.emplace();
          EXPECT_LE(forward_peak_bytes(*block, x), (c.bound + 0.1) * out_bytes);
        }
      }
    }
  }
}

// The same for the whole network: a ResNet-18's peak is its stem's, the 7x7 conv's output and the
// batch norm's (the input aside); the stem's output and each stage's are freed as the next stage
// runs.
TEST(ResNet, TheNetworksPeakIsTheStemsConvAndBatchNormOutputs) {
  Rng rng(1301);
  nn::ResNetOptions options;
  options.arch = nn::ResNetArch::resnet18;
  options.width = 8;
  nn::ResNet model(options, rng);
  const Tensor images = test::random_tensor(rng, {2, 64, 64, 3});
  const double stem_bytes = 2.0 * 32 * 32 * 8 * sizeof(float); // [2, 32, 32, 8]
  model.eval();
  NoGrad no_grad;
  EXPECT_LE(forward_peak_bytes(model, images), 2.1 * stem_bytes);
}

} // namespace
} // namespace minamp
