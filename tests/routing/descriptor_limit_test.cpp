#include "routing/descriptor_limit.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(DescriptorLimit, BudgetFitsOrSaysHowManyConnectionsFit) {
  EXPECT_EQ(connection_budget_problem(512, 20, 1024), "");
  const std::string problem = connection_budget_problem(1000, 20, 1024);
  EXPECT_NE(problem.find("1000 connections do not fit under the descriptor limit of 1024"), std::string::npos)
      << problem;
  EXPECT_NE(problem.find("at most 908 fit"), std::string::npos) << "1024 - 20 open - 64 refusals - 32 headroom";
  EXPECT_EQ(connection_budget_problem(908, 20, 1024), "");
  EXPECT_NE(connection_budget_problem(1, 100, 64).find("at most 0 fit"), std::string::npos);
}

TEST(DescriptorLimit, CountsOpenDescriptors) {
  const int before = count_open_descriptors();
  const int fd = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(count_open_descriptors(), before + 1);
  ::close(fd);
}

TEST(DescriptorLimit, RaisesTheSoftLimitToTheHardLimit) {
  rlimit original{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &original), 0);
  if (original.rlim_max < 128) GTEST_SKIP() << "hard limit too low to lower the soft one";
  rlimit lowered = original;
  lowered.rlim_cur = 100;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  const uint64_t raised = raise_descriptor_limit();
  rlimit now{};
  getrlimit(RLIMIT_NOFILE, &now);
  setrlimit(RLIMIT_NOFILE, &original);
  EXPECT_EQ(now.rlim_cur, original.rlim_max);
  EXPECT_EQ(raised, original.rlim_max == RLIM_INFINITY ? UINT64_MAX : uint64_t(original.rlim_max));
}

}  // namespace
}  // namespace strata
