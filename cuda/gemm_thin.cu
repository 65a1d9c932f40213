// GEMMs too thin for tensor-core tiles, on CUDA cores: a K of a few elements (sine's first 1x1
// conv, K = 2 input channels, and the input gradient of its last one, K = 1) or an N of a few
// columns over many rows (its last conv, N = 1 output channel). A tensor-core block tile pads
// K = 2 to BK = 32 and copies its two columns element by element, or N = 1 to a 64-wide tile
// of which one column is kept: 16x to 64x the arithmetic of the GEMM, for what is a pass over
// memory. These kernels read each operand once and do the FMAs in fp32 (products of the widened
// inputs, summed in k order), with the fused epilogue; the planner sends a GEMM here when
// gemm_version() is automatic (thin_gemm_applies, gemm.cuh).
//
//   thin K (K <= kThinK): a thread computes 4 consecutive columns of one row of C from the row's
//     K values of A, writing them as one pack where C's rows allow. When the block's threads
//     cover whole rows of C (N / 4 divides the 256 threads, as N = 256 does), each thread keeps
//     the same columns in every step: it reads their B values and bias once and walks the rows
//     with no index division (the kernel is one pass over C). When C is also the gradient of a
//     batch norm's output (GemmArgs::batchnorm_grad: sine's last conv, K = 1, applied the batch
//     norm before it as it loaded its input), each thread adds up its columns' gradient terms as
//     it stores them; the block adds its threads' sums per column in order;
//   thin N (N <= kThinN, M >= kThinNMinRows): a warp sums one row of A against the N columns of
//     B, each lane 4 consecutive k at a time (one 8- or 16-byte load where the row allows), the
//     lanes' partial sums added by shuffles; where K fits 2 such loads a lane, the lanes keep
//     their B values in registers and the warp loads 4 rows before it sums any (sine's last conv,
//     K = 256); a transposed A ([K, M], m contiguous) is read one
//     row per thread instead, consecutive threads on consecutive rows. An untransposed A may be
//     a normalised operand (gemm.cuh's GemmOperand::normalization: a 1x1 conv applying the batch
//     norm before it): each value is normalised as it loads and rounded to A's dtype, the value the
//     batch norm kernel would have stored.
// Plain and transposed matrices otherwise: the conv views with such shapes are 1x1 convs, which
// the conv ops pass as plain matrices.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "channel_packs.cuh"
#include "device.cuh"
#include "gemm.cuh"
#include "reduce.cuh"

namespace minamp::gpu {

namespace {

constexpr int kThreads = 256;

// Where element (i, k) of op(A) [M, K] is stored, and element (k, j) of op(B) [K, N] widened, from
// their stored layouts.
template <bool kTransA>
__device__ __forceinline__ int64_t a_index(int m, int k, int64_t i, int kk) {
  return kTransA ? int64_t(kk) * m + i : i * k + kk;
}
template <bool kTransB, class T>
__device__ __forceinline__ float b_at(const T* b, int k, int n, int kk, int j) {
  return load_f(b, kTransB ? int64_t(j) * k + kk : int64_t(kk) * n + j);
}

// The values of a thread's 4 columns from col, which the fixed-columns kernel reads once and the
// other kernel once a step: op(B) at (kk, col + e) and the bias, 0 past N or K (and the bias
// without one), so that the products and the packed store use them with no test.
template <bool kTransB, class T> struct ThinColumns {
  float b[4][kThinK];
  float bias[4];
  __device__ ThinColumns(const T* b_data, int k, int n, int col, const EpilogueArgs& ep) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
      for (int kk = 0; kk < kThinK; ++kk)
        b[e][kk] = col + e < n && kk < k ? b_at<kTransB>(b_data, k, n, kk, col + e) : 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) bias[e] = col + e < n && ep.bias ? ep.bias[col + e] : 0.0f;
  }
};

// a_row[kk] = op(A)[row, kk] as stored for kk < k, 0 after: held as stored, and widened where
// thin_row_products uses it, so that a thread with several rows in flight issues all their loads
// before it waits for the first (a value widened as it loads is waited for there).
template <bool kTransA, class T>
__device__ __forceinline__ void load_thin_row(const T* a, int m, int k, int64_t row,
                                              T (&a_row)[kThinK]) {
#pragma unroll
  for (int kk = 0; kk < kThinK; ++kk) a_row[kk] = kk < k ? a[a_index<kTransA>(m, k, row, kk)] : T{};
}

// acc[e] = sum over kk < k of a_row[kk] * b[e][kk], in k order (a_row as load_thin_row stores it;
// b: ThinColumns' values, 0 past N, so that no column is tested here).
template <class T>
__device__ __forceinline__ void thin_row_products(const T (&a_row)[kThinK], int k,
                                                  const float (&b)[4][kThinK], float (&acc)[4]) {
  float a_values[kThinK];
#pragma unroll
  for (int kk = 0; kk < kThinK; ++kk) a_values[kk] = load_f(a_row, kk);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    acc[e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kThinK; ++kk)
      if (kk < k) acc[e] += a_values[kk] * b[e][kk];
  }
}

// v = relu(alpha * acc + beta * C_old + bias), for the 4 columns from col of one row of C (row <
// M, an int), stored as one pack when `pack` (N a multiple of 4, C aligned) and beta is 0, else
// element by element up to N; acc becomes the values as stored (those past N are left as they
// were). In the pack, the bias is added as the 0 that bias[] holds without one and the ReLU is a
// floor (relu_floor): store_output's values, with no branch on either.
template <class CT>
__device__ __forceinline__ void store_four(CT* c, int n, int row, int col, float (&acc)[4],
                                           const float (&bias)[4], const EpilogueArgs& ep,
                                           bool pack) {
  if (!pack || ep.beta != 0.0f) {
    for (int e = 0; e < 4 && col + e < n; ++e)
      acc[e] = store_output(c, n, row, col + e, acc[e], ep);
    return;
  }
  const float floor = relu_floor(ep.relu);
  Float4 v;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float x = ep.alpha * acc[e] + bias[e];
    v.v[e] = x < floor ? floor : x; // a NaN passes, as in torch.relu
  }
  const Stored4<CT> stored = round4<CT>(v);
  store4_stored(c, int64_t(row) * n + col, stored);
  const Float4 values = widen4<CT>(stored);
#pragma unroll
  for (int e = 0; e < 4; ++e) acc[e] = values.v[e];
}

// The batch norm input x at (row, col + e), e < 4, as stored (0 past N; C being that batch norm's
// output gradient), read as one pack when `pack`; widen4 gives the values. Held as stored for the
// reason load_thin_row's row is.
template <class CT>
__device__ __forceinline__ Stored4<CT> load_grad_x(const BatchNormGradient& grad, int n,
                                                   int64_t row, int col, bool pack) {
  const CT* x = static_cast<const CT*>(grad.x) + row * n;
  if (pack) return load4_stored(x, col);
  CT values[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) values[e] = col + e < n ? x[col + e] : CT{};
  Stored4<CT> stored;
  static_assert(sizeof stored == sizeof values, "four values as one pack stores them");
  memcpy(&stored, values, sizeof stored);
  return stored;
}

// Adds the batch norm gradient terms (batchnorm_grad_terms) of C[row, col + e] as stored (dy[e])
// and of the batch norm's input there (xs[e]) to a thread's sums of its 4 columns. Columns past N
// get sums too, never stored.
__device__ __forceinline__ void add_grad_terms(const BatchNormGradient& grad,
                                               const ChannelValues<4>& ch, const float (&xs)[4],
                                               const float (&dy)[4], float (&sum)[4],
                                               float (&sum_xhat)[4]) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float xhat, dy_hat;
    batchnorm_grad_terms(xs[e], dy[e], ch.gamma[e], ch.beta[e], ch.mean[e], ch.invstd[e],
                         grad.channels.relu, xhat, dy_hat);
    sum[e] += dy_hat;
    sum_xhat[e] += dy_hat * xhat;
  }
}

// Adds C[row, col + e] as stored (v[e]) to a thread's running moments of its 4 columns over the
// `count` rows it has stored, this one included (Welford's update: each value moves the mean by
// its deviation over the count, and M2 by that deviation times the one from the moved mean; no
// sum of squares, no cancellation). Columns past N get figures too, never stored.
__device__ __forceinline__ void add_moments(int count, const float (&v)[4], float (&mean)[4],
                                            float (&m2)[4]) {
  const float share = reciprocal_of_count(count);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float delta = v[e] - mean[e];
    mean[e] = fmaf(delta, share, mean[e]);
    m2[e] = fmaf(delta, v[e] - mean[e], m2[e]);
  }
}

// Bytes of shared memory the thin-K kernel's per-block figures (gradient sums or moments) need:
// [lanes][2][groups * 4] floats.
constexpr int kThinPartialsBytes = 2 * kThreads * 4 * int(sizeof(float));

// Puts each thread's two figures of its 4 columns (from threadIdx.x % groups * 4, the same in
// every step) into shared memory as [lanes][2][groups * 4], lane = threadIdx.x / groups, and
// returns it once the whole block's are there.
__device__ __forceinline__ const float* share_thin_figures(const float (&first)[4],
                                                           const float (&second)[4], int n) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  float* lanes = reinterpret_cast<float*>(smem_bytes);
  const int groups = (n + 3) / 4, width = groups * 4;
  const int lane = threadIdx.x / groups, first_col = threadIdx.x % groups * 4;
  for (int e = 0; e < 4; ++e) {
    lanes[2 * lane * width + first_col + e] = first[e];
    lanes[(2 * lane + 1) * width + first_col + e] = second[e];
  }
  __syncthreads();
  return lanes;
}

// partials[blockIdx.x, 0, col] and [.., 1, col] = the block's sums of column col (sum dy_hat, sum
// dy_hat xhat): its lanes' added in lane order by one thread per column.
__device__ __forceinline__ void store_thin_grad_partials(const float (&sum)[4],
                                                         const float (&sum_xhat)[4], int n,
                                                         float* partials) {
  const float* lanes = share_thin_figures(sum, sum_xhat, n);
  const int width = (n + 3) / 4 * 4, lane_count = kThreads / ((n + 3) / 4);
  float* dy_hat_sums = partials + int64_t(blockIdx.x) * 2 * n; // [2, N] of this block
  for (int c = threadIdx.x; c < n; c += kThreads) {
    float total = 0.0f, total_xhat = 0.0f;
    for (int l = 0; l < lane_count; ++l) {
      total += lanes[2 * l * width + c];
      total_xhat += lanes[(2 * l + 1) * width + c];
    }
    dy_hat_sums[c] = total;
    dy_hat_sums[n + c] = total_xhat;
  }
}

// partials[blockIdx.x, 0, col] and [.., 1, col] = the mean and M2 of column col over the block's
// `rows` rows of C: its lanes' moments merged in lane order (Chan) by one thread per column. Lane
// l has stored rows l, l + lanes, ... of the block's.
__device__ __forceinline__ void store_thin_moment_partials(const float (&mean)[4],
                                                           const float (&m2)[4], int n,
                                                           int64_t rows, float* partials) {
  const float* lanes = share_thin_figures(mean, m2, n);
  const int width = (n + 3) / 4 * 4, lane_count = kThreads / ((n + 3) / 4);
  float* means = partials + int64_t(blockIdx.x) * 2 * n; // [2, N] of this block
  for (int c = threadIdx.x; c < n; c += kThreads) {
    Moments merged{0, 0.0f, 0.0f};
    for (int l = 0; l < lane_count && l < rows; ++l) {
      const long long count = (rows - l + lane_count - 1) / lane_count;
      merged = merge_moments(
          merged, Moments{count, lanes[2 * l * width + c], lanes[(2 * l + 1) * width + c]});
    }
    means[c] = merged.mean;
    means[n + c] = merged.m2;
  }
}

// Whether the block's threads cover whole rows of C [M, N] in the thin-K kernels (4 columns a
// thread): then each thread has the same columns in every step.
bool thin_k_fixed_columns(int64_t n) { return kThreads % ((n + 3) / 4) == 0; }

// C[M, N] = epilogue(op(A) @ op(B)) for K <= kThinK: one thread per 4 columns of a row, the
// thread's columns changing from step to step (thin_k_fixed_columns false).
template <bool kTransA, bool kTransB, class T, class CT>
__global__ void __launch_bounds__(kThreads)
    gemm_thin_k_kernel(const T* a, const T* b, CT* c, int m, int n, int k, EpilogueArgs ep,
                       bool pack) {
  const int groups = (n + 3) / 4;
  // The thread's (row, group of 4 columns) in a grid-stride walk over [M, groups], moved on by
  // the stride's rows and groups at each step (no division in the loop; the grid's threads, fewer
  // than 2^31, are divided in 32 bits, with no call to the 64-bit division).
  const int first = int(blockIdx.x * blockDim.x + threadIdx.x);
  const int stride = int(gridDim.x * blockDim.x);
  const int row_step = stride / groups, group_step = stride % groups;
  int64_t row = first / groups;
  for (int group = first % groups; row < m;) {
    const int col = group * 4;
    T a_row[kThinK];
    float acc[4];
    load_thin_row<kTransA>(a, m, k, row, a_row);
    const ThinColumns<kTransB, T> columns(b, k, n, col, ep);
    thin_row_products(a_row, k, columns.b, acc);
    store_four(c, n, int(row), col, acc, columns.bias, ep, pack);
    row += row_step;
    group += group_step;
    if (group >= groups) {
      group -= groups;
      ++row;
    }
  }
}

// What the fixed-columns kernel adds up per column besides storing C: nothing, the gradient terms
// of the batch norm whose output gradient C is (ep.batchnorm_grad), or C's moments
// (ep.column_partials); or, for the kernels on a K known only at run time, whichever of these ep
// asks for. A K known at compile time has each a kernel of its own, so that the registers of the
// other two stay free for the rows in flight.
enum class ThinKFigures { none, grad_sums, moments, from_epilogue };

// The steps whose loads a thread of the fixed-columns kernel has in flight, and the blocks per SM
// it keeps for a K known at compile time: 4 steps in 4 blocks (64 registers, 32 warps); with the
// gradient sums (K = 1 only: the input gradient of a conv with one output channel), whose x values
// and batch norm vectors take 30 registers more, 8 steps in 2 blocks (128 registers; ptxas spills
// on sm_80 with 85, even at 2 steps, and at K = 2): its x rows are most of what it reads, and
// 2 blocks of 4 steps had 20 KB a SM in flight; with the moments of an fp32 C, 3 blocks (85
// registers: 64 spill).
constexpr int thin_k_rows_in_flight(ThinKFigures figures) {
  return figures == ThinKFigures::grad_sums ? 8 : 4;
}
constexpr int thin_k_blocks_per_sm(int k, ThinKFigures figures, int c_bytes) {
  if (k == 0) return 1;
  if (figures == ThinKFigures::grad_sums) return 2;
  return figures == ThinKFigures::moments && c_bytes == 4 ? 3 : 4;
}

// The same when each thread keeps its 4 columns (thin_k_fixed_columns). Block b takes the rows
// [b * tile_rows, (b + 1) * tile_rows) of C, kThreads / groups rows a step, each thread the same 4
// columns in every step: it reads their B values, bias and batch norm vectors once, and loads the A
// rows (and x) of thin_k_rows_in_flight steps before it computes the first (one row's few bytes at
// a time left each warp waiting a memory latency per step). With gradient sums it also adds up the
// columns' gradient terms as it stores them (x_pack: x's rows allow 4-element loads), with moments
// their moments; the block then combines its threads' in order into its partials [blocks, 2, N].
// kK > 0 is K known at compile time (K = 1 and 2, sine's two thin-K GEMMs: the loop then tests no
// k), 0 reads k.
template <bool kTransA, bool kTransB, int kK, ThinKFigures kFigures, class T, class CT>
__global__ void __launch_bounds__(kThreads, thin_k_blocks_per_sm(kK, kFigures, int(sizeof(CT))))
    gemm_thin_k_fixed_columns_kernel(const T* a, const T* b, CT* c, int m, int n, int k_given,
                                     int64_t tile_rows, EpilogueArgs ep, bool pack, bool x_pack) {
  static_assert((kK > 0) == (kFigures != ThinKFigures::from_epilogue), "see ThinKFigures");
  constexpr bool kRuntime = kFigures == ThinKFigures::from_epilogue;
  const int k = kK > 0 ? kK : k_given;
  const BatchNormGradient& grad = ep.batchnorm_grad;
  const bool grad_sums = kFigures == ThinKFigures::grad_sums || (kRuntime && grad.sums);
  const bool moments = kFigures == ThinKFigures::moments || (kRuntime && ep.column_partials);
  const int groups = (n + 3) / 4;
  const int col = int(threadIdx.x) % groups * 4;
  const int64_t row_begin = int64_t(blockIdx.x) * tile_rows;
  const int64_t rows = min(int64_t(m) - row_begin, tile_rows); // the block's
  const ThinColumns<kTransB, T> columns(b, k, n, col, ep);
  // The batch norm vectors of the thread's 4 columns (ThinColumns' companion); none: no loads.
  const auto channels = ChannelValues<4>::below(grad.channels, col, grad_sums ? n : 0);
  constexpr int kRowsInFlight = thin_k_rows_in_flight(kFigures);
  T a_rows[kRowsInFlight][kThinK];
  Stored4<CT> xs[kRowsInFlight];
  float first[4] = {}, second[4] = {}; // sums of dy_hat and dy_hat xhat, or mean and M2
  int count = 0;                       // rows stored
  for_each_batched<kRowsInFlight>(
      row_begin + threadIdx.x / groups, kThreads / groups, row_begin + rows,
      [&](int r, int64_t row) {
        load_thin_row<kTransA>(a, m, k, row, a_rows[r]);
        if (grad_sums) xs[r] = load_grad_x<CT>(grad, n, row, col, x_pack);
      },
      [&](int r, int64_t row) {
        float acc[4];
        thin_row_products(a_rows[r], k, columns.b, acc);
        store_four(c, n, int(row), col, acc, columns.bias, ep, pack); // acc: the values as stored
        if (grad_sums) add_grad_terms(grad, channels, widen4<CT>(xs[r]).v, acc, first, second);
        if (moments) add_moments(++count, acc, first, second);
      });
  if (grad_sums) store_thin_grad_partials(first, second, n, grad.sums);
  if (moments) store_thin_moment_partials(first, second, n, rows, ep.column_partials);
}

// Whether the thin-K kernel adds up args.batchnorm_grad's sums, or args.column_moments, itself: a
// thread keeps the same 4 columns in every step when the block's threads are a whole number of
// rows of C.
bool thin_k_sums_in_epilogue(const GemmArgs& args) {
  return args.batchnorm_grad.sums && args.k <= kThinK && thin_k_fixed_columns(args.n);
}
bool thin_k_moments_in_epilogue(const GemmArgs& args) {
  return args.column_moments && args.k <= kThinK && thin_k_fixed_columns(args.n);
}

// The rows of C a block of the fixed-columns kernel takes: at least kThinKMinTileRows (the
// statistics' partials, one [2, N] per block, stay 1/32 of C's size or less in f16), enough that
// grid_for's blocks cover M, and whole steps of the block's kThreads / groups rows.
constexpr int64_t kThinKMinTileRows = 128;
int64_t thin_k_tile_rows(int64_t m, int64_t n) {
  const int64_t groups = (n + 3) / 4, rows_per_step = kThreads / groups;
  const int64_t blocks = grid_for(m * groups, kThreads);
  const int64_t rows = std::max(kThinKMinTileRows, (m + blocks - 1) / blocks);
  return (rows + rows_per_step - 1) / rows_per_step * rows_per_step;
}

// Element kk of a row of a normalised A, from its stored value v: batch norm's output as stored.
template <class T>
__device__ __forceinline__ float normalized_at(const BatchNormChannels& nz, int kk, float v) {
  return as_stored<T>(
      batchnorm_normalized(v, nz.gamma[kk], nz.beta[kk], nz.mean[kk], nz.invstd[kk], nz.relu));
}

// The warp's sums of one row of C, added across the lanes (the N columns only: n is the same
// for the whole warp), stored by lanes 0 .. n - 1.
template <class CT>
__device__ __forceinline__ void store_row(float (&acc)[kThinN], CT* c, int n, int64_t row, int lane,
                                          const EpilogueArgs& ep) {
#pragma unroll
  for (int j = 0; j < kThinN; ++j)
    if (j < n) acc[j] = warp_sum(acc[j]);
  if (lane >= n) return;
  float mine = acc[0];
#pragma unroll
  for (int j = 1; j < kThinN; ++j)
    if (lane == j) mine = acc[j];
  store_output(c, n, int(row), lane, mine, ep);
}

// C[M, N] = epilogue(A @ op(B)) for N <= kThinN, A untransposed ([M, K], k contiguous), normalised
// per `nz` when kNormalized: one warp per row; `packed` when K is a multiple of 4 and A is aligned
// for 4-element loads. Each product is added by an explicit fmaf, so that the normalised and the
// plain instantiations round alike wherever they are compiled (the emulator's host compiler
// contracts a * b + c as it sees fit, not as nvcc does).
template <bool kTransB, bool kNormalized, class T, class CT>
__global__ void __launch_bounds__(kThreads)
    gemm_thin_n_rows_kernel(const T* a, BatchNormChannels nz, const T* b, CT* c, int m, int n,
                            int k, EpilogueArgs ep, bool packed) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; row < m; row += warps) {
    const T* a_row = a + row * k;
    float acc[kThinN] = {};
    const auto add = [&](int kk, float value) {
      if constexpr (kNormalized) value = normalized_at<T>(nz, kk, value);
#pragma unroll
      for (int j = 0; j < kThinN; ++j)
        if (j < n) acc[j] = fmaf(value, b_at<kTransB>(b, k, n, kk, j), acc[j]);
    };
    if (packed) {
      for (int kk = 4 * lane; kk < k; kk += 4 * 32) {
        const Float4 v = load4(a_row, kk);
#pragma unroll
        for (int e = 0; e < 4; ++e) add(kk + e, v.v[e]);
      }
    } else {
      for (int kk = lane; kk < k; kk += 32) add(kk, load_f(a_row, kk));
    }
    store_row(acc, c, n, row, lane, ep);
  }
}

// The lane's chunks of 4 k that gemm_thin_n_rows_cached_kernel keeps in registers: K up to
// kCachedK (sine's last conv, K = 256); and the rows a warp loads before it sums any.
constexpr int kCachedChunks = 2;
constexpr int kCachedK = 4 * 32 * kCachedChunks;
constexpr int kRowsInFlight = 4;

// The same for a packed A whose K is at most kCachedK (and not 0): each lane reads the B values
// (and the batch norm parameters) of its k once, into registers, for every row the warp takes,
// and loads kRowsInFlight consecutive rows before it sums the first (one row's 8 or 16 bytes a lane
// left too few loads in flight to cover the memory's latency); the same products summed in the same
// order as gemm_thin_n_rows_kernel.
template <bool kTransB, bool kNormalized, class T, class CT>
__global__ void __launch_bounds__(kThreads)
    gemm_thin_n_rows_cached_kernel(const T* a, BatchNormChannels nz, const T* b, CT* c, int m,
                                   int n, int k, EpilogueArgs ep) {
  const int lane = threadIdx.x % 32;
  float w[kCachedChunks][4][kThinN] = {}; // op(B)[kk, j] at this lane's kk; 0 past K or N
  float gamma[kCachedChunks][4] = {}, beta[kCachedChunks][4] = {};
  float mean[kCachedChunks][4] = {}, invstd[kCachedChunks][4] = {};
#pragma unroll
  for (int i = 0; i < kCachedChunks; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int kk = 4 * lane + 4 * 32 * i + e;
      if (kk >= k) continue;
#pragma unroll
      for (int j = 0; j < kThinN; ++j)
        if (j < n) w[i][e][j] = b_at<kTransB>(b, k, n, kk, j);
      if constexpr (kNormalized) {
        gamma[i][e] = nz.gamma[kk], beta[i][e] = nz.beta[kk];
        mean[i][e] = nz.mean[kk], invstd[i][e] = nz.invstd[kk];
      }
    }
  // No load carries a condition of its own (a conditional load is converted as it arrives, and
  // the next one issued only then): a lane's chunk past K loads the row's last chunk instead, and a
  // row past M the last row, both never used.
  int loaded[kCachedChunks]; // the k of each chunk's load
#pragma unroll
  for (int i = 0; i < kCachedChunks; ++i) loaded[i] = min(4 * lane + 4 * 32 * i, k - 4);
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int64_t first_row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32 * kRowsInFlight;
  for (int64_t row0 = first_row; row0 < m; row0 += warps * kRowsInFlight) {
    Stored4<T> v[kRowsInFlight][kCachedChunks];
#pragma unroll
    for (int r = 0; r < kRowsInFlight; ++r) {
      const T* a_row = a + min(row0 + r, int64_t(m) - 1) * k;
#pragma unroll
      for (int i = 0; i < kCachedChunks; ++i) v[r][i] = load4_stored(a_row, loaded[i]);
    }
#pragma unroll
    for (int r = 0; r < kRowsInFlight; ++r) {
      if (row0 + r >= m) break;
      float acc[kThinN] = {};
#pragma unroll
      for (int i = 0; i < kCachedChunks; ++i) {
        if (4 * lane + 4 * 32 * i >= k) continue; // K is a multiple of 4: whole chunks
        const Float4 values = widen4<T>(v[r][i]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float value = values.v[e];
          if constexpr (kNormalized)
            value = as_stored<T>(batchnorm_normalized(value, gamma[i][e], beta[i][e], mean[i][e],
                                                      invstd[i][e], nz.relu));
#pragma unroll
          for (int j = 0; j < kThinN; ++j)
            if (j < n) acc[j] = fmaf(value, w[i][e][j], acc[j]);
        }
      }
      store_row(acc, c, n, row0 + r, lane, ep);
    }
  }
}

// The same with A transposed (stored [K, M], m contiguous): one thread per row.
template <bool kTransB, class T, class CT>
__global__ void __launch_bounds__(kThreads)
    gemm_thin_n_columns_kernel(const T* a, const T* b, CT* c, int m, int n, int k,
                               EpilogueArgs ep) {
  for (int64_t row = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; row < m;
       row += int64_t(gridDim.x) * blockDim.x) {
    float acc[kThinN] = {};
    for (int kk = 0; kk < k; ++kk) {
      const float value = load_f(a, int64_t(kk) * m + row);
#pragma unroll
      for (int j = 0; j < kThinN; ++j)
        if (j < n) acc[j] += value * b_at<kTransB>(b, k, n, kk, j);
    }
#pragma unroll
    for (int j = 0; j < kThinN; ++j) // a constant bound: acc stays in registers
      if (j < n) store_output(c, n, int(row), j, acc[j], ep);
  }
}

template <bool kTransA, bool kTransB, class T, class CT> void launch(const GemmArgs& args) {
  const T* a = static_cast<const T*>(args.a.data);
  const T* b = static_cast<const T*>(args.b.data);
  CT* c = static_cast<CT*>(args.c);
  const int m = int(args.m), n = int(args.n), k = int(args.k);
  if (args.k <= kThinK) {
    const bool pack = n % 4 == 0 && aligned_for_pack(c);
    if (!thin_k_fixed_columns(n)) {
      gemm_thin_k_kernel<kTransA, kTransB, T, CT>
          <<<grid_for(args.m * ((n + 3) / 4), kThreads), kThreads, 0, stream()>>>(
              a, b, c, m, n, k, args.epilogue, pack);
      CUDA_CHECK_LAUNCH("gemm (thin, CUDA cores)");
      return;
    }
    const int64_t tile_rows = thin_k_tile_rows(args.m, args.n);
    const int fixed_blocks = int((args.m + tile_rows - 1) / tile_rows);
    EpilogueArgs epilogue = args.epilogue;
    Tensor partials; // [blocks, 2, N]: gradient sums or moments
    if (thin_k_sums_in_epilogue(args) || thin_k_moments_in_epilogue(args))
      partials = Tensor::empty({fixed_blocks, 2, args.n}, DType::f32, Device::cuda);
    if (thin_k_sums_in_epilogue(args)) {
      epilogue.batchnorm_grad = args.batchnorm_grad;
      epilogue.batchnorm_grad.sums = ptr<float>(partials);
    } else if (thin_k_moments_in_epilogue(args)) {
      epilogue.column_partials = ptr<float>(partials);
    }
    const bool x_pack = pack && aligned_for_pack(static_cast<const CT*>(args.batchnorm_grad.x));
    const auto fixed_columns = [&](auto kernel) {
      kernel<<<fixed_blocks, kThreads, partials.defined() ? kThinPartialsBytes : 0, stream()>>>(
          a, b, c, m, n, k, tile_rows, epilogue, pack, x_pack);
      CUDA_CHECK_LAUNCH("gemm (thin, CUDA cores)");
    };
    const auto on_k = [&](auto k_constant) {
      constexpr int kK = decltype(k_constant)::value;
      if constexpr (kK == 0)
        fixed_columns(gemm_thin_k_fixed_columns_kernel<kTransA, kTransB, 0,
                                                       ThinKFigures::from_epilogue, T, CT>);
      else if (thin_k_sums_in_epilogue(args) && kK == 1)
        fixed_columns(
            gemm_thin_k_fixed_columns_kernel<kTransA, kTransB, 1, ThinKFigures::grad_sums, T, CT>);
      else if (thin_k_sums_in_epilogue(args))
        fixed_columns(gemm_thin_k_fixed_columns_kernel<kTransA, kTransB, 0,
                                                       ThinKFigures::from_epilogue, T, CT>);
      else if (thin_k_moments_in_epilogue(args))
        fixed_columns(
            gemm_thin_k_fixed_columns_kernel<kTransA, kTransB, kK, ThinKFigures::moments, T, CT>);
      else
        fixed_columns(
            gemm_thin_k_fixed_columns_kernel<kTransA, kTransB, kK, ThinKFigures::none, T, CT>);
    };
    if constexpr (kTransA)
      on_k(std::integral_constant<int, 0>{});
    else if (k == 1)
      on_k(std::integral_constant<int, 1>{});
    else if (k == 2)
      on_k(std::integral_constant<int, 2>{});
    else // K = 0 or 3 .. kThinK
      on_k(std::integral_constant<int, 0>{});
    if (thin_k_sums_in_epilogue(args))
      merge_grad_partials(ptr<float>(partials), fixed_blocks, n, args.batchnorm_grad.sums);
    else if (thin_k_moments_in_epilogue(args))
      merge_column_partials(ptr<float>(partials), args.m, int(tile_rows), n, args.column_moments);
    return;
  } else if constexpr (kTransA) {
    gemm_thin_n_columns_kernel<kTransB, T, CT>
        <<<grid_for(args.m, kThreads), kThreads, 0, stream()>>>(a, b, c, m, n, k, args.epilogue);
  } else {
    const bool packed = k % 4 == 0 && aligned_for_pack(a);
    const BatchNormChannels& nz = args.a.normalization;
    const auto rows = [&](auto normalized) {
      constexpr bool kNormalized = decltype(normalized)::value;
      if (packed && k > 0 && k <= kCachedK)
        gemm_thin_n_rows_cached_kernel<kTransB, kNormalized, T, CT>
            <<<grid_for((args.m + kRowsInFlight - 1) / kRowsInFlight * 32, kThreads), kThreads, 0,
               stream()>>>(a, nz, b, c, m, n, k, args.epilogue);
      else
        gemm_thin_n_rows_kernel<kTransB, kNormalized, T, CT>
            <<<grid_for(args.m * 32, kThreads), kThreads, 0, stream()>>>(a, nz, b, c, m, n, k,
                                                                         args.epilogue, packed);
    };
    if (args.a.kind == OperandKind::normalized)
      rows(std::true_type{});
    else
      rows(std::false_type{});
  }
  CUDA_CHECK_LAUNCH("gemm (thin, CUDA cores)");
}

template <class T, class CT> void launch_for_transposes(const GemmArgs& args) {
  const bool ta = args.a.kind == OperandKind::transposed;
  const bool tb = args.b.kind == OperandKind::transposed;
  if (ta && tb)
    launch<true, true, T, CT>(args);
  else if (ta)
    launch<true, false, T, CT>(args);
  else if (tb)
    launch<false, true, T, CT>(args);
  else
    launch<false, false, T, CT>(args);
}

} // namespace

void thin_gemm(const GemmArgs& args) {
  if (args.m == 0 || args.n == 0) return;
  const auto launch_for = [&](auto operands) {
    using T = typename decltype(operands)::type;
    visit_output<T>(args, [&](auto output) {
      launch_for_transposes<T, typename decltype(output)::type>(args);
    });
  };
  if (args.ab_dtype == DType::f32)
    launch_for(TypeTag<float>{});
  else
    visit_half_precision(args.ab_dtype, "gemm", launch_for);
  GemmArgs unfused = args; // the statistics the kernels did not produce
  if (thin_k_sums_in_epilogue(args)) unfused.batchnorm_grad.sums = nullptr;
  if (thin_k_moments_in_epilogue(args)) unfused.column_moments = nullptr;
  column_statistics_of_output(unfused);
}

} // namespace minamp::gpu
