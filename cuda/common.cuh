// Shared helpers of the CUDA backend: checked CUDA calls and launches (errors name the op and
// file:line), the one stream, launch-size helpers, typed pointers to tensor data, and loads and
// stores that widen to float and round back, of one value or of a pack of four, for the storage
// types f32 (float), f16 (__half) and bf16 (__nv_bfloat16).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

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

// Converts between storage types in device code: every load widens to float, every store
// rounds to the storage type (cvt.rn: round to nearest even).
__device__ __forceinline__ float load_f(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load_f(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void store_f(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void store_f(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}
__device__ __forceinline__ void store_f(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
// v as store_f leaves it in storage type T, widened back to float.
template <class T> __device__ __forceinline__ float as_stored(float v);
template <> __device__ __forceinline__ float as_stored<float>(float v) { return v; }
template <> __device__ __forceinline__ float as_stored<__half>(float v) {
  return __half2float(__float2half_rn(v));
}
template <> __device__ __forceinline__ float as_stored<__nv_bfloat16>(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// The same for four consecutive values at once, one 16-byte (f32) or 8-byte (f16, bf16) access:
// p + i must be aligned for it (aligned_for_pack on the base pointer, i a multiple of 4).
struct Float4 {
  float v[4];
};
template <class T> bool aligned_for_pack(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}
// The values a thread takes at a time along rows of `width`: 4 (a pack) when the rows are whole
// packs and every tensor is `aligned` for them (aligned_for_pack), else 1.
inline int pack_width(int64_t width, bool aligned) { return width % 4 == 0 && aligned ? 4 : 1; }
// A pair of 16-bit values as the 32 bits it is stored in, x in the low half (and for __half2,
// back): two pairs move as one 8-byte access, where a struct of the two would be copied member by
// member, as two 4-byte ones.
__device__ __forceinline__ uint32_t pair_bits(__half2 p) {
  return __half_as_ushort(p.x) | uint32_t(__half_as_ushort(p.y)) << 16;
}
__device__ __forceinline__ uint32_t pair_bits(__nv_bfloat162 p) {
  return __bfloat16_as_ushort(p.x) | uint32_t(__bfloat16_as_ushort(p.y)) << 16;
}
__device__ __forceinline__ float2 half_pair_to_float2(uint32_t bits) {
  return __half22float2(
      __halves2half2(__ushort_as_half(uint16_t(bits)), __ushort_as_half(uint16_t(bits >> 16))));
}
// Four values as stored, as one access moves them: two pairs' 32 bits (f16, bf16) or four floats.
// load4_stored reads them, widen4 turns them into floats, load4 does both. A kernel that has
// several loads in flight before it uses the first holds them as stored: half the registers for
// 16-bit values.
template <class T> using Stored4 = std::conditional_t<sizeof(T) == 2, uint2, float4>;
template <class T> __device__ __forceinline__ Stored4<T> load4_stored(const T* p, int64_t i) {
  return *reinterpret_cast<const Stored4<T>*>(p + i);
}
template <class T> __device__ Float4 widen4(const Stored4<T>& stored);
template <> __device__ __forceinline__ Float4 widen4<float>(const float4& q) {
  return {{q.x, q.y, q.z, q.w}};
}
template <> __device__ __forceinline__ Float4 widen4<__half>(const uint2& bits) {
  const float2 lo = half_pair_to_float2(bits.x), hi = half_pair_to_float2(bits.y);
  return {{lo.x, lo.y, hi.x, hi.y}};
}
// A bf16 is the high half of the float it widens to: each value is its 16 bits shifted into place.
template <> __device__ __forceinline__ Float4 widen4<__nv_bfloat16>(const uint2& bits) {
  return {{__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xffff0000u),
           __uint_as_float(bits.y << 16), __uint_as_float(bits.y & 0xffff0000u)}};
}
template <class T> __device__ __forceinline__ Float4 load4(const T* p, int64_t i) {
  return widen4<T>(load4_stored(p, i));
}
// round4 rounds four floats to T as store4 stores them (round to nearest even), store4_stored
// writes values so rounded, store4 does both: a kernel that also uses the values as stored
// (widen4 of round4's) rounds each once.
template <class T> __device__ Stored4<T> round4(const Float4& f);
template <> __device__ __forceinline__ float4 round4<float>(const Float4& f) {
  return make_float4(f.v[0], f.v[1], f.v[2], f.v[3]);
}
template <> __device__ __forceinline__ uint2 round4<__half>(const Float4& f) {
  return make_uint2(pair_bits(__floats2half2_rn(f.v[0], f.v[1])),
                    pair_bits(__floats2half2_rn(f.v[2], f.v[3])));
}
template <> __device__ __forceinline__ uint2 round4<__nv_bfloat16>(const Float4& f) {
  return make_uint2(pair_bits(__floats2bfloat162_rn(f.v[0], f.v[1])),
                    pair_bits(__floats2bfloat162_rn(f.v[2], f.v[3])));
}
template <class T>
__device__ __forceinline__ void store4_stored(T* p, int64_t i, const Stored4<T>& stored) {
  *reinterpret_cast<Stored4<T>*>(p + i) = stored;
}
template <class T> __device__ __forceinline__ void store4(T* p, int64_t i, const Float4& f) {
  store4_stored(p, i, round4<T>(f));
}

// kPack (1 or 4) consecutive values from p + i into v, and back: for kernels templated on how
// many elements a thread takes at a time.
template <int kPack, class T>
__device__ __forceinline__ void load_pack(const T* p, int64_t i, float (&v)[kPack]) {
  static_assert(kPack == 1 || kPack == 4, "packs of 1 or 4");
  if constexpr (kPack == 4) {
    const Float4 f = load4(p, i);
    for (int j = 0; j < 4; ++j) v[j] = f.v[j];
  } else {
    v[0] = load_f(p, i);
  }
}
template <int kPack, class T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const float (&v)[kPack]) {
  static_assert(kPack == 1 || kPack == 4, "packs of 1 or 4");
  if constexpr (kPack == 4)
    store4(p, i, Float4{{v[0], v[1], v[2], v[3]}});
  else
    store_f(p, i, v[0]);
}

// A thread's walk over first, first + step, ... (< end), kBatch indices at a time: load(b, i) for
// each of the kBatch, then use(b, i) for each, so that kBatch loads are in flight before the first
// is used; the last few indices, fewer than kBatch, one at a time (b = 0). One at a time, a loop
// whose loads are few bytes a thread leaves each warp waiting a whole memory latency per step.
// Whole batches carry no bounds test per load: a load under its own predicate is converted as soon
// as it arrives, and the compiler then issues the batch's loads one after another's wait.
// Index is the indices' type: 64 bits unless the caller names a narrower one for a walk that fits
// (not deduced from the arguments, which mix types).
template <class T> struct NotDeduced { using type = T; };
template <int kBatch, class Index = int64_t, class Load, class Use>
__device__ __forceinline__ void
for_each_batched(typename NotDeduced<Index>::type first, typename NotDeduced<Index>::type step,
                 typename NotDeduced<Index>::type end, Load&& load, Use&& use) {
  Index i = first;
  for (; i + (kBatch - 1) * step < end; i += kBatch * step) {
#pragma unroll
    for (int b = 0; b < kBatch; ++b) load(b, i + b * step);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) use(b, i + b * step);
  }
  for (; i < end; i += step) {
    load(0, i);
    use(0, i);
  }
}

// 1 / count, a count of rows (a positive integer, as a float): the reciprocal instruction
// (rcp.approx, MUFU.RCP) refined by one Newton step. That is the compiler's IEEE division of 1 by
// count without its test for operands near the ends of the float range (a count's float never
// is), in 4 instructions where the division takes 16 (the thin-K moments kernel divides once a
// row). From an estimate within an ulp of 1 / count, the step gives the correctly rounded
// reciprocal for every count below 2796203 (the first integer it misses, found by trying every
// count up to 2^24); a thread's count of rows stays far below it. The emulator starts from the
// quotient itself, which the step leaves as it is.
__device__ __forceinline__ float reciprocal_of_count(float count) {
#if defined(MINAMP_CUDA_EMULATOR)
  const float estimate = 1.0f / count;
#else
  float estimate;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(estimate) : "f"(count));
#endif
  return fmaf(estimate, fmaf(-count, estimate, 1.0f), estimate);
}
// x / count, x a sum over `count` rows: x times reciprocal_of_count, corrected once by the
// residual. That is the compiler's own fast path of IEEE division, with the same value wherever x
// and x / count are normal floats (else within an ulp). The compiler's range test sends the other
// operands to a slow path that is a function call, and registers live across a call are kept in
// local memory around it; the GEMM epilogues divide once per column of a tile
// (store_tile_with_moments).
__device__ __forceinline__ float divide_by_count(float x, float count) {
  const float inverse = reciprocal_of_count(count);
  const float quotient = x * inverse;
  return fmaf(fmaf(-count, quotient, x), inverse, quotient);
}

// Batch norm's normalisation of one value of a channel, then ReLU when asked: gamma (v - mean)
// invstd + beta with one rounding (fma), as the CPU reference; a NaN passes the ReLU. The batch
// norm kernel writes it, and a GEMM that normalises an operand as it loads it (gemm.cuh,
// GemmOperand::normalization) computes the same value bit for bit.
// The ReLU is applied as a floor, relu_floor(relu): 0 with it, -inf without (nothing is below
// -inf, so every value, NaN included, passes), one compare and select with no branch on `relu`.
__device__ __forceinline__ float relu_floor(bool relu) { return relu ? 0.0f : -INFINITY; }
__device__ __forceinline__ float batchnorm_normalized(float v, float gamma, float beta, float mean,
                                                      float invstd, float floor) {
  const float normalised = fmaf(gamma, (v - mean) * invstd, beta);
  return normalised < floor ? floor : normalised;
}
__device__ __forceinline__ float batchnorm_normalized(float v, float gamma, float beta, float mean,
                                                      float invstd, bool relu) {
  return batchnorm_normalized(v, gamma, beta, mean, invstd, relu_floor(relu));
}

// The batch norm backward's view of one element, from its input x and the gradient dy of its
// output: xhat = (x - mean) invstd, and dy_hat = dy with the ReLU's mask recomputed from x (zero
// where the output was <= 0; a NaN passes). The batch norm kernel and the thin-K GEMM kernel,
// which sums these terms as it stores dy (gemm_thin.cu), compute the same values.
__device__ __forceinline__ void batchnorm_grad_terms(float x, float dy, float gamma, float beta,
                                                     float mean, float invstd, bool relu,
                                                     float& xhat, float& dy_hat) {
  xhat = (x - mean) * invstd;
  dy_hat = relu && fmaf(gamma, xhat, beta) <= 0.0f ? 0.0f : dy;
}

} // namespace minamp::gpu

// Checks a CUDA runtime call: CUDA_CHECK(cudaMemcpyAsync(...), "copy").
#define CUDA_CHECK(call, what) ::minamp::gpu::check_cuda((call), (what), __FILE__, __LINE__)
// Checks the last launch: call right after kernel<<<...>>>(...).
#define CUDA_CHECK_LAUNCH(what)                                                                    \
  ::minamp::gpu::check_cuda(cudaGetLastError(), (what), __FILE__, __LINE__)
