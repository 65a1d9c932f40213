// Tests of the CUDA emulator itself (cuda/emulator/), built only with MINAMP_CUDA_EMULATOR: the
// CUDA semantics the kernels rely on (barriers, shuffles, the warp order that exposes races, WMMA
// layouts, dynamic shared memory, cp.async groups, graph capture) and the faults it must report
// instead of computing garbage or hanging. Like cuda/*.cu, this file goes through rewrite.cpp and
// has emulator.h force-included, so it is written as CUDA (and checks the rewriting too).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "gemm.cuh" // the cp.async helpers
#include "mma.cuh"  // ldmatrix, mma.sync

namespace {

// Device memory holding `n` values of T, freed at scope exit.
template <class T> struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : size(n) {
    EXPECT_EQ(cudaMalloc(&data, n * sizeof(T)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(data); }
  std::vector<T> download() const {
    std::vector<T> host(size);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), data, size * sizeof(T), cudaMemcpyDeviceToHost, nullptr),
              cudaSuccess);
    return host;
  }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(cudaMemcpyAsync(data, host.data(), size * sizeof(T), cudaMemcpyHostToDevice, nullptr),
              cudaSuccess);
  }
  T* data = nullptr;
  size_t size;
};

__global__ void xor_shuffle_kernel(int* out, int lane_mask) {
  const int t = int(threadIdx.x);
  out[t] = __shfl_xor_sync(0xffffffffu, t * 10, lane_mask);
}

TEST(Emulator, ShuffleXorReadsThePartnerLane) {
  DeviceBuffer<int> out(64);
  for (int mask : {1, 5, 16}) {
    xor_shuffle_kernel<<<1, 64>>>(out.data, mask);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<int> got = out.download();
    for (int t = 0; t < 64; ++t) {
      const int partner = (t & ~31) | ((t % 32) ^ mask);
      EXPECT_EQ(got[t], partner * 10) << "thread " << t << " mask " << mask;
    }
  }
}

// Each thread writes its slot, waits at the barrier, then reads a slot another warp wrote.
__global__ void barrier_kernel(int* out) {
  __shared__ int slots[256];
  const int t = int(threadIdx.x);
  slots[t] = t + 1000 * int(blockIdx.x);
  __syncthreads();
  out[blockIdx.x * 256 + t] = slots[255 - t];
}

TEST(Emulator, SyncthreadsMakesEveryWriteVisible) {
  DeviceBuffer<int> out(3 * 256);
  barrier_kernel<<<3, 256>>>(out.data);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = out.download();
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 256; ++t) EXPECT_EQ(got[b * 256 + t], 255 - t + 1000 * b);
}

// Lane 0 waits at __syncthreads while the rest of its warp waits for it at a shuffle.
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x == 0)
    __syncthreads();
  else
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

TEST(Emulator, BarriersNotEveryThreadReachesAreAFaultNotAHang) {
  DeviceBuffer<int> out(64);
  divergent_barrier_kernel<<<1, 64>>>(out.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the error is reported once";
}

// The first warp waits at one __syncthreads, the second at another.
__global__ void two_barriers_kernel(int* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
    out[threadIdx.x] = 1;
  } else {
    __syncthreads();
    out[threadIdx.x] = 2;
  }
}

TEST(Emulator, ThreadsAtDifferentSyncthreadsAreAFault) {
  DeviceBuffer<int> out(64);
  two_barriers_kernel<<<1, 64>>>(out.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

__global__ void early_exit_shuffle_kernel(int* out) {
  if (threadIdx.x % 32 == 7) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

TEST(Emulator, FullWarpShuffleAfterALaneExitedIsAFault) {
  DeviceBuffer<int> out(32);
  early_exit_shuffle_kernel<<<1, 32>>>(out.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

// Warp 1 writes a flag that warp 0 reads with no barrier between: a race.
__global__ void racy_flag_kernel(int* out) {
  __shared__ int flag;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  if (threadIdx.x == 32) flag = 1;
  if (threadIdx.x == 0) out[blockIdx.x] = flag;
}

// Between barriers the warps run one after another, in one order in even blocks and the other
// in odd ones, so both outcomes of the race occur and a test comparing with a reference fails.
TEST(Emulator, WarpsRunInBothOrdersBetweenBarriers) {
  DeviceBuffer<int> out(2);
  racy_flag_kernel<<<2, 64>>>(out.data);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = out.download();
  EXPECT_NE(got[0], got[1]) << "the race reads the flag before its write in one block, after in "
                               "the other";
}

// Two races in one block, one per barrier phase: warp 0 reads a flag warp 1 sets (to 1, then 2).
__global__ void racy_two_phases_kernel(int* out) {
  __shared__ int flag;
  if (threadIdx.x == 0) flag = 0;
  __syncthreads();
  if (threadIdx.x == 32) flag = 1;
  if (threadIdx.x == 0) out[0] = flag;
  __syncthreads();
  if (threadIdx.x == 32) flag = 2;
  if (threadIdx.x == 0) out[1] = flag;
}

// Within one block too the order alternates from one barrier phase to the next, so a race
// between warps shows in a single-block launch.
TEST(Emulator, WarpOrderAlternatesBetweenBarrierPhasesOfOneBlock) {
  DeviceBuffer<int> out(2);
  racy_two_phases_kernel<<<1, 64>>>(out.data);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<int> got = out.download();
  const bool warp0_first_then = got[0] == 0, warp0_first_now = got[1] == 1;
  EXPECT_NE(warp0_first_then, warp0_first_now) << got[0] << ", " << got[1];
}

// Each block marks its slot, then reads the slot of its neighbour at `offset` (a dependency
// between blocks, which a GPU does not order).
__global__ void neighbour_kernel(int* marks, int* seen, int offset) {
  const int b = int(blockIdx.x), neighbour = b + offset;
  marks[b] = 1;
  seen[b] = neighbour >= 0 && neighbour < int(gridDim.x) ? marks[neighbour] : -1;
}

TEST(Emulator, BlocksRunInAnOrderThatExposesDependenciesOnEitherNeighbour) {
  for (int offset : {-1, 1}) {
    DeviceBuffer<int> marks(8), seen(8);
    marks.upload(std::vector<int>(8, 0));
    neighbour_kernel<<<8, 1>>>(marks.data, seen.data, offset);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<int> got = seen.download();
    EXPECT_NE(std::count(got.begin(), got.end(), 0), 0)
        << "offset " << offset << ": some block must run before its neighbour";
    EXPECT_NE(std::count(got.begin(), got.end(), 1), 0) << "offset " << offset;
  }
}

// Block b records its place in the order the blocks ran (the emulator runs them one at a time,
// so the unsynchronised counter is exact there; on a GPU this would be a race).
__global__ void block_order_kernel(int* count, int* order) { order[count[0]++] = int(blockIdx.x); }

TEST(Emulator, BlocksRunEvenOnesUpThenOddOnesDown) {
  DeviceBuffer<int> count(1), order(8);
  count.upload({0});
  block_order_kernel<<<8, 1>>>(count.data, order.data);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(order.download(), (std::vector<int>{0, 2, 4, 6, 7, 5, 3, 1}));
}

// Only block 0 writes the static shared variable; every block reads it.
__global__ void static_shared_kernel(float* out) {
  __shared__ float value;
  if (blockIdx.x == 0) value = 1.0f;
  out[blockIdx.x] = value;
}

TEST(Emulator, StaticSharedMemoryStartsAsNaNInEveryBlock) {
  DeviceBuffer<float> out(3);
  static_shared_kernel<<<3, 1>>>(out.data);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = out.download();
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_TRUE(std::isnan(got[1])) << "block 1 must not see what block 0 wrote";
  EXPECT_TRUE(std::isnan(got[2]));
}

// Every thread of every block reads the dynamic shared memory before writing it: it must be
// garbage (NaN), also where a block before it wrote.
__global__ void dynamic_shared_kernel(float* out, uintptr_t* address) {
  extern __shared__ __align__(128) unsigned char bytes[];
  float* values = reinterpret_cast<float*>(bytes);
  out[blockIdx.x * blockDim.x + threadIdx.x] = values[threadIdx.x];
  if (threadIdx.x == 0) values[0] = 1.0f; // the next block must not see it
  if (threadIdx.x == 0) *address = reinterpret_cast<uintptr_t>(bytes);
}

TEST(Emulator, DynamicSharedMemoryIsAlignedAndStartsAsNaN) {
  DeviceBuffer<float> out(3 * 32);
  DeviceBuffer<uintptr_t> address(1);
  dynamic_shared_kernel<<<3, 32, 32 * sizeof(float)>>>(out.data, address.data); // every block
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  for (float v : out.download()) EXPECT_TRUE(std::isnan(v));
  EXPECT_EQ(address.download()[0] % 128, 0u);
}

// Writes the last float of its dynamic shared memory (of `floats` floats) to out; two instances
// are two kernels, each with its own shared-memory limit.
template <int kInstance> __global__ void last_shared_float_kernel(float* out, int floats) {
  extern __shared__ __align__(128) unsigned char bytes[];
  float* values = reinterpret_cast<float*>(bytes);
  values[floats - 1] = float(kInstance);
  *out = values[floats - 1];
}

// Above 48 KiB a launch needs cudaFuncSetAttribute on that kernel, as on a GPU: one kernel's
// raised limit lets no other kernel launch, and a limit set lower again is lower.
TEST(Emulator, DynamicSharedMemoryAbove48KiBNeedsTheKernelsOwnLimitRaised) {
  DeviceBuffer<float> out(1);
  const int bytes = 64 * 1024, floats = bytes / int(sizeof(float));
  last_shared_float_kernel<1><<<1, 1, bytes>>>(out.data, floats);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "above 48 KiB without the attribute";
  ASSERT_EQ(cudaFuncSetAttribute(last_shared_float_kernel<1>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
            cudaSuccess);
  last_shared_float_kernel<1><<<1, 1, bytes>>>(out.data, floats);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(out.download()[0], 1.0f);
  last_shared_float_kernel<2><<<1, 1, bytes>>>(out.data, floats);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "another kernel's limit was used";
  ASSERT_EQ(cudaFuncSetAttribute(last_shared_float_kernel<1>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 32 * 1024),
            cudaSuccess);
  last_shared_float_kernel<1><<<1, 1, 40 * 1024>>>(out.data, 10 * 1024);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "the lowered limit was not kept";
}

// Fresh device memory reads as NaN bytes, as memory a kernel never wrote is garbage on a GPU.
TEST(Emulator, FreshDeviceMemoryIsNaN) {
  DeviceBuffer<float> fresh(64);
  for (float v : fresh.download()) EXPECT_TRUE(std::isnan(v));
}

// cudaEventElapsedTime gives milliseconds: 20 ms of host sleep between two records.
TEST(Emulator, EventsMeasureMilliseconds) {
  cudaEvent_t start = nullptr, end = nullptr;
  ASSERT_EQ(cudaEventCreate(&start), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(start, nullptr), cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(cudaEventRecord(end, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, start, end), cudaSuccess);
  EXPECT_GE(ms, 19.0f);
  EXPECT_LT(ms, 5000.0f);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
}

// One thread copies src [16] into shared memory by cp.async in four 16-byte chunks: chunks 0-2
// in commit groups of their own, chunk 3 issued but not committed. It records the tile after
// cp_async_wait<kPending> in seen[0:16] and after committing and draining in seen[16:32].
template <int kPending> __global__ void cp_async_groups_kernel(const float* src, float* seen) {
  using namespace minamp::gpu;
  extern __shared__ __align__(128) unsigned char bytes[];
  float* tile = reinterpret_cast<float*>(bytes);
  for (int chunk = 0; chunk < 3; ++chunk) {
    cp_async16(tile + 4 * chunk, src + 4 * chunk);
    cp_async_commit();
  }
  cp_async16(tile + 12, src + 12);
  cp_async_wait<kPending>();
  for (int i = 0; i < 16; ++i) seen[i] = tile[i];
  cp_async_commit();
  cp_async_wait<0>();
  for (int i = 0; i < 16; ++i) seen[16 + i] = tile[i];
}

// After wait_group n the committed groups but the n most recent have landed; the others, and
// copies not yet committed, read as NaN (undefined on a GPU) until a later wait covers them.
template <int kPending> void check_cp_async_groups() {
  DeviceBuffer<float> src(16), seen(32);
  std::vector<float> values(16);
  for (int i = 0; i < 16; ++i) values[i] = 0.5f * float(i) - 3.0f;
  src.upload(values);
  cp_async_groups_kernel<kPending><<<1, 1, 64>>>(src.data, seen.data);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = seen.download();
  for (int i = 0; i < 16; ++i) {
    const int chunk = i / 4;
    if (chunk < 3 - kPending)
      EXPECT_EQ(got[i], values[i]) << "chunk " << chunk << " after wait_group " << kPending;
    else
      EXPECT_TRUE(std::isnan(got[i])) << "chunk " << chunk << " after wait_group " << kPending;
    EXPECT_EQ(got[16 + i], values[i]) << "after draining";
  }
}

TEST(Emulator, CpAsyncCopiesLandAtTheWaitThatCoversTheirGroup) {
  check_cp_async_groups<0>();
  check_cp_async_groups<1>();
  check_cp_async_groups<2>();
}

// Issues one cp.async from src + offset; waits for it unless `leave_in_flight`.
__global__ void cp_async_one_kernel(const float* src, int offset, bool leave_in_flight) {
  using namespace minamp::gpu;
  extern __shared__ __align__(128) unsigned char bytes[];
  cp_async16(bytes, src + offset);
  cp_async_commit();
  if (!leave_in_flight) cp_async_wait<0>();
}

TEST(Emulator, CpAsyncMisuseIsAFault) {
  DeviceBuffer<float> src(8);
  src.upload(std::vector<float>(8, 1.0f));
  cp_async_one_kernel<<<1, 32, 16>>>(src.data, 4, false);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << "a correct use";
  cp_async_one_kernel<<<1, 32, 16>>>(src.data, 4, true);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "a copy no wait covers";
  cp_async_one_kernel<<<1, 32, 16>>>(src.data, 1, false);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "a source not 16-byte aligned";
  cp_async_one_kernel<<<1, 32, 16>>>(src.data, 8, false);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "a source past its allocation";
  cp_async_one_kernel<<<1, 32, 8>>>(src.data, 0, false);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure) << "a destination past the shared memory";
}

// On a GPU a cudaMemcpyAsync from pinned memory reads it later: writing or freeing the buffer
// before waiting for the copy (an event recorded after it, or the stream) races with it. The
// emulator copies at once, so it reports such a write or free instead.
TEST(Emulator, PinnedMemoryACopyMayStillReadIsNotToBeWrittenOrFreed) {
  DeviceBuffer<float> dst(4);
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 4 * sizeof(float)), cudaSuccess);
  cudaEvent_t copied = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming), cudaSuccess);
  const auto copy = [&] {
    return cudaMemcpyAsync(dst.data, pinned, 4 * sizeof(float), cudaMemcpyHostToDevice, nullptr);
  };
  std::fill(pinned, pinned + 4, 1.0f);
  ASSERT_EQ(copy(), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(copied, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(copied), cudaSuccess);
  pinned[0] = 2.0f; // after the wait
  ASSERT_EQ(copy(), cudaSuccess);
  pinned[0] = 3.0f; // before any wait: the copy may read 2 or 3
  EXPECT_EQ(copy(), cudaErrorIllegalState);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);

  ASSERT_EQ(copy(), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(copied, nullptr), cudaSuccess);
  ASSERT_EQ(copy(), cudaSuccess); // after the event: waiting for it does not cover this copy
  ASSERT_EQ(cudaEventSynchronize(copied), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaErrorIllegalState);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  EXPECT_EQ(dst.download(), std::vector<float>({3.0f, 1.0f, 1.0f, 1.0f}));
  EXPECT_EQ(cudaEventDestroy(copied), cudaSuccess);
  (void)cudaGetLastError(); // the errors above are this test's
}

// `value` rounded to T (__half or __nv_bfloat16), and a T widened to float.
template <class T> T to_element(float value) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(value);
  else
    return __float2bfloat16_rn(value);
}
float element_float(__half x) { return __half2float(x); }
float element_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// C = A @ B for one 16x16x16 tile of T, A stored as `a_layout`, B as `b_layout`, C row-major.
template <class ALayout, class BLayout, class T>
__global__ void wmma_tile_kernel(const T* a, const T* b, float* c) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, ALayout> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, BLayout> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 1.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}

// `scale` moves A's values by a power of two (exact in both formats while in range).
template <class ALayout, class BLayout, class T> void check_wmma_layouts(float scale = 1.0f) {
  constexpr bool kAColumns = std::is_same_v<ALayout, nvcuda::wmma::col_major>;
  constexpr bool kBColumns = std::is_same_v<BLayout, nvcuda::wmma::col_major>;
  std::vector<float> a(256), b(256);
  std::vector<T> a_stored(256), b_stored(256);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) {
      a[r * 16 + c] = (float((r * 3 + c) % 7) - 3.0f) * scale;
      b[r * 16 + c] = float((r + 2 * c) % 5) - 2.0f;
      a_stored[kAColumns ? c * 16 + r : r * 16 + c] = to_element<T>(a[r * 16 + c]);
      b_stored[kBColumns ? c * 16 + r : r * 16 + c] = to_element<T>(b[r * 16 + c]);
    }
  DeviceBuffer<T> da(256), db(256);
  DeviceBuffer<float> dc(256);
  da.upload(a_stored);
  db.upload(b_stored);
  wmma_tile_kernel<ALayout, BLayout><<<1, 32>>>(da.data, db.data, dc.data);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> c = dc.download();
  for (int r = 0; r < 16; ++r)
    for (int col = 0; col < 16; ++col) {
      float want = 1.0f;
      for (int k = 0; k < 16; ++k) want += a[r * 16 + k] * b[k * 16 + col];
      EXPECT_EQ(c[r * 16 + col], want) << "row " << r << " col " << col;
    }
}

TEST(Emulator, WmmaFragmentsFollowTheirLayouts) {
  namespace wmma = nvcuda::wmma;
  check_wmma_layouts<wmma::row_major, wmma::row_major, __half>();
  check_wmma_layouts<wmma::row_major, wmma::col_major, __half>();
  check_wmma_layouts<wmma::col_major, wmma::row_major, __half>();
  check_wmma_layouts<wmma::col_major, wmma::col_major, __half>();
}

// bf16 fragments are read as bf16 (the same bits as f16 would be other values): products of
// values far outside f16's range, 2^100 x small integers, come out exact.
TEST(Emulator, WmmaBf16FragmentsFollowTheirLayouts) {
  namespace wmma = nvcuda::wmma;
  check_wmma_layouts<wmma::row_major, wmma::row_major, __nv_bfloat16>();
  check_wmma_layouts<wmma::row_major, wmma::col_major, __nv_bfloat16>(0x1p100f);
  check_wmma_layouts<wmma::col_major, wmma::row_major, __nv_bfloat16>(0x1p-100f);
  check_wmma_layouts<wmma::col_major, wmma::col_major, __nv_bfloat16>();
}

// mma_sync adds like a tensor core (emulator.h): exact products, bits below the largest term's
// 24-bit significand dropped per group of 8, the sum rounded toward zero.
TEST(Emulator, WmmaSumsTruncateLikeTensorCores) {
  using nvcuda::wmma::detail::tensor_core_sum;
  const double exact[8] = {3.0 * 5.0, -0.5 * 0.25, 1024.0, 0, 0, 0, 0, 0};
  EXPECT_EQ(tensor_core_sum(2.0f, exact, 8), 2.0f + 15.0f - 0.125f + 1024.0f); // all bits kept
  double tiny[8];
  std::fill(tiny, tiny + 8, 3 * std::ldexp(1.0, -25)); // 3/4 of 1.0f's last bit each
  // Exact: 1 + 6 * 2^-23, an fp32 value (and an FMA chain gives more), but a tensor core drops
  // each term's bits below 2^-23 before adding.
  EXPECT_EQ(tensor_core_sum(1.0f, tiny, 8), 1.0f);
  const double just_below[1] = {std::ldexp(1.0, 24) - 0.25}; // in [2^23, 2^24): quantum 1
  EXPECT_EQ(tensor_core_sum(0.0f, just_below, 1), std::ldexp(1.0f, 24) - 1.0f); // not 2^24
  const double overflow[2] = {3e38, 3e38};
  EXPECT_EQ(tensor_core_sum(0.0f, overflow, 2), INFINITY);
  // Kept bits whose sum needs one more: 2^25 - 1 is rounded toward zero, not to nearest (2^25).
  const double carry[3] = {std::ldexp(1.0, 24) - 1, std::ldexp(1.0, 24) - 1, 1.0};
  EXPECT_EQ(tensor_core_sum(0.0f, carry, 3), std::ldexp(1.0f, 25) - 2.0f);
}

TEST(Emulator, WmmaOnAMisalignedPointerIsAFault) {
  DeviceBuffer<__half> a(256 + 8), b(256);
  DeviceBuffer<float> c(256);
  a.upload(std::vector<__half>(264, __float2half_rn(1.0f)));
  b.upload(std::vector<__half>(256, __float2half_rn(1.0f)));
  const __half* misaligned = a.data + 8; // 16 bytes past a 256-byte boundary
  wmma_tile_kernel<nvcuda::wmma::row_major, nvcuda::wmma::row_major, __half>
      <<<1, 32>>>(misaligned, b.data, c.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

// One warp: copies a 16x16 tile of halves to dynamic shared memory, then each lane gives the row
// address ldmatrix.x4 asks of it (lanes 8j .. 8j + 7: the rows of matrix j, matrix j being the
// 8x8 block at (8 (j % 2), 8 (j / 2))) and writes out the four registers it receives.
// `row_offset` (in halves) moves every address, to make them misaligned.
template <bool kTrans>
__global__ void ldmatrix_kernel(const __half* tile, uint32_t* out, int row_offset) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  __half* shared = reinterpret_cast<__half*>(smem_bytes);
  const int lane = int(threadIdx.x);
  for (int i = lane; i < 256; i += 32) shared[i] = tile[i];
  __syncwarp();
  const int j = lane / 8, row = 8 * (j % 2) + lane % 8, col = 8 * (j / 2);
  uint32_t r[4];
  minamp::gpu::ldmatrix_x4<kTrans>(r, shared + row * 16 + col + row_offset);
  for (int q = 0; q < 4; ++q) out[lane * 4 + q] = r[q];
}

// Lane l gets, in register j, the halves at row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of
// matrix j (lower half first); with .trans the halves at column l / 4 of rows 2 (l % 4), +1.
TEST(Emulator, LdmatrixGivesEachLaneItsElements) {
  std::vector<__half> tile(256);
  for (int i = 0; i < 256; ++i) tile[size_t(i)] = __float2half_rn(float(i)); // exact in f16
  DeviceBuffer<__half> in(256);
  DeviceBuffer<uint32_t> out(128);
  in.upload(tile);
  for (bool trans : {false, true}) {
    if (trans)
      ldmatrix_kernel<true><<<1, 32, 512>>>(in.data, out.data, 0);
    else
      ldmatrix_kernel<false><<<1, 32, 512>>>(in.data, out.data, 0);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<uint32_t> got = out.download();
    for (int lane = 0; lane < 32; ++lane)
      for (int j = 0; j < 4; ++j) {
        const int g = lane / 4, t = lane % 4, r0 = 8 * (j % 2), c0 = 8 * (j / 2);
        // (row, col) of the two halves within matrix j
        const int lo = trans ? (r0 + 2 * t) * 16 + c0 + g : (r0 + g) * 16 + c0 + 2 * t;
        const int hi = trans ? lo + 16 : lo + 1;
        const uint32_t reg = got[size_t(lane * 4 + j)];
        EXPECT_EQ(__half2float(__ushort_as_half(uint16_t(reg & 0xffff))), float(lo))
            << "lane " << lane << " register " << j << " trans " << trans;
        EXPECT_EQ(__half2float(__ushort_as_half(uint16_t(reg >> 16))), float(hi))
            << "lane " << lane << " register " << j << " trans " << trans;
      }
  }
}

TEST(Emulator, LdmatrixOnAMisalignedRowIsAFault) {
  DeviceBuffer<__half> in(256);
  DeviceBuffer<uint32_t> out(128);
  in.upload(std::vector<__half>(256, __float2half_rn(1.0f)));
  ldmatrix_kernel<false><<<1, 32, 1024>>>(in.data, out.data, 4); // 8 bytes off
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

// One warp: D[16, 8] = A[16, 16] @ B[16, 8] + C from row-major A, B (T: f16 or bf16) and C in
// global memory, each lane packing the elements the PTX layout gives it (mma.cuh); with `swap`
// lanes hand over a[1] and a[2] in each other's places, the mistake of a kernel that misreads the
// layout.
template <class T>
__global__ void mma_kernel(const T* a, const T* b, const float* c, float* d, bool swap) {
  const int lane = int(threadIdx.x), g = lane / 4, t = lane % 4;
  const auto pack = [](T lo, T hi) {
    uint16_t lo_bits, hi_bits;
    std::memcpy(&lo_bits, &lo, 2);
    std::memcpy(&hi_bits, &hi, 2);
    return uint32_t(lo_bits) | (uint32_t(hi_bits) << 16);
  };
  const auto a_pair = [&](int row, int k) { return pack(a[row * 16 + k], a[row * 16 + k + 1]); };
  const auto b_pair = [&](int k, int col) { return pack(b[k * 8 + col], b[(k + 1) * 8 + col]); };
  uint32_t fa[4] = {a_pair(g, 2 * t), a_pair(g + 8, 2 * t), a_pair(g, 2 * t + 8),
                    a_pair(g + 8, 2 * t + 8)};
  if (swap) std::swap(fa[1], fa[2]);
  const uint32_t fb[2] = {b_pair(2 * t, g), b_pair(2 * t + 8, g)};
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t],
                  c[(g + 8) * 8 + 2 * t + 1]};
  minamp::gpu::mma_m16n8k16<T>(acc, fa, fb);
  d[g * 8 + 2 * t] = acc[0], d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2], d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// `a_scale` moves A's values by a power of two (exact in the format while in its range).
template <class T> void check_mma_layout(float a_scale) {
  std::vector<T> a(256), b(128);
  std::vector<float> c(128);
  // Small integers: every product and sum is exact, so D is exactly A @ B + C.
  for (int i = 0; i < 256; ++i) a[size_t(i)] = to_element<T>(float((i * 7) % 11 - 5) * a_scale);
  for (int i = 0; i < 128; ++i) b[size_t(i)] = to_element<T>(float((i * 5) % 9 - 4));
  for (int i = 0; i < 128; ++i) c[size_t(i)] = float(i % 13) * a_scale;
  DeviceBuffer<T> da(256), db(128);
  DeviceBuffer<float> dc(128), dd(128);
  da.upload(a), db.upload(b), dc.upload(c);
  for (bool swap : {false, true}) {
    mma_kernel<T><<<1, 32>>>(da.data, db.data, dc.data, dd.data, swap);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    const std::vector<float> d = dd.download();
    int wrong = 0;
    for (int r = 0; r < 16; ++r)
      for (int col = 0; col < 8; ++col) {
        float want = c[size_t(r * 8 + col)];
        for (int k = 0; k < 16; ++k)
          want += element_float(a[size_t(r * 16 + k)]) * element_float(b[size_t(k * 8 + col)]);
        wrong += d[size_t(r * 8 + col)] != want;
      }
    if (swap)
      EXPECT_GT(wrong, 0) << "fragments in the wrong registers still gave A @ B + C";
    else
      EXPECT_EQ(wrong, 0) << "elements of D differ from A @ B + C";
  }
}

TEST(Emulator, MmaSyncFollowsThePtxFragmentLayout) { check_mma_layout<__half>(1.0f); }

// mma.sync.m16n8k16 with bf16 inputs decodes its registers as bf16: the same layout, and values
// (2^90 x small integers) only bf16 can hold.
TEST(Emulator, MmaSyncBf16FollowsThePtxFragmentLayout) {
  check_mma_layout<__nv_bfloat16>(1.0f);
  check_mma_layout<__nv_bfloat16>(0x1p90f);
}

// The tensor-core sum of bf16 products truncates as it does for f16: products of bf16 values are
// exact (8 + 8 significant bits), and what falls below the largest term's 24-bit significand is
// dropped, where an fp32 FMA chain would keep it.
TEST(Emulator, MmaSyncBf16SumsTruncateLikeTensorCores) {
  std::vector<__nv_bfloat16> a(256, to_element<__nv_bfloat16>(0.0f)), b(128);
  std::vector<float> c(128, 1.0f);
  // Row 0 of A: 1.5 * 2^-24 in the first 8 columns; B all ones. Each product is 3/4 of 1.0f's
  // last bit (2^-23); their exact sum with C = 1 is 1 + 12 * 2^-24 = 1 + 3 * 2^-22, an fp32 value
  // a tensor core does not reach: it drops each product's bits below 2^-23.
  for (int k = 0; k < 8; ++k) a[size_t(k)] = to_element<__nv_bfloat16>(1.5f * 0x1p-24f);
  for (auto& v : b) v = to_element<__nv_bfloat16>(1.0f);
  DeviceBuffer<__nv_bfloat16> da(256), db(128);
  DeviceBuffer<float> dc(128), dd(128);
  da.upload(a), db.upload(b), dc.upload(c);
  mma_kernel<__nv_bfloat16><<<1, 32>>>(da.data, db.data, dc.data, dd.data, false);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> d = dd.download();
  for (int col = 0; col < 8; ++col) EXPECT_EQ(d[size_t(col)], 1.0f) << "column " << col;
  EXPECT_EQ(d[8], 1.0f); // row 1: A is zero there, D = C
}

__global__ void write_kernel(int* out, int value) { out[threadIdx.x] = value; }

__global__ void __launch_bounds__(64) bounded_write_kernel(int* out) { out[threadIdx.x] = 1; }

TEST(Emulator, LaunchBoundsAreChecked) {
  DeviceBuffer<int> out(128);
  bounded_write_kernel<<<1, 64>>>(out.data);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  bounded_write_kernel<<<1, 128>>>(out.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  bounded_write_kernel<<<1, dim3(32, 4)>>>(out.data); // 128 threads in two dimensions
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
}

TEST(Emulator, LaunchLimitsAreChecked) {
  DeviceBuffer<int> out(2048);
  write_kernel<<<1, 1025>>>(out.data, 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  write_kernel<<<dim3(1, 65536), 32>>>(out.data, 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  write_kernel<<<dim3(1, 1, 65536), 32>>>(out.data, 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  write_kernel<<<1, 32, 300 * 1024>>>(out.data, 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
}

TEST(Emulator, CopiesMustStayInsideADeviceAllocation) {
  DeviceBuffer<int> device(16);
  std::vector<int> host(32, 1);
  EXPECT_EQ(
      cudaMemcpyAsync(device.data, host.data(), 32 * sizeof(int), cudaMemcpyHostToDevice, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpyAsync(device.data, host.data(), 16 * sizeof(int) + 1, cudaMemcpyHostToDevice,
                            nullptr),
            cudaErrorInvalidValue)
      << "one byte past the end";
  EXPECT_EQ(
      cudaMemcpyAsync(device.data, host.data(), 16 * sizeof(int), cudaMemcpyHostToDevice, nullptr),
      cudaSuccess)
      << "exactly the allocation";
  EXPECT_EQ(cudaMemcpyAsync(host.data(), host.data() + 16, 16 * sizeof(int), cudaMemcpyDeviceToHost,
                            nullptr),
            cudaErrorInvalidValue)
      << "host memory named as device memory";
  (void)cudaGetLastError();
}

TEST(Emulator, CaptureRecordsWorkAndReplaysIt) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer<int> out(32);
  write_kernel<<<1, 32, 0, stream>>>(out.data, 1);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  write_kernel<<<1, 32, 0, stream>>>(out.data, 2);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(out.download(), std::vector<int>(32, 1)) << "a captured launch does not run";
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  EXPECT_EQ(out.download(), std::vector<int>(32, 2));

  // A host synchronisation inside a capture fails and invalidates it.
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorStreamCaptureUnsupported);
  cudaGraph_t invalid = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &invalid), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(invalid, nullptr);
  (void)cudaGetLastError();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The gathered GEMM operands split pixel and tap indices with gemm.cuh's FastDivisor (a
// multiply-high and a shift); it is plain host and device code, checked here where gemm.cuh
// compiles for the host: every divisor up to 2^12 and then powers of two and their neighbours up to
// 2^31 - 1, against integer division, on dividends at and around multiples of the divisor and
// across [0, 2^31).
TEST(GemmGather, FastDivisorDividesLikeIntegerDivision) {
  std::vector<int> divisors;
  for (int d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (int shift = 12; shift <= 30; ++shift)
    for (int delta : {-1, 0, 1}) divisors.push_back(int((1 << shift) + delta));
  divisors.push_back(INT32_MAX);
  uint64_t state = 88172645463325252ull; // xorshift64: dividends spread over [0, 2^31)
  const auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return int(state >> 33);
  };
  int failures = 0;
  for (const int d : divisors) {
    const minamp::gpu::FastDivisor f = minamp::gpu::fast_divisor(d);
    std::vector<int> dividends = {0, 1, d - 1, d, INT32_MAX, INT32_MAX - 1};
    for (const int64_t k : {int64_t(2), int64_t(7), int64_t(INT32_MAX) / d})
      for (const int64_t delta : {-1, 0, 1})
        if (k * d + delta >= 0 && k * d + delta <= INT32_MAX)
          dividends.push_back(int(k * d + delta));
    for (int i = 0; i < 64; ++i) dividends.push_back(next());
    for (const int n : dividends)
      if (minamp::gpu::quotient(f, n) != n / d && ++failures <= 10)
        ADD_FAILURE() << n << " / " << d << ": " << minamp::gpu::quotient(f, n) << ", not "
                      << n / d;
  }
  EXPECT_EQ(failures, 0);
}

} // namespace
