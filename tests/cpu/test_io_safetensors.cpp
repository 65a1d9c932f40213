// Tests for io/safetensors: round trips of every dtype with metadata, the byte layout that
// PyTorch's safetensors reads, reading a file built by hand from the spec, lookup errors, and
// corrupt files (specific corruptions, random truncations and bit flips).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "test_io_util.h"
#include "test_util.h"

namespace minamp {
namespace {

using io::NamedInt64s;
using io::NamedTensor;
using nlohmann::json;

std::string raw_bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

std::vector<NamedTensor> sample_tensors(Rng& rng) {
  return {{"linear.weight", test::random_tensor(rng, {3, 5})},
          {"linear.weight_f16", test::random_tensor(rng, {4}, DType::f16)},
          {"linear.weight_bf16", test::random_tensor(rng, {5}, DType::bf16)},
          {"indices", test::random_tensor(rng, {2, 2, 3}, DType::i32, Device::cpu, -100, 100)},
          {"conv.weight", test::random_tensor(rng, {2, 3, 3, 1})},
          {"scalar", test::random_tensor(rng, {})},
          {"empty", Tensor::empty({0, 3})}};
}

std::vector<NamedInt64s> sample_int64s() {
  return {{"bn.num_batches_tracked", {}, {12345678901234}},
          {"counts", {3}, {-1, 0, int64_t(1) << 40}},
          {"no_counts", {0, 4}, {}}};
}

// The JSON header of a safetensors file, parsed here independently of the reader.
json header_of(const std::string& bytes) {
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return json::parse(bytes.substr(8, length));
}

// A file assembled by hand: 8-byte length, `header`, then `data`.
std::string assemble(const json& header, const std::string& data) {
  const std::string text = header.dump();
  const uint64_t length = text.size();
  std::string bytes(reinterpret_cast<const char*>(&length), 8);
  return bytes + text + data;
}

std::string float_bytes(std::vector<float> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

// Expects load_safetensors(path) to throw Error whose message names the file and contains
// `fragment`.
void expect_load_error(const std::string& path, const std::string& fragment) {
  test::expect_error([&] { io::load_safetensors(path); }, path, fragment);
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  test::TempDir dir;
  Rng rng(1);
  const std::vector<NamedTensor> tensors = sample_tensors(rng);
  const io::Metadata metadata{{"format", "pt"}, {"step", "7"}};
  const std::string path = dir.path("model.safetensors");
  io::save_safetensors(path, tensors, metadata, sample_int64s());

  const io::SafetensorsFile file = io::load_safetensors(path);
  EXPECT_EQ(file.metadata, metadata);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const NamedTensor& want : tensors) {
    const Tensor& got = file.tensor(want.name);
    EXPECT_EQ(got.shape(), want.tensor.shape()) << want.name;
    EXPECT_EQ(got.dtype(), want.tensor.dtype()) << want.name;
    EXPECT_EQ(raw_bytes(got), raw_bytes(want.tensor)) << want.name;
  }
  for (const NamedInt64s& want : sample_int64s()) {
    const NamedInt64s& got = file.int64s_named(want.name);
    EXPECT_EQ(got.shape, want.shape);
    EXPECT_EQ(got.values, want.values);
  }
}

TEST(Safetensors, WritesTheLayoutPyTorchReads) {
  test::TempDir dir;
  Rng rng(2);
  const std::string path = dir.path("layout.safetensors");
  io::save_safetensors(path, sample_tensors(rng), {{"format", "pt"}}, sample_int64s());
  const std::string bytes = io::read_file(path);

  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u); // the header is padded so that the data is 8-byte aligned
  EXPECT_EQ(bytes[8], '{');
  const json header = header_of(bytes);
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["bn.num_batches_tracked"]["dtype"], "I64");
  EXPECT_EQ(header["bn.num_batches_tracked"]["shape"], json::array());
  EXPECT_EQ(header["linear.weight_f16"]["dtype"], "F16");
  EXPECT_EQ(header["linear.weight_bf16"]["dtype"], "BF16");
  EXPECT_EQ(header["indices"]["shape"], json({2, 2, 3}));

  // The entries tile the data block exactly: no gaps, no overlaps, nothing after the last.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& item : header.items())
    if (item.key() != "__metadata__")
      ranges.push_back({item.value()["data_offsets"][0], item.value()["data_offsets"][1]});
  std::sort(ranges.begin(), ranges.end());
  uint64_t end = 0;
  for (const auto& [begin, stop] : ranges) {
    EXPECT_EQ(begin, end);
    end = stop;
  }
  EXPECT_EQ(8 + header_length + end, bytes.size());
}

TEST(Safetensors, ReadsAFileBuiltFromTheSpec) {
  test::TempDir dir;
  const std::string path = dir.path("by_hand.safetensors");
  const int64_t step = 42;
  const std::string data =
      float_bytes({1.5f, -2.0f, 0.25f}) + std::string(reinterpret_cast<const char*>(&step), 8);
  json header = {{"b", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 12}}}},
                 {"a", {{"dtype", "I64"}, {"shape", json::array()}, {"data_offsets", {12, 20}}}},
                 {"__metadata__", {{"note", "hand made"}}}};
  test::write_bytes(path, assemble(header, data));

  const io::SafetensorsFile file = io::load_safetensors(path);
  EXPECT_EQ(file.tensor("b").to_vector(), (std::vector<float>{1.5f, -2.0f, 0.25f}));
  EXPECT_EQ(file.int64s_named("a").values, std::vector<int64_t>{42});
  EXPECT_EQ(file.metadata.at("note"), "hand made");
  EXPECT_TRUE(file.has_tensor("b"));
  EXPECT_FALSE(file.has_tensor("a"));
  EXPECT_TRUE(file.has_int64s("a"));
}

TEST(Safetensors, MissingNameErrorNamesFileAndEntry) {
  test::TempDir dir;
  Rng rng(3);
  const std::string path = dir.path("lookup.safetensors");
  io::save_safetensors(path, sample_tensors(rng));
  const io::SafetensorsFile file = io::load_safetensors(path);
  test::expect_error([&] { file.tensor("no.such.weight"); }, path, "no.such.weight");
  EXPECT_THROW(file.int64s_named("linear.weight"), Error);
}

TEST(Safetensors, SaveRejectsBadNamesAndKeepsThePreviousFile) {
  test::TempDir dir;
  const std::string path = dir.path("keep.safetensors");
  const Tensor t = Tensor::from_vector({1, 2}, {2});
  io::save_safetensors(path, {{"w", t}});
  const std::string before = io::read_file(path);

  EXPECT_THROW(io::save_safetensors(path, {{"w", t}, {"w", t}}), Error);
  EXPECT_THROW(io::save_safetensors(path, {{"", t}}), Error);
  EXPECT_THROW(io::save_safetensors(path, {{"__metadata__", t}}), Error);
  EXPECT_THROW(io::save_safetensors(path, {{"w", t}}, {}, {{"w", {1}, {5}}}), Error);
  EXPECT_THROW(io::save_safetensors(path, {}, {}, {{"n", {2, 2}, {1, 2, 3}}}), Error);
  EXPECT_THROW(io::save_safetensors(path, {}, {}, {{"n", {-1, -2}, {1, 2}}}), Error);
  EXPECT_THROW(io::save_safetensors(path, {{"u", Tensor()}}), Error);
  EXPECT_EQ(io::read_file(path), before);
  // Nothing but the file itself is left in the directory (no temp files).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.root()),
                          std::filesystem::directory_iterator()),
            1);
}

TEST(Safetensors, SpecificCorruptionsNameTheFileAndTheProblem) {
  test::TempDir dir;
  const std::string path = dir.path("bad.safetensors");
  const std::string data = float_bytes({1, 2, 3, 4});
  auto entry = [](const char* dtype, json shape, uint64_t begin, uint64_t end) {
    return json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
  };

  std::string bytes = assemble({{"w", entry("F32", {4}, 0, 16)}}, data);
  bytes[0] = char(0xff); // header length far past the end of the file
  test::write_bytes(path, bytes);
  expect_load_error(path, "header length");

  test::write_bytes(path, "abc");
  expect_load_error(path, "shorter than the 8-byte header length");

  test::write_bytes(path, assemble({{"w", entry("F16", {4}, 0, 16)}}, data));
  expect_load_error(path, "do not hold F16");
  // Fewer bytes than the shape needs (though the data block would hold it): reading the entry
  // would run into the next one.
  test::write_bytes(
      path, assemble({{"a", entry("F32", {3}, 0, 8)}, {"b", entry("F32", {2}, 8, 16)}}, data));
  expect_load_error(path, "entry 'a': 8 bytes do not hold F32");

  test::write_bytes(path, assemble({{"w", entry("F8_E4M3", {16}, 0, 16)}}, data));
  expect_load_error(path, "unsupported dtype 'F8_E4M3'");

  test::write_bytes(path, assemble({{"w", entry("F32", {8}, 0, 32)}}, data));
  expect_load_error(path, "lie outside");

  test::write_bytes(
      path, assemble({{"a", entry("F32", {3}, 0, 12)}, {"b", entry("F32", {2}, 8, 16)}}, data));
  expect_load_error(path, "overlaps");

  // The entries must tile the data block, as the safetensors library requires.
  test::write_bytes(
      path, assemble({{"a", entry("F32", {1}, 0, 4)}, {"b", entry("F32", {2}, 8, 16)}}, data));
  expect_load_error(path, "entry 'b' starts at byte 8, leaving a gap after byte 4");
  test::write_bytes(path, assemble({{"w", entry("F32", {3}, 0, 12)}}, data));
  expect_load_error(path, "the 16-byte data block has 4 bytes after its last entry");

  test::write_bytes(path, assemble({{"w", entry("F32", {1, 1, 1, 2, 2}, 0, 16)}}, data));
  expect_load_error(path, "entry 'w' has 5 dimensions");

  test::write_bytes(path, assemble({{"w", entry("F32", {-4}, 0, 16)}}, data));
  expect_load_error(path, "not a dimension");

  test::write_bytes(path, assemble({{"w", entry("F32", {uint64_t(1) << 62, 4}, 0, 16)}}, data));
  expect_load_error(path, "do not hold F32");
  // 2^63 does not fit a dimension, even beside a 0 that makes the entry empty.
  test::write_bytes(path, assemble({{"w", entry("F32", {uint64_t(1) << 63, 0}, 0, 0)}}, ""));
  expect_load_error(path, "not a dimension: 9223372036854775808");

  json three_offsets = entry("F32", {4}, 0, 16);
  three_offsets["data_offsets"] = {0, 16, 16};
  test::write_bytes(path, assemble({{"w", three_offsets}}, data));
  expect_load_error(path, "needs 'data_offsets' [begin, end]");

  test::write_bytes(path, assemble({{"__metadata__", {{"k", 3}}}}, ""));
  expect_load_error(path, "metadata 'k' is not a string");

  const std::string duplicated = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                 R"("w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  const uint64_t length = duplicated.size();
  test::write_bytes(path,
                    std::string(reinterpret_cast<const char*>(&length), 8) + duplicated + data);
  expect_load_error(path, "duplicate entry 'w'");

  const std::string not_json = "{\"w\": [1, 2";
  const uint64_t not_json_length = not_json.size();
  test::write_bytes(path,
                    std::string(reinterpret_cast<const char*>(&not_json_length), 8) + not_json);
  expect_load_error(path, "not valid JSON");

  // A valid header with a NUL byte and more after it, and one behind a byte-order mark.
  const std::string valid = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  for (const auto& [header, message] :
       {std::pair<std::string, std::string>{valid + std::string(1, '\0') + "junk",
                                            "header holds a NUL byte at byte 63"},
        {"\xEF\xBB\xBF" + valid, "header starts with a byte-order mark"}}) {
    const uint64_t header_length = header.size();
    test::write_bytes(path, std::string(reinterpret_cast<const char*>(&header_length), 8) + header +
                                data);
    expect_load_error(path, message);
  }

  expect_load_error(dir.path("missing.safetensors"), "cannot open");
}

TEST(Safetensors, RandomTruncationsAndBitFlipsLoadOrThrowError) {
  test::TempDir dir;
  Rng rng(4);
  const std::string valid_path = dir.path("valid.safetensors");
  io::save_safetensors(valid_path, sample_tensors(rng), {{"format", "pt"}}, sample_int64s());
  const std::string valid = io::read_file(valid_path);
  auto load = [](const std::string& path) { io::load_safetensors(path); };

  const test::FuzzCounts truncated =
      test::fuzz_truncations(valid, dir.path("cut.safetensors"), load, rng, 150);
  EXPECT_EQ(truncated.loaded, 0) << "a truncated file must not load";

  uint64_t header_length = 0;
  std::memcpy(&header_length, valid.data(), 8);
  const test::FuzzCounts flipped = test::fuzz_bit_flips(valid, dir.path("flip.safetensors"), load,
                                                        rng, 300, size_t(8 + header_length));
  EXPECT_GT(flipped.rejected, 0);
  EXPECT_GT(flipped.loaded, 0); // flips in the raw data are not detectable, and load
}

} // namespace
} // namespace minamp
