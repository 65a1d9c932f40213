// IDX files, the format of MNIST and Fashion-MNIST, gzipped or not:
//   bytes 0-1  zero;  byte 2  element type (0x08 = u8, the only one minamp reads);
//   byte 3     number of dimensions;  then each dimension as a big-endian u32;
//   then the values, row-major, exactly as many as the dimensions say.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace minamp::io {

// A u8 IDX array of any rank.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;
};

// Images [count, rows, cols], row-major u8 pixels.
struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;
};

// Reads a u8 IDX file (gzipped or raw). Throws Error naming the file when it cannot be read or
// when the magic, the dimensions or the data length are wrong.
IdxArray read_idx(const std::string& path);
// read_idx, requiring 3 dimensions [count, rows, cols].
IdxImages read_idx_images(const std::string& path);
// read_idx, requiring 1 dimension [count].
std::vector<uint8_t> read_idx_labels(const std::string& path);

} // namespace minamp::io
