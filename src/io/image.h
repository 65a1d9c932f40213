// Images as f32 tensors [H, W, C] with values in [0, 1], C = 1 (grey) or 3 (RGB): loading PNG
// and JPEG files (stb_image), resizing, writing PNG (stb_image_write), and an image-folder
// dataset (ROOT/<class>/<image>, one class per subdirectory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace minamp::io {

// Decodes a PNG or JPEG file into f32 [H, W, channels]; grey images are repeated into RGB and
// RGB turned into grey by stb's luma weights (0.30, 0.59, 0.11) as needed, alpha is dropped. Throws
// Error naming the file.
Tensor load_image(const std::string& path, int channels);

// Checks the image file at `path` as load_image does before it decodes the pixels (a readable
// PNG or JPEG header, a size within the pixel limit, a JPEG's Huffman tables), so that a data set
// read lazily is checked up front. Throws Error naming the file.
void check_image_header(const std::string& path);

// Resamples f32 [H, W, C] to [height, width, C] with a triangle (bilinear) filter whose width
// grows with the downscale factor, so shrinking averages every source pixel (no aliasing).
Tensor resize_image(const Tensor& image, int64_t height, int64_t width);

// PNG bytes for u8 pixels [height, width, channels] (channels 1-4), row-major.
std::string encode_png(const uint8_t* pixels, int width, int height, int channels);

// Writes f32 [H, W, C] (C = 1 or 3), clamped to [0, 1] and rounded to 8 bits, as a PNG file,
// atomically.
void save_png(const std::string& path, const Tensor& image);

// An image-folder dataset: labels[i] indexes `classes`, files[i] is the image behind row i.
struct ImageFolder {
  std::vector<std::string> classes; // subdirectory names, sorted
  std::vector<std::string> files;
  Tensor images; // f32 [N, size, size, channels], NHWC
  Tensor labels; // i32 [N]
};

// The files of an image folder, not decoded: labels[i] indexes `classes` for files[i].
struct ImageFolderFiles {
  std::vector<std::string> classes; // subdirectory names, sorted
  std::vector<std::string> files;   // by class, then by name
  std::vector<int32_t> labels;
};

// Lists ROOT/<class>/*.{png,jpg,jpeg} (extensions in any case; other files are ignored), classes
// and images sorted by name. Throws Error for a missing root, no class subdirectories, a class
// without images, or an entry named as an image that is not a regular file (a dangling link).
ImageFolderFiles list_image_folder(const std::string& root);

// Reads ROOT/<class>/*.{png,jpg,jpeg} (extensions in any case; other files are ignored), classes
// and images sorted by name, each image resized to size x size. Throws Error for a missing root,
// no class subdirectories, a class without images, or an image that cannot be decoded.
ImageFolder load_image_folder(const std::string& root, int64_t size, int channels);

} // namespace minamp::io
