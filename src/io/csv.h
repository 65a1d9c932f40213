// Numeric CSV files such as the metrics.csv and epochs.csv a run writes: a header row of column
// names, then rows of numbers separated by commas ("nan" and "inf" are numbers; a row may end in
// "\r\n").
#pragma once

#include <string>
#include <vector>

namespace minamp::io {

// The values of `column`, one per row after the header. Throws Error naming the file (and the
// row) when it cannot be read, has no header or no such column (or names it twice), or a row
// has no such field or holds there something that is not, in full, a number.
std::vector<double> read_csv_column(const std::string& path, const std::string& column);

} // namespace minamp::io
