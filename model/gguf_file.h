#pragma once
// A GGUF v2/v3 file, memory-mapped and parsed (../shared/specs/model_format.md, sections 1-2).
// Parsing checks every length and offset against the file size: a truncated or corrupt file raises GgufError
// naming the byte offset and what was expected there, never a crash.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/ggml_type.h"
#include "model/mapped_file.h"

namespace strata {

class GgufError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9,
  u64 = 10, i64 = 11, f64 = 12,
};

// One metadata value. Scalars keep their declared type; arrays keep their element type.
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  GgufValueType element_type = GgufValueType::u8;  // for arrays
  int64_t int_value = 0;        // every integer type and bool, widened
  uint64_t uint_value = 0;      // u64 beyond int64 range kept exactly here too
  double float_value = 0.0;     // f32 / f64
  std::string string_value;
  std::vector<int64_t> int_array;       // integer / bool arrays
  std::vector<double> float_array;      // float arrays
  std::vector<std::string> string_array;
  uint64_t array_count = 0;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // ne[]: shape[0] is the contiguous (innermost) dimension
  GgmlType type = GgmlType::f32;
  uint64_t offset = 0;         // absolute offset of the data in the file
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping

  int64_t n_elements() const;
  int64_t row_length() const { return shape.empty() ? 0 : shape[0]; }
  int64_t n_rows() const { return shape.empty() ? 0 : n_elements() / shape[0]; }
};

class GgufFile {
 public:
  static std::shared_ptr<GgufFile> open(const std::string& path);  // throws GgufError / std::system_error

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  // Typed getters: nullopt when the key is absent; GgufError naming the key when it has the wrong type.
  std::optional<int64_t> get_int(std::string_view key) const;     // any integer type or bool, widened
  std::optional<double> get_float(std::string_view key) const;    // f32/f64, or an integer
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<std::vector<std::string>> get_string_array(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_int_array(std::string_view key) const;
  std::optional<std::vector<double>> get_float_array(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // MappedFile::release_pages of the whole file.
  void release_pages() const { file_->release_pages(); }
  const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent
  const GgufTensorInfo& tensor(std::string_view name) const;       // GgufError when absent

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;

  friend class GgufParser;
};

}  // namespace strata
