#include "kernels/cpu/host_memory.h"

#include <sys/mman.h>

#include <new>
#include <utility>

namespace strata::cpu {
namespace {

constexpr size_t kPage = size_t(4) << 10;
constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kArenaRegion = size_t(32) << 20;  // a region of the arena: 16 huge pages

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

HostMapping::HostMapping(size_t bytes) {
  const bool huge = bytes >= kHugePage;
  size_ = round_up(bytes == 0 ? 1 : bytes, huge ? kHugePage : kPage);
  // A huge mapping is taken a huge page larger and trimmed to a 2 MiB boundary at both ends: THP backs only
  // aligned 2 MiB ranges.
  const size_t mapped = huge ? size_ + kHugePage : size_;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  auto* first = static_cast<uint8_t*>(p);
  data_ = first;
  if (huge) {
    data_ = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(first), kHugePage));
    if (data_ > first) ::munmap(first, size_t(data_ - first));
    if (first + mapped > data_ + size_) ::munmap(data_ + size_, size_t(first + mapped - (data_ + size_)));
    ::madvise(data_, size_, MADV_HUGEPAGE);  // advice: refused (THP "never", old kernels) it changes nothing
  }
  // Every page faulted in now, after the advice (so in huge pages): a pool larger than the machine can hold fails
  // at start-up rather than mid-request, and no step waits on page faults. MADV_POPULATE_WRITE (Linux 5.14) does it
  // in one call; older kernels refuse it, and a write to each page does it there.
  if (::madvise(data_, size_, MADV_POPULATE_WRITE) != 0) {
    for (size_t at = 0; at < size_; at += kPage) data_[at] = 0;
  }
}

HostMapping::~HostMapping() {
  if (data_) ::munmap(data_, size_);
}

HostMapping::HostMapping(HostMapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

HostMapping& HostMapping::operator=(HostMapping&& other) noexcept {
  if (this != &other) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

uint8_t* HostArena::allocate(size_t bytes) {
  bytes = round_up(bytes, 64);
  if (regions_.empty() || used_ + bytes > regions_.back().size()) {
    regions_.emplace_back(std::max(bytes, kArenaRegion));
    used_ = 0;
  }
  uint8_t* p = regions_.back().data() + used_;
  used_ += bytes;
  return p;
}

}  // namespace strata::cpu
