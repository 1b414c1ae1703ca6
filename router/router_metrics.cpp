#include "router/router_metrics.h"

#include <prometheus/text_serializer.h>

namespace strata {
namespace {

using prometheus::Histogram;

// vLLM's time-to-first-token buckets (as leader/metrics.cpp), so that the router's and the replicas' line up.
const Histogram::BucketBoundaries kLatencyBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                                     0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10.0,
                                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};

prometheus::Counter& counter(prometheus::Registry& registry, const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace

RouterMetrics::RouterMetrics(const std::vector<std::string>& replica_urls)
    : registry_(std::make_shared<prometheus::Registry>()),
      urls_(replica_urls),
      requests_(prometheus::BuildCounter()
                    .Name("strata_router_requests_total")
                    .Help("Requests forwarded, by replica and the replica's HTTP status (failed: no answer).")
                    .Register(*registry_)),
      retries_(counter(*registry_, "strata_router_retries_total",
                       "Requests sent to another replica after one failed before answering.")),
      prompt_tokens_(counter(*registry_, "strata_router_prompt_tokens_total", "Prompt tokens routed.")),
      prefix_hit_tokens_(counter(*registry_, "strata_router_prefix_hit_tokens_total",
                                 "Prompt tokens the chosen replica was sent before (the router's estimate of its "
                                 "prefix-cache hits).")) {
  auto& first_byte = prometheus::BuildHistogram()
                         .Name("strata_router_upstream_first_byte_seconds")
                         .Help("Time from forwarding a request to the replica's response header (a stream's first "
                               "event).")
                         .Register(*registry_);
  auto& duration = prometheus::BuildHistogram()
                       .Name("strata_router_upstream_duration_seconds")
                       .Help("Time from forwarding a request to the end of the replica's response.")
                       .Register(*registry_);
  auto& healthy = prometheus::BuildGauge()
                      .Name("strata_router_replica_healthy")
                      .Help("1 while the replica is in service (healthy at its last check), 0 otherwise.")
                      .Register(*registry_);
  auto& in_flight = prometheus::BuildGauge()
                        .Name("strata_router_replica_in_flight")
                        .Help("Requests forwarded to the replica that have not ended.")
                        .Register(*registry_);
  for (const std::string& url : urls_) {
    first_byte_.push_back(&first_byte.Add({{"replica", url}}, kLatencyBuckets));
    duration_.push_back(&duration.Add({{"replica", url}}, kLatencyBuckets));
    healthy_.push_back(&healthy.Add({{"replica", url}}));
    in_flight_.push_back(&in_flight.Add({{"replica", url}}));
  }
}

void RouterMetrics::add_attempt(size_t replica, const std::string& status) {
  requests_.Add({{"replica", urls_[replica]}, {"status", status}}).Increment();
}

void RouterMetrics::add_unanswered() { requests_.Add({{"replica", "none"}, {"status", "503"}}).Increment(); }

void RouterMetrics::add_retry() { retries_.Increment(); }

void RouterMetrics::add_routed_prompt(int prompt_tokens, int expected_cached_tokens) {
  prompt_tokens_.Increment(prompt_tokens);
  prefix_hit_tokens_.Increment(expected_cached_tokens);
}

void RouterMetrics::observe_upstream(size_t replica, double first_byte_s, double total_s) {
  first_byte_[replica]->Observe(first_byte_s);
  duration_[replica]->Observe(total_s);
}

void RouterMetrics::set_replicas(const std::vector<ReplicaView>& views) {
  for (size_t i = 0; i < views.size() && i < healthy_.size(); ++i) {
    healthy_[i]->Set(views[i].in_service ? 1 : 0);
    in_flight_[i]->Set(views[i].in_flight);
  }
}

std::string RouterMetrics::render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace strata
