// Frozen parameters (requires_grad false): no gradient, nothing recorded for a frozen prefix (so
// no activations kept), the trainable part's gradients unchanged, optimizers that take only the
// trainable parameters (no state, no update, no f16 refresh for the frozen), the loss scaler and
// checkpoints with a mix of both.
#include <gtest/gtest.h>

#include "amp/autocast.h"
#include "amp/diagnostics.h"
#include "amp/grad_scaler.h"
#include "io/checkpoint.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "test_io_util.h"
#include "test_util.h"

namespace minamp {
namespace {

using test::expect_error;

// Conv3x3(3->4)+BN+ReLU, Conv3x3/2(4->4)+BN+ReLU, GlobalAvgPool, Linear(4->5): a backbone of
// layers 0-5 and a classifier, layer 7.
std::unique_ptr<nn::Sequential> backbone_and_head(uint64_t seed) {
  Rng rng(seed);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Conv2d>(3, 4, 3, rng, 1, 1, false)
      .emplace<nn::BatchNorm>(4)
      .emplace<nn::ReLU>()
      .emplace<nn::Conv2d>(4, 4, 3, rng, 2, 1, false)
      .emplace<nn::BatchNorm>(4)
      .emplace<nn::ReLU>()
      .emplace<nn::GlobalAvgPool>()
      .emplace<nn::Linear>(4, 5, rng);
  return model;
}

nn::Linear& head(nn::Sequential& model) { return dynamic_cast<nn::Linear&>(model[7]); }

// Freezes every parameter but the classifier's.
void freeze_backbone(nn::Sequential& model) {
  model.requires_grad_(false);
  head(model).requires_grad_(true);
}

Var loss_of(nn::Sequential& model, const Tensor& images) {
  const Tensor labels = Tensor::from_vector({1, 4}, {2}, DType::i32);
  return ops::cross_entropy(model(Var(images)), labels);
}

TEST(Frozen, AFrozenParameterHasNoGradientAndUnfreezingGivesAZeroOne) {
  Parameter p(Tensor::full({3}, 2.0f));
  p.requires_grad_(false);
  EXPECT_FALSE(p.requires_grad());
  EXPECT_FALSE(p.grad().defined());
  p.zero_grad(); // nothing to zero
  p.requires_grad_(true);
  EXPECT_EQ(p.grad().to_vector(), std::vector<float>(3, 0.0f));
}

TEST(Frozen, AFrozenPrefixRecordsNothingAndKeepsNoActivations) {
  Rng rng(1);
  const Tensor images = test::random_tensor(rng, {2, 6, 6, 3});
  Allocator& allocator = allocator_for(Device::cpu);
  auto bytes_kept_by_forward = [&](nn::Sequential& model) {
    const size_t before = allocator.live_bytes();
    const Var logits = model(Var(images));
    return allocator.live_bytes() - before; // the graph and the logits
  };
  auto trainable = backbone_and_head(2), frozen = backbone_and_head(2);
  freeze_backbone(*frozen);
  const size_t all_kept = bytes_kept_by_forward(*trainable);
  // What is left: the pooled features [2, 4] the classifier saves, and the logits [2, 5].
  EXPECT_EQ(bytes_kept_by_forward(*frozen), (2 * 4 + 2 * 5) * sizeof(float));
  EXPECT_GT(all_kept, 10 * (2 * 4 + 2 * 5) * sizeof(float)) << "activations of every layer";

  frozen->requires_grad_(false); // nothing trainable at all: no graph
  EXPECT_FALSE((*frozen)(Var(images)).requires_grad());
}

TEST(Frozen, TheTrainablePartGetsTheSameGradientsAndTheFrozenNone) {
  Rng rng(3);
  const Tensor images = test::random_tensor(rng, {2, 6, 6, 3});
  auto all = backbone_and_head(4), part = backbone_and_head(4);
  freeze_backbone(*part);
  loss_of(*all, images).backward();
  loss_of(*part, images).backward();
  EXPECT_EQ(head(*part).weight.grad().to_vector(), head(*all).weight.grad().to_vector());
  EXPECT_EQ(head(*part).bias.grad().to_vector(), head(*all).bias.grad().to_vector());
  for (auto& [name, p] : part->named_parameters())
    EXPECT_EQ(p->grad().defined(), name.rfind("7.", 0) == 0) << name;
}

TEST(Frozen, AFrozenBatchNormBetweenTrainableLayersPassesTheGradientOn) {
  Rng rng(5);
  const Tensor images = test::random_tensor(rng, {2, 6, 6, 3});
  auto all = backbone_and_head(6), part = backbone_and_head(6);
  for (int frozen_bn : {1, 4}) (*part)[size_t(frozen_bn)].requires_grad_(false);
  loss_of(*all, images).backward();
  loss_of(*part, images).backward();
  auto& conv_all = dynamic_cast<nn::Conv2d&>((*all)[0]);
  auto& conv_part = dynamic_cast<nn::Conv2d&>((*part)[0]);
  EXPECT_EQ(conv_part.weight.grad().to_vector(), conv_all.weight.grad().to_vector());
}

TEST(Frozen, OptimizersTakeOnlyTheTrainableParameters) {
  Rng rng(7);
  const Tensor images = test::random_tensor(rng, {2, 6, 6, 3});
  auto model = backbone_and_head(8);
  freeze_backbone(*model);
  Parameter& frozen_conv = dynamic_cast<nn::Conv2d&>((*model)[0]).weight;
  const std::vector<float> frozen_before = frozen_conv.master().to_vector();
  const std::vector<float> half_before = frozen_conv.working_copy(DType::f16).to_vector();
  const std::vector<float> head_before = head(*model).weight.master().to_vector();

  optim::Adam adam(model->parameters(), 0.1f);
  EXPECT_EQ(adam.params().size(), 2u);
  EXPECT_EQ(adam.named_state().size(), 5u) << "step, and two moments per trainable parameter";
  amp::GradScaler scaler(amp::GradScalerOptions{}, Device::cpu);
  adam.zero_grad();
  {
    amp::Autocast autocast(true);
    scaler.scale(loss_of(*model, images)).backward();
  }
  scaler.step(adam);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 65536.0f) << "the unscaled gradients were finite";
  EXPECT_EQ(frozen_conv.master().to_vector(), frozen_before);
  EXPECT_EQ(frozen_conv.half_copy().to_vector(), half_before);
  EXPECT_NE(head(*model).weight.master().to_vector(), head_before);
  model->zero_grad();
}

TEST(Frozen, OptimizersRefuseNothingToTrainAndAParameterFrozenLater) {
  auto model = backbone_and_head(9);
  model->requires_grad_(false);
  expect_error([&] { optim::SGD sgd(model->parameters(), 0.1f); }, "Optimizer",
               "every one of the 8 parameters is frozen (requires_grad false)");
  expect_error([&] { optim::clip_grad_norm_(model->parameters(), 1.0f); }, "clip_grad_norm_",
               "every one of the 8 parameters is frozen");
  model->requires_grad_(true);
  optim::SGD sgd(model->parameters(), 0.1f);
  head(*model).bias.requires_grad_(false);
  expect_error([&] { sgd.step(); }, "Optimizer", "parameter 7 was frozen after the optimizer");
}

TEST(Frozen, ClippingAndDiagnosticsLeaveTheFrozenOut) {
  Rng rng(10);
  const Tensor images = test::random_tensor(rng, {2, 6, 6, 3});
  auto model = backbone_and_head(11);
  freeze_backbone(*model);
  loss_of(*model, images).backward();
  const float head_sq =
      optim::clip_grad_norm_({&head(*model).weight, &head(*model).bias}, 1e9f).item();
  EXPECT_EQ(optim::clip_grad_norm_(model->parameters(), 1e9f).item(), head_sq);
  const auto reports = amp::weight_gradient_report(model->named_parameters(), 1.0f, 1.0f);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].name, "7.weight");
  EXPECT_EQ(amp::first_nonfinite_parameter(model->named_parameters()), "");
}

TEST(Frozen, CheckpointsHoldTheFrozenWeightsAndTheTrainablesState) {
  test::TempDir dir;
  Rng rng(12);
  const Tensor images = test::random_tensor(rng, {2, 6, 6, 3});
  auto source = backbone_and_head(13);
  freeze_backbone(*source);
  optim::Adam adam(source->parameters(), 0.01f);
  amp::GradScaler scaler(amp::GradScalerOptions{}, Device::cpu);
  scaler.scale(loss_of(*source, images)).backward();
  scaler.step(adam);
  scaler.update();
  const std::string path = dir.path("ckpt.safetensors");
  io::TrainingState state;
  state.step = 1;
  io::save_training_checkpoint(path, *source, adam, scaler, state);

  auto target = backbone_and_head(14);
  freeze_backbone(*target);
  optim::Adam target_adam(target->parameters(), 0.01f);
  amp::GradScaler target_scaler(amp::GradScalerOptions{}, Device::cpu);
  io::load_training_checkpoint(path, *target, target_adam, target_scaler);
  for (size_t i = 0; i < 8; ++i)
    EXPECT_EQ(target->parameters()[i]->master().to_vector(),
              source->parameters()[i]->master().to_vector())
        << "parameter " << i;
  auto named = target_adam.named_state();
  auto source_named = adam.named_state();
  ASSERT_EQ(named.size(), 5u);
  for (size_t i = 0; i < named.size(); ++i)
    EXPECT_EQ(named[i].second->to_vector(), source_named[i].second->to_vector()) << named[i].first;
}

} // namespace
} // namespace minamp
