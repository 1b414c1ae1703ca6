#include "rank/sequence_compression.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cache/pooled_layer_keys.h"
#include "cache/prefill_footprint.h"

namespace strata {

ShardCompression::ShardCompression(LlamaModel& model, KvCache& cache, CompressionConfig config,
                                   std::string model_name, PolicyCollectives& collectives)
    : model(model),
      cache(cache),
      config(std::move(config)),
      model_name(std::move(model_name)),
      collectives(collectives),
      counts(size_t(cache.n_layers())) {}

PolicyContext ShardCompression::context(int global_layer) const {
  const ModelConfig& c = model.config();
  return PolicyContext{global_layer,
                       c.n_layers,
                       model.n_heads_local(),
                       model.n_kv_heads_local(),
                       model_name,
                       &collectives,
                       cache.pool().quantized() ? kKvQuantGroup : 1,
                       RopeParams{c.rope_style, c.rope_theta, c.rope_scaling},
                       config.prefill_chunk};
}

void ShardCompression::check_fits(const PolicyTraits& traits, const std::string& policy_name) const {
  if (traits.full_precision_pool && cache.pool().quantized()) {
    throw std::invalid_argument("policy " + policy_name + ": needs kv_cache.dtype f32");
  }
  if (traits.shared_keys && !pod_blocks) {
    throw std::invalid_argument("policy " + policy_name + ": needs kv_cache.pod_blocks (made by strata calibrate)");
  }
  if (traits.reads_key_forms && !cache.pool().backend().has_kv_key_forms()) {
    throw std::invalid_argument("policy " + policy_name + ": reads the cache's keys with kv_key_forms, which the " +
                                cache.pool().backend().name() + " backend does not have yet (docs/compression.md)");
  }
  if (traits.reads_column_maxima && !cache.pool().backend().has_column_maxima()) {
    throw std::invalid_argument("policy " + policy_name + ": reads KVzip's column maxima, which the " +
                                cache.pool().backend().name() + " backend's attention does not compute yet " +
                                "(docs/compression.md)");
  }
  if (config.chunked_where_possible) return;  // auto: each sequence runs as its policies allow
  if (traits.needs_chunked_prefill && !config.chunked()) {
    throw std::invalid_argument("policy " + policy_name + ": scores each prefill chunk by its reconstruction, so it " +
                                "needs kv_cache.prefill_compression: chunked (docs/compression.md)");
  }
  if (config.chunked() && !traits.compresses_prefill_chunks) {
    throw std::invalid_argument("policy " + policy_name + ": has no chunked prefill form, and " +
                                "kv_cache.prefill_compression is chunked (docs/compression.md)");
  }
}

void ShardCompression::check_request_policy(const PolicySpec& spec) const {
  check_fits(make_policy(spec, context(cache.layer_begin()))->traits(), spec.name);
}

SequenceCompression::SequenceCompression(ShardCompression& shard, SeqId seq, std::optional<PolicySpec> request_policy)
    : shard_(shard),
      seq_(seq),
      request_policy_(std::move(request_policy)),
      config_(shard.config.for_sequence(request_policy_, shard.context(shard.cache.layer_begin()))) {}

PolicyContext SequenceCompression::context(int global_layer) const {
  PolicyContext context = shard_.context(global_layer);
  context.prefill_chunk = config_.prefill_chunk;
  return context;
}

const PolicySpec& SequenceCompression::spec_for(int global_layer) const {
  return request_policy_ ? *request_policy_ : config_.for_layer(global_layer);
}

void SequenceCompression::start_prefill(int prefill_len) {
  KvCache& cache = shard_.cache;
  prefill_len_ = prefill_len;
  policies_.clear();
  counted_.assign(size_t(cache.n_layers()), {});
  // Every rank must agree on whether the sequence takes the cross-layer step (it is a collective) and PoD runs in
  // every layer of the model or in none, so the policies of the other stages' layers are asked too; building one
  // does no work.
  cross_layer_ = false;
  int n_shared_keys = 0;
  for (int l = 0; l < shard_.model.config().n_layers; ++l) {
    std::unique_ptr<CompressionPolicy> policy = make_policy(spec_for(l), context(l));
    cross_layer_ = cross_layer_ || policy->cross_layer();
    n_shared_keys += policy->traits().shared_keys ? 1 : 0;
    if (l >= cache.layer_begin() && l < cache.layer_end()) policies_.push_back(std::move(policy));
  }
  if (n_shared_keys > 0 && n_shared_keys != shard_.model.config().n_layers) {
    throw std::invalid_argument("policy pod: runs in every layer or in none (" + std::to_string(n_shared_keys) +
                                " of " + std::to_string(shard_.model.config().n_layers) + " layers have it)");
  }
  check_fits_the_cache();
  if (config_.chunked() && sums_every_prompt_row_) {
    throw std::invalid_argument("a shared prefill keeps every prompt row's sums, which chunked prefill compresses");
  }
  pod_ = n_shared_keys > 0 ? pod_sequence() : nullptr;
  // The prefill starts after the positions already there (cached prefix blocks, a compressed prefix, strata
  // bench's synthetic context).
  const int prefill_begin = cache.contains(seq_) ? cache.layer(seq_, cache.layer_begin()).n_appended : 0;
  next_compression_ = config_.compression_point(prefill_begin, prefill_len);
  scoring_rows_ =
      prefill_scoring_rows(config_, request_policy_, context(cache.layer_begin()), prefill_len).count;
  ask_rows_again_ = false;
  prefill_stats_ = prefill_stats();
}

void SequenceCompression::forget_policies() {
  policies_.clear();
  counted_.clear();
  prefill_stats_.reset();
}

void SequenceCompression::check_fits_the_cache() const {
  KvCache& cache = shard_.cache;
  for (const auto& policy : policies_) {
    const PolicyTraits traits = policy->traits();
    shard_.check_fits(traits, std::string(policy->name()));
    if (traits.codes_entries) {
      // Coded keys are rotated on read with the model's RoPE; the table covers the positions the model knows.
      const ModelConfig& c = shard_.model.config();
      cache.set_key_rope(RopeParams{c.rope_style, c.rope_theta, c.rope_scaling}, std::max(c.max_context, 4096));
    }
  }
}

// PoD: for every local layer and local KV head, the leader of its block. Tensor parallelism splits whole KV heads
// with their query heads, so a rank needs only its own heads' blocks.
std::unique_ptr<PodSequence> SequenceCompression::pod_sequence() const {
  auto pod = std::make_unique<PodSequence>();
  const std::optional<PodWindow> window = policies_.empty() ? std::nullopt : policies_[0]->traits().shared_keys;
  if (window) pod->window = *window;
  const int head_begin = shard_.model.kv_head_begin();
  for (int l = shard_.cache.layer_begin(); l < shard_.cache.layer_end(); ++l) {
    std::vector<int> leaders;
    for (int h = 0; h < shard_.model.n_kv_heads_local(); ++h) {
      leaders.push_back(shard_.pod_blocks->leader[size_t(head_begin + h)][size_t(l)]);
    }
    pod->leader.push_back(std::move(leaders));
  }
  return pod;
}

// The prompt rows the policies ask to sum, kept across the prefill's chunks; nothing is evicted before the prompt
// ends, so entries are positions.
std::unique_ptr<AttentionStats> SequenceCompression::prefill_stats() const {
  auto stats = std::make_unique<AttentionStats>();
  bool any = false;
  for (const auto& policy : policies_) {
    LayerState start;
    start.prompt_len = prefill_len_;
    start.compression_point = next_compression_;
    start.scoring_rows = scoring_rows_;
    const PolicyNeeds needs = policy->needs(start);
    const int from = sums_every_prompt_row_ ? 0 : needs.prefill_rows_from;
    stats->rows_from.push_back(from);
    stats->maxima.push_back(needs.prefill_row_maxima);
    stats->moments_from.push_back(needs.query_moments_from);
    any = any || from >= 0 || needs.query_moments_from >= 0;
  }
  stats->moments.resize(stats->moments_from.size());
  if (!any) return nullptr;
  // The scoring rows' entries follow the chunk's, at most at the last point before the prefill's end.
  stats->stride = prefill_len_ + scoring_rows_;
  const int n_heads = shard_.model.n_heads_local();
  for (int from : stats->rows_from) {
    stats->sums.emplace_back(from >= 0 ? size_t(n_heads) * size_t(stats->stride) : 0, 0.0f);
  }
  for (size_t local = 0; local < stats->moments_from.size(); ++local) {
    if (stats->moments_from[local] >= 0) stats->moments[local].emplace(n_heads, shard_.model.config().head_dim);
  }
  return stats;
}

void SequenceCompression::start_prefilled(int prefill_len, const AttentionStats& source) {
  start_prefill(prefill_len);
  if (prefill_stats_) {
    if (source.stride != prefill_len) throw std::logic_error("shared prefill: the statistics of another prompt");
    for (size_t local = 0; local < prefill_stats_->rows_from.size(); ++local) {
      const int from = prefill_stats_->rows_from[local];
      if (from > 0) {
        throw std::invalid_argument("shared prefill: layer " + std::to_string(shard_.cache.layer_begin() + int(local)) +
                                    " sums the prompt rows from " + std::to_string(from) + ", not from the first");
      }
      if (from == 0) prefill_stats_->sums[local] = source.sums.at(local);
      if (prefill_stats_->moments[local]) {
        throw std::invalid_argument("shared prefill: layer " + std::to_string(shard_.cache.layer_begin() + int(local)) +
                                    " sums the prompt's query moments, which the shared prefill does not keep");
      }
    }
  }
  // As if the prompt's last token had just been computed.
  after_step(PlannedWork{seq_, prefill_len - 1, {0}, true, prefill_len});
}

std::unique_ptr<AttentionStats> SequenceCompression::decode_stats(const PlannedWork& work) const {
  if (policies_.empty()) return nullptr;
  const KvCache& cache = shard_.cache;
  auto stats = std::make_unique<AttentionStats>();
  bool any = false;
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    LayerState s;
    s.prompt_len = prefill_len_;
    s.n_entries = cache.layer(seq_, l).n_entries;
    s.n_generated = work.start_pos - prefill_len_ + 1;
    const bool wanted = policies_[size_t(shard_.local(l))]->needs(s).decode_probabilities;
    stats->rows_from.push_back(wanted ? work.start_pos : -1);
    stats->stride = std::max(stats->stride, s.n_entries + 1);
    any = any || wanted;
  }
  if (!any) return nullptr;
  const int n_heads = shard_.model.n_heads_local();
  for (int from : stats->rows_from) stats->sums.emplace_back(from >= 0 ? size_t(n_heads) * stats->stride : 0, 0.0f);
  return stats;
}

AttentionStats* SequenceCompression::stats_for(const PlannedWork& work) {
  if (work.prefill_len > 0) {
    check_scoring_rows(work);
    if (ask_rows_again_) restart_prefill_rows(work.start_pos);
    return prefill_stats_.get();
  }
  decode_stats_ = decode_stats(work);
  return decode_stats_.get();
}

// The leader sends the scoring rows with exactly the work that reaches a compression point before the prefill's
// end (the scheduler ends chunks there).
void SequenceCompression::check_scoring_rows(const PlannedWork& work) const {
  const int work_end = work.start_pos + int(work.tokens.size()) - work.n_scoring;
  const bool at_point = config_.chunked() && work_end >= next_compression_ && work_end < work.prefill_len;
  const int expected = at_point ? scoring_rows_ : 0;
  if (work.n_scoring != expected || (expected > 0 && work_end != next_compression_)) {
    throw std::logic_error("step plan: work for sequence " + std::to_string(seq_) + " ending at " +
                           std::to_string(work_end) + " has " + std::to_string(work.n_scoring) +
                           " scoring rows; the compression point " + std::to_string(next_compression_) + " takes " +
                           std::to_string(scoring_rows_));
  }
}

LayerState SequenceCompression::layer_state(int global_layer, const AttentionStats* stats, int n_generated) const {
  LayerState s;
  s.prompt_len = prefill_len_;
  s.compression_point = next_compression_;
  s.scoring_rows = scoring_rows_;
  s.n_entries = shard_.cache.layer(seq_, global_layer).n_entries;
  s.n_generated = n_generated;
  const size_t local = size_t(shard_.local(global_layer));
  if (stats && stats->rows_from[local] >= 0) {
    s.column_sums = stats->sums[local].data();
    s.sums_stride = stats->stride;
  }
  if (stats && local < stats->moments.size() && stats->moments[local]) s.query_moments = &*stats->moments[local];
  return s;
}

void SequenceCompression::after_step(const PlannedWork& work) {
  const StepEnd end = step_end(work);
  run_hooks(end);
  seal_groups(end);
  free_distant_keys(end);
  count_observations();
  decode_stats_.reset();
}

SequenceCompression::StepEnd SequenceCompression::step_end(const PlannedWork& work) const {
  StepEnd end;
  const int work_end = work.start_pos + int(work.tokens.size()) - work.n_scoring;
  end.work_end = work_end;
  end.n_scoring = work.n_scoring;
  end.decode = work.prefill_len == 0;
  end.prefill_end = work.prefill_len > 0 && work_end == work.prefill_len;
  // The scheduler ends chunks at the compression points; a chunk that passed one is compressed at its end.
  end.chunk_point =
      work.prefill_len > 0 && !end.prefill_end && config_.chunked() && work_end >= next_compression_;
  end.n_generated = end.decode ? work.start_pos - prefill_len_ + 1 : 0;
  return end;
}

void SequenceCompression::run_hooks(const StepEnd& end) {
  if (policies_.empty()) return;
  if (end.chunk_point) return compress_chunk(end.work_end, end.n_scoring);
  if (!end.prefill_end && !end.decode) return;
  KvCache& cache = shard_.cache;
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    CompressionPolicy& policy = *policies_[size_t(shard_.local(l))];
    LayerState s = layer_state(l, end.prefill_end ? prefill_stats_.get() : decode_stats_.get(), end.n_generated);
    const PooledLayerKeys keys(cache, seq_, l);
    s.keys = &keys;
    apply(l, s.n_entries, end.prefill_end ? policy.on_prefill_end(s) : policy.on_decode_step(s));
    // A layer replaced by codebooks codes every new entry as it arrives (SpindleKV's decode-time update).
    if (end.decode) cache.code_appended(seq_, l, end.work_end - 1);
  }
  if (end.prefill_end) {
    if (!sums_every_prompt_row_) prefill_stats_.reset();
    if (cross_layer_) cross_layer_step();
  }
}

// Chunked prefill: every local layer's policy compresses what the layer holds at the compression point; the prompt
// rows' sums follow the entries kept, so that rows a policy keeps asking for accumulate over the same entries.
// The scoring rows' entries (the layer's last n_scoring) go first, whatever the policy keeps; a policy that asks for
// none (StreamingLLM's layers beside SnapKV's) decides over the entries before them.
void SequenceCompression::compress_chunk(int point, int n_scoring) {
  KvCache& cache = shard_.cache;
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    const size_t local = size_t(shard_.local(l));
    LayerState s = layer_state(l, prefill_stats_.get(), 0);
    const int n_entries = s.n_entries;
    if (policies_[local]->prefill_scoring(prefill_len_).source == ScoringSource::none) {
      s.n_entries -= n_scoring;
      s.scoring_rows = 0;
    }
    const PooledLayerKeys keys(cache, seq_, l);
    s.keys = &keys;
    const std::optional<Selection> keep = policies_[local]->on_prefill_chunk(s);
    if (n_scoring > 0) drop_scoring_rows(local, l, n_entries, n_scoring);
    if (keep) keep_prefill_sums(local, *keep);
    apply(l, n_entries - n_scoring, keep);
  }
  next_compression_ = config_.compression_point(point, prefill_len_);
  ask_rows_again_ = true;
}

// The scoring rows' entries leave the layer, and their columns the sums (the next chunk's entries take them).
void SequenceCompression::drop_scoring_rows(size_t local, int global_layer, int n_entries, int n_scoring) {
  shard_.cache.drop_appended(seq_, global_layer, n_scoring);
  if (!prefill_stats_ || prefill_stats_->rows_from[local] < 0) return;
  const int stride = prefill_stats_->stride;
  for (int h = 0; h < shard_.model.n_heads_local(); ++h) {
    float* sums_h = prefill_stats_->sums[local].data() + int64_t(h) * stride;
    std::fill(sums_h + n_entries - n_scoring, sums_h + n_entries, 0.0f);
  }
}

// The sums of the entries kept, renumbered as KvCache::retain renumbers them (one list for every KV head, or one
// per KV head for its query heads). In place: a selection is ascending, so kept[j] >= j is read before it is
// overwritten.
void SequenceCompression::keep_prefill_sums(size_t local, const Selection& keep) {
  if (!prefill_stats_ || prefill_stats_->rows_from[local] < 0) return;
  const int stride = prefill_stats_->stride;
  const int n_heads = shard_.model.n_heads_local();
  const int group = n_heads / shard_.model.n_kv_heads_local();
  for (int h = 0; h < n_heads; ++h) {
    const std::vector<int32_t>& kept = keep.kept.size() == 1 ? keep.kept[0] : keep.kept[size_t(h / group)];
    float* sums_h = prefill_stats_->sums[local].data() + int64_t(h) * stride;
    for (size_t j = 0; j < kept.size(); ++j) sums_h[j] = sums_h[kept[j]];
    std::fill(sums_h + kept.size(), sums_h + stride, 0.0f);
  }
}

// After a chunked compression, before the next chunk's first work: each layer's policy says which prompt rows it
// wants up to the next compression point. The same rows as before keep accumulating (H2O's every row); other rows
// restart from zero, from this chunk's first row at the earliest (SnapKV's window of the new chunk).
void SequenceCompression::restart_prefill_rows(int chunk_begin) {
  ask_rows_again_ = false;
  if (!prefill_stats_) return;
  const KvCache& cache = shard_.cache;
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    const size_t local = size_t(shard_.local(l));
    LayerState s;
    s.prompt_len = prefill_len_;
    s.n_entries = cache.layer(seq_, l).n_entries;
    s.compression_point = next_compression_;
    s.scoring_rows = scoring_rows_;
    const PolicyNeeds needs = policies_[local]->needs(s);
    int from = needs.prefill_rows_from;
    int& rows_from = prefill_stats_->rows_from[local];
    // Maxima start again at every point, over the entries the policy names now.
    prefill_stats_->maxima[local] = needs.prefill_row_maxima;
    if (from == rows_from && !needs.prefill_row_maxima) continue;
    if (from >= 0) from = std::max(from, chunk_begin);
    rows_from = from;
    prefill_stats_->sums[local].assign(from >= 0 ? size_t(shard_.model.n_heads_local()) * prefill_stats_->stride : 0,
                                       0.0f);
  }
}

// Design rule 4: every layer's statistic, gathered along the pipeline once per request (one number per layer),
// then handed to every local layer's policy, which may evict at once (D2O with evict_at=prefill_end).
void SequenceCompression::cross_layer_step() {
  const KvCache& cache = shard_.cache;
  std::vector<double> statistics(size_t(shard_.model.config().n_layers), std::nan(""));
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    statistics[size_t(l)] = policies_[size_t(shard_.local(l))]->layer_statistic();
  }
  shard_.collectives.gather_layers(statistics, cache.layer_begin(), cache.layer_end());
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    LayerState s = layer_state(l, nullptr, 0);
    const PooledLayerKeys keys(cache, seq_, l);
    s.keys = &keys;
    apply(l, s.n_entries, policies_[size_t(shard_.local(l))]->on_layer_statistics(s, statistics));
  }
}

// kv_cache.dtype int8 | int4 | int2: after the hooks, the full groups of every layer whose policy has taken the
// decisions that read the unquantized cache are quantized (CompressionPolicy::needs_unquantized).
// Chunked prefill seals at every compression point: the chunked policies decide from sums and positions only.
void SequenceCompression::seal_groups(const StepEnd& end) {
  KvCache& cache = shard_.cache;
  if (!cache.pool().quantized() || policies_.empty()) return;
  const bool chunked_point = config_.chunked() && (end.chunk_point || end.prefill_end);
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    const LayerState s = layer_state(l, nullptr, end.n_generated);
    if (chunked_point || !policies_[size_t(shard_.local(l))]->needs_unquantized(s)) cache.seal(seq_, l);
  }
}

// PoD storage: a layer whose every local KV head follows its block's leader no longer needs the keys of the
// entries that are distant for every later query (the next one is at position n_entries: entries
// [sinks, n_entries - recent]); KvCache pairs the blocks wholly inside that range and frees half of them. Only at
// the prompt's end and after decode steps, so a chunked prefill holds every key until its end.
void SequenceCompression::free_distant_keys(const StepEnd& end) {
  if (!pod_ || !(end.prefill_end || end.decode)) return;
  KvCache& cache = shard_.cache;
  for (int l = cache.layer_begin(); l < cache.layer_end(); ++l) {
    const std::vector<int>& leaders = pod_->leader[size_t(shard_.local(l))];
    if (std::find(leaders.begin(), leaders.end(), l) != leaders.end()) continue;
    const int n_entries = cache.layer(seq_, l).n_entries;
    cache.pair_key_free_blocks(seq_, l, pod_->window.sinks, n_entries - pod_->window.recent + 1);
  }
}

// Merges first, in the numbering before the compaction, then the compaction, then the codebooks.
void SequenceCompression::apply(int global_layer, int n_entries, const std::optional<Selection>& keep) {
  if (!keep) return;
  KvCache& cache = shard_.cache;
  if (!keep->merges.empty()) cache.merge(seq_, global_layer, keep->merges);
  cache.retain(seq_, global_layer, keep->kept);
  shard_.counts[size_t(shard_.local(global_layer))].evicted_tokens += n_entries - int64_t(keep->kept[0].size());
  if (keep->codebook) {
    cache.replace_with_codebook(seq_, global_layer, keep->codebook->positions, keep->codebook->key_threshold,
                                keep->codebook->value_threshold);
  }
}

// After every step's hooks: what each layer's policy counted since the previous count goes to the shard's counts
// for the next report, whichever hook (prefill end, chunk, cross-layer step, decode) it came from.
void SequenceCompression::count_observations() {
  for (size_t local = 0; local < policies_.size(); ++local) {
    std::vector<Observation> now;
    policies_[local]->observe(now);
    shard_.counts[local].add_growth(counted_[local], now);
    counted_[local] = std::move(now);
  }
}

std::vector<SequenceLayerDetail> SequenceCompression::detail() const {
  std::vector<SequenceLayerDetail> out;
  for (size_t i = 0; i < policies_.size(); ++i) {
    SequenceLayerDetail d;
    d.policy = to_string(spec_for(shard_.cache.layer_begin() + int(i)));
    policies_[i]->observe(d.observations);
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace strata
