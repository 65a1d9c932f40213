// The split-K plan of the CUDA GEMM (cuda/gemm_split.h, plain C++): slices are whole BK tiles,
// none is empty, together they cover K exactly, and K is split only when C's tiles alone would
// leave SMs idle and K is long enough to share out.
#include <gtest/gtest.h>

#include "gemm_split.h"

namespace minamp::gpu {
namespace {

constexpr int kBK = 32;

// The properties every plan must have, whatever the sizes.
void expect_valid_plan(int64_t tiles, int64_t k, int sm_count) {
  const KSplit split = plan_k_split(tiles, k, kBK, sm_count);
  SCOPED_TRACE(testing::Message() << "tiles " << tiles << ", K " << k << ", SMs " << sm_count
                                  << ": " << split.splits << " x " << split.k_per_split);
  ASSERT_GE(split.splits, 1);
  ASSERT_LE(split.splits, kMaxKSplits);
  if (split.splits == 1) {
    EXPECT_EQ(split.k_per_split, k);
    return;
  }
  EXPECT_LT(tiles, sm_count) << "a grid that fills the GPU is not split";
  EXPECT_EQ(split.k_per_split % kBK, 0) << "slices are whole tiles";
  EXPECT_GE(split.k_per_split, kMinTilesPerSplit * kBK);
  EXPECT_LT((split.splits - 1) * split.k_per_split, k) << "the last slice is not empty";
  EXPECT_GE(split.splits * split.k_per_split, k) << "the slices cover K";
}

TEST(GemmSplit, EveryPlanHasWholeNonEmptySlicesCoveringK) {
  for (int sm_count : {1, 80, 132})
    for (int64_t tiles : {1, 3, 16, 131, 132, 1000})
      for (int64_t k : {0, 1, 31, 32, 255, 256, 257, 1000, 4096, 4097, 65536, 262144, 999999})
        expect_valid_plan(tiles, k, sm_count);
}

TEST(GemmSplit, SineWeightGradientFillsAnH100) {
  // dw[256, 256] = dy^T @ x over 512 x 512 pixels: 16 tiles of 64 x 64 on 132 SMs.
  const KSplit split = plan_k_split(16, 512 * 512, kBK, 132);
  EXPECT_GE(16 * split.splits, 2 * 132) << "about two blocks per SM";
  EXPECT_LE(16 * split.splits, 2 * 132 + 16);
}

TEST(GemmSplit, NoSplitForShortKOrFullGrid) {
  EXPECT_EQ(plan_k_split(4, 100, kBK, 132).splits, 1) << "4 k-tiles cannot be shared out";
  const int64_t two_slices = 2 * kMinTilesPerSplit * kBK; // K of the smallest two-way split
  EXPECT_EQ(plan_k_split(4, two_slices - kBK, kBK, 132).splits, 1);
  EXPECT_EQ(plan_k_split(4, two_slices - kBK + 1, kBK, 132).splits, 2) << "a partial last tile";
  EXPECT_EQ(plan_k_split(132, 1 << 20, kBK, 132).splits, 1) << "every SM already has a block";
}

TEST(GemmSplit, SplitsAreCappedForATinyC) {
  // One tile of C and a huge K: at most kMaxKSplits slices.
  const KSplit split = plan_k_split(1, int64_t(1) << 24, kBK, 132);
  EXPECT_EQ(split.splits, kMaxKSplits);
}

} // namespace
} // namespace minamp::gpu
