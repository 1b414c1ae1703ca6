#include "router/router.h"

#include <stdexcept>

#include "router/forwarding_handler.h"
#include "router/health_checker.h"
#include "router/prefix_route_index.h"
#include "router/replica_set.h"
#include "router/router_metrics.h"

namespace strata {
namespace {

std::vector<ReplicaEndpoint> endpoints_of(const std::vector<std::string>& urls) {
  if (urls.empty()) throw std::invalid_argument("no replica: give at least one (--replica URL, router.replicas)");
  std::vector<ReplicaEndpoint> endpoints;
  for (const std::string& url : urls) {
    endpoints.push_back(parse_replica_url(url));
    for (size_t i = 0; i + 1 < endpoints.size(); ++i) {
      if (endpoints[i].url == endpoints.back().url) throw std::invalid_argument("replica '" + url + "' given twice");
    }
  }
  return endpoints;
}

std::vector<std::string> urls_of(const ReplicaSet& replicas) {
  std::vector<std::string> urls;
  for (size_t i = 0; i < replicas.size(); ++i) urls.push_back(replicas.endpoint(i).url);
  return urls;
}

}  // namespace

struct Router::Impl {
  Impl(RouterOptions options_in, ServerOptions server_options, const Tokenizer& tokenizer,
       const ChatTemplate& chat_template)
      : options(std::move(options_in)),
        replicas(endpoints_of(options.replicas)),
        index(options.index_blocks, replicas.size()),
        metrics(urls_of(replicas)),
        handler(options, replicas, index, metrics, tokenizer, chat_template),
        health(replicas, index, metrics, options.health_interval, options.health_timeout),
        server(std::move(server_options), handler, tokenizer, chat_template) {}

  RouterOptions options;
  ReplicaSet replicas;
  PrefixRouteIndex index;
  RouterMetrics metrics;
  ForwardingHandler handler;
  HealthChecker health;
  HttpServer server;  // last: stopped and destroyed first
};

Router::Router(RouterOptions options, ServerOptions server_options, const Tokenizer& tokenizer,
               const ChatTemplate& chat_template)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(server_options), tokenizer, chat_template)) {}

Router::~Router() { stop(); }

void Router::start() {
  impl_->health.start();
  impl_->server.start();
}

uint16_t Router::port() const { return impl_->server.port(); }

void Router::start_draining() {
  impl_->handler.start_draining();
  impl_->server.start_draining();
}

int Router::n_in_flight() const { return impl_->handler.n_in_flight(); }

void Router::stop() {
  impl_->server.stop();
  impl_->health.stop();
}

}  // namespace strata
