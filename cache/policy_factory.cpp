// Policy names to constructors and the per-layer metrics their observations feed. Adding a policy: its file in
// cache/policies/, its constructor (and its metrics, if it declares any) in policies.h, a row here.
#include <functional>
#include <map>
#include <span>
#include <stdexcept>
#include <string>

#include "cache/compression_policy.h"
#include "cache/policies/policies.h"
#include "cache/storage_observations.h"

namespace strata {
namespace {

using Constructor = std::function<std::unique_ptr<CompressionPolicy>(const PolicySpec&, const PolicyContext&)>;

struct PolicyRow {
  Constructor make;
  std::span<const LayerMetric> metrics = {};  // the per-layer series its observations feed
};

const std::map<std::string, PolicyRow>& policies() {
  static const std::map<std::string, PolicyRow> table = {
      {"full", {make_full_policy}},
      {"streaming", {make_streaming_policy}},
      {"h2o", {make_h2o_policy}},
      {"snapkv", {make_snapkv_policy}},
      {"pyramidkv", {make_pyramidkv_policy}},
      {"simlayerkv", {make_simlayerkv_policy, simlayerkv_metrics()}},
      {"d2o", {make_d2o_policy, d2o_metrics()}},
      {"spindlekv", {make_spindlekv_policy}},
      {"pod", {make_pod_policy}},
      {"expected_attention", {make_expected_attention_policy}},
      {"kvzip", {make_kvzip_policy}},
  };
  return table;
}

}  // namespace

std::optional<Selection> CompressionPolicy::on_prefill_chunk(const LayerState&) {
  throw std::logic_error(std::string(name()) + ": has no chunked prefill form");
}

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& [name, _] : policies()) names.push_back(name);
  return names;
}

std::unique_ptr<CompressionPolicy> make_policy(const PolicySpec& spec, const PolicyContext& context) {
  auto it = policies().find(spec.name);
  if (it == policies().end()) {
    std::string known;
    for (const std::string& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
    throw PolicyError("policy", "unknown KV compression policy '" + spec.name + "' (known: " + known + ")");
  }
  return it->second.make(spec, context);
}

void validate_policy(const PolicySpec& spec) {
  // Constructing one reads and checks every parameter; policies do no work until their hooks run.
  make_policy(spec, PolicyContext{});
}

std::vector<LayerMetric> layer_metrics() {
  const std::span<const LayerMetric> storage = storage_metrics();
  std::vector<LayerMetric> metrics(storage.begin(), storage.end());
  for (const auto& [_, row] : policies()) metrics.insert(metrics.end(), row.metrics.begin(), row.metrics.end());
  return metrics;
}

}  // namespace strata
