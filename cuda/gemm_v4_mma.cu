// GEMM v4: ldmatrix + mma.sync (inline PTX, mma.cuh) on v3's pipeline, with 64x64 warp tiles and
// the fragments of the next k-step loaded while the tensor cores work on this one.
//
// What it changes from v3 (gemm_v3_interior.cu):
//   - Below WMMA. wmma::load_matrix_sync and mma_sync hide the fragment layout, and on sm_80+
//     a 16x16x16 mma_sync is two mma.sync.m16n8k16 instructions. v4 issues those itself, and
//     fills the fragments with ldmatrix: one instruction gives each lane its elements of four
//     8x8 matrices straight from the padded shared tiles (ldmatrix.trans for a tile stored the
//     other way round, so every transpose of A and B is one code path).
//   - Larger warp tiles. A warp owns 64x64 of C (v3: 64x32): per 16-wide k-step it loads 4 A
//     fragments and 8 B fragments (8 ldmatrix.x4) for 32 mma.sync, twice v3's MMAs per shared
//     load. The accumulators are 128 fp32 registers per thread; the block is 2x2 such warps
//     (128x128, 4 stages), so two blocks fit an SM by registers.
//   - Register double-buffering. The fragments of k-step kk + 1 are loaded before the mma.syncs
//     of step kk are issued, so shared-memory latency hides behind tensor-core work.
//   - Epilogue. Accumulators go from registers to the fp32 staging tile as float2 pairs (the
//     m16n8 layout gives each lane two adjacent columns; the tile's row stride of BN + 8 floats
//     keeps a half-warp's stores on distinct banks), then v3's 16-byte-pack epilogue.
// The loader (TileLoader), the pipeline and split K are v3's; the conv views go through the
// gathering loader as in v2, so v4 can run every GEMM of the library on sm_80 and later.
#include <string>
#include <vector>

#include "device.cuh"
#include "gemm_mma.cuh"

namespace minamp::gpu {

namespace {

// 4 warps of 64x64 and 4 warps of 32x32, on the tiles gemm_plan.h plans with.
using MmaLarge = MmaConfig<kMmaLargeTile.bm, kMmaLargeTile.bn, kMmaLargeTile.bk, 2, 2, 4>;
using MmaSmall = MmaConfig<kMmaSmallTile.bm, kMmaSmallTile.bn, kMmaSmallTile.bk, 2, 2, 4>;

// One BK tile: BK / 16 steps of MMA_M x MMA_N mma.sync, the next step's fragments loaded first.
template <class Cfg, class TileA, class TileB, class T>
__device__ __forceinline__ void mma_tile(const T* tile_a, const T* tile_b, int a_lane, int b_lane,
                                         float (&acc)[Cfg::MMA_M][Cfg::MMA_N][4]) {
  constexpr int kSteps = Cfg::BK / 16;
  Fragments<Cfg, T> frags[2];
  load_fragments<Cfg, TileA, TileB>(frags[0], tile_a, tile_b, a_lane, b_lane, 0);
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    if (step + 1 < kSteps)
      load_fragments<Cfg, TileA, TileB>(frags[(step + 1) % 2], tile_a, tile_b, a_lane, b_lane,
                                        (step + 1) * 16);
    mma_step(frags[step % 2], acc);
  }
}

// C[M, N] = epilogue(op(A) @ op(B)); one BM x BN tile of C per block.
template <class Cfg, class OpA, class OpB, class CT>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    gemm_v4_kernel(typename OpA::View a, typename OpB::View b, CT* c, int m, int n, int k,
                   int k_per_split, EpilogueArgs ep) {
  using Smem = GemmSmem<Cfg, OpA, OpB>;
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  using T = typename Smem::T;
  if constexpr (!arch_can_launch(Smem::kBytes, true)) {
    __trap(); // never launched where it cannot run (arch_can_launch)
  } else {
    extern __shared__ __align__(128) unsigned char smem_bytes[];
    T* smem = reinterpret_cast<T*>(smem_bytes);

    const BlockShare share = block_share<Cfg>(m, n, k, k_per_split, c);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warp_row = (warp / Cfg::WARPS_N) * Cfg::kWarpM; // within the block tile
    const int warp_col = (warp % Cfg::WARPS_N) * Cfg::kWarpN;
    // This lane's ldmatrix row addresses for the warp's first 16x16 blocks, as tile offsets.
    const int a_lane = LdmatrixLane<TileA, true>::offset(lane, warp_row, 0);
    const int b_lane = LdmatrixLane<TileB, false>::offset(lane, warp_col, 0);

    float acc[Cfg::MMA_M][Cfg::MMA_N][4] = {};
    const auto consume = [&](const T* tile_a, const T* tile_b) {
      mma_tile<Cfg, TileA, TileB>(tile_a, tile_b, a_lane, b_lane, acc);
    };
    gemm_pipeline_interior<Cfg, Smem>(smem, a, b, share, consume);
    __syncthreads(); // every warp is done reading the pipeline buffers

    float* staging = reinterpret_cast<float*>(smem_bytes);
    store_accumulators<Cfg>(staging, warp_row, warp_col, lane, acc);
    __syncthreads();
    store_tile_packed<Cfg::BM, Cfg::BN, Cfg::kThreads>(staging, Cfg::kStagingLd, c, m, n, share.m0,
                                                       share.n0, ep);
  }
}

// v4 for GemmLaunch.
struct V4Family {
  using Large = MmaLarge;
  using Small = MmaSmall;
  static constexpr const char* kName = "gemm v4 (ldmatrix + mma.sync)";
  static constexpr bool kColumnStatistics = true; // store_tile_packed has the hook
  template <class Cfg, class OpA, class OpB> static constexpr int smem_bytes() {
    return GemmSmem<Cfg, OpA, OpB>::kBytes;
  }
  template <class Cfg, class OpA, class OpB, class CT> static auto kernel() {
    return gemm_v4_kernel<Cfg, OpA, OpB, CT>;
  }
};

} // namespace

GemmKernelInfo gemm_v4_kernel_info() {
  return large_kernel_info<V4Family>("v4", "gemm_v4_kernel", "MmaConfig");
}

void gemm_v4_mma(const GemmArgs& args) {
  dispatch_half_operands<GemmLaunch<V4Family>::On>(args, V4Family::kName);
}

std::vector<GemmCandidate> gemm_v4_sweep() {
  return {sweep_candidate<V4Family, MmaConfig<128, 128, 64, 2, 2, 3>>("v4"),
          sweep_candidate<V4Family, MmaConfig<128, 128, 32, 2, 2, 3>>("v4")};
}

} // namespace minamp::gpu
