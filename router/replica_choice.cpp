#include "router/replica_choice.h"

#include <algorithm>
#include <stdexcept>

namespace strata {

RoutingPolicy parse_routing_policy(const std::string& name) {
  if (name == "cache_aware") return RoutingPolicy::cache_aware;
  if (name == "round_robin") return RoutingPolicy::round_robin;
  throw std::invalid_argument("expected cache_aware or round_robin, got '" + name + "'");
}

ReplicaChoice choose_replicas(RoutingPolicy policy, std::span<const ReplicaView> replicas,
                              std::span<const int> matched_blocks, double busy_threshold, size_t turn) {
  const size_t n = replicas.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = (turn + i) % n;  // round-robin's order, and the tie-breaker
  auto match = [&](size_t i) {
    const bool counts = policy == RoutingPolicy::cache_aware && replicas[i].outstanding() < busy_threshold;
    return counts ? matched_blocks[i] : 0;
  };
  // The free share of its KV pool in eighths, from its last /metrics: cached blocks count as used there, so among
  // equally loaded replicas a new prompt goes where fewer are cached, and the documents spread over the pools.
  auto free_eighths = [&](size_t i) {
    const ReplicaLoad& load = replicas[i].load;
    return load.total_blocks > 0 ? int(8 * load.free_blocks / load.total_blocks) : 8;
  };
  // In service first; then, cache-aware, the longest match, the least loaded, the most free; ties keep the rotation.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (replicas[a].in_service != replicas[b].in_service) return replicas[a].in_service;
    if (policy == RoutingPolicy::round_robin) return false;
    if (match(a) != match(b)) return match(a) > match(b);
    if (replicas[a].outstanding() != replicas[b].outstanding()) {
      return replicas[a].outstanding() < replicas[b].outstanding();
    }
    return free_eighths(a) > free_eighths(b);
  });
  ReplicaChoice choice{order, 0};
  if (n > 0) choice.matched_blocks = matched_blocks[order.front()];
  return choice;
}

}  // namespace strata
