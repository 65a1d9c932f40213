// The op profiler: while enabled it counts every kernels:: call once per op with its time, only
// the outermost of nested scopes records, an op's time sums its calls, collect() empties it, and
// nothing is recorded while it is off. The GPU variant (events around each call) is in
// tests/gpu/test_gpu_device.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/profile.h"
#include "test_util.h"

namespace minamp {
namespace {

// The entry for `op`, or nullptr.
const profile::OpTime* find_op(const std::vector<profile::OpTime>& times, const std::string& op) {
  for (const profile::OpTime& t : times)
    if (t.op == op) return &t;
  return nullptr;
}

// Two GEMMs and one ReLU forward and backward through the dispatcher.
void run_some_ops(Device device) {
  Rng rng(7);
  const Tensor a = test::random_tensor(rng, {64, 48}, DType::f32, device);
  const Tensor b = test::random_tensor(rng, {48, 32}, DType::f32, device);
  Tensor c = Tensor::empty({64, 32}, DType::f32, device);
  Tensor y = Tensor::empty({64, 32}, DType::f32, device);
  Tensor dx = Tensor::empty({64, 32}, DType::f32, device);
  kernels::gemm(a, false, b, false, c, {});
  kernels::gemm(a, false, b, false, c, {});
  kernels::relu_forward(c, y);
  kernels::relu_backward(y, c, dx);
}

// Profiles run_some_ops on `device` and checks the counts and times.
void expect_profiled(Device device) {
  profile::collect(); // start from nothing
  profile::set_enabled(true);
  run_some_ops(device);
  profile::set_enabled(false);
  const std::vector<profile::OpTime> times = profile::collect();

  const profile::OpTime* gemm = find_op(times, "gemm");
  const profile::OpTime* relu = find_op(times, "relu_forward");
  const profile::OpTime* relu_backward = find_op(times, "relu_backward");
  ASSERT_NE(gemm, nullptr);
  ASSERT_NE(relu, nullptr);
  ASSERT_NE(relu_backward, nullptr);
  EXPECT_EQ(gemm->calls, 2);
  EXPECT_EQ(relu->calls, 1);
  EXPECT_EQ(relu_backward->calls, 1);
  EXPECT_EQ(gemm->device, device);
  EXPECT_GT(gemm->ms, 0.0);
  EXPECT_GE(relu->ms, 0.0);
  for (size_t i = 1; i < times.size(); ++i) EXPECT_GE(times[i - 1].ms, times[i].ms) << "sorted";
  EXPECT_TRUE(profile::collect().empty()) << "collect() forgets what it returned";
}

TEST(Profile, CountsAndTimesEveryCpuOp) { expect_profiled(Device::cpu); }

TEST(Profile, RecordsNothingWhileDisabled) {
  profile::collect();
  ASSERT_FALSE(profile::enabled());
  run_some_ops(Device::cpu);
  EXPECT_TRUE(profile::collect().empty());
}

// An op's time is the sum over its calls: two calls of at least 20 ms each take at least 40.
TEST(Profile, AnOpsTimeIsTheSumOfItsCalls) {
  profile::collect();
  profile::set_enabled(true);
  for (int call = 0; call < 2; ++call) {
    const profile::Scope scope("sleep", Device::cpu);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  profile::set_enabled(false);
  const std::vector<profile::OpTime> times = profile::collect();
  ASSERT_EQ(times.size(), 1u);
  EXPECT_EQ(times[0].calls, 2);
  EXPECT_GE(times[0].ms, 40.0);
}

TEST(Profile, OnlyTheOutermostScopeRecords) {
  profile::collect();
  profile::set_enabled(true);
  {
    const profile::Scope outer("outer", Device::cpu);
    const profile::Scope inner("inner", Device::cpu);
  }
  profile::set_enabled(false);
  const std::vector<profile::OpTime> times = profile::collect();
  ASSERT_EQ(times.size(), 1u);
  EXPECT_EQ(times[0].op, "outer");
}

// The table divides by the step count: 8 ms of GEMM over 2 steps is 4 ms per step, 80% of the
// 5 ms per step inside ops.
TEST(Profile, TheTableShowsFiguresPerStep) {
  const std::vector<profile::OpTime> times = {{"gemm", Device::cpu, 4, 8.0},
                                              {"relu_forward", Device::cpu, 2, 2.0}};
  const std::string table = profile::format_table(times, 2, "  ");
  EXPECT_EQ(table.substr(0, table.find('\n')),
            "  op profile over 2 steps: 5.000 ms per step inside ops");
  const std::string gemm_row = table.substr(table.find("  gemm"));
  const std::string gemm_line = gemm_row.substr(0, gemm_row.find('\n'));
  EXPECT_NE(gemm_line.find(" 2.0 "), std::string::npos) << gemm_line;
  EXPECT_NE(gemm_line.find(" 4.0000 "), std::string::npos) << gemm_line;
  EXPECT_NE(gemm_line.find(" 80.0%"), std::string::npos) << gemm_line;
}

} // namespace
} // namespace minamp
