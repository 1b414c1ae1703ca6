#pragma once
// A replica's address: "http://host:port" as the operator writes it (--replica, router.replicas).
#include <cstdint>
#include <string>

namespace strata {

struct ReplicaEndpoint {
  std::string url;  // as given, without a trailing slash: the replica's name in metrics and /health
  std::string host;
  uint16_t port = 80;
};

// Parses "http://host[:port][/]". Throws std::invalid_argument naming the URL and what is wrong with it (another
// scheme, a path, a bad port).
ReplicaEndpoint parse_replica_url(const std::string& url);

}  // namespace strata
