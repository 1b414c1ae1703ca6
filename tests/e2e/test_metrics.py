"""/metrics (parsed by prometheus_client), /v1/kv_state and /health: per-layer KV gauges, and request counters that
move by exactly what a request did."""
import time

import requests

from support import load_reference, metric, metrics, prompt_token_count

N_LAYERS = 30  # SmolLM2-135M


def layer_tokens(samples):
    """{layer: tokens} from strata_kv_layer_tokens, checking the labels of a one-rank server."""
    family = samples.get("strata_kv_layer_tokens")
    assert family, "/metrics has no strata_kv_layer_tokens"
    out = {}
    for labels, value in family.items():
        labels = dict(labels)
        assert set(labels) == {"layer", "pp_stage", "tp_rank"}, labels
        assert (labels["pp_stage"], labels["tp_rank"]) == ("0", "0"), labels
        out[int(labels["layer"])] = value
    return out


def test_kv_layer_tokens_has_every_layer(server):
    samples = metrics(server.base_url)
    assert sorted(layer_tokens(samples)) == list(range(N_LAYERS))
    assert metric(samples, "strata_kv_block_size_tokens") > 0
    assert metric(samples, "strata_kv_blocks_total") >= metric(samples, "strata_kv_blocks_free") > 0


def test_kv_layer_tokens_follow_a_running_request(server, model_name):
    prompt = load_reference("short_text")["text"]
    n_prompt = prompt_token_count(prompt)
    with requests.post(f"{server.base_url}/v1/completions", stream=True, timeout=120,
                       json={"model": model_name, "prompt": prompt, "max_tokens": 200, "temperature": 0,
                             "ignore_eos": True, "stream": True}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        while not next(lines).startswith(b"data: {"):
            pass
        # The request holds KV now. The gauges are published after the step whose tokens we may already have,
        # and one layer at a time, so wait for a snapshot in which they agree: with the full cache every layer
        # holds the same count, at least the prompt.
        deadline = time.monotonic() + 30
        while True:
            samples = metrics(server.base_url)
            tokens = layer_tokens(samples)
            if tokens[0] > 0 and len(set(tokens.values())) == 1:
                break
            assert time.monotonic() < deadline, f"no consistent per-layer KV within 30 s of the first token: {tokens}"
            time.sleep(0.1)
        assert n_prompt <= tokens[0] <= n_prompt + 200, (n_prompt, tokens[0])
        assert metric(samples, "strata_requests_running") == 1


def idle_metrics(base_url, timeout_s=60):
    """Metrics once no request runs or waits (an abandoned stream of an earlier test may take a step to go)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = metrics(base_url)
        if metric(samples, "strata_requests_running") == 0 and metric(samples, "strata_requests_waiting") == 0:
            return samples
        assert time.monotonic() < deadline, f"requests still running after {timeout_s} s"
        time.sleep(0.2)


def test_counters_grow_by_what_a_request_did(server, client, model_name):
    before = idle_metrics(server.base_url)
    prompt = "The quick brown fox jumps over the lazy dog."
    response = client.completions.create(model=model_name, prompt=prompt, max_tokens=4, temperature=0)
    after = metrics(server.base_url)

    def grew(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert response.usage.prompt_tokens == prompt_token_count(prompt)
    assert grew("strata_prompt_tokens_total") == response.usage.prompt_tokens
    assert grew("strata_generation_tokens_total") == response.usage.completion_tokens == 4
    assert grew("strata_time_to_first_token_seconds_count") == 1
    assert grew("strata_request_queue_time_seconds_count") == 1
    # Its wait in the queue ended before its first token came.
    assert 0 <= grew("strata_request_queue_time_seconds_sum") <= grew("strata_time_to_first_token_seconds_sum")
    assert grew("strata_e2e_request_latency_seconds_count") == 1
    assert grew("strata_requests_total", finish_reason="length") == 1
    assert metric(after, "strata_time_to_first_token_seconds_sum") > metric(before,
                                                                             "strata_time_to_first_token_seconds_sum")


def test_kv_state_and_health(server):
    state = requests.get(f"{server.base_url}/v1/kv_state", timeout=30)
    assert state.status_code == 200
    assert state.headers["content-type"].startswith("application/json")
    layers = state.json()["layers"]
    assert sorted(entry["layer"] for entry in layers) == list(range(N_LAYERS))
    health = requests.get(f"{server.base_url}/health", timeout=30)
    assert health.status_code == 200
