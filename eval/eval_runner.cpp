#include "eval/eval_runner.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace strata {

struct EvalRunner::Active {
  EvalJob* job = nullptr;
  int64_t seq = 0;
  std::vector<int32_t> known;  // prompt, then every token fed after it
  int pos = 0;                 // tokens of `known` already in the cache
  bool done = false;
};

float token_logprob(std::span<const float> logits, int32_t token) {
  if (token < 0 || size_t(token) >= logits.size()) throw std::out_of_range("eval: token id outside the vocabulary");
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float x : logits) sum += std::exp(double(x) - max);
  return float(double(logits[size_t(token)]) - max - std::log(sum));
}

EvalRunner::EvalRunner(RankRuntime& runtime, EvalRunnerOptions options) : rt_(runtime), options_(options) {
  if (options_.max_batch < 1 || options_.prefill_chunk < 1) {
    throw std::invalid_argument("eval: max_batch and prefill_chunk must be at least 1");
  }
}

static int job_tokens(const EvalJob& job) {
  return int(job.prompt.size() + (job.forced.empty() ? size_t(job.generate) : job.forced.size()));
}

void EvalRunner::run(std::span<EvalJob> jobs, const std::function<void(size_t, size_t)>& progress) {
  const KvCache& cache = *rt_.cache;
  const int64_t context = rt_.weights.config.max_context;
  for (const EvalJob& job : jobs) {
    if (job.prompt.empty()) throw std::invalid_argument("eval: a job has an empty prompt");
    if (job_tokens(job) > context) {
      throw std::invalid_argument("eval: a job needs " + std::to_string(job_tokens(job)) +
                                  " tokens, beyond the model's context of " + std::to_string(context));
    }
    // A job is admitted with the room to hold all its tokens uncompressed: a policy saves memory only after its
    // hooks run, so the worst case is what must fit.
    if (cache.blocks_to_append(-1, job_tokens(job)) > cache.pool().n_total()) {
      throw std::runtime_error("eval: a job of " + std::to_string(job_tokens(job)) +
                               " tokens does not fit in the KV pool (raise kv_cache.memory_mib)");
    }
  }
  size_t done = 0;
  size_t next = 0;
  while (next < jobs.size()) {
    std::vector<EvalJob*> batch;
    int64_t blocks = 0;
    while (next < jobs.size() && int(batch.size()) < options_.max_batch) {
      const int64_t need = cache.blocks_to_append(-1, job_tokens(jobs[next]));
      if (!batch.empty() && blocks + need > cache.pool().n_free()) break;
      blocks += need;
      batch.push_back(&jobs[next++]);
    }
    run_batch(batch);
    done += batch.size();
    if (progress) progress(done, jobs.size());
  }
}

void EvalRunner::run_batch(std::span<EvalJob*> batch) {
  StepExecutor& executor = *rt_.executor;
  executor.keep_logits(true);  // forced continuations are scored from the logits rows
  const std::vector<int32_t>& stop_ids = rt_.tokenizer->stop_ids();
  const int64_t vocab = rt_.weights.config.vocab_size;

  StepPlan plan;
  std::vector<Active> active;
  for (EvalJob* job : batch) {
    job->forced_logprobs.clear();
    job->generated.clear();
    job->layers.clear();
    Active a{job, next_seq_++, job->prompt, 0, false};
    SamplingRule greedy;
    greedy.temperature = 0.0f;
    std::optional<PolicySpec> policy;
    if (!job->policy.empty()) policy = parse_policy_spec(job->policy);
    plan.added.push_back(PlannedSequence{a.seq, greedy, 0, std::move(policy), int32_t(job->prompt.size())});
    active.push_back(std::move(a));
  }

  size_t n_done = 0;
  while (n_done < active.size()) {
    plan.step = ++step_;
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
      } else {
        w.tokens = {a.known[size_t(a.pos)]};
        w.sample = true;
      }
      a.pos += int(w.tokens.size());
      if (w.sample) sampled.push_back(&a);
      plan.work.push_back(std::move(w));
    }
    const StepResult result = executor.execute(plan);
    plan = StepPlan{};
    for (size_t i = 0; i < sampled.size(); ++i) {
      Active& a = *sampled[i];
      EvalJob& job = *a.job;
      if (!job.forced.empty()) {
        const size_t k = job.forced_logprobs.size();
        job.forced_logprobs.push_back(
            token_logprob(std::span<const float>(executor.last_logits().data() + i * vocab, size_t(vocab)),
                          job.forced[k]));
        a.done = k + 1 == job.forced.size();
        if (!a.done) a.known.push_back(job.forced[k]);
      } else {
        const int32_t token = result.sampled.at(i).sample.id;
        job.generated.push_back(token);
        a.done = int(job.generated.size()) >= job.generate ||
                 std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end();
        if (!a.done) a.known.push_back(token);
      }
      if (a.done) {
        job.layers = layers_held(a.seq);
        if (options_.before_release) options_.before_release(job, *rt_.cache);
        plan.finished.push_back(a.seq);
        ++n_done;
      }
    }
  }
  plan.step = ++step_;
  executor.execute(plan);  // releases the last finished sequences
}

std::vector<LayerHeld> EvalRunner::layers_held(int64_t seq) const {
  const KvCache& cache = *rt_.cache;
  std::vector<LayerHeld> out;
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    const LayerUsage u = cache.sequence_usage(seq, l);
    out.push_back(LayerHeld{u.entries, u.bytes, u.uncompressed_bytes});
  }
  return out;
}

}  // namespace strata
