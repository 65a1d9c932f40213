// torchvision's ResNet-18 and -34 (BasicBlock) and ResNet-50 (Bottleneck with the stride on its
// 3x3 conv, torchvision's "v1.5"), built from minamp's layers and named as torchvision's
// state_dict: "conv1.weight", "bn1.running_mean", "layer1.0.conv1.weight",
// "layer2.0.downsample.0.weight", "fc.bias", ... So torchvision's weights, saved with
// safetensors' save_file(model.state_dict(), path), load strictly (io::load_weights), and minamp's
// saved weights load back into torchvision. Input [N, H, W, 3] (channels last; PyTorch's NCHW
// image with the same values), output logits [N, num_classes].
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include "nn/module.h"

namespace minamp::nn {

enum class ResNetArch { resnet18, resnet34, resnet50 };

// "resnet18", "resnet34" or "resnet50"; an Error naming the choices otherwise.
ResNetArch parse_resnet_arch(const std::string& name);
const char* resnet_arch_name(ResNetArch arch);

struct ResNetOptions {
  ResNetArch arch = ResNetArch::resnet50;
  int64_t num_classes = 1000;
  // Channels of the stem and of layer1; layers 2-4 have 2, 4 and 8 times as many (torchvision:
  // 64). A narrower network keeps the structure and the names with smaller tensors.
  int64_t width = 64;
};

// What the blocks share: the shortcut, x itself or downsample(x) where the block changes the size
// or the channels, added to the block's output before the last ReLU.
class ResidualBlock : public Module {
public:
  std::unique_ptr<Sequential> downsample; // conv1x1(stride) BN, or null

protected:
  // Registers `layers` under their torchvision names, then the downsample shortcut when the block
  // maps in_channels to another number of channels or has a stride.
  void register_layers(std::initializer_list<std::pair<const char*, Module*>> layers,
                       int64_t in_channels, int64_t out_channels, int stride, Rng& rng);
  // relu(out + shortcut(x)).
  Var add_shortcut(const Var& out, const Var& x);
};

// conv3x3(stride) BN ReLU, conv3x3 BN, + x (or downsample(x) where the shape changes), ReLU.
class BasicBlock : public ResidualBlock {
public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in_channels, int64_t planes, int stride, Rng& rng);
  Var forward(const Var& x) override;
  std::string describe() const override;

  Conv2d conv1, conv2;
  BatchNorm bn1, bn2;
};

// conv1x1 BN ReLU, conv3x3(stride) BN ReLU, conv1x1 (to 4 x planes) BN, + x (or downsample(x)),
// ReLU. While fusion_enabled(), the second BN (+ ReLU) is applied by conv3 as it loads its input
// (Conv2d::forward_normalized).
class Bottleneck : public ResidualBlock {
public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in_channels, int64_t planes, int stride, Rng& rng);
  Var forward(const Var& x) override;
  std::string describe() const override;

  Conv2d conv1, conv2, conv3;
  BatchNorm bn1, bn2, bn3;
};

// conv1 (7x7, stride 2) bn1 ReLU maxpool (3x3, stride 2), layer1-4 (layer2-4 halve the size),
// global average pooling, fc. Initialised as torchvision: convs kaiming_normal_(fan_out, relu),
// BatchNorm weight 1 and bias 0, fc PyTorch's Linear default. To train the classifier alone:
// requires_grad_(false), then fc.requires_grad_(true).
class ResNet : public Module {
  ResNetOptions options_; // first: the layers below are built from it

public:
  ResNet(const ResNetOptions& options, Rng& rng);
  // logits [N, num_classes] = fc(features(x)).
  Var forward(const Var& x) override;
  // The pooled output of the backbone (every layer before fc): [N, num_features()].
  Var features(const Var& x);
  std::string describe() const override;
  const ResNetOptions& options() const { return options_; }
  // The width of the features fc reads: 8 x width x the block's expansion.
  int64_t num_features() const { return num_features(options_); }
  static int64_t num_features(const ResNetOptions& options);
  // The side of layer4's output (what its batch norms see per image) for square images of side
  // `image_side`: the stem's conv and max pool and the first blocks of layers 2-4 each halve it,
  // rounding up (stride 2, "same" padding).
  static int64_t output_side(int64_t image_side);

  Conv2d conv1;
  BatchNorm bn1;
  MaxPool2d maxpool;
  Sequential layer1, layer2, layer3, layer4;
  GlobalAvgPool avgpool;
  Linear fc;
};

} // namespace minamp::nn
