// The cuBLAS calls bench/gemm.cu makes, for the CUDA emulator: a plain CPU GEMM in cuBLAS's
// column-major convention (f16 or f32 operands and output, fp32 products summed in k order),
// run at once like every emulated launch. It exists so that bench_gemm_emulated can run the
// benchmark's checks and its whole timing path without a GPU; its times mean nothing, and only
// what bench_gemm uses is here: C = op(A) op(B) (host-pointer alpha 1 and beta 0; C is only
// written), no math modes, no batching.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

bool supported(cudaDataType type) { return type == CUDA_R_16F || type == CUDA_R_32F; }

float load(const void* p, cudaDataType type, int64_t i) {
  return type == CUDA_R_16F ? __half2float(static_cast<const __half*>(p)[i])
                            : static_cast<const float*>(p)[i];
}

void store(void* p, cudaDataType type, int64_t i, float v) {
  if (type == CUDA_R_16F)
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}

// C = op(A) op(B), all column-major: op(A) is [m, k], op(B) [k, n], C [m, n]. Other alpha and
// beta than 1 and 0 are not supported.
cublasStatus_t gemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                    int m, int n, int k, float alpha, const void* a, cudaDataType a_type, int lda,
                    const void* b, cudaDataType b_type, int ldb, float beta, void* c,
                    cudaDataType c_type, int ldc) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) ||
      ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!supported(a_type) || !supported(b_type) || !supported(c_type) || alpha != 1.0f ||
      beta != 0.0f)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      float sum = 0.0f;
      for (int64_t p = 0; p < k; ++p)
        sum += load(a, a_type, ta ? p + i * lda : i + p * lda) *
               load(b, b_type, tb ? j + p * ldb : p + j * ldb);
      store(c, c_type, i + j * ldc, sum);
    }
  return CUBLAS_STATUS_SUCCESS;
}

} // namespace

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetVersion_v2(cublasHandle_t, int* version) {
  *version = 0; // not cuBLAS: bench_gemm prints and records it
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  default: return "CUBLAS_STATUS_UNKNOWN (emulator)";
  }
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                              cublasOperation_t transb, int m, int n, int k, const float* alpha,
                              const float* a, int lda, const float* b, int ldb, const float* beta,
                              float* c, int ldc) {
  return gemm(handle, transa, transb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb,
              *beta, c, CUDA_R_32F, ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* a, cudaDataType a_type, int lda, const void* b,
                            cudaDataType b_type, int ldb, const void* beta, void* c,
                            cudaDataType c_type, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(handle, transa, transb, m, n, k, *static_cast<const float*>(alpha), a, a_type, lda, b,
              b_type, ldb, *static_cast<const float*>(beta), c, c_type, ldc);
}
