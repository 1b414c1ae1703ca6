#pragma once
// The leader's index of the prompt blocks the ranks keep for reuse (automatic prefix caching). A prefix block is
// block_size prompt tokens; it is named by a hash chain (leader/block_hash_chain.h: its parent's hash, its tokens,
// and a salt for whatever else changes the KV, such as the model), and on every rank it is one KV block per local
// layer. The leader alone decides which blocks a new sequence starts from, which are published once prefilled and
// which are evicted when the pool needs their memory, and tells the ranks in the StepPlan; the ranks only keep the
// block ids.
//
// A block in use by a sequence stays; a block nobody uses stays cached until evicted, least recently used first,
// and only once no cached block continues it (a block whose parent is gone could never be found again).
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata {

class PrefixIndex {
 public:
  PrefixIndex(int block_size, uint64_t salt);

  int block_size() const { return block_size_; }
  // The hashes of the full blocks of `tokens`, in order.
  std::vector<uint64_t> chain(std::span<const int32_t> tokens) const;
  // Appends to `chain` (the hashes of the leading blocks of `tokens`) those of the full blocks after them.
  void extend_chain(std::vector<uint64_t>& chain, std::span<const int32_t> tokens) const;
  // How many leading blocks of `chain` (computed from `tokens`) are cached. Their tokens are compared too, so a
  // hash collision is a miss, never another prompt's KV.
  int cached_blocks(std::span<const uint64_t> chain, std::span<const int32_t> tokens) const;

  // A sequence starts from the cached blocks `hashes` (a leading part of a chain), or stops using them.
  void acquire(std::span<const uint64_t> hashes);
  void release(std::span<const uint64_t> hashes);
  // Block `index` of the chain is now kept by the ranks, in use by the sequence that prefilled it. The blocks
  // before it must be cached. Returns false, changing nothing, when it already is.
  bool publish(std::span<const uint64_t> chain, int index, std::span<const int32_t> tokens);
  // A compressed prefix (leader/prefix_cache.h): the blocks `chain` (compressed_block_chain) hold what `policy`
  // keeps of the tokens `prefix`. Whether every one of them is cached for these tokens and this policy (a hash
  // collision is a miss); and publishing them all at once, in use by the sequence that compressed them (false,
  // changing nothing, when the first already is).
  bool has_compressed(std::span<const uint64_t> chain, std::span<const int32_t> prefix, std::string_view policy) const;
  bool publish_compressed(std::span<const uint64_t> chain, std::span<const int32_t> prefix, std::string_view policy);
  // Cached blocks that no sequence uses: what evicting could give back.
  int64_t n_unused() const { return n_unused_; }
  // Removes up to n unused blocks, least recently used first, and returns their hashes for the ranks.
  std::vector<uint64_t> evict(int64_t n);
  int64_t size() const { return int64_t(blocks_.size()); }

 private:
  struct Block {
    bool has_parent = false;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;  // its own; the first block of a compressed prefix: the whole prefix
    std::string policy;           // a compressed prefix's first block: what compressed it
    int users = 0;
    int children = 0;   // cached blocks that continue this one
    uint64_t last_used = 0;
  };
  static bool evictable(const Block& b) { return b.users == 0 && b.children == 0; }

  int block_size_;
  uint64_t salt_;
  uint64_t clock_ = 0;
  int64_t n_unused_ = 0;
  std::unordered_map<uint64_t, Block> blocks_;
  std::set<std::pair<uint64_t, uint64_t>> evictable_;  // (last_used, hash) of unused blocks with no cached child
};

}  // namespace strata
