// Whole-file I/O shared by the loaders and writers of io/: opening and reading an input file
// (regular files only, opened without blocking), and writing one atomically (a temp file in the
// same directory, then rename), so that a crash mid-write leaves the previous file intact.
#pragma once

#include <string>

namespace minamp::io {

// Opens the regular file at `path` for reading and returns its descriptor (the caller closes
// it). The file is checked with stat before it is opened, opened without blocking, and checked
// again with fstat, so a FIFO or a device is refused at once, never opened, and never hangs
// open() or read(). Throws Error "<op>: <path>: ..." naming the reason (missing, not a regular
// file, unreadable).
int open_regular_file(const std::string& path, const char* op);

// The bytes of the regular file at `path`; throws Error naming the file when it cannot be read.
std::string read_file(const std::string& path);

// Replaces the file at `path` with `bytes`: writes "<path>.tmp.XXXXXX" next to it, flushes it
// to disk and renames it over `path` (mode 0644, as a plain write under the usual umask gives,
// not the temp file's 0600). Only a regular file is replaced: a `path` that exists as anything
// else (a device such as /dev/null, a FIFO, a symbolic link, a directory) is refused. Throws
// Error naming the file on any failure, after removing the temp file; the previous file at
// `path`, if any, is then untouched.
void write_file_atomically(const std::string& path, const std::string& bytes);

// Throws Error naming `what` (e.g. "--json") and `path` when write_file_atomically(path, ...)
// would refuse `path` (it exists and is not a regular file) or could not create its temp file
// there (checked by creating and removing one): a long run that writes its results at the end
// fails before it starts instead.
void require_writable(const std::string& path, const char* what);

// Throws Error "<what>: <path>: exists and is <kind>, not a regular file ..." unless `path` is
// absent or a regular file (not followed when it is a symbolic link).
void require_replaceable(const std::string& path, const char* what);

// Removes the temp files that write_file_atomically(dir + "/" + name, ...) left behind when its
// process was killed mid-write ("<name>.tmp." and six characters, regular files only). Call it
// only on a folder no other process writes (one this process holds locked).
void remove_stale_temp_files(const std::string& dir, const std::string& name);

} // namespace minamp::io
