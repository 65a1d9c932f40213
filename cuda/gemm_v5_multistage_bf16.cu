// GEMM v5 (gemm_v5_multistage.cu) for bf16 operands: its kernels instantiated in a file of their
// own (gemm_v5.cuh), which compiles beside the f16 half.
#include "gemm_v5.cuh"

namespace minamp::gpu {

void gemm_v5_multistage_bf16(const GemmArgs& args) {
  dispatch_operands<__nv_bfloat16, GemmLaunch<V5Family>::On>(args, V5Family::kName);
}

} // namespace minamp::gpu
