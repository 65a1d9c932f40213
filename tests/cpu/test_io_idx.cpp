// Tests for io/idx: reading raw and gzipped IDX images and labels written here, specific
// corruptions, random truncations and bit flips, and (when installed) the real Fashion-MNIST
// test set.
#include <gtest/gtest.h>

#include <zlib.h>

#include <filesystem>

#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/idx.h"
#include "test_io_util.h"
#include "test_util.h"

namespace minamp {
namespace {

// An IDX file of u8 values: magic 0 0 8 rank, big-endian u32 dimensions, then the values.
std::string idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& values) {
  std::string bytes = {0, 0, 8, char(dims.size())};
  for (uint32_t d : dims)
    for (int shift : {24, 16, 8, 0}) bytes.push_back(char((d >> shift) & 0xff));
  return bytes + std::string(values.begin(), values.end());
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

std::vector<uint8_t> random_bytes(Rng& rng, size_t count, uint32_t bound = 256) {
  std::vector<uint8_t> values(count);
  for (uint8_t& v : values) v = uint8_t(rng.below(bound));
  return values;
}

void expect_idx_error(const std::string& path, const std::string& fragment) {
  test::expect_error([&] { io::read_idx(path); }, path, fragment);
}

TEST(Idx, ReadsRawAndGzippedImagesAndLabels) {
  test::TempDir dir;
  Rng rng(1);
  const std::vector<uint8_t> pixels = random_bytes(rng, 3 * 4 * 5);
  const std::vector<uint8_t> labels = random_bytes(rng, 3, 10);
  test::write_bytes(dir.path("images"), idx_bytes({3, 4, 5}, pixels));
  write_gzip(dir.path("images.gz"), idx_bytes({3, 4, 5}, pixels));
  test::write_bytes(dir.path("labels"), idx_bytes({3}, labels));
  write_gzip(dir.path("labels.gz"), idx_bytes({3}, labels));

  for (const char* name : {"images", "images.gz"}) {
    const io::IdxImages images = io::read_idx_images(dir.path(name));
    EXPECT_EQ(images.count, 3);
    EXPECT_EQ(images.rows, 4);
    EXPECT_EQ(images.cols, 5);
    EXPECT_EQ(images.pixels, pixels) << name;
  }
  EXPECT_EQ(io::read_idx_labels(dir.path("labels")), labels);
  EXPECT_EQ(io::read_idx_labels(dir.path("labels.gz")), labels);
  const io::IdxArray array = io::read_idx(dir.path("images.gz"));
  EXPECT_EQ(array.dims, (std::vector<int64_t>{3, 4, 5}));
}

TEST(Idx, SpecificCorruptionsNameTheFileAndTheProblem) {
  test::TempDir dir;
  const std::string path = dir.path("bad.idx");
  const std::vector<uint8_t> six(6, 1);

  std::string bytes = idx_bytes({2, 3}, six);
  bytes[0] = 1;
  test::write_bytes(path, bytes);
  expect_idx_error(path, "bad IDX magic");

  bytes = idx_bytes({2, 3}, six);
  bytes[2] = 0x0d; // f32 elements
  test::write_bytes(path, bytes);
  expect_idx_error(path, "element type code 13");

  test::write_bytes(path, idx_bytes({}, {}));
  expect_idx_error(path, "rank 0");
  test::write_bytes(path, idx_bytes({1, 1, 1, 1, 1}, {1}));
  expect_idx_error(path, "IDX rank 5 is not in 1..4");
  test::write_bytes(path, idx_bytes({1, 2, 1, 3}, six)); // rank 4, the largest, is read
  EXPECT_EQ(io::read_idx(path).dims, (std::vector<int64_t>{1, 2, 1, 3}));

  test::write_bytes(path, idx_bytes({2, 4}, six));
  expect_idx_error(path, "holds 6 values, its dimensions describe 8");

  test::write_bytes(path, idx_bytes({2, 2}, six));
  expect_idx_error(path, "more data than the 4 values");
  // One byte more than a whole 64 KiB read: the extra byte comes in a later read.
  test::write_bytes(path, idx_bytes({256, 256}, std::vector<uint8_t>(65537, 1)));
  expect_idx_error(path, "more data than the 65536 values");
  // A dimension of 0 is an empty array, not a division by zero.
  test::write_bytes(path, idx_bytes({0, 28, 28}, {}));
  EXPECT_EQ(io::read_idx(path).dims, (std::vector<int64_t>{0, 28, 28}));
  EXPECT_TRUE(io::read_idx(path).values.empty());

  test::write_bytes(path, idx_bytes({0xffffffffu, 0xffffffffu, 0xffffffffu}, six));
  expect_idx_error(path, "dimensions are too large");

  test::write_bytes(path, idx_bytes({70000, 70000}, six));
  expect_idx_error(path, "holds 6 values");

  test::write_bytes(path, std::string("\0\0", 2));
  expect_idx_error(path, "shorter than the 4-byte IDX magic");

  test::write_bytes(path, idx_bytes({6}, six));
  EXPECT_THROW(io::read_idx_images(path), Error);
  test::write_bytes(path, idx_bytes({1, 2, 3}, six));
  EXPECT_THROW(io::read_idx_labels(path), Error);

  expect_idx_error(dir.path("missing.gz"), "cannot open");
  expect_idx_error(dir.root(), "not a regular file (a directory)");
}

TEST(Idx, RandomTruncationsAndBitFlipsLoadOrThrowError) {
  test::TempDir dir;
  Rng rng(2);
  const std::string raw = idx_bytes({4, 6, 5}, random_bytes(rng, 4 * 6 * 5));
  write_gzip(dir.path("valid.gz"), raw);
  const std::string gz = io::read_file(dir.path("valid.gz"));
  auto load = [](const std::string& path) { io::read_idx_images(path); };

  const test::FuzzCounts raw_cut = test::fuzz_truncations(raw, dir.path("cut"), load, rng, 150);
  EXPECT_EQ(raw_cut.loaded, 0) << "a truncated file must not load";
  const test::FuzzCounts gz_cut = test::fuzz_truncations(gz, dir.path("cut.gz"), load, rng, 150);
  EXPECT_EQ(gz_cut.loaded, 0) << "a truncated gzip file must not load";

  const test::FuzzCounts raw_flips =
      test::fuzz_bit_flips(raw, dir.path("flip"), load, rng, 250, 16);
  EXPECT_GT(raw_flips.rejected, 0);
  EXPECT_GT(raw_flips.loaded, 0);
  const test::FuzzCounts gz_flips =
      test::fuzz_bit_flips(gz, dir.path("flip.gz"), load, rng, 250, 16);
  EXPECT_GT(gz_flips.rejected, 0);
}

// Every header field at its limits, in raw and gzipped files: each magic byte 0x00, 0x01 and
// 0xff, and each dimension 0, 1, 2^31 - 1, 2^31 and 2^32 - 1. Each file loads or throws Error
// naming it (never allocates what the header claims: the data are read as they come).
TEST(Idx, HeaderFieldsAtTheirLimitsLoadOrThrowError) {
  test::TempDir dir;
  Rng rng(3);
  const std::string valid = idx_bytes({4, 6, 5}, random_bytes(rng, 4 * 6 * 5));
  auto load = [](const std::string& path) { io::read_idx_images(path); };
  std::vector<std::string> variants;
  for (size_t at = 0; at < 4; ++at)
    for (char byte : {'\x00', '\x01', '\xff'}) {
      variants.push_back(valid);
      variants.back()[at] = byte;
    }
  for (size_t dim = 0; dim < 3; ++dim)
    for (uint32_t value : {0u, 1u, 0x7fffffffu, 0x80000000u, 0xffffffffu}) {
      std::string bytes = valid;
      for (int b = 0; b < 4; ++b) bytes[4 + 4 * dim + b] = char((value >> (24 - 8 * b)) & 0xff);
      variants.push_back(bytes);
    }
  test::FuzzCounts counts;
  for (const std::string& bytes : variants) {
    test::load_or_reject(dir.path("limit"), bytes, load, counts);
    write_gzip(dir.path("limit.gz"), bytes);
    test::load_or_reject(dir.path("limit.gz"), io::read_file(dir.path("limit.gz")), load, counts);
  }
  EXPECT_GT(counts.rejected, 0);
  EXPECT_GT(counts.loaded, 0); // the unchanged bytes among them
}

TEST(Idx, ReadsTheFashionMnistTestSetWhenInstalled) {
  const std::string root = "/usr/share/datasets/fashion-mnist/";
  if (!std::filesystem::exists(root + "t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed under " << root;
  const io::IdxImages images = io::read_idx_images(root + "t10k-images-idx3-ubyte.gz");
  const std::vector<uint8_t> labels = io::read_idx_labels(root + "t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(images.count, 10000);
  EXPECT_EQ(images.rows, 28);
  EXPECT_EQ(images.cols, 28);
  EXPECT_EQ(images.pixels.size(), size_t(10000 * 28 * 28));
  ASSERT_EQ(labels.size(), 10000u);
  std::vector<int> per_class(10, 0);
  for (uint8_t label : labels) {
    ASSERT_LT(label, 10);
    ++per_class[label];
  }
  for (int count : per_class) EXPECT_GT(count, 0); // every class is present
}

} // namespace
} // namespace minamp
