#include "leader/prefix_index.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "leader/block_hash_chain.h"

namespace strata {

PrefixIndex::PrefixIndex(int block_size, uint64_t salt) : block_size_(block_size), salt_(salt) {
  if (block_size < 1) throw std::invalid_argument("prefix index: block_size must be positive");
}

std::vector<uint64_t> PrefixIndex::chain(std::span<const int32_t> tokens) const {
  return block_hash_chain(tokens, block_size_, salt_);
}

void PrefixIndex::extend_chain(std::vector<uint64_t>& chain, std::span<const int32_t> tokens) const {
  extend_block_hash_chain(chain, tokens, block_size_, salt_);
}

int PrefixIndex::cached_blocks(std::span<const uint64_t> chain, std::span<const int32_t> tokens) const {
  int n = 0;
  for (; size_t(n) < chain.size(); ++n) {
    auto it = blocks_.find(chain[size_t(n)]);
    if (it == blocks_.end()) break;
    const auto block = tokens.subspan(size_t(n) * size_t(block_size_), size_t(block_size_));
    if (!std::equal(block.begin(), block.end(), it->second.tokens.begin(), it->second.tokens.end())) break;
  }
  return n;
}

void PrefixIndex::acquire(std::span<const uint64_t> hashes) {
  for (uint64_t h : hashes) {
    Block& b = blocks_.at(h);
    if (evictable(b)) evictable_.erase({b.last_used, h});
    if (b.users++ == 0) --n_unused_;
    b.last_used = ++clock_;
  }
}

// Last block first, so that a chain's tail is older than its head and goes first when both could.
void PrefixIndex::release(std::span<const uint64_t> hashes) {
  for (auto it = hashes.rbegin(); it != hashes.rend(); ++it) {
    Block& b = blocks_.at(*it);
    if (b.users <= 0) throw std::logic_error("prefix index: a block released more often than acquired");
    b.last_used = ++clock_;
    if (--b.users == 0) {
      ++n_unused_;
      if (b.children == 0) evictable_.insert({b.last_used, *it});
    }
  }
}

bool PrefixIndex::publish(std::span<const uint64_t> chain, int index, std::span<const int32_t> tokens) {
  const uint64_t hash = chain[size_t(index)];
  if (blocks_.count(hash)) return false;
  Block b;
  if (index > 0) {
    b.has_parent = true;
    b.parent = chain[size_t(index) - 1];
    Block& parent = blocks_.at(b.parent);
    if (evictable(parent)) evictable_.erase({parent.last_used, b.parent});
    ++parent.children;
  }
  const auto first = tokens.begin() + ptrdiff_t(index) * block_size_;
  b.tokens.assign(first, first + block_size_);
  b.users = 1;
  b.last_used = ++clock_;
  blocks_.emplace(hash, std::move(b));
  return true;
}

bool PrefixIndex::has_compressed(std::span<const uint64_t> chain, std::span<const int32_t> prefix,
                                 std::string_view policy) const {
  for (size_t i = 0; i < chain.size(); ++i) {
    auto it = blocks_.find(chain[i]);
    if (it == blocks_.end()) return false;
    const Block& b = it->second;
    if (i == 0 && (b.policy != policy || !std::equal(prefix.begin(), prefix.end(), b.tokens.begin(), b.tokens.end()))) {
      return false;
    }
    if (i > 0 && (!b.has_parent || b.parent != chain[i - 1])) return false;
  }
  return !chain.empty();
}

bool PrefixIndex::publish_compressed(std::span<const uint64_t> chain, std::span<const int32_t> prefix,
                                     std::string_view policy) {
  if (chain.empty() || blocks_.count(chain[0])) return false;
  for (size_t i = 0; i < chain.size(); ++i) {
    Block b;
    if (i == 0) {
      b.tokens.assign(prefix.begin(), prefix.end());
      b.policy = policy;
    } else {
      b.has_parent = true;
      b.parent = chain[i - 1];
      ++blocks_.at(b.parent).children;  // its parent was published just before, in use: never evictable here
    }
    b.users = 1;
    b.last_used = ++clock_;
    blocks_.emplace(chain[i], std::move(b));
  }
  return true;
}

std::vector<uint64_t> PrefixIndex::evict(int64_t n) {
  std::vector<uint64_t> evicted;
  while (int64_t(evicted.size()) < n && !evictable_.empty()) {
    const uint64_t hash = evictable_.begin()->second;
    evictable_.erase(evictable_.begin());
    const Block b = std::move(blocks_.at(hash));
    blocks_.erase(hash);
    --n_unused_;
    evicted.push_back(hash);
    if (!b.has_parent) continue;
    Block& parent = blocks_.at(b.parent);
    if (--parent.children == 0 && parent.users == 0) evictable_.insert({parent.last_used, b.parent});
  }
  return evicted;
}

}  // namespace strata
