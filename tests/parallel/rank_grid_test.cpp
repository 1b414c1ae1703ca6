#include "parallel/rank_grid.h"

#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

std::string error_of(int tp, int pp, int world) {
  try {
    make_rank_grid(tp, pp, world, 0);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(RankGrid, StageIsRankOverTpAndTensorRankIsTheRemainder) {
  // TP=3 x PP=2: ranks 0-2 are stage 0, 3-5 stage 1; a stage's TP group is consecutive ranks.
  const std::vector<std::pair<int, int>> want = {{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}};
  for (int r = 0; r < 6; ++r) {
    const RankGrid g = make_rank_grid(3, 2, 6, r);
    EXPECT_EQ(g.stage(), want[size_t(r)].first) << r;
    EXPECT_EQ(g.tp_rank(), want[size_t(r)].second) << r;
    EXPECT_EQ(g.rank_of(g.stage(), g.tp_rank()), r);
    EXPECT_EQ(g.is_leader(), r == 0);
    EXPECT_EQ(g.is_first_stage(), r < 3);
    EXPECT_EQ(g.is_last_stage(), r >= 3);
  }
  EXPECT_EQ(make_rank_grid(3, 2, 6, 4).describe(4), "rank 4 (pp_stage 1, tp_rank 1)");
}

TEST(RankGrid, DegreesMustMatchTheWorld) {
  EXPECT_EQ(error_of(3, 2, 4), "--tp 3 x --pp 2 = 6 ranks, but the launcher started 4 (mpirun -np 6)");
  EXPECT_EQ(error_of(0, 1, 1), "--tp (parallel.tp): expected an integer >= 1, got 0");
  EXPECT_EQ(error_of(1, -2, 1), "--pp (parallel.pp): expected an integer >= 1, got -2");
  EXPECT_THROW(make_rank_grid(2, 1, 2, 2), std::invalid_argument);
}

TEST(RankGrid, StageLayersAreContiguousAndDifferByAtMostOne) {
  using Range = std::pair<int, int>;
  EXPECT_EQ(stage_layers(30, 1, 0), (Range{0, 30}));
  EXPECT_EQ(stage_layers(30, 2, 1), (Range{15, 30}));
  const std::vector<Range> four = {{0, 8}, {8, 16}, {16, 23}, {23, 30}};  // 8, 8, 7, 7
  for (int s = 0; s < 4; ++s) EXPECT_EQ(stage_layers(30, 4, s), four[size_t(s)]) << s;
  for (int pp = 1; pp <= 7; ++pp) {
    int next = 0;
    for (int s = 0; s < pp; ++s) {
      const auto [begin, end] = stage_layers(7, pp, s);
      EXPECT_EQ(begin, next);
      EXPECT_GE(end - begin, 7 / pp);
      EXPECT_LE(end - begin, 7 / pp + 1);
      next = end;
    }
    EXPECT_EQ(next, 7);
  }
  try {
    stage_layers(6, 8, 0);
    ADD_FAILURE() << "8 stages of 6 layers";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "--pp (parallel.pp) 8: the model has only 6 layers, one stage needs at least one");
  }
}

}  // namespace
}  // namespace strata
