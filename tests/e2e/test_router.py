"""strata route over real replicas (strata serve processes on the real model):
- completions and chat, whole and streamed, /v1/models and the tokenizer's routes answer through the router as
  they do from a replica (the official openai client);
- a document asked twice goes to the replica that cached it (the replicas' own prefix-cache metrics say so);
- API keys are checked at the router;
- a replica killed with SIGKILL: the stream it was writing ends with an error event, the requests after it still
  succeed, and the router's /health shows it out within 2 s and back once it is restarted;
- a replica that drops a request before answering (a stand-in that answers its health checks and closes every
  other connection: a crash at the wrong moment, on demand) leaves the request to the next replica;
- a draining replica is taken out; the router itself drains on SIGTERM;
- a configuration without replicas, a bad URL and a bad policy are refused with the key named."""
import json
import signal
import socketserver
import subprocess
import threading
import time
import uuid

import openai
import pytest
import requests

from serve_process import ServeProcess, strata_binary
from support import ROOT, CompletionCall, metric, metrics

MODEL = "SmolLM2-135M-Instruct"
REPLICA_SETTINGS = ["engine.threads=1", "kv_cache.memory_mib=64", "server.drain_timeout_s=30"]
ROUTER_SETTINGS = ["router.health_interval_ms=200", "router.health_timeout_ms=500"]
HEALTH_BOUND_S = 2.0


def start_replicas(n, name="replica"):
    replicas = [ServeProcess(REPLICA_SETTINGS, name=f"{name} {i}") for i in range(n)]
    return [r.wait_ready() for r in replicas]


def start_router(replicas, *extra_args, overrides=()):
    args = [a for r in replicas for a in ("--replica", r.base_url)] + list(extra_args)
    router = ServeProcess([*ROUTER_SETTINGS, *overrides], name="strata route", extra_args=args, command="route")
    return router.wait_ready(timeout_s=30)


def stop_all(processes):
    for p in processes:
        p.stop()


def document():
    text = (ROOT / "tests" / "fixtures" / "texts" / "the_keepers_ledger.txt").read_text(encoding="utf-8")
    return f"[{uuid.uuid4().hex}]\n" + text[:1500]  # a tag of its own: no earlier request cached it


def complete(base_url, prompt, max_tokens=8, **fields):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **fields}
    return requests.post(f"{base_url}/v1/completions", json=body, timeout=120)


def replica_health(router):
    return {r["url"]: r for r in requests.get(f"{router.base_url}/health", timeout=5).json()["replicas"]}


def wait_for(condition, bound_s, what):
    """Seconds until condition() held; fails after bound_s."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < bound_s, f"{what}: not within {bound_s} s"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def cluster():
    replicas = start_replicas(2)
    router = start_router(replicas)
    yield router, replicas
    stop_all([router, *replicas])


def test_completions_and_chat_whole_and_streamed(cluster):
    router, _ = cluster
    client = openai.OpenAI(base_url=f"{router.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    whole = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert whole.choices[0].text and whole.usage.completion_tokens == 6
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True) if c.choices)
    assert streamed == whole.choices[0].text, "the same greedy answer, whichever replica gave it"
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi"}],
                                          max_tokens=5, temperature=0)
    assert chat.choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hi"}],
                                                 max_tokens=5, temperature=0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content


def test_models_and_the_tokenizer_routes(cluster):
    router, replicas = cluster
    models = openai.OpenAI(base_url=f"{router.base_url}/v1", api_key="unused", max_retries=0).models.list()
    assert [m.id for m in models.data] == [MODEL]
    tokens = requests.post(f"{router.base_url}/tokenize", json={"model": MODEL, "prompt": "Hello world"}, timeout=30)
    direct = requests.post(f"{replicas[0].base_url}/tokenize", json={"model": MODEL, "prompt": "Hello world"},
                           timeout=30)
    assert tokens.status_code == 200 and tokens.json() == direct.json()
    unknown = complete(router.base_url, "hi", model="no-such-model")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_a_document_asked_twice_goes_to_the_replica_that_cached_it(cluster):
    router, replicas = cluster
    doc = document()
    before = [metric(metrics(r.base_url), "strata_prefix_cache_hits_total") for r in replicas]
    router_before = metric(metrics(router.base_url), "strata_router_prefix_hit_tokens_total")
    for question in ("Who keeps the ledger?", "What is written first?", "When is it closed?"):
        response = complete(router.base_url, f"{doc}\nQuestion: {question}\nAnswer:")
        assert response.status_code == 200, response.text
    gained = [metric(metrics(r.base_url), "strata_prefix_cache_hits_total") - b for r, b in zip(replicas, before)]
    # Both later questions found the document on the replica that prefilled it: about 2 x 300 tokens there, none on
    # the other.
    assert max(gained) >= 2 * 280 and min(gained) == 0, gained
    estimated = metric(metrics(router.base_url), "strata_router_prefix_hit_tokens_total") - router_before
    assert estimated >= 2 * 280, estimated


def test_health_and_metrics_of_the_router(cluster):
    router, replicas = cluster
    health = requests.get(f"{router.base_url}/health", timeout=5).json()
    assert health["status"] == "ok" and health["policy"] == "cache_aware"
    assert [r["url"] for r in health["replicas"]] == [r.base_url for r in replicas]
    assert all(r["in_service"] and r["status"] == "ok" for r in health["replicas"])
    assert complete(router.base_url, "Hello").status_code == 200
    samples = metrics(router.base_url)
    urls = [r.base_url for r in replicas]
    assert sum(v for labels, v in samples["strata_router_requests_total"].items()
               if dict(labels)["replica"] in urls and dict(labels)["status"] == "200") >= 1
    for url in urls:
        assert metric(samples, "strata_router_replica_healthy", replica=url) == 1
    assert sum(metric(samples, "strata_router_upstream_first_byte_seconds_count", replica=u) for u in urls) >= 1


def test_api_keys_are_checked_at_the_router(cluster):
    _, replicas = cluster
    router = start_router(replicas, "--api-key", "sk-router-test")
    try:
        refused = complete(router.base_url, "Hello")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        accepted = requests.post(f"{router.base_url}/v1/completions",
                                 headers={"Authorization": "Bearer sk-router-test"},
                                 json={"model": MODEL, "prompt": "Hello", "max_tokens": 4}, timeout=60)
        assert accepted.status_code == 200, accepted.text
        assert requests.get(f"{router.base_url}/health", timeout=5).status_code == 200, "health needs no key"
    finally:
        router.stop()


def test_a_killed_replica_is_taken_out_and_brought_back():
    replicas = start_replicas(2, name="replica (kill)")
    router = start_router(replicas)
    try:
        stream = CompletionCall(router.base_url, 400, stream=True)
        assert stream.first_event.wait(60) and stream.events, stream.failure
        victim = next(r for r in replicas if replica_health(router)[r.base_url]["in_flight"] == 1)
        victim.process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        stream.join(60)
        assert stream.events[-1] == "[DONE]" and "error" in json.loads(stream.events[-2]), stream.events[-2:]
        for i in range(4):  # none fails, whichever replica the router tries first
            response = complete(router.base_url, f"Count to {i}:")
            assert response.status_code == 200, response.text
        wait_for(lambda: not replica_health(router)[victim.base_url]["in_service"], 5, "taken out")
        assert time.monotonic() - killed_at <= HEALTH_BOUND_S + 1.0  # the requests above took some of it
        restarted = ServeProcess(REPLICA_SETTINGS, name="replica (restarted)", port=victim.port).wait_ready()
        replicas[replicas.index(victim)] = restarted
        back_s = wait_for(lambda: replica_health(router)[victim.base_url]["in_service"], HEALTH_BOUND_S, "back")
        assert back_s <= HEALTH_BOUND_S
    finally:
        stop_all([router, *replicas])


class DroppingReplica(socketserver.ThreadingTCPServer):
    """Healthy to the health checks; every other request's connection is closed before any answer."""

    daemon_threads = True
    allow_reuse_address = True

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            request_line = self.rfile.readline().decode(errors="replace")
            if request_line.startswith(("GET /health", "GET /metrics")):
                body = b'{"status":"ok"}' if "/health" in request_line else b""
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                                 % (len(body), body))

    def __init__(self):
        super().__init__(("127.0.0.1", 0), self.Handler)
        self.base_url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_a_request_a_replica_drops_before_answering_goes_to_the_next(cluster):
    _, replicas = cluster
    dropping = DroppingReplica()
    router = start_router([dropping, replicas[0]], "--policy", "round_robin")
    try:
        wait_for(lambda: all(r["in_service"] for r in replica_health(router).values()), HEALTH_BOUND_S, "in service")
        assert complete(router.base_url, "Hello").status_code == 200  # round-robin's first turn: the dropping one
        stream = CompletionCall(router.base_url, 8, stream=True)
        stream.join(60)
        assert stream.status == 200 and stream.events[-1] == "[DONE]", (stream.failure, stream.events[-2:])
        samples = metrics(router.base_url)
        assert metric(samples, "strata_router_requests_total", replica=dropping.base_url, status="failed") >= 1
        assert metric(samples, "strata_router_retries_total") >= 1
    finally:
        router.stop()
        dropping.shutdown()


def test_a_draining_replica_is_taken_out():
    replicas = start_replicas(2, name="replica (drain)")
    router = start_router(replicas)
    try:
        draining = replicas[1]
        stream = CompletionCall(draining.base_url, 500, stream=True)  # keeps the replica draining for a while
        assert stream.first_event.wait(60)
        draining.process.send_signal(signal.SIGTERM)
        start = time.monotonic()
        wait_for(lambda: replica_health(router)[draining.base_url]["status"] == "draining", HEALTH_BOUND_S, "draining")
        assert time.monotonic() - start <= HEALTH_BOUND_S
        for i in range(3):
            response = complete(router.base_url, f"Name a color, {i}:")
            assert response.status_code == 200, response.text
        stream.join(60)
        assert stream.events[-1] == "[DONE]"
    finally:
        stop_all([router, *replicas])


def test_the_router_drains_on_sigterm(cluster):
    _, replicas = cluster
    router = start_router(replicas)
    try:
        stream = CompletionCall(router.base_url, 400, stream=True)
        assert stream.first_event.wait(60)
        router.process.send_signal(signal.SIGTERM)
        wait_for(lambda: requests.get(f"{router.base_url}/health", timeout=5).status_code == 503, 2, "draining")
        refused = complete(router.base_url, "Hello")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        stream.join(60)
        assert stream.status == 200 and stream.events[-1] == "[DONE]", stream.events[-2:]
        assert all("error" not in json.loads(e) for e in stream.events[:-1])
        assert router.process.wait(timeout=30) == 0
    finally:
        router.stop()


@pytest.mark.parametrize("args, expected", [
    ([], "router.replicas: no replica"),
    (["--replica", "https://127.0.0.1:1"], "router.replicas: replica 'https://127.0.0.1:1': not an http:// URL"),
    (["--replica", "http://127.0.0.1:1", "--policy", "random"], "router.policy: expected one of cache_aware"),
])
def test_bad_configurations_are_refused_with_the_key_named(args, expected):
    result = subprocess.run([str(strata_binary()), "route", "--config", str(ROOT / "configs" / "smollm2-cpu.yaml"),
                             *args], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr
