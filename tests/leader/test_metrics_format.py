"""The /metrics text of ServerMetrics, read back by the Prometheus client library's own parser.

The text comes from the C++ code itself: the gtest MetricsTest.WritesExpositionForTheParser sets every metric
and, with STRATA_METRICS_EXPOSITION set, writes the rendered text to that file. It runs from the build
(STRATA_BUILD_DIR, default build/, as tools/setup.sh makes it); a missing build fails, it is not skipped.
"""
import math
import os
import re
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("STRATA_BUILD_DIR", ROOT / "build"))

# Family names as the parser reports them: a counter's family drops the `_total` of its samples.
EXPECTED_TYPES = {
    "strata_kv_layer_tokens": "gauge",
    "strata_kv_layer_bytes": "gauge",
    "strata_kv_layer_uncompressed_bytes": "gauge",
    "strata_kv_saved_bytes": "gauge",
    "strata_kv_compression_ratio": "gauge",
    "strata_kv_layer_evicted_tokens": "counter",
    "strata_kv_layer_lazy_decisions": "counter",
    "strata_kv_layer_merged_tokens": "counter",
    "strata_kv_layer_codebook_vectors": "gauge",
    "strata_kv_layer_shared_keys": "gauge",
    "strata_kv_layer_prefix_cached_blocks": "gauge",
    "strata_kv_blocks_free": "gauge",
    "strata_kv_blocks_total": "gauge",
    "strata_kv_block_size_tokens": "gauge",
    "strata_kv_usage_ratio": "gauge",
    "strata_requests_running": "gauge",
    "strata_requests_waiting": "gauge",
    "strata_prompt_tokens": "counter",
    "strata_generation_tokens": "counter",
    "strata_requests": "counter",
    "strata_preemptions": "counter",
    "strata_prefix_cache_queries": "counter",
    "strata_prefix_cache_hits": "counter",
    "strata_prefix_cache_compressed_starts": "counter",
    "strata_prefix_cache_blocks": "gauge",
    "strata_request_queue_time_seconds": "histogram",
    "strata_time_to_first_token_seconds": "histogram",
    "strata_inter_token_latency_seconds": "histogram",
    "strata_e2e_request_latency_seconds": "histogram",
    "strata_request_prompt_tokens": "histogram",
    "strata_request_generation_tokens": "histogram",
}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    binary = BUILD / "tests" / "leader_tests"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: build first (tools/setup.sh, or set STRATA_BUILD_DIR)")
    path = tmp_path_factory.mktemp("metrics") / "metrics.txt"
    subprocess.run(
        [str(binary), "--gtest_filter=MetricsTest.WritesExpositionForTheParser"],
        env={**os.environ, "STRATA_METRICS_EXPOSITION": str(path)},
        cwd=ROOT, check=True, timeout=120, capture_output=True)
    return {family.name: family for family in text_string_to_metric_families(path.read_text())}


def samples(family, name=None):
    return [s for s in family.samples if name is None or s.name == name]


def test_every_family_is_there_with_its_type(families):
    assert {name: family.type for name, family in families.items()} == EXPECTED_TYPES


def test_names_follow_prometheus_conventions(families):
    for family in families.values():
        assert re.fullmatch(r"strata_[a-z0-9_]+", family.name), family.name
        assert family.documentation, f"{family.name} has no HELP"
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name == family.name + "_total", sample.name


def test_layer_gauges_are_labelled_by_layer_stage_and_rank(families):
    for name in ("strata_kv_layer_tokens", "strata_kv_layer_bytes", "strata_kv_layer_uncompressed_bytes"):
        series = samples(families[name])
        assert len(series) == 8, name  # 4 layers x 2 TP ranks, as populate() sets them
        for sample in series:
            assert set(sample.labels) == {"layer", "pp_stage", "tp_rank"}, name
            assert int(sample.labels["pp_stage"]) == int(sample.labels["layer"]) // 2
    held = sum(s.value for s in samples(families["strata_kv_layer_bytes"]))
    uncompressed = sum(s.value for s in samples(families["strata_kv_layer_uncompressed_bytes"]))
    assert samples(families["strata_kv_saved_bytes"])[0].value == uncompressed - held


def test_router_contract(families):
    value = {name: samples(families[name])[0].value for name in (
        "strata_kv_blocks_free", "strata_kv_blocks_total", "strata_kv_usage_ratio", "strata_kv_block_size_tokens",
        "strata_requests_running", "strata_requests_waiting")}
    assert value["strata_kv_usage_ratio"] == pytest.approx(
        1 - value["strata_kv_blocks_free"] / value["strata_kv_blocks_total"])
    assert 0 <= value["strata_kv_usage_ratio"] <= 1
    assert value["strata_kv_block_size_tokens"] == 16
    assert (value["strata_requests_running"], value["strata_requests_waiting"]) == (4, 2)


def test_labelled_counters(families):
    by_reason = {s.labels["finish_reason"]: s.value for s in samples(families["strata_requests"])}
    assert by_reason == {"stop": 1, "length": 1, "abort": 0}


@pytest.mark.parametrize("name", [n for n, t in EXPECTED_TYPES.items() if t == "histogram"])
def test_histograms_are_cumulative_and_end_at_their_count(families, name):
    family = families[name]
    buckets = sorted((float(s.labels["le"]), s.value) for s in samples(family, name + "_bucket"))
    assert buckets[-1][0] == math.inf
    assert len(buckets) >= 10, "too few buckets to read latencies or sizes from"
    counts = [count for _, count in buckets]
    assert counts == sorted(counts)
    assert counts[-1] == samples(family, name + "_count")[0].value > 0
    assert samples(family, name + "_sum")[0].value > 0
