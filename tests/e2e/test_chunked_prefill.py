"""Chunked prefill compression (kv_cache.prefill_compression: chunked) through the real server: a 4,000-token
prompt, four times what the pool holds per layer, is served under StreamingLLM, H2O, SnapKV and PyramidKV at 128
tokens a layer; `full` and a policy without a chunked form get a 400 that says why; the pool never held more than
the policies' budgets plus a chunk in any layer (strata_kv_layer_tokens, sampled while the prompt is prefilled);
every block comes back; and a server configured with a policy that has no chunked form does not start. Under
`auto` (the default) the same long prompt is served as `chunked` serves it, and a policy without a chunked form
runs at the prompt's end instead of being refused."""
import subprocess
import threading
import time

import pytest
import requests

from serve_process import CONFIG, ServeProcess, strata_binary
from support import error_of, free_port, metric, metrics
from test_compression import long_prompt_ids, wait_idle

N_LAYERS = 30
CHUNK = 256
# 44 MiB of f32 blocks of 16 tokens (24 KiB each): 1,877 blocks, 62 a layer, 992 tokens a layer.
POOL_MIB = 44
POOL_TOKENS_PER_LAYER = 992


def small_pool_server(mode):
    return ServeProcess([f"kv_cache.memory_mib={POOL_MIB}", f"kv_cache.prefill_compression={mode}",
                         f"kv_cache.prefill_chunk={CHUNK}", "kv_cache.prefix_caching=off"],
                        f"strata serve ({mode} prefill compression, 44 MiB pool)").wait_ready()


@pytest.fixture(scope="module")
def chunked_server():
    server = small_pool_server("chunked")
    yield server
    server.stop()


def completion(server, ids, kv, max_tokens=8):
    body = {"model": "SmolLM2-135M-Instruct", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "kv_compression": kv}
    return requests.post(f"{server.base_url}/v1/completions", json=body, timeout=600)


def most_tokens_in_a_layer(base_url, stop, out):
    """Polls /metrics until `stop` is set; keeps the most tokens any layer held."""
    while not stop.is_set():
        samples = metrics(base_url)
        out.append(max(metric(samples, "strata_kv_layer_tokens", layer=l, pp_stage=0, tp_rank=0)
                       for l in range(N_LAYERS)))
        time.sleep(0.05)


@pytest.mark.parametrize("policy", ["streaming", "h2o", "snapkv", "pyramidkv"])
def test_a_prompt_four_times_the_pool_is_served(chunked_server, policy):
    ids = long_prompt_ids()
    assert len(ids) >= 4 * POOL_TOKENS_PER_LAYER
    stop, seen = threading.Event(), []
    poller = threading.Thread(target=most_tokens_in_a_layer, args=(chunked_server.base_url, stop, seen))
    poller.start()
    try:
        response = completion(chunked_server, ids, {"policy": policy, "budget": 128})
    finally:
        stop.set()
        poller.join()
    assert response.status_code == 200, response.text[:500]
    body = response.json()
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == 8
    # PyramidKV's first layer keeps the most: about twice the average (spec pyramidkv.md 3.4).
    bound = (2 * 128 if policy == "pyramidkv" else 128) + CHUNK + 8
    assert seen and max(seen) <= bound, (policy, max(seen))
    wait_idle(chunked_server.base_url)


def test_full_and_a_policy_without_a_chunked_form_are_refused(chunked_server):
    ids = long_prompt_ids()
    response = completion(chunked_server, ids, {"policy": "full"})
    message = error_of(response, 400)["message"]
    assert f"{len(ids)} tokens" in message and "pool" in message, message
    response = completion(chunked_server, ids[:100], {"policy": "simlayerkv"})
    error = error_of(response, 400)
    assert error["param"] == "kv_compression.policy"
    assert "kv_cache.prefill_compression" in error["message"], error


def test_short_prompts_answer_as_in_end_mode(chunked_server, server):
    """A prompt within one chunk is compressed once, at its end: the same tokens as the default server's."""
    prompt = list(range(1000, 1200))
    kv = {"policy": "snapkv", "budget": 64, "window": 8}
    chunked = completion(chunked_server, prompt, kv, max_tokens=12).json()["choices"][0]["text"]
    end = completion(server, prompt, kv, max_tokens=12).json()["choices"][0]["text"]
    assert chunked == end


@pytest.mark.parametrize("settings", [
    ["kv_cache.prefill_compression=chunked", "kv_cache.policy=simlayerkv"],
    # auto cannot decide: KVzip compresses prefill chunks only, SimLayerKV has no chunked form.
    ["kv_cache.prefill_compression=auto", "kv_cache.policy=kvzip", "kv_cache.layer_overrides=0=simlayerkv"]])
def test_a_configured_policy_without_a_chunked_form_stops_the_server_naming_the_key(settings):
    command = [str(strata_binary()), "serve", "--config", str(CONFIG), "--port", str(free_port())]
    for setting in settings:
        command += ["--set", setting]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "kv_cache.prefill_compression" in done.stderr and "simlayerkv" in done.stderr, done.stderr[-2000:]


@pytest.fixture(scope="module")
def auto_server():
    server = small_pool_server("auto")
    yield server
    server.stop()


def test_auto_chunks_what_can_be_chunked_and_runs_the_rest_at_the_end(auto_server, chunked_server):
    ids = long_prompt_ids()
    kv = {"policy": "snapkv", "budget": 128}
    served = completion(auto_server, ids, kv)
    assert served.status_code == 200, served.text[:500]
    assert served.json()["choices"][0]["text"] == completion(chunked_server, ids, kv).json()["choices"][0]["text"]
    # SimLayerKV has no chunked form: a prompt that fits is served, compressed at its end, and /v1/kv_state says so.
    body = {"model": "SmolLM2-135M-Instruct", "prompt": ids[:300], "max_tokens": 200, "temperature": 0,
            "ignore_eos": True, "stream": True, "kv_compression": {"policy": "simlayerkv"}}
    with requests.post(f"{auto_server.base_url}/v1/completions", json=body, stream=True, timeout=600) as short:
        assert short.status_code == 200, short.text[:500]
        lines = short.iter_lines()
        while not next(lines).startswith(b"data: {"):
            pass  # its first token: the prompt is in the cache
        [seq] = requests.get(f"{auto_server.base_url}/v1/kv_state", timeout=30).json()["sequences"]
        assert seq["prefill_compression"] == "end", seq
    # full keeps every entry: the whole prompt must fit, as under end.
    message = error_of(completion(auto_server, ids, {"policy": "full"}), 400)["message"]
    assert f"{len(ids)} tokens" in message and "pool" in message, message
    wait_idle(auto_server.base_url)
