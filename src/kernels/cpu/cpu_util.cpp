// Float views of f32 / f16 / bf16 tensors, the shared GEMM epilogue and the thread-parallel matrix
// product of the CPU reference kernels (see cpu_util.h).
#include "kernels/cpu/cpu_util.h"

#include <algorithm>

namespace minamp::cpu {

namespace {
// The values of an f16 or bf16 tensor, widened (exactly) into `dst`.
void widen(const Tensor& tensor, float* dst) {
  if (tensor.dtype() == DType::f16)
    half_to_float(tensor.data<half>(), dst, tensor.numel());
  else
    bfloat16_to_float(tensor.data<bfloat16>(), dst, tensor.numel());
}
} // namespace

FloatInput::FloatInput(const Tensor& tensor) : size_(tensor.numel()) {
  if (tensor.dtype() == DType::f32) {
    data_ = tensor.data<float>();
    return;
  }
  widened_.reset(new float[static_cast<size_t>(size_)]);
  widen(tensor, widened_.get());
  data_ = widened_.get();
}

FloatOutput::FloatOutput(Tensor& tensor, bool keep_old) : tensor_(tensor), size_(tensor.numel()) {
  if (tensor.dtype() == DType::f32) {
    data_ = tensor.data<float>();
    return;
  }
  buffer_.reset(new float[static_cast<size_t>(size_)]);
  if (keep_old) widen(tensor, buffer_.get());
  data_ = buffer_.get();
}

void FloatOutput::store() {
  if (tensor_.dtype() != DType::f32) narrow(buffer_.get(), tensor_);
}

void narrow(const float* src, Tensor& dst) {
  if (dst.dtype() == DType::f16)
    float_to_half(src, dst.data<half>(), dst.numel());
  else
    float_to_bfloat16(src, dst.data<bfloat16>(), dst.numel());
}

void apply_bias_relu(MatrixMap c, const GemmEpilogue& epilogue) {
  if (epilogue.bias) {
    const ConstMatrixMap bias(epilogue.bias->data<float>(), 1, c.cols()); // [1, N]
    c.rowwise() += bias.row(0);
  }
  if (epilogue.relu) c = c.unaryExpr(&relu);
}

namespace {
// Output tiles: C is halved along its longer tile side until there are kTargetTiles tiles or a
// tile would drop below kMinTileRows x kMinTileCols. Enough tiles to balance a few cores, each
// large enough that Eigen's packing of its operand panels stays a small part of the work; tile
// widths are multiples of kColumnAlign (Eigen's 24-column AVX register block on row-major C).
constexpr int64_t kTargetTiles = 16;
constexpr int64_t kMinTileRows = 32, kMinTileCols = 48, kColumnAlign = 24;
constexpr double kParallelMultiplyAdds = 1 << 18; // smaller products stay on one thread

int64_t half_rounded_up(int64_t extent, int64_t align) {
  return ((extent + 1) / 2 + align - 1) / align * align;
}
} // namespace

OutputTiles output_tiles(int64_t rows, int64_t cols) {
  OutputTiles tiles{rows, cols, std::max<int64_t>(rows, 1), std::max<int64_t>(cols, 1)};
  while (tiles.count() < kTargetTiles) {
    const bool rows_can_halve = tiles.tile_rows >= 2 * kMinTileRows;
    const bool cols_can_halve = tiles.tile_cols >= 2 * kMinTileCols;
    if (rows_can_halve && (tiles.tile_rows >= tiles.tile_cols || !cols_can_halve))
      tiles.tile_rows = half_rounded_up(tiles.tile_rows, 8);
    else if (cols_can_halve)
      tiles.tile_cols = half_rounded_up(tiles.tile_cols, kColumnAlign);
    else
      break;
  }
  return tiles;
}

namespace {
// C = alpha * a @ b (or += when accumulate) tile by tile; a and b are op(A) and op(B) as Eigen
// expressions [M, K] and [K, N].
template <class Lhs, class Rhs>
void tiled_product(const Lhs& a, const Rhs& b, MatrixMap c, float alpha, bool accumulate) {
  const OutputTiles tiles = output_tiles(c.rows(), c.cols());
  const double multiply_adds = double(c.rows()) * double(c.cols()) * double(a.cols());
#pragma omp parallel for schedule(dynamic, 1) if (multiply_adds >= kParallelMultiplyAdds)
  for (int64_t t = 0; t < tiles.count(); ++t) {
    const int64_t r0 = t / tiles.col_tiles() * tiles.tile_rows;
    const int64_t c0 = t % tiles.col_tiles() * tiles.tile_cols;
    const int64_t rows = std::min(tiles.tile_rows, c.rows() - r0);
    const int64_t cols = std::min(tiles.tile_cols, c.cols() - c0);
    auto tile = c.block(r0, c0, rows, cols);
    if (accumulate)
      tile.noalias() += alpha * (a.middleRows(r0, rows) * b.middleCols(c0, cols));
    else
      tile.noalias() = alpha * (a.middleRows(r0, rows) * b.middleCols(c0, cols));
  }
}
} // namespace

void matmul(ConstMatrixMap a, bool trans_a, ConstMatrixMap b, bool trans_b, MatrixMap c,
            float alpha, bool accumulate) {
  if (trans_a && trans_b)
    tiled_product(a.transpose(), b.transpose(), c, alpha, accumulate);
  else if (trans_a)
    tiled_product(a.transpose(), b, c, alpha, accumulate);
  else if (trans_b)
    tiled_product(a, b.transpose(), c, alpha, accumulate);
  else
    tiled_product(a, b, c, alpha, accumulate);
}

} // namespace minamp::cpu
