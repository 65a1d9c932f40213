// libFuzzer's entry points for `make fuzz` (built only with clang and -DMINAMP_FUZZ=ON):
//   minamp_fuzz --target=NAME [libFuzzer flags] CORPUS_DIR...
// libFuzzer ignores flags that start with "--", so --target is read here and left to it.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "fuzz_targets.h"

namespace {
const minamp::fuzz::FuzzTarget* target = nullptr;
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* prefix = "--target=";
  for (int i = 1; i < *argc; ++i)
    if (std::strncmp((*argv)[i], prefix, std::strlen(prefix)) == 0) {
      try {
        target = &minamp::fuzz::fuzz_target((*argv)[i] + std::strlen(prefix));
      } catch (const minamp::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        std::exit(2);
      }
    }
  if (!target) {
    std::fprintf(stderr, "error: --target=NAME is required (see tests/fuzz/fuzz_targets.h)\n");
    std::exit(2);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  minamp::fuzz::fuzz_one_input(*target, data, size);
  return 0;
}
