// strata bench: prefill and decode throughput of the engine, in-process (no HTTP), for several batch sizes.
// Each batch size runs B requests of P random prompt tokens that each generate G tokens (greedy, EOS ignored):
//   prefill tokens/s = B*P / (time until every request has its first token)
//   decode tokens/s  = B*(G-1) / (time from the last first token to the end)
// With --policy SPEC every request uses that KV compression policy; with the pool fixed (kv_cache.memory_mib),
// max_concurrent (the most sequences decoding at one time) shows how compression turns into capacity.
// Raw results go to --out as JSON with the machine, the command and the configuration.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>
#include <variant>

#include <nlohmann/json.hpp>

#include "cache/compression_policy.h"
#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/machine_info.h"
#include "daemon/engine.h"
#include "daemon/metrics.h"
#include "daemon/runtime.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

class TimingSink final : public GenerationSink {
 public:
  void on_event(GenerationEvent event) override {
    if (auto* d = std::get_if<ChoiceDelta>(&event)) {
      if (!first_token && !d->token_ids.empty()) first_token = Clock::now();
      n_tokens += int(d->token_ids.size());
    } else if (std::holds_alternative<RequestFinished>(event)) {
      done = Clock::now();
    } else if (auto* e = std::get_if<RequestFailed>(&event)) {
      error = e->message;
    }
  }
  bool cancelled() const override { return false; }

  std::optional<Clock::time_point> first_token, done;  // done: the request's last event
  int n_tokens = 0;
  std::string error;
};

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The most requests between their first token and their end at one time.
int max_concurrent(const std::vector<std::shared_ptr<TimingSink>>& sinks) {
  std::vector<std::pair<Clock::time_point, int>> events;
  for (const auto& s : sinks) {
    events.emplace_back(*s->first_token, +1);
    events.emplace_back(*s->done, -1);
  }
  std::sort(events.begin(), events.end());  // at equal times an end (-1) sorts before a start (+1)
  int now = 0, most = 0;
  for (const auto& [t, d] : events) most = std::max(most, now += d);
  return most;
}

}  // namespace

int bench_command(int argc, char** argv) {
  try {
    CommandLine cl(argc, argv, {"config", "model", "batch", "prompt-tokens", "gen-tokens", "out", "set", "policy"},
                   {"help"}, {"set"});
    if (cl.has("help")) {
      std::cout << "usage: strata bench --config FILE [--model PATH|preset:NAME] [--batch 1,8] [--prompt-tokens 128]\n"
                   "                   [--gen-tokens 32] [--policy SPEC] [--out FILE.json] [--set section.key=value]...\n";
      return 0;
    }
    ServerConfig config = load_command_config(cl);
    if (cl.has("model")) config.model.path = cl.get("model");
    const int n_prompt = cl.get_int("prompt-tokens", 128);
    const int n_gen = cl.get_int("gen-tokens", 32);
    const std::vector<double> batch_sizes = cl.get_numbers("batch", "1,8");
    const std::vector<int> batches(batch_sizes.begin(), batch_sizes.end());
    const std::string policy = cl.get("policy", "");
    if (!policy.empty()) validate_policy(parse_policy_spec(policy));
    if (n_prompt < 1 || n_gen < 2) throw std::invalid_argument("--prompt-tokens must be >= 1 and --gen-tokens >= 2");

    std::unique_ptr<Runtime> rt = make_runtime(config);
    const ModelConfig& mc = rt->weights.config;
    // Without a tokenizer (dummy weights) nothing ends a sequence early; with one, EOS is ignored.
    std::optional<Tokenizer> no_tokenizer_stand_in;
    if (!rt->tokenizer) no_tokenizer_stand_in.emplace(stand_in_tokenizer(mc));
    const Tokenizer& tokenizer = rt->tokenizer ? *rt->tokenizer : *no_tokenizer_stand_in;

    nlohmann::json report = {
        {"command", command_text("bench", argc, argv)},
        {"machine", machine_json()},
        {"backend", rt->backend->name()},
        {"model", {{"path", config.model.path}, {"layers", mc.n_layers}, {"d_model", mc.d_model},
                   {"heads", mc.n_heads}, {"kv_heads", mc.n_kv_heads}, {"vocab", mc.vocab_size}}},
        {"prompt_tokens", n_prompt},
        {"gen_tokens", n_gen},
        {"max_batch_tokens", config.engine.max_batch_tokens},
        {"kv_pool", {{"memory_mib", config.kv_cache.memory_mib}, {"blocks", rt->pool->n_total()},
                     {"block_size", config.kv_cache.block_size}}},
        {"policy", policy.empty() ? config.kv_cache.policy : policy},
        {"results", nlohmann::json::array()}};

    std::mt19937 rng(7);
    std::uniform_int_distribution<int> token(100, mc.vocab_size - 1);
    for (int batch : batches) {
      ServerMetrics metrics(mc.max_context);
      EngineOptions options = engine_options(config);
      options.limits.max_running = std::max(options.limits.max_running, batch);
      Engine engine(*rt->executor, *rt->cache, tokenizer, mc, metrics, options);
      std::vector<std::shared_ptr<TimingSink>> sinks;
      const Clock::time_point start = Clock::now();
      for (int b = 0; b < batch; ++b) {
        GenerationRequest r;
        r.id = "bench-" + std::to_string(b);
        for (int i = 0; i < n_prompt; ++i) r.prompt_ids.push_back(token(rng));
        r.sampling.temperature = 0.0f;
        r.sampling.max_tokens = n_gen;
        r.sampling.ignore_eos = true;
        r.kv_policy = policy;
        sinks.push_back(std::make_shared<TimingSink>());
        r.sink = sinks.back();
        engine.submit(std::move(r));
      }
      engine.run_until_idle();
      Clock::time_point last_first = start, end = start;
      int generated = 0;
      for (const auto& s : sinks) {
        if (!s->error.empty()) throw std::runtime_error(s->error);
        last_first = std::max(last_first, *s->first_token);
        end = std::max(end, *s->done);
        generated += s->n_tokens;
      }
      const double prefill_s = seconds(start, last_first), decode_s = seconds(last_first, end);
      const nlohmann::json row = {{"batch", batch},
                                  {"prefill_seconds", prefill_s},
                                  {"prefill_tokens_per_second", batch * n_prompt / prefill_s},
                                  {"decode_seconds", decode_s},
                                  {"decode_tokens_per_second", (generated - batch) / decode_s},
                                  {"generated_tokens", generated},
                                  {"total_seconds", seconds(start, end)},
                                  {"generated_tokens_per_second_overall", generated / seconds(start, end)},
                                  {"max_concurrent", max_concurrent(sinks)}};
      std::cout << row.dump() << std::endl;
      report["results"].push_back(row);
    }
    if (cl.has("out")) {
      std::ofstream out(cl.get("out"));
      out << report.dump(2) << "\n";
      if (!out) throw std::runtime_error("cannot write " + cl.get("out"));
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "strata bench: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
