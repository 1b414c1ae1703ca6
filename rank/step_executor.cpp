#include "rank/step_executor.h"

#include <span>
#include <stdexcept>
#include <string>

namespace strata {

StepExecutor::StepExecutor(LlamaModel& model, KvCache& cache, CompressionConfig compression, std::string model_name,
                           PolicyCollectives* collectives)
    : model_(model),
      cache_(cache),
      shard_(model, cache, std::move(compression), std::move(model_name),
             collectives ? *collectives : single_rank_collectives()) {}

StepResult StepExecutor::execute(const StepPlan& plan) {
  update_sequences(plan);
  std::vector<BatchSequence> batch = batch_of(plan);
  // Every sampling is taken before the forward pass points at it (next() reuses its sampler's penalty buffer).
  sampling_.resize(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].logits != LogitsMode::sample) continue;
    sampling_[i] = state_of(batch[i].seq).sampler.next(plan.work[i].allowed);
    batch[i].sampling = &sampling_[i];
  }
  if (batch.empty()) return StepResult{plan.step, {}};
  model_.forward(batch, cache_, logits_, samples_);
  // Published as written: the hooks below may compact or seal them (the cache then copies or keeps the original).
  for (const PrefixPublish& p : plan.prefix_published) {
    if (!p.compressed) cache_.publish(p.seq, p.index, p.hash);
  }
  StepResult result = collect_tokens(plan, batch);
  for (const PlannedWork& w : plan.work) state_of(w.seq).compression.after_step(w);
  // A compressed prefix is what the hooks left.
  for (const PrefixPublish& p : plan.prefix_published) {
    if (p.compressed) cache_.publish_compressed(p.seq, p.index, p.hash);
  }
  return result;
}

// A preempted sequence keeps its sampling state: when it is recomputed it must draw what it would have drawn. Its
// policies start again with the recompute's prefill.
void StepExecutor::update_sequences(const StepPlan& plan) {
  cache_.evict(plan.prefix_evicted);
  for (const PlannedSequence& a : plan.added) {
    seqs_.erase(a.seq);
    seqs_.emplace(a.seq, SequenceState{SequenceSampler(a.sampling, a.seed),
                                       SequenceCompression(shard_, a.seq, a.kv_policy)});
  }
  for (SeqId seq : plan.preempted) {
    cache_.release(seq);
    if (auto it = seqs_.find(seq); it != seqs_.end()) it->second.compression.forget_policies();
  }
  for (SeqId seq : plan.finished) {
    cache_.release(seq);
    seqs_.erase(seq);
  }
  // A prefill that starts after cached blocks starts its policies here: its first chunk is not at position 0.
  for (const PrefixStart& s : plan.prefix_started) {
    SequenceState& state = state_of(s.seq);
    cache_.start_from_prefix(s.seq, s.blocks, s.copy, s.position);
    state.compression.start_prefill(s.prefill_len);
  }
}

std::vector<BatchSequence> StepExecutor::batch_of(const StepPlan& plan) {
  std::vector<BatchSequence> batch;
  batch.reserve(plan.work.size());
  for (const PlannedWork& w : plan.work) {
    if (!w.sample && !w.allowed.empty()) {
      throw std::logic_error("step plan: work for sequence " + std::to_string(w.seq) +
                             " has a mask but samples nothing");
    }
    SequenceCompression& compression = state_of(w.seq).compression;
    if (w.prefill_len > 0 && w.start_pos == 0) compression.start_prefill(w.prefill_len);
    // Only the last pipeline stage has logits to sample, and only it draws from the sequences' RNGs.
    const bool samples = w.sample && model_.has_output();
    const LogitsMode logits = !samples ? LogitsMode::none : keep_logits_ ? LogitsMode::last : LogitsMode::sample;
    batch.push_back(BatchSequence{w.seq, w.tokens, w.start_pos, logits, compression.stats_for(w), compression.pod()});
  }
  return batch;
}

StepResult StepExecutor::collect_tokens(const StepPlan& plan, const std::vector<BatchSequence>& batch) {
  StepResult result{plan.step, {}};
  const int64_t vocab = model_.config().vocab_size;
  int64_t row = 0, sampled = 0;
  for (size_t i = 0; i < batch.size(); ++i) {  // batch[i] is plan.work[i]'s
    const BatchSequence& b = batch[i];
    if (b.logits == LogitsMode::none) continue;
    SequenceSampler& sampler = state_of(b.seq).sampler;
    RowSample s = b.logits == LogitsMode::sample
                      ? std::move(samples_[size_t(sampled++)])
                      : sampler.sample(std::span<float>(logits_.data() + row++ * vocab, size_t(vocab)),
                                       plan.work[i].allowed);
    sampler.accept(s.id);
    result.sampled.push_back(SampledToken{b.seq, std::move(s)});
  }
  return result;
}

StepExecutor::SequenceState& StepExecutor::state_of(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw std::logic_error("step plan: work for unknown sequence " + std::to_string(seq));
  return it->second;
}

std::vector<LayerCompressionCounts> StepExecutor::take_counts() {
  std::vector<LayerCompressionCounts> out(shard_.counts.size());
  out.swap(shard_.counts);
  return out;
}

std::vector<SequenceLayerDetail> StepExecutor::policy_detail(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? std::vector<SequenceLayerDetail>{} : it->second.compression.detail();
}

}  // namespace strata
