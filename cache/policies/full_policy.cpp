// `full`: every layer keeps every entry. The baseline every other policy is measured against.
#include "cache/policies/policies.h"

namespace strata {
namespace {

class FullPolicy final : public CompressionPolicy {
 public:
  std::string_view name() const override { return "full"; }
  PolicyTraits traits() const override {
    PolicyTraits t;
    t.keeps_every_entry = true;
    t.compresses_prefill_chunks = true;  // trivially: it never compresses
    return t;
  }
  PolicyNeeds needs(const LayerState&) const override { return {}; }
  std::optional<Selection> on_prefill_end(const LayerState&) override { return std::nullopt; }
  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }
  std::optional<Selection> on_prefill_chunk(const LayerState&) override { return std::nullopt; }
};

}  // namespace

std::unique_ptr<CompressionPolicy> make_full_policy(const PolicySpec& spec, const PolicyContext&) {
  ParamReader(spec).finish();  // `full` takes no parameters
  return std::make_unique<FullPolicy>();
}

}  // namespace strata
