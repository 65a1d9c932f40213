// CUDA elementwise kernels: fill, cast, add_inplace, mul_scalar, add, ReLU, and the small
// reductions bias_backward, sum_squares, clip_coefficient and range_counts.
//
// Every map goes through one generic kernel (map_kernel): four elements at a time with 16-byte
// (f32, i32) or 8-byte (f16, bf16) accesses when every pointer is aligned for it, one at a time for
// the tail and for unaligned pointers, so any size (0 included) is handled.
#include <cmath>
#include <type_traits>

#include "common.cuh"
#include "device.cuh"
#include "kernels/kernels.h"
#include "reduce.cuh"

namespace minamp::gpu {

// ---- Loads and stores of one value and of four values for i32 (f32, f16 and bf16 come from
// common.cuh). They sit beside common.cuh's, outside the anonymous namespace, so that they
// overload rather than hide them.

// i32 converts through float; float -> i32 truncates toward zero (NaN becomes 0).
__device__ __forceinline__ float load_f(const int32_t* p, int64_t i) { return float(p[i]); }
__device__ __forceinline__ void store_f(int32_t* p, int64_t i, float v) {
  p[i] = __float2int_rz(v);
}
__device__ __forceinline__ Float4 load4(const int32_t* p, int64_t i) {
  const int4 q = *reinterpret_cast<const int4*>(p + i);
  return {{float(q.x), float(q.y), float(q.z), float(q.w)}};
}
__device__ __forceinline__ void store4(int32_t* p, int64_t i, const Float4& f) {
  *reinterpret_cast<int4*>(p + i) = make_int4(__float2int_rz(f.v[0]), __float2int_rz(f.v[1]),
                                              __float2int_rz(f.v[2]), __float2int_rz(f.v[3]));
}

namespace {

constexpr int kThreads = 256;

// op applied lane by lane to four-value packs (any number of inputs, none included).
template <class Op, class... Packs>
__device__ __forceinline__ Float4 apply4(const Op& op, const Packs&... in) {
  Float4 out;
  for (int j = 0; j < 4; ++j) out.v[j] = op(in.v[j]...);
  return out;
}

// out[i] = op(in[i]...) for i < n. `out` may be one of the inputs: each element is read and
// written by the same thread in the same iteration.
template <class TOut, class Op, class... TIn>
__global__ void __launch_bounds__(kThreads)
    map_kernel(TOut* out, int64_t n, bool vectorised, Op op, const TIn*... in) {
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t packs = vectorised ? n / 4 : 0;
  for (int64_t p = first; p < packs; p += stride)
    store4(out, 4 * p, apply4(op, load4(in, 4 * p)...));
  for (int64_t i = 4 * packs + first; i < n; i += stride) store_f(out, i, op(load_f(in, i)...));
}

template <class TOut, class Op, class... TIn>
void launch_map(const char* op_name, TOut* out, int64_t n, const Op& op, const TIn*... in) {
  if (n == 0) return;
  const bool vectorised = aligned_for_pack(out) && (aligned_for_pack(in) && ...);
  const int blocks = grid_for(vectorised ? (n + 3) / 4 : n, kThreads);
  map_kernel<<<blocks, kThreads, 0, stream()>>>(out, n, vectorised, op, in...);
  CUDA_CHECK_LAUNCH(op_name);
}

// Calls f(TypeTag<T>) for the storage type of any dtype (f32, f16, bf16, i32).
template <class F> void visit_storage(const Tensor& t, F&& f) {
  if (t.dtype() == DType::i32) return f(TypeTag<int32_t>{});
  visit_floating(t, "visit_storage", f);
}

// ---- The per-element operations.

struct Constant {
  float value;
  __device__ float operator()() const { return value; }
};
struct Identity {
  __device__ float operator()(float v) const { return v; }
};
struct AddScaled { // dst + alpha * src
  float alpha;
  __device__ float operator()(float dst, float src) const { return dst + alpha * src; }
};
struct ScaleOnDevice { // v * scale[0], the scale read where it lives
  const float* scale;
  __device__ float operator()(float v) const { return v * *scale; }
};
struct AddRelu { // a + b, then ReLU when asked (NaN passes through)
  bool relu;
  __device__ float operator()(float a, float b) const {
    const float sum = a + b;
    return relu && sum < 0.0f ? 0.0f : sum;
  }
};
struct Relu { // NaN passes through, as in PyTorch, so an overflow is never hidden
  __device__ float operator()(float v) const { return v < 0.0f ? 0.0f : v; }
};
struct ReluGrad { // 0 where the forward output y <= 0, else dy (also at NaN, as in PyTorch)
  __device__ float operator()(float y, float dy) const { return y <= 0.0f ? 0.0f : dy; }
};

} // namespace

void fill(Tensor& dst, float value) {
  require_fill(dst, value);
  visit_storage(dst, [&](auto out) {
    using TOut = typename decltype(out)::type;
    launch_map("fill", ptr<TOut>(dst), dst.numel(), Constant{value});
  });
}

// Same dtype: a plain device copy. Otherwise through float; float -> i32 truncates toward zero on
// the device, where a bad value cannot be reported: NaN becomes 0, ±inf and values beyond int32
// saturate (the CPU reference throws instead).
void cast(const Tensor& src, Tensor& dst) {
  require_cast(src, dst);
  if (src.nbytes() == 0) return;
  if (src.dtype() == dst.dtype()) {
    CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, stream()),
        "cast");
    return;
  }
  visit_storage(dst, [&](auto out) {
    visit_storage(src, [&](auto in) {
      using TOut = typename decltype(out)::type;
      using TIn = typename decltype(in)::type;
      launch_map("cast", ptr<TOut>(dst), dst.numel(), Identity{}, ptr<const TIn>(src));
    });
  });
}

void add_inplace(Tensor& dst, const Tensor& src, float alpha) {
  require_add_inplace(dst, src);
  visit_floating(dst, "add_inplace", [&](auto out) {
    visit_floating(src, "add_inplace", [&](auto in) {
      using TOut = typename decltype(out)::type;
      using TIn = typename decltype(in)::type;
      launch_map("add_inplace", ptr<TOut>(dst), dst.numel(), AddScaled{alpha}, ptr<const TOut>(dst),
                 ptr<const TIn>(src));
    });
  });
}

void mul_scalar(const Tensor& src, const Tensor& scale, Tensor& dst) {
  require_mul_scalar(src, scale, dst);
  visit_floating(dst, "mul_scalar", [&](auto out) {
    visit_floating(src, "mul_scalar", [&](auto in) {
      using TOut = typename decltype(out)::type;
      using TIn = typename decltype(in)::type;
      launch_map("mul_scalar", ptr<TOut>(dst), dst.numel(), ScaleOnDevice{ptr<const float>(scale)},
                 ptr<const TIn>(src));
    });
  });
}

void add_forward(const Tensor& a, const Tensor& b, Tensor& y, bool relu) {
  require_add_forward(a, b, y);
  visit_floating(y, "add_forward", [&](auto out) {
    visit_floating(a, "add_forward", [&](auto left) {
      visit_floating(b, "add_forward", [&](auto right) {
        using TOut = typename decltype(out)::type;
        using TA = typename decltype(left)::type;
        using TB = typename decltype(right)::type;
        launch_map("add_forward", ptr<TOut>(y), y.numel(), AddRelu{relu}, ptr<const TA>(a),
                   ptr<const TB>(b));
      });
    });
  });
}

void relu_forward(const Tensor& x, Tensor& y) {
  require_relu_forward(x, y);
  visit_floating(x, "relu_forward", [&](auto type) {
    using T = typename decltype(type)::type;
    launch_map("relu_forward", ptr<T>(y), y.numel(), Relu{}, ptr<const T>(x));
  });
}

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  require_relu_backward(y, dy, dx);
  visit_floating(dx, "relu_backward", [&](auto out) {
    visit_floating(y, "relu_backward", [&](auto forward) {
      visit_floating(dy, "relu_backward", [&](auto grad) {
        using TOut = typename decltype(out)::type;
        using TY = typename decltype(forward)::type;
        using TDy = typename decltype(grad)::type;
        launch_map("relu_backward", ptr<TOut>(dx), dx.numel(), ReluGrad{}, ptr<const TY>(y),
                   ptr<const TDy>(dy));
      });
    });
  });
}

// ---- Reductions (two-stage, fp32, see reduce.cuh).

namespace {

template <class T> struct ColumnValue { // dy[row, col] of a [rows, cols] matrix
  const T* dy;
  int cols;
  __device__ void operator()(int64_t row, int col, float (&v)[1]) const {
    v[0] = load_f(dy, row * cols + col);
  }
};
struct AddToColumn { // db[col] += total
  float* db;
  __device__ void operator()(int col, float (&total)[1]) const { db[col] += total[0]; }
};

template <class T> struct Square {
  const T* x;
  __device__ void operator()(int64_t i, float (&v)[1]) const {
    const float value = load_f(x, i);
    v[0] = value * value;
  }
};
struct AddToScalar { // out[0] += total
  float* out;
  __device__ void operator()(float (&total)[1]) const { out[0] += total[0]; }
};

// The five counts of range_counts for one value (see kernel_list.h), as 0 or 1, for values of x
// (stored as T) rounded to Format (__half or __nv_bfloat16).
template <class T, class Format> struct FormatRange {
  const T* x;
  float scale;
  __device__ void operator()(int64_t i, float (&v)[5]) const {
    constexpr float kMinNormal =
        std::is_same_v<Format, __half> ? kHalfMinNormal : kBfloat16MinNormal;
    const float value = load_f(x, i);
    const bool finite = isfinite(value);
    const bool nonzero = finite && value != 0.0f;
    Format rounded;
    store_f(&rounded, 0, value * scale);
    const float scaled = load_f(&rounded, 0);
    const bool flushed = nonzero && scaled == 0.0f;
    const bool overflowed = nonzero && isinf(scaled);
    v[0] = flushed;
    v[1] = nonzero && !flushed && !overflowed && fabsf(scaled) < kMinNormal;
    v[2] = overflowed;
    v[3] = nonzero;
    v[4] = !finite;
  }
};
struct AddCounts { // counts[k] += total[k]
  float* counts;
  __device__ void operator()(float (&total)[5]) const {
    for (int k = 0; k < 5; ++k) counts[k] += total[k];
  }
};

// coef[0] = min(1, max_norm / (sqrt(sum_sq[0]) + 1e-6)); a NaN norm gives a NaN coefficient.
__global__ void clip_coefficient_kernel(const float* sum_sq, float max_norm, float* coef) {
  const float ratio = max_norm / (sqrtf(sum_sq[0]) + 1e-6f);
  coef[0] = ratio > 1.0f ? 1.0f : ratio;
}

} // namespace

void bias_backward(const Tensor& dy, Tensor& db) {
  require_bias_backward(dy, db);
  const int64_t rows = dy.shape().rows(), cols = dy.shape().last(); // dy [rows, N]
  visit_floating(dy, "bias_backward", [&](auto type) {
    using T = typename decltype(type)::type;
    reduce_columns<1>(rows, int(cols), ColumnValue<T>{ptr<const T>(dy), int(cols)},
                      AddToColumn{ptr<float>(db)}, "bias_backward");
  });
}

void sum_squares(const Tensor& x, Tensor& sum_sq) {
  require_sum_squares(x, sum_sq);
  visit_floating(x, "sum_squares", [&](auto type) {
    using T = typename decltype(type)::type;
    reduce_all<1>(x.numel(), Square<T>{ptr<const T>(x)}, AddToScalar{ptr<float>(sum_sq)},
                  "sum_squares");
  });
}

void clip_coefficient(const Tensor& sum_sq, float max_norm, Tensor& coef) {
  require_clip_coefficient(sum_sq, coef);
  clip_coefficient_kernel<<<1, 1, 0, stream()>>>(ptr<const float>(sum_sq), max_norm,
                                                 ptr<float>(coef));
  CUDA_CHECK_LAUNCH("clip_coefficient");
}

// Counts are summed as floats: exact while every count stays below 2^24.
void range_counts(const Tensor& x, float scale, DType format, Tensor& counts) {
  require_range_counts(x, format, counts);
  visit_floating(x, "range_counts", [&](auto type) {
    visit_half_precision(format, "range_counts", [&](auto format_type) {
      using T = typename decltype(type)::type;
      using Format = typename decltype(format_type)::type;
      reduce_all<5>(x.numel(), FormatRange<T, Format>{ptr<const T>(x), scale},
                    AddCounts{ptr<float>(counts)}, "range_counts");
    });
  });
}

} // namespace minamp::gpu
