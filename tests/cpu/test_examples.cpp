// The example programs as a user meets them: --help, bad flags, devices, and what a run writes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/allocator.h"

namespace {

struct ProgramRun {
  int status;
  std::string output; // stdout and stderr together
};

// Runs an example binary from the build directory with `args`, capturing its output.
ProgramRun run_example(const std::string& name, const std::string& args) {
  const std::string command = std::string(MINAMP_BINARY_DIR) + "/" + name + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> chunk;
  while (size_t n = fread(chunk.data(), 1, chunk.size(), pipe)) output.append(chunk.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "minamp_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(Examples, HelpListsTheCommonOptions) {
  for (const char* name : {"mlp", "sine"}) {
    const ProgramRun run = run_example(name, "--help");
    EXPECT_EQ(run.status, 0) << name;
    for (const char* option : {"--device", "--seed", "--lr", "--out", "--amp", "--compare",
                               "--init-scale", "--growth-interval", "--no-loss-scaling"})
      EXPECT_NE(run.output.find(option), std::string::npos) << name << " --help lacks " << option;
  }
}

TEST(Examples, UnknownFlagIsAUsageErrorNamingIt) {
  const ProgramRun run = run_example("mlp", "--bogus-flag");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--bogus-flag"), std::string::npos) << run.output;
}

TEST(Examples, BadValuesAreOneLineErrors) {
  ProgramRun run = run_example("mlp", "--widths 16,x --out " + fresh_dir("bad_widths"));
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--widths"), std::string::npos) << run.output;
  run = run_example("sine", "--device tpu");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--device"), std::string::npos) << run.output;
}

TEST(Examples, CudaWithoutAGpuSaysWhy) {
  if (minamp::cuda_available()) GTEST_SKIP() << "a GPU is present";
  const ProgramRun run =
      run_example("mlp", "--device cuda --epochs 1 --out " + fresh_dir("nocuda"));
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find(minamp::cuda_unavailable_reason()), std::string::npos) << run.output;
}

TEST(Examples, SineWritesMetricsSummaryAndImage) {
  const std::string out = fresh_dir("sine");
  const ProgramRun run = run_example("sine", "--size 8 --hidden 8 --steps 6 --amp --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  std::ifstream csv(out + "/metrics.csv");
  std::string header, line;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,loss,wall_s,scale,skipped");
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 6);
  const nlohmann::json summary = nlohmann::json::parse(std::ifstream(out + "/summary.json"));
  for (const char* key : {"example", "device", "precision", "steps", "final_loss", "wall_s",
                          "peak_bytes", "skipped_steps", "final_scale"})
    EXPECT_TRUE(summary.contains(key)) << key;
  EXPECT_EQ(summary["precision"], "amp");
  EXPECT_EQ(summary["steps"], 6);
  EXPECT_GT(summary["peak_bytes"].get<double>(), 0);
  EXPECT_TRUE(std::filesystem::exists(out + "/sine.png"));
}

TEST(Examples, MlpLossFallsAndCompareWritesBothRuns) {
  const std::string out = fresh_dir("mlp");
  const ProgramRun run = run_example("mlp", "--compare --epochs 4 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("memory saved"), std::string::npos) << run.output;
  for (const char* precision : {"fp32", "amp"}) {
    std::ifstream csv(out + "/" + precision + "/metrics.csv");
    std::string line;
    std::getline(csv, line);
    std::vector<double> losses;
    while (std::getline(csv, line)) losses.push_back(std::stod(line.substr(line.find(',') + 1)));
    ASSERT_EQ(losses.size(), 200u);
    // Epoch means (the 50 batches differ), first vs last.
    double first = 0, last = 0;
    for (int i = 0; i < 50; ++i) first += losses[i], last += losses[150 + i];
    EXPECT_LT(last, first) << precision;
  }
}

} // namespace
