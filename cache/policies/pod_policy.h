#pragma once
// `pod` (../shared/specs/pod.md; docs/compression.md "PoD"): proximal tokens (the first `sinks` and the last
// `recent`) get the layer's own attention; distant tokens are scored with the logits of the layer's block leader
// (cache/pod_blocks.h, from `strata calibrate`) over the layer's own values, merged by the gate. The policy declares
// the window (PolicyTraits::shared_keys); the step executor hands the blocks to the forward pass and frees the
// followers' distant keys.
// It evicts nothing.
#include "cache/compression_policy.h"
#include "kernels/pod_attention.h"

namespace strata {

class PodPolicy final : public CompressionPolicy {
 public:
  explicit PodPolicy(PodWindow window) : window_(window) {}
  std::string_view name() const override { return "pod"; }
  PolicyTraits traits() const override { return {.full_precision_pool = true, .codes_entries = false, .shared_keys = window_, .keeps_every_entry = false}; }
  PolicyNeeds needs(const LayerState&) const override { return {}; }
  std::optional<Selection> on_prefill_end(const LayerState&) override { return std::nullopt; }
  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }

 private:
  PodWindow window_;
};

}  // namespace strata
