#pragma once
// Host memory for the CPU backend's buffers (the KV pool, the activations, the repacked weights), asked for in
// transparent huge pages: a decode step streams every weight (about 100 MB for SmolLM2) and reads KV blocks
// scattered over the pool, and with 4 KiB pages each 4 KiB of it costs a TLB miss, in a VM a two-level page walk
// (docs/decisions.md, [cpu-xeon]).
// madvise(MADV_HUGEPAGE) is what THP's "madvise" mode (Debian's default) waits for; under "never" the memory is
// ordinary pages and nothing else changes.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::cpu {

// One anonymous mapping of at least `bytes`: zeroed, page-aligned, 2 MiB-aligned and in huge pages where it is
// 2 MiB or more, every page present from the start. Unmapped on destruction; std::bad_alloc when the system
// refuses it.
class HostMapping {
 public:
  explicit HostMapping(size_t bytes);
  ~HostMapping();
  HostMapping(HostMapping&& other) noexcept;
  HostMapping& operator=(HostMapping&& other) noexcept;
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Many buffers of a few hundred KiB (the repacked weight matrices) laid side by side in a few large mappings, so
// that they too sit in huge pages. What it hands out lives as long as the arena.
class HostArena {
 public:
  // `bytes` of zeroed memory, 64-byte aligned.
  uint8_t* allocate(size_t bytes);

 private:
  std::vector<HostMapping> regions_;
  size_t used_ = 0;  // bytes taken of the last region
};

}  // namespace strata::cpu
