// Whole-file I/O shared by the loaders and writers of io/: reading a file into memory, and
// writing one atomically (a temp file in the same directory, then rename), so that a crash
// mid-write leaves the previous file intact.
#pragma once

#include <string>

namespace minamp::io {

// The bytes of the file at `path`; throws Error naming the file when it cannot be read.
std::string read_file(const std::string& path);

// Replaces the file at `path` with `bytes`: writes "<path>.tmp.XXXXXX" next to it, flushes it
// to disk and renames it over `path` (mode 0644, as a plain write under the usual umask gives,
// not the temp file's 0600). Throws Error naming the file on any failure, after
// removing the temp file; the previous file at `path`, if any, is then untouched.
void write_file_atomically(const std::string& path, const std::string& bytes);

// Throws Error naming `what` (e.g. "--json") and `path` when write_file_atomically(path, ...)
// could not create its temp file there (checked by creating and removing one), or `path` is a
// directory: a long run that writes its results at the end fails before it starts instead.
void require_writable(const std::string& path, const char* what);

} // namespace minamp::io
