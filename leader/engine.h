#pragma once
// The leader's engine loop (rank 0): takes validated requests from the HTTP threads, schedules every step
// (continuous batching: a new request joins the running batch at the next step, a finished one leaves it),
// builds the StepPlan, has every rank execute it (leader/step_dispatcher.h), and turns sampled tokens into text
// events on each request's sink: incremental detokenization, stop strings, finish reasons, logprobs, usage and
// metrics (the KV state of every rank, from their reports).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "grammar/token_mask.h"
#include "leader/generation.h"
#include "leader/kv_state_view.h"
#include "leader/metrics.h"
#include "leader/prefix_cache.h"
#include "leader/scheduler.h"
#include "leader/step_dispatcher.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

namespace strata {

struct EngineOptions {
  SchedulerLimits limits;
  int max_waiting = 256;               // queued sequences beyond which submit() refuses (Refusal::queue_full)
  // Called on the engine thread, after the requests in flight have been failed, when a rank of the world failed
  // or stopped answering (parallel/comm.h RankFailure): the world cannot go on and should be ended.
  std::function<void(const std::string& message)> on_rank_failure;
  // The server's policies and the model's shape, for what the leader asks the policies: how much of a prompt may
  // come from cached blocks, and how many entries a sequence holds at its peak (chunked prefill compression; its
  // prefill_chunk, chunked or auto, also bounds the scheduler's chunks, whatever limits.prefill_chunk says).
  CompressionConfig compression;
  PolicyContext policy_context;
  std::optional<PrefixCacheSettings> prefix_cache;  // kv_cache.prefix_caching; none: off
};

class Engine final : public GenerationService {
 public:
  // ranks: the world that executes the plans (daemon/runtime.h make_dispatcher).
  Engine(StepDispatcher& ranks, const Tokenizer& tokenizer, const ModelConfig& config, ServerMetrics& metrics,
         EngineOptions options);
  // A world of one: the engine drives this executor over this cache itself (tests, evaluation).
  Engine(StepExecutor& executor, const KvCache& cache, const Tokenizer& tokenizer, const ModelConfig& config,
         ServerMetrics& metrics, EngineOptions options);
  ~Engine() override;

  void start();  // runs the loop on its own thread
  // Finishes the current step, fails what is still in flight (Failure::shutting_down, not_started), joins the thread.
  void stop();
  // A graceful drain: submit() refuses new requests (Refusal::draining) while those queued and running go on.
  void drain();
  // Nothing queued or running (after drain(), it stays so).
  bool idle() const;

  void submit(GenerationRequest request) override;
  std::string metrics_text() override;
  // The ranks report their sequences' policy detail only while someone watches: the first call asks for it in the
  // next step and waits for that step (a few seconds at most; then, or when the engine is not stepping, the last
  // rendering); for a second after each call every step renders the state again, and calls return the latest at
  // once. Called from a sink on the thread that steps (strata generate --json), it renders the last step's
  // reports at once: lengths, and detail if that step had it.
  std::string kv_state_json() override;
  bool healthy() const override;

  // Runs steps on the calling thread until every submitted request has finished (strata generate, bench, tests).
  // RankFailure propagates.
  void run_until_idle();

 private:
  using Clock = std::chrono::steady_clock;
  struct RequestState;
  // own_ranks: set by the world-of-one constructor, which then passes ranks == nullptr.
  Engine(std::unique_ptr<StepDispatcher> own_ranks, StepDispatcher* ranks, const Tokenizer& tokenizer,
         const ModelConfig& config, ServerMetrics& metrics, EngineOptions options);
  struct Sequence;

  void loop();
  bool has_work() const;
  bool kv_state_wanted() const { return kv_state_asked_ > kv_state_served_; }  // under mutex_
  void step();
  void take_new_requests();
  void drop_cancelled();
  StepPlan plan_step(const Schedule& schedule);
  void count_queued();
  void count_compression();
  void account_chunks(const Schedule& schedule);
  // Prefix caching: the waiting sequences as the scheduler sees them, with the cached blocks each starts from
  // pinned; the pool as the scheduler sees it, cached blocks that nobody uses counted as free; and the evictions
  // that make the step's blocks really free before it runs.
  std::deque<SchedulerSequence> waiting_for_schedule();
  PipelineKv kv_for_schedule() const;
  void evict_for(StepPlan& plan, const Schedule& schedule);
  void on_token(Sequence& seq, const SampledToken& sampled);
  // Structured output: the vocabulary as the grammar sees it (built on the first constrained request), the mask a
  // sequence's next token is sampled under (empty: any; its grammar's, and no stop token before min_tokens), and
  // the token's effect on its grammar (true: the document is complete and nothing can extend it).
  const std::shared_ptr<const grammar::VocabularyTrie>& vocabulary();
  std::vector<uint64_t> allowed_tokens(Sequence& seq);
  bool constraint_done(Sequence& seq, int32_t token);
  void finish(Sequence& seq, FinishReason reason, bool notify);
  // Whether a sequence under these policies compresses its prefill chunk by chunk (kv_cache.prefill_compression
  // chunked, or auto and every policy has the form).
  bool prefills_in_chunks(const std::optional<PolicySpec>& request_policy) const;
  // Per global layer, the most entries a prefill of these tokens holds under the request's policies.
  std::vector<int> peak_entries(const std::optional<PolicySpec>& request_policy, int prefill_len) const;
  void check_fits_the_pool(const GenerationRequest& request) const;
  // release: have the ranks free the failed sequences' KV (not when the world is broken). why: what the running
  // sequences' requests fail with (queued ones fail as not_started: they may be retried elsewhere).
  void fail_all(const std::string& message, bool release, Failure why);
  void publish_metrics();
  // After a step whose plan asked for the ranks' detail: renders /v1/kv_state and wakes the clients that wait.
  void serve_kv_state(const StepPlan& plan, uint64_t asked);
  std::string render_kv_state_now() const;

  std::unique_ptr<StepDispatcher> own_ranks_;  // the world-of-one constructor's
  StepDispatcher& ranks_;
  // Per pipeline stage: its layers and pool size (fixed at start-up), for submit()'s check.
  struct StageCapacity {
    int layer_begin = 0;
    int n_layers = 0;
    int64_t n_blocks = 0;
  };
  std::vector<StageCapacity> stages_;
  int block_size_ = 0;
  const Tokenizer& tokenizer_;
  const ModelConfig& config_;
  ServerMetrics& metrics_;
  EngineOptions options_;

  // Shared with the HTTP threads.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<GenerationRequest> inbox_;
  size_t n_queued_ = 0;  // sequences in inbox_ and waiting_, for the max_waiting bound
  bool stopping_ = false;
  bool draining_ = false;
  size_t n_in_flight_ = 0;  // requests submitted and not yet finished or failed
  bool healthy_ = true;
  std::string broken_;  // why the world is gone (a rank failed): new requests are refused
  std::condition_variable kv_state_ready_;
  uint64_t kv_state_asked_ = 0;   // first requests for /v1/kv_state (not watching) so far
  uint64_t kv_state_served_ = 0;  // of which a rendering after them answers
  Clock::time_point kv_state_watched_until_;  // every step renders the state until then
  std::string kv_state_json_ = "{}";

  // Engine thread only.
  std::thread thread_;
  std::atomic<std::thread::id> stepping_thread_;  // the thread in step(): the loop's, or run_until_idle's caller
  std::mt19937_64 seed_source_{std::random_device{}()};  // seeds for requests that give none
  uint64_t step_ = 0;
  int64_t next_seq_id_ = 1;
  std::map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::vector<int64_t> running_;   // admission order
  std::deque<int64_t> waiting_;    // arrival order (preempted sequences go back to the front)
  std::vector<int64_t> to_release_;  // finished since the last plan: the ranks free them in the next one
  std::optional<PrefixCache> prefix_;  // prefix caching, when on
  std::shared_ptr<const grammar::VocabularyTrie> vocabulary_;
};

}  // namespace strata
