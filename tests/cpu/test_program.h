// Helpers for tests that run the example programs as a user does: running a binary from the
// build directory with its output captured (or in the background, to signal it), fresh output
// directories, the JSON and CSV files a run writes, and the check that a run resumed from a
// training checkpoint ends exactly where the uninterrupted run does.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "io/atomic_file.h"

namespace minamp::test {

struct ProgramRun {
  int status;
  std::string output; // stdout and stderr together
};

// Runs an example binary from the build directory with `args`, capturing its output; `shell`
// comes first in the shell's command line (e.g. "ulimit -v 1000000;").
inline ProgramRun run_program(const std::string& name, const std::string& args,
                              const std::string& shell = "") {
  const std::string command =
      shell + " " + std::string(MINAMP_BINARY_DIR) + "/" + name + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> chunk;
  while (size_t n = fread(chunk.data(), 1, chunk.size(), pipe)) output.append(chunk.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// A refused run: non-zero status and one line, "error: ...", that contains every one of `parts`.
inline void expect_one_line_error(const ProgramRun& run, const std::string& args,
                                  const std::vector<std::string>& parts) {
  EXPECT_NE(run.status, 0) << args;
  EXPECT_EQ(run.output.rfind("error: ", 0), 0u) << args << ": " << run.output;
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1)
      << args << ": " << run.output;
  for (const std::string& part : parts)
    EXPECT_NE(run.output.find(part), std::string::npos) << args << ": " << run.output;
}

// A program started in the background, with stdout and stderr going to `output_path`.
struct BackgroundProgram {
  pid_t pid = -1;
  std::string output_path;
  // Its output so far.
  std::string output() const {
    std::ifstream in(output_path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Waits (up to a minute) until its output contains `text`; false if it exits or time runs out.
  bool wait_for_output(const std::string& text) const {
    for (int i = 0; i < 6000; ++i) {
      if (output().find(text) != std::string::npos) return true;
      siginfo_t info{};
      ::waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT); // it ended (still waitable)
      if (info.si_pid == pid) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // Waits for it to end and returns its wait status (WIFEXITED, WTERMSIG, ...).
  int wait() const {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return status;
  }
};

// Starts an example binary from the build directory with `args` (each one argument) in the
// background, with SIGINT and SIGTERM at their default action, as in a terminal.
inline BackgroundProgram start_program(const std::string& name,
                                       const std::vector<std::string>& args,
                                       const std::string& output_path) {
  const std::string binary = std::string(MINAMP_BINARY_DIR) + "/" + name;
  std::vector<char*> argv{const_cast<char*>(binary.c_str())};
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  BackgroundProgram program{::fork(), output_path};
  if (program.pid == 0) { // the child: only async-signal-safe calls until exec
    const int out = ::open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(out, 2);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  EXPECT_GT(program.pid, 0) << "fork failed";
  return program;
}

// Whether process `pid` catches `signal` (its handler is installed), from /proc/PID/status.
inline bool catches_signal(pid_t pid, int signal) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("SigCgt:", 0) == 0)
      return (std::stoull(line.substr(7), nullptr, 16) >> (signal - 1)) & 1;
  return false;
}

// The JSON file a run wrote, parsed; when it is missing or not JSON, a test failure naming it and
// an empty object, so that a failed run fails its test and never the whole test binary.
inline nlohmann::json read_output_json(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) {
    ADD_FAILURE() << "missing " << path;
    return nlohmann::json::object();
  }
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    ADD_FAILURE() << path << " is not JSON: " << e.what();
    return nlohmann::json::object();
  }
}

// object[key]; when `object` has no such key, a test failure naming it and a null (indexing a
// missing key of a const json aborts the process).
inline const nlohmann::json& field(const nlohmann::json& object, const std::string& key) {
  static const nlohmann::json missing;
  if (object.is_object() && object.contains(key)) return object.at(key);
  ADD_FAILURE() << "no '" << key << "' in " << object.dump();
  return missing;
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

// The lines of a CSV file with the columns in `drop` removed (e.g. the wall-clock ones).
inline std::vector<std::string> csv_without_columns(const std::string& path,
                                                    const std::vector<size_t>& drop) {
  std::istringstream in(io::read_file(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string kept;
    size_t column = 0;
    for (std::string field; std::getline(fields, field, ','); ++column)
      if (std::find(drop.begin(), drop.end(), column) == drop.end()) kept += field + ",";
    lines.push_back(kept);
  }
  return lines;
}
inline std::vector<std::string> csv_without_column(const std::string& path, size_t drop) {
  return csv_without_columns(path, {drop});
}

// Expects a failed run with exactly one error line, "error: ...", containing each of `fragments`
// (lines of progress may come before it; stderr reaches the pipe before buffered stdout, so the
// line's position is not checked).
inline void expect_error_line(const ProgramRun& run, const std::vector<std::string>& fragments) {
  EXPECT_NE(run.status, 0) << run.output;
  std::istringstream lines(run.output);
  std::vector<std::string> errors;
  for (std::string line; std::getline(lines, line);)
    if (line.find("error") != std::string::npos) errors.push_back(line);
  ASSERT_EQ(errors.size(), 1u) << run.output;
  EXPECT_EQ(errors[0].rfind("error: ", 0), 0u) << run.output;
  for (const std::string& f : fragments)
    EXPECT_NE(errors[0].find(f), std::string::npos) << f << "\n" << run.output;
}

// Runs `program args` uninterrupted with --checkpoint-every `at` (the run must be shorter than
// 2 * at, so that the checkpoint left behind is the one at step `at`), then resumes a second run
// from that checkpoint. Both must end with the same bytes in final.safetensors, the same losses,
// scales and skips in metrics.csv and (when written) the same epochs.csv, wall times, speeds and
// peak memory aside (a resumed process makes its f16 weight copies anew, in its first epoch); the
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
    // epoch,train_loss,train_accuracy,test_loss,test_accuracy,wall_s,images_per_s,peak_mib
    EXPECT_EQ(csv_without_columns(whole + "/epochs.csv", {5, 6, 7}),
              csv_without_columns(resumed + "/epochs.csv", {5, 6, 7}));
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
  const nlohmann::json summary = read_output_json(resumed + "/summary.json");
  EXPECT_GE(field(summary, "wall_s").get<double>(), last_wall_s * (1 - 1e-5)) << name;
  return whole;
}

} // namespace minamp::test
