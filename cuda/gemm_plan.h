// How a GEMM is launched, in plain C++ so that CPU tests can check it: which version of the
// tensor-core GEMM runs it, which of a kernel's two tile configurations it takes, and whether K
// is split.
//
// Versions. The tensor-core GEMM exists as a ladder of versions (kernels/gemm_version.h); the
// library runs v5 (ldmatrix + mma.sync, multistage) wherever the GPU has mma.sync.m16n8k16
// (sm_80 and later), and v2 (WMMA) below that. v1, v3 and v4 are steps of the ladder; they run
// only when asked for. bf16 operands need sm_80 too (the first tensor cores with bf16 inputs),
// and one of the versions written for both 16-bit formats: v2, v4 or v5 (gemm_refusal).
//
// Tiles. Each kernel family (WMMA, SIMT) has a large configuration (128 x 128 block tiles) for
// big outputs and a small one (64 x 64) for outputs that would leave SMs idle with the large
// tiles or that the large tiles would mostly pad (a thin N = 32 wastes 3/4 of a 128-wide tile).
//
// Split K. A GEMM whose C has few tiles but a long K — the conv weight gradient dw[Cout, Cin] =
// dy^T @ x sums over every pixel of the batch (K = 262144 for the sine example at 512x512)
// while C has only 16 tiles of 64x64 — would run on 16 of an H100's 132 SMs. Split-K cuts K
// into `splits` slices of whole BK tiles: block z of the grid sums slice z into an fp32
// partial C, and a second kernel adds the partials in slice order (deterministic: no atomics)
// and applies the epilogue. The small tiles split to a few blocks per SM; v5's large tiles
// (8 warps of 64x64) split to one block per SM where K is long enough that each slice walks as
// many K tiles as a large GEMM's main loop does (plan_large_k_split).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "kernels/gemm_version.h"

namespace minamp::gpu {

struct KSplit {
  int splits = 1;          // slices of K, each non-empty
  int64_t k_per_split = 0; // elements of K per slice, a multiple of BK (the last may be shorter)
};

// Slices beyond this add more partial-sum traffic than they save.
constexpr int kMaxKSplits = 128;
// Blocks per SM a split aims at: a split GEMM runs the small tiles (4 warps), and on an H100 the
// sine weight gradients ran with 2 blocks per SM at 12% occupancy, their loads latency-bound.
constexpr int kSplitBlocksPerSm = 4;
// Each slice walks at least this many BK tiles, so the pipeline's prologue stays a small part.
constexpr int64_t kMinTilesPerSplit = 8;

// K's k_tiles BK tiles cut into about `splits` slices of whole tiles. Rounding the tiles a slice
// takes up can leave the last slices empty: they are dropped.
inline KSplit whole_tile_slices(int64_t k_tiles, int64_t splits, int bk) {
  const int64_t tiles_per_split = (k_tiles + splits - 1) / splits;
  return {int((k_tiles + tiles_per_split - 1) / tiles_per_split), tiles_per_split * bk};
}

// The split of K for a GEMM with `tiles` block tiles over C, on a GPU with `sm_count` SMs: no
// split when the tiles alone give every SM a block; otherwise about kSplitBlocksPerSm blocks per
// SM.
inline KSplit plan_k_split(int64_t tiles, int64_t k, int bk, int sm_count) {
  const int64_t k_tiles = (k + bk - 1) / bk;
  if (tiles >= sm_count) return {1, k};
  const int64_t wanted = (kSplitBlocksPerSm * int64_t(sm_count) + tiles - 1) / tiles;
  const int64_t splits = std::min({wanted, k_tiles / kMinTilesPerSplit, int64_t(kMaxKSplits)});
  if (splits <= 1) return {1, k};
  return whole_tile_slices(k_tiles, splits, bk);
}

// The split of K over the large tiles of a three-tile kernel (v5: 8 warps of 64x64 a block, one
// block per SM): about one block per SM, each slice at least kMinLargeTilesPerSplit BK tiles
// (4096^3's blocks walk 64), else no split. A long K over a C of a few large tiles — sine's hidden
// weight gradients, [256, 256] over 262144 pixels: 2 tiles of 128x256 split 66 ways — then runs
// the warp tiles and main loop of the large GEMMs instead of the small tiles' 4 warps of 32x32.
// Shorter K (ResNet-50's weight gradients at batch 64 would have at most 29 K tiles a slice) keeps
// the small tiles' split.
constexpr int64_t kMinLargeTilesPerSplit = 32;
inline KSplit plan_large_k_split(int64_t tiles, int64_t k, int bk, int sm_count) {
  const int64_t k_tiles = (k + bk - 1) / bk;
  const int64_t splits = (sm_count + tiles - 1) / tiles;
  if (tiles >= sm_count || splits > kMaxKSplits || k_tiles < splits * kMinLargeTilesPerSplit)
    return {1, k};
  return whole_tile_slices(k_tiles, splits, bk);
}

// The block tile of one kernel configuration: BM x BN of C, K walked BK at a time.
struct BlockTile {
  int bm, bn, bk;
};
// The configurations of the two kernel families (gemm_wmma.cuh and gemm_fp32.cu build theirs from
// these, so the plans tested on the CPU are the ones the kernels run).
constexpr BlockTile kWmmaLargeTile{128, 128, 32}, kWmmaSmallTile{64, 64, 32}; // v2, v3
constexpr BlockTile kMmaLargeTile{128, 128, 32}, kMmaSmallTile{64, 64, 32};   // v4
// v5's large tile: 128x256 (8 warps of 64x64), the fastest of its configurations on the 4096^3
// and sine GEMMs of an H200, with BK = 64, which on an H100 ran sine's GEMMs 6% faster than
// BK = 32 and 4096^3 as fast (bench/NOTES.md); v4's large tile is its medium one (2048^3 has 128
// tiles of 128x256, too few for the SMs, and 256 of 128x128), v4's small tile its small one.
constexpr BlockTile kMultistageLargeTile{128, 256, 64};
constexpr BlockTile kSimtLargeTile{128, 128, 16}, kSimtSmallTile{64, 64, 16};

enum class GemmTiles { large, medium, small };

struct GemmPlan {
  GemmTiles tiles = GemmTiles::small;
  KSplit split; // always one slice with the medium tiles
};

// The number of `tile`-sized blocks over C [m, n].
inline int64_t tile_count(int64_t m, int64_t n, BlockTile tile) {
  return ((m + tile.bm - 1) / tile.bm) * ((n + tile.bn - 1) / tile.bn);
}

// Whether the large tiles pad C [m, n] by at most 25% more than the small tiles would.
inline bool pads_little(int64_t m, int64_t n, BlockTile large, BlockTile small) {
  const auto padded = [](int64_t size, int tile) { return (size + tile - 1) / tile * tile; };
  const int64_t large_area = padded(m, large.bm) * padded(n, large.bn);
  const int64_t small_area = padded(m, small.bm) * padded(n, small.bn);
  return 4 * large_area <= 5 * small_area;
}

// The plan for C [m, n] summed over k on a GPU with `sm_count` SMs. The large tiles are taken
// when they give every SM at least one block, pad C by at most 25% more than the small tiles
// would, and fit the device's shared memory (`large_fits`; sm_75 opts in to 64 KB only);
// otherwise the small tiles, with K split when they alone would leave SMs idle.
inline GemmPlan plan_gemm(int64_t m, int64_t n, int64_t k, BlockTile large, BlockTile small,
                          bool large_fits, int sm_count) {
  if (tile_count(m, n, large) >= sm_count && pads_little(m, n, large, small) && large_fits)
    return {GemmTiles::large, KSplit{1, k}};
  return {GemmTiles::small, plan_k_split(tile_count(m, n, small), k, small.bk, sm_count)};
}

// The plan for a kernel with a third, medium configuration between the large and the small one:
// the large tiles when plan_gemm takes them over the small ones, else the medium tiles when
// plan_gemm would take those; else, where the small tiles would split K, the large tiles with K
// split when plan_large_k_split splits it (and they pad little and fit); else the small ones
// (with K split as plan_gemm says).
inline GemmPlan plan_gemm(int64_t m, int64_t n, int64_t k, BlockTile large, BlockTile medium,
                          BlockTile small, bool large_fits, bool medium_fits, int sm_count) {
  const GemmPlan with_large = plan_gemm(m, n, k, large, small, large_fits, sm_count);
  if (with_large.tiles == GemmTiles::large) return with_large;
  const GemmPlan with_medium = plan_gemm(m, n, k, medium, small, medium_fits, sm_count);
  if (with_medium.tiles == GemmTiles::large) return {GemmTiles::medium, KSplit{1, k}};
  if (with_medium.split.splits > 1 && large_fits && pads_little(m, n, large, small)) {
    const KSplit split = plan_large_k_split(tile_count(m, n, large), k, large.bk, sm_count);
    if (split.splits > 1) return {GemmTiles::large, split};
  }
  return with_medium;
}

// GEMMs too thin for tensor-core tiles, which run on CUDA cores (cuda/gemm_thin.cu): a K of at
// most kThinK (a tile would pad it to BK = 32), or an N of at most kThinN (padded to a 64-wide
// tile) over at least kThinNMinRows rows (with fewer rows and a long K, split K on the tensor
// cores keeps more SMs busy than a warp per row).
constexpr int64_t kThinK = 8, kThinN = 4, kThinNMinRows = 4096;
inline bool is_thin_gemm(int64_t m, int64_t n, int64_t k) {
  return k <= kThinK || (n <= kThinN && m >= kThinNMinRows);
}

// GEMMs whose C is at most kThinN rows or columns (and at most kThinCMaxWide the other way)
// summed over a K of at least kThinCMinK, which run on CUDA cores as a column reduction when A is
// transposed and B not (cuda/gemm_thin_c.cu): a weight gradient dw = dy^T @ x over every pixel of
// a batch, of a conv with few output or input channels. A tensor-core tile would pad the thin side
// to 64 and split K, for what is one pass over the wide operand.
constexpr int64_t kThinCMinK = 4096, kThinCMaxWide = 65536;
inline bool is_thin_c_gemm(int64_t m, int64_t n, int64_t k) {
  return std::min(m, n) <= kThinN && std::max(m, n) <= kThinCMaxWide && k >= kThinCMinK;
}

// The compute capability (major * 10 + minor) mma.sync.m16n8k16 needs.
constexpr int kMmaSyncCapability = 80;

// The version that runs a GEMM when `requested` (gemm_version()) is asked for on a GPU of
// compute capability `capability`: `automatic` resolves as above; an explicit version is kept
// (the launcher refuses v4 below kMmaSyncCapability, naming it).
inline GemmVersion plan_version(GemmVersion requested, int capability) {
  if (requested != GemmVersion::automatic) return requested;
  return capability >= kMmaSyncCapability ? GemmVersion::v5_multistage : GemmVersion::v2_wmma;
}

// Why `version` (a planned one, not `automatic`) cannot run a GEMM of `dtype` (f16 or bf16)
// operands on a GPU of compute capability `capability`, as the launcher's error says it; empty
// when it can. v4 and v5 need mma.sync, bf16 needs tensor cores that take it (both sm_80); v1 and
// v3 are written for f16 only.
inline std::string gemm_refusal(GemmVersion version, DType dtype, int capability) {
  const std::string gpu =
      "this GPU is " + std::to_string(capability / 10) + "." + std::to_string(capability % 10);
  const std::string name = std::string("gemm ") + gemm_version_name(version);
  const bool mma_sync = version == GemmVersion::v4_mma || version == GemmVersion::v5_multistage;
  if (mma_sync && capability < kMmaSyncCapability)
    return name + ": needs mma.sync (compute capability 8.0 or later); " + gpu +
           " (MINAMP_GEMM_VERSION=v2 or auto runs there)";
  if (dtype != DType::bf16) return "";
  if (version == GemmVersion::v1_naive || version == GemmVersion::v3_interior)
    return name + ": takes f16 operands only, not bf16 (v2, v4, v5 and auto take bf16)";
  if (capability < kMmaSyncCapability)
    return "gemm: bf16 operands need tensor cores of compute capability 8.0 or later; " + gpu +
           " (f16 runs there)";
  return "";
}

} // namespace minamp::gpu
