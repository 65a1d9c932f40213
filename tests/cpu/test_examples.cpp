// The example programs as a user meets them: --help, bad flags, devices, what a run writes,
// weights in and out, the op profile, and resuming from a training checkpoint bit for bit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "amp/autocast.h"
#include "autograd/var.h"
#include "core/allocator.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "nn/module.h"
#include "sine_data.h"
#include "test_program.h"

namespace {

using minamp::test::expect_one_line_error;
using minamp::test::fresh_dir;
using minamp::test::ProgramRun;
using minamp::test::run_program;

// The loss column of a run's metrics.csv (step,loss,...): one value per step.
std::vector<double> losses_in(const std::string& metrics_csv) {
  std::ifstream csv(metrics_csv);
  std::string line;
  std::getline(csv, line); // the header
  std::vector<double> losses;
  while (std::getline(csv, line)) losses.push_back(std::stod(line.substr(line.find(',') + 1)));
  return losses;
}

TEST(Examples, HelpListsTheCommonOptions) {
  for (const char* name : {"mlp", "sine", "classify"}) {
    const ProgramRun run = run_program(name, "--help");
    EXPECT_EQ(run.status, 0) << name;
    for (const char* option :
         {"--device", "--seed", "--lr", "--out", "--amp", "--compare", "--profile", "--init-scale",
          "--growth-interval", "--no-loss-scaling", "--save-weights", "--load-weights",
          "--checkpoint-every", "--resume"})
      EXPECT_NE(run.output.find(option), std::string::npos) << name << " --help lacks " << option;
    // The default learning rate: 1e-3 for all three (Adam for sine and classify, SGD for mlp).
    EXPECT_NE(run.output.find("--lr FLOAT=0.001 "), std::string::npos)
        << name << ": " << run.output;
  }
}

TEST(Examples, UnknownFlagIsAUsageErrorNamingIt) {
  const ProgramRun run = run_program("mlp", "--bogus-flag");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--bogus-flag"), std::string::npos) << run.output;
}

// MINAMP_GEMM_VERSION, MINAMP_GEMM_PERSISTENT (kernels/gemm_version.h) and MINAMP_FUSION
// (nn/module.h) are read before anything is written: an unknown value is a one-line error naming
// the variable, on every backend and in every program, and leaves no output folder.
TEST(Examples, UnknownEnvironmentSettingsAreRefusedBeforeAnythingIsWritten) {
  std::string out = fresh_dir("bad_gemm_version");
  ProgramRun run = run_program("mlp", "--epochs 1 --out " + out, "MINAMP_GEMM_VERSION=v9");
  expect_one_line_error(run, "MINAMP_GEMM_VERSION=v9",
                        {"MINAMP_GEMM_VERSION", "expected auto, v1, v2, v3, v4 or v5, got 'v9'"});
  EXPECT_FALSE(std::filesystem::exists(out)) << out;
  out = fresh_dir("bad_gemm_persistent");
  run = run_program("mlp", "--epochs 1 --out " + out, "MINAMP_GEMM_PERSISTENT=yes");
  expect_one_line_error(run, "MINAMP_GEMM_PERSISTENT=yes",
                        {"MINAMP_GEMM_PERSISTENT", "expected 0 or 1, got 'yes'"});
  EXPECT_FALSE(std::filesystem::exists(out)) << out;
  // MINAMP_FUSION matters only where a batch norm runs on CUDA, but is read first everywhere.
  out = fresh_dir("bad_fusion");
  run = run_program("sine",
                    "--size 4 --hidden 2 --steps 1 --out " + out + " --save-weights " + out + "/w",
                    "MINAMP_FUSION=2");
  expect_one_line_error(run, "MINAMP_FUSION=2", {"MINAMP_FUSION", "expected 0 or 1, got '2'"});
  EXPECT_FALSE(std::filesystem::exists(out)) << out;
  run = run_program("minimal_amp", "--steps 1", "MINAMP_GEMM_VERSION=v9");
  expect_one_line_error(run, "minimal_amp", {"MINAMP_GEMM_VERSION", "got 'v9'"});
  // Also where no GEMM runs: plot_metrics, and bench_gemm's --kernels and the check for a GPU.
  out = fresh_dir("bad_fusion_plot");
  std::filesystem::create_directories(out);
  minamp::io::write_file_atomically(out + "/metrics.csv", "step,loss\n1,0.5\n2,0.25\n");
  run =
      run_program("plot_metrics", out + "/metrics.csv --out " + out + "/p.png", "MINAMP_FUSION=2");
  expect_one_line_error(run, "plot_metrics", {"MINAMP_FUSION", "got '2'"});
  EXPECT_FALSE(std::filesystem::exists(out + "/p.png"));
  if (std::filesystem::exists(std::string(MINAMP_BINARY_DIR) + "/bench_gemm"))
    for (const char* args : {"--kernels", "--shapes tiny"}) {
      run = run_program("bench_gemm", args, "MINAMP_GEMM_PERSISTENT=x");
      EXPECT_NE(run.status, 0) << args;
      EXPECT_EQ(run.output.rfind("bench_gemm: error: MINAMP_GEMM_PERSISTENT", 0), 0u)
          << args << ": " << run.output;
      EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << args << run.output;
    }
}

TEST(Examples, BadValuesAreOneLineErrors) {
  ProgramRun run = run_program("mlp", "--widths 16,x --out " + fresh_dir("bad_widths"));
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--widths"), std::string::npos) << run.output;
  run = run_program("sine", "--device tpu");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--device"), std::string::npos) << run.output;
  // Counts past their limits (which would overflow a step count or exhaust memory) and values
  // that would wrap or poison training are refused before anything is written.
  const std::string out = fresh_dir("bad_values");
  const std::pair<const char*, std::vector<std::string>> cases[] = {
      {"--epochs 0", {"--epochs", "expected an integer from 1 to 1000000000, got 0"}},
      {"--batch-size 1e3", {"--batch-size", "expected an integer from 1 to 16777216, got 1e3"}},
      {"--epochs 1.5", {"--epochs", "got 1.5"}},
      {"--epochs 0x10", {"--epochs", "got 0x10"}},
      {"--epochs 1000000 --batches 1000000", {"--epochs x --batches", "at most 1000000000"}},
      {"--epochs 1 --batches 1000000000 --batch-size 16000000",
       {"--batches", "more than this machine's"}},
      {"--widths 4000000000", {"--widths", "wider than 65536"}},
      {"--widths 65537", {"--widths", "65537 is wider than 65536"}},
      {"--widths 16,16x", {"--widths", "'16x' is not a positive integer"}},
      {"--widths 1.5", {"--widths", "'1.5' is not a positive integer"}},
      {"--widths 16,", {"--widths", "'' is not a positive integer", "got '16,'"}},
      {"--widths 16,,16", {"--widths", "'' is not a positive integer"}},
      {"--widths 0x10", {"--widths", "'0x10' is not a positive integer"}},
      {"--seed -5", {"--seed", "expected an integer from 0 to 18446744073709551615, got -5"}},
      {"--seed 18446744073709551616", {"--seed", "got 18446744073709551616"}}, // not clamped
      {"--lr nan", {"--lr", "expected a finite number >= 0 (at most 3.4e38", "got nan"}},
      {"--lr -1", {"--lr", "got -1"}},
      {"--lr 1e-50", {"--lr", "at least 1.4e-45), got 1e-50"}}, // a float would hold 0
      {"--lr -0", {"--lr", "got -0"}},
      {"--lr 0x10", {"--lr", "got 0x10"}}, // decimal only, as the integers
      {"'--lr= 1'", {"--lr", "got  1"}},
      {"--amp --compare", {"--amp", "--compare trains both FP32 and AMP"}},
      {"--log-every -1", {"--log-every"}},
      {"--init-scale 1024", {"--init-scale", "only with --amp, --compare or --compare-dtypes"}},
      {"--no-loss-scaling",
       {"--no-loss-scaling", "only with --amp, --compare or --compare-dtypes"}},
      {"--growth-interval 5", {"--growth-interval", "only with --amp, --compare"}},
      {"--amp-dtype bf16", {"--amp-dtype", "only with --amp, --compare or --compare-dtypes"}},
      {"--amp --amp-dtype f32", {"--amp-dtype", "f32"}},
      {"--compare-dtypes --compare", {"--compare-dtypes", "takes neither --amp nor --compare"}},
      {"--compare-dtypes --amp-dtype bf16", {"--amp-dtype", "trains both f16 and bf16"}},
      {"--amp --loss-scaling --no-loss-scaling", {"--loss-scaling", "contradicts"}},
      {"--amp --loss-scaling", {"--loss-scaling", "f16 runs with loss scaling already"}},
      {"--amp --amp-dtype bf16 --no-loss-scaling",
       {"--no-loss-scaling", "bf16 runs without loss scaling already"}},
      {"--amp --amp-dtype bf16 --init-scale 8", {"--init-scale", "in bf16 with --loss-scaling"}},
      {"--amp --init-scale 0", {"--init-scale", "expected a finite number > 2.9e-39", "got 0"}},
      {"--amp --init-scale nan", {"--init-scale", "got nan"}},
      {"--compare --init-scale -1", {"--init-scale", "got -1"}},
      {"--amp --init-scale 1e39", {"--init-scale", "at most 3.4e38, got 1e39"}},
      // 1/scale overflows to inf below 2.9e-39 (PyTorch would take these and apply NaNs).
      {"--amp --init-scale 1e-40 --epochs 1 --batches 1", {"--init-scale", "got 1e-40"}},
      {"--amp --init-scale 1e-45 --epochs 1 --batches 1", {"--init-scale", "got 1e-45"}},
      {"--amp --growth-interval 0", {"--growth-interval", "expected an integer from 1 to"}},
      {"--resume a --compare", {"--resume", "cannot be combined with --compare"}},
      {"--resume a --compare-dtypes", {"--resume", "--compare or --compare-dtypes"}},
      {"--resume a --load-weights b", {"--resume", "--load-weights"}},
      {"--load-weights /nonexistent.safetensors", {"No such file or directory"}},
      {"--save-weights ''", {"--save-weights", "expected a path"}},
      {"--save-weights /dev/null/minamp", {"--save-weights", "/dev/null is not a directory"}},
      // Found only when creating it (as root, access() says /proc is writable): --out, made
      // first, is removed again.
      {"--save-weights /proc/minamp", {"--save-weights", "/proc"}},
      {"--epochs 1 --checkpoint-every 51", {"--checkpoint-every", "the run has 50 steps"}},
  };
  for (const auto& [args, parts] : cases) {
    expect_one_line_error(run_program("mlp", std::string(args) + " --out " + out), args, parts);
  }
  // The limit itself is allowed.
  run = run_program("mlp", "--widths 65536 --batch-size 1 --batches 1 --epochs 1 --out " +
                               fresh_dir("widest"));
  EXPECT_EQ(run.status, 0) << run.output;
  // A folder where the run would write a file at the end is refused before it starts.
  const std::string weights = fresh_dir("bad_values_weights");
  std::filesystem::create_directories(weights + "/final.safetensors");
  expect_one_line_error(
      run_program("mlp", "--save-weights " + weights + " --out " + out), "final.safetensors",
      {"--save-weights", "final.safetensors is a directory, where the run would write a file"});
  EXPECT_FALSE(std::filesystem::exists(out)) << "a refused run wrote output";
  const std::string blocked = fresh_dir("bad_values_checkpoint");
  std::filesystem::create_directories(blocked + "/checkpoint.safetensors");
  expect_one_line_error(
      run_program("mlp", "--checkpoint-every 10 --out " + blocked), "checkpoint.safetensors",
      {"checkpoint.safetensors is a directory, where the run would write a file"});
}

TEST(Examples, ResumeRefusesACheckpointOfOtherDataSeedLearningRateOrScaler) {
  const std::string first = fresh_dir("resume_source"), out = fresh_dir("resume_other");
  ASSERT_EQ(run_program("mlp", "--epochs 2 --batches 3 --checkpoint-every 2 --out " + first).status,
            0);
  const std::string resume = " --resume " + first + "/checkpoint.safetensors --out " + out;
  for (const auto& [args, what] :
       {std::pair<const char*, const char*>{"--epochs 2 --batches 4", "batches '3'"},
        {"--epochs 2 --batches 3 --batch-size 64", "batch_size '512'"},
        {"--epochs 2 --batches 3 --seed 9", "seed '0'"},
        {"--epochs 2 --batches 3 --lr 0.5", "lr '0.001', this run has '0.5'"},
        {"--epochs 2 --batches 3 --widths 8", "widths '16,16'"}}) {
    const ProgramRun run = run_program("mlp", args + resume);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_NE(run.output.find(what), std::string::npos) << args << ": " << run.output;
  }
  // The autocast dtype and loss scaling are part of the run: a checkpoint of AMP-bf16 resumes only
  // as AMP-bf16, and a refusal names both dtypes.
  const std::string bf16 = fresh_dir("resume_bf16");
  ASSERT_EQ(run_program("mlp", "--amp --amp-dtype bf16 --epochs 2 --batches 3 --checkpoint-every 2 "
                               "--out " +
                                   bf16)
                .status,
            0);
  const std::string bf16_resume = " --resume " + bf16 + "/checkpoint.safetensors --out " + out;
  for (const auto& [args, what] :
       {std::pair<const char*, const char*>{"--amp", "amp_dtype 'bf16', this run has 'f16'"},
        {"", "precision 'amp-bf16', this run has 'fp32'"},
        {"--amp --amp-dtype bf16 --loss-scaling",
         "precision 'amp-bf16', this run has 'amp-bf16 with loss "
         "scaling'"}}) {
    const ProgramRun run =
        run_program("mlp", std::string("--epochs 3 --batches 3 ") + args + bf16_resume);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_NE(run.output.find(what), std::string::npos) << args << ": " << run.output;
  }
  EXPECT_EQ(
      run_program("mlp", "--amp --amp-dtype bf16 --epochs 3 --batches 3" + bf16_resume).status, 0);
  const std::string weights_dir = fresh_dir("resume_weights");
  ASSERT_EQ(run_program("mlp", "--epochs 1 --batches 3 --save-weights " + weights_dir + " --out " +
                                   fresh_dir("resume_weights_run"))
                .status,
            0);
  const ProgramRun from_weights = run_program(
      "mlp", "--epochs 2 --batches 3 --resume " + weights_dir + "/final.safetensors --out " + out);
  EXPECT_NE(from_weights.status, 0);
  EXPECT_NE(from_weights.output.find("not a training checkpoint"), std::string::npos)
      << from_weights.output;
  EXPECT_NE(from_weights.output.find("--load-weights"), std::string::npos) << from_weights.output;
  const ProgramRun finished = run_program("mlp", "--epochs 2 --batches 3" + resume);
  EXPECT_NE(finished.status, 0);
  EXPECT_NE(finished.output.find("at step 6, the end of this run's 6 steps: nothing is left"),
            std::string::npos)
      << finished.output;
  // A checkpoint whose epoch count disagrees with its step count is corrupt.
  minamp::io::SafetensorsFile state =
      minamp::io::load_safetensors(first + "/checkpoint.safetensors");
  for (minamp::io::NamedInt64s& entry : state.int64s)
    if (entry.name == "train.epoch") entry.values = {1};
  const std::string odd = first + "/odd.safetensors";
  minamp::io::save_safetensors(odd, state.tensors, state.metadata, state.int64s);
  const ProgramRun odd_run =
      run_program("mlp", "--epochs 3 --batches 3 --resume " + odd + " --out " + out);
  EXPECT_NE(odd_run.status, 0);
  EXPECT_NE(odd_run.output.find("epoch 1 does not match step 6 (this example counts no epochs"),
            std::string::npos)
      << odd_run.output;
  EXPECT_EQ(run_program("mlp", "--epochs 3 --batches 3 --widths '16, 16 '" + resume).status, 0)
      << "the same widths, written another way, are the same model";
  EXPECT_EQ(run_program("mlp", "--epochs 3 --batches 3" + resume).status, 0)
      << "more epochs of the same data resume";
  // The resumed run's summary counts the whole run's training time, as metrics.csv does.
  const auto summary = nlohmann::json::parse(minamp::io::read_file(out + "/summary.json"));
  const std::string csv = minamp::io::read_file(out + "/metrics.csv");
  const std::string last_row = csv.substr(csv.rfind('\n', csv.size() - 2) + 1);
  const double last_wall_s =
      std::stod(last_row.substr(last_row.find(',', last_row.find(',') + 1) + 1));
  EXPECT_EQ(summary["resumed_at_step"], 6);
  // The summary's clock is read a little after the last row's (rounded to 6 digits there).
  EXPECT_GE(summary["wall_s"].get<double>(), last_wall_s * (1 - 1e-5));
  EXPECT_LT(summary["wall_s"].get<double>(), last_wall_s + 0.5);

  const std::string amp_source = fresh_dir("resume_amp_source");
  ASSERT_EQ(
      run_program("mlp", "--epochs 2 --batches 3 --amp --checkpoint-every 2 --out " + amp_source)
          .status,
      0);
  const std::string amp_resume =
      " --amp --resume " + amp_source + "/checkpoint.safetensors --out " + out;
  for (const auto& [args, what] :
       {std::pair<const char*, const char*>{"--growth-interval 7", "growth_interval '2000'"},
        {"--init-scale 1024", "init_scale '65536', this run has '1024'"}}) {
    const ProgramRun run =
        run_program("mlp", std::string("--epochs 2 --batches 3 ") + args + amp_resume);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_NE(run.output.find(what), std::string::npos) << args << ": " << run.output;
  }
}

// Every program that takes --device: asked for cuda where there is none, it fails saying why
// (no GPU, or a build without the CUDA backend), before it trains or writes anything.
TEST(Examples, CudaWithoutAGpuSaysWhy) {
  if (minamp::cuda_available()) GTEST_SKIP() << "a GPU is present";
  for (const char* program : {"mlp", "sine", "classify", "bench_train"}) {
    const std::string out = fresh_dir(std::string("nocuda-") + program);
    const std::string args = std::string(program) == "bench_train"
                                 ? "--device cuda --models mlp --json " + out
                                 : "--device cuda --out " + out;
    const ProgramRun run = run_program(program, args);
    EXPECT_NE(run.status, 0) << program;
    EXPECT_NE(run.output.find(minamp::cuda_unavailable_reason()), std::string::npos)
        << program << ": " << run.output;
    EXPECT_FALSE(std::filesystem::exists(out)) << program << " wrote " << out;
  }
}

// The (step, loss, scale) lines minimal_amp prints: "step  50  loss 0.01234  scale 65536".
struct LoopLine {
  long long step;
  double loss, scale;
};
std::vector<LoopLine> loop_lines(const std::string& output) {
  std::vector<LoopLine> lines;
  std::istringstream in(output);
  std::string word;
  LoopLine line{};
  while (in >> word)
    if (word == "step" && in >> line.step >> word >> line.loss >> word >> line.scale)
      lines.push_back(line);
  return lines;
}

// The README's loop, run as it stands in examples/minimal_amp.cpp: the MLP learns its function
// under autocast with the scaler at PyTorch's initial scale, which no step overflows.
TEST(Examples, MinimalAmpLearnsWithTheReadmesLoop) {
  const ProgramRun run = run_program("minimal_amp", "--steps 300");
  ASSERT_EQ(run.status, 0) << run.output;
  const std::vector<LoopLine> lines = loop_lines(run.output);
  ASSERT_EQ(lines.size(), 7u) << run.output; // steps 0, 50, ..., 250 and the last, 299
  EXPECT_EQ(lines.back().step, 299);
  EXPECT_LT(lines.back().loss, lines.front().loss / 4) << run.output;
  for (const LoopLine& line : lines) EXPECT_EQ(line.scale, 65536.0) << run.output;

  const ProgramRun bad = run_program("minimal_amp", "--steps 0");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("error: --steps"), std::string::npos) << bad.output;
  if (!minamp::cuda_available()) {
    const ProgramRun no_gpu = run_program("minimal_amp", "--device cuda");
    EXPECT_NE(no_gpu.status, 0);
    EXPECT_NE(no_gpu.output.find(minamp::cuda_unavailable_reason()), std::string::npos)
        << no_gpu.output;
  }
}

TEST(Examples, BenchTrainRefusesBadListsAndNumbers) {
  const std::string json = fresh_dir("bench_bad.json");
  for (const auto& [args, parts] :
       {std::pair<std::string, std::vector<std::string>>{"--models mlp,mlp",
                                                         {"--models", "'mlp' is given twice"}},
        {"--models resnet", {"--models", "unknown value 'resnet'"}},
        {"--precisions ,", {"--precisions", "expected at least one value"}},
        {"--steps 1e2", {"--steps", "expected an integer from 1 to 1000000000, got 1e2"}},
        {"--seed -1", {"--seed", "expected an integer from 0"}},
        {"--unfused", {"--unfused", "needs --device cuda (the CPU backend never fuses)"}},
        {"--cuda-graph", {"--cuda-graph", "needs --device cuda"}},
        {"--models resnet18 --resnet-size 32 --resnet-batch 1",
         {"--resnet-batch", "1 at --resnet-size 32", "one value per channel"}}}) {
    const ProgramRun run = run_program("bench_train", args + " --device cpu --json " + json);
    EXPECT_NE(run.status, 0) << args;
    for (const std::string& part : parts)
      EXPECT_NE(run.output.find(part), std::string::npos) << args << ": " << run.output;
  }
  // A --json it could not write is refused before any benchmark runs.
  const std::string unwritable = json + "/no/such/dir/out.json";
  const ProgramRun run =
      run_program("bench_train", "--device cpu --models mlp --json " + unwritable);
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find("--json: " + unwritable + ": its folder does not exist"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("timed steps"), std::string::npos) << "a benchmark ran: " << run.output;
  EXPECT_FALSE(std::filesystem::exists(json)) << "a refused run wrote its JSON";
  const ProgramRun empty = run_program("bench_train", "--device cpu --json ''");
  EXPECT_NE(empty.status, 0);
  EXPECT_NE(empty.output.find("--json: expected a path"), std::string::npos) << empty.output;
}

// bench_gemm checks its options before it looks for a GPU: unknown precisions (not a substring
// match: "bf16" is no f16), an empty --json, options --kernels would ignore.
TEST(Examples, BenchGemmRefusesBadOptions) {
  const std::string program = std::string(MINAMP_BINARY_DIR) + "/bench_gemm";
  if (!std::filesystem::exists(program)) GTEST_SKIP() << "bench_gemm needs the CUDA toolkit";
  for (const auto& [args, parts] :
       {std::pair<std::string, std::vector<std::string>>{"--precisions bf16",
                                                         {"--precisions", "unknown value 'bf16'"}},
        {"--precisions f16,bogus", {"--precisions", "unknown value 'bogus'"}},
        {"--precisions f32,f32", {"--precisions", "'f32' is given twice"}},
        {"--json ''", {"--json", "expected a path"}},
        {"--kernels --shapes square", {"--kernels", "takes no --shapes"}},
        {"--kernels --json x.json", {"--kernels", "takes no --json"}}}) {
    const ProgramRun run = run_program("bench_gemm", args);
    EXPECT_NE(run.status, 0) << args;
    EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << args << run.output;
    for (const std::string& part : parts)
      EXPECT_NE(run.output.find(part), std::string::npos) << args << ": " << run.output;
  }
}

// bench_train's figures from its own runs: from one init, runs of 1, 2, 10 and 11 timed steps
// share their first steps' losses, so the 2-step run's final loss (the last step's) and last-10
// mean give the first back, and the 10- and 11-step means differ by the 11th loss less the
// first over 10; and the percentiles interpolate between order statistics, numpy's way (of 2
// times, the median is their mean).
TEST(Examples, BenchTrainReportsTheLastLossAndInterpolatedPercentiles) {
  std::map<int, nlohmann::json> train_run;
  for (int steps : {1, 2, 10, 11}) {
    const std::string json = fresh_dir("bench_steps" + std::to_string(steps) + ".json");
    const ProgramRun run = run_program(
        "bench_train", "--device cpu --models mlp --precisions fp32 --warmup 1 --infer-steps 1 "
                       "--steps " +
                           std::to_string(steps) + " --json " + json);
    ASSERT_EQ(run.status, 0) << run.output;
    const nlohmann::json report = nlohmann::json::parse(minamp::io::read_file(json));
    for (const nlohmann::json& r : report["runs"])
      if (r["mode"] == "train") train_run[steps] = r;
    ASSERT_EQ(train_run.count(steps), 1u) << run.output;
  }
  const double first = train_run[1]["final_loss"], last = train_run[2]["final_loss"];
  EXPECT_NE(last, first) << "the second step's loss should differ from the first's";
  EXPECT_EQ(2.0 * train_run[2]["loss_last10_mean"].get<double>() - last, first);
  // From 10 to 11 steps the last 10 losses lose the first step's and gain the eleventh's.
  const double mean10 = train_run[10]["loss_last10_mean"],
               mean11 = train_run[11]["loss_last10_mean"];
  EXPECT_NEAR(10.0 * (mean11 - mean10), train_run[11]["final_loss"].get<double>() - first, 1e-5);
  const nlohmann::json ms = train_run[2]["step_ms"];
  const double low = ms["min"], high = ms["max"];
  EXPECT_EQ(ms["n"], 2);
  EXPECT_DOUBLE_EQ(ms["median"].get<double>(), low + 0.5 * (high - low));
  EXPECT_DOUBLE_EQ(ms["p10"].get<double>(), low + 0.1 * (high - low));
  EXPECT_DOUBLE_EQ(ms["p90"].get<double>(), low + 0.9 * (high - low));
}

// With --compare, the AMP run's outputs are checked before the FP32 run trains, sine's image
// among them.
TEST(Examples, CompareChecksBothRunsOutputsFirst) {
  const std::string out = fresh_dir("compare_blocked");
  std::filesystem::create_directories(out + "/amp/sine.png");
  const ProgramRun run =
      run_program("sine", "--size 8 --hidden 8 --steps 2 --compare --out " + out);
  EXPECT_NE(run.status, 0);
  EXPECT_NE(run.output.find(out + "/amp/sine.png is a directory"), std::string::npos) << run.output;
  EXPECT_FALSE(std::filesystem::exists(out + "/fp32")) << "the FP32 run trained first";
}

// On the CPU named: --device auto would pick a GPU where there is one.
TEST(Examples, SineWritesMetricsSummaryAndImage) {
  const std::string out = fresh_dir("sine");
  const ProgramRun run =
      run_program("sine", "--device cpu --size 8 --hidden 8 --steps 12 --amp --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("(last-10 mean "), std::string::npos) << run.output;
  std::ifstream csv(out + "/metrics.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,loss,wall_s,scale,skipped");
  const std::vector<double> losses = losses_in(out + "/metrics.csv");
  ASSERT_EQ(losses.size(), 12u);
  double last10 = 0;
  for (size_t i = 2; i < 12; ++i) last10 += losses[i] / 10; // steps 2-11
  const nlohmann::json summary = nlohmann::json::parse(std::ifstream(out + "/summary.json"));
  for (const char* key : {"example", "device", "device_name", "precision", "steps", "final_loss",
                          "loss_last10_mean", "wall_s", "peak_bytes", "skipped_steps",
                          "final_scale", "inference_wall_s", "inference_peak_bytes"})
    EXPECT_TRUE(summary.contains(key)) << key;
  EXPECT_EQ(summary["device_name"], "cpu");
  EXPECT_EQ(summary["precision"], "amp");
  EXPECT_EQ(summary["steps"], 12);
  // metrics.csv rounds to 6 digits
  EXPECT_NEAR(summary["loss_last10_mean"].get<double>(), last10, 1e-5 * last10);
  EXPECT_NEAR(summary["final_loss"].get<double>(), losses.back(), 1e-5 * losses.back());
  EXPECT_TRUE(summary["final_loss"].is_number() &&
              std::isfinite(summary["final_loss"].get<double>()))
      << summary["final_loss"];
  EXPECT_GT(summary["final_loss"].get<double>(), 0);
  EXPECT_EQ(summary["skipped_steps"], 0) << "clean steps at the default scale";
  EXPECT_EQ(summary["final_scale"], 65536.0);
  EXPECT_GT(summary["peak_bytes"].get<double>(), 0);
  // Forward passes without a graph keep no activations for a backward pass.
  EXPECT_GT(summary["inference_peak_bytes"].get<double>(), 0);
  EXPECT_LT(summary["inference_peak_bytes"].get<double>(), summary["peak_bytes"].get<double>());

  // sine.png: the target on the left, x along the columns and y down the rows (each of the 8x8
  // cells 32 pixels wide), then a white gap, then the prediction.
  const minamp::Tensor image = minamp::io::load_image(out + "/sine.png", 1);
  ASSERT_EQ(image.shape(), (minamp::Shape{256, 2 * 256 + 8, 1}));
  const std::vector<float> target =
      minamp::examples::quantized_sine(minamp::examples::coordinate_grid(8));
  const float* pixels = image.data<float>();
  for (int64_t row = 0; row < 256; ++row)
    for (int64_t col = 0; col < 256 + 8; ++col) {
      const float expected =
          col < 256 ? std::lround(target[(row / 32) * 8 + col / 32] * 255) / 255.0f : 1.0f;
      ASSERT_EQ(pixels[row * (2 * 256 + 8) + col], expected) << "row " << row << ", col " << col;
    }
}

// The right half of sine.png is the model's eval-mode prediction (running statistics, not the
// grid's batch statistics), as computed here from the weights the run saved: sine's model for
// --hidden 8 and its 2 hidden blocks, under autocast as in the --amp run.
TEST(Examples, SineImageShowsTheEvalModePrediction) {
  const std::string out = fresh_dir("sine_eval_image");
  const ProgramRun run =
      run_program("sine", "--size 8 --hidden 8 --steps 12 --amp --save-weights " + out +
                              "/weights --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  minamp::Rng rng(0);
  minamp::nn::Sequential model;
  for (int64_t in : {2, 8, 8})
    model.emplace<minamp::nn::Conv2d>(in, 8, 1, rng)
        .emplace<minamp::nn::BatchNorm>(8)
        .emplace<minamp::nn::ReLU>();
  model.emplace<minamp::nn::Conv2d>(8, 1, 1, rng);
  minamp::io::load_weights(out + "/weights/final.safetensors", model);
  model.eval();
  std::vector<float> prediction;
  {
    const minamp::NoGrad no_grad;
    const minamp::amp::Autocast autocast;
    const minamp::Tensor grid =
        minamp::Tensor::from_vector(minamp::examples::coordinate_grid(8), {1, 8, 8, 2});
    prediction = model(minamp::Var(grid)).value().to_vector();
  }
  const minamp::Tensor image = minamp::io::load_image(out + "/sine.png", 1);
  ASSERT_EQ(image.shape(), (minamp::Shape{256, 2 * 256 + 8, 1}));
  const float* pixels = image.data<float>();
  for (int64_t row = 0; row < 256; ++row)
    for (int64_t col = 0; col < 256; ++col) {
      const float value = std::clamp(prediction[(row / 32) * 8 + col / 32], 0.0f, 1.0f);
      ASSERT_EQ(pixels[row * (2 * 256 + 8) + 256 + 8 + col], std::lround(value * 255) / 255.0f)
          << "row " << row << ", col " << col;
    }
}

// Grids past 256 cells a side (the GPU's 512) get one pixel per cell.
TEST(Examples, SineImageOfALargeGridHasAPixelPerCell) {
  const std::string out = fresh_dir("sine_large_image");
  const ProgramRun run =
      run_program("sine", "--size 264 --hidden 2 --layers 0 --steps 1 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(minamp::io::load_image(out + "/sine.png", 1).shape(),
            (minamp::Shape{264, 2 * 264 + 8, 1}));
}

// --profile: the op table is printed and written, with the ops a sine step runs and their calls
// per step (4 convs, 3 batch norms, one zero_grads and one Adam step).
TEST(Examples, ProfileWritesTheTimePerOp) {
  const std::string out = fresh_dir("sine_profile");
  const ProgramRun run =
      run_program("sine", "--device cpu --size 8 --hidden 8 --steps 5 --profile --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("op profile over 5 steps"), std::string::npos) << run.output;
  std::ifstream file(out + "/profile.txt");
  std::map<std::string, double> calls_per_step;
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream fields(line);
    std::string op, device;
    double calls = 0;
    if (fields >> op >> device >> calls && device == "cpu") calls_per_step[op] = calls;
  }
  EXPECT_EQ(calls_per_step["conv2d_forward"], 4.0);
  EXPECT_EQ(calls_per_step["conv2d_backward"], 4.0);
  EXPECT_EQ(calls_per_step["batchnorm_forward"], 3.0);
  EXPECT_EQ(calls_per_step["zero_grads"], 1.0);
  EXPECT_EQ(calls_per_step["adam_step"], 1.0);
}

// Integers are decimal, leading zeros too (CLI11 alone would read 010 as octal 8).
TEST(Examples, IntegerOptionsAreDecimal) {
  const std::string out = fresh_dir("decimal");
  ASSERT_EQ(run_program("mlp", "--epochs 010 --batches 1 --seed 011 --out " + out).status, 0);
  const auto summary = nlohmann::json::parse(minamp::io::read_file(out + "/summary.json"));
  EXPECT_EQ(summary["steps"], 10);
  EXPECT_EQ(summary["seed"], 11);
}

// A run whose loss ends as NaN finishes and writes its outputs, but says that it diverged.
TEST(Examples, ADivergedRunSaysSo) {
  const std::string out = fresh_dir("diverged");
  const ProgramRun run = run_program("mlp", "--lr 1e10 --epochs 1 --out " + out);
  EXPECT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("warning: fp32: the final loss is"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("training diverged"), std::string::npos) << run.output;
  // A NaN reads "nan" everywhere (printf would show a NaN with its sign bit set as "-nan").
  EXPECT_NE(run.output.find("the final loss is nan"), std::string::npos) << run.output;
  const std::string metrics = minamp::io::read_file(out + "/metrics.csv");
  EXPECT_NE(metrics.find(",nan,"), std::string::npos) << metrics;
  for (const std::string& text : {run.output, metrics})
    EXPECT_EQ(text.find("-nan"), std::string::npos) << text;
  // Two steps at that rate end on an infinite loss (the second step's), which is no better.
  const ProgramRun infinite = run_program("mlp", "--lr 1e10 --epochs 2 --batches 1 --out " + out);
  EXPECT_NE(infinite.output.find("warning: fp32: the final loss is inf: training diverged"),
            std::string::npos)
      << infinite.output;
  const ProgramRun fine = run_program("mlp", "--epochs 1 --out " + out);
  EXPECT_EQ(fine.output.find("warning"), std::string::npos) << fine.output;
  const ProgramRun both = run_program("mlp", "--compare --lr 1e10 --epochs 1 --out " + out);
  for (const char* run_name : {"fp32", "amp"})
    EXPECT_NE(both.output.find(std::string("warning: ") + run_name + ": the final loss is"),
              std::string::npos)
        << both.output;
  EXPECT_EQ(both.output.find("-nan"), std::string::npos) << both.output;
}

TEST(Examples, MlpLossFallsAndCompareWritesBothRuns) {
  const std::string out = fresh_dir("mlp");
  const ProgramRun run = run_program("mlp", "--compare --epochs 4 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  // The training table's rows and savings are those of the two runs' summaries.
  const size_t table = run.output.find("\nTraining\n");
  ASSERT_NE(table, std::string::npos) << run.output;
  const std::string training = run.output.substr(table);
  std::map<std::string, nlohmann::json> summary;
  const auto printed = [](double value) {
    std::ostringstream text;
    text << value;
    return text.str();
  };
  for (const char* precision : {"fp32", "amp"}) {
    summary[precision] =
        nlohmann::json::parse(minamp::io::read_file(out + "/" + precision + "/summary.json"));
    const std::string label = std::string(precision) == "fp32" ? "FP32" : "AMP";
    const size_t at = training.find("\n  " + label + " ");
    ASSERT_NE(at, std::string::npos) << training;
    std::istringstream row(training.substr(at));
    std::string name, unit, final_loss, tail_mean;
    double seconds = 0, mib = 0;
    row >> name >> seconds >> mib >> unit >> final_loss >> tail_mean;
    const nlohmann::json& s = summary[precision];
    // The losses as the table prints them (6 significant digits), from this run's summary.
    EXPECT_EQ(final_loss, printed(s["final_loss"])) << label;
    EXPECT_EQ(tail_mean, printed(s["loss_last10_mean"])) << label;
    EXPECT_NEAR(mib, s["peak_bytes"].get<double>() / 1048576.0, 0.006) << label;
  }
  // The inference table has time and memory only: its lines end at the memory column, unpadded.
  const size_t inference = run.output.find("\nInference (forward only)\n");
  ASSERT_NE(inference, std::string::npos) << run.output;
  std::istringstream lines(run.output.substr(inference + 1));
  std::string line;
  for (int i = 0; i < 4 && std::getline(lines, line); ++i)
    EXPECT_TRUE(line.empty() || line.back() != ' ') << "'" << line << "'";
  EXPECT_NE(run.output.find("time (s)    peak memory\n"), std::string::npos) << run.output;
  double time_saved = 0, memory_saved = 0;
  const size_t savings = training.find("time saved:");
  ASSERT_NE(savings, std::string::npos) << training;
  ASSERT_EQ(std::sscanf(training.c_str() + savings, "time saved: %lf%% memory saved: %lf%%",
                        &time_saved, &memory_saved),
            2)
      << training;
  const auto ratio = [&](const char* key) {
    return summary["amp"][key].get<double>() / summary["fp32"][key].get<double>();
  };
  EXPECT_NEAR(memory_saved, 100.0 * (1.0 - ratio("peak_bytes")), 0.051);
  EXPECT_NEAR(time_saved, 100.0 * (1.0 - ratio("wall_s")), 0.051);
  for (const char* precision : {"fp32", "amp"}) {
    const std::vector<double> losses = losses_in(out + "/" + precision + "/metrics.csv");
    ASSERT_EQ(losses.size(), 200u);
    // Epoch means (the 50 batches differ), first vs last.
    double first = 0, last = 0;
    for (int i = 0; i < 50; ++i) first += losses[i], last += losses[150 + i];
    EXPECT_LT(last, first) << precision;
  }
}

// --compare-dtypes: FP32, AMP-f16 and AMP-bf16 from one init, each in its own folder, side by side
// in one table (time, memory, losses, skipped steps); bf16 runs without loss scaling.
TEST(Examples, CompareDtypesTrainsFp32F16AndBf16SideBySide) {
  const std::string out = fresh_dir("compare_dtypes");
  const ProgramRun run = run_program("mlp", "--compare-dtypes --epochs 1 --batches 8 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  const size_t table = run.output.find("\nTraining\n");
  ASSERT_NE(table, std::string::npos) << run.output;
  const std::string training = run.output.substr(table);
  EXPECT_NE(training.find("skipped"), std::string::npos) << training;
  const std::pair<const char*, const char*> runs[] = {
      {"fp32", "FP32"}, {"amp", "AMP-f16"}, {"amp-bf16", "AMP-bf16"}};
  for (const auto& [folder, label] : runs) {
    const nlohmann::json s =
        nlohmann::json::parse(minamp::io::read_file(out + "/" + folder + "/summary.json"));
    EXPECT_EQ(s["precision"], folder);
    EXPECT_EQ(s["amp_dtype"], std::string(folder) == "fp32"  ? nlohmann::json()
                              : std::string(folder) == "amp" ? nlohmann::json("f16")
                                                             : nlohmann::json("bf16"));
    EXPECT_EQ(s["loss_scaling"], std::string(folder) == "amp") << folder;
    EXPECT_EQ(s["skipped_steps"], 0) << folder;
    // The row: label, time, memory (value and unit), final loss, last-10 mean, skipped steps.
    const size_t at = training.find(std::string("\n  ") + label + " ");
    ASSERT_NE(at, std::string::npos) << label << "\n" << training;
    std::istringstream row(training.substr(at));
    std::string name, unit, final_loss, tail_mean;
    double seconds = 0, mib = 0;
    int64_t skipped = -1;
    row >> name >> seconds >> mib >> unit >> final_loss >> tail_mean >> skipped;
    std::ostringstream printed;
    printed << s["final_loss"].get<double>();
    EXPECT_EQ(final_loss, printed.str()) << label;
    EXPECT_EQ(skipped, 0) << label;
    if (std::string(folder) != "fp32") {
      EXPECT_NE(training.find(std::string("  ") + label + ": time saved: "), std::string::npos)
          << training;
    }
  }
  EXPECT_NE(run.output.find("AMP-bf16: 0 skipped steps, final scale 1 (no loss scaling)"),
            std::string::npos)
      << run.output;
  EXPECT_FALSE(std::filesystem::exists(out + "/amp-bf16/loss_scale.png"));
  EXPECT_TRUE(std::filesystem::exists(out + "/amp/loss_scale.png"));
}

// --diagnose on the last step: the range table has f16 (at 1 and at S) and bf16 columns, the
// update table says what 16-bit weights would lose, and gradients.png is written.
TEST(Examples, DiagnoseReportsBothFormatsAndDrawsTheHistogram) {
  const std::string out = fresh_dir("diagnose");
  const ProgramRun run =
      run_program("sine", "--device cpu --size 8 --hidden 8 --steps 3 --diagnose --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* part : {"range of activation gradients in f16 and bf16", "f16 at S = 65536",
                           "bf16 at scale 1", "range of weight gradients in f16 and bf16",
                           "weights in f16", "weights in bf16", "conv2d#0", "0.weight"})
    EXPECT_NE(run.output.find(part), std::string::npos) << part << "\n" << run.output;
  EXPECT_GT(std::filesystem::file_size(out + "/gradients.png"), 1000u);
}

// --compare --save-weights DIR: each precision keeps its weights in its own folder, both runs
// start from the same init, and each ends on its own weights (mlp's AMP run rounds to f16).
TEST(Examples, CompareSavesEachRunsWeightsApart) {
  const std::string weights = fresh_dir("compare_weights");
  const ProgramRun run = run_program("mlp", "--compare --epochs 1 --batches 3 --save-weights " +
                                                weights + " --out " + fresh_dir("compare_run"));
  ASSERT_EQ(run.status, 0) << run.output;
  const auto bytes = [&](const std::string& file) {
    return minamp::io::read_file(weights + "/" + file + ".safetensors");
  };
  EXPECT_EQ(bytes("fp32/init"), bytes("amp/init"));
  EXPECT_NE(bytes("fp32/final"), bytes("amp/final"));
  EXPECT_NE(bytes("fp32/final"), bytes("fp32/init"));
}

TEST(Examples, MlpAndSineResumeBitForBitInFp32AndAmp) {
  // mlp: SGD, 20 steps, resumed at 12; sine: Adam + BatchNorm, 20 steps, resumed at 12, AMP with
  // a growing scale (interval 5) so the growth tracker is mid-count at the checkpoint.
  minamp::test::expect_resume_equals_uninterrupted("mlp", "--epochs 2 --batches 10", 12,
                                                   "mlp_fp32");
  minamp::test::expect_resume_equals_uninterrupted("mlp", "--epochs 2 --batches 10 --amp", 12,
                                                   "mlp_amp");
  const std::string sine = "--size 8 --hidden 8 --steps 20";
  minamp::test::expect_resume_equals_uninterrupted("sine", sine, 12, "sine_fp32");
  minamp::test::expect_resume_equals_uninterrupted("sine", sine + " --amp --growth-interval 5", 12,
                                                   "sine_amp");
}

TEST(Examples, WeightsSavedByOneRunStartAnother) {
  const std::string first = fresh_dir("weights_first"), second = fresh_dir("weights_second");
  ProgramRun run = run_program("sine", "--size 8 --hidden 8 --steps 3 --out " + first +
                                           " --save-weights " + first + "/w");
  ASSERT_EQ(run.status, 0) << run.output;
  const minamp::io::SafetensorsFile final =
      minamp::io::load_safetensors(first + "/w/final.safetensors");
  EXPECT_EQ(final.tensor("0.weight").shape(), (minamp::Shape{8, 2, 1, 1})); // [Cout, Cin, kh, kw]
  EXPECT_EQ(final.int64s_named("1.num_batches_tracked").values, std::vector<int64_t>{3});

  run = run_program("sine", "--size 8 --hidden 8 --steps 3 --seed 9 --out " + second +
                                " --load-weights " + first +
                                "/w/final.safetensors --save-weights " + second + "/w");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(minamp::io::read_file(second + "/w/init.safetensors"),
            minamp::io::read_file(first + "/w/final.safetensors"));

  run = run_program("mlp", "--epochs 1 --out " + second + "_mlp --load-weights " + first +
                               "/w/final.safetensors");
  EXPECT_NE(run.status, 0);
  EXPECT_NE(
      run.output.find("final.safetensors: '0.weight' has shape [8, 2, 1, 1], expected [16, 8]"),
      std::string::npos)
      << run.output;
  EXPECT_FALSE(std::filesystem::exists(second + "_mlp")) << "a failed run wrote output";
}

TEST(Examples, RunsWritePlotsNextToTheirMetrics) {
  const std::string out = fresh_dir("plots");
  const ProgramRun run = run_program("mlp", "--compare --epochs 1 --batches 5 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_TRUE(std::filesystem::exists(out + "/fp32/loss.png"));
  EXPECT_FALSE(std::filesystem::exists(out + "/fp32/loss_scale.png")) << "no scaler in FP32";
  EXPECT_TRUE(std::filesystem::exists(out + "/amp/loss.png"));
  EXPECT_TRUE(std::filesystem::exists(out + "/amp/loss_scale.png"));
}

// A run of fewer than 10 steps reports the mean of the losses it has as its last-10 mean.
TEST(Examples, ShortRunsAverageTheLossesTheyHave) {
  const std::string out = fresh_dir("mlp_short");
  const ProgramRun run = run_program("mlp", "--epochs 1 --batches 4 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("(last-4 mean "), std::string::npos) << run.output;
  const std::vector<double> losses = losses_in(out + "/metrics.csv");
  ASSERT_EQ(losses.size(), 4u);
  const double sum = std::accumulate(losses.begin(), losses.end(), 0.0);
  const auto summary = nlohmann::json::parse(std::ifstream(out + "/summary.json"));
  EXPECT_NEAR(summary["loss_last10_mean"].get<double>(), sum / 4, 1e-5 * sum / 4);
}

// An AMP run without loss scaling says so in its summary.
TEST(Examples, SummarySaysWhetherTheLossWasScaled) {
  const std::string out = fresh_dir("mlp_unscaled");
  const ProgramRun run =
      run_program("mlp", "--amp --no-loss-scaling --epochs 1 --batches 2 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  const auto summary = nlohmann::json::parse(minamp::io::read_file(out + "/summary.json"));
  EXPECT_EQ(summary["precision"], "amp");
  EXPECT_EQ(summary["loss_scaling"], false);
}

// --compare hands the scaler's options to its AMP run; the FP32 run has no scaler.
TEST(Examples, CompareGivesTheScalerOptionsToItsAmpRun) {
  const std::string out = fresh_dir("compare_scaler");
  const ProgramRun run = run_program(
      "mlp", "--compare --epochs 1 --batches 5 --init-scale 1024 --growth-interval 3 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  const auto amp = nlohmann::json::parse(std::ifstream(out + "/amp/summary.json"));
  const auto fp32 = nlohmann::json::parse(std::ifstream(out + "/fp32/summary.json"));
  EXPECT_EQ(amp["skipped_steps"], 0);
  EXPECT_EQ(amp["final_scale"], 2048.0) << "1024, grown once after 3 clean steps";
  EXPECT_EQ(fp32["loss_scaling"], false);
}

TEST(Examples, PlotMetricsDrawsRunsAndRefusesWhatItCannotDraw) {
  const std::string out = fresh_dir("plot_metrics");
  ASSERT_EQ(run_program("mlp", "--compare --epochs 1 --batches 5 --out " + out).status, 0);
  const std::string fp32 = out + "/fp32/metrics.csv", amp = out + "/amp/metrics.csv";
  ProgramRun run = run_program("plot_metrics", "--column loss --out " + out + "/loss.png " + fp32 +
                                                   ":FP32 " + amp + ":AMP");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_GT(std::filesystem::file_size(out + "/loss.png"), 0u);
  // ':' in a file's path (with or without a label) and in a label.
  const std::string colon_dir = out + "/12:30";
  std::filesystem::create_directories(colon_dir);
  std::filesystem::copy_file(fp32, colon_dir + "/metrics.csv");
  run = run_program("plot_metrics", "--out " + out + "/colon.png " + colon_dir + "/metrics.csv " +
                                        colon_dir + "/metrics.csv:run:12:30");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_GT(std::filesystem::file_size(out + "/colon.png"), 0u);

  // --y-label is drawn (and not, say, the title in its place).
  for (const char* label : {"A", "B"}) {
    run = run_program("plot_metrics", "--title T --y-label " + std::string(label) + " --out " +
                                          out + "/" + label + ".png " + fp32);
    ASSERT_EQ(run.status, 0) << run.output;
  }
  EXPECT_NE(minamp::io::read_file(out + "/A.png"), minamp::io::read_file(out + "/B.png"));

  // x is the files' step column, not the row number: the same losses at steps 10 and 11 draw
  // another plot than at 0 and 1.
  std::ofstream(out + "/at0.csv") << "step,loss\n0,1\n1,2\n";
  std::ofstream(out + "/at10.csv") << "step,loss\n10,1\n11,2\n";
  for (const char* name : {"at0", "at10"})
    ASSERT_EQ(run_program("plot_metrics",
                          minamp::cat("--out ", out, "/", name, ".png ", out, "/", name, ".csv:L"))
                  .status,
              0);
  EXPECT_NE(minamp::io::read_file(out + "/at0.png"), minamp::io::read_file(out + "/at10.png"));

  const std::string header_only = out + "/header_only.csv", not_a_number = out + "/nan.csv",
                    short_row = out + "/short.csv";
  std::ofstream(header_only) << "step,loss\n";
  std::ofstream(not_a_number) << "step,loss\n0,1.5\n1,abc\n";
  std::ofstream(short_row) << "step,loss\n0\n";
  const std::string huge = out + "/huge.csv", runs = out + "/runs";
  std::ofstream(huge) << "step,loss\n0,-1e308\n1,1e308\n";
  std::ofstream(runs) << "step,loss\n0,1\n";
  std::ofstream(runs + ":12.csv") << "step,loss\n0,1\n";
  const std::pair<std::string, std::vector<std::string>> cases[] = {
      {not_a_number, {not_a_number + ":3: 'abc' is not a number"}},
      {short_row, {short_row + ":2: 1 field where the header has 2"}},
      {huge, {"nothing to draw", "magnitude below 1e300"}}, // a linear axis's span would overflow
      {runs + ":12.csv:AMP", {"could be the file " + runs + " or " + runs + ":12.csv"}},
      {"--column nope " + fp32, {"no column 'nope'", "step,loss"}},
      {"--column skipped --log-y " + fp32, {"nothing to draw", "positive"}},
      {header_only, {"nothing to draw", "'loss'"}},
      {out + "/missing.csv", {"missing.csv", "No such file or directory"}},
      {out + "/missing.csv:label", {"missing.csv: cannot open (No such file or directory)"}},
  };
  for (const auto& [args, parts] : cases) {
    expect_one_line_error(run_program("plot_metrics", "--out " + out + "/bad.png " + args), args,
                          parts);
  }
  EXPECT_FALSE(std::filesystem::exists(out + "/bad.png"));
  expect_one_line_error(run_program("plot_metrics", "--out '' " + fp32), "--out ''",
                        {"--out", "expected a path"});
}

// The loop reads each step's loss, scale and skip flag on the host in batches (not after every
// step, which would wait for the GPU each time); every row must still show its own step's values.
TEST(Examples, MetricsShowEachStepsScaleAndSkipThoughReadInBatches) {
  // metrics.csv rows: step, loss, wall_s, scale, skipped.
  // From S = 1, growth every 3 clean steps: S after step i is 2^((i + 1) / 3) (at most 2^13, far
  // from overflow). 40 steps with no log line before the last: the 32 pending steps are read when
  // the buffer is full, then the last 8.
  std::string out = fresh_dir("batched_reads_growth");
  ProgramRun run = run_program(
      "mlp",
      "--amp --epochs 1 --batches 40 --init-scale 1 --growth-interval 3 --log-every 100 --out " +
          out);
  ASSERT_EQ(run.status, 0) << run.output;
  auto rows = minamp::test::csv_rows(out + "/metrics.csv");
  ASSERT_EQ(rows.size(), 40u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const double expected = double(1 << ((i + 1) / 3));
    EXPECT_NEAR(rows[i][3], expected, 1e-5 * expected) << "step " << i; // 6 digits in the CSV
    EXPECT_EQ(rows[i][4], 0.0) << "step " << i;
  }
  // Every step overflows at S = 1e30 and is skipped: S after step i is 1e30 / 2^(i + 1).
  out = fresh_dir("batched_reads_overflow");
  run = run_program("mlp",
                    "--amp --epochs 1 --batches 10 --init-scale 1e30 --log-every 4 --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  rows = minamp::test::csv_rows(out + "/metrics.csv");
  ASSERT_EQ(rows.size(), 10u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const double expected = double(1e30f) / double(1 << (i + 1));
    EXPECT_NEAR(rows[i][3], expected, 1e-5 * expected) << "step " << i;
    EXPECT_EQ(rows[i][4], 1.0) << "step " << i;
  }
}

} // namespace
