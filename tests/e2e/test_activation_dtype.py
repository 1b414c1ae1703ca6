"""engine.activation_dtype: int8 through the shipped binary: a server whose quantized matmuls round their inputs to
int8 per block of 32 answers over HTTP, a request batched with others gets the greedy tokens it gets alone (each
row is rounded on its own), and a configuration the backend cannot honour is refused naming the key."""
import concurrent.futures
import subprocess

import pytest
import requests

from serve_process import CONFIG, ServeProcess, strata_binary
from support import ROOT

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a village by the sea,",
           "The three primary colours are"]


@pytest.fixture(scope="module")
def server():
    s = ServeProcess(["engine.activation_dtype=int8", "kv_cache.memory_mib=64"], "strata serve (int8 activations)")
    try:
        yield s.wait_ready()
    finally:
        s.stop()


def complete(server, prompt):
    body = {"model": "SmolLM2-135M-Instruct", "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True}
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text[:500]
    return response.json()["choices"][0]["text"]


def test_a_request_gets_alone_what_it_gets_batched(server):
    alone = [complete(server, p) for p in PROMPTS]
    assert all(len(text) > 0 for text in alone)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: complete(server, p), PROMPTS))
    assert together == alone


def test_the_start_up_line_names_the_cpu_kernels(server):
    assert "(CPU kernels " in server.log_tail()


@pytest.mark.parametrize("sets, key", [
    (["engine.activation_dtype=fp16"], "engine.activation_dtype"),
    (["engine.activation_dtype=int8", "engine.backend=cuda"], "engine.activation_dtype"),
])
def test_a_setting_the_backend_cannot_honour_is_refused_naming_the_key(sets, key):
    args = [str(strata_binary()), "serve", "--config", str(CONFIG), "--port", "0"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert key in done.stderr, done.stderr[-2000:]
