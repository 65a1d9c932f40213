// Device plumbing shared by the CUDA backend: the cudaMalloc counter (for tests), the SM count,
// and — for .cu files only — dtype dispatch and the chunk lists of multi-tensor launches.
//
// The first part is plain C++ so host tests can include this header; the second part needs nvcc
// (or the CPU emulator, cuda/emulator/).
#pragma once

#include <cstddef>

namespace minamp::gpu {

// How many times the caching allocator has called cudaMalloc since the process started.
size_t cuda_malloc_calls();
// True when MINAMP_CUDA_EXACT_ALLOC is set (and not 0): the allocator then caches nothing
// outside graph capture (cuda/device.cu), for memory checkers.
bool cuda_exact_allocation();
// Number of streaming multiprocessors of the current device (read once).
int sm_count();
// The device's compute capability as major * 10 + minor (90 for an H100).
int compute_capability();

} // namespace minamp::gpu

#if defined(__CUDACC__) || defined(MINAMP_CUDA_EMULATOR)

#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "kernels/checks.h"

namespace minamp::gpu {

// A type carried as a value, so that a generic host lambda can learn which type to launch with.
template <class T> struct TypeTag { using type = T; };

// Calls f(TypeTag<__half>) or f(TypeTag<__nv_bfloat16>) for a 16-bit float dtype; throws Error
// naming `op` for any other dtype.
template <class F> void visit_half_precision(DType dtype, const char* op, F&& f) {
  switch (dtype) {
  case DType::f16: f(TypeTag<__half>{}); return;
  case DType::bf16: f(TypeTag<__nv_bfloat16>{}); return;
  default: throw Error(cat(op, ": expected f16 or bf16, got ", dtype));
  }
}

// Calls f(TypeTag<float>), f(TypeTag<__half>) or f(TypeTag<__nv_bfloat16>) for a floating dtype;
// throws Error naming `op` for any other dtype.
template <class F> void visit_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
  case DType::f32: f(TypeTag<float>{}); return;
  case DType::f16: f(TypeTag<__half>{}); return;
  case DType::bf16: f(TypeTag<__nv_bfloat16>{}); return;
  default: throw Error(cat(op, ": expected f32, f16 or bf16, got ", dtype));
  }
}
template <class F> void visit_floating(const Tensor& t, const char* op, F&& f) {
  switch (t.dtype()) {
  case DType::f32: f(TypeTag<float>{}); return;
  case DType::f16: f(TypeTag<__half>{}); return;
  case DType::bf16: f(TypeTag<__nv_bfloat16>{}); return;
  default: throw Error(cat(op, ": expected an f32, f16 or bf16 tensor, got ", describe(t)));
  }
}

// A fixed-capacity list of work chunks passed by value as a kernel parameter (kBlocksPerChunk
// blocks per chunk). Keep sizeof(ChunkList) under the classic 4 KB kernel-parameter limit.
template <class Chunk, int kCapacity> struct ChunkList {
  static constexpr int capacity = kCapacity;
  Chunk chunk[kCapacity];
  int count;
};

// Builds chunk lists on the host and launches `launch(list)` each time one is full and once at
// the end for the rest, so any number of chunks takes ceil(chunks / capacity) launches.
template <class List, class Launch> class ChunkBatcher {
public:
  explicit ChunkBatcher(Launch launch) : launch_(launch) { list_.count = 0; }
  template <class Chunk> void push(const Chunk& chunk) {
    list_.chunk[list_.count++] = chunk;
    if (list_.count == List::capacity) flush();
  }
  void flush() {
    if (list_.count > 0) launch_(list_);
    list_.count = 0;
  }

private:
  List list_;
  Launch launch_;
};

// Elements per chunk of a multi-tensor launch.
constexpr int64_t kChunkElements = 32768;
// Blocks per chunk: a launch's grid is [chunks, kBlocksPerChunk] (chunk_grid), and block (c, s)
// takes every kBlocksPerChunk-th stretch of blockDim.x values of chunk c from stretch s on
// (chunk_begin, chunk_stride). One block per chunk kept only 80 to 240 blocks in flight on a
// 132-SM GPU, too few loads to use its memory bandwidth; eight give each thread 16 values of a
// chunk at 256 threads.
constexpr int kBlocksPerChunk = 8;

inline dim3 chunk_grid(int chunks) { return dim3(unsigned(chunks), unsigned(kBlocksPerChunk)); }
__device__ __forceinline__ int chunk_begin() { return int(blockIdx.y * blockDim.x + threadIdx.x); }
__device__ __forceinline__ int chunk_stride() { return int(gridDim.y * blockDim.x); }

// Values of a chunk a thread loads before it uses the first (for_each_chunk_value). A thread has
// up to 16 values of a chunk; one at a time, each waited a memory latency (an H200 took 14.5 µs
// for Adam over the sine net's 135k parameters, 8.5 µs to unscale their gradients).
constexpr int kChunkBatch = 4;

// This thread's walk over its values of a chunk of `numel`: load(b, i) for kChunkBatch of them,
// then use(b, i) for each (for_each_batched), the last few one at a time.
template <class Load, class Use>
__device__ __forceinline__ void for_each_chunk_value(int numel, Load&& load, Use&& use) {
  for_each_batched<kChunkBatch>(chunk_begin(), chunk_stride(), numel, load, use);
}

// Up to kChunkElements consecutive values of one f32 tensor (gradients: unscale, zero).
struct FloatChunk {
  float* data;
  int numel;
};
// 240 chunks of 16 bytes: 3.8 KB of kernel parameters, 7.9 M values per launch.
using FloatChunkList = ChunkList<FloatChunk, 240>;

// Pushes the chunks of `tensor` (f32) to `batcher`.
template <class Batcher> void push_float_chunks(Batcher& batcher, const Tensor& tensor) {
  float* data = static_cast<float*>(tensor.raw());
  for (int64_t offset = 0; offset < tensor.numel(); offset += kChunkElements)
    batcher.push(FloatChunk{data + offset, int(std::min(kChunkElements, tensor.numel() - offset))});
}

} // namespace minamp::gpu

#endif // __CUDACC__ || MINAMP_CUDA_EMULATOR
