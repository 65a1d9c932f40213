// Per-column mean and biased variance of a [rows, cols] matrix on the device, as batch norm's
// training statistics need them (moments f32 [2, cols]: row 0 the means, row 1 the variances):
// either computed from the matrix in two passes (column_moments), or merged from the per-tile
// partials a GEMM epilogue wrote while producing the matrix (merge_column_partials; gemm.cuh).
// Both are deterministic: fixed orders, no atomics.
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
// sum of squared deviations from it (row 1). Chan's parallel merge, in tile order; bit-identical
// from run to run.
void merge_column_partials(const float* partials, int64_t rows, int tile_rows, int cols,
                           float* moments);

} // namespace minamp::gpu
