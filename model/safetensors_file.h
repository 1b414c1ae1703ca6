#pragma once
// A .safetensors file, memory-mapped and parsed: u64 LE header length, a JSON header mapping each tensor name to
// {dtype, shape, data_offsets: [begin, end)} relative to the data section, then the raw little-endian data.
// Parsing checks every shape, dtype and offset against the file size; errors (SafetensorsError) name the file.
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

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SafetensorsTensor {
  std::string name;
  std::string dtype;             // as written: "F32", "F16", "BF16", "I64", ...
  int64_t element_bytes = 0;
  std::vector<int64_t> shape;    // row-major, outermost first: a linear weight is [out_features, in_features]
  uint64_t offset = 0;           // absolute offset of the data in the file
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping

  int64_t n_elements() const;
  // GgmlType::f32 / f16 / bf16 for the float dtypes that dequantize_row reads; nullopt for the others.
  std::optional<GgmlType> ggml_type() const;
};

class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);  // SafetensorsError / std::system_error

  const std::string& path() const { return path_; }
  uint64_t data_offset() const { return data_offset_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in data-offset order
  const SafetensorsTensor* find(std::string_view name) const;  // nullptr when absent
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }  // __metadata__

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string, std::less<>> metadata_;
};

}  // namespace strata
