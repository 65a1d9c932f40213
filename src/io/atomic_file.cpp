// Whole-file reads, and atomic whole-file writes through a temp file, fsync and rename (POSIX).
#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace minamp::io {

namespace {

std::string errno_text() { return std::strerror(errno); }

// Writes all of `bytes` to `fd`, retrying short writes; false on an error.
bool write_all(int fd, const std::string& bytes) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    written += static_cast<size_t>(n);
  }
  return true;
}

// Removes the half-written temp file and reports why writing `path` failed.
[[noreturn]] void discard_and_throw(const std::string& temp_path, const std::string& path,
                                    const std::string& reason) {
  std::remove(temp_path.c_str());
  throw Error(cat("write_file_atomically: ", path, ": write failed (", reason, ")"));
}

} // namespace

std::string read_file(const std::string& path) {
  struct stat info {};
  const bool exists = ::stat(path.c_str(), &info) == 0; // before errno_text() reads errno
  require(exists, "read_file", path, ": cannot open (", errno_text(), ")");
  require(S_ISREG(info.st_mode), "read_file", path, ": not a regular file");
  std::ifstream in(path, std::ios::binary);
  require(in.good(), "read_file", path, ": cannot open for reading");
  std::ostringstream contents;
  contents << in.rdbuf();
  require(!in.bad(), "read_file", path, ": read error");
  return contents.str();
}

namespace {
// Creates the empty file "<path>.tmp.XXXXXX" and returns its descriptor, with its name in
// `temp_path`; throws Error naming `op` and `path` when it cannot.
int create_temp_next_to(const std::string& path, const char* op, std::string& temp_path) {
  temp_path = path + ".tmp.XXXXXX";
  std::vector<char> temp_name(temp_path.begin(), temp_path.end());
  temp_name.push_back('\0');
  const int fd = ::mkstemp(temp_name.data());
  if (fd < 0 && errno == ENOENT) throw Error(cat(op, ": ", path, ": its folder does not exist"));
  require(fd >= 0, op, path, ": cannot create a temp file next to it (", errno_text(), ")");
  temp_path = temp_name.data();
  return fd;
}
} // namespace

void require_writable(const std::string& path, const char* what) {
  struct stat info {};
  const bool is_directory = ::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
  require(!is_directory, what, path, ": is a directory");
  std::string temp_path;
  ::close(create_temp_next_to(path, what, temp_path));
  ::unlink(temp_path.c_str());
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  std::string temp_path;
  const int fd = create_temp_next_to(path, "write_file_atomically", temp_path);
  if (::fchmod(fd, 0644) != 0 || !write_all(fd, bytes) || ::fsync(fd) != 0) {
    const std::string reason = errno_text();
    ::close(fd);
    discard_and_throw(temp_path, path, reason);
  }
  if (::close(fd) != 0) discard_and_throw(temp_path, path, errno_text());
  if (::rename(temp_path.c_str(), path.c_str()) != 0)
    discard_and_throw(temp_path, path, errno_text());
}

} // namespace minamp::io
