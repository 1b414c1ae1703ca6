// Replica URLs (router/replica_endpoint.h), and what the health checks read from a replica (router/health_checker.h).
#include "router/replica_endpoint.h"

#include <gtest/gtest.h>

#include "router/health_checker.h"

namespace strata {
namespace {

TEST(ReplicaEndpoint, HostPortAndTheUrlItIsNamedBy) {
  const ReplicaEndpoint a = parse_replica_url("http://127.0.0.1:8001/");
  EXPECT_EQ(a.url, "http://127.0.0.1:8001");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 8001);
  const ReplicaEndpoint b = parse_replica_url("http://replica-2");
  EXPECT_EQ(b.host, "replica-2");
  EXPECT_EQ(b.port, 80);
  const ReplicaEndpoint c = parse_replica_url("http://[::1]:9000");
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.port, 9000);
}

TEST(ReplicaEndpoint, WhatCannotBeUsedIsNamed) {
  for (const char* url : {"https://a:1", "a:1", "http://a:1/v1", "http://:80", "http://a:0", "http://a:x"}) {
    try {
      parse_replica_url(url);
      ADD_FAILURE() << url << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(url), std::string::npos) << e.what();
    }
  }
}

TEST(HealthChecks, TheLoadSeriesOfAReplicasMetrics) {
  const ReplicaLoad load = parse_replica_load(
      "# HELP strata_requests_waiting Requests queued for admission.\n"
      "# TYPE strata_requests_waiting gauge\n"
      "strata_requests_waiting 3\n"
      "strata_requests_running 2\n"
      "strata_kv_blocks_free_ratio 7\n"
      "strata_kv_blocks_free 120\n"
      "strata_kv_blocks_total 512\n");
  EXPECT_EQ(load.waiting, 3);
  EXPECT_EQ(load.running, 2);
  EXPECT_EQ(load.free_blocks, 120);
  EXPECT_EQ(load.total_blocks, 512);
  EXPECT_EQ(parse_replica_load("").waiting, 0);
}

TEST(HealthChecks, Verdicts) {
  EXPECT_EQ(health_verdict(200, R"({"status":"ok"})"), "ok");
  EXPECT_EQ(health_verdict(503, R"({"status":"draining"})"), "draining");
  EXPECT_EQ(health_verdict(503, R"({"status":"unavailable"})"), "unavailable");
  EXPECT_EQ(health_verdict(503, "not json"), "unavailable");
  EXPECT_EQ(health_verdict(0, ""), "unreachable");
}

}  // namespace
}  // namespace strata
