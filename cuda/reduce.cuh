// Reductions shared by the CUDA backend, all in fp32 and deterministic (fixed summation order,
// no atomics): warp and block sums, and two-stage reductions over a whole tensor or over the
// rows of a [rows, cols] matrix (per-column sums, as bias gradients and batch norm need); and the
// merge of two sets of rows' column moments.
//
// Both two-stage reductions take functors instead of lambdas (no --extended-lambda needed):
//   Term:   __device__ void operator()(int64_t i, float (&v)[kValues]) for a whole-tensor sum, or
//           __device__ void operator()(int64_t row, int col, float (&v)[kValues]) per column;
//   Finish: __device__ void operator()(float (&sum)[kValues]) or (int col, float (&sum)[kValues])
//           receives the totals and writes them wherever the op wants them.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "device.cuh"

namespace minamp::gpu {

constexpr unsigned kFullWarp = 0xffffffffu;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullWarp, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(kFullWarp, v, offset));
  return v;
}

// The sum of `v` over the block, returned to every thread. Every thread of the block must call
// it (blockDim.x a multiple of 32, at most 1024); it may be called several times in a row.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_totals[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  __syncthreads(); // every thread has finished reading warp_totals from a previous call
  if (lane == 0) warp_totals[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  return warp_sum(lane < warps ? warp_totals[lane] : 0.0f);
}

// One column's count, mean and M2 (the sum of squared deviations from the mean) over a set of
// rows: what the statistics hooks of the GEMM kernels (per tile) and their merge
// (column_moments.cu) carry, rather than (sum, sum of squares), whose difference cancels (gemm.cuh,
// store_tile_with_moments, says why).
struct Moments {
  long long count;
  float mean, m2;
};

// Chan et al.'s merge of the moments of two disjoint sets of rows, a before b.
__device__ __forceinline__ Moments merge_moments(const Moments& a, const Moments& b) {
  if (b.count == 0) return a;
  if (a.count == 0) return b;
  const long long count = a.count + b.count;
  const float delta = b.mean - a.mean;
  const float b_share = float(b.count) / float(count);
  return {count, a.mean + delta * b_share, a.m2 + b.m2 + delta * delta * float(a.count) * b_share};
}

// The moments of K disjoint sets of rows at once, those with a count of 0 left out (count[0] > 0):
// Chan et al.'s formula for K sets, in two passes over their means, shifted by the first set's so
// that their differences keep their digits when the mean is far from zero:
//   mean = shift + sum(count_i (mean_i - shift)) / count,
//   M2   = sum(M2_i) + sum(count_i (mean_i - mean)^2),
// every term of M2 non-negative. One division (divide_by_count), where merge_moments one set at a
// time takes K - 1 in a dependent chain.
template <int K>
__device__ __forceinline__ Moments combine_moments(const int (&count)[K], const float (&mean)[K],
                                                   const float (&m2)[K]) {
  const float shift = mean[0];
  float weight[K], shifted[K], weighted = 0.0f;
  long long total = 0;
#pragma unroll
  for (int i = 0; i < K; ++i) {
    weight[i] = float(count[i]);
    shifted[i] = count[i] > 0 ? mean[i] - shift : 0.0f;
    weighted = fmaf(weight[i], shifted[i], weighted);
    total += count[i];
  }
  const float offset = divide_by_count(weighted, float(total));
  float sum_m2 = 0.0f, spread = 0.0f;
#pragma unroll
  for (int i = 0; i < K; ++i) {
    const float deviation = shifted[i] - offset;
    sum_m2 += count[i] > 0 ? m2[i] : 0.0f;
    spread = fmaf(weight[i] * deviation, deviation, spread);
  }
  return Moments{total, shift + offset, sum_m2 + spread};
}

// ---- Whole-tensor sums: stage 1 writes one partial per block, stage 2 (one block) adds them.

constexpr int kReduceThreads = 256;

// partials[k, block] = sum over this block's grid-stride share of i < n of term(i)[k].
template <int kValues, class Term>
__global__ void __launch_bounds__(kReduceThreads)
    sum_partials_kernel(int64_t n, Term term, float* partials) {
  float acc[kValues] = {};
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v[kValues];
    term(i, v);
    for (int k = 0; k < kValues; ++k) acc[k] += v[k];
  }
  for (int k = 0; k < kValues; ++k) {
    const float total = block_sum(acc[k]);
    if (threadIdx.x == 0) partials[k * gridDim.x + blockIdx.x] = total;
  }
}

// One block: adds the `blocks` partials of each value and hands the totals to finish.
template <int kValues, class Finish>
__global__ void __launch_bounds__(kReduceThreads)
    sum_finish_kernel(const float* partials, int blocks, Finish finish) {
  float totals[kValues];
  for (int k = 0; k < kValues; ++k) {
    float acc = 0.0f;
    for (int b = threadIdx.x; b < blocks; b += blockDim.x) acc += partials[k * blocks + b];
    totals[k] = block_sum(acc);
  }
  if (threadIdx.x == 0) finish(totals);
}

// Sums term(i) for i < n (n may be 0) and calls finish(totals) once on the device.
template <int kValues, class Term, class Finish>
void reduce_all(int64_t n, const Term& term, const Finish& finish, const char* op) {
  const int blocks = grid_for(n, kReduceThreads);
  Tensor partials = Tensor::empty({kValues, blocks}, DType::f32, Device::cuda);
  sum_partials_kernel<kValues>
      <<<blocks, kReduceThreads, 0, stream()>>>(n, term, ptr<float>(partials));
  CUDA_CHECK_LAUNCH(op);
  sum_finish_kernel<kValues>
      <<<1, kReduceThreads, 0, stream()>>>(ptr<float>(partials), blocks, finish);
  CUDA_CHECK_LAUNCH(op);
}

// ---- Per-column sums of a [rows, cols] matrix. A block is 32 columns x 8 row lanes; the grid
// is (column tiles, row blocks). Stage 1 writes partials[row block, k, col]; stage 2 adds the
// row blocks of each column in order (one thread per column).

constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;
constexpr int kRowsInFlight = 4;

template <int kValues, class Term>
__global__ void __launch_bounds__(kColumnTile* kRowLanes)
    column_partials_kernel(int64_t rows, int cols, Term term, float* partials) {
  const int col = blockIdx.x * kColumnTile + threadIdx.x;
  float acc[kValues] = {};
  if (col < cols) {
    const int64_t stride = int64_t(gridDim.y) * kRowLanes;
    int64_t row = blockIdx.y * int64_t(kRowLanes) + threadIdx.y;
    // kRowsInFlight rows per iteration: their loads do not depend on each other, so a thread
    // keeps that many in flight (one 2-byte load at a time would leave HBM mostly idle).
    for (; row + (kRowsInFlight - 1) * stride < rows; row += kRowsInFlight * stride) {
      float v[kRowsInFlight][kValues];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) term(row + u * stride, col, v[u]);
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u)
        for (int k = 0; k < kValues; ++k) acc[k] += v[u][k];
    }
    for (; row < rows; row += stride) {
      float v[kValues];
      term(row, col, v);
      for (int k = 0; k < kValues; ++k) acc[k] += v[k];
    }
  }
  __shared__ float lanes[kValues][kRowLanes][kColumnTile];
  for (int k = 0; k < kValues; ++k) lanes[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  for (int k = 0; k < kValues; ++k) {
    float total = 0.0f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += lanes[k][lane][threadIdx.x];
    partials[(blockIdx.y * int64_t(kValues) + k) * cols + col] = total;
  }
}

// Row blocks whose partials a column_finish_kernel thread loads before it adds the first: one
// thread adds all of a column's, and one at a time a few columns over ~1000 row blocks (a last
// layer's bias gradient) waited an L2 latency per few blocks (19 µs on an H200).
constexpr int kFinishBatch = 16;

template <int kValues, class Finish>
__global__ void column_finish_kernel(const float* partials, int row_blocks, int cols,
                                     Finish finish) {
  for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < cols; col += gridDim.x * blockDim.x) {
    float totals[kValues] = {}, values[kFinishBatch][kValues];
    for_each_batched<kFinishBatch>(
        0, 1, row_blocks,
        [&](int u, int64_t b) {
          for (int k = 0; k < kValues; ++k) values[u][k] = partials[(b * kValues + k) * cols + col];
        },
        [&](int u, int64_t) { // in block order
          for (int k = 0; k < kValues; ++k) totals[k] += values[u][k];
        });
    finish(col, totals);
  }
}

// Row blocks for a column reduction: enough blocks in all to fill every SM about once
// (8 blocks of 256 threads is a full SM), but no more than one row block per 128 rows, so each
// thread sums at least ~16 rows before the block combines them.
inline int row_blocks_for(int64_t rows, int cols) {
  const int64_t column_tiles = (cols + kColumnTile - 1) / kColumnTile;
  const int64_t wanted_for_device = std::max<int64_t>(1, sm_count() * 8 / column_tiles);
  const int64_t wanted_for_rows = std::max<int64_t>(1, rows / (16 * kRowLanes));
  return static_cast<int>(std::min(wanted_for_device, wanted_for_rows));
}

// For every column c < cols: totals = sum over rows of term(row, c), then finish(c, totals) on
// the device. With rows == 0 finish still runs, with zero totals.
template <int kValues, class Term, class Finish>
void reduce_columns(int64_t rows, int cols, const Term& term, const Finish& finish,
                    const char* op) {
  if (cols == 0) return;
  const int row_blocks = row_blocks_for(rows, cols);
  Tensor partials = Tensor::empty({row_blocks, kValues, cols}, DType::f32, Device::cuda);
  const dim3 grid((cols + kColumnTile - 1) / kColumnTile, row_blocks);
  const dim3 block(kColumnTile, kRowLanes);
  column_partials_kernel<kValues>
      <<<grid, block, 0, stream()>>>(rows, cols, term, ptr<float>(partials));
  CUDA_CHECK_LAUNCH(op);
  column_finish_kernel<kValues>
      <<<grid_for(cols, 256), 256, 0, stream()>>>(ptr<float>(partials), row_blocks, cols, finish);
  CUDA_CHECK_LAUNCH(op);
}

} // namespace minamp::gpu
