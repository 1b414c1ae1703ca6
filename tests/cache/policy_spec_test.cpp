// Policy specs as operators and clients write them, and the parameter reader every policy uses.
#include <string>

#include <gtest/gtest.h>

#include "cache/compression_config.h"
#include "cache/policy_spec.h"

namespace strata {
namespace {

TEST(PolicySpec, ParsesNameAndParameters) {
  const PolicySpec s = parse_policy_spec(" pyramidkv : budget=128, window = 8 ");
  EXPECT_EQ(s.name, "pyramidkv");
  EXPECT_EQ(s.params.at("budget"), "128");
  EXPECT_EQ(s.params.at("window"), "8");
  EXPECT_EQ(parse_policy_spec("full").params.size(), 0u);
  EXPECT_EQ(to_string(s), "pyramidkv:budget=128,window=8");
  const PolicySpec again = parse_policy_spec(to_string(s));
  EXPECT_EQ(again.name, s.name);
  EXPECT_EQ(again.params, s.params);
}

TEST(PolicySpec, MalformedTextIsAnError) {
  EXPECT_THROW(parse_policy_spec(""), PolicyError);
  EXPECT_THROW(parse_policy_spec(":budget=1"), PolicyError);
  EXPECT_THROW(parse_policy_spec("snapkv:budget"), PolicyError);
  EXPECT_THROW(parse_policy_spec("snapkv:=3"), PolicyError);
  try {
    parse_policy_spec("snapkv:budget=1,budget=2");
    ADD_FAILURE();
  } catch (const PolicyError& e) {
    EXPECT_EQ(e.param(), "budget");
  }
}

TEST(ParamReader, DefaultsRangesAndUnknownKeys) {
  const PolicySpec s = parse_policy_spec("p:a=5,b=0.5,c=true,d=max,e=20%,f=0.25,g=300");
  ParamReader r(s);
  EXPECT_EQ(r.get_int("a", 1, 0, 10), 5);
  EXPECT_EQ(r.get_int("missing", 7, 0, 10), 7);
  EXPECT_DOUBLE_EQ(r.get_double("b", 0, 0, 1), 0.5);
  EXPECT_TRUE(r.get_bool("c", false));
  EXPECT_EQ(r.get_choice("d", "avg", {"avg", "max"}), "max");
  EXPECT_EQ(r.get_budget("e", {}).resolve(1000), 200);
  EXPECT_EQ(r.get_budget("f", {}).resolve(10), 3);  // rounded up
  EXPECT_EQ(r.get_budget("g", {}).resolve(10), 300);
  EXPECT_NO_THROW(r.finish());

  const PolicySpec bad = parse_policy_spec("p:a=11,x=1");
  ParamReader r2(bad);
  try {
    r2.get_int("a", 1, 0, 10);
    ADD_FAILURE();
  } catch (const PolicyError& e) {
    EXPECT_EQ(e.param(), "a");
    EXPECT_NE(std::string(e.what()).find("p: a:"), std::string::npos) << e.what();
  }
  ParamReader r3(bad);
  r3.get_int("x", 0, 0, 5);
  try {
    r3.finish();
    ADD_FAILURE();
  } catch (const PolicyError& e) {
    EXPECT_EQ(e.param(), "a");  // nobody read it
  }
  for (const std::string text : {"p:e=0%", "p:e=101%", "p:e=-3", "p:e=abc", "p:e=2.5", "p:e=128.0", "p:e=1e3"}) {
    ParamReader rb(parse_policy_spec(text));
    EXPECT_THROW(rb.get_budget("e", {}), PolicyError) << text;
  }
  // '1.0' is neither a count nor a fraction below 1; the error says how to ask for the whole prompt.
  ParamReader one(parse_policy_spec("p:e=1.0"));
  try {
    one.get_budget("e", {});
    ADD_FAILURE();
  } catch (const PolicyError& e) {
    EXPECT_EQ(e.param(), "e");
    EXPECT_NE(std::string(e.what()).find("the whole prompt is 100%"), std::string::npos) << e.what();
  }
}

TEST(CompressionConfig, LayerOverridesPickTheLastMatch) {
  CompressionConfig c;
  c.policy = parse_policy_spec("snapkv:budget=64");
  c.overrides = parse_layer_overrides("0-1=full; 28-29=pyramidkv:budget=256; 29=streaming");
  EXPECT_EQ(c.for_layer(0).name, "full");
  EXPECT_EQ(c.for_layer(5).name, "snapkv");
  EXPECT_EQ(c.for_layer(28).name, "pyramidkv");
  EXPECT_EQ(c.for_layer(29).name, "streaming");
  EXPECT_TRUE(parse_layer_overrides("").empty());
  for (const std::string bad : {"0-1", "x=full", "3-1=full", "0=nosuch", "0=snapkv:bogus=1"}) {
    EXPECT_THROW(parse_layer_overrides(bad), PolicyError) << bad;
  }
}

}  // namespace
}  // namespace strata
