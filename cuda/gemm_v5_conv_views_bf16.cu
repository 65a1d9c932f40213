// GEMM v5 (gemm_v5_multistage.cu) on a convolution's views of bf16: the kernels whose A or B is an
// im2col, col2im or normalised operand, instantiated in a file of their own (gemm_v5.cuh) so that
// they compile beside v5's other parts.
#include "gemm_v5.cuh"

namespace minamp::gpu {

void gemm_v5_conv_views_bf16(const GemmArgs& args) {
  dispatch_operands<__nv_bfloat16, GemmLaunch<V5Family>::On, OperandPairs::conv_views>(
      args, V5Family::kName);
}

} // namespace minamp::gpu
