// A tiny line-plot writer with no plotting library: white canvas, framed axes with tick labels
// and grid, several named series in distinct colours with a legend, an optional log-scale y axis
// (for the loss-scale trajectory), a title and axis labels, written as a PNG file.
#pragma once

#include <string>
#include <vector>

namespace minamp::io {

// One line. With `x` empty the points sit at x = 0, 1, 2, ...; otherwise x and y pair up.
// Points that are not is_plottable break the line there.
struct PlotSeries {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;
};

struct PlotOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_y = false;
  int width = 960;
  int height = 600;
};

// Whether save_line_plot draws a value on an axis: on a log axis any finite positive value (its
// span in decades stays finite), on a linear one any of magnitude below 1e300 (so that the span
// between two does not overflow).
bool is_plottable(double v, bool log);

// Draws `series` and writes the PNG to `path` atomically. Throws Error naming the file for a
// series whose x and y lengths differ, or a canvas too small to hold the axes.
void save_line_plot(const std::string& path, const std::vector<PlotSeries>& series,
                    const PlotOptions& options = {});

// The tick labels save_line_plot writes along an axis holding data from `lo` to `hi`: steps of
// 1, 2 or 5 times a power of ten on a linear axis; powers of ten on a log axis, with 2x and 5x
// between them when it spans two decades or fewer.
std::vector<std::string> axis_tick_labels(double lo, double hi, bool log);

} // namespace minamp::io
