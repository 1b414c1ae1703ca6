#pragma once
// What a layer keeps of its KV cache (design brief, section 3). One policy object serves one (sequence, layer).
// The step executor asks what statistics it needs, has the forward pass compute them, calls its hooks at the end
// of the prompt and after each decode step, and applies a returned Selection with KvCache::retain, which compacts
// the layer and returns freed blocks to the pool at once.
//
// Entries are indices into the layer's cache in arrival order; after a compaction they are renumbered 0..k-1 in
// the same order. Keys keep their original RoPE positions (design rule 5): no policy re-rotates a key.
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/layer_metric.h"
#include "cache/observation.h"
#include "cache/policy_collectives.h"
#include "cache/policy_spec.h"
#include "cache/query_moments.h"
#include "kernels/column_maxima.h"
#include "kernels/kv_merge.h"
#include "kernels/pod_attention.h"
#include "kernels/rope_params.h"

namespace strata {

// What a policy knows about where it runs. Head counts are this rank's (tensor parallelism divides them);
// budgets are functions of the global layer index and the total layer count (design rule 1).
struct PolicyContext {
  int global_layer = 0;
  int n_layers_total = 1;
  int n_heads = 1;     // query heads on this rank
  int n_kv_heads = 1;  // KV heads on this rank; query head h belongs to KV head h / (n_heads / n_kv_heads)
  std::string model_name;  // e.g. SimLayerKV's per-model threshold
  // Reductions over the other ranks that hold this layer's heads, and the per-layer gather along the pipeline
  // (cache/policy_collectives.h). Never null; a world of one uses the single-rank instance.
  PolicyCollectives* collectives = &single_rank_collectives();
  // How far past its budget a layer may grow while decoding before a policy that evicts every step cuts it back:
  // 1 (cut at every step), or one quantization group on a quantized pool. There a cut moves every later entry, and
  // each key group whose entries change is quantized again (Backend::kv_compact); cutting a whole group's worth at
  // once moves the groups after it intact, and costs one staging block's worth of entries at most.
  int decode_eviction_batch = 1;
  RopeParams rope = {};  // the model's RoPE (Expected Attention rotates its query statistics to future positions)
  int prefill_chunk = 0;  // kv_cache.prefill_chunk when kv_cache.prefill_compression is chunked; 0: end
};

// The attention statistics a policy asks the forward pass for. Both are column sums: for every query head h and
// cache entry e, the sum over the selected query rows of softmax probability p(row, e).
struct PolicyNeeds {
  // Prompt rows at positions >= this are summed, across prefill chunks, until the compression point (SnapKV's
  // observation window: point - w; H2O's accumulated attention: 0). -1: none. Chunked prefill asks again after
  // each compression: the same answer keeps summing, another restarts the sums from the next chunk's first row.
  int prefill_rows_from = -1;
  // The decode query of the coming step is summed (H2O's per-step scores, SimLayerKV's first decode step).
  bool decode_probabilities = false;
  // The queries (before RoPE) of prompt rows at positions >= this are added to the layer's QueryMoments, across
  // prefill chunks, until the prompt's end (Expected Attention: every row after the sinks). -1: none. Asked once,
  // when the prefill starts.
  int query_moments_from = -1;
  // The prefill rows asked for give KVzip's column maxima instead of sums (kernels/column_maxima.h); asked again,
  // like the rows, after each chunked compression. nullopt: sums.
  std::optional<ColumnMaxima> prefill_row_maxima;
};

// The layer's keys as a policy may see them: through questions the backend answers where the cache lives, never
// as a copy on the host (D2O's nearest-neighbour search; design brief section 3: the KV pool stays on the device).
class LayerKeys {
 public:
  virtual ~LayerKeys() = default;
  // For each entry queries[i] of KV head kv_head: the highest cosine similarity with the keys of `candidates`
  // and the index into candidates that gives it, the lower on ties (Backend::kv_nearest_keys).
  virtual void nearest(int kv_head, std::span<const int32_t> queries, std::span<const int32_t> candidates,
                       std::span<float> best_similarity, std::span<int32_t> best_candidate) const = 0;
  // For the first n = value_norms.size() entries e of KV head kv_head: m quadratic forms of its key,
  // forms[j * n + e] = linear[j] . k_e + k_e^T quadratic[j] k_e (linear [m][head_dim], quadratic
  // [m][head_dim][head_dim], row-major), and value_norms[e] = |v_e| (Backend::kv_key_forms; Expected Attention).
  virtual void key_forms(int kv_head, std::span<const float> linear, std::span<const float> quadratic,
                         std::span<float> forms, std::span<float> value_norms) const = 0;
};

// Chunked prefill's scoring rows: tokens run after a chunk that ends at a compression point before the prefill's
// end, at the positions that follow it, for their attention only (LayerState::scoring_rows). A policy asks for
// the prompt's tail (SnapKV, PyramidKV: its last `count` tokens, the queries that score the whole prompt at its
// end) or for the chunk's reconstruction (KVzip: the model asked to repeat the chunk and fed it again; the rows'
// count comes from the configuration, cache/scoring_tokens.h).
enum class ScoringSource { none, prompt_tail, chunk_reconstruction };

struct ScoringRows {
  ScoringSource source = ScoringSource::none;
  int count = 0;
};

// One (sequence, layer) at a hook.
struct LayerState {
  int prompt_len = 0;
  // The prompt position at which the coming prefill compression runs: the prompt's end (0 says so too), or with
  // kv_cache.prefill_compression chunked the end of the current chunk. An observation window ends there.
  int compression_point = 0;
  int n_entries = 0;     // entries the layer holds now (including this step's token at a decode hook)
  int n_generated = 0;   // tokens generated so far (1 at the first decode step's hook)
  // The requested column sums, [n_heads][sums_stride], valid for entries < n_entries; nullptr when none were
  // requested for this hook.
  const float* column_sums = nullptr;
  int sums_stride = 0;
  // The layer's keys, entries < n_entries (nullptr in tests that do not need them).
  const LayerKeys* keys = nullptr;
  // The prompt rows' query moments asked for (PolicyNeeds::query_moments_from) up to this hook; nullptr when none.
  const QueryMoments* query_moments = nullptr;
  // Chunked prefill: the scoring rows run after each chunk that ends at a compression point before the prefill's
  // end, at the positions that follow the chunk, for their attention only (ScoringRows,
  // CompressionPolicy::prefill_scoring). At such a point they are the layer's last scoring_rows entries, which the
  // executor drops after the hook, whatever the policy keeps. 0: none.
  int scoring_rows = 0;

  float sum(int head, int entry) const { return column_sums[int64_t(head) * sums_stride + entry]; }
  int point() const { return compression_point > 0 ? compression_point : prompt_len; }
  // Whether the coming compression is a chunk's that the prefill's last tokens score (scoring_rows).
  bool scored_by_prefill_tail() const { return scoring_rows > 0 && point() < prompt_len; }
};

// The entries a layer keeps, ascending. One list: every KV head keeps the same entries. n_kv_heads lists: each
// KV head keeps its own, all of the same length (design rule 2: a layer has one length in all its heads).
// merges (D2O): empty, or one KvMerges per KV head, applied before the compaction, so that its entries are
// indices before it: evicted entries (sources) are merged into kept ones (targets).
// codebook (SpindleKV): after the compaction, every kept entry is replaced by references into codebooks learnt
// per KV head (KvCache::replace_with_codebook): positions holds each kept entry's original position, one list (all
// heads) or one per KV head, in the order of kept. From then on the layer codes every new entry as it arrives.
struct CodebookReplacement {
  float key_threshold = 0.98f;
  float value_threshold = 0.95f;
  std::vector<std::vector<int32_t>> positions;
};

struct Selection {
  std::vector<std::vector<int32_t>> kept;
  std::vector<KvMerges> merges = {};
  std::optional<CodebookReplacement> codebook = std::nullopt;
};

// What a policy's decisions require of the cache and of the other layers, declared when it is built, so that the
// step executor checks and wires them without knowing the policy's name.
struct PolicyTraits {
  // Its decisions replace or share full-precision entries: kv_cache.dtype must be f32.
  bool full_precision_pool = false;
  // Its selections replace entries by codebook references (CodebookReplacement); coded keys are rotated on read
  // with the model's RoPE, so the pool needs its key RoPE table.
  bool codes_entries = false;
  // PoD: the layer scores distant entries with its block leader's keys (cache/pod_blocks.h) and attends to
  // `shared_keys` (sinks and recent entries) with its own. Every layer of the sequence runs such a policy or
  // none, and the blocks come from kv_cache.pod_blocks.
  std::optional<PodWindow> shared_keys;
  // It never evicts, merges or codes an entry (`full`): a sequence may keep sharing cached prefix blocks for its
  // whole life. Any other policy may rewrite the blocks, so its sequence takes copies of them (cache/prefix_reuse.h).
  bool keeps_every_entry = false;
  // It has a chunked prefill form (kv_cache.prefill_compression: chunked): on_prefill_chunk compresses what the
  // layer holds after each prefill chunk, and prefill_budget bounds what it keeps. Its decisions read attention
  // sums, positions, query moments and key forms (which read sealed groups too), never the cache's full-precision
  // entries, so a quantized pool seals groups as the prompt is prefilled.
  bool compresses_prefill_chunks = false;
  // Its decisions read KVzip's column maxima (PolicyNeeds::prefill_row_maxima), which only some backends compute
  // (Backend::has_column_maxima): refused elsewhere with an error naming the policy.
  bool reads_column_maxima = false;
  // It compresses only at chunked compression points (kv_cache.prefill_compression: chunked), scored by rows run
  // after the chunk: refused in end mode with an error naming the key.
  bool needs_chunked_prefill = false;
  // Its decisions read the keys and values through LayerKeys::key_forms (Backend::kv_key_forms), which only some
  // backends have (Backend::has_kv_key_forms): refused elsewhere with an error naming the policy.
  bool reads_key_forms = false;
};

class CompressionPolicy {
 public:
  virtual ~CompressionPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual PolicyTraits traits() const { return {}; }
  // Asked when the sequence starts (n_generated == 0) and before each decode step.
  virtual PolicyNeeds needs(const LayerState& state) const = 0;
  // The prompt is complete in the cache (state.column_sums: the prefill rows asked for).
  virtual std::optional<Selection> on_prefill_end(const LayerState& state) = 0;
  // A decode step has appended its token (state.column_sums: that step's query, when asked for).
  virtual std::optional<Selection> on_decode_step(const LayerState& state) = 0;
  // Chunked prefill (traits().compresses_prefill_chunks): the prompt is in the cache up to
  // state.compression_point, which is not its end. state.column_sums: the prefill rows asked for, summed since
  // the policy last asked for other rows (rows that stay the same accumulate across chunks, over the entries
  // kept). The default throws std::logic_error: a policy without the trait is never asked.
  virtual std::optional<Selection> on_prefill_chunk(const LayerState& state);
  // The most entries the layer keeps after a prefill compression of a prompt of prompt_len tokens (the
  // scheduler's footprint while the prompt is prefilled in chunks); nullopt when it keeps the whole prompt.
  virtual std::optional<int> prefill_budget(int /*prompt_len*/) const { return std::nullopt; }
  // Chunked prefill (asked only then): the scoring rows the policy asks for (ScoringRows). A policy that scores by
  // the last w queries of the prompt, which a chunk's compression point has not reached yet, asks for the prompt's
  // tail of w tokens, as FINCH appends the question after each chunk, so that a chunk is scored by the queries that
  // score the whole prompt at its end; KVzip for the chunk's reconstruction. None by default.
  virtual ScoringRows prefill_scoring(int /*prompt_len*/) const { return {}; }
  // A query-agnostic policy (Expected Attention), whose decision at a chunked compression point depends on the
  // tokens before it alone: the entries the layer holds right after the compression at `point` of a prefill that
  // started at position 0. The prefix cache shares such a compressed prefix between sequences whose prompts agree
  // up to the point (leader/prefix_cache.h). nullopt for every other policy.
  virtual std::optional<int> entries_after_point(int /*point*/) const { return std::nullopt; }
  // Whether a decision still to come must read this layer's cache unquantized (kv_cache.dtype int8 | int4 | int2:
  // decide on the unquantized cache, then quantize, as SimLayerKV + KIVI does). The executor seals the layer's
  // full groups only once this is false. The default holds the cache until the hooks of the first decode step
  // have run, which covers every decision taken at prefill end or at the first decode step; a policy that
  // decides every step reads the quantized cache after that. One whose later steps need full precision (e.g.
  // merging entries, which Backend::kv_merge does on full-precision blocks only) returns true for as long.
  virtual bool needs_unquantized(const LayerState& state) const { return state.n_generated < 1; }

  // The cross-layer step (D2O's allocation over all layers; design rule 4). A policy that takes part publishes
  // one number per layer after on_prefill_end (layer_statistic); once every layer of the sequence has, on every
  // stage, the executor gathers them (PolicyCollectives::gather_layers) and hands all of them to every layer's
  // policy (on_layer_statistics), before its first decode hook. The executor runs the step for a sequence when
  // the policy of any layer of the model, on any stage, takes part, so that every rank joins the gather.
  virtual bool cross_layer() const { return false; }
  // This layer's statistic, valid after on_prefill_end; NaN for none.
  virtual double layer_statistic() const { return std::nan(""); }
  // Every layer's statistic, [n_layers_total] by global layer, NaN where a layer published none. `state` as at
  // prefill end (no column sums). May return a selection (D2O evicting at prefill end).
  virtual std::optional<Selection> on_layer_statistics(const LayerState&, std::span<const double>) {
    return std::nullopt;
  }

  // What the policy reports about its (sequence, layer), appended to `out` as named values (cache/observation.h):
  // its decisions (SimLayerKV's verdict), bounds (D2O's capacity) and counts since it was built (D2O's merges).
  // /v1/kv_state shows them beside what the layer holds; the rank adds the growth of the counts and each verdict
  // to the layer's counters on /metrics, under the series the policy's factory row declares. None by default.
  virtual void observe(std::vector<Observation>& /*out*/) const {}
};

// The policies make_policy knows.
std::vector<std::string> policy_names();
// Checks a spec's name and parameters without building a policy. Throws PolicyError.
void validate_policy(const PolicySpec& spec);
// Throws PolicyError naming the policy or the parameter.
std::unique_ptr<CompressionPolicy> make_policy(const PolicySpec& spec, const PolicyContext& context);
// The per-layer series on /metrics that every policy and the cache's storage of their decisions declare.
std::vector<LayerMetric> layer_metrics();

}  // namespace strata
