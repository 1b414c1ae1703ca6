// The block hash chain (leader/block_hash_chain.h) that the prefix cache and the router both name blocks with.
#include "leader/block_hash_chain.h"

#include <vector>

#include <gtest/gtest.h>

#include "leader/prefix_index.h"

namespace strata {
namespace {

TEST(BlockHashChain, OneHashPerFullBlockNamingTheWholePrefix) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<uint64_t> chain = block_hash_chain(a, 4, 7);
  ASSERT_EQ(chain.size(), 2u) << "the ninth token makes no full block";
  std::vector<int32_t> b = a;
  b[0] = 100;  // a different first block changes every later hash
  const std::vector<uint64_t> other = block_hash_chain(b, 4, 7);
  EXPECT_NE(other[0], chain[0]);
  EXPECT_NE(other[1], chain[1]);
  EXPECT_NE(block_hash_chain(a, 4, 8)[0], chain[0]) << "the salt is part of every name";
}

TEST(BlockHashChain, ExtendingGivesTheWholeChainAndThePrefixIndexUsesIt) {
  const std::vector<int32_t> tokens = {5, 4, 3, 2, 1, 0, 9, 8, 7, 6, 5, 4};
  std::vector<uint64_t> chain = block_hash_chain(std::span(tokens).first(5), 3, 11);
  extend_block_hash_chain(chain, tokens, 3, 11);
  EXPECT_EQ(chain, block_hash_chain(tokens, 3, 11));
  EXPECT_EQ(chain, PrefixIndex(3, 11).chain(tokens));
}

}  // namespace
}  // namespace strata
