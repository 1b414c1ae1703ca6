#include "rank/rank_reporter.h"

#include <vector>

namespace strata {

RankReport kv_report(const KvCache& cache, std::span<const SeqId> seqs) {
  RankReport r;
  const BlockPool& pool = cache.pool();
  r.layer_begin = cache.layer_begin();
  r.block_size = cache.block_size();
  r.block_bytes = pool.layout().block_bytes();
  r.blocks_free = pool.n_free();
  r.blocks_total = pool.n_total();
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    const LayerUsage u = cache.layer_usage(l);
    r.layers.push_back(LayerReport{u.entries, u.blocks, u.bytes, u.uncompressed_bytes, 0, 0, 0, 0, u.codebook_vectors,
                                   u.shared_key_entries});
  }
  for (SeqId seq : seqs) {
    if (!cache.contains(seq)) continue;
    SequenceReport s;
    s.seq = seq;
    s.blocks_held = cache.blocks_held(seq);
    for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
      const LayerKv& kv = cache.layer(seq, l);
      s.entries.push_back(kv.n_entries);
      s.appended.push_back(kv.n_appended);
      s.blocks.push_back(int32_t(kv.block_table.size()));
      s.lazy.push_back(-1);
      s.capacity.push_back(-1);
      s.merged.push_back(0);
      s.codebook_keys.push_back(0);
      s.codebook_values.push_back(0);
      s.shared_keys.push_back(cache.sequence_usage(seq, l).shared_key_entries);
    }
    r.sequences.push_back(std::move(s));
  }
  return r;
}

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
