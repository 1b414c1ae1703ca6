"""API keys (server.api_keys, server.api_key_file, --api-key) against the real binary: /v1/* needs
`Authorization: Bearer KEY` (401 invalid_api_key otherwise, as the OpenAI API answers), /health never does, /metrics
only with server.metrics_require_key; no key is ever written to the log; a server without keys warns when it
listens beyond the loopback interface; an unusable key file stops the start-up with an error naming the key."""
import subprocess

import openai
import pytest
import requests

from serve_process import CONFIG, ServeProcess, strata_binary
from support import ROOT, error_of

KEYS = {"yaml": "sk-e2e-yaml-0123456789", "flag": "sk-e2e-flag-abcdef", "file": "sk-e2e-file-Zyx987"}


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# the e2e keys\n\n  {KEYS['file']}  \n#sk-e2e-retired\n")
    server = ServeProcess([f"server.api_keys={KEYS['yaml']}", f"server.api_key_file={key_file}"],
                          name="strata serve with keys", extra_args=["--api-key", KEYS["flag"]])
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def client(server, key):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0, timeout=120)


@pytest.mark.parametrize("source", sorted(KEYS))
def test_each_configured_key_is_accepted(keyed_server, source):
    reply = client(keyed_server, KEYS[source]).completions.create(
        model="SmolLM2-135M-Instruct", prompt="The capital of France is", max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens > 0


def test_a_stream_with_a_key(keyed_server):
    chunks = client(keyed_server, KEYS["file"]).chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True)
    assert any(chunk.choices and chunk.choices[0].finish_reason for chunk in chunks)


@pytest.mark.parametrize("key", ["sk-e2e-wrong", KEYS["yaml"][:-1], KEYS["yaml"] + "0", KEYS["flag"].upper()])
def test_a_wrong_key_is_401_invalid_api_key(keyed_server, key):
    with pytest.raises(openai.AuthenticationError) as raised:
        client(keyed_server, key).models.list()
    assert raised.value.status_code == 401
    assert raised.value.code == "invalid_api_key"
    assert key not in raised.value.response.text


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Basic c2stZTJl"}, {"Authorization": "Bearer"},
                                     {"Authorization": KEYS["yaml"]}])
@pytest.mark.parametrize("path,method", [("/v1/completions", "post"), ("/v1/chat/completions", "post"),
                                         ("/v1/models", "get"), ("/v1/kv_state", "get"), ("/v1/nothing", "get")])
def test_no_bearer_key_is_401_on_every_v1_route(keyed_server, path, method, headers):
    response = requests.request(method, f"{keyed_server.base_url}{path}", headers=headers,
                                json={"prompt": "hi", "max_tokens": 1}, timeout=30)
    error = error_of(response, 401)
    assert error == {"message": error["message"], "type": "invalid_request_error", "param": None,
                     "code": "invalid_api_key"}
    assert response.headers["WWW-Authenticate"] == "Bearer"


def test_health_and_metrics_stay_open(keyed_server):
    assert requests.get(f"{keyed_server.base_url}/health", timeout=30).status_code == 200
    assert requests.get(f"{keyed_server.base_url}/metrics", timeout=30).status_code == 200


def test_refusals_are_counted_and_no_key_reaches_the_log(keyed_server):
    requests.get(f"{keyed_server.base_url}/v1/models", headers={"Authorization": "Bearer sk-e2e-leak"}, timeout=30)
    metrics = requests.get(f"{keyed_server.base_url}/metrics", timeout=30).text
    assert 'strata_request_errors_total{status="401"}' in metrics
    log = keyed_server.log_tail(10**7)
    assert "3 API key(s) configured" in log, log
    for key in (*KEYS.values(), "sk-e2e-leak", "sk-e2e-retired"):
        assert key not in log


def test_metrics_may_require_a_key():
    server = ServeProcess(["server.api_keys=sk-e2e-metrics", "server.metrics_require_key=true"],
                          name="strata serve, metrics behind a key")
    try:
        server.wait_ready()
        error = error_of(requests.get(f"{server.base_url}/metrics", timeout=30), 401)
        assert error["code"] == "invalid_api_key"
        ok = requests.get(f"{server.base_url}/metrics", headers={"Authorization": "Bearer sk-e2e-metrics"},
                          timeout=30)
        assert ok.status_code == 200 and "strata_kv_blocks_total" in ok.text
        assert requests.get(f"{server.base_url}/health", timeout=30).status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize("host,warned", [("0.0.0.0", True), ("127.0.0.1", False)])
def test_an_open_server_warns_when_it_listens_beyond_loopback(host, warned):
    server = ServeProcess(name=f"strata serve on {host}", extra_args=["--host", host])
    try:
        server.wait_ready()
        assert requests.get(f"{server.base_url}/v1/models", timeout=30).status_code == 200  # open: no key needed
        assert ("no API key is configured and the server listens on " + host in server.log_tail()) == warned
    finally:
        server.stop()


def start_failure(settings, tmp_path):
    args = [str(strata_binary()), "serve", "--config", str(CONFIG), "--port", "0"]
    for s in settings:
        args += ["--set", s]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_an_unusable_key_file_stops_the_start_up(tmp_path):
    missing = start_failure([f"server.api_key_file={tmp_path / 'absent.txt'}"], tmp_path)
    assert missing.returncode == 1
    assert "server.api_key_file: cannot read" in missing.stderr, missing.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing yet\n\n")
    no_key = start_failure([f"server.api_key_file={empty}"], tmp_path)
    assert no_key.returncode == 1
    assert "server.api_key_file" in no_key.stderr and "holds no key" in no_key.stderr, no_key.stderr
