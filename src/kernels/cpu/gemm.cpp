// CPU reference of the GEMM (C = relu(alpha * op(A) @ op(B) + beta * C + bias)) and of the bias
// gradient. The product is Eigen's float matrix product on row-major maps, tile by tile on every
// thread (cpu::matmul): fp32 accumulation, f16 operands widened exactly to float first, an f16 C
// rounded once at the end.
#include <vector>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          const GemmEpilogue& epilogue) {
  const GemmDims d = require_gemm(a, trans_a, b, trans_b, c, epilogue);

  const FloatInput a_values(a), b_values(b);
  FloatOutput c_values(c, epilogue.beta != 0.0f);
  MatrixMap c_matrix = c_values.matrix(d.m, d.n);
  if (epilogue.beta != 0.0f && epilogue.beta != 1.0f) c_matrix *= epilogue.beta;
  // beta == 0 assigns C without reading it: it may hold NaN poison
  matmul(a_values.matrix(a.shape().rows(), a.shape().last()), trans_a,
         b_values.matrix(b.shape().rows(), b.shape().last()), trans_b, c_matrix, epilogue.alpha,
         epilogue.beta != 0.0f);
  apply_bias_relu(c_matrix, epilogue);
  c_values.store();
  store_column_moments(c, epilogue);
}

void bias_backward(const Tensor& dy, Tensor& db) {
  require_bias_backward(dy, db);
  const int64_t rows = dy.shape().rows(), cols = dy.shape().last(); // dy [rows, N]
  const FloatInput grad(dy);
  std::vector<double> sums(static_cast<size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) sums[j] += grad[r * cols + j];
  float* out = db.data<float>();
  for (int64_t j = 0; j < cols; ++j) out[j] += static_cast<float>(sums[j]);
}

} // namespace minamp::cpu
