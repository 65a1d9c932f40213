// The transfer example end to end on the image-folder fixture in data/tiny-images (3 classes of 3
// images): ResNet-18 at 64x64, batch 4, fine-tunes and writes its per-epoch figures; resumes bit
// for bit; starts from --pretrained weights whose fc has another size, keeping a frozen backbone
// as it was; predicts; finds the largest batch under a memory limit; and refuses what cannot work
// with one-line errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <sstream>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "nn/resnet.h"
#include "test_program.h"

namespace minamp {
namespace {

namespace fs = std::filesystem;
using test::expect_error_line;
using test::fresh_dir;
using test::ProgramRun;
using test::run_program;

std::string fixture() { return std::string(MINAMP_SOURCE_DIR) + "/data/tiny-images"; }

// ResNet-18 at 64x64, batch 4: 6 training and 3 validation images, one step an epoch.
std::string small_run(int epochs, int batch_size = 4) {
  return cat("--images ", fixture(), " --arch resnet18 --image-size 64 --batch-size ", batch_size,
             " --epochs ", epochs, " --val-fraction 0.34");
}

nlohmann::json summary_of(const std::string& out) {
  return nlohmann::json::parse(io::read_file(out + "/summary.json"));
}

// The values of one entry of a weights file.
std::vector<float> entry(const std::string& path, const std::string& name) {
  return io::load_safetensors(path).tensor(name).to_vector();
}

// Lines of a file.
std::vector<std::string> lines_of(const std::string& path) {
  std::istringstream in(io::read_file(path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Transfer, FineTunesAResNetAndWritesEpochFiguresPlotsAndWeights) {
  const std::string out = fresh_dir("transfer_trains");
  const ProgramRun run =
      run_program("transfer", small_run(2) + " --out " + out + " --save-weights " + out + "/w");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("6 training and 3 validation images, 3 classes"), std::string::npos)
      << run.output;
  for (const char* line : {"epoch 1/2  train loss", "epoch 2/2  train loss", "images/s, peak"})
    EXPECT_NE(run.output.find(line), std::string::npos) << line << "\n" << run.output;
  const std::vector<std::vector<double>> epochs = test::csv_rows(out + "/epochs.csv");
  ASSERT_EQ(epochs.size(), 2u);
  // epoch,train_loss,train_accuracy,test_loss,test_accuracy,wall_s,images_per_s,peak_mib
  for (const auto& row : epochs) {
    ASSERT_EQ(row.size(), 8u);
    EXPECT_GT(row[6], 0.0) << "images/s";
    EXPECT_GT(row[7], 40.0) << "peak MiB: ResNet-18's weights alone are 43 MiB";
  }
  EXPECT_EQ(summary_of(out)["epochs"], 2);
  EXPECT_EQ(summary_of(out)["config"]["arch"], "resnet18");
  for (const char* file : {"loss.png", "accuracy.png", "metrics.csv", "w/final.safetensors"})
    EXPECT_TRUE(fs::exists(out + "/" + file)) << file;
  // torchvision's names and the fc of this folder's 3 classes.
  EXPECT_EQ(io::load_safetensors(out + "/w/final.safetensors").tensor("fc.weight").shape(),
            (Shape{3, 512}));

  // --predict: the validation images, their classes and logits, with no training.
  const std::string predicted = fresh_dir("transfer_predicts");
  const ProgramRun predict =
      run_program("transfer", small_run(2) + " --predict --load-weights " + out +
                                  "/w/final.safetensors --out " + predicted);
  ASSERT_EQ(predict.status, 0) << predict.output;
  EXPECT_NE(predict.output.find("of 3 validation images predicted right"), std::string::npos)
      << predict.output;
  const std::vector<std::string> lines = lines_of(predicted + "/predictions.csv");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "path,true_class,predicted_class,logit_0,logit_1,logit_2");
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> fields;
    std::istringstream row(lines[i]);
    for (std::string field; std::getline(row, field, ',');) fields.push_back(field);
    ASSERT_EQ(fields.size(), 6u) << lines[i];
    EXPECT_EQ(fields[0].rfind(fixture() + "/" + fields[1] + "/", 0), 0u) << "its class folder";
    const std::vector<std::string> classes{"circles", "squares", "stripes"};
    int best = 0;
    for (int k = 1; k < 3; ++k)
      if (std::stod(fields[size_t(3 + k)]) > std::stod(fields[size_t(3 + best)])) best = k;
    EXPECT_EQ(fields[2], classes[size_t(best)]) << "the largest logit's class";
  }
  EXPECT_FALSE(fs::exists(predicted + "/summary.json")) << "--predict trains nothing";
}

TEST(Transfer, ResumesBitForBit) {
  test::expect_resume_equals_uninterrupted("transfer", small_run(3) + " --augment", 2,
                                           "transfer_fp32");
  test::expect_resume_equals_uninterrupted(
      "transfer", small_run(3) + " --amp --freeze-backbone --width 16", 2, "transfer_amp_frozen");
}

// A pretrained file of 5 classes: its fc is left out with a note, everything else loads; with a
// frozen backbone the convolutions end as they started and only fc trains.
TEST(Transfer, PretrainedWeightsLoadAroundAnotherFcAndAFrozenBackboneStays) {
  const std::string dir = fresh_dir("transfer_pretrained");
  fs::create_directories(dir);
  Rng rng(7);
  nn::ResNetOptions options;
  options.arch = nn::ResNetArch::resnet18;
  options.num_classes = 5;
  nn::ResNet pretrained(options, rng);
  io::save_weights(dir + "/r18.safetensors", pretrained);
  const ProgramRun run = run_program(
      "transfer", small_run(2) + " --pretrained " + dir + "/r18.safetensors" +
                      " --freeze-backbone --out " + dir + "/out --save-weights " + dir + "/w");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("r18.safetensors's fc is [5, 512], this folder has 3 classes"),
            std::string::npos)
      << run.output;
  const std::string init = dir + "/w/init.safetensors", final = dir + "/w/final.safetensors";
  for (const char* name : {"conv1.weight", "layer3.1.conv2.weight", "layer4.0.downsample.0.weight"})
    EXPECT_EQ(entry(final, name), entry(dir + "/r18.safetensors", name)) << name;
  EXPECT_NE(entry(final, "fc.weight"), entry(init, "fc.weight")) << "fc trained";

  // Both starting points at once, or --predict without trained weights, are refused.
  expect_error_line(
      run_program("transfer", small_run(1) + " --pretrained " + init + " --load-weights " + init),
      {"--pretrained", "give one"});
  expect_error_line(run_program("transfer", small_run(1) + " --predict"),
                    {"--predict", "needs trained weights"});
}

// The largest batch of a training step under a memory limit, FP32 and AMP; AMP's activations
// take half the bytes, so it fits more.
TEST(Transfer, MaxBatchUnderAMemoryLimit) {
  const std::string out = fresh_dir("transfer_max_batch");
  const std::string args = cat("--images ", fixture(),
                               " --arch resnet18 --width 8 --image-size 32 --max-batch "
                               "--memory-limit 24MiB --out ",
                               out);
  const ProgramRun run = run_program("transfer", args);
  ASSERT_EQ(run.status, 0) << run.output;
  const nlohmann::json summary = summary_of(out);
  const int64_t fp32 = summary["max_batch"]["fp32"], amp = summary["max_batch"]["amp"];
  EXPECT_GT(fp32, 4);
  EXPECT_GT(amp, fp32) << run.output;
  EXPECT_EQ(summary["memory_limit"], 24 << 20);
  EXPECT_LE(summary["peak_bytes"]["amp"].get<int64_t>(), 24 << 20);
  EXPECT_EQ(summary["limited_by"]["fp32"], "memory");
  EXPECT_EQ(summary["limited_by"]["amp"], "memory");
  EXPECT_NE(run.output.find(cat("fp32: batch ", fp32 + 1, " is out of memory")), std::string::npos)
      << "the search tried one more\n"
      << run.output;
  expect_error_line(run_program("transfer", cat("--images ", fixture(),
                                                " --device cpu --max-batch --out ", out, "/x")),
                    {"--max-batch", "needs --memory-limit on the cpu"});
}

TEST(Transfer, OutOfMemoryAndBadOptionsAreOneLineErrorsWithNoOutput) {
  const std::string out = fresh_dir("transfer_refused");
  expect_error_line(
      run_program("transfer", small_run(1) + " --memory-limit 8MiB --out " + out),
      {"out of memory", "memory limit is 8388608 bytes", "--batch-size 4, --image-size 64"});
  expect_error_line(run_program("transfer", small_run(1) + " --memory-limit 6XB"),
                    {"--memory-limit", "expected a size in bytes", "6XB"});
  expect_error_line(run_program("transfer", small_run(1) + " --val-fraction 1"),
                    {"--val-fraction", "between 0 and 1"});
  expect_error_line(run_program("transfer", "--arch resnet18"), {"--images is required"});
  expect_error_line(run_program("transfer", small_run(1, 7)),
                    {"--batch-size", "7 is more than the 6 training images"});
  EXPECT_FALSE(fs::exists(out)) << "a failed run wrote output";
}

} // namespace
} // namespace minamp
