// fp16 range diagnostics: counts gathered on the gradients' device, read once at the end.
#include "amp/diagnostics.h"

#include <cstdio>
#include <map>

#include "kernels/kernels.h"

namespace minamp::amp {

namespace {

// fp16_range_counts of `x * factor` into a fresh f32 [5] tensor on x's device.
Tensor range_counts(const Tensor& x, float factor) {
  Tensor counts = Tensor::zeros({5}, DType::f32, x.device());
  kernels::fp16_range_counts(x, factor, counts);
  return counts;
}

RangeCounts to_counts(const Tensor& counts) {
  const std::vector<float> c = counts.to_vector();
  return RangeCounts{c[0], c[1], c[2], c[3], c[4]};
}

} // namespace

ActivationGradientProbe::ActivationGradientProbe(float stored_scale, float target_scale)
    : stored_scale_(stored_scale), target_scale_(target_scale) {
  set_grad_observer([this](const Node& node) {
    // Layer outputs only: the gradients that autocast stores in f16. Losses, the loss scaling
    // and casts carry fp32 gradients under autocast.
    const std::string op = node.op;
    if (op == "mse_loss" || op == "cross_entropy" || op == "mul_scalar" || op == "cast") return;
    entries_.push_back({node.op, range_counts(node.grad, 1.0f / stored_scale_),
                        range_counts(node.grad, target_scale_ / stored_scale_)});
  });
}

ActivationGradientProbe::~ActivationGradientProbe() { set_grad_observer(nullptr); }

std::vector<RangeReport> ActivationGradientProbe::reports() const {
  std::vector<RangeReport> out;
  std::map<std::string, int> seen;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    const std::string name = it->op + "#" + std::to_string(seen[it->op]++);
    out.push_back({name, to_counts(it->at_one), to_counts(it->at_scale)});
  }
  return out;
}

std::vector<RangeReport>
weight_gradient_report(const std::vector<std::pair<std::string, Parameter*>>& params,
                       float stored_scale, float target_scale) {
  std::vector<RangeReport> out;
  for (const auto& [name, p] : params) {
    if (!p->requires_grad()) continue; // frozen: no gradient
    out.push_back({name, to_counts(range_counts(p->grad(), 1.0f / stored_scale)),
                   to_counts(range_counts(p->grad(), target_scale / stored_scale))});
  }
  return out;
}

std::string
first_nonfinite_parameter(const std::vector<std::pair<std::string, Parameter*>>& params) {
  for (auto it = params.rbegin(); it != params.rend(); ++it)
    if (it->second->requires_grad() &&
        to_counts(range_counts(it->second->grad(), 1.0f)).nonfinite > 0)
      return it->first;
  return "";
}

std::string format_range_reports(const std::string& title, const std::vector<RangeReport>& reports,
                                 float target_scale) {
  auto percent = [](double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; };
  std::string out = title + "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-22s %10s | %-26s | at S = %g\n", "", "", "at scale 1",
                target_scale);
  out += line;
  std::snprintf(line, sizeof line, "  %-22s %10s | %8s %8s %8s | %8s %8s %8s\n", "name", "nonzero",
                "flush%", "subn%", "ovf%", "flush%", "subn%", "ovf%");
  out += line;
  for (const RangeReport& r : reports) {
    const double n = r.at_scale_one.nonzero;
    std::snprintf(line, sizeof line, "  %-22s %10.0f | %8.3f %8.3f %8.3f | %8.3f %8.3f %8.3f%s\n",
                  r.name.c_str(), n, percent(r.at_scale_one.flushed, n),
                  percent(r.at_scale_one.subnormal, n), percent(r.at_scale_one.overflow, n),
                  percent(r.at_scale.flushed, n), percent(r.at_scale.subnormal, n),
                  percent(r.at_scale.overflow, n),
                  r.at_scale_one.nonfinite > 0 ? "  NON-FINITE" : "");
    out += line;
  }
  return out;
}

} // namespace minamp::amp
