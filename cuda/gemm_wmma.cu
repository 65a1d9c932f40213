// The public gpu::gemm: f16 operands go to the tensor-core kernel (gemm_wmma.cuh) with the
// library's tile configurations, f32 operands to the SIMT kernel (gemm_fp32.cu).
#include "device.cuh"
#include "gemm_wmma.cuh"
#include "kernels/kernels.h"

namespace minamp::gpu {

void wmma_gemm(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0) return;
  dispatch_operands<__half, GemmLaunch<WmmaFamily>::On>(args);
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          const GemmEpilogue& epilogue) {
  const GemmDims s = require_gemm(a, trans_a, b, trans_b, c, epilogue);
  require(s.m <= kMaxGemmExtent && s.n <= kMaxGemmExtent && s.k <= kMaxGemmExtent, "gemm",
          "sizes must fit in 32 bits (at most ", kMaxGemmExtent, "), got M ", s.m, ", N ", s.n,
          ", K ", s.k);

  GemmArgs args;
  args.a = matrix_operand(a, trans_a);
  args.b = matrix_operand(b, trans_b);
  args.c = c.raw();
  args.c_dtype = c.dtype();
  args.m = s.m, args.n = s.n, args.k = s.k;
  args.epilogue = {epilogue.alpha, epilogue.beta,
                   epilogue.bias ? ptr<float>(*epilogue.bias) : nullptr, epilogue.relu};
  run_gemm(args, a.dtype());
}

} // namespace minamp::gpu
