// Shape: up to 4 dimensions, row-major (the last dimension is contiguous).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>

#include "core/error.h"

namespace minamp {

class Shape;
// Prints "[2, 3]" (defined below; the constructor names the shape in its errors).
inline std::ostream& operator<<(std::ostream& out, const Shape& shape);

class Shape {
public:
  static constexpr int kMaxRank = 4;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    require(dims.size() <= kMaxRank, "Shape", "at most ", kMaxRank, " dimensions, got ",
            dims.size());
    for (int64_t d : dims) {
      require(d >= 0, "Shape", "dimensions must be >= 0, got ", d);
      dims_[rank_++] = d;
    }
    require(numel_fits(), "Shape", "the element count of ", *this, " overflows int64");
  }

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[i < 0 ? i + rank_ : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // Rows of the row-major [rows, last] matrix this shape is viewed as by GEMM-like ops: the
  // product of all dimensions but the last (also when the last is 0).
  int64_t rows() const {
    int64_t n = 1;
    for (int i = 0; i + 1 < rank_; ++i) n *= dims_[i];
    return n;
  }
  int64_t last() const { return rank_ == 0 ? 1 : dims_[rank_ - 1]; }

  bool operator==(const Shape& other) const {
    if (rank_ != other.rank_) return false;
    for (int i = 0; i < rank_; ++i)
      if (dims_[i] != other.dims_[i]) return false;
    return true;
  }
  bool operator!=(const Shape& other) const { return !(*this == other); }

private:
  // True when numel() (multiplying the dimensions in order) does not overflow int64_t.
  bool numel_fits() const {
    int64_t n = 1;
    for (int i = 0; i < rank_; ++i)
      if (__builtin_mul_overflow(n, dims_[i], &n)) return false;
    return true;
  }

  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

inline std::ostream& operator<<(std::ostream& out, const Shape& shape) {
  out << '[';
  for (int i = 0; i < shape.rank(); ++i) out << (i ? ", " : "") << shape[i];
  return out << ']';
}

} // namespace minamp
