// plot_metrics: draws one column of several runs' metrics.csv files into one PNG line plot, e.g.
// the loss of an FP32 and an AMP run, or the loss-scale trajectory (use --log-y).
//   plot_metrics --column loss --out loss.png out/sine/fp32/metrics.csv:FP32
//   out/sine/amp/metrics.csv:AMP
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <utility>

#include "cli.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/plot.h"

using namespace minamp;

namespace {

// The values of `column` in the CSV file at `path` (header row first), as a plot series.
io::PlotSeries read_column(const std::string& path, const std::string& column,
                           const std::string& name) {
  std::istringstream in(io::read_file(path)); // names the path and the reason when it cannot
  std::string line, cell;
  require(static_cast<bool>(std::getline(in, line)), "plot_metrics", path, " is empty");
  std::stringstream header(line);
  int index = -1;
  for (int i = 0; std::getline(header, cell, ','); ++i)
    if (cell == column) index = i;
  require(index >= 0, "plot_metrics", path, " has no column '", column, "' (header: ", line, ")");
  io::PlotSeries series{name, {}, {}};
  for (int row = 2; std::getline(in, line); ++row) {
    std::stringstream fields(line);
    for (int i = 0; i <= index; ++i)
      require(static_cast<bool>(std::getline(fields, cell, ',')), "plot_metrics", path, ":", row,
              " has no field ", index + 1);
    try {
      series.y.push_back(std::stod(cell));
    } catch (const std::logic_error&) {
      throw Error(cat("plot_metrics: ", path, ":", row, ": '", cell, "' is not a number"));
    }
  }
  return series;
}

// An input's file and label: FILE alone (labelled FILE), or FILE:LABEL where FILE is the
// shortest prefix before a ':' that is a file, so that both may hold ':' (e.g. runs/12:30/...).
// When no prefix is a file, the text before the last ':' is taken as the (missing) file.
std::pair<std::string, std::string> file_and_label(const std::string& input) {
  if (std::filesystem::is_regular_file(input)) return {input, input};
  for (size_t colon = input.find(':'); colon != std::string::npos;
       colon = input.find(':', colon + 1))
    if (std::filesystem::is_regular_file(input.substr(0, colon)))
      return {input.substr(0, colon), input.substr(colon + 1)};
  const size_t last = input.rfind(':');
  if (last == std::string::npos) return {input, input};
  return {input.substr(0, last), input.substr(last + 1)};
}

// True when the plot would show some point of `series`: a finite value (positive for --log-y).
bool has_drawable_point(const std::vector<io::PlotSeries>& series, bool log_y) {
  for (const io::PlotSeries& s : series)
    for (double y : s.y)
      if (std::isfinite(y) && (!log_y || y > 0)) return true;
  return false;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"plot_metrics: one column of several metrics.csv files as a PNG line plot"};
  std::string column = "loss", out = "plot.png", title, y_label;
  bool log_y = false;
  std::vector<std::string> inputs;
  app.add_option("--column", column, "the CSV column to plot")->capture_default_str();
  app.add_option("--out", out, "the PNG to write")
      ->check(examples::kNonEmptyPath)
      ->capture_default_str();
  app.add_option("--title", title, "plot title (default: the column)");
  app.add_option("--y-label", y_label, "y axis label (default: the column)");
  app.add_flag("--log-y", log_y, "logarithmic y axis (e.g. for the loss scale)");
  app.add_option("inputs", inputs, "metrics.csv files, each optionally FILE:LABEL")->required();
  examples::use_one_line_errors(app);
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<io::PlotSeries> series;
    for (const std::string& input : inputs) {
      const auto [path, label] = file_and_label(input);
      series.push_back(read_column(path, column, label));
    }
    require(has_drawable_point(series, log_y), "plot_metrics", "nothing to draw: column '", column,
            "' has no ", log_y ? "positive finite value (--log-y)" : "finite value",
            " in any input");
    io::PlotOptions options;
    options.title = title.empty() ? column : title;
    options.x_label = "step";
    options.y_label = y_label.empty() ? column : y_label;
    options.log_y = log_y;
    io::save_line_plot(out, series, options);
    std::printf("wrote %s\n", out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
