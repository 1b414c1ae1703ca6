// strata generate: complete one prompt from the command line and print the text as it is generated. Under mpirun
// every rank runs this command: the leader prints, the others execute their shard (docs/distributed.md).
// --json prints one JSON object per generated token instead of text (its id, logprob, top alternatives, the KV
// entries every layer holds at that step and the count it would hold uncompressed), which is how the multi-rank
// tests compare worlds token for token.
#include <iostream>
#include <optional>
#include <variant>

#include <nlohmann/json.hpp>

#include "cache/compression_policy.h"
#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/rank_world.h"
#include "daemon/runtime.h"
#include "leader/engine.h"
#include "leader/metrics.h"
#include "rank/rank_worker.h"

namespace strata {
namespace {

class PrintingSink final : public GenerationSink {
 public:
  PrintingSink(bool json, Engine* engine) : json_(json), engine_(engine) {}

  void on_event(GenerationEvent event) override {
    if (auto* d = std::get_if<ChoiceDelta>(&event)) {
      if (json_) {
        print_tokens(*d);
      } else {
        std::cout << d->text << std::flush;
      }
    } else if (auto* f = std::get_if<ChoiceFinished>(&event)) {
      finish_reason = finish_reason_name(f->reason);
    } else if (auto* r = std::get_if<RequestFinished>(&event)) {
      usage = r->usage;
    } else if (auto* e = std::get_if<RequestFailed>(&event)) {
      error = e->message;
    }
  }
  bool cancelled() const override { return false; }

  std::string finish_reason, error;
  Usage usage;

 private:
  // The engine publishes the KV state before a step's tokens go out: this is the cache that produced them.
  void print_tokens(const ChoiceDelta& d) const {
    nlohmann::json layer_tokens = nlohmann::json::array();
    int64_t uncompressed_tokens = 0;  // what every layer would hold uncompressed
    const nlohmann::json state = nlohmann::json::parse(engine_->kv_state_json());
    for (const auto& seq : state["sequences"]) {
      uncompressed_tokens = seq["uncompressed_tokens"];
      for (const auto& layer : seq["layers"]) layer_tokens.push_back(layer["tokens"]);
    }
    for (size_t i = 0; i < d.token_ids.size(); ++i) {
      nlohmann::json line = {
          {"token", d.token_ids[i]}, {"layer_tokens", layer_tokens}, {"uncompressed_tokens", uncompressed_tokens}};
      if (i < d.logprobs.size()) {
        line["logprob"] = d.logprobs[i].logprob;
        nlohmann::json top = nlohmann::json::array();
        for (const auto& [text, logprob] : d.logprobs[i].top) top.push_back({text, logprob});
        line["top"] = std::move(top);
      }
      std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n" << std::flush;
    }
  }

  bool json_;
  Engine* engine_;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t at = 0;
  while (at < text.size()) {
    size_t used = 0;
    ids.push_back(int32_t(std::stol(text.substr(at), &used)));
    at += used;
    if (at < text.size() && text[at] != ',') throw std::invalid_argument("--prompt-ids: expected comma-separated ids");
    ++at;
  }
  return ids;
}

}  // namespace

int generate_command(int argc, char** argv) {
  std::unique_ptr<RankWorld> world;
  try {
    CommandLine cl(argc, argv,
                   {"config", "prompt", "prompt-ids", "max-tokens", "temperature", "top-p", "top-k", "seed", "set",
                    "tp", "pp", "top-logprobs"},
                   {"chat", "json", "ignore-eos", "help"}, {"set"});
    if (cl.has("help") || (!cl.has("prompt") && !cl.has("prompt-ids"))) {
      std::cout << "usage: strata generate --config FILE (--prompt TEXT | --prompt-ids 1,2,3) [--chat]\n"
                   "                      [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
                   "                      [--ignore-eos] [--json [--top-logprobs N]] [--tp T] [--pp P]\n"
                   "                      [--set section.key=value]...\n"
                   "  under mpirun -np T*P, with --tp T --pp P, every rank runs the command and the leader prints\n";
      return cl.has("help") ? 0 : 2;
    }
    ServerConfig config = load_command_config(cl);
    if (cl.has("tp")) apply_config_override(config, "parallel.tp=" + cl.get("tp"));
    if (cl.has("pp")) apply_config_override(config, "parallel.pp=" + cl.get("pp"));
    world = std::make_unique<RankWorld>(config);
    std::unique_ptr<RankRuntime> rt = make_runtime(config, world.get());
    if (!world->grid().is_leader()) {
      run_worker(world->grid(), *rt->exchange, *rt->executor, *rt->cache,
                 [&](const std::string& message) { world->abort(message); });
      return 0;
    }
    if (!rt->tokenizer && cl.has("prompt")) {
      throw ConfigError(config.file + ": model.path: --prompt needs a model with a tokenizer (or use --prompt-ids)");
    }
    std::optional<Tokenizer> stand_in;
    if (!rt->tokenizer) stand_in.emplace(stand_in_tokenizer(rt->weights.config));
    const Tokenizer& tokenizer = rt->tokenizer ? *rt->tokenizer : *stand_in;

    GenerationRequest request;
    request.id = "generate-1";
    if (cl.has("prompt-ids")) {
      request.prompt_ids = parse_ids(cl.get("prompt-ids"));
    } else if (cl.has("chat")) {
      const ChatMessage message{"user", cl.get("prompt")};
      request.prompt_ids = tokenizer.encode(rt->chat_template->render({&message, 1}, true), true);
    } else {
      request.prompt_ids = tokenizer.encode(cl.get("prompt"), false);
    }
    request.sampling.max_tokens = cl.get_int("max-tokens", 64);
    request.sampling.temperature = float(cl.get_double("temperature", 0.0));
    request.sampling.top_p = float(cl.get_double("top-p", 1.0));
    request.sampling.top_k = cl.get_int("top-k", 0);
    request.sampling.ignore_eos = cl.has("ignore-eos");
    if (cl.has("json")) request.sampling.n_logprobs = cl.get_int("top-logprobs", 5);
    if (cl.has("seed")) request.sampling.seed = uint64_t(cl.get_int("seed", 0));

    std::unique_ptr<StepDispatcher> ranks = make_dispatcher(*rt, world.get());
    ServerMetrics metrics(rt->weights.config.max_context, layer_metrics());
    Engine engine(*ranks, tokenizer, rt->weights.config, metrics, engine_options(config, *rt));
    auto sink = std::make_shared<PrintingSink>(cl.has("json"), &engine);
    request.sink = sink;
    engine.submit(std::move(request));
    try {
      engine.run_until_idle();
      ranks->shutdown();
    } catch (const RankFailure& e) {
      world->abort(std::string("strata generate: ") + e.what() + "; ending the world");
    }
    if (!cl.has("json")) std::cout << std::endl;
    if (!sink->error.empty()) throw std::runtime_error(sink->error);
    std::cerr << "strata: " << sink->usage.prompt_tokens << " prompt tokens, " << sink->usage.completion_tokens
              << " generated, finish_reason " << sink->finish_reason << std::endl;
    return 0;
  } catch (const std::exception& e) {
    // With other ranks waiting on this one, an error here must end them too.
    if (world && world->distributed()) world->abort(std::string("strata generate: ") + e.what());
    std::cerr << "strata generate: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
