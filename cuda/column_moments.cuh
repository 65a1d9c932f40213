// The per-column statistics of a [rows, C] activation on the device that batch norm needs:
// - forward, the mean and biased variance (moments f32 [2, C]: row 0 the means, row 1 the
//   variances), either computed from the matrix in two passes (column_moments), or merged from
//   the per-tile partials a GEMM epilogue wrote while producing it (merge_column_partials);
// - backward, the gradient sums (sums f32 [2, C]: sum dy_hat, sum dy_hat * xhat), either computed
//   from x and dy (batchnorm_grad_sums), or added up from the per-block partials the thin-K GEMM
//   kernel wrote while producing dy (merge_grad_partials; gemm_thin.cu); and the sums
//   of its dx per channel (column_sums), the bias gradient of the layer before it.
// All are deterministic: fixed orders, no atomics. Also the normalisation itself, from given
// statistics (batchnorm_normalize), for a conv whose input gradient pass needs x normalised again.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace minamp::gpu {

// moments [2, cols] of x [rows, cols] (f32, f16 or bf16; rows >= 1): the mean first, then the
// mean of squared deviations from it (two reads of x, no cancellation), each a column reduction
// of reduce.cuh. `op` names the caller in errors.
void column_moments(const void* x, DType dtype, int64_t rows, int cols, float* moments,
                    const char* op);

// moments [2, cols] from partials [row_tiles, 2, cols] f32, where row tile t covers rows
// [t * tile_rows, min(rows, (t + 1) * tile_rows)) and holds each column's mean (row 0) and M2, the
// sum of squared deviations from it (row 1). Chan et al.'s formula for merging sets, over runs of
// consecutive tiles and then across the runs in a fixed order: bit-identical from run to run.
void merge_column_partials(const float* partials, int64_t rows, int tile_rows, int cols,
                           float* moments);

// A batch norm's per-channel f32 [C] vectors on the device (gamma, beta, and the mean and invstd
// it normalises with), and whether a ReLU follows it.
struct BatchNormChannels {
  const float* gamma = nullptr;
  const float* beta = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  bool relu = false;
};

// What a batch norm's input gradient needs beside its channels' vectors and its output gradient:
// its input x (in the gradient's dtype), the gradient sums f32 [2, C] (sum dy_hat, sum dy_hat xhat;
// BatchNormParams::grad_sums) and its mode.
struct BatchNormInputGradView {
  const void* x = nullptr;
  const float* grad_sums = nullptr;
  bool training = true;
};

// y = x batch-normalised per bn, as batchnorm_forward writes its output (batchnorm.cu): x and y
// [rows, C] in dtype (f32, f16 or bf16), not overlapping.
void batchnorm_normalize(const void* x, void* y, DType dtype, int64_t rows, int channels,
                         const BatchNormChannels& bn, const char* op);

// sums [2, C] = sum over rows of dy_hat (row 0) and of dy_hat * xhat (row 1), xhat and dy_hat
// per element as batchnorm_grad_terms (common.cuh) gives them from the batch norm's input x and
// its output gradient dy (both [rows, C], f32, f16 or bf16): one pass reading both (each thread
// on 4 channels where C / 4 divides 256 and x and dy share a dtype, else a column reduction), then
// its blocks' sums added in block order.
// With dbeta and dgamma (f32 [C]), its last step also adds the sums to them.
void batchnorm_grad_sums(const void* x, DType x_dtype, const void* dy, DType dy_dtype, int64_t rows,
                         int channels, const BatchNormChannels& bn, float* sums, const char* op,
                         float* dbeta = nullptr, float* dgamma = nullptr);

// sums [2, cols] from partials [row_tiles, 2, cols] f32, added in tile order.
void merge_grad_partials(const float* partials, int64_t row_tiles, int cols, float* sums);

// sums [cols] = the sum over the rows of x [rows, cols] (f32, f16 or bf16) per column: the sums
// of a batch norm's dx (BatchNormParams::dx_sums) from dx itself, or from the per-block partials
// of them that the dx kernel wrote (one column reduction, fixed order).
void column_sums(const void* x, DType dtype, int64_t rows, int cols, float* sums, const char* op);

} // namespace minamp::gpu
