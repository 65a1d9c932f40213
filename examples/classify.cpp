// A small CNN classifier trained with softmax cross-entropy and Adam, on Fashion-MNIST (gzipped
// IDX files, Debian's dataset-fashion-mnist) or on an image folder (ROOT/<class>/*.png|jpg).
// Model, for width W, C input channels, K classes and H x W' images (channels-last inside):
//   Conv3x3(C->W) BN ReLU, Conv3x3/2(W->W) BN ReLU, Conv3x3(W->2W) BN ReLU,
//   Conv3x3/2(2W->2W) BN ReLU, Flatten, Linear(2W * ceil(H/4) * ceil(W'/4) -> K)
// Convs have padding 1 and no bias (BN follows). PyTorch equivalent (NCHW there, so Flatten
// must flatten in channels-last order to match the Linear's columns):
//   nn.Sequential(nn.Conv2d(C,W,3,padding=1,bias=False), nn.BatchNorm2d(W), nn.ReLU(),
//     nn.Conv2d(W,W,3,stride=2,padding=1,bias=False), nn.BatchNorm2d(W), nn.ReLU(),
//     nn.Conv2d(W,2W,3,padding=1,bias=False), nn.BatchNorm2d(2W), nn.ReLU(),
//     nn.Conv2d(2W,2W,3,stride=2,padding=1,bias=False), nn.BatchNorm2d(2W), nn.ReLU(),
//     FlattenNHWC(), nn.Linear(2W*h*w, K))   with FlattenNHWC: x.permute(0, 2, 3, 1).flatten(1)
#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "cli.h"
#include "common.h"
#include "io/idx.h"
#include "io/image.h"
#include "io/utf8.h"
#include "ops/ops.h"

using namespace minamp;

namespace {

// [N, H, W, C] -> [N, H * W * C]: channels-last order, so PyTorch needs FlattenNHWC (above).
class Flatten : public nn::Module {
public:
  Var forward(const Var& x) override {
    const Shape& s = x.shape();
    return ops::reshape(x, {s[0], s.numel() / s[0]});
  }
  std::string describe() const override { return "Flatten()"; }
};

// One split of a data set on the host: images f32 [N, H, W, C] in [0, 1], labels in [0, classes).
struct Split {
  Tensor images;
  std::vector<int32_t> labels;
  int64_t size() const { return int64_t(labels.size()); }
};

struct Dataset {
  Split train, test;
  int64_t classes = 0;
  std::vector<std::string> files; // the files it was read from
  // "2 2 2, test 1 1 1": the images of each class in the train and test splits.
  std::string images_per_class() const {
    std::string out;
    for (const Split* split : {&train, &test}) {
      std::vector<int64_t> counts(size_t(classes), 0);
      for (int32_t label : split->labels) ++counts[size_t(label)];
      out += split == &train ? "train" : ", test";
      for (int64_t count : counts) out += cat(" ", count);
    }
    return out;
  }
};

// The first `count` images of `split` (all when count is 0 or larger).
Split first_images(const Split& split, int64_t count) {
  if (count <= 0 || count >= split.size()) return split;
  const Shape& s = split.images.shape();
  Split out{Tensor::empty({count, s[1], s[2], s[3]}),
            {split.labels.begin(), split.labels.begin() + count}};
  std::memcpy(out.images.raw(), split.images.raw(), out.images.nbytes());
  return out;
}

// The files of one Fashion-MNIST split ("train" or "t10k"): its images and its labels.
std::array<std::string, 2> fashion_mnist_files(const std::string& dir, const std::string& split) {
  return {dir + "/" + split + "-images-idx3-ubyte.gz", dir + "/" + split + "-labels-idx1-ubyte.gz"};
}

Split read_fashion_mnist_split(const std::string& dir, const std::string& name, int64_t classes) {
  const auto [images_path, labels_path] = fashion_mnist_files(dir, name);
  const io::IdxImages images = io::read_idx_images(images_path);
  const std::vector<uint8_t> labels = io::read_idx_labels(labels_path);
  require(int64_t(labels.size()) == images.count, "--data", labels_path, ": ", labels.size(),
          " labels for the ", images.count, " images of ", images_path);
  Split split{Tensor::empty({images.count, images.rows, images.cols, 1}), {}};
  float* pixels = split.images.data<float>();
  for (size_t i = 0; i < images.pixels.size(); ++i) pixels[i] = images.pixels[i] / 255.0f;
  for (size_t i = 0; i < labels.size(); ++i) {
    require(labels[i] < classes, "--data", labels_path, ": label ", int(labels[i]), " of image ", i,
            " is not a class in [0, ", classes, ")");
    split.labels.push_back(labels[i]);
  }
  return split;
}

Dataset read_fashion_mnist(const std::string& dir) {
  constexpr int64_t kClasses = 10;
  require(std::filesystem::is_directory(dir), "--data", dir,
          ": not a directory (Debian's dataset-fashion-mnist package installs Fashion-MNIST; "
          "`make deps` does)");
  Dataset data{read_fashion_mnist_split(dir, "train", kClasses),
               read_fashion_mnist_split(dir, "t10k", kClasses),
               kClasses,
               {}};
  for (const char* split : {"train", "t10k"})
    for (const std::string& file : fashion_mnist_files(dir, split)) data.files.push_back(file);
  require(data.train.images.shape() == Shape{data.train.size(), 28, 28, 1} &&
              data.test.images.shape() == Shape{data.test.size(), 28, 28, 1},
          "--data", dir, ": expected 28x28 images, got train ", data.train.images.shape(),
          " and test ", data.test.images.shape());
  return data;
}

// An image folder split into train and test: every `holdout_every`-th image of each class (the
// 1st, the holdout_every+1-th, ...) is held out for testing.
Dataset read_image_folder(const std::string& root, int64_t size, int channels,
                          int64_t holdout_every) {
  const io::ImageFolder folder = io::load_image_folder(root, size, channels);
  const int64_t n = folder.images.shape()[0], per_image = size * size * channels;
  std::vector<int64_t> train_rows, test_rows;
  for (int64_t i = 0, in_class = 0; i < n; ++i) {
    const int32_t label = folder.labels.data<int32_t>()[i];
    in_class = (i > 0 && folder.labels.data<int32_t>()[i - 1] == label) ? in_class + 1 : 0;
    (in_class % holdout_every == 0 ? test_rows : train_rows).push_back(i);
  }
  auto gather = [&](const std::vector<int64_t>& rows) {
    Split split{Tensor::empty({int64_t(rows.size()), size, size, channels}), {}};
    for (size_t r = 0; r < rows.size(); ++r) {
      std::copy_n(folder.images.data<float>() + rows[r] * per_image, per_image,
                  split.images.data<float>() + int64_t(r) * per_image);
      split.labels.push_back(folder.labels.data<int32_t>()[rows[r]]);
    }
    return split;
  };
  return {gather(train_rows), gather(test_rows), int64_t(folder.classes.size()), folder.files};
}

std::unique_ptr<nn::Sequential> build_cnn(Rng& rng, const Shape& image, int64_t width,
                                          int64_t classes) {
  auto model = std::make_unique<nn::Sequential>();
  const int64_t channels[] = {image[3], width, width, 2 * width, 2 * width};
  const int strides[] = {1, 2, 1, 2};
  int64_t h = image[1], w = image[2];
  for (int i = 0; i < 4; ++i) {
    model->emplace<nn::Conv2d>(channels[i], channels[i + 1], 3, rng, strides[i], 1, false)
        .emplace<nn::BatchNorm>(channels[i + 1])
        .emplace<nn::ReLU>();
    h = (h - 1) / strides[i] + 1; // padding 1, kernel 3: ceil(h / stride)
    w = (w - 1) / strides[i] + 1;
  }
  model->emplace<Flatten>().emplace<nn::Linear>(2 * width * h * w, classes, rng);
  return model;
}

// Rows `rows` of a split as a batch on `device`.
examples::Batch gather_batch(const Split& split, const int64_t* rows, int64_t count,
                             Device device) {
  const Shape& s = split.images.shape();
  const int64_t per_image = s[1] * s[2] * s[3];
  std::vector<float> pixels(static_cast<size_t>(count * per_image));
  std::vector<float> labels(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    std::copy_n(split.images.data<float>() + rows[i] * per_image, per_image,
                pixels.begin() + i * per_image);
    labels[i] = float(split.labels[rows[i]]);
  }
  return {Tensor::from_vector(pixels, {count, s[1], s[2], s[3]}, DType::f32, device),
          Tensor::from_vector(labels, {count}, DType::i32, device)};
}

} // namespace

int main(int argc, char** argv) {
  return examples::guarded_main([&] {
    CLI::App app{"minamp classify: a small CNN on Fashion-MNIST or an image folder "
                 "(softmax cross-entropy, Adam)"};
    examples::Options options;
    examples::add_common_options(app, options, 1e-3f);
    int64_t batch_size = 128, epochs = 5, width = 32, image_size = 28, holdout_every = 5;
    int64_t subset = 0, eval_batch_size = 1000;
    int channels = 3;
    std::string data_dir = "/usr/share/datasets/fashion-mnist", images_root;
    app.add_option("--batch-size", batch_size, "images per training batch")
        ->transform(examples::integer_in(1, examples::kMaxBatch))
        ->capture_default_str();
    app.add_option("--epochs", epochs, "passes over the training set")
        ->transform(examples::integer_in(1, examples::kMaxSteps))
        ->capture_default_str();
    CLI::Option* data_option =
        app.add_option("--data", data_dir, "directory of Fashion-MNIST's *-ubyte.gz files")
            ->check(examples::kNonEmptyPath)
            ->capture_default_str();
    CLI::Option* images_option =
        app.add_option("--images", images_root,
                       "train on an image folder ROOT/<class>/*.{png,jpg} instead of Fashion-MNIST")
            ->check(examples::kNonEmptyPath)
            ->excludes(data_option);
    // The image-folder options without --images would be ignored: refused, as CLI11 words it
    // ("--image-size requires --images").
    app.add_option("--image-size", image_size, "with --images: side images are resized to")
        ->transform(examples::integer_in(4, 1024))
        ->needs(images_option)
        ->capture_default_str();
    app.add_option("--channels", channels, "with --images: 1 (grey) or 3 (RGB)")
        ->check(CLI::Validator(
            [](const std::string& text) {
              return text == "1" || text == "3" ? std::string() : "expected 1 or 3, got " + text;
            },
            "1 or 3"))
        ->needs(images_option)
        ->capture_default_str();
    app.add_option("--holdout-every", holdout_every,
                   "with --images: images 1, N+1, 2N+1, ... of each class are test images")
        ->transform(examples::integer_in(2, 1000000))
        ->needs(images_option)
        ->capture_default_str();
    app.add_option("--width", width, "channels of the first conv stage (the second has twice)")
        ->transform(examples::integer_in(1, examples::kMaxWidth / 2))
        ->capture_default_str();
    app.add_option("--subset", subset, "use only the first N training and N test images (0: all)")
        ->transform(examples::integer_in(0, INT64_MAX));
    examples::use_one_line_errors(app);
    CLI11_PARSE(app, argc, argv);
    examples::resolve_device(options.device); // --device cuda without a GPU: before the data loads
    examples::set_memory_options(cat("--batch-size ", batch_size, ", --width ", width,
                                     images_root.empty() ? "" : cat(", --image-size ", image_size),
                                     " and --subset ", subset));

    Dataset data = images_root.empty()
                       ? read_fashion_mnist(data_dir)
                       : read_image_folder(images_root, image_size, channels, holdout_every);
    data.train = first_images(data.train, subset);
    data.test = first_images(data.test, subset);
    const std::string source = images_root.empty() ? data_dir : images_root;
    // Where the data is, as one spelling (a checkpoint records it: "data/x", "./data/x/" and
    // "/abs/data/x" are one data set to --resume), and as UTF-8 (JSON's text) without losing a
    // byte of a path that is not.
    std::error_code error;
    const std::string data_path =
        io::escape_to_utf8(std::filesystem::canonical(source, error).string());
    require(!error, images_root.empty() ? "--data" : "--images", source, ": ", error.message());
    require(data.classes >= 2, "classify", source, ": ", data.classes,
            " class; a classifier needs at least 2");
    require(data.train.size() > 0, "classify", source, ": no training images",
            images_root.empty() ? ""
                                : cat(" (every ", holdout_every,
                                      "th image of a class, its first included, is held out "
                                      "for testing: see --holdout-every)"));
    require(data.train.size() >= batch_size, "--batch-size", batch_size, " is more than the ",
            data.train.size(), " training images of ", source);
    require(data.test.size() > 0, "classify", source, ": no test images");
    std::printf("classify: %lld training and %lld test images, %lld classes, from %s\n",
                static_cast<long long>(data.train.size()), static_cast<long long>(data.test.size()),
                static_cast<long long>(data.classes), source.c_str());
    std::printf("classify: images per class: %s\n", data.images_per_class().c_str());

    std::vector<int64_t> train_order(size_t(data.train.size())),
        test_rows(size_t(data.test.size()));
    std::iota(test_rows.begin(), test_rows.end(), 0);

    examples::TrainSpec spec;
    spec.example = "classify";
    spec.loss = examples::LossKind::cross_entropy;
    spec.optimizer = examples::OptimizerKind::adam;
    spec.steps_per_epoch = data.train.size() / batch_size; // the last partial batch is dropped
    require(epochs <= examples::kMaxSteps / spec.steps_per_epoch, "--epochs", "at most ",
            examples::kMaxSteps, " steps, got ", epochs, " epochs of ", spec.steps_per_epoch);
    spec.steps = epochs * spec.steps_per_epoch;
    spec.config = {{"data", data_path},
                   {"subset", std::to_string(subset)},
                   {"batch_size", std::to_string(batch_size)},
                   {"width", std::to_string(width)}};
    if (!images_root.empty())
      spec.config.insert({{"image_size", std::to_string(image_size)},
                          {"channels", std::to_string(channels)},
                          {"holdout_every", std::to_string(holdout_every)}});
    spec.input_files = data.files;
    if (!images_root.empty()) spec.input_dirs = {images_root};
    spec.build_model = [&](Rng& rng) {
      return build_cnn(rng, data.train.images.shape(), width, data.classes);
    };
    // The epoch's order is a function of the state of `rng` alone, so that a resumed run redraws
    // it from the saved state.
    spec.start_epoch = [&](int64_t, Rng& rng) { rng.permutation(train_order); };
    spec.batch = [&](int64_t step, Device device) {
      const int64_t first = (step % spec.steps_per_epoch) * batch_size;
      return gather_batch(data.train, train_order.data() + first, batch_size, device);
    };
    spec.eval_batches = (data.test.size() + eval_batch_size - 1) / eval_batch_size;
    spec.eval_batch = [&](int64_t index, Device device) {
      const int64_t first = index * eval_batch_size;
      const int64_t count = std::min(eval_batch_size, data.test.size() - first);
      return gather_batch(data.test, test_rows.data() + first, count, device);
    };
    return examples::run_example(spec, options);
  });
}
