#pragma once
// The router's own /metrics (strata_router_*): requests per replica and status, retries, the prompt tokens it
// routed and how many of them it expects the chosen replica's prefix cache to hold, upstream latency per replica,
// and each replica's health and requests in flight. The replicas' own series stay on their /metrics.
#include <memory>
#include <string>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "router/replica_set.h"

namespace strata {

class RouterMetrics {
 public:
  explicit RouterMetrics(const std::vector<std::string>& replica_urls);

  // One attempt's end on a replica: its HTTP status, or "failed" when it gave none (refused, reset, timed out).
  void add_attempt(size_t replica, const std::string& status);
  // A request no replica answered.
  void add_unanswered();
  void add_retry();
  void add_routed_prompt(int prompt_tokens, int expected_cached_tokens);
  // Seconds from sending to the response's header (a stream's first event), and to its end.
  void observe_upstream(size_t replica, double first_byte_s, double total_s);
  void set_replicas(const std::vector<ReplicaView>& views);
  std::string render() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::vector<std::string> urls_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Counter& retries_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& prefix_hit_tokens_;
  std::vector<prometheus::Histogram*> first_byte_;
  std::vector<prometheus::Histogram*> duration_;
  std::vector<prometheus::Gauge*> healthy_;
  std::vector<prometheus::Gauge*> in_flight_;
};

}  // namespace strata
