"""D2O through the API (kv_compression {"policy": "d2o", ...}) on the real model and server:
- d2o requests (code and paper modes) run in one batch with other policies and get what they get alone;
- on a 1,000-token prompt every non-exempt layer holds exactly the budget the policy reports in /v1/kv_state
  (`capacity`) at every step, /metrics shows the same tokens and whole blocks, the exempt layers (0, 1, L-1) keep
  everything, the budgets obey the allocation's bounds, evicted entries are merged, and the blocks return;
- bad D2O parameters get a 400 naming the field."""
import math
from concurrent.futures import ThreadPoolExecutor

import requests

from support import ROOT, error_of, metric, metrics, tokenizer
from test_compression import complete, token_texts, wait_idle

N_LAYERS = 30
BLOCK_SIZE = 16
EXEMPT = {0, 1, N_LAYERS - 1}
PROMPT_TOKENS = 1000


def prompt_ids(n):
    text = (ROOT / "tests" / "fixtures" / "texts" / "the_keepers_ledger.txt").read_text(encoding="utf-8")
    return tokenizer().encode(text, add_special_tokens=False).ids[:n]


def test_d2o_runs_in_a_batch_with_other_policies(server, model_name):
    # Prompts of 60 to 90 tokens: long enough for D2O (sinks + 16) to evict and merge at its 20 % default.
    ids = prompt_ids(400)
    prompts = [ids[0:90], ids[100:170], ids[200:260], ids[300:380]]
    policies = [{"policy": "d2o"},
                {"policy": "d2o", "layer_rule": "paper_gate", "merge_weight": "paper_softmax",
                 "evict_at": "prefill_end", "hh_ratio": 0.15, "recent_ratio": 0.05},
                {"policy": "h2o", "budget": 16, "window": 4, "mode": "per_step"},
                {"policy": "streaming", "budget": 12, "mode": "rolling"}]
    alone = [token_texts(complete(server, model_name, p, kv, max_tokens=16)) for p, kv in zip(prompts, policies)]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda pk: token_texts(complete(server, model_name, *pk, max_tokens=16)),
                                 zip(prompts, policies)))
    assert together == alone


def test_d2o_layers_hold_the_budget_the_policy_reports(server, model_name):
    wait_idle(server.base_url)
    ids = prompt_ids(PROMPT_TOKENS)
    body = {"model": model_name, "prompt": ids, "max_tokens": 300, "temperature": 0, "ignore_eos": True,
            "stream": True, "kv_compression": {"policy": "d2o"}}
    with requests.post(f"{server.base_url}/v1/completions", json=body, stream=True, timeout=600) as response:
        assert response.status_code == 200, response.text[:500]
        lines = response.iter_lines()
        chunks = 0
        while chunks < 4:  # past the first decode step, where D2O evicts and merges
            chunks += next(lines).startswith(b"data: {")
        before = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()
        samples = metrics(server.base_url)
        after = requests.get(f"{server.base_url}/v1/kv_state", timeout=30).json()

    [seq] = before["sequences"]
    assert seq["prompt_tokens"] == len(ids)
    decoded = seq["uncompressed_tokens"] - len(ids)
    assert decoded >= 2
    layers = {layer["layer"]: layer for layer in seq["layers"]}
    capacity = {}
    for l, layer in layers.items():
        assert layer["policy"].startswith("d2o"), layer
        assert layer["uncompressed_tokens"] == seq["uncompressed_tokens"]
        if l in EXEMPT:
            assert "capacity" not in layer and layer["tokens"] == seq["uncompressed_tokens"], layer
            continue
        capacity[l] = layer["capacity"]
        assert layer["tokens"] == capacity[l], layer  # exactly S, one eviction per step after the first
        # heavy = recent = floor((P + 1) R / 2) with 0.01 <= R <= 1 (hh_ratio = recent_ratio, over 5 sinks + 1).
        assert capacity[l] % 2 == 0, layer
        assert 2 * math.floor((len(ids) + 1) * 0.01 / 2) <= capacity[l] <= len(ids) + 1, layer
    # sigma lies in [0, 1), so softmax(-sigma) varies by less than a factor e across layers (before the floors).
    low, high = min(capacity.values()), max(capacity.values())
    assert high <= math.e * (low + 2), capacity
    assert sum(capacity.values()) < 0.5 * len(ids) * len(capacity)  # it does compress
    assert any(layers[l].get("merged_tokens", 0) > 0 for l in capacity), "no evicted entry was merged"

    decoded_after = after["sequences"][0]["uncompressed_tokens"] - len(ids) if after["sequences"] else decoded + 300
    block_bytes = before["block_bytes"]
    for l in range(N_LAYERS):
        tokens = metric(samples, "strata_kv_layer_tokens", layer=l, pp_stage=0, tp_rank=0)
        if l in EXEMPT:
            assert len(ids) + decoded <= tokens <= len(ids) + decoded_after, (l, tokens)
        else:
            assert tokens == capacity[l], (l, tokens, capacity[l])  # the budget holds between snapshots too
            evicted = metric(samples, "strata_kv_layer_evicted_tokens_total", layer=l, pp_stage=0, tp_rank=0)
            assert evicted >= len(ids) + 1 - capacity[l], (l, evicted)
        layer_bytes = metric(samples, "strata_kv_layer_bytes", layer=l, pp_stage=0, tp_rank=0)
        assert layer_bytes == -(-tokens // BLOCK_SIZE) * block_bytes, (l, tokens, layer_bytes)
    merged = sum(metric(samples, "strata_kv_layer_merged_tokens_total", layer=l, pp_stage=0, tp_rank=0)
                 for l in capacity)
    assert merged > 0
    for l in EXEMPT:
        assert metric(samples, "strata_kv_layer_merged_tokens_total", layer=l, pp_stage=0, tp_rank=0) == 0

    state = wait_idle(server.base_url)
    assert state["blocks_free"] + state["blocks_cached"] == state["blocks_total"]


def test_bad_d2o_parameters_name_the_field(server, model_name):
    def post(kv):
        return requests.post(f"{server.base_url}/v1/completions", timeout=30,
                             json={"model": model_name, "prompt": "hi", "max_tokens": 1, "kv_compression": kv})

    for kv, param in (({"policy": "d2o", "gqa": "q_head"}, "kv_compression.gqa"),
                      ({"policy": "d2o", "merge_weight": "average"}, "kv_compression.merge_weight"),
                      ({"policy": "d2o", "hh_ratio": 0.8, "recent_ratio": 0.5}, "kv_compression.recent_ratio"),
                      ({"policy": "d2o", "gate": 10}, "kv_compression.gate"),
                      ({"policy": "d2o", "ema_a": 2}, "kv_compression.ema_a"),
                      ({"policy": "d2o", "budget": 128}, "kv_compression.budget")):
        error = error_of(post(kv), 400)
        assert error["param"] == param, (kv, error)
    assert post({"policy": "d2o", "layer_rule": "paper_gate", "gate": 10}).status_code == 200
