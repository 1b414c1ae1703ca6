"""KV compression through the API (the kv_compression extension field), on the real model and server:
- with a budget at least the prompt length, every policy's output equals `full` token for token;
- PyramidKV at 128 tokens per layer on a ~4,000-token prompt: every layer holds what the official schedule of
  ../shared/specs/pyramidkv.md section 3.4 says (computed here, independently of the C++), /metrics agrees, the
  bytes follow the blocks, and every block is back in the pool afterwards;
- requests with different policies run in one batch;
- bad policies and parameters get a 400 naming the field."""
import json
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from support import ROOT, error_of, metric, metrics, tokenizer

N_LAYERS = 30
BLOCK_SIZE = 16
LONG_PROMPT_TOKENS = 4000


def pyramid_schedule(n, C, w=8, beta=20, L=N_LAYERS):
    """Non-window budget per layer, the official integer schedule (spec 3.4)."""
    a = C - w
    if n < C:
        return None  # no compression
    if n < 2 * a:
        return [a] * L
    lo = a // beta
    hi = 2 * a - lo
    if hi >= n - w:
        hi = n - w
        lo = 2 * a - hi
    step = (hi - lo) // (L - 1)
    return [hi - l * step for l in range(L)]


def long_prompt_ids():
    text = (ROOT / "tests" / "fixtures" / "texts" / "the_keepers_ledger.txt").read_text(encoding="utf-8")
    ids = tokenizer().encode(text, add_special_tokens=False).ids
    assert len(ids) >= LONG_PROMPT_TOKENS
    return ids[:LONG_PROMPT_TOKENS]


def complete(server, model_name, prompt, kv=None, max_tokens=12):
    body = {"model": model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0}
    if kv is not None:
        body["kv_compression"] = kv
    response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=600)
    assert response.status_code == 200, response.text[:500]
    return response.json()["choices"][0]


def token_texts(choice):
    return choice["logprobs"]["tokens"]


def test_budget_beyond_the_prompt_equals_full(server, model_name):
    prompt = "The lighthouse keeper climbed the stairs every evening, counting the steps as he went, and"
    full = token_texts(complete(server, model_name, prompt))
    for kv in ({"policy": "streaming", "budget": 2048},
               {"policy": "streaming", "budget": 2048, "mode": "rolling"},
               {"policy": "h2o", "budget": 2048},
               {"policy": "snapkv", "budget": 2048},
               {"policy": "pyramidkv", "budget": 2048},
               {"policy": "expected_attention", "budget": 2048},
               {"policy": "simlayerkv"}):  # window 1024 > prompt: no layer is trimmed
        assert token_texts(complete(server, model_name, prompt, kv)) == full, kv


def wait_idle(base_url, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while True:
        state = requests.get(f"{base_url}/v1/kv_state", timeout=30).json()
        if not state["sequences"] and state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]:
            return state
        assert time.monotonic() < deadline, f"KV still held {timeout_s} s after the requests ended: {state}"
        time.sleep(0.2)


def test_pyramidkv_holds_the_schedule_in_every_layer(server, model_name):
    wait_idle(server.base_url)
    ids = long_prompt_ids()
    budget = 128
    expected = [k + 8 for k in pyramid_schedule(len(ids), budget)]
    body = {"model": model_name, "prompt": ids, "max_tokens": 400, "temperature": 0, "ignore_eos": True,
            "stream": True, "kv_compression": {"policy": "pyramidkv", "budget": budget}}
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True, timeout=600) as response:
        assert response.status_code == 200, response.text[:500]
        lines = response.iter_lines()
        while not next(lines).startswith(b"data: {"):
            pass  # the first token: the prompt is in the cache and compressed
        before = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()
        samples = metrics(server.base_url)
        after = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()

    [seq] = before["sequences"]
    assert seq["prompt_tokens"] == len(ids)
    assert seq["prefill_compression"] == "chunked"  # kv_cache.prefill_compression auto, and PyramidKV has the form
    decoded = seq["uncompressed_tokens"] - seq["prompt_tokens"]  # entries appended after the prompt
    for layer in seq["layers"]:
        assert layer["tokens"] - decoded == expected[layer["layer"]], (layer, expected[layer["layer"]], decoded)
        assert layer["uncompressed_tokens"] == seq["uncompressed_tokens"]
        assert layer["policy"].startswith("pyramidkv")
    # The first layers keep the most, the last the least (the pyramid).
    assert expected[0] > expected[-1]

    # /metrics between the two snapshots: tokens = schedule + what was decoded by then; bytes = whole blocks.
    decoded_after = after["sequences"][0]["uncompressed_tokens"] - len(ids) if after["sequences"] else decoded + 400
    block_bytes = before["block_bytes"]
    held_bytes = 0
    for layer in range(N_LAYERS):
        tokens = metric(samples, "strata_kv_layer_tokens", layer=layer, pp_stage=0, tp_rank=0)
        assert expected[layer] + decoded <= tokens <= expected[layer] + decoded_after, (layer, tokens)
        layer_bytes = metric(samples, "strata_kv_layer_bytes", layer=layer, pp_stage=0, tp_rank=0)
        assert layer_bytes == -(-tokens // BLOCK_SIZE) * block_bytes, (layer, tokens, layer_bytes)
        uncompressed = metric(samples, "strata_kv_layer_uncompressed_bytes", layer=layer, pp_stage=0, tp_rank=0)
        assert uncompressed >= -(-len(ids) // BLOCK_SIZE) * block_bytes
        held_bytes += layer_bytes
        evicted = metric(samples, "strata_kv_layer_evicted_tokens_total", layer=layer, pp_stage=0, tp_rank=0)
        assert evicted >= len(ids) - expected[layer]
    assert metric(samples, "strata_kv_compression_ratio") > 5
    assert metric(samples, "strata_kv_saved_bytes") > 0
    full_bytes = N_LAYERS * -(-len(ids) // BLOCK_SIZE) * block_bytes
    assert held_bytes < full_bytes / 5, (held_bytes, full_bytes)

    # The client went away: the sequence ends and every block returns to the pool.
    state = wait_idle(server.base_url)
    assert state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]


def test_policies_run_together_in_one_batch(server, model_name):
    prompts = [
        "In the winter the harbour froze from the shore outwards, and the fishermen",
        "The clockmaker opened the case and found, to his surprise,",
        "Every morning the almanac recorded the tide, the wind, and",
        "She counted the lamps along the quay: one, two, three,",
        "The ledger listed the ships that came in that year, their cargo and",
    ]
    policies = [{"policy": "snapkv", "budget": 16, "window": 4},
                {"policy": "streaming", "budget": 12, "mode": "rolling"},
                {"policy": "h2o", "budget": 12, "window": 4, "mode": "per_step"},
                {"policy": "pyramidkv", "budget": 16, "window": 4},
                {"policy": "expected_attention", "budget": 10, "sinks": 2}]
    alone = [token_texts(complete(server, model_name, p, kv)) for p, kv in zip(prompts, policies)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda pk: token_texts(complete(server, model_name, *pk)), zip(prompts, policies)))
    assert together == alone


def test_bad_policies_and_parameters_name_the_field(server, model_name):
    def post(kv):
        return requests.post(f"{server.base_url}/v1/completions", timeout=30,
                             json={"model": model_name, "prompt": "hi", "max_tokens": 1, "kv_compression": kv})

    for kv, param in ((["snapkv"], "kv_compression"),
                      ({}, "kv_compression.policy"),
                      ({"policy": "nosuch"}, "kv_compression.policy"),
                      ({"policy": 3}, "kv_compression.policy"),
                      ({"policy": "snapkv", "budget": -1}, "kv_compression.budget"),
                      ({"policy": "snapkv", "budget": "lots"}, "kv_compression.budget"),
                      ({"policy": "snapkv", "pool": "median"}, "kv_compression.pool"),
                      ({"policy": "snapkv", "bogus": 1}, "kv_compression.bogus"),
                      ({"policy": "snapkv", "budget": {"a": 1}}, "kv_compression.budget"),
                      ({"policy": "expected_attention", "future": 0}, "kv_compression.future"),
                      ({"policy": "expected_attention", "budget": 4}, "kv_compression.budget"),
                      ({"policy": "kvzip", "budget": 4}, "kv_compression.budget")):
        error = error_of(post(kv), 400)
        assert error["param"] == param, (kv, error)
    # KVzip scores each prefill chunk by its reconstruction: this server (kv_cache.prefill_compression auto)
    # prefills its sequences in chunks (an end server refuses it, tests/rank/chunked_prefill_test.cpp).
    assert post({"policy": "kvzip"}).status_code == 200
    assert post({"policy": "snapkv", "budget": "20%"}).status_code == 200
    assert json.loads(post({"policy": "full"}).text)["choices"]
