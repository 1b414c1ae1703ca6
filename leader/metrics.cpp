#include "leader/metrics.h"

#include <algorithm>

#include <prometheus/text_serializer.h>

namespace strata {
namespace {

using prometheus::Histogram;
using prometheus::Registry;

prometheus::Family<prometheus::Gauge>& gauge_family(Registry& registry, const std::string& name,
                                                    const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

prometheus::Gauge& gauge(Registry& registry, const std::string& name, const std::string& help) {
  return gauge_family(registry, name, help).Add({});
}

prometheus::Family<prometheus::Counter>& counter_family(Registry& registry, const std::string& name,
                                                        const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Counter& counter(Registry& registry, const std::string& name, const std::string& help) {
  return counter_family(registry, name, help).Add({});
}

Histogram& histogram(Registry& registry, const std::string& name, const std::string& help,
                     const Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add({}, buckets);
}

// 1, 2, 5, 10, 20, 50, ... up to max_value: token counts span orders of magnitude.
Histogram::BucketBoundaries one_two_five_buckets(int64_t max_value) {
  Histogram::BucketBoundaries buckets;
  for (int64_t decade = 1;; decade *= 10) {
    for (int64_t step : {1, 2, 5}) {
      if (step * decade > max_value) return buckets;
      buckets.push_back(static_cast<double>(step * decade));
    }
  }
}

// vLLM's latency buckets, so that dashboards and SLO queries carry over.
const Histogram::BucketBoundaries kTimeToFirstTokenBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
// vLLM's, plus 1, 2.5 and 5 ms at the low end: a sharded 70B decode step is 5-8 ms, all in vLLM's first bucket.
const Histogram::BucketBoundaries kInterTokenLatencyBuckets = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2, 0.3,
    0.4,   0.5,    0.75,  1.0,  2.5,   5.0,  7.5,   10.0, 20.0, 40.0, 80.0};
const Histogram::BucketBoundaries kE2eRequestLatencyBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace

ServerMetrics::ServerMetrics(int64_t max_model_len, std::span<const LayerMetric> layer_metrics)
    : registry_(std::make_shared<Registry>()),
      kv_layer_tokens_(gauge_family(*registry_, "strata_kv_layer_tokens",
                                    "KV-cache tokens held by one layer on one rank.")),
      kv_layer_bytes_(gauge_family(*registry_, "strata_kv_layer_bytes",
                                   "KV-cache bytes held by one layer on one rank.")),
      kv_layer_uncompressed_bytes_(gauge_family(*registry_, "strata_kv_layer_uncompressed_bytes",
                                                "Bytes the same tokens would take in the uncompressed cache.")),
      kv_layer_evicted_tokens_(counter_family(*registry_, "strata_kv_layer_evicted_tokens_total",
                                              "KV entries removed by compression policies, per layer.")),
      kv_layer_prefix_cached_blocks_(gauge_family(*registry_, "strata_kv_layer_prefix_cached_blocks",
                                                  "Prefix-cache blocks one layer holds, used by sequences or not.")),
      kv_saved_bytes_(gauge(*registry_, "strata_kv_saved_bytes",
                            "Uncompressed minus held KV-cache bytes, summed over all layers and ranks.")),
      kv_compression_ratio_(gauge(*registry_, "strata_kv_compression_ratio",
                                  "Bytes the KV cache would hold uncompressed over the bytes it holds (1: none).")),
      kv_blocks_free_(gauge(*registry_, "strata_kv_blocks_free", "Free KV-cache blocks.")),
      kv_blocks_total_(gauge(*registry_, "strata_kv_blocks_total", "KV-cache blocks in the pool.")),
      kv_block_size_tokens_(gauge(*registry_, "strata_kv_block_size_tokens", "Tokens per KV-cache block.")),
      kv_usage_ratio_(gauge(*registry_, "strata_kv_usage_ratio", "Used over total KV-cache blocks, 0 to 1.")),
      requests_running_(gauge(*registry_, "strata_requests_running", "Requests being generated.")),
      requests_waiting_(gauge(*registry_, "strata_requests_waiting", "Requests queued for admission.")),
      prompt_tokens_(counter(*registry_, "strata_prompt_tokens_total", "Prompt tokens processed.")),
      generation_tokens_(counter(*registry_, "strata_generation_tokens_total", "Tokens generated.")),
      preemptions_(counter(*registry_, "strata_preemptions_total", "Requests preempted to free KV-cache blocks.")),
      prefix_cache_queries_(counter(*registry_, "strata_prefix_cache_queries_total",
                                    "Prompt tokens looked up in the prefix cache.")),
      prefix_cache_hits_(counter(*registry_, "strata_prefix_cache_hits_total",
                                 "Prompt tokens whose KV came from the prefix cache.")),
      prefix_cache_compressed_starts_(counter(*registry_, "strata_prefix_cache_compressed_starts_total",
                                              "Requests that started from a shared compressed prefix: their "
                                              "document was neither prefilled nor compressed again.")),
      prefix_cache_blocks_(gauge(*registry_, "strata_prefix_cache_blocks",
                                 "Cached prompt blocks (each one KV block in every layer of every stage).")),
      requests_(counter_family(*registry_, "strata_requests_total", "Requests finished, by finish reason.")),
      // vLLM gives its queue time the end-to-end buckets; these, fine below 0.3 s, tell a queue of one step from an
      // idle server, which is where a dashboard starts to see load.
      queue_time_(histogram(*registry_, "strata_request_queue_time_seconds",
                            "Time from arrival to the first step that schedules the request.",
                            kTimeToFirstTokenBuckets)),
      time_to_first_token_(histogram(*registry_, "strata_time_to_first_token_seconds",
                                     "Time from arrival to the first generated token.", kTimeToFirstTokenBuckets)),
      inter_token_latency_(histogram(*registry_, "strata_inter_token_latency_seconds",
                                     "Time between consecutive generated tokens of a request.",
                                     kInterTokenLatencyBuckets)),
      e2e_request_latency_(histogram(*registry_, "strata_e2e_request_latency_seconds",
                                     "Time from arrival to the end of a request.", kE2eRequestLatencyBuckets)),
      request_prompt_tokens_(histogram(*registry_, "strata_request_prompt_tokens", "Prompt tokens per request.",
                                       one_two_five_buckets(max_model_len))),
      request_generation_tokens_(histogram(*registry_, "strata_request_generation_tokens",
                                           "Generated tokens per request.", one_two_five_buckets(max_model_len))) {
  // Every finish reason is a series from the start, so that rate() sees the first request of each.
  for (FinishReason reason : {FinishReason::stop, FinishReason::length, FinishReason::abort}) {
    requests_.Add({{"finish_reason", std::string(finish_reason_name(reason))}});
  }
  kv_compression_ratio_.Set(1.0);
  declare(layer_metrics);
}

// One family per name, whichever declarations share it.
void ServerMetrics::declare(std::span<const LayerMetric> layer_metrics) {
  std::map<std::string_view, prometheus::Family<prometheus::Counter>*> counters;
  std::map<std::string_view, prometheus::Family<prometheus::Gauge>*> gauges;
  for (const LayerMetric& m : layer_metrics) {
    ObservedSeries series{m};
    const std::string family(m.family), help(m.help);
    if (m.type == MetricType::counter) {
      auto [it, added] = counters.try_emplace(m.family);
      if (added) it->second = &counter_family(*registry_, family, help);
      series.counters = it->second;
    } else {
      auto [it, added] = gauges.try_emplace(m.family);
      if (added) it->second = &gauge_family(*registry_, family, help);
      series.gauges = it->second;
    }
    observed_series_.push_back(series);
  }
}

ServerMetrics::LayerKv& ServerMetrics::layer(int layer, int pp_stage, int tp_rank) {
  auto [it, inserted] = layers_.try_emplace(LayerKey{layer, pp_stage, tp_rank});
  LayerKv& kv = it->second;
  if (inserted) {
    prometheus::Labels labels = {{"layer", std::to_string(layer)},
                                 {"pp_stage", std::to_string(pp_stage)},
                                 {"tp_rank", std::to_string(tp_rank)}};
    kv.tokens = &kv_layer_tokens_.Add(labels);
    kv.bytes = &kv_layer_bytes_.Add(labels);
    kv.uncompressed_bytes = &kv_layer_uncompressed_bytes_.Add(labels);
    kv.evicted_tokens = &kv_layer_evicted_tokens_.Add(labels);
    kv.prefix_cached_blocks = &kv_layer_prefix_cached_blocks_.Add(labels);
    for (const ObservedSeries& series : observed_series_) {
      prometheus::Labels series_labels = labels;
      if (!series.metric.label.empty()) {
        series_labels[std::string(series.metric.label)] = std::string(series.metric.label_value);
      }
      const std::string name(series.metric.observation);
      if (series.counters) {
        kv.observed_counters[name] = &series.counters->Add(series_labels);
      } else {
        kv.observed_gauges[name] = &series.gauges->Add(series_labels);
      }
    }
  }
  return kv;
}

void ServerMetrics::set_layer_kv(int layer_index, int pp_stage, int tp_rank, int64_t tokens, int64_t bytes,
                                 int64_t uncompressed_bytes) {
  std::lock_guard lock(layers_mutex_);
  LayerKv& kv = layer(layer_index, pp_stage, tp_rank);
  kv.tokens->Set(static_cast<double>(tokens));
  kv.bytes->Set(static_cast<double>(bytes));
  kv.uncompressed_bytes->Set(static_cast<double>(uncompressed_bytes));
  bytes_held_ += bytes - kv.bytes_held;
  bytes_uncompressed_ += uncompressed_bytes - kv.bytes_uncompressed;
  kv.bytes_held = bytes;
  kv.bytes_uncompressed = uncompressed_bytes;
  kv_saved_bytes_.Set(static_cast<double>(bytes_uncompressed_ - bytes_held_));
  kv_compression_ratio_.Set(bytes_held_ > 0 ? static_cast<double>(bytes_uncompressed_) / double(bytes_held_) : 1.0);
}

void ServerMetrics::add_layer_compression(int layer_index, int pp_stage, int tp_rank, int64_t evicted_tokens,
                                          std::span<const Observation> observed) {
  std::lock_guard lock(layers_mutex_);
  LayerKv& kv = layer(layer_index, pp_stage, tp_rank);
  kv.evicted_tokens->Increment(static_cast<double>(evicted_tokens));
  for (const Observation& o : observed) {
    auto it = kv.observed_counters.find(o.name);
    if (o.kind == ObservationKind::count && it != kv.observed_counters.end()) {
      it->second->Increment(static_cast<double>(o.value));
    }
  }
}

void ServerMetrics::set_layer_observed(int layer_index, int pp_stage, int tp_rank,
                                       std::span<const Observation> observed) {
  std::lock_guard lock(layers_mutex_);
  for (auto& named : layer(layer_index, pp_stage, tp_rank).observed_gauges) {
    const std::string& name = named.first;  // a structured binding cannot be captured before clang 16
    auto it = std::find_if(observed.begin(), observed.end(), [&name](const Observation& o) {
      return o.kind == ObservationKind::amount && o.name == name;
    });
    named.second->Set(it == observed.end() ? 0.0 : static_cast<double>(it->value));
  }
}

void ServerMetrics::set_layer_prefix_cached(int layer_index, int pp_stage, int tp_rank, int64_t blocks) {
  std::lock_guard lock(layers_mutex_);
  layer(layer_index, pp_stage, tp_rank).prefix_cached_blocks->Set(static_cast<double>(blocks));
}

void ServerMetrics::set_kv_blocks(int64_t n_free, int64_t n_total, int block_size) {
  kv_blocks_free_.Set(static_cast<double>(n_free));
  kv_blocks_total_.Set(static_cast<double>(n_total));
  kv_block_size_tokens_.Set(block_size);
  kv_usage_ratio_.Set(n_total > 0 ? static_cast<double>(n_total - n_free) / static_cast<double>(n_total) : 0.0);
}

void ServerMetrics::set_build_info(const std::string& commit, const std::string& backend,
                                   const std::string& cpu_kernels, const std::string& amx) {
  gauge_family(*registry_, "strata_build_info",
               "1, labelled with the commit built, the backend, the instruction-set level of the CPU kernels and "
               "what the AMX probe found (absent, refused, trapped, usable).")
      .Add({{"commit", commit}, {"backend", backend}, {"cpu_kernels", cpu_kernels}, {"amx", amx}})
      .Set(1);
}

void ServerMetrics::set_kv_cache_info(const std::string& dtype, const std::string& element) {
  gauge_family(*registry_, "strata_kv_cache_info",
               "1, labelled with the KV cache's format (kv_cache.dtype: f32, bf16, f16, int8, int4 or int2) and the "
               "element type of its full-precision blocks (f32, bf16 or f16).")
      .Add({{"dtype", dtype}, {"element", element}})
      .Set(1);
}

void ServerMetrics::set_requests(int n_running, int n_waiting) {
  requests_running_.Set(n_running);
  requests_waiting_.Set(n_waiting);
}

void ServerMetrics::add_prompt_tokens(int64_t n) { prompt_tokens_.Increment(static_cast<double>(n)); }

void ServerMetrics::add_generation_tokens(int64_t n) { generation_tokens_.Increment(static_cast<double>(n)); }

void ServerMetrics::add_preemption() { preemptions_.Increment(); }

void ServerMetrics::add_prefix_cache_lookup(int64_t n_prompt, int64_t n_cached) {
  prefix_cache_queries_.Increment(static_cast<double>(n_prompt));
  prefix_cache_hits_.Increment(static_cast<double>(n_cached));
}

void ServerMetrics::add_compressed_prefix_start() { prefix_cache_compressed_starts_.Increment(); }

void ServerMetrics::set_prefix_cache_blocks(int64_t n_blocks) { prefix_cache_blocks_.Set(static_cast<double>(n_blocks)); }

void ServerMetrics::add_finished_request(FinishReason reason) {
  requests_.Add({{"finish_reason", std::string(finish_reason_name(reason))}}).Increment();
}


void ServerMetrics::observe_queue_time(double seconds) { queue_time_.Observe(seconds); }

void ServerMetrics::observe_time_to_first_token(double seconds) { time_to_first_token_.Observe(seconds); }

void ServerMetrics::observe_inter_token_latency(double seconds) { inter_token_latency_.Observe(seconds); }

void ServerMetrics::observe_finished_request(double e2e_seconds, int64_t n_prompt_tokens,
                                             int64_t n_generation_tokens) {
  e2e_request_latency_.Observe(e2e_seconds);
  request_prompt_tokens_.Observe(static_cast<double>(n_prompt_tokens));
  request_generation_tokens_.Observe(static_cast<double>(n_generation_tokens));
}

std::string ServerMetrics::render() const { return prometheus::TextSerializer().Serialize(registry_->Collect()); }

}  // namespace strata
