// The mma.sync building blocks of the tensor-core GEMM versions v4 and v5 (gemm_v4_mma.cu,
// gemm_v5_multistage.cu): the tile configuration, where each lane's ldmatrix row addresses lie in
// the padded shared tiles, a warp's A and B fragments for one 16-wide k-step (ldmatrix.x4 from
// either orientation of tile), the MMAs of one k-step, and the accumulators' way to the
// epilogue's fp32 staging tile. The instructions themselves are in mma.cuh. Everything takes f16
// or bf16 elements alike (ldmatrix moves 16-bit words whatever they hold); only the MMA
// instruction names the type.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "gemm.cuh"
#include "mma.cuh"

#if defined(__CUDACC__) || defined(MINAMP_CUDA_EMULATOR)

namespace minamp::gpu {

template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_> struct MmaConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, STAGES = STAGES_;
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int kWarpM = BM / WARPS_M, kWarpN = BN / WARPS_N; // warp tile
  static constexpr int MMA_M = kWarpM / 16, MMA_N = kWarpN / 8;      // m16n8 tiles per warp
  static constexpr int kStagingLd = BN + 8; // fp32 epilogue tile [BM][BN + 8]
  // Blocks per SM the registers must allow (__launch_bounds__): two of 4 warps, one of 8.
  static constexpr int kMinBlocks = kThreads <= 128 ? 2 : 1;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0 && BK % 16 == 0, "m16n8k16 tiles, x4 loads");
};

// Where this lane's ldmatrix.x4 row address lies, relative to the 16x16 block it loads, as
// (outer offset, k offset) in the tile: lanes 8j .. 8j + 7 give the rows of matrix j. For A the
// four matrices are (outer 0-7, k 0-7), (outer 8-15, k 0-7), (outer 0-7, k 8-15),
// (outer 8-15, k 8-15), the order of a[0..3]; for B, (k 0-7), (k 8-15) of outer 0-7, then of
// outer 8-15: b[0..1] of one n8 tile, then of the next. A tile stored k-contiguous is read by
// rows of outer index, one stored outer-contiguous by rows of k (and transposed by ldmatrix).
template <class Tile, bool kIsA> struct LdmatrixLane {
  __device__ static int outer(int lane) {
    const int row = lane % 8, j = lane / 8;
    const int matrix_outer = kIsA ? 8 * (j % 2) : 8 * (j / 2);
    return Tile::kKContiguous ? matrix_outer + row : matrix_outer;
  }
  __device__ static int k(int lane) {
    const int row = lane % 8, j = lane / 8;
    const int matrix_k = kIsA ? 8 * (j / 2) : 8 * (j % 2);
    return Tile::kKContiguous ? matrix_k : matrix_k + row;
  }
  // The lane's offset in the tile for the block at (outer0, k0).
  __device__ static int offset(int lane, int outer0, int k0) {
    return Tile::offset(outer0 + outer(lane), k0 + k(lane));
  }
};

// A warp's A and B fragments of one k-step, pairs of T (f16 or bf16) packed in 32-bit registers.
template <class Cfg, class T> struct Fragments {
  uint32_t a[Cfg::MMA_M][4];
  uint32_t b[Cfg::MMA_N][2];
};

// The warp's A and B fragments for the 16-wide k-step at kk of the tiles in shared memory.
template <class Cfg, class TileA, class TileB, class T>
__device__ __forceinline__ void load_fragments(Fragments<Cfg, T>& f, const T* tile_a,
                                               const T* tile_b, int a_lane, int b_lane, int kk) {
#pragma unroll
  for (int i = 0; i < Cfg::MMA_M; ++i)
    ldmatrix_x4<!TileA::kKContiguous>(f.a[i], tile_a + a_lane + TileA::offset(i * 16, kk));
#pragma unroll
  for (int j = 0; j < Cfg::MMA_N; j += 2) {
    uint32_t r[4];
    ldmatrix_x4<!TileB::kKContiguous>(r, tile_b + b_lane + TileB::offset(j * 8, kk));
    f.b[j][0] = r[0], f.b[j][1] = r[1], f.b[j + 1][0] = r[2], f.b[j + 1][1] = r[3];
  }
}

// The MMAs of one k-step: acc[i][j] += A fragment i @ B fragment j.
template <class Cfg, class T>
__device__ __forceinline__ void mma_step(const Fragments<Cfg, T>& f,
                                         float (&acc)[Cfg::MMA_M][Cfg::MMA_N][4]) {
#pragma unroll
  for (int i = 0; i < Cfg::MMA_M; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::MMA_N; ++j) mma_m16n8k16<T>(acc[i][j], f.a[i], f.b[j]);
}

// Stores a warp's accumulators into the block's fp32 staging tile [BM][kStagingLd] at the warp's
// tile (warp_row, warp_col): lane (g, t) holds rows g and g + 8, columns 2t and 2t + 1 of each
// m16n8 tile, written as float2 pairs.
template <class Cfg>
__device__ __forceinline__ void store_accumulators(float* staging, int warp_row, int warp_col,
                                                   int lane,
                                                   const float (&acc)[Cfg::MMA_M][Cfg::MMA_N][4]) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < Cfg::MMA_M; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::MMA_N; ++j) {
      float* at = staging + (warp_row + i * 16 + g) * Cfg::kStagingLd + warp_col + j * 8 + 2 * t;
      *reinterpret_cast<float2*>(at) = make_float2(acc[i][j][0], acc[i][j][1]);
      *reinterpret_cast<float2*>(at + 8 * Cfg::kStagingLd) =
          make_float2(acc[i][j][2], acc[i][j][3]);
    }
}

} // namespace minamp::gpu

#endif // __CUDACC__ || MINAMP_CUDA_EMULATOR
