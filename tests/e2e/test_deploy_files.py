"""The files in deploy/: the Grafana dashboard is valid JSON whose panels all query Prometheus, the Prometheus
configuration passes `promtool check config`, and the systemd unit has the keys operators rely on (and passes
`systemd-analyze verify` where it exists). The queries themselves run against a real Prometheus in
test_prometheus_scrape.py.

These tests start no server (the session's `strata serve` is not needed).
"""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONFIG = ROOT / "configs" / "smollm2-cpu.yaml"
DASHBOARD = DEPLOY / "grafana" / "strata-dashboard.json"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
UNIT = DEPLOY / "systemd" / "strata.service"
ROUTER_UNITS = {"route": DEPLOY / "systemd" / "strata-router.service",
                "serve": DEPLOY / "systemd" / "strata-replica@.service"}


def _dashboard():
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows keep their panels inside


def _exprs(panel):
    return [t.get("expr", "") for t in panel.get("targets", [])]


def test_dashboard_panels_all_query_prometheus():
    dashboard = _dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41, dashboard["schemaVersion"]
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"

    panels = [p for p in _panels(dashboard) if p["type"] != "row"]
    assert len(panels) >= 10
    ids = [p["id"] for p in _panels(dashboard)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    for panel in panels:
        title = panel.get("title")
        assert title, panel
        assert panel.get("targets"), f"panel {title!r} has no targets"
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), title
        assert panel["datasource"]["uid"] == "${datasource}", f"panel {title!r} does not use the datasource variable"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"panel {title!r}: refIds repeat: {ref_ids}"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", title
            assert re.search(r"\bstrata_[a-z_]+", target.get("expr", "")), f"panel {title!r}: {target}"
            assert target["expr"].count("(") == target["expr"].count(")"), f"panel {title!r}: {target['expr']}"


def test_dashboard_has_the_panels_design_md_promises():
    panels = [p for p in _panels(_dashboard()) if p["type"] != "row"]

    def find(kind, *metrics):
        found = [p for p in panels if p["type"] == kind and all(m in " ".join(_exprs(p)) for m in metrics)]
        assert found, f"no {kind} panel queries {metrics}"
        return found[0]

    heatmap = find("heatmap", "strata_kv_layer_tokens")
    assert "by (layer)" in heatmap["targets"][0]["expr"] and heatmap["targets"][0]["legendFormat"] == "{{layer}}"
    assert heatmap["options"]["calculate"] is False, "the layer is the y bucket: Grafana must not re-bucket values"
    find("bargauge", "strata_kv_layer_bytes", "strata_kv_layer_uncompressed_bytes")
    find("timeseries", "strata_kv_saved_bytes")
    find("timeseries", "strata_kv_usage_ratio", "strata_kv_blocks_free")
    find("timeseries", "strata_requests_running", "strata_requests_waiting")
    find("timeseries", "rate(strata_prompt_tokens_total", "rate(strata_generation_tokens_total")
    find("timeseries", "strata_preemptions_total")
    find("timeseries", "strata_request_errors_total")
    # The router row (strata route's own series).
    find("timeseries", "strata_router_requests_total", "strata_router_retries_total")
    find("timeseries", "strata_router_prefix_hit_tokens_total", "strata_router_prompt_tokens_total")
    find("timeseries", "strata_router_upstream_first_byte_seconds_bucket")
    find("timeseries", "strata_router_replica_healthy", "strata_router_replica_in_flight")
    for histogram in ("strata_time_to_first_token_seconds", "strata_inter_token_latency_seconds",
                      "strata_e2e_request_latency_seconds"):
        exprs = " ".join(_exprs(find("timeseries", f"{histogram}_bucket")))
        for q in ("0.5", "0.95", "0.99"):
            assert f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket" in exprs, (histogram, q)


def test_prometheus_config():
    text = PROMETHEUS_CONFIG.read_text(encoding="utf-8")
    # Minimal checks that need no YAML parser: the job, its interval, the path.
    job = re.search(r"^\s*-\s*job_name:\s*[\"']?strata[\"']?\s*$", text, re.M)
    assert job, "no scrape job named strata"
    job_block = text[job.start():]
    assert re.search(r"^\s+scrape_interval:\s*5s\b", job_block, re.M), "the strata job should scrape every 5 s"
    assert re.search(r"^\s+metrics_path:\s*/metrics\s*$", job_block, re.M)
    assert re.search(r"^\s+-\s*[\w.-]+:\d+", job_block, re.M), "no host:port target"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is missing (Debian package prometheus, installed by tools/setup.sh): "
                    "only the minimal checks ran")
    result = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _unit_sections(text):
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"not a key=value line in a section: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_systemd_unit_keys():
    sections = _unit_sections(UNIT.read_text(encoding="utf-8"))
    assert {"Unit", "Service", "Install"} <= set(sections), sections.keys()
    service = {k: v[-1] for k, v in sections["Service"].items()}
    assert service["Type"] == "simple"
    exec_start = service["ExecStart"].split()
    assert exec_start[0].startswith("/") and exec_start[0].endswith("/strata"), exec_start
    assert exec_start[1] == "serve" and "--config" in exec_start, exec_start
    assert exec_start[exec_start.index("--config") + 1].startswith("/"), "systemd needs an absolute config path"
    assert service["Restart"] == "on-failure"
    assert service["User"] and service["User"] != "root"
    assert int(service["LimitNOFILE"]) >= 4096
    assert service["KillSignal"] == "SIGTERM"  # strata drains on it (serve_command.cpp)
    stop = re.fullmatch(r"(\d+)(s|min)?", service["TimeoutStopSec"])
    assert stop, service["TimeoutStopSec"]
    stop_s = int(stop.group(1)) * (60 if stop.group(2) == "min" else 1)
    drain_s = int(re.search(r"^  drain_timeout_s: (\d+)", CONFIG.read_text(), re.M).group(1))
    assert stop_s > drain_s, "systemd would SIGKILL the server before its drain can end"
    assert "PrivateDevices" not in service, "PrivateDevices hides the GPUs"
    assert sections["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.parametrize("command", sorted(ROUTER_UNITS))
def test_router_and_replica_units(command):
    sections = _unit_sections(ROUTER_UNITS[command].read_text(encoding="utf-8"))
    service = {k: v[-1] for k, v in sections["Service"].items()}
    exec_start = service["ExecStart"].split()
    assert exec_start[0] == "/opt/strata/build/strata" and exec_start[1] == command, exec_start
    assert exec_start[exec_start.index("--config") + 1].startswith("/etc/strata/"), exec_start
    if command == "serve":
        assert exec_start[exec_start.index("--port") + 1] == "%i", "the instance name is the replica's port"
    assert service["KillSignal"] == "SIGTERM" and service["Restart"] == "on-failure"
    assert service["User"] != "root" and int(service["LimitNOFILE"]) >= 4096
    drain_s = int(re.search(r"^  drain_timeout_s: (\d+)", CONFIG.read_text(), re.M).group(1))
    assert int(service["TimeoutStopSec"]) > drain_s
    assert sections["Install"]["WantedBy"] == ["multi-user.target"]


def test_systemd_analyze_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing")
    # verify insists that ExecStart's binary exists: point it at one that does (the unit's path is /opt/strata/...).
    binary = shutil.which("true") or "/bin/true"
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={binary}", UNIT.read_text(encoding="utf-8"), flags=re.M)
    unit = tmp_path / "strata.service"
    unit.write_text(text, encoding="utf-8")
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    messages = "\n".join(line for line in (result.stdout + result.stderr).splitlines()
                         if str(unit) in line or "strata.service" in line)
    assert result.returncode == 0, result.stdout + result.stderr
    # Unknown keys and bad values are only warnings, with exit status 0: fail on them too.
    assert not messages, messages
