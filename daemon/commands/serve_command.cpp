// strata serve: load the model, start the engine thread and the HTTP server, run until SIGINT or SIGTERM.
// Under mpirun every rank runs this command: the leader (rank 0) serves HTTP and schedules, the others execute
// their shard of every step (docs/distributed.md).
#include <semaphore.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <iostream>
#include <mutex>
#include <stop_token>
#include <thread>

#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/rank_world.h"
#include "daemon/runtime.h"
#include "leader/engine.h"
#include "leader/metrics.h"
#include "rank/rank_worker.h"
#include "routing/http_server.h"

namespace strata {

namespace {

// SIGINT/SIGTERM post a semaphore that the main thread waits on. A handler, not sigwait: libraries start threads
// before main (OpenBLAS), and a signal delivered to one of those must still end in a clean shutdown, also when
// it arrives while the model is loading.
sem_t g_shutdown;
std::atomic<int> g_signal{0};

void on_signal(int signal) {
  g_signal = signal;
  sem_post(&g_shutdown);  // async-signal-safe
}

void install_signal_handlers() {
  sem_init(&g_shutdown, 0, 0);
  struct sigaction action{};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error code, not the end of the process
}

void print_serve_help() {
  std::cout << "usage: strata serve --config FILE [--port N] [--host H] [--tp T] [--pp P] [--set section.key=value]...\n"
               "configuration keys (YAML sections and keys; --set overrides any of them):\n";
  for (const std::string& k : config_keys()) std::cout << "  " << k << "\n";
}

// How long a step may still take once a shutdown begins before the waits on other ranks are cut short: a rank may
// be gone (mpirun signals every rank when one dies, and kills them a second later).
constexpr std::chrono::milliseconds kStopGrace{500};
// What the HTTP sessions get to write the requests' error responses before the server stops.
constexpr std::chrono::milliseconds kDrain{200};

// A rank other than the leader: executes its shard of every step the leader sends, until the leader ends it.
void serve_as_worker(const ServerConfig& config, RankWorld& world) {
  // The leader's shutdown plan ends this rank (or its silence, or mpirun): a signal forwarded by mpirun must
  // not end it first, while the leader may still be sending it a step.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
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
  options.model_name = rt.model_name;
  options.max_context = rt.weights.config.max_context;
  options.max_n = config.server.max_n;
  options.kv_policies = request_policy_names(config);
  return options;
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

}  // namespace

int serve_command(int argc, char** argv) {
  std::unique_ptr<RankWorld> world;
  try {
    CommandLine cl(argc, argv, {"config", "port", "host", "set", "tp", "pp"}, {"help"}, {"set"});
    if (cl.has("help")) {
      print_serve_help();
      return 0;
    }
    ServerConfig config = load_command_config(cl);
    if (cl.has("port")) apply_config_override(config, "server.port=" + cl.get("port"));
    if (cl.has("host")) apply_config_override(config, "server.host=" + cl.get("host"));
    if (cl.has("tp")) apply_config_override(config, "parallel.tp=" + cl.get("tp"));
    if (cl.has("pp")) apply_config_override(config, "parallel.pp=" + cl.get("pp"));
    world = std::make_unique<RankWorld>(config);
    if (!world->grid().is_leader()) {
      serve_as_worker(config, *world);
      return 0;
    }

    install_signal_handlers();
    std::unique_ptr<RankRuntime> rt = make_runtime(config, world.get());
    if (!rt->tokenizer) throw ConfigError(config.file + ": model.path: a served model needs a tokenizer");
    std::unique_ptr<StepDispatcher> ranks = make_dispatcher(*rt, world.get());
    ServerMetrics metrics(rt->weights.config.max_context);
    EngineOptions engine_settings = engine_options(config, *rt);
    std::mutex failure_mutex;
    std::string rank_failure;
    engine_settings.on_rank_failure = [&](const std::string& message) {
      {
        std::lock_guard lock(failure_mutex);
        rank_failure = message;
      }
      sem_post(&g_shutdown);
    };
    Engine engine(*ranks, *rt->tokenizer, rt->weights.config, metrics, std::move(engine_settings));
    engine.start();
    HttpServer server(server_options(config, *rt), engine, *rt->tokenizer, *rt->chat_template);
    server.start();
    std::cerr << "strata: serving " << rt->model_name << " on http://" << config.server.host << ":" << server.port()
              << std::endl;

    while (sem_wait(&g_shutdown) != 0) {
    }
    std::string failure;
    {
      std::lock_guard lock(failure_mutex);
      failure = rank_failure;
    }
    if (failure.empty()) {
      std::cerr << "strata: signal " << g_signal.load() << ", shutting down"
                << (world->distributed() ? " (mpirun also signals every rank when one dies, and names it)" : "")
                << std::endl;
    }
    shut_down(*world, engine, server, *ranks, failure);
    return 0;
  } catch (const std::exception& e) {
    // With other ranks waiting on this one, an error here must end them too.
    if (world && world->distributed()) world->abort(std::string("strata serve: ") + e.what());
    std::cerr << "strata serve: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
