// Checkpoints as safetensors files in PyTorch's state_dict names and layouts, of two kinds:
//
// Weights (a model's state_dict, what torch's nn.Sequential.load_state_dict reads):
//   "<i>.weight", "<i>.bias"        parameters, F32
//   "<i>.running_mean/running_var"  BatchNorm buffers, F32
//   "<i>.num_batches_tracked"       BatchNorm counters, 0-d I64
// Every 4-D tensor is a conv weight: [Cout, kh, kw, Cin] inside minamp (channels-last),
// [Cout, Cin, kh, kw] in the file; Linear [out, in] and 1-D tensors are stored as they are.
//
// Training checkpoints: the weights, plus what resuming needs, under prefixes that no module
// of minamp's models is named (nn::Sequential numbers its layers; ResNet's are torchvision's):
//   "optimizer.<name>"   each tensor of Optimizer::named_state() (Adam "step", "exp_avg.<i>",
//                        "exp_avg_sq.<i>"; SGD "momentum_buffer.<i>"), 4-D ones permuted
//                        like their parameter
//   "scaler.<key>"       GradScaler.state_dict() key for key (only when the scaler is enabled):
//                        scale, growth_factor, backoff_factor (0-d F32), growth_interval,
//                        _growth_tracker (0-d I64)
//   "train.step", "train.epoch"                      0-d I64: steps and epochs completed
//   "train.data_rng.state", "train.data_rng.increment"  0-d I64: the data-order Rng (bits as is)
//   "log.<name>"         any tensors the trainer keeps with the run (its log so far)
//
// Loading is strict, as PyTorch's load_state_dict(strict=True): every expected name must be
// there with the expected dtype and shape, and no other name may be. Values are checked too,
// against what training can produce: parameters, buffers and first moments finite; second
// moments ("exp_avg_sq") and BatchNorm running variances finite and >= 0; Adam's "step" an
// integer from 0 to train.step; the scaler's values in GradScaler's ranges. Everything is
// checked before anything is changed, so a bad file leaves the model and optimizer as they were.
// Saving applies the same value checks, so nothing is written that loading would refuse.
#pragma once

#include <string>
#include <vector>

#include "amp/grad_scaler.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace minamp::io {

// Thrown by the save functions, before anything is written, when a value to save is one loading
// refuses: in practice NaN or inf in the weights after training diverged.
class InvalidState : public Error {
public:
  using Error::Error;
};

// Writes the model's state_dict to `path` atomically.
void save_weights(const std::string& path, nn::Module& model);

// Loads a state_dict written by save_weights (or by PyTorch's safetensors for the equivalent
// module) into `model`. Throws Error naming the file and the first problem found (a training
// checkpoint is named as such). With `skipped` (a module's name, e.g. "fc"), that module's
// entries are neither required nor read and its weights keep their values (a classifier
// replaced by one of another size).
void load_weights(const std::string& path, nn::Module& model, const std::string& skipped = "");

// What a training checkpoint holds besides the model, optimizer and scaler.
struct TrainingState {
  int64_t step = 0;  // optimizer steps completed
  int64_t epoch = 0; // epochs completed
  Rng::State data_rng;
  std::vector<NamedTensor> logs; // names without the "log." prefix
  Metadata metadata;             // strings describing the run
};

// Writes model, optimizer, scaler and `state` to `path` atomically.
void save_training_checkpoint(const std::string& path, nn::Module& model, optim::Optimizer& opt,
                              const amp::GradScaler& scaler, const TrainingState& state);

// Metadata values a checkpoint must have, checked in this order (the first that differs is the
// one reported, so the most telling keys, e.g. which example wrote the file, come first).
using RequiredMetadata = std::vector<std::pair<std::string, std::string>>;

// Loads a checkpoint written by save_training_checkpoint into model, opt and scaler (built as
// for the run that wrote it) and returns the rest. The file's metadata must hold every key of
// `required` with the same value (e.g. the example and precision of this run). Throws Error
// naming the file and the problem (a weights-only file is named as such).
TrainingState load_training_checkpoint(const std::string& path, nn::Module& model,
                                       optim::Optimizer& opt, amp::GradScaler& scaler,
                                       const RequiredMetadata& required = {});

} // namespace minamp::io
