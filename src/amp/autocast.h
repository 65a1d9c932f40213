// Autocast: the mixed-precision op policy, one readable table, switched on by an RAII scope —
// the shape of torch.autocast, including its `dtype`: the low precision is f16 (IEEE binary16,
// with loss scaling) or bf16 (bfloat16, float's range, usually without). Ops ask
// `autocast_dtype(OpClass)` which dtype to compute in.
#pragma once

#include "core/dtype.h"

namespace minamp::amp {

// How an op behaves under autocast.
enum class OpClass {
  matmul,    // Linear, Conv2d, GEMM: 16-bit operands, fp32 accumulation, 16-bit result
  normalize, // BatchNorm: takes and returns 16-bit, fp32 statistics and affine parameters
  keep,      // ReLU, pooling, reshape: compute in the input's dtype
  fp32,      // MSE, softmax, cross-entropy, sums: upcast to fp32
};

// The policy table, written out (low = the scope's dtype, f16 or bf16):
//
//   op class    | autocast off | autocast on
//   ------------+--------------+-------------------------------------------------
//   matmul      | f32          | low in, fp32 accumulate, low out
//   normalize   | input dtype  | low in/out, fp32 statistics, fp32 gamma/beta
//   keep        | input dtype  | input dtype
//   fp32        | f32          | f32 (inputs upcast)
//
// The dtype an op of `op_class` computes in for an input of `input_dtype`.
DType autocast_dtype(OpClass op_class, DType input_dtype);

// True while an enabled Autocast scope is alive on this thread.
bool autocast_enabled();

// RAII scope: `amp::Autocast autocast(use_amp, DType::bf16);` around the forward pass and the
// loss (torch.autocast("cuda", dtype=torch.bfloat16)). `dtype` must be f16 or bf16.
class Autocast {
public:
  explicit Autocast(bool enabled = true, DType dtype = DType::f16);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

private:
  bool previous_enabled_;
  DType previous_dtype_;
};

} // namespace minamp::amp
