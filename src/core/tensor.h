// Tensor: a contiguous, row-major block of f32 / f16 / bf16 / i32 values on one device, up to 4-D.
// Copies of a Tensor share storage (like a shared_ptr); `clone()` copies the values.
#pragma once

#include <memory>
#include <ostream>
#include <vector>

#include "core/allocator.h"
#include "core/dtype.h"
#include "core/half.h"
#include "core/shape.h"

namespace minamp {

class Tensor {
public:
  Tensor() = default; // undefined: no storage

  // Uninitialised values.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor full(const Shape& shape, float value, DType dtype = DType::f32,
                     Device device = Device::cpu);
  // From host values (converted to dtype: f16 and bf16 round to nearest even, i32 truncates).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::f32, Device device = Device::cpu);

  bool defined() const { return storage_ != nullptr; }
  // Whether another Tensor (a copy or a reshape) shares this one's storage: writing in place
  // would change its values too.
  bool storage_shared() const { return storage_.use_count() > 1; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  // The storage's address on its device (for a cuda tensor, not readable on the host).
  void* raw() const;
  // Typed host access to a cpu tensor; checks the device and that T matches the dtype (float,
  // half, bfloat16, int32_t).
  template <class T> T* data() const;

  // Same storage, new shape with the same number of elements.
  Tensor reshape(const Shape& shape) const;
  // A copy of the values on `device` (a copy even when already there).
  Tensor to(Device device) const;
  // A copy converted to `dtype` (rounds to nearest even into f16 and bf16).
  Tensor to(DType dtype) const;
  Tensor clone() const { return to(device_); }
  // Host copy of the values as floats.
  std::vector<float> to_vector() const;
  // The value of a one-element tensor (a host read: synchronises with the device).
  float item() const;

private:
  struct Storage {
    void* ptr = nullptr;
    size_t bytes = 0;
    Device device = Device::cpu;
    ~Storage();
  };
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// A tensor as error messages show it ("f16[4, 8] on cpu"). Formatting happens only when the
// description is streamed, i.e. when a check fails and its message is built, so a check that
// passes costs nothing. Use it within one expression (it points at the tensor).
struct TensorDescription {
  const Tensor* tensor;
};
inline TensorDescription describe(const Tensor& tensor) { return {&tensor}; }
// The same for an optional tensor: a null pointer reads "no tensor".
inline TensorDescription describe(const Tensor* tensor) { return {tensor}; }
std::ostream& operator<<(std::ostream& out, const TensorDescription& description);

} // namespace minamp
