// The tensor-core GEMM kernel (fp16 in, fp32 accumulate, nvcuda::wmma 16x16x16 fragments), its
// tile configurations and its kernel family for GemmLaunch (gemm.cuh). gemm_wmma.cu launches it
// with the library's two configurations; bench_gemm instantiates others to compare them.
//
// How the kernel works, for a reader:
//
// Tiling. C[M, N] is cut into BM x BN block tiles, one thread block each (grid.x walks M,
// grid.y walks N). The block's warps form a WARPS_M x WARPS_N grid; each warp owns a
// (BM / WARPS_M) x (BN / WARPS_N) warp tile, held as FRAG_M x FRAG_N fp32 accumulator
// fragments of 16x16. The large configuration is 128x128 with 8 warps of 64x32 (8 fragments,
// 64 accumulator registers per thread); a 64x64 configuration with 4 warps of 32x32 is chosen
// when the large one would leave SMs idle, pad a thin C, or not fit (see plan_gemm).
//
// Pipeline. K is walked in steps of BK = 32. Each step needs an A tile [BM, BK] and a B tile
// [BK, BN] in shared memory; STAGES (3) buffers of both rotate. Copies are cp.async 16-byte
// chunks (sm_80+; older GPUs do the same copy with plain loads), committed as one group per
// k-step. Iteration kt waits until the group of tile kt has landed (at most STAGES - 2 newer
// groups in flight), syncs the block, starts the copy of tile kt + STAGES - 1 into the buffer
// that iteration kt - 1 used (the sync guarantees every warp is done with it), then runs
// BK / 16 rounds of wmma::mma_sync on tile kt. So STAGES - 1 tiles are always in flight while
// the tensor cores work. An empty group is committed when no tile is left so the count stays
// uniform. This loop is gemm_pipeline in gemm.cuh, shared with the SIMT kernel.
//
// Layouts and transposes. Tiles keep the orientation of the operand in global memory (so every
// copy is contiguous); the fragment type absorbs the transpose:
//   A untransposed [M, K]: tile [BM][BK + 8], matrix_a row_major
//   A transposed   [K, M]: tile [BK][BM + 8], matrix_a col_major
//   B untransposed [K, N]: tile [BK][BN + 8], matrix_b row_major
//   B transposed   [N, K]: tile [BN][BK + 8], matrix_b col_major
// The 8-half (16-byte) pad makes consecutive rows start in different banks. An im2col A (conv
// forward) or B (conv weight gradient) is gathered from x by the loader like an untransposed one.
//
// Edges. The loaders zero-fill every element outside the matrix (rows past M or N, k past K,
// conv padding), so partial tiles need no special case in the MMA loop; a 16-byte chunk that
// straddles an edge, or a matrix whose rows are not 16-byte aligned (K or N not a multiple of
// 8), is copied element by element. Any M, N, K >= 1 works (K = 0 gives the epilogue of zero).
//
// Epilogue. After the last k-step the pipeline buffers are reused as an fp32 [BM][BN + 4]
// staging tile: each warp stores its accumulator fragments there, the block syncs, and then
// consecutive threads take consecutive columns of a row, so alpha/beta/bias/ReLU are applied in
// fp32 and C is written (rounded to nearest even for f16) with coalesced accesses, skipping
// rows and columns outside C. beta == 0 never reads C.
//
// Split K. When even the small tiles leave SMs idle and K is long (the conv weight gradient), the
// launcher in gemm.cuh gives grid.z slices of K to different blocks, each writing an fp32
// partial C without the epilogue; a second kernel adds them in order and applies it.
//
// Tuning knobs are the WmmaConfig template parameters: `bench_gemm --wmma-sweep` times other
// configurations beside the library's on the shapes that matter, in the same process. Beyond
// them, the next step on an H100 would be ldmatrix/mma.sync with swizzled tiles and block-order
// swizzling for L2 reuse.
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

// 8 warps of 64x32 and 4 warps of 32x32, on the tiles gemm_plan.h plans with.
using WmmaLarge = WmmaConfig<kWmmaLargeTile.bm, kWmmaLargeTile.bn, kWmmaLargeTile.bk, 2, 4, 3>;
using WmmaSmall = WmmaConfig<kWmmaSmallTile.bm, kWmmaSmallTile.bn, kWmmaSmallTile.bk, 2, 2, 3>;

// Shared-memory layout of one configuration and pair of operand orientations.
template <class Cfg, bool kTransA, bool kTransB> struct WmmaSmem {
  using TileA = TileShape<__half, !kTransA, Cfg::BM, Cfg::BK>;
  using TileB = TileShape<__half, kTransB, Cfg::BN, Cfg::BK>;
  static constexpr int kStageElems = TileA::kElems + TileB::kElems;
  static constexpr int kPipelineBytes = Cfg::STAGES * kStageElems * int(sizeof(__half));
  static constexpr int kStagingBytes = Cfg::BM * Cfg::kStagingLd * int(sizeof(float));
  static constexpr int kBytes = kPipelineBytes > kStagingBytes ? kPipelineBytes : kStagingBytes;
  // wmma::load_matrix_sync needs 32-byte aligned fragment pointers.
  static_assert(TileA::kElems * sizeof(__half) % 32 == 0, "A tile keeps 32-byte alignment");
  static_assert(TileB::kElems * sizeof(__half) % 32 == 0, "B tile keeps 32-byte alignment");
};

// One k-step of MMAs on the tiles in shared memory: acc[i][j] += A[warp rows i] @ B[warp cols j].
template <class Cfg, class TileA, class TileB, class Acc>
__device__ __forceinline__ void mma_tile(const __half* tile_a, const __half* tile_b, int warp_row,
                                         int warp_col, Acc (&acc)[Cfg::FRAG_M][Cfg::FRAG_N]) {
  using LayoutA = std::conditional_t<TileA::kKContiguous, wmma::row_major, wmma::col_major>;
  using LayoutB = std::conditional_t<TileB::kKContiguous, wmma::col_major, wmma::row_major>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, LayoutA> a[Cfg::FRAG_M];
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, LayoutB> b[Cfg::FRAG_N];
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

// C[M, N] = epilogue(op(A) @ op(B)); one BM x BN tile of C per block. See the top of the file.
template <class Cfg, class OpA, class OpB, class CT>
__global__ void __launch_bounds__(Cfg::kThreads)
    wmma_gemm_kernel(typename OpA::View a, typename OpB::View b, CT* c, int m, int n, int k,
                     int k_per_split, EpilogueArgs ep) {
  using Smem = WmmaSmem<Cfg, OpA::kTransposed, OpB::kTransposed>;
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  __half* smem = reinterpret_cast<__half*>(smem_bytes);

  const BlockShare share = block_share<Cfg>(m, n, k, k_per_split, c);
  const int warp = threadIdx.x / 32;
  const int warp_row = (warp / Cfg::WARPS_N) * Cfg::kWarpM; // within the block tile
  const int warp_col = (warp % Cfg::WARPS_N) * Cfg::kWarpN;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[Cfg::FRAG_M][Cfg::FRAG_N];
#pragma unroll
  for (int i = 0; i < Cfg::FRAG_M; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::FRAG_N; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const auto consume = [&](const __half* tile_a, const __half* tile_b) {
    mma_tile<Cfg, TileA, TileB>(tile_a, tile_b, warp_row, warp_col, acc);
  };
  gemm_pipeline<Cfg, Smem>(smem, a, b, share, consume);
  __syncthreads(); // every warp is done reading the pipeline buffers

  // Epilogue: accumulators -> fp32 staging tile -> alpha/beta/bias/ReLU -> C.
  float* staging = reinterpret_cast<float*>(smem_bytes);
#pragma unroll
  for (int i = 0; i < Cfg::FRAG_M; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::FRAG_N; ++j)
      wmma::store_matrix_sync(staging + (warp_row + i * 16) * Cfg::kStagingLd + warp_col + j * 16,
                              acc[i][j], Cfg::kStagingLd, wmma::mem_row_major);
  __syncthreads();
  for (int idx = threadIdx.x; idx < Cfg::BM * Cfg::BN; idx += Cfg::kThreads) {
    const int r = idx / Cfg::BN, col = idx % Cfg::BN;
    const int row = share.m0 + r, column = share.n0 + col;
    if (row < m && column < n)
      store_output(c, n, row, column, staging[r * Cfg::kStagingLd + col], ep);
  }
}

// The WMMA kernel family for GemmLaunch.
struct WmmaFamily {
  using Large = WmmaLarge;
  using Small = WmmaSmall;
  static constexpr const char* kName = "gemm (wmma)";
  template <class Cfg, class OpA, class OpB> static constexpr int smem_bytes() {
    return WmmaSmem<Cfg, OpA::kTransposed, OpB::kTransposed>::kBytes;
  }
  template <class Cfg, class OpA, class OpB, class CT> static auto kernel() {
    return wmma_gemm_kernel<Cfg, OpA, OpB, CT>;
  }
};

} // namespace minamp::gpu

#endif // __CUDACC__ || MINAMP_CUDA_EMULATOR
