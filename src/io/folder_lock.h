// An advisory lock on a folder a run writes into, so that two runs never mix their files there:
// DIR/.minamp.lock, locked with flock() and holding the holder's PID. The kernel drops the lock
// when its holder exits, however it ends, so a lock file left by a killed run is stale and taken
// over.
#pragma once

#include <string>

namespace minamp::io {

class FolderLock {
public:
  // Locks the existing folder `dir`. Throws Error "<what>: <dir> is in use by another minamp run
  // (PID n) ..." when another process holds it, or naming the reason when the lock file cannot
  // be made.
  FolderLock(const std::string& dir, const char* what);
  // Removes the lock file, then releases the lock.
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

  static constexpr const char* kFileName = ".minamp.lock";

private:
  std::string path_;
  int fd_ = -1;
};

} // namespace minamp::io
