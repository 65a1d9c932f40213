// Image loading, resizing and PNG writing on stb_image / stb_image_write (whose implementations
// are compiled here, and only here), and the image-folder dataset.
#include "io/image.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "io/atomic_file.h"

namespace {

// What stb_image may reallocate to while it decodes one image on this thread, and whether it
// asked for more. Its only growing buffers are a PNG's compressed data (IDAT), gathered from the
// file, and that data inflated, which stb lets grow, doubling, past what the pixels need: a small
// file (deflate packs up to ~1000:1) would otherwise have it allocate gigabytes.
thread_local size_t stb_realloc_budget = SIZE_MAX;
thread_local bool stb_realloc_refused = false;

void* stb_realloc_within_budget(void* pointer, size_t size) {
  if (size > stb_realloc_budget) {
    stb_realloc_refused = true;
    return nullptr;
  }
  return realloc(pointer, size);
}

} // namespace

// Only the formats minamp reads, and no image larger than 2^14 on a side. stb's allocations are
// zeroed: what a file leaves unwritten (a progressive JPEG's coefficients that no scan codes, a
// component no scan covers) decodes as zeros, as libjpeg's do, not as what the memory held; its
// reallocations are held to the budget above.
#define STBI_MALLOC(size) calloc(1, size)
#define STBI_REALLOC(pointer, size) stb_realloc_within_budget(pointer, size)
#define STBI_FREE(pointer) free(pointer)
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_MAX_DIMENSIONS (1 << 14)
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_WRITE_IMPLEMENTATION
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wsign-compare"
#include <stb_image.h>
#include <stb_image_write.h>
#pragma GCC diagnostic pop

namespace minamp::io {

namespace fs = std::filesystem;

namespace {

// Decoded images are refused past this many pixels, before stb allocates anything for them.
constexpr int64_t kMaxPixels = int64_t(1) << 25;

void require_channels(int channels, const char* op) {
  require(channels == 1 || channels == 3, op, "channels must be 1 or 3, got ", channels);
}

// The source pixels and weights that make one output pixel along one axis.
struct Taps {
  int64_t first = 0;
  std::vector<float> weights;
};

// Triangle-filter taps for resampling `in_size` pixels to `out_size`. Pixel centres sit at
// i + 0.5; the filter radius is one source pixel when enlarging and the scale when shrinking.
std::vector<Taps> resize_taps(int64_t in_size, int64_t out_size) {
  const double scale = double(in_size) / double(out_size);
  const double radius = std::max(1.0, scale);
  std::vector<Taps> taps(static_cast<size_t>(out_size));
  for (int64_t o = 0; o < out_size; ++o) {
    const double centre = (o + 0.5) * scale - 0.5;
    const int64_t first = std::max<int64_t>(0, int64_t(std::ceil(centre - radius)));
    const int64_t last = std::min<int64_t>(in_size - 1, int64_t(std::floor(centre + radius)));
    Taps& t = taps[o];
    t.first = first;
    double total = 0;
    for (int64_t s = first; s <= last; ++s) {
      const double w = std::max(0.0, 1.0 - std::fabs(s - centre) / radius);
      t.weights.push_back(float(w));
      total += w;
    }
    for (float& w : t.weights) w = float(w / total);
  }
  return taps;
}

// Resamples axis 1 of a row-major [outer, in_size, inner] array to [outer, out_size, inner].
std::vector<float> resize_axis(const std::vector<float>& in, int64_t outer, int64_t in_size,
                               int64_t inner, int64_t out_size) {
  const std::vector<Taps> taps = resize_taps(in_size, out_size);
  std::vector<float> out(static_cast<size_t>(outer * out_size * inner), 0.0f);
  for (int64_t a = 0; a < outer; ++a)
    for (int64_t o = 0; o < out_size; ++o) {
      float* dst = &out[(a * out_size + o) * inner];
      const Taps& t = taps[o];
      for (size_t k = 0; k < t.weights.size(); ++k) {
        const float* src = &in[(a * in_size + t.first + int64_t(k)) * inner];
        for (int64_t c = 0; c < inner; ++c) dst[c] += t.weights[k] * src[c];
      }
    }
  return out;
}

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg";
}

// Entries of `dir` that pass `keep`, sorted by name; throws Error naming `dir` when it cannot be
// listed.
template <class Keep> std::vector<fs::path> sorted_entries(const fs::path& dir, Keep keep) {
  std::vector<fs::path> entries;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error))
    if (keep(*it)) entries.push_back(it->path());
  require(!error, "load_image_folder", dir.string(), ": cannot list it (", error.message(), ")");
  std::sort(entries.begin(), entries.end());
  return entries;
}

// Where a JPEG's start-of-image marker (0xd8 after one or more 0xff, as stb reads it) ends in
// `bytes`; 0 when they do not begin with one.
size_t jpeg_start_end(const std::string& bytes) {
  size_t pos = 0;
  while (pos < bytes.size() && static_cast<unsigned char>(bytes[pos]) == 0xff) ++pos;
  return pos > 0 && pos < bytes.size() && static_cast<unsigned char>(bytes[pos]) == 0xd8 ? pos + 1
                                                                                         : 0;
}

// A JPEG's bytes as stb reads them: zeros past the end of the file.
struct JpegBytes {
  const std::string& bytes;
  unsigned char operator[](size_t i) const {
    return i < bytes.size() ? static_cast<unsigned char>(bytes[i]) : 0;
  }
};

// The tables a JPEG's segments have defined so far, and its frame.
struct JpegTables {
  bool huffman[2][4] = {}; // [class: DC, AC][id]
  bool quantization[4] = {};
  int frame = 0;          // the frame's marker once seen: 0xc0/0xc1 sequential, 0xc2 progressive
  size_t frame_start = 0; // its segment's [length, precision, height, width, count, components]
};

// Records the tables of the DHT segment at `segment` (its length first): tables of [class/id, 16
// code counts, the codes' values]. As stb reads them: while the segment's length (which may run
// past the file) lasts, an id stb refuses not recorded. Says what is wrong, or "".
std::string record_huffman_tables(JpegBytes byte, size_t segment, JpegTables& tables) {
  size_t table = segment + 2;
  for (int64_t left = (int64_t(byte[segment]) << 8) + byte[segment + 1] - 2; left > 0;) {
    size_t codes = 0;
    for (size_t i = 1; i <= 16; ++i) codes += byte[table + i];
    if (codes > 256) return "a Huffman table has more than 256 codes";
    const int table_class = byte[table] >> 4, id = byte[table] & 15;
    if (table_class <= 1 && id <= 3) tables.huffman[table_class][id] = true;
    table += 17 + codes;
    left -= int64_t(17 + codes);
  }
  return "";
}

// The same for a DQT segment: tables of [precision/id, 64 values of 8 or 16 bits].
void record_quantization_tables(JpegBytes byte, size_t segment, JpegTables& tables) {
  size_t table = segment + 2;
  for (int64_t left = (int64_t(byte[segment]) << 8) + byte[segment + 1] - 2; left > 0;) {
    const size_t size = (byte[table] >> 4) != 0 ? 129 : 65;
    if ((byte[table] & 15) <= 3) tables.quantization[byte[table] & 15] = true;
    table += size;
    left -= int64_t(size);
  }
}

// What is wrong with the tables the scan whose SOS segment is at `segment` decodes with, or "".
// SOS: [length, count, count x (component, DC table << 4 | AC table), first and last coefficient,
// successive approximation]. A sequential scan decodes with both Huffman tables; a progressive
// one with the DC table in a first DC scan, the AC table in any AC scan, neither in a DC
// refinement. Each component takes the quantization table the frame gives it. stb refuses a
// scan before the frame, a table id past 3 and a component the frame does not have.
std::string scan_tables_problem(JpegBytes byte, size_t segment, const JpegTables& tables) {
  if (tables.frame == 0) return "";
  const int count = byte[segment + 2];
  const size_t spectral = segment + 3 + 2 * size_t(count);
  const bool ac_scan = byte[spectral] > 0, refinement = (byte[spectral + 2] >> 4) != 0;
  const bool uses_dc = tables.frame != 0xc2 || (!ac_scan && !refinement);
  const bool uses_ac = tables.frame != 0xc2 || ac_scan;
  for (int c = 0; c < count; ++c) {
    const int component = byte[segment + 3 + 2 * size_t(c)];
    const int huffman = byte[segment + 4 + 2 * size_t(c)], dc = huffman >> 4, ac = huffman & 15;
    if (dc > 3 || ac > 3) return "";
    if ((uses_dc && !tables.huffman[0][dc]) || (uses_ac && !tables.huffman[1][ac]))
      return "a scan uses a Huffman table that no DHT segment before it defines";
    for (int f = 0; f < byte[tables.frame_start + 7]; ++f) {
      const size_t frame_component = tables.frame_start + 8 + 3 * size_t(f);
      const int quantization = byte[frame_component + 2];
      if (byte[frame_component] == component && quantization <= 3 &&
          !tables.quantization[quantization])
        return "a scan uses a quantization table that no DQT segment before it defines";
    }
  }
  return "";
}

// What stb_image 2.27 (Debian's libstb-dev) does not check in a JPEG's tables: it writes past
// its Huffman tables when a DHT segment declares more than 256 codes (stb issue #1289, fixed
// upstream in 2.28), and it decodes a scan with a Huffman or quantization table that no segment
// has defined yet (a Huffman table's stale contents would send its reads out of bounds, a
// quantization table's give the pixels whatever the memory held). This walks the JPEG's marker
// segments as stb does and says what is wrong with its tables, or "" when nothing is (libjpeg
// refuses the same files); files that are not JPEG pass, for stb to judge.
std::string jpeg_tables_problem(const std::string& bytes) {
  const JpegBytes byte{bytes};
  size_t pos = jpeg_start_end(bytes);
  if (pos == 0) return "";
  JpegTables tables;
  while (pos + 4 <= bytes.size()) {
    const unsigned char marker = byte[pos + 1];
    if (byte[pos] != 0xff || marker == 0xff) { // entropy-coded data or fill bytes
      ++pos;
      continue;
    }
    const bool standalone = marker == 0x00 || marker == 0x01 || (marker >= 0xd0 && marker <= 0xd8);
    if (standalone) {
      pos += 2;
      continue;
    }
    if (marker == 0xd9) break; // end of image
    const size_t segment = pos + 2;
    if (marker >= 0xc0 && marker <= 0xc2 && tables.frame == 0) {
      tables.frame = marker;
      tables.frame_start = segment;
    }
    std::string problem;
    if (marker == 0xc4) problem = record_huffman_tables(byte, segment, tables);
    if (marker == 0xdb) record_quantization_tables(byte, segment, tables);
    if (marker == 0xda) problem = scan_tables_problem(byte, segment, tables);
    if (!problem.empty()) return problem;
    pos = std::max(segment + (size_t(byte[segment]) << 8) + byte[segment + 1], pos + 4);
  }
  return "";
}

// Readies a PNG's bytes for stb_image, which trusts two things it should not. It allocates for a
// data chunk (IDAT) as long as the chunk says it is before it finds the bytes missing: up to 2^31
// from a file of a few dozen. Returns false where a chunk runs past the end of the file (stb only
// decodes at the end chunk, IEND, so it could not have loaded such a file). And it copies an empty
// IDAT before any image data to a null pointer (memcpy's undefined behaviour, which lets the
// compiler drop stb's later "no IDAT" check): empty IDAT chunks, which hold nothing, are removed.
// Files that are not PNG pass unchanged, for stb to judge.
bool prepare_png_for_stb(std::string& bytes) {
  const std::string signature = "\x89PNG\r\n\x1a\n";
  if (bytes.compare(0, signature.size(), signature) != 0) return true;
  // One pass that moves each kept chunk down over the dropped ones: [signature.size(), kept) is
  // done, `next` is the next chunk read. A chunk: length (4 bytes, big-endian), type, data, CRC.
  size_t kept = signature.size(), next = kept;
  while (next + 8 <= bytes.size() && bytes.compare(next + 4, 4, "IEND") != 0) {
    uint64_t length = 0;
    for (size_t i = 0; i < 4; ++i)
      length = (length << 8) | static_cast<unsigned char>(bytes[next + i]);
    if (length > bytes.size() - next - 8) return false;
    const size_t chunk = std::min(size_t(length) + 12, bytes.size() - next); // its CRC may be cut
    if (length != 0 || bytes.compare(next + 4, 4, "IDAT") != 0) {
      if (kept != next)
        std::copy(bytes.begin() + next, bytes.begin() + next + chunk, bytes.begin() + kept);
      kept += chunk;
    }
    next += chunk;
  }
  bytes.erase(kept, next - kept);
  return true;
}

// stb's reason for its last failure on this thread, or a stand-in where it gave none.
const char* failure_reason() {
  const char* reason = stbi_failure_reason();
  return reason ? reason : "no reason given";
}

// Why stb could not decode `bytes`: its reason, but where its JPEG decoder gave none (data cut
// short), the one its PNG probe left ("bad png sig") would mislead.
std::string decode_failure_reason(const std::string& bytes) {
  const std::string reason = failure_reason();
  return jpeg_start_end(bytes) > 0 && reason == "bad png sig" ? "corrupt or truncated JPEG data"
                                                              : reason;
}

// The bytes of the image file at `path`, checked as far as can be without decoding its pixels:
// a size stb can take, a JPEG's tables, a PNG's chunk lengths, a PNG or JPEG header stb
// reads (its size in `width` and `height`) and at most kMaxPixels pixels; a PNG's empty data
// chunks are removed. Throws Error naming the file and `op`.
std::string read_image_header(const std::string& path, const char* op, int& width, int& height) {
  std::string bytes = read_file(path);
  require(bytes.size() <= size_t(INT_MAX), op, path, ": file too large");
  const std::string tables_problem = jpeg_tables_problem(bytes);
  require(tables_problem.empty(), op, path, ": corrupt JPEG (", tables_problem, ")");
  require(prepare_png_for_stb(bytes), op, path,
          ": corrupt or truncated PNG (a chunk's length runs past the end of the file)");
  // Each stb call runs before stbi_failure_reason() is read (a function's arguments are evaluated
  // in no fixed order: read within one require(), the reason could be the previous call's).
  int file_channels = 0;
  const bool readable =
      stbi_info_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()), int(bytes.size()),
                            &width, &height, &file_channels) == 1;
  require(readable, op, path, ": not a readable PNG or JPEG (", failure_reason(), ")");
  require(int64_t(width) * height <= kMaxPixels, op, path, ": ", width, "x", height,
          " pixels is more than ", kMaxPixels);
  return bytes;
}

// Holds stb's reallocations, while it lives, to twice what decoding `file_bytes` of a `width` x
// `height` image can need, and at least 1 MiB: the file's bytes, or the most its pixels inflate to
// (8 bytes a pixel, 16-bit RGBA, and a filter byte a row). stb starts the inflated buffer at the
// size its pixels need and doubles it when the data runs on: an interlaced image's passes take a
// few bytes a row more, and some writers pad.
class StbReallocBudget {
public:
  StbReallocBudget(size_t file_bytes, int width, int height) {
    const size_t inflated = size_t(8) * size_t(width) * size_t(height) + size_t(height);
    stb_realloc_budget = std::max(size_t(1) << 20, 2 * std::max(file_bytes, inflated));
    stb_realloc_refused = false;
  }
  ~StbReallocBudget() { stb_realloc_budget = SIZE_MAX; }
  StbReallocBudget(const StbReallocBudget&) = delete;
  StbReallocBudget& operator=(const StbReallocBudget&) = delete;
};

void append_png_bytes(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), size_t(size));
}

} // namespace

Tensor load_image(const std::string& path, int channels) {
  require_channels(channels, "load_image");
  int width = 0, height = 0, file_channels = 0;
  const std::string bytes = read_image_header(path, "load_image", width, height);
  stbi_uc* pixels = nullptr;
  {
    const StbReallocBudget budget(bytes.size(), width, height);
    pixels = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(bytes.data()),
                                   int(bytes.size()), &width, &height, &file_channels, channels);
  }
  require(pixels != nullptr || !stb_realloc_refused, "load_image", path,
          ": corrupt PNG (its image data inflates to far more than ", width, "x", height,
          " pixels hold)");
  require(pixels != nullptr, "load_image", path, ": cannot decode (", decode_failure_reason(bytes),
          ")");
  Tensor image = Tensor::empty({height, width, channels});
  float* out = image.data<float>();
  for (int64_t i = 0; i < image.numel(); ++i) out[i] = pixels[i] / 255.0f;
  stbi_image_free(pixels);
  return image;
}

void check_image_header(const std::string& path) {
  int width = 0, height = 0;
  read_image_header(path, "load_image", width, height);
}

Tensor resize_image(const Tensor& image, int64_t height, int64_t width) {
  require(image.dtype() == DType::f32 && image.device() == Device::cpu && image.shape().rank() == 3,
          "resize_image", "expected a host f32 [H, W, C] image, got ", describe(image));
  require(height > 0 && width > 0, "resize_image", "target size must be positive, got ", height,
          "x", width);
  const int64_t in_h = image.shape()[0], in_w = image.shape()[1], c = image.shape()[2];
  require(in_h > 0 && in_w > 0, "resize_image", "cannot resize an empty image ", describe(image));
  const float* src = image.data<float>();
  const std::vector<float> pixels(src, src + image.numel());
  const std::vector<float> rows_done = resize_axis(pixels, in_h, in_w, c, width);
  const std::vector<float> resized = resize_axis(rows_done, 1, in_h, width * c, height);
  Tensor out = Tensor::empty({height, width, c});
  std::copy(resized.begin(), resized.end(), out.data<float>());
  return out;
}

std::string encode_png(const uint8_t* pixels, int width, int height, int channels) {
  std::string png;
  const int ok = stbi_write_png_to_func(append_png_bytes, &png, width, height, channels, pixels,
                                        width * channels);
  require(ok != 0, "encode_png", "cannot encode a ", width, "x", height, "x", channels, " image");
  return png;
}

void save_png(const std::string& path, const Tensor& image) {
  require(image.dtype() == DType::f32 && image.device() == Device::cpu &&
              image.shape().rank() == 3 && (image.shape()[2] == 1 || image.shape()[2] == 3),
          "save_png", path, ": expected a host f32 [H, W, 1 or 3] image, got ", describe(image));
  std::vector<uint8_t> bytes(static_cast<size_t>(image.numel()));
  const float* src = image.data<float>();
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = uint8_t(std::lround(std::clamp(src[i], 0.0f, 1.0f) * 255.0f));
  const std::string png =
      encode_png(bytes.data(), int(image.shape()[1]), int(image.shape()[0]), int(image.shape()[2]));
  write_file_atomically(path, png);
}

ImageFolderFiles list_image_folder(const std::string& root) {
  std::error_code ignored; // an entry that cannot be examined is not one of the dataset's
  require(fs::is_directory(root, ignored), "load_image_folder", root, ": not a directory");
  const std::vector<fs::path> class_dirs =
      sorted_entries(root, [&](const fs::directory_entry& e) { return e.is_directory(ignored); });
  require(!class_dirs.empty(), "load_image_folder", root, ": no class subdirectories");
  ImageFolderFiles folder;
  for (const fs::path& dir : class_dirs) {
    const std::vector<fs::path> files =
        sorted_entries(dir, [&](const fs::directory_entry& e) { return is_image_file(e.path()); });
    require(!files.empty(), "load_image_folder", dir.string(), ": class has no .png/.jpg images");
    for (const fs::path& file : files) {
      // Named as an image, so meant as one: a dangling link, a FIFO or a folder is refused.
      require(fs::is_regular_file(file, ignored), "load_image_folder", file.string(),
              ": not a regular file",
              fs::is_symlink(file, ignored) && !fs::exists(file, ignored) ? " (a link to nothing)"
                                                                          : "");
      folder.files.push_back(file.string());
      folder.labels.push_back(int32_t(folder.classes.size()));
    }
    folder.classes.push_back(dir.filename().string());
  }
  return folder;
}

ImageFolder load_image_folder(const std::string& root, int64_t size, int channels) {
  require_channels(channels, "load_image_folder");
  require(size > 0, "load_image_folder", root, ": image size must be positive, got ", size);
  const ImageFolderFiles listed = list_image_folder(root);
  ImageFolder folder{listed.classes, listed.files, {}, {}};
  const int64_t n = int64_t(listed.files.size()), per_image = size * size * channels;
  folder.images = Tensor::empty({n, size, size, channels});
  folder.labels = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) {
    const Tensor image = resize_image(load_image(listed.files[i], channels), size, size);
    std::copy_n(image.data<float>(), per_image, folder.images.data<float>() + i * per_image);
    folder.labels.data<int32_t>()[i] = listed.labels[i];
  }
  return folder;
}

} // namespace minamp::io
