#pragma once
// The observation-window family (spec pyramidkv.md section 2): at the end of the prompt each KV head keeps the k
// prompt entries that the last w prompt queries attend to most, after pooling, plus the w window entries; nothing
// is evicted while decoding (spec 1.2). SnapKV and PyramidKV differ only in k per layer, given as a rule.
//
// Chunked prefill (kv_cache.prefill_compression chunked) runs the same selection after every prefill chunk, with
// the chunk's last w queries as the observation window and k from the whole prompt's length: the layer keeps k + w
// entries and grows by one chunk before the next selection. This is InfiniPot's continual context distillation
// (Kim et al., EMNLP 2024: compress each time a chunk fills the cache, scoring by the attention of queries at the
// chunk's end) without its catalyst prompt, whose added question tokens we do not append. A window longer than a
// chunk is summed from the chunk's rows only (docs/compression.md).
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
  // Chunked prefill: the same selection with the chunk's last w queries as the observation window.
  std::optional<Selection> on_prefill_chunk(const LayerState& state) override;
  std::optional<int> prefill_budget(int prompt_len) const override;

 private:
  std::string name_;
  int window_;
  WindowScoring scoring_;
  KeepRule keep_;
  PolicyContext context_;
};

}  // namespace strata
