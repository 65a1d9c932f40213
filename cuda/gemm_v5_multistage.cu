// GEMM v5: v4's warps and fragments on a main loop that never lets the tensor cores wait for a
// barrier: one __syncthreads per K tile, placed before the last k-step's MMAs, and the next tile's
// first fragments loaded across it (the multistage schedule of CUTLASS's sm_80 GEMMs).
//
// What it changes from v4 (gemm_v4_mma.cu). v4 runs each K tile as: wait for its copies, barrier,
// issue the copies of a later tile, load the tile's first fragments, then the MMAs. Every warp
// reaches the barrier with nothing left to multiply, and after it waits once more for its first
// ldmatrix: the SASS of v4's main loop has 64 HMMA behind one BAR.SYNC and 16 LDSM whose first
// results the first HMMA needs. v5's loop over the k-steps of tile kt:
//   - steps 0 .. last-1: load the fragments of step + 1, then the MMAs of this step (as v4);
//   - the last step, whose fragments are already in registers: wait for tile kt + 1's copies,
//     barrier (every warp has issued its ldmatrix of tile kt, so tile kt's buffer is free), issue
//     the copies of tile kt + STAGES into that buffer, load tile kt + 1's first fragments, and only
//     then the last step's MMAs — the barrier's wait and the ldmatrix latency hide behind them.
// All STAGES buffers hold tiles in flight (v4 keeps one of them for the tile being read), and the
// wait is cp.async.wait_group STAGES - 2 at every tile. BK must hold an even number of 16-wide
// steps so that the double-buffered fragments line up from one tile to the next. The large tile
// is 128x256x64, 8 warps of 64x64 in 3 stages, with v4's 128x128 tile as a medium one for grids
// too small for it; everything else (small tile, loaders, epilogue, split K, conv views) is
// v4's.
//
// What it bought, measured (H200, bench_gemm, f16): on v4's 128x128 tiles, nothing — 4096^3 at
// 320.6 TFLOP/s against v4's 329.0 (the barrier was not what held v4 back); with 8 warps on
// 128x256 tiles, 355.9 (0.48 of cuBLAS), the best of the configurations swept, and sine's forward
// GEMM 212.8 against v4's 197.5. On an H100, BK = 64 on those tiles took sine's forward and
// input-gradient GEMMs from 202 to 215 TFLOP/s (0.63 of cuBLAS), 4096^3 unchanged. See
// bench/NOTES.md.
//
// On the large tiles one block fills an SM, so nothing covers a tile's start (the wait for its
// first K tile) or its epilogue; at K = 256 (sine's GEMMs, 4 K tiles) those are a large share of
// each tile. The sweep also times the large configuration on a persistent grid
// (gemm_v5_persistent_kernel: one block an SM walks the tiles, and each next tile's first K tile
// is in flight during the epilogue), which the library takes only once a GPU says it wins.
#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "gemm_v5.cuh"

namespace minamp::gpu {

GemmKernelInfo gemm_v5_kernel_info() {
  return large_kernel_info<V5Family>("v5", "gemm_v5_kernel", "MmaConfig");
}

// The f16 matrix/transposed pairs are instantiated here; the other three parts of v5's kernels
// have a file each (gemm.cuh).
void gemm_v5_multistage(const GemmArgs& args) {
  const bool conv_view = uses_conv_view(args);
  visit_half_precision(args.ab_dtype, V5Family::kName, [&](auto type) {
    if constexpr (std::is_same_v<typename decltype(type)::type, __half>) {
      if (conv_view)
        gemm_v5_conv_views(args);
      else
        dispatch_operands<__half, GemmLaunch<V5Family>::On, OperandPairs::matrices>(
            args, V5Family::kName);
    } else {
      conv_view ? gemm_v5_conv_views_bf16(args) : gemm_v5_multistage_bf16(args);
    }
  });
}

namespace {

// The large configuration on the persistent grid (run_persistent), for the sweep.
GemmCandidate persistent_candidate() {
  using Cfg = MultistageLarge;
  using OpA = OperandTraits<__half, OperandKind::matrix>;
  using OpB = OperandTraits<__half, OperandKind::transposed>;
  using OpBPlain = OperandTraits<__half, OperandKind::matrix>;
  GemmCandidate out;
  out.name = sweep_name<Cfg>("v5 persistent");
  out.smem_bytes =
      std::max(PersistentSmem<Cfg, OpA, OpB>::kBytes, PersistentSmem<Cfg, OpA, OpBPlain>::kBytes);
  out.run = [](const GemmArgs& args) {
    require_sweep_operands(args, V5Family::kName);
    const bool ran = args.b.kind == OperandKind::transposed
                         ? run_persistent<Cfg, OpA, OpB, __half>(args, args.c, args.epilogue)
                         : run_persistent<Cfg, OpA, OpBPlain, __half>(args, args.c, args.epilogue);
    require(ran, V5Family::kName, "the persistent grid needs more shared memory than the GPU has");
  };
  return out;
}

} // namespace

std::vector<GemmCandidate> gemm_v5_sweep() {
  return {sweep_candidate<V5Family, MmaConfig<128, 128, 64, 2, 2, 3>>("v5"),
          sweep_candidate<V5Family, MmaConfig<128, 128, 32, 2, 2, 4>>("v5"),
          sweep_candidate<V5Family, MmaConfig<128, 256, 32, 2, 4, 3>>("v5"),
          sweep_candidate<V5Family, MmaConfig<256, 128, 32, 4, 2, 3>>("v5"),
          persistent_candidate()};
}

} // namespace minamp::gpu
