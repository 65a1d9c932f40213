// Split-K planning for the GEMM kernels, in plain C++ so that CPU tests can check it.
//
// A GEMM whose C has few tiles but a long K — the conv weight gradient dw[Cout, Cin] =
// dy^T @ x sums over every pixel of the batch (K = 262144 for the sine example at 512x512)
// while C has only 16 tiles of 64x64 — would run on 16 of an H100's 132 SMs. Split-K cuts K
// into `splits` slices of whole BK tiles: block z of the grid sums slice z into an fp32
// partial C, and a second kernel adds the partials in slice order (deterministic: no atomics)
// and applies the epilogue.
#pragma once

#include <algorithm>
#include <cstdint>

namespace minamp::gpu {

struct KSplit {
  int splits = 1;          // slices of K, each non-empty
  int64_t k_per_split = 0; // elements of K per slice, a multiple of BK (the last may be shorter)
};

// Slices beyond this add more partial-sum traffic than they save.
constexpr int kMaxKSplits = 64;
// Each slice walks at least this many BK tiles, so the pipeline's prologue stays a small part.
constexpr int64_t kMinTilesPerSplit = 8;

// The split of K for a GEMM with `tiles` block tiles over C, on a GPU with `sm_count` SMs: no
// split when the tiles alone give every SM a block; otherwise about two blocks per SM.
inline KSplit plan_k_split(int64_t tiles, int64_t k, int bk, int sm_count) {
  const int64_t k_tiles = (k + bk - 1) / bk;
  if (tiles >= sm_count) return {1, k};
  const int64_t wanted = (2 * int64_t(sm_count) + tiles - 1) / tiles;
  const int64_t splits = std::min({wanted, k_tiles / kMinTilesPerSplit, int64_t(kMaxKSplits)});
  if (splits <= 1) return {1, k};
  const int64_t tiles_per_split = (k_tiles + splits - 1) / splits;
  // Rounding tiles_per_split up can leave the last slices empty: drop them.
  return {int((k_tiles + tiles_per_split - 1) / tiles_per_split), tiles_per_split * bk};
}

} // namespace minamp::gpu
