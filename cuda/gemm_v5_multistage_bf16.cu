// GEMM v5 (gemm_v5_multistage.cu) on bf16 matrices: the kernels of the matrix/transposed operand
// pairs of bf16, instantiated in a file of their own (gemm_v5.cuh) so that they compile beside
// v5's other parts.
#include "gemm_v5.cuh"

namespace minamp::gpu {

void gemm_v5_multistage_bf16(const GemmArgs& args) {
  dispatch_operands<__nv_bfloat16, GemmLaunch<V5Family>::On, OperandPairs::matrices>(
      args, V5Family::kName);
}

} // namespace minamp::gpu
