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
#include "io/image.h"
#include "io/safetensors.h"
#include "nn/resnet.h"
#include "test_io_util.h"
#include "test_program.h"

namespace minamp {
namespace {

namespace fs = std::filesystem;
using test::expect_error_line;
using test::fresh_dir;
using test::ProgramRun;
using test::run_program;

std::string fixture() { return std::string(MINAMP_SOURCE_DIR) + "/data/tiny-images"; }

// ResNet-18 at 64x64, batch 4: 6 training and 3 validation images.
std::string data_options(int batch_size = 4) {
  return cat("--images ", fixture(), " --arch resnet18 --image-size 64 --batch-size ", batch_size,
             " --val-fraction 0.34");
}

// Training on data_options: one step an epoch.
std::string small_run(int epochs, int batch_size = 4) {
  return cat(data_options(batch_size), " --epochs ", epochs);
}

// Writes the weights of a seeded ResNet-18 of `classes` classes and stem `width` to `path`, as a
// --pretrained file.
void save_resnet18(const std::string& path, int64_t classes, int64_t width, uint64_t seed) {
  Rng rng(seed);
  nn::ResNetOptions options;
  options.arch = nn::ResNetArch::resnet18;
  options.num_classes = classes;
  options.width = width;
  nn::ResNet model(options, rng);
  io::save_weights(path, model);
}

// A copy of the fixture's image folder in `dir`/images, for tests that change it.
std::string copy_of_fixture(const std::string& dir) {
  fs::create_directories(dir);
  fs::copy(fixture(), dir + "/images", fs::copy_options::recursive);
  return dir + "/images";
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
      run_program("transfer", data_options() + " --predict --load-weights " + out +
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
  save_resnet18(dir + "/r18.safetensors", 5, 64, 7);
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
  expect_error_line(run_program("transfer", data_options() + " --predict"),
                    {"--predict", "needs trained weights"});
  // --predict from a file whose fc is left out would predict with an untrained classifier.
  expect_error_line(
      run_program("transfer", data_options() + " --predict --pretrained " + dir +
                                  "/r18.safetensors --out " + dir + "/p"),
      {"--predict", "r18.safetensors's fc has 5 classes, this folder 3", "untrained classifier"});
  EXPECT_FALSE(fs::exists(dir + "/p"));
}

// An fc that is not this backbone's classifier for another number of classes (other in-features,
// another rank) is no fc to leave out: loading the file fails, naming the entry.
TEST(Transfer, PretrainedFcOfAnotherShapeIsAnError) {
  const std::string dir = fresh_dir("transfer_pretrained_fc");
  fs::create_directories(dir);
  save_resnet18(dir + "/narrow.safetensors", 3, 32, 3); // fc reads 256 features, not 512
  const ProgramRun run = run_program("transfer", small_run(1) + " --pretrained " + dir +
                                                     "/narrow.safetensors --out " + dir + "/o");
  expect_error_line(run, {"narrow.safetensors"});
  EXPECT_EQ(run.output.find("fc starts from its seeded initialisation"), std::string::npos)
      << run.output;
  EXPECT_FALSE(fs::exists(dir + "/o"));
}

// --pretrained is recorded as its canonical path, as --images is: a resumed run may name the file
// another way.
TEST(Transfer, ResumeTakesThePretrainedFileByAnotherName) {
  const std::string dir = fresh_dir("transfer_pretrained_path");
  fs::create_directories(dir + "/sub");
  save_resnet18(dir + "/r18.safetensors", 3, 8, 5);
  const std::string common = data_options() + " --width 8 --checkpoint-every 1 --out " + dir + "/o";
  const ProgramRun first =
      run_program("transfer", common + " --epochs 2 --pretrained " + dir + "/r18.safetensors");
  ASSERT_EQ(first.status, 0) << first.output;
  fs::copy_file(dir + "/o/checkpoint.safetensors", dir + "/at2.safetensors");
  const ProgramRun resumed =
      run_program("transfer", common + " --epochs 3 --pretrained " + dir +
                                  "/sub/../r18.safetensors --resume " + dir + "/at2.safetensors");
  EXPECT_EQ(resumed.status, 0) << resumed.output;
}

// --predict and --max-batch refuse the options they would ignore.
TEST(Transfer, ModesRefuseTheOptionsTheyWouldIgnore) {
  const std::string weights = fresh_dir("transfer_modes") + "/w.safetensors";
  const std::string predict = data_options() + " --predict --load-weights " + weights;
  const std::string max_batch = cat("--images ", fixture(),
                                    " --arch resnet18 --width 8 "
                                    "--image-size 32 --max-batch --memory-limit 24MiB");
  const std::pair<std::string, std::string> cases[] = {
      {predict + " --epochs 2", "--epochs"},
      {predict + " --save-weights x", "--save-weights"},
      {predict + " --resume x", "--resume"},
      {predict + " --compare-dtypes", "--compare-dtypes"},
      {predict + " --lr 0.1", "--lr"},
      {max_batch + " --batch-size 8", "--batch-size"},
      {max_batch + " --load-weights " + weights, "--load-weights"},
      {max_batch + " --checkpoint-every 1", "--checkpoint-every"},
  };
  for (const auto& [args, option] : cases)
    expect_error_line(run_program("transfer", args),
                      {option + ": is not used with",
                       args.find("--predict") != std::string::npos ? "--predict" : "--max-batch"});
}

// What fails on the data is refused before anything is written: an output folder inside the image
// folder (its plots would join the data), an image whose header stb cannot read (checked up front,
// though images are decoded batch by batch), an image name that is a link to nothing, a batch of
// one image where layer4's batch norms would see one value per channel.
TEST(Transfer, DataProblemsAreRefusedBeforeAnythingIsWritten) {
  const std::string dir = fresh_dir("transfer_data_problems");
  const std::string images = copy_of_fixture(dir);
  const std::string args = cat("--images ", images,
                               " --arch resnet18 --width 8 --image-size 32 "
                               "--batch-size 2 --epochs 1 --val-fraction 0.34");
  for (const std::string& out : {images + "/circles", images + "/new_class", images})
    expect_error_line(run_program("transfer", args + " --out " + out),
                      {"--out", "lies inside " + images, "would join the data"});
  expect_error_line(
      run_program("transfer", args + " --out " + dir + "/o --save-weights " + images + "/w"),
      {"--save-weights", "lies inside"});
  expect_error_line(run_program("transfer", cat("--images ", images,
                                                " --arch resnet18 --width 8 "
                                                "--image-size 32 --max-batch --memory-limit 24MiB "
                                                "--out ",
                                                images, "/mb")),
                    {"--out", "lies inside"});
  EXPECT_EQ(io::list_image_folder(images).files.size(), 9u) << "no image was added";
  EXPECT_FALSE(fs::exists(images + "/new_class"));

  // One value per channel at layer4 (32x32 images halve five times to 1x1).
  expect_error_line(run_program("transfer", cat("--images ", images,
                                                " --arch resnet18 --width 8 "
                                                "--image-size 32 --batch-size 1 --epochs 1 "
                                                "--val-fraction 0.34 --out ",
                                                dir, "/o")),
                    {"--batch-size", "1 at --image-size 32", "one value per channel"});

  const std::string bad = dir + "/bad_images";
  fs::copy(images, bad, fs::copy_options::recursive);
  const std::string first = io::list_image_folder(bad).files.back(); // trained on or held out
  test::write_bytes(first, io::read_file(first).substr(0, 20));      // a cut header
  const std::string bad_args = cat("--images ", bad,
                                   " --arch resnet18 --width 8 --image-size 32 "
                                   "--batch-size 2 --epochs 1 --val-fraction 0.34 --out ",
                                   dir, "/o --save-weights ", dir, "/w");
  expect_error_line(run_program("transfer", bad_args), {"load_image", first});
  fs::remove(first);
  fs::create_symlink(dir + "/nothing.png", first);
  expect_error_line(run_program("transfer", bad_args),
                    {"load_image_folder", first, "not a regular file (a link to nothing)"});
  EXPECT_FALSE(fs::exists(dir + "/o"));
  EXPECT_FALSE(fs::exists(dir + "/w"));
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
  EXPECT_EQ(summary["width"], 8);
  // Not even the smallest batch fits: an error, not a max batch of 0.
  const std::string none = fresh_dir("transfer_max_batch_none");
  expect_error_line(run_program("transfer", cat("--images ", fixture(),
                                                " --arch resnet18 --width 8 --image-size 32 "
                                                "--max-batch --memory-limit 1MiB --out ",
                                                none)),
                    {"--max-batch", "FP32: a step of 2 images", "is out of memory",
                     "under --memory-limit 1048576 bytes"});
  EXPECT_FALSE(fs::exists(none));
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
