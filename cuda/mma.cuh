// Tensor-core instructions below the WMMA API, as inline PTX: ldmatrix, which loads 8x8 matrices
// of 16-bit elements (f16 or bf16: it moves bits) from shared memory straight into the register
// layout of an MMA fragment, and mma.sync.m16n8k16 (f16 or bf16 inputs, fp32 accumulators), the
// instruction WMMA's 16x16x16 mma_sync compiles to on sm_80 and later. The GEMM of gemm_v4_mma.cuh
// is written with them. On the CPU emulator they run lane by lane (emulator.h). The fragment
// layouts (g = lane / 4, t = lane % 4):
//   A 16x16, 4 registers of 2 halves: a[0] = A[g][2t..2t+1],   a[1] = A[g+8][2t..2t+1],
//                                      a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]
//   B 16x8,  2 registers of 2 halves: b[0] = B[2t..2t+1][g],   b[1] = B[2t+8..2t+9][g]
//   C/D 16x8, 4 floats: c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
// ldmatrix.x4 fills 4 registers, one 8x8 matrix each; lane 8j + r gives the address of row r of
// matrix j, and lane l receives row l / 4, columns 2t..2t+1 of each (with .trans: column l / 4,
// rows 2t..2t+1, which turns a tile stored the other way round into the same fragment).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace minamp::gpu {

// Four 8x8 matrices of 16-bit elements from shared memory; `row` is this lane's row address
// (16-byte aligned). kTrans gives each matrix transposed.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(MINAMP_CUDA_EMULATOR)
  ::minamp::emu::ldmatrix(r, 4, kTrans, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned at = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
#else
  (void)r, (void)row;
  __trap(); // the launcher never runs an mma.sync kernel below sm_80
#endif
}

// d = a @ b + d: one 16x8x16 tensor-core product of T (__half or __nv_bfloat16) inputs with fp32
// accumulators.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "f16 or bf16");
#if defined(MINAMP_CUDA_EMULATOR)
  ::minamp::emu::mma_m16n8k16<T>(d, a, b, d);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  (void)d, (void)a, (void)b;
  __trap();
#endif
}

} // namespace minamp::gpu
