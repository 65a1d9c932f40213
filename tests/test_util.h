// Shared test helpers: seeded random tensors, poisoned outputs, relative errors, tolerances,
// and the GPU skip guard.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace minamp::test {

// A tensor of uniform values in [lo, hi) drawn from `rng`, stored as `dtype` on `device`.
inline Tensor random_tensor(Rng& rng, const Shape& shape, DType dtype = DType::f32,
                            Device device = Device::cpu, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  for (float& v : values) v = rng.uniform(lo, hi);
  return Tensor::from_vector(values, shape, dtype, device);
}

// An output tensor filled with NaN, so a kernel that skips an element cannot pass.
inline Tensor poisoned(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu) {
  return Tensor::full(shape, std::nanf(""), dtype, device);
}

// ||out - ref|| / ||ref|| in double; infinity when any value of `out` is not finite.
inline double relative_error(const std::vector<float>& out, const std::vector<float>& ref) {
  EXPECT_EQ(out.size(), ref.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < out.size() && i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    norm += double(ref[i]) * ref[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}
inline double relative_error(const Tensor& out, const Tensor& ref) {
  return relative_error(out.to_vector(), ref.to_vector());
}

// The tolerance for comparing a kernel against the fp32 CPU reference: ~1e-6 for fp32 math
// (5e-6: the largest error of any fp32 GPU test on the CPU emulator, which runs the kernels' own
// summation orders, is 6.5e-7), ~1e-3 when inputs or outputs are f16.
inline double tolerance_for(DType dtype) { return dtype == DType::f16 ? 2e-3 : 5e-6; }
// The same by the inputs' and the output's dtype. f16 inputs with an f32 output get 1e-4: the
// products of f16 values are exact in fp32 and only the fp32 sums may differ (tensor cores round
// their partial sums their own way), while a result that went through f16 on its way to the f32
// output (an error near 3e-4) must fail.
inline double tolerance_for(DType inputs, DType output) {
  if (output == DType::f16) return tolerance_for(DType::f16);
  return inputs == DType::f16 ? 1e-4 : tolerance_for(DType::f32);
}

} // namespace minamp::test

// Skips the current test with a printed reason when no CUDA device can be used.
#define MINAMP_REQUIRE_GPU()                                                                       \
  do {                                                                                             \
    if (!::minamp::cuda_available())                                                               \
      GTEST_SKIP() << "no GPU: " << ::minamp::cuda_unavailable_reason();                           \
  } while (0)
