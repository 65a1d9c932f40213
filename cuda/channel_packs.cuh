// The loop shared by the memory-bound batch norm passes over an activation x [rows, C] (its
// normalisation, its input gradient, its gradient sums): a grid-stride walk in packs of kPack
// consecutive channels of a row, each thread pinned to the same channels in every step, so that it
// reads their parameters once, keeps its own per-channel sums, and has the loads of kBatch steps in
// flight; and the per-block partials of such sums, added over the threads of a channel in thread
// order.
#pragma once

#include <cstdint>
#include <numeric>

#include "column_moments.cuh"
#include "common.cuh"

namespace minamp::gpu {

// Threads per block of every pinned-packs kernel.
constexpr int kPackThreads = 256;

// A grid-stride loop over [rows, C] in packs of kPack consecutive channels of a row. The launch
// (pinned_grid) makes the grid's threads a multiple of the packs in a row, C / kPack, so every
// pack a thread visits lies in the same channels: `channel` is worked out once, and the
// per-channel values with it, outside the loop. for_each walks the thread's packs kBatch at a
// time (for_each_batched), body(b, i) given the first element i of each pack.
template <int kPack, int kBatch> struct PinnedPacks {
  int64_t first, step, size;
  int channel;
  __device__ PinnedPacks(int64_t size_, int channels)
      : first((blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * kPack),
        step(int64_t(gridDim.x) * blockDim.x * kPack), size(size_), channel(int(first % channels)) {
  }
  template <class Load, class Use> __device__ void for_each(Load&& load, Use&& use) const {
    for_each_batched<kBatch>(first, step, size, load, use);
  }
};

// Blocks of kPackThreads for a PinnedPacks loop over `size` elements in packs of `pack`: as many as
// grid_for gives, rounded up so that the grid's threads are a multiple of the packs in a row.
inline int pinned_grid(int64_t size, int channels, int pack) {
  const int row_packs = channels / pack;
  const int blocks_per_turn = row_packs / std::gcd(row_packs, kPackThreads); // whole rows
  const int blocks = grid_for(size / pack, kPackThreads);
  return (blocks + blocks_per_turn - 1) / blocks_per_turn * blocks_per_turn;
}

// Whether a block's threads hold whole rows of packs (C / pack divides kPackThreads): then the
// threads of each pack column are all in the block, and it can add up their sums itself.
inline bool block_holds_whole_rows(int channels, int pack) {
  return kPackThreads % (channels / pack) == 0;
}

// Elements a thread takes at a time: 4 when C allows packs and every tensor (activations and the
// per-channel vectors alike) is aligned for them.
template <class... T> int pack_for(int channels, const BatchNormChannels& bn, const T*... data) {
  const bool aligned = (aligned_for_pack(data) && ...) && aligned_for_pack(bn.gamma) &&
                       aligned_for_pack(bn.beta) && aligned_for_pack(bn.mean) &&
                       aligned_for_pack(bn.invstd);
  return pack_width(channels, aligned);
}

// The parameters and statistics of kPack consecutive channels from c on, one 16-byte load each
// for a pack (zeros when default-constructed: a thread with no channels).
template <int kPack> struct ChannelValues {
  float gamma[kPack] = {}, beta[kPack] = {}, mean[kPack] = {}, invstd[kPack] = {};
  ChannelValues() = default;
  __device__ ChannelValues(const BatchNormChannels& bn, int c) {
    load_pack(bn.gamma, c, gamma);
    load_pack(bn.beta, c, beta);
    load_pack(bn.mean, c, mean);
    load_pack(bn.invstd, c, invstd);
  }
  // Those of the channels from c on below n, one value at a time (any alignment; zeros past n).
  __device__ static ChannelValues below(const BatchNormChannels& bn, int c, int n) {
    ChannelValues ch;
#pragma unroll
    for (int e = 0; e < kPack; ++e)
      if (c + e < n) {
        ch.gamma[e] = bn.gamma[c + e];
        ch.beta[e] = bn.beta[c + e];
        ch.mean[e] = bn.mean[c + e];
        ch.invstd[e] = bn.invstd[c + e];
      }
    return ch;
  }
};

// What a batch norm's input gradient needs of the kPack channels from c on: their parameters and
// statistics, the gradient sums [2, C] (sum dy_hat, sum dy_hat xhat), and dx's factor gamma invstd
// (/ n in training). The dx kernel (batchnorm.cu) and the thin-C GEMM that reads dx without its
// being written (gemm_thin_c.cu) compute each element with it, so their values agree bit for bit.
// Zeros when default-constructed (a thread with no channels).
template <int kPack> struct DxChannels {
  ChannelValues<kPack> ch;
  float sum_dy[kPack] = {}, sum_dy_xhat[kPack] = {}, factor[kPack] = {};
  DxChannels() = default;
  __device__ DxChannels(const BatchNormChannels& bn, const float* sums, int channels, int c,
                        float n, bool training)
      : ch(bn, c) {
    load_pack(sums, c, sum_dy);
    load_pack(sums + channels, c, sum_dy_xhat);
    for (int j = 0; j < kPack; ++j) {
      const float scale = ch.gamma[j] * ch.invstd[j];
      factor[j] = training ? scale / n : scale;
    }
  }
  // dx of one element of channel j from its x and dy, dy_hat being dy with the ReLU mask (zero
  // where y <= 0; a NaN passes, as in PyTorch) recomputed from x.
  __device__ float dx(float x, float dy, int j, float n, bool relu, bool training) const {
    float xhat, dy_hat;
    batchnorm_grad_terms(x, dy, ch.gamma[j], ch.beta[j], ch.mean[j], ch.invstd[j], relu, xhat,
                         dy_hat);
    return training ? factor[j] * (n * dy_hat - sum_dy[j] - xhat * sum_dy_xhat[j])
                    : factor[j] * dy_hat;
  }
};

// The block's share of kValues sums per channel: each thread holds sums[v][j] of its kPack
// channels (the same in every step, block_holds_whole_rows); the threads of each pack column are
// added in thread order into partials[blockIdx.x, v, C]. Every thread of the block must call it.
template <int kPack, int kValues>
__device__ __forceinline__ void store_pinned_partials(const float (&sums)[kValues][kPack],
                                                      int channels, float* partials) {
  __shared__ float staged[kValues][kPack][kPackThreads];
  for (int v = 0; v < kValues; ++v)
    for (int j = 0; j < kPack; ++j) staged[v][j][threadIdx.x] = sums[v][j];
  __syncthreads();
  const int packs = channels / kPack; // divides kPackThreads
  if (int(threadIdx.x) >= packs) return;
  for (int v = 0; v < kValues; ++v)
    for (int j = 0; j < kPack; ++j) {
      float total = 0.0f;
      for (int t = threadIdx.x; t < kPackThreads; t += packs) total += staged[v][j][t];
      partials[(int64_t(blockIdx.x) * kValues + v) * channels + threadIdx.x * kPack + j] = total;
    }
}

} // namespace minamp::gpu
