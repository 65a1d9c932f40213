// Command-line errors of every minamp program in one line, like its other errors: "error: " and
// CLI11's message (the option and what was expected), then a pointer to --help.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace minamp::examples {

inline void use_one_line_errors(CLI::App& app) {
  app.failure_message([](const CLI::App*, const CLI::Error& error) {
    return std::string("error: ") + error.what() + " (see --help)\n";
  });
}

} // namespace minamp::examples
