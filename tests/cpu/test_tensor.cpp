// Tests of Tensor creation: host values that an i32 tensor cannot hold.
#include <cmath>

#include "test_kernels_reference.h"

namespace minamp::test {
namespace {

TEST(Tensor, FromVectorRejectsValuesAnI32CannotHold) {
  const std::vector<float> too_large = {1.0f, 3e9f}, not_a_number = {std::nanf("")};
  expect_error([&] { Tensor::from_vector(too_large, {2}, DType::i32); }, "Tensor::from_vector",
               "value 3e+09 at 1 does not fit i32");
  expect_error([&] { Tensor::from_vector(not_a_number, {1}, DType::i32); }, "Tensor::from_vector",
               "value nan at 0");
  const std::vector<float> extremes = {-2147483648.0f, 2147483520.0f, -7.9f};
  EXPECT_EQ(Tensor::from_vector(extremes, {3}, DType::i32).to_vector(),
            (std::vector<float>{-2147483648.0f, 2147483520.0f, -7.0f}));
}

} // namespace
} // namespace minamp::test
