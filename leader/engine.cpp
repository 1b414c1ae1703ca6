#include "leader/engine.h"

#include <algorithm>
#include <stdexcept>

#include "cache/prefill_footprint.h"
#include "cache/scoring_tokens.h"
#include "kernels/token_mask_layout.h"
#include "leader/stop_matcher.h"

namespace strata {

struct Engine::RequestState {
  GenerationRequest request;
  int n_unfinished = 0;
  Usage usage;
  Clock::time_point arrival;
  bool admitted = false;  // one of its sequences has been scheduled (the end of its wait in the queue)
  bool first_token_seen = false;
};

struct Engine::Sequence {
  int64_t id = 0;
  std::shared_ptr<RequestState> req;
  int choice = 0;
  std::vector<int32_t> tokens;  // prompt, then generated
  int n_prompt = 0;
  int n_cached = 0;             // tokens whose KV the ranks hold
  int prefill_len = 0;          // tokens known at (re)admission: chunks before this are prefill
  bool chunked_prefill = false;  // its policies compress prefill chunks (kv_cache.prefill_compression, decided)
  std::vector<int> peak_entries;  // chunked prefill compression, waiting: per global layer, for a prefill of
  int peak_prefill_len = 0;       // this many tokens
  ScoringRows scoring;            // and the scoring rows of its chunks (cache/prefill_footprint.h)
  int n_generated = 0;
  bool known_to_ranks = false;
  uint64_t seed = 0;
  IncrementalDecoder decoder;
  StopMatcher stop;
  std::unique_ptr<grammar::TokenMatcher> constraint;  // structured output: the grammar's state after its tokens
  Clock::time_point last_token;

  Sequence(const Tokenizer& tokenizer, const std::vector<std::string>& stops)
      : decoder(tokenizer, /*skip_special=*/true), stop(stops) {}
};

Engine::Engine(StepDispatcher& ranks, const Tokenizer& tokenizer, const ModelConfig& config, ServerMetrics& metrics,
               EngineOptions options)
    : Engine(nullptr, &ranks, tokenizer, config, metrics, std::move(options)) {}

Engine::Engine(StepExecutor& executor, const KvCache& cache, const Tokenizer& tokenizer, const ModelConfig& config,
               ServerMetrics& metrics, EngineOptions options)
    : Engine(std::make_unique<StepDispatcher>(RankGrid{}, executor, cache, nullptr), nullptr, tokenizer, config,
             metrics, std::move(options)) {}

Engine::Engine(std::unique_ptr<StepDispatcher> own_ranks, StepDispatcher* ranks, const Tokenizer& tokenizer,
               const ModelConfig& config, ServerMetrics& metrics, EngineOptions options)
    : own_ranks_(std::move(own_ranks)),
      ranks_(ranks ? *ranks : *own_ranks_),
      tokenizer_(tokenizer),
      config_(config),
      metrics_(metrics),
      options_(std::move(options)) {
  const PipelineKv kv = ranks_.pipeline_kv();
  int layer_begin = 0;
  for (int s = 0; s < kv.n_stages(); ++s) {
    stages_.push_back({layer_begin, kv.n_layers(s), kv.n_total(s)});
    layer_begin += kv.n_layers(s);
  }
  block_size_ = kv.block_size();
  options_.limits.prefill_chunk = options_.compression.prefill_chunk;
  // The policies are asked about the whole model, whatever shape the options were given.
  options_.policy_context.n_layers_total = config.n_layers;
  options_.policy_context.n_heads = config.n_heads;
  options_.policy_context.n_kv_heads = config.n_kv_heads;
  if (options_.prefix_cache) {
    prefix_.emplace(block_size_, *options_.prefix_cache, options_.compression, options_.policy_context);
  }
  publish_metrics();
  kv_state_json_ = render_kv_state_now();
}

Engine::~Engine() { stop(); }

void Engine::start() { thread_ = std::thread([this] { loop(); }); }

void Engine::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  kv_state_ready_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::drain() {
  std::lock_guard lock(mutex_);
  draining_ = true;
}

bool Engine::idle() const {
  std::lock_guard lock(mutex_);
  return n_in_flight_ == 0;
}

void Engine::submit(GenerationRequest request) {
  const int n_prompt = int(request.prompt_ids.size());
  if (n_prompt == 0) throw std::invalid_argument("the prompt is empty");
  if (n_prompt >= config_.max_context) {
    throw std::invalid_argument("the prompt has " + std::to_string(n_prompt) + " tokens; the model's context is " +
                                std::to_string(config_.max_context) + " tokens");
  }
  check_fits_the_pool(request);
  if (!request.sink) throw std::logic_error("generation request without a sink");
  {
    std::lock_guard lock(mutex_);
    if (!broken_.empty()) throw SubmitRefused(Refusal::rank_lost, "the server lost a rank: " + broken_);
    if (stopping_) throw SubmitRefused(Refusal::shutting_down, "the server is shutting down");
    if (draining_) {
      throw SubmitRefused(Refusal::draining, "the server is draining before it shuts down; retry on another server");
    }
    if (n_queued_ + size_t(request.n) > size_t(options_.max_waiting)) {
      throw SubmitRefused(Refusal::queue_full, "the request queue is full (" + std::to_string(options_.max_waiting) +
                                                   " sequences waiting); retry later");
    }
    n_queued_ += size_t(request.n);
    ++n_in_flight_;
    inbox_.push_back(std::move(request));
  }
  wake_.notify_one();
}

std::vector<int> Engine::peak_entries(const std::optional<PolicySpec>& request_policy, int prefill_len) const {
  return prefill_peak_entries(options_.compression, request_policy, options_.policy_context, prefill_len);
}

bool Engine::prefills_in_chunks(const std::optional<PolicySpec>& request_policy) const {
  return options_.compression.for_sequence(request_policy, options_.policy_context).chunked();
}

// A prompt whose peak (with its first generated token) cannot fit the KV pool of a pipeline stage alone would wait
// forever.
void Engine::check_fits_the_pool(const GenerationRequest& request) const {
  const int n_prompt = int(request.prompt_ids.size());
  // end: every layer holds the prompt (the policies' context is not needed, and tests leave it out).
  const bool chunked = prefills_in_chunks(request.kv_policy);
  const std::vector<int> peak = chunked ? peak_entries(request.kv_policy, n_prompt) : std::vector<int>{};
  for (size_t s = 0; s < stages_.size(); ++s) {
    const StageCapacity& stage = stages_[s];
    int64_t blocks = 0;
    for (int l = stage.layer_begin; l < stage.layer_begin + stage.n_layers; ++l) {
      blocks += ((chunked ? peak.at(size_t(l)) : n_prompt + 1) + block_size_ - 1) / block_size_;
    }
    if (blocks > stage.n_blocks) {
      const int64_t per_layer = stage.n_blocks / stage.n_layers * block_size_;
      throw std::invalid_argument(
          "the prompt has " + std::to_string(n_prompt) + " tokens and needs " + std::to_string(blocks) +
          " KV blocks at its peak" + (stages_.size() > 1 ? " on pipeline stage " + std::to_string(s) : std::string()) +
          (chunked ? " under its KV policies (kv_cache.prefill_compression chunked)" : std::string()) +
          "; the server's pool has " + std::to_string(stage.n_blocks) + " (about " + std::to_string(per_layer) +
          " tokens a layer)");
    }
  }
}

std::string Engine::metrics_text() { return metrics_.render(); }

std::string Engine::kv_state_json() {
  if (std::this_thread::get_id() == stepping_thread_.load()) return render_kv_state_now();
  std::unique_lock lock(mutex_);
  const Clock::time_point now = Clock::now();
  const bool watched = now < kv_state_watched_until_;
  kv_state_watched_until_ = now + std::chrono::seconds(1);
  if (!watched) {
    const uint64_t asked = ++kv_state_asked_;
    wake_.notify_one();
    kv_state_ready_.wait_for(lock, std::chrono::seconds(5),
                             [&] { return kv_state_served_ >= asked || stopping_ || !broken_.empty(); });
  }
  return kv_state_json_;
}

bool Engine::healthy() const {
  std::lock_guard lock(mutex_);
  return healthy_ && broken_.empty() && !stopping_;
}


bool Engine::has_work() const { return !running_.empty() || !waiting_.empty() || !to_release_.empty(); }

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      // Step while idle too, every 100 ms: a client gone during a long prompt's queueing is noticed, and with
      // several ranks the empty step is the heartbeat by which they know the leader is alive.
      wake_.wait_for(lock, std::chrono::milliseconds(100),
                     [&] { return stopping_ || !inbox_.empty() || has_work() || kv_state_wanted(); });
      if (stopping_) break;
    }
    try {
      step();
    } catch (const RankFailure& e) {
      // The world is broken: fail what is in flight (the ranks cannot free anything now), refuse new requests,
      // and let the owner end the world.
      const std::string message = std::string("a rank failed: ") + e.what();
      {
        std::lock_guard lock(mutex_);
        broken_ = e.what();
      }
      kv_state_ready_.notify_all();
      fail_all(message, /*release=*/false, Failure::rank_lost);
      if (options_.on_rank_failure) options_.on_rank_failure(e.what());
      return;
    } catch (const std::exception& e) {
      // A failed step must not take the server down or leave clients waiting: fail what is in flight.
      fail_all(std::string("engine step failed: ") + e.what(), /*release=*/true, Failure::step_failed);
    }
  }
  fail_all("the server is shutting down", /*release=*/true, Failure::shutting_down);
}

void Engine::run_until_idle() {
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (inbox_.empty() && !has_work()) return;
    }
    step();
  }
}

void Engine::take_new_requests() {
  std::deque<GenerationRequest> incoming;
  {
    std::lock_guard lock(mutex_);
    incoming.swap(inbox_);
  }
  for (GenerationRequest& r : incoming) {
    auto req = std::make_shared<RequestState>();
    req->arrival = Clock::now();
    req->n_unfinished = r.n;
    req->usage.prompt_tokens = int(r.prompt_ids.size());
    req->request = std::move(r);
    const SamplingParams& sp = req->request.sampling;
    const bool chunked_prefill = prefills_in_chunks(req->request.kv_policy);
    for (int c = 0; c < req->request.n; ++c) {
      auto seq = std::make_unique<Sequence>(tokenizer_, sp.stop);
      seq->chunked_prefill = chunked_prefill;
      seq->id = next_seq_id_++;
      seq->req = req;
      seq->choice = c;
      seq->tokens = req->request.prompt_ids;
      seq->n_prompt = int(seq->tokens.size());
      // The same seed gives the same output; the choices of one request differ from each other.
      seq->seed = sp.seed ? *sp.seed + uint64_t(c) : seed_source_();
      if (req->request.grammar) {
        seq->constraint = std::make_unique<grammar::TokenMatcher>(vocabulary(), req->request.grammar,
                                                                  tokenizer_.stop_ids());
      }
      waiting_.push_back(seq->id);
      seqs_.emplace(seq->id, std::move(seq));
    }
  }
}

void Engine::drop_cancelled() {
  std::vector<Sequence*> gone;
  for (auto& [id, seq] : seqs_) {
    if (seq->req->request.sink->cancelled()) gone.push_back(seq.get());
  }
  for (Sequence* seq : gone) finish(*seq, FinishReason::abort, /*notify=*/false);
}

void Engine::step() {
  stepping_thread_ = std::this_thread::get_id();
  take_new_requests();
  drop_cancelled();
  std::vector<SchedulerSequence> running;
  for (int64_t id : running_) {
    const Sequence& s = *seqs_.at(id);
    running.push_back({id, int(s.tokens.size()), s.n_cached, 0, {}, s.scoring.count});
  }
  const std::deque<SchedulerSequence> waiting = waiting_for_schedule();
  const Schedule schedule = schedule_step(running, waiting, to_release_, kv_for_schedule(), options_.limits);
  StepPlan plan = plan_step(schedule);
  if (prefix_) {
    evict_for(plan, schedule);
    prefix_->plan_done();
  }
  uint64_t kv_state_asked = 0;
  {
    std::lock_guard lock(mutex_);
    plan.report_detail = kv_state_wanted() || Clock::now() < kv_state_watched_until_;
    kv_state_asked = kv_state_asked_;
  }
  count_queued();

  const StepResult result = ranks_.execute(plan);
  count_compression();
  account_chunks(schedule);
  // The KV state is published before the step's tokens go out, so that a client that reads /metrics (or
  // /v1/kv_state) after receiving a token sees the cache that produced it.
  publish_metrics();
  serve_kv_state(plan, kv_state_asked);
  for (const SampledToken& t : result.sampled) on_token(*seqs_.at(t.seq), t);
  metrics_.set_requests(int(running_.size()), int(waiting_.size()));
}

// The schedule's decisions as the ranks will carry them out, with the engine's own bookkeeping of them.
StepPlan Engine::plan_step(const Schedule& schedule) {
  StepPlan plan;
  plan.step = ++step_;
  for (int64_t id : schedule.unservable) finish(*seqs_.at(id), FinishReason::length, /*notify=*/true);
  for (int64_t id : schedule.preempted) {
    Sequence& s = *seqs_.at(id);
    s.n_cached = 0;
    if (prefix_) prefix_->release(id);
    std::erase(running_, id);
    waiting_.push_front(id);
    plan.preempted.push_back(id);
    metrics_.add_preemption();
  }
  for (int64_t id : schedule.admitted) {
    Sequence& s = *seqs_.at(id);
    std::erase(waiting_, id);
    running_.push_back(id);
    s.prefill_len = int(s.tokens.size());
    if (!s.req->admitted) {
      s.req->admitted = true;
      metrics_.observe_queue_time(std::chrono::duration<double>(Clock::now() - s.req->arrival).count());
    }
    if (!s.known_to_ranks) {
      const GenerationRequest& r = s.req->request;
      plan.added.push_back(PlannedSequence{id, r.sampling, s.seed, r.kv_policy, s.n_prompt});
      s.known_to_ranks = true;
      // Its prompt's lookup, once: a recompute after preemption is not a new query.
      Usage& usage = s.req->usage;
      usage.cached_prompt_tokens = std::max(usage.cached_prompt_tokens, s.n_cached);
      metrics_.add_prefix_cache_lookup(s.n_prompt, s.n_cached);
      if (prefix_ && prefix_->blocks_of(id).compressed) metrics_.add_compressed_prefix_start();
    }
    if (prefix_) prefix_->start(plan, id, s.prefill_len);
  }
  plan.finished.swap(to_release_);
  for (const ScheduledChunk& c : schedule.chunks) {
    const Sequence& s = *seqs_.at(c.id);
    PlannedWork w;
    w.seq = c.id;
    w.start_pos = c.start;
    w.tokens.assign(s.tokens.begin() + c.start, s.tokens.begin() + c.start + c.n);
    w.sample = c.start + c.n == int(s.tokens.size());
    w.prefill_len = c.start < s.prefill_len ? s.prefill_len : 0;
    if (c.n_scoring > 0) {
      const std::span<const int32_t> prefill = std::span(s.tokens).first(size_t(s.prefill_len));
      append_scoring_rows(w, scoring_tokens(s.scoring, options_.compression, prefill, c.start + c.n));
    }
    if (w.sample) w.allowed = allowed_tokens(*seqs_.at(c.id));
    if (prefix_) prefix_->publish(plan, c.id, s.tokens, c.start + c.n, s.prefill_len);
    plan.work.push_back(std::move(w));
  }
  return plan;
}

std::deque<SchedulerSequence> Engine::waiting_for_schedule() {
  std::deque<SchedulerSequence> waiting;
  for (int64_t id : waiting_) {
    Sequence& s = *seqs_.at(id);
    int n_copied = 0;
    if (prefix_) {
      s.n_cached = prefix_->pin(id, s.tokens, int(s.tokens.size()), s.req->request.kv_policy);
      if (prefix_->copies(id)) n_copied = s.n_cached;
    }
    if (s.chunked_prefill && s.peak_prefill_len != int(s.tokens.size())) {
      s.peak_entries = peak_entries(s.req->request.kv_policy, int(s.tokens.size()));
      s.scoring = prefill_scoring_rows(options_.compression, s.req->request.kv_policy, options_.policy_context,
                                       int(s.tokens.size()));
      s.peak_prefill_len = int(s.tokens.size());
    }
    waiting.push_back({id, int(s.tokens.size()), s.n_cached, n_copied, s.peak_entries, s.scoring.count});
  }
  return waiting;
}

PipelineKv Engine::kv_for_schedule() const {
  PipelineKv kv = ranks_.pipeline_kv();
  if (prefix_) {
    for (int s = 0; s < kv.n_stages(); ++s) kv.add_free(s, prefix_->n_evictable() * kv.n_layers(s));
  }
  return kv;
}

// Each cached block that goes frees one block per layer of every stage; the step needs, on each stage, the blocks
// its chunks append and the copies its new sequences take, beyond what is free once the finished and preempted
// sequences have given theirs back.
void Engine::evict_for(StepPlan& plan, const Schedule& schedule) {
  const PipelineKv kv = ranks_.pipeline_kv();
  int64_t n_evict = 0;
  for (int stage = 0; stage < kv.n_stages(); ++stage) {
    int64_t need = -kv.n_free(stage);
    for (const ScheduledChunk& c : schedule.chunks) need += kv.blocks_to_append(stage, c.id, c.n + c.n_scoring);
    for (const PrefixStart& s : plan.prefix_started) need += s.copy ? int64_t(s.blocks.size()) * kv.n_layers(stage) : 0;
    for (int64_t id : plan.finished) need -= kv.blocks_held(stage, id);
    for (int64_t id : plan.preempted) need -= kv.blocks_held(stage, id);
    const int64_t per_block = kv.n_layers(stage);
    if (need > 0) n_evict = std::max(n_evict, (need + per_block - 1) / per_block);
  }
  if (n_evict > 0) prefix_->evict(plan, n_evict);
}

// The sequences waiting for admission, for submit()'s bound.
void Engine::count_queued() {
  std::lock_guard lock(mutex_);
  n_queued_ = waiting_.size();
  for (const GenerationRequest& r : inbox_) n_queued_ += size_t(r.n);
}

// What every rank's policies did in the step, as counters per (layer, pp_stage, tp_rank).
void Engine::count_compression() {
  for (const RankReport& r : ranks_.reports()) {
    for (size_t i = 0; i < r.layers.size(); ++i) {
      const LayerReport& l = r.layers[i];
      if (l.evicted_tokens == 0 && l.observations.empty()) continue;
      metrics_.add_layer_compression(r.layer_begin + int(i), r.pp_stage, r.tp_rank, l.evicted_tokens, l.observations);
    }
  }
}

// The chunks the ranks have now cached, and the prompt tokens among them.
void Engine::account_chunks(const Schedule& schedule) {
  int n_prompt_tokens = 0;
  for (const ScheduledChunk& c : schedule.chunks) {
    Sequence& s = *seqs_.at(c.id);
    s.n_cached += c.n;
    n_prompt_tokens += std::max(0, std::min(c.start + c.n, s.n_prompt) - c.start);
  }
  metrics_.add_prompt_tokens(n_prompt_tokens);
}

void Engine::on_token(Sequence& seq, const SampledToken& sampled) {
  RequestState& req = *seq.req;
  const SamplingParams& sp = req.request.sampling;
  const int32_t token = sampled.sample.id;
  const Clock::time_point now = Clock::now();
  if (!req.first_token_seen) {
    req.first_token_seen = true;
    metrics_.observe_time_to_first_token(std::chrono::duration<double>(now - req.arrival).count());
  } else if (seq.n_generated > 0) {
    metrics_.observe_inter_token_latency(std::chrono::duration<double>(now - seq.last_token).count());
  }
  seq.last_token = now;
  seq.tokens.push_back(token);
  ++seq.n_generated;
  ++req.usage.completion_tokens;
  metrics_.add_generation_tokens(1);

  ChoiceDelta delta;
  delta.choice = seq.choice;
  delta.token_ids.push_back(token);
  if (sp.n_logprobs >= 0) {
    LogprobEntry e{tokenizer_.token_bytes(token), token, sampled.sample.logprob, {}};
    for (const TokenLogprob& top : sampled.sample.top) e.top.emplace_back(tokenizer_.token_bytes(top.id), top.logprob);
    delta.logprobs.push_back(std::move(e));
  }

  const auto& stop_ids = tokenizer_.stop_ids();
  const bool is_stop_token =
      !sp.ignore_eos && std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end();
  if (is_stop_token) {
    req.request.sink->on_event(std::move(delta));
    finish(seq, FinishReason::stop, /*notify=*/true);
    return;
  }
  const bool document_done = seq.constraint && constraint_done(seq, token);
  const StopScan text = seq.stop.push(seq.decoder.push(token));
  delta.text = text.text;
  req.request.sink->on_event(std::move(delta));
  if (text.stopped || document_done) {
    finish(seq, FinishReason::stop, /*notify=*/true);
  } else if (seq.n_generated >= sp.max_tokens || int(seq.tokens.size()) >= config_.max_context) {
    finish(seq, FinishReason::length, /*notify=*/true);
  }
}

const std::shared_ptr<const grammar::VocabularyTrie>& Engine::vocabulary() {
  if (!vocabulary_) {
    // One column per logit; the stop tokens, special and so without bytes, end a complete document.
    vocabulary_ = std::make_shared<const grammar::VocabularyTrie>(tokenizer_.text_bytes(config_.vocab_size));
  }
  return vocabulary_;
}

std::vector<uint64_t> Engine::allowed_tokens(Sequence& seq) {
  const bool too_early = seq.n_generated < seq.req->request.sampling.min_tokens;
  if (!seq.constraint && !too_early) return {};
  std::vector<uint64_t> words;
  if (seq.constraint) {
    const grammar::TokenMask& mask = seq.constraint->allowed_tokens();
    words.assign(mask.begin(), mask.end());
  } else {
    words.assign(size_t(mask_words(config_.vocab_size)), ~uint64_t(0));
  }
  if (too_early) {
    for (int32_t id : tokenizer_.stop_ids()) {
      if (id >= 0 && id < config_.vocab_size) mask_clear(words, id);
    }
  }
  return words;
}

bool Engine::constraint_done(Sequence& seq, int32_t token) {
  grammar::TokenMatcher& matcher = *seq.constraint;
  if (!matcher.accept_token(token)) {
    // The ranks sampled under the mask this sequence's state gave: anything else is a bug on their side.
    throw std::logic_error("request " + seq.req->request.id + ": token " + std::to_string(token) +
                           " was sampled outside its grammar's mask");
  }
  return matcher.is_finished() || !matcher.masker().automaton().can_continue(matcher.state());
}

void Engine::finish(Sequence& seq, FinishReason reason, bool notify) {
  const int64_t id = seq.id;
  std::shared_ptr<RequestState> req = seq.req;
  if (notify) {
    // Whatever the decoder and the stop matcher still hold belongs to the output, unless a stop string ended it.
    if (!seq.stop.stopped()) {
      const std::string rest = seq.stop.push(seq.decoder.flush()).text + seq.stop.flush();
      if (!rest.empty()) req->request.sink->on_event(ChoiceDelta{seq.choice, rest, {}, {}});
    }
    req->request.sink->on_event(ChoiceFinished{seq.choice, reason});
  }
  std::erase(running_, id);
  std::erase(waiting_, id);
  if (seq.known_to_ranks) to_release_.push_back(id);
  if (prefix_) prefix_->release(id);
  seqs_.erase(id);  // `seq` is gone from here on

  if (--req->n_unfinished == 0) {
    {
      std::lock_guard lock(mutex_);
      --n_in_flight_;
    }
    metrics_.add_finished_request(reason);
    metrics_.observe_finished_request(std::chrono::duration<double>(Clock::now() - req->arrival).count(),
                                      req->usage.prompt_tokens, req->usage.completion_tokens);
    if (notify) req->request.sink->on_event(RequestFinished{req->usage});
  }
}

void Engine::fail_all(const std::string& message, bool release, Failure why) {
  std::vector<std::shared_ptr<RequestState>> reqs;
  for (auto& [id, seq] : seqs_) {
    if (std::find(reqs.begin(), reqs.end(), seq->req) == reqs.end()) reqs.push_back(seq->req);
    if (seq->known_to_ranks) to_release_.push_back(id);
  }
  seqs_.clear();
  running_.clear();
  waiting_.clear();
  std::deque<GenerationRequest> incoming;
  {
    std::lock_guard lock(mutex_);
    incoming.swap(inbox_);
    n_queued_ = 0;
    n_in_flight_ -= reqs.size() + incoming.size();
  }
  for (auto& req : reqs) req->request.sink->on_event(RequestFailed{why, message});
  for (auto& r : incoming) r.sink->on_event(RequestFailed{Failure::not_started, message});
  // The ranks still hold the KV of the failed sequences: free it now (the next plan would otherwise do it).
  if (!release) to_release_.clear();
  if (!to_release_.empty()) {
    StepPlan plan;
    plan.step = ++step_;
    plan.finished.swap(to_release_);
    try {
      ranks_.execute(plan);
    } catch (const std::exception&) {
      std::lock_guard lock(mutex_);
      healthy_ = false;  // the ranks are in an unknown state: report it on /health
    }
  }
  publish_metrics();
}

// Every rank's report of the last step: per-layer gauges for each (layer, pp_stage, tp_rank); the pool totals from
// the first tensor rank of each stage (its TP peers hold the same block counts).
void Engine::publish_metrics() {
  if (prefix_) metrics_.set_prefix_cache_blocks(prefix_->n_cached());
  const RankGrid& grid = ranks_.grid();
  const std::vector<RankReport>& reports = ranks_.reports();
  for (const RankReport& r : reports) {
    for (size_t i = 0; i < r.layers.size(); ++i) {
      const LayerUsage& u = r.layers[i].usage;
      const int layer = r.layer_begin + int(i);
      metrics_.set_layer_kv(layer, r.pp_stage, r.tp_rank, u.entries, u.bytes, u.uncompressed_bytes);
      metrics_.set_layer_observed(layer, r.pp_stage, r.tp_rank, r.layers[i].observations);
      metrics_.set_layer_prefix_cached(layer, r.pp_stage, r.tp_rank, u.cached_blocks);
    }
  }
  int64_t blocks_free = 0, blocks_total = 0;
  for (int st = 0; st < grid.pp; ++st) {
    const RankReport& r = reports.at(size_t(grid.rank_of(st, 0)));
    blocks_free += r.blocks_free;
    blocks_total += r.blocks_total;
  }
  metrics_.set_kv_blocks(blocks_free, blocks_total, reports.at(0).block_size);
  metrics_.set_requests(int(running_.size()), int(waiting_.size()));
}

std::string Engine::render_kv_state_now() const {
  std::vector<KvStateSequence> sequences;
  for (const auto& [id, seq] : seqs_) {
    const GenerationRequest& r = seq->req->request;
    KvStateSequence s{id, r.id, seq->choice, r.kv_policy ? to_string(*r.kv_policy) : "", seq->n_prompt,
                      seq->n_generated, seq->n_cached};
    if (prefix_) {
      const PrefixCache::SequenceBlocks blocks = prefix_->blocks_of(id);
      s.prefix_blocks_shared = blocks.started_from;
      s.prefix_blocks_published = blocks.published;
      s.prefix_compressed = blocks.compressed;
    }
    s.chunked_prefill = seq->chunked_prefill;
    sequences.push_back(std::move(s));
  }
  return render_kv_state(ranks_.grid(), ranks_.reports(), sequences, prefix_ ? prefix_->n_cached() - prefix_->n_evictable() : 0);
}

void Engine::serve_kv_state(const StepPlan& plan, uint64_t asked) {
  if (!plan.report_detail) return;
  std::string text = render_kv_state_now();
  {
    std::lock_guard lock(mutex_);
    kv_state_json_ = std::move(text);
    kv_state_served_ = std::max(kv_state_served_, asked);
  }
  kv_state_ready_.notify_all();
}

}  // namespace strata
