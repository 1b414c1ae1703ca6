#pragma once
// The replicas as the router sees them: whether each is in service (its last health check, and no failed request
// since), its load (the router's own requests in flight, and what its /metrics last said) and why it is out.
// Shared by the health checker and the requests; every call takes a lock.
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "router/replica_endpoint.h"

namespace strata {

// What a replica's /metrics said last (leader/metrics.cpp's series).
struct ReplicaLoad {
  double running = 0;       // strata_requests_running
  double waiting = 0;       // strata_requests_waiting
  double free_blocks = 0;   // strata_kv_blocks_free
  double total_blocks = 0;  // strata_kv_blocks_total
};

struct ReplicaView {
  bool in_service = false;         // no request goes to it before a health check finds it well
  std::string status = "unknown";  // the last verdict: ok, draining, unavailable, unreachable, failed
  int in_flight = 0;               // requests the router forwarded to it that have not ended
  ReplicaLoad load;
  // The requests it holds: the router's own, or more where its metrics count some from other clients.
  double outstanding() const;
};

class ReplicaSet {
 public:
  explicit ReplicaSet(std::vector<ReplicaEndpoint> endpoints);

  size_t size() const { return endpoints_.size(); }
  const ReplicaEndpoint& endpoint(size_t i) const { return endpoints_[i]; }
  std::vector<ReplicaView> views() const;

  // A health check's verdict ("ok" puts it in service). Returns true when the replica comes back into service:
  // it may have restarted, with an empty cache.
  bool set_status(size_t i, const std::string& status);
  void set_load(size_t i, const ReplicaLoad& load);
  // A forwarded request could not reach it: out of service until a health check finds it well again.
  void mark_failed(size_t i);
  void begin_request(size_t i);
  void end_request(size_t i);

 private:
  const std::vector<ReplicaEndpoint> endpoints_;
  mutable std::mutex mutex_;
  std::vector<ReplicaView> views_;
};

}  // namespace strata
