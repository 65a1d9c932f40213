// Independent double-precision references for the CPU kernel tests: naive loop versions of the
// forward ops, central finite differences of a scalar objective, error measures in double, and a
// check that a kernel's outputs do not depend on the OpenMP thread count.
#pragma once

#include <gtest/gtest.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "test_util.h"

namespace minamp::test {

using Doubles = std::vector<double>;

inline Doubles to_doubles(const Tensor& t) {
  const std::vector<float> values = t.to_vector();
  return Doubles(values.begin(), values.end());
}

// ||out - ref|| / ||ref|| in double; infinity when any value of `out` is not finite.
inline double relative_error_to(const Tensor& out, const Doubles& ref) {
  const std::vector<float> values = out.to_vector();
  EXPECT_EQ(values.size(), ref.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < values.size() && i < ref.size(); ++i) {
    if (!std::isfinite(values[i])) return INFINITY;
    diff += (values[i] - ref[i]) * (values[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline double dot(const Doubles& a, const Doubles& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// d objective / d x by central differences in double, one coordinate at a time.
inline Doubles numerical_gradient(const std::function<double(const Doubles&)>& objective, Doubles x,
                                  double step = 1e-5) {
  Doubles grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + step;
    const double up = objective(x);
    x[i] = saved - step;
    const double down = objective(x);
    x[i] = saved;
    grad[i] = (up - down) / (2.0 * step);
  }
  return grad;
}

// C[M, N] = op(A) @ op(B) in double; A is [M, K] or (trans_a) [K, M], B [K, N] or [N, K].
inline Doubles gemm_reference(const Doubles& a, bool trans_a, const Doubles& b, bool trans_b,
                              int64_t m, int64_t k, int64_t n) {
  Doubles c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) {
        const double a_ip = trans_a ? a[p * m + i] : a[i * k + p];
        const double b_pj = trans_b ? b[j * k + p] : b[p * n + j];
        c[i * n + j] += a_ip * b_pj;
      }
  return c;
}

// Sizes of a convolution x [N, H, W, Cin] * w [Cout, kh, kw, Cin] -> y [N, Ho, Wo, Cout].
struct ConvCase {
  int64_t n, h, w, cin, cout, kh, kw;
  int stride, pad;
  int64_t ho() const { return (h + 2 * pad - kh) / stride + 1; }
  int64_t wo() const { return (w + 2 * pad - kw) / stride + 1; }
  Shape x_shape() const { return {n, h, w, cin}; }
  Shape w_shape() const { return {cout, kh, kw, cin}; }
  Shape y_shape() const { return {n, ho(), wo(), cout}; }
};

// The convolution by its definition, in double, zero padding.
inline Doubles conv_reference(const Doubles& x, const Doubles& w, const ConvCase& c) {
  Doubles y(static_cast<size_t>(c.n * c.ho() * c.wo() * c.cout), 0.0);
  for (int64_t s = 0; s < c.n; ++s)
    for (int64_t oh = 0; oh < c.ho(); ++oh)
      for (int64_t ow = 0; ow < c.wo(); ++ow)
        for (int64_t o = 0; o < c.cout; ++o) {
          double sum = 0.0;
          for (int64_t i = 0; i < c.kh; ++i)
            for (int64_t j = 0; j < c.kw; ++j) {
              const int64_t ih = oh * c.stride - c.pad + i, iw = ow * c.stride - c.pad + j;
              if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
              for (int64_t q = 0; q < c.cin; ++q)
                sum += x[((s * c.h + ih) * c.w + iw) * c.cin + q] *
                       w[((o * c.kh + i) * c.kw + j) * c.cin + q];
            }
          y[((s * c.ho() + oh) * c.wo() + ow) * c.cout + o] = sum;
        }
  return y;
}

// Runs `run` (which returns a kernel's outputs) on 1 and on 4 OpenMP threads, expects the two
// sets equal bit for bit, and returns the 4-thread outputs (without OpenMP: one plain run).
inline std::vector<Tensor>
outputs_on_any_thread_count(const std::function<std::vector<Tensor>()>& run,
                            const std::string& what) {
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<Tensor> one_thread = run();
  omp_set_num_threads(4);
  const std::vector<Tensor> outputs = run();
  omp_set_num_threads(threads);
  for (size_t i = 0; i < outputs.size(); ++i)
    EXPECT_EQ(outputs[i].to_vector(), one_thread[i].to_vector()) << what << " output " << i;
  return outputs;
#else
  (void)what;
  return run();
#endif
}

} // namespace minamp::test
