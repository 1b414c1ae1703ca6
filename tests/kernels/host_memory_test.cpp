// The CPU backend's host memory (kernels/cpu/host_memory.h): mappings zeroed, aligned (2 MiB from 2 MiB on, where
// transparent huge pages can back them), writable end to end and handed over by moves; arena buffers zeroed,
// 64-byte aligned and apart from one another, also across regions and for one larger than a region.
#include "kernels/cpu/host_memory.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace strata::cpu {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

bool all_zero(const uint8_t* p, size_t n) { return std::all_of(p, p + n, [](uint8_t b) { return b == 0; }); }

TEST(HostMapping, ZeroedAlignedAndWritableForSmallAndHugeSizes) {
  for (size_t bytes : {size_t(1), size_t(4097), 2 * kMiB - 1, 2 * kMiB, 5 * kMiB + 3}) {
    HostMapping m(bytes);
    ASSERT_NE(m.data(), nullptr);
    EXPECT_GE(m.size(), bytes);
    const uintptr_t at = reinterpret_cast<uintptr_t>(m.data());
    EXPECT_EQ(at % 4096, 0u) << bytes;
    if (bytes >= 2 * kMiB) {
      EXPECT_EQ(at % (2 * kMiB), 0u) << bytes;
      EXPECT_EQ(m.size() % (2 * kMiB), 0u) << bytes;
    }
    EXPECT_TRUE(all_zero(m.data(), m.size())) << bytes;
    std::memset(m.data(), 0xAB, m.size());  // every byte is ours
    EXPECT_EQ(m.data()[m.size() - 1], 0xAB);
  }
}

TEST(HostMapping, MovesHandTheMemoryOver) {
  HostMapping a(3 * kMiB);
  uint8_t* data = a.data();
  data[0] = 7;
  HostMapping b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), data);
  HostMapping c(1);
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.data()[0], 7);
}

TEST(HostArena, BuffersAreZeroedAlignedAndApart) {
  HostArena arena;
  struct Buffer {
    uint8_t* data;
    size_t bytes;
  };
  std::vector<Buffer> buffers;
  // Sizes of SmolLM2's packed matrices and odd ones, more than a region's worth in all, and one larger than a region.
  const size_t sizes[] = {207360, 69120, 552960 + 64, 1, 63, 65, 40 * kMiB, 3 * kMiB};
  for (int round = 0; round < 8; ++round) {
    for (size_t bytes : sizes) {
      uint8_t* p = arena.allocate(bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
      EXPECT_TRUE(all_zero(p, bytes)) << bytes;
      std::memset(p, int(buffers.size() % 251) + 1, bytes);
      buffers.push_back({p, bytes});
    }
  }
  for (size_t i = 0; i < buffers.size(); ++i) {  // no later buffer wrote over an earlier one
    const uint8_t want = uint8_t(i % 251 + 1);
    ASSERT_TRUE(std::all_of(buffers[i].data, buffers[i].data + buffers[i].bytes, [&](uint8_t b) { return b == want; }))
        << "buffer " << i;
  }
}

}  // namespace
}  // namespace strata::cpu
