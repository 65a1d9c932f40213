// Reading one column of a numeric CSV file, strictly: every row has the header's fields, and every
// field read is, in full, a decimal number.
#include "io/csv.h"

#include <charconv>
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

// Whether `line` holds nothing (but a '\r'): a blank line, skipped as pandas skips it.
bool is_blank(const std::string& line) { return line.empty() || line == "\r"; }

// The header's fields, read from `in` (which is left at the first row); throws Error naming the
// file when it has no header. A UTF-8 byte-order mark before the header is dropped.
std::vector<std::string> read_header(const std::string& path, std::istringstream& in) {
  std::string line;
  require(static_cast<bool>(std::getline(in, line)), "read_csv_column", path, ": empty file");
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
  return fields_of(line);
}

std::string joined(const std::vector<std::string>& fields) {
  std::string line;
  for (const std::string& field : fields) line += (line.empty() ? "" : ",") + field;
  return line;
}

} // namespace

size_t decimal_number_prefix(const std::string& text, double& value) {
  const char* begin = text.data() + (text.size() > 1 && text[0] == '+' && text[1] != '-');
  const auto [stop, error] = std::from_chars(begin, text.data() + text.size(), value);
  return error == std::errc() ? size_t(stop - text.data()) : 0;
}

bool parse_decimal_number(const std::string& text, double& value) {
  return !text.empty() && decimal_number_prefix(text, value) == text.size();
}

std::vector<std::string> read_csv_header(const std::string& path) {
  std::istringstream in(read_file(path)); // names the path and the reason when it cannot
  return read_header(path, in);
}

std::vector<double> read_csv_column(const std::string& path, const std::string& column) {
  std::istringstream in(read_file(path));
  const std::vector<std::string> header = read_header(path, in);
  size_t index = header.size();
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] != column) continue;
    require(index == header.size(), "read_csv_column", path, ": column '", column,
            "' appears twice in the header (", joined(header), ")");
    index = i;
  }
  require(index < header.size(), "read_csv_column", path, ": no column '", column,
          "' (header: ", joined(header), ")");
  std::vector<double> values;
  std::string line;
  for (int row = 2; std::getline(in, line); ++row) {
    if (is_blank(line)) continue;
    const std::vector<std::string> fields = fields_of(line);
    require(fields.size() == header.size(), "read_csv_column", path, ":", row, ": ", fields.size(),
            fields.size() == 1 ? " field" : " fields", " where the header has ", header.size());
    double value = 0;
    require(parse_decimal_number(fields[index], value), "read_csv_column", path, ":", row, ": '",
            fields[index], "' is not a number");
    values.push_back(value);
  }
  return values;
}

} // namespace minamp::io
