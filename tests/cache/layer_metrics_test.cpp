// The per-layer series the policies and the cache declare (cache/layer_metric.h, layer_metrics()): each
// observation name feeds one series, a family shared by several declarations has one type, one HELP and one label
// key, and names follow Prometheus's conventions, so that /metrics can create them without knowing who declared
// them.
#include <map>
#include <regex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_policy.h"

namespace strata {
namespace {

TEST(LayerMetrics, EveryNameFeedsOneSeriesAndFamiliesAgree) {
  const std::vector<LayerMetric> metrics = layer_metrics();
  ASSERT_FALSE(metrics.empty());
  std::set<std::string_view> observations;
  std::set<std::tuple<std::string_view, std::string_view>> series;
  std::map<std::string_view, std::tuple<MetricType, std::string_view, std::string_view>> families;
  for (const LayerMetric& m : metrics) {
    EXPECT_TRUE(observations.insert(m.observation).second) << m.observation;
    EXPECT_TRUE(series.insert({m.family, m.label_value}).second) << m.family << " " << m.label_value;
    EXPECT_TRUE(std::regex_match(std::string(m.family), std::regex("strata_kv_layer_[a-z0-9_]+"))) << m.family;
    EXPECT_EQ(m.type == MetricType::counter, m.family.ends_with("_total")) << m.family;
    EXPECT_FALSE(m.help.empty()) << m.family;
    EXPECT_EQ(m.label.empty(), m.label_value.empty()) << m.family;
    for (const char* own : {"layer", "pp_stage", "tp_rank"}) EXPECT_NE(m.label, own) << m.family;
    const auto [it, added] = families.try_emplace(m.family, m.type, m.help, m.label);
    EXPECT_EQ(it->second, std::make_tuple(m.type, m.help, m.label)) << m.family << " is declared two ways";
  }
}

}  // namespace
}  // namespace strata
