#include "leader/metrics.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cache/compression_policy.h"

namespace strata {
namespace {

// The value of one series in the exposition text, e.g. series = `strata_kv_blocks_free` or
// `strata_requests_total{finish_reason="stop"}`; nullopt when no line has it.
std::optional<double> value_of(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(series + " ")) return std::stod(line.substr(series.size() + 1));
  }
  return std::nullopt;
}

std::string layer_series(const std::string& name, int layer, int pp_stage, int tp_rank) {
  return name + "{layer=\"" + std::to_string(layer) + "\",pp_stage=\"" + std::to_string(pp_stage) +
         "\",tp_rank=\"" + std::to_string(tp_rank) + "\"}";
}

// Sets every metric once, as a running daemon would.
void populate(ServerMetrics& metrics) {
  for (int layer = 0; layer < 4; ++layer) {
    for (int tp_rank = 0; tp_rank < 2; ++tp_rank) {
      int64_t tokens = 100 * (layer + 1);
      metrics.set_layer_kv(layer, layer / 2, tp_rank, tokens, tokens * 256, tokens * 1024);
    }
  }
  metrics.set_kv_blocks(300, 1000, 16);
  metrics.set_requests(4, 2);
  metrics.add_prompt_tokens(812);
  metrics.add_generation_tokens(96);
  metrics.add_preemption();
  metrics.add_finished_request(FinishReason::stop);
  metrics.add_finished_request(FinishReason::length);
  metrics.observe_queue_time(0.004);
  metrics.observe_time_to_first_token(0.031);
  metrics.observe_inter_token_latency(0.006);
  metrics.observe_inter_token_latency(0.012);
  metrics.observe_finished_request(1.7, 812, 96);
  const std::vector<Observation> counts = {{"lazy=true", 1, ObservationKind::count},
                                           {"merged_tokens", 12, ObservationKind::count}};
  metrics.add_layer_compression(2, 1, 0, 40, counts);
  const std::vector<Observation> amounts = {{"codebook_vectors", 715, ObservationKind::amount},
                                            {"shared_keys", 64, ObservationKind::amount}};
  metrics.set_layer_observed(2, 1, 0, amounts);
}

TEST(MetricsTest, LayerGaugesCarryLayerStageAndRank) {
  ServerMetrics metrics(2048, layer_metrics());
  metrics.set_layer_kv(3, 1, 0, 128, 4096, 16384);
  metrics.set_layer_kv(3, 1, 1, 64, 2048, 8192);
  std::string text = metrics.render();
  EXPECT_EQ(value_of(text, layer_series("strata_kv_layer_tokens", 3, 1, 0)), 128);
  EXPECT_EQ(value_of(text, layer_series("strata_kv_layer_bytes", 3, 1, 0)), 4096);
  EXPECT_EQ(value_of(text, layer_series("strata_kv_layer_uncompressed_bytes", 3, 1, 0)), 16384);
  EXPECT_EQ(value_of(text, layer_series("strata_kv_layer_tokens", 3, 1, 1)), 64);
  EXPECT_EQ(value_of(text, "strata_kv_saved_bytes"), (16384 - 4096) + (8192 - 2048));

  // A later value for the same layer replaces the earlier one, in the layer gauges and in the total saved.
  metrics.set_layer_kv(3, 1, 0, 256, 8192, 32768);
  text = metrics.render();
  EXPECT_EQ(value_of(text, layer_series("strata_kv_layer_tokens", 3, 1, 0)), 256);
  EXPECT_EQ(value_of(text, "strata_kv_saved_bytes"), (32768 - 8192) + (8192 - 2048));
}

TEST(MetricsTest, KvBlocksGiveTheUsageRatio) {
  ServerMetrics metrics(2048, layer_metrics());
  EXPECT_EQ(value_of(metrics.render(), "strata_kv_usage_ratio"), 0);  // no pool yet: 0, not NaN
  metrics.set_kv_blocks(250, 1000, 16);
  std::string text = metrics.render();
  EXPECT_EQ(value_of(text, "strata_kv_blocks_free"), 250);
  EXPECT_EQ(value_of(text, "strata_kv_blocks_total"), 1000);
  EXPECT_EQ(value_of(text, "strata_kv_block_size_tokens"), 16);
  EXPECT_EQ(value_of(text, "strata_kv_usage_ratio"), 0.75);
}

TEST(MetricsTest, RequestGaugesAndCounters) {
  ServerMetrics metrics(2048, layer_metrics());
  std::string text = metrics.render();
  EXPECT_EQ(value_of(text, "strata_requests_total{finish_reason=\"stop\"}"), 0);  // present before any request
  EXPECT_EQ(value_of(text, "strata_requests_total{finish_reason=\"abort\"}"), 0);

  metrics.set_requests(3, 5);
  metrics.add_prompt_tokens(100);
  metrics.add_prompt_tokens(20);
  metrics.add_generation_tokens(7);
  metrics.add_preemption();
  metrics.add_preemption();
  metrics.add_finished_request(FinishReason::stop);
  metrics.add_finished_request(FinishReason::stop);
  metrics.add_finished_request(FinishReason::length);
  text = metrics.render();
  EXPECT_EQ(value_of(text, "strata_requests_running"), 3);
  EXPECT_EQ(value_of(text, "strata_requests_waiting"), 5);
  EXPECT_EQ(value_of(text, "strata_prompt_tokens_total"), 120);
  EXPECT_EQ(value_of(text, "strata_generation_tokens_total"), 7);
  EXPECT_EQ(value_of(text, "strata_preemptions_total"), 2);
  EXPECT_EQ(value_of(text, "strata_requests_total{finish_reason=\"stop\"}"), 2);
  EXPECT_EQ(value_of(text, "strata_requests_total{finish_reason=\"length\"}"), 1);
}

TEST(MetricsTest, HistogramsCountIntoTheirBuckets) {
  ServerMetrics metrics(2048, layer_metrics());
  metrics.observe_time_to_first_token(0.03);
  metrics.observe_inter_token_latency(0.004);
  metrics.observe_finished_request(2.2, 700, 30);
  metrics.observe_queue_time(0.007);
  std::string text = metrics.render();
  EXPECT_EQ(value_of(text, "strata_request_queue_time_seconds_bucket{le=\"0.005\"}"), 0);
  EXPECT_EQ(value_of(text, "strata_request_queue_time_seconds_bucket{le=\"0.01\"}"), 1);
  EXPECT_EQ(value_of(text, "strata_request_queue_time_seconds_count"), 1);
  EXPECT_EQ(value_of(text, "strata_time_to_first_token_seconds_bucket{le=\"0.02\"}"), 0);
  EXPECT_EQ(value_of(text, "strata_time_to_first_token_seconds_bucket{le=\"0.04\"}"), 1);
  EXPECT_EQ(value_of(text, "strata_time_to_first_token_seconds_count"), 1);
  EXPECT_NEAR(*value_of(text, "strata_time_to_first_token_seconds_sum"), 0.03, 1e-12);
  EXPECT_EQ(value_of(text, "strata_inter_token_latency_seconds_bucket{le=\"0.0025\"}"), 0);
  EXPECT_EQ(value_of(text, "strata_inter_token_latency_seconds_bucket{le=\"0.005\"}"), 1);
  EXPECT_EQ(value_of(text, "strata_e2e_request_latency_seconds_bucket{le=\"2\"}"), 0);
  EXPECT_EQ(value_of(text, "strata_e2e_request_latency_seconds_bucket{le=\"2.5\"}"), 1);
  EXPECT_EQ(value_of(text, "strata_request_prompt_tokens_bucket{le=\"500\"}"), 0);
  EXPECT_EQ(value_of(text, "strata_request_prompt_tokens_bucket{le=\"1000\"}"), 1);
  EXPECT_EQ(value_of(text, "strata_request_generation_tokens_bucket{le=\"50\"}"), 1);
  // 1-2-5 buckets stop at max_model_len.
  EXPECT_TRUE(value_of(text, "strata_request_prompt_tokens_bucket{le=\"2000\"}").has_value());
  EXPECT_FALSE(value_of(text, "strata_request_prompt_tokens_bucket{le=\"5000\"}").has_value());
}

TEST(MetricsTest, UpdatesAndRendersFromManyThreads) {
  ServerMetrics metrics(2048, layer_metrics());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&metrics, t] {
      for (int step = 1; step <= 500; ++step) {
        for (int layer = 0; layer < 8; ++layer) metrics.set_layer_kv(layer, 0, t, step, step * 2, step * 10);
        metrics.add_generation_tokens(1);
        metrics.observe_inter_token_latency(0.01);
      }
    });
  }
  threads.emplace_back([&metrics] {
    for (int i = 0; i < 50; ++i) EXPECT_NE(metrics.render().find("strata_kv_saved_bytes"), std::string::npos);
  });
  for (std::thread& thread : threads) thread.join();
  std::string text = metrics.render();
  EXPECT_EQ(value_of(text, "strata_kv_saved_bytes"), 4 * 8 * (500 * 10 - 500 * 2));
  EXPECT_EQ(value_of(text, "strata_generation_tokens_total"), 4 * 500);
  EXPECT_EQ(value_of(text, "strata_inter_token_latency_seconds_count"), 4 * 500);
}

// Renders every metric; tests/leader/test_metrics_format.py runs this test with STRATA_METRICS_EXPOSITION set and
// parses the file with the Prometheus client library's parser.
TEST(MetricsTest, WritesExpositionForTheParser) {
  ServerMetrics metrics(4096, layer_metrics());
  populate(metrics);
  std::string text = metrics.render();
  for (const char* name :
       {"strata_kv_layer_tokens", "strata_kv_layer_bytes", "strata_kv_layer_uncompressed_bytes",
        "strata_kv_saved_bytes", "strata_kv_blocks_free", "strata_kv_blocks_total", "strata_kv_block_size_tokens",
        "strata_kv_usage_ratio", "strata_requests_running", "strata_requests_waiting", "strata_prompt_tokens_total",
        "strata_generation_tokens_total", "strata_requests_total", "strata_preemptions_total",
        "strata_request_queue_time_seconds", "strata_time_to_first_token_seconds",
        "strata_inter_token_latency_seconds",
        "strata_e2e_request_latency_seconds", "strata_request_prompt_tokens", "strata_request_generation_tokens",
        "strata_kv_compression_ratio", "strata_kv_layer_evicted_tokens_total", "strata_kv_layer_lazy_decisions_total"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  if (const char* path = std::getenv("STRATA_METRICS_EXPOSITION")) {
    std::ofstream out(path);
    out << text;
    ASSERT_TRUE(out.good()) << "cannot write " << path;
  }
}

TEST(MetricsTest, CompressionRatioEvictionsAndLazyDecisions) {
  ServerMetrics metrics(4096, layer_metrics());
  EXPECT_NE(metrics.render().find("strata_kv_compression_ratio 1"), std::string::npos) << "1 while empty";
  metrics.set_layer_kv(0, 0, 0, 100, 1000, 4000);
  metrics.set_layer_kv(1, 0, 0, 100, 1000, 2000);
  std::string text = metrics.render();
  EXPECT_NE(text.find("strata_kv_compression_ratio 3"), std::string::npos) << text;  // 6000 / 2000
  metrics.set_layer_kv(1, 0, 0, 100, 2000, 2000);  // a layer's new value replaces its old one
  text = metrics.render();
  EXPECT_NE(text.find("strata_kv_compression_ratio 2"), std::string::npos);  // 6000 / 3000

  const std::vector<Observation> lazy = {{"lazy=true", 1, ObservationKind::count}};
  const std::vector<Observation> not_lazy = {{"lazy=false", 2, ObservationKind::count}};
  metrics.add_layer_compression(1, 0, 0, 37, lazy);
  metrics.add_layer_compression(1, 0, 0, 5, not_lazy);
  text = metrics.render();
  EXPECT_NE(text.find(R"(strata_kv_layer_evicted_tokens_total{layer="1",pp_stage="0",tp_rank="0"} 42)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(strata_kv_layer_lazy_decisions_total{layer="1",lazy="true",pp_stage="0",tp_rank="0"} 1)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"(strata_kv_layer_lazy_decisions_total{layer="1",lazy="false",pp_stage="0",tp_rank="0"} 2)"),
            std::string::npos)
      << text;
}

// The series that policies and the cache declare are on every layer from the start and fed by name; /metrics
// knows none of them.
TEST(MetricsTest, DeclaredLayerSeriesAreFedByName) {
  const LayerMetric declared[] = {
      {"done=yes", "strata_test_done_total", MetricType::counter, "Done, by answer.", "answer", "yes"},
      {"done=no", "strata_test_done_total", MetricType::counter, "Done, by answer.", "answer", "no"},
      {"held", "strata_test_held", MetricType::gauge, "Held now."},
  };
  ServerMetrics metrics(2048, declared);
  metrics.set_layer_kv(4, 1, 0, 10, 100, 100);
  std::string text = metrics.render();
  EXPECT_NE(text.find("# HELP strata_test_done_total Done, by answer."), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE strata_test_done_total counter"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE strata_test_held gauge"), std::string::npos) << text;
  const std::string yes = R"(strata_test_done_total{answer="yes",layer="4",pp_stage="1",tp_rank="0"})";
  const std::string no = R"(strata_test_done_total{answer="no",layer="4",pp_stage="1",tp_rank="0"})";
  EXPECT_EQ(value_of(text, yes), 0);
  EXPECT_EQ(value_of(text, no), 0);
  EXPECT_EQ(value_of(text, layer_series("strata_test_held", 4, 1, 0)), 0);

  // Counts add up; an amount, or a name nobody declared, feeds no counter.
  const std::vector<Observation> step = {{"done=yes", 2, ObservationKind::count},
                                         {"done=no", 5, ObservationKind::amount},
                                         {"undeclared", 9, ObservationKind::count}};
  metrics.add_layer_compression(4, 1, 0, 0, step);
  metrics.add_layer_compression(4, 1, 0, 0, step);
  // A gauge shows the amount of its name, and 0 again once none is reported.
  const std::vector<Observation> held = {{"held", 33, ObservationKind::amount}};
  metrics.set_layer_observed(4, 1, 0, held);
  text = metrics.render();
  EXPECT_EQ(value_of(text, yes), 4);
  EXPECT_EQ(value_of(text, no), 0);
  EXPECT_EQ(text.find("undeclared"), std::string::npos);
  EXPECT_EQ(value_of(text, layer_series("strata_test_held", 4, 1, 0)), 33);
  metrics.set_layer_observed(4, 1, 0, {});
  EXPECT_EQ(value_of(metrics.render(), layer_series("strata_test_held", 4, 1, 0)), 0);
}

// The per-layer families operators scrape (README, deploy/grafana) keep their names, types and HELP texts, now
// that policies and the cache declare them.
TEST(MetricsTest, ThePoliciesLayerFamiliesKeepTheirNames) {
  ServerMetrics metrics(2048, layer_metrics());
  metrics.set_layer_kv(0, 0, 0, 10, 100, 100);
  const std::string text = metrics.render();
  for (const char* line : {
           R"(# HELP strata_kv_layer_lazy_decisions_total SimLayerKV verdicts per layer: lazy="true" layers were trimmed.)",
           "# TYPE strata_kv_layer_lazy_decisions_total counter",
           R"(strata_kv_layer_lazy_decisions_total{layer="0",lazy="true",pp_stage="0",tp_rank="0"} 0)",
           R"(strata_kv_layer_lazy_decisions_total{layer="0",lazy="false",pp_stage="0",tp_rank="0"} 0)",
           "# HELP strata_kv_layer_merged_tokens_total Evicted KV entries merged into kept ones (D2O), per layer.",
           "# TYPE strata_kv_layer_merged_tokens_total counter",
           R"(strata_kv_layer_merged_tokens_total{layer="0",pp_stage="0",tp_rank="0"} 0)",
           "# HELP strata_kv_layer_codebook_vectors SpindleKV codebook entries held by one layer (keys and values).",
           "# TYPE strata_kv_layer_codebook_vectors gauge",
           R"(strata_kv_layer_codebook_vectors{layer="0",pp_stage="0",tp_rank="0"} 0)",
           "# HELP strata_kv_layer_shared_keys PoD: entries one layer holds without their keys (its block leader's are "
           "used).",
           "# TYPE strata_kv_layer_shared_keys gauge",
           R"(strata_kv_layer_shared_keys{layer="0",pp_stage="0",tp_rank="0"} 0)"}) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace strata
