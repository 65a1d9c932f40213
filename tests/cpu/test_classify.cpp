// The classify example end to end on small data: a synthetic Fashion-MNIST-shaped data set
// written here as gzipped IDX files, and the image-folder fixture in data/. It learns, reports
// per-epoch figures, writes plots and weights, resumes bit for bit in FP32 and AMP, and turns a
// missing or corrupt data set and bad checkpoints into one-line errors with no output written.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "test_program.h"

namespace minamp {
namespace {

namespace fs = std::filesystem;
using test::fresh_dir;
using test::ProgramRun;
using test::run_program;

// Writes a gzipped u8 IDX file: magic, big-endian dimensions, values.
void write_idx_gz(const std::string& path, const std::vector<uint32_t>& dims,
                  const std::vector<uint8_t>& values) {
  std::string bytes{0, 0, 0x08, char(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(char((d >> shift) & 0xff));
  bytes.append(values.begin(), values.end());
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  gzclose(file);
}

// One split of a 10-class, 28x28 data set that a tiny CNN separates in a few steps: class k is a
// bright 3-row band at rows 2k+2 .. 2k+4, on noise. `labels` (count of them) overrides the
// drawn labels.
void write_split(const std::string& dir, const std::string& prefix, uint32_t count, Rng& rng,
                 std::vector<uint8_t> labels = {}) {
  std::vector<uint8_t> pixels;
  const bool draw_labels = labels.empty();
  for (uint32_t i = 0; i < count; ++i) {
    if (draw_labels) labels.push_back(uint8_t(rng.below(10)));
    for (uint32_t row = 0; row < 28; ++row)
      for (uint32_t col = 0; col < 28; ++col) {
        const bool band = row >= 2u * labels[i] + 2 && row < 2u * labels[i] + 5;
        pixels.push_back(uint8_t(band ? 200 + rng.below(56) : rng.below(60)));
      }
  }
  write_idx_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", {count, 28, 28}, pixels);
  write_idx_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", {uint32_t(labels.size())}, labels);
}

// A synthetic data set in a new directory: 384 training images (12 batches of 32), 100 test.
std::string synthetic_data(const std::string& name) {
  const std::string dir = fresh_dir(name);
  fs::create_directories(dir);
  Rng rng(11);
  write_split(dir, "train", 384, rng);
  write_split(dir, "t10k", 100, rng);
  return dir;
}

// The synthetic data set of the running test, written once (ctest runs tests in parallel, each
// in its own process, so each test has its own copy).
const std::string& data() {
  static const std::string dir =
      synthetic_data(std::string("classify_data_") +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
  return dir;
}

// --data, a tiny model (width 4 by default) and batch 32 (by default: 12 steps per epoch).
std::string small_run(const std::string& data_dir, int epochs, int batch_size = 32, int width = 4) {
  return "--data " + data_dir + " --epochs " + std::to_string(epochs) + " --batch-size " +
         std::to_string(batch_size) + " --width " + std::to_string(width);
}

// Expects a failed run with exactly one error line, containing each of `fragments`.
void expect_one_line_error(const ProgramRun& run, const std::vector<std::string>& fragments) {
  test::expect_error_line(run, fragments);
}

bool is_png(const std::string& path) {
  return fs::exists(path) && io::read_file(path).rfind("\x89PNG\r\n\x1a\n", 0) == 0;
}

nlohmann::json summary_of(const std::string& out) {
  return nlohmann::json::parse(io::read_file(out + "/summary.json"));
}

TEST(Classify, LearnsAndWritesEpochFiguresPlotsAndPyTorchWeights) {
  const std::string out = fresh_dir("classify_learns");
  const ProgramRun run = run_program("classify", small_run(data(), 3) + " --amp --out " + out +
                                                     " --save-weights " + out + "/weights");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("384 training and 100 test images, 10 classes"), std::string::npos)
      << run.output;
  for (const char* line : {"epoch 1/3  train loss", "epoch 3/3  train loss"})
    EXPECT_NE(run.output.find(line), std::string::npos) << run.output;

  const nlohmann::json summary = summary_of(out);
  EXPECT_EQ(summary["epochs"], 3);
  EXPECT_EQ(summary["steps"], 36);
  EXPECT_GT(summary["test_accuracy"].get<double>(), 0.6) << "chance is 0.1";
  EXPECT_EQ(test::csv_without_column(out + "/epochs.csv", 99).size(), 4u);
  EXPECT_EQ(test::csv_without_column(out + "/metrics.csv", 99).size(), 37u);
  // An epoch's train loss is the mean of its 12 steps' losses (metrics.csv: step,loss,...).
  const std::vector<std::vector<double>> steps = test::csv_rows(out + "/metrics.csv");
  double first_epoch = 0;
  for (int i = 0; i < 12; ++i) first_epoch += steps.at(i).at(1) / 12;
  const double train_loss = test::csv_rows(out + "/epochs.csv").at(0).at(1);
  EXPECT_NEAR(train_loss, first_epoch, 1e-5 * first_epoch); // both printed to 6 digits
  for (const char* plot : {"loss.png", "accuracy.png", "loss_scale.png"})
    EXPECT_TRUE(is_png(out + "/" + plot)) << plot;

  const io::SafetensorsFile init = io::load_safetensors(out + "/weights/init.safetensors");
  const io::SafetensorsFile final = io::load_safetensors(out + "/weights/final.safetensors");
  EXPECT_EQ(final.tensor("0.weight").shape(), (Shape{4, 1, 3, 3})); // [Cout, Cin, kh, kw]
  EXPECT_EQ(final.tensor("9.weight").shape(), (Shape{8, 8, 3, 3}));
  EXPECT_EQ(final.tensor("13.weight").shape(), (Shape{10, 8 * 7 * 7})); // Linear [out, in]
  EXPECT_FALSE(final.has_tensor("0.bias")) << "convs before BN have no bias";
  EXPECT_EQ(init.int64s_named("10.num_batches_tracked").values, std::vector<int64_t>{0});
  EXPECT_EQ(final.int64s_named("10.num_batches_tracked").values, std::vector<int64_t>{36});
  EXPECT_NE(init.tensor("13.weight").to_vector(), final.tensor("13.weight").to_vector());
}

// The test figures are those of the model's predictions: with its last layer's weights zeroed
// and its bias favouring the last class (10 vs 0), and lr 0, every logit row is that bias, so
// the test accuracy is the share of test images of class 9 (30 of 100; 8 are of class 0), and
// the test loss is log(9 + e^10) - 10 for those and log(9 + e^10) for the others, averaged over
// every image.
TEST(Classify, TestAccuracyAndLossAreThoseOfThePredictions) {
  const std::string dir = fresh_dir("classify_known_predictions");
  fs::create_directories(dir);
  Rng rng(12);
  std::vector<uint8_t> train_labels; // 38 of the 384 are class 9
  for (int i = 0; i < 384; ++i) train_labels.push_back(uint8_t(i % 10));
  write_split(dir, "train", 384, rng, train_labels);
  std::vector<uint8_t> labels;
  for (int i = 0; i < 100; ++i) labels.push_back(uint8_t(i < 30 ? 9 : i % 9));
  write_split(dir, "t10k", 100, rng, labels);
  const std::string out = fresh_dir("classify_known_predictions_out");
  ASSERT_EQ(run_program("classify", small_run(dir, 1) + " --out " + out + "/first" +
                                        " --save-weights " + out + "/weights")
                .status,
            0);

  io::SafetensorsFile weights = io::load_safetensors(out + "/weights/init.safetensors");
  for (io::NamedTensor& t : weights.tensors) {
    if (t.name == "13.weight") t.tensor = Tensor::zeros(t.tensor.shape());
    if (t.name == "13.bias") {
      std::vector<float> bias(10, 0.0f);
      bias[9] = 10.0f;
      t.tensor = Tensor::from_vector(bias, {10});
    }
  }
  const std::string chosen = out + "/chosen.safetensors";
  io::save_safetensors(chosen, weights.tensors, weights.metadata, weights.int64s);
  const ProgramRun run = run_program("classify", small_run(dir, 1) + " --lr 0 --load-weights " +
                                                     chosen + " --out " + out + "/second");
  ASSERT_EQ(run.status, 0) << run.output;

  const nlohmann::json summary = summary_of(out + "/second");
  EXPECT_NEAR(summary["test_accuracy"].get<double>(), 0.3, 1e-7);
  // The training batches' accuracy too (every image is predicted 9), in epoch 1's row.
  // epoch,train_loss,train_accuracy,test_loss,test_accuracy,wall_s,images_per_s,peak_mib
  const std::vector<double> epoch = test::csv_rows(out + "/second/epochs.csv").at(0);
  ASSERT_EQ(epoch.size(), 8u);
  EXPECT_EQ(epoch[0], 1.0) << "epochs are numbered from 1";
  EXPECT_NEAR(epoch[2], 38.0 / 384.0, 1e-6); // train_accuracy
  const double log_sum_exp = std::log(9.0 + std::exp(10.0));
  const double expected_loss = 0.3 * (log_sum_exp - 10.0) + 0.7 * log_sum_exp;
  EXPECT_NEAR(summary["test_loss"].get<double>(), expected_loss, 1e-5 * expected_loss);
}

TEST(Classify, ResumeEqualsUninterruptedBitForBit) {
  // 36 steps of 12 per epoch: a checkpoint in mid-epoch (step 20) and at an epoch's end (24).
  // AMP with a short growth interval, so that the scale grows, overflows and backs off.
  const std::string amp = " --amp --init-scale 1048576 --growth-interval 3";
  for (int at : {20, 24}) {
    test::expect_resume_equals_uninterrupted("classify", small_run(data(), 3), at,
                                             "classify_fp32_" + std::to_string(at));
    const std::string whole = test::expect_resume_equals_uninterrupted(
        "classify", small_run(data(), 3) + amp, at, "classify_amp_" + std::to_string(at));
    EXPECT_GT(summary_of(whole)["skipped_steps"].get<int>(), 0) << "AMP should back off here";
  }
}

// At 18x18, not a multiple of 4: the stride-2 convs round up (18 -> 9 -> 5), as PyTorch's do.
TEST(Classify, TrainsOnTheImageFolderFixture) {
  const std::string out = fresh_dir("classify_folder");
  const ProgramRun run = run_program(
      "classify", std::string("--images ") + MINAMP_SOURCE_DIR +
                      "/data/tiny-images --image-size 18 --batch-size 2 --width 4 --epochs 2 "
                      "--holdout-every 3 --out " +
                      out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_NE(run.output.find("6 training and 3 test images, 3 classes"), std::string::npos)
      << run.output;
  // Each image keeps its class's label in the split (the first of each class is held out).
  EXPECT_NE(run.output.find("images per class: train 2 2 2, test 1 1 1"), std::string::npos)
      << run.output;
  EXPECT_EQ(summary_of(out)["epochs"], 2);

  // --subset takes the first N of both splits; progress lines name the epoch of their step.
  const ProgramRun subset = run_program(
      "classify", std::string("--images ") + MINAMP_SOURCE_DIR +
                      "/data/tiny-images --image-size 18 --batch-size 1 --width 4 --epochs 2 "
                      "--holdout-every 3 --subset 2 --log-every 1 --out " +
                      fresh_dir("classify_folder_subset"));
  ASSERT_EQ(subset.status, 0) << subset.output;
  EXPECT_NE(subset.output.find("2 training and 2 test images"), std::string::npos) << subset.output;
  for (const char* line : {"epoch 1/2  step 1/4", "epoch 1/2  step 2/4", "epoch 2/2  step 3/4"})
    EXPECT_NE(subset.output.find(line), std::string::npos) << line << "\n" << subset.output;
}

// An error is the last line of the run's output, after the lines printed before it, also when
// stdout (block-buffered in a pipe) and stderr go to one file.
TEST(Classify, AnErrorComesAfterTheLinesPrintedBeforeIt) {
  const std::string folder = std::string("--images ") + MINAMP_SOURCE_DIR +
                             "/data/tiny-images --image-size 8 --batch-size 2 --epochs 1 ";
  const std::string narrow = fresh_dir("classify_order_narrow");
  ASSERT_EQ(
      run_program("classify", folder + "--width 4 --out " + narrow + " --save-weights " + narrow)
          .status,
      0);
  const ProgramRun run =
      run_program("classify", folder + "--width 8 --out " + fresh_dir("classify_order_wide") +
                                  " --load-weights " + narrow + "/final.safetensors");
  EXPECT_NE(run.status, 0);
  const size_t info = run.output.find("6 training and 3 test images");
  const size_t error = run.output.find("error: load_weights: ");
  ASSERT_NE(info, std::string::npos) << run.output;
  ASSERT_NE(error, std::string::npos) << run.output;
  EXPECT_LT(info, error) << run.output;
  EXPECT_EQ(run.output.find('\n', error), run.output.size() - 1) << run.output;
}

// The last partial batch of an epoch is dropped: 384 images in batches of 100 make 3 steps an
// epoch, each epoch over its own order of the images.
TEST(Classify, EpochsDropTheLastPartialBatch) {
  const std::string out = fresh_dir("classify_partial_batch");
  const ProgramRun run = run_program("classify", small_run(data(), 2, 100) + " --out " + out);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(summary_of(out)["steps"], 6);
  EXPECT_EQ(test::csv_rows(out + "/metrics.csv").size(), 6u);
}

TEST(Classify, DataProblemsAreOneLineErrorsWithNoOutput) {
  const std::string out = fresh_dir("classify_bad_data");
  expect_one_line_error(run_program("classify", "--data /nonexistent/fm --out " + out),
                        {"/nonexistent/fm", "dataset-fashion-mnist"});
  expect_one_line_error(run_program("classify", "--images /nonexistent/img --out " + out),
                        {"/nonexistent/img", "not a directory"});
  expect_one_line_error(run_program("classify", small_run(data(), 1, 385) + " --out " + out),
                        {"--batch-size", "385 is more than the 384 training images"});
  const ProgramRun whole_batch = run_program("classify", small_run(data(), 1, 384) + " --out " +
                                                             fresh_dir("classify_whole_batch"));
  EXPECT_EQ(whole_batch.status, 0) << "one batch of all the training images\n"
                                   << whole_batch.output;
  // Options that would be ignored are refused.
  expect_one_line_error(
      run_program("classify", small_run(data(), 1) + " --image-size 16 --out " + out),
      {"--image-size requires --images"});
  expect_one_line_error(
      run_program("classify", small_run(data(), 1) + " --images data/tiny-images --out " + out),
      {"--data excludes --images"});

  const std::string bad = synthetic_data("classify_corrupt");
  const std::string images = bad + "/train-images-idx3-ubyte.gz";
  const std::string whole = io::read_file(images);
  io::write_file_atomically(images, whole.substr(0, whole.size() / 2));
  expect_one_line_error(run_program("classify", small_run(bad, 1) + " --out " + out), {images});

  Rng rng(3);
  write_split(bad, "train", 40, rng);
  write_idx_gz(bad + "/train-labels-idx1-ubyte.gz", {39}, std::vector<uint8_t>(39, 1));
  expect_one_line_error(run_program("classify", small_run(bad, 1) + " --out " + out),
                        {"train-labels-idx1-ubyte.gz", "39 labels for the 40 images"});
  std::vector<uint8_t> labels(40, 2);
  labels[7] = 10; // 10 classes: 0 to 9
  write_split(bad, "train", 40, rng, labels);
  expect_one_line_error(run_program("classify", small_run(bad, 1) + " --out " + out),
                        {"train-labels-idx1-ubyte.gz", "label 10 of image 7"});
  EXPECT_FALSE(fs::exists(out)) << "a failed run wrote output";
}

TEST(Classify, ImageFoldersThatCannotTrainAreOneLineErrors) {
  const std::string out = fresh_dir("classify_bad_folder");
  const std::string fixture = std::string(MINAMP_SOURCE_DIR) + "/data/tiny-images";
  const std::string one_class = fresh_dir("classify_one_class");
  fs::create_directories(one_class);
  fs::copy(fixture + "/circles", one_class + "/circles");
  expect_one_line_error(run_program("classify", "--images " + one_class + " --out " + out),
                        {one_class, "1 class; a classifier needs at least 2"});
  const std::string one_each = fresh_dir("classify_one_image_each"); // all held out for testing
  for (const char* name : {"circles", "squares"}) {
    fs::create_directories(one_each + "/" + name);
    fs::copy(fixture + "/" + name + "/img0.png", one_each + "/" + name + "/img0.png");
  }
  expect_one_line_error(run_program("classify", "--images " + one_each + " --out " + out),
                        {one_each, "no training images", "--holdout-every"});
  EXPECT_FALSE(fs::exists(out)) << "a failed run wrote output";
  // An output inside the image folder would add its plots to the data: refused.
  const std::string copy = fresh_dir("classify_out_inside");
  fs::copy(fixture, copy, fs::copy_options::recursive);
  for (const std::string& inside : {copy + "/new_class", copy + "/circles"})
    expect_one_line_error(
        run_program("classify", "--images " + copy + " --batch-size 2 --out " + inside),
        {"--out", "lies inside " + copy});
  EXPECT_FALSE(fs::exists(copy + "/new_class"));
  expect_one_line_error(run_program("classify", "--images " + copy + " --channels ''"),
                        {"--channels", "expected 1 or 3, got"});
}

// A FIFO where a data file should be is refused at once (opening it would wait for a writer
// forever), naming the file.
TEST(Classify, AFifoForADataFileIsRefusedAtOnce) {
  const std::string dir = synthetic_data("classify_fifo");
  const std::string images = dir + "/train-images-idx3-ubyte.gz";
  fs::remove(images);
  ASSERT_EQ(::mkfifo(images.c_str(), 0644), 0);
  const std::string out = fresh_dir("classify_fifo_out");
  const ProgramRun run = run_program("classify", small_run(dir, 1) + " --out " + out, "timeout 60");
  EXPECT_NE(run.status, 124) << "classify waited on the FIFO";
  expect_one_line_error(run, {images, "not a regular file (a FIFO)"});
  EXPECT_FALSE(fs::exists(out)) << "a failed run wrote output";
}

// A path that is not UTF-8 (paths are bytes) trains, checkpoints and resumes: summary.json and
// the checkpoint record it escaped ("\xff"), which JSON can hold, and a resumed run reads the
// same record from the same path.
TEST(Classify, APathThatIsNotUtf8IsRecordedEscaped) {
  const std::string images = fresh_dir("classify_images_\xff");
  fs::copy(std::string(MINAMP_SOURCE_DIR) + "/data/tiny-images", images,
           fs::copy_options::recursive);
  const std::string out = fresh_dir("classify_not_utf8");
  const std::string args = "--images '" + images +
                           "' --image-size 8 --batch-size 2 --width 2 --holdout-every 3 "
                           "--checkpoint-every 1 --save-weights " +
                           out + "/w --out " + out;
  const ProgramRun run = run_program("classify", args + " --epochs 1");
  ASSERT_EQ(run.status, 0) << run.output;
  const std::string recorded = summary_of(out)["config"]["data"];
  EXPECT_EQ(recorded.substr(recorded.size() - 20), "classify_images_\\xff") << recorded;
  EXPECT_EQ(io::load_safetensors(out + "/checkpoint.safetensors").metadata.at("data"), recorded);
  const ProgramRun resumed =
      run_program("classify", args + " --epochs 2 --resume " + out + "/checkpoint.safetensors");
  EXPECT_EQ(resumed.status, 0) << resumed.output;
}

TEST(Classify, BadCheckpointsAreOneLineErrorsWithNoOutput) {
  const std::string source = fresh_dir("classify_ckpt_source");
  ASSERT_EQ(
      run_program("classify", small_run(data(), 1) + " --amp --checkpoint-every 12 --out " + source)
          .status,
      0);
  const std::string checkpoint = source + "/checkpoint.safetensors";
  const std::string out = fresh_dir("classify_bad_ckpt");

  expect_one_line_error(
      run_program("classify", small_run(data(), 2) + " --resume " + checkpoint + " --out " + out),
      {checkpoint, "precision 'amp', this run has 'fp32'"});
  expect_one_line_error(run_program("classify", small_run(data(), 2, 16) + " --amp " + "--resume " +
                                                    checkpoint + " --out " + out),
                        {checkpoint, "batch_size '32', this run has '16'"});
  // The data folder spelled another way is the same data: the width is what differs.
  expect_one_line_error(run_program("classify", small_run(data() + "/./", 2, 32, 8) + " --amp " +
                                                    "--resume " + checkpoint + " --out " + out),
                        {checkpoint, "width '4', this run has '8'"});
  expect_one_line_error(run_program("classify", small_run(data(), 2) + " --subset 40 --amp " +
                                                    "--resume " + checkpoint + " --out " + out),
                        {checkpoint, "subset '0', this run has '40'"});
  expect_one_line_error(
      run_program("mlp", "--amp --resume " + checkpoint + " --out " + out),
      {checkpoint, "written by a run with example 'classify', this run has 'mlp'"});
  expect_one_line_error(run_program("classify", small_run(data(), 2) + " --load-weights " +
                                                    checkpoint + " --out " + out),
                        {checkpoint, "a training checkpoint, not a weights file", "--resume"});

  // An image folder split another way (--holdout-every) is other data, though as large.
  const std::string folder =
      std::string("--images ") + MINAMP_SOURCE_DIR +
      "/data/tiny-images --image-size 18 --batch-size 1 --width 4 --subset 3";
  const std::string folder_source = fresh_dir("classify_ckpt_folder");
  ASSERT_EQ(run_program("classify", folder +
                                        " --epochs 2 --holdout-every 3 --checkpoint-every 3 "
                                        "--out " +
                                        folder_source)
                .status,
            0);
  const std::string folder_checkpoint = folder_source + "/checkpoint.safetensors";
  expect_one_line_error(run_program("classify", folder + " --epochs 3 --holdout-every 2 --resume " +
                                                    folder_checkpoint + " --out " + out),
                        {folder_checkpoint, "holdout_every '3', this run has '2'"});

  const std::string truncated = fresh_dir("classify_truncated.safetensors");
  io::write_file_atomically(truncated, io::read_file(checkpoint).substr(0, 1000));
  expect_one_line_error(run_program("classify", small_run(data(), 2) + " --amp --resume " +
                                                    truncated + " --out " + out),
                        {truncated});
  EXPECT_FALSE(fs::exists(out)) << "a failed run wrote output";
}

TEST(Classify, LoadWeightsStartsFromThem) {
  const std::string first = fresh_dir("classify_weights_a"),
                    second = fresh_dir("classify_weights_b");
  ASSERT_EQ(
      run_program("classify", small_run(data(), 1) + " --out " + first + " --save-weights " + first)
          .status,
      0);
  const ProgramRun run = run_program("classify", small_run(data(), 1) + " --seed 5 --out " +
                                                     second + " --load-weights " + first +
                                                     "/final.safetensors --save-weights " + second);
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_EQ(io::read_file(second + "/init.safetensors"),
            io::read_file(first + "/final.safetensors"));
}

} // namespace
} // namespace minamp
