#include "rank/rank_reporter.h"

#include <vector>

#include "cache/storage_observations.h"

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
    LayerReport layer;
    layer.usage = cache.layer_usage(l);
    observe_layer_storage(layer.usage, layer.observations);
    r.layers.push_back(std::move(layer));
  }
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
  const std::vector<LayerCompressionCounts> counts = executor_.take_counts();
  for (size_t l = 0; l < counts.size() && l < r.layers.size(); ++l) {
    r.layers[l].evicted_tokens = counts[l].evicted_tokens;
    const std::vector<Observation> observed = counts[l].observations();
    r.layers[l].observations.insert(r.layers[l].observations.end(), observed.begin(), observed.end());
  }
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

// What the policies report (nothing before the sequence's prefill starts) beside what the cache holds for them.
SequenceDetail RankReporter::detail(SeqId seq) const {
  SequenceDetail d{seq, executor_.policy_detail(seq)};
  d.layers.resize(size_t(cache_.n_layers()));
  for (int l = cache_.layer_begin(); l < cache_.layer_end(); ++l) {
    SequenceLayerDetail& layer = d.layers[size_t(l - cache_.layer_begin())];
    layer.appended = cache_.layer(seq, l).n_appended;
    observe_sequence_storage(cache_, seq, l, layer.observations);
  }
  return d;
}

}  // namespace strata
