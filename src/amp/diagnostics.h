// fp16 range diagnostics — the argument of Micikevicius et al. (2018, Figure 3), measured:
// how many activation- and weight-gradient values would flush to zero, land in the subnormal
// range or overflow if stored in fp16, at scale 1 and at a loss scale S; and which parameter's
// gradient turned non-finite first on an overflow.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "autograd/var.h"
#include "nn/parameter.h"

namespace minamp::amp {

struct RangeCounts {
  double flushed = 0;   // nonzero values that become 0 in fp16
  double subnormal = 0; // values in (0, 2^-14): kept with reduced precision
  double overflow = 0;  // values that become inf
  double nonzero = 0;   // all nonzero finite values
  double nonfinite = 0; // values already inf or NaN
};

struct RangeReport {
  std::string name; // "linear#0" for activations (in forward order), parameter names for weights
  RangeCounts at_scale_one;
  RangeCounts at_scale;
};

// While alive, records the range counts of every layer output's gradient during backward()
// (losses, loss scaling and casts are left out: their gradients stay fp32 under autocast).
// Gradients are stored multiplied by `stored_scale` (the loss scale of this backward, 1 in FP32);
// counts are taken for the true gradient (x 1) and for it multiplied by `target_scale`.
class ActivationGradientProbe {
public:
  ActivationGradientProbe(float stored_scale, float target_scale);
  ~ActivationGradientProbe();
  ActivationGradientProbe(const ActivationGradientProbe&) = delete;
  ActivationGradientProbe& operator=(const ActivationGradientProbe&) = delete;
  // The per-op reports of every backward run while the probe is alive (the examples run one),
  // host reads, in forward order.
  std::vector<RangeReport> reports() const;

private:
  struct Entry {
    std::string op;
    Tensor at_one, at_scale; // f32 [5] counts
  };
  float stored_scale_, target_scale_;
  std::vector<Entry> entries_; // in backward order
};

// The same counts for the parameters' gradients (stored x stored_scale); frozen ones have none.
std::vector<RangeReport>
weight_gradient_report(const std::vector<std::pair<std::string, Parameter*>>& params,
                       float stored_scale, float target_scale);

// The name of the parameter whose gradient the backward pass made non-finite first (backward
// visits the last layer first), or "" when every gradient is finite.
std::string
first_nonfinite_parameter(const std::vector<std::pair<std::string, Parameter*>>& params);

// A table of reports: name, nonzero count, % flushed / subnormal / overflow at scale 1 and S.
std::string format_range_reports(const std::string& title, const std::vector<RangeReport>& reports,
                                 float target_scale);

} // namespace minamp::amp
