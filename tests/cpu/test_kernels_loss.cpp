// Tests of the CPU loss kernels: mean squared error and softmax cross-entropy, forward against
// double references (including logits large enough to overflow a naive exp), backward by finite
// differences, f16 inputs, and the errors for bad labels and shapes.
#include "kernels/kernels.h"
#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

constexpr double kF32Tolerance = 1e-6;
constexpr double kGradientTolerance = 1e-4;

double mse_reference(const Doubles& pred, const Doubles& target) {
  double sum = 0.0;
  for (size_t i = 0; i < pred.size(); ++i) sum += (pred[i] - target[i]) * (pred[i] - target[i]);
  return sum / static_cast<double>(pred.size());
}

// mean over rows of log(sum_k exp(z_k)) - z_label, with the row max taken out first.
double cross_entropy_reference(const Doubles& logits, const std::vector<int>& labels,
                               int64_t classes) {
  double total = 0.0;
  for (size_t r = 0; r < labels.size(); ++r) {
    const double* row = logits.data() + r * classes;
    const double max = *std::max_element(row, row + classes);
    double sum = 0.0;
    for (int64_t k = 0; k < classes; ++k) sum += std::exp(row[k] - max);
    total += max + std::log(sum) - row[labels[r]];
  }
  return total / static_cast<double>(labels.size());
}

std::vector<int> random_labels(Rng& rng, int64_t rows, int64_t classes) {
  std::vector<int> labels(static_cast<size_t>(rows));
  for (int& label : labels) label = static_cast<int>(rng.below(static_cast<uint32_t>(classes)));
  return labels;
}

Tensor labels_tensor(const std::vector<int>& labels) {
  return Tensor::from_vector(std::vector<float>(labels.begin(), labels.end()),
                             {static_cast<int64_t>(labels.size())}, DType::i32);
}

TEST(CpuMse, ForwardAndBackwardMatchReference) {
  Rng rng(51);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor pred = random_tensor(rng, {9, 17}, dtype);
    const Tensor target = random_tensor(rng, {9, 17});
    Tensor loss = poisoned({1});
    cpu::mse_forward(pred, target, loss);
    const Doubles p0 = to_doubles(pred), t0 = to_doubles(target);
    EXPECT_LT(relative_error_to(loss, {mse_reference(p0, t0)}), kF32Tolerance) << dtype;

    const Tensor dloss = Tensor::from_vector({1.75f}, {1}); // the upstream gradient
    Tensor dpred = poisoned({9, 17});
    cpu::mse_backward(pred, target, dloss, dpred);
    Doubles num = numerical_gradient([&](const Doubles& v) { return mse_reference(v, t0); }, p0);
    for (double& g : num) g *= 1.75;
    EXPECT_LT(relative_error_to(dpred, num), kGradientTolerance) << dtype;
  }
  Tensor loss = poisoned({1});
  expect_error([&] { cpu::mse_forward(Tensor::zeros({3}), Tensor::zeros({4}), loss); },
               "mse_forward", "same number of elements");
}

TEST(CpuCrossEntropy, ForwardMatchesReferenceEvenForHugeLogits) {
  Rng rng(52);
  for (const auto& [rows, classes, offset] : {std::tuple<int64_t, int64_t, float>{1, 1, 0.0f},
                                              {7, 10, 0.0f},
                                              {16, 33, 200.0f}}) { // exp(200+) overflows float
    const Tensor logits =
        random_tensor(rng, {rows, classes}, DType::f32, Device::cpu, offset - 3, offset + 3);
    const std::vector<int> labels = random_labels(rng, rows, classes);
    Tensor loss = poisoned({1});
    cpu::cross_entropy_forward(logits, labels_tensor(labels), loss);
    const double ref = cross_entropy_reference(to_doubles(logits), labels, classes);
    // One class: the loss is exactly 0, so compare absolutely.
    EXPECT_NEAR(loss.item(), ref, kF32Tolerance * std::max(1.0, std::fabs(ref)))
        << rows << "x" << classes;
  }
}

TEST(CpuCrossEntropy, BackwardMatchesFiniteDifferences) {
  Rng rng(53);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const int64_t rows = 6, classes = 11;
    const Tensor logits = random_tensor(rng, {rows, classes}, dtype, Device::cpu, -3.0f, 3.0f);
    const std::vector<int> labels = random_labels(rng, rows, classes);
    const Tensor dloss = Tensor::from_vector({0.5f}, {1});
    Tensor dlogits = poisoned({rows, classes}); // f32 even for f16 logits
    cpu::cross_entropy_backward(logits, labels_tensor(labels), dloss, dlogits);
    Doubles num = numerical_gradient(
        [&](const Doubles& v) { return cross_entropy_reference(v, labels, classes); },
        to_doubles(logits));
    for (double& g : num) g *= 0.5;
    EXPECT_LT(relative_error_to(dlogits, num), kGradientTolerance) << dtype;
  }
}

TEST(CpuCrossEntropy, RejectsLabelsOutOfRangeNamingRowLabelAndK) {
  const Tensor logits = Tensor::full({3, 4}, 0.5f);
  const Tensor labels = Tensor::from_vector({0, 3, 4}, {3}, DType::i32);
  Tensor loss = poisoned({1});
  expect_error([&] { cpu::cross_entropy_forward(logits, labels, loss); }, "cross_entropy_forward",
               "label 4 of row 2 is outside [0, 4)");
  const Tensor negative = Tensor::from_vector({-1, 0, 0}, {3}, DType::i32);
  Tensor dlogits = poisoned({3, 4});
  expect_error(
      [&] { cpu::cross_entropy_backward(logits, negative, Tensor::full({1}, 1.0f), dlogits); },
      "cross_entropy_backward", "label -1 of row 0");
  const Tensor four_labels = Tensor::from_vector({0, 1, 2, 3}, {4}, DType::i32);
  expect_error([&] { cpu::cross_entropy_forward(logits, four_labels, loss); },
               "cross_entropy_forward",
               "expects labels i32 [3] for logits f32[3, 4] on cpu, got i32[4]");
  const Tensor float_labels = Tensor::zeros({3});
  expect_error([&] { cpu::cross_entropy_forward(logits, float_labels, loss); },
               "cross_entropy_forward", "labels i32 [3]");
  expect_error([&] { cpu::cross_entropy_forward(Tensor::zeros({12}), labels, loss); },
               "cross_entropy_forward", "expects logits [N, K]");
}

} // namespace
} // namespace minamp::test
