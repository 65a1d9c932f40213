// Tests of Tensor creation: shapes whose element or byte count does not fit, the matrix view of
// empty shapes, host values that an i32 tensor cannot hold, item(), and the allocator's live and
// peak byte counts.
#include <cmath>

#include "core/allocator.h"

#include "kernels/kernels.h"
#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

TEST(Tensor, RejectsShapesWhoseElementCountOverflows) {
  const int64_t rows = int64_t{1} << 40, cols = int64_t{1} << 24; // 2^64 elements
  const std::string message = "the element count of [1099511627776, 16777216] overflows int64";
  expect_error([&] { Tensor::zeros({rows, cols}); }, "Shape", message);
  expect_error([] { Tensor::zeros({2, -3}); }, "Shape", "dimensions must be >= 0, got -3");
}

TEST(Tensor, RejectsShapesWhoseByteCountOverflows) {
  expect_error([] { Tensor::empty({int64_t{1} << 62}); }, "Tensor::empty",
               "the byte count of f32[4611686018427387904] overflows int64");
}

TEST(Tensor, EmptyShapesViewAsMatricesWithoutDividingByZero) {
  EXPECT_EQ(Shape({4, 0}).rows(), 4);
  EXPECT_EQ(Shape({2, 3, 0}).rows(), 6);
  EXPECT_EQ(Shape({0, 5}).rows(), 0);
  EXPECT_EQ(Shape({2, 3, 5}).rows(), 6);
  EXPECT_EQ(Shape{}.rows(), 1);
}

// Empty tensors own no memory (null data): copies of them must not hand null to memcpy (which
// UndefinedBehaviorSanitizer, in make test-sanitize, reports).
TEST(Tensor, EmptyTensorsCloneAndCast) {
  for (DType from : {DType::f32, DType::f16, DType::i32})
    for (DType to : {DType::f32, DType::f16, DType::i32}) {
      const Tensor empty = Tensor::zeros({0, 3}, from);
      Tensor out = Tensor::empty({3, 0}, to);
      cpu::cast(empty, out);
      EXPECT_EQ(out.numel(), 0);
      EXPECT_EQ(empty.clone().shape(), (Shape{0, 3}));
      EXPECT_EQ(empty.to(to).dtype(), to);
    }
}

TEST(Tensor, FromVectorRejectsValuesAnI32CannotHold) {
  const std::vector<float> too_large = {1.0f, 3e9f}, not_a_number = {std::nanf("")};
  expect_error([&] { Tensor::from_vector(too_large, {2}, DType::i32); }, "Tensor::from_vector",
               "value 3e+09 at 1 does not fit i32");
  const std::vector<float> two_to_31 = {2147483648.0f}; // INT32_MAX + 1, the first float past it
  expect_error([&] { Tensor::from_vector(two_to_31, {1}, DType::i32); }, "Tensor::from_vector",
               "does not fit i32");
  expect_error([&] { Tensor::from_vector(not_a_number, {1}, DType::i32); }, "Tensor::from_vector",
               "value nan at 0");
  const std::vector<float> extremes = {-2147483648.0f, 2147483520.0f, -7.9f};
  EXPECT_EQ(Tensor::from_vector(extremes, {3}, DType::i32).to_vector(),
            (std::vector<float>{-2147483648.0f, 2147483520.0f, -7.0f}));
}

// to() and clone() copy the values, even to the dtype and device the tensor already has:
// writing the result leaves the source alone (a plain copy of a Tensor shares storage).
TEST(Tensor, ConversionsToTheSameDtypeOrDeviceAreCopies) {
  const Tensor source = Tensor::from_vector({1.0f, 2.0f}, {2});
  for (Tensor copy : {source.to(DType::f32), source.to(Device::cpu), source.clone()}) {
    copy.data<float>()[0] = 7.0f;
    EXPECT_EQ(source.to_vector(), (std::vector<float>{1.0f, 2.0f}));
  }
  Tensor shared = source;
  shared.data<float>()[1] = 5.0f;
  EXPECT_EQ(source.to_vector(), (std::vector<float>{1.0f, 5.0f}));
}

TEST(Tensor, ItemNeedsExactlyOneElement) {
  EXPECT_EQ(Tensor::full({1, 1}, 2.5f).item(), 2.5f);
  expect_error([] { (void)Tensor::zeros({2}).item(); }, "Tensor::item",
               "expected one element, got f32[2] on cpu");
  expect_error([] { (void)Tensor::zeros({0}).item(); }, "Tensor::item", "got f32[0] on cpu");
}

// The byte counts behind every peak_bytes the examples and benchmarks report: a tensor's bytes
// count while it lives, and the peak is the largest live total since reset_peak().
TEST(Allocator, CountsLiveBytesAndThePeakExactly) {
  Allocator& cpu = allocator_for(Device::cpu);
  const size_t live = cpu.live_bytes();
  cpu.reset_peak();
  EXPECT_EQ(cpu.peak_bytes(), live);
  {
    Tensor a = Tensor::empty({1000});                  // 4000 bytes
    const Tensor b = Tensor::empty({300}, DType::f16); // 600 bytes
    EXPECT_EQ(cpu.live_bytes(), live + 4600);
    EXPECT_EQ(cpu.peak_bytes(), live + 4600);
    a = Tensor();
    EXPECT_EQ(cpu.live_bytes(), live + 600);
    EXPECT_EQ(cpu.peak_bytes(), live + 4600) << "freeing memory lowered the peak";
    cpu.reset_peak();
    EXPECT_EQ(cpu.peak_bytes(), live + 600);
  }
  EXPECT_EQ(cpu.live_bytes(), live);
}

// A memory limit caps the live bytes: the request that would pass it is an OutOfMemory error
// naming the request, the live bytes and the limit; what fits is still given, and lifting the
// limit lifts the cap.
TEST(Allocator, AMemoryLimitCapsTheLiveBytes) {
  Allocator& cpu = allocator_for(Device::cpu);
  const size_t live = cpu.live_bytes();
  cpu.set_memory_limit(live + 10000);
  {
    const Tensor a = Tensor::empty({2000}); // 8000 bytes: fits
    try {
      const Tensor b = Tensor::empty({1000}); // 4000 more: 2000 too many
      ADD_FAILURE() << "the limit was not enforced";
    } catch (const OutOfMemory& e) {
      const std::string message = e.what();
      EXPECT_NE(
          message.find(cat("cpu allocator: out of memory allocating 4000 bytes: ", live + 8000,
                           " bytes are live and the memory limit is ", live + 10000, " bytes")),
          std::string::npos)
          << message;
    }
    const Tensor c = Tensor::empty({500}); // 2000 bytes: exactly up to the limit
    EXPECT_EQ(cpu.live_bytes(), live + 10000);
  }
  cpu.set_memory_limit(0);
  EXPECT_EQ(cpu.memory_limit(), 0u);
  const Tensor big = Tensor::empty({100000});
  EXPECT_EQ(cpu.live_bytes(), live + 400000);
}

} // namespace
} // namespace minamp::test
