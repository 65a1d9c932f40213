// The public gpu::gemm and the choice of tensor-core GEMM version: f16 and bf16 operands go to the
// version gemm_version() names, or for `automatic` to the one plan_version picks (gemm_plan.h),
// f32 operands to the SIMT kernel (gemm_fp32.cu). The versions are cuda/gemm_v1_naive.cu ...
// cuda/gemm_v5_multistage.cu, each opening with what it changes and what that bought.
#include "device.cuh"
#include "gemm.cuh"
#include "kernels/gemm_version.h"
#include "kernels/kernels.h"

namespace minamp::gpu {

void tensor_core_gemm(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0) return;
  const GemmVersion version = plan_version(gemm_version(), compute_capability());
  const std::string refusal = gemm_refusal(version, args.ab_dtype, compute_capability());
  if (!refusal.empty()) throw Error(refusal);
  switch (version) {
  case GemmVersion::v1_naive: return gemm_v1_naive(args);
  case GemmVersion::v2_wmma: return gemm_v2_wmma(args);
  case GemmVersion::v3_interior: return gemm_v3_interior(args);
  case GemmVersion::v4_mma: return gemm_v4_mma(args);
  case GemmVersion::v5_multistage: return gemm_v5_multistage(args);
  case GemmVersion::automatic: break;
  }
  throw Error("gemm: no version planned (internal error)");
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          const GemmEpilogue& epilogue) {
  const GemmDims s = require_gemm(a, trans_a, b, trans_b, c, epilogue);
  require_size(s.m <= kMaxGemmExtent && s.n <= kMaxGemmExtent && s.k <= kMaxGemmExtent, "gemm",
               "sizes must fit in 32 bits (at most ", kMaxGemmExtent, "), got M ", s.m, ", N ", s.n,
               ", K ", s.k);

  GemmArgs args;
  args.a = matrix_operand(a, trans_a);
  args.b = matrix_operand(b, trans_b);
  args.ab_dtype = a.dtype();
  args.c = c.raw();
  args.c_dtype = c.dtype();
  args.m = s.m, args.n = s.n, args.k = s.k;
  args.epilogue.alpha = epilogue.alpha;
  args.epilogue.beta = epilogue.beta;
  args.epilogue.bias = epilogue.bias ? ptr<float>(*epilogue.bias) : nullptr;
  args.epilogue.relu = epilogue.relu;
  args.column_moments = epilogue.column_moments ? ptr<float>(*epilogue.column_moments) : nullptr;
  run_gemm(args);
}

} // namespace minamp::gpu
