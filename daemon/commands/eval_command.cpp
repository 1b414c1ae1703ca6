// strata eval: what each compression policy costs in quality and saves in memory, on the real model.
// Runs the suite of eval_suite.h case by case and writes the JSON after every case (a long run that stops keeps
// what it measured). tools/eval_report.py turns the JSON into docs/eval/README.md and its plots.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <stdexcept>

#include "cache/compression_policy.h"
#include "cache/policy_spec.h"
#include "daemon/build_commit.h"
#include "daemon/commands/command_line.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/machine_info.h"
#include "daemon/runtime.h"
#include "eval/eval_report.h"
#include "eval/eval_suite.h"
#include "eval/retrieval_task.h"
#include "eval/ruler_tasks.h"
#include "model/gguf_file.h"
#include "model/tokenizer.h"
#include "rank/offline_executor.h"

namespace strata {
namespace {

std::vector<int> whole_numbers(const std::vector<double>& numbers) {
  return std::vector<int>(numbers.begin(), numbers.end());
}

// The choices named on a list flag (--ruler-tasks, --ruler-settings); an unknown name is refused with the known ones.
template <class Choice>
std::vector<Choice> named_choices(const std::string& flag, const std::vector<std::string>& names,
                                  std::optional<Choice> (*parse)(std::string_view), const std::vector<Choice>& known,
                                  std::string_view (*name_of)(Choice)) {
  std::vector<Choice> out;
  for (const std::string& name : names) {
    const std::optional<Choice> choice = parse(name);
    if (!choice) {
      std::string listed;
      for (Choice c : known) listed += (listed.empty() ? "" : ", ") + std::string(name_of(c));
      throw std::invalid_argument("--" + flag + ": unknown name '" + name + "' (known: " + listed + ")");
    }
    out.push_back(*choice);
  }
  return out;
}

// A progress bar on stderr: jobs done of the cases run together.
void show_progress(const std::string& label, size_t jobs_done, size_t jobs_total) {
  const int width = 30;
  const int filled = int(double(jobs_done) / double(std::max<size_t>(1, jobs_total)) * width);
  std::cerr << "\r[" << std::string(size_t(filled), '#') << std::string(size_t(width - filled), ' ') << "] " << label
            << " job " << jobs_done << "/" << jobs_total << "      " << std::flush;
}

constexpr const char* kUsage =
    "usage: strata eval --config FILE [--out FILE] [--policies a,b:key=v] [--budgets 64,128,20%]\n"
    "                   [--quantized simlayerkv,full] [--quantized-dtypes int8,int4] [--documents a,b]\n"
    "                   [--ppl-prefixes 2048,4096] [--ppl-tokens N] [--long-docs N] [--long-prompt N]\n"
    "                   [--long-tokens N] [--retrieval-lengths 2048,4096] [--retrieval-depths 0,0.5,1]\n"
    "                   [--retrieval-trials N] [--ruler-tasks niah_single,common_words] [--ruler-lengths 2048,4096]\n"
    "                   [--ruler-trials N] [--ruler-settings in_prompt,after_compression]\n"
    "                   [--passkey-lengths 1024,4096] [--passkey-depths 0,0.5,1]\n"
    "                   [--agreement-prompts N] [--agreement-context N] [--agreement-tokens N] [--batch N]\n"
    "                   [--no-shared-prefill] [--seed S] [--data DIR] [--set section.key=value]\n"
    "                   [--dump-retrieval-prompts FILE] [--dump-ruler-prompts FILE]\n"
    "Runs `full` and every policy at every budget over perplexity, long generation, retrieval, passkey\n"
    "retrieval and agreement with full, and writes the raw results as JSON (default eval-results.json).\n"
    "Empty lists and zero counts skip a task (--policies '': only the --quantized rows). Every prompt is\n"
    "prefilled once and shared by the rows (--no-shared-prefill: each row prefills alone; the same numbers,\n"
    "slower). A policy may carry parameters of its own besides the budget:\n"
    "--policies h2o,h2o:mode=per_step,streaming:mode=rolling.\n"
    "--dump-retrieval-prompts FILE writes the retrieval cases' prompts (--retrieval-lengths, -depths, -trials,\n"
    "--seed) as JSON lines of token ids for tools/retrieval_probe.py, and runs nothing; --dump-ruler-prompts FILE\n"
    "the RULER cases' (--ruler-tasks, -lengths, -trials, --seed), context and question apart, likewise.\n";

// The suite's settings from the command line.
EvalSettings parse_eval_settings(const CommandLine& cl, const ServerConfig& config) {
  EvalSettings settings;
  if (cl.has("data")) settings.data_dir = cl.get("data");
  // Every policy but full when the option is absent; an empty list: only the quantized rows.
  if (cl.has("policies")) {
    settings.policies = join_policy_parameters(cl.get_list("policies"));
  } else {
    for (const std::string& p : policy_names()) {
      if (p != "full") settings.policies.push_back(p);
    }
  }
  if (cl.has("budgets")) settings.budgets = cl.get_list("budgets");
  if (cl.has("quantized")) settings.quantized_policies = join_policy_parameters(cl.get_list("quantized"));
  if (cl.has("quantized-dtypes")) settings.quantized_dtypes = cl.get_list("quantized-dtypes");
  settings.base_dtype = config.kv_cache.dtype;
  if (cl.has("documents")) settings.documents = cl.get_list("documents");
  if (cl.has("ppl-prefixes")) settings.perplexity_prefixes = whole_numbers(cl.get_numbers("ppl-prefixes"));
  settings.perplexity_tokens = cl.get_int("ppl-tokens", settings.perplexity_tokens);
  settings.long_documents = cl.get_int("long-docs", settings.long_documents);
  settings.long_prompt = cl.get_int("long-prompt", settings.long_prompt);
  settings.long_tokens = cl.get_int("long-tokens", settings.long_tokens);
  if (cl.has("retrieval-lengths")) settings.retrieval_lengths = whole_numbers(cl.get_numbers("retrieval-lengths"));
  if (cl.has("retrieval-depths")) settings.retrieval_depths = cl.get_numbers("retrieval-depths");
  settings.retrieval_trials = cl.get_int("retrieval-trials", settings.retrieval_trials);
  if (cl.has("ruler-tasks")) {
    settings.ruler_tasks =
        named_choices("ruler-tasks", cl.get_list("ruler-tasks"), parse_ruler_task, ruler_tasks(), ruler_task_name);
  }
  if (cl.has("ruler-lengths")) settings.ruler_lengths = whole_numbers(cl.get_numbers("ruler-lengths"));
  settings.ruler_trials = cl.get_int("ruler-trials", settings.ruler_trials);
  if (cl.has("ruler-settings")) {
    settings.ruler_settings =
        named_choices("ruler-settings", cl.get_list("ruler-settings"), parse_ruler_setting,
                      {RulerSetting::in_prompt, RulerSetting::after_compression}, ruler_setting_name);
  }
  if (cl.has("passkey-lengths")) settings.passkey_lengths = whole_numbers(cl.get_numbers("passkey-lengths"));
  if (cl.has("passkey-depths")) settings.passkey_depths = cl.get_numbers("passkey-depths");
  settings.agreement_prompts = cl.get_int("agreement-prompts", settings.agreement_prompts);
  settings.agreement_context = cl.get_int("agreement-context", settings.agreement_context);
  settings.agreement_tokens = cl.get_int("agreement-tokens", settings.agreement_tokens);
  settings.runner.max_batch = cl.get_int("batch", settings.runner.max_batch);
  settings.runner.prefill_chunk = config.engine.max_batch_tokens;
  settings.runner.share_prefill = !cl.has("no-shared-prefill");
  // kv_cache.prefill_compression chunked or auto: the runner's chunks end at the compression points, as the
  // server's scheduler ends them. A chunked row prefills alone (a shared prefill keeps the whole prompt
  // uncompressed): with chunked every row, with auto the rows whose policies compress in chunks (EvalRunner).
  if (config.kv_cache.prefill_compression != "end") settings.runner.prefill_chunk = config.kv_cache.prefill_chunk;
  if (config.kv_cache.prefill_compression == "chunked") settings.runner.share_prefill = false;
  settings.seed = uint64_t(cl.get_int("seed", int(settings.seed)));
  return settings;
}

// A policy that cannot run with the configuration fails before the model loads.
void check_policies_runnable(const EvalSettings& settings, const ServerConfig& config) {
  // By name, with or without parameters of its own ("pod:recent=64").
  const auto is_pod = [](const std::string& p) { return parse_policy_spec(p).name == "pod"; };
  const bool wants_pod = std::any_of(settings.policies.begin(), settings.policies.end(), is_pod);
  if (wants_pod && config.kv_cache.pod_blocks.empty()) {
    throw ConfigError(config.file + ": kv_cache.pod_blocks: policy pod needs the layer blocks of strata calibrate "
                      "(--set kv_cache.pod_blocks=configs/smollm2-pod-blocks.txt), or leave pod out of --policies");
  }
}

// The report without cases: the machine, the command, the model and the suite's settings.
nlohmann::ordered_json eval_report(const std::string& command, const ServerConfig& config, const RankRuntime& rt,
                                   const EvalSuite& suite) {
  nlohmann::ordered_json report;
  report["command"] = command;
  report["commit"] = build_commit();
  report["machine"] = machine_json();
  report["backend"] = rt.backend->name();
  report["activations"] = activations_name(config);  // the scores' numerics (engine.activation_dtype, decided)
  report["model"] = {{"path", config.model.path}, {"name", rt.model_name}, {"layers", rt.weights.config.n_layers}};
  report["kv_pool"] = {{"memory_mib", config.kv_cache.memory_mib}, {"block_size", config.kv_cache.block_size}};
  report["prefill_compression"] = {{"mode", config.kv_cache.prefill_compression},
                                   {"chunk", config.kv_cache.prefill_chunk}};
  report["settings"] = settings_json(suite.settings());
  report["cases"] = nlohmann::ordered_json::array();
  return report;
}

// How a case's rows prefilled: "chunked" or "end" (kv_cache.prefill_compression auto decides per policy, as the
// server does; tools/eval_report.py keeps rows of different modes apart).
std::string case_prefill_mode(RankRuntime& rt, const EvalCase& c) {
  return OfflineExecutor(*rt.executor).prefills_in_chunks(parse_policy_spec(c.policy)) ? "chunked" : "end";
}

// The configuration of the runtime of the cases in cache format `dtype` (the configuration's own, or a quantized
// one). Applied before the long run, so that a bad dtype fails at once; the runtime is built when its cases come.
ServerConfig dtype_config(const ServerConfig& config, const std::string& dtype) {
  ServerConfig quantized = config;
  if (dtype != config.kv_cache.dtype) {
    apply_config_override(quantized, "kv_cache.dtype=" + dtype);
    apply_config_override(quantized, "kv_cache.block_size=32");  // a block is one KIVI group
  }
  return quantized;
}

// The cases by cache format, the base format first: each format's cases run together on one runtime.
std::vector<std::pair<std::string, std::vector<EvalCase>>> cases_by_dtype(const std::vector<EvalCase>& cases) {
  std::vector<std::pair<std::string, std::vector<EvalCase>>> out;
  for (const EvalCase& c : cases) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& g) { return g.first == c.kv_dtype; });
    if (it == out.end()) it = out.insert(out.end(), {c.kv_dtype, {}});
    it->second.push_back(c);
  }
  return out;
}

// --dump-retrieval-prompts, --dump-ruler-prompts: a task's prompts for a server (tools/retrieval_probe.py,
// tests/e2e/test_ruler_against_server.py); the tokenizer alone, no weights.
void dump_prompts(const ServerConfig& config, const EvalSettings& settings, const std::string& flag,
                  const std::string& path) {
  const Tokenizer tokenizer = Tokenizer::from_gguf(*GgufFile::open(config.model.path));
  std::ofstream out(path);
  if (!out) throw std::runtime_error("--" + flag + ": cannot write " + path);
  const std::vector<std::string> texts = load_retrieval_texts(settings.data_dir);
  if (flag == "dump-ruler-prompts") {
    write_ruler_prompts(out, tokenizer,
                        ruler_prompts(tokenizer, retrieval_sentences(texts), settings.ruler_tasks,
                                      settings.ruler_lengths, settings.ruler_trials, settings.seed));
  } else {
    write_retrieval_prompts(out, tokenizer, texts, settings.retrieval_lengths, settings.retrieval_depths,
                            settings.retrieval_trials, settings.seed);
  }
  std::cerr << "strata eval: prompts written to " << path << "\n";
}

}  // namespace

int eval_command(int argc, char** argv) {
  try {
    CommandLine cl(argc, argv,
                   {"config", "out", "policies", "budgets", "quantized", "quantized-dtypes", "documents",
                    "ppl-prefixes", "ppl-tokens", "long-docs", "long-prompt", "long-tokens", "retrieval-lengths",
                    "retrieval-depths", "retrieval-trials", "ruler-tasks", "ruler-lengths", "ruler-trials",
                    "ruler-settings", "passkey-lengths", "passkey-depths", "agreement-prompts", "agreement-context",
                    "agreement-tokens", "batch", "seed", "data", "set", "dump-retrieval-prompts",
                    "dump-ruler-prompts"},
                   {"help", "no-shared-prefill"}, {"set"});
    if (cl.has("help")) {
      std::cout << kUsage;
      return 0;
    }
    ServerConfig config = load_command_config(cl);
    const EvalSettings settings = parse_eval_settings(cl, config);
    for (const std::string flag : {"dump-retrieval-prompts", "dump-ruler-prompts"}) {
      if (cl.has(flag)) {
        dump_prompts(config, settings, flag, cl.get(flag));
        return 0;
      }
    }
    check_policies_runnable(settings, config);
    const std::string out_path = cl.get("out", "eval-results.json");

    const auto start = std::chrono::steady_clock::now();
    const std::unique_ptr<RankRuntime> rt = make_runtime(config);  // f32: full, the first case, runs on it
    if (!rt->tokenizer || !rt->chat_template) {
      throw ConfigError(config.file + ": model.path: eval needs a model with a tokenizer and a chat template");
    }
    EvalSuite suite(settings, *rt->tokenizer, *rt->chat_template);
    const auto groups = cases_by_dtype(suite.cases());
    std::vector<ServerConfig> configs;
    for (const auto& group : groups) configs.push_back(dtype_config(config, group.first));
    nlohmann::ordered_json report = eval_report(command_text("eval", argc, argv), config, *rt, suite);
    for (size_t g = 0; g < groups.size(); ++g) {
      std::unique_ptr<RankRuntime> quantized = g > 0 ? make_runtime(configs[g]) : nullptr;
      const std::string label = groups[g].first + " (" + std::to_string(groups[g].second.size()) + " rows)";
      RankRuntime& runtime = quantized ? *quantized : *rt;
      for (const EvalCaseResult& result : suite.run(groups[g].second, runtime, [&](size_t done, size_t total) {
             show_progress(label, done, total);
           })) {
        nlohmann::ordered_json row = case_json(result);
        row["prefill_compression"] = case_prefill_mode(runtime, result.c);
        report["cases"].push_back(std::move(row));
      }
      report["timing"] = {
          {"wall_seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()},
          {"shared_prefill", settings.runner.share_prefill},
          {"prefills", suite.prefills()}};
      std::ofstream(out_path) << report.dump(1) << "\n";
    }
    std::cerr << "\nstrata eval: " << report["cases"].size() << " cases written to " << out_path << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "strata eval: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace strata
