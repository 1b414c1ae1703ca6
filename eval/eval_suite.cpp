#include "eval/eval_suite.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "cache/compression_policy.h"
#include "cache/policy_spec.h"

namespace strata {

namespace {

// The spec of a policy named `policy` (no parameters of its own) at budget `budget_text` ("128", "20%").
std::string budget_spec(const std::string& policy, const std::string& budget_text, int prompt_len) {
  const Budget budget = [&] {
    PolicySpec probe;
    probe.params["budget"] = budget_text;
    return ParamReader(probe).get_budget("budget", Budget{});
  }();
  if (policy == "simlayerkv+snapkv" || policy == "simlayerkv+pyramidkv") {
    // The composition: a lazy layer keeps what simlayerkv@budget keeps, a layer found not lazy what the kept
    // policy keeps at the same budget, so that the row compares the two choices at one memory.
    return "simlayerkv:strategy=prefill,window=" + std::to_string(std::max(1, budget.resolve(prompt_len) - 4)) +
           ",kept=" + policy.substr(policy.find('+') + 1) + ",kept_budget=" + budget_text;
  }
  if (policy == "simlayerkv") {
    // A lazy layer keeps its n_init = 4 initial entries plus the window; layers found not lazy keep everything.
    return "simlayerkv:window=" + std::to_string(std::max(1, budget.resolve(prompt_len) - 4));
  }
  if (policy == "spindlekv") {
    // SpindleKV's budget is its average share of the prompt, window included.
    const double share = std::min(1.0, double(budget.resolve(prompt_len)) / double(std::max(1, prompt_len)));
    return "spindlekv:ratio=" + std::to_string(share);
  }
  if (policy == "pod") {
    // PoD keeps every value; the budget is its proximal span (16 sinks + the recent window) over which a
    // follower layer keeps its own keys.
    return "pod:recent=" + std::to_string(std::max(1, budget.resolve(prompt_len) - 16));
  }
  if (policy == "d2o") {
    // D2O's budget is a share of the prompt, split evenly between heavy hitters and the recent window (the
    // official defaults, 0.1 + 0.1, are the 20% budget).
    const double share = std::min(1.0, double(budget.resolve(prompt_len)) / double(std::max(1, prompt_len)));
    const std::string half = std::to_string(share / 2.0);
    return "d2o:hh_ratio=" + half + ",recent_ratio=" + half;
  }
  return policy + ":budget=" + budget_text;
}

}  // namespace

std::string case_spec(const EvalCase& c, int prompt_len) {
  if (c.policy == "full" || c.budget.empty()) return c.policy;
  const PolicySpec own = parse_policy_spec(c.policy);
  const std::string spec = budget_spec(own.name, c.budget, prompt_len);
  if (own.params.empty()) return spec;
  // The policy's own parameters, as written, then those its budget makes.
  return c.policy + "," + spec.substr(spec.find(':') + 1);
}

std::vector<std::string> join_policy_parameters(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const std::string& item : items) {
    const bool continues = item.find('=') != std::string::npos && item.find(':') == std::string::npos;
    if (continues && !out.empty()) {
      out.back() += "," + item;
    } else {
      out.push_back(item);
    }
  }
  return out;
}

EvalCase with_budget_of(const EvalCase& c, int length) {
  if (c.budget.empty() || c.budget.back() != '%') return c;
  PolicySpec probe;
  probe.params["budget"] = c.budget;
  EvalCase out = c;
  out.budget = std::to_string(ParamReader(probe).get_budget("budget", Budget{}).resolve(length));
  return out;
}

double EvalMemory::ratio() const {
  const int64_t held = std::accumulate(bytes.begin(), bytes.end(), int64_t(0));
  const int64_t full = std::accumulate(uncompressed_bytes.begin(), uncompressed_bytes.end(), int64_t(0));
  return held > 0 ? double(full) / double(held) : 0.0;
}

double EvalMemory::peak_ratio() const {
  const int64_t full = std::accumulate(uncompressed_bytes.begin(), uncompressed_bytes.end(), int64_t(0));
  return peak_bytes > 0 ? double(full) / double(peak_bytes) : 0.0;
}

std::string case_label(const EvalCase& c) {
  return c.policy + (c.budget.empty() ? "" : "@" + c.budget) + (c.kv_dtype == "f32" ? "" : "+" + c.kv_dtype);
}

EvalSuite::EvalSuite(EvalSettings settings, const Tokenizer& tokenizer, const ChatTemplate& chat)
    : settings_(std::move(settings)), tokenizer_(tokenizer), chat_(chat) {
  // Each task reads only its own files, so that --data may hold just those of the tasks run.
  const bool reads_documents = !settings_.perplexity_prefixes.empty() || settings_.long_documents > 0 ||
                               settings_.agreement_prompts > 0;
  if (reads_documents && settings_.documents.empty()) settings_.documents = document_names(settings_.data_dir);
  for (const std::string& name : reads_documents ? settings_.documents : std::vector<std::string>{}) {
    documents_.push_back(document_tokens(tokenizer_, settings_.data_dir, name));
  }
  if (settings_.agreement_prompts > 0) instructions_ = load_instructions(settings_.data_dir);
  if (!settings_.retrieval_lengths.empty()) retrieval_texts_ = load_retrieval_texts(settings_.data_dir);
  if (runs_ruler()) make_ruler_prompts();
  if (settings_.agreement_prompts > int(instructions_.size())) {
    throw std::invalid_argument("eval: " + std::to_string(settings_.agreement_prompts) + " agreement prompts asked, " +
                                std::to_string(instructions_.size()) + " instructions in " + settings_.data_dir);
  }
  // A budget a policy rejects (below its window, say) fails here, before hours of running, naming the parameter.
  for (const EvalCase& c : cases()) validate_policy(parse_policy_spec(case_spec(c, 1000)));
}

std::vector<EvalCase> EvalSuite::cases() const {
  // Budget by budget, so that a run stopped early has covered every policy at the budgets it reached.
  const auto& quantized = settings_.quantized_policies;
  const bool quantized_full = std::find(quantized.begin(), quantized.end(), "full") != quantized.end();
  std::vector<EvalCase> out{{"full", "", settings_.base_dtype}};
  for (const std::string& dtype : settings_.quantized_dtypes) {
    if (quantized_full) out.push_back({"full", "", dtype});
  }
  for (const std::string& b : settings_.budgets) {
    for (const std::string& p : settings_.policies) out.push_back({p, b, settings_.base_dtype});
    for (const std::string& dtype : settings_.quantized_dtypes) {
      for (const std::string& p : quantized) {
        if (p != "full") out.push_back({p, b, dtype});
      }
    }
  }
  return out;
}

// One case's jobs, each with the task case it scores.
struct EvalSuite::CaseJobs {
  // Which task and case a job belongs to.
  struct Tag {
    enum Kind { perplexity, long_generation, passkey, retrieval, ruler, agreement } kind;
    size_t index;  // into that task's cases
  };

  std::vector<EvalJob> jobs;
  std::vector<Tag> tags;  // per job
  std::vector<PerplexityCase> perplexity;
  std::vector<PerplexityCase> long_generation;
  std::vector<PasskeyCase> passkey;
  std::vector<std::string> keys;  // per passkey case: the key its prompt hides
  std::vector<RetrievalCase> retrieval;
  std::vector<std::string> expected;  // per retrieval case: the answer
  struct Ruler {
    RulerCase c;
    RulerSetting setting;
    RulerPrompt prompt;
  };
  std::vector<Ruler> ruler;
  std::vector<AgreementCase> agreement;
};

bool EvalSuite::runs_ruler() const {
  return !settings_.ruler_tasks.empty() && !settings_.ruler_lengths.empty() && settings_.ruler_trials > 0 &&
         !settings_.ruler_settings.empty();
}

// Once for the suite: every case's jobs share the prompts, and generating one tokenizes its whole filler.
void EvalSuite::make_ruler_prompts() {
  ruler_prompts_ = ruler_prompts(tokenizer_, retrieval_sentences(load_retrieval_texts(settings_.data_dir)),
                                 settings_.ruler_tasks, settings_.ruler_lengths, settings_.ruler_trials,
                                 settings_.seed);
}

EvalSuite::CaseJobs EvalSuite::jobs_for(const EvalCase& c) const {
  CaseJobs j;
  auto add = [&](EvalJob job, CaseJobs::Tag tag) {
    const int prompt_len = int(job.prompt.size());
    job.policy = tag.kind == CaseJobs::Tag::long_generation
                     ? case_spec(with_budget_of(c, prompt_len + int(job.forced.size())), prompt_len)
                     : case_spec(c, prompt_len);
    j.jobs.push_back(std::move(job));
    j.tags.push_back(tag);
  };
  for (size_t d = 0; d < documents_.size(); ++d) {
    for (int prefix : settings_.perplexity_prefixes) {
      j.perplexity.push_back({settings_.documents[d], prefix, settings_.perplexity_tokens});
      add(perplexity_job(documents_[d], j.perplexity.back(), ""), {CaseJobs::Tag::perplexity, j.perplexity.size() - 1});
    }
  }
  for (size_t d = 0; d < documents_.size() && int(d) < settings_.long_documents; ++d) {
    j.long_generation.push_back({settings_.documents[d], settings_.long_prompt, settings_.long_tokens});
    add(perplexity_job(documents_[d], j.long_generation.back(), ""),
        {CaseJobs::Tag::long_generation, j.long_generation.size() - 1});
  }
  for (int length : settings_.passkey_lengths) {
    for (double depth : settings_.passkey_depths) {
      j.passkey.push_back({length, depth});
      j.keys.emplace_back();
      const uint64_t seed = settings_.seed * 1000003u + uint64_t(length) * 131u + uint64_t(depth * 100.0);
      add(passkey_job(tokenizer_, chat_, j.passkey.back(), seed, "", &j.keys.back()),
          {CaseJobs::Tag::passkey, j.passkey.size() - 1});
    }
  }
  for (int length : settings_.retrieval_lengths) {
    for (double depth : settings_.retrieval_depths) {
      for (int trial = 0; trial < settings_.retrieval_trials; ++trial) {
        j.retrieval.push_back({length, depth, trial});
        j.expected.emplace_back();
        add(retrieval_job(tokenizer_, retrieval_texts_, j.retrieval.back(),
                          retrieval_seed(settings_.seed, j.retrieval.back()), &j.expected.back()),
            {CaseJobs::Tag::retrieval, j.retrieval.size() - 1});
      }
    }
  }
  // A trial's prompt is the same in both settings: only where the question comes differs.
  for (const auto& [rc, prompt] : ruler_prompts_) {
    for (RulerSetting setting : settings_.ruler_settings) {
      j.ruler.push_back({rc, setting, prompt});
      add(ruler_job(tokenizer_, prompt, rc.task, setting), {CaseJobs::Tag::ruler, j.ruler.size() - 1});
    }
  }
  for (size_t d = 0; d < documents_.size() && settings_.agreement_prompts > 0; ++d) {
    const std::vector<int32_t>& doc = documents_[d];
    const int context = settings_.agreement_context;
    if (int(doc.size()) <= context) throw std::invalid_argument("eval: agreement passages longer than the documents");
    for (int i = 0; i < settings_.agreement_prompts; ++i) {
      const size_t offset = (size_t(i) * 997u) % (doc.size() - size_t(context));  // a different passage each
      const std::vector<int32_t> passage(doc.begin() + long(offset), doc.begin() + long(offset) + context);
      j.agreement.push_back({int(j.agreement.size()), context});
      add(agreement_job(tokenizer_, chat_, passage, instructions_[size_t(i)], settings_.agreement_tokens, ""),
          {CaseJobs::Tag::agreement, j.agreement.size() - 1});
    }
  }
  return j;
}

namespace {

// Adds what a job's cache held, per layer, to mem; the longest prompt's entries are kept whole.
void add_memory(EvalMemory& mem, const EvalJob& job) {
  mem.peak_bytes += job.peak.bytes;
  mem.peak_full_precision_bytes += job.peak.full_precision_bytes;
  mem.bytes.resize(job.layers.size());
  mem.uncompressed_bytes.resize(job.layers.size());
  for (size_t l = 0; l < job.layers.size(); ++l) {
    mem.bytes[l] += job.layers[l].bytes;
    mem.uncompressed_bytes[l] += job.layers[l].uncompressed_bytes;
    mem.full_precision_bytes += job.layers[l].full_precision_bytes;
  }
  if (int(job.prompt.size()) > mem.longest_prompt) {
    mem.longest_prompt = int(job.prompt.size());
    mem.longest_entries.clear();
    for (const LayerHeld& l : job.layers) mem.longest_entries.push_back(l.entries);
  }
}

}  // namespace

EvalCaseResult EvalSuite::score(const EvalCase& c, const CaseJobs& jobs) {
  EvalCaseResult result;
  result.c = c;
  result.perplexity.resize(jobs.perplexity.size());
  result.long_generation.resize(jobs.long_generation.size());
  result.passkey.resize(jobs.passkey.size());
  result.retrieval.resize(jobs.retrieval.size());
  result.ruler.resize(jobs.ruler.size());
  result.agreement.resize(jobs.agreement.size());
  if (c.policy == "full") reference_answers_.assign(jobs.agreement.size(), {});
  if (reference_answers_.size() != jobs.agreement.size()) throw std::logic_error("eval: full must run first");
  for (size_t k = 0; k < jobs.jobs.size(); ++k) {
    const EvalJob& job = jobs.jobs[k];
    const CaseJobs::Tag& tag = jobs.tags[k];
    switch (tag.kind) {
      case CaseJobs::Tag::perplexity:
        result.perplexity[tag.index] = score_perplexity(jobs.perplexity[tag.index], job);
        break;
      case CaseJobs::Tag::long_generation:
        result.long_generation[tag.index] = score_perplexity(jobs.long_generation[tag.index], job);
        break;
      case CaseJobs::Tag::passkey:
        result.passkey[tag.index] = score_passkey(tokenizer_, jobs.passkey[tag.index], jobs.keys[tag.index], job);
        break;
      case CaseJobs::Tag::retrieval:
        result.retrieval[tag.index] =
            score_retrieval(jobs.retrieval[tag.index], jobs.expected[tag.index], tokenizer_, job);
        break;
      case CaseJobs::Tag::ruler: {
        const CaseJobs::Ruler& r = jobs.ruler[tag.index];
        result.ruler[tag.index] = score_ruler(r.c, r.setting, r.prompt, tokenizer_, job);
        break;
      }
      case CaseJobs::Tag::agreement:
        if (c.policy == "full") reference_answers_[tag.index] = job.generated;
        result.agreement[tag.index] = score_agreement(jobs.agreement[tag.index], reference_answers_[tag.index], job);
        break;
    }
    add_memory(result.memory, job);
  }
  return result;
}

std::vector<EvalCaseResult> EvalSuite::run(std::span<const EvalCase> cases, RankRuntime& runtime,
                                           const std::function<void(size_t, size_t)>& progress) {
  std::vector<CaseJobs> case_jobs;
  std::vector<EvalJob> all;
  for (const EvalCase& c : cases) {
    case_jobs.push_back(jobs_for(c));
    for (EvalJob& job : case_jobs.back().jobs) all.push_back(std::move(job));
  }
  EvalRunner runner(runtime, settings_.runner);
  runner.run(all, progress);
  prefills_ += runner.prefills();
  std::vector<EvalCaseResult> results;
  size_t next = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (EvalJob& job : case_jobs[i].jobs) job = std::move(all[next++]);
    results.push_back(score(cases[i], case_jobs[i]));
  }
  return results;
}

}  // namespace strata
