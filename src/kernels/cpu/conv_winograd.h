// The CPU convolution's fast path for 3x3, stride-1 kernels: Winograd's minimal filtering
// algorithm F(2x2, 3x3) (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2015).
// Each 2x2 block of output pixels is computed from the 4x4 input tile under it with 16 products
// per channel pair instead of 36, so the GEMMs do 2.25x fewer multiply-adds than im2col's.
#pragma once

#include "kernels/checks.h"

namespace minamp::cpu {

// Whether winograd_conv2d_forward computes this convolution, and is worth it: a 3x3 kernel at
// stride 1, and enough output tiles per channel pair that transforming the weights (16 values per
// pair, each call) costs less than the multiply-adds saved. Depends on the shape only.
bool winograd_applies(const ConvDims& d);

// y [N, Ho, Wo, Cout] = conv(x [N, H, W, Cin], w [Cout, 3, 3, Cin]), in fp32, for shapes where
// winograd_applies. Results do not depend on the number of threads.
void winograd_conv2d_forward(const float* x, const float* w, float* y, const ConvDims& d);

} // namespace minamp::cpu
