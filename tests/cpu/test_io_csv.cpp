// Tests for io/csv: reading one column of a numeric CSV file (what plot_metrics draws from a run's
// metrics.csv), strictly; specific malformations named by file, row and field; random
// truncations and bit flips that load or throw Error naming the file.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "io/csv.h"
#include "test_io_util.h"
#include "test_util.h"

namespace minamp {
namespace {

using test::expect_error;

TEST(Csv, ReadsAColumnOfNumbers) {
  test::TempDir dir;
  const std::string path = dir.path("metrics.csv");
  test::write_bytes(path, "step,loss,wall_s,scale,skipped\n0,0.5,0.01,65536,0\n"
                          "1,nan,0.02,32768,1\r\n2,inf,0.03,1e+30,0\n");
  EXPECT_EQ(io::read_csv_column(path, "step"), (std::vector<double>{0, 1, 2}));
  EXPECT_EQ(io::read_csv_column(path, "skipped"), (std::vector<double>{0, 1, 0})); // "\r\n" too
  const std::vector<double> loss = io::read_csv_column(path, "loss");
  ASSERT_EQ(loss.size(), 3u);
  EXPECT_EQ(loss[0], 0.5);
  EXPECT_TRUE(std::isnan(loss[1])); // a diverged or skipped step's loss
  EXPECT_EQ(loss[2], INFINITY);
  test::write_bytes(path, "loss\n");
  EXPECT_TRUE(io::read_csv_column(path, "loss").empty());
  // As pandas reads them: a UTF-8 byte-order mark before the header, blank lines skipped.
  test::write_bytes(path, "\xEF\xBB\xBFstep,loss\n0,1\n\n1,+2\r\n\r\n");
  EXPECT_EQ(io::read_csv_header(path), (std::vector<std::string>{"step", "loss"}));
  EXPECT_EQ(io::read_csv_column(path, "step"), (std::vector<double>{0, 1}));
  EXPECT_EQ(io::read_csv_column(path, "loss"), (std::vector<double>{1, 2}));
}

TEST(Csv, MalformedFilesNameTheFileRowAndField) {
  test::TempDir dir;
  const std::string path = dir.path("bad.csv");
  const std::pair<std::string, std::string> cases[] = {
      {"", ": empty file"},
      {"step,loss\n0,1.5abc\n", ":2: '1.5abc' is not a number"}, // not a prefix of it
      {"step,loss\n0,\n", ":2: '' is not a number"},
      {"step,loss\n0,1\n1\n", ":3: 1 field where the header has 2"},
      {"step,loss\n0,1,2\n", ":2: 3 fields where the header has 2"},
      {"step,loss\n0,0x10\n", ":2: '0x10' is not a number"}, // no hexadecimal
      {"step,loss\n0, 1\n", ":2: ' 1' is not a number"},     // nor spaces
      {"step,loss\n0,1e999\n", ":2: '1e999' is not a number"},
      {"step,loss,loss\n0,1,2\n", "column 'loss' appears twice in the header"},
      {"step,los\n0,1\n", "no column 'loss' (header: step,los)"},
      {std::string("step,loss\n0,1\0\n", 15), ":2: '1"},
  };
  for (const auto& [bytes, message] : cases) {
    test::write_bytes(path, bytes);
    expect_error([&] { io::read_csv_column(path, "loss"); }, "read_csv_column: " + path, message);
  }
  expect_error([&] { io::read_csv_column(dir.path("missing.csv"), "loss"); },
               dir.path("missing.csv"), "cannot open");
}

TEST(Csv, RandomTruncationsAndBitFlipsLoadOrThrowError) {
  test::TempDir dir;
  Rng rng(12);
  std::string valid = "step,loss,wall_s,scale,skipped\n";
  for (int i = 0; i < 20; ++i)
    valid += std::to_string(i) + "," + std::to_string(1.0 / (i + 1)) + ",0.5,65536,0\n";
  auto load = [](const std::string& path) { io::read_csv_column(path, "loss"); };
  const test::FuzzCounts cut = test::fuzz_truncations(valid, dir.path("cut.csv"), load, rng, 150);
  EXPECT_GT(cut.loaded, 0); // cut at a line end
  EXPECT_GT(cut.rejected, 0);
  const test::FuzzCounts flips =
      test::fuzz_bit_flips(valid, dir.path("flip.csv"), load, rng, 250, 40);
  EXPECT_GT(flips.loaded, 0); // a flipped digit is still a number
  EXPECT_GT(flips.rejected, 0);
}

} // namespace
} // namespace minamp
