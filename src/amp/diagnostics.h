// Range diagnostics of the two 16-bit formats — the argument of Micikevicius et al. (2018,
// Figure 3), measured for f16 and bf16: how many activation- and weight-gradient values would
// flush to zero, land in the subnormal range or overflow if stored in f16 (at scale 1 and at a
// loss scale S) or in bf16 (at scale 1: it has float's range); the histogram of log2|g| that the
// paper draws (gradients.png); how many weight updates each format would round away if the
// weights were kept in it (the case for fp32 master weights); and which parameter's gradient
// turned non-finite first on an overflow.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "autograd/var.h"
#include "nn/parameter.h"

namespace minamp::amp {

struct RangeCounts {
  double flushed = 0;   // nonzero values that become 0 in the format
  double subnormal = 0; // values below its smallest normal: kept with reduced precision
  double overflow = 0;  // values that become inf
  double nonzero = 0;   // all nonzero finite values
  double nonfinite = 0; // values already inf or NaN
};

// How many values of a tensor have each binary exponent: counts[e - kMinExponent] of them have
// 2^e <= |v| < 2^(e + 1). Float's exponents, subnormals included, span -149 .. 127; the bins go
// a little wider, so that values divided by a loss scale still land in one.
struct Log2Histogram {
  static constexpr int kMinExponent = -180, kMaxExponent = 140;
  std::array<double, kMaxExponent - kMinExponent + 1> counts{};
  double zeros = 0, nonfinite = 0;

  // Adds the values of `x` divided by `divisor` (the loss scale they are stored at; a host read).
  void add(const Tensor& x, double divisor);
  double nonzero() const;
};

struct RangeReport {
  std::string name; // "linear#0" for activations (in forward order), parameter names for weights
  RangeCounts f16_at_one, f16_at_scale, bf16_at_one;
  Log2Histogram histogram; // of the true values (x 1); activation gradients only
};

// While alive, records the range counts and the log2 histogram of every layer output's gradient
// during backward() (losses, loss scaling and casts are left out: their gradients stay fp32 under
// autocast). Gradients are stored multiplied by `stored_scale` (the loss scale of this backward,
// 1 without a scaler); counts are taken for the true gradient (x 1) and, in f16, for it
// multiplied by `target_scale`. Each gradient is read on the host as backward produces it (for
// its histogram): a diagnostic, not a training step.
class ActivationGradientProbe {
public:
  ActivationGradientProbe(float stored_scale, float target_scale);
  ~ActivationGradientProbe();
  ActivationGradientProbe(const ActivationGradientProbe&) = delete;
  ActivationGradientProbe& operator=(const ActivationGradientProbe&) = delete;
  // The per-op reports of every backward run while the probe is alive (the examples run one),
  // in forward order.
  std::vector<RangeReport> reports() const;

private:
  float stored_scale_, target_scale_;
  std::vector<RangeReport> entries_; // in backward order, named by op
};

// The same counts for the parameters' gradients (stored x stored_scale); frozen ones have none,
// and no report has a histogram.
std::vector<RangeReport>
weight_gradient_report(const std::vector<std::pair<std::string, Parameter*>>& params,
                       float stored_scale, float target_scale);

// The name of the parameter whose gradient the backward pass made non-finite first (backward
// visits the last layer first), or "" when every gradient is finite.
std::string
first_nonfinite_parameter(const std::vector<std::pair<std::string, Parameter*>>& params);

// A table of reports: name, nonzero count, % flushed / subnormal / overflow in f16 at scale 1 and
// at S, and in bf16 at scale 1.
std::string format_range_reports(const std::string& title, const std::vector<RangeReport>& reports,
                                 float target_scale);

// gradients.png: the histogram of log2|g| over every layer's activation gradients and over the
// layer that f16 flushes most of, at scale 1 and shifted by log2(target_scale), with f16's
// overflow, smallest normal and smallest subnormal marked and bf16's range (Micikevicius et al.,
// Figure 3). Written atomically; `title` heads it.
void save_gradient_histogram(const std::string& path, const std::vector<RangeReport>& reports,
                             float target_scale, const std::string& title);

// What one optimizer step would have done to weights kept in a 16-bit format instead of an fp32
// master: `lost` updates (nonzero, but under half a unit in the last place of their weight, so
// the stored weight stays put) and the relative error of the updates the stored weights take,
// ||(round(w16 + dw) - w16) - dw|| / ||dw||, with w16 the weight rounded to the format.
struct UpdateRounding {
  double lost = 0;
  double error = 0;
};
struct UpdateReport {
  std::string name;
  double nonzero = 0; // updates that are not zero
  UpdateRounding f16, bf16;
};

// The masters of `params` as host values, to compare against after an optimizer step.
std::vector<std::vector<float>>
snapshot_masters(const std::vector<std::pair<std::string, Parameter*>>& params);
// The report of the step that took the masters from `before` (snapshot_masters) to now.
std::vector<UpdateReport>
weight_update_report(const std::vector<std::pair<std::string, Parameter*>>& params,
                     const std::vector<std::vector<float>>& before);
std::string format_update_reports(const std::string& title,
                                  const std::vector<UpdateReport>& reports);

} // namespace minamp::amp
