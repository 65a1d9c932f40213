// Batch norm's per-column statistics on the device (column_moments.cuh): the mean and variance
// by the two-pass column reduction that batch norm's unfused statistics pass runs, or by merging
// the per-tile partials of the GEMM epilogue's statistics hook (gemm.cuh,
// store_tile_with_moments) or of the thin-K GEMM kernel (gemm_thin.cu); and the backward's
// gradient sums, by one pass over x and dy (each thread on the same 4 channels, channel_packs.cuh,
// where C allows; else a column reduction) or from the per-block partials of the thin-K GEMM
// kernel; and plain column sums (a batch norm's dx, per channel).
#include "column_moments.cuh"

#include <type_traits>

#include "channel_packs.cuh"
#include "device.cuh"
#include "reduce.cuh"

namespace minamp::gpu {

namespace {

template <class T> struct ColumnValue { // x[row, c]
  const T* x;
  int cols;
  __device__ void operator()(int64_t row, int c, float (&v)[1]) const {
    v[0] = load_f(x, row * cols + c);
  }
};
struct StoreSum { // sums[c] = sum
  float* sums;
  __device__ void operator()(int c, float (&sum)[1]) const { sums[c] = sum[0]; }
};
struct StoreMean { // mean[c] = sum / rows
  float* mean;
  float rows;
  __device__ void operator()(int c, float (&sum)[1]) const { mean[c] = sum[0] / rows; }
};

template <class T> struct SquaredDeviation { // (x[row, c] - mean[c])^2
  const T* x;
  const float* mean;
  int cols;
  __device__ void operator()(int64_t row, int c, float (&v)[1]) const {
    const float centred = load_f(x, row * cols + c) - mean[c];
    v[0] = centred * centred;
  }
};

template <class TX, class TDy> struct GradTerms { // {dy_hat, dy_hat * xhat}
  const TX* x;
  const TDy* dy;
  BatchNormChannels bn;
  int channels;
  __device__ void operator()(int64_t row, int c, float (&v)[2]) const {
    const int64_t i = row * channels + c;
    float xhat, dy_hat;
    batchnorm_grad_terms(load_f(x, i), load_f(dy, i), bn.gamma[c], bn.beta[c], bn.mean[c],
                         bn.invstd[c], bn.relu, xhat, dy_hat);
    v[0] = dy_hat;
    v[1] = dy_hat * xhat;
  }
};
struct TileGradPartials { // partials[tile, 0, c] and [tile, 1, c]
  const float* partials;
  int cols;
  __device__ void operator()(int64_t tile, int c, float (&v)[2]) const {
    v[0] = partials[tile * 2 * cols + c];
    v[1] = partials[(tile * 2 + 1) * cols + c];
  }
};
struct StoreSums { // sums[0, c] and sums[1, c]; dbeta[c] += the first, dgamma[c] += the second
  float* sums;
  int cols;
  float* dbeta = nullptr; // or nullptr: no adding
  float* dgamma = nullptr;
  __device__ void operator()(int c, float (&total)[2]) const {
    sums[c] = total[0];
    sums[cols + c] = total[1];
    if (dbeta) {
      dbeta[c] += total[0];
      dgamma[c] += total[1];
    }
  }
};

// The gradient sums' per-block partials [gridDim.x, 2, C] over x and dy [rows, C] of one dtype,
// C / 4 dividing kPackThreads: each thread adds up the terms of its 4 channels (pinned_grid's
// launch keeps them), the x and dy packs of 4 steps loaded before it adds any (64 bytes a thread
// in flight for 16-bit x and dy), held as loaded and widened a pack at a time (62 registers for
// f16, 4 blocks an SM; widened as they arrived, 74 and 3); the block adds its threads' in thread
// order (store_pinned_partials).
// The column reduction it replaces (GradTerms) gave each thread one column and read 2 bytes of
// each tensor at a time.
template <class T>
__global__ void __launch_bounds__(kPackThreads)
    grad_sums_partials_kernel(const T* __restrict__ x, const T* __restrict__ dy, int64_t size,
                              int channels, BatchNormChannels bn, float* __restrict__ partials) {
  const PinnedPacks<4, 4> packs(size, channels);
  const ChannelValues<4> ch(bn, packs.channel);
  Stored4<T> xs[4], dys[4]; // as loaded: widened one pack at a time, when used
  float sums[2][4] = {};
  packs.for_each(
      [&](int b, int64_t i) {
        xs[b] = load4_stored(x, i);
        dys[b] = load4_stored(dy, i);
      },
      [&](int b, int64_t) {
        const Float4 x4 = widen4<T>(xs[b]), dy4 = widen4<T>(dys[b]);
        for (int j = 0; j < 4; ++j) {
          float xhat, dy_hat;
          batchnorm_grad_terms(x4.v[j], dy4.v[j], ch.gamma[j], ch.beta[j], ch.mean[j], ch.invstd[j],
                               bn.relu, xhat, dy_hat);
          sums[0][j] += dy_hat;
          sums[1][j] = fmaf(dy_hat, xhat, sums[1][j]);
        }
      });
  store_pinned_partials<4, 2>(sums, channels, partials);
}

// merge_column_partials_kernel's block: kMergeWarps warps over kMergeColumns consecutive columns
// (32-byte loads of a tile's row), each lane merging one contiguous run of row tiles of its
// column, kMergeBatch tiles' partials loaded before any is used, so that the loads are in flight
// together rather than one per dependent merge.
constexpr int kMergeColumns = 8;
constexpr int kMergeLanesPerColumn = 32 / kMergeColumns;
constexpr int kMergeWarps = 32;
constexpr int kMergeRuns = kMergeWarps * kMergeLanesPerColumn;
constexpr int kMergeBatch = 8;
// Warps whose moments one lane of warp 0 merges in the last stage (then across lanes).
constexpr int kMergeWarpsPerLane = kMergeWarps / kMergeLanesPerColumn;

// The merge of the moments of lanes lane and lane ^ offset for offset = kMergeColumns, 2
// kMergeColumns, ... < 32 (pairs first, as in a tree, the lower lane's first): every lane of the
// warp takes part, and each lane of the lowest kMergeColumns ends with its column's merge.
__device__ __forceinline__ Moments merge_across_lanes(Moments own, int lane) {
  for (int offset = kMergeColumns; offset < 32; offset *= 2) {
    const Moments other{__shfl_xor_sync(kFullWarp, own.count, offset),
                        __shfl_xor_sync(kFullWarp, own.mean, offset),
                        __shfl_xor_sync(kFullWarp, own.m2, offset)};
    own = (lane & offset) != 0 ? merge_moments(other, own) : merge_moments(own, other);
  }
  return own;
}

// Run r = warp * kMergeLanesPerColumn + lane / kMergeColumns holds the row tiles
// [r * per_run, (r + 1) * per_run) of its column, combined a batch at a time (combine_moments) and
// the batches merged in tile order; a warp's runs are merged in run order across its lanes, then
// warp 0 merges the warps': each of its lanes kMergeWarpsPerLane warps in warp order, then across
// its lanes. A fixed order, the same on every run.
__global__ void __launch_bounds__(32 * kMergeWarps)
    merge_column_partials_kernel(const float* __restrict__ partials, int64_t rows, int tile_rows,
                                 int row_tiles, int cols, float* __restrict__ moments) {
  __shared__ Moments warp_moments[kMergeWarps][kMergeColumns];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int sub = lane / kMergeColumns, col = blockIdx.x * kMergeColumns + lane % kMergeColumns;
  const int run = warp * kMergeLanesPerColumn + sub;
  const int per_run = (row_tiles + kMergeRuns - 1) / kMergeRuns;
  const int first = run * per_run, last = min(row_tiles, first + per_run);
  // Every tile holds tile_rows rows but the last, which holds what is left.
  const int last_tile_rows = int(rows - int64_t(row_tiles - 1) * tile_rows);
  const float* column = partials + col;
  const int tile_stride = 2 * cols;
  Moments own{0, 0.0f, 0.0f};
  for (int t0 = first; col < cols && t0 < last; t0 += kMergeBatch) {
    int count[kMergeBatch];
    float mean[kMergeBatch], m2[kMergeBatch];
#pragma unroll
    for (int i = 0; i < kMergeBatch; ++i) { // past the run: its last tile again, counted 0
      const int t = min(t0 + i, last - 1);
      const float* tile = column + int64_t(t) * tile_stride;
      mean[i] = tile[0];
      m2[i] = tile[cols];
      count[i] = t0 + i >= last ? 0 : t == row_tiles - 1 ? last_tile_rows : tile_rows;
    }
    own = merge_moments(own, combine_moments(count, mean, m2));
  }
  own = merge_across_lanes(own, lane);
  if (sub == 0) warp_moments[warp][lane] = own;
  __syncthreads();
  if (warp != 0) return;
  own = warp_moments[sub * kMergeWarpsPerLane][lane % kMergeColumns];
  for (int w = 1; w < kMergeWarpsPerLane; ++w)
    own = merge_moments(own, warp_moments[sub * kMergeWarpsPerLane + w][lane % kMergeColumns]);
  own = merge_across_lanes(own, lane);
  if (sub != 0 || col >= cols) return;
  moments[col] = own.mean;
  moments[cols + col] = own.m2 / float(rows);
}

} // namespace

void column_moments(const void* x, DType dtype, int64_t rows, int cols, float* moments,
                    const char* op) {
  const auto run = [&](auto type) {
    using T = typename decltype(type)::type;
    const T* values = static_cast<const T*>(x);
    reduce_columns<1>(rows, cols, ColumnValue<T>{values, cols}, StoreMean{moments, float(rows)},
                      op);
    reduce_columns<1>(rows, cols, SquaredDeviation<T>{values, moments, cols},
                      StoreMean{moments + cols, float(rows)}, op);
  };
  visit_floating(dtype, op, run);
}

void merge_column_partials(const float* partials, int64_t rows, int tile_rows, int cols,
                           float* moments) {
  if (cols == 0) return;
  const int row_tiles = int((rows + tile_rows - 1) / tile_rows);
  const int blocks = (cols + kMergeColumns - 1) / kMergeColumns;
  merge_column_partials_kernel<<<blocks, 32 * kMergeWarps, 0, stream()>>>(partials, rows, tile_rows,
                                                                          row_tiles, cols, moments);
  CUDA_CHECK_LAUNCH("gemm: merging the column statistics");
}

void batchnorm_grad_sums(const void* x, DType x_dtype, const void* dy, DType dy_dtype, int64_t rows,
                         int channels, const BatchNormChannels& bn, float* sums, const char* op,
                         float* dbeta, float* dgamma) {
  const StoreSums finish{sums, channels, dbeta, dgamma};
  visit_floating(x_dtype, op, [&](auto x_type) {
    visit_floating(dy_dtype, op, [&](auto dy_type) {
      using TX = typename decltype(x_type)::type;
      using TDy = typename decltype(dy_type)::type;
      const TX* x_values = static_cast<const TX*>(x);
      const TDy* dy_values = static_cast<const TDy*>(dy);
      if constexpr (std::is_same_v<TX, TDy>) {
        if (rows > 0 && channels > 0 && pack_for(channels, bn, x_values, dy_values) == 4 &&
            block_holds_whole_rows(channels, 4)) {
          const int64_t size = rows * channels;
          const int blocks = pinned_grid(size, channels, 4);
          Tensor partials = Tensor::empty({blocks, 2, channels}, DType::f32, Device::cuda);
          grad_sums_partials_kernel<<<blocks, kPackThreads, 0, stream()>>>(
              x_values, dy_values, size, channels, bn, ptr<float>(partials));
          CUDA_CHECK_LAUNCH(op);
          return reduce_columns<2>(blocks, channels,
                                   TileGradPartials{ptr<float>(partials), channels}, finish, op);
        }
      }
      reduce_columns<2>(rows, channels, GradTerms<TX, TDy>{x_values, dy_values, bn, channels},
                        finish, op);
    });
  });
}

void merge_grad_partials(const float* partials, int64_t row_tiles, int cols, float* sums) {
  reduce_columns<2>(row_tiles, cols, TileGradPartials{partials, cols}, StoreSums{sums, cols},
                    "gemm: adding up the batch norm gradient sums");
}

void column_sums(const void* x, DType dtype, int64_t rows, int cols, float* sums, const char* op) {
  visit_floating(dtype, op, [&](auto type) {
    using T = typename decltype(type)::type;
    reduce_columns<1>(rows, cols, ColumnValue<T>{static_cast<const T*>(x), cols}, StoreSum{sums},
                      op);
  });
}

} // namespace minamp::gpu
