// strata route: a router over replicas (strata serve processes) that answers the same OpenAI API by forwarding
// each request to one of them, cache-aware (router/). It loads the model's tokenizer, not its weights. SIGTERM,
// SIGINT or SIGUSR1 drain it as they drain strata serve.
#include <chrono>
#include <iostream>

#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/shutdown_signals.h"
#include "daemon/runtime.h"
#include "cache/compression_policy.h"
#include "router/router.h"
#include "routing/api_keys.h"
#include "routing/descriptor_limit.h"

namespace strata {
namespace {

// How often a drain looks whether the requests in flight are done.
constexpr std::chrono::milliseconds kDrainPoll{50};

void print_route_help() {
  std::cout << "usage: strata route --config FILE [--replica http://HOST:PORT]... [--policy cache_aware|round_robin]\n"
               "                    [--port N] [--host H] [--api-key KEY]... [--set section.key=value]...\n"
               "Forwards the OpenAI API to the replicas (--replica, repeatable, or router.replicas), each request to\n"
               "the replica that most likely holds its prompt's prefix in its cache unless that one is busy, then\n"
               "to the least loaded; /health and /metrics are the router's own. It reads model.* for the tokenizer\n"
               "(the replicas' model), kv_cache.block_size for their blocks, server.* for its own listener and\n"
               "keys, router.* for the rest. SIGTERM, SIGINT or SIGUSR1: drain as strata serve does.\n"
               "configuration keys of the router: section:\n";
  for (const std::string& k : config_keys()) {
    if (k.rfind("router.", 0) == 0) std::cout << "  " << k << "\n";
  }
}

RouterOptions router_options(const ServerConfig& config, const ModelFrontEnd& model) {
  RouterOptions options;
  const ServerConfig::Router& r = config.router;
  options.replicas = r.replicas;
  options.policy = parse_routing_policy(r.policy);
  options.block_size = config.kv_cache.block_size;
  options.index_blocks = size_t(r.index_blocks);
  options.busy_threshold = r.busy_threshold;
  options.health_interval = std::chrono::milliseconds(r.health_interval_ms);
  options.health_timeout = std::chrono::milliseconds(r.health_timeout_ms);
  options.connect_timeout = std::chrono::milliseconds(r.connect_timeout_ms);
  options.upstream_timeout = std::chrono::seconds(r.upstream_timeout_s);
  options.forward_api_key = r.forward_api_key;
  options.limits.model_name = model.model_name;
  options.limits.max_context = model.max_context;
  options.limits.vocab_size = model.tokenizer.vocab_size();
  options.limits.max_n = config.server.max_n;
  options.limits.max_prompts = config.server.max_prompts;
  options.limits.kv_policies = policy_names();  // the replicas check what they allow
  options.limits.ignore_unknown_fields = true;
  return options;
}

ServerOptions listener_options(const ServerConfig& config) {
  ServerOptions options;
  options.host = config.server.host;
  options.port = uint16_t(config.server.port);
  options.threads = config.server.threads;
  options.max_body_bytes = size_t(config.server.max_body_bytes);
  options.access_log = config.server.access_log;
  options.idle_timeout = std::chrono::seconds(config.server.idle_timeout_s);
  options.max_connections = config.server.max_connections;
  options.api_keys = configured_api_keys(config);
  options.metrics_require_key = config.server.metrics_require_key;
  const std::string problem =
      connection_budget_problem(options.max_connections, count_open_descriptors(), raise_descriptor_limit());
  if (!problem.empty()) throw ConfigError(config.file + ": server.max_connections: " + problem);
  return options;
}

// The command line over the configuration file: --replica replaces router.replicas, the rest as strata serve.
ServerConfig route_config(const CommandLine& cl) {
  ServerConfig config = load_command_config(cl);
  if (cl.has("replica")) {
    std::string urls;
    for (const std::string& url : cl.get_all("replica")) urls += (urls.empty() ? "" : ",") + url;
    apply_config_override(config, "router.replicas=" + urls);
  }
  if (cl.has("policy")) apply_config_override(config, "router.policy=" + cl.get("policy"));
  apply_listener_flags(cl, config);
  if (config.router.replicas.empty()) {
    throw ConfigError(config.file + ": router.replicas: no replica (give --replica http://HOST:PORT or the list)");
  }
  return config;
}

// Refuses new requests and waits for those in flight, up to server.drain_timeout_s or a second ending signal.
void drain(Router& router, std::chrono::seconds timeout, int n_ending) {
  router.start_draining();
  std::cerr << "strata route: signal " << last_signal() << ", draining: " << router.n_in_flight()
            << " request(s) in flight get up to " << timeout.count() << " s to finish" << std::endl;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (router.n_in_flight() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::cerr << "strata route: drain timed out; ending the " << router.n_in_flight() << " request(s) in flight"
                << std::endl;
      return;
    }
    if (wait_for_signal(kDrainPoll) && n_ending_signals() > n_ending) return;
  }
  std::cerr << "strata route: drained" << std::endl;
}

}  // namespace

int route_command(int argc, char** argv) {
  try {
    CommandLine cl(argc, argv, {"config", "replica", "policy", "port", "host", "set", "api-key"}, {"help"},
                   {"replica", "set", "api-key"});
    if (cl.has("help")) {
      print_route_help();
      return 0;
    }
    const ServerConfig config = route_config(cl);
    install_shutdown_signals();
    const ModelFrontEnd model = load_model_front_end(config);
    Router router(router_options(config, model), listener_options(config), model.tokenizer, model.chat_template);
    router.start();
    std::cerr << "strata route: " << config.router.replicas.size() << " replica(s) of " << model.model_name << " ("
              << config.router.policy << ") on http://" << config.server.host << ":" << router.port() << std::endl;
    wait_for_shutdown();
    const int n_ending = n_ending_signals();
    if (n_ending < 2 && config.server.drain_timeout_s > 0) {
      drain(router, std::chrono::seconds(config.server.drain_timeout_s), n_ending);
    }
    std::cerr << "strata route: signal " << last_signal() << ", shutting down" << std::endl;
    router.stop();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "strata route: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
