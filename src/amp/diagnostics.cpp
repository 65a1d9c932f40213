// Range diagnostics of f16 and bf16: counts gathered on the gradients' device, histograms and
// weight-update rounding computed on the host.
#include "amp/diagnostics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/half.h"
#include "io/plot.h"
#include "kernels/kernels.h"

namespace minamp::amp {

namespace {

// range_counts of `x * factor` in `format` into a fresh f32 [5] tensor on x's device.
Tensor range_counts(const Tensor& x, float factor, DType format) {
  Tensor counts = Tensor::zeros({5}, DType::f32, x.device());
  kernels::range_counts(x, factor, format, counts);
  return counts;
}

RangeCounts to_counts(const Tensor& counts) {
  const std::vector<float> c = counts.to_vector();
  return RangeCounts{c[0], c[1], c[2], c[3], c[4]};
}

// The three reports' counts of gradient `g` stored x stored_scale.
RangeReport range_report(const std::string& name, const Tensor& g, float stored_scale,
                         float target_scale) {
  return {name, to_counts(range_counts(g, 1.0f / stored_scale, DType::f16)),
          to_counts(range_counts(g, target_scale / stored_scale, DType::f16)),
          to_counts(range_counts(g, 1.0f / stored_scale, DType::bf16)), Log2Histogram{}};
}

} // namespace

void Log2Histogram::add(const Tensor& x, double divisor) {
  for (float v : x.to_vector()) {
    if (!std::isfinite(v)) {
      ++nonfinite;
      continue;
    }
    if (v == 0.0f) {
      ++zeros;
      continue;
    }
    int exponent = 0; // |v| / divisor = m 2^exponent, m in [0.5, 1)
    std::frexp(double(v) / divisor, &exponent);
    counts[size_t(std::clamp(exponent - 1, kMinExponent, kMaxExponent) - kMinExponent)] += 1;
  }
}

double Log2Histogram::nonzero() const {
  double total = 0;
  for (double c : counts) total += c;
  return total;
}

ActivationGradientProbe::ActivationGradientProbe(float stored_scale, float target_scale)
    : stored_scale_(stored_scale), target_scale_(target_scale) {
  set_grad_observer([this](const Node& node) {
    // Layer outputs only: the gradients that autocast stores in 16 bits. Losses, the loss
    // scaling and casts carry fp32 gradients under autocast.
    const std::string op = node.op;
    if (op == "mse_loss" || op == "cross_entropy" || op == "mul_scalar" || op == "cast") return;
    RangeReport report = range_report(node.op, node.grad, stored_scale_, target_scale_);
    report.histogram.add(node.grad, stored_scale_);
    entries_.push_back(std::move(report));
  });
}

ActivationGradientProbe::~ActivationGradientProbe() { set_grad_observer(nullptr); }

std::vector<RangeReport> ActivationGradientProbe::reports() const {
  std::vector<RangeReport> out;
  std::map<std::string, int> seen;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    out.push_back(*it);
    out.back().name = it->name + "#" + std::to_string(seen[it->name]++);
  }
  return out;
}

std::vector<RangeReport>
weight_gradient_report(const std::vector<std::pair<std::string, Parameter*>>& params,
                       float stored_scale, float target_scale) {
  std::vector<RangeReport> out;
  for (const auto& [name, p] : params)
    if (p->requires_grad()) // frozen: no gradient
      out.push_back(range_report(name, p->grad(), stored_scale, target_scale));
  return out;
}

std::string
first_nonfinite_parameter(const std::vector<std::pair<std::string, Parameter*>>& params) {
  for (auto it = params.rbegin(); it != params.rend(); ++it)
    if (it->second->requires_grad() &&
        to_counts(range_counts(it->second->grad(), 1.0f, DType::f16)).nonfinite > 0)
      return it->first;
  return "";
}

namespace {
double percent(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }
} // namespace

std::string format_range_reports(const std::string& title, const std::vector<RangeReport>& reports,
                                 float target_scale) {
  std::string out = title + "\n";
  char line[320];
  std::snprintf(line, sizeof line, "  %-22s %10s | %-26s | f16 at S = %-15g | %s\n", "", "",
                "f16 at scale 1", target_scale, "bf16 at scale 1");
  out += line;
  std::snprintf(line, sizeof line, "  %-22s %10s | %8s %8s %8s | %8s %8s %8s | %8s %8s %8s\n",
                "name", "nonzero", "flush%", "subn%", "ovf%", "flush%", "subn%", "ovf%", "flush%",
                "subn%", "ovf%");
  out += line;
  for (const RangeReport& r : reports) {
    const double n = r.f16_at_one.nonzero;
    const auto columns = [&](const RangeCounts& c) {
      char text[32];
      std::snprintf(text, sizeof text, "%8.3f %8.3f %8.3f", percent(c.flushed, n),
                    percent(c.subnormal, n), percent(c.overflow, n));
      return std::string(text);
    };
    std::snprintf(line, sizeof line, "  %-22s %10.0f | %s | %s | %s%s\n", r.name.c_str(), n,
                  columns(r.f16_at_one).c_str(), columns(r.f16_at_scale).c_str(),
                  columns(r.bf16_at_one).c_str(), r.f16_at_one.nonfinite > 0 ? "  NON-FINITE" : "");
    out += line;
  }
  return out;
}

namespace {

// A histogram as a plot series: the percentage of the nonzero values in each binary exponent's
// bin, at x = the bin's middle + shift (empty bins left out).
io::PlotSeries histogram_series(const std::string& name, const Log2Histogram& h, double shift) {
  io::PlotSeries series{name, {}, {}};
  const double total = h.nonzero();
  for (size_t i = 0; i < h.counts.size(); ++i) {
    if (h.counts[i] == 0) continue;
    series.x.push_back(double(int(i) + Log2Histogram::kMinExponent) + 0.5 + shift);
    series.y.push_back(100.0 * h.counts[i] / total);
  }
  return series;
}

// Vertical lines at each x of `at`, from y = lo to y = hi (a NaN point between them breaks the
// line).
io::PlotSeries vertical_lines(const std::string& name, const std::vector<double>& at, double lo,
                              double hi) {
  io::PlotSeries series{name, {}, {}};
  for (double x : at) {
    if (!series.x.empty()) series.x.push_back(x), series.y.push_back(std::nan(""));
    series.x.insert(series.x.end(), {x, x});
    series.y.insert(series.y.end(), {lo, hi});
  }
  return series;
}

} // namespace

void save_gradient_histogram(const std::string& path, const std::vector<RangeReport>& reports,
                             float target_scale, const std::string& title) {
  Log2Histogram all;
  const RangeReport* worst = nullptr;
  for (const RangeReport& r : reports) {
    for (size_t i = 0; i < all.counts.size(); ++i) all.counts[i] += r.histogram.counts[i];
    const auto flushed = [](const RangeReport& x) {
      return percent(x.f16_at_one.flushed, x.f16_at_one.nonzero);
    };
    if (!worst || flushed(r) > flushed(*worst)) worst = &r;
  }
  std::vector<io::PlotSeries> series = {histogram_series("all layers, scale 1", all, 0.0)};
  char shifted[96];
  std::snprintf(shifted, sizeof shifted, "all layers x S = %g (loss scale)", target_scale);
  series.push_back(histogram_series(shifted, all, std::log2(double(target_scale))));
  if (worst)
    series.push_back(
        histogram_series(worst->name + ", scale 1 (f16 flushes most)", worst->histogram, 0.0));
  double lo = 100.0;
  for (const io::PlotSeries& s : series)
    for (double y : s.y) lo = std::min(lo, y);
  lo /= 2;
  // The bounds reach three decades above the data, so that the legend, drawn at the top, hides
  // none of the histograms.
  const double hi = 1e5;
  series.push_back(vertical_lines("f16: largest 65504 (2^16), smallest normal 2^-14, smallest "
                                  "subnormal 2^-24",
                                  {16.0, -14.0, -24.0}, lo, hi));
  series.push_back(
      vertical_lines("bf16: smallest subnormal 2^-133, largest ~2^128", {-133.0, 128.0}, lo, hi));
  io::save_line_plot(
      path, series, {title, "log2 |gradient|", "% of nonzero values (log scale)", true, 1200, 640});
}

std::vector<std::vector<float>>
snapshot_masters(const std::vector<std::pair<std::string, Parameter*>>& params) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : params) out.push_back(p->master().to_vector());
  return out;
}

namespace {

// The rounding of updates `before -> after` by weights kept in a format (`round`).
UpdateRounding update_rounding(const std::vector<float>& before, const std::vector<float>& after,
                               float (*round)(float)) {
  UpdateRounding out;
  double error = 0, norm = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const double update = double(after[i]) - double(before[i]);
    if (update == 0.0) continue;
    const float stored = round(before[i]);
    const float updated = round(float(double(stored) + update));
    out.lost += updated == stored;
    error += (double(updated) - stored - update) * (double(updated) - stored - update);
    norm += update * update;
  }
  out.error = norm > 0 ? std::sqrt(error / norm) : 0.0;
  return out;
}

} // namespace

std::vector<UpdateReport>
weight_update_report(const std::vector<std::pair<std::string, Parameter*>>& params,
                     const std::vector<std::vector<float>>& before) {
  std::vector<UpdateReport> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> after = params[i].second->master().to_vector();
    UpdateReport r{params[i].first, 0, {}, {}};
    for (size_t j = 0; j < after.size(); ++j) r.nonzero += after[j] != before[i][j];
    r.f16 = update_rounding(before[i], after, round_to_half);
    r.bf16 = update_rounding(before[i], after, round_to_bfloat16);
    out.push_back(r);
  }
  return out;
}

std::string format_update_reports(const std::string& title,
                                  const std::vector<UpdateReport>& reports) {
  std::string out = title + "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-22s %10s | %-19s | %-19s\n", "", "", "weights in f16",
                "weights in bf16");
  out += line;
  std::snprintf(line, sizeof line, "  %-22s %10s | %9s %9s | %9s %9s\n", "name", "updates", "lost%",
                "error%", "lost%", "error%");
  out += line;
  for (const UpdateReport& r : reports) {
    std::snprintf(line, sizeof line, "  %-22s %10.0f | %9.3f %9.3f | %9.3f %9.3f\n", r.name.c_str(),
                  r.nonzero, percent(r.f16.lost, r.nonzero), 100.0 * r.f16.error,
                  percent(r.bf16.lost, r.nonzero), 100.0 * r.bf16.error);
    out += line;
  }
  return out;
}

} // namespace minamp::amp
