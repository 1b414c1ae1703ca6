// strata generate: complete one prompt from the command line and print the text as it is generated.
#include <iostream>
#include <variant>

#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/engine.h"
#include "daemon/metrics.h"
#include "daemon/runtime.h"

namespace strata {
namespace {

class PrintingSink final : public GenerationSink {
 public:
  void on_event(GenerationEvent event) override {
    if (auto* d = std::get_if<ChoiceDelta>(&event)) {
      std::cout << d->text << std::flush;
    } else if (auto* f = std::get_if<ChoiceFinished>(&event)) {
      finish_reason = f->finish_reason;
    } else if (auto* r = std::get_if<RequestFinished>(&event)) {
      usage = r->usage;
    } else if (auto* e = std::get_if<RequestFailed>(&event)) {
      error = e->message;
    }
  }
  bool cancelled() const override { return false; }

  std::string finish_reason, error;
  Usage usage;
};

}  // namespace

int generate_command(int argc, char** argv) {
  try {
    CommandLine cl(argc, argv, {"config", "prompt", "max-tokens", "temperature", "top-p", "top-k", "seed", "set"},
                   {"chat", "help"}, {"set"});
    if (cl.has("help") || !cl.has("prompt")) {
      std::cout << "usage: strata generate --config FILE --prompt TEXT [--chat] [--max-tokens N] [--temperature T]\n"
                   "                      [--top-p P] [--top-k K] [--seed S] [--set section.key=value]...\n";
      return cl.has("help") ? 0 : 2;
    }
    ServerConfig config = load_server_config(cl.get("config", "configs/smollm2-cpu.yaml"));
    for (const std::string& s : cl.get_all("set")) apply_config_override(config, s);
    std::unique_ptr<Runtime> rt = make_runtime(config);
    if (!rt->tokenizer) throw ConfigError(config.file + ": model.path: generate needs a model with a tokenizer");

    GenerationRequest request;
    request.id = "generate-1";
    const std::string prompt = cl.get("prompt");
    if (cl.has("chat")) {
      const ChatMessage message{"user", prompt};
      request.prompt_ids = rt->tokenizer->encode(rt->chat_template->render({&message, 1}, true), true);
    } else {
      request.prompt_ids = rt->tokenizer->encode(prompt, false);
    }
    request.sampling.max_tokens = cl.get_int("max-tokens", 64);
    request.sampling.temperature = float(cl.get_double("temperature", 0.0));
    request.sampling.top_p = float(cl.get_double("top-p", 1.0));
    request.sampling.top_k = cl.get_int("top-k", 0);
    if (cl.has("seed")) request.sampling.seed = uint64_t(cl.get_int("seed", 0));
    auto sink = std::make_shared<PrintingSink>();
    request.sink = sink;

    ServerMetrics metrics(rt->weights.config.max_context);
    Engine engine(*rt->executor, *rt->cache, *rt->tokenizer, rt->weights.config, metrics, engine_options(config));
    engine.submit(std::move(request));
    engine.run_until_idle();
    std::cout << std::endl;
    if (!sink->error.empty()) throw std::runtime_error(sink->error);
    std::cerr << "strata: " << sink->usage.prompt_tokens << " prompt tokens, " << sink->usage.completion_tokens
              << " generated, finish_reason " << sink->finish_reason << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "strata generate: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace strata
