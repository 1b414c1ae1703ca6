"""engine.activation_dtype int8 and int16 through the shipped binary: a server whose quantized matmuls round their
inputs to int8 or int16 per block of 32 answers over HTTP, a request batched with others gets the greedy tokens it
gets alone (each row is rounded on its own), the start-up line names what ran, and a configuration the backend cannot
honour is refused naming the key."""
import concurrent.futures
import subprocess

import pytest
import requests

from serve_process import CONFIG, ServeProcess, strata_binary
from test_build_commit import expected_amx_states, expected_cpu_kernels
from support import ROOT

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a village by the sea,",
           "The three primary colours are"]


@pytest.fixture(scope="module", params=["int8", "int16"])
def server(request):
    s = ServeProcess([f"engine.activation_dtype={request.param}", "kv_cache.memory_mib=64"],
                     f"strata serve ({request.param} activations)")
    try:
        s.wait_ready()
        s.dtype = request.param
        yield s
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


def test_the_start_up_line_names_the_cpu_kernels_the_activations_and_amx(server):
    assert "(CPU kernels " in server.log_tail()
    assert any(f", {server.dtype} activations, AMX {state})" in server.log_tail() for state in expected_amx_states())


@pytest.mark.parametrize("sets, key", [
    (["engine.activation_dtype=fp16"], "engine.activation_dtype"),
    (["engine.activation_dtype=int8", "engine.backend=cuda"], "engine.activation_dtype"),
    (["engine.activation_dtype=int16", "engine.backend=cuda"], "engine.activation_dtype"),
])
def test_a_setting_the_backend_cannot_honour_is_refused_naming_the_key(sets, key):
    args = [str(strata_binary()), "serve", "--config", str(CONFIG), "--port", "0"]
    for s in sets:
        args += ["--set", s]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert key in done.stderr, done.stderr[-2000:]


def test_auto_is_int16_where_the_machine_has_an_integer_tile_kernel_and_f32_elsewhere():
    s = ServeProcess(["kv_cache.memory_mib=64"], "strata serve (activation_dtype auto)")
    try:
        s.wait_ready()
        expected = "f32" if expected_cpu_kernels() == "baseline" else "int16"
        assert f", {expected} activations, AMX " in s.log_tail()
    finally:
        s.stop()


LEVELS = ["baseline", "avx2", "avx512", "avx512_vnni", "amx"]


def test_cpu_kernels_runs_a_level_below_the_machines_best_and_auto_follows_it():
    """engine.cpu_kernels=avx2 on any x86-64-v3 machine: the start-up line names avx2, auto picks int16 there (its
    AVX2 tile kernel), and a request gets the greedy tokens the machine's best level gives it (the two tile kernels
    give the same floats; Q8_0, in pairs at AVX2, the same rounded products up to the order of their sums)."""
    best = expected_cpu_kernels()
    if best == "baseline":
        pytest.skip("no x86-64-v3")
    texts = {}
    for level in ("avx2", "auto"):
        s = ServeProcess([f"engine.cpu_kernels={level}", "kv_cache.memory_mib=64"], f"strata serve (cpu {level})")
        try:
            s.wait_ready()
            assert f"(CPU kernels {best if level == 'auto' else level}, int16 activations, AMX " in s.log_tail()
            texts[level] = [complete(s, p) for p in PROMPTS[:2]]
        finally:
            s.stop()
    assert texts["avx2"] == texts["auto"]


def test_cpu_kernels_beyond_the_machine_is_refused_naming_the_key():
    best = expected_cpu_kernels()
    if best == LEVELS[-1]:
        pytest.skip("this machine has every level")
    beyond = LEVELS[LEVELS.index(best) + 1]
    args = [str(strata_binary()), "serve", "--config", str(CONFIG), "--port", "0", "--set",
            f"engine.cpu_kernels={beyond}"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "engine.cpu_kernels" in done.stderr and beyond in done.stderr, done.stderr[-2000:]
