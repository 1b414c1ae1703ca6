#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace strata {

namespace {

[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  throw std::system_error(errno, std::generic_category(), what + " " + path);
}

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int saved = errno;
    ::close(fd);
    errno = saved;
    throw_errno("cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::system_error(std::make_error_code(std::errc::invalid_argument), "not a regular file: " + path);
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  // mmap rejects a zero length; an empty file is a valid mapping of nothing (parsers report it as truncated).
  if (file->size_ > 0) {
    void* p = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int saved = errno;
      ::close(fd);
      errno = saved;
      throw_errno("cannot mmap", path);
    }
    file->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::release_pages() const {
  if (size_ > 0) ::madvise(const_cast<uint8_t*>(data_), size_, MADV_DONTNEED);
}

}  // namespace strata
