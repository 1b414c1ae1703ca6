#pragma once
// Which replica a request goes to, and where it is retried when that one fails before answering: a pure function
// of what the router knows now (router/replica_set.h) and, for cache-aware routing, how much of the prompt each
// replica was sent before (router/prefix_route_index.h).
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "router/replica_set.h"

namespace strata {

enum class RoutingPolicy {
  cache_aware,  // the longest prefix match unless that replica is busy, then the least loaded
  round_robin,  // each replica in turn, whatever the prompt (the baseline)
};

// "cache_aware" or "round_robin"; throws std::invalid_argument for another name.
RoutingPolicy parse_routing_policy(const std::string& name);

struct ReplicaChoice {
  std::vector<size_t> order;  // every replica: the first choice first, those out of service last
  int matched_blocks = 0;     // the first choice's match
};

// turn: a number that grows by one per request; it rotates round-robin and breaks ties between equal replicas,
// so that new prompts spread. busy_threshold: outstanding requests at which a replica's match no longer counts.
ReplicaChoice choose_replicas(RoutingPolicy policy, std::span<const ReplicaView> replicas,
                              std::span<const int> matched_blocks, double busy_threshold, size_t turn);

}  // namespace strata
