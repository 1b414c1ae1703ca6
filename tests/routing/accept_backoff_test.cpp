#include "routing/accept_backoff.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

using namespace std::chrono_literals;

TEST(AcceptBackoff, DelayDoublesUpToOneSecondAndStartsOverAfterASuccess) {
  AcceptBackoff backoff;
  const auto t0 = AcceptBackoff::Clock::time_point{} + 1h;
  std::vector<int64_t> delays;
  for (int i = 0; i < 7; ++i) delays.push_back(backoff.on_failure("Too many open files", t0).delay.count());
  EXPECT_EQ(delays, (std::vector<int64_t>{50, 100, 200, 400, 800, 1000, 1000}));
  EXPECT_EQ(backoff.on_success(), "accepting connections again after 7 failed accepts");
  EXPECT_EQ(backoff.on_failure("Too many open files", t0).delay, 50ms);
  EXPECT_EQ(backoff.on_success(), "accepting connections again after 1 failed accepts");
  EXPECT_EQ(backoff.on_success(), "") << "nothing to report after a success";
}

TEST(AcceptBackoff, LogsTheFirstFailureThenOncePerIntervalWithTheCount) {
  AcceptBackoff backoff;
  const auto t0 = AcceptBackoff::Clock::time_point{} + 1h;
  const std::string first = backoff.on_failure("Too many open files", t0).log;
  EXPECT_NE(first.find("accept failed: Too many open files"), std::string::npos) << first;
  int n_logged = 0;
  for (int i = 1; i <= 20; ++i) n_logged += !backoff.on_failure("Too many open files", t0 + i * 400ms).log.empty();
  EXPECT_EQ(n_logged, 0) << "20 failures within 8 s";
  const std::string later = backoff.on_failure("Too many open files", t0 + 10s).log;
  EXPECT_NE(later.find("21 times since the last report"), std::string::npos) << later;
  EXPECT_TRUE(backoff.on_failure("Too many open files", t0 + 11s).log.empty());
}

}  // namespace
}  // namespace strata
