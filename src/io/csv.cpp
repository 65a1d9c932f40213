// Reading one column of a numeric CSV file, strictly: every field read must be a whole number.
#include "io/csv.h"

#include <cstdlib>
#include <sstream>

#include "core/error.h"
#include "io/atomic_file.h"

namespace minamp::io {

namespace {

// The fields of one line (without a trailing '\r').
std::vector<std::string> fields_of(std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  std::vector<std::string> fields;
  std::stringstream in(line);
  for (std::string field; std::getline(in, field, ',');) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back(); // "a,b," has 3 fields
  return fields;
}

// `text` as a number when all of it is one (strtod's syntax, so "nan" and "inf" too).
bool parse_number(const std::string& text, double& value) {
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size();
}

} // namespace

std::vector<double> read_csv_column(const std::string& path, const std::string& column) {
  std::istringstream in(read_file(path)); // names the path and the reason when it cannot
  std::string line;
  require(static_cast<bool>(std::getline(in, line)), "read_csv_column", path, ": empty file");
  const std::vector<std::string> header = fields_of(line);
  size_t index = header.size();
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] != column) continue;
    require(index == header.size(), "read_csv_column", path, ": column '", column,
            "' appears twice in the header (", line, ")");
    index = i;
  }
  require(index < header.size(), "read_csv_column", path, ": no column '", column,
          "' (header: ", line, ")");
  std::vector<double> values;
  for (int row = 2; std::getline(in, line); ++row) {
    const std::vector<std::string> fields = fields_of(line);
    require(index < fields.size(), "read_csv_column", path, ":", row, ": no field ", index + 1,
            " ('", column, "')");
    double value = 0;
    require(parse_number(fields[index], value), "read_csv_column", path, ":", row, ": '",
            fields[index], "' is not a number");
    values.push_back(value);
  }
  return values;
}

} // namespace minamp::io
