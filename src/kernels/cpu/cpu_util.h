// Helpers shared by the CPU reference kernels (namespace minamp::cpu): float views of f32 / f16 /
// bf16 tensors, Eigen row-major maps, ReLU and the shared GEMM bias/ReLU epilogue (the argument
// checks are in kernels/checks.h).
//
// The CPU backend emulates f16 and bf16 faithfully: a 16-bit input is widened to float (exact),
// the math is fp32, and a 16-bit output is rounded to nearest even. Reductions accumulate in double
// here, so the reference is at least as accurate as any fp32 accumulation order a GPU kernel may
// choose.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <memory>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/checks.h"
#include "kernels/kernels.h"

namespace minamp::cpu {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

// The values of a floating tensor as floats: f32 storage is read in place, f16 and bf16 storage is
// widened (exactly) into a private buffer.
class FloatInput {
public:
  explicit FloatInput(const Tensor& tensor);

  const float* data() const { return data_; }
  int64_t size() const { return size_; }
  float operator[](int64_t i) const { return data_[i]; }
  // The values as a row-major [rows, cols] matrix (rows * cols == size()).
  ConstMatrixMap matrix(int64_t rows, int64_t cols) const { return {data_, rows, cols}; }

private:
  std::unique_ptr<float[]> widened_; // 16-bit input only; not zeroed first (no wasted memset)
  const float* data_ = nullptr;
  int64_t size_ = 0;
};

// A float view of an output tensor. f32 outputs are written in place; f16 and bf16 outputs are
// computed in a float buffer that store() rounds to nearest even into the tensor, so a kernel must
// call store() once it is done. With keep_old the buffer starts from the tensor's values (outputs
// that accumulate or are read as beta * C); otherwise its contents are unspecified.
class FloatOutput {
public:
  FloatOutput(Tensor& tensor, bool keep_old);

  float* data() { return data_; }
  int64_t size() const { return size_; }
  float& operator[](int64_t i) { return data_[i]; }
  MatrixMap matrix(int64_t rows, int64_t cols) { return {data_, rows, cols}; }
  // Writes the buffer into an f16 or bf16 tensor (nothing to do for f32).
  void store();

private:
  Tensor tensor_;
  std::unique_ptr<float[]> buffer_; // 16-bit output only; not zeroed first
  float* data_ = nullptr;
  int64_t size_ = 0;
};

// dst (f16 or bf16) = src[0 .. numel) rounded to nearest even.
void narrow(const float* src, Tensor& dst);

// max(v, 0), with NaN passed through (as PyTorch's relu), so an overflow is never hidden.
inline float relu(float v) { return v < 0.0f ? 0.0f : v; }

// C = relu(C + bias[N]) on a [M, N] matrix, each part only when the epilogue asks for it.
void apply_bias_relu(MatrixMap c, const GemmEpilogue& epilogue);

// How a matrix product's output C [M, N] is cut into tiles for the threads: tile_rows x
// tile_cols each (the last row / column of tiles may be smaller), from the shape alone.
struct OutputTiles {
  int64_t rows = 0, cols = 0;           // C's shape [M, N]
  int64_t tile_rows = 0, tile_cols = 0; // one tile's shape
  int64_t row_tiles() const { return (rows + tile_rows - 1) / tile_rows; }
  int64_t col_tiles() const { return (cols + tile_cols - 1) / tile_cols; }
  int64_t count() const { return rows == 0 || cols == 0 ? 0 : row_tiles() * col_tiles(); }
};
OutputTiles output_tiles(int64_t rows, int64_t cols);

// C = alpha * op(A) @ op(B), or C += that when accumulate, in fp32 on every OpenMP thread. C is
// cut into output_tiles(M, N) and each tile is one single-threaded Eigen product (Eigen is built
// with EIGEN_DONT_PARALLELIZE), so the result never depends on the number of threads.
void matmul(ConstMatrixMap a, bool trans_a, ConstMatrixMap b, bool trans_b, MatrixMap c,
            float alpha, bool accumulate);

// *epilogue.column_moments (when set) = the per-column mean and biased variance of c viewed as
// [rows, N], from its values as stored (batchnorm.cpp: batch norm's own statistics).
void store_column_moments(const Tensor& c, const GemmEpilogue& epilogue);

} // namespace minamp::cpu
