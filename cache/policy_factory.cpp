// Policy names to constructors. Adding a policy: its file in cache/policies/, its constructor in policies.h, a
// row here.
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "cache/compression_policy.h"
#include "cache/policies/policies.h"

namespace strata {
namespace {

using Constructor = std::function<std::unique_ptr<CompressionPolicy>(const PolicySpec&, const PolicyContext&)>;

const std::map<std::string, Constructor>& constructors() {
  static const std::map<std::string, Constructor> table = {
      {"full", make_full_policy},           {"streaming", make_streaming_policy}, {"h2o", make_h2o_policy},
      {"snapkv", make_snapkv_policy},       {"pyramidkv", make_pyramidkv_policy},
      {"simlayerkv", make_simlayerkv_policy}, {"d2o", make_d2o_policy},
      {"spindlekv", make_spindlekv_policy}, {"pod", make_pod_policy},
  };
  return table;
}

}  // namespace

std::optional<Selection> CompressionPolicy::on_prefill_chunk(const LayerState&) {
  throw std::logic_error(std::string(name()) + ": has no chunked prefill form");
}

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& [name, _] : constructors()) names.push_back(name);
  return names;
}

std::unique_ptr<CompressionPolicy> make_policy(const PolicySpec& spec, const PolicyContext& context) {
  auto it = constructors().find(spec.name);
  if (it == constructors().end()) {
    std::string known;
    for (const std::string& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
    throw PolicyError("policy", "unknown KV compression policy '" + spec.name + "' (known: " + known + ")");
  }
  return it->second(spec, context);
}

void validate_policy(const PolicySpec& spec) {
  // Constructing one reads and checks every parameter; policies do no work until their hooks run.
  make_policy(spec, PolicyContext{});
}

}  // namespace strata
