// Typed enums for element types and devices, with their names and sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

namespace minamp {

// f16 is IEEE binary16, bf16 bfloat16 (core/half.h); the two low-precision formats of AMP.
enum class DType : uint8_t { f32, f16, i32, bf16 };
enum class Device : uint8_t { cpu, cuda };

// True for the 16-bit float formats autocast computes in (f16, bf16).
inline bool is_half_precision(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

inline size_t dtype_size(DType dtype) { return is_half_precision(dtype) ? 2 : 4; }

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
  case DType::f32: return "f32";
  case DType::f16: return "f16";
  case DType::i32: return "i32";
  case DType::bf16: return "bf16";
  }
  return "?";
}

inline const char* device_name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

inline bool is_floating(DType dtype) { return dtype != DType::i32; }

// True when truncating `value` gives an int32 (false for NaN and inf).
inline bool fits_int32(float value) { return value >= -2147483648.0f && value < 2147483648.0f; }

inline std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }
inline std::ostream& operator<<(std::ostream& out, Device device) {
  return out << device_name(device);
}

// Parses "cpu" / "cuda"; throws Error naming the accepted values otherwise.
Device parse_device(const std::string& name);
// Parses a half-precision dtype name, "f16" or "bf16"; throws Error naming the accepted values
// otherwise.
DType parse_half_precision(const std::string& name);

} // namespace minamp
