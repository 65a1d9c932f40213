// Parameter: a trainable weight as mixed precision keeps it — the fp32 master, its fp32
// gradient, and a 16-bit (f16 or bf16) working copy that layers read under autocast and that the
// optimizer rewrites in the same pass as the update.
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

  const Tensor& master() const { return master_; }
  Tensor& master() { return master_; }
  Tensor& grad() { return grad_; }
  const Tensor& grad() const { return grad_; }
  // The 16-bit copy (f16 or bf16); undefined until first asked for by working_copy.
  Tensor& half_copy() { return half_; }

  // The tensor a layer computes with: the master for f32, the 16-bit copy for f16 or bf16
  // (created from the master on first use, and anew when the other 16-bit format is asked for).
  const Tensor& working_copy(DType dtype);
  // Rewrites the 16-bit copy from the master (after changing the master by hand).
  void sync_half_copy();
  void zero_grad();
  // Moves master, gradient and copy to `device`.
  void to(Device device);

private:
  Tensor master_; // f32
  Tensor grad_;   // f32, same shape
  Tensor half_;   // f16 or bf16 copy of master_, or undefined
};

// Zeroes the gradients of all of `params` in one pass (kernels::zero_grads: one launch on the GPU
// for up to ~7.9 M values).
void zero_grads(const std::vector<Parameter*>& params);

} // namespace minamp
