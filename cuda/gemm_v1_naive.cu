// GEMM v1: the smallest correct tensor-core GEMM. One warp per 16x16 tile of C; for each
// 16-wide step of K it loads an A and a B fragment straight from global memory
// (wmma::load_matrix_sync), multiplies them into an fp32 accumulator fragment (mma_sync), and at
// the end writes the tile through the epilogue.
//
// Nothing is shared: every warp reads its 16 rows of A and 16 columns of B from global memory,
// so each element of A is read N / 16 times and each of B M / 16 times (the L2 absorbs much of
// it), and each load waits for memory with nothing else to do. v2 (gemm_v2_wmma.cu) stages tiles
// in shared memory for a block of warps and overlaps the copies with the MMAs.
//
// load_matrix_sync needs a 32-byte aligned pointer and a leading dimension of whole 16-byte
// units; a 16x16 block that crosses the matrix's edge, or one that is not so aligned (K or N not
// a multiple of 8), is copied by the warp's lanes into a 16x16 block of shared memory first, with
// zeros outside the matrix, and loaded from there. The accumulators go through a per-warp fp32
// staging block to the element-wise epilogue. Plain and transposed matrices only.
#include <mma.h>

#include <type_traits>

#include "device.cuh"
#include "gemm.cuh"

namespace minamp::gpu {

namespace {

namespace wmma = nvcuda::wmma;

constexpr int kWarps = 4; // warps per block, one 16x16 tile of C each (stacked along M)

// The shared memory of one warp: edge blocks of A and B, and the staging block of C.
struct WarpScratch {
  __half a[16 * 16], b[16 * 16];
  float c[16 * 16];
};

// Loads the 16x16 block at (row0, col0) of a row-major [rows, cols] matrix into `fragment`
// (whose layout says how the block maps onto the fragment's rows and columns): straight from
// global memory when the block lies inside and is aligned, else through `edge`.
template <class Fragment>
__device__ void load_block(Fragment& fragment, const __half* data, int rows, int cols, int row0,
                           int col0, __half* edge) {
  const __half* block = data + int64_t(row0) * cols + col0;
  if (row0 + 16 <= rows && col0 + 16 <= cols && cols % 8 == 0 && is_aligned32(block)) {
    wmma::load_matrix_sync(fragment, block, unsigned(cols));
    return;
  }
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < 16 * 16; i += 32) {
    const int r = i / 16, c = i % 16;
    const bool inside = row0 + r < rows && col0 + c < cols;
    edge[i] = inside ? block[int64_t(r) * cols + c] : __float2half_rn(0.0f);
  }
  __syncwarp();
  wmma::load_matrix_sync(fragment, edge, 16);
  __syncwarp(); // every lane has read `edge` before the next step refills it
}

// A [M, K] (stored [K, M] when kTransA), B [K, N] (stored [N, K] when kTransB): warp w of block
// (x, y) computes C's tile at rows (x * kWarps + w) * 16, columns y * 16.
template <bool kTransA, bool kTransB, class CT>
__global__ void __launch_bounds__(kWarps * 32)
    gemm_v1_kernel(const __half* a, const __half* b, CT* c, int m, int n, int k, EpilogueArgs ep) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  WarpScratch& scratch = reinterpret_cast<WarpScratch*>(smem_bytes)[warp];
  const int row0 = (blockIdx.x * kWarps + warp) * 16, col0 = blockIdx.y * 16;
  if (row0 >= m) return; // no block-wide barrier follows

  using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, LayoutA> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, LayoutB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  for (int k0 = 0; k0 < k; k0 += 16) {
    if (kTransA)
      load_block(fa, a, k, m, k0, row0, scratch.a);
    else
      load_block(fa, a, m, k, row0, k0, scratch.a);
    if (kTransB)
      load_block(fb, b, n, k, col0, k0, scratch.b);
    else
      load_block(fb, b, k, n, k0, col0, scratch.b);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(scratch.c, acc, 16, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 16 * 16; i += 32) {
    const int row = row0 + i / 16, col = col0 + i % 16;
    if (row < m && col < n) store_output(c, n, row, col, scratch.c[i], ep);
  }
}

template <bool kTransA, bool kTransB, class CT> void launch(const GemmArgs& args) {
  const int64_t tiles_m = (args.m + 15) / 16, tiles_n = (args.n + 15) / 16;
  require(tiles_n <= 65535, "gemm v1", "N = ", args.n, " needs more than 65535 column tiles");
  const dim3 grid(unsigned((tiles_m + kWarps - 1) / kWarps), unsigned(tiles_n));
  constexpr int kSmemBytes = kWarps * int(sizeof(WarpScratch));
  gemm_v1_kernel<kTransA, kTransB, CT><<<grid, kWarps * 32, kSmemBytes, stream()>>>(
      static_cast<const __half*>(args.a.data), static_cast<const __half*>(args.b.data),
      static_cast<CT*>(args.c), int(args.m), int(args.n), int(args.k), args.epilogue);
  CUDA_CHECK_LAUNCH("gemm v1 (naive wmma)");
}

template <bool kTransA, bool kTransB> void launch_for_output(const GemmArgs& args) {
  if (args.c_dtype == DType::f16)
    launch<kTransA, kTransB, __half>(args);
  else
    launch<kTransA, kTransB, float>(args);
}

} // namespace

GemmKernelInfo gemm_v1_kernel_info() {
  return {"v1", "gemm_v1_kernel<false, false, __half>", kWarps * 32,
          kWarps * int(sizeof(WarpScratch))};
}

void gemm_v1_naive(const GemmArgs& args) {
  const auto plain = [](const GemmOperand& op) {
    return op.kind == OperandKind::matrix || op.kind == OperandKind::transposed;
  };
  require(plain(args.a) && plain(args.b), "gemm v1 (naive wmma)",
          "takes plain (or transposed) matrices only, not a convolution's gathered operand");
  const bool ta = args.a.kind == OperandKind::transposed;
  const bool tb = args.b.kind == OperandKind::transposed;
  if (ta && tb)
    launch_for_output<true, true>(args);
  else if (ta)
    launch_for_output<true, false>(args);
  else if (tb)
    launch_for_output<false, true>(args);
  else
    launch_for_output<false, false>(args);
  column_statistics_of_output(args); // no epilogue hooks in v1
}

} // namespace minamp::gpu
