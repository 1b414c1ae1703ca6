#pragma once
// The daemon's Prometheus metrics, served at /metrics in the text exposition format.
//
// Names use `strata_` and `_` (not vLLM's `:`). The request metrics mirror vLLM's (running, waiting, TTFT,
// inter-token latency, e2e latency, token counters, preemptions) so existing dashboards map one to one; the
// router contract is strata_requests_waiting, strata_requests_running, strata_kv_usage_ratio and
// strata_kv_block_size_tokens. Per-layer KV occupancy, labelled {layer, pp_stage, tp_rank}, is what no other
// server exports and what compression changes. What the policies and the cache's storage of their decisions
// observe per layer has the series they declare (cache/layer_metric.h): created here by name, fed by name.
//
// Updated from the engine thread, rendered from HTTP threads: every method may be called from any thread.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "cache/layer_metric.h"
#include "cache/observation.h"
#include "leader/generation.h"

namespace strata {

class ServerMetrics {
 public:
  // max_model_len bounds the token-count histograms (1-2-5 buckets up to it, as vLLM does). layer_metrics: the
  // per-layer series of observations (cache/compression_policy.h: layer_metrics()), on every layer from the start.
  ServerMetrics(int64_t max_model_len, std::span<const LayerMetric> layer_metrics);

  // KV held by one layer on one rank; strata_kv_saved_bytes follows the sum over all layers set so far.
  void set_layer_kv(int layer, int pp_stage, int tp_rank, int64_t tokens, int64_t bytes, int64_t uncompressed_bytes);
  void set_kv_blocks(int64_t n_free, int64_t n_total, int block_size);
  // What one layer's compression policies did since the last call: the entries they evicted, and the counts among
  // `observed`, each added to the counter declared under its name.
  void add_layer_compression(int layer, int pp_stage, int tp_rank, int64_t evicted_tokens,
                             std::span<const Observation> observed);
  // What one layer observes now: every gauge declared shows the amount of its name in `observed`, or 0.
  void set_layer_observed(int layer, int pp_stage, int tp_rank, std::span<const Observation> observed);
  // Prefix caching: the blocks of one layer in the cache, used or not.
  void set_layer_prefix_cached(int layer, int pp_stage, int tp_rank, int64_t blocks);
  void set_requests(int n_running, int n_waiting);
  // strata_build_info{commit, backend, cpu_kernels, amx} 1: which code serves, so a dashboard can tell ranks, rollouts
  // and machine kinds apart.
  void set_build_info(const std::string& commit, const std::string& backend, const std::string& cpu_kernels,
                      const std::string& amx);
  // strata_kv_cache_info{dtype, element} 1: the cache's format (kv_cache.dtype) and the element type of its
  // full-precision blocks (f32, bf16 or f16; CUDA's are bf16 under dtype f32), so that a dashboard knows what a
  // token costs when it reads strata_kv_layer_bytes.
  void set_kv_cache_info(const std::string& dtype, const std::string& element);

  void add_prompt_tokens(int64_t n);
  void add_generation_tokens(int64_t n);
  void add_preemption();
  // Prefix caching: a sequence admitted with n_prompt tokens of which n_cached came from cached blocks; the
  // blocks cached now (each one KV block in every layer of every stage).
  void add_prefix_cache_lookup(int64_t n_prompt, int64_t n_cached);
  void add_compressed_prefix_start();
  void set_prefix_cache_blocks(int64_t n_blocks);
  // strata_requests_total{finish_reason}: "stop", "length" or "abort" (the client went away), all three from the
  // start at 0.
  void add_finished_request(FinishReason reason);

  // A request's wait in the queue: from arrival to the step that first schedules one of its sequences.
  void observe_queue_time(double seconds);
  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  // At the end of a request: its latency from arrival and its token counts.
  void observe_finished_request(double e2e_seconds, int64_t n_prompt_tokens, int64_t n_generation_tokens);

  std::string render() const;

 private:
  struct LayerKv {
    prometheus::Gauge* tokens = nullptr;
    prometheus::Gauge* bytes = nullptr;
    prometheus::Gauge* uncompressed_bytes = nullptr;
    prometheus::Counter* evicted_tokens = nullptr;
    prometheus::Gauge* prefix_cached_blocks = nullptr;
    // The declared series, by the name of the observation they show.
    std::map<std::string, prometheus::Counter*, std::less<>> observed_counters;
    std::map<std::string, prometheus::Gauge*, std::less<>> observed_gauges;
    int64_t bytes_held = 0;      // as last set
    int64_t bytes_uncompressed = 0;
  };
  LayerKv& layer(int layer, int pp_stage, int tp_rank);  // under layers_mutex_
  using LayerKey = std::tuple<int, int, int>;  // (layer, pp_stage, tp_rank)
  // A declared per-layer series and its family (several declarations may share one).
  struct ObservedSeries {
    LayerMetric metric;
    prometheus::Family<prometheus::Counter>* counters = nullptr;  // for a counter
    prometheus::Family<prometheus::Gauge>* gauges = nullptr;      // for a gauge
  };
  void declare(std::span<const LayerMetric> layer_metrics);

  std::shared_ptr<prometheus::Registry> registry_;

  prometheus::Family<prometheus::Gauge>& kv_layer_tokens_;
  prometheus::Family<prometheus::Gauge>& kv_layer_bytes_;
  prometheus::Family<prometheus::Gauge>& kv_layer_uncompressed_bytes_;
  prometheus::Family<prometheus::Counter>& kv_layer_evicted_tokens_;
  prometheus::Family<prometheus::Gauge>& kv_layer_prefix_cached_blocks_;
  std::vector<ObservedSeries> observed_series_;
  prometheus::Gauge& kv_saved_bytes_;
  prometheus::Gauge& kv_compression_ratio_;
  prometheus::Gauge& kv_blocks_free_;
  prometheus::Gauge& kv_blocks_total_;
  prometheus::Gauge& kv_block_size_tokens_;
  prometheus::Gauge& kv_usage_ratio_;
  prometheus::Gauge& requests_running_;
  prometheus::Gauge& requests_waiting_;

  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& prefix_cache_queries_;
  prometheus::Counter& prefix_cache_hits_;
  prometheus::Counter& prefix_cache_compressed_starts_;
  prometheus::Gauge& prefix_cache_blocks_;
  prometheus::Family<prometheus::Counter>& requests_;

  prometheus::Histogram& queue_time_;
  prometheus::Histogram& time_to_first_token_;
  prometheus::Histogram& inter_token_latency_;
  prometheus::Histogram& e2e_request_latency_;
  prometheus::Histogram& request_prompt_tokens_;
  prometheus::Histogram& request_generation_tokens_;

  std::mutex layers_mutex_;  // guards layers_ and the totals derived from it
  std::map<LayerKey, LayerKv> layers_;
  int64_t bytes_held_ = 0;
  int64_t bytes_uncompressed_ = 0;
};

}  // namespace strata
