#pragma once
// Little-endian, length-prefixed encoding of the plain structs that cross ranks (parallel/step_plan.h,
// parallel/rank_report.h). Every read is bounds-checked: a short or corrupt message raises an error naming the
// message kind and the offset instead of reading past the buffer.
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace strata::wire {

class Writer {
 public:
  template <typename T>
  void put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put(const std::string& s) {
    put<uint32_t>(uint32_t(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  template <typename T>
  void put(const std::vector<T>& v) {
    put<uint32_t>(uint32_t(v.size()));
    for (const T& x : v) put(x);
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  // `kind` names the message in errors ("step message", "rank report").
  Reader(const std::vector<uint8_t>& in, std::string kind) : in_(in), kind_(std::move(kind)) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string get_string() {
    const uint32_t n = get<uint32_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> get_vector() {
    const uint32_t n = get<uint32_t>();
    need(uint64_t(n) * sizeof(T));
    std::vector<T> v(n);
    for (auto& x : v) x = get<T>();
    return v;
  }
  // A count of items that take at least min_item_bytes each: a corrupt count cannot make the caller reserve
  // more than the message holds.
  uint32_t get_count(size_t min_item_bytes) {
    const uint32_t n = get<uint32_t>();
    need(uint64_t(n) * min_item_bytes);
    return n;
  }
  void expect(uint32_t magic, const char* what) {
    if (get<uint32_t>() != magic) throw std::runtime_error(kind_ + ": not " + what);
  }
  void expect_end() const {
    if (pos_ != in_.size()) {
      throw std::runtime_error(kind_ + ": " + std::to_string(in_.size() - pos_) + " trailing bytes at offset " +
                               std::to_string(pos_));
    }
  }

 private:
  void need(uint64_t n) const {
    if (n > in_.size() - pos_) {
      throw std::runtime_error(kind_ + ": offset " + std::to_string(pos_) + ": expected " + std::to_string(n) +
                               " more bytes, message has " + std::to_string(in_.size()));
    }
  }
  const std::vector<uint8_t>& in_;
  std::string kind_;
  size_t pos_ = 0;
};

}  // namespace strata::wire
