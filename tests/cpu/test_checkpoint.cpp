// Tests for io/checkpoint: weights and training checkpoints round-trip bit for bit, the file is in
// PyTorch's names and layouts (checked against an NCHW convolution written here), strict loading
// rejects wrong names, shapes, dtypes and values with one Error naming the file while leaving the
// model untouched, and random truncations and bit flips never crash the loaders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "amp/grad_scaler.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "nn/module.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "test_io_util.h"
#include "test_util.h"

namespace minamp {
namespace {

using io::NamedInt64s;
using io::NamedTensor;
using test::rewrite_safetensors;

// Conv(3->4, 3x3, stride 2, pad 1)+BN+ReLU, GlobalAvgPool, Linear(4->5): every kind of entry.
std::unique_ptr<nn::Sequential> small_model(uint64_t seed) {
  Rng rng(seed);
  auto model = std::make_unique<nn::Sequential>();
  model->emplace<nn::Conv2d>(3, 4, 3, rng, 2, 1)
      .emplace<nn::BatchNorm>(4)
      .emplace<nn::ReLU>()
      .emplace<nn::GlobalAvgPool>()
      .emplace<nn::Linear>(4, 5, rng);
  return model;
}

// Gives every buffer and counter a value of its own, so a round trip cannot pass by default.
void perturb_buffers(nn::Module& model, Rng& rng) {
  for (auto& [name, t] : model.named_buffers())
    *t = test::random_tensor(rng, t->shape(), DType::f32, Device::cpu, 0.5f, 2.0f);
  for (auto& [name, c] : model.named_counters()) *c = 1000 + rng.below(1000);
}

// Every value of the model's state_dict, in order, as bit patterns.
std::vector<uint32_t> state_bits(nn::Module& model) {
  std::vector<uint32_t> bits;
  auto add = [&](const Tensor& t) {
    for (float v : t.to_vector()) {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      bits.push_back(b);
    }
  };
  for (auto& [name, p] : model.named_parameters()) add(p->master());
  for (auto& [name, t] : model.named_buffers()) add(*t);
  for (auto& [name, c] : model.named_counters()) bits.push_back(uint32_t(*c));
  return bits;
}

// Expects `load` to throw Error whose message names `path` and contains `fragment`.
template <class Load>
void expect_error(Load load, const std::string& path, const std::string& fragment) {
  try {
    load();
    ADD_FAILURE() << "expected an error containing '" << fragment << "'";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  }
}

TEST(Checkpoint, WeightsRoundTripBitForBit) {
  test::TempDir dir;
  Rng rng(3);
  auto source = small_model(1);
  perturb_buffers(*source, rng);
  io::save_weights(dir.path("w.safetensors"), *source);
  auto target = small_model(2);
  ASSERT_NE(state_bits(*source), state_bits(*target));
  io::load_weights(dir.path("w.safetensors"), *target);
  EXPECT_EQ(state_bits(*source), state_bits(*target));
}

TEST(Checkpoint, LoadRefreshesTheHalfCopies) {
  test::TempDir dir;
  auto source = small_model(1);
  io::save_weights(dir.path("w.safetensors"), *source);
  auto target = small_model(2);
  Parameter& w = dynamic_cast<nn::Linear&>((*target)[4]).weight;
  w.working_copy(DType::f16); // creates the f16 copy from the old master
  io::load_weights(dir.path("w.safetensors"), *target);
  EXPECT_EQ(w.half_copy().to_vector(), w.master().to(DType::f16).to_vector());
}

TEST(Checkpoint, FileHasPyTorchNamesDtypesAndLayouts) {
  test::TempDir dir;
  Rng rng(4);
  auto model = small_model(1);
  perturb_buffers(*model, rng);
  io::save_weights(dir.path("w.safetensors"), *model);
  const io::SafetensorsFile file = io::load_safetensors(dir.path("w.safetensors"));

  std::vector<std::string> names;
  for (const NamedTensor& t : file.tensors) names.push_back(t.name);
  for (const NamedInt64s& e : file.int64s) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"0.bias", "0.weight", "1.bias",
                                             "1.num_batches_tracked", "1.running_mean",
                                             "1.running_var", "1.weight", "4.bias", "4.weight"}));
  EXPECT_EQ(file.metadata.at("format"), "pt");

  // Conv: [Cout, kh, kw, Cin] inside, [Cout, Cin, kh, kw] in the file.
  const Tensor& inside = dynamic_cast<nn::Conv2d&>((*model)[0]).weight.master();
  const Tensor& stored = file.tensor("0.weight");
  ASSERT_EQ(stored.shape(), (Shape{4, 3, 3, 3}));
  for (int64_t o = 0; o < 4; ++o)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 3; ++j)
          ASSERT_EQ(stored.data<float>()[((o * 3 + c) * 3 + i) * 3 + j],
                    inside.data<float>()[((o * 3 + i) * 3 + j) * 3 + c]);
  // Linear [out, in] as is; the counter a 0-d I64.
  EXPECT_EQ(file.tensor("4.weight").shape(), (Shape{5, 4}));
  EXPECT_EQ(file.tensor("4.weight").to_vector(),
            dynamic_cast<nn::Linear&>((*model)[4]).weight.master().to_vector());
  const NamedInt64s& tracked = file.int64s_named("1.num_batches_tracked");
  EXPECT_TRUE(tracked.shape.empty());
  EXPECT_EQ(tracked.values,
            std::vector<int64_t>{dynamic_cast<nn::BatchNorm&>((*model)[1]).num_batches_tracked});
}

// PyTorch's Conv2d on NCHW input with the file's [Cout, Cin, kh, kw] weight, written directly
// from its definition: y[n, o, p, q] = b[o] + sum w[o, c, i, j] x[n, c, p s - pad + i, q s - pad +
// j].
std::vector<float> conv_nchw(const std::vector<float>& x, int64_t n, int64_t cin, int64_t h,
                             int64_t w, const Tensor& weight, const Tensor& bias, int stride,
                             int pad, int64_t& ho, int64_t& wo) {
  const int64_t cout = weight.shape()[0], k = weight.shape()[2];
  ho = (h + 2 * pad - k) / stride + 1, wo = (w + 2 * pad - k) / stride + 1;
  std::vector<float> y(size_t(n * cout * ho * wo));
  const float* wt = weight.data<float>();
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < cout; ++o)
      for (int64_t p = 0; p < ho; ++p)
        for (int64_t q = 0; q < wo; ++q) {
          double sum = bias.data<float>()[o];
          for (int64_t c = 0; c < cin; ++c)
            for (int64_t i = 0; i < k; ++i)
              for (int64_t j = 0; j < k; ++j) {
                const int64_t r = p * stride - pad + i, s = q * stride - pad + j;
                if (r < 0 || r >= h || s < 0 || s >= w) continue;
                sum += double(wt[((o * cin + c) * k + i) * k + j]) *
                       x[((b * cin + c) * h + r) * w + s];
              }
          y[((b * cout + o) * ho + p) * wo + q] = float(sum);
        }
  return y;
}

TEST(Checkpoint, StoredConvWeightComputesTheSameConvInPyTorchLayout) {
  test::TempDir dir;
  Rng rng(5);
  auto model = small_model(1);
  io::save_weights(dir.path("w.safetensors"), *model);
  const io::SafetensorsFile file = io::load_safetensors(dir.path("w.safetensors"));

  const int64_t n = 2, c = 3, h = 7, w = 6;
  const Tensor x_nhwc = test::random_tensor(rng, {n, h, w, c});
  std::vector<float> x_nchw(size_t(n * c * h * w));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t r = 0; r < h; ++r)
        for (int64_t s = 0; s < w; ++s)
          x_nchw[((b * c + ch) * h + r) * w + s] =
              x_nhwc.data<float>()[((b * h + r) * w + s) * c + ch];
  int64_t ho = 0, wo = 0;
  const std::vector<float> expected =
      conv_nchw(x_nchw, n, c, h, w, file.tensor("0.weight"), file.tensor("0.bias"), 2, 1, ho, wo);

  const Var y = (*model)[0](Var(x_nhwc)); // [N, Ho, Wo, Cout]
  const std::vector<float> got = y.value().to_vector();
  ASSERT_EQ(y.shape(), (Shape{n, ho, wo, 4}));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < 4; ++o)
      for (int64_t p = 0; p < ho; ++p)
        for (int64_t q = 0; q < wo; ++q)
          EXPECT_NEAR(got[((b * ho + p) * wo + q) * 4 + o],
                      expected[((b * 4 + o) * ho + p) * wo + q], 1e-5);
}

TEST(Checkpoint, StrictLoadingNamesTheFileAndTheProblemAndChangesNothing) {
  test::TempDir dir;
  const std::string good = dir.path("good.safetensors"), bad = dir.path("bad.safetensors");
  io::save_weights(good, *small_model(1));
  auto model = small_model(2);
  const std::vector<uint32_t> before = state_bits(*model);
  auto load = [&] { io::load_weights(bad, *model); };
  auto find = [](std::vector<NamedTensor>& ts, const std::string& name) -> Tensor& {
    for (NamedTensor& t : ts)
      if (t.name == name) return t.tensor;
    throw std::logic_error(name);
  };

  rewrite_safetensors(good, bad, [](auto& ts, auto&) { ts.erase(ts.begin()); });
  expect_error(load, bad, "missing entry");
  rewrite_safetensors(good, bad, [](auto& ts, auto&) {
    ts.push_back({"5.weight", Tensor::zeros({2})});
  });
  expect_error(load, bad, "unexpected entry '5.weight'");
  rewrite_safetensors(good, bad, [](auto& ts, auto&) {
    ts.push_back({"log.loss", Tensor::zeros({2})});
  });
  expect_error(load, bad, "unexpected entry 'log.loss'"); // a training log is not weights
  rewrite_safetensors(good, bad, [&](auto& ts, auto&) {
    find(ts, "4.weight") = Tensor::zeros({4, 5});
  });
  expect_error(load, bad, "'4.weight' has shape [4, 5], expected [5, 4]");
  rewrite_safetensors(good, bad, [&](auto& ts, auto&) {
    find(ts, "0.weight") = Tensor::zeros({4, 3, 3, 3}, DType::f16);
  });
  expect_error(load, bad, "'0.weight' is F16, expected F32");
  rewrite_safetensors(good, bad, [&](auto& ts, auto& is) {
    is.clear();
    ts.push_back({"1.num_batches_tracked", Tensor::zeros({})});
  });
  expect_error(load, bad, "'1.num_batches_tracked' is F32, expected a 0-d I64");
  rewrite_safetensors(good, bad, [&](auto& ts, auto& is) {
    is.push_back({"1.bias", {}, {3}});
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "1.bias"; }),
             ts.end());
  });
  expect_error(load, bad, "'1.bias' is I64, expected F32");
  rewrite_safetensors(good, bad, [](auto&, auto& is) { is[0].values[0] = -1; });
  expect_error(load, bad, "'1.num_batches_tracked' is -1, expected >= 0");

  std::string bytes = io::read_file(good);
  bytes[5] = 1; // a header length of 2^40 bytes, past the end of the file
  test::write_bytes(bad, bytes);
  expect_error(load, bad, "runs past the end");
  expect_error([&] { io::load_weights(dir.path("absent.safetensors"), *model); },
               dir.path("absent.safetensors"), "");
  EXPECT_EQ(state_bits(*model), before) << "a failed load changed the model";
}

// GradScaler options with every field away from PyTorch's defaults (or disabled).
amp::GradScalerOptions unusual_scaler(bool enabled = true) {
  amp::GradScalerOptions options;
  options.init_scale = 1536.0f;
  options.growth_factor = 4.0f;
  options.backoff_factor = 0.25f;
  options.growth_interval = 7;
  options.enabled = enabled;
  return options;
}

// A model, Adam and a GradScaler, to be trained a few real steps (moments, step count and
// growth tracker then away from their initial values).
struct Training {
  std::unique_ptr<nn::Sequential> model;
  std::unique_ptr<optim::Adam> opt;
  std::unique_ptr<amp::GradScaler> scaler;

  explicit Training(uint64_t seed, amp::GradScalerOptions options = unusual_scaler())
      : model(small_model(seed)) {
    opt = std::make_unique<optim::Adam>(model->parameters(), 1e-2f);
    scaler = std::make_unique<amp::GradScaler>(options);
  }
  void steps(int count, Rng& rng) {
    const Tensor labels = Tensor::from_vector({0, 1, 2, 3}, {4}, DType::i32);
    for (int i = 0; i < count; ++i) {
      opt->zero_grad();
      const Var loss =
          ops::cross_entropy((*model)(Var(test::random_tensor(rng, {4, 5, 5, 3}))), labels);
      scaler->scale(loss).backward();
      scaler->step(*opt);
      scaler->update();
    }
  }
  std::vector<float> optimizer_values() {
    std::vector<float> out;
    for (auto& [name, t] : opt->named_state())
      for (float v : t->to_vector()) out.push_back(v);
    return out;
  }
};

io::TrainingState sample_state() {
  io::TrainingState state;
  state.step = 2;
  state.epoch = 1;
  state.data_rng = {0xfedcba9876543210ULL, 0x8000000000000001ULL}; // top bits set: sign of I64
  state.logs = {{"steps", Tensor::from_vector({1, 2, 3, 4, 5, 6}, {1, 6})}};
  state.metadata = {{"example", "test"}, {"precision", "amp"}};
  return state;
}

// `training`, `steps` steps on, saved to `path` with sample_state().
void train_and_save(Training& training, int steps, Rng& rng, const std::string& path) {
  training.steps(steps, rng);
  io::save_training_checkpoint(path, *training.model, *training.opt, *training.scaler,
                               sample_state());
}

TEST(Checkpoint, TrainingCheckpointRoundTripsEveryPart) {
  test::TempDir dir;
  Rng rng(6);
  Training source(1);
  const std::string path = dir.path("ckpt.safetensors");
  train_and_save(source, 2, rng, path);

  Training target(2, amp::GradScalerOptions{}); // PyTorch's defaults: the file must replace them
  const io::TrainingState state = io::load_training_checkpoint(
      path, *target.model, *target.opt, *target.scaler, {{"precision", "amp"}});
  EXPECT_EQ(state_bits(*target.model), state_bits(*source.model));
  EXPECT_EQ(target.optimizer_values(), source.optimizer_values());
  EXPECT_EQ(target.opt->step_count(), 2);
  const amp::GradScalerState loaded = *target.scaler->state_dict();
  EXPECT_EQ(loaded.scale, 1536.0f);
  EXPECT_EQ(loaded.growth_factor, 4.0f);
  EXPECT_EQ(loaded.backoff_factor, 0.25f);
  EXPECT_EQ(loaded.growth_interval, 7);
  EXPECT_EQ(loaded.growth_tracker, 2);
  EXPECT_EQ(state.step, 2);
  EXPECT_EQ(state.epoch, 1);
  EXPECT_EQ(state.data_rng.state, 0xfedcba9876543210ULL);
  EXPECT_EQ(state.data_rng.increment, 0x8000000000000001ULL);
  ASSERT_EQ(state.logs.size(), 1u);
  EXPECT_EQ(state.logs[0].name, "steps");
  EXPECT_EQ(state.logs[0].tensor.to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(state.metadata.at("example"), "test");

  // Conv moments are stored like their parameter, [Cout, Cin, kh, kw].
  const io::SafetensorsFile file = io::load_safetensors(path);
  EXPECT_EQ(file.tensor("optimizer.exp_avg.0").shape(), (Shape{4, 3, 3, 3}));
  EXPECT_TRUE(file.int64s_named("scaler._growth_tracker").shape.empty());
}

TEST(Checkpoint, TrainingCheckpointMismatchesAreErrors) {
  test::TempDir dir;
  Rng rng(7);
  Training source(1);
  const std::string path = dir.path("ckpt.safetensors");
  train_and_save(source, 1, rng, path);

  Training target(2, amp::GradScalerOptions{}); // its factors differ from the file's
  auto load = [&](const std::string& file, amp::GradScaler& scaler,
                  io::RequiredMetadata required = {}) {
    return [&, file, required] {
      io::load_training_checkpoint(file, *target.model, *target.opt, scaler, required);
    };
  };
  expect_error(load(path, *target.scaler, {{"precision", "fp32"}}), path,
               "written by a run with precision 'amp', this run has 'fp32'");
  // The first key that differs, in the caller's order, is the one reported.
  expect_error(load(path, *target.scaler, {{"precision", "fp32"}, {"example", "other"}}), path,
               "precision 'amp'");
  expect_error(load(path, *target.scaler, {{"example", "other"}, {"precision", "fp32"}}), path,
               "example 'test', this run has 'other'");
  expect_error(load(path, *target.scaler, {{"dataset", "folder"}}), path,
               "written by a run with dataset '(none)', this run has 'folder'");
  Training disabled(3, unusual_scaler(false));
  expect_error(load(path, *disabled.scaler), path, "unexpected entry 'scaler.");
  expect_error([&] { io::load_weights(path, *target.model); }, path,
               ": a training checkpoint, not a weights file");
  const std::string weights = dir.path("weights.safetensors");
  io::save_weights(weights, *source.model);
  expect_error(load(weights, *target.scaler, {{"example", "test"}}), weights,
               ": not a training checkpoint (it has no 'train.step')");

  const std::string plain = dir.path("plain.safetensors");
  io::save_training_checkpoint(plain, *disabled.model, *disabled.opt, *disabled.scaler,
                               sample_state());
  expect_error(load(plain, *target.scaler), plain, "missing entry 'scaler.");

  const std::string bad = dir.path("bad.safetensors");
  rewrite_safetensors(path, bad, [](auto& ts, auto&) {
    for (NamedTensor& t : ts)
      if (t.name == "scaler.scale") t.tensor = Tensor::full({}, -4.0f);
  });
  expect_error(load(bad, *target.scaler), bad,
               "'scaler.scale' is -4, expected a finite value > 2.93874e-39");
  rewrite_safetensors(path, bad, [](auto&, auto& is) {
    for (NamedInt64s& e : is)
      if (e.name == "scaler.growth_interval") e.values[0] = 0;
  });
  expect_error(load(bad, *target.scaler), bad, "'scaler.growth_interval' is 0, expected >= 1");
  rewrite_safetensors(path, bad, [](auto&, auto& is) {
    for (NamedInt64s& e : is)
      if (e.name == "scaler._growth_tracker") e.values[0] = int64_t(1) << 32; // not an int
  });
  expect_error(load(bad, *target.scaler), bad,
               "'scaler._growth_tracker' is 4294967296, expected >= 0 and <= 2147483647");
  rewrite_safetensors(path, bad, [](auto&, auto& is) {
    for (NamedInt64s& e : is)
      if (e.name == "train.epoch") e.values[0] = -1;
  });
  expect_error(load(bad, *target.scaler), bad, "'train.epoch' is -1, expected >= 0");
  // Counters are PyTorch's 0-d I64 tensors, and an I64 the checkpoint does not have is refused
  // like an unexpected tensor.
  rewrite_safetensors(path, bad, [](auto&, auto& is) {
    for (NamedInt64s& e : is)
      if (e.name == "train.step") e.shape = {1};
  });
  expect_error(load(bad, *target.scaler), bad, "'train.step' has 1 dimensions, expected a 0-d I64");
  // A step stored as F32 still marks a training checkpoint: its loader names the dtype, and
  // load_weights sends it there.
  rewrite_safetensors(path, bad, [](auto& ts, auto& is) {
    is.erase(std::remove_if(is.begin(), is.end(),
                            [](const NamedInt64s& e) { return e.name == "train.step"; }),
             is.end());
    ts.push_back({"train.step", Tensor::full({}, 3.0f)});
  });
  expect_error(load(bad, *target.scaler), bad, "'train.step' is F32, expected a 0-d I64");
  expect_error([&] { io::load_weights(bad, *target.model); }, bad,
               ": a training checkpoint, not a weights file");
  rewrite_safetensors(path, bad, [](auto&, auto& is) { is.push_back({"train.extra", {}, {3}}); });
  expect_error(load(bad, *target.scaler), bad, "unexpected entry 'train.extra'");
  // Factors GradScaler's constructor refuses are refused in a file too, the bounds included.
  for (const auto& [name, value, expected] :
       {std::tuple{"scaler.growth_factor", 0.5f, "is 0.5, expected a finite value > 1"},
        std::tuple{"scaler.growth_factor", 1.0f, "is 1, expected a finite value > 1"},
        std::tuple{"scaler.backoff_factor", 1.5f, "is 1.5, expected a finite value > 0 and < 1"},
        std::tuple{"scaler.backoff_factor", 1.0f, "is 1, expected a finite value > 0 and < 1"},
        std::tuple{"scaler.backoff_factor", 0.0f, "is 0, expected a finite value > 0 and < 1"},
        std::tuple{"scaler.scale", INFINITY, "is inf, expected a finite value > 2.93874e-39"},
        std::tuple{"scaler.scale", 0.0f, "is 0, expected a finite value > 2.93874e-39"},
        // 1 / scale must be finite too (GradScaler's range; PyTorch would take these).
        std::tuple{"scaler.scale", 1e-40f, "is 9.99995e-41, expected a finite value > 2.93874e-39"},
        std::tuple{"scaler.scale", 0x1p-128f, "is 2.93874e-39, expected a finite value >"}}) {
    rewrite_safetensors(path, bad, [name = std::string(name), value = value](auto& ts, auto&) {
      for (NamedTensor& t : ts)
        if (t.name == name) t.tensor = Tensor::full({}, value);
    });
    expect_error(load(bad, *target.scaler), bad, cat("'", name, "' ", expected));
  }
  EXPECT_EQ(target.scaler->state_dict()->growth_factor, 2.0f) << "a refused file changed it";
  EXPECT_EQ(target.scaler->state_dict()->scale, 65536.0f) << "a refused file changed it";
}

// Values training never produces are refused, naming the entry: non-finite weights, buffers and
// moments, negative second moments and running variances, and an Adam step count that is not an
// integer from 0 to the steps completed (sample_state: 2).
TEST(Checkpoint, ValuesTrainingCannotProduceAreRefused) {
  test::TempDir dir;
  Rng rng(9);
  Training source(1);
  const std::string path = dir.path("ckpt.safetensors"), bad = dir.path("bad.safetensors");
  train_and_save(source, 1, rng, path);
  Training target(2);
  const std::vector<uint32_t> before = state_bits(*target.model);
  auto load = [&] {
    io::load_training_checkpoint(bad, *target.model, *target.opt, *target.scaler);
  };
  const float nan = std::nanf("");
  const std::tuple<const char*, float, const char*> cases[] = {
      {"0.weight", nan, "'0.weight' holds nan at index 0, expected finite values"},
      {"4.bias", INFINITY, "'4.bias' holds inf at index 0, expected finite values"},
      {"1.running_mean", -INFINITY, "'1.running_mean' holds -inf at index 0"},
      {"1.running_var", -1.0f, "'1.running_var' holds -1 at index 0, expected finite values >= 0"},
      {"optimizer.exp_avg.0", nan, "'optimizer.exp_avg.0' holds nan"},
      {"optimizer.exp_avg_sq.2", -1.0f,
       "'optimizer.exp_avg_sq.2' holds -1 at index 0, expected "
       "finite values >= 0"},
      {"optimizer.step", nan, "'optimizer.step' is nan, expected an integer from 0 to 2"},
      {"optimizer.step", -1.0f, "'optimizer.step' is -1, expected an integer from 0 to 2"},
      {"optimizer.step", 3.0f, "'optimizer.step' is 3, expected an integer from 0 to 2"},
      {"optimizer.step", 1e30f, "'optimizer.step' is 1e+30"},
      {"optimizer.step", INFINITY, "'optimizer.step' is inf"},
      {"optimizer.step", 1.5f, "'optimizer.step' is 1.5"},
  };
  for (const auto& [name, value, message] : cases) {
    rewrite_safetensors(path, bad, [name = std::string(name), value = value](auto& ts, auto&) {
      for (NamedTensor& t : ts)
        if (t.name == name) t.tensor.data<float>()[0] = value;
    });
    expect_error(load, bad, message);
  }
  EXPECT_EQ(state_bits(*target.model), before) << "a refused file changed the model";
  // A weights file is held to the same rules.
  const std::string weights = dir.path("weights.safetensors");
  io::save_weights(weights, *source.model);
  rewrite_safetensors(weights, bad,
                      [nan](auto& ts, auto&) { ts[0].tensor.template data<float>()[0] = nan; });
  expect_error([&] { io::load_weights(bad, *target.model); }, bad, "holds nan at index 0");
  // Steps 0, 1 and 2 (all steps skipped, some, none) load.
  for (float step : {0.0f, 1.0f, 2.0f}) {
    rewrite_safetensors(path, bad, [step](auto& ts, auto&) {
      for (NamedTensor& t : ts)
        if (t.name == "optimizer.step") t.tensor.data<float>()[0] = step;
    });
    io::load_training_checkpoint(bad, *target.model, *target.opt, *target.scaler);
    EXPECT_EQ(target.opt->step_count(), int64_t(step));
  }
}

// What loading refuses is never written: a model whose weights went NaN (training diverged) is
// refused by the save functions with InvalidState, and the previous file stays.
TEST(Checkpoint, SavingRefusesWhatLoadingWouldRefuse) {
  test::TempDir dir;
  Training run(1);
  const std::string weights = dir.path("w.safetensors"), ckpt = dir.path("c.safetensors");
  io::save_weights(weights, *run.model);
  io::save_training_checkpoint(ckpt, *run.model, *run.opt, *run.scaler, sample_state());
  const std::string weights_before = io::read_file(weights), ckpt_before = io::read_file(ckpt);
  run.model->named_parameters()[1].second->master().data<float>()[2] = std::nanf("");
  expect_error([&] { io::save_weights(weights, *run.model); }, weights,
               "holds nan at index 2, expected finite values; loading would refuse it");
  EXPECT_THROW(
      io::save_training_checkpoint(ckpt, *run.model, *run.opt, *run.scaler, sample_state()),
      io::InvalidState);
  EXPECT_EQ(io::read_file(weights), weights_before);
  EXPECT_EQ(io::read_file(ckpt), ckpt_before);
}

TEST(Checkpoint, CorruptFilesLoadOrFailWithAnErrorNamingTheFile) {
  test::TempDir dir;
  Rng rng(8);
  Training source(1);
  const std::string weights = dir.path("w.safetensors"), ckpt = dir.path("c.safetensors");
  train_and_save(source, 1, rng, ckpt);
  io::save_weights(weights, *source.model);

  auto model = small_model(2);
  auto load_weights = [&](const std::string& path) { io::load_weights(path, *model); };
  Training target(2);
  auto load_training = [&](const std::string& path) {
    io::load_training_checkpoint(path, *target.model, *target.opt, *target.scaler);
  };
  auto fuzz = [&](const std::string& valid, const std::string& path, auto load) {
    const test::FuzzCounts cut = test::fuzz_truncations(valid, path, load, rng, 120);
    EXPECT_EQ(cut.loaded, 0) << "a truncated checkpoint must not load";
    const test::FuzzCounts flips = test::fuzz_bit_flips(valid, path, load, rng, 200, 400);
    EXPECT_GT(flips.rejected, 0);
    EXPECT_GT(flips.loaded, 0); // flips inside the data are undetectable without a checksum
  };
  fuzz(io::read_file(weights), dir.path("fuzz-w"), load_weights);
  fuzz(io::read_file(ckpt), dir.path("fuzz-c"), load_training);
}

} // namespace
} // namespace minamp
