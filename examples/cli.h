// Command-line helpers of every minamp program: errors in one line, like its other errors
// ("error: " and CLI11's message, then a pointer to --help), and checks of numeric options that
// say what was expected ("--epochs: expected an integer from 1 to 1000000000, got 1e3").
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/csv.h"
#include "kernels/gemm_version.h"
#include "nn/module.h"
#include "nn/resnet.h"

namespace minamp::examples {

// Reads the environment's settings (MINAMP_GEMM_VERSION, MINAMP_GEMM_PERSISTENT, MINAMP_FUSION)
// now, so that a program refuses an unknown value as it starts, before it writes anything.
inline void require_valid_environment() {
  gemm_version();
  gemm_persistent_tiles();
  nn::fusion_enabled();
}

// Refuses a ResNet training batch its batch norms cannot train on: `batch` images of side `side`
// give layer4's batch norms batch x ResNet::output_side(side)^2 values per channel, and one is too
// few. The error names the options that set the two.
inline void require_resnet_batch_trains(int64_t batch, int64_t side, const char* batch_option,
                                        const char* side_option) {
  const int64_t last = nn::ResNet::output_side(side);
  require(batch * last * last > 1, batch_option, batch, " at ", side_option, " ", side,
          " gives layer4's batch norms one value per channel (its output is 1x1), too few to "
          "train them: use 2 or more, or a ",
          side_option, " above 32");
}

inline void use_one_line_errors(CLI::App& app) {
  app.failure_message([](const CLI::App*, const CLI::Error& error) {
    return std::string("error: ") + error.what() + " (see --help)\n";
  });
}

// Whether `text` is, in full, a decimal integer that fits T (no sign for an unsigned T).
template <class T> bool parses_as_integer(const std::string& text, T& value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  return !text.empty() && error == std::errc() && stop == end;
}

// Check of a decimal integer option in [min, max] of type T. (CLI::Range says "not in range"
// for 1e3 or 1.5 too, and CLI11 alone reads "010" as octal 8, wraps "-5" to 2^64 - 5 in an
// unsigned option and clamps values past 2^64 - 1.) The value is handed on as written in
// canonical decimal, so CLI11 stores the number this check read: give it to Option::transform
// (Option::check would hand it a copy).
template <class T> CLI::Validator integer_in(T min, T max) {
  const std::string range = std::to_string(min) + " to " + std::to_string(max);
  const std::string help = "INT in [" + std::to_string(min) + " - " + std::to_string(max) + "]";
  return CLI::Validator(
      [min, max, range](std::string& text) {
        T value = 0;
        if (!parses_as_integer(text, value) || value < min || value > max)
          return "expected an integer from " + range + ", got " + text;
        text = std::to_string(value);
        return std::string();
      },
      help);
}
inline CLI::Validator integer_in(int64_t min, int64_t max) { return integer_in<int64_t>(min, max); }

// Check of a seed: any uint64.
inline CLI::Validator any_uint64() {
  return integer_in<uint64_t>(0, std::numeric_limits<uint64_t>::max());
}

// Check of a real-valued option: a finite number, in full, that `accept` takes; otherwise
// "expected <expected>, got <text>".
inline CLI::Validator finite_number(std::function<bool(double)> accept,
                                    const std::string& expected) {
  return CLI::Validator(
      [accept, expected](const std::string& text) {
        double value = 0;
        return io::parse_decimal_number(text, value) && std::isfinite(value) && accept(value)
                   ? std::string()
                   : "expected " + expected + ", got " + text;
      },
      "");
}

// Check of a byte count: a whole number of bytes, or a number with a unit, 1000-based (KB, MB, GB,
// TB) or 1024-based (KiB, MiB, GiB, TiB), e.g. 6GiB or 1.5GB; at least 1 byte and at most 2^62.
// Handed on as the number of bytes in decimal (give it to Option::transform).
inline CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& text) {
        static const std::pair<const char*, double> kUnits[] = {
            {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
            {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
            {"B", 1.0},      {"", 1.0}};
        const std::string expected =
            "expected a size in bytes such as 6GiB, 512MiB or 1000000, got " + text;
        double number = 0;
        const size_t used = io::decimal_number_prefix(text, number);
        if (used == 0 || !std::isfinite(number)) return expected;
        const std::string unit = text.substr(used);
        for (const auto& [name, factor] : kUnits) {
          if (unit != name) continue;
          const double bytes = std::floor(number * factor);
          if (!(bytes >= 1.0 && bytes <= 4611686018427387904.0)) return expected;
          text = std::to_string(static_cast<int64_t>(bytes));
          return std::string();
        }
        return expected;
      },
      "SIZE");
}

// The comma-separated items of an option, each checked against the accepted values and given
// once (empty items, as in a trailing comma, are skipped); throws Error naming the option.
inline std::vector<std::string> parse_list(const std::string& text, const char* option,
                                           const std::vector<std::string>& accepted) {
  std::vector<std::string> items;
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    require(std::find(accepted.begin(), accepted.end(), item) != accepted.end(), option,
            "unknown value '", item, "'");
    require(std::find(items.begin(), items.end(), item) == items.end(), option, "'", item,
            "' is given twice");
    items.push_back(item);
  }
  require(!items.empty(), option, "expected at least one value, got '", text, "'");
  return items;
}

// Check of a path option: "" is refused instead of silently meaning "not given".
inline const CLI::Validator kNonEmptyPath(
    [](const std::string& text) {
      return text.empty() ? std::string("expected a path, got ''") : std::string();
    },
    "");

} // namespace minamp::examples
