// Transfer learning with AMP, the ResNet-50 / Caltech-256 tutorial as a minamp program: an
// ImageNet-style ResNet (torchvision's names, so torchvision's weights load with --pretrained)
// gets a new classifier for the class folders of --images ROOT, optionally with a frozen backbone,
// and is fine-tuned with Adam in FP32 or AMP. Images (PNG/JPEG) are converted to RGB, resized to
// --image-size square (bilinear), scaled to [0, 1] and normalised with ImageNet's mean and std;
// --augment adds the tutorial's random horizontal flip and shift/scale/rotate. A seeded,
// stratified split holds out --val-fraction of each class for validation.
//
// Other modes: --predict writes predictions.csv for the validation images (no training), and
// --max-batch finds the largest batch whose training step fits, in FP32 and in AMP (with
// --memory-limit, on any device).
//
// PyTorch equivalent: torchvision.models.resnet50(weights=...) with model.fc =
// nn.Linear(2048, classes), trained on NCHW images of the same values.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <new>

#include "amp/autocast.h"
#include "cli.h"
#include "common.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/image.h"
#include "io/utf8.h"
#include "nn/resnet.h"
#include "ops/ops.h"

using namespace minamp;

namespace {

// The RNG streams of the split and of the augmentation (the weights use the default stream and
// the harness the data order's).
constexpr uint64_t kSplitStream = 2, kAugmentStream = 3;

struct TransferOptions {
  std::string images, arch = "resnet50", pretrained, normalize = "imagenet";
  bool freeze_backbone = false, augment = false, predict = false, max_batch = false;
  int64_t image_size = 224, batch_size = 64, epochs = 10, width = 64;
  double val_fraction = 0.1;
  int64_t memory_limit = 0;
};

// The images of one split: their files and labels.
struct Split {
  std::vector<std::string> files;
  std::vector<int32_t> labels;
  int64_t size() const { return int64_t(files.size()); }
};

// Per class, round(n * fraction) images (at least one when the fraction is positive and the
// class has two or more, never all of them) go to validation, drawn by a seeded shuffle.
std::pair<Split, Split> stratified_split(const io::ImageFolderFiles& folder, double fraction,
                                         uint64_t seed) {
  Rng rng(seed, kSplitStream);
  Split train, val;
  for (size_t c = 0, first = 0; c < folder.classes.size(); ++c) {
    size_t end = first;
    while (end < folder.files.size() && folder.labels[end] == int32_t(c)) ++end;
    std::vector<int64_t> order(end - first);
    rng.permutation(order);
    const int64_t n = int64_t(order.size());
    int64_t held = int64_t(std::llround(double(n) * fraction));
    if (fraction > 0 && n >= 2) held = std::clamp<int64_t>(held, 1, n - 1);
    std::sort(order.begin(), order.begin() + held); // validation in file order
    for (int64_t i = 0; i < n; ++i) {
      Split& split = i < held ? val : train;
      split.files.push_back(folder.files[first + size_t(order[size_t(i)])]);
      split.labels.push_back(int32_t(c));
    }
    first = end;
  }
  return {train, val};
}

// ImageNet's per-channel mean and standard deviation (what torchvision's weights expect).
constexpr float kMean[3] = {0.485f, 0.456f, 0.406f}, kStd[3] = {0.229f, 0.224f, 0.225f};

// The tutorial's augmentation of a [size, size, 3] image, in place: a horizontal flip (p 0.5),
// then albumentations' ShiftScaleRotate(shift_limit 0.3, scale_limit 0.3, rotate_limit 15,
// p 0.5): a rotation by up to 15 degrees and a scaling by 0.7-1.3 about the centre and a shift by
// up to 30% of the size, bilinear, the border mirrored (OpenCV's BORDER_REFLECT_101).
void augment(std::vector<float>& image, int64_t size, Rng& rng) {
  const bool flip = rng.uniform() < 0.5f, warp = rng.uniform() < 0.5f;
  const float angle = rng.uniform(-15.0f, 15.0f) * float(M_PI) / 180.0f;
  const float scale = rng.uniform(0.7f, 1.3f);
  const float shift_x = rng.uniform(-0.3f, 0.3f) * float(size);
  const float shift_y = rng.uniform(-0.3f, 0.3f) * float(size);
  if (flip)
    for (int64_t y = 0; y < size; ++y)
      for (int64_t x = 0; x < size / 2; ++x)
        for (int64_t c = 0; c < 3; ++c)
          std::swap(image[size_t((y * size + x) * 3 + c)],
                    image[size_t((y * size + size - 1 - x) * 3 + c)]);
  if (!warp) return;
  const std::vector<float> source = image;
  auto reflect = [size](int64_t i) { // BORDER_REFLECT_101: ... 2 1 | 0 1 2 ... n-1 | n-2 ...
    const int64_t period = 2 * (size - 1);
    if (period == 0) return int64_t(0);
    i = ((i % period) + period) % period;
    return i < size ? i : period - i;
  };
  // Output pixel p comes from centre + R^-1 (p - centre - shift), R = scale * rotation(angle).
  const float a = scale * std::cos(angle), b = scale * std::sin(angle), det = a * a + b * b;
  const float centre = 0.5f * float(size - 1);
  for (int64_t y = 0; y < size; ++y)
    for (int64_t x = 0; x < size; ++x) {
      const float px = float(x) - centre - shift_x, py = float(y) - centre - shift_y;
      const float sx = centre + (a * px - b * py) / det, sy = centre + (b * px + a * py) / det;
      const int64_t x0 = int64_t(std::floor(sx)), y0 = int64_t(std::floor(sy));
      const float fx = sx - float(x0), fy = sy - float(y0);
      for (int64_t c = 0; c < 3; ++c) {
        auto at = [&](int64_t yy, int64_t xx) {
          return source[size_t((reflect(yy) * size + reflect(xx)) * 3 + c)];
        };
        image[size_t((y * size + x) * 3 + c)] =
            (1 - fy) * ((1 - fx) * at(y0, x0) + fx * at(y0, x0 + 1)) +
            fy * ((1 - fx) * at(y0 + 1, x0) + fx * at(y0 + 1, x0 + 1));
      }
    }
}

// Decodes, resizes, (augments) and normalises images into batches.
class BatchMaker {
public:
  explicit BatchMaker(const TransferOptions& o)
      : size_(o.image_size), normalize_(o.normalize == "imagenet") {}

  // Rows `rows` of `split` as a batch on `device`; with `augment_rng`, augmented.
  examples::Batch make(const Split& split, const std::vector<int64_t>& rows, Device device,
                       Rng* augment_rng) const {
    const int64_t pixels = size_ * size_ * 3;
    std::vector<float> values(size_t(int64_t(rows.size()) * pixels)), labels;
    for (size_t i = 0; i < rows.size(); ++i) {
      const Tensor decoded = io::load_image(split.files[size_t(rows[i])], 3);
      const Tensor resized = io::resize_image(decoded, size_, size_);
      std::vector<float> image = resized.to_vector();
      if (augment_rng) augment(image, size_, *augment_rng);
      for (int64_t p = 0; p < pixels; ++p) {
        const int64_t c = p % 3;
        values[i * size_t(pixels) + size_t(p)] =
            normalize_ ? (image[size_t(p)] - kMean[c]) / kStd[c] : image[size_t(p)];
      }
      labels.push_back(float(split.labels[size_t(rows[i])]));
    }
    const int64_t n = int64_t(rows.size());
    return {Tensor::from_vector(values, {n, size_, size_, 3}, DType::f32, device),
            Tensor::from_vector(labels, {n}, DType::i32, device)};
  }

private:
  int64_t size_;
  bool normalize_;
};

// Rows first .. first + count - 1.
std::vector<int64_t> row_range(int64_t first, int64_t count) {
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) rows[size_t(i)] = first + i;
  return rows;
}

// A field of predictions.csv: quoted (with doubled quotes) when it holds a comma, quote or line
// break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char ch : text) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return quoted + "\"";
}

// --predict: the validation images' predicted classes and logits, into predictions.csv.
void predict(const examples::TrainSpec& spec, const examples::Options& options, const Split& val,
             const io::ImageFolderFiles& folder, const BatchMaker& batches, int64_t batch_size,
             const std::string& out) {
  const Device device = examples::resolve_device(options.device);
  Rng rng(options.seed);
  std::unique_ptr<nn::Module> model = spec.build_model(rng);
  model->to(device);
  if (!options.load_weights.empty()) io::load_weights(options.load_weights, *model);
  model->eval();
  std::string csv = "path,true_class,predicted_class";
  const int64_t classes = int64_t(folder.classes.size());
  for (int64_t k = 0; k < classes; ++k) csv += cat(",logit_", k);
  csv += "\n";
  int64_t correct = 0;
  for (int64_t first = 0; first < val.size(); first += batch_size) {
    const int64_t count = std::min(batch_size, val.size() - first);
    const examples::Batch batch = batches.make(val, row_range(first, count), device, nullptr);
    NoGrad no_grad;
    amp::Autocast autocast(options.amp, parse_half_precision(options.amp_dtype));
    const std::vector<float> logits = (*model)(Var(batch.input)).value().to_vector();
    for (int64_t i = 0; i < count; ++i) {
      const float* row = logits.data() + i * classes;
      const int64_t predicted = std::max_element(row, row + classes) - row;
      const int32_t truth = val.labels[size_t(first + i)];
      correct += predicted == truth;
      csv += cat(csv_field(val.files[size_t(first + i)]), ",",
                 csv_field(folder.classes[size_t(truth)]), ",",
                 csv_field(folder.classes[size_t(predicted)]));
      for (int64_t k = 0; k < classes; ++k) csv += cat(",", row[k]);
      csv += "\n";
    }
  }
  io::write_file_atomically(out + "/predictions.csv", csv);
  std::printf("transfer: %lld of %lld validation images predicted right (%.2f%%); wrote "
              "%s/predictions.csv\n",
              static_cast<long long>(correct), static_cast<long long>(val.size()),
              100.0 * double(correct) / double(std::max<int64_t>(val.size(), 1)), out.c_str());
}

// How one training step at a given batch ended: it ran, the allocator ran out of memory, or a
// tensor went beyond what the kernels index (the CUDA kernels' 32-bit sizes).
enum class StepOutcome { fits, out_of_memory, too_large };

const char* describe(StepOutcome outcome) {
  switch (outcome) {
  case StepOutcome::fits: return "fits";
  case StepOutcome::out_of_memory: return "is out of memory";
  case StepOutcome::too_large: return "is beyond the kernels' 32-bit sizes";
  }
  return "";
}

// One training step at `batch` images in `precision` from a fresh model, optimizer and scaler
// (enabled as the run's options say): how it ended, and the peak bytes of the device's allocator
// while it ran.
struct StepTry {
  StepOutcome outcome = StepOutcome::out_of_memory;
  size_t peak_bytes = 0;
};

StepTry try_training_step(const examples::TrainSpec& spec, const examples::Options& options,
                          Device device, int64_t batch, int64_t image_size, int64_t classes,
                          const examples::Precision& precision) {
  Allocator& allocator = allocator_for(device);
  allocator.reset_peak();
  StepTry result;
  try {
    Rng rng(options.seed);
    std::unique_ptr<nn::Module> model = spec.build_model(rng);
    model->to(device);
    optim::Adam adam(model->parameters(), options.lr);
    amp::GradScalerOptions scaling;
    scaling.enabled = examples::scales_loss(options, precision);
    amp::GradScaler scaler(scaling, device);
    Rng data(options.seed, kAugmentStream);
    std::vector<float> pixels(size_t(batch * image_size * image_size * 3)),
        labels(static_cast<size_t>(batch));
    for (float& v : pixels) v = data.uniform(-2.0f, 2.0f);
    for (float& v : labels) v = float(data.below(uint32_t(classes)));
    const Tensor images =
        Tensor::from_vector(pixels, {batch, image_size, image_size, 3}, DType::f32, device);
    const Tensor targets = Tensor::from_vector(labels, {batch}, DType::i32, device);
    adam.zero_grad();
    Var loss;
    {
      amp::Autocast autocast(precision.amp, precision.dtype);
      loss = ops::cross_entropy((*model)(Var(images)), targets);
    }
    scaler.scale(loss).backward();
    scaler.step(adam);
    scaler.update();
    (void)loss.value().item(); // waits for the device
    result.outcome = StepOutcome::fits;
  } catch (const OutOfMemory&) {
  } catch (const std::bad_alloc&) {
  } catch (const SizeLimit&) {
    result.outcome = StepOutcome::too_large;
  }
  result.peak_bytes = allocator.peak_bytes();
  return result;
}

// The largest batch found and what stopped the search: the first batch past it ran out of memory
// or went beyond the kernels' sizes (`limit`, out_of_memory or too_large; fits when every batch up
// to kMaxBatch fitted).
struct LargestBatch {
  int64_t batch = 0;
  size_t peak_bytes = 0;
  StepOutcome limit = StepOutcome::fits;
};

// The largest batch whose step fits: doubling from 2 (a batch of one image gives BatchNorm one
// value per channel at the end of the net) until one does not, then bisecting; 0 when 2 does not.
LargestBatch largest_batch(const std::function<StepTry(int64_t)>& attempt, const char* label) {
  LargestBatch found;
  int64_t fails = 0;
  auto run = [&](int64_t batch) {
    const StepTry t = attempt(batch);
    std::printf("  %s: batch %lld %s (peak %.1f MiB)\n", label, static_cast<long long>(batch),
                describe(t.outcome), double(t.peak_bytes) / 1048576.0);
    std::fflush(stdout);
    if (t.outcome == StepOutcome::fits) {
      found.batch = batch;
      found.peak_bytes = t.peak_bytes;
    } else {
      fails = batch;
      found.limit = t.outcome;
    }
    return t.outcome == StepOutcome::fits;
  };
  for (int64_t batch = 2; batch <= examples::kMaxBatch && run(batch); batch *= 2) {
  }
  if (fails == 0) return found; // fits up to kMaxBatch
  while (found.batch > 0 && fails - found.batch > 1) run(found.batch + (fails - found.batch) / 2);
  return found;
}

// summary.json's name for what ended a search.
const char* limit_name(StepOutcome limit) {
  switch (limit) {
  case StepOutcome::fits: return "none";
  case StepOutcome::out_of_memory: return "memory";
  case StepOutcome::too_large: return "kernel sizes";
  }
  return "";
}

std::string mib(size_t bytes) {
  return cat(std::round(double(bytes) / 1048576.0 * 10) / 10, " MiB");
}

// --max-batch: the largest batch in FP32 and in AMP (--amp-dtype's), printed and written to
// summary.json.
void find_max_batch(const examples::TrainSpec& spec, const examples::Options& options,
                    const TransferOptions& t, int64_t classes, const std::string& out) {
  const Device device = examples::resolve_device(options.device);
  require(t.memory_limit > 0 || (device == Device::cuda && !cuda_emulated()), "--max-batch",
          "needs --memory-limit on ", cuda_emulated() ? "the CUDA emulator" : "the cpu",
          ": without one the search would fill the host's memory");
  std::printf(
      "transfer: largest batch of a training step, %s at %lldx%lld%s, on %s, %s\n", t.arch.c_str(),
      static_cast<long long>(t.image_size), static_cast<long long>(t.image_size),
      t.freeze_backbone ? ", frozen backbone" : "", device_description(device).c_str(),
      t.memory_limit <= 0        ? "no memory limit"
      : t.memory_limit < 1048576 ? cat("memory limit ", t.memory_limit, " bytes").c_str()
                                 : cat("memory limit ", mib(size_t(t.memory_limit))).c_str());
  nlohmann::json max_batch, peaks, limited_by;
  std::vector<std::pair<std::string, LargestBatch>> rows;
  for (bool amp : {false, true}) {
    const examples::Precision precision{amp, parse_half_precision(options.amp_dtype)};
    const std::string label = precision.name();
    const auto found = largest_batch(
        [&](int64_t batch) {
          return try_training_step(spec, options, device, batch, t.image_size, classes, precision);
        },
        label.c_str());
    max_batch[label] = found.batch;
    peaks[label] = found.peak_bytes;
    limited_by[label] = limit_name(found.limit);
    rows.push_back({amp ? "AMP" : "FP32", found});
  }
  std::printf("\n  %-6s %10s %14s  %s\n", "", "max batch", "peak memory", "limited by");
  for (const auto& [name, found] : rows)
    std::printf("  %-6s %10lld %14s  %s\n", name.c_str(), static_cast<long long>(found.batch),
                mib(found.peak_bytes).c_str(), limit_name(found.limit));
  for (const auto& [name, found] : rows)
    require(found.batch > 0, "--max-batch", name,
            ": a step of 2 images (the fewest a batch norm trains on) ", describe(found.limit),
            t.memory_limit > 0 ? cat(" under --memory-limit ", t.memory_limit, " bytes")
                               : std::string(),
            ": raise the limit or lower --image-size or --width");
  const double ratio = double(rows[1].second.batch) / double(rows[0].second.batch);
  std::printf("  AMP / FP32: %.2f\n", ratio);
  const nlohmann::json summary = {{"example", "transfer"},
                                  {"mode", "max_batch"},
                                  {"device", device_name(device)},
                                  {"device_name", device_description(device)},
                                  {"arch", t.arch},
                                  {"image_size", t.image_size},
                                  {"width", t.width},
                                  {"freeze_backbone", t.freeze_backbone},
                                  {"classes", classes},
                                  {"memory_limit", t.memory_limit},
                                  {"max_batch", max_batch},
                                  {"peak_bytes", peaks},
                                  {"limited_by", limited_by},
                                  {"amp_over_fp32", ratio}};
  io::write_file_atomically(out + "/summary.json", summary.dump(2) + "\n");
  std::printf("wrote %s/summary.json\n", out.c_str());
}

// `path` made absolute, links and ".." resolved, as checkpoints record it (UTF-8): a resumed run
// may name the same file another way.
std::string canonical_path(const std::string& path, const char* option) {
  std::error_code error;
  const std::string canonical = std::filesystem::canonical(path, error).string();
  require(!error, option, path, ": ", error.message());
  return io::escape_to_utf8(canonical);
}

// The options that --predict and --max-batch would ignore are refused, as the harness refuses an
// option that no run uses.
void refuse_unused_options(const CLI::App& app, const TransferOptions& t) {
  const char* mode = t.predict ? "--predict" : t.max_batch ? "--max-batch" : nullptr;
  if (!mode) return;
  std::vector<const char*> unused = {"--compare-dtypes", "--resume",   "--checkpoint-every",
                                     "--save-weights",   "--diagnose", "--profile",
                                     "--epochs",         "--augment",  "--log-every"};
  const char* what = t.predict ? "trains nothing: it predicts with --load-weights or --pretrained"
                               : "times one training step of each precision at each batch it "
                                 "tries, from --pretrained's or the seeded weights";
  if (t.predict)
    unused.insert(unused.end(), {"--lr", "--freeze-backbone", "--init-scale", "--growth-interval",
                                 "--no-loss-scaling", "--loss-scaling"});
  else
    unused.insert(unused.end(), {"--load-weights", "--batch-size", "--compare"});
  for (const char* name : unused)
    require(app.count(name) == 0, name, "is not used with ", mode, ", which ", what);
}

} // namespace

int main(int argc, char** argv) {
  return examples::guarded_main([&] {
    CLI::App app{"minamp transfer: fine-tune an ImageNet ResNet (torchvision's names and weights) "
                 "on an image folder, in FP32 or AMP (softmax cross-entropy, Adam)"};
    examples::Options options;
    examples::add_common_options(app, options, 1e-4f);
    TransferOptions t;
    app.add_option("--images", t.images, "image folder ROOT/<class>/*.{png,jpg}")
        ->required()
        ->check(examples::kNonEmptyPath);
    app.add_option("--arch", t.arch, "resnet18, resnet34 or resnet50")
        ->check(CLI::IsMember({"resnet18", "resnet34", "resnet50"}))
        ->capture_default_str();
    app.add_option("--pretrained", t.pretrained,
                   "start from these weights (torchvision's state_dict as safetensors); its "
                   "fc is left out when its size differs")
        ->check(examples::kNonEmptyPath);
    app.add_flag("--freeze-backbone", t.freeze_backbone, "train only the classifier (fc)");
    app.add_option("--image-size", t.image_size, "side images are resized to")
        ->transform(examples::integer_in(32, 1024))
        ->capture_default_str();
    app.add_option("--val-fraction", t.val_fraction, "share of each class held out for validation")
        ->check(examples::finite_number([](double v) { return v > 0 && v < 1; },
                                        "a number between 0 and 1"))
        ->capture_default_str();
    app.add_option("--batch-size", t.batch_size, "images per training batch")
        ->transform(examples::integer_in(1, examples::kMaxBatch))
        ->capture_default_str();
    app.add_option("--epochs", t.epochs, "passes over the training images")
        ->transform(examples::integer_in(1, examples::kMaxSteps))
        ->capture_default_str();
    app.add_flag("--augment", t.augment,
                 "random horizontal flip and shift/scale/rotate of the training images");
    app.add_option("--normalize", t.normalize, "imagenet (torchvision's mean/std) or none")
        ->check(CLI::IsMember({"imagenet", "none"}))
        ->capture_default_str();
    app.add_option("--width", t.width,
                   "channels of the stem and layer1 (torchvision: 64; narrower nets keep the "
                   "names, not the pretrained shapes)")
        ->transform(examples::integer_in(1, 1024))
        ->capture_default_str();
    CLI::Option* predict_option =
        app.add_flag("--predict", t.predict,
                     "write predictions.csv for the validation images and train nothing");
    app.add_flag("--max-batch", t.max_batch,
                 "find the largest batch whose training step fits, in FP32 and in AMP")
        ->excludes(predict_option);
    app.add_option("--memory-limit", t.memory_limit,
                   "cap minamp's memory on the device, e.g. 6GiB (out of memory past it)")
        ->transform(examples::byte_size());
    examples::use_one_line_errors(app);
    CLI11_PARSE(app, argc, argv);
    examples::require_valid_environment();
    require(t.pretrained.empty() || options.load_weights.empty(), "--pretrained",
            "and --load-weights both give the starting weights; give one");
    refuse_unused_options(app, t);
    require(!t.predict || !options.compare, "--predict", "runs one precision; use --amp or not");
    require(!t.predict || !t.pretrained.empty() || !options.load_weights.empty(), "--predict",
            "needs trained weights: --load-weights FILE (e.g. a run's final.safetensors) or "
            "--pretrained FILE");
    const Device device = examples::resolve_device(options.device);
    if (t.memory_limit > 0) allocator_for(device).set_memory_limit(size_t(t.memory_limit));
    examples::set_memory_options(
        cat("--batch-size ", t.batch_size, ", --image-size ", t.image_size, ", --arch ", t.arch,
            ", --width ", t.width,
            t.memory_limit > 0 ? cat(" and --memory-limit ", t.memory_limit) : std::string()));

    const io::ImageFolderFiles folder = io::list_image_folder(t.images);
    // Images are decoded batch by batch: each one's header is checked before anything is written.
    for (const std::string& file : folder.files) io::check_image_header(file);
    const int64_t classes = int64_t(folder.classes.size());
    require(classes >= 2, "transfer", t.images, ": ", classes, " class; a classifier needs two");
    const std::pair<Split, Split> split = stratified_split(folder, t.val_fraction, options.seed);
    const Split &train = split.first, &val = split.second;
    require(val.size() > 0, "--val-fraction", t.val_fraction, " holds out no image of ", t.images,
            " (every class needs two images or more)");
    std::printf("transfer: %lld training and %lld validation images, %lld classes, from %s\n",
                static_cast<long long>(train.size()), static_cast<long long>(val.size()),
                static_cast<long long>(classes), t.images.c_str());

    // --pretrained: its fc is used only when it has this folder's number of classes.
    nn::ResNetOptions resnet;
    resnet.arch = nn::parse_resnet_arch(t.arch);
    resnet.num_classes = classes;
    resnet.width = t.width;
    // --pretrained: its fc is left out only when it has this backbone's features for another
    // number of classes; any other difference is the loader's error.
    std::string skipped;
    if (!t.pretrained.empty()) {
      const io::SafetensorsFile file = io::load_safetensors(t.pretrained);
      const int64_t features = nn::ResNet::num_features(resnet);
      if (file.has_tensor("fc.weight")) {
        const Shape fc = file.tensor("fc.weight").shape();
        if (fc.rank() == 2 && fc[1] == features && fc[0] != classes) {
          skipped = "fc";
          require(!t.predict, "--predict", t.pretrained, "'s fc has ", fc[0],
                  " classes, this folder ", classes,
                  ": its predictions would come from an untrained classifier (fine-tune first, "
                  "then --predict --load-weights final.safetensors)");
          std::printf("transfer: %s's fc is %s, this folder has %lld classes: fc starts from its "
                      "seeded initialisation\n",
                      t.pretrained.c_str(), cat(fc).c_str(), static_cast<long long>(classes));
        }
      }
    }

    examples::TrainSpec spec;
    spec.example = "transfer";
    spec.loss = examples::LossKind::cross_entropy;
    spec.optimizer = examples::OptimizerKind::adam;
    spec.build_model = [&](Rng& rng) {
      auto model = std::make_unique<nn::ResNet>(resnet, rng);
      if (!t.pretrained.empty()) io::load_weights(t.pretrained, *model, skipped);
      if (t.freeze_backbone) {
        model->requires_grad_(false);
        model->fc.requires_grad_(true);
      }
      return model;
    };
    const std::string out = options.out.empty() ? "out/transfer" : options.out;
    std::vector<std::string> inputs = folder.files;
    for (const std::string& file : {t.pretrained, options.load_weights})
      if (!file.empty()) inputs.push_back(file);
    const BatchMaker batches(t);
    if (t.predict) {
      examples::with_output_folder(out, {"predictions.csv"}, inputs, {t.images}, [&] {
        predict(spec, options, val, folder, batches, t.batch_size, out);
      });
      return 0;
    }
    if (t.max_batch) {
      examples::with_output_folder(out, {"summary.json"}, inputs, {t.images},
                                   [&] { find_max_batch(spec, options, t, classes, out); });
      return 0;
    }

    require(train.size() >= t.batch_size, "--batch-size", t.batch_size, " is more than the ",
            train.size(), " training images of ", t.images);
    examples::require_resnet_batch_trains(t.batch_size, t.image_size, "--batch-size",
                                          "--image-size");
    spec.steps_per_epoch = train.size() / t.batch_size; // the last partial batch is dropped
    require(t.epochs <= examples::kMaxSteps / spec.steps_per_epoch, "--epochs", "at most ",
            examples::kMaxSteps, " steps, got ", t.epochs, " epochs of ", spec.steps_per_epoch);
    spec.steps = t.epochs * spec.steps_per_epoch;
    spec.config = {{"images", canonical_path(t.images, "--images")},
                   {"arch", t.arch},
                   {"width", std::to_string(t.width)},
                   {"image_size", std::to_string(t.image_size)},
                   {"val_fraction", cat(t.val_fraction)},
                   {"batch_size", std::to_string(t.batch_size)},
                   {"normalize", t.normalize},
                   {"augment", t.augment ? "yes" : "no"},
                   {"freeze_backbone", t.freeze_backbone ? "yes" : "no"},
                   {"pretrained", t.pretrained.empty()
                                      ? std::string()
                                      : canonical_path(t.pretrained, "--pretrained")}};
    spec.input_files = inputs;
    spec.input_dirs = {t.images};
    std::vector<int64_t> train_order(size_t(train.size()));
    spec.start_epoch = [&](int64_t, Rng& rng) { rng.permutation(train_order); };
    spec.batch = [&](int64_t step, Device on) {
      const int64_t first = (step % spec.steps_per_epoch) * t.batch_size;
      const std::vector<int64_t> rows(train_order.begin() + first,
                                      train_order.begin() + first + t.batch_size);
      // Each step's augmentation has a generator of its own: a resumed run redraws it.
      Rng augment_rng(options.seed + uint64_t(step) * 0x9e3779b97f4a7c15ULL, kAugmentStream);
      return batches.make(train, rows, on, t.augment ? &augment_rng : nullptr);
    };
    spec.eval_batches = (val.size() + t.batch_size - 1) / t.batch_size;
    spec.eval_batch = [&](int64_t index, Device on) {
      const int64_t first = index * t.batch_size;
      return batches.make(val, row_range(first, std::min(t.batch_size, val.size() - first)), on,
                          nullptr);
    };
    return examples::run_example(spec, options);
  });
}
