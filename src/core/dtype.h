// Typed enums for element types and devices, with their names and sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

namespace minamp {

enum class DType : uint8_t { f32, f16, i32 };
enum class Device : uint8_t { cpu, cuda };

inline size_t dtype_size(DType dtype) { return dtype == DType::f16 ? 2 : 4; }

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
  case DType::f32: return "f32";
  case DType::f16: return "f16";
  case DType::i32: return "i32";
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

} // namespace minamp
