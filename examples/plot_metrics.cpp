// plot_metrics: draws one column of several runs' metrics.csv files into one PNG line plot, e.g.
// the loss of an FP32 and an AMP run, or the loss-scale trajectory (use --log-y), against the
// files' step column (epoch in epochs.csv; the row number in files with neither).
//   plot_metrics --column loss --out loss.png out/sine/fp32/metrics.csv:FP32
//   out/sine/amp/metrics.csv:AMP
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <utility>

#include "cli.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/csv.h"
#include "io/plot.h"

using namespace minamp;

namespace {

// An input's file and label: FILE alone (labelled FILE), or FILE:LABEL, where FILE is the one
// prefix before a ':' (or all of it) that is a file, so that both may hold ':' (e.g.
// runs/12:30/...). Two such files make the input ambiguous (an Error); when none is, the text
// before the last ':' is taken as the (missing) file.
std::pair<std::string, std::string> file_and_label(const std::string& input) {
  std::error_code ignored; // a path that cannot be examined is no file (reading it says why)
  std::vector<std::pair<std::string, std::string>> readings;
  for (size_t colon = input.find(':'); colon != std::string::npos;
       colon = input.find(':', colon + 1))
    if (std::filesystem::is_regular_file(input.substr(0, colon), ignored))
      readings.push_back({input.substr(0, colon), input.substr(colon + 1)});
  if (std::filesystem::is_regular_file(input, ignored)) readings.push_back({input, input});
  if (readings.size() > 1)
    throw Error(cat("plot_metrics: '", input, "' could be the file ", readings[0].first, " or ",
                    readings[1].first, " (with a label or without): rename one"));
  if (!readings.empty()) return readings[0];
  const size_t last = input.rfind(':');
  if (last == std::string::npos) return {input, input};
  return {input.substr(0, last), input.substr(last + 1)};
}

// The column of x values: "step" when every input has one, else "epoch" when every input has
// one, else "" (the row number).
std::string x_column(const std::vector<std::string>& paths) {
  std::vector<std::vector<std::string>> headers;
  for (const std::string& path : paths) headers.push_back(io::read_csv_header(path));
  for (const char* name : {"step", "epoch"})
    if (std::all_of(headers.begin(), headers.end(), [&](const std::vector<std::string>& header) {
          return std::find(header.begin(), header.end(), name) != header.end();
        }))
      return name;
  return "";
}

// True when the plot would show some point of `series`.
bool has_drawable_point(const std::vector<io::PlotSeries>& series, bool log_y) {
  for (const io::PlotSeries& s : series)
    for (size_t i = 0; i < s.y.size(); ++i)
      if (io::is_plottable(s.y[i], log_y) && (s.x.empty() || io::is_plottable(s.x[i], false)))
        return true;
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
    examples::require_valid_environment();
    io::require_writable(out, "--out");
    std::vector<std::pair<std::string, std::string>> files;
    std::vector<std::string> paths;
    for (const std::string& input : inputs) {
      files.push_back(file_and_label(input));
      const std::string& path = files.back().first;
      std::error_code ignored; // false when either file is missing
      require(!std::filesystem::equivalent(path, out, ignored), "--out", out, " is the input ",
              path, ": the plot would replace it");
      paths.push_back(path);
    }
    const std::string x = x_column(paths);
    std::vector<io::PlotSeries> series;
    for (const auto& [path, label] : files)
      series.push_back({label, x.empty() ? std::vector<double>() : io::read_csv_column(path, x),
                        io::read_csv_column(path, column)});
    require(has_drawable_point(series, log_y), "plot_metrics", "nothing to draw: column '", column,
            "' has no ",
            log_y ? "finite positive value (--log-y)" : "value of magnitude below 1e300",
            " in any input");
    io::PlotOptions options;
    options.title = title.empty() ? column : title;
    options.x_label = x.empty() ? "row" : x;
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
