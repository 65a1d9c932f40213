// Parameter: a trainable weight as mixed precision keeps it — the fp32 master, its fp32
// gradient, and a 16-bit (f16 or bf16) working copy that layers read under autocast and that the
// optimizer rewrites in the same pass as the update. A frozen parameter (requires_grad_(false))
// has no gradient: ops record nothing for it, optimizers do not take it, its 16-bit copy is made
// once.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace minamp {

class Parameter {
public:
  Parameter() = default;
  // Takes an f32 master; the gradient starts at zero.
  explicit Parameter(Tensor master);

  // Whether backward computes this parameter's gradient (PyTorch's requires_grad).
  bool requires_grad() const { return trainable_; }
  // Freezes (false: the gradient is freed) or unfreezes (true: a zero gradient) the parameter.
  // Optimizers take the parameters that require grad when they are made.
  void requires_grad_(bool requires_grad);

  const Tensor& master() const { return master_; }
  Tensor& master() { return master_; }
  Tensor& grad() { return grad_; } // undefined when frozen
  const Tensor& grad() const { return grad_; }
  // The 16-bit copy (f16 or bf16); undefined until first asked for by working_copy.
  Tensor& half_copy() { return half_; }

  // The tensor a layer computes with: the master for f32, the 16-bit copy for f16 or bf16
  // (created from the master on first use, and anew when the other 16-bit format is asked for).
  const Tensor& working_copy(DType dtype);
  // Rewrites the 16-bit copy from the master (after changing the master by hand).
  void sync_half_copy();
  void zero_grad(); // nothing to do when frozen
  // Moves master, gradient and copy to `device`.
  void to(Device device);

private:
  Tensor master_;         // f32
  Tensor grad_;           // f32, same shape; undefined when frozen
  Tensor half_;           // f16 or bf16 copy of master_, or undefined
  bool trainable_ = true; // requires_grad()
};

// Zeroes the gradients of all of `params` (the frozen have none) in one pass (kernels::zero_grads:
// one launch on the GPU for up to ~7.9 M values).
void zero_grads(const std::vector<Parameter*>& params);

} // namespace minamp
