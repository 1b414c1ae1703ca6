#include "rank/offline_executor.h"

#include <stdexcept>
#include <string>

#include "cache/prefill_footprint.h"
#include "cache/scoring_tokens.h"

namespace strata {

void OfflineExecutor::start_prefill_with_entries(SeqId seq, int prefill_len) {
  executor_.state_of(seq).compression.start_prefill(prefill_len);
}

void OfflineExecutor::share_prefill(SeqId source) { executor_.state_of(source).compression.sum_every_prompt_row(); }

void OfflineExecutor::fork_prefix(SeqId source, SeqId seq, int n_entries, int prefill_len) {
  StepExecutor::SequenceState& state = executor_.state_of(seq);
  executor_.cache_.fork(source, seq, n_entries);
  state.compression.start_prefill(prefill_len);
}

void OfflineExecutor::fork_prefilled(SeqId source, SeqId seq) {
  const AttentionStats* sums = executor_.state_of(source).compression.prompt_statistics();
  if (!sums) throw std::logic_error("shared prefill: sequence " + std::to_string(source) + " kept no statistics");
  StepExecutor::SequenceState& state = executor_.state_of(seq);
  executor_.cache_.fork(source, seq, sums->stride);
  state.compression.start_prefilled(sums->stride, *sums);
}

bool OfflineExecutor::prefills_in_chunks(const std::optional<PolicySpec>& policy) const {
  const ShardCompression& shard = executor_.shard_;
  return shard.config.for_sequence(policy, shard.context(shard.cache.layer_begin())).chunked();
}

ScoringRows OfflineExecutor::scoring_rows(const std::optional<PolicySpec>& policy, int prefill_len) const {
  const ShardCompression& shard = executor_.shard_;
  return prefill_scoring_rows(shard.config, policy, shard.context(shard.cache.layer_begin()), prefill_len);
}

std::vector<int32_t> OfflineExecutor::scoring_tokens(const ScoringRows& rows, std::span<const int32_t> prefill,
                                                     int point) const {
  return strata::scoring_tokens(rows, executor_.shard_.config, prefill, point);
}

}  // namespace strata
