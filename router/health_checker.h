#pragma once
// The router's health checks, on a thread of their own: every interval, each replica's /health (200: in service;
// 503 draining or unavailable, or no answer within the timeout: out) and, while it is in service, its /metrics for
// its load. A replica that comes back may have restarted: the index forgets what it was sent.
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "router/prefix_route_index.h"
#include "router/replica_set.h"
#include "router/router_metrics.h"

namespace strata {

// The load series of a replica's /metrics text (leader/metrics.cpp's names); absent ones stay 0.
ReplicaLoad parse_replica_load(std::string_view metrics_text);

// A replica's state from its /health answer: "ok" (200), "draining" or "unavailable" (what its body says), or
// "unreachable" (status 0: no answer).
std::string health_verdict(unsigned status, std::string_view body);

class HealthChecker {
 public:
  HealthChecker(ReplicaSet& replicas, PrefixRouteIndex& index, RouterMetrics& metrics,
                std::chrono::milliseconds interval, std::chrono::milliseconds timeout);
  ~HealthChecker();  // stops
  HealthChecker(const HealthChecker&) = delete;
  HealthChecker& operator=(const HealthChecker&) = delete;

  void start();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
