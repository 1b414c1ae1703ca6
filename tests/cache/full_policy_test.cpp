// The `full` policy and the policy factory.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_policy.h"

namespace strata {
namespace {

PolicySpec spec(const std::string& name) { return PolicySpec{name, {}}; }

TEST(FullPolicy, KeepsEverythingAtEveryHook) {
  for (int layer : {0, 7, 29}) {
    std::unique_ptr<CompressionPolicy> p = make_policy(spec("full"), PolicyContext{layer, 30, 9, 3, "m"});
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->name(), "full");
    for (int entries : {0, 1, 100, 5000}) {
      LayerState s;
      s.prompt_len = entries;
      s.n_entries = entries;
      EXPECT_FALSE(p->on_prefill_end(s).has_value()) << "layer " << layer << " entries " << entries;
      s.n_generated = 1;
      EXPECT_FALSE(p->on_decode_step(s).has_value()) << "layer " << layer << " entries " << entries;
    }
    std::vector<Observation> observations;
    p->observe(observations);
    EXPECT_TRUE(observations.empty()) << "layer " << layer;
  }
}

TEST(FullPolicy, NeedsNoAttentionStatistics) {
  LayerState s;
  s.prompt_len = 100;
  const PolicyNeeds n = make_policy(spec("full"), PolicyContext{})->needs(s);
  EXPECT_EQ(n.prefill_rows_from, -1);
  EXPECT_FALSE(n.decode_probabilities);
}

TEST(FullPolicy, TakesNoParameters) {
  try {
    make_policy(PolicySpec{"full", {{"budget", "128"}}}, PolicyContext{});
    ADD_FAILURE() << "full:budget=128 was accepted";
  } catch (const PolicyError& e) {
    EXPECT_EQ(e.param(), "budget");
  }
}

TEST(MakePolicy, UnknownNamesThrowNamingThePolicy) {
  for (const std::string name : {"fulll", "h2o-typo", "FULL"}) {
    try {
      make_policy(spec(name), PolicyContext{});
      ADD_FAILURE() << "make_policy('" << name << "') did not throw";
    } catch (const PolicyError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
      EXPECT_EQ(e.param(), "policy");
    }
  }
}

TEST(MakePolicy, EveryListedNameIsMadeWithItsDefaults) {
  const std::vector<std::string> names = policy_names();
  for (const std::string n : {"full", "streaming", "h2o", "snapkv", "pyramidkv", "simlayerkv"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  for (const std::string& n : names) {
    auto p = make_policy(spec(n), PolicyContext{3, 30, 9, 3, "SmolLM2-135M-Instruct"});
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(p->name(), n);
    validate_policy(spec(n));
  }
}

}  // namespace
}  // namespace strata
