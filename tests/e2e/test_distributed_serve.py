"""`strata serve` as a world of mpirun ranks (docs/distributed.md), driven over HTTP:

- a TP=3 x PP=2 world answers greedy completions with the reference tokens (transformers' greedy continuation,
  tests/fixtures/reference), serves concurrent streams, and exports the per-layer KV gauges of all six ranks on the
  leader's /metrics with their pp_stage and tp_rank labels;
- structured output in that world: a schema's document is the one a single process writes;
- prefix caching in that world: a document's second question starts from the blocks its first one published on
  every rank, and is answered with the tokens one process without the cache generates, with `full` and with
  PyramidKV (which starts from copies), and from the compressed document Expected Attention published;
- a rank that dies (SIGKILL) or stops answering (SIGSTOP) mid-request: the client gets an error, and every process
  of the world is gone within FAILURE_BOUND_S, with a message naming the rank.
"""
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import openai
import pytest
import requests

from distributed_world import CONFIG, COMMON_SETTINGS, command, generate, world_env
from support import (check_greedy_against_reference, completion_logprob_ids, free_port, load_reference, metric,
                     metrics, wait_until_ready)
from support import ROOT

N_LAYERS = 30
STARTUP_TIMEOUT_S = 180
# A dead rank: mpirun notices at once and ends the world (SIGTERM, then SIGKILL a second later). A silent rank: the
# leader's deadline (parallel.timeout_s below) plus the shutdown's grace and drain.
FAILURE_TIMEOUT_S = 4
FAILURE_BOUND_S = 20


class World:
    def __init__(self, tp, pp, settings=(), launcher=None):
        """launcher(port): the command line; default: mpirun as distributed_world.command makes it."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkdtemp(prefix="strata-world-")) / "serve.log"
        cmd = launcher(self.port) if launcher else command("serve", tp, pp, ["--port", str(self.port)], settings)
        with open(self.log_path, "wb") as log:
            # A session of its own: the test can check that every process of the world is gone.
            self.process = subprocess.Popen(cmd, cwd=ROOT, env=world_env(), stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_until_ready(self.process, f"{self.base_url}/health", "strata world", STARTUP_TIMEOUT_S, self.log_tail,
                         interval_s=0.5)

    def log_tail(self, n=6000):
        return self.log_path.read_bytes()[-n:].decode("utf-8", errors="replace")

    def rank_pids(self):
        """{world rank: pid} of the strata processes mpirun started (from their environment)."""
        pids = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getsid(int(entry.name)) != self.process.pid:
                    continue
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except (OSError, ProcessLookupError):
                continue
            if b"strata" not in cmdline.split(b"\0")[0]:
                continue
            for var in environ:
                if var.startswith(b"OMPI_COMM_WORLD_RANK="):
                    pids[int(var.split(b"=")[1])] = int(entry.name)
        return pids

    def session_alive(self):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.getsid(int(entry.name)) == self.process.pid:
                        return True
                except (OSError, ProcessLookupError):
                    pass
        return False

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture(scope="module")
def world():
    w = World(3, 2)
    try:
        yield w
    finally:
        w.stop()


def test_greedy_completion_matches_the_reference(world):
    reference = load_reference("code_digits")
    client = openai.OpenAI(base_url=f"{world.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    response = client.completions.create(model=model, prompt=reference["text"], max_tokens=16, logprobs=3,
                                         temperature=0)
    ids = completion_logprob_ids(response.choices[0])
    assert len(ids) == 16
    check_greedy_against_reference(ids, reference, "TP=3 x PP=2 completions code_digits")


@pytest.mark.parametrize("policy", ["full", "pyramidkv:budget=96"])
def test_a_cached_prefix_in_a_world_answers_what_one_process_answers_without_it(world, policy):
    """With `full` the blocks are shared; PyramidKV rewrites its entries once the prompt is in, so its sequence
    starts from copies of the cached blocks (cache/prefix_reuse.h) and must still answer as one process does."""
    text = (ROOT / "tests" / "fixtures" / "texts" / "how_clocks_keep_time.txt").read_text(encoding="utf-8")
    document = f"[world {time.time_ns()}]\n" + text[:900]
    name, _, budget = policy.partition(":budget=")
    extra = {"kv_compression": {"policy": name, "budget": int(budget)}} if budget else {}
    client = openai.OpenAI(base_url=f"{world.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    first = client.completions.create(model=model, prompt=document + "\nQuestion: what is a clock?\nAnswer:",
                                      max_tokens=4, temperature=0, extra_body=extra)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    question = document + "\nQuestion: why does a pendulum keep time?\nAnswer:"
    second = client.completions.create(model=model, prompt=question, max_tokens=12, logprobs=1, temperature=0,
                                       extra_body=extra)
    assert second.usage.prompt_tokens_details.cached_tokens >= 160, second.usage
    got = completion_logprob_ids(second.choices[0])
    alone = generate(1, 1, ["--prompt", question, "--max-tokens", "12"],
                     ["kv_cache.prefix_caching=off", f"kv_cache.policy={policy}"])
    for step, (g, w) in enumerate(zip(got, alone)):
        if g != w["token"]:
            margin = w["top"][0][1] - w["top"][1][1]
            assert margin < 1e-3, f"step {step}: token {g}, one process {w['token']} (margin {margin:.3g})"
            break
    assert got, "no tokens"


@pytest.mark.parametrize("policy", ["expected_attention", "kvzip"])
def test_a_shared_compressed_document_in_a_world_answers_what_one_process_answers(policy):
    """[shared-compressed]: under a query-agnostic policy (Expected Attention, KVzip) with chunked prefill, a
    document's second question starts from the compressed blocks its first one published on every rank of TP=3 x
    PP=2 (its cached tokens are its prompt's last compression point), and is answered with the tokens one process
    without the cache generates."""
    chunked = ["kv_cache.prefill_compression=chunked", "kv_cache.prefill_chunk=64"]
    text = (ROOT / "tests" / "fixtures" / "texts" / "how_clocks_keep_time.txt").read_text(encoding="utf-8")
    document = text[:900]
    question = document + "\nQuestion: why does a pendulum keep time?\nAnswer:"
    w = World(3, 2, chunked)
    try:
        client = openai.OpenAI(base_url=f"{w.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        extra = {"kv_compression": {"policy": policy, "budget": 64}, "ignore_eos": True}
        first = client.completions.create(model=model, prompt=document + "\nQuestion: what is a clock?\nAnswer:",
                                          max_tokens=4, temperature=0, extra_body=extra)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        second = client.completions.create(model=model, prompt=question, max_tokens=12, logprobs=1, temperature=0,
                                           extra_body=extra)
        n_prompt = second.usage.prompt_tokens
        assert second.usage.prompt_tokens_details.cached_tokens == (n_prompt - 1) // 64 * 64, second.usage
        got = completion_logprob_ids(second.choices[0])
    finally:
        w.stop()
    alone = generate(1, 1, ["--prompt", question, "--max-tokens", "12", "--ignore-eos"],
                     ["kv_cache.prefix_caching=off", f"kv_cache.policy={policy}:budget=64"] + chunked)
    for step, (g, a) in enumerate(zip(got, alone)):
        if g != a["token"]:
            margin = a["top"][0][1] - a["top"][1][1]
            assert margin < 1e-3, f"step {step}: token {g}, one process {a['token']} (margin {margin:.3g})"
            break
    assert len(got) == 12


def test_concurrent_streams_and_a_batch_each_get_what_they_get_alone(world):
    client = openai.OpenAI(base_url=f"{world.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    prompts = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=10, temperature=0).choices[0].text
             for p in prompts]
    streams = [client.completions.create(model=model, prompt=p, max_tokens=10, temperature=0, stream=True)
               for p in prompts]
    together = ["".join(chunk.choices[0].text for chunk in s if chunk.choices) for s in streams]
    assert together == alone
    batch = client.completions.create(model=model, prompt=prompts, max_tokens=10, temperature=0)
    assert [c.text for c in sorted(batch.choices, key=lambda c: c.index)] == alone


def test_a_schema_in_a_world_answers_what_one_process_answers(world, client):
    """Structured output under TP x PP: the leader computes each step's token mask and sends it with the plan
    (docs/decisions.md [structured-output]); the last stage's ranks sample under it. Greedy, the world writes the
    document one process writes, up to a near-tie of the two best allowed tokens."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "population": {"type": "integer", "minimum": 0}},
              "required": ["city", "population"]}
    request = {"messages": [{"role": "user", "content": "The largest city of France, as JSON."}], "max_tokens": 60,
               "temperature": 0, "logprobs": True, "top_logprobs": 2,
               "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}}
    world_client = openai.OpenAI(base_url=f"{world.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    model = world_client.models.list().data[0].id
    in_world = world_client.chat.completions.create(model=model, **request).choices[0]
    alone = client.chat.completions.create(model=model, **request).choices[0]
    assert in_world.finish_reason == "stop"
    document = json.loads(in_world.message.content)
    assert set(document) == {"city", "population"}
    for step, (w, a) in enumerate(zip(in_world.logprobs.content, alone.logprobs.content)):
        if w.token != a.token:
            margin = a.top_logprobs[0].logprob - a.top_logprobs[1].logprob
            assert margin < 1e-3, f"step {step}: {w.token!r} in the world, {a.token!r} alone (margin {margin:.3g})"
            return
    assert in_world.message.content == alone.message.content


def test_metrics_carry_every_rank_and_kv_state_every_layer(world):
    samples = metrics(world.base_url)
    for stage, layers in ((0, range(0, 15)), (1, range(15, 30))):
        for tp_rank in range(3):
            for layer in layers:
                assert metric(samples, "strata_kv_layer_bytes", layer=layer, pp_stage=stage, tp_rank=tp_rank) >= 0
    labelled = {dict(k)["pp_stage"] + "/" + dict(k)["tp_rank"] for k in samples["strata_kv_layer_tokens"]}
    assert labelled == {f"{s}/{t}" for s in range(2) for t in range(3)}
    state = requests.get(f"{world.base_url}/v1/kv_state", timeout=30).json()
    assert sorted(layer["layer"] for layer in state["layers"]) == list(range(N_LAYERS))
    assert (state["tp"], state["pp"]) == (3, 2)
    ranks = sorted((r["pp_stage"], r["tp_rank"]) for r in state["ranks"])
    assert ranks == [(s, t) for s in range(2) for t in range(3)]
    assert requests.get(f"{world.base_url}/health", timeout=30).status_code == 200


def stream_until_first_token(world):
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "Tell me a long story about a lighthouse keeper.", "max_tokens": 2000,
            "temperature": 0, "ignore_eos": True, "stream": True}
    response = requests.post(f"{world.base_url}/v1/completions", json=body, stream=True, timeout=60)
    assert response.status_code == 200, response.text[:500]
    lines = response.iter_lines()
    while not next(lines).startswith(b"data: {"):
        pass
    return response, lines


def read_rest(lines):
    """What the stream still sends: the SSE data lines, or the connection error that cut it."""
    events = []
    try:
        for line in lines:
            if line.startswith(b"data: "):
                events.append(line[6:].decode("utf-8", errors="replace"))
    except requests.RequestException as e:
        events.append(f"connection error: {e}")
    return events


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_failed_rank_fails_the_request_and_ends_the_world(how):
    w = World(1, 2, [f"parallel.timeout_s={FAILURE_TIMEOUT_S}"])
    try:
        pids = w.rank_pids()
        assert sorted(pids) == [0, 1], pids
        response, lines = stream_until_first_token(w)
        failed_at = time.monotonic()
        os.kill(pids[1], signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        rest = read_rest(lines)
        # The stream ends in an error, never in a normal finish.
        assert rest, "the stream ended without a word"
        assert "[DONE]" not in rest[-1] or any('"error"' in e for e in rest), rest[-3:]
        assert any('"error"' in e or e.startswith("connection error") for e in rest), rest[-3:]
        if how == "stopped":  # the leader's watchdog names the silent rank in the error the client gets
            assert any("rank 1 (pp_stage 1, tp_rank 0)" in e for e in rest), rest[-3:]
        w.process.wait(timeout=FAILURE_BOUND_S)
        while w.session_alive():
            assert time.monotonic() - failed_at < FAILURE_BOUND_S, f"processes left:\n{w.log_tail()}"
            time.sleep(0.2)
        assert time.monotonic() - failed_at < FAILURE_BOUND_S
        assert w.process.returncode != 0
        assert "rank 1" in w.log_tail(), w.log_tail()
    finally:
        w.stop()


def test_the_deploy_launch_script_starts_a_world():
    """deploy/mpi/strata-mpirun.sh (it finds the binary through STRATA_BIN, as the tests do)."""
    def launcher(port):
        settings = [arg for s in COMMON_SETTINGS for arg in ("--set", s)]
        return [str(ROOT / "deploy" / "mpi" / "strata-mpirun.sh"), "--config", str(CONFIG), "--tp", "1", "--pp", "2",
                "--", "--port", str(port), *settings]

    w = World(1, 2, launcher=launcher)
    try:
        assert sorted(w.rank_pids()) == [0, 1]
        state = requests.get(f"{w.base_url}/v1/kv_state", timeout=30).json()
        assert (state["tp"], state["pp"]) == (1, 2)
    finally:
        w.stop()


def drain_world(tp, pp):
    return World(tp, pp, ["server.drain_timeout_s=120"])


# SmolLM2's 9 heads divide among 3 tensor ranks, not 2: the two-rank world is a pipeline.
@pytest.mark.parametrize("how,tp,pp", [("SIGUSR1 to mpirun", 3, 1), ("SIGTERM to rank 0", 1, 2)])
def test_a_drain_finishes_the_stream_in_flight_and_the_whole_world_exits_0(how, tp, pp):
    """The two ways to drain a world (docs/decisions.md): mpirun forwards SIGUSR1 to every rank at once (the worker
    ranks ignore it, the leader drains); or the leader gets SIGTERM itself. Either way the leader tells the other
    ranks to stop once the requests in flight are done, and mpirun exits 0."""
    w = drain_world(tp, pp)
    try:
        body = {"model": "SmolLM2-135M-Instruct", "prompt": "Once upon a time", "max_tokens": 48, "temperature": 0,
                "ignore_eos": True, "stream": True}
        response = requests.post(f"{w.base_url}/v1/completions", json=body, stream=True, timeout=120)
        lines = response.iter_lines()
        while not next(lines).startswith(b"data: {"):
            pass
        if how == "SIGUSR1 to mpirun":
            w.process.send_signal(signal.SIGUSR1)
        else:
            os.kill(w.rank_pids()[0], signal.SIGTERM)
        time.sleep(0.3)
        health = requests.get(f"{w.base_url}/health", timeout=30)
        assert health.status_code == 503 and health.json() == {"status": "draining"}, health.text
        refused = requests.post(f"{w.base_url}/v1/completions", json={**body, "stream": False}, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        rest = read_rest(lines)
        assert rest[-1] == "[DONE]" and not any('"error"' in e for e in rest), rest[-3:]
        assert '"finish_reason":"length"' in rest[-2], rest[-2]
        assert w.process.wait(timeout=60) == 0, w.log_tail()
        deadline = time.monotonic() + 20
        while w.session_alive():
            assert time.monotonic() < deadline, f"processes left:\n{w.log_tail()}"
            time.sleep(0.2)
        assert "strata: drained" in w.log_tail()
    finally:
        w.stop()


def test_sigterm_to_mpirun_ends_the_world_without_a_drain():
    """What the documentation warns of: Open MPI's mpirun answers SIGTERM by sending SIGTERM to every rank a second
    later (odls_base_sigkill_timeout) and SIGKILL a second after that, whatever the ranks are doing, so the stream
    in flight is cut. (The leader starts a drain on the first SIGTERM, which mpirun then cuts short.)"""
    w = drain_world(1, 2)
    try:
        response, lines = stream_until_first_token(w)
        signalled_at = time.monotonic()
        w.process.send_signal(signal.SIGTERM)
        rest = read_rest(lines)
        assert any('"error"' in e or e.startswith("connection error") for e in rest), rest[-3:]
        w.process.wait(timeout=FAILURE_BOUND_S)
        assert time.monotonic() - signalled_at < FAILURE_BOUND_S
    finally:
        w.stop()
