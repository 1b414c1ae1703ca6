#pragma once
// The observation-window family (spec pyramidkv.md section 2): at the end of the prompt each KV head keeps the k
// prompt entries that the last w prompt queries attend to most, after pooling, plus the w window entries; nothing
// is evicted while decoding (spec 1.2). SnapKV and PyramidKV differ only in k per layer, given as a rule.
//
// Chunked prefill (kv_cache.prefill_compression chunked) runs the same selection after every prefill chunk, with
// k from the whole prompt's length: the layer keeps k + w entries (the chunk's last w as its window) and grows by
// one chunk before the next selection. The observation window that scores a chunk is the prompt's own last w
// tokens, run after the chunk for their attention only (LayerState::scoring_rows): FINCH's prompt-guided chunked
// selection (Corallo & Papotti, TACL 2024: each chunk is scored by the attention of the question appended after
// it), with the prompt's end standing for the question. The chunk's own last queries, as InfiniPot's continual
// context distillation scores without its catalyst prompt (Kim et al., EMNLP 2024), cannot see a question that
// comes after them (docs/eval/chunked). A window longer than a chunk is summed from the chunk's rows only
// (docs/compression.md).
#include <functional>
#include <optional>
#include <string>

#include "cache/compression_policy.h"
#include "cache/policies/selection.h"

namespace strata {

// The parameters both read: budget (C, window included), window, kernel (odd), pool, agg.
struct WindowParams {
  Budget budget;
  int window = 8;
  WindowScoring scoring;
};

// Reads them with the given defaults; PolicyError for an even kernel or a token budget not above the window.
WindowParams read_window_params(ParamReader& reader, const std::string& policy, int default_window,
                                int default_kernel, const std::string& default_pool);

class ObservationWindowPolicy final : public CompressionPolicy {
 public:
  // k for a prompt of prompt_len tokens, or nullopt when the layer keeps the whole prompt.
  using KeepRule = std::function<std::optional<int>(int prompt_len)>;

  ObservationWindowPolicy(std::string name, int window, WindowScoring scoring, KeepRule keep,
                          const PolicyContext& context);

  std::string_view name() const override { return name_; }
  PolicyNeeds needs(const LayerState& state) const override;
  std::optional<Selection> on_prefill_end(const LayerState& state) override;
  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }
  PolicyTraits traits() const override {
    PolicyTraits t;
    t.compresses_prefill_chunks = true;
    return t;
  }
  // Chunked prefill: the same selection, scored by the prompt's last w queries run after the chunk.
  std::optional<Selection> on_prefill_chunk(const LayerState& state) override;
  std::optional<int> prefill_budget(int prompt_len) const override;
  ScoringRows prefill_scoring(int prompt_len) const override;

 private:
  std::string name_;
  int window_;
  WindowScoring scoring_;
  KeepRule keep_;
  PolicyContext context_;
};

}  // namespace strata
