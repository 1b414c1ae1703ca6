#pragma once
// The leader of `strata eval`: runs evaluation jobs through one rank's StepExecutor in-process, several jobs in
// one batch, each with its own compression policy. A job either scores a given continuation token by token
// through the (compressed) cache, or generates greedily. At its end the runner records what every layer held.
//
// It builds StepPlans itself instead of going through the Engine so that it can score forced tokens (the Engine
// samples) and read the per-sequence cache before the sequence is released. Jobs on the same prompt share its
// prefill (eval/shared_prefill.h).
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "rank/offline_executor.h"
#include "rank/rank_runtime.h"

namespace strata {

// What one layer of one sequence held when its job ended.
struct LayerHeld {
  int64_t entries = 0;             // tokens held
  int64_t bytes = 0;               // pool memory taken (whole blocks)
  int64_t full_precision_bytes = 0;  // of which blocks at the pool's own precision (LayerUsage)
  int64_t uncompressed_bytes = 0;  // what `full` would take for the same tokens
};

struct EvalJob {
  std::vector<int32_t> prompt;
  std::string policy;              // a policy spec ("snapkv:budget=128"); empty: the configuration's
  std::vector<int32_t> forced;     // teacher-forced continuation: score log p(forced[i] | prompt, forced[<i]),
                                   // fed one decode step at a time, after the prompt's compression
  int generate = 0;                // then greedy tokens to generate (fewer if EOS comes first)

  // Results.
  std::vector<float> forced_logprobs;  // one per forced token
  std::vector<int32_t> generated;
  std::vector<LayerHeld> layers;       // per layer of the model, at the job's last step
  KvCache::HeldBytes peak;             // the most pool bytes its sequence held, prefill included (KvCache::peak)
};

struct EvalRunnerOptions {
  int max_batch = 4;        // jobs run together
  int prefill_chunk = 512;  // prompt tokens per job per step (chunked prefill, as the engine does)
  // Jobs on the same prompt start from one prefill of it (eval/shared_prefill.h); false: each prefills alone.
  bool share_prefill = true;
  // Called when a job has ended and its layers are recorded, before its sequence leaves the cache (the tests
  // compare the record with the cache's and the metrics' own accounting). Optional.
  std::function<void(const EvalJob&, const KvCache&)> before_release;
};

class EvalRunner {
 public:
  EvalRunner(RankRuntime& runtime, EvalRunnerOptions options);

  // Runs every job; `progress(done, total)` is called after each finished batch. Throws std::runtime_error when
  // a job cannot fit in the KV pool on its own (beside its prompt's shared prefill).
  void run(std::span<EvalJob> jobs, const std::function<void(size_t, size_t)>& progress = {});
  // Prefills run so far: one per prompt shared by several jobs, one per job that prefills alone.
  int64_t prefills() const { return prefills_; }

 private:
  struct Active;
  struct SharedPrompt;
  void check_fits(std::span<const EvalJob> jobs) const;
  SharedPrompt prefill_shared(const std::vector<int32_t>& prompt);
  void run_batches(std::span<EvalJob* const> jobs, const SharedPrompt* shared, const std::function<void(size_t)>& done);
  void run_batch(std::span<EvalJob* const> batch, const SharedPrompt* shared);
  bool forks(const EvalJob& job) const;
  void start_from(const SharedPrompt& shared, Active& a, StepPlan& plan);
  // Scores or takes the token that follows a.known from a logits row (greedy: the sampled token); true once the
  // job has what it asked for.
  bool take_next(Active& a, std::span<const float> logits, int32_t greedy);
  void finish(Active& a, StepPlan& plan);
  StepResult execute(StepPlan& plan);
  std::vector<LayerHeld> layers_held(int64_t seq) const;

  RankRuntime& rt_;
  OfflineExecutor executor_;  // rt_'s
  EvalRunnerOptions options_;
  int64_t next_seq_ = 1;
  uint64_t step_ = 0;
  int64_t prefills_ = 0;
};

// log p(token) from one row of logits (log-softmax in double precision).
float token_logprob(std::span<const float> logits, int32_t token);

}  // namespace strata
