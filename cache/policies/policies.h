#pragma once
// The constructors of the policies, one per file in cache/policies/; cache/policy_factory.cpp maps names to them.
// Each reads its parameters from the spec with ParamReader (unknown or bad parameters throw PolicyError). A policy
// whose observations (CompressionPolicy::observe) feed /metrics declares the per-layer series here too.
#include <memory>
#include <span>

#include "cache/compression_policy.h"

namespace strata {

std::unique_ptr<CompressionPolicy> make_full_policy(const PolicySpec& spec, const PolicyContext& context);
std::unique_ptr<CompressionPolicy> make_streaming_policy(const PolicySpec& spec, const PolicyContext& context);
std::unique_ptr<CompressionPolicy> make_h2o_policy(const PolicySpec& spec, const PolicyContext& context);
std::unique_ptr<CompressionPolicy> make_snapkv_policy(const PolicySpec& spec, const PolicyContext& context);
std::unique_ptr<CompressionPolicy> make_pyramidkv_policy(const PolicySpec& spec, const PolicyContext& context);
std::unique_ptr<CompressionPolicy> make_simlayerkv_policy(const PolicySpec& spec, const PolicyContext& context);
std::span<const LayerMetric> simlayerkv_metrics();
std::unique_ptr<CompressionPolicy> make_d2o_policy(const PolicySpec& spec, const PolicyContext& context);
std::span<const LayerMetric> d2o_metrics();
std::unique_ptr<CompressionPolicy> make_spindlekv_policy(const PolicySpec& spec, const PolicyContext& context);
std::unique_ptr<CompressionPolicy> make_pod_policy(const PolicySpec& spec, const PolicyContext& context);
std::unique_ptr<CompressionPolicy> make_expected_attention_policy(const PolicySpec& spec,
                                                                  const PolicyContext& context);
std::unique_ptr<CompressionPolicy> make_kvzip_policy(const PolicySpec& spec, const PolicyContext& context);

}  // namespace strata
