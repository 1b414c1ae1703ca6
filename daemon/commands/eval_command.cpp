// strata eval: what each compression policy costs in quality and saves in memory, on the real model.
// Runs the suite of eval_suite.h case by case and writes the JSON after every case (a long run that stops keeps
// what it measured). tools/eval_report.py turns the JSON into docs/eval/README.md and its plots.
#include <algorithm>
#include <fstream>
#include <iostream>

#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/machine_info.h"
#include "daemon/runtime.h"
#include "eval/eval_report.h"
#include "eval/eval_suite.h"

namespace strata {
namespace {

std::vector<int> whole_numbers(const std::vector<double>& numbers) {
  return std::vector<int>(numbers.begin(), numbers.end());
}

// A progress bar on stderr: cases done, and jobs done in the current case.
class Progress {
 public:
  explicit Progress(size_t n_cases) : n_cases_(n_cases) {}
  void update(size_t case_index, const std::string& label, size_t jobs_done, size_t jobs_total) {
    const int width = 30;
    const double done = (double(case_index) + double(jobs_done) / double(std::max<size_t>(1, jobs_total))) /
                        double(n_cases_);
    const int filled = int(done * width);
    std::cerr << "\r[" << std::string(size_t(filled), '#') << std::string(size_t(width - filled), ' ') << "] case "
              << case_index + 1 << "/" << n_cases_ << " " << label << " job " << jobs_done << "/" << jobs_total
              << "      " << std::flush;
  }
  void end() const { std::cerr << "\n"; }

 private:
  size_t n_cases_;
};

constexpr const char* kUsage =
    "usage: strata eval --config FILE [--out FILE] [--policies a,b] [--budgets 64,128,20%]\n"
    "                   [--quantized simlayerkv] [--quantized-dtype int4] [--documents a,b]\n"
    "                   [--ppl-prefixes 1024,2048] [--ppl-tokens N] [--passkey-lengths 1024,4096]\n"
    "                   [--passkey-depths 0,0.5,1] [--agreement-prompts N] [--agreement-context N]\n"
    "                   [--agreement-tokens N] [--batch N] [--seed S] [--data DIR] [--set section.key=value]\n"
    "Runs `full` and every policy at every budget over perplexity, passkey retrieval and agreement with\n"
    "full, and writes the raw results as JSON (default eval-results.json). Empty lists skip a task.\n";

// The suite's settings from the command line; a policy that cannot run with the configuration fails here, before
// the model loads.
EvalSettings parse_eval_settings(const CommandLine& cl, const ServerConfig& config) {
  EvalSettings settings;
  if (cl.has("data")) settings.data_dir = cl.get("data");
  if (cl.has("policies")) settings.policies = cl.get_list("policies");
  if (cl.has("budgets")) settings.budgets = cl.get_list("budgets");
  if (cl.has("quantized")) settings.quantized_policies = cl.get_list("quantized");
  if (cl.has("quantized-dtype")) settings.quantized_dtype = cl.get("quantized-dtype");
  if (cl.has("documents")) settings.documents = cl.get_list("documents");
  if (cl.has("ppl-prefixes")) settings.perplexity_prefixes = whole_numbers(cl.get_numbers("ppl-prefixes"));
  settings.perplexity_tokens = cl.get_int("ppl-tokens", settings.perplexity_tokens);
  if (cl.has("passkey-lengths")) settings.passkey_lengths = whole_numbers(cl.get_numbers("passkey-lengths"));
  if (cl.has("passkey-depths")) settings.passkey_depths = cl.get_numbers("passkey-depths");
  settings.agreement_prompts = cl.get_int("agreement-prompts", settings.agreement_prompts);
  settings.agreement_context = cl.get_int("agreement-context", settings.agreement_context);
  settings.agreement_tokens = cl.get_int("agreement-tokens", settings.agreement_tokens);
  settings.runner.max_batch = cl.get_int("batch", settings.runner.max_batch);
  settings.runner.prefill_chunk = config.engine.max_batch_tokens;
  settings.seed = uint64_t(cl.get_int("seed", int(settings.seed)));
  for (const std::string& p : settings.policies) validate_policy(parse_policy_spec(p));
  const bool wants_pod = settings.policies.empty() ||
                         std::find(settings.policies.begin(), settings.policies.end(), "pod") != settings.policies.end();
  if (wants_pod && config.kv_cache.pod_blocks.empty()) {
    throw ConfigError(config.file + ": kv_cache.pod_blocks: policy pod needs the layer blocks of strata calibrate "
                      "(--set kv_cache.pod_blocks=configs/smollm2-pod-blocks.txt), or leave pod out of --policies");
  }
  return settings;
}

// The report without cases: the machine, the command, the model and the suite's settings.
nlohmann::ordered_json eval_report(const std::string& command, const ServerConfig& config, const RankRuntime& rt,
                                   const EvalSuite& suite) {
  nlohmann::ordered_json report;
  report["command"] = command;
  report["machine"] = machine_json();
  report["backend"] = rt.backend->name();
  report["model"] = {{"path", config.model.path}, {"name", rt.model_name}, {"layers", rt.weights.config.n_layers}};
  report["kv_pool"] = {{"memory_mib", config.kv_cache.memory_mib}, {"block_size", config.kv_cache.block_size}};
  report["settings"] = settings_json(suite.settings());
  report["cases"] = nlohmann::ordered_json::array();
  return report;
}

// The configuration of the quantized cases' runtime: the cache in their format. Applied now, so that a bad dtype
// fails before the long run; the runtime is built when the first such case comes.
ServerConfig quantized_config(const ServerConfig& config, const EvalSettings& settings) {
  ServerConfig quantized = config;
  if (!settings.quantized_policies.empty()) {
    apply_config_override(quantized, "kv_cache.dtype=" + settings.quantized_dtype);
    apply_config_override(quantized, "kv_cache.block_size=32");  // a block is one KIVI group
  }
  return quantized;
}

std::string case_label(const EvalCase& c) {
  return c.policy + (c.budget.empty() ? "" : "@" + c.budget) + (c.kv_dtype == "f32" ? "" : "+" + c.kv_dtype);
}

}  // namespace

int eval_command(int argc, char** argv) {
  try {
    CommandLine cl(argc, argv,
                   {"config", "out", "policies", "budgets", "quantized", "quantized-dtype", "documents",
                    "ppl-prefixes", "ppl-tokens", "passkey-lengths", "passkey-depths", "agreement-prompts",
                    "agreement-context", "agreement-tokens", "batch", "seed", "data", "set"},
                   {"help"}, {"set"});
    if (cl.has("help")) {
      std::cout << kUsage;
      return 0;
    }
    ServerConfig config = load_command_config(cl);
    const EvalSettings settings = parse_eval_settings(cl, config);
    const std::string out_path = cl.get("out", "eval-results.json");

    std::unique_ptr<RankRuntime> rt = make_runtime(config);
    if (!rt->tokenizer || !rt->chat_template) {
      throw ConfigError(config.file + ": model.path: eval needs a model with a tokenizer and a chat template");
    }
    EvalSuite suite(settings, *rt->tokenizer, *rt->chat_template);
    const std::vector<EvalCase> cases = suite.cases();
    nlohmann::ordered_json report = eval_report(command_text("eval", argc, argv), config, *rt, suite);

    const ServerConfig quantized_runtime_config = quantized_config(config, settings);
    std::unique_ptr<RankRuntime> quantized;
    Progress progress(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      const EvalCase& c = cases[i];
      RankRuntime* runtime = rt.get();
      if (c.kv_dtype != "f32") {
        if (!quantized) quantized = make_runtime(quantized_runtime_config);
        runtime = quantized.get();
      }
      const std::string label = case_label(c);
      const EvalCaseResult result =
          suite.run(c, *runtime, [&](size_t done, size_t total) { progress.update(i, label, done, total); });
      report["cases"].push_back(case_json(result));
      std::ofstream(out_path) << report.dump(1) << "\n";
    }
    progress.end();
    std::cerr << "strata eval: " << cases.size() << " cases written to " << out_path << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "strata eval: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace strata
