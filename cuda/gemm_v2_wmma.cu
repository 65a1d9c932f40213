// GEMM v2: WMMA on shared-memory tiles fed by a cp.async pipeline, with split K.
//
// What it changes from v1: v1's warps read every fragment straight from global memory, each
// element of A and B once per warp tile that needs it. v2 stages BM x BK and BK x BN tiles in
// shared memory once per block, so a block of 8 warps reads each from global memory once and the
// warps share it, and it overlaps those copies with the tensor cores' work. Measured (bench_gemm,
// f16 in, fp32 accumulate, 4096^3): H100 213 TFLOP/s (0.29 of cuBLAS), H200 216 (0.29).
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
// What the profile says is left (Nsight Compute on an H100 at 4096^3): the kernel is issue-bound
// (issue slots 53% busy, tensor pipe 34%): the loader works out every chunk's address and bounds
// on each k-step and the epilogue writes one element at a time. v3 takes those on.
#include "device.cuh"
#include "gemm_wmma.cuh"

namespace minamp::gpu {

namespace {

// C[M, N] = epilogue(op(A) @ op(B)); one BM x BN tile of C per block. See the top of the file.
template <class Cfg, class OpA, class OpB, class CT>
__global__ void __launch_bounds__(Cfg::kThreads)
    gemm_v2_kernel(typename OpA::View a, typename OpB::View b, CT* c, int m, int n, int k,
                   int k_per_split, EpilogueArgs ep) {
  using Smem = WmmaSmem<Cfg, OpA, OpB>;
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  using T = typename Smem::T;
  if constexpr (!arch_can_launch(Smem::kBytes, false)) {
    __trap(); // never launched where it cannot run (arch_can_launch)
  } else {
    extern __shared__ __align__(128) unsigned char smem_bytes[];
    T* smem = reinterpret_cast<T*>(smem_bytes);

    const BlockShare share = block_share<Cfg>(m, n, k, k_per_split, c);
    const int warp = threadIdx.x / 32;
    const int warp_row = (warp / Cfg::WARPS_N) * Cfg::kWarpM; // within the block tile
    const int warp_col = (warp % Cfg::WARPS_N) * Cfg::kWarpN;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[Cfg::FRAG_M][Cfg::FRAG_N];
#pragma unroll
    for (int i = 0; i < Cfg::FRAG_M; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::FRAG_N; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    const auto consume = [&](const T* tile_a, const T* tile_b) {
      mma_tile<Cfg, TileA, TileB>(tile_a, tile_b, warp_row, warp_col, acc);
    };
    gemm_pipeline<Cfg, Smem>(smem, a, b, share, consume);
    __syncthreads(); // every warp is done reading the pipeline buffers

    // Epilogue: accumulators -> fp32 staging tile -> alpha/beta/bias/ReLU -> C.
    float* staging = reinterpret_cast<float*>(smem_bytes);
    store_accumulators<Cfg>(staging, warp_row, warp_col, acc);
    __syncthreads();
    for (int idx = threadIdx.x; idx < Cfg::BM * Cfg::BN; idx += Cfg::kThreads) {
      const int r = idx / Cfg::BN, col = idx % Cfg::BN;
      const int row = share.m0 + r, column = share.n0 + col;
      if (row < m && column < n)
        store_output(c, n, row, column, staging[r * Cfg::kStagingLd + col], ep);
    }
  }
}

// v2 for GemmLaunch.
struct V2Family {
  using Large = WmmaLarge;
  using Small = WmmaSmall;
  static constexpr const char* kName = "gemm v2 (wmma)";
  static constexpr bool kColumnStatistics = false; // its epilogue writes element by element
  template <class Cfg, class OpA, class OpB> static constexpr int smem_bytes() {
    return WmmaSmem<Cfg, OpA, OpB>::kBytes;
  }
  template <class Cfg, class OpA, class OpB, class CT> static auto kernel() {
    return gemm_v2_kernel<Cfg, OpA, OpB, CT>;
  }
};

} // namespace

GemmKernelInfo gemm_v2_kernel_info() {
  return large_kernel_info<V2Family>("v2", "gemm_v2_kernel", "WmmaConfig");
}

void gemm_v2_wmma(const GemmArgs& args) {
  dispatch_half_operands<GemmLaunch<V2Family>::On>(args, V2Family::kName);
}

} // namespace minamp::gpu
