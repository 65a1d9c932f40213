// safetensors checkpoints (the format PyTorch's `safetensors` package reads and writes):
//   8 bytes   little-endian u64 N, the length of the JSON header
//   N bytes   JSON: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
//                    ..., "__metadata__": {"key": "value", ...}}   (padded with spaces)
//   the rest  raw little-endian values; offsets are relative to the start of this block.
// minamp tensors hold F32 / F16 / BF16 / I32 (at most 4-D). I64 entries (e.g. BatchNorm's
// num_batches_tracked, a 0-d int64 in PyTorch) are kept apart as NamedInt64s, of any rank.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace minamp::io {

// A tensor and the name it is stored under. Any device: saving copies to the host first.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// An int64 entry: its shape (empty for a 0-d scalar) and row-major values.
struct NamedInt64s {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> values;
};

using Metadata = std::map<std::string, std::string>;

// The contents of a loaded file, entries in the order of their data; tensors live on the host.
struct SafetensorsFile {
  std::string path;
  std::vector<NamedTensor> tensors;
  std::vector<NamedInt64s> int64s;
  Metadata metadata;

  bool has_tensor(const std::string& name) const;
  bool has_int64s(const std::string& name) const;
  // The entry called `name`; throws Error naming the file and the missing name.
  const Tensor& tensor(const std::string& name) const;
  const NamedInt64s& int64s_named(const std::string& name) const;
};

// Writes `tensors`, `int64s` and `metadata` to `path` atomically. Throws Error for empty,
// duplicate or reserved ("__metadata__") names, names or metadata that are not valid UTF-8 (the
// header is JSON), and for int64 values that do not fill their shape.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const Metadata& metadata = {}, const std::vector<NamedInt64s>& int64s = {});

// The safetensors name of a dtype ("F32", "F16", "BF16", "I32").
const char* safetensors_dtype(DType dtype);

// Reads and validates a whole file: header length and JSON, names, dtypes (F32, F16, BF16, I32,
// I64),
// shapes, and that the data offsets match dtype * shape and tile the data block exactly (no
// overlap, no gap, nothing after the last entry), as the safetensors library requires.
// Throws Error naming the file and what is wrong.
SafetensorsFile load_safetensors(const std::string& path);

} // namespace minamp::io
