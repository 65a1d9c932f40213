// The example programs used as a careless or hostile user would: two runs on one folder, Ctrl-C
// and SIGTERM, temp files of killed writes, outputs that are inputs or not regular files,
// checkpoints and weights holding what training never produces, a loss scale that collapses,
// and a run too large for memory. Each ends in one line (an error, a warning, or the
// interruption) and writes or replaces nothing it does not own.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/folder_lock.h"
#include "io/safetensors.h"
#include "test_io_util.h"
#include "test_program.h"

namespace minamp {
namespace {

namespace fs = std::filesystem;
using test::expect_one_line_error;
using test::field;
using test::fresh_dir;
using test::ProgramRun;
using test::read_output_json;
using test::run_program;

// The entries of `path` whose names contain ".tmp." or are the lock file.
std::vector<std::string> leftovers_in(const std::string& path) {
  std::vector<std::string> found;
  for (const fs::directory_entry& e : fs::directory_iterator(path)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp.") != std::string::npos || name == io::FolderLock::kFileName)
      found.push_back(name);
  }
  return found;
}

using test::rewrite_safetensors;

// The int64 entry `name` of a safetensors file (train.step, ...).
int64_t int64_entry(const std::string& path, const std::string& name) {
  return io::load_safetensors(path).int64s_named(name).values.at(0);
}

// mlp started in the background with `args` (its output in the temp file `name`), once its
// output holds `text`; a test failure when it never does.
test::BackgroundProgram start_mlp_until(const std::vector<std::string>& args,
                                        const std::string& name, const std::string& text) {
  const test::BackgroundProgram run = test::start_program("mlp", args, fresh_dir(name));
  EXPECT_TRUE(run.wait_for_output(text)) << run.output();
  return run;
}

// Sends `signal` to `run` and returns its exit status (-1, and a test failure, when it did not
// exit but was killed).
int exit_status_after(const test::BackgroundProgram& run, int signal) {
  ::kill(run.pid, signal);
  const int status = run.wait();
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << ": " << run.output();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A second run on a folder another run is writing is refused, naming the folder and the other
// run's PID; SIGTERM then stops the first after its step, with status 143.
TEST(Reliability, ASecondRunOnTheSameFolderIsRefused) {
  const std::string out = fresh_dir("locked_out");
  const test::BackgroundProgram first =
      start_mlp_until({"--epochs", "1000000", "--batches", "1", "--batch-size", "8", "--log-every",
                       "200", "--out", out},
                      "locked_first.log", "step 200/");
  const ProgramRun second = run_program("mlp", "--epochs 1 --batches 2 --out " + out);
  expect_one_line_error(second, "second run",
                        {"--out: " + out + " is in use by another minamp run (PID " +
                         std::to_string(first.pid) + ")"});
  EXPECT_EQ(exit_status_after(first, SIGTERM), 143) << first.output();
  EXPECT_NE(first.output().find("interrupted (SIGTERM): mlp fp32 stopped after "),
            std::string::npos)
      << first.output();
  EXPECT_EQ(field(read_output_json(out + "/summary.json"), "interrupted"), true);
  EXPECT_FALSE(fs::exists(out + "/checkpoint.safetensors")) << "no --checkpoint-every";
  EXPECT_TRUE(leftovers_in(out).empty()) << "the lock file is removed on exit";
  EXPECT_EQ(run_program("mlp", "--epochs 1 --batches 2 --out " + out).status, 0)
      << "the folder is free again";
}

// Ctrl-C: the step under way finishes, a checkpoint of it is written, summary.json says
// "interrupted": true, the program says so in one line and exits with 130; the checkpoint
// continues the run.
TEST(Reliability, CtrlCFinishesTheStepAndWritesTheCheckpoint) {
  const std::string out = fresh_dir("ctrl_c");
  const test::BackgroundProgram run =
      start_mlp_until({"--epochs", "1000000", "--batches", "3", "--checkpoint-every", "100000",
                       "--log-every", "30", "--out", out},
                      "ctrl_c.log", "step 30/");
  ASSERT_EQ(exit_status_after(run, SIGINT), 130) << run.output();
  const nlohmann::json summary = read_output_json(out + "/summary.json");
  EXPECT_EQ(field(summary, "interrupted"), true);
  const int64_t steps = field(summary, "steps_completed").get<int64_t>();
  EXPECT_GE(steps, 30);
  EXPECT_NE(run.output().find("interrupted (SIGINT): mlp fp32 stopped after " +
                              std::to_string(steps) + " of 3000000 steps; wrote " + out),
            std::string::npos)
      << run.output();
  EXPECT_EQ(test::csv_rows(out + "/metrics.csv").size(), size_t(steps));
  EXPECT_EQ(int64_entry(out + "/checkpoint.safetensors", "train.step"), steps);
  EXPECT_TRUE(leftovers_in(out).empty());
  const std::string resumed = fresh_dir("ctrl_c_resumed");
  const int64_t epochs = steps / 3 + 2; // 3 to 5 steps more
  const ProgramRun resume =
      run_program("mlp", "--epochs " + std::to_string(epochs) + " --batches 3 --resume " + out +
                             "/checkpoint.safetensors --out " + resumed);
  ASSERT_EQ(resume.status, 0) << resume.output;
  const nlohmann::json after = read_output_json(resumed + "/summary.json");
  EXPECT_EQ(field(after, "resumed_at_step"), steps);
  EXPECT_EQ(field(after, "steps_completed"), epochs * 3);
  EXPECT_EQ(field(after, "interrupted"), false);
}

// A second Ctrl-C while the first is honoured (the step under way, half a second or so on the
// CPU) ends the program at once, by the signal.
TEST(Reliability, ASecondCtrlCEndsTheProgramAtOnce) {
  const std::string out = fresh_dir("ctrl_c_twice");
  const test::BackgroundProgram run =
      start_mlp_until({"--device", "cpu", "--batch-size", "20000", "--widths", "512,512",
                       "--epochs", "1000", "--batches", "1", "--log-every", "1", "--out", out},
                      "ctrl_c_twice.log", "step 1/");
  ::kill(run.pid, SIGINT);
  // The handler runs once: SIGINT is then no longer caught.
  for (int i = 0; i < 10000 && test::catches_signal(run.pid, SIGINT); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(run.pid, SIGINT);
  const int status = run.wait();
  ASSERT_TRUE(WIFSIGNALED(status)) << "exited with " << WEXITSTATUS(status) << ": " << run.output();
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  // A later run in the folder is not blocked by the lock file the killed one left.
  EXPECT_EQ(run_program("mlp", "--epochs 1 --batches 2 --out " + out).status, 0);
}

// Temp files that killed atomic writes of a run's files left behind are removed by the next run
// in the folder; other files, however alike, stay.
TEST(Reliability, TheNextRunRemovesTheTempFilesOfKilledWrites) {
  const std::string out = fresh_dir("stale_temp_files");
  fs::create_directories(out);
  for (const char* name : {"metrics.csv.tmp.Ab12Cd", "checkpoint.safetensors.tmp.xY9z8w",
                           "notes.txt.tmp.Ab12Cd", "metrics.csv.tmp.long_suffix"})
    io::write_file_atomically(out + "/" + name, "partial");
  io::write_file_atomically(out + "/" + io::FolderLock::kFileName, "999999\n"); // stale lock
  ASSERT_EQ(run_program("mlp", "--epochs 1 --batches 2 --checkpoint-every 1 --out " + out).status,
            0);
  EXPECT_FALSE(fs::exists(out + "/metrics.csv.tmp.Ab12Cd"));
  EXPECT_FALSE(fs::exists(out + "/checkpoint.safetensors.tmp.xY9z8w"));
  EXPECT_TRUE(fs::exists(out + "/notes.txt.tmp.Ab12Cd")) << "not a file this run writes";
  EXPECT_TRUE(fs::exists(out + "/metrics.csv.tmp.long_suffix")) << "not a temp file's name";
  EXPECT_FALSE(fs::exists(out + "/" + io::FolderLock::kFileName));
}

// A folder holds one run's outputs: the next run in it removes what the earlier one wrote and it
// will not write again (named in a note), and what it may fail to write (the final weights of a run
// that diverges), but not an earlier checkpoint, which a run started again without --resume
// would otherwise lose; nor files of other names.
TEST(Reliability, ARunRemovesAnEarlierRunsOutputsButItsCheckpoint) {
  const std::string out = fresh_dir("earlier_outputs");
  const std::string both = " --epochs 4 --batches 2 --out " + out + " --save-weights " + out + "/w";
  ProgramRun run = run_program("mlp", "--amp --profile --checkpoint-every 1" + both);
  ASSERT_EQ(run.status, 0) << run.output;
  for (const char* file :
       {"loss_scale.png", "profile.txt", "checkpoint.safetensors", "w/final.safetensors"})
    ASSERT_TRUE(fs::exists(out + "/" + file)) << file;
  io::write_file_atomically(out + "/notes.txt", "mine");
  run = run_program("mlp", "--lr 1e10" + both); // diverges: no final weights
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("note: --out " + out +
                            ": removed an earlier run's loss_scale.png, "
                            "profile.txt, which this run does not write"),
            std::string::npos)
      << run.output;
  EXPECT_FALSE(fs::exists(out + "/loss_scale.png"));
  EXPECT_FALSE(fs::exists(out + "/profile.txt"));
  EXPECT_FALSE(fs::exists(out + "/w/final.safetensors")) << "the earlier run's, beside this init";
  EXPECT_TRUE(fs::exists(out + "/w/init.safetensors"));
  EXPECT_TRUE(fs::exists(out + "/checkpoint.safetensors"));
  EXPECT_EQ(io::read_file(out + "/notes.txt"), "mine");
  EXPECT_EQ(read_output_json(out + "/summary.json")["lr"], 1e10f);
}

// No run replaces a file it reads, or anything that is not a regular file.
TEST(Reliability, OutputsNeverReplaceInputsOrWhatIsNotAFile) {
  const std::string dir = fresh_dir("inputs_kept");
  const std::string weights = dir + "/w";
  ASSERT_EQ(run_program("mlp", "--epochs 1 --batches 2 --save-weights " + weights + " --out " +
                                   dir + "/first")
                .status,
            0);
  const std::string final_weights = weights + "/final.safetensors";
  const std::string before = io::read_file(final_weights);
  expect_one_line_error(run_program("mlp", "--epochs 1 --batches 2 --load-weights " +
                                               final_weights + " --save-weights " + weights +
                                               " --out " + dir + "/second"),
                        "--load-weights into --save-weights",
                        {"--save-weights: " + final_weights + " is " + final_weights +
                         ", which this run reads: the run would replace it"});
  EXPECT_EQ(io::read_file(final_weights), before);
  EXPECT_FALSE(fs::exists(dir + "/second")) << "a refused run left a folder";

  // plot_metrics: its --out is one of its inputs (by another name too), or a FIFO or a link.
  const std::string csv = dir + "/first/metrics.csv", csv_text = io::read_file(csv);
  fs::create_hard_link(csv, dir + "/same.csv");
  for (const std::string& out : {csv, dir + "/same.csv"})
    expect_one_line_error(run_program("plot_metrics", "--out " + out + " " + csv), out,
                          {"--out", "is the input " + csv + ": the plot would replace it"});
  EXPECT_EQ(io::read_file(csv), csv_text);
  const std::string fifo = dir + "/fifo.png", link = dir + "/link.png";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  fs::create_symlink(csv, link);
  expect_one_line_error(run_program("plot_metrics", "--out " + fifo + " " + csv), fifo,
                        {"--out: " + fifo + ": exists and is a FIFO, not a regular file"});
  expect_one_line_error(run_program("plot_metrics", "--out " + link + " " + csv), link,
                        {"--out: " + link + ": exists and is a symbolic link"});
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(link));
  // bench_train refuses such a --json before any benchmark runs; a run's --out likewise.
  const ProgramRun bench = run_program("bench_train", "--device cpu --models mlp --json " + fifo);
  EXPECT_NE(bench.status, 0);
  EXPECT_NE(bench.output.find("--json: " + fifo + ": exists and is a FIFO"), std::string::npos)
      << bench.output;
  EXPECT_EQ(bench.output.find("timed steps"), std::string::npos) << bench.output;
  fs::create_directories(dir + "/run");
  ASSERT_EQ(::mkfifo((dir + "/run/summary.json").c_str(), 0644), 0);
  expect_one_line_error(run_program("mlp", "--epochs 1 --out " + dir + "/run"), "summary FIFO",
                        {"--out: " + dir + "/run/summary.json: exists and is a FIFO"});
  EXPECT_TRUE(fs::is_fifo(dir + "/run/summary.json"));
}

// Weights for mlp's default model (from a run of it) with every value multiplied by `factor`.
std::string scaled_mlp_weights(const std::string& name, float factor) {
  const std::string dir = fresh_dir(name);
  EXPECT_EQ(
      run_program("mlp", "--epochs 1 --batches 1 --save-weights " + dir + " --out " + dir + "/run")
          .status,
      0);
  const std::string path = dir + "/scaled.safetensors";
  rewrite_safetensors(dir + "/init.safetensors", path, [factor](auto& tensors, auto&) {
    for (io::NamedTensor& t : tensors)
      for (int64_t i = 0; i < t.tensor.numel(); ++i) t.tensor.template data<float>()[i] *= factor;
  });
  return path;
}

// A run whose every step overflows (weights of 1e30 are inf in f16) halves its scale each step:
// once a skipped step leaves it below the smallest normal float, the run stops with an error
// saying loss scaling collapsed. The checkpoints it wrote before load (their scale is valid).
TEST(Reliability, ACollapsedLossScaleStopsTheRun) {
  const std::string huge = scaled_mlp_weights("collapse_weights", 1e30f);
  const std::string out = fresh_dir("collapse");
  // From 1e-36, the 7th halving falls below 1.18e-38; the scale is read at each checkpoint (no
  // progress line before the last step), and the 7th step's is read at the 8th.
  const ProgramRun run =
      run_program("mlp", "--amp --init-scale 1e-36 --epochs 1 --batches 40 --log-every 40 "
                         "--checkpoint-every 2 --load-weights " +
                             huge + " --out " + out);
  expect_one_line_error(run, "collapse",
                        {"amp: loss scaling collapsed after 7 steps: the last 7 overflowed",
                         "below the smallest normal float", "checkpoint.safetensors keeps step 6"});
  EXPECT_EQ(int64_entry(out + "/checkpoint.safetensors", "train.step"), 6);
  // The checkpoint loads; its run collapses again at the next step.
  const ProgramRun resumed = run_program(
      "mlp", "--amp --init-scale 1e-36 --epochs 1 --batches 40 --log-every 40 "
             "--checkpoint-every 2 --resume " +
                 out + "/checkpoint.safetensors --out " + fresh_dir("collapse_resumed"));
  expect_one_line_error(resumed, "resumed collapse", {"loss scaling collapsed after 7 steps"});
}

// Weights and checkpoints holding what training never produces are refused on load, naming the
// file and the entry, before anything is written.
TEST(Reliability, CorruptWeightsAndCheckpointsAreRefused) {
  const std::string source = fresh_dir("corrupt_source");
  ASSERT_EQ(run_program("sine", "--size 8 --hidden 8 --steps 4 --checkpoint-every 2 "
                                "--save-weights " +
                                    source + "/w --out " + source)
                .status,
            0);
  const std::string checkpoint = source + "/checkpoint.safetensors";
  const std::string bad = source + "/bad.safetensors", out = fresh_dir("corrupt_out");
  const std::string resume = "--size 8 --hidden 8 --steps 6 --resume " + bad + " --out " + out;
  // Sets element `index` of tensor `entry` to `value`.
  struct Corruption {
    const char* entry;
    int64_t index;
    float value;
    const char* message;
  };
  const float nan = std::nanf("");
  const Corruption cases[] = {
      {"optimizer.step", 0, nan, "'optimizer.step' is nan, expected an integer from 0 to 4"},
      {"optimizer.step", 0, -1.0f, "'optimizer.step' is -1"},
      {"optimizer.step", 0, 1e30f, "'optimizer.step' is 1e+30"},
      {"optimizer.step", 0, INFINITY, "'optimizer.step' is inf"},
      {"optimizer.step", 0, 0.0f, "'optimizer.step' is 0, but 'log.steps' records 4 steps taken"},
      {"optimizer.exp_avg_sq.0", 1, -1e-3f,
       "'optimizer.exp_avg_sq.0' holds -0.001 at index 1, expected finite values >= 0"},
      {"0.weight", 0, nan, "'0.weight' holds nan at index 0"},
      {"1.running_var", 2, INFINITY, "'1.running_var' holds inf at index 2"},
      // log.steps rows: loss, wall_s, scale, skipped, correct, rows.
      {"log.steps", 1, nan, "'log.steps' row 0: wall_s is nan"},
      {"log.steps", 6, INFINITY, "'log.steps' row 1: the loss of a step taken is inf"},
  };
  for (const Corruption& c : cases) {
    rewrite_safetensors(checkpoint, bad, [&](auto& tensors, auto&) {
      for (io::NamedTensor& t : tensors)
        if (t.name == c.entry) t.tensor.template data<float>()[c.index] = c.value;
    });
    expect_one_line_error(run_program("sine", resume), c.message, {bad, c.message});
    EXPECT_FALSE(fs::exists(out)) << c.message << ": a refused run wrote output";
  }
  // A log entry no example writes is refused, as an unexpected model or optimizer entry is.
  rewrite_safetensors(checkpoint, bad, [](auto& tensors, auto&) {
    tensors.push_back({"log.extra", Tensor::zeros({1})});
  });
  expect_one_line_error(run_program("sine", resume), "log.extra",
                        {bad, "unexpected entry 'log.extra'"});
  EXPECT_FALSE(fs::exists(out)) << "log.extra: a refused run wrote output";
  // --load-weights: a non-finite weight is refused the same way.
  rewrite_safetensors(source + "/w/final.safetensors", bad, [](auto& tensors, auto&) {
    for (io::NamedTensor& t : tensors)
      if (t.name == "4.weight") t.tensor.template data<float>()[3] = -INFINITY;
  });
  expect_one_line_error(
      run_program("sine", "--size 8 --hidden 8 --steps 2 --load-weights " + bad + " --out " + out),
      "NaN weights", {bad, "'4.weight' holds -inf at index 3, expected finite values"});
  EXPECT_FALSE(fs::exists(out));
}

// A run that diverges (weights and losses inf or NaN) writes no checkpoint that loading would
// refuse: it keeps the last good one, says so in a warning, and that checkpoint resumes.
TEST(Reliability, ADivergedRunKeepsItsLastLoadableCheckpoint) {
  const std::string out = fresh_dir("diverged_checkpoints");
  const ProgramRun run =
      run_program("mlp", "--lr 1e10 --epochs 4 --batches 2 --checkpoint-every 1 --save-weights " +
                             out + "/w --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("warning: fp32: training diverged by step "), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("checkpoint.safetensors keeps step "), std::string::npos) << run.output;
  const int64_t kept = int64_entry(out + "/checkpoint.safetensors", "train.step");
  EXPECT_LT(kept, 8);
  const ProgramRun resumed =
      run_program("mlp", "--lr 1e10 --epochs 5 --batches 2 --checkpoint-every 1 --resume " + out +
                             "/checkpoint.safetensors --out " + fresh_dir("diverged_resumed"));
  EXPECT_EQ(resumed.status, 0) << resumed.output;
}

// A step too large for memory names the options that made it so, and leaves no folder behind.
TEST(Reliability, OutOfMemoryNamesTheOptionsAndLeavesNoFolder) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer reserves more address space than the limit allows";
#endif
  const std::string out = fresh_dir("out_of_memory");
  // 2048^2 pixels x 1024 channels is 16 GiB for one activation; the address space is 1 GiB.
  const ProgramRun run = run_program(
      "sine", "--device cpu --size 2048 --hidden 1024 --layers 0 --steps 1 --out " + out,
      "ulimit -v 1000000;");
  expect_one_line_error(run, "--size 2048",
                        {"error: out of memory (cpu allocator: out of memory allocating",
                         "--size 2048, --hidden 1024 and --layers 0 ask for more memory than "
                         "is available; lower them"});
  EXPECT_FALSE(fs::exists(out)) << "an empty folder was left";
}

} // namespace
} // namespace minamp
