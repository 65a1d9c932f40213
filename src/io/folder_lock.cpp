// FolderLock: flock() on DIR/.minamp.lock, with the PID of the holder written into the file.
#include "io/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace minamp::io {

namespace {

// The PID a lock file holds, or "" when it holds none yet (its holder writes it after locking).
std::string pid_in(int fd) {
  char text[32] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string pid(text, n > 0 ? size_t(n) : 0);
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid;
}

// Whether `fd` is still the file at `path` (its previous holder may have removed it between our
// open() and flock(), and a third run may have made a new one there since).
bool still_at(int fd, const std::string& path) {
  struct stat open_file {
  }, named_file{};
  return ::fstat(fd, &open_file) == 0 && ::stat(path.c_str(), &named_file) == 0 &&
         open_file.st_dev == named_file.st_dev && open_file.st_ino == named_file.st_ino;
}

} // namespace

FolderLock::FolderLock(const std::string& dir, const char* what) : path_(dir + "/" + kFileName) {
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    require(fd_ >= 0, what, dir, ": cannot create its lock file ", kFileName, " (",
            std::strerror(errno), ")");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      const std::string pid = pid_in(fd_);
      ::close(fd_);
      require(error == EWOULDBLOCK, what, dir, ": cannot lock it (", std::strerror(error), ")");
      throw Error(cat(what, ": ", dir, " is in use by another minamp run",
                      pid.empty() ? std::string() : cat(" (PID ", pid, ")"),
                      ": wait for it to finish, or write elsewhere"));
    }
    if (still_at(fd_, path_)) break;
    ::close(fd_);
  }
  // Without its PID the lock still holds; a run refused by it then names no PID.
  const std::string pid = cat(::getpid(), "\n");
  const bool noted = ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) > 0;
  (void)noted;
}

FolderLock::~FolderLock() {
  ::unlink(path_.c_str());
  ::close(fd_);
}

} // namespace minamp::io
