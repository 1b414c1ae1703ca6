#include "cache/block_pool.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.h"

namespace strata {
namespace {

KvBlockLayout small_layout() {
  KvBlockLayout L;
  L.n_kv_heads = 2;
  L.head_dim = 8;
  L.block_size = 16;
  L.dtype = DType::f32;
  return L;  // 2 * 2 * 16 * 8 * 4 = 2048 bytes a block
}

TEST(BlockPool, StartsWithEveryBlockFree) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, small_layout(), 10);
  EXPECT_EQ(pool.n_total(), 10);
  EXPECT_EQ(pool.n_free(), 10);
  EXPECT_TRUE(pool.can_allocate(0));
  EXPECT_TRUE(pool.can_allocate(10));
  EXPECT_FALSE(pool.can_allocate(11));
  EXPECT_EQ(&pool.backend(), be.get());
  EXPECT_EQ(pool.layout().block_size, 16);
  EXPECT_EQ(pool.layout().n_kv_heads, 2);
  EXPECT_EQ(pool.layout().head_dim, 8);
}

TEST(BlockPool, RejectsUnusableSizes) {
  auto be = make_cpu_backend();
  EXPECT_THROW(BlockPool(*be, small_layout(), 0), std::invalid_argument);
  EXPECT_THROW(BlockPool(*be, small_layout(), -3), std::invalid_argument);
}

TEST(BlockPool, BlocksForMemory) {
  const KvBlockLayout L = small_layout();
  ASSERT_EQ(L.block_bytes(), 2048);
  EXPECT_EQ(BlockPool::blocks_for_memory(L, 0), 0);
  EXPECT_EQ(BlockPool::blocks_for_memory(L, 2047), 0);
  EXPECT_EQ(BlockPool::blocks_for_memory(L, 2048), 1);
  EXPECT_EQ(BlockPool::blocks_for_memory(L, 10000), 4);
  EXPECT_EQ(BlockPool::blocks_for_memory(L, int64_t(1024) << 20), 524288);  // 1 GiB / 2 KiB
}

TEST(BlockPool, AllocatesDistinctBlocksAndCounts) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, small_layout(), 6);
  std::set<int32_t> got;
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(pool.can_allocate(1));
    const int32_t b = pool.allocate();
    EXPECT_GE(b, 0);
    EXPECT_LT(b, 6);
    EXPECT_TRUE(got.insert(b).second) << "block " << b << " handed out twice";
    EXPECT_EQ(pool.n_free(), 5 - i);
    EXPECT_TRUE(pool.can_allocate(5 - i));
    EXPECT_FALSE(pool.can_allocate(6 - i));
  }
  EXPECT_FALSE(pool.can_allocate(1));
  EXPECT_THROW(pool.allocate(), std::runtime_error);
  EXPECT_EQ(pool.n_free(), 0);  // the failed allocation changed nothing
}

TEST(BlockPool, ReleasedBlocksComeBack) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, small_layout(), 3);
  const int32_t a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  EXPECT_THROW(pool.allocate(), std::runtime_error);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_EQ(pool.allocate(), b);  // the only free block
  pool.release(a);
  pool.release(c);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 3);
  std::set<int32_t> again;
  for (int i = 0; i < 3; ++i) again.insert(pool.allocate());
  EXPECT_EQ(again, (std::set<int32_t>{a, b, c}));
}

TEST(BlockPool, ASharedBlockReturnsWithItsLastHolder) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, small_layout(), 2);
  const int32_t a = pool.allocate();
  EXPECT_EQ(pool.holders(a), 1);
  pool.share(a);
  pool.share(a);
  EXPECT_EQ(pool.holders(a), 3);
  pool.release(a);
  pool.release(a);
  EXPECT_EQ(pool.n_free(), 1);  // one holder left
  pool.release(a);
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_EQ(pool.holders(a), 0);
  EXPECT_THROW(pool.share(a), std::logic_error);    // free
  EXPECT_THROW(pool.release(a), std::logic_error);  // released once more than held
  EXPECT_THROW(pool.share(7), std::logic_error);    // unknown
}

TEST(BlockPool, ReleasingAnUnknownBlockThrows) {
  auto be = make_cpu_backend();
  BlockPool pool(*be, small_layout(), 4);
  EXPECT_THROW(pool.release(-1), std::logic_error);
  EXPECT_THROW(pool.release(4), std::logic_error);
  EXPECT_EQ(pool.n_free(), 4);
}

TEST(BlockPool, EveryBlockHasItsOwnMemory) {
  auto be = make_cpu_backend();
  const KvBlockLayout L = small_layout();
  const int n = 5;
  BlockPool pool(*be, L, n);
  const KvPoolView view = pool.view();
  ASSERT_NE(view.base, nullptr);
  EXPECT_EQ(view.layout.block_size, L.block_size);
  EXPECT_EQ(view.layout.elements_per_block(), L.elements_per_block());
  // Fill every block end to end with its id; each must read back whole (no block overlaps another).
  for (int b = 0; b < n; ++b) std::fill_n(view.block_f32(b), L.elements_per_block(), float(b));
  for (int b = 0; b < n; ++b) {
    const float* p = view.block_f32(b);
    for (int64_t i = 0; i < L.elements_per_block(); ++i) ASSERT_EQ(p[i], float(b)) << "block " << b << " at " << i;
  }
}

}  // namespace
}  // namespace strata
