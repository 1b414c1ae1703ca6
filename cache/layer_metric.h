#pragma once
// A per-layer series on /metrics, declared by a compression policy (its row in cache/policy_factory.cpp) or by the
// cache for what it stores of the policies' decisions (cache/storage_observations.h). /metrics creates every
// declared series for each (layer, pp_stage, tp_rank) from the first report of the layer, and feeds it the layer's
// observations of the same name (cache/observation.h): a counter adds the counts reported since the previous
// report, a gauge shows the amount reported now, or 0 when none is. So the names, types and HELP texts operators
// scrape live beside the code that reports them, and /metrics names none of them. Declarations are constants:
// their views are of string literals.
#include <string_view>

namespace strata {

enum class MetricType { counter, gauge };

struct LayerMetric {
  std::string_view observation;  // the layer's observation it shows, e.g. "merged_tokens", "lazy=true"
  std::string_view family;       // the Prometheus family; declarations may share one with other label values
  MetricType type = MetricType::gauge;
  std::string_view help;
  std::string_view label = {};  // one more label beside layer, pp_stage and tp_rank, and its value; empty: none
  std::string_view label_value = {};
};

}  // namespace strata
