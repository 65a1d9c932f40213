// GEMM v3: v2 with fewer instructions around the tensor cores — a loader that works out its
// addresses once per block, and an epilogue that writes 16 bytes at a time.
//
// What it changes from v2 (gemm_v2_wmma.cu), whose profile showed it issue-bound:
//   - Loads. v2's loader (load_operand_tile) works out, for every 16-byte chunk of every tile, its
//     row and column, its offset in the matrix and whether it is inside. In v3 a block whose
//     tiles all lie inside both matrices (every block but those on C's right and bottom edges,
//     when K is whole tiles) runs a main loop with no bounds check at all: each thread owns the
//     same chunks of every tile, computes their addresses once per block, and moves them by one
//     k-step per tile with a single multiply-add (InteriorTileLoader in gemm.cuh). The edge
//     blocks, a ragged K and the conv views run v2's loop.
//   - Epilogue. v2 writes C one element per thread and step; v3 (store_tile_packed in gemm.cuh)
//     reads 4 or 8 staged accumulators and writes 16 bytes of C (8 halves or 4 floats) at once,
//     reading C (beta != 0) and the bias the same way.
// Everything else (WMMA 16x16x16 fragments, the tiles, the pipeline, split K) is v2's. It takes
// plain and transposed matrices; the library's conv GEMMs run on v2 or v4.
#include "device.cuh"
#include "gemm_wmma.cuh"

namespace minamp::gpu {

namespace {

template <class Cfg, class OpA, class OpB, class CT>
__global__ void __launch_bounds__(Cfg::kThreads)
    gemm_v3_kernel(typename OpA::View a, typename OpB::View b, CT* c, int m, int n, int k,
                   int k_per_split, EpilogueArgs ep) {
  using Smem = WmmaSmem<Cfg, OpA, OpB>;
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  if constexpr (!arch_can_launch(Smem::kBytes, false)) {
    __trap(); // never launched where it cannot run (arch_can_launch)
  } else {
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
    gemm_pipeline_interior<Cfg, Smem>(smem, a, b, share, consume);
    __syncthreads(); // every warp is done reading the pipeline buffers

    float* staging = reinterpret_cast<float*>(smem_bytes);
    store_accumulators<Cfg>(staging, warp_row, warp_col, acc);
    __syncthreads();
    store_tile_packed<Cfg::BM, Cfg::BN, Cfg::kThreads>(staging, Cfg::kStagingLd, c, m, n, share.m0,
                                                       share.n0, ep);
  }
}

// v3 for GemmLaunch.
struct V3Family {
  using Large = WmmaLarge;
  using Small = WmmaSmall;
  static constexpr const char* kName = "gemm v3 (wmma, interior loads, packed epilogue)";
  static constexpr bool kColumnStatistics = true; // store_tile_packed has the hook
  template <class Cfg, class OpA, class OpB> static constexpr int smem_bytes() {
    return WmmaSmem<Cfg, OpA, OpB>::kBytes;
  }
  template <class Cfg, class OpA, class OpB, class CT> static auto kernel() {
    return gemm_v3_kernel<Cfg, OpA, OpB, CT>;
  }
};

} // namespace

GemmKernelInfo gemm_v3_kernel_info() {
  return large_kernel_info<V3Family>("v3", "gemm_v3_kernel", "WmmaConfig");
}

void gemm_v3_interior(const GemmArgs& args) {
  dispatch_operands<__half, GemmLaunch<V3Family>::On, OperandPairs::matrices>(args,
                                                                              V3Family::kName);
}

} // namespace minamp::gpu
