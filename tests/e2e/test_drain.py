"""A graceful drain of the real binary: on SIGTERM it refuses new requests (503 with an error body and a
Retry-After; /health 503 "draining"), lets the requests in flight finish, running and queued, streamed or not, up
to server.drain_timeout_s, ends the rest with an error (an SSE error event for streams, a 503 body otherwise),
then exits 0. A second SIGTERM or SIGINT ends at once."""
import json
import re
import signal
import time

import pytest
import requests

from serve_process import ServeProcess
from support import CompletionCall, error_of, metric, metrics

MODEL = "SmolLM2-135M-Instruct"
EXIT_BOUND_S = 60  # generous: the drains below take seconds


def wait_for_exit(server):
    try:
        return server.process.wait(timeout=EXIT_BOUND_S)
    except Exception:
        pytest.fail(f"strata did not exit after the drain:\n{server.log_tail()}")


@pytest.fixture
def serve():
    servers = []

    def start(*overrides):
        server = ServeProcess(["engine.max_running=2", *overrides], name="strata serve (drain)").wait_ready()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def engine_requests(server):
    samples = metrics(server.base_url)
    return metric(samples, "strata_requests_running") + metric(samples, "strata_requests_waiting")


def test_sigterm_drains_running_and_queued_requests_then_exits_0(serve):
    server = serve("server.drain_timeout_s=120")
    # The long stream runs first; engine.max_running=2: one more runs beside it, and the last two wait in the queue
    # when the signal comes. (Started together, the short ones could run first and be gone before the look below.)
    # It is long enough to outlast the look at /health on a fast machine: at 256 tokens the server once drained
    # and exited before it.
    calls = [CompletionCall(server.base_url, 768, True)]
    assert calls[0].first_event.wait(60) and calls[0].events, "the first stream did not start"
    calls += [CompletionCall(server.base_url, tokens, stream)
              for tokens, stream in ((96, True), (32, False), (32, True))]
    # The others reach the engine a moment later (later still on a loaded machine): signal once three have.
    deadline = time.monotonic() + 60
    in_engine = engine_requests(server)
    while in_engine < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
        in_engine = engine_requests(server)
    assert in_engine >= 3, f"only {in_engine} request(s) reached the engine: {[c.status for c in calls]}"
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)

    health = requests.get(f"{server.base_url}/health", timeout=30)
    assert health.status_code == 503 and health.json() == {"status": "draining"}
    refused = requests.post(f"{server.base_url}/v1/completions", json={"model": MODEL, "prompt": "Hi"}, timeout=30)
    error = error_of(refused, 503)
    assert error["code"] == "draining" and int(refused.headers["Retry-After"]) > 0
    assert refused.headers["Connection"] == "close"
    error_of(requests.get(f"{server.base_url}/v1/models", timeout=30), 503)

    for call, max_tokens in zip(calls, (768, 96, 32, 32)):
        response = call.result()
        assert response.status_code == 200, response.text[:500]
        if call.body["stream"]:
            n_chunks, last = call.streamed_tokens()
            assert last["finish_reason"] == "length" and n_chunks > max_tokens // 2
        else:
            assert response.json()["usage"]["completion_tokens"] == max_tokens
    assert wait_for_exit(server) == 0
    log = server.log_tail()
    in_flight = re.search(r"draining: (\d+) request\(s\) in flight", log)
    assert in_flight and int(in_flight.group(1)) >= 3, log  # the first stream, and at least two queued behind it
    assert "strata: drained" in log, log


def test_what_outlasts_the_drain_timeout_ends_with_an_error(serve):
    server = serve("server.drain_timeout_s=2")
    stream = CompletionCall(server.base_url, 4000, stream=True)
    whole = CompletionCall(server.base_url, 4000, stream=False)
    assert stream.first_event.wait(60) and stream.events
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert wait_for_exit(server) == 0
    assert time.monotonic() - started < 30

    assert stream.result().status_code == 200
    assert stream.events[-1] == "[DONE]"
    error = json.loads(stream.events[-2])["error"]
    assert "shutting down" in error["message"], error
    assert error_of(whole.result(), 503)["type"] == "server_error"
    assert "drain timed out" in server.log_tail()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_ends_at_once(serve, second):
    server = serve("server.drain_timeout_s=300")
    stream = CompletionCall(server.base_url, 4000, stream=True)
    assert stream.first_event.wait(60) and stream.events
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert server.process.poll() is None, "still draining"
    started = time.monotonic()
    server.process.send_signal(second)
    assert wait_for_exit(server) == 0
    assert time.monotonic() - started < 15, "ended at once, not after the drain timeout"
    assert stream.result().status_code == 200
    assert "error" in json.loads(stream.events[-2]), stream.events[-2:]


def test_sigusr1_drains_and_repeating_it_does_not_end_the_drain(serve):
    server = serve("server.drain_timeout_s=120")
    stream = CompletionCall(server.base_url, 64, stream=True)
    assert stream.first_event.wait(60) and stream.events
    server.process.send_signal(signal.SIGUSR1)
    server.process.send_signal(signal.SIGUSR1)  # e.g. mpirun's forward and a supervisor's own
    assert wait_for_exit(server) == 0
    n_chunks, last = stream.streamed_tokens()
    assert last["finish_reason"] == "length" and n_chunks > 32
