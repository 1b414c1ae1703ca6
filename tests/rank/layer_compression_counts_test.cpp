// What the rank counts of a policy's observations between two reports (rank/layer_compression_counts.h): the
// growth of its counts, each verdict once when taken, nothing for amounts.
#include <vector>

#include <gtest/gtest.h>

#include "rank/layer_compression_counts.h"

namespace strata {
namespace {

using Kind = ObservationKind;

TEST(LayerCompressionCounts, CountsGrowthAndVerdictsOnce) {
  LayerCompressionCounts counts;
  const std::vector<Observation> nothing;
  const std::vector<Observation> first = {{"merged", 3, Kind::count}, {"bound", 40, Kind::amount}};
  const std::vector<Observation> later = {{"merged", 5, Kind::count}, {"bound", 40, Kind::amount},
                                          {"calm", 1, Kind::verdict}};
  counts.add_growth(nothing, first);
  counts.add_growth(first, later);
  counts.add_growth(later, later);  // nothing new
  // Another sequence's policy of the same layer, just built: everything it reports is new.
  counts.add_growth(nothing, std::vector<Observation>{{"merged", 2, Kind::count}, {"calm", 0, Kind::verdict}});
  EXPECT_EQ(counts.observations(), (std::vector<Observation>{{"calm=false", 1, Kind::count},
                                                             {"calm=true", 1, Kind::count},
                                                             {"merged", 7, Kind::count}}));
}

TEST(LayerCompressionCounts, NothingToReportIsEmpty) {
  LayerCompressionCounts counts;
  const std::vector<Observation> same = {{"merged", 4, Kind::count}};
  counts.add_growth(same, same);
  EXPECT_TRUE(counts.observations().empty());
}

}  // namespace
}  // namespace strata
