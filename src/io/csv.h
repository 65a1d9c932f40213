// Numeric CSV files such as the metrics.csv and epochs.csv a run writes: a header row of column
// names, then rows of as many numbers separated by commas ("nan" and "inf" are numbers; a row may
// end in "\r\n"; blank lines and a UTF-8 byte-order mark are skipped).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace minamp::io {

// The length of the decimal number `text` starts with, read into `value` (0 when it starts with
// none): an optional sign, digits with an optional point and exponent, or "inf" / "nan"; no
// hexadecimal, no spaces (std::from_chars's syntax, and a leading '+'); out of double's range is
// no number. CSV fields and the programs' real-valued options are read with it.
size_t decimal_number_prefix(const std::string& text, double& value);
// Whether `text` is, in full, such a number (read into `value`).
bool parse_decimal_number(const std::string& text, double& value);

// The column names of the file's header. Throws Error naming the file when it cannot be read or
// is empty.
std::vector<std::string> read_csv_header(const std::string& path);

// The values of `column`, one per row after the header. Throws Error naming the file (and the
// row) when it cannot be read, has no header or no such column (or names it twice), or a row
// has not the header's number of fields or holds in the column something that is not, in full, a
// decimal number.
std::vector<double> read_csv_column(const std::string& path, const std::string& column);

} // namespace minamp::io
