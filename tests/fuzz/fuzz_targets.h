// The file loaders minamp fuzzes. Each target hands a fuzzer's bytes to one of minamp's loaders as
// a file, and has valid files to start from. A loader may accept the bytes or throw minamp::Error;
// anything else (another exception, a crash, a sanitizer report) is a finding. Used by
// fuzz_main.cpp (libFuzzer, `make fuzz`) and fuzz_replay.cpp (every build: the seeds and the
// inputs that once failed, as ctest fuzz.*).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace minamp::fuzz {

struct FuzzTarget {
  const char* name;
  const char* extension;                 // the file name's ending the loader is given
  void (*load)(const std::string& path); // throws minamp::Error for input it refuses
  std::vector<std::string> (*seeds)();   // valid files' bytes
};

// safetensors, checkpoint, idx, csv, image.
const std::vector<FuzzTarget>& fuzz_targets();

// The target called `name`; throws Error listing the targets when there is none.
const FuzzTarget& fuzz_target(const std::string& name);

// Writes the bytes to this process's input file for `target` and loads it. Returns when the
// loader accepts them or throws minamp::Error; prints the exception and aborts on any other.
void fuzz_one_input(const FuzzTarget& target, const uint8_t* data, size_t size);

} // namespace minamp::fuzz
