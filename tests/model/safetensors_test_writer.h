#pragma once
// Writes small .safetensors files for the model tests.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::test {

class SafetensorsTestWriter {
 public:
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, std::vector<uint8_t> data) {
    header_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data_.size(), data_.size() + data.size()}}};
    data_.insert(data_.end(), data.begin(), data.end());
  }
  void add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
    std::vector<uint8_t> data(values.size() * 4);
    std::memcpy(data.data(), values.data(), data.size());
    add(name, "F32", std::move(shape), std::move(data));
  }
  nlohmann::json& header() { return header_; }

  std::vector<uint8_t> bytes() const { return bytes_with_header(header_.dump()); }
  std::vector<uint8_t> bytes_with_header(std::string header) const {
    header.append((8 - header.size() % 8) % 8, ' ');
    const uint64_t n = header.size();
    std::vector<uint8_t> out(8 + header.size() + data_.size());
    std::memcpy(out.data(), &n, 8);
    std::memcpy(out.data() + 8, header.data(), header.size());
    std::copy(data_.begin(), data_.end(), out.begin() + static_cast<ptrdiff_t>(8 + header.size()));
    return out;
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::vector<uint8_t> data_;
};

}  // namespace strata::test
