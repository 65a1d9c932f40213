// The argument checks shared by the CPU and CUDA kernels.
#include "kernels/checks.h"

namespace minamp {

void require_floating(const char* op, const char* name, const Tensor& tensor) {
  require(tensor.defined() && is_floating(tensor.dtype()), op, name,
          " must be a defined f32 or f16 tensor, got ", describe(tensor));
}

void require_f32(const char* op, const char* name, const Tensor& tensor, int64_t numel) {
  require(tensor.defined() && tensor.dtype() == DType::f32 && tensor.numel() == numel, op, name,
          " must be f32 with ", numel, " elements, got ", describe(tensor));
}

void require_same_numel(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                        const Tensor& b) {
  require(a.defined() && b.defined() && a.numel() == b.numel(), op, name_a, " and ", name_b,
          " must have the same number of elements, got ", describe(a), " and ", describe(b));
}

void require_param_slot(const char* op, const ParamSlot& slot, int states) {
  require(slot.master && slot.master->defined(), op, "every parameter needs a master tensor");
  const int64_t n = slot.master->numel();
  require_f32(op, "master", *slot.master, n);
  require(slot.grad != nullptr, op, "parameter ", describe(*slot.master), " has no gradient");
  require_f32(op, "grad", *slot.grad, n);
  if (states > 0) {
    require(slot.state0 != nullptr, op, "parameter ", describe(*slot.master), " has no state0");
    require_f32(op, "state0", *slot.state0, n);
  }
  if (states > 1) {
    require(slot.state1 != nullptr, op, "parameter ", describe(*slot.master), " has no state1");
    require_f32(op, "state1", *slot.state1, n);
  }
  if (slot.half && slot.half->defined())
    require(slot.half->dtype() == DType::f16 && slot.half->numel() == n, op, "the f16 copy of ",
            describe(*slot.master), " must be f16 of the same size, got ", describe(*slot.half));
}

} // namespace minamp
