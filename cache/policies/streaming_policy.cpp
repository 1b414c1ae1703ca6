// `streaming`: the first `sinks` tokens (attention sinks) plus the most recent ones, C in all (StreamingLLM; spec
// pyramidkv.md section 3.1). No attention statistics.
//
// With kv_cache.prefill_compression chunked the cut also runs after every prefill chunk.
//
// Parameters:
//   budget  C, sinks included (default 128); a token count or a fraction of the prompt.
//   sinks   default 4, as PyramidKV's LongBench runner (w = C - 4 there, spec 3.1).
//   mode    one_shot (default): the PyramidKV baseline, truncate once at the end of the prompt and append
//             without eviction afterwards (spec 1.2, 3.1).
//           rolling: the StreamingLLM paper, the same cut again after every decode step, so that the cache stays
//             at C. Keys keep their original positions in both modes (design rule 5; spec 1.3 notes that the
//             PyramidKV baseline also ran without StreamingLLM's position rolling).
#include <algorithm>

#include "cache/policies/policies.h"

namespace strata {
namespace {

class StreamingPolicy final : public CompressionPolicy {
 public:
  StreamingPolicy(Budget budget, int sinks, bool rolling, int decode_eviction_batch)
      : budget_(budget), sinks_(sinks), rolling_(rolling), decode_eviction_batch_(decode_eviction_batch) {}

  std::string_view name() const override { return "streaming"; }
  PolicyTraits traits() const override {
    PolicyTraits t;
    t.compresses_prefill_chunks = true;
    return t;
  }
  PolicyNeeds needs(const LayerState&) const override { return {}; }

  std::optional<Selection> on_prefill_end(const LayerState& state) override { return cut(state, 1); }
  // Chunked prefill: the same cut after every chunk is StreamingLLM's own streaming form (the paper's cache
  // never holds more than the sinks and the recent window while the input streams in).
  std::optional<Selection> on_prefill_chunk(const LayerState& state) override { return cut(state, 1); }
  std::optional<int> prefill_budget(int prompt_len) const override {
    return sinks_ + std::max(0, budget_.resolve(prompt_len) - sinks_);
  }

  std::optional<Selection> on_decode_step(const LayerState& state) override {
    if (!rolling_) return std::nullopt;
    return cut(state, decode_eviction_batch_);
  }

 private:
  // Keeps [0, sinks) and the last C - sinks entries when the layer holds at least C + batch entries. A fraction
  // budget resolves against the prompt; one that falls below the sinks keeps the sinks alone (spec 9.2 leaves the
  // choice open: the sinks are the policy's fixed part, like a window).
  std::optional<Selection> cut(const LayerState& state, int batch) const {
    const int recent = std::max(0, budget_.resolve(state.prompt_len) - sinks_);
    const int n = state.n_entries;
    if (n < sinks_ + recent + batch) return std::nullopt;
    std::vector<int32_t> kept;
    kept.reserve(sinks_ + recent);
    for (int j = 0; j < sinks_; ++j) kept.push_back(j);
    for (int j = n - recent; j < n; ++j) kept.push_back(j);
    return Selection{{std::move(kept)}};
  }

  Budget budget_;
  int sinks_;
  bool rolling_;
  int decode_eviction_batch_;  // PolicyContext::decode_eviction_batch
};

}  // namespace

std::unique_ptr<CompressionPolicy> make_streaming_policy(const PolicySpec& spec, const PolicyContext& context) {
  ParamReader reader(spec);
  const Budget budget = reader.get_budget("budget", Budget{128});
  const int sinks = reader.get_int("sinks", 4, 0, 1 << 20);
  const bool rolling = reader.get_choice("mode", "one_shot", {"one_shot", "rolling"}) == "rolling";
  reader.finish();
  if (budget.fraction == 0.0 && budget.tokens <= sinks) {
    throw PolicyError("budget", spec.name + ": budget: must exceed sinks (" + std::to_string(sinks) + "), got " +
                                    std::to_string(budget.tokens));
  }
  return std::make_unique<StreamingPolicy>(budget, sinks, rolling, context.decode_eviction_batch);
}

}  // namespace strata
