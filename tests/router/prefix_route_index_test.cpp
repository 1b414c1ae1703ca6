// The router's index of what each replica was sent (router/prefix_route_index.h).
#include "router/prefix_route_index.h"

#include <vector>

#include <gtest/gtest.h>

#include "leader/block_hash_chain.h"

namespace strata {
namespace {

std::vector<uint64_t> chain_of(int n_tokens, int32_t first) {
  std::vector<int32_t> tokens(static_cast<size_t>(n_tokens));
  for (int i = 0; i < n_tokens; ++i) tokens[size_t(i)] = first + i;
  return block_hash_chain(tokens, 4, 1);
}

TEST(PrefixRouteIndex, AReplicaMatchesThePrefixItWasSent) {
  PrefixRouteIndex index(1000, 3);
  const std::vector<uint64_t> document = chain_of(40, 0);  // 10 blocks
  index.record(std::span(document).first(6), 1);
  EXPECT_EQ(index.matched_blocks(document), (std::vector<int>{0, 6, 0}));
  index.record(document, 2);
  EXPECT_EQ(index.matched_blocks(document), (std::vector<int>{0, 6, 10}));
  EXPECT_EQ(index.matched_blocks(chain_of(40, 1)), (std::vector<int>{0, 0, 0})) << "another prompt";
}

TEST(PrefixRouteIndex, BoundedLeastRecentlyUsedFirst) {
  PrefixRouteIndex index(10, 2);
  const std::vector<uint64_t> old_document = chain_of(40, 0), new_document = chain_of(40, 1000);
  index.record(old_document, 0);
  index.record(new_document, 1);
  EXPECT_EQ(index.size(), 10u);
  EXPECT_EQ(index.matched_blocks(old_document), (std::vector<int>{0, 0}));
  EXPECT_EQ(index.matched_blocks(new_document), (std::vector<int>{0, 10}));
}

TEST(PrefixRouteIndex, AReplicaThatRestartedHoldsNothing) {
  PrefixRouteIndex index(1000, 2);
  const std::vector<uint64_t> document = chain_of(40, 0);
  index.record(document, 0);
  index.record(document, 1);
  index.forget(0);
  EXPECT_EQ(index.matched_blocks(document), (std::vector<int>{0, 10}));
  index.forget(1);
  EXPECT_EQ(index.size(), 0u);
}

TEST(PrefixRouteIndex, AtMostOneBitPerReplica) {
  EXPECT_THROW(PrefixRouteIndex(10, PrefixRouteIndex::kMaxReplicas + 1), std::invalid_argument);
}

}  // namespace
}  // namespace strata
