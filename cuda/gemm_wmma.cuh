// The WMMA building blocks of the tensor-core GEMM versions v2 and v3 (gemm_v2_wmma.cu,
// gemm_v3_interior.cu): the tile configuration (block tile, warp grid, pipeline depth), the
// shared-memory layout of one configuration, one k-step of nvcuda::wmma 16x16x16 products on the
// tiles in shared memory (f16 or bf16 fragments, fp32 accumulators), and the first step of the
// epilogue (fragments to an fp32 staging tile).
// WMMA is the readable entry point to tensor cores: the API hides how a fragment is spread over
// the warp's registers, so these functions read like the matrix algebra they do.
#pragma once

#include <mma.h>

#include <type_traits>

#include "gemm.cuh"

#if defined(__CUDACC__) || defined(MINAMP_CUDA_EMULATOR)

namespace minamp::gpu {

namespace wmma = nvcuda::wmma;

template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_> struct WmmaConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_;
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWarpM = BM / WARPS_M, kWarpN = BN / WARPS_N; // warp tile
  static constexpr int FRAG_M = kWarpM / 16, FRAG_N = kWarpN / 16;
  static constexpr int kStagingLd = BN + 4; // fp32 epilogue tile [BM][BN + 4]
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && BK % 16 == 0, "16x16x16 fragments");
};

// 8 warps of 64x32 and 4 warps of 32x32, on the tiles gemm_plan.h plans with (v2 and v3).
using WmmaLarge = WmmaConfig<kWmmaLargeTile.bm, kWmmaLargeTile.bn, kWmmaLargeTile.bk, 2, 4, 3>;
using WmmaSmall = WmmaConfig<kWmmaSmallTile.bm, kWmmaSmallTile.bn, kWmmaSmallTile.bk, 2, 2, 3>;

// The shared-memory layout of a WMMA configuration (load_matrix_sync needs 32-byte aligned
// fragment pointers: each tile of each stage keeps that alignment).
template <class Cfg, class OpA, class OpB> struct WmmaSmem : GemmSmem<Cfg, OpA, OpB> {
  using Base = GemmSmem<Cfg, OpA, OpB>;
  static_assert(Base::TileA::kElems * sizeof(typename Base::T) % 32 == 0,
                "A tile keeps 32-byte alignment");
  static_assert(Base::TileB::kElems * sizeof(typename Base::T) % 32 == 0,
                "B tile keeps 32-byte alignment");
};

// WMMA has bf16 fragments on sm_80 and later only. Device code compiled for an older GPU gets
// none, and traps instead: the launcher refuses bf16 there before launching (gemm_plan.h).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr bool kWmmaHasBf16 = false;
#else
constexpr bool kWmmaHasBf16 = true;
#endif
template <class T> constexpr bool kWmmaTakes = std::is_same_v<T, __half> || kWmmaHasBf16;

// One k-step of MMAs on the tiles in shared memory: acc[i][j] += A[warp rows i] @ B[warp cols j].
template <class Cfg, class TileA, class TileB, class T, class Acc>
__device__ __forceinline__ void mma_tile(const T* tile_a, const T* tile_b, int warp_row,
                                         int warp_col, Acc (&acc)[Cfg::FRAG_M][Cfg::FRAG_N]) {
  if constexpr (!kWmmaTakes<T>) {
    __trap();
  } else {
    using LayoutA = std::conditional_t<TileA::kKContiguous, wmma::row_major, wmma::col_major>;
    using LayoutB = std::conditional_t<TileB::kKContiguous, wmma::col_major, wmma::row_major>;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> a[Cfg::FRAG_M];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> b[Cfg::FRAG_N];
#pragma unroll
    for (int kk = 0; kk < Cfg::BK; kk += 16) {
#pragma unroll
      for (int i = 0; i < Cfg::FRAG_M; ++i)
        wmma::load_matrix_sync(a[i], tile_a + TileA::offset(warp_row + i * 16, kk), TileA::kLd);
#pragma unroll
      for (int j = 0; j < Cfg::FRAG_N; ++j)
        wmma::load_matrix_sync(b[j], tile_b + TileB::offset(warp_col + j * 16, kk), TileB::kLd);
#pragma unroll
      for (int i = 0; i < Cfg::FRAG_M; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::FRAG_N; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
  }
}

// Stores a warp's accumulator fragments into the block's fp32 staging tile [BM][kStagingLd] at
// the warp's tile (warp_row, warp_col): the first step of every WMMA epilogue.
template <class Cfg, class Acc>
__device__ __forceinline__ void store_accumulators(float* staging, int warp_row, int warp_col,
                                                   const Acc (&acc)[Cfg::FRAG_M][Cfg::FRAG_N]) {
#pragma unroll
  for (int i = 0; i < Cfg::FRAG_M; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::FRAG_N; ++j)
      wmma::store_matrix_sync(staging + (warp_row + i * 16) * Cfg::kStagingLd + warp_col + j * 16,
                              acc[i][j], Cfg::kStagingLd, wmma::mem_row_major);
}

} // namespace minamp::gpu

#endif // __CUDACC__ || MINAMP_CUDA_EMULATOR
