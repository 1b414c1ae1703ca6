#include "model/safetensors_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

namespace strata {

namespace {

// The reference implementation refuses larger headers too; it keeps a corrupt length from allocating much.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

int64_t dtype_bytes(std::string_view dtype) {
  static const std::map<std::string_view, int64_t> sizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4}, {"I64", 8}, {"U64", 8}, {"F64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

[[noreturn]] void fail(const std::string& path, const std::string& message) {
  throw SafetensorsError(path + ": " + message);
}

}  // namespace

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<GgmlType> SafetensorsTensor::ggml_type() const {
  if (dtype == "F32") return GgmlType::f32;
  if (dtype == "F16") return GgmlType::f16;
  if (dtype == "BF16") return GgmlType::bf16;
  return std::nullopt;
}

namespace {

// The length of the JSON header, from the file's first 8 bytes; checked against the file and kMaxHeaderBytes.
uint64_t header_length(const std::string& path, const uint8_t* bytes, uint64_t size) {
  if (size < 8) fail(path, "expected a u64 header length at offset 0, file ends at " + std::to_string(size));
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > kMaxHeaderBytes) {
    fail(path, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes));
  }
  if (header_len > size - 8) {
    fail(path, "expected a " + std::to_string(header_len) + "-byte JSON header at offset 8, file ends at " +
         std::to_string(size));
  }
  return header_len;
}

// The JSON header: an object without duplicate keys.
nlohmann::json parse_header(const std::string& path, const uint8_t* bytes, uint64_t header_len) {
  // The JSON library keeps the last of duplicate keys: catch them while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len, on_event);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("invalid JSON header: ") + e.what());
  }
  if (!header.is_object()) fail(path, "the JSON header is not an object");
  if (!duplicate.empty()) fail(path, "duplicate tensor name '" + duplicate + "' in the header");
  return header;
}

// One tensor's header entry, checked: a known dtype, a shape that does not overflow, and data offsets that fit in
// the data section (data_size bytes from data_offset) and hold exactly the shape's elements.
SafetensorsTensor parse_tensor(const std::string& path, const std::string& name, const nlohmann::json& entry,
                               const uint8_t* bytes, uint64_t data_offset, uint64_t data_size) {
  const std::string where = "tensor '" + name + "': ";
  if (!entry.is_object()) fail(path, where + "expected an object with dtype, shape and data_offsets");
  SafetensorsTensor t;
  t.name = name;
  if (!entry.contains("dtype") || !entry["dtype"].is_string()) fail(path, where + "expected a string 'dtype'");
  t.dtype = entry["dtype"].get<std::string>();
  t.element_bytes = dtype_bytes(t.dtype);
  if (t.element_bytes == 0) fail(path, where + "unknown dtype '" + t.dtype + "'");
  if (!entry.contains("shape") || !entry["shape"].is_array()) fail(path, where + "expected an array 'shape'");
  uint64_t n_elements = 1;
  for (const auto& d : entry["shape"]) {
    if (!d.is_number_unsigned()) fail(path, where + "shape entries must be non-negative integers");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        __builtin_mul_overflow(n_elements, dim, &n_elements)) {
      fail(path, where + "shape overflows");
    }
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  const auto& offsets = entry.contains("data_offsets") ? entry["data_offsets"] : nlohmann::json();
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail(path, where + "expected 'data_offsets': [begin, end] with non-negative integers");
  }
  const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
  if (begin > end || end > data_size) {
    fail(path, where + "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
         ") do not fit in the data section of " + std::to_string(data_size) + " bytes");
  }
  uint64_t expected_bytes = 0;
  if (__builtin_mul_overflow(n_elements, static_cast<uint64_t>(t.element_bytes), &expected_bytes) ||
      expected_bytes != end - begin) {
    fail(path, where + "data_offsets span " + std::to_string(end - begin) + " bytes, but shape and dtype need " +
         std::to_string(n_elements) + " x " + std::to_string(t.element_bytes));
  }
  t.offset = data_offset + begin;
  t.n_bytes = end - begin;
  t.data = bytes + t.offset;
  return t;
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto file = std::shared_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = path;
  file->file_ = MappedFile::open(path);
  const uint8_t* bytes = file->file_->data();
  const uint64_t size = file->file_->size();
  const uint64_t header_len = header_length(path, bytes, size);
  file->data_offset_ = 8 + header_len;
  const uint64_t data_size = size - file->data_offset_;

  const nlohmann::json header = parse_header(path, bytes, header_len);
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(path, "__metadata__['" + key + "'] is not a string");
        file->metadata_.emplace(key, value.get<std::string>());
      }
      continue;
    }
    file->tensors_.push_back(parse_tensor(path, name, entry, bytes, file->data_offset_, data_size));
  }

  std::sort(file->tensors_.begin(), file->tensors_.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.offset < b.offset; });
  // Each tensor against the one reaching furthest before it, not only its neighbour: an empty tensor between two
  // others must not hide their overlap (found by tests/fuzz/safetensors_fuzz.cpp).
  const SafetensorsTensor* furthest = nullptr;
  for (size_t i = 0; i < file->tensors_.size(); ++i) {
    const SafetensorsTensor& t = file->tensors_[i];
    if (furthest != nullptr && t.n_bytes > 0 && t.offset < furthest->offset + furthest->n_bytes) {
      fail(path, "tensors '" + furthest->name + "' and '" + t.name + "' overlap");
    }
    if (furthest == nullptr || t.offset + t.n_bytes > furthest->offset + furthest->n_bytes) furthest = &t;
    file->index_.emplace(t.name, i);
  }
  return file;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace strata
