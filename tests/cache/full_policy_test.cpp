#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_policy.h"

namespace strata {
namespace {

TEST(FullPolicy, KeepsEverythingAtEveryHook) {
  std::unique_ptr<CompressionPolicy> p = make_policy("full");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->name(), "full");
  for (int layer : {0, 7, 29}) {
    for (int entries : {0, 1, 100, 5000}) {
      LayerState s;
      s.global_layer = layer;
      s.n_layers_total = 30;
      s.prompt_len = entries;
      s.n_entries = entries;
      EXPECT_FALSE(p->on_prefill_end(s).has_value()) << "layer " << layer << " entries " << entries;
      EXPECT_FALSE(p->on_decode_step(s).has_value()) << "layer " << layer << " entries " << entries;
    }
  }
}

TEST(FullPolicy, NeedsNoAttentionStatistics) {
  const PolicyNeeds n = make_policy("full")->needs();
  EXPECT_EQ(n.observation_window, 0);
  EXPECT_FALSE(n.decode_probabilities);
  EXPECT_FALSE(n.column_sums);
  EXPECT_FALSE(n.pre_rope_keys);
}

TEST(FullPolicy, EachCallMakesItsOwnObject) {
  auto a = make_policy("full"), b = make_policy("full");
  EXPECT_NE(a.get(), b.get());
}

TEST(MakePolicy, UnknownNamesThrowNamingThePolicy) {
  for (const std::string name : {"fulll", "h2o-typo", "", "FULL"}) {
    try {
      make_policy(name);
      ADD_FAILURE() << "make_policy('" << name << "') did not throw";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(MakePolicy, PolicyNamesListsFullAndEveryNameIsMade) {
  const std::vector<std::string> names = policy_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "full"), names.end());
  for (const std::string& n : names) {
    auto p = make_policy(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(p->name(), n);
  }
}

}  // namespace
}  // namespace strata
