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
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) r.layers.push_back({cache.layer_usage(l), {}});
  for (SeqId seq : seqs) {
    if (!cache.contains(seq)) continue;
    SequenceKv s{seq, {}, {}, cache.blocks_held(seq)};
    for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
      const LayerKv& kv = cache.layer(seq, l);
      s.entries.push_back(kv.n_entries);
      s.blocks.push_back(int32_t(kv.block_table.size()));
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

RankReport RankReporter::report(const StepPlan& plan, StepResult result) {
  const std::vector<SeqId> seqs(seqs_.begin(), seqs_.end());
  RankReport r = kv_report(cache_, seqs);
  r.step = plan.step;
  r.world_rank = grid_.rank;
  r.pp_stage = grid_.stage();
  r.tp_rank = grid_.tp_rank();
  const std::vector<LayerCompressionCounters> counters = executor_.take_counters();
  for (size_t l = 0; l < counters.size() && l < r.layers.size(); ++l) r.layers[l].counters = counters[l];
  // The stage's other tensor ranks hold the same sequence lengths: one of them describes the sequences.
  if (grid_.tp_rank() != 0) {
    r.sequences.clear();
  } else if (plan.report_detail) {
    for (const SequenceKv& s : r.sequences) r.details.push_back(detail(s.seq));
  }
  // The first tensor rank of the last stage speaks for the world's sampling (its TP peers draw the same tokens).
  if (grid_.is_last_stage() && grid_.tp_rank() == 0) r.result = std::move(result);
  return r;
}

// The policies' decisions (none before the sequence's prefill starts) beside what the cache holds for them.
SequenceDetail RankReporter::detail(SeqId seq) const {
  SequenceDetail d{seq, executor_.policy_detail(seq)};
  d.layers.resize(size_t(cache_.n_layers()));
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    SequenceLayerDetail& layer = d.layers[size_t(l - cache_.layer_begin())];
    const LayerKv& kv = cache_.layer(seq, l);
    layer.appended = kv.n_appended;
    if (kv.codebook) {
      for (const auto& k : kv.codebook->keys) layer.codebook_keys += int64_t(k.size());
      for (const auto& v : kv.codebook->values) layer.codebook_values += int64_t(v.size());
    }
    layer.shared_keys = cache_.sequence_usage(seq, l).shared_key_entries;
  }
  return d;
}

}  // namespace strata
