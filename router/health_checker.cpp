#include "router/health_checker.h"

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "router/upstream_connection.h"

namespace strata {
namespace {

// The value of an unlabelled series `name` in Prometheus text, or 0.
double series_value(std::string_view text, std::string_view name) {
  size_t at = 0;
  while ((at = text.find(name, at)) != std::string_view::npos) {
    const bool line_start = at == 0 || text[at - 1] == '\n';
    const size_t after = at + name.size();
    if (line_start && after < text.size() && text[after] == ' ') {
      return std::strtod(std::string(text.substr(after + 1, text.find('\n', after) - after - 1)).c_str(), nullptr);
    }
    at = after;
  }
  return 0;
}

}  // namespace

ReplicaLoad parse_replica_load(std::string_view metrics_text) {
  return ReplicaLoad{series_value(metrics_text, "strata_requests_running"),
                     series_value(metrics_text, "strata_requests_waiting"),
                     series_value(metrics_text, "strata_kv_blocks_free"),
                     series_value(metrics_text, "strata_kv_blocks_total")};
}

std::string health_verdict(unsigned status, std::string_view body) {
  if (status == 0) return "unreachable";
  if (status == 200) return "ok";
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_object() && parsed.value("status", "") == "draining") return "draining";
  return "unavailable";
}

struct HealthChecker::Impl {
  Impl(ReplicaSet& replicas_in, PrefixRouteIndex& index_in, RouterMetrics& metrics_in,
       std::chrono::milliseconds interval_in, std::chrono::milliseconds timeout_in)
      : replicas(replicas_in), index(index_in), metrics(metrics_in), interval(interval_in), timeout(timeout_in) {}

  ReplicaSet& replicas;
  PrefixRouteIndex& index;
  RouterMetrics& metrics;
  std::chrono::milliseconds interval;
  std::chrono::milliseconds timeout;
  net::io_context io_context{1};
  std::thread thread;

  net::awaitable<void> check_forever(size_t replica);
};

net::awaitable<void> HealthChecker::Impl::check_forever(size_t replica) {
  auto executor = co_await net::this_coro::executor;
  const ReplicaEndpoint& endpoint = replicas.endpoint(replica);
  for (;;) {
    const FetchedResponse health = co_await fetch(executor, endpoint, "/health", timeout);
    if (replicas.set_status(replica, health_verdict(health.error ? 0 : health.status, health.body))) {
      index.forget(replica);
    }
    if (health.status == 200 && !health.error) {
      const FetchedResponse load = co_await fetch(executor, endpoint, "/metrics", timeout);
      if (!load.error && load.status == 200) replicas.set_load(replica, parse_replica_load(load.body));
    }
    metrics.set_replicas(replicas.views());
    net::steady_timer pause(executor, interval);
    if (auto [ec] = co_await pause.async_wait(use_nothrow); ec) co_return;
  }
}

HealthChecker::HealthChecker(ReplicaSet& replicas, PrefixRouteIndex& index, RouterMetrics& metrics,
                             std::chrono::milliseconds interval, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>(replicas, index, metrics, interval, timeout)) {}

HealthChecker::~HealthChecker() { stop(); }

void HealthChecker::start() {
  for (size_t i = 0; i < impl_->replicas.size(); ++i) {
    net::co_spawn(impl_->io_context, impl_->check_forever(i), net::detached);
  }
  impl_->thread = std::thread([this] { impl_->io_context.run(); });
}

void HealthChecker::stop() {
  impl_->io_context.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace strata
