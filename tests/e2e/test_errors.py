"""Bad requests get the right status and an OpenAI error body {"error": {"message", "type", "param", "code"}}, and
the server keeps serving afterwards."""
import concurrent.futures
import socket
import time

import pytest
import requests

from serve_process import ServeProcess
from support import error_of

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


def post(server, path, **kwargs):
    return requests.post(f"{server.base_url}{path}", timeout=60, **kwargs)


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_malformed_json(server, path):
    error = error_of(post(server, path, data=b'{"prompt": "hi", "max_tokens": ',
                          headers={"content-type": "application/json"}), 400)
    assert error["type"] == "invalid_request_error"


def test_body_that_is_not_an_object(server):
    error_of(post(server, COMPLETIONS, json=["hi"]), 400)


@pytest.mark.parametrize("path,body,param", [
    (COMPLETIONS, {"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    (COMPLETIONS, {"prompt": 42}, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "temperature": "hot"}, "temperature"),
    (COMPLETIONS, {"prompt": "hi", "stream": "yes"}, "stream"),
    (COMPLETIONS, {"prompt": "hi", "n": 1.5}, "n"),
    (COMPLETIONS, {"prompt": "hi", "stop": 3}, "stop"),
    (CHAT, {"messages": "hello"}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}], "logprobs": 3}, "logprobs"),
])
def test_wrong_types_name_the_field(server, path, body, param):
    error = error_of(post(server, path, json=body), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error


@pytest.mark.parametrize("path,body", [
    (COMPLETIONS, {"prompt": "hi"}),
    (CHAT, {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_unknown_model(server, path, body):
    error = error_of(post(server, path, json={"model": "gpt-17-ultra", **body}), 404)
    assert error["param"] == "model"
    assert error["code"] == "model_not_found"


@pytest.mark.parametrize("max_tokens", [-1, 0, 10**9, 2**70])
def test_max_tokens_out_of_range(server, max_tokens):
    error = error_of(post(server, COMPLETIONS, json={"prompt": "hi", "max_tokens": max_tokens}), 400)
    assert error["param"] == "max_tokens"


def test_max_completion_tokens_out_of_range_in_chat(server):
    error = error_of(post(server, CHAT, json={"messages": [{"role": "user", "content": "hi"}],
                                              "max_completion_tokens": -5}), 400)
    assert error["param"] == "max_completion_tokens"


@pytest.fixture(scope="module")
def context_tokens(server, model_name):
    models = requests.get(f"{server.base_url}/v1/models", timeout=30).json()
    return models["data"][0]["max_model_len"]


def test_prompt_longer_than_the_context(server, context_tokens):
    # " hello" is one token, so this is context + 10 tokens of text.
    error = error_of(post(server, COMPLETIONS, json={"prompt": " hello" * (context_tokens + 10), "max_tokens": 1}),
                     400)
    assert error["param"] == "prompt"
    error = error_of(post(server, COMPLETIONS, json={"prompt": [198] * (context_tokens + 10), "max_tokens": 1}), 400)
    assert error["param"] == "prompt"


def test_prompt_plus_max_tokens_beyond_the_context(server, context_tokens):
    error = error_of(post(server, COMPLETIONS, json={"prompt": [198] * (context_tokens - 10), "max_tokens": 20}),
                     400)
    assert error["param"] == "max_tokens"


def test_token_id_outside_the_vocabulary(server):
    error = error_of(post(server, COMPLETIONS, json={"prompt": [1, 2, 10**7], "max_tokens": 1}), 400)
    assert error["param"] == "prompt"


def test_oversized_body(server):
    # Announce a body far above server.max_body_bytes and send only the headers: the server must refuse from the
    # Content-Length alone, without waiting for (or reading) the body.
    length = 64 << 20
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall((f"POST {COMPLETIONS} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {length}\r\n\r\n").encode("ascii"))
        reply = b""
        while b"\r\n\r\n" not in reply:
            data = sock.recv(65536)
            assert data, f"connection closed without a response: {reply!r}"
            reply += data
    status_line = reply.split(b"\r\n", 1)[0]
    assert status_line.split()[1] == b"413", reply[:500]


def test_oversized_body_sent_whole(server):
    response = post(server, COMPLETIONS, data=b'{"prompt": "' + b"a" * (6 << 20) + b'"}',
                    headers={"content-type": "application/json"})
    assert error_of(response, 413)["type"] == "invalid_request_error"


def test_unknown_route(server):
    error_of(requests.get(f"{server.base_url}/v1/engines", timeout=30), 404)
    error_of(post(server, "/v2/completions", json={"prompt": "hi"}), 404)


@pytest.mark.parametrize("method,path", [("GET", COMPLETIONS), ("GET", CHAT), ("POST", "/v1/models"),
                                         ("DELETE", "/health")])
def test_wrong_method(server, method, path):
    response = requests.request(method, f"{server.base_url}{path}", timeout=30)
    error_of(response, 405)
    assert "allow" in {k.lower() for k in response.headers}, response.headers


def test_server_still_serves_after_bad_requests(server, client, model_name):
    server.assert_alive()
    assert requests.get(f"{server.base_url}/health", timeout=30).status_code == 200
    response = client.completions.create(model=model_name, prompt="Hello", max_tokens=2, temperature=0)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 2


def test_a_full_queue_answers_503_overloaded_and_serves_on():
    """engine.max_waiting 1 and max_running 1: one request runs, one waits, a third is refused with the code a
    client retries on (routing/ decides it from the engine's typed refusal); the first two still finish."""
    small = ServeProcess(["engine.max_waiting=1", "engine.max_running=1"], "strata serve (a queue of one)")
    try:
        small.wait_ready()
        body = {"model": "SmolLM2-135M-Instruct", "prompt": "Count to a thousand:", "max_tokens": 600,
                "ignore_eos": True, "temperature": 0}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = pool.submit(post, small, COMPLETIONS, json=body)
            time.sleep(0.3)
            waiting = pool.submit(post, small, COMPLETIONS, json=body)
            time.sleep(0.3)
            refused = error_of(post(small, COMPLETIONS, json={**body, "max_tokens": 4}), 503)
            assert refused["code"] == "overloaded" and "queue is full" in refused["message"], refused
            assert running.result().status_code == 200
            assert waiting.result().status_code == 200
    finally:
        small.stop()
