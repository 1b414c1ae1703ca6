#include "daemon/rank_reporter.h"

#include <vector>

#include "daemon/pipeline_kv.h"

namespace strata {

RankReporter::RankReporter(const RankGrid& grid, const KvCache& cache, StepExecutor& executor)
    : grid_(grid), cache_(cache), executor_(executor) {}

void RankReporter::track(const StepPlan& plan) {
  for (int64_t seq : plan.finished) seqs_.erase(seq);
  for (const PlannedWork& w : plan.work) seqs_.insert(w.seq);
}

RankReport RankReporter::report(uint64_t step, StepResult result) {
  const std::vector<SeqId> seqs(seqs_.begin(), seqs_.end());
  RankReport r = kv_report(cache_, seqs);
  r.step = step;
  r.world_rank = grid_.rank;
  r.pp_stage = grid_.stage();
  r.tp_rank = grid_.tp_rank();
  const std::vector<LayerCompressionCounters> counters = executor_.take_counters();
  for (size_t l = 0; l < counters.size() && l < r.layers.size(); ++l) {
    r.layers[l].evicted_tokens = counters[l].evicted_tokens;
    r.layers[l].lazy_decisions = counters[l].lazy_decisions;
    r.layers[l].not_lazy_decisions = counters[l].not_lazy_decisions;
    r.layers[l].merged_tokens = counters[l].merged_tokens;
  }
  // The stage's other tensor ranks hold the same sequence lengths: one of them describes the sequences.
  if (grid_.tp_rank() != 0) r.sequences.clear();
  for (SequenceReport& s : r.sequences) {
    const std::vector<LayerPolicyState> policies = executor_.layer_policies(s.seq);
    if (policies.size() != s.entries.size()) continue;  // no policies before the sequence's prefill starts
    for (size_t l = 0; l < policies.size(); ++l) {
      const LayerPolicyState& p = policies[l];
      if (p.lazy) s.lazy[l] = *p.lazy ? 1 : 0;
      if (p.capacity) s.capacity[l] = *p.capacity;
      s.merged[l] = p.merged_tokens;
      s.codebook_keys[l] = p.codebook_keys;
      s.codebook_values[l] = p.codebook_values;
      s.policy.push_back(p.policy);
    }
  }
  // The first tensor rank of the last stage speaks for the world's sampling (its TP peers draw the same tokens).
  if (grid_.is_last_stage() && grid_.tp_rank() == 0) r.result = std::move(result);
  return r;
}

}  // namespace strata
