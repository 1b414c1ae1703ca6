// strata serve: load the model, start the engine thread and the HTTP server, run until SIGINT or SIGTERM (a
// graceful drain, then the end; a second one ends at once). Under mpirun every rank runs this command: the leader
// (rank 0) serves HTTP and schedules, the others execute their shard of every step (docs/distributed.md).
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <functional>
#include <iostream>
#include <mutex>
#include <stop_token>
#include <thread>

#include "cache/compression_policy.h"
#include "daemon/build_commit.h"
#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/shutdown_signals.h"
#include "daemon/rank_world.h"
#include "daemon/runtime.h"
#include "leader/engine.h"
#include "kernels/cpu/amx_probe.h"
#include "kernels/cpu/quantized_dot.h"
#include "leader/metrics.h"
#include "rank/rank_worker.h"
#include "routing/api_keys.h"
#include "routing/descriptor_limit.h"
#include "routing/http_server.h"

namespace strata {

namespace {

void print_serve_help() {
  std::cout << "usage: strata serve --config FILE [--port N] [--host H] [--tp T] [--pp P] [--api-key KEY]...\n"
               "                    [--set section.key=value]...\n"
               "--api-key adds a key to server.api_keys (a key file is safer: command lines are visible to all).\n"
               "SIGTERM, SIGINT or SIGUSR1: drain (refuse new requests, finish those in flight for up to\n"
               "server.drain_timeout_s), then exit 0; a second SIGTERM or SIGINT ends at once. Under mpirun send\n"
               "SIGUSR1 to mpirun (it forwards it to every rank) or SIGTERM to rank 0: mpirun kills the ranks 1 s\n"
               "after its own SIGTERM.\n"
               "configuration keys (YAML sections and keys; --set overrides any of them):\n";
  for (const std::string& k : config_keys()) std::cout << "  " << k << "\n";
}

// How long a step may still take once a shutdown begins before the waits on other ranks are cut short: a rank may
// be gone (mpirun signals every rank when one dies, and kills them a second later).
constexpr std::chrono::milliseconds kStopGrace{500};
// What the HTTP sessions get to write the requests' error responses before the server stops.
constexpr std::chrono::milliseconds kDrain{200};
// How often a drain looks whether the requests in flight are done.
constexpr std::chrono::milliseconds kDrainPoll{50};

// A rank other than the leader: executes its shard of every step the leader sends, until the leader ends it.
void serve_as_worker(const ServerConfig& config, RankWorld& world) {
  // The leader's shutdown plan ends this rank (or its silence, or mpirun): a signal forwarded by mpirun must
  // not end it first, while the leader may still be sending it a step.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  std::signal(SIGUSR1, SIG_IGN);  // the leader's drain signal, which mpirun forwards to every rank
  std::unique_ptr<RankRuntime> rt = make_runtime(config, &world);
  run_worker(world.grid(), *rt->exchange, *rt->executor, *rt->cache,
             [&](const std::string& message) { world.abort(message); });
}

ServerOptions server_options(const ServerConfig& config, const RankRuntime& rt) {
  ServerOptions options;
  options.host = config.server.host;
  options.port = uint16_t(config.server.port);
  options.threads = config.server.threads;
  options.max_body_bytes = size_t(config.server.max_body_bytes);
  ProtocolLimits& limits = options.limits;
  limits.model_name = rt.model_name;
  limits.max_context = rt.weights.config.max_context;
  limits.max_n = config.server.max_n;
  limits.max_prompts = config.server.max_prompts;
  limits.max_sequences = config.engine.max_waiting;
  limits.kv_policies = request_policy_names(config);
  limits.check_kv_policy = [&executor = *rt.executor](const PolicySpec& spec) { executor.check_request_policy(spec); };
  limits.ignore_unknown_fields = config.server.ignore_unknown_fields;
  options.access_log = config.server.access_log;
  options.idle_timeout = std::chrono::seconds(config.server.idle_timeout_s);
  options.max_connections = config.server.max_connections;
  options.api_keys = configured_api_keys(config);
  options.metrics_require_key = config.server.metrics_require_key;
  return options;
}

// What the HTTP server needs from the process: descriptors for every connection it may hold; and a word when it
// is open to the network without a key.
void check_server_options(const ServerConfig& config, const ServerOptions& options) {
  const std::string problem =
      connection_budget_problem(options.max_connections, count_open_descriptors(), raise_descriptor_limit());
  if (!problem.empty()) throw ConfigError(config.file + ": server.max_connections: " + problem);
  if (!options.api_keys.empty()) {
    std::cerr << "strata: " << options.api_keys.size() << " API key(s) configured: /v1/*"
              << (options.metrics_require_key ? " and /metrics" : "") << " need one" << std::endl;
  } else if (!is_loopback_host(options.host)) {
    std::cerr << "strata: warning: no API key is configured and the server listens on " << options.host
              << ": anyone who reaches it can use it (server.api_keys, server.api_key_file, --api-key)" << std::endl;
  }
}

// The graceful part of a shutdown: no new requests, and those in flight (running and queued) get up to
// server.drain_timeout_s to finish. Returns early on a SIGINT or SIGTERM beyond the `n_ending` seen so far, or on
// a rank failure (`failed`).
void drain(Engine& engine, HttpServer& server, std::chrono::seconds timeout, int n_ending,
           const std::function<bool()>& failed) {
  server.start_draining();
  engine.drain();
  std::cerr << "strata: signal " << last_signal() << ", draining: " << server.n_in_flight()
            << " request(s) in flight get up to " << timeout.count()
            << " s to finish (a second SIGTERM or SIGINT ends at once)" << std::endl;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!(engine.idle() && server.n_in_flight() == 0)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::cerr << "strata: drain timed out; ending the " << server.n_in_flight() << " request(s) still in flight"
                << std::endl;
      return;
    }
    if (wait_for_signal(kDrainPoll) && (n_ending_signals() > n_ending || failed())) return;
  }
  std::cerr << "strata: drained" << std::endl;
}

// The leader's shutdown: the engine fails what is in flight, the sessions then write those errors before the
// server stops, and the other ranks are told to stop (or, after a rank failure, the world is ended).
void shut_down(RankWorld& world, Engine& engine, HttpServer& server, StepDispatcher& ranks,
               const std::string& failure) {
  std::jthread interrupter([&](std::stop_token stop) {
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock lock(m);
    cv.wait_for(lock, stop, kStopGrace, [] { return false; });
    if (!stop.stop_requested()) world.interrupt();
  });
  engine.stop();
  interrupter.request_stop();
  std::this_thread::sleep_for(kDrain);
  server.stop();
  if (!failure.empty()) world.abort("strata serve: " + failure + "; ending the world");
  try {
    ranks.shutdown();
  } catch (const RankFailure& e) {
    world.abort(std::string("strata serve: the other ranks could not be told to stop: ") + e.what());
  }
}

// Serves until a signal or a rank failure; then drains (unless a rank failed, two ending signals came at once, or
// the drain timeout is 0) and shuts down. failure(): why the world broke, or "".
void serve_until_stopped(RankWorld& world, Engine& engine, HttpServer& server, StepDispatcher& ranks,
                         std::chrono::seconds drain_timeout, const std::function<std::string()>& failure) {
  wait_for_shutdown();
  const int n_ending = n_ending_signals();
  const auto failed = [&] { return !failure().empty(); };
  if (!failed() && n_ending < 2 && drain_timeout.count() > 0) drain(engine, server, drain_timeout, n_ending, failed);
  const std::string why = failure();
  if (why.empty()) {
    std::cerr << "strata: signal " << last_signal() << ", shutting down"
              << (world.distributed() ? " (mpirun also signals every rank when one dies, and names it)" : "")
              << std::endl;
  }
  shut_down(world, engine, server, ranks, why);
}

}  // namespace

int serve_command(int argc, char** argv) {
  std::unique_ptr<RankWorld> world;
  try {
    CommandLine cl(argc, argv, {"config", "port", "host", "set", "tp", "pp", "api-key"}, {"help"}, {"set", "api-key"});
    if (cl.has("help")) {
      print_serve_help();
      return 0;
    }
    ServerConfig config = load_command_config(cl);
    apply_listener_flags(cl, config);
    if (cl.has("tp")) apply_config_override(config, "parallel.tp=" + cl.get("tp"));
    if (cl.has("pp")) apply_config_override(config, "parallel.pp=" + cl.get("pp"));
    world = std::make_unique<RankWorld>(config);
    if (!world->grid().is_leader()) {
      serve_as_worker(config, *world);
      return 0;
    }

    install_shutdown_signals();
    std::unique_ptr<RankRuntime> rt = make_runtime(config, world.get());
    if (!rt->tokenizer) throw ConfigError(config.file + ": model.path: a served model needs a tokenizer");
    std::unique_ptr<StepDispatcher> ranks = make_dispatcher(*rt, world.get());
    ServerMetrics metrics(rt->weights.config.max_context, layer_metrics());
    metrics.set_build_info(build_commit(), rt->backend->name(), std::string(cpu::cpu_isa_name(cpu::best_cpu_isa())),
                           std::string(cpu::amx_state_name(cpu::amx_probe().state)));
    metrics.set_kv_cache_info(config.kv_cache.dtype, dtype_name(rt->pool->layout().dtype));
    EngineOptions engine_settings = engine_options(config, *rt);
    std::mutex failure_mutex;
    std::string rank_failure;
    engine_settings.on_rank_failure = [&](const std::string& message) {
      {
        std::lock_guard lock(failure_mutex);
        rank_failure = message;
      }
      post_shutdown();
    };
    ServerOptions options = server_options(config, *rt);
    check_server_options(config, options);
    Engine engine(*ranks, *rt->tokenizer, rt->weights.config, metrics, std::move(engine_settings));
    engine.start();
    HttpServer server(std::move(options), engine, *rt->tokenizer, *rt->chat_template);
    server.start();
    std::cerr << "strata: serving " << rt->model_name << " on http://" << config.server.host << ":" << server.port()
              << std::endl;
    serve_until_stopped(*world, engine, server, *ranks, std::chrono::seconds(config.server.drain_timeout_s), [&] {
      std::lock_guard lock(failure_mutex);
      return rank_failure;
    });
    return 0;
  } catch (const std::exception& e) {
    // With other ranks waiting on this one, an error here must end them too.
    if (world && world->distributed()) world->abort(std::string("strata serve: ") + e.what());
    std::cerr << "strata serve: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
