// Tensor storage, creation, host transfers and conversions.
#include "core/tensor.h"

#include <cstring>
#include <limits>

#include "core/error.h"
#include "kernels/kernels.h"

namespace minamp {

Tensor::Storage::~Storage() {
  if (ptr)
    allocator_for(device).deallocate(ptr, bytes); // nothing to give back if allocation failed
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  require(shape.numel() <= std::numeric_limits<int64_t>::max() / int64_t(dtype_size(dtype)),
          "Tensor::empty", "the byte count of ", dtype, shape, " overflows int64");
  Tensor t;
  t.storage_ = std::make_shared<Storage>();
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_->bytes = t.nbytes();
  t.storage_->device = device;
  t.storage_->ptr = allocator_for(device).allocate(t.storage_->bytes);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0f, dtype, device);
}

Tensor Tensor::full(const Shape& shape, float value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  kernels::fill(t, value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype,
                           Device device) {
  require(static_cast<int64_t>(values.size()) == shape.numel(), "Tensor::from_vector",
          values.size(), " values do not fill shape ", shape);
  Tensor host = empty(shape, dtype, Device::cpu);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
    case DType::f32: host.data<float>()[i] = values[i]; break;
    case DType::f16: host.data<half>()[i] = half(values[i]); break;
    case DType::bf16: host.data<bfloat16>()[i] = bfloat16(values[i]); break;
    case DType::i32:
      require(fits_int32(values[i]), "Tensor::from_vector", "value ", values[i], " at ", i,
              " does not fit ", describe(host));
      host.data<int32_t>()[i] = static_cast<int32_t>(values[i]);
      break;
    }
  }
  return device == Device::cpu ? host : host.to(device);
}

void* Tensor::raw() const {
  require(defined(), "Tensor", "use of an undefined tensor");
  return storage_->ptr;
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<half>() { return DType::f16; }
template <> constexpr DType dtype_of<bfloat16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }

template <class T> T* Tensor::data() const {
  require(dtype_ == dtype_of<T>(), "Tensor::data", "tensor is ", describe(*this), ", accessed as ",
          dtype_of<T>());
  require(device_ == Device::cpu, "Tensor::data", "tensor is ", describe(*this),
          ": the host cannot read its memory (copy it with to(Device::cpu); raw() is its device "
          "address)");
  return static_cast<T*>(raw());
}
template float* Tensor::data<float>() const;
template half* Tensor::data<half>() const;
template bfloat16* Tensor::data<bfloat16>() const;
template int32_t* Tensor::data<int32_t>() const;

Tensor Tensor::reshape(const Shape& shape) const {
  require(shape.numel() == numel(), "Tensor::reshape", "cannot view ", describe(*this), " as ",
          shape);
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  copy_bytes(t.raw(), device, raw(), device_, nbytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype, device_);
  kernels::cast(*this, t);
  return t;
}

std::vector<float> Tensor::to_vector() const {
  const Tensor host = device_ == Device::cpu ? *this : to(Device::cpu);
  std::vector<float> values(static_cast<size_t>(numel()));
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype_) {
    case DType::f32: values[i] = host.data<float>()[i]; break;
    case DType::f16: values[i] = static_cast<float>(host.data<half>()[i]); break;
    case DType::bf16: values[i] = static_cast<float>(host.data<bfloat16>()[i]); break;
    case DType::i32: values[i] = static_cast<float>(host.data<int32_t>()[i]); break;
    }
  }
  return values;
}

float Tensor::item() const {
  require(numel() == 1, "Tensor::item", "expected one element, got ", describe(*this));
  return to_vector()[0];
}

DType parse_half_precision(const std::string& name) {
  if (name == "f16") return DType::f16;
  if (name == "bf16") return DType::bf16;
  throw Error(cat("dtype: expected 'f16' or 'bf16', got '", name, "'"));
}

std::ostream& operator<<(std::ostream& out, const TensorDescription& description) {
  if (!description.tensor) return out << "no tensor";
  const Tensor& t = *description.tensor;
  if (!t.defined()) return out << "undefined tensor";
  return out << t.dtype() << t.shape() << " on " << t.device();
}

} // namespace minamp
