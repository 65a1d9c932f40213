// Checkpoint reading and writing (see checkpoint.h): each model, optimizer, scaler and progress
// value becomes an Entry bound to where it lives in memory; saving writes the entries in
// PyTorch's layout, loading checks them all against the file before writing any of them back.
#include "io/checkpoint.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"

namespace minamp::io {

namespace {

constexpr const char* kLogPrefix = "log.";

// What the values of a tensor entry must be, on load and on save (counters have [min, max]).
enum class Values {
  finite,              // parameters, buffers, first moments
  finite_non_negative, // second moments, BatchNorm running variances
  bounded,             // one finite value in (above, below): the scaler's scale and factors
  step_count,          // one integer in [min, max]: Adam's step, at most train.step
};

// One checkpoint entry and where its value lives: an f32 tensor (any device), or a host int64
// stored as a 0-d I64. For a parameter's master, `param` is set so its f16 copy follows a load.
// A counter must lie in [min, max]; a tensor must hold what `values` says, so a corrupt file
// cannot make training nonsense.
struct Entry {
  std::string name;
  Tensor* tensor = nullptr;
  int64_t* counter = nullptr;
  Parameter* param = nullptr;
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  Values values = Values::finite;
  float above = 0.0f, below = INFINITY;
};

Entry tensor_entry(std::string name, Tensor* t, Values values = Values::finite,
                   Parameter* param = nullptr) {
  Entry e{std::move(name), t};
  e.values = values;
  e.param = param;
  return e;
}

Entry counter_entry(std::string name, int64_t* c, int64_t min,
                    int64_t max = std::numeric_limits<int64_t>::max()) {
  Entry e{std::move(name), nullptr, c};
  e.min = min;
  e.max = max;
  return e;
}

Entry bounded_scalar_entry(std::string name, Tensor* t, float above, float below = INFINITY) {
  Entry e = tensor_entry(std::move(name), t, Values::bounded);
  e.above = above;
  e.below = below;
  return e;
}

Entry step_count_entry(std::string name, Tensor* t, int64_t max) {
  Entry e = tensor_entry(std::move(name), t, Values::step_count);
  e.min = 0;
  e.max = max;
  return e;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Why the host f32 tensor `t` is not a value `e` may hold ("holds nan at index 3, expected
// finite values"), or "" when it is one.
std::string invalid_value(const Entry& e, const Tensor& t) {
  const float* v = t.data<float>();
  switch (e.values) {
  case Values::finite:
  case Values::finite_non_negative: {
    const bool non_negative = e.values == Values::finite_non_negative;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(v[i]) || (non_negative && v[i] < 0.0f))
        return cat("holds ", v[i], " at index ", i, ", expected finite values",
                   non_negative ? " >= 0" : "");
    return "";
  }
  case Values::bounded:
    if (std::isfinite(v[0]) && v[0] > e.above && v[0] < e.below) return "";
    return cat("is ", v[0], ", expected a finite value > ", e.above,
               std::isinf(e.below) ? std::string() : cat(" and < ", e.below));
  case Values::step_count:
    if (std::isfinite(v[0]) && v[0] == std::floor(v[0]) && v[0] >= float(e.min) &&
        v[0] <= float(e.max))
      return "";
    return cat("is ", v[0], ", expected an integer from ", e.min, " to ", e.max,
               " (the steps the checkpoint has completed)");
  }
  return "";
}

// ---- layouts ----

// out has dims d[order[k]] of a host f32 4-D tensor with dims d: the axes rearranged.
Tensor permute4(const Tensor& t, const std::array<int, 4>& order) {
  const Shape& d = t.shape();
  const std::array<int64_t, 4> stride{d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
  Tensor out = Tensor::empty({d[order[0]], d[order[1]], d[order[2]], d[order[3]]});
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  const Shape& o = out.shape();
  for (int64_t a = 0; a < o[0]; ++a)
    for (int64_t b = 0; b < o[1]; ++b)
      for (int64_t c = 0; c < o[2]; ++c)
        for (int64_t e = 0; e < o[3]; ++e)
          *dst++ = src[a * stride[order[0]] + b * stride[order[1]] + c * stride[order[2]] +
                       e * stride[order[3]]];
  return out;
}

// Conv weights: [Cout, kh, kw, Cin] (minamp) <-> [Cout, Cin, kh, kw] (PyTorch).
constexpr std::array<int, 4> kToPytorch{0, 3, 1, 2};
constexpr std::array<int, 4> kFromPytorch{0, 2, 3, 1};

Shape pytorch_shape(const Shape& s) { return s.rank() == 4 ? Shape{s[0], s[3], s[1], s[2]} : s; }

// A host copy of `t` as the file stores it.
Tensor to_file_layout(const Tensor& t) {
  const Tensor host = t.device() == Device::cpu ? t : t.to(Device::cpu);
  return host.shape().rank() == 4 ? permute4(host, kToPytorch) : host;
}

// ---- the entries of a model, an optimizer, a scaler, the progress ----

std::vector<Entry> model_entries(nn::Module& model) {
  std::vector<Entry> entries;
  for (auto& [name, p] : model.named_parameters())
    entries.push_back(tensor_entry(name, &p->master(), Values::finite, p));
  for (auto& [name, t] : model.named_buffers())
    entries.push_back(tensor_entry(
        name, t, ends_with(name, "running_var") ? Values::finite_non_negative : Values::finite));
  for (auto& [name, c] : model.named_counters()) entries.push_back(counter_entry(name, c, 0));
  return entries;
}

// The optimizer's state (PyTorch's names): Adam's "step" counts at most the `steps` completed.
void add_optimizer_entries(optim::Optimizer& opt, int64_t steps, std::vector<Entry>& entries) {
  for (auto& [name, t] : opt.named_state()) {
    const std::string entry = "optimizer." + name;
    if (name == "step")
      entries.push_back(step_count_entry(entry, t, steps));
    else
      entries.push_back(tensor_entry(entry, t,
                                     name.rfind("exp_avg_sq.", 0) == 0 ? Values::finite_non_negative
                                                                       : Values::finite));
  }
}

// GradScaler.state_dict() as host values that entries can point at.
struct ScalerValues {
  Tensor scale = Tensor::zeros({}), growth_factor = Tensor::zeros({}),
         backoff_factor = Tensor::zeros({});
  int64_t growth_interval = 0, growth_tracker = 0;

  explicit ScalerValues(const std::optional<amp::GradScalerState>& s) {
    if (!s) return;
    kernels::fill(scale, s->scale);
    kernels::fill(growth_factor, s->growth_factor);
    kernels::fill(backoff_factor, s->backoff_factor);
    growth_interval = s->growth_interval;
    growth_tracker = s->growth_tracker;
  }
  amp::GradScalerState state() const {
    return {scale.item(), growth_factor.item(), backoff_factor.item(),
            static_cast<int>(growth_interval), static_cast<int>(growth_tracker)};
  }
  void add_to(std::vector<Entry>& entries) {
    // The ranges GradScaler's constructor accepts; its counters are ints.
    constexpr int64_t int_max = std::numeric_limits<int>::max();
    entries.push_back(bounded_scalar_entry("scaler.scale", &scale, amp::kScaleFloor));
    entries.push_back(bounded_scalar_entry("scaler.growth_factor", &growth_factor, 1.0f));
    entries.push_back(bounded_scalar_entry("scaler.backoff_factor", &backoff_factor, 0.0f, 1.0f));
    entries.push_back(counter_entry("scaler.growth_interval", &growth_interval, 1, int_max));
    entries.push_back(counter_entry("scaler._growth_tracker", &growth_tracker, 0, int_max));
  }
};

// TrainingState's counters as int64s that entries can point at (the Rng's u64s bit for bit).
struct ProgressValues {
  int64_t step = 0, epoch = 0, rng_state = 0, rng_increment = 0;

  explicit ProgressValues(const TrainingState& s)
      : step(s.step), epoch(s.epoch), rng_state(static_cast<int64_t>(s.data_rng.state)),
        rng_increment(static_cast<int64_t>(s.data_rng.increment)) {}
  void write_to(TrainingState& s) const {
    s.step = step;
    s.epoch = epoch;
    s.data_rng = {static_cast<uint64_t>(rng_state), static_cast<uint64_t>(rng_increment)};
  }
  // train.step first: load_training_checkpoint reads it before the other entries.
  void add_to(std::vector<Entry>& entries) {
    const int64_t any = std::numeric_limits<int64_t>::min();
    entries.push_back(counter_entry("train.step", &step, 0));
    entries.push_back(counter_entry("train.epoch", &epoch, 0));
    entries.push_back(counter_entry("train.data_rng.state", &rng_state, any));
    entries.push_back(counter_entry("train.data_rng.increment", &rng_increment, any));
  }
};

// ---- saving ----

void save_entries(const std::string& path, const std::vector<Entry>& entries,
                  std::vector<NamedTensor> extra, Metadata metadata) {
  std::vector<NamedTensor> tensors;
  std::vector<NamedInt64s> counters;
  for (const Entry& e : entries) {
    if (e.counter) {
      counters.push_back({e.name, {}, {*e.counter}});
      continue;
    }
    tensors.push_back({e.name, to_file_layout(*e.tensor)});
    const std::string invalid = invalid_value(e, tensors.back().tensor);
    if (!invalid.empty())
      throw InvalidState(cat("save: ", path, ": '", e.name, "' ", invalid,
                             "; loading would refuse it, so it is not written"));
  }
  for (NamedTensor& t : extra) tensors.push_back(std::move(t));
  metadata["format"] = "pt"; // as torch's safetensors save_file writes
  save_safetensors(path, tensors, metadata, counters);
}

// ---- loading ----

// A value read from the file for one entry, ready to be written back.
struct LoadedValue {
  Tensor tensor;
  int64_t counter = 0;
};

LoadedValue read_tensor(const SafetensorsFile& file, const Entry& e, const char* op) {
  require(!file.has_int64s(e.name), op, file.path, ": '", e.name, "' is I64, expected F32");
  require(file.has_tensor(e.name), op, file.path, ": missing entry '", e.name, "'");
  const Tensor& t = file.tensor(e.name);
  require(t.dtype() == e.tensor->dtype(), op, file.path, ": '", e.name, "' is ",
          safetensors_dtype(t.dtype()), ", expected ", safetensors_dtype(e.tensor->dtype()));
  const Shape expected = pytorch_shape(e.tensor->shape());
  require(t.shape() == expected, op, file.path, ": '", e.name, "' has shape ", t.shape(),
          ", expected ", expected);
  const std::string invalid = invalid_value(e, t);
  require(invalid.empty(), op, file.path, ": '", e.name, "' ", invalid);
  const Tensor value = t.shape().rank() == 4 ? permute4(t, kFromPytorch) : t;
  return {value.to(e.tensor->device())};
}

LoadedValue read_counter(const SafetensorsFile& file, const Entry& e, const char* op) {
  if (file.has_tensor(e.name))
    throw Error(cat(op, ": ", file.path, ": '", e.name, "' is ",
                    safetensors_dtype(file.tensor(e.name).dtype()), ", expected a 0-d I64"));
  require(file.has_int64s(e.name), op, file.path, ": missing entry '", e.name, "'");
  const NamedInt64s& ints = file.int64s_named(e.name);
  require(ints.shape.empty(), op, file.path, ": '", e.name, "' has ", ints.shape.size(),
          " dimensions, expected a 0-d I64");
  const int64_t value = ints.values.at(0);
  require(value >= e.min && value <= e.max, op, file.path, ": '", e.name, "' is ", value,
          ", expected >= ", e.min,
          e.max == std::numeric_limits<int64_t>::max() ? std::string() : cat(" and <= ", e.max));
  return {Tensor(), value};
}

// Throws unless every name in the file is one of `entries`, or (with `allow_logs`) a "log."
// tensor, or starts with `ignored` (when not empty).
void refuse_unexpected(const SafetensorsFile& file, const std::vector<Entry>& entries,
                       bool allow_logs, const std::string& ignored, const char* op) {
  std::set<std::string> known;
  for (const Entry& e : entries) known.insert(e.name);
  auto expected = [&](const std::string& name) {
    return known.count(name) || (!ignored.empty() && name.rfind(ignored, 0) == 0);
  };
  for (const NamedTensor& t : file.tensors) {
    const bool log = allow_logs && t.name.rfind(kLogPrefix, 0) == 0;
    require(log || expected(t.name), op, file.path, ": unexpected entry '", t.name, "'");
  }
  for (const NamedInt64s& i : file.int64s)
    require(expected(i.name), op, file.path, ": unexpected entry '", i.name, "'");
}

// Checks every entry against `file`, then writes them all (nothing is written on an error).
// Names starting with `ignored` (when not empty) may be in the file and are not read.
void load_entries(const SafetensorsFile& file, const std::vector<Entry>& entries, bool allow_logs,
                  const char* op, const std::string& ignored = "") {
  std::vector<LoadedValue> values;
  for (const Entry& e : entries)
    values.push_back(e.tensor ? read_tensor(file, e, op) : read_counter(file, e, op));
  refuse_unexpected(file, entries, allow_logs, ignored, op);
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.counter) {
      *e.counter = values[i].counter;
      continue;
    }
    *e.tensor = values[i].tensor;
    if (e.param && e.param->half_copy().defined()) e.param->sync_half_copy();
  }
}

// Whether `file` is a training checkpoint (it records the steps completed) rather than weights.
bool is_training_checkpoint(const SafetensorsFile& file) {
  return file.has_int64s("train.step") || file.has_tensor("train.step");
}

std::vector<NamedTensor> logs_of(const SafetensorsFile& file) {
  std::vector<NamedTensor> logs;
  for (const NamedTensor& t : file.tensors)
    if (t.name.rfind(kLogPrefix, 0) == 0)
      logs.push_back({t.name.substr(std::string(kLogPrefix).size()), t.tensor});
  return logs;
}

} // namespace

void save_weights(const std::string& path, nn::Module& model) {
  save_entries(path, model_entries(model), {}, {});
}

void load_weights(const std::string& path, nn::Module& model, const std::string& skipped) {
  const SafetensorsFile file = load_safetensors(path);
  require(!is_training_checkpoint(file), "load_weights", path,
          ": a training checkpoint, not a weights file (it has 'train.step'); continue its run "
          "with load_training_checkpoint (--resume in the examples)");
  std::vector<Entry> entries = model_entries(model);
  const std::string prefix = skipped.empty() ? skipped : skipped + ".";
  if (!prefix.empty())
    entries.erase(std::remove_if(entries.begin(), entries.end(),
                                 [&](const Entry& e) { return e.name.rfind(prefix, 0) == 0; }),
                  entries.end());
  load_entries(file, entries, false, "load_weights", prefix);
}

void save_training_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                              const amp::GradScaler& scaler, const TrainingState& state) {
  std::vector<Entry> entries = model_entries(model);
  add_optimizer_entries(opt, state.step, entries);
  ScalerValues scaler_values(scaler.state_dict());
  if (scaler.is_enabled()) scaler_values.add_to(entries);
  ProgressValues progress(state);
  progress.add_to(entries);
  std::vector<NamedTensor> logs;
  for (const NamedTensor& t : state.logs) logs.push_back({kLogPrefix + t.name, t.tensor});
  save_entries(path, entries, logs, state.metadata);
}

TrainingState load_training_checkpoint(const std::string& path, nn::Module& model,
                                       optim::Optimizer& opt, amp::GradScaler& scaler,
                                       const RequiredMetadata& required) {
  const SafetensorsFile file = load_safetensors(path);
  require(is_training_checkpoint(file), "load_training_checkpoint", path,
          ": not a training checkpoint (it has no 'train.step'); a weights file loads with "
          "load_weights (--load-weights in the examples)");
  for (const auto& [key, value] : required) {
    const auto found = file.metadata.find(key);
    require(found != file.metadata.end() && found->second == value, "load_training_checkpoint",
            path, ": written by a run with ", key, " '",
            found == file.metadata.end() ? "(none)" : found->second, "', this run has '", value,
            "'");
  }
  TrainingState state;
  ProgressValues progress(state);
  std::vector<Entry> progress_entries;
  progress.add_to(progress_entries);
  // The steps completed bound Adam's step count (checked first, as every counter is checked).
  const int64_t steps =
      read_counter(file, progress_entries.front(), "load_training_checkpoint").counter;
  std::vector<Entry> entries = model_entries(model);
  add_optimizer_entries(opt, steps, entries);
  ScalerValues scaler_values(std::nullopt);
  if (scaler.is_enabled()) scaler_values.add_to(entries);
  entries.insert(entries.end(), progress_entries.begin(), progress_entries.end());
  load_entries(file, entries, true, "load_training_checkpoint");

  if (scaler.is_enabled()) scaler.load_state_dict(scaler_values.state());
  progress.write_to(state);
  state.logs = logs_of(file);
  state.metadata = file.metadata;
  return state;
}

} // namespace minamp::io
