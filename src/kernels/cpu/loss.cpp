// CPU reference of the losses, computed in fp32 (sums in double) whatever the input dtype:
// mean squared error and softmax cross-entropy (log-sum-exp with the row max subtracted).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

// The label of `row`, checked to lie in [0, K).
int64_t checked_label(const char* op, const int32_t* labels, int64_t row, const LogitDims& d) {
  const int32_t label = labels[row];
  require(label >= 0 && label < d.classes, op, "label ", label, " of row ", row, " is outside [0, ",
          d.classes, ") (K = ", d.classes, ")");
  return label;
}

// softmax(row)[K] into probs; returns log(sum(exp(row - max(row)))), so that
// -log softmax(row)[k] = that + (max - row[k]), with no exp that can overflow.
double softmax_row(const float* row, int64_t classes, float* probs) {
  const float max = *std::max_element(row, row + classes);
  double sum = 0.0;
  for (int64_t k = 0; k < classes; ++k) {
    probs[k] = std::exp(row[k] - max);
    sum += probs[k];
  }
  for (int64_t k = 0; k < classes; ++k) probs[k] = static_cast<float>(probs[k] / sum);
  return std::log(sum);
}

} // namespace

void mse_forward(const Tensor& pred, const Tensor& target, Tensor& loss) {
  require_mse_forward(pred, target, loss);
  const FloatInput p(pred), t(target);
  double sum = 0.0;
  for (int64_t i = 0; i < p.size(); ++i) {
    const float diff = p[i] - t[i];
    sum += static_cast<double>(diff) * diff;
  }
  loss.data<float>()[0] = static_cast<float>(sum / static_cast<double>(p.size()));
}

void mse_backward(const Tensor& pred, const Tensor& target, const Tensor& dloss, Tensor& dpred) {
  require_mse_backward(pred, target, dloss, dpred);
  const FloatInput p(pred), t(target);
  const float factor = dloss.data<float>()[0] * 2.0f / static_cast<float>(p.size());
  FloatOutput grad(dpred, false);
  for (int64_t i = 0; i < p.size(); ++i) grad[i] = factor * (p[i] - t[i]);
  grad.store();
}

void cross_entropy_forward(const Tensor& logits, const Tensor& labels, Tensor& loss) {
  const char* op = "cross_entropy_forward";
  const LogitDims d = require_cross_entropy_forward(logits, labels, loss);
  const FloatInput z(logits);
  const int32_t* y = labels.data<int32_t>();
  std::vector<float> probs(static_cast<size_t>(d.classes));
  double sum = 0.0;
  for (int64_t r = 0; r < d.rows; ++r) {
    const int64_t label = checked_label(op, y, r, d);
    const float* row = z.data() + r * d.classes;
    const float max = *std::max_element(row, row + d.classes);
    sum += softmax_row(row, d.classes, probs.data()) + (max - row[label]); // -log softmax[label]
  }
  loss.data<float>()[0] = static_cast<float>(sum / static_cast<double>(d.rows));
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& dloss,
                            Tensor& dlogits) {
  const char* op = "cross_entropy_backward";
  const LogitDims d = require_cross_entropy_backward(logits, labels, dloss, dlogits);
  const FloatInput z(logits);
  const int32_t* y = labels.data<int32_t>();
  const float factor = dloss.data<float>()[0] / static_cast<float>(d.rows);
  FloatOutput grad(dlogits, false);
  for (int64_t r = 0; r < d.rows; ++r) {
    const int64_t label = checked_label(op, y, r, d);
    float* grad_row = grad.data() + r * d.classes;
    softmax_row(z.data() + r * d.classes, d.classes, grad_row);
    grad_row[label] -= 1.0f;
    for (int64_t k = 0; k < d.classes; ++k) grad_row[k] *= factor;
  }
  grad.store();
}

} // namespace minamp::cpu
