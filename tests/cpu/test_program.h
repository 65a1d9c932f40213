// Helpers for tests that run the example programs as a user does: running a binary from the
// build directory with its output captured, fresh output directories, CSV columns, and the check
// that a run resumed from a training checkpoint ends exactly where the uninterrupted run does.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "io/atomic_file.h"

namespace minamp::test {

struct ProgramRun {
  int status;
  std::string output; // stdout and stderr together
};

// Runs an example binary from the build directory with `args`, capturing its output.
inline ProgramRun run_program(const std::string& name, const std::string& args) {
  const std::string command = std::string(MINAMP_BINARY_DIR) + "/" + name + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> chunk;
  while (size_t n = fread(chunk.data(), 1, chunk.size(), pipe)) output.append(chunk.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// The temp folder of this test process, removed when the process exits. ctest runs every test
// in a process of its own and runs them in parallel, GpuExamples.* beside emulated.GpuExamples.*
// (the same test, the same names): a folder per process keeps them apart.
class ProcessTempDir {
public:
  ProcessTempDir() : path_(::testing::TempDir() + "minamp_" + std::to_string(::getpid())) {
    std::filesystem::remove_all(path_); // left by a crashed process with the same id
    std::filesystem::create_directories(path_);
  }
  ~ProcessTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ProcessTempDir(const ProcessTempDir&) = delete;
  ProcessTempDir& operator=(const ProcessTempDir&) = delete;
  const std::string& path() const { return path_; }

private:
  std::string path_;
};

// A path for `name` in this process's temp folder (tests in one process use different names).
inline std::string temp_path(const std::string& name) {
  static const ProcessTempDir dir;
  return dir.path() + "/" + name;
}

// temp_path(name), removed first if it exists.
inline std::string fresh_dir(const std::string& name) {
  const std::string dir = temp_path(name);
  std::filesystem::remove_all(dir);
  return dir;
}

// The rows of a numeric CSV file after its header, each row's fields as numbers.
inline std::vector<std::vector<double>> csv_rows(const std::string& path) {
  std::istringstream in(io::read_file(path));
  std::string line;
  std::getline(in, line);
  std::vector<std::vector<double>> rows;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<double> row;
    for (std::string field; std::getline(fields, field, ',');) row.push_back(std::stod(field));
    rows.push_back(row);
  }
  return rows;
}

// The lines of a CSV file with column `drop` removed (e.g. a wall-clock column).
inline std::vector<std::string> csv_without_column(const std::string& path, size_t drop) {
  std::istringstream in(io::read_file(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string kept;
    size_t column = 0;
    for (std::string field; std::getline(fields, field, ','); ++column)
      if (column != drop) kept += field + ",";
    lines.push_back(kept);
  }
  return lines;
}

// Runs `program args` uninterrupted with --checkpoint-every `at` (the run must be shorter than
// 2 * at, so that the checkpoint left behind is the one at step `at`), then resumes a second run
// from that checkpoint. Both must end with the same bytes in final.safetensors, the same losses,
// scales and skips in metrics.csv and (when written) the same epochs.csv, wall times aside; the
// resumed run's summary counts the training time before the checkpoint too, as its metrics do.
// Returns the uninterrupted run's output directory.
inline std::string expect_resume_equals_uninterrupted(const std::string& program,
                                                      const std::string& args, int at,
                                                      const std::string& name) {
  const std::string whole = fresh_dir(name + "_whole"), resumed = fresh_dir(name + "_resumed");
  const std::string checkpoint = fresh_dir(name + ".safetensors");
  const std::string every = " --checkpoint-every " + std::to_string(at);
  ProgramRun run = run_program(program, args + every + " --out " + whole + " --save-weights " +
                                            whole + "/weights");
  EXPECT_EQ(run.status, 0) << run.output;
  std::filesystem::copy_file(whole + "/checkpoint.safetensors", checkpoint);
  run = run_program(program, args + every + " --out " + resumed + " --resume " + checkpoint +
                                 " --save-weights " + resumed + "/weights");
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_FALSE(std::filesystem::exists(resumed + "/weights/init.safetensors"))
      << "a resumed run does not start from initial weights";
  EXPECT_EQ(io::read_file(whole + "/weights/final.safetensors"),
            io::read_file(resumed + "/weights/final.safetensors"))
      << name << ": resumed at step " << at << ", the final weights differ";
  EXPECT_EQ(csv_without_column(whole + "/metrics.csv", 2),
            csv_without_column(resumed + "/metrics.csv", 2));
  if (std::filesystem::exists(whole + "/epochs.csv")) {
    EXPECT_EQ(csv_without_column(whole + "/epochs.csv", 5),
              csv_without_column(resumed + "/epochs.csv", 5));
  }
  // The resumed run's clock goes on from the checkpoint's: wall_s never falls.
  const std::vector<std::vector<double>> steps = csv_rows(resumed + "/metrics.csv");
  for (size_t i = 1; i < steps.size(); ++i)
    EXPECT_GE(steps[i].at(2), steps[i - 1].at(2)) << name << ": metrics.csv row " << i;
  if (std::filesystem::exists(whole + "/epochs.csv")) {
    const std::vector<std::vector<double>> epochs = csv_rows(resumed + "/epochs.csv");
    for (size_t i = 1; i < epochs.size(); ++i)
      EXPECT_GE(epochs[i].at(5), epochs[i - 1].at(5)) << name << ": epochs.csv row " << i;
  }
  const double last_wall_s = steps.back().at(2); // step,loss,wall_s
  const double summary_wall_s =
      nlohmann::json::parse(io::read_file(resumed + "/summary.json"))["wall_s"];
  EXPECT_GE(summary_wall_s, last_wall_s * (1 - 1e-5)) << name;
  return whole;
}

} // namespace minamp::test
