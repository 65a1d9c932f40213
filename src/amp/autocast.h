// Autocast: the mixed-precision op policy, one readable table, switched on by an RAII scope —
// the shape of torch.autocast. Ops ask `autocast_dtype(OpClass)` which dtype to compute in.
#pragma once

#include "core/dtype.h"

namespace minamp::amp {

// How an op behaves under autocast.
enum class OpClass {
  matmul,    // Linear, Conv2d, GEMM: f16 operands, fp32 accumulation, f16 result
  normalize, // BatchNorm: takes and returns f16, fp32 statistics and affine parameters
  keep,      // ReLU, pooling, reshape: compute in the input's dtype
  fp32,      // MSE, softmax, cross-entropy, sums: upcast to fp32
};

// The policy table, written out:
//
//   op class    | autocast off | autocast on (f16)
//   ------------+--------------+-------------------------------------------------
//   matmul      | f32          | f16 in, fp32 accumulate, f16 out
//   normalize   | input dtype  | f16 in/out, fp32 statistics, fp32 gamma/beta
//   keep        | input dtype  | input dtype
//   fp32        | f32          | f32 (inputs upcast)
//
// The dtype an op of `op_class` computes in for an input of `input_dtype`.
DType autocast_dtype(OpClass op_class, DType input_dtype);

// True while an enabled Autocast scope is alive on this thread.
bool autocast_enabled();

// RAII scope: `amp::Autocast autocast(use_amp);` around the forward pass and the loss.
class Autocast {
public:
  explicit Autocast(bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

private:
  bool previous_;
};

} // namespace minamp::amp
