// The autocast policy table and its thread-local switch.
#include "amp/autocast.h"

namespace minamp::amp {

namespace {
thread_local bool g_autocast = false;
}

DType autocast_dtype(OpClass op_class, DType input_dtype) {
  switch (op_class) {
  case OpClass::matmul: return g_autocast ? DType::f16 : DType::f32;
  case OpClass::normalize: return g_autocast ? DType::f16 : input_dtype;
  case OpClass::keep: return input_dtype;
  case OpClass::fp32: return DType::f32;
  }
  return input_dtype;
}

bool autocast_enabled() { return g_autocast; }

Autocast::Autocast(bool enabled) : previous_(g_autocast) { g_autocast = enabled; }
Autocast::~Autocast() { g_autocast = previous_; }

} // namespace minamp::amp
