// Shared test helpers: seeded random tensors, poisoned outputs, relative errors (of the whole
// tensor and of its worst row or column), tolerances, the ledger of how close each GPU-vs-CPU
// comparison came to its tolerance, bit-for-bit comparison, and the GPU skip guard.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/module.h"

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

// Lines shorter than this are left out of worst_line_error: against the whole tensor's RMS, the
// rounding of one or two elements is noise.
constexpr int64_t kMinLineLength = 16;

// The largest error of one line of `out` seen as [rows, cols] (a row or a column) as the RMS of
// its difference from `ref` over the RMS of all of `ref` (over 1 when `ref` is zero); infinity
// when any value of `out` is not finite. An error confined to one column of a wide output, which
// relative_error dilutes by the square root of the column count, shows here at full size.
inline double worst_line_error(const std::vector<float>& out, const std::vector<float>& ref,
                               int64_t rows, int64_t cols) {
  EXPECT_EQ(out.size(), size_t(rows * cols));
  EXPECT_EQ(ref.size(), size_t(rows * cols));
  if (out.size() != size_t(rows * cols) || ref.size() != out.size() || out.empty()) return 0.0;
  std::vector<double> row_sq(size_t(rows), 0.0), col_sq(size_t(cols), 0.0);
  double norm = 0.0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      if (!std::isfinite(out[i])) return INFINITY;
      const double d = double(out[i]) - ref[i];
      row_sq[size_t(r)] += d * d;
      col_sq[size_t(c)] += d * d;
      norm += double(ref[i]) * ref[i];
    }
  const double ref_mean_square = norm == 0.0 ? 1.0 : norm / double(rows * cols);
  double worst = 0.0;
  if (cols >= kMinLineLength)
    for (double sq : row_sq)
      worst = std::max(worst, std::sqrt(sq / double(cols) / ref_mean_square));
  if (rows >= kMinLineLength)
    for (double sq : col_sq)
      worst = std::max(worst, std::sqrt(sq / double(rows) / ref_mean_square));
  return worst;
}

// Values that land exactly on the edges of the f16 ranges once multiplied by 1024
// (range_counts' classes, with round to nearest even), and what each counts as.
inline const std::vector<float> kFp16RangeEdgesAt1024 = {
    0x1p-24f,            // 2^-14, the smallest normal: normal
    0x1p-24f - 0x1p-34f, // 2^-14 - 2^-24, the largest subnormal: subnormal
    65504.0f / 1024.0f,  // 65504, the largest finite f16: normal
    65520.0f / 1024.0f,  // 65520, halfway from 65504 to 2^16: rounds (to even) to inf: overflow
    0x1p-35f,            // 2^-25, halfway to the smallest subnormal: rounds to 0: flushed
    0x1p-35f + 0x1p-45f, // just above it: rounds to 2^-24: subnormal
};
// The same for bf16 (float's range: the edges lie among float's own subnormals and at its top).
inline const std::vector<float> kBf16RangeEdgesAt1024 = {
    0x1p-136f,             // 2^-126, the smallest normal: normal
    0x1p-136f - 0x1p-143f, // 2^-126 - 2^-133, the largest subnormal: subnormal
    0x1.fep127f / 1024.0f, // (2 - 2^-7) 2^127, the largest finite bf16: normal
    0x1.ffp127f / 1024.0f, // halfway from it to 2^128: rounds (to even) to inf: overflow
    0x1p-144f,             // 2^-134, halfway to the smallest subnormal: flushed
    0x1p-144f + 0x1p-149f, // just above it: rounds to 2^-133: subnormal
};

// `value` stored in `dtype` and read back: f16 and bf16 round to nearest even, f32 keeps it.
inline float round_to(DType dtype, float value) {
  if (dtype == DType::f16) return round_to_half(value);
  return dtype == DType::bf16 ? round_to_bfloat16(value) : value;
}

// The tolerance for comparing a kernel against the fp32 CPU reference: ~1e-6 for fp32 math
// (5e-6: the largest error of any fp32 GPU test on the CPU emulator, which runs the kernels' own
// summation orders, is 6.5e-7), about four units of the last place when inputs or outputs are
// 16-bit: 2e-3 for f16 (2^-11 = 4.9e-4), 1.6e-2 for bf16 (2^-8 = 3.9e-3).
inline double tolerance_for(DType dtype) {
  switch (dtype) {
  case DType::f16: return 2e-3;
  case DType::bf16: return 1.6e-2;
  default: return 5e-6;
  }
}
// The same by the inputs' and the output's dtype. 16-bit inputs with an f32 output get 1e-4: the
// products of f16 or bf16 values are exact in fp32 and only the fp32 sums may differ (tensor cores
// round their partial sums their own way), while a result that went through the 16-bit format on
// its way to the f32 output (an error near 3e-4 for f16, 2e-3 for bf16) must fail.
inline double tolerance_for(DType inputs, DType output) {
  if (is_half_precision(output)) return tolerance_for(output);
  return is_half_precision(inputs) ? 1e-4 : tolerance_for(DType::f32);
}

// Every GPU-vs-CPU comparison made through expect_within records its error as a fraction of its
// tolerance; at the end of the run the closest ten are printed. On a GPU this says how much room
// the tolerances (chosen on the CPU emulator) leave on the hardware, also when every test passes.
class ErrorLedger : public ::testing::Environment {
public:
  static void record(double error, double tolerance, const std::string& what) {
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string name = test ? std::string(test->test_suite_name()) + "." + test->name() : "";
    entries().push_back({error / tolerance, name + ": " + what});
  }
  void TearDown() override {
    std::vector<std::pair<double, std::string>>& all = entries();
    if (all.empty()) return;
    const size_t shown = std::min<size_t>(all.size(), 10);
    std::partial_sort(all.begin(), all.begin() + shown, all.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    std::printf("Closest of %zu GPU-vs-CPU comparisons on %s (relative error / tolerance):\n",
                all.size(), device_description(Device::cuda).c_str());
    for (size_t i = 0; i < shown; ++i)
      std::printf("  %8.3g  %s\n", all[i].first, all[i].second.c_str());
  }

private:
  static std::vector<std::pair<double, std::string>>& entries() {
    static std::vector<std::pair<double, std::string>> all;
    return all;
  }
};
inline ::testing::Environment* const kErrorLedger =
    ::testing::AddGlobalTestEnvironment(new ErrorLedger);

// Expects a relative error below `tolerance` (an infinite or NaN error never passes) and records
// it in the ledger.
inline void expect_within(double error, double tolerance, const std::string& what) {
  ErrorLedger::record(error, tolerance, what);
  EXPECT_LT(error, tolerance) << what << ": relative error " << error;
}

// Expects `out` to match `ref` within `tolerance`, both as a whole (relative_error) and line by
// line (worst_line_error, over rows and columns of the tensors seen as [rows, last dimension]),
// and records both in the ledger.
inline void expect_close(const Tensor& out, const Tensor& ref, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(out.shape(), ref.shape()) << what;
  const std::vector<float> o = out.to_vector(), r = ref.to_vector();
  expect_within(relative_error(o, r), tolerance, what);
  if (out.shape().rank() >= 2)
    expect_within(worst_line_error(o, r, out.shape().rows(), out.shape().last()), tolerance,
                  what + " (worst row or column)");
}

// Expects `out` to be `ref` bit for bit (as widened floats; a NaN never matches).
inline void expect_identical(const Tensor& out, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(out.shape(), ref.shape()) << what;
  const std::vector<float> o = out.to_vector(), r = ref.to_vector();
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < o.size(); ++i)
    if (!(o[i] == r[i])) first = mismatches++ ? first : i;
  EXPECT_EQ(mismatches, 0u) << what << ": first at " << first << ": " << o[first] << " vs "
                            << r[first];
}

// The sums a batch norm's backward needs, in double: sum dy_hat (sums[c]) and sum dy_hat * xhat
// (sums[C + c]) over the rows of x and dy [.., C], with xhat = (x - mean) invstd and dy_hat = dy
// zeroed where gamma xhat + beta <= 0 when `relu` (the ReLU's mask, in f32 as the kernels compute
// it). `scale` holds each sum's sum of absolute terms: the size of its rounding error.
struct BatchNormGradSums {
  std::vector<double> sums, scale;
};
inline BatchNormGradSums batchnorm_grad_sums_on_host(const Tensor& x, const Tensor& dy,
                                                     const Tensor& gamma, const Tensor& beta,
                                                     const Tensor& mean, const Tensor& invstd,
                                                     bool relu) {
  const size_t channels = size_t(x.shape().last());
  const std::vector<float> xs = x.to_vector(), dys = dy.to_vector(), g = gamma.to_vector(),
                           b = beta.to_vector(), m = mean.to_vector(), s = invstd.to_vector();
  BatchNormGradSums out{std::vector<double>(2 * channels), std::vector<double>(2 * channels)};
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t c = i % channels;
    const float xhat = (xs[i] - m[c]) * s[c];
    const double dy_hat = relu && std::fma(g[c], xhat, b[c]) <= 0.0f ? 0.0 : dys[i];
    out.sums[c] += dy_hat;
    out.sums[channels + c] += dy_hat * xhat;
    out.scale[c] += std::fabs(dy_hat);
    out.scale[channels + c] += std::fabs(dy_hat * xhat);
  }
  return out;
}

// Expects `sums` (f32 [2, C]) within `tolerance` times each sum's scale of `ref` (a NaN never
// passes).
inline void expect_grad_sums(const Tensor& sums, const BatchNormGradSums& ref, double tolerance,
                             const std::string& what) {
  const std::vector<float> got = sums.to_vector();
  ASSERT_EQ(got.size(), ref.sums.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::fabs(got[i] - ref.sums[i]), tolerance * ref.scale[i] + 1e-30)
        << what << ": grad sum " << i << " (" << (i < got.size() / 2 ? "dy_hat" : "dy_hat * xhat")
        << ") " << got[i] << " vs " << ref.sums[i];
}

// Expects `sums` (f32 [C]) to be the sums over the rows of `values` [rows, C] as stored, each
// within `tolerance` times its column's sum of |values| (a NaN never passes).
inline void expect_column_sums(const Tensor& sums, const Tensor& values, double tolerance,
                               const std::string& what) {
  const size_t channels = size_t(values.shape().last());
  const std::vector<float> got = sums.to_vector(), v = values.to_vector();
  ASSERT_EQ(got.size(), channels) << what;
  std::vector<double> exact(channels), scale(channels);
  for (size_t i = 0; i < v.size(); ++i) {
    exact[i % channels] += v[i];
    scale[i % channels] += std::fabs(v[i]);
  }
  for (size_t c = 0; c < channels; ++c)
    EXPECT_LE(std::fabs(got[c] - exact[c]), tolerance * scale[c] + 1e-30)
        << what << ": column " << c << " sum " << got[c] << " vs " << exact[c];
}

// Expects `call` to throw minamp::Error whose message contains every one of `parts`.
template <class Call, class... Parts> void expect_error(Call&& call, const Parts&... parts) {
  const std::vector<std::string> wanted = {std::string(parts)...};
  try {
    call();
    std::string list;
    for (const std::string& part : wanted) list += " '" + part + "'";
    ADD_FAILURE() << "expected minamp::Error containing" << list;
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : wanted)
      EXPECT_NE(message.find(part), std::string::npos)
          << "'" << message << "' lacks '" << part << "'";
  }
}

// Sets nn::fusion_enabled() for a scope and restores it on exit (an assertion that returns early
// included).
class ScopedFusion {
public:
  explicit ScopedFusion(bool enabled) : previous_(nn::fusion_enabled()) { nn::set_fusion(enabled); }
  ~ScopedFusion() { nn::set_fusion(previous_); }
  ScopedFusion(const ScopedFusion&) = delete;
  ScopedFusion& operator=(const ScopedFusion&) = delete;

private:
  bool previous_;
};

// The most bytes live on `device` while `run` runs, beyond those live before it.
template <class Run> size_t peak_bytes_during(Device device, Run&& run) {
  Allocator& allocator = allocator_for(device);
  allocator.reset_peak();
  const size_t before = allocator.live_bytes();
  run();
  return allocator.peak_bytes() - before;
}

} // namespace minamp::test

// Skips the current test with a printed reason when no CUDA device can be used.
#define MINAMP_REQUIRE_GPU()                                                                       \
  do {                                                                                             \
    if (!::minamp::cuda_available())                                                               \
      GTEST_SKIP() << "no GPU: " << ::minamp::cuda_unavailable_reason();                           \
  } while (0)

// Skips a test of the CUDA allocator's cache when MINAMP_CUDA_EXACT_ALLOC turns the cache off
// (include device.cuh; CUDA builds only).
#define MINAMP_REQUIRE_CACHING()                                                                   \
  do {                                                                                             \
    if (::minamp::gpu::cuda_exact_allocation())                                                    \
      GTEST_SKIP() << "MINAMP_CUDA_EXACT_ALLOC is set: the allocator caches nothing";              \
  } while (0)
