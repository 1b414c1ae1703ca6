// strata serve: load the model, start the engine thread and the HTTP server, run until SIGINT or SIGTERM.
#include <semaphore.h>

#include <atomic>
#include <csignal>
#include <iostream>

#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/engine.h"
#include "daemon/metrics.h"
#include "daemon/runtime.h"
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

}  // namespace

int serve_command(int argc, char** argv) {
  try {
    CommandLine cl(argc, argv, {"config", "port", "host", "set", "tp", "pp"}, {"help"}, {"set"});
    if (cl.has("help")) {
      print_serve_help();
      return 0;
    }
    ServerConfig config = load_server_config(cl.get("config", "configs/smollm2-cpu.yaml"));
    for (const std::string& s : cl.get_all("set")) apply_config_override(config, s);
    if (cl.has("port")) apply_config_override(config, "server.port=" + cl.get("port"));
    if (cl.has("host")) apply_config_override(config, "server.host=" + cl.get("host"));
    if (cl.has("tp")) apply_config_override(config, "parallel.tp=" + cl.get("tp"));
    if (cl.has("pp")) apply_config_override(config, "parallel.pp=" + cl.get("pp"));
    if (config.parallel.tp * config.parallel.pp != 1) {
      throw ConfigError(config.file + ": parallel.tp x parallel.pp = " +
                        std::to_string(config.parallel.tp * config.parallel.pp) +
                        ": this build serves one rank; multi-rank execution under mpirun is not implemented yet");
    }

    install_signal_handlers();
    std::unique_ptr<Runtime> rt = make_runtime(config);
    if (!rt->tokenizer) throw ConfigError(config.file + ": model.path: a served model needs a tokenizer");
    ServerMetrics metrics(rt->weights.config.max_context);
    Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, engine_options(config));
    engine.start();

    ServerOptions options;
    options.host = config.server.host;
    options.port = uint16_t(config.server.port);
    options.threads = config.server.threads;
    options.max_body_bytes = size_t(config.server.max_body_bytes);
    options.model_name = rt->model_name;
    options.max_context = rt->weights.config.max_context;
    options.max_n = config.server.max_n;
    options.kv_policies = request_policy_names(config);
    HttpServer server(options, engine, *rt->tokenizer, *rt->chat_template);
    server.start();
    std::cerr << "strata: serving " << rt->model_name << " on http://" << config.server.host << ":" << server.port()
              << std::endl;

    while (sem_wait(&g_shutdown) != 0) {
    }
    std::cerr << "strata: signal " << g_signal.load() << ", shutting down" << std::endl;
    server.stop();
    engine.stop();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "strata serve: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
