#include "rank/step_executor.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "cache/policies/pod_policy.h"
#include "cache/pooled_layer_keys.h"

namespace strata {

StepExecutor::StepExecutor(LlamaModel& model, KvCache& cache, CompressionConfig compression, std::string model_name,
                           PolicyCollectives* collectives)
    : model_(model),
      cache_(cache),
      compression_(std::move(compression)),
      model_name_(std::move(model_name)),
      collectives_(collectives ? *collectives : single_rank_collectives()),
      counters_(size_t(cache.n_layers())) {}

StepResult StepExecutor::execute(const StepPlan& plan) {
  for (const PlannedSequence& a : plan.added) {
    SequenceState state(SequenceSampler(a.sampling, a.seed));
    if (!a.kv_policy.empty()) state.request_policy = parse_policy_spec(a.kv_policy);
    seqs_.insert_or_assign(a.seq, std::move(state));
  }
  // A preempted sequence keeps its sampling state: when it is recomputed it must draw what it would have drawn.
  // Its policies start again with the recompute's prefill.
  for (int64_t seq : plan.preempted) {
    cache_.release(seq);
    if (auto it = seqs_.find(seq); it != seqs_.end()) {
      it->second.policies.clear();
      it->second.prefill_stats.reset();
    }
  }
  for (int64_t seq : plan.finished) {
    cache_.release(seq);
    seqs_.erase(seq);
  }

  std::vector<BatchSequence> batch;
  std::vector<std::unique_ptr<AttentionStats>> step_stats(plan.work.size());
  batch.reserve(plan.work.size());
  for (size_t i = 0; i < plan.work.size(); ++i) {
    const PlannedWork& w = plan.work[i];
    auto it = seqs_.find(w.seq);
    if (it == seqs_.end()) throw std::logic_error("step plan: work for unknown sequence " + std::to_string(w.seq));
    SequenceState& state = it->second;
    if (w.prefill_len > 0 && w.start_pos == 0) start_prefill(state, w.prefill_len);
    AttentionStats* stats = nullptr;
    if (w.prefill_len > 0) {
      stats = state.prefill_stats.get();
    } else {
      step_stats[i] = decode_stats(w, state);
      stats = step_stats[i].get();
    }
    // Only the last pipeline stage has logits to sample, and only it draws from the sequences' RNGs.
    const bool samples = w.sample && model_.has_output();
    const LogitsMode logits = !samples ? LogitsMode::none : keep_logits_ ? LogitsMode::last : LogitsMode::sample;
    batch.push_back(BatchSequence{w.seq, w.tokens, w.start_pos, logits, stats, state.pod.get()});
  }
  // Every sampling is taken before the forward pass points at it (next() reuses its sampler's penalty buffer).
  sampling_.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].logits != LogitsMode::sample) continue;
    sampling_[i] = seqs_.at(batch[i].seq).sampler.next();
    batch[i].sampling = &sampling_[i];
  }

  StepResult result;
  result.step = plan.step;
  if (batch.empty()) return result;
  model_.forward(batch, cache_, logits_, samples_);

  const int64_t vocab = model_.config().vocab_size;
  int64_t row = 0, sampled = 0;
  for (size_t i = 0; i < plan.work.size(); ++i) {
    const PlannedWork& w = plan.work[i];
    SequenceState& state = seqs_.at(w.seq);
    if (batch[i].logits != LogitsMode::none) {
      const RowSample s = batch[i].logits == LogitsMode::sample
                              ? std::move(samples_[size_t(sampled++)])
                              : state.sampler.sample(std::span<float>(logits_.data() + row++ * vocab, size_t(vocab)));
      state.sampler.accept(s.id);
      SampledToken t{w.seq, s.id, s.logprob, {}, {}};
      for (const TokenLogprob& top : s.top) {
        t.top_ids.push_back(top.id);
        t.top_logprobs.push_back(top.logprob);
      }
      result.sampled.push_back(std::move(t));
    }
    run_hooks(w, state, step_stats[i].get());
    seal_groups(w, state);
    free_distant_keys(w, state);
  }
  return result;
}

void StepExecutor::start_prefill_with_entries(int64_t seq, int prefill_len) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::logic_error("start_prefill_with_entries: unknown sequence " + std::to_string(seq));
  start_prefill(it->second, prefill_len);
}

const PolicySpec& StepExecutor::spec_for(const SequenceState& state, int global_layer) const {
  return state.request_policy ? *state.request_policy : compression_.for_layer(global_layer);
}

PolicyContext StepExecutor::policy_context(int global_layer) const {
  return PolicyContext{global_layer,        model_.config().n_layers, model_.n_heads_local(),
                       model_.n_kv_heads_local(), model_name_,           &collectives_};
}

void StepExecutor::start_prefill(SequenceState& state, int prefill_len) {
  state.prefill_len = prefill_len;
  state.policies.clear();
  state.merged_tokens.assign(size_t(cache_.n_layers()), 0);
  const int n_heads = model_.n_heads_local();
  // Every rank must agree on whether the sequence takes the cross-layer step (it is a collective), so the
  // policies of the other stages' layers are asked too; building one does no work.
  state.cross_layer = false;
  for (int l = 0; l < model_.config().n_layers; ++l) {
    if (l >= cache_.layer_begin() && l < cache_.layer_end()) continue;
    state.cross_layer = state.cross_layer || make_policy(spec_for(state, l), policy_context(l))->cross_layer();
  }
  auto stats = std::make_unique<AttentionStats>();
  bool any = false;
  state.pod = pod_sequence(state);
  for (int l = cache_.layer_begin(); l < cache_.layer_end() && cache_.pool().quantized(); ++l) {
    if (spec_for(state, l).name == "spindlekv") {
      throw std::invalid_argument("policy spindlekv: needs kv_cache.dtype f32 (its codebooks replace the entries)");
    }
  }
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    state.policies.push_back(make_policy(spec_for(state, l), policy_context(l)));
    state.cross_layer = state.cross_layer || state.policies.back()->cross_layer();
    LayerState start;
    start.prompt_len = prefill_len;
    const int from = state.policies.back()->needs(start).prefill_rows_from;
    stats->rows_from.push_back(from);
    any = any || from >= 0;
  }
  if (!any) {
    state.prefill_stats.reset();
    return;
  }
  stats->stride = prefill_len;  // nothing is evicted before the prompt ends: entries are positions
  for (int from : stats->rows_from) {
    stats->sums.emplace_back(from >= 0 ? size_t(n_heads) * size_t(prefill_len) : 0, 0.0f);
  }
  state.prefill_stats = std::move(stats);
}

// PoD runs in every layer of a sequence or in none: a follower's leader must keep all its keys and score its
// distant entries, which another policy in the leader's layer would not do.
std::unique_ptr<PodSequence> StepExecutor::pod_sequence(const SequenceState& state) const {
  const int n_layers = model_.config().n_layers;
  int n_pod = 0;
  for (int l = 0; l < n_layers; ++l) n_pod += spec_for(state, l).name == "pod" ? 1 : 0;
  if (n_pod == 0) return nullptr;
  if (n_pod != n_layers) {
    throw std::invalid_argument("policy pod: runs in every layer or in none (" + std::to_string(n_pod) + " of " +
                                std::to_string(n_layers) + " layers have it)");
  }
  if (!pod_blocks_) throw std::invalid_argument("policy pod: needs kv_cache.pod_blocks (made by strata calibrate)");
  if (cache_.pool().quantized()) throw std::invalid_argument("policy pod: needs kv_cache.dtype f32");
  auto pod = std::make_unique<PodSequence>();
  const auto policy = make_policy(spec_for(state, cache_.layer_begin()), policy_context(cache_.layer_begin()));
  pod->window = static_cast<const PodPolicy&>(*policy).window();
  // Tensor parallelism splits whole KV heads with their query heads, so a rank needs only its own heads' blocks.
  const int head_begin = model_.kv_head_begin();
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    std::vector<int> leaders;
    for (int h = 0; h < model_.n_kv_heads_local(); ++h) leaders.push_back(pod_blocks_->leader[size_t(head_begin + h)][size_t(l)]);
    pod->leader.push_back(std::move(leaders));
  }
  return pod;
}

std::unique_ptr<AttentionStats> StepExecutor::decode_stats(const PlannedWork& work, SequenceState& state) {
  if (state.policies.empty()) return nullptr;
  const int n_heads = model_.n_heads_local();
  auto stats = std::make_unique<AttentionStats>();
  bool any = false;
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    LayerState s;
    s.prompt_len = state.prefill_len;
    s.n_entries = cache_.layer(work.seq, l).n_entries;
    s.n_generated = work.start_pos - state.prefill_len + 1;
    const bool wanted = state.policies[size_t(l - cache_.layer_begin())]->needs(s).decode_probabilities;
    stats->rows_from.push_back(wanted ? work.start_pos : -1);
    stats->stride = std::max(stats->stride, s.n_entries + 1);
    any = any || wanted;
  }
  if (!any) return nullptr;
  for (int from : stats->rows_from) stats->sums.emplace_back(from >= 0 ? size_t(n_heads) * stats->stride : 0, 0.0f);
  return stats;
}

LayerState StepExecutor::layer_state(const SequenceState& state, int64_t seq, int global_layer,
                                     const AttentionStats* stats, int n_generated) const {
  LayerState s;
  s.prompt_len = state.prefill_len;
  s.n_entries = cache_.layer(seq, global_layer).n_entries;
  s.n_generated = n_generated;
  const size_t local = size_t(global_layer - cache_.layer_begin());
  if (stats && stats->rows_from[local] >= 0) {
    s.column_sums = stats->sums[local].data();
    s.sums_stride = stats->stride;
  }
  return s;
}

void StepExecutor::run_hooks(const PlannedWork& work, SequenceState& state, const AttentionStats* decode) {
  if (state.policies.empty()) return;
  const bool prefill_end = work.prefill_len > 0 && work.start_pos + int(work.tokens.size()) == work.prefill_len;
  const bool decode_step = work.prefill_len == 0;
  if (!prefill_end && !decode_step) return;
  const int n_generated = decode_step ? work.start_pos - state.prefill_len + 1 : 0;
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    CompressionPolicy& policy = *state.policies[size_t(l - cache_.layer_begin())];
    const std::optional<bool> lazy_before = policy.lazy();
    LayerState s = layer_state(state, work.seq, l, prefill_end ? state.prefill_stats.get() : decode, n_generated);
    const PooledLayerKeys keys(cache_, work.seq, l);
    s.keys = &keys;
    apply(work.seq, state, l, s.n_entries, prefill_end ? policy.on_prefill_end(s) : policy.on_decode_step(s));
    // A layer replaced by codebooks codes every new entry as it arrives (SpindleKV's decode-time update).
    if (decode_step) cache_.code_appended(work.seq, l, work.start_pos + int(work.tokens.size()) - 1);
    if (!lazy_before && policy.lazy()) {
      LayerCompressionCounters& c = counters_[size_t(l - cache_.layer_begin())];
      (*policy.lazy() ? c.lazy_decisions : c.not_lazy_decisions) += 1;
    }
  }
  if (prefill_end) {
    state.prefill_stats.reset();
    if (state.cross_layer) cross_layer_step(work.seq, state);
  }
}

// kv_cache.dtype int8 | int4: after the hooks, the full groups of every layer whose policy has taken the decisions
// that read the unquantized cache are quantized (CompressionPolicy::needs_unquantized).
void StepExecutor::seal_groups(const PlannedWork& work, const SequenceState& state) {
  if (!cache_.pool().quantized() || state.policies.empty()) return;
  const int n_generated = work.prefill_len > 0 ? 0 : work.start_pos - state.prefill_len + 1;
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    const LayerState s = layer_state(state, work.seq, l, nullptr, n_generated);
    if (!state.policies[size_t(l - cache_.layer_begin())]->needs_unquantized(s)) cache_.seal(work.seq, l);
  }
}

// PoD storage: a layer whose every local KV head follows its block's leader no longer needs the keys of the
// entries that are distant for every later query (the next one is at position n_entries: entries
// [sinks, n_entries - recent]); KvCache pairs the blocks wholly inside that range and frees half of them. Only at
// the prompt's end and after decode steps, so a chunked prefill holds every key until its end.
void StepExecutor::free_distant_keys(const PlannedWork& work, const SequenceState& state) {
  if (!state.pod) return;
  const bool prefill_end = work.prefill_len > 0 && work.start_pos + int(work.tokens.size()) == work.prefill_len;
  if (work.prefill_len > 0 && !prefill_end) return;
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    const std::vector<int>& leaders = state.pod->leader[size_t(l - cache_.layer_begin())];
    if (std::find(leaders.begin(), leaders.end(), l) != leaders.end()) continue;
    const int n_entries = cache_.layer(work.seq, l).n_entries;
    const int freed = cache_.pair_key_free_blocks(work.seq, l, state.pod->window.sinks,
                                                  n_entries - state.pod->window.recent + 1);
    counters_[size_t(l - cache_.layer_begin())].key_free_blocks += freed;
  }
}

// Design rule 4: every layer's statistic, gathered along the pipeline once per request (one number per layer),
// then handed to every local layer's policy, which may evict at once (D2O with evict_at=prefill_end).
void StepExecutor::cross_layer_step(int64_t seq, SequenceState& state) {
  std::vector<double> statistics(size_t(model_.config().n_layers), std::nan(""));
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    statistics[size_t(l)] = state.policies[size_t(l - cache_.layer_begin())]->layer_statistic();
  }
  collectives_.gather_layers(statistics, cache_.layer_begin(), cache_.layer_end());
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    LayerState s = layer_state(state, seq, l, nullptr, 0);
    const PooledLayerKeys keys(cache_, seq, l);
    s.keys = &keys;
    apply(seq, state, l, s.n_entries, state.policies[size_t(l - cache_.layer_begin())]->on_layer_statistics(s, statistics));
  }
}

// Merges first, in the numbering before the compaction, then the compaction.
void StepExecutor::apply(int64_t seq, SequenceState& state, int global_layer, int n_entries,
                         const std::optional<Selection>& keep) {
  if (!keep) return;
  const size_t local = size_t(global_layer - cache_.layer_begin());
  if (!keep->merges.empty()) {
    if (int(keep->merges.size()) != model_.n_kv_heads_local()) {
      throw std::logic_error("compression policy: merges for " + std::to_string(keep->merges.size()) +
                             " KV heads, the layer has " + std::to_string(model_.n_kv_heads_local()));
    }
    const LayerKv& kv = cache_.layer(seq, global_layer);
    int64_t merged = 0;
    for (size_t h = 0; h < keep->merges.size(); ++h) {
      cache_.pool().backend().kv_merge(kv.block_table, keep->merges[h], cache_.pool_view(), int(h));
      merged += int64_t(keep->merges[h].n_sources());
    }
    merged /= int64_t(keep->merges.size());  // per KV head, as evictions are counted
    counters_[local].merged_tokens += merged;
    state.merged_tokens[local] += merged;
  }
  cache_.retain(seq, global_layer, keep->kept);
  counters_[local].evicted_tokens += n_entries - int64_t(keep->kept[0].size());
  if (keep->codebook) {
    // Coded keys are rotated on read with the model's RoPE; the table covers the positions the model knows.
    const ModelConfig& c = model_.config();
    cache_.set_key_rope(RopeParams{c.rope_style, c.rope_theta, c.rope_scaling}, std::max(c.max_context, 4096));
    cache_.replace_with_codebook(seq, global_layer, keep->codebook->positions, keep->codebook->key_threshold,
                                 keep->codebook->value_threshold);
  }
}

std::vector<LayerCompressionCounters> StepExecutor::take_counters() {
  std::vector<LayerCompressionCounters> out(counters_.size());
  out.swap(counters_);
  return out;
}

std::vector<LayerPolicyState> StepExecutor::layer_policies(int64_t seq) const {
  std::vector<LayerPolicyState> out;
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return out;
  const SequenceState& state = it->second;
  for (size_t i = 0; i < state.policies.size(); ++i) {
    const int l = cache_.layer_begin() + int(i);
    const PolicySpec& spec = spec_for(state, l);
    out.push_back({to_string(spec), state.policies[i]->lazy(), state.policies[i]->capacity(),
                   i < state.merged_tokens.size() ? state.merged_tokens[i] : 0});
    if (const auto& cb = cache_.layer(seq, l).codebook) {
      for (const auto& k : cb->keys) out.back().codebook_keys += int64_t(k.size());
      for (const auto& v : cb->values) out.back().codebook_values += int64_t(v.size());
    }
  }
  return out;
}

}  // namespace strata
