// Command-line helpers of every minamp program: errors in one line, like its other errors
// ("error: " and CLI11's message, then a pointer to --help), and checks of numeric options that
// say what was expected ("--epochs: expected an integer from 1 to 1000000000, got 1e3").
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>

namespace minamp::examples {

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

// Check of an integer option in [min, max]. (CLI::Range says "not in range" for 1e3 or 1.5
// too.)
inline CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](const std::string& text) {
        int64_t value = 0;
        return parses_as_integer(text, value) && value >= min && value <= max
                   ? std::string()
                   : "expected an integer from " + std::to_string(min) + " to " +
                         std::to_string(max) + ", got " + text;
      },
      "");
}

// Check of a uint64 option (a seed): CLI11 alone wraps "-5" to 2^64 - 5 and clamps values past
// 2^64 - 1, so two different seeds would give one run.
inline CLI::Validator any_uint64() {
  return CLI::Validator(
      [](const std::string& text) {
        uint64_t value = 0;
        return parses_as_integer(text, value)
                   ? std::string()
                   : "expected an integer from 0 to 18446744073709551615, got " + text;
      },
      "");
}

// Check of a real-valued option: a finite number, in full, that `accept` takes; otherwise
// "expected <expected>, got <text>".
inline CLI::Validator finite_number(std::function<bool(double)> accept,
                                    const std::string& expected) {
  return CLI::Validator(
      [accept, expected](const std::string& text) {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        const bool number = !text.empty() && end == text.c_str() + text.size();
        return number && std::isfinite(value) && accept(value)
                   ? std::string()
                   : "expected " + expected + ", got " + text;
      },
      "");
}

// Check of a path option: "" is refused instead of silently meaning "not given".
inline const CLI::Validator kNonEmptyPath(
    [](const std::string& text) {
      return text.empty() ? std::string("expected a path, got ''") : std::string();
    },
    "");

} // namespace minamp::examples
