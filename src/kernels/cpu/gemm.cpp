// CPU reference of the GEMM (C = relu(alpha * op(A) @ op(B) + beta * C + bias)) and of the bias
// gradient. The product is Eigen's float matrix product on row-major maps: fp32 accumulation,
// f16 operands widened exactly to float first, an f16 C rounded once at the end.
#include <vector>

#include "kernels/cpu/cpu_util.h"

namespace minamp::cpu {

namespace {

// C = alpha * op(A) @ op(B) + beta * C, with a and b the stored (untransposed) matrices.
void multiply(ConstMatrixMap a, bool trans_a, ConstMatrixMap b, bool trans_b, MatrixMap c,
              float alpha, float beta) {
  if (beta == 0.0f)
    c.setZero(); // beta == 0 never reads C: it may hold NaN poison
  else if (beta != 1.0f)
    c *= beta;
  if (trans_a && trans_b)
    c.noalias() += alpha * (a.transpose() * b.transpose());
  else if (trans_a)
    c.noalias() += alpha * (a.transpose() * b);
  else if (trans_b)
    c.noalias() += alpha * (a * b.transpose());
  else
    c.noalias() += alpha * (a * b);
}

} // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          const GemmEpilogue& epilogue) {
  const GemmDims d = require_gemm(a, trans_a, b, trans_b, c, epilogue);

  const FloatInput a_values(a), b_values(b);
  FloatOutput c_values(c, epilogue.beta != 0.0f);
  MatrixMap c_matrix = c_values.matrix(d.m, d.n);
  multiply(a_values.matrix(a.shape().rows(), a.shape().last()), trans_a,
           b_values.matrix(b.shape().rows(), b.shape().last()), trans_b, c_matrix, epilogue.alpha,
           epilogue.beta);
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
