#pragma once
// The observation-window family (spec pyramidkv.md section 2): at the end of the prompt each KV head keeps the k
// prompt entries that the last w prompt queries attend to most, after pooling, plus the w window entries; nothing
// is evicted while decoding (spec 1.2). SnapKV and PyramidKV differ only in k per layer, given as a rule.
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

 private:
  std::string name_;
  int window_;
  WindowScoring scoring_;
  KeepRule keep_;
  PolicyContext context_;
};

}  // namespace strata
