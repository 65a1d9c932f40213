// Argument checks shared by both backends' kernels; each throws Error naming the op and the
// tensor. (The dispatcher checks devices and GEMM shapes; kernels check what is theirs.)
#pragma once

#include "kernels/kernels.h"

namespace minamp {

// Unless `tensor` is defined with a floating dtype:
void require_floating(const char* op, const char* name, const Tensor& tensor);
// Unless `tensor` is defined, f32 and has `numel` elements:
void require_f32(const char* op, const char* name, const Tensor& tensor, int64_t numel);
// Unless both are defined and have the same number of elements:
void require_same_numel(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                        const Tensor& b);
// Unless the optimizer slot has master and grad f32 of one size, `states` state tensors (0, 1 or
// 2) f32 of that size, and an f16 copy of that size when it has one:
void require_param_slot(const char* op, const ParamSlot& slot, int states);

} // namespace minamp
