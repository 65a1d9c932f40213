// The fuzz targets without libFuzzer, in every build:
//   minamp_fuzz_replay                          each target's seeds must load (ctest fuzz.seeds)
//   minamp_fuzz_replay --target NAME PATH...    replays files (a folder: every file in it) as
//                                               the fuzzer would (ctest fuzz.regressions)
//   minamp_fuzz_replay --write-seeds DIR        DIR/<target>/seed-<i>, the corpus `make fuzz`
//                                               starts from
//   minamp_fuzz_replay --list                   the targets' names, one per line
// A replayed input may load or be refused with minamp::Error; anything else aborts.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "fuzz_targets.h"
#include "io/atomic_file.h"

namespace fs = std::filesystem;
using minamp::fuzz::FuzzTarget;

namespace {

// Every seed must load: a refused seed means the target no longer reads what minamp writes.
int check_seeds() {
  int failures = 0;
  for (const FuzzTarget& target : minamp::fuzz::fuzz_targets()) {
    const std::vector<std::string> seeds = target.seeds();
    for (size_t i = 0; i < seeds.size(); ++i) {
      const std::string path =
          (fs::temp_directory_path() /
           ("minamp-fuzz-seed-" + std::to_string(::getpid()) + target.extension))
              .string();
      minamp::io::write_file_atomically(path, seeds[i]);
      try {
        target.load(path);
      } catch (const minamp::Error& e) {
        std::printf("FAIL %s seed %zu is refused: %s\n", target.name, i, e.what());
        ++failures;
      }
      fs::remove(path);
    }
    std::printf("%s: %zu seeds\n", target.name, seeds.size());
  }
  return failures == 0 ? 0 : 1;
}

void write_seeds(const std::string& dir) {
  for (const FuzzTarget& target : minamp::fuzz::fuzz_targets()) {
    const fs::path folder = fs::path(dir) / target.name;
    fs::create_directories(folder);
    const std::vector<std::string> seeds = target.seeds();
    for (size_t i = 0; i < seeds.size(); ++i)
      minamp::io::write_file_atomically((folder / ("seed-" + std::to_string(i))).string(),
                                        seeds[i]);
    std::printf("%s: %zu seeds in %s\n", target.name, seeds.size(), folder.c_str());
  }
}

// The files at `paths` (folders expanded to their regular files, sorted), replayed in order.
void replay(const FuzzTarget& target, const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& path : paths) {
    minamp::require(fs::exists(path), "minamp_fuzz_replay", "no file or folder ", path);
    if (!fs::is_directory(path)) {
      files.push_back(path);
      continue;
    }
    for (const fs::directory_entry& entry : fs::directory_iterator(path))
      if (entry.is_regular_file()) files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& file : files) {
    const std::string bytes = minamp::io::read_file(file);
    minamp::fuzz::fuzz_one_input(target, reinterpret_cast<const uint8_t*>(bytes.data()),
                                 bytes.size());
  }
  std::printf("%s: %zu inputs replayed\n", target.name, files.size());
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"minamp_fuzz_replay: the fuzz targets' seeds checked, or inputs replayed"};
  std::string target, seeds_dir;
  std::vector<std::string> paths;
  bool list = false;
  app.add_option("--target", target, "the target to replay PATHs through");
  app.add_option("--write-seeds", seeds_dir, "write every target's seeds under this folder");
  app.add_option("paths", paths, "inputs to replay (files, or folders of them)");
  app.add_flag("--list", list, "print the targets' names, one per line");
  CLI11_PARSE(app, argc, argv);
  try {
    if (list) {
      for (const FuzzTarget& t : minamp::fuzz::fuzz_targets()) std::printf("%s\n", t.name);
      return 0;
    }
    if (!seeds_dir.empty()) {
      write_seeds(seeds_dir);
      return 0;
    }
    if (paths.empty()) return check_seeds();
    minamp::require(!target.empty(), "minamp_fuzz_replay", "--target is required with PATHs");
    replay(minamp::fuzz::fuzz_target(target), paths);
    return 0;
  } catch (const minamp::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
