// The fp32 SIMT GEMM (plain FFMA, no tensor cores), used when A and B are f32.
//
// Tiling. Each block computes a BM x BN tile of C with (BM / TM) x (BN / TN) threads, each
// holding a TM x TN block of fp32 accumulators in registers (128x128 tiles with 8x8 per thread
// for large problems, 64x64 with 4x4 when the large tiles would leave SMs idle or pad a thin C,
// see plan_gemm). Warps are 8 threads along N by 4 along M, so a warp reads few
// distinct shared-memory words per step.
//
// Pipeline. The WMMA kernel's (gemm_pipeline in gemm.cuh, described in gemm_v2_wmma.cu) with
// BK = 16 and STAGES = 3: rotating shared buffers filled by 16-byte cp.async chunks (plain loads
// before sm_80), one commit group per k-step, wait + __syncthreads before each step, the next
// copy issued into the buffer freed by the previous step. Tiles keep the global orientation (see
// TileShape in gemm.cuh) and the loaders zero-fill everything outside the matrices, so edges need
// no special case here.
//
// Which C rows/columns a thread owns depends on the tile orientation along that axis:
//   outer-contiguous tile (A transposed, B untransposed): runs of 4 (t*4 .. t*4+3, then the
//     same 4 * threads further on), read with one float4 per run;
//   k-contiguous tile (A untransposed, B transposed): strided (t, t + threads, ...), read one
//     float at a time; neighbouring threads then read rows kLd = BK + 4 floats apart, which
//     land in different banks.
//
// Epilogue. Straight from registers: alpha/beta/bias/ReLU in fp32 per element, rows/columns
// outside C skipped, beta == 0 never reads C.
#include "device.cuh"
#include "gemm.cuh"

namespace minamp::gpu {

namespace {

template <int BM_, int BN_, int BK_, int TM_, int TN_, int STAGES_> struct SimtConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_, STAGES = STAGES_;
  static constexpr int kThreadsM = BM / TM, kThreadsN = BN / TN;
  static constexpr int kThreads = kThreadsM * kThreadsN;
  static constexpr int kWarpsN = kThreadsN / 8; // a warp is 8 threads along N x 4 along M
  static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are made of float4 runs");
  static_assert(kThreadsN % 8 == 0 && kThreadsM % 4 == 0 && kThreads % 32 == 0, "8x4 warps");
};

// 256 threads each, on the tiles gemm_plan.h plans with.
using SimtLarge = SimtConfig<kSimtLargeTile.bm, kSimtLargeTile.bn, kSimtLargeTile.bk, 8, 8, 3>;
using SimtSmall = SimtConfig<kSimtSmallTile.bm, kSimtSmallTile.bn, kSimtSmallTile.bk, 4, 4, 3>;

template <class Cfg, bool kTransA, bool kTransB> struct SimtSmem {
  using TileA = TileShape<float, !kTransA, Cfg::BM, Cfg::BK>;
  using TileB = TileShape<float, kTransB, Cfg::BN, Cfg::BK>;
  static constexpr int kStageElems = TileA::kElems + TileB::kElems;
  static constexpr int kBytes = Cfg::STAGES * kStageElems * int(sizeof(float));
};

// The i-th of a thread's rows (or columns) in the tile, for thread position t of `threads`
// along that axis: runs of 4 when the tile is contiguous along the axis, strided otherwise.
template <bool kRuns> __device__ __forceinline__ int owned_index(int t, int threads, int i) {
  return kRuns ? (i / 4) * threads * 4 + t * 4 + i % 4 : t + threads * i;
}

// The thread's COUNT values of one operand at k index `k` of the tile.
template <class Tile, int COUNT, int THREADS>
__device__ __forceinline__ void load_fragment(float (&out)[COUNT], const float* tile, int t,
                                              int k) {
  if constexpr (Tile::kKContiguous) {
#pragma unroll
    for (int i = 0; i < COUNT; ++i)
      out[i] = tile[Tile::offset(owned_index<false>(t, THREADS, i), k)];
  } else {
#pragma unroll
    for (int i = 0; i < COUNT; i += 4) {
      const float4 run = *reinterpret_cast<const float4*>(
          tile + Tile::offset(owned_index<true>(t, THREADS, i), k));
      out[i] = run.x, out[i + 1] = run.y, out[i + 2] = run.z, out[i + 3] = run.w;
    }
  }
}

// C[M, N] = epilogue(op(A) @ op(B)) in fp32; one BM x BN tile of C per block.
template <class Cfg, class OpA, class OpB, class CT>
__global__ void __launch_bounds__(Cfg::kThreads)
    simt_gemm_kernel(typename OpA::View a, typename OpB::View b, CT* c, int m, int n, int k,
                     int k_per_split, EpilogueArgs ep) {
  using Smem = SimtSmem<Cfg, OpA::kTransposed, OpB::kTransposed>;
  using TileA = typename Smem::TileA;
  using TileB = typename Smem::TileB;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  float* smem = reinterpret_cast<float*>(smem_bytes);

  const BlockShare share = block_share<Cfg>(m, n, k, k_per_split, c);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tx = (warp % Cfg::kWarpsN) * 8 + lane % 8; // thread position along N
  const int ty = (warp / Cfg::kWarpsN) * 4 + lane / 8; // thread position along M

  float acc[Cfg::TM][Cfg::TN];
#pragma unroll
  for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = 0.0f;

  // One k-step: each thread's TM x TN outer products of an A column and a B row.
  const auto consume = [&](const float* tile_a, const float* tile_b) {
  // Unrolling by 4 rather than BK keeps ptxas from hoisting every shared-memory load of the
  // step into registers (212 registers when both tiles are k-contiguous; <= 128 this way).
#pragma unroll 4
    for (int kk = 0; kk < Cfg::BK; ++kk) {
      float a_col[Cfg::TM], b_row[Cfg::TN];
      load_fragment<TileA, Cfg::TM, Cfg::kThreadsM>(a_col, tile_a, ty, kk);
      load_fragment<TileB, Cfg::TN, Cfg::kThreadsN>(b_row, tile_b, tx, kk);
#pragma unroll
      for (int i = 0; i < Cfg::TM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::TN; ++j) acc[i][j] = fmaf(a_col[i], b_row[j], acc[i][j]);
    }
  };
  gemm_pipeline<Cfg, Smem>(smem, a, b, share, consume);

#pragma unroll
  for (int i = 0; i < Cfg::TM; ++i) {
    const int row = share.m0 + owned_index<!TileA::kKContiguous>(ty, Cfg::kThreadsM, i);
    if (row >= m) continue;
#pragma unroll
    for (int j = 0; j < Cfg::TN; ++j) {
      const int col = share.n0 + owned_index<!TileB::kKContiguous>(tx, Cfg::kThreadsN, j);
      if (col < n) store_output(c, n, row, col, acc[i][j], ep);
    }
  }
}

// The SIMT kernel family for GemmLaunch.
struct SimtFamily {
  using Large = SimtLarge;
  using Small = SimtSmall;
  static constexpr const char* kName = "gemm (fp32 simt)";
  static constexpr bool kColumnStatistics = false; // its epilogue writes element by element
  template <class Cfg, class OpA, class OpB> static constexpr int smem_bytes() {
    return SimtSmem<Cfg, OpA::kTransposed, OpB::kTransposed>::kBytes;
  }
  template <class Cfg, class OpA, class OpB, class CT> static auto kernel() {
    return simt_gemm_kernel<Cfg, OpA, OpB, CT>;
  }
};

} // namespace

void simt_gemm(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0) return;
  dispatch_operands<float, GemmLaunch<SimtFamily>::On>(args, SimtFamily::kName);
}

} // namespace minamp::gpu
