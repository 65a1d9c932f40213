// Reads of regular files opened without blocking, and atomic whole-file writes through a temp
// file, fsync and rename (POSIX).
#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace minamp::io {

namespace {

std::string errno_text() { return std::strerror(errno); }

// What a file that is not a regular one is, for messages: "a FIFO", "a directory", ...
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

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

// The start of the temp files' names for the file `name`: "<name>.tmp.", with `name` cut so that
// the six characters mkstemp adds keep it within a file name's 255 bytes.
std::string temp_prefix(const std::string& name) {
  constexpr size_t kNameMax = 255, kSuffix = sizeof(".tmp.XXXXXX") - 1;
  return name.substr(0, kNameMax - kSuffix) + ".tmp.";
}

// Creates the empty file "<path>.tmp.XXXXXX" (temp_prefix) and returns its descriptor, with its
// name in `temp_path`; throws Error naming `op` and `path` when it cannot.
int create_temp_next_to(const std::string& path, const char* op, std::string& temp_path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  temp_path = dir + temp_prefix(path.substr(dir.size())) + "XXXXXX";
  std::vector<char> temp_name(temp_path.begin(), temp_path.end());
  temp_name.push_back('\0');
  const int fd = ::mkstemp(temp_name.data());
  if (fd < 0) {
    const int error = errno;
    struct stat info {}; // ENOENT also where the folder exists but holds no new file (/proc)
    require(error != ENOENT || ::stat(dir.empty() ? "." : dir.c_str(), &info) == 0, op, path,
            ": its folder does not exist");
    throw Error(
        cat(op, ": ", path, ": cannot create a temp file next to it (", std::strerror(error), ")"));
  }
  temp_path = temp_name.data();
  return fd;
}

// Whether `entry` is temp_prefix(name) followed by the six characters mkstemp puts there.
bool is_temp_file_of(const std::string& entry, const std::string& name) {
  const std::string prefix = temp_prefix(name);
  return entry.size() == prefix.size() + 6 && entry.compare(0, prefix.size(), prefix) == 0;
}

} // namespace

int open_regular_file(const std::string& path, const char* op) {
  // Checked before opening (opening a device can act on it), and again on what was opened (the
  // path may have changed in between). O_NONBLOCK: open() of a FIFO without a writer would
  // otherwise wait for one forever.
  struct stat info {};
  const bool regular_or_missing = ::stat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode);
  require(regular_or_missing, op, path, ": not a regular file (", file_kind(info.st_mode), ")");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  require(fd >= 0, op, path, ": cannot open (", errno_text(), ")");
  const bool known = ::fstat(fd, &info) == 0;
  if (!known || !S_ISREG(info.st_mode)) {
    const std::string reason =
        known ? cat("not a regular file (", file_kind(info.st_mode), ")") : errno_text();
    ::close(fd);
    throw Error(cat(op, ": ", path, ": ", reason));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK); // reads of a regular file block
  return fd;
}

std::string read_file(const std::string& path) {
  const int fd = open_regular_file(path, "read_file");
  std::string contents;
  std::vector<char> chunk(1 << 16);
  for (;;) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason = n < 0 ? errno_text() : std::string();
      ::close(fd);
      require(n == 0, "read_file", path, ": read error (", reason, ")");
      return contents;
    }
    contents.append(chunk.data(), static_cast<size_t>(n));
  }
}

void require_replaceable(const std::string& path, const char* what) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0 || S_ISREG(info.st_mode)) return;
  const bool link = S_ISLNK(info.st_mode);
  throw Error(cat(what, ": ", path, ": exists and is ", file_kind(info.st_mode),
                  ", not a regular file: ",
                  link ? "replacing it would replace the link, not its target"
                       : "minamp replaces only regular files"));
}

void require_writable(const std::string& path, const char* what) {
  require_replaceable(path, what);
  std::string temp_path;
  ::close(create_temp_next_to(path, what, temp_path));
  ::unlink(temp_path.c_str());
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  require_replaceable(path, "write_file_atomically");
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

void remove_stale_temp_files(const std::string& dir, const std::string& name) {
  DIR* listing = ::opendir(dir.c_str());
  if (!listing) return;
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(listing))
    if (is_temp_file_of(entry->d_name, name)) stale.push_back(dir + "/" + entry->d_name);
  ::closedir(listing);
  for (const std::string& path : stale) {
    struct stat info {};
    if (::lstat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode)) ::unlink(path.c_str());
  }
}

} // namespace minamp::io
