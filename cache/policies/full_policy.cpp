// `full`: every layer keeps every entry. The baseline every other policy is measured against.
#include <stdexcept>

#include "cache/compression_policy.h"

namespace strata {
namespace {

class FullPolicy final : public CompressionPolicy {
 public:
  std::string_view name() const override { return "full"; }
  PolicyNeeds needs() const override { return {}; }
  std::optional<Selection> on_prefill_end(const LayerState&) override { return std::nullopt; }
  std::optional<Selection> on_decode_step(const LayerState&) override { return std::nullopt; }
};

}  // namespace

std::vector<std::string> policy_names() { return {"full"}; }

std::unique_ptr<CompressionPolicy> make_policy(std::string_view name) {
  if (name == "full") return std::make_unique<FullPolicy>();
  throw std::invalid_argument("unknown KV compression policy '" + std::string(name) + "' (known: full)");
}

}  // namespace strata
