// The launch plan of the CUDA GEMM (cuda/gemm_plan.h, plain C++): the tile configuration each
// shape of the GPU tests is meant to exercise is the one it gets on an H100, and split-K slices
// are whole BK tiles, none empty, together covering K, cut only when C's tiles alone would leave
// SMs idle and K is long enough to share out; and which versions refuse which GEMMs on which GPUs.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "gemm_plan.h"

namespace minamp::gpu {
namespace {

constexpr int kBK = 32;
constexpr int kH100Sms = 132;

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
  for (int sm_count : {1, 80, kH100Sms})
    for (int64_t tiles : {1, 3, 16, 131, 132, 1000})
      for (int64_t k : {0, 1, 31, 32, 255, 256, 257, 1000, 4096, 4097, 65536, 262144, 999999})
        expect_valid_plan(tiles, k, sm_count);
}

TEST(GemmSplit, SineWeightGradientFillsAnH100) {
  // dw[256, 256] = dy^T @ x over 512 x 512 pixels: 16 tiles of 64 x 64 on 132 SMs.
  const KSplit split = plan_k_split(16, 512 * 512, kBK, kH100Sms);
  EXPECT_GE(16 * split.splits, kSplitBlocksPerSm * kH100Sms) << "kSplitBlocksPerSm per SM";
  EXPECT_LE(16 * split.splits, kSplitBlocksPerSm * kH100Sms + 16);
}

TEST(GemmSplit, NoSplitForShortKOrFullGrid) {
  EXPECT_EQ(plan_k_split(4, 100, kBK, kH100Sms).splits, 1) << "4 k-tiles cannot be shared out";
  const int64_t two_slices = 2 * kMinTilesPerSplit * kBK; // K of the smallest two-way split
  EXPECT_EQ(plan_k_split(4, two_slices - kBK, kBK, kH100Sms).splits, 1);
  EXPECT_EQ(plan_k_split(4, two_slices - kBK + 1, kBK, kH100Sms).splits, 2)
      << "a partial last tile";
  EXPECT_EQ(plan_k_split(kH100Sms, 1 << 20, kBK, kH100Sms).splits, 1)
      << "every SM already has a block";
}

TEST(GemmSplit, SplitsAreCappedForATinyC) {
  // One tile of C and a huge K: at most kMaxKSplits slices.
  const KSplit split = plan_k_split(1, int64_t(1) << 24, kBK, kH100Sms);
  EXPECT_EQ(split.splits, kMaxKSplits);
}

// The plan of both kernel families (WMMA, SIMT) for one shape on an H100.
struct FamilyPlans {
  GemmPlan wmma, simt;
};
FamilyPlans h100_plans(int64_t m, int64_t n, int64_t k) {
  return {plan_gemm(m, n, k, kWmmaLargeTile, kWmmaSmallTile, true, kH100Sms),
          plan_gemm(m, n, k, kSimtLargeTile, kSimtSmallTile, true, kH100Sms)};
}

// The shapes GpuGemm.* (tests/gpu/test_gpu_gemm.cpp) names for each configuration take it.
TEST(GemmPlan, GpuTestShapesTakeTheConfigurationTheyTestOnAnH100) {
  for (int64_t k : {72, 37}) { // LargeTilesWithEdges: 33 x 5 = 165 tiles of 128 x 128
    const FamilyPlans plans = h100_plans(4099, 520, k);
    EXPECT_EQ(plans.wmma.tiles, GemmTiles::large) << "K " << k;
    EXPECT_EQ(plans.simt.tiles, GemmTiles::large) << "K " << k;
    EXPECT_EQ(plans.wmma.split.splits, 1);
  }
  const FamilyPlans tall_thin = h100_plans(65537, 32, 32); // TallThin
  EXPECT_EQ(tall_thin.wmma.tiles, GemmTiles::small) << "N = 32 would be 3/4 padding";
  EXPECT_EQ(tall_thin.simt.tiles, GemmTiles::small);
  EXPECT_EQ(tall_thin.wmma.split.splits, 1) << "1025 tiles fill the GPU";

  const FamilyPlans long_k = h100_plans(40, 72, 8013); // SplitKLongK: 2 tiles of 64 x 64
  EXPECT_EQ(long_k.wmma.tiles, GemmTiles::small);
  EXPECT_EQ(long_k.wmma.split.splits, 28) << "251 k-tiles of 32 in slices of 9";
  EXPECT_EQ(long_k.wmma.split.k_per_split, 9 * 32);
  EXPECT_EQ(long_k.simt.split.splits, 56) << "501 k-tiles of 16 in slices of 9";
  EXPECT_EQ(long_k.simt.split.k_per_split, 9 * 16);

  // GpuConv.*'s 128-channel case, x [1, 128, 132, 128], 1x1 kernel, pad 1: dx is [16896, 128]
  // over K = 128, 132 large tiles (y, padded to 130x134, has 137).
  EXPECT_EQ(h100_plans(128 * 132, 128, 128).wmma.tiles, GemmTiles::large);
  EXPECT_EQ(h100_plans(128 * 132, 128, 128).simt.tiles, GemmTiles::large);
  // Its case x [2, 96, 97, 8], w [32, 3, 3, 8]: dw [32, 72] sums over 18624 pixels in 2 tiles.
  EXPECT_GT(h100_plans(32, 72, 2 * 96 * 97).wmma.split.splits, 1);
  EXPECT_GT(h100_plans(32, 72, 2 * 96 * 97).simt.split.splits, 1);
}

TEST(GemmPlan, LargeTilesNeedAFullGridLittlePaddingAndSharedMemory) {
  // 12 x 11 = 132 tiles of 128 x 128 fill an H100 exactly; one row fewer does not.
  EXPECT_EQ(plan_gemm(1536, 1408, 256, kWmmaLargeTile, kWmmaSmallTile, true, kH100Sms).tiles,
            GemmTiles::large);
  EXPECT_EQ(plan_gemm(1408, 1408, 256, kWmmaLargeTile, kWmmaSmallTile, true, kH100Sms).tiles,
            GemmTiles::small);
  EXPECT_EQ(plan_gemm(1536, 1408, 256, kWmmaLargeTile, kWmmaSmallTile, false, kH100Sms).tiles,
            GemmTiles::small)
      << "the large tiles' shared memory does not fit";
  // N = 192: 128-wide tiles pad it to 256, 64-wide ones not at all (4/3 > 5/4): small tiles.
  EXPECT_EQ(plan_gemm(1 << 16, 192, 256, kWmmaLargeTile, kWmmaSmallTile, true, kH100Sms).tiles,
            GemmTiles::small);
  // N = 320 pads to 384 against 320 (6/5 <= 5/4): large tiles.
  EXPECT_EQ(plan_gemm(1 << 16, 320, 256, kWmmaLargeTile, kWmmaSmallTile, true, kH100Sms).tiles,
            GemmTiles::large);
}

TEST(GemmPlan, SineAndGemmBenchShapes) {
  // The sine net's 1x1 convs at 512^2 (N = 256 channels): large tiles forward; its weight
  // gradient [256, 256] over K = 262144 pixels splits K on the small tiles.
  EXPECT_EQ(h100_plans(262144, 256, 256).wmma.tiles, GemmTiles::large);
  const GemmPlan dw = h100_plans(256, 256, 262144).wmma;
  EXPECT_EQ(dw.tiles, GemmTiles::small);
  EXPECT_EQ(dw.split.splits, 33) << "16 small tiles, about four blocks per SM";
  // 4096^3, the headline GEMM: 1024 large tiles, no split.
  const GemmPlan square = h100_plans(4096, 4096, 4096).wmma;
  EXPECT_EQ(square.tiles, GemmTiles::large);
  EXPECT_EQ(square.split.splits, 1);
}

// v5's plan (three tiles) for one shape on a GPU with `sm_count` SMs.
GemmPlan v5_plan(int64_t m, int64_t n, int64_t k, int sm_count = kH100Sms) {
  return plan_gemm(m, n, k, kMultistageLargeTile, kMmaLargeTile, kMmaSmallTile, true, true,
                   sm_count);
}

// v5 plans over three tiles: 128x256 where they fill the SMs, else 128x128, else 64x64.
TEST(GemmPlan, MultistageTakesItsMediumTilesWhereTheLargeOnesLeaveSmsIdle) {
  EXPECT_EQ(v5_plan(4096, 4096, 4096).tiles, GemmTiles::large) << "512 tiles of 128x256";
  EXPECT_EQ(v5_plan(262144, 256, 256).tiles, GemmTiles::large) << "sine's forward: 2048 tiles";
  EXPECT_EQ(v5_plan(2048, 2048, 2048).tiles, GemmTiles::medium) << "128 large, 256 medium tiles";
  EXPECT_EQ(v5_plan(4099, 520, 72).tiles, GemmTiles::medium) << "99 large, 165 medium tiles";
  EXPECT_EQ(v5_plan(4099, 1040, 72).tiles, GemmTiles::large) << "165 large tiles";
  EXPECT_EQ(v5_plan(1024, 1024, 1024).tiles, GemmTiles::small) << "32 large, 64 medium tiles";
  EXPECT_EQ(v5_plan(1024, 1024, 1024).split.splits, 1) << "256 small tiles fill the SMs";
  EXPECT_EQ(v5_plan(4096, 4096, 4096).split.splits, 1);
  // Too little shared memory for the large tiles (up to 166 KB): the medium ones.
  EXPECT_EQ(plan_gemm(4096, 4096, 4096, kMultistageLargeTile, kMmaLargeTile, kMmaSmallTile, false,
                      true, kH100Sms)
                .tiles,
            GemmTiles::medium);
  // A thin N = 64 pads 128- and 256-wide tiles: the small ones, K split as the two-tile plan does.
  const GemmPlan thin = v5_plan(256, 64, 262144);
  EXPECT_EQ(thin.tiles, GemmTiles::small);
  EXPECT_EQ(thin.split.splits,
            plan_gemm(256, 64, 262144, kMmaLargeTile, kMmaSmallTile, true, kH100Sms).split.splits);
}

// With few tiles over C and a long K, v5 splits K on its large tiles, about one block per SM, each
// slice at least kMinLargeTilesPerSplit K tiles: sine's hidden weight gradients. Shorter K keeps
// the small tiles' split: ResNet-50's weight gradients at batch 64, and sine's at 128^2.
TEST(GemmPlan, MultistageSplitsKOnItsLargeTilesWhereKIsLong) {
  const GemmPlan dw = v5_plan(256, 256, 512 * 512);
  EXPECT_EQ(dw.tiles, GemmTiles::large);
  EXPECT_EQ(dw.split.splits, 66) << "2 tiles of 128x256 on 132 SMs";
  EXPECT_EQ(dw.split.k_per_split, 63 * 64) << "4096 K tiles of 64 in slices of 63";
  const GemmPlan short_k = v5_plan(256, 256, 128 * 128);
  EXPECT_EQ(short_k.tiles, GemmTiles::small) << "256 K tiles: 3.9 a slice of 66";
  EXPECT_EQ(short_k.split.splits, plan_k_split(16, 128 * 128, kMmaSmallTile.bk, kH100Sms).splits);
  EXPECT_EQ(v5_plan(256, 256, 512 * 512, 4).tiles, GemmTiles::medium)
      << "4 medium tiles give 4 SMs a block: no split";
  EXPECT_EQ(v5_plan(64, 256, 512 * 512).tiles, GemmTiles::small) << "M = 64 pads 128-high tiles";
  // GpuGemmVersions.MultistageSplitsKOnLargeTiles' shape: one large tile on 9 SMs, 289 K tiles in 9
  // slices.
  const GemmPlan test = v5_plan(100, 200, 18469, 9);
  EXPECT_EQ(test.tiles, GemmTiles::large);
  EXPECT_EQ(test.split.splits, 9);
  EXPECT_EQ(test.split.k_per_split, 33 * 64);

  // ResNet-50 at batch 64: dw [Cout, Cin * kh * kw] over the batch's output pixels, every conv.
  std::vector<std::array<int64_t, 3>> resnet = {{64, 3 * 49, 64 * 112 * 112}};
  int64_t in = 64;
  for (auto [blocks, width, size] :
       {std::array<int64_t, 3>{3, 64, 56}, {4, 128, 28}, {6, 256, 14}, {3, 512, 7}})
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t size_in = b == 0 && width != 64 ? 2 * size : size; // stride 2 on the 3x3
      resnet.push_back({width, in, 64 * size_in * size_in});
      resnet.push_back({width, 9 * width, 64 * size * size});
      resnet.push_back({4 * width, width, 64 * size * size});
      if (b == 0) resnet.push_back({4 * width, in, 64 * size * size});
      in = 4 * width;
    }
  for (const auto& [m, n, k] : resnet) {
    const GemmPlan plan = v5_plan(m, n, k);
    EXPECT_FALSE(plan.tiles == GemmTiles::large && plan.split.splits > 1)
        << "ResNet-50 dw [" << m << ", " << n << "] over " << k;
  }

  // Every large-tile split: whole K tiles, long slices, none empty, covering K, about one
  // block per SM.
  for (int sm_count : {9, 80, kH100Sms})
    for (int64_t m : {100, 256, 300})
      for (int64_t k : {18469, 262144, 999999}) {
        const GemmPlan plan = v5_plan(m, 256, k, sm_count);
        if (plan.tiles != GemmTiles::large || plan.split.splits == 1) continue;
        const int64_t tiles = tile_count(m, 256, kMultistageLargeTile);
        SCOPED_TRACE(testing::Message() << "M " << m << ", K " << k << ", SMs " << sm_count);
        EXPECT_EQ(plan.split.k_per_split % kMultistageLargeTile.bk, 0);
        EXPECT_GE(plan.split.k_per_split, kMinLargeTilesPerSplit * kMultistageLargeTile.bk);
        EXPECT_LT((plan.split.splits - 1) * plan.split.k_per_split, k);
        EXPECT_GE(plan.split.splits * plan.split.k_per_split, k);
        EXPECT_LE(tiles * plan.split.splits, sm_count + tiles);
      }
}

// What each planned version refuses, by operand dtype and GPU: the launcher throws these words.
TEST(GemmPlan, VersionsRefuseWhatTheyCannotRunNamingWhy) {
  const GemmVersion all[] = {GemmVersion::v1_naive, GemmVersion::v2_wmma, GemmVersion::v3_interior,
                             GemmVersion::v4_mma, GemmVersion::v5_multistage};
  for (GemmVersion v : all) {
    EXPECT_EQ(gemm_refusal(v, DType::f16, 90), "") << gemm_version_name(v);
    const bool mma_sync = v == GemmVersion::v4_mma || v == GemmVersion::v5_multistage;
    EXPECT_EQ(gemm_refusal(v, DType::f16, 75).empty(), !mma_sync) << gemm_version_name(v);
  }
  EXPECT_EQ(gemm_refusal(GemmVersion::v4_mma, DType::f16, 75),
            "gemm v4: needs mma.sync (compute capability 8.0 or later); this GPU is 7.5 "
            "(MINAMP_GEMM_VERSION=v2 or auto runs there)");
  // bf16: v2, v4, v5 on sm_80 and later; v1 and v3 never; nothing below sm_80, not even v2,
  // whose WMMA has no bf16 fragments there.
  for (GemmVersion v : {GemmVersion::v2_wmma, GemmVersion::v4_mma, GemmVersion::v5_multistage}) {
    EXPECT_EQ(gemm_refusal(v, DType::bf16, 80), "") << gemm_version_name(v);
    EXPECT_EQ(gemm_refusal(v, DType::bf16, 90), "") << gemm_version_name(v);
  }
  EXPECT_EQ(gemm_refusal(GemmVersion::v1_naive, DType::bf16, 90),
            "gemm v1: takes f16 operands only, not bf16 (v2, v4, v5 and auto take bf16)");
  EXPECT_EQ(gemm_refusal(GemmVersion::v3_interior, DType::bf16, 90),
            "gemm v3: takes f16 operands only, not bf16 (v2, v4, v5 and auto take bf16)");
  EXPECT_EQ(gemm_refusal(GemmVersion::v2_wmma, DType::bf16, 75),
            "gemm: bf16 operands need tensor cores of compute capability 8.0 or later; this GPU "
            "is 7.5 (f16 runs there)");
  // What auto plans on a Turing GPU (v2) refuses bf16 too: never a wrong answer.
  EXPECT_NE(gemm_refusal(plan_version(GemmVersion::automatic, 75), DType::bf16, 75), "");
  EXPECT_EQ(gemm_refusal(plan_version(GemmVersion::automatic, 80), DType::bf16, 80), "");
}

// The sine net's first conv (K = 2), its last conv (N = 1) and that conv's input gradient (K = 1)
// run on CUDA cores as thin GEMMs; its weight gradients over 262144 pixels (M = 256, N = 2;
// M = 1, N = 256) as thin-C GEMMs; its hidden convs on the tensor cores.
TEST(GemmPlan, ThinGemmsAreSinesFirstAndLastConvs) {
  EXPECT_TRUE(is_thin_c_gemm(256, 2, 262144));
  EXPECT_TRUE(is_thin_c_gemm(1, 256, 262144));
  EXPECT_TRUE(is_thin_c_gemm(4, 4, kThinCMinK));
  EXPECT_FALSE(is_thin_c_gemm(256, 2, kThinCMinK - 1)) << "a short K: split K keeps SMs busy";
  EXPECT_FALSE(is_thin_c_gemm(256, 5, 262144)) << "5 columns: the tensor cores";
  EXPECT_FALSE(is_thin_c_gemm(256, 256, 262144)) << "the hidden convs' weight gradients";
  EXPECT_FALSE(is_thin_c_gemm(1, kThinCMaxWide + 1, 262144));
  EXPECT_FALSE(is_thin_c_gemm(262144, 1, 256)) << "the last conv's forward: thin N";
  EXPECT_TRUE(is_thin_gemm(262144, 256, 2));
  EXPECT_TRUE(is_thin_gemm(262144, 1, 256));
  EXPECT_TRUE(is_thin_gemm(262144, 256, 1));
  EXPECT_FALSE(is_thin_gemm(256, 2, 262144));
  EXPECT_FALSE(is_thin_gemm(1, 256, 262144));
  EXPECT_FALSE(is_thin_gemm(262144, 256, 256));
  EXPECT_FALSE(is_thin_gemm(100352, 32, 9)) << "classify's first conv: K = 9";
}

} // namespace
} // namespace minamp::gpu
