// The leader's prefix index (leader/prefix_index.h): hash chains, hits verified by tokens, users, and eviction
// least recently used first without ever leaving a cached block whose parent is gone.
#include "leader/prefix_index.h"

#include <algorithm>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace strata {
namespace {

std::vector<int32_t> tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = first + i;
  return t;
}

// Publishes every full block of `t` as one sequence's prefill would, and returns the chain.
std::vector<uint64_t> prefill(PrefixIndex& index, const std::vector<int32_t>& t) {
  const std::vector<uint64_t> chain = index.chain(t);
  const int hit = index.cached_blocks(chain, t);
  index.acquire(std::span(chain).first(size_t(hit)));
  for (int i = hit; i < int(chain.size()); ++i) EXPECT_TRUE(index.publish(chain, i, t));
  return chain;
}

TEST(PrefixIndex, ChainsNameFullBlocksByEverythingBeforeThem) {
  PrefixIndex index(4, 7);
  const std::vector<int32_t> a = tokens(10, 100);
  std::vector<int32_t> b = a;
  b[5] = 1;  // block 1 differs
  const std::vector<uint64_t> ca = index.chain(a), cb = index.chain(b);
  ASSERT_EQ(ca.size(), 2u);  // the partial third block has no name
  EXPECT_EQ(ca[0], cb[0]);
  EXPECT_NE(ca[1], cb[1]);
  std::vector<int32_t> c = a;
  c[0] = 1;  // block 0 differs: so does every later name
  EXPECT_NE(index.chain(c)[1], ca[1]);
  EXPECT_NE(PrefixIndex(4, 8).chain(a)[0], ca[0]) << "the salt (the model) is part of the name";
  EXPECT_TRUE(index.chain(tokens(3, 0)).empty());
  // A chain extended as tokens come (a sequence decoding) names the blocks as the whole chain does.
  std::vector<uint64_t> grown = index.chain(std::span(a).first(5));
  index.extend_chain(grown, std::span(a).first(7));
  EXPECT_EQ(grown.size(), 1u);
  index.extend_chain(grown, a);
  EXPECT_EQ(grown, ca);
}

TEST(PrefixIndex, HitsAreTheLeadingCachedBlocksWithTheSameTokens) {
  PrefixIndex index(4, 0);
  const std::vector<int32_t> doc = tokens(12, 0);
  const std::vector<uint64_t> chain = prefill(index, doc);
  EXPECT_EQ(index.size(), 3);
  std::vector<int32_t> question = doc;
  question.resize(8);
  for (int32_t t : tokens(6, 500)) question.push_back(t);
  EXPECT_EQ(index.cached_blocks(index.chain(question), question), 2);
  // A chain whose tokens do not match what is cached under its names (as after a hash collision) is a miss.
  EXPECT_EQ(index.cached_blocks(chain, tokens(12, 1)), 0);
  EXPECT_FALSE(index.publish(chain, 0, doc)) << "already cached";
}

TEST(PrefixIndex, BlocksInUseAreNeverEvicted) {
  PrefixIndex index(2, 0);
  const std::vector<int32_t> t = tokens(6, 0);
  const std::vector<uint64_t> chain = prefill(index, t);
  EXPECT_EQ(index.n_unused(), 0);
  EXPECT_TRUE(index.evict(10).empty());
  index.acquire(std::span(chain).first(1));  // a second sequence shares the first block
  index.release(chain);                      // the first one finishes
  EXPECT_EQ(index.n_unused(), 2);
  EXPECT_EQ(index.evict(10), (std::vector<uint64_t>{chain[2], chain[1]}));
  EXPECT_EQ(index.size(), 1);
  index.release(std::span(chain).first(1));
  EXPECT_EQ(index.evict(10), (std::vector<uint64_t>{chain[0]}));
  EXPECT_THROW(index.release(std::span(chain).first(1)), std::out_of_range);
}

TEST(PrefixIndex, EvictsLeastRecentlyUsedTailsFirst) {
  PrefixIndex index(2, 0);
  const std::vector<int32_t> old_doc = tokens(4, 0), new_doc = tokens(4, 100);
  const std::vector<uint64_t> old_chain = prefill(index, old_doc);
  const std::vector<uint64_t> new_chain = prefill(index, new_doc);
  index.release(old_chain);
  index.release(new_chain);
  EXPECT_EQ(index.evict(1), (std::vector<uint64_t>{old_chain[1]}));
  // The old document's head is used again: now the new document is the least recently used.
  index.acquire(std::span(old_chain).first(1));
  index.release(std::span(old_chain).first(1));
  EXPECT_EQ(index.evict(2), (std::vector<uint64_t>{new_chain[1], new_chain[0]}));
  EXPECT_EQ(index.evict(2), (std::vector<uint64_t>{old_chain[0]}));
  EXPECT_EQ(index.size(), 0);
}

TEST(PrefixIndex, ReleasingMoreThanAcquiredIsABug) {
  PrefixIndex index(2, 0);
  const std::vector<uint64_t> chain = prefill(index, tokens(2, 0));
  index.release(chain);
  EXPECT_THROW(index.release(chain), std::logic_error);
}

// Random traffic over a few shared prefixes: the counts stay true and no cached block loses its parent.
TEST(PrefixIndex, RandomTrafficKeepsTheChainsWhole) {
  PrefixIndex index(2, 3);
  std::mt19937 rng(11);
  std::vector<std::vector<uint64_t>> running;  // what each running sequence acquired or published
  for (int step = 0; step < 2000; ++step) {
    const int action = int(rng() % 3);
    if (action == 0) {
      std::vector<int32_t> t = tokens(2 * int(1 + rng() % 4), 0);
      t[rng() % t.size()] = int32_t(rng() % 3);  // a few prompts, sharing heads
      running.push_back(prefill(index, t));
    } else if (action == 1 && !running.empty()) {
      const size_t i = rng() % running.size();
      index.release(running[i]);
      running.erase(running.begin() + ptrdiff_t(i));
    } else {
      const std::vector<uint64_t> evicted = index.evict(int64_t(rng() % 3));
      for (const auto& chain : running) {
        for (uint64_t h : evicted) EXPECT_EQ(std::count(chain.begin(), chain.end(), h), 0) << "evicted in use";
      }
    }
    std::set<uint64_t> in_use;
    for (const auto& chain : running) in_use.insert(chain.begin(), chain.end());
    ASSERT_EQ(index.n_unused(), index.size() - int64_t(in_use.size())) << "step " << step;
  }
  for (const auto& chain : running) index.release(chain);
  const int64_t cached = index.size();
  EXPECT_EQ(index.n_unused(), cached);
  EXPECT_EQ(int64_t(index.evict(cached + 1).size()), cached) << "every unused block can go, tails first";
  EXPECT_EQ(index.size(), 0);
}

}  // namespace
}  // namespace strata
