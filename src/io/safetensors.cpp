// safetensors writer and validating reader (see safetensors.h for the layout).
#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/utf8.h"

namespace minamp::io {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors: the raw data is little-endian, as is this host's memory");

namespace {

using nlohmann::json;

constexpr const char* kMetadataKey = "__metadata__";
constexpr size_t kLengthBytes = 8;

// Throws Error("load_safetensors: <path>: <message>") when `ok` is false.
template <class... Parts>
void check_file(bool ok, const std::string& path, const Parts&... message) {
  require(ok, "load_safetensors", path, ": ", message...);
}

} // namespace

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
  case DType::f32: return "F32";
  case DType::f16: return "F16";
  case DType::bf16: return "BF16";
  case DType::i32: return "I32";
  }
  return "?";
}

namespace {

// Bytes per element of a safetensors dtype name, or 0 when minamp does not read it.
size_t element_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "I64") return 8;
  return 0;
}

DType minamp_dtype(const std::string& dtype) {
  if (dtype == "F16") return DType::f16;
  if (dtype == "BF16") return DType::bf16;
  if (dtype == "I32") return DType::i32;
  return DType::f32;
}

// The product of `dims`, or false when it exceeds `limit` (checked without overflow).
bool product_within(const std::vector<int64_t>& dims, uint64_t limit, uint64_t& product) {
  product = 1;
  for (int64_t d : dims)
    if (d == 0) product = 0;
  if (product == 0) return true;
  for (int64_t d : dims) {
    if (product > limit / static_cast<uint64_t>(d)) return false;
    product *= static_cast<uint64_t>(d);
  }
  return true;
}

Shape shape_from_dims(const std::vector<int64_t>& d) {
  switch (d.size()) {
  case 0: return Shape{};
  case 1: return Shape{d[0]};
  case 2: return Shape{d[0], d[1]};
  case 3: return Shape{d[0], d[1], d[2]};
  default: return Shape{d[0], d[1], d[2], d[3]};
  }
}

// ---- writing ----

// Names and metadata go into the JSON header, which must be UTF-8.
void check_names(const std::string& path, const std::vector<NamedTensor>& tensors,
                 const std::vector<NamedInt64s>& int64s, const Metadata& metadata) {
  std::set<std::string> seen;
  auto check = [&](const std::string& name) {
    require(!name.empty(), "save_safetensors", path, ": an entry has an empty name");
    require(is_valid_utf8(name), "save_safetensors", path, ": entry name '", escape_to_utf8(name),
            "' is not valid UTF-8");
    require(name != kMetadataKey, "save_safetensors", path, ": '", kMetadataKey,
            "' is reserved for metadata");
    require(seen.insert(name).second, "save_safetensors", path, ": duplicate name '", name, "'");
  };
  for (const NamedTensor& t : tensors) check(t.name);
  for (const NamedInt64s& e : int64s) check(e.name);
  for (const auto& [key, value] : metadata)
    require(is_valid_utf8(key) && is_valid_utf8(value), "save_safetensors", path, ": metadata '",
            escape_to_utf8(key), "' = '", escape_to_utf8(value), "' is not valid UTF-8");
}

// Appends `bytes` bytes at `src` to `data` and records the entry in `header`.
void append_entry(json& header, std::string& data, const std::string& name, const char* dtype,
                  const std::vector<int64_t>& shape, const void* src, size_t bytes) {
  const size_t begin = data.size();
  if (bytes > 0) data.append(static_cast<const char*>(src), bytes);
  header[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, data.size()}}};
}

void append_tensor(json& header, std::string& data, const std::string& path,
                   const NamedTensor& entry) {
  require(entry.tensor.defined(), "save_safetensors", path, ": tensor '", entry.name,
          "' is undefined");
  const Tensor host =
      entry.tensor.device() == Device::cpu ? entry.tensor : entry.tensor.to(Device::cpu);
  std::vector<int64_t> shape;
  for (int i = 0; i < host.shape().rank(); ++i) shape.push_back(host.shape()[i]);
  append_entry(header, data, entry.name, safetensors_dtype(host.dtype()), shape, host.raw(),
               host.nbytes());
}

void append_int64s(json& header, std::string& data, const std::string& path,
                   const NamedInt64s& entry) {
  uint64_t count = 0;
  const bool dims_ok =
      std::all_of(entry.shape.begin(), entry.shape.end(), [](int64_t d) { return d >= 0; });
  require(dims_ok && product_within(entry.shape, entry.values.size(), count) &&
              count == entry.values.size(),
          "save_safetensors", path, ": int64 entry '", entry.name, "' has ", entry.values.size(),
          " values for its shape");
  append_entry(header, data, entry.name, "I64", entry.shape, entry.values.data(),
               entry.values.size() * sizeof(int64_t));
}

std::string little_endian_u64(uint64_t value) {
  std::string bytes(kLengthBytes, '\0');
  for (size_t i = 0; i < kLengthBytes; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// ---- reading ----

uint64_t read_little_endian_u64(const std::string& bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < kLengthBytes; ++i)
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return value;
}

// Parses the JSON header, refusing duplicate top-level names (which JSON parsers would
// otherwise silently merge), and what the format's JSON text is not: a NUL byte (the JSON parser
// would stop reading there) or a byte-order mark (which safetensors' own parser refuses).
json parse_header(const std::string& path, const std::string& text) {
  check_file(text.find('\0') == std::string::npos, path, "header holds a NUL byte at byte ",
             kLengthBytes + text.find('\0'), " (it is JSON text, padded with spaces)");
  check_file(text.rfind("\xEF\xBB\xBF", 0) != 0, path,
             "header starts with a byte-order mark (it is JSON text, which has none)");
  std::set<std::string> names;
  std::vector<std::string> duplicates;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 &&
        !names.insert(parsed.get<std::string>()).second)
      duplicates.push_back(parsed.get<std::string>());
    return true;
  };
  json header;
  try {
    header = json::parse(text, on_event);
  } catch (const json::exception& e) {
    throw Error(cat("load_safetensors: ", path, ": header is not valid JSON (", e.what(), ")"));
  }
  check_file(duplicates.empty(), path, "duplicate entry '", duplicates.empty() ? "" : duplicates[0],
             "' in the header");
  check_file(header.is_object(), path, "header is not a JSON object");
  return header;
}

// One entry as the header describes it, before its offsets are checked against the data.
struct EntrySpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

EntrySpec parse_entry(const std::string& path, const std::string& name, const json& value) {
  EntrySpec spec;
  spec.name = name;
  const std::string where = cat("entry '", name, "'");
  check_file(value.is_object(), path, where, " is not a JSON object");
  const auto dtype = value.find("dtype");
  check_file(dtype != value.end() && dtype->is_string(), path, where, " has no string 'dtype'");
  spec.dtype = dtype->get<std::string>();
  check_file(element_size(spec.dtype) != 0, path, where, " has unsupported dtype '", spec.dtype,
             "' (expected F32, F16, BF16, I32 or I64)");

  const auto shape = value.find("shape");
  check_file(shape != value.end() && shape->is_array(), path, where, " has no 'shape' array");
  for (const json& dim : *shape) {
    check_file(dim.is_number_unsigned() &&
                   dim.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()),
               path, where, " has a shape entry that is not a dimension: ", dim.dump());
    spec.shape.push_back(dim.get<int64_t>());
  }

  const auto offsets = value.find("data_offsets");
  check_file(offsets != value.end() && offsets->is_array() && offsets->size() == 2 &&
                 (*offsets)[0].is_number_unsigned() && (*offsets)[1].is_number_unsigned(),
             path, where, " needs 'data_offsets' [begin, end] of two unsigned integers");
  spec.begin = (*offsets)[0].get<uint64_t>();
  spec.end = (*offsets)[1].get<uint64_t>();
  return spec;
}

// Checks that every entry's bytes lie inside the data block and hold exactly dtype * shape, and
// that the entries tile the block (no overlap, no gap, nothing after the last). Sorts `specs` by
// offset.
void check_offsets(const std::string& path, std::vector<EntrySpec>& specs, uint64_t data_size) {
  std::sort(specs.begin(), specs.end(), [](const EntrySpec& a, const EntrySpec& b) {
    return std::pair(a.begin, a.end) < std::pair(b.begin, b.end); // empty ones first
  });
  uint64_t previous_end = 0;
  for (const EntrySpec& spec : specs) {
    const std::string where = cat("entry '", spec.name, "'");
    check_file(spec.begin <= spec.end && spec.end <= data_size, path, where, " data_offsets [",
               spec.begin, ", ", spec.end, "] lie outside the ", data_size, "-byte data block");
    check_file(spec.begin >= previous_end, path, where, " overlaps the previous entry");
    // As the safetensors library's validation: the entries tile the data block, with no gap.
    check_file(spec.begin == previous_end, path, where, " starts at byte ", spec.begin,
               ", leaving a gap after byte ", previous_end, " of the data block");
    const size_t size = element_size(spec.dtype);
    uint64_t count = 0;
    check_file(product_within(spec.shape, data_size / size, count) &&
                   count * size == spec.end - spec.begin,
               path, where, ": ", spec.end - spec.begin, " bytes do not hold ", spec.dtype,
               " of its shape");
    previous_end = spec.end;
  }
  check_file(previous_end == data_size, path, "the ", data_size, "-byte data block has ",
             data_size - previous_end, " bytes after its last entry");
}

Tensor make_tensor(const std::string& path, const EntrySpec& spec, const char* data) {
  check_file(spec.shape.size() <= size_t(Shape::kMaxRank), path, "entry '", spec.name, "' has ",
             spec.shape.size(), " dimensions; minamp tensors have at most ", Shape::kMaxRank);
  Tensor tensor = Tensor::empty(shape_from_dims(spec.shape), minamp_dtype(spec.dtype));
  if (tensor.nbytes() > 0) std::memcpy(tensor.raw(), data + spec.begin, tensor.nbytes());
  return tensor;
}

NamedInt64s make_int64s(const EntrySpec& spec, const char* data) {
  NamedInt64s entry{spec.name, spec.shape, {}};
  entry.values.resize((spec.end - spec.begin) / sizeof(int64_t));
  if (!entry.values.empty())
    std::memcpy(entry.values.data(), data + spec.begin, spec.end - spec.begin);
  return entry;
}

Metadata parse_metadata(const std::string& path, const json& value) {
  check_file(value.is_object(), path, "'", kMetadataKey, "' is not a JSON object");
  Metadata metadata;
  for (const auto& item : value.items()) {
    check_file(item.value().is_string(), path, "metadata '", item.key(), "' is not a string");
    metadata[item.key()] = item.value().get<std::string>();
  }
  return metadata;
}

} // namespace

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const Metadata& metadata, const std::vector<NamedInt64s>& int64s) {
  check_names(path, tensors, int64s, metadata);
  json header = json::object();
  std::string data;
  for (const NamedTensor& entry : tensors) append_tensor(header, data, path, entry);
  for (const NamedInt64s& entry : int64s) append_int64s(header, data, path, entry);
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string header_text = header.dump();
  header_text.append((kLengthBytes - header_text.size() % kLengthBytes) % kLengthBytes, ' ');
  write_file_atomically(path, little_endian_u64(header_text.size()) + header_text + data);
}

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string bytes = read_file(path);
  check_file(bytes.size() >= kLengthBytes, path, "file is ", bytes.size(),
             " bytes, shorter than the 8-byte header length");
  const uint64_t header_length = read_little_endian_u64(bytes);
  check_file(header_length <= bytes.size() - kLengthBytes, path, "header length ", header_length,
             " runs past the end of the ", bytes.size(), "-byte file");
  const json header = parse_header(path, bytes.substr(kLengthBytes, header_length));

  SafetensorsFile file;
  file.path = path;
  std::vector<EntrySpec> specs;
  for (const auto& item : header.items()) {
    if (item.key() == kMetadataKey)
      file.metadata = parse_metadata(path, item.value());
    else
      specs.push_back(parse_entry(path, item.key(), item.value()));
  }
  const char* data = bytes.data() + kLengthBytes + header_length;
  check_offsets(path, specs, bytes.size() - kLengthBytes - header_length);
  for (const EntrySpec& spec : specs) {
    if (spec.dtype == "I64")
      file.int64s.push_back(make_int64s(spec, data));
    else
      file.tensors.push_back({spec.name, make_tensor(path, spec, data)});
  }
  return file;
}

bool SafetensorsFile::has_tensor(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const NamedTensor& t) { return t.name == name; });
}

bool SafetensorsFile::has_int64s(const std::string& name) const {
  return std::any_of(int64s.begin(), int64s.end(),
                     [&](const NamedInt64s& e) { return e.name == name; });
}

const Tensor& SafetensorsFile::tensor(const std::string& name) const {
  for (const NamedTensor& t : tensors)
    if (t.name == name) return t.tensor;
  throw Error(cat("safetensors: ", path, ": no tensor named '", name, "'"));
}

const NamedInt64s& SafetensorsFile::int64s_named(const std::string& name) const {
  for (const NamedInt64s& e : int64s)
    if (e.name == name) return e;
  throw Error(cat("safetensors: ", path, ": no int64 entry named '", name, "'"));
}

} // namespace minamp::io
