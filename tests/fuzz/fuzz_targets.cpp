// The fuzzed loaders (safetensors, weights, training checkpoints, IDX, CSV, PNG/JPEG) with the
// valid files each starts from, and the input file they read the fuzzer's bytes from.
#include "fuzz_targets.h"

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "amp/grad_scaler.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/csv.h"
#include "io/idx.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace minamp::fuzz {
namespace {

namespace fs = std::filesystem;

// This process's input files, one per extension, removed when the process exits.
class InputFiles {
public:
  const std::string& path(const std::string& extension) {
    std::string& path = paths_[extension];
    if (path.empty())
      path = (fs::temp_directory_path() / ("minamp-fuzz-" + std::to_string(::getpid()) + extension))
                 .string();
    return path;
  }
  ~InputFiles() {
    std::error_code ignored;
    for (const auto& [extension, path] : paths_) fs::remove(path, ignored);
  }

private:
  std::map<std::string, std::string> paths_;
};

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// A seed made by one of minamp's writers: the bytes of the file it wrote.
template <class Write> std::string written_bytes(const char* extension, Write write) {
  static InputFiles files;
  const std::string& path = files.path(std::string(".seed") + extension);
  write(path);
  return io::read_file(path);
}

// The model the weights and checkpoint targets load into: one layer of each kind with state.
nn::Sequential small_model() {
  Rng rng(1);
  nn::Sequential model;
  model.emplace<nn::Conv2d>(2, 4, 3, rng);
  model.emplace<nn::BatchNorm>(4);
  model.emplace<nn::ReLU>();
  model.emplace<nn::Linear>(4, 2, rng);
  return model;
}

void load_safetensors(const std::string& path) { io::load_safetensors(path); }

std::vector<std::string> safetensors_seeds() {
  return {written_bytes(".safetensors", [](const std::string& path) {
    io::save_safetensors(path,
                         {{"weight", Tensor::from_vector({1, -2, 3, -4, 5, -6}, {2, 3})},
                          {"half", Tensor::from_vector({0.5f, 65504, -0.0f}, {3}, DType::f16)},
                          {"brain", Tensor::from_vector({1e30f, -1e-30f}, {1, 2}, DType::bf16)},
                          {"index", Tensor::from_vector({7, 8, 9, 10}, {2, 1, 2}, DType::i32)}},
                         {{"format", "pt"}, {"note", "seed"}},
                         {{"count", {}, {42}}, {"pair", {2}, {-1, 1}}});
  })};
}

void load_weights(const std::string& path) {
  nn::Sequential model = small_model();
  io::load_weights(path, model);
}

std::vector<std::string> weights_seeds() {
  return {written_bytes(".safetensors", [](const std::string& path) {
    nn::Sequential model = small_model();
    io::save_weights(path, model);
  })};
}

void load_checkpoint(const std::string& path) {
  nn::Sequential model = small_model();
  optim::Adam adam(model.parameters());
  amp::GradScaler scaler;
  io::load_training_checkpoint(path, model, adam, scaler, {{"example", "fuzz"}});
}

std::vector<std::string> checkpoint_seeds() {
  return {written_bytes(".safetensors", [](const std::string& path) {
    nn::Sequential model = small_model();
    optim::Adam adam(model.parameters());
    amp::GradScaler scaler;
    io::TrainingState state;
    state.step = 3;
    state.epoch = 1;
    state.logs = {{"loss", Tensor::from_vector({0.5f, 0.25f, 0.125f}, {3})}};
    state.metadata = {{"example", "fuzz"}, {"precision", "amp"}};
    io::save_training_checkpoint(path, model, adam, scaler, state);
  })};
}

void load_idx(const std::string& path) { io::read_idx(path); }

// An IDX file of u8 values: magic 0 0 8 rank, big-endian u32 dimensions, then the values.
std::string idx_bytes(const std::vector<uint32_t>& dims) {
  std::string bytes = {0, 0, 8, char(dims.size())};
  size_t count = 1;
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) bytes.push_back(char((d >> shift) & 0xff));
    count *= d;
  }
  for (size_t i = 0; i < count; ++i) bytes.push_back(char(i * 37));
  return bytes;
}

std::vector<std::string> idx_seeds() {
  const std::string images = idx_bytes({2, 3, 4});
  const std::string gzipped = written_bytes(".idx.gz", [&](const std::string& path) {
    gzFile file = gzopen(path.c_str(), "wb");
    const bool ok = file && gzwrite(file, images.data(), unsigned(images.size())) > 0;
    if (!file || gzclose(file) != Z_OK || !ok) throw Error("fuzz: cannot gzip " + path);
  });
  return {images, gzipped, idx_bytes({5})};
}

void load_csv(const std::string& path) {
  for (const std::string& column : io::read_csv_header(path)) io::read_csv_column(path, column);
}

std::vector<std::string> csv_seeds() {
  return {"step,loss,scale\n1,0.5,65536\n2,0.25,32768\n",
          "epoch,accuracy\r\n1,-1.5e-3\r\n2,nan\r\n3,inf\r\n"};
}

void load_image(const std::string& path) {
  io::check_image_header(path);
  const Tensor image = io::load_image(path, 3);
  io::resize_image(image, 7, 5);
}

// PNGs in colour and grey, the interlaced 16-bit RGBA fixture, and the JPEG of the image-folder
// fixture: baseline, progressive, and progressive in grey (minamp writes none of those).
std::vector<std::string> image_seeds() {
  const int width = 6, height = 5;
  std::vector<uint8_t> pixels(width * height * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t(i * 29);
  const std::string data = std::string(MINAMP_SOURCE_DIR) + "/data/";
  return {io::encode_png(pixels.data(), width, height, 3),
          io::encode_png(pixels.data(), width, height, 1),
          io::read_file(data + "interlaced-png/rgba16.png"),
          io::read_file(data + "tiny-images/stripes/img1.jpg"),
          io::read_file(data + "progressive-jpeg/stripes.jpg"),
          io::read_file(data + "progressive-jpeg/stripes-grey.jpg")};
}

} // namespace

const std::vector<FuzzTarget>& fuzz_targets() {
  static const std::vector<FuzzTarget> targets = {
      {"safetensors", ".safetensors", load_safetensors, safetensors_seeds},
      {"weights", ".safetensors", load_weights, weights_seeds},
      {"checkpoint", ".safetensors", load_checkpoint, checkpoint_seeds},
      {"idx", ".idx", load_idx, idx_seeds},
      {"csv", ".csv", load_csv, csv_seeds},
      {"image", ".png", load_image, image_seeds},
  };
  return targets;
}

const FuzzTarget& fuzz_target(const std::string& name) {
  std::string names;
  for (const FuzzTarget& target : fuzz_targets()) {
    if (name == target.name) return target;
    names += std::string(names.empty() ? "" : ", ") + target.name;
  }
  throw Error("fuzz: no target '" + name + "'; the targets are " + names);
}

void fuzz_one_input(const FuzzTarget& target, const uint8_t* data, size_t size) {
  static InputFiles files;
  const std::string& path = files.path(target.extension);
  write_file(path, data, size);
  try {
    target.load(path);
  } catch (const Error&) {
    // refused, as bad input should be
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz %s: an exception other than minamp::Error: %s\n", target.name,
                 e.what());
    std::abort();
  }
}

} // namespace minamp::fuzz
