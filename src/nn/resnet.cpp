// ResNet-18/34/50: the blocks, the stages and torchvision's initialisation.
#include "nn/resnet.h"

#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace minamp::nn {

namespace {

// torchvision's kaiming_normal_(w, mode="fan_out", nonlinearity="relu"): N(0, 2 / fan_out) with
// fan_out = Cout kh kw, for w [Cout, kh, kw, Cin].
void kaiming_normal_fan_out(Parameter& weight, Rng& rng) {
  const Shape& s = weight.master().shape();
  const float std = std::sqrt(2.0f / float(s[0] * s[1] * s[2]));
  std::vector<float> values(size_t(s.numel()));
  for (float& v : values) v = std * rng.normal();
  weight.master() = Tensor::from_vector(values, s);
}

// conv1x1(stride) without bias, then BatchNorm: the shortcut of a block whose output differs in
// size or channels from its input.
std::unique_ptr<Sequential> downsample(int64_t in_channels, int64_t out_channels, int stride,
                                       Rng& rng) {
  auto layers = std::make_unique<Sequential>();
  layers->emplace<Conv2d>(in_channels, out_channels, 1, rng, stride, 0, false)
      .emplace<BatchNorm>(out_channels);
  kaiming_normal_fan_out(dynamic_cast<Conv2d&>((*layers)[0]).weight, rng);
  return layers;
}

// Blocks per stage (layer1-4), as torchvision.
std::array<int, 4> stage_blocks(ResNetArch arch) {
  if (arch == ResNetArch::resnet18) return {2, 2, 2, 2};
  return {3, 4, 6, 3}; // resnet34 (BasicBlock) and resnet50 (Bottleneck)
}

// Fills `layer` with `blocks` blocks of `planes` (the first with `stride`); in_channels goes
// from the stage's input to its output channels.
template <class Block>
void make_stage(Sequential& layer, int64_t& in_channels, int64_t planes, int blocks, int stride,
                Rng& rng) {
  layer.emplace<Block>(in_channels, planes, stride, rng);
  in_channels = planes * Block::kExpansion;
  for (int i = 1; i < blocks; ++i) layer.emplace<Block>(in_channels, planes, 1, rng);
}

} // namespace

ResNetArch parse_resnet_arch(const std::string& name) {
  for (ResNetArch arch : {ResNetArch::resnet18, ResNetArch::resnet34, ResNetArch::resnet50})
    if (name == resnet_arch_name(arch)) return arch;
  throw Error(cat("ResNet: expected resnet18, resnet34 or resnet50, got '", name, "'"));
}

const char* resnet_arch_name(ResNetArch arch) {
  switch (arch) {
  case ResNetArch::resnet18: return "resnet18";
  case ResNetArch::resnet34: return "resnet34";
  case ResNetArch::resnet50: return "resnet50";
  }
  return "resnet";
}

void ResidualBlock::register_layers(std::initializer_list<std::pair<const char*, Module*>> layers,
                                    int64_t in_channels, int64_t out_channels, int stride,
                                    Rng& rng) {
  for (const auto& [name, layer] : layers) register_child(name, layer);
  if (stride == 1 && in_channels == out_channels) return;
  downsample = nn::downsample(in_channels, out_channels, stride, rng);
  register_child("downsample", downsample.get());
}

Var ResidualBlock::add_shortcut(const Var& out, const Var& x) {
  return ops::add(out, downsample ? (*downsample)(x) : x, /*relu=*/true);
}

BasicBlock::BasicBlock(int64_t in_channels, int64_t planes, int stride, Rng& rng)
    : conv1(in_channels, planes, 3, rng, stride, 1, false),
      conv2(planes, planes, 3, rng, 1, 1, false), bn1(planes), bn2(planes) {
  kaiming_normal_fan_out(conv1.weight, rng);
  kaiming_normal_fan_out(conv2.weight, rng);
  bn1.absorb_relu();
  bn1.take_statistics_from(conv1);
  bn2.take_statistics_from(conv2);
  register_layers({{"conv1", &conv1}, {"bn1", &bn1}, {"conv2", &conv2}, {"bn2", &bn2}}, in_channels,
                  planes * kExpansion, stride, rng);
}

// Here, in Bottleneck and in ResNet::features, each layer's output replaces its input, as in
// torchvision's `out = ...` lines: where no backward needs an activation (inference, a frozen
// backbone), it is freed once the next layer has read it.
Var BasicBlock::forward(const Var& x) {
  Var out = conv1(x);
  out = bn1(out);
  out = conv2(out);
  out = bn2(out);
  return add_shortcut(out, x);
}

std::string BasicBlock::describe() const {
  const Shape& s = conv1.weight.master().shape(); // [planes, 3, 3, in]
  return cat("BasicBlock(", s[3], " -> ", s[0], downsample ? ", downsample)" : ")");
}

Bottleneck::Bottleneck(int64_t in_channels, int64_t planes, int stride, Rng& rng)
    : conv1(in_channels, planes, 1, rng, 1, 0, false),
      conv2(planes, planes, 3, rng, stride, 1, false),
      conv3(planes, planes * kExpansion, 1, rng, 1, 0, false), bn1(planes), bn2(planes),
      bn3(planes * kExpansion) {
  for (Conv2d* conv : {&conv1, &conv2, &conv3}) kaiming_normal_fan_out(conv->weight, rng);
  bn1.absorb_relu();
  bn2.absorb_relu();
  bn1.take_statistics_from(conv1);
  bn2.take_statistics_from(conv2);
  bn3.take_statistics_from(conv3);
  register_layers({{"conv1", &conv1},
                   {"bn1", &bn1},
                   {"conv2", &conv2},
                   {"bn2", &bn2},
                   {"conv3", &conv3},
                   {"bn3", &bn3}},
                  in_channels, planes * kExpansion, stride, rng);
}

Var Bottleneck::forward(const Var& x) {
  Var out = conv1(x);
  out = bn1(out);
  out = conv2(out);
  if (fusion_enabled()) {
    // conv3 is 1x1: it applies bn2 (+ ReLU) as it loads its input where the kernels can.
    out = conv3.forward_normalized(std::move(out), bn2);
  } else {
    out = bn2(out);
    out = conv3(out);
  }
  out = bn3(out);
  return add_shortcut(out, x);
}

std::string Bottleneck::describe() const {
  const Shape &in = conv1.weight.master().shape(), &out = conv3.weight.master().shape();
  return cat("Bottleneck(", in[3], " -> ", in[0], " -> ", out[0],
             downsample ? ", downsample)" : ")");
}

ResNet::ResNet(const ResNetOptions& options, Rng& rng)
    : options_(options), conv1(3, options.width, 7, rng, 2, 3, false), bn1(options.width),
      maxpool(3, 2, 1), fc(num_features(options), options.num_classes, rng) {
  require(options.width > 0 && options.num_classes > 0, "ResNet",
          "width and num_classes must be positive, got ", options.width, " and ",
          options.num_classes);
  kaiming_normal_fan_out(conv1.weight, rng);
  bn1.absorb_relu();
  bn1.take_statistics_from(conv1);
  register_child("conv1", &conv1);
  register_child("bn1", &bn1);
  const std::array<Sequential*, 4> stages{&layer1, &layer2, &layer3, &layer4};
  const std::array<int, 4> blocks = stage_blocks(options.arch);
  int64_t channels = options.width;
  for (int i = 0; i < 4; ++i) {
    const int64_t planes = options.width << i;
    const int stride = i == 0 ? 1 : 2;
    if (options.arch == ResNetArch::resnet50)
      make_stage<Bottleneck>(*stages[i], channels, planes, blocks[i], stride, rng);
    else
      make_stage<BasicBlock>(*stages[i], channels, planes, blocks[i], stride, rng);
    register_child(cat("layer", i + 1), stages[i]);
  }
  register_child("fc", &fc);
}

int64_t ResNet::num_features(const ResNetOptions& options) {
  const int64_t expansion =
      options.arch == ResNetArch::resnet50 ? Bottleneck::kExpansion : BasicBlock::kExpansion;
  return 8 * options.width * expansion;
}

int64_t ResNet::output_side(int64_t image_side) {
  int64_t side = image_side;
  for (int halvings = 0; halvings < 5; ++halvings) side = (side + 1) / 2;
  return side;
}

Var ResNet::features(const Var& x) {
  Var h = conv1(x);
  h = bn1(h);
  h = maxpool(h);
  for (Sequential* stage : {&layer1, &layer2, &layer3, &layer4}) h = (*stage)(h);
  return avgpool(h);
}

Var ResNet::forward(const Var& x) { return fc(features(x)); }

std::string ResNet::describe() const {
  return cat(resnet_arch_name(options_.arch), "(", options_.num_classes, " classes",
             options_.width == 64 ? std::string() : cat(", width ", options_.width), ")");
}

} // namespace minamp::nn
