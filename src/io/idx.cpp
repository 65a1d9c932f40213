// IDX reader on zlib's gz* functions, which read gzipped and raw files alike.
#include "io/idx.h"

#include <unistd.h>
#include <zlib.h>

#include <array>

#include "core/error.h"
#include "io/atomic_file.h"

namespace minamp::io {

namespace {

constexpr uint8_t kU8Type = 0x08;
constexpr int kMaxDims = 4;
constexpr uint64_t kMaxValues = uint64_t(1) << 40;

template <class... Parts>
void check_file(bool ok, const std::string& path, const Parts&... message) {
  require(ok, "read_idx", path, ": ", message...);
}

// An open gz (or raw) regular file, closed on destruction.
class GzReader {
public:
  explicit GzReader(const std::string& path) : path_(path) {
    const int fd = open_regular_file(path, "read_idx");
    file_ = gzdopen(fd, "rb");
    if (file_ == nullptr) ::close(fd);
    check_file(file_ != nullptr, path, "cannot open (zlib could not allocate its state)");
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `size` bytes (fewer only at the end of the data); throws on a zlib error,
  // such as a corrupt or truncated gzip stream.
  size_t read(void* dst, unsigned size) {
    const int n = gzread(file_, dst, size);
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    check_file(n >= 0 && (code == Z_OK || code == Z_STREAM_END), path_, "read error (", message,
               ")");
    return static_cast<size_t>(n);
  }

private:
  std::string path_;
  gzFile file_ = nullptr;
};

// The dimensions after the 4-byte magic (count_values multiplies them out).
std::vector<int64_t> read_dims(GzReader& file, const std::string& path, int count) {
  std::vector<int64_t> dims;
  for (int i = 0; i < count; ++i) {
    std::array<uint8_t, 4> bytes{};
    check_file(file.read(bytes.data(), 4) == 4, path, "file ends inside the dimensions");
    dims.push_back((int64_t(bytes[0]) << 24) | (int64_t(bytes[1]) << 16) |
                   (int64_t(bytes[2]) << 8) | int64_t(bytes[3]));
  }
  return dims;
}

uint64_t count_values(const std::string& path, const std::vector<int64_t>& dims) {
  uint64_t count = 1;
  for (int64_t d : dims) {
    check_file(d == 0 || count <= kMaxValues / uint64_t(d), path, "dimensions are too large");
    count *= uint64_t(d);
  }
  return count;
}

// Reads the values to the end of the file. The buffer grows with the data actually present, so
// a corrupt header cannot make this allocate more than the file holds.
std::vector<uint8_t> read_values(GzReader& file, const std::string& path, uint64_t expected) {
  std::vector<uint8_t> values;
  std::vector<uint8_t> chunk(1 << 16);
  for (;;) {
    const size_t n = file.read(chunk.data(), static_cast<unsigned>(chunk.size()));
    values.insert(values.end(), chunk.begin(), chunk.begin() + n);
    if (n == 0 || values.size() > expected) break;
  }
  check_file(values.size() <= expected, path, "more data than the ", expected,
             " values its dimensions describe");
  check_file(values.size() == expected, path, "holds ", values.size(), " values, its dimensions",
             " describe ", expected);
  return values;
}

} // namespace

IdxArray read_idx(const std::string& path) {
  GzReader file(path);
  std::array<uint8_t, 4> magic{};
  check_file(file.read(magic.data(), 4) == 4, path, "shorter than the 4-byte IDX magic");
  check_file(magic[0] == 0 && magic[1] == 0, path, "bad IDX magic (first two bytes not zero)");
  check_file(magic[2] == kU8Type, path, "IDX element type code ", int(magic[2]), " is not ",
             int(kU8Type), " (u8)");
  check_file(magic[3] >= 1 && magic[3] <= kMaxDims, path, "IDX rank ", int(magic[3]),
             " is not in 1..", kMaxDims);
  IdxArray array;
  array.dims = read_dims(file, path, magic[3]);
  array.values = read_values(file, path, count_values(path, array.dims));
  return array;
}

IdxImages read_idx_images(const std::string& path) {
  IdxArray array = read_idx(path);
  check_file(array.dims.size() == 3, path, "images need 3 dimensions [count, rows, cols], got ",
             array.dims.size());
  return {array.dims[0], array.dims[1], array.dims[2], std::move(array.values)};
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  IdxArray array = read_idx(path);
  check_file(array.dims.size() == 1, path, "labels need 1 dimension [count], got ",
             array.dims.size());
  return std::move(array.values);
}

} // namespace minamp::io
