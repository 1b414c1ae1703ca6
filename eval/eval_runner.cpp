#include "eval/eval_runner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

#include "eval/shared_prefill.h"

namespace strata {

struct EvalRunner::Active {
  EvalJob* job = nullptr;
  int64_t seq = 0;
  std::vector<int32_t> known;  // prompt, then every token fed after it
  int pos = 0;                 // tokens of `known` already in the cache
  bool done = false;
  ScoringRows scoring{};       // the scoring rows of its prompt's chunks (PlannedWork::n_scoring)
};

// The sequence that prefilled a prompt shared by several jobs, and what its last row gives.
struct EvalRunner::SharedPrompt {
  int64_t seq = 0;
  std::vector<float> last_logits;  // the prompt's last row
  int32_t greedy = 0;              // the token greedy sampling draws from it
};

float token_logprob(std::span<const float> logits, int32_t token) {
  if (token < 0 || size_t(token) >= logits.size()) throw std::out_of_range("eval: token id outside the vocabulary");
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - max);
  return float(double(logits[size_t(token)]) - max - std::log(sum));
}

EvalRunner::EvalRunner(RankRuntime& runtime, EvalRunnerOptions options)
    : rt_(runtime), executor_(*runtime.executor), options_(options) {
  if (options_.max_batch < 1 || options_.prefill_chunk < 1) {
    throw std::invalid_argument("eval: max_batch and prefill_chunk must be at least 1");
  }
}

static int job_tokens(const EvalJob& job) { return int(job.prompt.size() + job.forced.size()) + job.generate; }

static SamplingRule greedy_sampling() {
  SamplingRule greedy;
  greedy.temperature = 0.0f;
  return greedy;
}

void EvalRunner::check_fits(std::span<const EvalJob> jobs) const {
  const KvCache& cache = *rt_.cache;
  const int64_t context = rt_.weights.config.max_context;
  for (const EvalJob& job : jobs) {
    if (job.prompt.empty()) throw std::invalid_argument("eval: a job has an empty prompt");
    if (job_tokens(job) > context) {
      throw std::invalid_argument("eval: a job needs " + std::to_string(job_tokens(job)) +
                                  " tokens, beyond the model's context of " + std::to_string(context));
    }
    // A job is admitted with the room to hold all its tokens uncompressed (a policy saves memory only after its
    // hooks run, so the worst case is what must fit), beside its prompt's shared prefill.
    const int64_t shared = options_.share_prefill ? cache.blocks_to_append(-1, int(job.prompt.size())) : 0;
    if (cache.blocks_to_append(-1, job_tokens(job)) + shared > cache.pool().n_total()) {
      throw std::runtime_error("eval: a job of " + std::to_string(job_tokens(job)) +
                               " tokens does not fit in the KV pool (raise kv_cache.memory_mib)");
    }
  }
}

// Jobs by prompt, the longest prompts first (a batch then holds jobs of similar lengths), each group in job order.
static std::vector<std::vector<EvalJob*>> groups_by_prompt(std::span<EvalJob> jobs) {
  std::map<std::vector<int32_t>, size_t> index;
  std::vector<std::vector<EvalJob*>> groups;
  for (EvalJob& job : jobs) {
    auto [it, added] = index.try_emplace(job.prompt, groups.size());
    if (added) groups.emplace_back();
    groups[it->second].push_back(&job);
  }
  std::stable_sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    return a[0]->prompt.size() > b[0]->prompt.size();
  });
  return groups;
}

void EvalRunner::run(std::span<EvalJob> jobs, const std::function<void(size_t, size_t)>& progress) {
  check_fits(jobs);
  executor_.keep_logits(true);  // forced continuations are scored from the logits rows
  size_t n_done = 0;
  const auto done = [&](size_t n) {
    n_done += n;
    if (progress) progress(n_done, jobs.size());
  };
  const std::vector<std::vector<EvalJob*>> groups = groups_by_prompt(jobs);
  if (!options_.share_prefill) {
    std::vector<EvalJob*> all;
    for (const std::vector<EvalJob*>& group : groups) all.insert(all.end(), group.begin(), group.end());
    run_batches(all, nullptr, done);
    return;
  }
  for (const std::vector<EvalJob*>& group : groups) {
    if (group.size() == 1 || std::none_of(group.begin(), group.end(), [&](const EvalJob* j) { return forks(*j); })) {
      run_batches(group, nullptr, done);
      continue;
    }
    const SharedPrompt shared = prefill_shared(group[0]->prompt);
    run_batches(group, &shared, done);
    StepPlan plan;
    plan.finished.push_back(shared.seq);
    execute(plan);
  }
}

EvalRunner::SharedPrompt EvalRunner::prefill_shared(const std::vector<int32_t>& prompt) {
  SharedPrompt shared{next_seq_++, {}, 0};
  const int prompt_len = int(prompt.size());
  StepPlan plan;
  plan.added.push_back(PlannedSequence{shared.seq, greedy_sampling(), 0, parse_policy_spec("full"), prompt_len});
  execute(plan);
  executor_.share_prefill(shared.seq);
  ++prefills_;
  for (int pos = 0; pos < prompt_len; pos += options_.prefill_chunk) {
    const int end = std::min(prompt_len, pos + options_.prefill_chunk);
    plan.work.push_back(PlannedWork{shared.seq, pos, {prompt.begin() + pos, prompt.begin() + end}, end == prompt_len,
                                    prompt_len});
    const StepResult result = execute(plan);
    if (end == prompt_len) {
      const int64_t vocab = rt_.weights.config.vocab_size;
      shared.last_logits.assign(executor_.last_logits().begin(), executor_.last_logits().begin() + vocab);
      shared.greedy = result.sampled.at(0).sample.id;
    }
  }
  return shared;
}

void EvalRunner::run_batches(std::span<EvalJob* const> jobs, const SharedPrompt* shared,
                             const std::function<void(size_t)>& done) {
  const KvCache& cache = *rt_.cache;
  size_t next = 0;
  while (next < jobs.size()) {
    std::vector<EvalJob*> batch;
    int64_t blocks = 0;
    while (next < jobs.size() && int(batch.size()) < options_.max_batch) {
      const int64_t need = cache.blocks_to_append(-1, job_tokens(*jobs[next]));
      if (!batch.empty() && blocks + need > cache.pool().n_free()) break;
      blocks += need;
      batch.push_back(jobs[next++]);
    }
    run_batch(batch, shared);
    done(batch.size());
  }
}

void EvalRunner::run_batch(std::span<EvalJob* const> batch, const SharedPrompt* shared) {
  StepPlan plan;
  std::vector<Active> active;
  for (EvalJob* job : batch) {
    job->forced_logprobs.clear();
    job->generated.clear();
    job->layers.clear();
    Active a{job, next_seq_++, job->prompt, 0, false};
    std::optional<PolicySpec> policy;
    if (!job->policy.empty()) policy = parse_policy_spec(job->policy);
    a.scoring = executor_.scoring_rows(policy, int(job->prompt.size()));
    plan.added.push_back(PlannedSequence{a.seq, greedy_sampling(), 0, std::move(policy), int32_t(job->prompt.size())});
    active.push_back(std::move(a));
  }
  execute(plan);
  for (Active& a : active) {
    if (shared) start_from(*shared, a, plan);
    if (!shared || a.pos == 0) ++prefills_;
  }

  const int64_t vocab = rt_.weights.config.vocab_size;
  while (std::any_of(active.begin(), active.end(), [](const Active& a) { return !a.done; })) {
    std::vector<Active*> sampled;
    for (Active& a : active) {
      if (a.done) continue;
      const int prompt_len = int(a.job->prompt.size());
      PlannedWork w;
      w.seq = a.seq;
      w.start_pos = a.pos;
      if (a.pos < prompt_len) {
        const int end = std::min(prompt_len, a.pos + options_.prefill_chunk);
        w.tokens.assign(a.known.begin() + a.pos, a.known.begin() + end);
        w.prefill_len = prompt_len;
        w.sample = end == prompt_len;
        // Chunks end at the compression points (eval_command sets prefill_chunk to kv_cache.prefill_chunk).
        if (!w.sample) append_scoring_rows(w, executor_.scoring_tokens(a.scoring, a.job->prompt, end));
      } else {
        w.tokens = {a.known[size_t(a.pos)]};
        w.sample = true;
      }
      a.pos += int(w.tokens.size()) - w.n_scoring;
      if (w.sample) sampled.push_back(&a);
      plan.work.push_back(std::move(w));
    }
    const StepResult result = execute(plan);
    for (size_t i = 0; i < sampled.size(); ++i) {
      const std::span<const float> logits(executor_.last_logits().data() + i * vocab, size_t(vocab));
      if (take_next(*sampled[i], logits, result.sampled.at(i).sample.id)) finish(*sampled[i], plan);
    }
  }
  execute(plan);  // releases the last finished sequences
}

// Whether a job may start from a shared prefill: not under the configuration's policies, nor in a chunked prefill
// (kv_cache.prefill_compression auto or chunked), whose compressions the shared prefill does not make.
bool EvalRunner::forks(const EvalJob& job) const {
  return !job.policy.empty() && !executor_.prefills_in_chunks(parse_policy_spec(job.policy));
}

// A forked job starts where the shared prefill leaves it: at its fork point, or at the prompt's end with the
// prompt's last row already computed.
void EvalRunner::start_from(const SharedPrompt& shared, Active& a, StepPlan& plan) {
  if (!forks(*a.job)) return;
  const int prompt_len = int(a.job->prompt.size());
  const PolicyContext context{0, rt_.weights.config.n_layers, rt_.model->n_heads_local(),
                              rt_.model->n_kv_heads_local(), rt_.model_name};
  const JobStart start = job_start(parse_policy_spec(a.job->policy), context, prompt_len, options_.prefill_chunk);
  switch (start.kind) {
    case JobStart::own_prefill:
      break;
    case JobStart::fork_prefix:
      executor_.fork_prefix(shared.seq, a.seq, start.entries, prompt_len);
      a.pos = start.entries;
      break;
    case JobStart::fork_prefilled:
      executor_.fork_prefilled(shared.seq, a.seq);
      a.pos = prompt_len;
      if (take_next(a, shared.last_logits, shared.greedy)) finish(a, plan);
      break;
  }
}

bool EvalRunner::take_next(Active& a, std::span<const float> logits, int32_t greedy) {
  EvalJob& job = *a.job;
  if (job.forced_logprobs.size() < job.forced.size()) {
    const size_t k = job.forced_logprobs.size();
    job.forced_logprobs.push_back(token_logprob(logits, job.forced[k]));
    a.done = k + 1 == job.forced.size() && job.generate == 0;
    if (!a.done) a.known.push_back(job.forced[k]);
    return a.done;
  }
  const std::vector<int32_t>& stop_ids = rt_.tokenizer->stop_ids();
  job.generated.push_back(greedy);
  a.done = int(job.generated.size()) >= job.generate ||
           std::find(stop_ids.begin(), stop_ids.end(), greedy) != stop_ids.end();
  if (!a.done) a.known.push_back(greedy);
  return a.done;
}

void EvalRunner::finish(Active& a, StepPlan& plan) {
  a.job->layers = layers_held(a.seq);
  a.job->peak = rt_.cache->peak(a.seq);
  if (options_.before_release) options_.before_release(*a.job, *rt_.cache);
  plan.finished.push_back(a.seq);
}

StepResult EvalRunner::execute(StepPlan& plan) {
  plan.step = ++step_;
  const StepResult result = executor_.execute(plan);
  plan = StepPlan{};
  return result;
}

std::vector<LayerHeld> EvalRunner::layers_held(int64_t seq) const {
  const KvCache& cache = *rt_.cache;
  std::vector<LayerHeld> out;
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    const LayerUsage u = cache.sequence_usage(seq, l);
    out.push_back(LayerHeld{u.entries, u.bytes, u.full_precision_bytes, u.uncompressed_bytes});
  }
  return out;
}

}  // namespace strata
