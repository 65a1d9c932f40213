// A narrow ResNet-18 and ResNet-50 on the GPU against the CPU from the same weights and batch:
// the training-mode logits and loss, and the gradients of layers at the start, in a shortcut and
// at the end of the network, in FP32 and under autocast. The GPU runs with every BatchNorm taking
// its statistics from the convolution before it, and each Bottleneck's 1x1 conv3 applying bn2 as
// it loads where its GEMMs are not thin (layer3 and layer4 at width 4; the CPU never fuses); a
// last test checks that the blocks link their pairs and that the fused step matches
// nn::set_fusion(false).
#include <gtest/gtest.h>

#include "amp/autocast.h"
#include "nn/resnet.h"
#include "ops/ops.h"
#include "test_util.h"

namespace minamp {
namespace {

struct Pass {
  Tensor logits, loss;
  std::vector<Tensor> grads; // conv1.weight, layer2.0.downsample.0.weight, fc.weight
};

// One forward and backward pass of a fresh ResNet (weights from a fixed seed) on `device`.
Pass run_on(Device device, nn::ResNetArch arch, bool amp) {
  Rng rng(5);
  nn::ResNetOptions options;
  options.arch = arch;
  options.width = 4;
  options.num_classes = 5;
  nn::ResNet model(options, rng);
  model.to(device);
  Rng data(6);
  const Tensor images = test::random_tensor(data, {4, 64, 64, 3}, DType::f32, device);
  const Tensor labels = Tensor::from_vector({1, 4, 0, 2}, {4}, DType::i32, device);
  Var logits, loss;
  {
    amp::Autocast autocast(amp);
    logits = model(Var(images));
    loss = ops::cross_entropy(logits, labels);
  }
  loss.backward();
  Pass pass{logits.value().to(Device::cpu), loss.value().to(Device::cpu), {}};
  const auto named = model.named_parameters();
  for (const char* wanted : {"conv1.weight", "layer2.0.downsample.0.weight", "fc.weight"})
    for (const auto& [name, p] : named)
      if (name == wanted) pass.grads.push_back(p->grad().to(Device::cpu));
  return pass;
}

void expect_same_pass(nn::ResNetArch arch, bool amp) {
  SCOPED_TRACE(cat(nn::resnet_arch_name(arch), amp ? " AMP" : " FP32"));
  const Pass gpu = run_on(Device::cuda, arch, amp), cpu = run_on(Device::cpu, arch, amp);
  // FP32: summation order only, through 20 to 50 layers. AMP: f16 activations and gradients,
  // where a value near a rounding tie goes either way on each device (the emulator's tensor cores
  // round down, the CPU to nearest) and the difference grows on its way back through BatchNorms
  // of 4 to 32 channels: by the first layers' weight gradients it is tens of percent, so AMP
  // compares the forward pass and fc's gradient only.
  const double tolerance = amp ? 5e-2 : 1e-4;
  test::expect_close(gpu.logits, cpu.logits, tolerance, "logits");
  test::expect_close(gpu.loss, cpu.loss, tolerance, "loss");
  ASSERT_EQ(gpu.grads.size(), 3u);
  for (size_t i = amp ? 2 : 0; i < gpu.grads.size(); ++i)
    test::expect_close(gpu.grads[i], cpu.grads[i], amp ? 5e-2 : 1e-3, cat("gradient ", i));
}

TEST(GpuResNet, ResNet18StepMatchesTheCpu) {
  MINAMP_REQUIRE_GPU();
  expect_same_pass(nn::ResNetArch::resnet18, false);
  expect_same_pass(nn::ResNetArch::resnet18, true);
}

TEST(GpuResNet, ResNet50StepMatchesTheCpu) {
  MINAMP_REQUIRE_GPU();
  expect_same_pass(nn::ResNetArch::resnet50, false);
  expect_same_pass(nn::ResNetArch::resnet50, true);
}

// Whether `conv`, run in training mode on x, hands its output's batch moments over: it does when
// a BatchNorm takes its statistics from it.
bool produces_moments(nn::Conv2d& conv, const Tensor& x) {
  const Tensor y = conv(Var(x)).value();
  return conv.take_batch_moments(y).defined();
}

TEST(GpuResNet, BatchNormsTakeTheirStatisticsFromTheConvBeforeThem) {
  MINAMP_REQUIRE_GPU();
  Rng rng(7);
  test::ScopedFusion on(true);
  for (nn::ResNetArch arch : {nn::ResNetArch::resnet18, nn::ResNetArch::resnet50}) {
    SCOPED_TRACE(nn::resnet_arch_name(arch));
    nn::ResNetOptions options;
    options.arch = arch;
    options.width = 4;
    options.num_classes = 5;
    nn::ResNet model(options, rng);
    model.to(Device::cuda);
    model.train();
    EXPECT_TRUE(produces_moments(
        model.conv1, test::random_tensor(rng, {2, 16, 16, 3}, DType::f32, Device::cuda)));
    const Tensor x = test::random_tensor(rng, {2, 8, 8, 4}, DType::f32, Device::cuda);
    if (arch == nn::ResNetArch::resnet50) {
      auto& block = dynamic_cast<nn::Bottleneck&>(model.layer1[0]);
      EXPECT_TRUE(produces_moments(block.conv1, x));
      const Tensor mid = test::random_tensor(rng, {2, 8, 8, 4}, DType::f32, Device::cuda);
      EXPECT_TRUE(produces_moments(block.conv2, mid));
      EXPECT_TRUE(produces_moments(block.conv3, mid));
    } else {
      auto& block = dynamic_cast<nn::BasicBlock&>(model.layer1[0]);
      EXPECT_TRUE(produces_moments(block.conv1, x));
      EXPECT_TRUE(produces_moments(block.conv2, x));
    }
  }
  // The whole step, fused and not: the same up to the summation order of the statistics.
  const Pass fused = run_on(Device::cuda, nn::ResNetArch::resnet50, false);
  Pass unfused;
  {
    test::ScopedFusion off(false);
    unfused = run_on(Device::cuda, nn::ResNetArch::resnet50, false);
  }
  test::expect_close(fused.logits, unfused.logits, 1e-4, "logits");
  test::expect_close(fused.loss, unfused.loss, 1e-4, "loss");
  ASSERT_EQ(fused.grads.size(), 3u);
  for (size_t i = 0; i < fused.grads.size(); ++i)
    test::expect_close(fused.grads[i], unfused.grads[i], 1e-3, cat("gradient ", i));
}

} // namespace
} // namespace minamp
