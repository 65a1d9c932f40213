// Losses as differentiable ops: inputs are upcast to fp32 (autocast's fp32 class), the loss
// is an fp32 scalar.
#include "amp/autocast.h"
#include "core/error.h"
#include "ops/ops.h"

namespace minamp::ops {

Var mse_loss(const Var& pred, const Tensor& target) {
  require(pred.shape() == target.shape(), "mse_loss", "prediction ", describe(pred.value()),
          " and target ", describe(target), " differ in shape");
  Var p = cast(pred, amp::autocast_dtype(amp::OpClass::fp32, pred.dtype()));
  Tensor loss = Tensor::empty({1}, DType::f32, pred.device());
  kernels::mse_forward(p.value(), target, loss);
  const Tensor saved_pred = p.value();
  return Var::from_op("mse_loss", loss, {p}, false, [saved_pred, target](Node& self) {
    Tensor dpred = Tensor::empty(saved_pred.shape(), saved_pred.dtype(), saved_pred.device());
    kernels::mse_backward(saved_pred, target, self.grad, dpred);
    accumulate_grad(*self.inputs[0], dpred);
  });
}

Var cross_entropy(const Var& logits, const Tensor& labels) {
  require(logits.shape().rank() == 2 && labels.dtype() == DType::i32 &&
              labels.numel() == logits.shape()[0],
          "cross_entropy", "expected logits [N, K] and i32 labels [N], got ",
          describe(logits.value()), " and ", describe(labels));
  Var l = cast(logits, amp::autocast_dtype(amp::OpClass::fp32, logits.dtype()));
  Tensor loss = Tensor::empty({1}, DType::f32, logits.device());
  kernels::cross_entropy_forward(l.value(), labels, loss);
  const Tensor saved_logits = l.value();
  return Var::from_op("cross_entropy", loss, {l}, false, [saved_logits, labels](Node& self) {
    Tensor dlogits =
        Tensor::empty(saved_logits.shape(), saved_logits.dtype(), saved_logits.device());
    kernels::cross_entropy_backward(saved_logits, labels, self.grad, dlogits);
    accumulate_grad(*self.inputs[0], dlogits);
  });
}

} // namespace minamp::ops
