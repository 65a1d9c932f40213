// Helpers for the io tests: a fresh temp directory per test, raw file writes, and corruption
// fuzzing (random truncations and bit flips of a valid file, each of which must either load or
// throw minamp::Error naming the file — never crash or throw anything else).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"

namespace minamp::test {

// A new empty directory under the system temp dir, removed with its contents on destruction.
class TempDir {
public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "minamp-io-XXXXXX").string();
    require(::mkdtemp(pattern.data()) != nullptr, "TempDir", "mkdtemp failed for ", pattern);
    root_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(root_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& root() const { return root_; }
  std::string path(const std::string& name) const { return root_ + "/" + name; }

private:
  std::string root_;
};

// Writes a new file (removing any old one first: ext4 flushes a file truncated and rewritten in
// place to disk on close, which makes the fuzz loops below wait on the disk).
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::filesystem::remove(path);
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// A copy of the safetensors file at `path` with `edit` applied to its entries (tensors, int64s),
// written to `out`.
template <class Edit>
void rewrite_safetensors(const std::string& path, const std::string& out, Edit edit) {
  io::SafetensorsFile file = io::load_safetensors(path);
  edit(file.tensors, file.int64s);
  io::save_safetensors(out, file.tensors, file.metadata, file.int64s);
}

// How a loader fared on a set of corrupted files.
struct FuzzCounts {
  int loaded = 0;
  int rejected = 0;
};

// Writes `bytes` to `path` and calls load(path): counts a load or an Error whose message names
// `path`; any other outcome fails the test.
template <class Load>
void load_or_reject(const std::string& path, const std::string& bytes, Load load,
                    FuzzCounts& counts) {
  write_bytes(path, bytes);
  try {
    load(path);
    ++counts.loaded;
  } catch (const Error& e) {
    ++counts.rejected;
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos)
        << "error does not name the file: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a minamp::Error: " << e.what();
  }
}

// Every strict prefix of `valid` (or `count` random ones when there are more), fed to `load`.
template <class Load>
FuzzCounts fuzz_truncations(const std::string& valid, const std::string& path, Load load, Rng& rng,
                            size_t count) {
  FuzzCounts counts;
  const bool every_length = valid.size() <= count;
  for (size_t i = 0; i < (every_length ? valid.size() : count); ++i) {
    const size_t length = every_length ? i : rng.below(uint32_t(valid.size()));
    load_or_reject(path, valid.substr(0, length), load, counts);
  }
  return counts;
}

// `count` copies of `valid` with 1 to 3 random bits flipped, half of them within the first
// `hot_bytes` (the header, where flips matter most), fed to `load`.
template <class Load>
FuzzCounts fuzz_bit_flips(const std::string& valid, const std::string& path, Load load, Rng& rng,
                          int count, size_t hot_bytes) {
  FuzzCounts counts;
  for (int i = 0; i < count; ++i) {
    std::string bytes = valid;
    const size_t range = (i % 2 == 0) ? std::min(hot_bytes, bytes.size()) : bytes.size();
    const int flips = 1 + int(rng.below(3));
    for (int f = 0; f < flips; ++f) bytes[rng.below(uint32_t(range))] ^= char(1u << rng.below(8));
    load_or_reject(path, bytes, load, counts);
  }
  return counts;
}

} // namespace minamp::test
