// The autocast policy table and its thread-local switch.
#include "amp/autocast.h"

#include "core/error.h"

namespace minamp::amp {

namespace {
thread_local bool g_autocast = false;
thread_local DType g_low_precision = DType::f16;
} // namespace

DType autocast_dtype(OpClass op_class, DType input_dtype) {
  switch (op_class) {
  case OpClass::matmul: return g_autocast ? g_low_precision : DType::f32;
  case OpClass::normalize: return g_autocast ? g_low_precision : input_dtype;
  case OpClass::keep: return input_dtype;
  case OpClass::fp32: return DType::f32;
  }
  return input_dtype;
}

bool autocast_enabled() { return g_autocast; }

Autocast::Autocast(bool enabled, DType dtype)
    : previous_enabled_(g_autocast), previous_dtype_(g_low_precision) {
  require(is_half_precision(dtype), "Autocast", "dtype must be f16 or bf16, got ", dtype);
  g_autocast = enabled;
  g_low_precision = dtype;
}

Autocast::~Autocast() {
  g_autocast = previous_enabled_;
  g_low_precision = previous_dtype_;
}

} // namespace minamp::amp
