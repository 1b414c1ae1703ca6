#pragma once
// A read-only memory mapping of a whole file. Weights are read from here, never copied into a second buffer.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);  // throws std::system_error naming the path
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the mapping's pages from this process's memory (MADV_DONTNEED). The data stays valid: a page read again
  // is brought back from the file. For after the weights have been copied where they are used.
  void release_pages() const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace strata
