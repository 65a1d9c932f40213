// Shared helpers of the CUDA backend: checked CUDA calls and launches (errors name the op and
// file:line), the one stream, launch-size helpers and typed pointers to tensor data.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "core/tensor.h"

namespace minamp::gpu {

// Throws minamp::Error naming `what` and the CUDA error when `status` is not cudaSuccess.
void check_cuda(cudaError_t status, const char* what, const char* file, int line);

// The one stream every minamp kernel and copy runs on.
cudaStream_t stream();

// Number of blocks of `threads` covering `n` items, capped at a few waves of the device.
int grid_for(int64_t n, int threads);

template <class T> T* ptr(const Tensor& t) { return static_cast<T*>(t.raw()); }
inline __half* half_ptr(const Tensor& t) { return static_cast<__half*>(t.raw()); }

// Converts between storage types in device code: every load widens to float, every store
// rounds to the storage type (cvt.rn: round to nearest even).
__device__ __forceinline__ float load_f(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ void store_f(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}

} // namespace minamp::gpu

// Checks a CUDA runtime call: CUDA_CHECK(cudaMemcpyAsync(...), "copy").
#define CUDA_CHECK(call, what) ::minamp::gpu::check_cuda((call), (what), __FILE__, __LINE__)
// Checks the last launch: call right after kernel<<<...>>>(...).
#define CUDA_CHECK_LAUNCH(what)                                                                    \
  ::minamp::gpu::check_cuda(cudaGetLastError(), (what), __FILE__, __LINE__)
