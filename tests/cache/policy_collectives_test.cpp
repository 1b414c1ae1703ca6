// Policies whose decisions average over all heads of a layer reach the same decision on every tensor-parallel
// rank through PolicyCollectives (design rule 3): two in-process ranks, each with some of the heads, against the
// one-rank decision over all heads.
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cache/policies/policies.h"
#include "thread_group.h"
#include "tests/observed.h"

namespace strata {
namespace {

// SimLayerKV at its first decode step over 4 entries (n_init 1, window 1: S = {0, 3}); one query head per rank.
// Head A puts 0.9 of its probability on S, head B 0.2: the layer's score is 0.55, above the threshold 0.5, so the
// layer is lazy. Each rank alone would disagree (A lazy, B not) and the two ranks would hold different lengths.
const std::vector<float> kHeadA = {0.5f, 0.05f, 0.05f, 0.4f};
const std::vector<float> kHeadB = {0.1f, 0.4f, 0.4f, 0.1f};

std::optional<bool> simlayerkv_verdict(const std::vector<float>& sums, int n_heads, PolicyCollectives& collectives) {
  PolicyContext context;
  context.n_heads = n_heads;
  context.n_kv_heads = 1;
  context.collectives = &collectives;
  auto policy = make_simlayerkv_policy(parse_policy_spec("simlayerkv:threshold=0.5,n_init=1,window=1"), context);
  LayerState state;
  state.prompt_len = 3;
  state.n_entries = 4;
  state.n_generated = 1;
  state.column_sums = sums.data();
  state.sums_stride = 4;
  policy->on_decode_step(state);
  return test::verdict(*policy, "lazy");
}

TEST(PolicyCollectives, SimLayerKvDecidesOnTheMeanOverEveryRanksHeads) {
  std::vector<float> both = kHeadA;
  both.insert(both.end(), kHeadB.begin(), kHeadB.end());
  EXPECT_EQ(simlayerkv_verdict(both, 2, single_rank_collectives()), true);
  EXPECT_EQ(simlayerkv_verdict(kHeadA, 1, single_rank_collectives()), true);
  EXPECT_EQ(simlayerkv_verdict(kHeadB, 1, single_rank_collectives()), false);

  test::ThreadGroup group(2);
  std::optional<bool> verdict[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      test::GroupRank self(group, r);
      verdict[r] = simlayerkv_verdict(r == 0 ? kHeadA : kHeadB, 1, self);
    });
  }
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(verdict[0], true);
  EXPECT_EQ(verdict[1], true);
}

}  // namespace
}  // namespace strata
