#pragma once
// Writes small GGUF files for the model tests: header, metadata of any type, tensor infos, aligned data.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/ggml_type.h"
#include "model/gguf_file.h"

namespace strata::test {

class GgufTestWriter {
 public:
  uint32_t version = 3;
  char magic[4] = {'G', 'G', 'U', 'F'};
  uint64_t alignment = 32;  // for laying out the data; add general.alignment yourself to declare another one

  template <typename T>
  void add(const std::string& key, GgufValueType type, T value) {
    key_header(key, type);
    put(kv_, value);
  }
  void add_string(const std::string& key, const std::string& value) {
    key_header(key, GgufValueType::string);
    put_string(kv_, value);
  }
  template <typename T>
  void add_array(const std::string& key, GgufValueType element_type, const std::vector<T>& values) {
    key_header(key, GgufValueType::array);
    put(kv_, static_cast<uint32_t>(element_type));
    put(kv_, static_cast<uint64_t>(values.size()));
    for (const T& v : values) put(kv_, v);
  }
  void add_string_array(const std::string& key, const std::vector<std::string>& values) {
    key_header(key, GgufValueType::array);
    put(kv_, static_cast<uint32_t>(GgufValueType::string));
    put(kv_, static_cast<uint64_t>(values.size()));
    for (const std::string& v : values) put_string(kv_, v);
  }
  // Raw bytes appended to the metadata (for malformed entries); counts as one key/value.
  void add_raw_kv(const std::vector<uint8_t>& bytes) {
    kv_.insert(kv_.end(), bytes.begin(), bytes.end());
    ++n_kv_;
  }

  // `shape` in GGUF order (ne[0] first); `data` must hold the tensor's bytes.
  void add_tensor(const std::string& name, std::vector<uint64_t> shape, uint32_t type_id, std::vector<uint8_t> data) {
    tensors_.push_back({name, std::move(shape), type_id, std::move(data)});
  }
  void add_f32_tensor(const std::string& name, std::vector<uint64_t> shape, const std::vector<float>& values) {
    std::vector<uint8_t> data(values.size() * 4);
    std::memcpy(data.data(), values.data(), data.size());
    add_tensor(name, std::move(shape), 0, std::move(data));
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out(magic, magic + 4);
    put(out, version);
    put(out, static_cast<uint64_t>(tensors_.size()));
    put(out, n_kv_);
    out.insert(out.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const Tensor& t : tensors_) {
      put_string(out, t.name);
      put(out, static_cast<uint32_t>(t.shape.size()));
      for (uint64_t ne : t.shape) put(out, ne);
      put(out, t.type_id);
      put(out, offset);
      offsets.push_back(offset);
      offset = align(offset + t.data.size());
    }
    out.resize(align(out.size()), 0);
    const size_t data_start = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(data_start + offsets[i], 0);
      out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
    }
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> shape;
    uint32_t type_id;
    std::vector<uint8_t> data;
  };

  template <typename T>
  static void put(std::vector<uint8_t>& out, T value) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &value, sizeof(T));
    out.insert(out.end(), b, b + sizeof(T));
  }
  static void put_string(std::vector<uint8_t>& out, const std::string& s) {
    put(out, static_cast<uint64_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  void key_header(const std::string& key, GgufValueType type) {
    put_string(kv_, key);
    put(kv_, static_cast<uint32_t>(type));
    ++n_kv_;
  }
  size_t align(size_t x) const { return x + (alignment - x % alignment) % alignment; }

  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

// A file under the temporary directory, removed when the object goes away.
class TempFile {
 public:
  explicit TempFile(const std::vector<uint8_t>& bytes, const std::string& suffix = ".gguf") {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() /
             ("strata_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + suffix))
                .string();
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  ~TempFile() { std::filesystem::remove(path_); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace strata::test
