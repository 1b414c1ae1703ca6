#include "daemon/step_executor.h"

#include <span>
#include <stdexcept>
#include <string>

namespace strata {

StepExecutor::StepExecutor(LlamaModel& model, KvCache& cache) : model_(model), cache_(cache) {}

StepResult StepExecutor::execute(const StepPlan& plan) {
  for (const PlannedSequence& a : plan.added) {
    SequenceState state{SequenceSampler(a.sampling, a.seed), a.prompt_len, {}};
    for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
      state.policies.push_back(make_policy(a.kv_policy.empty() ? "full" : a.kv_policy));
    }
    seqs_.insert_or_assign(a.seq, std::move(state));
  }
  // A preempted sequence keeps its sampling state: when it is recomputed it must draw what it would have drawn.
  for (int64_t seq : plan.preempted) cache_.release(seq);
  for (int64_t seq : plan.finished) {
    cache_.release(seq);
    seqs_.erase(seq);
  }

  std::vector<BatchSequence> batch;
  batch.reserve(plan.work.size());
  for (const PlannedWork& w : plan.work) {
    if (!seqs_.count(w.seq)) throw std::logic_error("step plan: work for unknown sequence " + std::to_string(w.seq));
    batch.push_back(BatchSequence{w.seq, w.tokens, w.start_pos, w.sample ? LogitsMode::last : LogitsMode::none});
  }

  StepResult result;
  result.step = plan.step;
  if (batch.empty()) return result;
  model_.forward(batch, cache_, logits_);

  const int64_t vocab = model_.config().vocab_size;
  int64_t row = 0;
  for (const PlannedWork& w : plan.work) {
    SequenceState& state = seqs_.at(w.seq);
    if (w.sample) {
      const SampleResult s = state.sampler.sample(std::span<float>(logits_.data() + row * vocab, size_t(vocab)));
      state.sampler.accept(s.id);
      SampledToken t{w.seq, s.id, s.logprob, {}, {}};
      for (const TokenLogprob& top : s.top) {
        t.top_ids.push_back(top.id);
        t.top_logprobs.push_back(top.logprob);
      }
      result.sampled.push_back(std::move(t));
      ++row;
    }
    run_policy_hooks(w, state);
  }
  return result;
}

void StepExecutor::run_policy_hooks(const PlannedWork& work, SequenceState& state) {
  const bool decode_step = !work.prefill_end && work.tokens.size() == 1 && work.start_pos >= state.prompt_len;
  if (!work.prefill_end && !decode_step) return;
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    CompressionPolicy& policy = *state.policies[size_t(l - cache_.layer_begin())];
    const LayerState layer{l, model_.config().n_layers, state.prompt_len, cache_.layer(work.seq, l).n_entries};
    const std::optional<Selection> keep =
        work.prefill_end ? policy.on_prefill_end(layer) : policy.on_decode_step(layer);
    if (keep) cache_.retain(work.seq, l, keep->kept);
  }
}

}  // namespace strata
