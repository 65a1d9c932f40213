// The CUDA emulator's device side, force-included (-include) into every cuda/*.cu file compiled
// for the CPU (the library minamp_emulated, the test binary minamp_tests_emulated; `make test`
// runs it). With it the same kernel sources, compiled by the host C++ compiler, run every GPU
// test on a machine without a GPU:
//   - the CUDA keywords (__global__, __device__, __shared__, ...) become plain C++; a block's
//     __shared__ variables are thread_local, which is right because one OS thread runs one
//     block at a time, and filled with NaN bytes in each block before any thread uses them
//     (rewrite.cpp adds the call), as the dynamic shared memory is;
//   - threadIdx, blockIdx, blockDim and gridDim name the emulated thread's coordinates;
//   - __syncthreads and the warp-wide operations (__shfl_xor_sync, ldmatrix, mma.sync) switch
//     between the block's threads, which run as cooperative fibers (runtime.cpp): a barrier is
//     where a fiber waits for the others.
//     Between two __syncthreads the warps run one after another, first to last in one phase
//     and last to first in the next (odd blocks start backwards), so a race between warps
//     (one writes what another still reads) gives a wrong result in some block or phase.
//     Blocks run one at a time, the even ones upwards and then the odd ones downwards, so a
//     block that depends on a neighbouring block's writes fails too;
//   - nvcuda::wmma fragments (f16 or bf16 inputs) hold their whole 16x16 tile in every lane (the
//     API hides how the tile is spread over the warp, so no correct kernel can tell), with the
//     API's alignment rules checked; mma_sync sums like a tensor core, truncating
//     (detail::tensor_core_sum);
//   - ldmatrix and mma.sync.m16n8k16 (f16 or bf16; mma.cuh's helpers call them below) run lane
//     by lane, with
//     each lane's registers holding exactly the elements the PTX ISA gives that lane: a kernel
//     that hands a fragment to the wrong lane, or addresses a row the wrong lane should give,
//     computes a wrong result; a misaligned ldmatrix row, or one outside the block's dynamic
//     shared memory, is a fault;
//   - cp.async (gemm.cuh's helpers call cp_async below) is asynchronous as on sm_80: a copy's
//     destination reads as NaN from its issue until the cp.async.wait_group that covers its
//     commit group, so a missing or too weak wait, or a buffer refilled while other threads
//     still read it, shows up as NaN results;
//   - kernel<<<...>>>(args) launches were rewritten by rewrite.cpp into launch_kernel calls.
//
// What the emulator checks beyond the results: barriers every live thread of the block
// reaches, and at the same __syncthreads (a deadlock is reported, not hung), full-warp shuffles
// after lanes exited, WMMA pointer alignment and leading dimensions, launch sizes, launch bounds
// and shared-memory limits, copies that leave a device allocation, pinned host memory written or
// freed before the host waited for the cudaMemcpyAsync reading it (runtime.cpp), cp.async copies
// that are misaligned, leave their buffers or are never waited for, and host-synchronising calls
// during a graph capture. A kernel's plain loads and stores are not range-checked: one past a
// tensor's end but inside its allocator block goes unseen (`make test-sanitize` gives every
// tensor an exact-size block under AddressSanitizer, which sees it). It does not see timing, the
// memory model, or a race whose two orders give the same result in the test's data; that is
// what the GPU run and compute-sanitizer's racecheck are for.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h> // empty for a host compiler; included first so the sources' include is a no-op

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ thread_local
#define __launch_bounds__(...)

namespace minamp::emu {

// The coordinates of the emulated thread that is running (set by the scheduler at each switch).
struct ThreadCoordinates {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
extern thread_local ThreadCoordinates coordinates;

// Reports a kernel fault (the first one is kept): the launch's check then fails with
// cudaErrorLaunchFailure and `what` is printed.
void report_fault(const char* what);

// Waits until every live thread of the block reaches a barrier: the same __syncthreads, named
// by its source location (threads waiting at different ones are a fault, as CUDA requires).
void sync_block(const char* file, int line);
// The warp-wide exchange every warp-synchronous operation is built on: each of the 32 lanes
// puts `bytes` (at most kWarpExchangeBytes) in its slot and waits until all have; it returns
// the warp's 32 slots, lane l's at l * kWarpExchangeBytes, valid until the lane's next exchange.
constexpr size_t kWarpExchangeBytes = 64;
const unsigned char* warp_exchange(const void* mine, size_t bytes);
// Exchanges one 64-bit value per lane across the warp: returns the value lane ^ lane_mask gave.
uint64_t shuffle_xor(uint64_t value, int lane_mask);
// True when [p, p + bytes) lies in the running block's dynamic shared memory.
bool in_dynamic_shared_memory(const void* p, size_t bytes);

// Work a warp does together, done once: the calling lane's n-th warp-collective call since the
// block's last barrier gets the n-th slot of `floats` values of its warp; `first` says whether
// this lane is the first to reach it (and must fill it) or another lane has filled it already.
float* warp_collective_slot(size_t floats, bool& first);

// cp.async: copies `bytes` (4, 8 or 16) from device memory into the block's dynamic shared
// memory asynchronously. The destination reads as NaN until a cp_async_wait covers the copy's
// group: cp_async_commit closes the group of the copies issued since the last one, and
// cp_async_wait(n) lands every committed group but the n most recent (cp.async.wait_group n).
void cp_async(void* shared_dst, const void* global_src, size_t bytes);
void cp_async_commit();
void cp_async_wait(int pending_groups);

// Called where a static __shared__ variable is declared (rewrite.cpp adds the call): the first
// thread of a block to get there fills it with NaN bytes, the garbage a block starts with.
void static_shared_memory(void* variable, size_t bytes);

// Called first in a kernel defined with __launch_bounds__(max_threads[, ...]) (rewrite.cpp adds
// the call): a block of more threads than max_threads is a fault, as the launch fails on a GPU.
void check_launch_bounds(int max_threads, int min_blocks = 0, int max_blocks_per_cluster = 0);

// The running block's dynamic shared memory (the launch's size, 16-byte aligned).
void* dynamic_shared_memory_base();
template <class T> T* dynamic_shared_memory() {
  return static_cast<T*>(dynamic_shared_memory_base());
}

// Runs `thread_body` for every thread of every block of the grid, or records it in the graph
// when `stream` is capturing; `kernel` (its address, or nullptr) keys its dynamic shared-memory
// limit. Faults are reported through cudaGetLastError.
void launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            std::function<void()> thread_body);

// A kernel's address: the key of its dynamic shared-memory limit (cudaFuncSetAttribute's).
template <class Function> const void* kernel_address(Function* kernel) {
  return reinterpret_cast<const void*>(kernel);
}

template <class Kernel, class... Args>
void launch_kernel(const void* address, dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Kernel kernel, Args&&... args) {
  // The arguments are evaluated once, here, and copied like kernel parameters.
  launch(address, grid, block, shared_bytes, stream,
         [kernel, params = std::make_tuple(std::decay_t<Args>(std::forward<Args>(args))...)] {
           std::apply(kernel, params);
         });
}

} // namespace minamp::emu

#define threadIdx (::minamp::emu::coordinates.thread_idx)
#define blockIdx (::minamp::emu::coordinates.block_idx)
#define blockDim (::minamp::emu::coordinates.block_dim)
#define gridDim (::minamp::emu::coordinates.grid_dim)

// cuda_runtime.h's C++ overload, which it declares for nvcc only.
template <class... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

#define __syncthreads() ::minamp::emu::sync_block(__FILE__, __LINE__)

template <class T> T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>,
                "__shfl_xor_sync: 64-bit values at most");
  if (mask != 0xffffffffu || width != 32)
    ::minamp::emu::report_fault("__shfl_xor_sync: the emulator supports full warps only");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = ::minamp::emu::shuffle_xor(bits, lane_mask);
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

// A barrier for the lanes of one warp (full warps only).
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu)
    ::minamp::emu::report_fault("__syncwarp: the emulator supports full warps only");
  ::minamp::emu::warp_exchange(nullptr, 0);
}

// A kernel's trap (code a launcher must never reach) is a fault.
inline void __trap() { ::minamp::emu::report_fault("__trap: the kernel trapped"); }

// float -> int rounding toward zero, saturating; NaN gives 0 (cvt.rzi.s32.f32).
inline int __float2int_rz(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 2147483648.0f) return INT32_MAX;
  if (x <= -2147483648.0f) return INT32_MIN;
  return int(x);
}

// The float whose bits are `bits` (a reinterpretation, as mov.b32 in device code).
inline float __uint_as_float(unsigned bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

using std::isfinite;
using std::isinf;
using std::isnan;
using std::max;
using std::min;

// ---- nvcuda::wmma for 16x16x16 f16 and bf16 fragments with fp32 accumulators.
namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// The whole 16x16 tile, in fp32 (f16 and bf16 inputs convert exactly), row-major:
// v[row * 16 + col].
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator provides 16x16x16 fragments");
  float v[256];
};

namespace detail {
// The API's rules: a 256-bit aligned pointer and a leading dimension of whole 16-byte units.
template <class T> void check_pointer(const char* op, const T* p, unsigned ldm) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    ::minamp::emu::report_fault("wmma: the matrix pointer is not 256-bit aligned");
  if ((ldm * sizeof(T)) % 16 != 0) ::minamp::emu::report_fault(op);
}
template <class T> float to_float(T x) { return float(x); }
inline float to_float(__half x) {
#if defined(__F16C__)
  return _cvtsh_ss(__half_raw(x).x); // the hardware conversion: cuda_fp16's host one is slow
#else
  return __half2float(x);
#endif
}
inline float to_float(__nv_bfloat16 x) { // float's upper half: exact by a shift
  uint16_t pattern;
  std::memcpy(&pattern, &x, sizeof pattern);
  const uint32_t bits = uint32_t(pattern) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}
} // namespace detail

template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  detail::check_pointer("wmma::load_matrix_sync: ldm is not a multiple of 16 bytes", p, ldm);
  constexpr bool kRowMajor = std::is_same_v<Layout, row_major>;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.v[r * 16 + c] = detail::to_float(kRowMajor ? p[r * ldm + c] : p[c * ldm + r]);
}

template <class T>
void store_matrix_sync(T* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm,
                       layout_t layout) {
  detail::check_pointer("wmma::store_matrix_sync: ldm is not a multiple of 16 bytes", p, ldm);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = T(f.v[r * 16 + c]);
}

template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float value) {
  std::fill(f.v, f.v + 256, value);
}

namespace detail {
// Products of f16 (or bf16) values added to an fp32 accumulator the way tensor cores are measured
// to do it (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021), not as an FMA chain:
// the products are exact (11 + 11 or 8 + 8 significant bits fit a double, and a float); a group of
// kTensorCoreTerms of them and the accumulator are aligned to the largest exponent among them,
// every bit below that term's 24-bit significand is dropped (truncation, no guard bits) and the
// exact sum of what is left is rounded toward zero to fp32. This errs on the pessimistic side (the
// hardware may keep guard bits or take more terms at once), so a tolerance that holds here holds on
// a GPU.
constexpr int kTensorCoreTerms = 8;

inline float round_toward_zero(double x) {
  const float nearest = static_cast<float>(x);
  if (!std::isfinite(nearest) || std::abs(double(nearest)) <= std::abs(x)) return nearest;
  return std::nextafter(nearest, 0.0f);
}

inline float tensor_core_sum(float accumulator, const double* products, int count) {
  double exact = accumulator;
  int largest = INT32_MIN; // the exponent e of the largest term, |term| < 2^e
  for (int i = 0; i < count; ++i) exact += products[i];
  if (!std::isfinite(exact)) return static_cast<float>(exact); // inf or NaN propagate
  const auto exponent_of = [&](double x) {
    int e = 0;
    if (x != 0.0) std::frexp(x, &e);
    if (x != 0.0) largest = std::max(largest, e);
  };
  exponent_of(accumulator);
  for (int i = 0; i < count; ++i) exponent_of(products[i]);
  if (largest == INT32_MIN) return accumulator + 0.0f;  // every term is zero
  const double quantum = std::ldexp(1.0, largest - 24); // the largest term's last kept bit
  double sum = std::trunc(double(accumulator) / quantum) * quantum;
  for (int i = 0; i < count; ++i) sum += std::trunc(products[i] / quantum) * quantum;
  return round_toward_zero(sum);
}

// out = a @ b + c, summed over k in groups of kTensorCoreTerms by tensor_core_sum.
inline void multiply_add(const float* a, const float* b, const float* c, float* out) {
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      float acc = c[r * 16 + col];
      for (int k0 = 0; k0 < 16; k0 += kTensorCoreTerms) {
        double products[kTensorCoreTerms];
        for (int k = 0; k < kTensorCoreTerms; ++k)
          products[k] = double(a[r * 16 + k0 + k]) * double(b[(k0 + k) * 16 + col]);
        acc = tensor_core_sum(acc, products, kTensorCoreTerms);
      }
      out[r * 16 + col] = acc;
    }
}
} // namespace detail

// d = a @ b + c in fp32. Every lane holds the same fragments, so the first lane of the warp to
// get here computes the product and the others copy it, after checking that they were given
// the same a, b and c (a warp-collective call with per-lane operands is a kernel bug).
template <class TA, class LA, class TB, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
              const fragment<matrix_b, 16, 16, 16, TB, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  constexpr size_t kTile = sizeof(d.v);
  bool first = false;
  float* slot = ::minamp::emu::warp_collective_slot(4 * 256, first); // [a, b, c, a @ b + c]
  if (first) {
    std::memcpy(slot, a.v, kTile);
    std::memcpy(slot + 256, b.v, kTile);
    std::memcpy(slot + 512, c.v, kTile);
    detail::multiply_add(a.v, b.v, c.v, slot + 768);
  } else if (std::memcmp(slot, a.v, kTile) != 0 || std::memcmp(slot + 256, b.v, kTile) != 0 ||
             std::memcmp(slot + 512, c.v, kTile) != 0) {
    ::minamp::emu::report_fault("wmma::mma_sync: the lanes of a warp hold different fragments");
  }
  std::memcpy(d.v, slot + 768, kTile);
}

} // namespace nvcuda::wmma

// ---- ldmatrix and mma.sync.m16n8k16 (f16 or bf16 inputs, fp32 accumulators), lane by lane.
namespace minamp::emu {

namespace detail {
inline int lane_id() {
  const ThreadCoordinates& c = coordinates;
  return int((c.thread_idx.x + c.block_dim.x * (c.thread_idx.y + c.block_dim.y * c.thread_idx.z)) %
             32);
}
// The value of the 16-bit pattern `bits` as a T (__half or __nv_bfloat16).
template <class T> float element_value(uint32_t bits) {
  using Raw = std::conditional_t<std::is_same_v<T, __half>, __half_raw, __nv_bfloat16_raw>;
  Raw raw;
  raw.x = static_cast<unsigned short>(bits);
  return nvcuda::wmma::detail::to_float(T(raw));
}
} // namespace detail

// ldmatrix.sync.aligned.m8n8.x{matrices}[.trans].shared.b16: lanes 8j .. 8j + 7 give the
// addresses of the 8 rows (16 bytes each) of matrix j; lane l receives in register j the two
// 16-bit elements at row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j (lower half
// first), or with .trans those of its transpose: column l / 4 of rows 2 (l % 4) and 2 (l % 4) + 1.
// It moves bits: f16 and bf16 alike.
inline void ldmatrix(uint32_t* regs, int matrices, bool trans, const void* row) {
  const uint64_t address = reinterpret_cast<uintptr_t>(row);
  const unsigned char* slots = warp_exchange(&address, sizeof(address));
  const auto row_of = [&](int lane) {
    uint64_t at = 0;
    std::memcpy(&at, slots + size_t(lane) * kWarpExchangeBytes, sizeof(at));
    return reinterpret_cast<const uint16_t*>(uintptr_t(at));
  };
  for (int lane = 0; lane < 8 * matrices; ++lane) {
    const uint16_t* r = row_of(lane);
    if (reinterpret_cast<uintptr_t>(r) % 16 != 0 || !in_dynamic_shared_memory(r, 16)) {
      report_fault("ldmatrix: a row address is not 16-byte aligned or not in the block's dynamic "
                   "shared memory");
      std::fill(regs, regs + matrices, 0u);
      return;
    }
  }
  const int l = detail::lane_id(), g = l / 4, t = l % 4;
  for (int j = 0; j < matrices; ++j) {
    const uint32_t lo = trans ? row_of(8 * j + 2 * t)[g] : row_of(8 * j + g)[2 * t];
    const uint32_t hi = trans ? row_of(8 * j + 2 * t + 1)[g] : row_of(8 * j + g)[2 * t + 1];
    regs[j] = lo | (hi << 16);
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (T = __half or
// __nv_bfloat16): D[16, 8] = A[16, 16] @ B[16, 8] + C, the fragments spread over the warp as the
// PTX ISA lays them out (g = lane / 4, t = lane % 4):
//   a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8,
//   2t+9] b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g] c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] =
//   C[g+8][2t, 2t+1] (and d likewise)
// summed as the WMMA emulation sums (tensor_core_sum, groups of kTensorCoreTerms products).
template <class T>
void mma_m16n8k16(float* d, const uint32_t* a, const uint32_t* b, const float* c) {
  struct Fragments {
    uint32_t a[4], b[2];
  } mine;
  std::memcpy(mine.a, a, sizeof(mine.a));
  std::memcpy(mine.b, b, sizeof(mine.b));
  const unsigned char* slots = warp_exchange(&mine, sizeof(mine));
  const auto lane_fragments = [&](int lane) {
    Fragments f;
    std::memcpy(&f, slots + size_t(lane) * kWarpExchangeBytes, sizeof(f));
    return f;
  };
  // A[row][k] and B[k][col] as held by the lane the layout above gives them to.
  const auto a_at = [&](int row, int k) {
    const uint32_t reg = lane_fragments((row % 8) * 4 + (k % 8) / 2).a[(row / 8) + 2 * (k / 8)];
    return detail::element_value<T>(k % 2 ? reg >> 16 : reg & 0xffff);
  };
  const auto b_at = [&](int k, int col) {
    const uint32_t reg = lane_fragments(col * 4 + (k % 8) / 2).b[k / 8];
    return detail::element_value<T>(k % 2 ? reg >> 16 : reg & 0xffff);
  };
  using nvcuda::wmma::detail::kTensorCoreTerms;
  const int l = detail::lane_id(), g = l / 4, t = l % 4;
  float out[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float acc = c[i];
    for (int k0 = 0; k0 < 16; k0 += kTensorCoreTerms) {
      double products[kTensorCoreTerms];
      for (int k = 0; k < kTensorCoreTerms; ++k)
        products[k] = double(a_at(row, k0 + k)) * double(b_at(k0 + k, col));
      acc = nvcuda::wmma::detail::tensor_core_sum(acc, products, kTensorCoreTerms);
    }
    out[i] = acc;
  }
  std::copy(out, out + 4, d);
}

} // namespace minamp::emu
