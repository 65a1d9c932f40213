// Line plots rasterised by hand into an RGB buffer: text from stb_easy_font (which emits each
// glyph as axis-aligned quads; we fill them as rectangles), lines drawn by stepping along them
// one pixel at a time, the result encoded by stb_image_write.
#include "io/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/image.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb_easy_font.h>
#pragma GCC diagnostic pop

namespace minamp::io {

namespace {

struct Color {
  uint8_t r, g, b;
};
constexpr Color kTextColor{20, 20, 20};
constexpr Color kFrameColor{70, 70, 70};
constexpr Color kGridColor{228, 228, 228};
constexpr Color kWhite{255, 255, 255};
// Matplotlib's "tab10" palette: ten colours that stay distinct side by side.
constexpr Color kPalette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                              {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                              {188, 189, 34},  {23, 190, 207}};

constexpr int kTextScale = 2;  // stb_easy_font pixels are drawn 2x2
constexpr int kLineWidth = 2;  // series lines, in pixels
constexpr int kTickLength = 6; // tick marks outside the frame
constexpr int kGap = 8;        // space between a label and what it labels

// Pixel rectangle [left, right) x [top, bottom).
struct Rect {
  int left, top, right, bottom;
  bool contains(int x, int y) const { return x >= left && x < right && y >= top && y < bottom; }
};

class Canvas {
public:
  Canvas(int width, int height)
      : width_(width), height_(height), rgb_(size_t(width) * height * 3, 255) {}

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& rgb() const { return rgb_; }

  void fill(const Rect& r, Color c) {
    for (int y = std::max(r.top, 0); y < std::min(r.bottom, height_); ++y)
      for (int x = std::max(r.left, 0); x < std::min(r.right, width_); ++x) set(x, y, c);
  }

  // Outline of `r`, one pixel wide, on its inside.
  void frame(const Rect& r, Color c) {
    fill({r.left, r.top, r.right, r.top + 1}, c);
    fill({r.left, r.bottom - 1, r.right, r.bottom}, c);
    fill({r.left, r.top, r.left + 1, r.bottom}, c);
    fill({r.right - 1, r.top, r.right, r.bottom}, c);
  }

  // A line `width` pixels thick from (x0, y0) to (x1, y1), drawn only inside `clip`.
  void line(double x0, double y0, double x1, double y1, int width, Color c, const Rect& clip) {
    const int steps = int(std::ceil(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0)))) + 1;
    for (int i = 0; i <= steps; ++i) {
      const double t = double(i) / steps;
      const int x = int(std::lround(x0 + t * (x1 - x0))) - width / 2;
      const int y = int(std::lround(y0 + t * (y1 - y0))) - width / 2;
      for (int dy = 0; dy < width; ++dy)
        for (int dx = 0; dx < width; ++dx)
          if (clip.contains(x + dx, y + dy)) set(x + dx, y + dy, c);
    }
  }

private:
  void set(int x, int y, Color c) {
    uint8_t* p = &rgb_[(size_t(y) * width_ + x) * 3];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }

  int width_, height_;
  std::vector<uint8_t> rgb_;
};

// ---- text ----

int text_width(const std::string& text) {
  std::vector<char> chars(text.begin(), text.end());
  chars.push_back('\0');
  return stb_easy_font_width(chars.data()) * kTextScale;
}

// The height of one line of capitals, the part that the layout aligns.
constexpr int kTextHeight = 7 * kTextScale;

// The glyph quads of `text` as rectangles in font pixels, top-left of the text at (0, 0).
std::vector<Rect> glyph_quads(const std::string& text) {
  std::vector<char> chars(text.begin(), text.end());
  chars.push_back('\0');
  struct Vertex {
    float x, y, z;
    uint8_t color[4];
  };
  std::vector<Vertex> vertices(text.size() * 96 + 16);
  const int quads = stb_easy_font_print(0, 0, chars.data(), nullptr, vertices.data(),
                                        int(vertices.size() * sizeof(Vertex)));
  std::vector<Rect> rects;
  for (int q = 0; q < quads; ++q) {
    const Vertex* v = &vertices[size_t(q) * 4];
    const float left = std::min({v[0].x, v[1].x, v[2].x, v[3].x});
    const float right = std::max({v[0].x, v[1].x, v[2].x, v[3].x});
    const float top = std::min({v[0].y, v[1].y, v[2].y, v[3].y});
    const float bottom = std::max({v[0].y, v[1].y, v[2].y, v[3].y});
    rects.push_back({int(left), int(top), int(right), int(bottom)});
  }
  return rects;
}

// Text with its top-left corner at (x, y).
void draw_text(Canvas& canvas, const std::string& text, int x, int y, Color c) {
  const int s = kTextScale;
  for (const Rect& q : glyph_quads(text))
    canvas.fill({x + q.left * s, y + q.top * s, x + q.right * s, y + q.bottom * s}, c);
}

// Text turned a quarter left (read bottom to top), its baseline side facing right, starting
// at (x, y) and running upwards.
void draw_text_upwards(Canvas& canvas, const std::string& text, int x, int y, Color c) {
  const int s = kTextScale;
  for (const Rect& q : glyph_quads(text))
    canvas.fill({x + q.top * s, y - q.right * s, x + q.bottom * s, y - q.left * s}, c);
}

// ---- axes ----

struct Tick {
  double value; // in axis units (log10 of the data on a log axis)
  std::string label;
};

// Maps data values onto one pixel direction of the plot area.
struct Axis {
  double lo = 0, hi = 1; // axis units
  bool log = false;
  std::vector<Tick> ticks;

  double to_units(double v) const { return log ? std::log10(v) : v; }
  double fraction(double v) const { return (to_units(v) - lo) / (hi - lo); }
};

// The 1, 2 or 5 times a power of ten nearest above range / target.
double nice_step(double range, int target) {
  const double raw = range / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * magnitude >= raw * (1 - 1e-9)) return m * magnitude;
  return 10 * magnitude;
}

std::string format_tick(double value, double step) {
  char text[32];
  if (std::fabs(value) < step * 1e-6) value = 0; // no "-0" or "1e-17" at zero
  const double largest = std::max(std::fabs(value), step);
  if (largest >= 1e6 || step < 1e-4) {
    std::snprintf(text, sizeof text, "%g", value);
  } else {
    const int decimals = std::max(0, int(std::ceil(-std::log10(step) - 1e-9)));
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
  }
  return text;
}

Axis linear_axis(double lo, double hi) {
  if (!(hi - lo > std::fabs(lo) * 1e-9)) { // one value: centre it in a span around it
    const double pad = std::max(1.0, std::fabs(lo) * 0.1);
    lo -= pad, hi += pad;
  }
  const double step = nice_step(hi - lo, 6);
  Axis axis;
  axis.lo = std::floor(lo / step + 1e-9) * step;
  axis.hi = std::ceil(hi / step - 1e-9) * step;
  const double first = std::round(axis.lo / step);
  for (int i = 0; i < 20 && (first + i) * step <= axis.hi + step * 1e-9; ++i)
    axis.ticks.push_back({(first + i) * step, format_tick((first + i) * step, step)});
  return axis;
}

std::string format_power_of_ten(double mantissa, int exponent) {
  char text[32];
  if (exponent >= -3 && exponent <= 4)
    std::snprintf(text, sizeof text, "%g", mantissa * std::pow(10.0, exponent));
  else
    std::snprintf(text, sizeof text, "%ge%d", mantissa, exponent);
  return text;
}

// A log axis over [lo_value, hi_value] (positive data): whole decades, with ticks at powers of
// ten, and also at 2x and 5x when the axis spans two decades or fewer.
Axis log_axis(double lo_value, double hi_value) {
  Axis axis;
  axis.log = true;
  axis.lo = std::floor(std::log10(lo_value));
  axis.hi = std::max(axis.lo + 1, std::ceil(std::log10(hi_value)));
  const int decade_step = std::max(1, int(std::ceil((axis.hi - axis.lo) / 8)));
  const bool minor = axis.hi - axis.lo <= 2;
  for (int e = int(axis.lo); e <= int(axis.hi); e += decade_step)
    for (double m : {1.0, 2.0, 5.0}) {
      const double value = std::log10(m) + e;
      if ((m == 1.0 || minor) && value <= axis.hi + 1e-9)
        axis.ticks.push_back({value, format_power_of_ten(m, e)});
    }
  return axis;
}

// The x values of a series: its own, or 0, 1, 2, ...
std::vector<double> x_values(const PlotSeries& s) {
  if (!s.x.empty()) return s.x;
  std::vector<double> x(s.y.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(i);
  return x;
}

// The axes covering every plottable point; [0, 1] on an axis with none.
std::pair<Axis, Axis> fit_axes(const std::vector<PlotSeries>& series, bool log_y) {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const PlotSeries& s : series) {
    const std::vector<double> x = x_values(s);
    for (size_t i = 0; i < x.size(); ++i) {
      if (!is_plottable(x[i], false) || !is_plottable(s.y[i], log_y)) continue;
      x_lo = std::min(x_lo, x[i]), x_hi = std::max(x_hi, x[i]);
      y_lo = std::min(y_lo, s.y[i]), y_hi = std::max(y_hi, s.y[i]);
    }
  }
  if (x_lo > x_hi) x_lo = 0, x_hi = 1;
  if (y_lo > y_hi) y_lo = log_y ? 1 : 0, y_hi = log_y ? 10 : 1;
  return {linear_axis(x_lo, x_hi), log_y ? log_axis(y_lo, y_hi) : linear_axis(y_lo, y_hi)};
}

// ---- drawing ----

void draw_axes(Canvas& canvas, const Rect& area, const Axis& x_axis, const Axis& y_axis) {
  for (const Tick& t : x_axis.ticks) {
    const int px =
        area.left + int(std::lround(x_axis.fraction(t.value) * (area.right - area.left - 1)));
    canvas.fill({px, area.top, px + 1, area.bottom}, kGridColor);
    canvas.fill({px, area.bottom, px + 1, area.bottom + kTickLength}, kFrameColor);
    draw_text(canvas, t.label, px - text_width(t.label) / 2, area.bottom + kTickLength + kGap / 2,
              kTextColor);
  }
  for (const Tick& t : y_axis.ticks) {
    const double f = (t.value - y_axis.lo) / (y_axis.hi - y_axis.lo);
    const int py = area.bottom - 1 - int(std::lround(f * (area.bottom - area.top - 1)));
    canvas.fill({area.left, py, area.right, py + 1}, kGridColor);
    canvas.fill({area.left - kTickLength, py, area.left, py + 1}, kFrameColor);
    draw_text(canvas, t.label, area.left - kTickLength - kGap / 2 - text_width(t.label),
              py - kTextHeight / 2, kTextColor);
  }
  canvas.frame(area, kFrameColor);
}

void draw_series(Canvas& canvas, const Rect& area, const Axis& x_axis, const Axis& y_axis,
                 const PlotSeries& s, Color color) {
  const std::vector<double> x = x_values(s);
  auto px = [&](size_t i) {
    return area.left + x_axis.fraction(x[i]) * (area.right - area.left - 1);
  };
  auto py = [&](size_t i) {
    return area.bottom - 1 - y_axis.fraction(s.y[i]) * (area.bottom - area.top - 1);
  };
  auto ok = [&](size_t i) {
    return i < x.size() && is_plottable(x[i], false) && is_plottable(s.y[i], y_axis.log);
  };
  for (size_t i = 0; i < x.size(); ++i) {
    if (!ok(i)) continue;
    if (ok(i + 1)) canvas.line(px(i), py(i), px(i + 1), py(i + 1), kLineWidth, color, area);
    const bool isolated = !ok(i + 1) && (i == 0 || !ok(i - 1));
    if (isolated) canvas.line(px(i), py(i), px(i), py(i), 6, color, area); // a square dot
  }
}

void draw_legend(Canvas& canvas, const Rect& area, const std::vector<PlotSeries>& series) {
  constexpr int kSwatch = 28, kRow = kTextHeight + 10, kPad = 10;
  int widest = 0;
  for (const PlotSeries& s : series) widest = std::max(widest, text_width(s.name));
  const int width = kPad + kSwatch + kGap + widest + kPad;
  const int height = kPad + int(series.size()) * kRow - 10 + kPad;
  const Rect box{area.right - kPad - width, area.top + kPad, area.right - kPad,
                 area.top + kPad + height};
  canvas.fill(box, kWhite);
  canvas.frame(box, kFrameColor);
  for (size_t i = 0; i < series.size(); ++i) {
    const int top = box.top + kPad + int(i) * kRow;
    const Color color = kPalette[i % std::size(kPalette)];
    canvas.fill({box.left + kPad, top + kTextHeight / 2 - 1, box.left + kPad + kSwatch,
                 top + kTextHeight / 2 + 2},
                color);
    draw_text(canvas, series[i].name, box.left + kPad + kSwatch + kGap, top, kTextColor);
  }
}

} // namespace

bool is_plottable(double v, bool log) {
  return log ? v > 0 && std::isfinite(v) : std::fabs(v) < 1e300;
}

void save_line_plot(const std::string& path, const std::vector<PlotSeries>& series,
                    const PlotOptions& options) {
  for (const PlotSeries& s : series)
    require(s.x.empty() || s.x.size() == s.y.size(), "save_line_plot", path, ": series '", s.name,
            "' has ", s.x.size(), " x values and ", s.y.size(), " y values");
  const auto [x_axis, y_axis] = fit_axes(series, options.log_y);

  int widest_y_label = 0;
  for (const Tick& t : y_axis.ticks) widest_y_label = std::max(widest_y_label, text_width(t.label));
  const int left = kGap + (options.y_label.empty() ? 0 : kTextHeight + 2 * kGap) + widest_y_label +
                   kGap / 2 + kTickLength;
  const int top = options.title.empty() ? 2 * kGap : kTextHeight + 4 * kGap;
  const int bottom = kTickLength + kGap + kTextHeight +
                     (options.x_label.empty() ? 0 : 2 * kGap + kTextHeight) + 2 * kGap;
  // The last x tick label is centred on the right edge of the plot: leave room for its half.
  const int right = std::max(3 * kGap, text_width(x_axis.ticks.back().label) / 2 + kGap);
  const Rect area{left, top, options.width - right, options.height - bottom};
  require(area.right - area.left >= 50 && area.bottom - area.top >= 50, "save_line_plot", path,
          ": a ", options.width, "x", options.height, " canvas is too small for the axes");

  Canvas canvas(options.width, options.height);
  draw_axes(canvas, area, x_axis, y_axis);
  for (size_t i = 0; i < series.size(); ++i)
    draw_series(canvas, area, x_axis, y_axis, series[i], kPalette[i % std::size(kPalette)]);
  if (!series.empty()) draw_legend(canvas, area, series);

  const int centre = (area.left + area.right) / 2;
  draw_text(canvas, options.title, centre - text_width(options.title) / 2, 2 * kGap, kTextColor);
  draw_text(canvas, options.x_label, centre - text_width(options.x_label) / 2,
            options.height - 2 * kGap - kTextHeight, kTextColor);
  draw_text_upwards(canvas, options.y_label, kGap,
                    (area.top + area.bottom) / 2 + text_width(options.y_label) / 2, kTextColor);
  write_file_atomically(path, encode_png(canvas.rgb().data(), canvas.width(), canvas.height(), 3));
}

std::vector<std::string> axis_tick_labels(double lo, double hi, bool log) {
  std::vector<std::string> labels;
  for (const Tick& t : (log ? log_axis(lo, hi) : linear_axis(lo, hi)).ticks)
    labels.push_back(t.label);
  return labels;
}

} // namespace minamp::io
