#include "router/prefix_route_index.h"

#include <stdexcept>
#include <string>

namespace strata {

PrefixRouteIndex::PrefixRouteIndex(size_t capacity, size_t n_replicas) : capacity_(capacity), n_replicas_(n_replicas) {
  if (capacity < 1) throw std::invalid_argument("prefix route index: capacity must be positive");
  if (n_replicas > kMaxReplicas) {
    throw std::invalid_argument("the router takes at most " + std::to_string(kMaxReplicas) + " replicas");
  }
}

// The chain names prefixes, so a replica sent block i was sent every block before it: its match is its deepest
// block (blocks before it may have been evicted here first, being older).
std::vector<int> PrefixRouteIndex::matched_blocks(std::span<const uint64_t> chain) const {
  std::vector<int> matched(n_replicas_, 0);
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < chain.size(); ++i) {
    auto it = entries_.find(chain[i]);
    if (it == entries_.end()) continue;
    for (size_t r = 0; r < n_replicas_; ++r) {
      if (it->second.replicas >> r & 1) matched[r] = int(i + 1);
    }
  }
  return matched;
}

void PrefixRouteIndex::record(std::span<const uint64_t> chain, size_t replica) {
  std::lock_guard lock(mutex_);
  for (uint64_t hash : chain) {
    auto [it, added] = entries_.try_emplace(hash);
    if (!added) recency_.erase(it->second.recency);
    recency_.push_front(hash);
    it->second.recency = recency_.begin();
    it->second.replicas |= uint64_t(1) << replica;
  }
  while (entries_.size() > capacity_) {
    entries_.erase(recency_.back());
    recency_.pop_back();
  }
}

void PrefixRouteIndex::forget(size_t replica) {
  std::lock_guard lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    it->second.replicas &= ~(uint64_t(1) << replica);
    if (it->second.replicas == 0) {
      recency_.erase(it->second.recency);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t PrefixRouteIndex::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace strata
