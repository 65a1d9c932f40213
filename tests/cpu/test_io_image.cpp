// Tests for io/image, io/plot and io/atomic_file: PNG round trips, channel conversion,
// resizing, the image-folder fixture (data/tiny-images) and its errors, corrupt PNGs and JPEGs,
// a line plot's pixels, and atomic writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include <zlib.h>

#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/image.h"
#include "io/plot.h"
#include "test_io_util.h"
#include "test_util.h"

namespace minamp {
namespace {

using test::expect_error;

// A random image whose values are multiples of 1/255, so that 8-bit PNG holds them exactly.
Tensor random_8bit_image(Rng& rng, int64_t h, int64_t w, int64_t c) {
  Tensor image = Tensor::empty({h, w, c});
  for (int64_t i = 0; i < image.numel(); ++i) image.data<float>()[i] = rng.below(256) / 255.0f;
  return image;
}

// The 4 bytes of `v`, most significant first.
std::string big_endian(uint32_t v) {
  return std::string{char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

// A random 8-bit [h, w, 3] image saved as a PNG in `dir`: the image, the file's bytes, and where
// its data chunk (IDAT) and end chunk (IEND) begin (each at its 4-byte length, before its type).
struct SavedPng {
  Tensor image;
  std::string bytes;
  size_t data, end;
};
SavedPng save_random_png(const test::TempDir& dir, uint64_t seed, int64_t h, int64_t w) {
  Rng rng(seed);
  SavedPng png{random_8bit_image(rng, h, w, 3), "", 0, 0};
  io::save_png(dir.path("valid.png"), png.image);
  png.bytes = io::read_file(dir.path("valid.png"));
  png.data = png.bytes.find("IDAT") - 4;
  png.end = png.bytes.find("IEND") - 4;
  return png;
}

// Both ways an image file is read: its header alone, and in full.
const std::vector<void (*)(const std::string&)> kImageReads = {
    +[](const std::string& path) { io::check_image_header(path); },
    +[](const std::string& path) { io::load_image(path, 3); }};

Tensor constant_image(int64_t h, int64_t w, const std::vector<float>& pixel) {
  Tensor image = Tensor::empty({h, w, int64_t(pixel.size())});
  for (int64_t i = 0; i < image.numel(); ++i) image.data<float>()[i] = pixel[i % pixel.size()];
  return image;
}

double mean_of(const Tensor& t) {
  double sum = 0;
  for (float v : t.to_vector()) sum += v;
  return sum / double(t.numel());
}

TEST(Image, PngRoundTripsRgbAndGrey) {
  test::TempDir dir;
  Rng rng(1);
  for (int64_t channels : {1, 3}) {
    const Tensor image = random_8bit_image(rng, 7, 11, channels);
    const std::string path = dir.path("image" + std::to_string(channels) + ".png");
    io::save_png(path, image);
    const Tensor back = io::load_image(path, int(channels));
    EXPECT_EQ(back.shape(), image.shape());
    EXPECT_EQ(back.to_vector(), image.to_vector());
  }
}

// Values outside [0, 1] (a prediction overshooting its target) are clamped, not wrapped around
// 8 bits; values inside round to the nearest of the 256 levels.
TEST(Image, SavePngClampsToTheUnitInterval) {
  test::TempDir dir;
  const std::string path = dir.path("clamped.png");
  io::save_png(path, Tensor::from_vector({-0.5f, 0.0f, 0.5f, 1.0f, 1.5f, 40.0f}, {1, 6, 1}));
  EXPECT_EQ(io::load_image(path, 1).to_vector(),
            (std::vector<float>{0.0f, 0.0f, 128 / 255.0f, 1.0f, 1.0f, 1.0f}));
}

TEST(Image, ConvertsChannelsOnLoad) {
  test::TempDir dir;
  const std::string rgb_path = dir.path("rgb.png"), grey_path = dir.path("grey.png");
  io::save_png(rgb_path, constant_image(4, 4, {1.0f, 1.0f, 1.0f}));
  io::save_png(grey_path, constant_image(4, 4, {0.2f}));

  const Tensor white = io::load_image(rgb_path, 1);
  EXPECT_EQ(white.shape(), (Shape{4, 4, 1}));
  for (float v : white.to_vector()) EXPECT_NEAR(v, 1.0f, 1.0f / 255);
  const Tensor grey_as_rgb = io::load_image(grey_path, 3);
  EXPECT_EQ(grey_as_rgb.shape(), (Shape{4, 4, 3}));
  for (float v : grey_as_rgb.to_vector()) EXPECT_NEAR(v, 0.2f, 0.5f / 255);
  EXPECT_THROW(io::load_image(rgb_path, 2), Error);
}

TEST(Image, ResizeKeepsConstantsAndIdentity) {
  Rng rng(2);
  const Tensor image = random_8bit_image(rng, 6, 9, 3);
  EXPECT_EQ(io::resize_image(image, 6, 9).to_vector(), image.to_vector());
  for (auto [h, w] : {std::pair{3, 4}, std::pair{13, 20}, std::pair{1, 1}}) {
    const Tensor resized = io::resize_image(constant_image(6, 9, {0.25f, 0.5f, 1.0f}), h, w);
    EXPECT_EQ(resized.shape(), (Shape{h, w, 3}));
    const std::vector<float> values = resized.to_vector();
    for (size_t i = 0; i < values.size(); ++i)
      EXPECT_NEAR(values[i], (std::vector<float>{0.25f, 0.5f, 1.0f})[i % 3], 1e-6);
  }
  EXPECT_THROW(io::resize_image(image, 0, 4), Error);
}

TEST(Image, ResizeUpIsBilinearAndDownAverages) {
  // One row [0, 1] doubled: output centres sit at source x = -0.25, 0.25, 0.75, 1.25, so
  // bilinear interpolation (clamped at the edges) gives 0, 1/4, 3/4, 1.
  const Tensor ramp = Tensor::from_vector({0.0f, 1.0f}, {1, 2, 1});
  EXPECT_EQ(io::resize_image(ramp, 1, 4).to_vector(), (std::vector<float>{0, 0.25f, 0.75f, 1}));

  // A checkerboard shrunk 4x must come out grey (point sampling would give pure 0 or 1).
  Tensor board = Tensor::empty({8, 8, 1});
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 8; ++x) board.data<float>()[y * 8 + x] = float((x + y) % 2);
  for (float v : io::resize_image(board, 2, 2).to_vector()) EXPECT_NEAR(v, 0.5f, 0.05f);
  // Every third row white, shrunk 3x: each output row centres on a black row, which a filter one
  // source pixel wide would sample alone; 3 wide it sees the white rows too.
  Tensor stripes = Tensor::empty({9, 1, 1});
  for (int y = 0; y < 9; ++y) stripes.data<float>()[y] = float(y % 3 == 2);
  for (float v : io::resize_image(stripes, 3, 1).to_vector()) EXPECT_NEAR(v, 1.0f / 3, 0.1f);

  Rng rng(3);
  const Tensor noise = random_8bit_image(rng, 30, 40, 1);
  EXPECT_NEAR(mean_of(io::resize_image(noise, 10, 10)), mean_of(noise), 0.02);
}

TEST(Image, LoadsTheImageFolderFixture) {
  const std::string root = std::string(MINAMP_SOURCE_DIR) + "/data/tiny-images";
  const io::ImageFolder folder = io::load_image_folder(root, 8, 3);
  EXPECT_EQ(folder.classes, (std::vector<std::string>{"circles", "squares", "stripes"}));
  ASSERT_EQ(folder.files.size(), 9u);
  EXPECT_EQ(folder.images.shape(), (Shape{9, 8, 8, 3}));
  EXPECT_EQ(folder.labels.dtype(), DType::i32);
  EXPECT_EQ(folder.labels.to_vector(), (std::vector<float>{0, 0, 0, 1, 1, 1, 2, 2, 2}));
  EXPECT_NE(folder.files[7].find("stripes/img1.jpg"), std::string::npos);
  EXPECT_TRUE(std::is_sorted(folder.files.begin(), folder.files.end()));
  for (float v : folder.images.to_vector()) ASSERT_TRUE(v >= 0.0f && v <= 1.0f);

  // Row i is files[i] loaded and resized on its own.
  const Tensor first = io::resize_image(io::load_image(folder.files[0], 3), 8, 8);
  const std::vector<float> all = folder.images.to_vector();
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + 8 * 8 * 3), first.to_vector());

  const io::ImageFolder grey = io::load_image_folder(root, 5, 1);
  EXPECT_EQ(grey.images.shape(), (Shape{9, 5, 5, 1}));
}

TEST(Image, FolderErrorsNameTheProblemPath) {
  test::TempDir dir;
  expect_error([&] { io::load_image_folder(dir.path("absent"), 8, 3); }, dir.path("absent"));
  expect_error([&] { io::load_image_folder(dir.root(), 8, 3); }, dir.root()); // no classes

  std::filesystem::create_directories(dir.path("cats"));
  test::write_bytes(dir.path("cats/notes.txt"), "not an image");
  expect_error([&] { io::load_image_folder(dir.root(), 8, 3); }, dir.path("cats"));

  Rng rng(4);
  io::save_png(dir.path("cats/a.png"), random_8bit_image(rng, 5, 5, 3));
  test::write_bytes(dir.path("cats/b.PNG"), "garbage that is not a PNG");
  expect_error([&] { io::load_image_folder(dir.root(), 8, 3); }, dir.path("cats/b.PNG"));
  std::filesystem::remove(dir.path("cats/b.PNG"));
  EXPECT_EQ(io::load_image_folder(dir.root(), 4, 3).images.shape(), (Shape{1, 4, 4, 3}));
  EXPECT_THROW(io::load_image_folder(dir.root(), 0, 3), Error);
  // .jpeg is a JPEG too, in either case.
  std::filesystem::copy(std::string(MINAMP_SOURCE_DIR) + "/data/tiny-images/stripes/img1.jpg",
                        dir.path("cats/c.JPEG"));
  EXPECT_EQ(io::load_image_folder(dir.root(), 4, 3).images.shape(), (Shape{2, 4, 4, 3}));
}

// Random truncations and bit flips, and the size fields of a PNG's header (IHDR width and
// height) and of a JPEG's frame header (SOF height and width) at their limits: 0, 1, 2^14 (stb's
// largest side), 2^14 + 1, and the largest values the fields hold. Each file loads or throws
// Error naming it, and none makes stb allocate for more than 2^25 pixels.
TEST(Image, CorruptPngsAndJpegsLoadOrThrowError) {
  test::TempDir dir;
  Rng rng(5);
  io::save_png(dir.path("valid.png"), random_8bit_image(rng, 9, 7, 3));
  const std::string png = io::read_file(dir.path("valid.png"));
  const std::string jpeg =
      io::read_file(std::string(MINAMP_SOURCE_DIR) + "/data/tiny-images/stripes/img1.jpg");
  auto load = [](const std::string& path) { io::load_image(path, 3); };
  for (const std::string& valid : {png, jpeg}) {
    const test::FuzzCounts cut = test::fuzz_truncations(valid, dir.path("cut"), load, rng, 150);
    EXPECT_GT(cut.rejected, 0);
    const test::FuzzCounts flips =
        test::fuzz_bit_flips(valid, dir.path("flip"), load, rng, 250, 200);
    EXPECT_GT(flips.rejected, 0);
  }
  expect_error([&] { io::load_image(dir.path("missing.png"), 3); }, dir.path("missing.png"));

  const size_t sof =
      jpeg.find("\xff\xc0") != std::string::npos ? jpeg.find("\xff\xc0") : jpeg.find("\xff\xc2");
  ASSERT_NE(sof, std::string::npos) << "no frame header in the JPEG fixture";
  // Where each size field is (offset, bytes, big-endian) in its file.
  const struct {
    const std::string* file;
    size_t offset, bytes;
  } fields[] = {{&png, 16, 4}, {&png, 20, 4}, {&jpeg, sof + 5, 2}, {&jpeg, sof + 7, 2}};
  test::FuzzCounts limits;
  for (const auto& field : fields) {
    const uint64_t largest = (uint64_t(1) << (8 * field.bytes)) - 1;
    for (uint64_t value : {uint64_t(0), uint64_t(1), uint64_t(1) << 14, (uint64_t(1) << 14) + 1,
                           largest >> 1, largest}) {
      std::string bytes = *field.file;
      for (size_t b = 0; b < field.bytes; ++b)
        bytes[field.offset + b] = char((value >> (8 * (field.bytes - 1 - b))) & 0xff);
      test::load_or_reject(dir.path("limit"), bytes, load, limits);
    }
  }
  EXPECT_GT(limits.rejected, 0);
}

// The message ends with stb's reason, not cut short (a null reason would stop the stream).
TEST(Image, ANonImageFileNamesStbsReason) {
  test::TempDir dir;
  io::write_file_atomically(dir.path("x.png"), "notanimage\n");
  expect_error([&] { io::load_image(dir.path("x.png"), 3); }, dir.path("x.png"),
               ": not a readable PNG or JPEG (unknown image type)");
}

// A JPEG cut short is named as one: stb's JPEG decoder gives no reason of its own there, and the
// one its PNG probe left ("bad png sig") would mislead.
TEST(Image, ATruncatedJpegIsNamedAsOne) {
  test::TempDir dir;
  const std::string jpeg =
      io::read_file(std::string(MINAMP_SOURCE_DIR) + "/data/tiny-images/stripes/img1.jpg");
  int rejected = 0, named = 0;
  for (size_t cut = 2; cut < jpeg.size(); ++cut) {
    test::write_bytes(dir.path("cut.jpg"), jpeg.substr(0, cut));
    try {
      io::load_image(dir.path("cut.jpg"), 3);
    } catch (const Error& e) {
      ++rejected;
      const std::string message = e.what();
      EXPECT_EQ(message.find("png"), std::string::npos) << cut << ": " << message;
      named += message.find("corrupt or truncated JPEG data") != std::string::npos;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(named, 0) << "no cut reached the decoder";
}

// data/progressive-jpeg/stripes.jpg is the fixture's baseline JPEG rewritten as progressive
// without loss (`jpegtran -progressive`): the same coefficients, so the same pixels.
TEST(Image, AProgressiveJpegDecodesAsItsBaseline) {
  const std::string data = std::string(MINAMP_SOURCE_DIR) + "/data/";
  const std::string progressive = io::read_file(data + "progressive-jpeg/stripes.jpg");
  ASSERT_NE(progressive.find("\xff\xc2"), std::string::npos) << "no progressive frame header";
  const Tensor baseline = io::load_image(data + "tiny-images/stripes/img1.jpg", 3);
  const Tensor image = io::load_image(data + "progressive-jpeg/stripes.jpg", 3);
  EXPECT_EQ(image.shape(), baseline.shape());
  EXPECT_EQ(image.to_vector(), baseline.to_vector());
}

// Leaves freed heap memory holding `byte`: blocks of each small size and some larger ones, filled
// and freed, for later allocations to reuse, so that what a decoder reads without having written
// shows.
void poison_freed_heap(char byte) {
  std::vector<std::unique_ptr<char[]>> blocks;
  auto fill = [&](size_t size) {
    blocks.emplace_back(new char[size]);
    std::memset(blocks.back().get(), byte, size);
  };
  for (size_t size = 16; size <= 1024; size += 16)
    for (int i = 0; i < 8; ++i) fill(size);
  for (int i = 0; i < 16; ++i) fill(size_t(64) << 10);
}

// The length a JPEG's marker segment gives itself: the 2 bytes after its marker, at `marker`.
size_t jpeg_segment_length(const std::string& jpeg, size_t marker) {
  return size_t{static_cast<uint8_t>(jpeg[marker + 2])} << 8 |
         static_cast<uint8_t>(jpeg[marker + 3]);
}

// A progressive JPEG may leave coefficients uncoded, which decode as zeros whatever the memory
// stb is given held: the grey fixture (data/progressive-jpeg/README.txt) without its first scan,
// the blocks' DC coefficients, loads the same after freed memory held one pattern or another
// (stb's first DC scan clears a block; without one its coefficients were the memory's). Cut
// after that first scan instead, and ended, it loads as 8x8 blocks of one level each.
TEST(Image, AProgressiveJpegsUncodedCoefficientsDecodeAsZeros) {
  const std::string path =
      std::string(MINAMP_SOURCE_DIR) + "/data/progressive-jpeg/stripes-grey.jpg";
  const std::string grey = io::read_file(path);
  const size_t first_scan = grey.find("\xff\xda");
  const size_t second_scan = grey.find("\xff\xda", first_scan + 2);
  ASSERT_NE(second_scan, std::string::npos);
  // Where the first scan's entropy-coded data, after its header, ends: at the first marker that
  // is not a restart (0xd0-0xd7) or a stuffed 0xff (0xff 0x00).
  size_t first_scan_end = first_scan + 2 + jpeg_segment_length(grey, first_scan);
  while (first_scan_end + 1 < grey.size() &&
         !(uint8_t(grey[first_scan_end]) == 0xff && uint8_t(grey[first_scan_end + 1]) != 0 &&
           (uint8_t(grey[first_scan_end + 1]) & 0xf8) != 0xd0))
    ++first_scan_end;
  test::TempDir dir;
  test::write_bytes(dir.path("no-dc.jpg"),
                    grey.substr(0, first_scan) + grey.substr(first_scan_end));
  poison_freed_heap('\x5a');
  const Tensor one = io::load_image(dir.path("no-dc.jpg"), 1);
  poison_freed_heap('\xa5');
  const Tensor other = io::load_image(dir.path("no-dc.jpg"), 1);
  EXPECT_EQ(one.to_vector(), other.to_vector());

  test::write_bytes(dir.path("dc.jpg"), grey.substr(0, second_scan) + "\xff\xd9");
  const Tensor full = io::load_image(path, 1);
  const Tensor dc = io::load_image(dir.path("dc.jpg"), 1);
  ASSERT_EQ(dc.shape(), full.shape());
  const int64_t h = dc.shape()[0], w = dc.shape()[1];
  const float* p = dc.data<float>();
  bool some_block_varies = false; // in the full image: else flat blocks would prove nothing
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const int64_t corner = (y / 8 * 8) * w + x / 8 * 8;
      EXPECT_EQ(p[y * w + x], p[corner]) << "pixel (" << x << ", " << y << ")";
      some_block_varies |= full.data<float>()[y * w + x] != full.data<float>()[corner];
    }
  EXPECT_TRUE(some_block_varies);
}

TEST(Image, RejectsAJpegHuffmanTableWithTooManyCodes) {
  // SOI, then a DHT segment whose 16 code counts sum to 16 * 255 (a table holds at most 256).
  std::string bytes = "\xff\xd8\xff\xc4";
  const size_t length = 2 + 1 + 16 + 16 * 255;
  bytes += char(length >> 8);
  bytes += char(length & 0xff);
  bytes += '\0';
  bytes += std::string(16, char(255)) + std::string(16 * 255, '\0') + "\xff\xd9";
  test::TempDir dir;
  test::write_bytes(dir.path("bad.jpg"), bytes);
  expect_error([&] { io::load_image(dir.path("bad.jpg"), 3); }, dir.path("bad.jpg"),
               "more than 256 codes");

  // The same where the counts run past the end of the file, which stb reads as zeros: a segment
  // of two tables, the first empty, the second's counts 255 + 255 and then the end of the file.
  std::string cut = "\xff\xd8\xff\xc4";
  cut += '\0';
  cut += char(2 + 2 * 17);
  cut += '\0' + std::string(16, '\0') + "\x10\xff\xff";
  test::write_bytes(dir.path("cut.jpg"), cut);
  for (auto read : kImageReads)
    expect_error([&] { read(dir.path("cut.jpg")); }, dir.path("cut.jpg"), "more than 256 codes");
  // And where fill bytes come before the start-of-image marker, which stb skips.
  test::write_bytes(dir.path("filled.jpg"), "\xff\xff" + bytes.substr(1));
  expect_error([&] { io::load_image(dir.path("filled.jpg"), 3); }, dir.path("filled.jpg"),
               "more than 256 codes");
}

// Where the first table `id_byte` of the segments `marker` defines is in a JPEG's bytes (0xc4:
// Huffman tables, class << 4 | id, 0x10 being AC table 0; 0xdb: quantization tables, precision
// << 4 | id): at that byte (0xff followed by a marker never occurs in entropy-coded data).
size_t jpeg_table_at(const std::string& jpeg, char marker, unsigned char id_byte) {
  const std::string start{'\xff', marker};
  for (size_t segment = jpeg.find(start); segment != std::string::npos;
       segment = jpeg.find(start, segment + 2)) {
    const size_t end = segment + 2 + jpeg_segment_length(jpeg, segment);
    for (size_t table = segment + 4; table < end;) {
      if (uint8_t(jpeg[table]) == id_byte) return table;
      size_t size = (uint8_t(jpeg[table]) >> 4) != 0 ? 129 : 65;
      if (marker == '\xc4') {
        size = 17;
        for (size_t i = 1; i <= 16; ++i) size += uint8_t(jpeg[table + i]);
      }
      table += size;
    }
  }
  return std::string::npos;
}

// A scan that decodes with a Huffman or quantization table no segment has defined before it is
// refused (stb would decode with its tables' uninitialised memory): the baseline fixture with its
// AC table 0 renamed AC table 2, or its quantization table 1 renamed 3, and the progressive one
// without the segment that first defines AC table 0, which its first AC scan needs. (Its first
// scan, of DC coefficients, names AC table 0 before any AC table is defined, and uses none: that
// passes.)
TEST(Image, RejectsAJpegScanWithAnUndefinedTable) {
  test::TempDir dir;
  const std::string data = std::string(MINAMP_SOURCE_DIR) + "/data/";
  const std::string baseline = io::read_file(data + "tiny-images/stripes/img1.jpg");
  auto renamed = [&](char marker, unsigned char id_byte, unsigned char to) {
    std::string bytes = baseline;
    const size_t table = jpeg_table_at(bytes, marker, id_byte);
    EXPECT_NE(table, std::string::npos);
    if (table != std::string::npos) bytes[table] = char(to);
    return bytes;
  };
  test::write_bytes(dir.path("huffman.jpg"), renamed('\xc4', 0x10, 0x12));
  test::write_bytes(dir.path("quantization.jpg"), renamed('\xdb', 0x01, 0x03));

  const std::string progressive = io::read_file(data + "progressive-jpeg/stripes.jpg");
  const size_t segment = jpeg_table_at(progressive, '\xc4', 0x10) - 4; // its first table
  test::write_bytes(
      dir.path("progressive.jpg"),
      progressive.substr(0, segment) +
          progressive.substr(segment + 2 + jpeg_segment_length(progressive, segment)));
  const std::vector<std::pair<const char*, const char*>> expected = {
      {"huffman.jpg", "a Huffman table that no DHT segment"},
      {"quantization.jpg", "a quantization table that no DQT segment"},
      {"progressive.jpg", "a Huffman table that no DHT segment"}};
  for (const auto& [name, table] : expected)
    for (auto read : kImageReads)
      expect_error([&] { read(dir.path(name)); }, dir.path(name),
                   std::string(": corrupt JPEG (a scan uses ") + table + " before it defines)");
}

// Empty PNG data chunks (IDAT) hold nothing: a PNG with them loads as the same image without
// them (stb would copy one before any image data to a null pointer), and a PNG whose only data
// chunk is empty is refused as having no image data.
TEST(Image, EmptyPngDataChunksLoadAsNothing) {
  test::TempDir dir;
  const SavedPng png = save_random_png(dir, 8, 5, 6);
  ASSERT_EQ(png.data, size_t(8 + 25)) << "the data chunk does not follow the signature and header";
  const std::string empty_data("\0\0\0\0IDAT\x35\xaf\x06\x1e", 12); // with its CRC-32
  const std::string& bytes = png.bytes;
  test::write_bytes(dir.path("empty.png"), bytes.substr(0, png.data) + empty_data +
                                               bytes.substr(png.data, png.end - png.data) +
                                               empty_data + empty_data + bytes.substr(png.end));
  EXPECT_EQ(io::load_image(dir.path("empty.png"), 3).to_vector(), png.image.to_vector());

  test::write_bytes(dir.path("no-data.png"),
                    bytes.substr(0, png.data) + empty_data + bytes.substr(png.end));
  expect_error([&] { io::load_image(dir.path("no-data.png"), 3); }, dir.path("no-data.png"),
               ": cannot decode (no IDAT)");
}

// A chunk that says it is longer than what is left of the file is refused before stb allocates
// for it (up to 2^31 bytes from a file of a few dozen); the end chunk, of which stb reads nothing,
// may say what it likes.
TEST(Image, RejectsAPngChunkThatRunsPastTheEndOfTheFile) {
  test::TempDir dir;
  const SavedPng png = save_random_png(dir, 9, 4, 3);
  auto with_length = [&](size_t chunk, uint32_t length) {
    std::string bytes = png.bytes;
    bytes.replace(chunk, 4, big_endian(length));
    return bytes;
  };
  const size_t left = png.bytes.size() - png.data - 8; // after the data chunk's length and type
  for (const uint32_t length : {uint32_t(left + 1), uint32_t(0x7fffffff)}) {
    test::write_bytes(dir.path("long.png"), with_length(png.data, length));
    for (auto read : kImageReads)
      expect_error([&] { read(dir.path("long.png")); }, dir.path("long.png"),
                   ": corrupt or truncated PNG (a chunk's length runs past the end of the file)");
  }
  // The longest data chunk the file holds, its CRC cut short, gets as far as stb.
  test::write_bytes(dir.path("fits.png"), with_length(png.data, uint32_t(left)));
  expect_error([&] { io::load_image(dir.path("fits.png"), 3); }, dir.path("fits.png"),
               ": cannot decode (");
  test::write_bytes(dir.path("end.png"), with_length(png.end, 1000));
  EXPECT_EQ(io::load_image(dir.path("end.png"), 3).to_vector(), png.image.to_vector());
}

// A PNG chunk: its data's length (big-endian), its type, the data and the CRC-32 of type and data.
std::string png_chunk(const std::string& type, const std::string& data) {
  const std::string typed = type + data;
  const uint32_t crc =
      uint32_t(crc32(0, reinterpret_cast<const Bytef*>(typed.data()), uInt(typed.size())));
  return big_endian(uint32_t(data.size())) + typed + big_endian(crc);
}

// An 8-bit greyscale PNG of `width` x `height` whose image data is `raw` (filter bytes and
// pixels, as the decoder inflates them), deflated at zlib's best compression.
std::string grey_png(uint32_t width, uint32_t height, bool interlaced, const std::string& raw) {
  uLongf packed_size = compressBound(uLong(raw.size()));
  std::string packed(packed_size, '\0');
  EXPECT_EQ(compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                      reinterpret_cast<const Bytef*>(raw.data()), uLong(raw.size()), 9),
            Z_OK);
  packed.resize(packed_size);
  const std::string header =
      big_endian(width) + big_endian(height) +
      std::string{8, 0, 0, 0, char(interlaced)}; // depth, grey, deflate, filters, interlace
  return "\x89PNG\r\n\x1a\n" + png_chunk("IHDR", header) + png_chunk("IDAT", packed) +
         png_chunk("IEND", "");
}

// An interlaced (Adam7) PNG decodes to its pixels. Its seven passes inflate to more bytes than the
// same image without interlacing, which stb's first guess of the size holds: its buffer grows.
TEST(Image, AnInterlacedPngDecodesToItsPixels) {
  Rng rng(12);
  const int64_t h = 13, w = 10;
  const Tensor image = random_8bit_image(rng, h, w, 1);
  // Adam7's passes: where each starts in an 8x8 cell (x, y) and its steps (dx, dy).
  const int pass[7][4] = {{0, 0, 8, 8}, {4, 0, 8, 8}, {0, 4, 4, 8}, {2, 0, 4, 4},
                          {0, 2, 2, 4}, {1, 0, 2, 2}, {0, 1, 1, 2}};
  std::string raw;
  for (const auto& p : pass)
    for (int64_t y = p[1]; y < h; y += p[3]) {
      if (p[0] >= w) break; // a pass with no columns has no rows either
      raw += '\0';          // filter: none
      for (int64_t x = p[0]; x < w; x += p[2])
        raw += char(std::lround(image.data<float>()[y * w + x] * 255));
    }
  ASSERT_GT(raw.size(), size_t(h * (w + 1))) << "the passes fit stb's first guess";
  test::TempDir dir;
  test::write_bytes(dir.path("interlaced.png"), grey_png(w, h, true, raw));
  const Tensor back = io::load_image(dir.path("interlaced.png"), 1);
  EXPECT_EQ(back.shape(), image.shape());
  EXPECT_EQ(back.to_vector(), image.to_vector());
}

// The interlaced 16-bit RGBA fixture (data/interlaced-png/README.txt) loads as its RGB levels: its
// passes put back in place, 16 bits read as their high byte, alpha dropped.
TEST(Image, TheInterlaced16BitRgbaFixtureLoadsAsItsLevels) {
  const Tensor image =
      io::load_image(std::string(MINAMP_SOURCE_DIR) + "/data/interlaced-png/rgba16.png", 3);
  ASSERT_EQ(image.shape(), Shape({5, 7, 3}));
  for (int64_t y = 0; y < 5; ++y)
    for (int64_t x = 0; x < 7; ++x)
      for (int64_t c = 0; c < 3; ++c)
        EXPECT_EQ(image.data<float>()[(y * 7 + x) * 3 + c],
                  ((37 * x + 101 * y + 53 * c) % 256) / 255.0f)
            << "pixel (" << x << ", " << y << ") channel " << c;
}

// A PNG whose image data inflates to far more than its pixels hold (stb ignores the excess, but
// would allocate for all of it, doubling: gigabytes from a file of a few megabytes) is refused
// once the data outgrows twice what the pixels or the file could need, or 1 MiB. Here 64 MiB from
// 64 KiB.
TEST(Image, RejectsAPngWhoseDataInflatesFarPastItsPixels) {
  test::TempDir dir;
  std::string raw(size_t(64) << 20, '\0');
  raw[1] = char(200); // the one pixel, after its row's filter byte
  const std::string bomb = grey_png(1, 1, false, raw);
  ASSERT_LT(bomb.size(), size_t(128) << 10);
  test::write_bytes(dir.path("bomb.png"), bomb);
  expect_error([&] { io::load_image(dir.path("bomb.png"), 1); }, dir.path("bomb.png"),
               ": corrupt PNG (its image data inflates to far more than 1x1 pixels hold)");
  // Some excess still loads: the pixels, the rest ignored.
  raw.resize(100000);
  test::write_bytes(dir.path("padded.png"), grey_png(1, 1, false, raw));
  EXPECT_EQ(io::load_image(dir.path("padded.png"), 1).to_vector(),
            std::vector<float>{200 / 255.0f});
}

// True when `pixel` (3 floats in [0, 1]) is exactly the 8-bit colour (r, g, b).
bool is_colour(const float* pixel, int r, int g, int b) {
  return std::lround(pixel[0] * 255) == r && std::lround(pixel[1] * 255) == g &&
         std::lround(pixel[2] * 255) == b;
}

// True when some pixel of `image` (f32 [H, W, 3]) has exactly the 8-bit colour (r, g, b).
bool has_colour(const Tensor& image, int r, int g, int b) {
  const float* p = image.data<float>();
  for (int64_t i = 0; i < image.numel(); i += 3)
    if (is_colour(p + i, r, g, b)) return true;
  return false;
}

TEST(Plot, DrawsSeriesInDistinctColoursOnWhite) {
  test::TempDir dir;
  io::PlotSeries loss{"loss", {}, {}}, scale{"scale", {}, {}};
  for (int i = 0; i < 50; ++i) {
    loss.y.push_back(1.0 / (1 + i));
    scale.y.push_back(i == 20 ? NAN : 65536.0 / (1 << (i / 10)));
  }
  io::PlotOptions options;
  options.title = "loss and scale";
  options.x_label = "step";
  options.y_label = "value";
  options.log_y = true;
  options.width = 400;
  options.height = 300;
  const std::string path = dir.path("plot.png");
  io::save_line_plot(path, {loss, scale}, options);

  const Tensor image = io::load_image(path, 3);
  EXPECT_EQ(image.shape(), (Shape{300, 400, 3}));
  EXPECT_TRUE(has_colour(image, 31, 119, 180)); // first series
  EXPECT_TRUE(has_colour(image, 255, 127, 14)); // second series
  EXPECT_FALSE(has_colour(image, 44, 160, 44)); // no third series
  EXPECT_TRUE(has_colour(image, 20, 20, 20));   // text
  EXPECT_EQ(image.data<float>()[0], 1.0f);      // white corner
  EXPECT_GT(mean_of(image), 0.8);               // mostly white canvas

  EXPECT_THROW(io::save_line_plot(path, {{"bad", {1, 2}, {1}}}), Error);
  io::save_line_plot(dir.path("empty.png"), {}, {}); // no data: axes only
  EXPECT_EQ(io::load_image(dir.path("empty.png"), 3).shape(), (Shape{600, 960, 3}));
}

// Pixels land where they belong on a canvas wider than it is high: a step from 0 to 1 is drawn
// as a vertical segment, one column holding the series' colour over much of the height.
TEST(Plot, AStepIsDrawnAsAVerticalSegment) {
  test::TempDir dir;
  const io::PlotSeries step{"step", {0, 1, 1, 2}, {0, 0, 1, 1}};
  io::PlotOptions options;
  options.width = 400;
  options.height = 300;
  const std::string path = dir.path("step.png");
  io::save_line_plot(path, {step}, options);
  const Tensor image = io::load_image(path, 3);
  ASSERT_EQ(image.shape(), (Shape{300, 400, 3}));
  const float* p = image.data<float>();
  int64_t tallest = 0; // the most pixels of the series' colour in one column
  for (int64_t col = 0; col < 400; ++col) {
    int64_t rows = 0;
    for (int64_t row = 0; row < 300; ++row)
      rows += is_colour(p + (row * 400 + col) * 3, 31, 119, 180);
    tallest = std::max(tallest, rows);
  }
  EXPECT_GT(tallest, 100);
}

// Pixels of the first series' colour in the PNG at `path`.
int64_t first_series_pixels(const std::string& path) {
  const Tensor image = io::load_image(path, 3);
  const float* p = image.data<float>();
  int64_t count = 0;
  for (int64_t i = 0; i < image.numel(); i += 3) count += is_colour(p + i, 31, 119, 180);
  return count;
}

// Data a plot must still show: a lone point between gaps (drawn as a dot), the finite values
// beside an infinite one (a diverged loss breaks the line, it does not blank the plot), and log
// data that all sit on one power of ten. Each draws more of its colour than its legend swatch.
TEST(Plot, DrawsWhatIsPlottableOfDegenerateData) {
  test::TempDir dir;
  io::PlotOptions options;
  options.width = 400;
  options.height = 300;
  const std::string legend_only = dir.path("legend_only.png");
  io::save_line_plot(legend_only, {{"s", {}, {NAN, NAN}}}, options);
  const int64_t swatch = first_series_pixels(legend_only);
  EXPECT_GT(swatch, 0);

  const std::pair<const char*, std::vector<double>> linear_cases[] = {
      {"lone point between gaps", {NAN, 2, NAN}},
      {"values beside an infinite one", {1, 2, INFINITY, 3, 4}},
  };
  for (const auto& [name, y] : linear_cases) {
    io::save_line_plot(dir.path("case.png"), {{"s", {}, y}}, options);
    EXPECT_GT(first_series_pixels(dir.path("case.png")), swatch + 20) << name;
  }
  options.log_y = true;
  io::save_line_plot(dir.path("log.png"), {{"s", {}, {100, 100, 100}}}, options);
  EXPECT_GT(first_series_pixels(dir.path("log.png")), swatch + 20) << "constant 100, log axis";

  test::expect_error(
      [&] {
        io::save_line_plot(dir.path("bad.png"), {{"s", {1}, {1, 2}}});
      },
      dir.path("bad.png"), "series 's' has 1 x values and 2 y values");
  EXPECT_FALSE(std::filesystem::exists(dir.path("bad.png")));
}

TEST(Plot, TickLabelsStepBy125OrByDecades) {
  using Labels = std::vector<std::string>;
  EXPECT_EQ(io::axis_tick_labels(0, 1, false), (Labels{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0"}));
  EXPECT_EQ(io::axis_tick_labels(0, 0.05, false),
            (Labels{"0.00", "0.01", "0.02", "0.03", "0.04", "0.05"}));
  EXPECT_EQ(io::axis_tick_labels(0, 500, false), (Labels{"0", "100", "200", "300", "400", "500"}));
  // One value: a span around it.
  EXPECT_EQ(io::axis_tick_labels(3, 3, false), (Labels{"2.0", "2.5", "3.0", "3.5", "4.0"}));
  // Log axes: 2x and 5x up to two decades, whole decades beyond, every other one past eight.
  EXPECT_EQ(io::axis_tick_labels(1, 100, true), (Labels{"1", "2", "5", "10", "20", "50", "100"}));
  EXPECT_EQ(io::axis_tick_labels(1, 1000, true), (Labels{"1", "10", "100", "1000"}));
  EXPECT_EQ(io::axis_tick_labels(100, 100, true), (Labels{"100", "200", "500", "1000"}));
  EXPECT_EQ(io::axis_tick_labels(1e-8, 1e8, true),
            (Labels{"1e-8", "1e-6", "1e-4", "0.01", "1", "100", "10000", "1e6", "1e8"}));
}

TEST(AtomicFile, ReplacesFilesAndLeavesNoTempFiles) {
  test::TempDir dir;
  const std::string path = dir.path("file.bin");
  io::write_file_atomically(path, "first");
  io::write_file_atomically(path, std::string("sec\0nd", 6));
  EXPECT_EQ(io::read_file(path), std::string("sec\0nd", 6));
  EXPECT_EQ(std::filesystem::status(path).permissions(),
            std::filesystem::perms(0644)) // not the temp file's 0600
      << "others cannot read the results";
  io::write_file_atomically(dir.path("empty"), "");
  EXPECT_EQ(io::read_file(dir.path("empty")), "");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.root()),
                          std::filesystem::directory_iterator()),
            2);

  expect_error([&] { io::write_file_atomically(dir.path("no/such/dir/f"), "x"); },
               dir.path("no/such/dir/f"));
  expect_error([&] { io::read_file(dir.path("missing")); }, dir.path("missing"));
  expect_error([&] { io::read_file(dir.path("missing")); }, std::strerror(ENOENT));
  expect_error([&] { io::read_file(dir.root()); }, dir.root());

  // require_writable: the errors write_file_atomically would raise, up front, leaving no file.
  expect_error([&] { io::require_writable(dir.path("no/such/f"), "--json"); },
               "--json: " + dir.path("no/such/f") + ": its folder does not exist");
  expect_error([&] { io::require_writable(dir.root(), "--json"); }, "is a directory");
  io::require_writable(dir.path("new.json"), "--json");
  EXPECT_FALSE(std::filesystem::exists(dir.path("new.json")));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.root()),
                          std::filesystem::directory_iterator()),
            2);
}

} // namespace
} // namespace minamp
