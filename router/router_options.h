#pragma once
// How strata route runs (the router: section of the configuration, --replica; daemon/server_config.h).
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "router/replica_choice.h"
#include "routing/protocol_limits.h"

namespace strata {

struct RouterOptions {
  std::vector<std::string> replicas;  // http://host:port of each strata serve
  RoutingPolicy policy = RoutingPolicy::cache_aware;
  int block_size = 16;                // the replicas' kv_cache.block_size: the blocks their prefix caches key
  size_t index_blocks = 1 << 18;      // blocks the router remembers (least recently used out)
  double busy_threshold = 8;          // outstanding requests at which a replica's prefix match stops counting
  std::chrono::milliseconds health_interval{500};
  std::chrono::milliseconds health_timeout{1000};
  std::chrono::milliseconds connect_timeout{1000};
  std::chrono::milliseconds upstream_timeout{600'000};  // each read of a response (a long prefill sends nothing)
  bool forward_api_key = true;        // the client's Authorization header goes on to the replica
  // How requests are parsed to find their prompt (the served model's name and context).
  ProtocolLimits limits;
};

}  // namespace strata
