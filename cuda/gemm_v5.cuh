// GEMM v5's kernel and its tile configurations (gemm_v5_multistage.cu says what v5 is), shared by
// the four files that instantiate it, so that the parts of the largest kernel family compile in
// parallel: gemm_v5_multistage.cu and gemm_v5_multistage_bf16.cu for the matrix/transposed operand
// pairs of f16 and bf16, gemm_v5_conv_views.cu and gemm_v5_conv_views_bf16.cu for a convolution's
// views of each. Each file gets its own copy (an unnamed namespace) and instantiates only its own
// part.
#pragma once

#include "device.cuh"
#include "gemm_mma.cuh"

namespace minamp::gpu {

namespace {

// 8 warps of 64x64 in 3 stages (one block per SM: up to 166 KB of shared memory for the pipeline,
// 135 KB of it reused for the epilogue's staging tile); v4's large configuration, 4 warps of 64x64
// in 4 stages, for grids too small for the 128x256 tiles (gemm_plan.h); and v4's small one, 4 warps
// of 32x32 in 4 stages.
using MultistageLarge =
    MmaConfig<kMultistageLargeTile.bm, kMultistageLargeTile.bn, kMultistageLargeTile.bk, 2, 4, 3>;
using MultistageMedium = MmaConfig<kMmaLargeTile.bm, kMmaLargeTile.bn, kMmaLargeTile.bk, 2, 2, 4>;
using MultistageSmall = MmaConfig<kMmaSmallTile.bm, kMmaSmallTile.bn, kMmaSmallTile.bk, 2, 2, 4>;

// The main loop over `k_tiles` tiles (see the top of gemm_v5_multistage.cu); load_a(tile, kt) and
// load_b(tile, kt) issue the copies of K tile kt. A loader whose finish is branch-free
// (kFinishesInStep: the interior tiles of a normalised operand) has tile kt + 1 finished during
// tile kt's first k-step, in the same basic block as that step's MMAs, so that ptxas interleaves
// the two, rather than just before the barrier, where every warp waits for the slowest and the
// tensor pipes idle; the last tile, which has no next one, then runs as a loop of its own, so that
// no test of kt + 1 splits the block. kFirstInFlight: K tile 0's copies into stage 0 were issued
// (and committed as one group) before the call, as the persistent kernel does during the epilogue
// of the tile before.
template <class Cfg, class Smem, bool kFirstInFlight = false, class LoadA, class LoadB>
__device__ __forceinline__ void
multistage_loop(typename Smem::T* smem, int k_tiles, const LoadA& load_a, const LoadB& load_b,
                int a_lane, int b_lane, float (&acc)[Cfg::MMA_M][Cfg::MMA_N][4]) {
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  constexpr int kStages = Cfg::STAGES, kSteps = Cfg::BK / 16;
  static_assert(kSteps % 2 == 0, "the fragment buffers alternate across tiles");
  constexpr bool kFinishInStep = LoadA::kFinishesInStep || LoadB::kFinishesInStep;
  const auto stage_a = [&](int s) { return smem + s * Smem::kStageElems; };
  const auto stage_b = [&](int s) { return smem + s * Smem::kStageElems + TileA::kElems; };
  const auto load_stage = [&](int s, int k_tile) {
    if (k_tile < k_tiles) {
      load_a(stage_a(s), k_tile);
      load_b(stage_b(s), k_tile);
    }
    cp_async_commit(); // one group per tile, empty past the end: the count stays uniform
  };

  // After this thread's copies of tile k_tile (< k_tiles) have landed: a normalised operand is
  // normalised; no warp reads them before the next barrier. finish_in_step(s, k_tile, step) is
  // k-step `step`'s share when the loaders finish in step: part i of a loader's finish at step
  // min(i, kSteps - 2), the last before the barrier's (a loader that does not finish in parts
  // finishes whole at step 0).
  const auto finish_stage = [&](int s, int k_tile) {
    load_a.finish(stage_a(s), k_tile);
    load_b.finish(stage_b(s), k_tile);
  };
  const auto finish_in_step = [&](int s, int k_tile, int step) {
    const auto finish_parts = [&](const auto& load, auto* tile) {
      using Load = std::decay_t<decltype(load)>;
      if constexpr (Load::kFinishesInStep) {
#pragma unroll
        for (int part = step; part < Load::kFinishParts; ++part)
          if (part == step || step == kSteps - 2) load.finish_part(tile, k_tile, part);
      } else if (step == 0) {
        load.finish(tile, k_tile);
      }
    };
    finish_parts(load_a, stage_a(s));
    finish_parts(load_b, stage_b(s));
  };

  // Tiles 0 .. STAGES-1 in flight; wait for tile 0 and load its first fragments.
#pragma unroll
  for (int s = kFirstInFlight ? 1 : 0; s < kStages; ++s) load_stage(s, s);
  cp_async_wait<kStages - 1>();
  if (k_tiles > 0) finish_stage(0, 0);
  __syncthreads();
  Fragments<Cfg, typename Smem::T> frags[2];
  load_fragments<Cfg, TileA, TileB>(frags[0], stage_a(0), stage_b(0), a_lane, b_lane, 0);

  // The k-steps of tile kt; has_next (a std::bool_constant) says whether tile kt + 1 is known to
  // exist at compile time (kFinishInStep), else it is tested.
  const auto run_tile = [&](int kt, auto has_next) {
    constexpr bool kHasNext = decltype(has_next)::value;
    const int s = kt % kStages;
#pragma unroll
    for (int step = 0; step < kSteps; ++step) {
      Fragments<Cfg, typename Smem::T>& next = frags[(step + 1) % 2];
      if (step + 1 < kSteps) {
        if constexpr (kFinishInStep && kHasNext) {     // before the next fragments' loads, whose
          if (step == 0) cp_async_wait<kStages - 2>(); // registers it can use; tile kt + 1's
          finish_in_step((kt + 1) % kStages, kt + 1, step); // copies (this thread's) have landed
        }
        load_fragments<Cfg, TileA, TileB>(next, stage_a(s), stage_b(s), a_lane, b_lane,
                                          (step + 1) * 16);
      } else {
        const int s_next = (kt + 1) % kStages;
        if constexpr (!kFinishInStep) {
          cp_async_wait<kStages - 2>(); // this thread's copies of tile kt + 1 have landed
          if (kt + 1 < k_tiles) finish_stage(s_next, kt + 1);
        }
        __syncthreads(); // everyone's have (and are finished), and every warp is done with tile kt
        load_stage(s, kt + kStages);
        load_fragments<Cfg, TileA, TileB>(next, stage_a(s_next), stage_b(s_next), a_lane, b_lane,
                                          0);
      }
      mma_step(frags[step % 2], acc);
    }
  };
  if constexpr (kFinishInStep) {
    for (int kt = 0; kt + 1 < k_tiles; ++kt) run_tile(kt, std::true_type{});
    if (k_tiles > 0) run_tile(k_tiles - 1, std::false_type{});
  } else {
    for (int kt = 0; kt < k_tiles; ++kt) run_tile(kt, std::true_type{});
  }
  cp_async_wait<0>(); // only empty groups can remain
}

// This thread's warp in the block tile: where its kWarpM x kWarpN tile starts, and its lane's
// ldmatrix offsets in the A and B tiles.
template <class Cfg, class Smem> struct WarpPlace {
  int lane, row, col, a_lane, b_lane;
  __device__ __forceinline__ WarpPlace() {
    const int warp = threadIdx.x / 32;
    lane = threadIdx.x % 32;
    row = (warp / Cfg::WARPS_N) * Cfg::kWarpM;
    col = (warp % Cfg::WARPS_N) * Cfg::kWarpN;
    a_lane = LdmatrixLane<typename Smem::TileA, true>::offset(lane, row, 0);
    b_lane = LdmatrixLane<typename Smem::TileB, false>::offset(lane, col, 0);
  }
};

// C[M, N] = epilogue(op(A) @ op(B)); one BM x BN tile of C per block.
template <class Cfg, class OpA, class OpB, class CT>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    gemm_v5_kernel(typename OpA::View a, typename OpB::View b, CT* c, int m, int n, int k,
                   int k_per_split, EpilogueArgs ep) {
  using Smem = GemmSmem<Cfg, OpA, OpB>;
  if constexpr (!arch_can_launch(Smem::kBytes, true)) {
    __trap(); // never launched where it cannot run (arch_can_launch)
  } else {
    extern __shared__ __align__(128) unsigned char smem_bytes[];
    auto* smem = reinterpret_cast<typename Smem::T*>(smem_bytes);

    const BlockShare share = block_share<Cfg>(m, n, k, k_per_split, c);
    const WarpPlace<Cfg, Smem> warp;
    float acc[Cfg::MMA_M][Cfg::MMA_N][4] = {};
    with_tile_loaders<Cfg, Smem>(a, b, share, [&](const auto& load_a, const auto& load_b) {
      multistage_loop<Cfg, Smem>(smem, share_k_tiles<Cfg>(share), load_a, load_b, warp.a_lane,
                                 warp.b_lane, acc);
    });
    __syncthreads(); // every warp is done reading the pipeline buffers

    float* staging = reinterpret_cast<float*>(smem_bytes);
    store_accumulators<Cfg>(staging, warp.row, warp.col, warp.lane, acc);
    __syncthreads();
    store_tile_packed<Cfg::BM, Cfg::BN, Cfg::kThreads>(staging, Cfg::kStagingLd, c, m, n, share.m0,
                                                       share.n0, ep);
  }
}

// The persistent form of gemm_v5_kernel, without split K: a grid of at most one block an SM
// (run_persistent) walks C's tiles (tile, tile + gridDim.x, ...: the row tiles of one column tile
// of C in turn, as consecutive blocks of gemm_v5_kernel's grid are) and puts each next tile's
// first K tile in flight before its epilogue. The fp32 staging tile lies past pipeline stage 0
// (PersistentSmem), so those copies land while the epilogue runs; in gemm_v5_kernel, one block an
// SM on the large tiles, every tile waits for its first K tile with nothing to overlap it.
template <class Cfg, class OpA, class OpB> struct PersistentSmem {
  using Smem = GemmSmem<Cfg, OpA, OpB>;
  static constexpr int kStageBytes = Smem::kStageElems * int(sizeof(typename Smem::T));
  static constexpr int kRestBytes = (Cfg::STAGES - 1) * kStageBytes;
  static constexpr int kBytes =
      kStageBytes + (kRestBytes > Smem::kStagingBytes ? kRestBytes : Smem::kStagingBytes);
  static_assert(kStageBytes % 16 == 0, "the staging tile's packs are 16-byte aligned");
};

template <class Cfg, class OpA, class OpB, class CT>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_v5_persistent_kernel(typename OpA::View a, typename OpB::View b, CT* c, int m, int n,
                              int k, EpilogueArgs ep) {
  using Smem = GemmSmem<Cfg, OpA, OpB>;
  if constexpr (!arch_can_launch(PersistentSmem<Cfg, OpA, OpB>::kBytes, true)) {
    __trap(); // never launched where it cannot run (arch_can_launch)
  } else {
    extern __shared__ __align__(128) unsigned char smem_bytes[];
    auto* smem = reinterpret_cast<typename Smem::T*>(smem_bytes);
    float* staging = reinterpret_cast<float*>(smem + Smem::kStageElems); // past stage 0
    const WarpPlace<Cfg, Smem> warp;

    const int row_tiles = (m + Cfg::BM - 1) / Cfg::BM;
    const int tiles = row_tiles * ((n + Cfg::BN - 1) / Cfg::BN);
    const auto share_of = [&](int tile) {
      return BlockShare{tile % row_tiles * Cfg::BM, tile / row_tiles * Cfg::BN, 0, k};
    };
    // K tile 0 of `tile` (if any) into stage 0, as one commit group.
    const auto issue_first = [&](int tile) {
      if (tile < tiles && k > 0)
        with_tile_loaders<Cfg, Smem>(a, b, share_of(tile),
                                     [&](const auto& load_a, const auto& load_b) {
                                       load_a(smem, 0);
                                       load_b(smem + Smem::TileA::kElems, 0);
                                     });
      cp_async_commit();
    };

    issue_first(blockIdx.x);
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const BlockShare share = share_of(tile);
      float acc[Cfg::MMA_M][Cfg::MMA_N][4] = {};
      with_tile_loaders<Cfg, Smem>(a, b, share, [&](const auto& load_a, const auto& load_b) {
        multistage_loop<Cfg, Smem, true>(smem, share_k_tiles<Cfg>(share), load_a, load_b,
                                         warp.a_lane, warp.b_lane, acc);
      });
      __syncthreads(); // every warp is done reading the pipeline buffers
      issue_first(tile + gridDim.x);
      store_accumulators<Cfg>(staging, warp.row, warp.col, warp.lane, acc);
      __syncthreads();
      store_tile_packed<Cfg::BM, Cfg::BN, Cfg::kThreads>(staging, Cfg::kStagingLd, c, m, n,
                                                         share.m0, share.n0, ep);
      __syncthreads(); // every thread is done with the staging tile, which stages 1.. overlap
    }
    cp_async_wait<0>(); // the last, empty group
  }
}

// Launches gemm_v5_persistent_kernel on Cfg for C of CT, whole K: a block for each SM the planner
// plans for (planning_sm_count), or one a tile where C has fewer. Returns false, launching nothing,
// where the GPU has too little shared memory for it.
template <class Cfg, class OpA, class OpB, class CT>
bool run_persistent(const GemmArgs& args, void* c, const EpilogueArgs& epilogue) {
  constexpr int kSmemBytes = PersistentSmem<Cfg, OpA, OpB>::kBytes;
  if (kSmemBytes > max_dynamic_smem()) return false;
  const auto kernel = gemm_v5_persistent_kernel<Cfg, OpA, OpB, CT>;
  static const bool smem_ready = (allow_dynamic_smem(kernel, kSmemBytes), true);
  (void)smem_ready;
  const int64_t tiles = (args.m + Cfg::BM - 1) / Cfg::BM * ((args.n + Cfg::BN - 1) / Cfg::BN);
  const int blocks = int(std::min<int64_t>(tiles, planning_sm_count()));
  if (blocks == 0) return true;
  kernel<<<blocks, Cfg::kThreads, kSmemBytes, stream()>>>(OpA::view(args.a), OpB::view(args.b),
                                                          static_cast<CT*>(c), int(args.m),
                                                          int(args.n), int(args.k), epilogue);
  CUDA_CHECK_LAUNCH("gemm v5 (mma.sync, multistage, persistent)");
  return true;
}

// v5 for GemmLaunch.
struct V5Family {
  using Large = MultistageLarge;
  using Medium = MultistageMedium;
  using Small = MultistageSmall;
  static constexpr const char* kName = "gemm v5 (mma.sync, multistage)";
  static constexpr bool kColumnStatistics = true; // store_tile_packed has the hook
  template <class Cfg, class OpA, class OpB> static constexpr int smem_bytes() {
    return GemmSmem<Cfg, OpA, OpB>::kBytes;
  }
  template <class Cfg, class OpA, class OpB, class CT> static auto kernel() {
    return gemm_v5_kernel<Cfg, OpA, OpB, CT>;
  }
  // Its large tiles on a persistent grid where gemm_persistent_tiles() asks for it.
  static constexpr bool kPersistentTiles = true;
  template <class Cfg, class OpA, class OpB, class CT>
  static bool run_persistent_tiles(const GemmArgs& args, void* c, const EpilogueArgs& epilogue) {
    return run_persistent<Cfg, OpA, OpB, CT>(args, c, epilogue);
  }
};

} // namespace

} // namespace minamp::gpu
