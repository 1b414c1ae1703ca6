#include "cache/policies/pod_policy.h"

#include "cache/policies/policies.h"

namespace strata {

// Defaults: n_s = 16 as in the paper; n_r scaled from the paper's 4080 of a 32K context to SmolLM2's 8K (4096 / 4
// proximal tokens: 16 + 1008).
std::unique_ptr<CompressionPolicy> make_pod_policy(const PolicySpec& spec, const PolicyContext&) {
  ParamReader params(spec);
  PodWindow window;
  window.sinks = params.get_int("sinks", 16, 0, 1 << 20);
  window.recent = params.get_int("recent", 1008, 1, 1 << 20);
  params.finish();
  return std::make_unique<PodPolicy>(window);
}

}  // namespace strata
