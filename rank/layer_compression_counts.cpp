#include "rank/layer_compression_counts.h"

#include <algorithm>

namespace strata {
namespace {

const Observation* named(std::span<const Observation> observations, const std::string& name) {
  auto it = std::find_if(observations.begin(), observations.end(),
                         [&](const Observation& o) { return o.name == name; });
  return it == observations.end() ? nullptr : &*it;
}

}  // namespace

void LayerCompressionCounts::add_growth(std::span<const Observation> before, std::span<const Observation> now) {
  for (const Observation& o : now) {
    const Observation* earlier = named(before, o.name);
    const int64_t growth = o.value - (earlier ? earlier->value : 0);
    if (o.kind == ObservationKind::count && growth != 0) {
      observed[o.name] += growth;
    } else if (o.kind == ObservationKind::verdict && (!earlier || growth != 0)) {
      observed[o.name + (o.value ? "=true" : "=false")] += 1;
    }
  }
}

std::vector<Observation> LayerCompressionCounts::observations() const {
  std::vector<Observation> out;
  for (const auto& [name, n] : observed) {
    if (n != 0) out.push_back({name, n, ObservationKind::count});
  }
  return out;
}

}  // namespace strata
