#include "routing/connection_limit.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(ConnectionLimit, SlotsUpToTheLimitAndBackWhenReleased) {
  ConnectionLimit limit(2);
  std::optional<ConnectionLimit::Slot> a = limit.try_take();
  std::optional<ConnectionLimit::Slot> b = limit.try_take();
  ASSERT_TRUE(a && b);
  EXPECT_EQ(limit.n_open(), 2);
  EXPECT_FALSE(limit.try_take());
  {
    ConnectionLimit::Slot moved = std::move(*a);  // a moved-from slot gives nothing back
    a.reset();
    EXPECT_EQ(limit.n_open(), 2);
  }
  EXPECT_EQ(limit.n_open(), 1);
  EXPECT_TRUE(limit.try_take());  // taken and given back at once
  EXPECT_EQ(limit.n_open(), 1);
}

TEST(ConnectionLimit, ConcurrentTakersNeverExceedTheLimit) {
  ConnectionLimit limit(5);
  std::atomic<int> n_max{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        if (auto slot = limit.try_take()) {
          int seen = limit.n_open();
          int prev = n_max.load();
          while (seen > prev && !n_max.compare_exchange_weak(prev, seen)) {
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(n_max.load(), 5);
  EXPECT_EQ(limit.n_open(), 0);
}

}  // namespace
}  // namespace strata
