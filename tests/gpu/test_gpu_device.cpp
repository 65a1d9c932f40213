// GPU tests of the device plumbing: host/device copies round-trip every dtype bit for bit, a
// parameter moves with its f16 copy, ops refuse a host tensor among device tensors, the caching
// allocator makes no cudaMalloc call once a step's sizes have been seen, reports out-of-memory with
// the bytes requested and survives frees at exit, the op profiler times GPU ops with events, CUDA
// graphs capture without running and replay on new inputs, keep their blocks to themselves and
// survive a failed capture, and (the one test that needs no GPU) a cuda tensor without a device
// fails with an Error saying why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "kernels/profile.h"
#include "nn/parameter.h"
#include "test_util.h"
#if MINAMP_WITH_CUDA
#include "device.cuh"
#endif

namespace minamp {
namespace {

using test::expect_error;

TEST(GpuAbsent, CudaTensorWithoutADeviceThrowsTheReason) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present; this test needs its absence";
  const std::string reason = cuda_unavailable_reason();
  EXPECT_FALSE(reason.empty());
  expect_error([] { Tensor::empty({4}, DType::f32, Device::cuda); }, reason);
}

TEST(GpuDevice, CopiesRoundTripEveryDtype) {
  MINAMP_REQUIRE_GPU();
  Rng rng(81);
  for (DType dtype : {DType::f32, DType::f16, DType::i32})
    for (int64_t n : {1, 17, 1000, 1 << 20}) {
      const Tensor host = test::random_tensor(rng, {n}, dtype, Device::cpu, -1000.0f, 1000.0f);
      const Tensor device = host.to(Device::cuda);
      const Tensor device_copy = device.clone(); // device to device
      const Tensor back = device_copy.to(Device::cpu);
      ASSERT_EQ(back.nbytes(), host.nbytes());
      EXPECT_EQ(std::memcmp(back.raw(), host.raw(), host.nbytes()), 0)
          << describe(host) << " changed on its way through the device";
    }
}

TEST(GpuDevice, AParameterMovesWithItsF16Copy) {
  MINAMP_REQUIRE_GPU();
  Rng rng(82);
  Parameter p(test::random_tensor(rng, {3, 5}));
  const std::vector<float> copy_made_on_cpu = p.working_copy(DType::f16).to_vector();
  p.to(Device::cuda);
  EXPECT_EQ(p.master().device(), Device::cuda);
  EXPECT_EQ(p.grad().device(), Device::cuda);
  const Tensor& copy = p.working_copy(DType::f16);
  EXPECT_EQ(copy.device(), Device::cuda) << "the f16 copy stayed on the cpu";
  EXPECT_EQ(copy.to_vector(), copy_made_on_cpu);
}

// The host reads a cuda tensor only through a copy, and an op never mixes devices: both are
// Errors that say what was wrong (on a GPU, the host read would be a crash, not an error).
TEST(GpuDevice, DeviceMismatchesAreErrors) {
  MINAMP_REQUIRE_GPU();
  Tensor on_gpu = Tensor::full({4}, 1.0f, DType::f32, Device::cuda);
  const Tensor on_cpu = Tensor::full({4}, 2.0f);
  expect_error([&] { on_gpu.data<float>(); },
               "Tensor::data: tensor is f32[4] on cuda: the host cannot read its memory");
  expect_error([&] { kernels::add_inplace(on_gpu, on_cpu, 1.0f); },
               "add_inplace: all tensors must be on one device, got f32[4] on cpu and f32[4] on "
               "cuda");
  EXPECT_EQ(on_gpu.to_vector(), std::vector<float>(4, 1.0f)) << "a refused op changed its output";
}

// The common mistake of a tensor left on the host (targets, labels, a bias, running statistics)
// beside device tensors: each op refuses it, naming itself and the two devices. On a GPU it would
// otherwise be an illegal address; on the emulator, a silent host read.
TEST(GpuDevice, AnOpGivenAHostTensorAmongDeviceTensorsRefusesIt) {
  MINAMP_REQUIRE_GPU();
  Rng rng(83);
  const Tensor host_bias = Tensor::zeros({4});
  GemmEpilogue with_host_bias;
  with_host_bias.bias = &host_bias;
  const Tensor pred = test::random_tensor(rng, {4, 4}).to(Device::cuda);
  Tensor out = Tensor::empty({4, 4}, DType::f32, Device::cuda);
  Tensor loss = Tensor::empty({1}, DType::f32, Device::cuda);
  const Tensor x = test::random_tensor(rng, {1, 4, 4, 3}).to(Device::cuda);
  const Tensor w = test::random_tensor(rng, {4, 3, 3, 3}).to(Device::cuda);
  Tensor y = Tensor::empty({1, 2, 2, 4}, DType::f32, Device::cuda);
  const Tensor ones = Tensor::full({4}, 1.0f, DType::f32, Device::cuda);
  Tensor mean = ones.clone(), invstd = ones.clone(), running_mean = ones.clone();
  Tensor host_running_var = Tensor::full({4}, 1.0f);
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"mse_forward",
       [&] {
         kernels::mse_forward(pred, test::random_tensor(rng, {4, 4}), loss);
       }},
      {"cross_entropy_forward",
       [&] {
         kernels::cross_entropy_forward(pred, Tensor::from_vector({0, 1, 2, 3}, {4}, DType::i32),
                                        loss);
       }},
      {"gemm", [&] { kernels::gemm(pred, false, pred, true, out, with_host_bias); }},
      {"conv2d_forward", [&] { kernels::conv2d_forward(x, w, y, ConvParams{}, with_host_bias); }},
      {"batchnorm_forward", [&] {
         kernels::batchnorm_forward(pred, ones, ones, out, mean, invstd, running_mean,
                                    host_running_var, BatchNormParams{});
       }}};
  for (const auto& [op, call] : calls)
    expect_error(call, op, ": all tensors must be on one device", " on cpu", " on cuda");
}

#if MINAMP_WITH_CUDA

// A few tensors alive together, of sizes in both size-class regimes (below and above 1 MiB).
void allocate_like_a_step() {
  std::vector<Tensor> live;
  for (int64_t n : {1, 17, 1000, 300000, 1 << 20, 3 << 20})
    live.push_back(Tensor::empty({n}, DType::f32, Device::cuda));
  live.push_back(Tensor::empty({12345}, DType::f16, Device::cuda));
}

// Host-to-device copies up to 64 MB go through a ring of pinned staging buffers without waiting
// for the GPU: many uploads of different sizes in a row (slots reused and grown; from_vector's
// host tensor is freed as soon as it returns) each arrive intact, and a larger one takes the
// waiting path.
TEST(GpuDevice, StagedUploadsArriveIntact) {
  MINAMP_REQUIRE_GPU();
  Rng rng(13);
  std::vector<Tensor> uploaded;
  std::vector<std::vector<float>> sources;
  for (int i = 0; i < 24; ++i) {
    const int64_t size = (i % 3 == 0) ? 700000 : 1000 + 37 * i; // slots grow and are reused
    std::vector<float> values(static_cast<size_t>(size));
    for (float& v : values) v = rng.uniform(-1.0f, 1.0f);
    uploaded.push_back(Tensor::from_vector(values, {size}, DType::f32, Device::cuda));
    sources.push_back(std::move(values));
  }
  for (size_t i = 0; i < uploaded.size(); ++i)
    EXPECT_EQ(uploaded[i].to_vector(), sources[i]) << "upload " << i;
  const Tensor big = Tensor::full({(int64_t(64) << 20) / 4 + 1}, 0.5f); // just over 64 MB
  const Tensor big_gpu = big.to(Device::cuda);
  EXPECT_EQ(big_gpu.to_vector(), big.to_vector());
}

TEST(GpuAllocator, SteadyStateMakesNoCudaMallocCall) {
  MINAMP_REQUIRE_GPU();
  MINAMP_REQUIRE_CACHING();
  Allocator& allocator = allocator_for(Device::cuda);
  const size_t live_before = allocator.live_bytes();
  allocator.reset_peak(); // so that no earlier test's peak can satisfy the check below
  allocate_like_a_step(); // warm-up: fills the cache
  const size_t calls_after_warm_up = gpu::cuda_malloc_calls();
  for (int i = 0; i < 10; ++i) allocate_like_a_step();
  EXPECT_EQ(gpu::cuda_malloc_calls(), calls_after_warm_up);
  EXPECT_EQ(allocator.live_bytes(), live_before);
  EXPECT_GE(allocator.peak_bytes(), live_before + (size_t(4) << 20) * 4);
}

// Requests below 1 MiB are rounded up to a multiple of 512 bytes (not to a whole MiB): a freed
// block goes to the next request of its own class only. (Sizes no other test uses.)
TEST(GpuAllocator, SmallRequestsShareBlocksOnlyWithinTheirClassOf512Bytes) {
  MINAMP_REQUIRE_GPU();
  MINAMP_REQUIRE_CACHING();
  const auto block_of = [](int64_t floats) {
    return Tensor::empty({floats}, DType::f32, Device::cuda).raw(); // freed at once
  };
  const void* freed = block_of(15744); // 62976 bytes: 123 x 512
  EXPECT_NE(block_of(15872), freed);   // 63488 bytes: the next class
  EXPECT_EQ(block_of(15700), freed);   // 62800 bytes: the same class as the first
}

// An impossible request fails with an Error naming the bytes asked for; the device stays usable.
TEST(GpuAllocator, OutOfMemoryIsAnErrorNamingTheBytes) {
  MINAMP_REQUIRE_GPU();
  const int64_t n = int64_t(1) << 40; // 4 TiB of f32
  expect_error([&] { Tensor::empty({n}, DType::f32, Device::cuda); },
               std::to_string(n * 4) + " bytes");
  const Tensor after = Tensor::full({1000}, 3.0f, DType::f32, Device::cuda);
  EXPECT_EQ(after.to_vector()[999], 3.0f);
}

// The memory limit caps the cuda allocator too, before any cudaMalloc.
TEST(GpuAllocator, AMemoryLimitCapsTheLiveBytes) {
  MINAMP_REQUIRE_GPU();
  Allocator& cuda = allocator_for(Device::cuda);
  cuda.set_memory_limit(cuda.live_bytes() + (1 << 20));
  expect_error([&] { Tensor::empty({1 << 19}, DType::f32, Device::cuda); },
               "cuda allocator: out of memory allocating 2097152 bytes", "memory limit");
  const Tensor fits = Tensor::full({1 << 17}, 2.0f, DType::f32, Device::cuda);
  cuda.set_memory_limit(0);
  EXPECT_EQ(fits.to_vector()[0], 2.0f);
}

// A cuda tensor with static storage duration is freed after main returns, possibly after the
// CUDA runtime has been torn down: the free must make no CUDA call (the test binary would
// crash or print an error at exit).
TEST(GpuAllocator, TensorFreedAtProgramExit) {
  MINAMP_REQUIRE_GPU();
  static const Tensor kept = Tensor::full({4096}, 1.0f, DType::f32, Device::cuda);
  EXPECT_EQ(kept.to_vector()[4095], 1.0f);
}

// Kernels with workspaces (two-stage reductions) also reach a steady state after one step.
TEST(GpuAllocator, BatchNormStepReusesItsWorkspaces) {
  MINAMP_REQUIRE_GPU();
  MINAMP_REQUIRE_CACHING();
  Rng rng(82);
  const Tensor x = test::random_tensor(rng, {4096, 64}, DType::f16, Device::cuda);
  const Tensor gamma = Tensor::full({64}, 1.0f, DType::f32, Device::cuda);
  const Tensor beta = Tensor::zeros({64}, DType::f32, Device::cuda);
  Tensor y = Tensor::empty({4096, 64}, DType::f16, Device::cuda);
  Tensor dx = Tensor::empty({4096, 64}, DType::f16, Device::cuda);
  Tensor mean = Tensor::empty({64}, DType::f32, Device::cuda);
  Tensor invstd = Tensor::empty({64}, DType::f32, Device::cuda);
  Tensor running_mean = Tensor::zeros({64}, DType::f32, Device::cuda);
  Tensor running_var = Tensor::full({64}, 1.0f, DType::f32, Device::cuda);
  Tensor dgamma = Tensor::zeros({64}, DType::f32, Device::cuda);
  Tensor dbeta = Tensor::zeros({64}, DType::f32, Device::cuda);
  const BatchNormParams bn;
  auto step = [&] {
    kernels::batchnorm_forward(x, gamma, beta, y, mean, invstd, running_mean, running_var, bn);
    kernels::batchnorm_backward(x, gamma, beta, mean, invstd, y, dx, dgamma, dbeta, bn);
  };
  step();
  const size_t calls = gpu::cuda_malloc_calls();
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(gpu::cuda_malloc_calls(), calls);
  backend::cuda_synchronize();
}

// After a failed capture the allocator has left capture mode: a block cached before is handed
// out again, not a new one for a graph's pool.
TEST(GpuAllocator, AFailedCaptureLeavesTheCacheShared) {
  MINAMP_REQUIRE_GPU();
  MINAMP_REQUIRE_CACHING();
  const void* cached = Tensor::empty({15488}, DType::f32, Device::cuda).raw(); // freed at once
  EXPECT_THROW(backend::cuda_graph_capture([] { (void)Tensor::full({4}, 1.0f).to(Device::cuda); }),
               Error);
  EXPECT_EQ(Tensor::empty({15488}, DType::f32, Device::cuda).raw(), cached);
}

#endif // MINAMP_WITH_CUDA

// Two GEMMs and a ReLU on the GPU with the profiler on: each op once per call, with the time the
// GPU spent between the events around it.
TEST(GpuProfile, TimesOpsWithEvents) {
  MINAMP_REQUIRE_GPU();
  Rng rng(8);
  const Tensor a = test::random_tensor(rng, {512, 256}, DType::f16, Device::cuda);
  const Tensor b = test::random_tensor(rng, {256, 384}, DType::f16, Device::cuda);
  Tensor c = Tensor::empty({512, 384}, DType::f32, Device::cuda);
  Tensor y = Tensor::empty({512, 384}, DType::f32, Device::cuda);
  profile::collect();
  profile::set_enabled(true);
  kernels::gemm(a, false, b, false, c, {});
  kernels::gemm(a, false, b, false, c, {});
  kernels::relu_forward(c, y);
  profile::set_enabled(false);
  const std::vector<profile::OpTime> times = profile::collect();
  ASSERT_EQ(times.size(), 2u);
  for (const profile::OpTime& t : times) {
    EXPECT_EQ(t.device, Device::cuda);
    EXPECT_EQ(t.calls, t.op == "gemm" ? 2 : 1) << t.op;
    EXPECT_GT(t.ms, 0.0) << t.op;
  }
}

// z = relu(x @ w) captured once; the capture runs nothing (z keeps its poison), and every replay
// recomputes z from what x holds at that moment.
TEST(GpuGraph, CaptureRunsNothingAndReplaysOnNewInputs) {
  MINAMP_REQUIRE_GPU();
  Rng rng(9);
  const Tensor w = test::random_tensor(rng, {40, 24});
  Tensor x = test::random_tensor(rng, {70, 40}, DType::f32, Device::cuda);
  Tensor z = test::poisoned({70, 24}, DType::f32, Device::cuda);
  const Tensor w_gpu = w.to(Device::cuda);
  backend::CudaGraph* graph = backend::cuda_graph_capture([&] {
    Tensor y = Tensor::empty({70, 24}, DType::f32, Device::cuda); // from the graph's pool
    kernels::gemm(x, false, w_gpu, false, y, {});
    kernels::relu_forward(y, z);
  });
  for (float v : z.to_vector()) ASSERT_TRUE(std::isnan(v)) << "the capture ran a kernel";
  for (int replay = 0; replay < 2; ++replay) {
    const Tensor x_new = test::random_tensor(rng, {70, 40});
    copy_bytes(x.raw(), Device::cuda, x_new.raw(), Device::cpu, x.nbytes());
    backend::cuda_graph_launch(graph);
    Tensor y_ref = Tensor::empty({70, 24}), z_ref = Tensor::empty({70, 24});
    kernels::gemm(x_new, false, w, false, y_ref, {});
    kernels::relu_forward(y_ref, z_ref);
    EXPECT_LT(test::relative_error(z.to_vector(), z_ref.to_vector()),
              test::tolerance_for(DType::f32))
        << "replay " << replay;
  }
  backend::cuda_graph_destroy(graph);
}

// A block the graph used is not handed to a tensor made after the capture (a replay would
// overwrite it): neither a temporary freed during the capture nor a tensor made in the capture
// and freed after it.
TEST(GpuGraph, BlocksOfTheCaptureStayWithTheGraph) {
  MINAMP_REQUIRE_GPU();
  const auto block = [] { return Tensor::empty({4096}, DType::f32, Device::cuda); };
  const void* temporary = nullptr;
  Tensor kept;
  backend::CudaGraph* graph = backend::cuda_graph_capture([&] {
    Tensor t = block();
    kernels::fill(t, 1.0f);
    temporary = t.raw();
    kept = block();
    kernels::fill(kept, 2.0f);
  });
  const void* kept_block = kept.raw();
  kept = Tensor();
  const Tensor after = block();
  EXPECT_NE(after.raw(), temporary);
  EXPECT_NE(after.raw(), kept_block);
  backend::cuda_graph_destroy(graph);

  // A block from before the capture, freed inside it, joins the graph's pool as well: taken
  // again in the capture and freed after it, it stays with the graph.
  Tensor before = block();
  Tensor reused;
  graph = backend::cuda_graph_capture([&] {
    before = Tensor();
    reused = block();
    kernels::fill(reused, 3.0f);
  });
  const void* reused_block = reused.raw();
  reused = Tensor();
  const Tensor outside = block();
  EXPECT_NE(outside.raw(), reused_block);
  backend::cuda_graph_destroy(graph);
}

// Destroying a graph hands its pool to the shared cache: the next request of a block's size
// outside any capture gets it.
TEST(GpuGraph, DestroyingAGraphFreesItsBlocksForEveryone) {
  MINAMP_REQUIRE_GPU();
  const auto block = [] { return Tensor::empty({15616}, DType::f32, Device::cuda); };
  const void* temporary = nullptr;
  backend::CudaGraph* graph = backend::cuda_graph_capture([&] {
    Tensor t = block();
    kernels::fill(t, 1.0f);
    temporary = t.raw();
  });
  EXPECT_NE(block().raw(), temporary) << "the graph still holds it";
  backend::cuda_graph_destroy(graph);
  EXPECT_EQ(block().raw(), temporary);
}

// Copying to or from the host while capturing is refused (a replay would read a staging buffer
// long since reused, or could not hand a value back): the capture fails with an Error naming it,
// and the stream and the allocator work as before (another capture included).
TEST(GpuGraph, FailedCaptureLeavesTheStreamUsable) {
  MINAMP_REQUIRE_GPU();
  Tensor t = Tensor::empty({16}, DType::f32, Device::cuda);
  for (bool to_host : {true, false}) {
    try {
      backend::cuda_graph_capture([&] {
        kernels::fill(t, 2.0f);
        if (to_host)
          (void)t.to_vector();
        else
          (void)Tensor::full({16}, 1.0f).to(Device::cuda);
      });
      FAIL() << "a host copy was captured";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be captured"), std::string::npos) << e.what();
    }
  }
  kernels::fill(t, 3.0f);
  EXPECT_EQ(t.to_vector(), std::vector<float>(16, 3.0f));
  backend::CudaGraph* graph = backend::cuda_graph_capture([&] { kernels::fill(t, 4.0f); });
  backend::cuda_graph_launch(graph);
  EXPECT_EQ(t.to_vector(), std::vector<float>(16, 4.0f));
  backend::cuda_graph_destroy(graph);
}

} // namespace
} // namespace minamp
