"""A real Prometheus server scrapes the session's `strata serve` every second; its HTTP API then answers for the
per-layer KV gauges, the token counters, a latency quantile, and every PromQL expression of the shipped Grafana
dashboard (deploy/grafana/strata-dashboard.json).

Needs the `prometheus` binary (Debian package `prometheus`, installed by tools/setup.sh; PROMETHEUS_BIN overrides).
"""
import json
import math
import os
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from support import ROOT, free_port, stop_process, wait_until_ready

DASHBOARD = ROOT / "deploy" / "grafana" / "strata-dashboard.json"
N_LAYERS = 30  # SmolLM2-135M
SCRAPE_INTERVAL_S = 1
PROMETHEUS_READY_TIMEOUT_S = 30
WAIT_TIMEOUT_S = 30  # for each condition on what Prometheus has scraped
REQUEST_TIMEOUT_S = 60
# What the dashboard's Grafana variables become here: "All" for the label filters, and a rate window of several
# scrapes (Grafana's $__rate_interval is at least four scrape intervals).
GRAFANA_VARIABLES = {"$__rate_interval": "15s", "$__interval": "1s", "$__range": "1m", "$job": ".*",
                     "$instance": ".*", "$tp_rank": ".*"}
# Metrics that are declared but have no series until something happens that this test cannot cause.
MAY_BE_ABSENT = {"strata_request_errors_total",  # a status appears with its first failed request
                 # the router row: strata route's series, which a replica does not have
                 "strata_router_requests_total", "strata_router_retries_total", "strata_router_prefix_hit_tokens_total",
                 "strata_router_prompt_tokens_total", "strata_router_upstream_first_byte_seconds_bucket",
                 "strata_router_replica_healthy", "strata_router_replica_in_flight"}


def _prometheus_binary():
    override = os.environ.get("PROMETHEUS_BIN")
    if override:
        return override if Path(override).exists() else None
    return shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)


class Prometheus:
    def __init__(self, process, port, log_path):
        self.process = process
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    def log_tail(self, n_bytes=4000):
        return self.log_path.read_bytes()[-n_bytes:].decode("utf-8", errors="replace")

    def api(self, path, **params):
        """The data of a /api/v1 answer; fails the test on an error status (a PromQL parse error among them)."""
        assert self.process.poll() is None, f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}"
        response = requests.get(f"{self.base_url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        assert response.status_code == 200 and body.get("status") == "success", (
            f"/api/v1/{path} {params}: HTTP {response.status_code}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def wait_for(self, expr, what, predicate=bool, timeout_s=WAIT_TIMEOUT_S):
        """The result of `expr` once `predicate(result)` holds; fails after timeout_s with the last result."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            assert time.monotonic() < deadline, f"{what}: not seen within {timeout_s} s; {expr} = {result}"
            time.sleep(0.5)


@pytest.fixture
def prometheus(request, tmp_path):
    binary = _prometheus_binary()
    if binary is None:
        pytest.fail("the prometheus binary is missing: run tools/setup.sh (it installs the Debian package "
                    "`prometheus`), or point PROMETHEUS_BIN at one")
    server = request.getfixturevalue("server")  # after the check: no strata start-up when prometheus is missing
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: {SCRAPE_INTERVAL_S}s
  scrape_timeout: {SCRAPE_INTERVAL_S}s
scrape_configs:
  - job_name: strata
    static_configs:
      - targets: ["127.0.0.1:{server.port}"]
""")
    port = free_port()
    log_path = tmp_path / "prometheus.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(process, port, log_path)
    try:
        wait_until_ready(process, f"{prom.base_url}/-/ready", "prometheus", PROMETHEUS_READY_TIMEOUT_S, prom.log_tail)
        # One successful scrape before any request, so that rate() sees the requests' increase.
        prom.wait_for('up{job="strata"} == 1', "a successful scrape of strata")
        yield prom
    finally:
        stop_process(process, timeout_s=10)


def _scalar(result):
    """The value of a one-element instant vector, or None."""
    return float(result[0]["value"][1]) if len(result) == 1 else None


def _hold_kv_until_scraped(server, prom, model_name):
    """A streamed request holds KV from its first token on; keep it open until Prometheus has scraped a layer with
    tokens, then hang up (the server cancels it). Fixed-length requests would race the 1 s scrape."""
    prompt = "Tell me about the history of the mountains and rivers of Europe, one country after the other. " * 4
    with requests.post(f"{server.base_url}/v1/completions", stream=True, timeout=REQUEST_TIMEOUT_S,
                       json={"model": model_name, "prompt": prompt, "max_tokens": 2000, "ignore_eos": True,
                             "temperature": 0, "stream": True}) as response:
        assert response.status_code == 200, response.text
        lines = response.iter_lines()
        while not next(lines).startswith(b"data: {"):
            pass
        prom.wait_for('max(strata_kv_layer_tokens{job="strata"}) > 0', "a layer holding KV tokens")


def _complete(server, model_name, i):
    response = requests.post(f"{server.base_url}/v1/completions", timeout=REQUEST_TIMEOUT_S,
                             json={"model": model_name, "prompt": f"Count to {i + 3}:", "max_tokens": 4,
                                   "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()["usage"]["completion_tokens"]


def _dashboard_targets():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    for panel in panels:
        for target in panel.get("targets", []):
            yield panel["title"], target
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield f"variable {variable['name']}", {"expr": query["query"] if isinstance(query, dict) else query,
                                                  "variable": True}


def _substitute(expr):
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace("${" + name[1:] + "}", GRAFANA_VARIABLES[name]).replace(name, GRAFANA_VARIABLES[name])
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr


def _check_dashboard_expressions(prom):
    checked = 0
    now = time.time()
    for title, target in _dashboard_targets():
        expr = _substitute(target["expr"])
        metrics = set(re.findall(r"\bstrata_[a-z_]+", expr))
        if target.get("variable"):
            # Grafana's label_values(selector, label): the series API with that selector.
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", expr)
            assert match, f"{title}: not a label_values(selector, label) query: {expr}"
            series = prom.api("series", **{"match[]": match.group(1), "start": now - 60, "end": now})
            values = {s.get(match.group(2)) for s in series} - {None}
            assert values, f"{title}: {expr} gives no values"
        elif target.get("instant"):
            result = prom.query(expr)
            assert result or metrics <= MAY_BE_ABSENT, f"{title}: {expr} returns nothing"
        else:
            data = prom.api("query_range", query=expr, start=now - 30, end=now, step=1)
            assert data["result"] or metrics <= MAY_BE_ABSENT, f"{title}: {expr} returns nothing"
        checked += 1
    return checked


def test_prometheus_scrapes_strata(prometheus, server, model_name):
    _hold_kv_until_scraped(server, prometheus, model_name)
    with ThreadPoolExecutor(max_workers=3) as pool:  # batched together by the engine: light on the CPU
        assert sum(pool.map(lambda i: _complete(server, model_name, i), range(3))) > 0

    # Every layer is a series, with the rank labels (and job/instance from Prometheus).
    series = prometheus.wait_for('strata_kv_layer_tokens{job="strata"}', f"{N_LAYERS} layer series",
                                 lambda r: len(r) >= N_LAYERS)
    assert sorted(int(s["metric"]["layer"]) for s in series) == list(range(N_LAYERS))
    for s in series:
        assert set(s["metric"]) == {"__name__", "layer", "pp_stage", "tp_rank", "job", "instance"}, s["metric"]
        assert (s["metric"]["pp_stage"], s["metric"]["tp_rank"]) == ("0", "0"), s["metric"]

    # Some layer held tokens at some scrape (the streamed request above), and the counters moved.
    held = _scalar(prometheus.query('max(max_over_time(strata_kv_layer_tokens{job="strata"}[5m]))'))
    assert held is not None and held > 0, held
    prometheus.wait_for('strata_generation_tokens_total{job="strata"} > 0', "generated tokens")
    prometheus.wait_for('sum(increase(strata_requests_total{job="strata"}[1m])) > 0',
                        "the finished requests counted after a scrape")

    # The TTFT histogram gives a quantile: a number, not NaN (NaN would mean no observation in the window).
    ttft = prometheus.wait_for(
        'histogram_quantile(0.5, sum by (le) (rate(strata_time_to_first_token_seconds_bucket{job="strata"}[1m])))',
        "a TTFT quantile", lambda r: _scalar(r) is not None and not math.isnan(_scalar(r)))
    assert 0 < _scalar(ttft) < REQUEST_TIMEOUT_S, ttft

    # Every expression of the shipped dashboard parses and, except for series that need an error, returns data.
    n_checked = _check_dashboard_expressions(prometheus)
    assert n_checked >= 15, n_checked
