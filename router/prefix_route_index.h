#pragma once
// Which replicas the router sent which prompt blocks to: a block's hash (leader/block_hash_chain.h, which names the
// whole prefix up to the block's end) -> one bit per replica. Bounded: past `capacity` blocks the least recently
// used goes. An estimate of what the replicas' prefix caches hold (they evict on their own), good enough to send a
// prompt where its prefix most likely is. Thread-safe.
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

namespace strata {

class PrefixRouteIndex {
 public:
  static constexpr size_t kMaxReplicas = 64;  // one bit each

  PrefixRouteIndex(size_t capacity, size_t n_replicas);

  // For each replica, how many leading blocks of `chain` it was sent.
  std::vector<int> matched_blocks(std::span<const uint64_t> chain) const;
  // The prompt of `chain` went to `replica`.
  void record(std::span<const uint64_t> chain, size_t replica);
  // The replica lost its cache (it restarted): it holds none of the blocks.
  void forget(size_t replica);
  size_t size() const;

 private:
  struct Entry {
    uint64_t replicas = 0;
    std::list<uint64_t>::iterator recency;
  };

  const size_t capacity_;
  const size_t n_replicas_;
  mutable std::mutex mutex_;
  std::list<uint64_t> recency_;  // most recently used first
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace strata
