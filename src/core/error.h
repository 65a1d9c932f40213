// minamp::Error, the one exception type for user-facing failures, and small helpers that
// build its messages (the op, the shapes/dtypes/devices involved, what was expected).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace minamp {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// An allocator could not give the memory asked for (a program can then name the options that
// made the request too large).
class OutOfMemory : public Error {
public:
  using Error::Error;
};

// A size beyond what a kernel can index (the CUDA kernels' 32-bit extents): the same request in
// smaller pieces (a smaller batch) would run.
class SizeLimit : public Error {
public:
  using Error::Error;
};

// Concatenates any streamable values into one string: cat("Linear: got ", shape, "").
template <class... Parts> std::string cat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

// Throws Error("<op>: <message>") when `ok` is false.
template <class... Parts> void require(bool ok, const char* op, const Parts&... message) {
  if (!ok) throw Error(cat(op, ": ", message...));
}

// Throws SizeLimit("<op>: <message>") when `ok` is false.
template <class... Parts> void require_size(bool ok, const char* op, const Parts&... message) {
  if (!ok) throw SizeLimit(cat(op, ": ", message...));
}

} // namespace minamp
